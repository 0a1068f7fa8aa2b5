"""Each worker leaves its exit code for the supervisor: torchrun itself exits 1 whatever its workers returned.

A rank with no record was killed (SIGKILL, OOM, node loss); the supervisor treats that as the root cause.
"""

from __future__ import annotations

import os
from pathlib import Path


def record_exit(code: int) -> None:
    directory = os.environ.get("TRAINFORGE_EXIT_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        Path(directory, f"rank{os.environ.get('RANK', '0')}.code").write_text(str(code))
