"""SIGTERM handling that works even when the main thread is stuck.

Python runs signal handlers only between bytecodes of the main thread, so a worker blocked in C++ (a
collective whose peer died, `init_process_group`) never sees a flag-setting handler. CPython's C-level
handler does write the signal number to the wakeup fd at once, though; a watchdog thread reads it, raises
the flag for the training loop, and if the loop has not finished its emergency checkpoint within the grace
period, ends the process with the "preempted" exit code itself.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from trainforge.exits import EXIT_PREEMPTED

log = logging.getLogger("trainforge.runtime")


class PreemptionGuard:
    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.requested = threading.Event()
        self.finished = threading.Event()
        self.received_at: float | None = None
        self._read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd)
        # The handler itself does nothing: the wakeup fd carries the news, so it arrives even mid-C++.
        signal.signal(signal.SIGTERM, lambda *_: None)
        threading.Thread(target=self._watch, name="trainforge-preemption", daemon=True).start()

    def _watch(self) -> None:
        while True:
            data = os.read(self._read_fd, 64)
            if signal.SIGTERM.value in data:
                break
        self.received_at = time.monotonic()
        log.warning("SIGTERM received: checkpointing and exiting (grace %.0f s)", self.grace_s)
        self.requested.set()
        if not self.finished.wait(self.grace_s):
            log.error("training loop did not stop within %.0f s of SIGTERM; exiting without a new checkpoint", self.grace_s)
            from trainforge.exits import record_exit
            record_exit(EXIT_PREEMPTED)
            os._exit(EXIT_PREEMPTED)

    def done(self) -> None:
        self.finished.set()
