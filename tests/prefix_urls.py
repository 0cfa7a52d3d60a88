"""A URLconf like a host project's (docs/django-project.md): the dashboard mounted under
/ops/ beside pages of the project's own; tests/test_theme.py and tests/test_sso.py use it."""
from django.http import HttpResponse
from django.urls import include, path


def home(request):
    return HttpResponse("the host project's own page")


urlpatterns = [
    path("", home),
    path("ops/", include("dashboard.urls")),
]
