"""INT8 per-channel benchmark over the ten shapes of *GPU-Accelerated KV Cache Quantization*
(docs/design.md section 1; the two smallest without a GPU).

One case per (shape, variant): quantize ms (scales pass + finite check + codes), dequantize ms and
their total; speedups of the total over the CPU baseline, torch eager and torch.compile (timed
once per shape, same input); GB/s over the fewest bytes moved (scales pass reads 4 B/element,
quantize reads 4 B and writes 1 B, dequantize reads 1 B and writes 4 B) and % of the device copy
bandwidth measured in the same run; that work's errors: reconstruction L2 and max-abs, and the
attention surrogate mean_t |Q.K[t] - Q.K_hat[t]|.

GPU timings are CUDA-event medians (harness.measure.timing.time_call) over inputs rotated through enough
copies to exceed 4x the L2 cache, recorded with their repeats' spread (ms_n, ms_min, ms_iqr, ms_mad:
quantize and dequantize added) and whether the pair is bound by the host or the device (bound,
host_ms; at the smallest shapes a call is mostly the host's launch cost). The CPU baseline is
timed by wall clock with 1-3 repetitions, only where its predicted time is at most
CPU_BASELINE_LIMIT_S; other shapes record it as skipped with the reason. torch.compile on CPU
tensors costs about 40 s of C++ builds, so without a GPU it runs only when
KVH_INT8_CPU_COMPILE=1.

Run on a GPU box: python -m pytest suites/test_bench_int8.py -m bench
"""

from __future__ import annotations

import math
import os
import time

import pytest
import torch

from harness.measure.timing import Timing, bandwidth_metrics, bound_metrics, time_call
from kvbits import int8
from suites.int8_support import attention_error, kv_matrix, l2_error, max_abs_error, query_fill, tag

pytestmark = pytest.mark.bench

SHAPES = [
    (1024, 64),
    (2048, 128),
    (16384, 256),
    (65536, 256),
    (131072, 256),
    (131072, 1024),
    (131072, 2048),
    (131072, 4096),
    (131072, 8192),
    (262144, 128),
]
HEADLINE_SHAPES = ((1024, 64), (131072, 4096))  # gpu_verify times these; the bench session all ten
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
ACTIVE_SHAPES = SHAPES if CUDA else SHAPES[:2]
CPU_BASELINE_LIMIT_S = float(os.environ.get("KVH_INT8_CPU_LIMIT_S", "60"))
SAMPLE_ELEMENTS = 1 << 22  # the CPU baseline's timed sample that predicts a shape's time
CPU_COMPILE = CUDA or os.environ.get("KVH_INT8_CPU_COMPILE") == "1"
BASELINES = ("cpu_baseline", "torch_eager", "torch_compile")


def _variants() -> list[str]:
    names = list(int8.variants_for(DEVICE))
    if "cpu_baseline" not in names:
        names.append("cpu_baseline")  # on a GPU box: the INT8 work's CPU code on the host's cores
    return names + ["torch_compile"]


def _bytes(T: int, D: int, in_bytes: int = 4) -> dict[str, int]:
    n = T * D
    return {"quant": n * (in_bytes + in_bytes + 1), "dequant": n * (1 + 4)}


def _bytes_per_s(T: int, D: int, quant_ms: float, dequant_ms: float) -> dict[str, float]:
    nbytes = _bytes(T, D)
    return {
        "quant_gbps": nbytes["quant"] / (quant_ms * 1e-3) / 1e9,
        "dequant_gbps": nbytes["dequant"] / (dequant_ms * 1e-3) / 1e9,
    }


class _ShapeState:
    """Input, rotation copies and baseline timings of one shape (one shape held at a time)."""

    def __init__(self, T: int, D: int) -> None:
        self.shape = (T, D)
        self.x = kv_matrix(T, D, seed=T ^ D, device=DEVICE)
        self.query = query_fill(D, seed=D, device=DEVICE)
        self.baselines: dict[str, float | str] = {}
        self.timed: dict[str, tuple[Timing, Timing, tuple]] = {}
        self.compiled: tuple | None = None
        self.cpu_split: tuple[Timing, Timing] | None = None
        copies = 1
        if CUDA:
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
            copies = max(1, math.ceil(4 * l2 / (self.x.numel() * 5)))
        self.xs = [self.x] + [self.x.clone() for _ in range(copies - 1)]


