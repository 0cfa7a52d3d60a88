"""Deploy markers (dashboard.models.DeployMarker): `sluice mark-deploy LABEL` writes one,
audited; the monitoring tab draws the markers of its period on every chart."""
from __future__ import annotations

import datetime as dt

from django.db import transaction

from core.db import database_now_us
from dashboard.security.audit_log import Audit
from dashboard.models import AuditOutcome, DeployMarker

#: Markers one chart draws at most (the newest).
MAX_MARKERS = 50
LABEL_LENGTH = DeployMarker._meta.get_field("label").max_length


def clean_label(label: str) -> str:
    """The label, stripped; ValueError when it is empty or too long."""
    label = " ".join(label.split())
    if not label:
        raise ValueError("a deploy label must not be empty")
    if len(label) > LABEL_LENGTH:
        raise ValueError(f"a deploy label is at most {LABEL_LENGTH} characters")
    return label


def mark_deploy(label: str, actor: str, via: str = "cli") -> DeployMarker:
    """Write a marker at the database's clock, with its audit entry (one transaction)."""
    label = clean_label(label)
    at = dt.datetime.fromtimestamp(database_now_us() / 1_000_000, dt.timezone.utc)
    with transaction.atomic():
        marker = DeployMarker.objects.create(at=at, label=label, username=actor[:150])
        Audit(user=None, action="mark_deploy", via=via, target=f"deploy {label}", ids=[str(marker.pk)],
              actor=actor).write(AuditOutcome.OK, f"deploy marker at {at:%Y-%m-%d %H:%M:%S} UTC")
    return marker


def markers_between(start: dt.datetime, end: dt.datetime) -> list[DeployMarker]:
    """The period's markers (the newest :data:`MAX_MARKERS`), oldest first."""
    return list(DeployMarker.objects.filter(at__gte=start, at__lt=end).order_by("-at")[:MAX_MARKERS])[::-1]


def marker_json(marker: DeployMarker) -> dict:
    return {"id": marker.pk, "at": marker.at.isoformat(), "label": marker.label, "by": marker.username}
