from django.apps import AppConfig

from core.tracing import configure as configure_tracing


class CoreConfig(AppConfig):
    name = "core"
    label = "sluice"
    verbose_name = "Sluice"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks.  Here, not at the top: they reach the models
        # (through core.outbox), which cannot load before the app registry is ready.
        from core import checks  # noqa: F401
        # SLUICE_OTEL: set up the OpenTelemetry SDK once the settings can be read.  A setting
        # of the wrong type is reported by the system checks (sluice.E002), with its name,
        # rather than by a traceback here.
        try:
            configure_tracing()
        except ValueError:
            pass
