"""Hostile message data (bodies, headers, types, ids, exception texts carrying ``<script>`` and
an attribute break-out) renders inert on every page that shows it: escaped, never as markup."""
from __future__ import annotations

import pytest

from core.delayed import delayed_store
from core.messages import Headers
from core.transport import Transport
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    XSS_IMG, XSS_IMG_ESCAPED, XSS_SCRIPT, XSS_SCRIPT_ESCAPED, _fresh_dashboard_cache, fail_message, operator,
    operator_client,
)

HOSTILE_BODY = f'{{"note": "{XSS_SCRIPT}", "x": "{XSS_IMG.replace(chr(34), "")}"}}'


def assert_inert(html: str, *, where: str) -> None:
    assert "<script>window.__pwned" not in html, where
    assert "<img src=x" not in html, where
    assert XSS_SCRIPT_ESCAPED in html or XSS_IMG_ESCAPED in html or "&lt;img src=x" in html, where


@pytest.fixture
def hostile(make_queue, error_queue):
    queue = make_queue()
    transport = Transport()
    headers = {"X-Evil": XSS_IMG, "X-Script": XSS_SCRIPT}
    transport.send(queue, XSS_SCRIPT + XSS_IMG, message_type=XSS_SCRIPT, headers=headers,
                   message_id="id" + XSS_IMG)
    record = fail_message(queue, body=XSS_SCRIPT + XSS_IMG, exception_type="ValueError",
                          exception_message=XSS_SCRIPT + XSS_IMG, message_type=XSS_IMG, headers=headers,
                          message_id="fail" + XSS_IMG)
    return queue, record


def test_queue_pages_escape_message_data(operator_client, hostile):
    queue, _ = hostile
    listing = operator_client.get(f"/queues/{queue}/").content.decode()
    assert_inert(listing, where="queue list")
    assert XSS_IMG_ESCAPED in listing  # the message id column
    row = Transport().browse(queue)[0]
    detail = operator_client.get(f"/queues/{queue}/messages/{row.row_version}/").content.decode()
    assert_inert(detail, where="message detail")
    assert XSS_SCRIPT_ESCAPED in detail and XSS_IMG_ESCAPED in detail
    assert 'hx-disable' in detail  # message data never drives htmx either


def test_failed_pages_escape_message_data(operator_client, hostile):
    _, record = hostile
    for url in ("/failed/", f"/failed/?q={record.message_id[:6]}", "/failed/?by=message_type",
                f"/failed/{record.pk}/", f"/failed/{record.pk}/edit/"):
        html = operator_client.get(url).content.decode()
        assert_inert(html, where=url)
    detail = operator_client.get(f"/failed/{record.pk}/").content.decode()
    assert detail.count(XSS_SCRIPT_ESCAPED) >= 3  # exception message, body, header
    edit = operator_client.get(f"/failed/{record.pk}/edit/").content.decode()
    assert f'value="{XSS_IMG_ESCAPED}"' in edit  # a header value inside an input: the quote cannot break out


def test_delayed_page_escapes_message_data(operator_client, make_queue):
    store = delayed_store()
    store.setup_infrastructure()
    queue = make_queue()
    Transport().send(queue, XSS_SCRIPT, message_type=XSS_SCRIPT, message_id="d" + XSS_IMG, delay=600)
    try:
        html = operator_client.get("/delayed/").content.decode()
        assert_inert(html, where="delayed")
        assert XSS_SCRIPT_ESCAPED in html and XSS_IMG_ESCAPED in html
    finally:
        for m in store.list(1000)[0]:
            if m.destination == queue:
                store.delete(m.id)


def test_audit_page_escapes_targets(operator_client, hostile):
    queue, _ = hostile
    operator_client.post(f"/queues/{queue}/delete/", {"ids": ["id" + XSS_IMG]})
    html = operator_client.get("/audit/").content.decode()
    assert_inert(html, where="audit")
    assert XSS_IMG_ESCAPED in html


def test_overview_of_hostile_data_renders(operator_client, hostile):
    html = operator_client.get("/").content.decode()
    assert "<script>window.__pwned" not in html and "<img src=x" not in html
    assert Headers.MESSAGE_ID not in html  # the overview shows counts, not message data
