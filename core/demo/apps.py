from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "core.demo"
    label = "sluice_demo"
    verbose_name = "Sluice demo endpoint"
    default_auto_field = "django.db.models.BigAutoField"
