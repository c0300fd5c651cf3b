"""Timing on the GPU: per-repeat times from ``triton.testing.do_bench`` (kept as a distribution),
whether a call is bound by the host or the device, and the copy-bandwidth ceiling.

Bandwidth is always computed from the fewest bytes an operation must move (each
input read once, each output written once); the ceiling is a device-to-device
copy measured in the same process, counting bytes read plus bytes written.

A timed call keeps its repeats' distribution (:class:`Timing`): a benchmark records the median
as ``ms`` and the spread beside it (``ms_n``, ``ms_min``, ``ms_iqr``, ``ms_mad``,
:meth:`Timing.metrics`), which the regression check weighs a change against. ``bound_metrics``
says whether the figure is the device's time or the host's cost of issuing the call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache

import torch

from .noise import Timing  # defined without torch, so the run history can summarize runs with it

COPY_BYTES = 2 * 2**30  # source size for the ceiling: far larger than any L2
ROTATE_BYTES = 192 << 20  # bytes read across one replay's calls: several times an H200's 60 MB L2
# A call is host-bound when issuing it costs the host at least this share of the device's time
# for it: from there on the host's speed (and its jitter) shows in the figure.
HOST_BOUND_RATIO = 0.8
ISSUE_CALLS = 32  # back-to-back calls timed on the host: few enough never to fill the launch queue
PROFILED_CALLS = 8  # calls whose device activity the profiler sums


def _on_gpu(device=None) -> bool:
    """Whether a call on ``device`` (None: wherever the harness times) is timed with CUDA events."""
    return torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")


def _wall_clock_samples(fn: Callable[[], object], rep_ms: float) -> list[float]:
    fn()
    times = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def time_call(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100, device=None) -> Timing:
    """Every repeat of ``fn`` in ms: CUDA events on a GPU (``do_bench``, ``return_mode="all"``),
    the wall clock on CPU. ``device="cpu"`` on a GPU host times a CPU baseline by the wall clock
    too: CUDA events around host work would only time the host, with two event launches on top."""
    if _on_gpu(device):
        import triton.testing

        return Timing.of(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all"))
    return Timing.of(_wall_clock_samples(fn, rep_ms))


def median_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn`` in ms: CUDA events on a GPU, wall clock on CPU."""
    return time_call(fn, warmup_ms=warmup_ms, rep_ms=rep_ms).median


def graph_replay_timing(calls, *, rep_ms: float = 20) -> Timing:
    """The ms of one call, the calls being ``calls`` (a non-empty list of zero-argument
    callables, typically one per rotated input set) run in order. On a GPU:
    ``triton.testing.do_bench_cudagraph`` of one pass over them, which captures as many passes as
    fill ``rep_ms`` in one CUDA graph and replays it (its repeats are the replays), so neither
    host launch gaps nor the graph's own launch stay in the figure (each call's kernel launches
    do); with inputs rotated (``rotations``) each call reads from DRAM. On CPU the passes run in
    a loop."""
    calls = list(calls)
    if not calls:
        raise ValueError("calls must hold at least one callable")
    for call in calls:  # warm-up: compile, build cached views, host copies
        call()

    def one_pass():
        for call in calls:
            call()

    if not torch.cuda.is_available():
        return time_call(one_pass, rep_ms=50).scaled(1 / len(calls))
    import triton.testing

    torch.cuda.synchronize()
    replays = triton.testing.do_bench_cudagraph(one_pass, rep=rep_ms, return_mode="all")
    return Timing.of(replays).scaled(1 / len(calls))


def graph_replay_ms(calls, *, rep_ms: float = 20) -> float:
    """Median ms of one call of ``calls`` replayed in a CUDA graph (:func:`graph_replay_timing`)."""
    return graph_replay_timing(calls, rep_ms=rep_ms).median


def classify_bound(host_ms: float, device_ms: float) -> str:
    """``"host"`` when the host's cost of a call is at least HOST_BOUND_RATIO of the device's
    time for it, else ``"device"``."""
    return "host" if host_ms >= HOST_BOUND_RATIO * device_ms else "device"


