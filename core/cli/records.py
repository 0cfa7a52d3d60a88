"""`sluice records export|retention` and `sluice pipeline run|load` (core.records, pipeline/)."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from core.cli.base import CommandError, Group, command_group
from core.conf import get_settings
from core.records import package
from core.records.export import ExportBusy, ExportConflict, LeaseLost, export_records
from core.records.extra import PipelineExtraMissing
from core.records.location import spark_path
from core.records.results import NoResults, load_path
from core.records.retention import delete_exported
from core.records.run import PipelineBusy, run_pipeline
from pipeline.job import parse_since

#: What the pipeline commands turn into one clear error line (exit status 1, no traceback).
EXPECTED = (PipelineExtraMissing, PipelineBusy, ExportBusy, ExportConflict, LeaseLost, NoResults)


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
        try:
            result = export_records(options["path"])
        except EXPECTED as exc:
            raise CommandError(str(exc)) from None
        earliest = result.earliest_ended.isoformat() if result.earliest_ended else None
        data = {"exported": result.exported, "watermark": result.last_id, "files": result.files,
                "earliest_ended": earliest, "held_back": result.held_back, "held_reason": result.held_reason}
        if options["json"]:
            self.stdout.write(json.dumps(data))
        else:
            self.stdout.write(f"exported {result.exported} record(s) in {len(result.files)} file(s); "
                              f"watermark {result.last_id}" + (f"; earliest ended {earliest} (the job's --since)"
                                                               if earliest else "")
                              + (f"\n{result.held_reason}" if result.held_back else ""))

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
        pack = self.handles(psub.add_parser(
            "package", help="write the Spark job as a zip (spark-submit --py-files) and its main script"),
            self.package)
        pack.add_argument("directory", nargs="?", default="var/spark", help="where to write them (default var/spark)")
        pack.add_argument("--json", action="store_true")

    def run(self, options: dict[str, Any]) -> None:
        since = since_option(options["since"])
        try:
            result = run_pipeline(since, master=options["master"], trigger="cli")
        except EXPECTED as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps(result.json()))
        else:
            self.stdout.write(f"exported {result.exported} record(s), loaded {result.windows} window(s) in "
                              f"{result.seconds:.1f} s on {result.spark_master}; "
                              f"deleted {result.deleted} old record(s)"
                              + (f"\n{result.held_reason}" if result.held_back else ""))

    def package(self, options: dict[str, Any]) -> None:
        built = package.build(options["directory"])
        settings = get_settings()
        command = built.spark_submit(spark_path(settings.RECORDS_PATH), spark_path(settings.METRICS_PATH))
        if options["json"]:
            self.stdout.write(json.dumps({"zip": built.zip, "main": built.main, "spark_submit": command}))
        else:
            self.stdout.write(f"wrote {built.zip} and {built.main}; run on a cluster with\n  "
                              + " ".join(command[:1] + ["--master", "MASTER", "--deploy-mode", "cluster"]
                                         + command[1:] + ["--since", "ISO"]))

    def load(self, options: dict[str, Any]) -> None:
        try:
            windows = load_path(options["input"], since_option(options["since"]))
        except EXPECTED as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            self.stdout.write(json.dumps({"windows": windows}))
        else:
            self.stdout.write(f"loaded {windows} window(s)")
