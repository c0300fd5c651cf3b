"""Progress lines for long benchmark runs: ``[i/n] name ... 0.612 ms``, flushed at once.

pytest prints one line per test; a benchmark that times many shapes or variants
inside one test uses this to show each measurement as it lands::

    progress = BenchProgress(len(shapes), label="decode", config=request.config)
    for shape in shapes:
        with progress.step(f"S={shape[-1]} splitk") as step:
            step.ms = median_ms(lambda: kernel(...))
            step.note = f"{gbps:.0f} GB/s"

Lines go to stderr. Given the pytest ``config``, they bypass output capture so that
they show live under a plain ``pytest`` run (pytest-xdist workers' output never
reaches the terminal: run benchmarks without ``-n``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass


@dataclass
class Step:
    name: str
    ms: float | None = None  # the figure to print; wall time of the block when left unset
    note: str = ""


class BenchProgress:
    def __init__(self, total: int, *, label: str = "", stream=None, config=None) -> None:
        if not isinstance(total, int) or isinstance(total, bool) or total < 0:
            raise ValueError(f"total must be a non-negative int; got {total!r}")
        self.total = total
        self.label = label
        self.done = 0
        self._stream = stream
        self._config = config
        self.lines: list[str] = []

    def _write(self, line: str) -> None:
        capture = self._config.pluginmanager.getplugin("capturemanager") if self._config is not None else None
        context = capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext()
        with context:
            stream = self._stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()

    def report(self, name: str, ms: float | None = None, note: str = "") -> str:
        """Print and return the line for one finished measurement."""
        self.done += 1
        width = len(str(self.total))
        figure = "failed" if ms is None else f"{ms:.4g} ms"
        head = f"[{self.done:>{width}}/{self.total}]" if self.total else f"[{self.done}]"
        if self.label:
            head += f" {self.label}:"
        line = f"{head} {name} ... {figure}" + (f"  ({note})" if note else "")
        self.lines.append(line)
        self._write(line)
        return line

    @contextlib.contextmanager
    def step(self, name: str):
        """Time a block; prints its line on exit (``failed`` when the block raised)."""
        step = Step(name)
        start = time.perf_counter()
        try:
            yield step
        except BaseException:
            self.report(name, None, step.note or "raised")
            raise
        if step.ms is None:
            step.ms = (time.perf_counter() - start) * 1e3
        self.report(name, step.ms, step.note)
