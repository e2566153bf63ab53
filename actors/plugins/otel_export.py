"""A tracer provider built from the standard ``OTEL_*`` environment, for the ``otel``
plug-in (:mod:`actors.plugins.otel`) and for embedders who want the same set-up.

The SDK's own environment set-up (``opentelemetry-instrument``) is not public API, hence
:func:`build_tracer_provider`. OpenTelemetry stays optional: nothing here imports it
until a function is called.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from runtime.errors import ConfigurationError
from runtime.logging import get_logger

EXPORT_TIMEOUT = 2.0
"""Seconds an OTLP export may take, retries included, unless ``OTEL_EXPORTER_OTLP_TIMEOUT``
or ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` says otherwise. The exporters' own default (10 s
of retries) held a one-turn ``run --otel`` open that long after its answer whenever no
collector listened."""
_TIMEOUT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
_EXPORTER_LOGGERS = "opentelemetry.exporter.otlp"
"""The OTLP exporters' stdlib loggers (a retry warning per attempt, then an error):
silenced by :func:`build_tracer_provider`, whose exporters report a failure once."""


def import_otel() -> Any:
    """The ``opentelemetry.trace`` module, or a :class:`ConfigurationError` saying what to
    install."""
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ConfigurationError(
            "OpenTelemetry tracing needs the opentelemetry packages: "
            "pip install 'axon-runtime[otel]'"
        ) from exc
    return trace


_PROTOCOLS = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}


def build_tracer_provider(*, service_name: str = "axon") -> Any:
    """An SDK ``TracerProvider`` exporting in batches to what the standard variables name.

    ``OTEL_TRACES_EXPORTER`` (comma-separated; default ``otlp``; ``console``, ``none``, or
    any installed ``opentelemetry_traces_exporter`` entry point); ``otlp`` uses the
    protocol in ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``
    (default ``http/protobuf``). The exporters read their own variables
    (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``..._HEADERS``...), the SDK reads the resource
    (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), sampler and batch settings;
    ``service_name`` applies when ``OTEL_SERVICE_NAME`` is unset. ``console`` writes to
    stderr, since stdout is the CLI's answer (or its JSON lines). The SDK's own
    environment set-up (``opentelemetry-instrument``) is not public API, hence this.

    An OTLP export gives up after :data:`EXPORT_TIMEOUT` seconds, retries included,
    unless a ``..._TIMEOUT`` variable is set; a failed export is one ``otel.export_failed``
    structlog warning (the first, and the first after a success), and the exporters' own
    log lines (a warning per retry) are silenced, process-wide.
    """
    from importlib.metadata import entry_points

    import_otel()
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise ConfigurationError(
            "OpenTelemetry export needs the SDK: pip install 'axon-runtime[otel]'"
        ) from exc
    env = os.environ
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return provider
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    installed = {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}
    for name in names:
        if name == "none":
            continue
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
            continue
        provider.add_span_processor(BatchSpanProcessor(_installed_exporter(name, installed)))
    return provider


def _installed_exporter(name: str, installed: dict[str, Any]) -> Any:
    """The exporter ``OTEL_TRACES_EXPORTER`` names, from its entry point (``otlp``: the
    one of the configured protocol), reporting failed exports (:func:`_reporting`)."""
    env = os.environ
    if name == "otlp":
        protocol = env.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        )
        if protocol not in _PROTOCOLS:
            raise ConfigurationError(
                f"unknown OTLP protocol {protocol!r}; use one of {sorted(_PROTOCOLS)}"
            )
        name = _PROTOCOLS[protocol]
    if name not in installed:
        raise ConfigurationError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed "
            f"(installed: {', '.join(sorted(installed)) or 'none'})"
        )
    options: dict[str, Any] = {}
    if name in _PROTOCOLS.values():
        logging.getLogger(_EXPORTER_LOGGERS).setLevel(logging.CRITICAL)
        if not any(env.get(v) for v in _TIMEOUT_VARIABLES):
            options["timeout"] = EXPORT_TIMEOUT
    return _reporting(installed[name].load()(**options), name)


def _reporting(exporter: Any, name: str) -> Any:
    """``exporter``, reporting a failed export as one structlog warning: the first
    failure, and the first again after an export succeeded (a collector that is down
    fails every batch; one line says so, not one per batch and retry)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    log = get_logger("axon.otel")

    class ReportingExporter(SpanExporter):  # type: ignore[misc]
        def __init__(self) -> None:
            self.failing = False

        def export(self, spans: Any) -> Any:
            result = exporter.export(spans)
            if result is SpanExportResult.SUCCESS:
                self.failing = False
            elif not self.failing:
                self.failing = True
                log.warning(
                    "otel.export_failed",
                    exporter=name,
                    endpoint=getattr(exporter, "_endpoint", None),
                    spans=len(spans),
                    hint="is a collector listening? OTEL_EXPORTER_OTLP_ENDPOINT names it; "
                    "spans that cannot be sent are dropped, and said so once until one is sent",
                )
            return result

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return ReportingExporter()


__all__ = ["EXPORT_TIMEOUT", "build_tracer_provider", "import_otel"]
