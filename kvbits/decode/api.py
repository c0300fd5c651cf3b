"""``decode_attention``: one fused decode call, checks and all (docs/design.md section 6).

One call does everything: it checks its arguments (reading the lengths and block table on the
host), arranges a contiguous cache's codes (:func:`~kvbits.decode.paged.decode_view`, O(S)),
plans the split and launches. A decode loop does these once per batch composition
(:class:`~kvbits.decode.plan.DecodePlan`, :class:`~kvbits.decode.cache.PagedKVCache`).
"""

from __future__ import annotations

import math

import torch

from .._checks import resolve_backend
from .._runtime import on_device
from .checks import check_inputs, check_scale_range, check_served
from .kernel import _decode_merge_kernel, _decode_split_kernel
from .launch import fp_parts, merge_launch, partial_buffers, query_group, split_launch, split_plan
from .paged import PagedQuantizedKV, code_tokens, decode_view
from .reference import reference_decode

BACKENDS = ("torch", "triton")


def _triton_decode(q, view: PagedQuantizedKV, lens, cache_lens, max_code_len, sm_scale, num_splits, out):
    batch, hq, d = q.shape
    splits, per = split_plan(batch, view.heads, max_code_len, view.tile, q.device, num_splits, view.warps,
                             fp_parts(view))
    mid_o, mid_lse = partial_buffers(batch, hq, d, splits + fp_parts(view), q.device)
    grid, args, options = split_launch(view, hq // view.heads, lens, cache_lens, mid_o, mid_lse, sm_scale, splits, per)
    _decode_split_kernel[grid](query_group(q), **args, **options)
    grid, args, options = merge_launch(mid_o, mid_lse, out.stride()[:2])
    _decode_merge_kernel[grid](mid_o, mid_lse, out, *args, **options)
    return out


def decode_attention(
    q: torch.Tensor,
    cache,
    *,
    seq_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    backend: str | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused decode attention of one query token per sequence over a low-bit KV cache.

    q: fp16 / bf16 [B, Hq, D]. cache: :class:`QuantizedKV` or :class:`PagedQuantizedKV`
    with Hkv heads, ``Hq % Hkv == 0``. seq_lens: int32/int64 [B] tokens to attend per
    sequence (default ``cache.seq_lens``; each in [1, cache.seq_lens]). sm_scale:
    default ``1/sqrt(D)``. backend: ``"torch"`` (dequantize, then attention in fp32;
    any device; any cache, 8 bits and any head_dim included) or ``"triton"`` (fused split-KV
    kernel; bits 2/3/4, D 64/128/256 with at most four V groups per token, D / G <= 4: D = 256
    with G = 64 or 128); ``None`` picks Triton on a GPU. num_splits: override the split count
    (Triton).
    out: optional [B, Hq, D] output buffer. Returns [B, Hq, D] in q's dtype. q's values are not
    inspected: NaN or Inf in q gives NaN in that sequence's output, as SDPA does.

    The Triton path carries q * sm_scale * K scale and each softmax weight * V scale as fp16
    tensor-core operands. Where q * sm_scale * log2(e) * K scale exceeds 65504 (logits of order
    10^5 and more) its output is not finite; a cache with fp32 scales beyond fp16's range is
    refused; V scales below about 2^-8 for 3 bits (2^-14 for 2 and 4 bits; a 3-bit group
    spanning less than about 0.03) put even the largest weights among fp16's subnormals, which
    carry fewer bits (3 bits: about 1.5% of the largest output at V scales of 2^-10, 0.1% at
    2^-6.5). Each call reads the lengths (and a paged cache's block table) on the host, so it
    synchronizes and cannot be captured in a CUDA graph, and arranges a contiguous cache's codes
    anew (O(S)): a decode loop plans once (:class:`~kvbits.decode.plan.DecodePlan` over a
    :class:`PagedQuantizedKV`, or :class:`~kvbits.decode.cache.PagedKVCache`).
    """
    lens_t, lens, held = check_inputs(q, cache, seq_lens, sm_scale, num_splits, out)
    backend = resolve_backend(backend, q.device, BACKENDS)
    d = q.shape[-1]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(d)
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0:  # an empty batch: nothing to attend
        return out
    if backend == "torch":
        out.copy_(reference_decode(q, cache, seq_lens=lens_t, sm_scale=sm_scale, dtype=torch.float32))
        return out
    check_served(cache.bits, d, cache.group_size)
    check_scale_range(cache)
    view = cache if isinstance(cache, PagedQuantizedKV) else decode_view(cache)
    max_code = code_tokens(lens, held, cache.group_size, view.sinks, view.window)
    lens32 = lens_t if lens_t.dtype == torch.int32 else lens_t.to(torch.int32)
    # The kernels address q and out with unit stride along D: strided views go through
    # contiguous buffers (q copied in, the result copied into the caller's out).
    direct = out.is_contiguous()
    result = out if direct else torch.empty_like(out, memory_format=torch.contiguous_format)
    with on_device(q.device):
        _triton_decode(q.contiguous(), view, lens32.contiguous(), cache.seq_lens, max_code, sm_scale,
                       num_splits, result)
    if not direct:
        out.copy_(result)
    return out
