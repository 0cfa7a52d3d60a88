from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    label = "sluice"
    verbose_name = "Sluice"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core import checks  # noqa: F401  (registers system checks)
