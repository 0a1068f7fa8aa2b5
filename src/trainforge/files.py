"""Files another process reads while this one writes them."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Write `text` so that a reader sees the old file or the new one, never an empty or half-written one (a plain
    write truncates first). The temporary file is hidden, so a listing by pattern (`rank*.code`, `*.pid`) never
    includes it, and its own per thread: a worker's preemption watcher may record its exit while the main thread does."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
