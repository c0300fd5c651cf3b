"""References for the fused decode: exact attention over the dequantized cache, and attention
over any K/V (docs/design.md section 6).

:func:`reference_decode` is float64 on the dequantized cache (the kernel's error alone);
:func:`attention_reference` takes any K/V, e.g. the original fp16 K/V for the quantization error.
"""

from __future__ import annotations

import math

import torch

from ..kv_cache import QuantizedKV, dequantize_kv
from .paged import PagedQuantizedKV, paged_to_contiguous


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v per sequence, in ``dtype``.

    q [B, Hq, D]; k, v [B, Hkv, S, D] (Hq a multiple of Hkv); seq_lens [B] (token i of
    sequence b is attended iff i < seq_lens[b] <= S). Returns [B, Hq, D] in ``dtype``.
    """
    b, hq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    group = hq // hkv
    qd = q.to(dtype).reshape(b, hkv, group, d)
    scores = torch.einsum("bhgd,bhsd->bhgs", qd, k.to(dtype)) * sm_scale
    pos = torch.arange(s, device=k.device)
    valid = pos[None, :] < seq_lens.to(k.device).long()[:, None]  # [B, S]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgs,bhsd->bhgd", probs, v.to(dtype))
    return out.reshape(b, hq, d)


def _contiguous(cache) -> QuantizedKV:
    return paged_to_contiguous(cache) if isinstance(cache, PagedQuantizedKV) else cache


def held_kv(cache, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) [B, H, max(seq_lens), D] as the decode attends them: each position's dequantized
    codes, or its fp value where a paged cache keeps one (the sinks, and the ring from
    ``max(sinks, full - window)`` on; kvbits.decode.paged); zero past each length."""
    k_hat, v_hat = dequantize_kv(_contiguous(cache), dtype=dtype)
    if isinstance(cache, PagedQuantizedKV) and (cache.sinks or cache.window):
        g, ring = cache.group_size, cache.ring
        for i, n in enumerate(cache.seq_lens.tolist()):
            full = n // g * g
            sinks = min(cache.sinks, n)
            window = torch.arange(min(max(cache.sinks, full - cache.window), full), full, device=k_hat.device)
            for out, sink, residual in ((k_hat, cache.k_sink, cache.k_residual), (v_hat, cache.v_sink, cache.v_residual)):
                out[i, :, :sinks] = sink[i, :, :sinks].to(dtype)
                out[i, :, window] = residual[i, :, window % ring].to(dtype)
    return k_hat, v_hat


def reference_decode(
    q: torch.Tensor, cache, *, seq_lens: torch.Tensor | None = None, sm_scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Attention of q over the cache as the decode reads it (:func:`held_kv`), computed in
    ``dtype`` (float64 by default).

    The dequantized values ``(code - zero) * scale`` are exact in fp32 for fp16 scales,
    so in float64 this is the exact answer the fused kernel approximates.
    """
    lens = cache.seq_lens if seq_lens is None else seq_lens
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    k_hat, v_hat = held_kv(cache)
    return attention_reference(q, k_hat, v_hat, lens, sm_scale, dtype)