_state: _ShapeState | None = None


def _shape_state(T: int, D: int) -> _ShapeState:
    global _state
    if _state is None or _state.shape != (T, D):
        _state = None
        if CUDA:
            torch.cuda.empty_cache()
        _state = _ShapeState(T, D)
    return _state


def _rotating(items):
    index = [0]

    def next_item():
        index[0] = (index[0] + 1) % len(items)
        return items[index[0]]

    return next_item


def _time_pair(quant, dequant, xs) -> tuple[Timing, Timing, tuple]:
    """Timings of quant(x) over rotated inputs, and of dequant(q, s) over rotated codes."""
    next_x = _rotating(xs)
    quant_timing = time_call(lambda: quant(next_x()))
    outputs = [quant(x) for x in xs]
    next_qs = _rotating(outputs)
    dequant_timing = time_call(lambda: dequant(*next_qs()))
    return quant_timing, dequant_timing, outputs[0]


def _variant_fns(variant: str, state: _ShapeState):
    if variant == "torch_compile":
        if state.compiled is None:
            torch._dynamo.reset()  # one static graph per shape, no recompile limit across shapes
            state.compiled = (
                torch.compile(int8.reference_quantize, dynamic=False),
                torch.compile(int8.reference_dequantize, dynamic=False),
            )
        return state.compiled
    if variant == "torch_eager":
        return int8.reference_quantize, int8.reference_dequantize
    return (
        lambda x: int8.quantize_per_channel(x, variant=variant),
        lambda q, s: int8.dequantize_per_channel(q, s, variant=variant),
    )


def _timed(state: _ShapeState, name: str) -> tuple[Timing, Timing, tuple]:
    """(quant timing, dequant timing, (q, scales)) of a variant or baseline, measured once per shape."""
    if name not in state.timed:
        state.timed[name] = _time_pair(*_variant_fns(name, state), state.xs)
    return state.timed[name]


