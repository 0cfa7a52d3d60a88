"""The documentation site and its generated reference: every setting, command and API
endpoint has a description and appears on its reference page; `mkdocs build --strict`
passes (no broken link); the README stays a front door; the version has one source."""
from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import pytest

from sluice import __version__
from sluice.reference import api_entries, command_entries, settings_entries
from tests.conftest import ROOT

no_database = pytest.mark.no_database
#: Internal ticket numbers have no place in product documentation.
TICKET = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def undescribed(entries) -> list[str]:
    return [e.name for e in entries if not e.description.strip()]


@no_database
def test_every_setting_has_a_description():
    entries = settings_entries()
    assert len(entries) > 50
    assert undescribed(entries) == [], "add a #: line above these fields in core/conf.py"


@no_database
def test_every_command_has_a_description():
    entries = command_entries()
    assert {"sluice setup", "sluice status", "sluice queue create", "sluice failed retry"} <= {e.name for e in entries}
    assert undescribed(entries) == [], "give these sub-commands a help= text"


@no_database
def test_every_api_endpoint_has_a_description():
    entries = api_entries()
    assert any(e.name == "GET /api/queues/" for e in entries)
    assert undescribed(entries) == [], "give these API views a summary (extend_schema) or docstring"


@no_database
def test_every_environment_variable_read_by_the_settings_module_is_documented():
    source = (ROOT / "sluice" / "settings.py").read_text()
    read = set(re.findall(r"""(?:environ(?:\.get)?[\[(]|env_flag\(|env_int\()\s*"([A-Z_]+)\"""", source))
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"} <= read
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    assert sorted(name for name in read if f"`{name}`" not in page) == []


@no_database
def test_the_site_builds_strictly_with_the_whole_reference(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {name: (site / "reference" / name / "index.html").read_text() for name in ("settings", "cli", "api")}
    assert [e.name for e in settings_entries() if e.name not in pages["settings"]] == []
    assert [e.name for e in command_entries() if e.name not in pages["cli"]] == []
    missing = [e.name for e in api_entries() if e.name.split(" ", 1)[1] not in pages["api"]]
    assert missing == []


@no_database
def test_the_docs_and_readme_speak_of_the_product_not_of_tickets():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files for m in TICKET.finditer(f.read_text())]
    assert found == []


@no_database
def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    for command in ("make run", "make test", "## Guarantees", "docs/guarantees.md"):
        assert command in readme


@no_database
def test_the_version_has_one_source():
    assert importlib.metadata.version("django-sluice") == __version__
    for argv in ([sys.executable, "-m", "sluice", "--version"], [sys.executable, "manage.py", "sluice", "--version"]):
        result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.stdout.strip() == __version__, result.stderr
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and f"## [{__version__}]" in changelog
