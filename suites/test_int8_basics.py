"""INT8 tests of *GPU-Accelerated KV Cache Quantization* (docs/design.md section 1), its
categories 1-3: allocation, data helpers, metric identity.

Names from that work: test_create_fp32, test_create_int8 (here: the float32 and int8 outputs of every
variant, allocated or passed in poisoned, come back with the right shape, dtype and device, every
element written); test_fill_range, test_query_fill; test_l2_identical, test_max_abs_identical,
test_attn_identical (each metric is 0 on identical inputs and exact on a known difference).
"""

from __future__ import annotations

import pytest
import torch

from kvbits import int8
from suites.int8_support import (
    attention_error,
    fill_range,
    kv_matrix,
    l2_error,
    max_abs_error,
    query_fill,
    run_variant,
    skip_unless_served,
    tag,
    variant_cases,
)

SHAPES = [(1, 1), (3, 5), (17, 12), (64, 33)]


@pytest.mark.parametrize("device,variant", variant_cases())
@pytest.mark.parametrize("T,D", SHAPES, ids=[f"{t}x{d}" for t, d in SHAPES])
def test_create_int8(record, device, variant, T, D):
    tag(record, device, variant)
    skip_unless_served(variant, D)
    x = kv_matrix(T, D, seed=T * 1000 + D, device=device)
    q, scales = int8.quantize_per_channel(x, variant=variant)
    assert q.dtype == torch.int8 and tuple(q.shape) == (T, D) and q.device.type == device
    assert (
        scales.dtype == torch.float32
        and tuple(scales.shape) == (D,)
        and scales.device.type == device
    )
    assert q.is_contiguous() and scales.is_contiguous()
    run_variant(x, variant)  # the same through poisoned out= tensors: every element written
    record.add(states_checked=T * D + D, shape=f"{T}x{D}")


@pytest.mark.parametrize("device,variant", variant_cases())
@pytest.mark.parametrize("T,D", SHAPES, ids=[f"{t}x{d}" for t, d in SHAPES])
def test_create_fp32(record, device, variant, T, D):
    tag(record, device, variant)
    skip_unless_served(variant, D)
    gen = torch.Generator().manual_seed(T + D)
    q = torch.randint(-127, 128, (T, D), generator=gen, dtype=torch.int8).to(device)
    scales = (torch.rand(D, generator=gen) + 0.01).to(device)
    x_hat = int8.dequantize_per_channel(q, scales, variant=variant)
    assert (
        x_hat.dtype == torch.float32
        and tuple(x_hat.shape) == (T, D)
        and x_hat.device.type == device
    )
    assert x_hat.is_contiguous()
    out = torch.full((T, D), float("nan"), device=device)
    assert int8.dequantize_per_channel(q, scales, variant=variant, out=out) is out
    assert not bool(torch.isnan(out).any())
    assert torch.equal(out, x_hat)
    record.add(states_checked=T * D, shape=f"{T}x{D}")


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (0.0, 5.0), (-300.0, -2.0), (-1e-3, 1e-3)])
def test_fill_range(record, lo, hi):
    x = fill_range((256, 64), lo, hi, seed=7)
    assert x.dtype == torch.float32 and tuple(x.shape) == (256, 64)
    assert bool((x >= lo).all()) and bool((x <= hi).all())
    assert float(x.max() - x.min()) > 0.9 * (hi - lo), "values do not spread over the range"
    assert not torch.equal(x, fill_range((256, 64), lo, hi, seed=8)), (
        "different seeds gave the same data"
    )
    assert torch.equal(x, fill_range((256, 64), lo, hi, seed=7)), "one seed gave different data"
    record.add(states_checked=x.numel())


@pytest.mark.parametrize("D", [1, 4, 127, 4096])
def test_query_fill(record, D):
    q = query_fill(D, seed=D, lo=-0.5, hi=2.0)
    assert tuple(q.shape) == (D,) and q.dtype == torch.float32
    assert bool((q >= -0.5).all()) and bool((q <= 2.0).all())
    if D > 1:
        assert float(q.max()) > float(q.min())
    record.add(states_checked=D)


def _pair(seed: int):
    a = fill_range((40, 24), -3.0, 3.0, seed=seed)
    b = a.clone()
    b[5, 7] += 0.25
    b[11, 2] -= 0.5
    return a, b


def test_l2_identical(record):
    a, b = _pair(1)
    assert l2_error(a, a) == 0.0
    expected = (0.25**2 + 0.5**2) ** 0.5
    assert abs(l2_error(a, b) - expected) < 1e-6
    record.add(states_checked=a.numel(), max_abs_err=abs(l2_error(a, b) - expected))


def test_max_abs_identical(record):
    a, b = _pair(2)
    assert max_abs_error(a, a) == 0.0
    assert abs(max_abs_error(a, b) - 0.5) < 1e-6
    record.add(states_checked=a.numel())


def test_attn_identical(record):
    a, b = _pair(3)
    query = query_fill(24, seed=4)
    assert attention_error(query, a, a) == 0.0
    q64 = query.double()
    expected = (abs(0.25 * float(q64[7])) + abs(0.5 * float(q64[2]))) / 40
    assert abs(attention_error(query, a, b) - expected) < 1e-6
    record.add(states_checked=a.numel())
