"""mkdocs hooks (mkdocs.yml ``hooks:``): fill the reference pages from the code at build time.

A page's ``<!-- reference: settings -->`` (or ``commands``, ``api``) marker becomes the
Markdown sluice.reference generates, so the site always matches the code it documents.
"""
from __future__ import annotations

import os
import re
from typing import Any

MARKER = re.compile(r"<!--\s*reference:\s*(\w+)\s*-->")


def on_config(config: Any) -> Any:
    # The reference reads Django's settings and URLconf; no database is touched.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sluice.settings")
    import django

    django.setup()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    from sluice.reference import GENERATORS

    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
