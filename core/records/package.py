"""`sluice pipeline package`: the Spark job as files spark-submit ships to a cluster.

The ``pipeline`` package imports neither Django nor the rest of Sluice (an import-linter
contract), so it runs wherever Spark runs: a zip of it for ``--py-files`` and a two-line
main script, which spark-submit needs as a file of its own.  The driver needs pyarrow
(the job declares its input schema from pipeline.arrow_schema); executors need no Python
package of ours (the job runs no Python UDFs).
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pipeline

ZIP_NAME = "sluice-pipeline.zip"
MAIN_NAME = "sluice_pipeline_main.py"
MAIN = '''"""spark-submit's main file for the Sluice metrics job (pipeline.job, shipped in --py-files)."""
import sys

from pipeline.job import main

sys.exit(main())
'''


@dataclass(frozen=True)
class Package:
    zip: str
    main: str

    def spark_submit(self, records: str, metrics: str) -> list[str]:
        """A spark-submit command line for the two files (add --master and --deploy-mode)."""
        return ["spark-submit", "--py-files", self.zip, self.main, "--input", records, "--output", metrics]


def build(directory: str) -> Package:
    """Write the zip and the main script into ``directory`` (created; files replaced)."""
    out = Path(directory).resolve()
    out.mkdir(parents=True, exist_ok=True)
    source = Path(pipeline.__file__).parent
    archive = out / ZIP_NAME
    tmp = out / f".{ZIP_NAME}.tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(source.glob("*.py")):
            z.write(path, f"pipeline/{path.name}")
    os.replace(tmp, archive)
    main = out / MAIN_NAME
    main.write_text(MAIN)
    return Package(str(archive), str(main))
