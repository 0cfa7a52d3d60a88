"""The PySpark analytics job over exported processing records.

Imports neither Django nor the rest of Sluice (an import-linter contract says so), so
this package ships to a Spark cluster as is: `spark-submit pipeline/job.py ...`.
"""
