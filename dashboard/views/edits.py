"""The body an edit-and-retry form sent, with the bytes the operator did not touch kept.

A browser changes a textarea's text on the way: the HTML parser drops one leading newline
and turns CRLF into LF, and a form post turns every line break into CRLF.  So the page
writes a newline after ``<textarea>`` (the parser eats that one instead of the body's), and
here the line breaks are given back the style the stored body had; an untouched body is the
stored one, byte for byte.

A url-encoded field is capped by Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB, well below a
4 MiB message), so the page's script (static/dashboard/edit.js) sends the text as a file
part, ``body_file``, which only SLUICE_MAX_BODY_BYTES limits.  Without JavaScript the
textarea field ``body`` is used (and the 2.5 MB cap applies).
"""
from __future__ import annotations

from django.http import HttpRequest

from core.conf import get_settings


class BodyRefused(Exception):
    """The submitted body cannot be used (too big, not UTF-8): a message for the page."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _lines(text: str) -> str:
    """Every line break as LF (what a textarea holds)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def restore_line_breaks(stored: str, submitted: str) -> str:
    """``submitted`` with the line breaks ``stored`` had: the stored text itself when only the
    line breaks differ (nothing was edited); CRLF throughout when the stored text used CRLF
    only; LF otherwise."""
    edited = _lines(submitted)
    if edited == _lines(stored):
        return stored
    lone_lf = "\n" in stored.replace("\r\n", "")
    if "\r\n" in stored and not lone_lf:
        return edited.replace("\n", "\r\n")
    return edited


def submitted_body(request: HttpRequest, stored: str) -> str:
    """The edited body of an edit-and-retry post (file part ``body_file``, else field ``body``)."""
    limit = get_settings().MAX_BODY_BYTES
    upload = request.FILES.get("body_file")
    if upload is None:
        raw = request.POST.get("body", "")
    else:
        if upload.size > limit:
            raise BodyRefused(f"the edited body is {upload.size} bytes; SLUICE_MAX_BODY_BYTES allows {limit}", 413)
        try:
            raw = upload.read().decode("utf-8")
        except UnicodeDecodeError:
            raise BodyRefused("the edited body is not UTF-8 text") from None
    return restore_line_breaks(stored, raw)
