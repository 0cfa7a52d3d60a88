"""A handler for tests/test_worker_footprint.py's worker process (SLUICE_HANDLER_MODULES):
type ``Modules`` on queue ``footprint`` writes the names of the modules its process has
loaded to the file its body names."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from core.handlers import handler


@handler("footprint", "Modules")
def modules(message, context) -> None:
    Path(message.json()["path"]).write_text(json.dumps(sorted(sys.modules)))
