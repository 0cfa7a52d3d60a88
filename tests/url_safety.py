"""Every URL a page carries, resolved the way a browser resolves it, and the check that none
leaves its own route (issue 35 item 3): a crafted message id such as ``../alerts/rules/1``
must not turn a button's ``formaction`` into another route."""
from __future__ import annotations

import html as html_lib
import re
from urllib.parse import unquote, urljoin, urlsplit

from django.urls import Resolver404, resolve

#: The attributes a click, a form or htmx turns into a request.
URL_ATTRIBUTES = ("href", "action", "formaction", "hx-get", "hx-post", "hx-put", "hx-patch", "hx-delete")
_ATTRIBUTE = re.compile(r'\s(' + "|".join(re.escape(a) for a in URL_ATTRIBUTES) + r')="([^"]*)"')
#: What the WHATWG URL parser takes as "." and ".." path segments besides the dots themselves.
_DOT = {"%2e": "."}
_DOUBLE_DOT = {".%2e", "%2e.", "%2e%2e"}
#: Route arguments that carry an id or a name from message data.
ID_ARGUMENTS = ("message_id", "conversation_id", "name")


def urls_in(page: str) -> list[tuple[str, str]]:
    """(attribute, URL) of every URL attribute, HTML entities decoded as the browser decodes them."""
    return [(m.group(1), html_lib.unescape(m.group(2))) for m in _ATTRIBUTE.finditer(page)]


def browser_resolve(base: str, url: str) -> str:
    """``url`` resolved against ``base`` as a browser does: urljoin, with the percent-encoded
    dot segments a browser also removes (``%2e%2e``) taken as dots first."""
    split = urlsplit(url)
    segments = []
    for segment in split.path.split("/"):
        lowered = segment.lower()
        segments.append(".." if lowered in _DOUBLE_DOT else _DOT.get(lowered, segment))
    path = "/".join(segments)
    rebuilt = path + (f"?{split.query}" if split.query else "") + (f"#{split.fragment}" if split.fragment else "")
    if split.scheme or split.netloc:
        rebuilt = f"{split.scheme}:" * bool(split.scheme) + f"//{split.netloc}" * bool(split.netloc) + rebuilt
    return urljoin(base, rebuilt)


def _has_dot_segment(url: str) -> bool:
    path = urlsplit(url).path
    return any(s.lower() in (".", "..", "%2e", *_DOUBLE_DOT) for s in path.split("/"))


def problems(base: str, page: str, planted: set[str]) -> list[str]:
    """What is wrong with the page's URLs: one that a browser would move with a dot segment,
    one that leaves the site, one that names no route, and one whose route takes an id or
    name argument that is not one the test planted (or an ordinary queue name) exactly."""
    found = []
    for attribute, url in urls_in(page):
        if url.startswith("#") or url == "":
            continue
        where = f"{attribute}={url!r}"
        if _has_dot_segment(url):
            found.append(f"{where}: a dot segment moves it")
            continue
        absolute = browser_resolve(base, url)
        split = urlsplit(absolute)
        if split.scheme != "http" or split.netloc != "testserver":
            found.append(f"{where}: leaves the site ({absolute})")
            continue
        if split.path.startswith("/static/"):
            continue
        try:
            match = resolve(unquote(split.path))  # the server sees the decoded path (WSGI)
        except Resolver404:
            found.append(f"{where}: {split.path} names no route")
            continue
        for key in ID_ARGUMENTS:
            if key in match.kwargs and match.kwargs[key] not in planted:
                found.append(f"{where}: route {match.url_name} got {key}={match.kwargs[key]!r}, not a planted one")
    return found
