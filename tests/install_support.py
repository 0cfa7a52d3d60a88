"""Building the wheel of this tree and installing it into fresh virtualenvs, as a user would:
shared by the clean-install test and the own-project test that follows the docs."""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT

CACHE = ROOT / "var" / "clean-install"
#: Inherited from the test run's environment: nothing else (no PYTHONPATH, no VIRTUAL_ENV,
#: no SLUICE_* or DJANGO_* of the suite's own).
PASSED_THROUGH = ("PATH", "HOME", "LANG", "TMPDIR", "SPARK_LOCAL_IP")


# -- the wheel and its venvs ----------------------------------------------------------------------

def build_wheel(tmp_path_factory) -> Path:
    """The wheel of this tree, built from a copy (pip's build writes beside the sources)."""
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
    source = tmp_path_factory.mktemp("source") / "sluice"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "var", "build", "*.egg-info", "__pycache__", "node_modules", "test-results"))
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
         "-w", str(out), str(source)], cwd=source, env=os.environ.copy(), timeout=300)
    (built,) = out.glob("django_sluice-*.whl")
    return built


def installed_venv(wheel: Path, extras: str = "") -> Path:
    """A venv with ``wheel[extras]`` installed, reused while the wheel's contents are the same."""
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        key = hashlib.sha256(zf.read(record) + extras.encode() + sys.version.encode()).hexdigest()[:16]
    # One cache entry per interpreter: make test's Django 6.1 leg (Python 3.12) installs the
    # wheel while the main passes (Python 3.11) use theirs, so neither may remove the other's.
    kind = f"{extras or 'base'}-py{sys.version_info.major}{sys.version_info.minor}"
    venv = CACHE / f"{kind}-{key}"
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    # make test runs its passes as parallel pytest processes, and two of them may want this
    # venv at once (the clean-install test and the own-project test in different passes): one
    # builds it while the other waits, rather than removing the other's half-made venv.
    with open(CACHE / f"{kind}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").exists():
            return venv
        for stale in CACHE.glob(f"{kind}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)], cwd=CACHE.parent, env=clean_env(), timeout=120)
        requirement = f"{wheel}[{extras}]" if extras else str(wheel)
        run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", requirement],
            cwd=CACHE.parent, env=clean_env(), timeout=600)
        (venv / ".complete").touch()
    return venv


# -- running the installed commands ----------------------------------------------------------------

def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120,
        check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)
    if check:
        assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


