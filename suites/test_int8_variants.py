"""INT8 tests of *GPU-Accelerated KV Cache Quantization* (docs/design.md section 1), its categories
5-9: kernel correctness, edge cases, patterns, consistency, stress.

Their names there and where they live here (each parametrized over every variant of the device):
  test_gpu_naive / _tiled / _coarsened / _vectorized -> test_gpu_correctness[device-variant-shape]
  test_1x1_cpu, test_1x1_gpu_naive                   -> test_1x1[device-variant]
  test_1x4_gpu_vec                                   -> test_1x4[device-variant]
  test_all_zeros, test_all_ones, test_alternating    -> same names
  test_consistency_naive_tiled / _coarsened / _vectorized -> test_consistency[device-base-variant]
  test_stress_cpu_large (2048 x 128), test_stress_gpu_large (4096 x 256) -> same names
Correctness is bit for bit against the float64 oracle (codes, scales and reconstructions), not
"within integer-rounding tolerance" as in *GPU-Accelerated KV Cache Quantization*.
"""

from __future__ import annotations

import pytest
import torch

from kvbits import int8
from suites.int8_support import (
    CUDA,
    compare_to_oracle,
    consistency_cases,
    fill_range,
    kv_matrix,
    run_variant,
    skip_unless_served,
    tag,
    variant_cases,
)

SHAPES = [(1, 4), (5, 3), (31, 64), (200, 12), (129, 260), (1000, 1)] + (
    [(4099, 1028)] if CUDA else []
)


@pytest.mark.parametrize("device,variant", variant_cases())
@pytest.mark.parametrize("T,D", SHAPES, ids=[f"{t}x{d}" for t, d in SHAPES])
def test_gpu_correctness(record, device, variant, T, D):
    tag(record, device, variant)
    skip_unless_served(variant, D)
    x = fill_range((T, D), -4.0, 4.0, seed=T * 31 + D, device=device) * kv_matrix(
        T, D, seed=D, device=device
    )
    compare_to_oracle(record, x, *run_variant(x, variant))


@pytest.mark.parametrize("device,variant", variant_cases(exclude=("vectorized",)))  # D = 1: see test_1x4
@pytest.mark.parametrize("value", [0.7, -3e5, 0.0, 1e-30], ids=["pos", "neg", "zero", "tiny"])
def test_1x1(record, device, variant, value):
    tag(record, device, variant)
    x = torch.tensor([[value]], device=device)
    q, scales, x_hat = run_variant(x, variant)
    assert not bool(torch.isnan(x_hat).any())
    if abs(value) >= 2.0**-64:
        assert q.item() == (127 if value > 0 else -127)
        assert abs(x_hat.item() - value) <= abs(value) * 1e-6
    else:
        assert q.item() == 0 and scales.item() == 0 and x_hat.item() == 0
    compare_to_oracle(record, x, q, scales, x_hat)


@pytest.mark.parametrize("device,variant", variant_cases())
def test_1x4(record, device, variant):
    tag(record, device, variant)
    x = torch.tensor([[0.25, -8.0, 0.0, 3.0]], device=device)
    q, scales, x_hat = run_variant(x, variant)
    assert q.cpu().tolist() == [[127, -127, 0, 127]]
    assert scales.cpu().tolist() == [
        float(torch.tensor(v / 127, dtype=torch.float32)) for v in (0.25, 8.0, 0.0, 3.0)
    ]
    compare_to_oracle(record, x, q, scales, x_hat)


@pytest.mark.parametrize("device,variant", variant_cases())
def test_all_zeros(record, device, variant):
    tag(record, device, variant)
    x = torch.zeros(37, 20, device=device)
    q, scales, x_hat = run_variant(x, variant)
    assert bool((scales == 0).all()) and bool((q == 0).all()) and bool((x_hat == 0).all())
    compare_to_oracle(record, x, q, scales, x_hat)


@pytest.mark.parametrize("device,variant", variant_cases())
def test_all_ones(record, device, variant):
    tag(record, device, variant)
    x = torch.ones(37, 20, device=device)
    q, scales, x_hat = run_variant(x, variant)
    assert bool((q == 127).all())
    assert bool((scales == torch.tensor(1 / 127, dtype=torch.float32)).all())
    assert float((x_hat - 1).abs().max()) <= 2.0**-23
    compare_to_oracle(record, x, q, scales, x_hat)


@pytest.mark.parametrize("device,variant", variant_cases())
def test_alternating(record, device, variant):
    tag(record, device, variant)
    signs = (torch.arange(40 * 24).reshape(40, 24) % 2) * 2 - 1
    x = (signs * 127.0).to(device)  # +-127 checkerboard: scale 1, exact round trip
    q, scales, x_hat = run_variant(x, variant)
    assert bool((scales == 1).all())
    assert torch.equal(q.cpu().to(torch.int64), (signs * 127).to(torch.int64))
    assert torch.equal(x_hat.cpu(), x.cpu())
    compare_to_oracle(record, x, q, scales, x_hat)


@pytest.mark.parametrize("device,base,variant", consistency_cases())
@pytest.mark.parametrize("T,D", [(96, 40), (513, 132)], ids=["96x40", "513x132"])
def test_consistency(record, device, base, variant, T, D):
    tag(record, device, variant)
    if CUDA and device == "cuda":
        T, D = T * 8, D * 4
    x = kv_matrix(T, D, seed=T + D, device=device)
    q0, s0, xh0 = run_variant(x, base)
    q1, s1, xh1 = run_variant(x, variant)
    mismatches = int((q0 != q1).sum()) + int((s0 != s1).sum()) + int((xh0 != xh1).sum())
    record.add(states_checked=T * D, bit_errors=mismatches, shape=f"{T}x{D}", base=base)
    assert torch.equal(q0, q1) and torch.equal(s0, s1) and torch.equal(xh0, xh1), (
        f"{variant} differs from {base}"
    )


@pytest.mark.parametrize("device,variant", variant_cases())
def test_stress_cpu_large(record, device, variant):
    tag(record, device, variant)
    x = kv_matrix(2048, 128, seed=2048, device=device)
    compare_to_oracle(record, x, *run_variant(x, variant))


@pytest.mark.parametrize("device,variant", variant_cases())
def test_stress_gpu_large(record, device, variant):
    tag(record, device, variant)
    x = kv_matrix(4096, 256, seed=4096, device=device)
    compare_to_oracle(record, x, *run_variant(x, variant))
    for _ in range(2):  # repeated runs into the same buffers give the same bits
        q, scales = int8.quantize_per_channel(x, variant=variant)
        assert torch.equal(q, int8.quantize_per_channel(x, variant=variant)[0])
