"""``/send/``: send a message from the page (operators): queue, message type, a JSON body,
headers as a JSON object, delay and TTL.  A refused message is the form again, with what
was typed and why it was refused; a sent one opens its message page (a delayed one, the
delayed page of its queue)."""
from __future__ import annotations

from urllib.parse import quote

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from core.queues import list_queues
from dashboard import actions
from dashboard.actions import ActionError, ActionResult
from dashboard.counting import stats
from dashboard.views.common import error_response, operator_only, page

FIELDS = ("queue", "message_type", "body", "headers", "delay", "ttl")


def _form(request: HttpRequest, values: dict[str, str], error: str = "", status: int = 200) -> HttpResponse:
    return page(request, "dashboard/send.html", {
        "section": "queues", "v": values, "error": error,
        "queues": [q.name for q in list_queues()],
    }, status=status)


def _after(queue: str, sent: ActionResult) -> str:
    if sent.delayed:
        return f"{reverse('dashboard:delayed')}?destination={quote(queue)}"
    if sent.row_version is None:  # a worker took it already: its queue
        return reverse("dashboard:queue", args=[queue])
    return reverse("dashboard:message", args=[queue, sent.row_version])


@operator_only("send_message")
def send(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD", "POST"):
        return error_response(request, "GET shows the form; POST sends.", 405)
    if request.method != "POST":
        return _form(request, {"queue": request.GET.get("queue", "")[:100], "body": "{}", "headers": ""})
    values = {name: request.POST.get(name, "") for name in FIELDS}
    try:
        sent = actions.send_message(request.user, values["queue"], body=values["body"],
                                    message_type=values["message_type"], headers=values["headers"],
                                    delay=values["delay"], ttl=values["ttl"], via="web")
    except PermissionDenied as exc:
        return error_response(request, str(exc), 403)
    except ActionError as exc:
        return _form(request, values, exc.message, exc.status)
    stats.forget_snapshot()
    messages.success(request, sent.message[:1].upper() + sent.message[1:] + ".")
    return HttpResponseRedirect(_after(values["queue"], sent), status=303)
