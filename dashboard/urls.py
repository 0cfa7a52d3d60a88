from django.urls import include, path

from dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", include("dashboard.api.urls")),  # the JSON API (/api/…) and /metrics
    path("", views.overview, name="overview"),
    path("partials/queues/", views.queue_table, name="queue-table"),
    path("healthz", views.healthz, name="healthz"),
]
