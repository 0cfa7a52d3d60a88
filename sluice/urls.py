from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("dashboard.urls")),
]

# Under /api/ a crash answers {"error": ...} JSON too (dashboard/api/errors.py).
handler404 = "dashboard.api.errors.page_not_found"
handler500 = "dashboard.api.errors.server_error"
