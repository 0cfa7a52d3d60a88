from django.urls import path

from dashboard import charts, metrics_api, views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("partials/queues/", views.queue_table, name="queue-table"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics/charts/", charts.charts, name="metrics-charts"),
    path("metrics/charts/run/", charts.run_now, name="metrics-run"),
    path("api/metrics/", metrics_api.metrics, name="api-metrics"),
]
