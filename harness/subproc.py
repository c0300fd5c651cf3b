"""Running a child process with a deadline, killing its whole process group when it passes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


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
