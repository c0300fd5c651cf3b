"""Checks of the fused decode's arguments (docs/design.md section 6).

The kernels read where the lengths and the block table point, unchecked, and carry scales as
fp16 operands: :func:`check_inputs` refuses lengths past what the cache holds, block-table
entries outside the pool for a page a length reaches, and fp32 scales beyond fp16's range. It
reads the lengths and the block table on the host, so a ``decode_attention`` call synchronizes
with the device and cannot be captured in a CUDA graph; a decode loop plans once instead
(:class:`kvbits.decode.plan.DecodePlan`), whose per-step run reads nothing on the host.
"""

from __future__ import annotations

import torch

from .._checks import require_dtype, require_rank, require_same_device, require_tensor
from ..kv_cache import QuantizedKV
from .kernel import LOG2E
from .layout import DECODE_BITS, DECODE_HEAD_DIMS, MAX_V_GROUPS
from .paged import PagedQuantizedKV

Q_DTYPES = (torch.float16, torch.bfloat16)
SM_SCALE_MAX = 3.4028234663852886e38 / LOG2E  # sm_scale * log2(e) must be a finite fp32
FP16_MAX = 65504.0


def check_sm_scale(sm_scale) -> None:
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a float; got {type(sm_scale).__name__}")
    if not 0 < sm_scale <= SM_SCALE_MAX:  # compared as given: an int too large for a float is refused too
        raise ValueError(f"sm_scale must be a positive float of at most {SM_SCALE_MAX:g} (the kernel's fp32 "
                         f"logit scale); got {sm_scale}")


def check_num_splits(num_splits) -> None:
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int; got {num_splits!r}")


def check_served(bits: int, head_dim: int, group_size: int) -> None:
    """Raise ValueError for a cache configuration the Triton kernel does not serve."""
    if bits not in DECODE_BITS:
        raise ValueError(f"backend='triton' serves cache bits {DECODE_BITS}; got {bits} (use 'torch')")
    if head_dim not in DECODE_HEAD_DIMS:
        raise ValueError(f"backend='triton' serves head_dim {DECODE_HEAD_DIMS}; got {head_dim} (use 'torch')")
    if head_dim // group_size > MAX_V_GROUPS:
        raise ValueError(f"backend='triton' serves head_dim / group_size <= {MAX_V_GROUPS} (V scale groups per token); "
                         f"got head_dim {head_dim}, group_size {group_size} (use 'torch')")


def largest_finite(t: torch.Tensor) -> float:
    """The largest finite |value| (0 for none): unused pages of a pool may hold anything."""
    a = t.detach().abs()
    return float(torch.where(torch.isfinite(a), a, 0).amax()) if a.numel() else 0.0


def check_scale_range(cache) -> None:
    """Refuse fp32 scales beyond fp16's range: the fused kernel holds q * sm_scale * K scale and
    softmax weight * V scale as fp16 operands, so they would come out as NaN (16-bit scales cannot
    exceed it). One reduction over the scales."""
    if cache.k_scale.element_size() == 2:
        return
    for name, scale in (("cache.k_scale", cache.k_scale), ("cache.v_scale", cache.v_scale)):
        largest = largest_finite(scale)
        if largest > FP16_MAX:
            raise ValueError(f"{name} holds scales up to {largest:g}, beyond what backend='triton' carries "
                             f"(its products take scales times q or the softmax weights as fp16, at most "
                             f"{FP16_MAX:g}); use backend='torch'")


def valid_prefix(entries: torch.Tensor, pool: int) -> list[int]:
    """Per row of a host block table, how many leading entries are pages of a pool of ``pool``
    pages (the column of its first entry that is not, or the table's width)."""
    if entries.shape[1] == 0:
        return [0] * entries.shape[0]
    cols = torch.arange(entries.shape[1]).expand_as(entries)
    invalid = (entries < 0) | (entries >= pool)
    return torch.where(invalid, cols, entries.shape[1]).amin(dim=1).tolist()


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.int64)


