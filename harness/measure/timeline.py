"""Where a pytest run's wall time goes outside its tests: for the controller and each
pytest-xdist worker, the moments the process started, was configured, had collected, began
its first test and ended its last. The manifest keeps them (``timeline``) as seconds after the
controller's process start; ``describe`` turns them into the report's one line.

A suite step of 27 s whose tests span 11 s spends the rest starting processes (interpreter,
torch, triton, CUDA contexts, extension loads) and collecting: more GPUs do not shorten that.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping

MARKS = ("started", "configured", "collected", "first_test", "last_test_end", "finished")
KEY = "kvh_timeline"  # the key a worker's marks travel under in xdist's workeroutput


def process_start_time(pid: int | str = "self") -> float | None:
    """Unix time at which process ``pid`` started, from Linux's /proc; None where unreadable.

    /proc gives the start in clock ticks since boot; the boot moment comes from the boot-time
    clock read beside the wall clock (/proc/stat's btime is truncated to whole seconds)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return booted + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Marks:
    """Unix times of one process's moments; ``first`` keeps the earliest, ``last`` the latest."""

    def __init__(self, started: float | None = None) -> None:
        self.times: dict[str, float] = {}
        start = started if started is not None else process_start_time()
        if start is not None:
            self.times["started"] = start

    def first(self, name: str, when: float | None = None) -> None:
        self.times.setdefault(name, time.time() if when is None else when)

    def last(self, name: str, when: float | None = None) -> None:
        self.times[name] = time.time() if when is None else when


def relative(times: Mapping[str, float], origin: float) -> dict[str, float]:
    """Unix times -> seconds after ``origin`` (ms resolution), in MARKS order."""
    return {name: round(times[name] - origin, 3) for name in MARKS if isinstance(times.get(name), (int, float))}


def build(controller: Mapping[str, float], workers: Mapping[str, Mapping[str, float]]) -> dict:
    """The manifest's ``timeline``: every process's marks as seconds after the controller started
    (or after its earliest mark when its start time is unknown)."""
    origin = controller.get("started")
    if origin is None:
        known = [t for marks in (controller, *workers.values()) for t in marks.values()]
        origin = min(known, default=time.time())
    return {
        "origin": round(origin, 3),
        "controller": relative(controller, origin),
        "workers": {name: relative(marks, origin) for name, marks in sorted(workers.items())},
    }


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def phases(timeline: Mapping | None) -> dict | None:
    """Seconds per phase of a run: ``startup`` (controller start to the first test anywhere),
    ``ready`` (each worker's first test, after the controller's start: median, max), ``collected``
    (latest collection end), ``tests`` (first test start to last test end), ``wind_down``
    (last test end to the controller's end) and ``total``. None without a usable timeline."""
    if not isinstance(timeline, Mapping):
        return None
    controller = timeline.get("controller") if isinstance(timeline.get("controller"), Mapping) else {}
    workers = timeline.get("workers") if isinstance(timeline.get("workers"), Mapping) else {}
    processes = [controller, *(w for w in workers.values() if isinstance(w, Mapping))]

    def each(name: str) -> list[float]:
        return [v for p in processes if (v := _finite(p.get(name))) is not None]

    firsts, ends = each("first_test"), each("last_test_end")
    if not firsts or not ends:
        return None
    ready = [v for w in workers.values() if isinstance(w, Mapping) and (v := _finite(w.get("first_test"))) is not None]
    out = {
        "startup": min(firsts),
        "tests": max(ends) - min(firsts),
        "collected": max(each("collected"), default=None),
        "ready_median": statistics.median(ready) if ready else None,
        "ready_max": max(ready) if ready else None,
        "workers": len(ready),  # the workers that ran a test
    }
    finished = _finite(controller.get("finished"))
    if finished is not None:
        out["wind_down"] = max(0.0, finished - max(ends))
        out["total"] = finished
    return out


def describe(timeline: Mapping | None) -> str | None:
    """One line: ``first test at 7.9 s (8 workers ready 5.1 s median, 7.9 s last; collected by
    4.2 s) · tests 11.2 s · wind-down 1.2 s · session ended at 20.3 s``; None without a timeline."""
    p = phases(timeline)
    if p is None:
        return None
    detail = []
    if p["ready_median"] is not None:
        workers = f"{p['workers']} worker" + ("s" if p["workers"] != 1 else "")
        detail.append(f"{workers} ready {p['ready_median']:.1f} s median, {p['ready_max']:.1f} s last")
    if p["collected"] is not None:
        detail.append(f"collected by {p['collected']:.1f} s")
    parts = [f"first test at {p['startup']:.1f} s" + (f" ({'; '.join(detail)})" if detail else ""),
             f"tests {p['tests']:.1f} s"]
    if "total" in p:
        parts += [f"wind-down {p['wind_down']:.1f} s", f"session ended at {p['total']:.1f} s"]
    return " \N{MIDDLE DOT} ".join(parts)


def describe_compiles(counts: Mapping | None) -> str | None:
    """``281 compiled, 5 waited for in another worker`` from a manifest's ``triton_compiles``
    (harness/compile/triton_cache.py); None without counts."""
    if not isinstance(counts, Mapping):
        return None
    stored, waited = counts.get("stored"), counts.get("loaded_after_wait")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (stored, waited)):
        return None
    return f"{stored} compiled, {waited} waited for in another worker"
