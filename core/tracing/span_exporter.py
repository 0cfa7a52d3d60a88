"""The OTLP/HTTP span exporter Sluice sets up, with its wire encoder (core.tracing.otlp_wire).

It is the SDK's ``OTLPSpanExporter`` — same variables, endpoint, headers, compression,
retries, request size limit and self-metrics — with one change: the request body is
written by :class:`~core.tracing.otlp_wire.Encoder` instead of the SDK's protobuf objects.
A batch the encoder cannot write (a value of a type OpenTelemetry does not allow) goes
through the SDK's own export, as does every batch on an SDK version whose exporter is
not laid out as this one expects (:func:`fits`).
"""
from __future__ import annotations

import logging
from typing import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from core.tracing.otlp_wire import Encoder

try:  # the SDK exporter's own error (its name is the error.type of its self-metrics)
    from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError
except ImportError:  # an SDK from before it: the fast path is not taken (fits)
    RequestPayloadTooLargeError = None  # type: ignore[assignment,misc]

log = logging.getLogger("sluice.tracing")

#: What :meth:`WireSpanExporter.export` uses of the SDK exporter's insides (1.4x).
_INSIDES = ("_client", "_metrics", "_max_request_size", "_shutdown")


def fits(exporter: OTLPSpanExporter) -> bool:
    """Whether this SDK's exporter has the insides the fast path sends through."""
    return (RequestPayloadTooLargeError is not None and all(hasattr(exporter, name) for name in _INSIDES)
            and hasattr(exporter._client, "export"))


class WireSpanExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` whose request bodies come from :class:`Encoder`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._encoder = Encoder()
        self._fast = fits(self)
        if not self._fast:
            log.info("OTLP span export through the SDK's encoder: this SDK's exporter is not the one Sluice knows")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._fast or self._shutdown:
            return super().export(spans)
        try:
            body = self._encoder.request(spans)
        except Exception:  # noqa: BLE001 — anything it cannot write, the SDK's encoder writes (or reports)
            log.debug("span batch not written by Sluice's encoder; using the SDK's", exc_info=True)
            return super().export(spans)
        # From here on as the SDK's export does it, with the body already written.
        with self._metrics.export_operation(len(spans)) as result:
            if 0 < self._max_request_size < len(body):  # limits the body before compression
                log.warning("Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.",
                            len(body), self._max_request_size)
                result.error = RequestPayloadTooLargeError(
                    f"Serialized span request size {len(body)} bytes exceeds max_request_size "
                    f"{self._max_request_size} bytes.")
                return SpanExportResult.FAILURE
            sent = self._client.export(body)
            if not sent.success:
                result.error = sent.error
                status = getattr(sent, "status_code", None)
                result.error_attrs = {"http.response.status_code": status} if status is not None else None
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
