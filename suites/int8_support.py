"""Shared pieces of the INT8 suites: (device, variant) cases, data, an independent oracle, metrics.

The data helpers and metrics are the ``matrix.c`` ones of
*GPU-Accelerated KV Cache Quantization* (docs/design.md section 1): random fill in a range, a random
query vector, L2 / max-abs reconstruction error, the attention surrogate mean |Q.K - Q.K_hat|.
The oracle recomputes the INT8 contract in float64 numpy with an explicit float32 rounding after
every operation; float64 holds every float32 product exactly and rounds float32 quotients
correctly, so the oracle gives the exact bits without using any code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvbits import int8
from suites.common import triton_skip_reason

CUDA = torch.cuda.is_available()
BACKEND_OF = {"torch": "torch", "cpu_baseline": "cpp", "triton": "triton"}
CPU_VARIANTS = ("torch", "cpu_baseline", "triton")
GPU_VARIANTS = ("torch", "naive", "tiled", "coarsened", "vectorized", "triton")


def _skip_reason(device: str, variant: str) -> str | None:
    if device == "cuda" and not CUDA:
        return "needs a CUDA device"
    return triton_skip_reason(device) if variant == "triton" else None


def variant_cases(*, exclude: tuple[str, ...] = ()) -> list:
    """pytest params (device, variant) for every variant, skipped with a reason where it cannot run."""
    cases = []
    for device, names in (("cpu", CPU_VARIANTS), ("cuda", GPU_VARIANTS)):
        for variant in names:
            if variant in exclude:
                continue
            reason = _skip_reason(device, variant)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            cases.append(pytest.param(device, variant, id=f"{device}-{variant}", marks=marks))
    return cases


def consistency_cases() -> list:
    """(device, base, other): on CUDA every variant against naive (the pairs of the INT8 work's
    test_consistency_naive_*), on CPU against torch."""
    cases = []
    for device, base, names in (("cpu", "torch", CPU_VARIANTS), ("cuda", "naive", GPU_VARIANTS)):
        for variant in names:
            if variant == base:
                continue
            reason = _skip_reason(device, variant)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            cases.append(
                pytest.param(device, base, variant, id=f"{device}-{base}-{variant}", marks=marks)
            )
    return cases


def tag(record, device: str, variant: str) -> None:
    record.backend = BACKEND_OF.get(variant, "cuda")
    record.variant = variant
    record.device = device


def skip_unless_served(variant: str, D: int) -> None:
    """Skip a case whose width the variant does not serve: ``vectorized`` needs D % 4 == 0 (its
    refusal of other widths is tested in test_int8_bad_input)."""
    if variant == "vectorized" and D % 4:
        pytest.skip("vectorized needs D % 4 == 0 (its refusal is tested in test_int8_bad_input)")


# ----------------------------------------------------------------------------- data (as matrix.c)
def fill_range(
    shape, lo: float, hi: float, *, seed: int, device="cpu", dtype=torch.float32
) -> torch.Tensor:
    """Uniform random values in [lo, hi] (``random_fill_FP32Matrix`` of ``matrix.c``)."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    return values.to(dtype).to(device)


def query_fill(
    D: int, *, seed: int, lo: float = -1.0, hi: float = 1.0, device="cpu"
) -> torch.Tensor:
    """A random query vector [D] in [lo, hi] for the attention surrogate (``random_fill_query_vector``)."""
    return fill_range((D,), lo, hi, seed=seed, device=device)


def kv_matrix(T: int, D: int, *, seed: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Fresh KV-like data: uniform in [-1, 1] with per-channel magnitudes spread over 2**-6 .. 2**6."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((T, D), generator=gen, dtype=torch.float64) * 2 - 1
    magnitude = torch.exp2(torch.rand((D,), generator=gen, dtype=torch.float64) * 12 - 6)
    return (x * magnitude).to(dtype).to(device)


# ----------------------------------------------------------------------------- metrics (as matrix.c)
def l2_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """sqrt(sum((a - b)^2)) in float64."""
    return float(torch.linalg.vector_norm((a.double() - b.double()).flatten()))


def max_abs_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def attention_error(query: torch.Tensor, k: torch.Tensor, k_hat: torch.Tensor) -> float:
    """mean over rows t of |Q . K[t] - Q . K_hat[t]| in float64 (``attention_dot_product_error``)."""
    q = query.double().to(k.device)
    return float((k.double() @ q - k_hat.double() @ q).abs().mean())


# ----------------------------------------------------------------------------- the oracle
def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32).astype(np.float64)


