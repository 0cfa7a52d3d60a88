"""OpenTelemetry traces and metrics for Sluice (off unless ``SLUICE_OTEL=1``).

The engine depends on ``opentelemetry-api`` only; the SDK and the OTLP exporters are the
``[otel]`` extra, imported by :mod:`core.tracing.sdk` when tracing is switched on.

By what each module holds:

- ``state``: the one switch the hot paths read (``state.current``, None when off), the
  tracer, the meter and its instruments; :func:`install` / :func:`uninstall`;
- ``propagation``: W3C ``traceparent`` / ``tracestate`` / ``baggage`` in message headers;
- ``producing``: the ``send {queue}`` span and the outbox / delayed-mover forward spans;
- ``consuming``: the ``process {queue}`` spans of one receive batch and its metrics;
- ``parents``: where a message's process span starts (its parent context and links);
- ``sdk``: the SDK set-up from the standard ``OTEL_*`` variables (imported only when on).

Off, every hook is one test of a module attribute: no span, context or attribute
object is made.
"""
from core.tracing.state import Telemetry, active, configure, install, uninstall

__all__ = ["Telemetry", "active", "configure", "install", "uninstall"]
