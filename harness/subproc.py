"""Child processes of the harness: the environment that lets them import this repository, and
running one with a deadline, killing its whole process group when it passes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def env_with_repo(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of ``environ`` with this repository first on ``PYTHONPATH`` (a child started
    from elsewhere still imports ``harness`` and ``kernels`` from here)."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), environ.get("PYTHONPATH")) if p)
    return env


def run_killable(cmd: list[str], *, env: dict, cwd: str | Path, timeout_s: float) -> tuple[int | None, str, float]:
    """(exit code, or None when the deadline killed it; stdout+stderr; seconds)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    except BaseException:  # an interrupt (Ctrl-C, a command limit's SIGINT) ends the child's group too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return rc, out.decode(errors="replace"), time.perf_counter() - start