def oracle(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q int8, scales float32, x_hat float32) of the contract, in float64 numpy."""
    xd = x.detach().cpu().float().double().numpy()
    amax = np.abs(xd).max(axis=0)
    s = np.where(amax < int8.TINY_AMAX, 0.0, _f32(amax / 127.0))
    with np.errstate(divide="ignore"):
        inv = np.where(s == 0, 0.0, _f32(1.0 / np.where(s == 0, 1.0, s)))
    y = np.clip(_f32(xd * inv), -128.0, 127.0)
    q = np.rint(y).astype(np.int8)  # numpy rint rounds half to even
    x_hat = _f32(q.astype(np.float64) * s)
    return q, s.astype(np.float32), x_hat.astype(np.float32)


# ----------------------------------------------------------------------------- running a variant
Q_POISON = -128  # a code the contract never produces (|x * inv| <= 127 up to one rounding)


def run_variant(x: torch.Tensor, variant: str):
    """Quantize and dequantize ``x`` with ``variant`` into poisoned outputs; check all were written."""
    T, D = x.shape
    q = torch.full((T, D), Q_POISON, dtype=torch.int8, device=x.device)
    scales = torch.full((D,), float("nan"), device=x.device)
    q_out, s_out = int8.quantize_per_channel(x, variant=variant, out=(q, scales))
    assert q_out.data_ptr() == q.data_ptr() and s_out.data_ptr() == scales.data_ptr()
    assert not bool((q == Q_POISON).any()), "quantize left codes unwritten (poison -128 remains)"
    assert bool(torch.isfinite(scales).all()), (
        "compute_scales left scales unwritten (NaN poison remains)"
    )
    x_hat = torch.full((T, D), float("nan"), device=x.device)
    out = int8.dequantize_per_channel(q, scales, variant=variant, out=x_hat)
    assert out.data_ptr() == x_hat.data_ptr()
    assert not bool(torch.isnan(x_hat).any()), (
        "dequantize left elements unwritten (NaN poison remains)"
    )
    return q, scales, x_hat


def compare_to_oracle(record, x: torch.Tensor, q, scales, x_hat) -> None:
    """Bit-exact comparison with the oracle; records states checked, code errors, error figures."""
    q_ref, s_ref, x_hat_ref = oracle(x)
    q_np, s_np, xh_np = q.cpu().numpy(), scales.cpu().numpy(), x_hat.cpu().numpy()
    code_errors = int((q_np != q_ref).sum())
    scale_errors = int((s_np.view(np.uint32) != s_ref.view(np.uint32)).sum())
    recon_errors = int((xh_np.view(np.uint32) != x_hat_ref.view(np.uint32)).sum())
    xf = x.detach().cpu().double()
    err = (xf - x_hat.cpu().double()).abs()
    # |x - x_hat| <= s/2 per column, plus the float32 roundings of 1/s, x * inv and q * s
    # (each relative 2**-24 on values up to 127 s); a zero-scale column holds only |x| < 2**-64.
    s64 = torch.from_numpy(s_ref.astype(np.float64))
    bound = torch.where(s64 == 0, torch.full_like(s64, int8.TINY_AMAX), s64 * (0.5 + 2.0**-12))
    record.add(
        states_checked=int(q_np.size),
        bit_errors=code_errors + scale_errors + recon_errors,
        max_abs_err=float(err.max()),
        max_rel_err=l2_error(xf, x_hat.cpu())
        / max(float(torch.linalg.vector_norm(xf.flatten())), 1e-300),
        shape=f"{x.shape[0]}x{x.shape[1]}",
        err_to_tol=float((err / bound[None, :]).max()),
    )
    assert code_errors == 0, f"{code_errors} codes differ from the oracle"
    assert scale_errors == 0, f"{scale_errors} scales differ from the oracle"
    assert recon_errors == 0, f"{recon_errors} reconstructed values differ from the oracle"
    assert bool((err <= bound[None, :]).all()), "reconstruction error above s/2"