def host_issue_ms(fn: Callable[[], object], calls: int = ISSUE_CALLS) -> float:
    """The host's time to issue one call of ``fn``: the wall clock over ``calls`` calls back to
    back with no synchronization between them, so the device's time is not in it, unless
    ``fn`` itself waits for the device (a read-back)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e3 / calls


def device_busy_ms(fn: Callable[[], object], calls: int = PROFILED_CALLS) -> float | None:
    """The device's busy time in one call of ``fn``: its kernels', copies' and fills' durations as
    the profiler records them, averaged over ``calls`` calls; None when the profiler records none."""
    try:
        from torch.profiler import ProfilerActivity, profile

        cuda = torch.autograd.DeviceType.CUDA
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        busy_us = sum(event.device_time_total for event in prof.events() if event.device_type == cuda)
    except Exception:  # a profiler without CUPTI, or one another tool holds: no figure, not a failure
        return None
    return busy_us / 1e3 / calls if busy_us > 0 else None


def bound_metrics(fn: Callable[[], object], figure_ms: float, *, device=None) -> dict:
    """Whether the figure ``figure_ms`` of ``fn`` is bound by the host or the device: ``bound``
    ("host", "device", or "cpu" for a call timed on the CPU alone), ``host_ms`` (the host's time
    to issue one call) and, where it decides, ``busy_ms`` (the device's busy time per call).

    The host issuing faster than HOST_BOUND_RATIO of the figure leaves the device paced by its own
    work: "device". Otherwise the host issues slowly, or ``fn`` waits for the device (a read-back
    makes the host's time the device's): the device's idle time inside the figure tells them
    apart, host-bound when the device waits on the host at least HOST_BOUND_RATIO as long as it
    works. Without a profiler's figure the host's time alone decides."""
    if not _on_gpu(device):
        return {"bound": "cpu"}
    host = host_issue_ms(fn)
    if classify_bound(host, figure_ms) == "device":
        return {"bound": "device", "host_ms": host}
    busy = device_busy_ms(fn)
    if busy is None:
        return {"bound": "host", "host_ms": host}
    return {"bound": classify_bound(max(figure_ms - busy, 0.0), busy), "host_ms": host, "busy_ms": busy}


def rotations(nbytes: int, limit: int = 16) -> int:
    """How many copies of an input of ``nbytes`` one timed replay walks through, so that each call
    reads from DRAM rather than from the L2 the previous call filled (1 on CPU)."""
    return max(1, min(limit, -(-ROTATE_BYTES // max(nbytes, 1)))) if torch.cuda.is_available() else 1


@cache
def copy_bandwidth_gbps(device_index: int = 0, nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy bandwidth in GB/s (read + write bytes), measured once per process."""
    if not torch.cuda.is_available():
        raise RuntimeError("copy bandwidth needs a CUDA device")
    with torch.cuda.device(device_index):
        ms = _copy_ms(nbytes)
        torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


@cache
def write_bandwidth_gbps(device_index: int = 0, nbytes: int = COPY_BYTES) -> float:
    """Write-only bandwidth in GB/s (a fill), measured once per process: the ceiling that
    write-heavy kernels (unpacking: 2.67 bytes written per byte read) approach instead of the copy's."""
    if not torch.cuda.is_available():
        raise RuntimeError("write bandwidth needs a CUDA device")
    with torch.cuda.device(device_index):
        ms = _fill_ms(nbytes)
        torch.cuda.empty_cache()
    return nbytes / (ms * 1e-3) / 1e9


def _fill_ms(nbytes: int) -> float:
    dst = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
    return median_ms(lambda: dst.fill_(7), warmup_ms=50, rep_ms=300)


def _copy_ms(nbytes: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda").random_()
    dst = torch.empty_like(src)
    return median_ms(lambda: dst.copy_(src), warmup_ms=50, rep_ms=300)


def bandwidth_metrics(nbytes: int, ms: float, device_index: int = 0) -> dict:
    """``gbps`` and ``pct_of_peak`` for an operation that must move ``nbytes`` in ``ms``."""
    gbps = nbytes / (ms * 1e-3) / 1e9
    metrics = {"ms": ms, "bytes": nbytes, "gbps": gbps}
    if torch.cuda.is_available():
        peak = copy_bandwidth_gbps(device_index)
        metrics["copy_gbps"] = peak
        metrics["pct_of_peak"] = 100.0 * gbps / peak
    return metrics
