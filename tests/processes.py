"""Live processes in the harness's own tests: whether a pid is running, waiting for it to end,
and a real SIGINT delivered to this process while a block runs."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path


class SigintWhen:
    """Within the block, send this process a real SIGINT from another thread (as Ctrl-C or
    ``timeout -s INT`` would) once ``ready()`` holds; ``sent_at`` is when. The handler raises
    KeyboardInterrupt in the main thread, as Python's own does, only while the block runs."""

    def __init__(self, ready) -> None:
        self.ready, self.sent_at = ready, None
        self.armed, self.thread = threading.Event(), threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        deadline = time.monotonic() + 120
        while self.armed.is_set() and time.monotonic() < deadline:
            if self.ready():
                self.sent_at = time.monotonic()
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    def _handle(self, signum, frame) -> None:
        if self.armed.is_set():
            raise KeyboardInterrupt

    def __enter__(self) -> SigintWhen:
        self.old = signal.signal(signal.SIGINT, self._handle)
        self.armed.set()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.armed.clear()
        self.thread.join()
        signal.signal(signal.SIGINT, self.old)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def ended(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
