"""run_killable: a deadline kills the child's whole process group, and so does an interrupt or
ChildGroups.kill_all from another thread; a pipe held by a process left behind cannot turn an
ended child into a timeout or hold the run past its deadline."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest
from processes import ended

from harness.run.subproc import ChildGroups, ChildrenStopped, run_killable

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


def test_kill_all_ends_the_children_of_other_threads_and_starts_no_more(tmp_path):
    """What the main thread does on an interrupt: the child a worker thread runs is killed with
    its group, the worker gets ChildrenStopped instead of a result, and no new child starts."""
    marker = tmp_path / "pids"
    groups = ChildGroups()
    outcome: list = []

    def worker():
        try:
            outcome.append(run_killable(_child(marker), env=dict(os.environ), cwd=tmp_path, timeout_s=60,
                                        groups=groups))
        except ChildrenStopped as exc:
            outcome.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    pids = _pids(marker)
    groups.kill_all()
    thread.join(timeout=10)
    assert not thread.is_alive() and isinstance(outcome[0], ChildrenStopped), outcome
    assert all(ended(pid) for pid in pids)
    late = tmp_path / "late"
    with pytest.raises(ChildrenStopped):
        run_killable(["touch", str(late)], env=dict(os.environ), cwd=tmp_path, timeout_s=60, groups=groups)
    assert not late.exists()


def test_a_child_that_exits_keeps_its_exit_code_while_a_process_it_left_holds_the_pipe(tmp_path):
    """A background grandchild keeps stdout open after the child exits 0: the result is exit 0
    soon after (not a timeout at the deadline), and the grandchild is killed with the group."""
    marker = tmp_path / "pid"
    script = f"sleep 60 & echo $! > {marker}; echo done; exit 0"
    rc, out, seconds = run_killable(["sh", "-c", script], env=dict(os.environ), cwd=tmp_path, timeout_s=60)
    assert (rc, out.strip()) == (0, "done") and seconds < 30
    assert ended(int(marker.read_text()))


def test_a_process_that_left_the_group_cannot_hold_the_run_past_its_deadline(tmp_path):
    """A grandchild in a session of its own is out of reach of the group kill and holds the pipe:
    the run still ends soon after its deadline, as a timeout."""
    marker = tmp_path / "pid"
    escaped = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    code = ("import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', {escaped!r}], start_new_session=True)\n"
            "time.sleep(60)\n")
    try:
        rc, _, seconds = run_killable([sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path,
                                      timeout_s=2)
        assert rc is None and seconds < 20
    finally:
        pid = _pids(marker)[0]
        os.kill(pid, signal.SIGKILL)
