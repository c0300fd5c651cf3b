"""Child processes of the harness: the environment that lets them import this repository, and
running one with a deadline, killing its whole process group when it passes.

Each child runs in a session of its own, so an interrupt (Ctrl-C, a command limit's SIGINT)
never reaches it: Python hands the interrupt to the main thread alone. A child run from the
main thread is killed there; children run from worker threads are registered in a
:class:`ChildGroups` whose :meth:`~ChildGroups.kill_all` the main thread calls."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.25  # how often a running child is checked for having exited with its pipe still held
PIPE_GRACE_S = 2.0  # how long a pipe may stay open after the child exited (a process it left behind)
DRAIN_S = 1.0  # how long the output is read after the group was killed


def env_with_repo(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of ``environ`` with this repository first on ``PYTHONPATH`` (a child started
    from elsewhere still imports ``harness`` and ``kvbits`` from here)."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), environ.get("PYTHONPATH")) if p)
    return env


class ChildrenStopped(RuntimeError):
    """The child was killed, or not started, because :meth:`ChildGroups.kill_all` was called."""


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (nothing when it is gone already)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


class ChildGroups:
    """The process groups of the children that :func:`run_killable` runs for one caller, from any
    thread. :meth:`kill_all` kills every one running and makes later starts raise
    :class:`ChildrenStopped`, so that a run cut short by an interrupt leaves no child behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen] = {}
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """Whether :meth:`kill_all` was called."""
        return self._stopped

    def start(self, cmd: list[str], **popen_args) -> subprocess.Popen:
        """Start ``cmd`` in a new session and register its group (ChildrenStopped after kill_all)."""
        with self._lock:
            if self._stopped:
                raise ChildrenStopped(f"not started after the run was stopped: {cmd[0]}")
            proc = subprocess.Popen(cmd, start_new_session=True, **popen_args)
            self._running[proc.pid] = proc
        return proc

    def forget(self, proc: subprocess.Popen) -> None:
        """Take an ended child out of the registry."""
        with self._lock:
            self._running.pop(proc.pid, None)

    def kill_all(self) -> None:
        """Kill every registered group and refuse new children (safe from any thread)."""
        with self._lock:
            self._stopped = True
            for pid in self._running:
                kill_group(pid)


def _drain(proc: subprocess.Popen) -> bytes:
    """What is left of the output once the group is dead; a process that left the group
    (``setsid``) and still holds the pipe gets :data:`DRAIN_S` seconds, then the pipe is closed."""
    try:
        out, _ = proc.communicate(timeout=DRAIN_S)
        return out or b""
    except subprocess.TimeoutExpired as exc:
        proc.stdout.close()
        proc.wait()
        return exc.output or b""


def _communicate(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, bytes]:
    """(exit code, or None when the deadline passed first; output). A child that exited while
    something it started still holds its pipe keeps its exit code: the group is killed after
    :data:`PIPE_GRACE_S` seconds."""
    deadline = time.monotonic() + timeout_s
    exited_at: float | None = None
    while True:
        try:
            out, _ = proc.communicate(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            return proc.returncode, out or b""
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if now >= deadline or (exited_at is not None and now - exited_at >= PIPE_GRACE_S):
            break
    rc = proc.poll()
    kill_group(proc.pid)
    return rc, _drain(proc)


def run_killable(cmd: list[str], *, env: dict, cwd: str | Path, timeout_s: float,
                 groups: ChildGroups | None = None) -> tuple[int | None, str, float]:
    """(exit code, or None when the deadline killed it; stdout+stderr; seconds). ``groups``
    registers the child so that another thread can kill it (then this raises ChildrenStopped)."""
    groups = groups or ChildGroups()
    start = time.perf_counter()
    proc = groups.start(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        rc, out = _communicate(proc, timeout_s)
    except BaseException:  # an interrupt (Ctrl-C, a command limit's SIGINT) ends the child's group too
        kill_group(proc.pid)
        proc.wait()
        raise
    finally:
        groups.forget(proc)
    if groups.stopped:
        raise ChildrenStopped(f"killed when the run was stopped: {cmd[0]}")
    return rc, out.decode(errors="replace"), time.perf_counter() - start
