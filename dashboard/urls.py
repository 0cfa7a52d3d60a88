from django.urls import path

from dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("partials/queues/", views.queue_table, name="queue-table"),
    path("healthz", views.healthz, name="healthz"),
]
