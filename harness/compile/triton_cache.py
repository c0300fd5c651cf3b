"""A Triton cache manager that compiles each kernel specialization once per host.

pytest-xdist workers share Triton's on-disk cache, but workers that launch the same
specialization at the same moment all miss it and all compile it: cold suites spread over
16 workers spent twice the compile time of 8. :class:`CompileOnceCacheManager` takes a
file lock of the specialization's cache directory on a miss and looks again once it holds
it, so the first process compiles and stores while the others wait, then load what it
stored. The lock is dropped when the compiled group is stored, when the manager is freed,
by :func:`release_all` (the harness's pytest plugin calls it after every test, so a compile
that failed, whose manager a traceback may keep alive, holds nobody up past its test), or
by the system when the process ends; a waiter gives up waiting after :data:`WAIT_S`
seconds and compiles by itself.

Select it with ``TRITON_CACHE_MANAGER=harness.compile.triton_cache:CompileOnceCacheManager``
(``harness.run.commands.plan`` does for the suites of a GPU run).
"""

from __future__ import annotations

import fcntl
import itertools
import os
import time

from triton.runtime.cache import FileCacheManager

LOCK_FILE = "compiling.lock"
WAIT_S = 600.0
POLL_S = 0.02
# this process's compiles stored, and compiles it waited for and then loaded from another
STATS = {"stored": 0, "loaded_after_wait": 0}
_HELD: dict[int, int] = {}  # this process's held locks: token -> descriptor of the lock file
_tokens = itertools.count(1)


def release_all() -> int:
    """Drop every lock this process holds (compiles it began and never stored); how many."""
    count = 0
    while _HELD:
        _, fd = _HELD.popitem()
        os.close(fd)  # closing the descriptor drops the process's lock
        count += 1
    return count


class CompileOnceCacheManager(FileCacheManager):
    """Triton's file cache, with one compile per specialization across processes."""

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self._guards_compiles = not (override or dump)
        self._lock_token: int | None = None

    def get_group(self, filename: str):
        found = super().get_group(filename)
        if not self._guards_compiles or _complete(found, filename) or self.holds_lock:
            return found
        self._lock()
        found = super().get_group(filename)  # stored by another process while this one waited
        if _complete(found, filename):
            STATS["loaded_after_wait"] += 1
            self._unlock()
        return found

    def put_group(self, filename: str, group):
        try:
            path = super().put_group(filename, group)
            if self._guards_compiles:
                STATS["stored"] += 1
            return path
        finally:
            self._unlock()

    def _lock(self) -> None:
        fd = os.open(os.path.join(self.cache_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(POLL_S)
                    continue
                os.close(fd)  # waited long enough: compile without the lock
                return
            self._lock_token = next(_tokens)
            _HELD[self._lock_token] = fd
            return

    @property
    def holds_lock(self) -> bool:
        return self._lock_token is not None and self._lock_token in _HELD

    def _unlock(self) -> None:
        token, self._lock_token = self._lock_token, None
        fd = _HELD.pop(token, None) if token is not None else None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the process's lock

    def __del__(self) -> None:
        self._unlock()


def _complete(group, filename: str) -> bool:
    """A stored compile: the group lists the metadata file Triton looks for."""
    return bool(group) and filename in group
