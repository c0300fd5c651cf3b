"""INT8 tests of *GPU-Accelerated KV Cache Quantization* (docs/design.md section 1), its category 4
(core logic, white box), on every variant, plus the contract's rules.

Names from that work: test_compute_scales_simple, test_cpu_quant_values, test_cpu_dequant_values. It
ran them on its CPU reference only; here every variant must give the same known values. Then the
rules that make variants agree bit for bit: ties round half to even, a column below 2**-64 gets
scale 0, NaN/Inf raise, float16/bfloat16 inputs are widened exactly, and random data matches the
float64 oracle bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from kvbits import int8
from suites.int8_support import (
    compare_to_oracle,
    kv_matrix,
    run_variant,
    skip_unless_served,
    tag,
    variant_cases,
)


def _column_matrix(columns: list[list[float]], device: str) -> torch.Tensor:
    return torch.tensor(columns, dtype=torch.float32).T.contiguous().to(device)


@pytest.mark.parametrize("device,variant", variant_cases())
def test_compute_scales_simple(record, device, variant):
    tag(record, device, variant)
    columns = [
        [1.0, -2.0, 0.5, 0.0],  # max |x| = 2 (a negative value sets it)
        [127.0, 3.0, -5.0, 1.0],  # max 127 -> scale exactly 1
        [0.0, 0.0, 0.0, 0.0],  # all zero -> scale 0
        [-0.1, 0.2, 0.3, -0.35],  # max 0.35
        [1e-20, -2e-20, 0.0, 0.0],  # below 2**-64 -> scale 0
        [6e-19, 0.0, 0.0, 0.0],  # just above 2**-64 (5.42e-20) -> a real scale
        [3e38, -1.0, 0.0, 0.0],  # near the float32 maximum
        [254.0, -254.0, 1.0, 2.0],  # max 254 -> scale 2
    ]
    x = _column_matrix(columns, device)
    scales = int8.compute_scales(x, variant=variant).cpu()
    expected = []
    for col in columns:
        amax = torch.tensor(col, dtype=torch.float32).abs().max()
        expected.append(0.0 if float(amax) < 2.0**-64 else float((amax.double() / 127).float()))
    assert scales.tolist() == expected
    assert scales[1] == 1.0 and scales[2] == 0.0 and scales[4] == 0.0 and scales[7] == 2.0
    record.add(
        states_checked=len(columns), bit_errors=int((scales != torch.tensor(expected)).sum())
    )


TIES = [  # (x with scale exactly 1, code): half to even
    (63.5, 64),
    (0.5, 0),
    (1.5, 2),
    (2.5, 2),
    (3.5, 4),
    (-0.5, 0),
    (-1.5, -2),
    (-2.5, -2),
    (-63.5, -64),
    (126.5, 126),
    (-126.5, -126),
    (0.49999997, 0),
    (0.50000006, 1),
    (-127.0, -127),
    (100.25, 100),
    (100.75, 101),
    (0.0, 0),
]


@pytest.mark.parametrize("device,variant", variant_cases(exclude=("vectorized",)))  # D = 2 < 4
def test_cpu_quant_values(record, device, variant):
    tag(record, device, variant)
    values = [127.0] + [v for v, _ in TIES]  # the 127 fixes the scale of the column to exactly 1
    x = _column_matrix(
        [values, [2 * v for v in values]], device
    )  # second column: scale 2, same codes
    q, scales = run_variant(x, variant)[:2]
    assert scales.cpu().tolist() == [1.0, 2.0]
    expected = [127] + [c for _, c in TIES]
    got = q.cpu()
    assert got[:, 0].tolist() == expected, "ties must round half to even"
    assert got[:, 1].tolist() == expected
    record.add(
        states_checked=2 * len(values), bit_errors=int((got[:, 0] != torch.tensor(expected)).sum())
    )


@pytest.mark.parametrize("device,variant", variant_cases())
def test_cpu_dequant_values(record, device, variant):
    tag(record, device, variant)
    q = torch.tensor([[-128, 127, 0, 64], [1, -1, -127, 5], [0, 0, 0, 0]], dtype=torch.int8).to(
        device
    )
    scales = torch.tensor([1.0, 0.5, 2.0**-10, 3.0], device=device)
    x_hat = int8.dequantize_per_channel(q, scales, variant=variant).cpu()
    expected = torch.tensor(
        [[-128.0, 63.5, 0.0, 192.0], [1.0, -0.5, -127 * 2.0**-10, 15.0], [0.0, 0.0, 0.0, 0.0]]
    )
    assert torch.equal(x_hat, expected)
    odd = torch.tensor([0.1, 1 / 3, 1e-7, 12345.678], device=device)  # not powers of two
    x_hat = int8.dequantize_per_channel(q, odd, variant=variant).cpu()
    assert torch.equal(x_hat, q.cpu().float() * odd.cpu())  # one float32 multiply, bit for bit
    record.add(states_checked=2 * q.numel())


@pytest.mark.parametrize("device,variant", variant_cases())
@pytest.mark.parametrize("T,D", [(1, 8), (33, 20), (257, 96), (100, 7)], ids=lambda v: str(v))
def test_random_matches_oracle(record, device, variant, T, D):
    tag(record, device, variant)
    skip_unless_served(variant, D)
    x = kv_matrix(T, D, seed=T * 7 + D, device=device)
    # Plant exact ties: with the column max set to 127 * 2**k the scale is 2**k, so
    # (n + 0.5) * 2**k is a tie that only round-half-to-even resolves one way.
    x[0, 0] = 127.0 * 4
    if T > 4:
        x[1:5, 0] = torch.tensor([0.5, 1.5, 2.5, -2.5], device=device) * 4
    compare_to_oracle(record, x, *run_variant(x, variant))


@pytest.mark.parametrize("device,variant", variant_cases(exclude=("cpu_baseline",)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_inputs(record, device, variant, dtype):
    tag(record, device, variant)
    x = kv_matrix(65, 24, seed=11, device=device, dtype=dtype)
    q, scales, x_hat = run_variant(x, variant)
    compare_to_oracle(record, x, q, scales, x_hat)
    q32, s32 = int8.quantize_per_channel(x.float(), variant=variant)
    assert torch.equal(q, q32) and torch.equal(scales, s32), (
        "a half input must act as its exact float32 value"
    )


@pytest.mark.parametrize("device,variant", variant_cases())
def test_tiny_columns(record, device, variant):
    tag(record, device, variant)
    x = torch.zeros(9, 8, device=device)
    x[:, 0] = 2.0**-65  # below the floor: scale 0, codes 0, reconstructs to 0
    x[3, 1] = -(2.0**-64)  # exactly at the floor: a real scale
    x[:, 2] = 1e-40  # denormal inputs in a negligible column
    x[0, 3] = 1.0  # a normal column holding denormals: they quantize to 0
    x[1:, 3] = 1e-39
    x[:, 4] = torch.linspace(-1e-30, 1e-30, 9)
    q, scales, x_hat = run_variant(x, variant)
    s = scales.cpu()
    assert (
        s[0] == 0 and s[2] == 0 and s[1] == float(torch.tensor(2.0**-64 / 127, dtype=torch.float32))
    )
    assert bool((q.cpu()[:, 0] == 0).all()) and bool((x_hat.cpu()[:, 0] == 0).all())
    assert q.cpu()[3, 1] == -127 and bool((q.cpu()[1:, 3] == 0).all())
    compare_to_oracle(record, x, q, scales, x_hat)


@pytest.mark.parametrize("device,variant", variant_cases())
@pytest.mark.parametrize(
    "bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"]
)
def test_nonfinite_rejected(record, device, variant, bad):
    tag(record, device, variant)
    x = kv_matrix(20, 12, seed=5, device=device)
    x[7, 9] = bad
    x[0, 2] = bad
    with record.raises(ValueError, match=r"NaN or Inf in column\(s\) \[2, 9\]", input=f"{bad} in x"):
        int8.quantize_per_channel(x, variant=variant)
    with record.raises(ValueError, match="NaN or Inf", input=f"{bad} in x (scales)"):
        int8.compute_scales(x, variant=variant)
    record.add(states_checked=x.numel())
