"""`sluice records export|retention` and `sluice pipeline run|load` (core.records, pipeline/)."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from core.cli.base import CommandError, Group, command_group
from core.conf import get_settings
from core.records.export import export_records
from core.records.results import load_path
from core.records.retention import delete_exported
from core.records.run import PipelineBusy, run_pipeline
from pipeline.job import parse_since


def since_option(text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        return parse_since(text)
    except ValueError:
        raise CommandError(f"--since wants an ISO 8601 instant such as 2026-11-23T10:00:00Z, not {text!r}") from None


@command_group
class RecordsCommands(Group):
    def add_to(self, sub) -> None:
        records = sub.add_parser("records", help="processing records: export to Parquet, retention")
        rsub = records.add_subparsers(dest="records_action", required=True, metavar="ACTION")
        export = self.handles(rsub.add_parser(
            "export", help="write records above the watermark to the Parquet data set (SLUICE_RECORDS_PATH)"),
            self.export)
        export.add_argument("--path", default=None, help="data set location (default SLUICE_RECORDS_PATH)")
        export.add_argument("--json", action="store_true")
        retention = self.handles(rsub.add_parser(
            "retention", help="delete exported records older than SLUICE_RECORDS_RETENTION now"), self.retention)
        retention.add_argument("--json", action="store_true")

    def export(self, options: dict[str, Any]) -> None:
        result = export_records(options["path"])
        data = {"exported": result.exported, "watermark": result.last_id, "files": result.files}
        if options["json"]:
            self.stdout.write(json.dumps(data))
        else:
            self.stdout.write(f"exported {result.exported} record(s) in {len(result.files)} file(s); "
                              f"watermark {result.last_id}")

    def retention(self, options: dict[str, Any]) -> None:
        deleted = delete_exported()
        if options["json"]:
            self.stdout.write(json.dumps({"deleted": deleted}))
        else:
            self.stdout.write(f"deleted {deleted} exported record(s) older than "
                              f"{get_settings().RECORDS_RETENTION:g} s")


@command_group
class PipelineCommands(Group):
    def add_to(self, sub) -> None:
        pipeline = sub.add_parser("pipeline", help="the analytics pipeline (export + Spark job + load)")
        psub = pipeline.add_subparsers(dest="pipeline_action", required=True, metavar="ACTION")
        run = self.handles(psub.add_parser(
            "run", help="export, run the Spark job (local mode by default), load the metric windows"), self.run)
        run.add_argument("--since", default=None, metavar="ISO",
                         help="recompute windows from this instant's hour (default: from the earliest "
                              "newly exported record; nothing new → no job)")
        run.add_argument("--master", default=None,
                         help="Spark master (default SLUICE_SPARK_MASTER, local[*])")
        run.add_argument("--json", action="store_true")
        load = self.handles(psub.add_parser(
            "load", help="load metric windows a spark-submit run wrote (Parquet) into the database"), self.load)
        load.add_argument("input", help="the job's --output")
        load.add_argument("--since", default=None, metavar="ISO",
                          help="the --since given to the job (windows from its hour are replaced)")
        load.add_argument("--json", action="store_true")

    def run(self, options: dict[str, Any]) -> None:
        since = since_option(options["since"])
        try:
            result = run_pipeline(since, master=options["master"], trigger="cli")
        except PipelineBusy as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(result.json()))
        else:
            self.stdout.write(f"exported {result.exported} record(s), loaded {result.windows} window(s) in "
                              f"{result.seconds:.1f} s on {result.spark_master}; "
                              f"deleted {result.deleted} old record(s)")

    def load(self, options: dict[str, Any]) -> None:
        windows = load_path(options["input"], since_option(options["since"]))
        if options["json"]:
            self.stdout.write(json.dumps({"windows": windows}))
        else:
            self.stdout.write(f"loaded {windows} window(s)")
