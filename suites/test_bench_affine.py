"""Benchmark: the Triton affine quantize kernel (K and V into the packed cache) against the
measured copy bandwidth and the torch reference. Figures only; nothing is asserted on speed.

Bytes moved (the fewest the operation must move): K and V read once, codes, scales and
zeros written once. Target on an H200: fp16 [8, 8, 32768, 128] at >= 85% of copy bandwidth.
The kernels' ms carries its repeats' spread (ms_n, ms_min, ms_iqr, ms_mad) and whether the two
launches are bound by the host or the device (bound, host_ms).
"""

from __future__ import annotations

import pytest
import torch
from affine_support import ON_GPU, cache_mismatches, random_kv

from harness.measure.timing import bandwidth_metrics, bound_metrics, median_ms, time_call
from kvbits.affine import _launch_quantize
from kvbits.kv_cache import QuantizedKV, quantize_into, quantize_kv

pytestmark = pytest.mark.bench

GPU_SHAPE = (8, 8, 32768, 128)
CPU_SHAPE = (1, 2, 128, 64)


def _moved_bytes(qkv: QuantizedKV, k: torch.Tensor) -> int:
    written = sum(getattr(qkv, f).numel() * getattr(qkv, f).element_size()
                  for f in ("k_codes", "v_codes", "k_scale", "k_zero", "v_scale", "v_zero"))
    return 2 * k.numel() * k.element_size() + written


def _configs():
    """(bits, group size): 3 bits G=64 (the headline figure) first; the others are the sweep."""
    configs = [(bits, g) for bits in (3, 2, 4, 8) for g in (64, 128, 32)]
    return [pytest.param(bits, g, id=f"{bits}-{g}", marks=() if (bits, g) == (3, 64) else pytest.mark.sweep)
            for bits, g in configs]


@pytest.mark.parametrize(("bits", "group_size"), _configs())
def test_bench_quantize_kv(record, bits, group_size):
    if not ON_GPU and (bits != 3 or group_size != 64):
        pytest.skip("in the interpreter only the default configuration is timed (figures are GPU figures)")
    device = "cuda" if ON_GPU else "cpu"
    shape = GPU_SHAPE if ON_GPU else CPU_SHAPE
    b, h, s, d = shape
    k, v = random_kv(shape, torch.float16, device, seed=bits, kind="outliers")
    make = lambda: QuantizedKV.empty(b, h, d, bits=bits, group_size=group_size, capacity=s,
                                     dtype=k.dtype, device=device)
    qkv, ref = make(), make()

    def kernel_only():
        _launch_quantize(k, qkv.k_codes, qkv.k_scale, qkv.k_zero, 0, group_size, bits, True)
        _launch_quantize(v, qkv.v_codes, qkv.v_scale, qkv.v_zero, 0, group_size, bits, False)

    timing = time_call(kernel_only)
    ms = timing.median
    ms_api = median_ms(lambda: quantize_into(qkv, k, v, 0, "triton"))
    # the public call a prompt goes through: allocation, kernels, checks (one read-back)
    ms_public = median_ms(lambda: quantize_kv(k, v, bits, group_size=group_size, backend="triton")) if ON_GPU else None
    ms_torch = median_ms(lambda: quantize_into(ref, k, v, 0, "torch"))
    qkv.seq_lens.fill_(s)
    ref.seq_lens.fill_(s)
    diff = cache_mismatches(ref, qkv)
    metrics = bandwidth_metrics(_moved_bytes(qkv, k), ms)
    record.backend, record.variant, record.device = "triton", f"b{bits}-g{group_size}-fp16", device
    record.add(
        **metrics, **timing.metrics(), **bound_metrics(kernel_only, ms, device=device),
        ms_api=ms_api, ms_torch=ms_torch, bit_errors=sum(diff.values()),
        **({"ms_public": ms_public, "pct_of_peak_public": metrics["pct_of_peak"] * ms / ms_public}
           if ms_public else {}),
        speedup={"torch_reference": ms_torch / ms},
        shape="x".join(map(str, shape)),
    )
    assert not diff, diff
