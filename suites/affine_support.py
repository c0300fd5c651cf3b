"""Shared pieces of the affine, streaming and accuracy suites: devices, inputs, cache checks."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels._runtime import triton_interpreted
from kernels.kv_cache import QuantizedKV

FIELDS = ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "k_residual", "v_residual", "seq_lens")
ON_GPU = torch.cuda.is_available() and not triton_interpreted()


def device_backends() -> list:
    """(device, backend) pairs that can run here: torch on CPU always, Triton interpreted
    on CPU or compiled on a GPU, both backends on a GPU."""
    pairs = [pytest.param("cpu", "torch", id="cpu-torch")]
    if triton_interpreted():
        pairs.append(pytest.param("cpu", "triton", id="cpu-triton"))
    if torch.cuda.is_available():
        pairs.append(pytest.param("cuda", "torch", id="cuda-torch"))
        pairs.append(pytest.param(
            "cuda", "triton", id="cuda-triton",
            marks=pytest.mark.skipif(not ON_GPU, reason="compiled Triton needs TRITON_INTERPRET unset"),
        ))
    return pairs


def gpu_or_small(cpu_value, gpu_value, device) -> object:
    """Small problems in the interpreter, full-size ones on a GPU."""
    return gpu_value if str(device).startswith("cuda") else cpu_value


def make_values(kind: str, shape, dtype: torch.dtype, device, generator: torch.Generator) -> torch.Tensor:
    """Fresh test inputs of one character (never all zeros unless ``kind == "zeros"``).

    randn: standard normal; outliers: normal with a few channels scaled 30x and
    shifted (keys' outlier channels); offset: all positive, 5 + U[0, 1) (the range
    does not hold 0); tiny: 1e-4 scale (fp16 subnormal territory for small bits);
    huge: 1e4 scale (fp16 input limits) or 1e30 (fp32 input); constant: every
    group constant, with zero, positive and negative constants; zeros.
    """
    def randn(*s):
        return torch.randn(*s, generator=generator, dtype=torch.float32)

    n = shape[-1]
    if kind == "randn":
        x = randn(*shape)
    elif kind == "outliers":
        x = randn(*shape)
        cols = torch.randperm(n, generator=generator)[: max(1, n // 16)]
        x[..., cols] = x[..., cols] * 30 + 7
    elif kind == "offset":
        x = 5 + torch.rand(*shape, generator=generator)
    elif kind == "tiny":
        x = randn(*shape) * 1e-4
    elif kind == "huge":
        x = randn(*shape) * (1e30 if dtype == torch.float32 else 1e4)
    elif kind == "constant":
        choices = torch.tensor([0.0, 1.5, -2.25, 0.1, -1e-3, 3e4])
        idx = torch.randint(0, len(choices), shape[:-2] + (1, 1), generator=generator)
        x = choices[idx].expand(*shape).clone()
    elif kind == "zeros":
        x = torch.zeros(shape)
    else:
        raise ValueError(kind)
    return x.to(dtype).to(device)


def random_kv(shape, dtype, device, seed: int, kind: str = "randn"):
    g = torch.Generator().manual_seed(seed)
    return make_values(kind, shape, dtype, device, g), make_values(kind, shape, dtype, device, g)


def poison(qkv: QuantizedKV) -> None:
    """Fill every field with values no correct write leaves: 0xFF codes, NaN scales and residual."""
    for name in FIELDS:
        t = getattr(qkv, name)
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif name == "seq_lens":
            t.fill_(0)
        else:
            t.fill_(0xFF)


def used_parts(qkv: QuantizedKV) -> dict:
    """The parts of the cache that hold data, per field, as lists over sequences."""
    g = qkv.group_size
    out = {name: [] for name in FIELDS if name != "seq_lens"}
    for i, (n, nq) in enumerate(zip(qkv.seq_lens.tolist(), qkv.quantized_lens().tolist(), strict=True)):
        out["k_codes"].append(qkv.k_codes[i, :, :nq])
        out["v_codes"].append(qkv.v_codes[i, :, :nq])
        out["k_scale"].append(qkv.k_scale[i, :, : nq // g])
        out["k_zero"].append(qkv.k_zero[i, :, : nq // g])
        out["v_scale"].append(qkv.v_scale[i, :, :nq])
        out["v_zero"].append(qkv.v_zero[i, :, :nq])
        out["k_residual"].append(qkv.k_residual[i, :, : n - nq])
        out["v_residual"].append(qkv.v_residual[i, :, : n - nq])
    return out


def cache_mismatches(a: QuantizedKV, b: QuantizedKV) -> dict:
    """Per field, how many stored elements differ (bitwise) between the used parts of a and b."""
    if not torch.equal(a.seq_lens.cpu(), b.seq_lens.cpu()):
        return {"seq_lens": int((a.seq_lens.cpu() != b.seq_lens.cpu()).sum())}
    pa, pb = used_parts(a), used_parts(b)
    diff = {}
    for name in pa:
        count = 0
        for x, y in zip(pa[name], pb[name], strict=True):
            assert x.shape == y.shape, (name, x.shape, y.shape)
            if x.is_floating_point():
                count += int((x.cpu().view(torch.uint8) != y.cpu().view(torch.uint8)).sum())
            else:
                count += int((x.cpu() != y.cpu()).sum())
        if count:
            diff[name] = count
    return diff


def elements(qkv: QuantizedKV) -> int:
    return sum(t.numel() for parts in used_parts(qkv).values() for t in parts)


def quantize(k, v, bits, group_size, backend, **kw) -> QuantizedKV:
    return kernels.quantize_kv(k, v, bits, group_size=group_size, backend=backend, **kw)
