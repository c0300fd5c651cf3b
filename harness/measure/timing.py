"""Timing on the GPU: medians from ``triton.testing.do_bench`` and the copy-bandwidth ceiling.

Bandwidth is always computed from the fewest bytes an operation must move (each
input read once, each output written once); the ceiling is a device-to-device
copy measured in the same process, counting bytes read plus bytes written.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

COPY_BYTES = 2 * 2**30  # source size for the ceiling: far larger than any L2
ROTATE_BYTES = 192 << 20  # bytes read across one replay's calls: several times an H200's 60 MB L2


def median_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn`` in ms: CUDA events on a GPU, wall clock on CPU."""
    if torch.cuda.is_available():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    import statistics
    import time

    fn()
    times = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 1000):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graph_replay_ms(calls, *, rep_ms: float = 20) -> float:
    """Median ms of one call, the calls being ``calls`` (a non-empty list of zero-argument
    callables, typically one per rotated input set) run in order. On a GPU:
    ``triton.testing.do_bench_cudagraph`` of one pass over them, which captures as many passes as
    fill ``rep_ms`` in one CUDA graph and replays it, so neither host launch gaps nor the graph's
    own launch stay in the figure (each call's kernel launches do); with inputs rotated
    (``rotations``) each call reads from DRAM. On CPU the passes run in a loop."""
    calls = list(calls)
    if not calls:
        raise ValueError("calls must hold at least one callable")
    for call in calls:  # warm-up: compile, build cached views, host copies
        call()

    def one_pass():
        for call in calls:
            call()

    if not torch.cuda.is_available():
        return median_ms(one_pass, rep_ms=50) / len(calls)
    import triton.testing

    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(one_pass, rep=rep_ms, return_mode="median")) / len(calls)


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
