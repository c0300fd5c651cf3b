"""Shared pieces of the fused-decode suites: devices, cache builders, references, checks."""

from __future__ import annotations

import math

import pytest
import torch

import kvbits
from harness.measure.timing import graph_replay_ms, rotations
from kvbits.decode import attention_reference, decode_attention, reference_decode
from kvbits.decode.layout import default_layout
from kvbits.kv_cache import QuantizedKV
from suites.common import triton_skip_reason

FP16_TOL = 2e-3  # kernel error against the float64 reference, fp16 outputs (the decode contract)
BF16_TOL = 1.6e-2  # bf16 outputs: their own rounding is 2^-9 relative

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def device_params():
    """pytest params for every available device, each skipped where Triton cannot run on it here
    (on a GPU box the CPU cases: the interpreter is off there)."""
    reasons = {d: triton_skip_reason(d) for d in DEVICES}
    return [pytest.param(d, id=d, marks=pytest.mark.skip(reason=reasons[d]) if reasons[d] else ()) for d in DEVICES]


def generator(seed: int, device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def random_kv(batch: int, heads: int, seq: int, dim: int, *, dtype=torch.float16, device="cpu",
              seed: int = 0, outliers: bool = True):
    """Random K, V [B, H, S, D]; K has a few outlier channels (as real keys do)."""
    gen = generator(seed, device)
    k = torch.randn(batch, heads, seq, dim, generator=gen, device=device)
    v = torch.randn(batch, heads, seq, dim, generator=gen, device=device)
    if outliers:
        scale = torch.ones(dim, device=device)
        scale[torch.randperm(dim, generator=gen, device=device)[: max(1, dim // 16)]] = 6.0
        k = k * scale
    return k.to(dtype), v.to(dtype)


def random_q(batch: int, heads: int, dim: int, *, dtype=torch.float16, device="cpu", seed: int = 1,
             scale: float = 1.0) -> torch.Tensor:
    gen = generator(seed, device)
    return (torch.randn(batch, heads, dim, generator=gen, device=device) * scale).to(dtype)


def varlen_cache(k, v, lens, *, bits=3, group_size=64, scale_dtype=torch.float16, poison=True) -> QuantizedKV:
    """A cache holding k[i, :, :lens[i]] for each sequence i (each quantized on its own).

    With ``poison``, everything the cache holds beyond each sequence (codes, scales,
    residual rows) is garbage: random codes, NaN scales and residual rows.
    """
    b, h, _, d = k.shape
    g = group_size
    cap = max(g, -(-max(lens) // g) * g)
    cache = QuantizedKV.empty(b, h, d, bits=bits, group_size=g, capacity=cap, dtype=k.dtype,
                              scale_dtype=scale_dtype, device=k.device)
    if poison:
        cache.k_codes.random_(0, 256)
        cache.v_codes.random_(0, 256)
        for name in ("k_scale", "k_zero", "v_scale", "v_zero", "k_residual", "v_residual"):
            getattr(cache, name).fill_(float("nan"))
    for i, n in enumerate(lens):
        one = kvbits.quantize_kv(k[i:i + 1, :, :n], v[i:i + 1, :, :n], bits, group_size=g,
                                  scale_dtype=scale_dtype, backend="torch")
        full = n // g * g
        cache.k_codes[i, :, :full] = one.k_codes[0, :, :full]
        cache.v_codes[i, :, :full] = one.v_codes[0, :, :full]
        cache.k_scale[i, :, : full // g] = one.k_scale[0, :, : full // g]
        cache.k_zero[i, :, : full // g] = one.k_zero[0, :, : full // g]
        cache.v_scale[i, :, :full] = one.v_scale[0, :, :full]
        cache.v_zero[i, :, :full] = one.v_zero[0, :, :full]
        cache.k_residual[i, :, : n - full] = one.k_residual[0, :, : n - full]
        cache.v_residual[i, :, : n - full] = one.v_residual[0, :, : n - full]
    cache.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
    return cache


def poisoned_like(q: torch.Tensor) -> torch.Tensor:
    return torch.full_like(q, float("nan"))


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (out.double() - ref.double()).abs()
    return {
        "max_abs_err": float(diff.max()),
        "max_rel_err": float(diff.norm() / ref.double().norm().clamp_min(1e-30)),
    }


def tolerance(dtype: torch.dtype) -> float:
    return FP16_TOL if dtype == torch.float16 else BF16_TOL


def run_checked(record, q, cache, *, backend="triton", seq_lens=None, sm_scale=None, original=None,
                num_splits=None, tol=None, variant=None) -> torch.Tensor:
    """Decode into a NaN-poisoned buffer, require every element written, compare with the float64
    reference on the dequantized cache (and, given ``original`` = (k, v), report the quantization
    error against attention on the original K/V), record the figures and assert the tolerance."""
    record.backend = backend
    record.device = str(q.device)
    if variant is None and backend == "triton":
        tile, warps = (cache.tile, cache.warps) if hasattr(cache, "tile") else default_layout(
            cache.head_dim, cache.group_size)
        variant = f"t{tile}w{warps}"
    record.variant = variant or "reference"
    out = poisoned_like(q)
    result = decode_attention(q, cache, seq_lens=seq_lens, sm_scale=sm_scale, backend=backend,
                              num_splits=num_splits, out=out)
    assert result is out
    assert bool(torch.isfinite(out).all()), "output has unwritten (NaN) or non-finite elements"
    ref = reference_decode(q, cache, seq_lens=seq_lens, sm_scale=sm_scale)
    metrics = errors(out, ref)
    metrics["states_checked"] = out.numel()
    lens_shown = (cache.seq_lens if seq_lens is None else seq_lens).tolist()[:8]
    metrics["shape"] = (f"B={q.shape[0]} Hq={q.shape[1]} Hkv={cache.heads} D={q.shape[2]} bits={cache.bits} "
                        f"G={cache.group_size} lens={lens_shown}")
    if original is not None:
        k, v = original
        lens = cache.seq_lens if seq_lens is None else seq_lens
        scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
        exact = attention_reference(q, k, v, lens, scale)
        metrics["quant_abs_err"] = float((out.double() - exact).abs().max())
        metrics["quant_rel_err"] = errors(out, exact)["max_rel_err"]
    limit = tolerance(q.dtype) if tol is None else tol
    record.add(**metrics, tolerance=limit)
    assert metrics["max_abs_err"] <= limit, f"max abs err {metrics['max_abs_err']:.3g} > {limit:g}"
    return out


# ----------------------------------------------------------------------------- benchmark
# (B, Hq, Hkv, S, D): the decode benchmark's shapes on a GPU (at the default group size 64; D = 256
# is Gemma's head, four V scale groups per token); one tiny shape in the interpreter
GPU_BENCH_SHAPES = [
    (1, 32, 32, 4096, 128), (1, 32, 32, 16384, 128), (1, 32, 32, 32768, 128), (1, 32, 32, 131072, 128),
    (8, 32, 8, 32768, 128), (32, 32, 32, 8192, 128), (1, 16, 8, 32768, 256),
]
CPU_BENCH_SHAPES = [(1, 2, 2, 256, 64)]


def bench_shapes() -> list[tuple]:
    return GPU_BENCH_SHAPES if torch.cuda.is_available() else CPU_BENCH_SHAPES


def clone_cache(cache: QuantizedKV) -> QuantizedKV:
    return QuantizedKV(cache.bits, cache.group_size, *(getattr(cache, f).clone() for f in (
        "k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "k_residual", "v_residual", "seq_lens")))


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp16 scaled_dot_product_attention of one query token over the original K/V (GQA native)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(2)


def unfused_decode(q: torch.Tensor, cache: QuantizedKV, length: int) -> torch.Tensor:
    """Dequantize the whole cache to fp16 (unpack kernel, then scale and zero in torch), then SDPA:
    the path a fused kernel must beat. Every sequence holds ``length`` tokens."""
    b, h, d, g = cache.batch, cache.heads, cache.head_dim, cache.group_size
    full = length // g * g
    backend = "triton" if q.is_cuda else "torch"
    k = kvbits.unpack_bits(cache.k_codes[:, :, :full], cache.bits, backend=backend)
    v = kvbits.unpack_bits(cache.v_codes[:, :, :full], cache.bits, backend=backend)
    ks, kz = cache.k_scale[:, :, : full // g, None, :], cache.k_zero[:, :, : full // g, None, :]
    k = ((k.view(b, h, full // g, g, d).to(ks.dtype) - kz) * ks).view(b, h, full, d)
    vs, vz = cache.v_scale[:, :, :full, :, None], cache.v_zero[:, :, :full, :, None]
    v = ((v.view(b, h, full, d // g, g).to(vs.dtype) - vz) * vs).view(b, h, full, d)
    if length > full:
        k = torch.cat([k.to(q.dtype), cache.k_residual[:, :, : length - full].to(q.dtype)], dim=2)
        v = torch.cat([v.to(q.dtype), cache.v_residual[:, :, : length - full].to(q.dtype)], dim=2)
    return sdpa_decode(q, k.to(q.dtype), v.to(q.dtype))


LONG_CONTEXT = 32768  # from here on the fused kernel is held to the long-context goals


def decode_goals(seq: int) -> dict:
    """What the fused 3-bit decode aims at on a GPU (figures shown in the report, never asserted):
    faster than the unfused path at every length; from LONG_CONTEXT tokens on, 4x fp16 SDPA and
    80% of the copy bandwidth measured in the same run over the bytes it must read."""
    goals = {"speedup.unfused": 1.0}
    if seq >= LONG_CONTEXT:
        goals.update({"speedup.sdpa_fp16": 4.0, "pct_of_peak": 80.0})
    return goals


def bench_shape(batch, hq, hkv, seq, dim, *, device, bits=3, layout=None, seed=0) -> dict:
    """Time the fused kernel, fp16 SDPA on the original K/V and the unfused path on one shape,
    check the fused output, and return the figures (ms, speedups, bandwidth over the bytes the
    fused kernel must read; on a GPU also the read floor of those bytes, harness.measure.read_floor, and
    the fused kernel's speed as a percentage of it, and the eager public call)."""
    from harness.measure.timing import bandwidth_metrics, graph_replay_timing, median_ms
    from kvbits.decode import DecodePlan, decode_view

    k, v = random_kv(batch, hkv, seq, dim, device=device, seed=seed)
    q = random_q(batch, hq, dim, device=device, seed=seed + 1)
    cache = kvbits.quantize_kv(k, v, bits, backend="triton" if device == "cuda" else "torch")
    tile, warps = layout or (None, None)
    view = decode_view(cache, tile=tile, warps=warps)
    nbytes = view.read_bytes() + 2 * q.numel() * q.element_size()
    caches = [cache] + [clone_cache(cache) for _ in range(rotations(nbytes) - 1)]
    views = [view] + [decode_view(c, tile=view.tile, warps=view.warps) for c in caches[1:]]
    out = decode_attention(q, cache, backend="triton")
    ref = reference_decode(q, cache)
    figures = {"max_abs_err": float((out.double() - ref).abs().max()), "states_checked": out.numel()}
    del ref
    plans = [DecodePlan(view, hq, q.dtype, seq) for view in views]  # the kernels alone, planned once
    fused = graph_replay_timing([lambda p=p: p.run(q) for p in plans])
    fused_ms = fused.median
    del plans
    kv_bytes = 2 * k.numel() * k.element_size()
    originals = [(k, v)] + [(k.clone(), v.clone()) for _ in range(rotations(kv_bytes, 4) - 1)]
    sdpa_ms = graph_replay_ms([lambda kv=kv: sdpa_decode(q, *kv) for kv in originals])
    del originals
    unfused_ms = graph_replay_ms([lambda c=c: unfused_decode(q, c, seq) for c in caches[: rotations(nbytes, 4)]])
    figures.update(bandwidth_metrics(nbytes, fused_ms), **fused.metrics())
    # replayed from a CUDA graph, the figure holds no host launch: the device's time by construction
    figures["bound"] = "device" if device == "cuda" else "cpu"
    figures.update(
        ms=fused_ms, sdpa_ms=sdpa_ms, unfused_ms=unfused_ms,
        speedup={"sdpa_fp16": sdpa_ms / fused_ms, "unfused": unfused_ms / fused_ms},
        sdpa_gbps=kv_bytes / (sdpa_ms * 1e-3) / 1e9,
        shape=f"B={batch} Hq={hq} Hkv={hkv} S={seq} D={dim} bits={bits}",
        layout=f"t{view.tile}w{view.warps}",
    )
    if torch.cuda.is_available():  # what a kernel that only reads these bytes takes, timed alike
        from harness.measure.read_floor import read_floor_ms

        floor_ms = read_floor_ms(nbytes, q.device.index or 0)
        figures["call_ms"] = median_ms(lambda: decode_attention(q, view))  # the public call, eager
        figures.update(read_floor_ms=floor_ms, pct_of_read_floor=100.0 * floor_ms / fused_ms,
                       goals=decode_goals(seq))
    return figures