def _time_cpu_baseline(state: _ShapeState) -> tuple[Timing, Timing] | str:
    """Wall-clock (quant, dequant) timings of the CPU baseline, or the reason it was not run.

    Outside the timing: one call on a few elements (the extension's build or load, the thread
    pool), then one on a sample of at most SAMPLE_ELEMENTS whole rows, which predicts the full
    shape's time (doubled when the sample is smaller: wide strided column scans slow down);
    shapes predicted above CPU_BASELINE_LIMIT_S are not run.
    """
    T, D = state.shape
    n = T * D
    x = state.x.cpu()
    quant, dequant = _variant_fns("cpu_baseline", state)
    dequant(*quant(x[:4, :4].contiguous()))
    rows = max(1, min(T, SAMPLE_ELEMENTS // D))
    sample = x[:rows].contiguous()
    start = time.perf_counter()
    dequant(*quant(sample))
    predicted_s = (time.perf_counter() - start) * n / sample.numel() * (1 if rows == T else 2)
    if predicted_s > CPU_BASELINE_LIMIT_S:
        return f"predicted {predicted_s:.3g} s > {CPU_BASELINE_LIMIT_S:.3g} s limit (KVH_INT8_CPU_LIMIT_S)"
    quant_times, dequant_times = [], []
    while len(quant_times) < 3:
        start = time.perf_counter()
        q, s = quant(x)
        middle = time.perf_counter()
        dequant(q, s)
        quant_times.append(middle - start)
        dequant_times.append(time.perf_counter() - middle)
        if quant_times[0] + dequant_times[0] > 2.0:
            break  # slow shapes: one repetition
    return Timing.of(quant_times).scaled(1e3), Timing.of(dequant_times).scaled(1e3)


def _baseline(state: _ShapeState, name: str) -> float | str:
    if name not in state.baselines:
        if name == "cpu_baseline":
            timed = _time_cpu_baseline(state)
            state.baselines[name] = timed if isinstance(timed, str) else timed[0].plus(timed[1]).median
            if not isinstance(timed, str):
                state.cpu_split = timed
        elif name == "torch_compile" and not CPU_COMPILE:
            state.baselines[name] = "torch.compile on CPU is opt-in (KVH_INT8_CPU_COMPILE=1)"
        else:
            quant, dequant, _ = _timed(state, name)
            state.baselines[name] = quant.plus(dequant).median
    return state.baselines[name]


def _bound(state: _ShapeState, variant: str, total_ms: float) -> dict:
    """Whether a quantize then dequantize over the rotated inputs is bound by the host or the device."""
    quant, dequant = _variant_fns(variant, state)
    next_x = _rotating(state.xs)
    return bound_metrics(lambda: dequant(*quant(next_x())), total_ms, device=DEVICE)


def _cases():
    return [
        pytest.param(T, D, variant, id=f"{T}x{D}-{variant}",
                     marks=() if (T, D) in HEADLINE_SHAPES else pytest.mark.sweep)
        for T, D in ACTIVE_SHAPES
        for variant in _variants()
    ]


@pytest.mark.parametrize("T,D,variant", _cases())
def test_bench_int8(record, T, D, variant):
    tag(record, "cpu" if variant == "cpu_baseline" else DEVICE, variant)
    if variant == "torch_compile":
        record.backend = "torch"
    state = _shape_state(T, D)
    record.add(shape=f"{T}x{D}")

    if variant == "cpu_baseline":
        total = _baseline(state, "cpu_baseline")
        if isinstance(total, str):
            pytest.skip(f"cpu_baseline at {T}x{D}: {total}")
        quant, dequant = state.cpu_split
        record.add(
            ms=total,
            **quant.plus(dequant).metrics(),
            bound="cpu",
            quant_ms=quant.median,
            dequant_ms=dequant.median,
            reference=True,  # the INT8 work's CPU baseline: its timing is compared, never a regression
            timing="wall clock, median of 1-3 runs",
            speedup={"cpu_baseline": 1.0},
            **_bytes_per_s(T, D, quant.median, dequant.median),
        )
        return
    if variant == "torch_compile" and not CPU_COMPILE:
        pytest.skip(str(_baseline(state, "torch_compile")))

    quant, dequant, (q, scales) = _timed(state, variant)
    pair = quant.plus(dequant)
    total = pair.median
    nbytes = _bytes(T, D)
    metrics = bandwidth_metrics(nbytes["quant"] + nbytes["dequant"], total)
    metrics.update(
        **pair.metrics(), **_bound(state, variant, total),
        quant_ms=quant.median, dequant_ms=dequant.median, **_bytes_per_s(T, D, quant.median, dequant.median)
    )
    speedup, skipped = {}, {}
    for name in BASELINES:
        base = _baseline(state, name)
        if isinstance(base, str):
            skipped[name] = base
        else:
            speedup[name] = base / total
    x_hat = _variant_fns(variant, state)[1](q, scales)
    q_ref, s_ref = int8.reference_quantize(state.x)
    bit_errors = int((q != q_ref).sum()) + int((scales != s_ref).sum())
    record.add(
        **metrics,
        speedup=speedup,
        baselines_skipped=skipped,
        l2_err=l2_error(state.x, x_hat),
        max_abs_err=max_abs_error(state.x, x_hat),
        attn_err=attention_error(state.query, state.x, x_hat),
        max_rel_err=l2_error(state.x, x_hat)
        / float(torch.linalg.vector_norm(state.x.double().flatten())),
        bit_errors=bit_errors,
        states_checked=T * D,
    )
    if variant == "torch_compile":
        record.add(reference=True)  # a baseline timed beside the kernels
    if variant in int8.VARIANTS:  # torch.compile is a baseline: its bit errors are only reported
        assert bit_errors == 0, f"{variant} codes or scales differ from the torch reference"
