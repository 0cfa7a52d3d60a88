"""``/api/monitoring/`` and ``/api/monitoring/<queue>/``: the live monitoring tab's figures
as JSON (dashboard/monitoring.py builds them for the pages too).  Shapes: dashboard/api/monitoring_schema.py."""
from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response

from core.monitoring.live import PERIODS
from dashboard import monitoring
from dashboard.api import schema as out
from dashboard.api import monitoring_schema as shapes
from dashboard.api.schema import doc
from dashboard.api.base import SluiceAPIView

PERIOD = out.choice("period", (*PERIODS, "range"))
RANGE = [out.when("from"), out.when("to")]


class MonitoringOverview(SluiceAPIView):
    @doc(shapes.MonitoringOverview, summary="Every queue's throughput, retries, processing and critical time "
                                         "(p50/p95/p99) and length over a period, bucketed; workers' stale and "
                                         "clock-skew flags; the period's deploy markers",
         operation_id="monitoring_overview",
         parameters=[PERIOD, *RANGE, out.text("q")])
    def get(self, request: Request) -> Response:
        return Response(monitoring.overview_json(monitoring.overview(request.query_params)))


class MonitoringQueue(SluiceAPIView):
    @doc(shapes.MonitoringQueueDetail, summary="One queue's figures over a period, by message type and by worker",
         parameters=[PERIOD, *RANGE])
    def get(self, request: Request, name: str) -> Response:
        return Response(monitoring.queue_json(monitoring.queue_detail(name, request.query_params)))
