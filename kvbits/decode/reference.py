"""References for the fused decode: exact attention over the dequantized cache, and attention
over any K/V (docs/design.md section 6).

:func:`reference_decode` is float64 on the dequantized cache (the kernel's error alone);
:func:`attention_reference` takes any K/V, e.g. the original fp16 K/V for the quantization error.
"""

from __future__ import annotations

import math

import torch

from ..kv_cache import _dequantize_side, dequantize_kv
from .layout import codes_from_words
from .paged import PagedQuantizedKV, gather_pages


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


def held_kv(cache, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) [B, H, max(seq_lens), D] as the decode attends them: each position's dequantized
    codes, or its fp value where a paged cache keeps one (the sinks, and the ring from
    ``max(sinks, full - window)`` on; kvbits.decode.paged); zero past each length.

    A paged cache is read where its sequences hold tokens: for each sequence, the pages its whole
    groups fill (block-table entries ``[0, ceil(full / page_size))``), up to its last whole group,
    and its fp rows, whatever the pool's size or the block table's width."""
    if not isinstance(cache, PagedQuantizedKV):
        return dequantize_kv(cache, dtype=dtype)
    lens = cache.seq_lens.tolist()
    b, h, d, g = cache.batch, cache.heads, cache.head_dim, cache.group_size
    shape = (b, h, max(lens, default=0), d)
    k_hat = torch.zeros(shape, dtype=torch.float32, device=cache.device)
    v_hat = torch.zeros(shape, dtype=torch.float32, device=cache.device)
    ring = cache.ring
    for i, n in enumerate(lens):
        full = n // g * g
        if full:
            k_hat[i, :, :full], v_hat[i, :, :full] = _held_codes(cache, i, full)
        rest = torch.arange(full, n, device=cache.device)  # the partial group, from the ring
        sinks = min(cache.sinks, n)
        window = torch.arange(min(max(cache.sinks, full - cache.window), full), full, device=cache.device)
        for out, sink, residual in ((k_hat, cache.k_sink, cache.k_residual), (v_hat, cache.v_sink, cache.v_residual)):
            out[i, :, full:n] = residual[i, :, rest % ring].float()
            if sinks:
                out[i, :, :sinks] = sink[i, :, :sinks].float()
            out[i, :, window] = residual[i, :, window % ring].float()
    return k_hat.to(dtype), v_hat.to(dtype)


def _held_codes(cache: PagedQuantizedKV, i: int, full: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (k, v) [H, full, D]: the dequantized codes of the first ``full`` tokens (whole groups) of
    sequence i, read from the pages they lie in and no other."""
    p, t, g = cache.page_size, cache.tile, cache.group_size
    pages = cache.block_table[i:i + 1, :-(-full // p)]

    def held(x: torch.Tensor, rows: int) -> torch.Tensor:
        # [NP, H, r, ...] -> [1, H, rows, ...]: the sequence's pages in block-table order, cut at ``rows``
        return gather_pages(x, pages)[:, :, :rows]

    out = []
    for role, words, scale, zero in (("k", cache.k_words, cache.k_scale, cache.k_zero),
                                     ("v", cache.v_words, cache.v_scale, cache.v_zero)):
        codes = codes_from_words(held(words, full // t), cache.bits, role, cache.head_dim, t, cache.warps)
        rows = full // g if role == "k" else full
        out.append(_dequantize_side(codes, held(scale, rows), held(zero, rows), cache.bits, g, full, role == "k")[0])
    return out[0], out[1]


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
