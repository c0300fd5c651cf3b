"""run_killable: a deadline kills the child's whole process group, and so does an interrupt."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from harness.subproc import run_killable

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX signals")


def _child(marker) -> list[str]:
    """A child that writes its pid, starts a grandchild in its group, and sleeps."""
    code = ("import os, subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(marker)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}')\n"
            "time.sleep(60)\n")
    return [sys.executable, "-c", code]


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie grandchild of ours counts as gone once reaped by init; ours we reap here
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def _pids(marker, within_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text().strip():
            return [int(p) for p in marker.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the child never started")


def test_the_deadline_kills_the_group(tmp_path):
    marker = tmp_path / "pids"
    rc, _, seconds = run_killable(_child(marker), env=dict(os.environ), cwd=tmp_path, timeout_s=3)
    assert rc is None and seconds < 30
    assert all(_gone(pid) for pid in _pids(marker))


def test_an_interrupt_kills_the_group_and_reaches_the_caller(tmp_path):
    marker = tmp_path / "pids"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 3.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_killable(_child(marker), env=dict(os.environ), cwd=tmp_path, timeout_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert all(_gone(pid) for pid in _pids(marker))