def check_extent(cache, held: list[int]) -> None:
    """Raise ValueError where the cache's lengths claim more tokens than it holds, or a paged
    cache's block table names a page outside its pool for a page those lengths reach. (Entries
    past a sequence's pages may hold anything: they are never read.)"""
    g, window = cache.group_size, cache.k_residual.shape[2]
    paged = isinstance(cache, PagedQuantizedKV)
    if paged:
        table = cache.block_table
        require_tensor("cache.block_table", table)
        require_dtype("cache.block_table", table, (torch.int32, torch.int64))
        require_rank("cache.block_table", table, 2)
        require_same_device(cache_block_table=table, cache_k_words=cache.k_words)
        entries = _host(table)
        limits = valid_prefix(entries, cache.num_pages)
        capacity = table.shape[1] * cache.page_size
    else:
        capacity = cache.capacity
    for i, n in enumerate(held):
        quantized = n // g * g
        if n < 0 or quantized > capacity or n - quantized > window:
            raise ValueError(f"cache.seq_lens[{i}] = {n} exceeds what the cache holds ({capacity} quantized "
                             f"tokens and a residual window of {window})")
        if paged and -(-quantized // cache.page_size) > limits[i]:  # a page it reaches, past entry limits[i]
            j = limits[i]
            raise ValueError(f"cache.block_table[{i}, {j}] = {int(entries[i, j])} is not a page of "
                             f"the pool (0 to {cache.num_pages - 1}); sequence {i} reaches its page {j}")


def _check_lengths(seq_lens, batch: int, q: torch.Tensor) -> None:
    require_tensor("seq_lens", seq_lens)
    require_dtype("seq_lens", seq_lens, (torch.int32, torch.int64))
    require_rank("seq_lens", seq_lens, 1)
    if seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens must have shape [{batch}]; got {tuple(seq_lens.shape)}")
    require_same_device(q=q, seq_lens=seq_lens)


def _check_out(out, q: torch.Tensor) -> None:
    require_tensor("out", out)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(
            f"out must match q (shape {tuple(q.shape)}, {q.dtype}, {q.device}); "
            f"got {tuple(out.shape)}, {out.dtype}, {out.device}"
        )


def check_inputs(q, cache, seq_lens, sm_scale, num_splits, out) -> tuple[torch.Tensor, list[int], list[int]]:
    """Check decode_attention's arguments; return (the lengths tensor to attend, those lengths and
    the cache's own as host ints)."""
    require_tensor("q", q)
    require_dtype("q", q, Q_DTYPES)
    require_rank("q", q, 3)
    if not isinstance(cache, (QuantizedKV, PagedQuantizedKV)):
        raise TypeError(f"cache must be a QuantizedKV or PagedQuantizedKV; got {type(cache).__name__}")
    batch, hq, d = q.shape
    if batch != cache.batch:
        raise ValueError(f"q has batch {batch} but the cache holds {cache.batch} sequences")
    if d != cache.head_dim:
        raise ValueError(f"q has head_dim {d} but the cache has head_dim {cache.head_dim}")
    if hq == 0 or hq % cache.heads:
        raise ValueError(
            f"q heads ({hq}) must be a positive multiple of the cache's kv heads ({cache.heads}) for GQA"
        )
    require_same_device(q=q, cache=cache.k_residual)
    if seq_lens is not None:
        _check_lengths(seq_lens, batch, q)
    if sm_scale is not None:
        check_sm_scale(sm_scale)
    check_num_splits(num_splits)
    if out is not None:
        _check_out(out, q)
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("decode_attention reads the lengths on the host and cannot be captured in a CUDA "
                           "graph; capture DecodePlan.run (kvbits.decode.plan) or PagedKVCache.attend")
    held = _host(cache.seq_lens).tolist()
    check_extent(cache, held)
    lens_t = cache.seq_lens if seq_lens is None else seq_lens
    lens = held if seq_lens is None else _host(seq_lens).tolist()
    for i, (n, cap) in enumerate(zip(lens, held, strict=True)):
        if cap == 0:
            raise ValueError(f"sequence {i} of the cache is empty (cache.seq_lens[{i}] = 0): it holds no token to "
                             f"attend; append one first, or leave the sequence out of the batch")
        if n < 1 or n > cap:
            raise ValueError(f"seq_lens[{i}] = {n} must be in [1, {cap}] (the tokens the cache holds for sequence {i})")
    return lens_t, lens, held
