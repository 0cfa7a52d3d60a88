"""``GET <mount>/favicon.ico``: browsers ask for it on their own (before or beside the
pages' ``<link rel="icon">``), and a 404 on every first visit fills logs.  It sends them to
the SVG icon among the static files, under ``STATIC_URL`` (the script prefix included), so it
works wherever the dashboard is mounted."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static

#: The icon's static path (base.html links it too).
FAVICON = "dashboard/favicon.svg"


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """A redirect browsers cache for a day (the static name changes with the icon)."""
    response = HttpResponseRedirect(static(FAVICON))
    response["Cache-Control"] = "public, max-age=86400"
    return response
