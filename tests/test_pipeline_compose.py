"""docker-compose.yml runs the analytics pipeline: a Spark master and worker from the
official image at the pinned pyspark's version, a shared volume at the same path in the
app's worker and the Spark worker, Java in the app image, a switch for the scheduled run.
(`docker compose config` validates the whole file in tests/test_deploy.py where Docker has
its compose plugin.)"""
from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.no_database


def test_compose_has_a_spark_cluster_and_a_shared_volume():
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    spark = version("pyspark")
    for name in ("spark-master", "spark-worker"):
        assert services[name]["image"] == f"apache/spark:{spark}", name
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    env = services["worker"]["environment"]
    assert env["SLUICE_SPARK_MASTER"] == "${SLUICE_SPARK_MASTER:-spark://spark-master:7077}"
    assert "spark.driver.host=worker" in env["SLUICE_SPARK_CONF"]
    assert env["SLUICE_PIPELINE_SCHEDULE"] == "${SLUICE_PIPELINE_SCHEDULE:-1}"
    shared = "pipeline-data:/app/var/pipeline"
    assert shared in services["worker"]["volumes"] and shared in services["spark-worker"]["volumes"]
    for path in (env["SLUICE_RECORDS_PATH"], env["SLUICE_METRICS_PATH"]):
        assert path.startswith("/app/var/pipeline/")


def test_the_app_image_has_java_and_the_pipeline_extra():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in dockerfile
    extras = re.search(r"^ARG EXTRAS=(\S+)$", dockerfile, re.M)
    assert extras and "pipeline" in extras.group(1).split(","), "the image installs the wheel with [pipeline]"
    assert 'pip install "$(ls /dist/django_sluice-*.whl)[${EXTRAS}]"' in dockerfile


def test_the_schedule_switch_removes_the_beat_entry(settings):
    from workers.celery import beat_schedule

    assert "analytics-pipeline" in beat_schedule()
    settings.SLUICE_PIPELINE_SCHEDULE = False
    assert "analytics-pipeline" not in beat_schedule()
