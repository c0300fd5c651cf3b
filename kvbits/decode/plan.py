"""Plan once, run per step: the fused decode's host work done once per batch composition.

:class:`DecodePlan` takes a decode-arranged cache (:class:`~kvbits.decode.paged.PagedQuantizedKV`),
the query heads and dtype, and the longest length it is to serve, and does once what
:func:`~kvbits.decode.api.decode_attention` does on every call: the checks of the cache's configuration,
the split plan (sized for ``max_len``: a split past a sequence's tokens stores an empty
partial), the partial-output buffers and every launch argument. :meth:`DecodePlan.run` then
launches the split and merge kernels on the lengths the device holds, with no host
synchronization: a step can be captured in a CUDA graph and replayed while the lengths grow
up to ``max_len`` (as FlashInfer's ``plan()``/``run()`` split does).

Launches go through :class:`~kvbits.decode.direct_launch.Launch`, which skips Triton's per-call argument
specialization once the first call has compiled the kernel.
"""

from __future__ import annotations

import math

import torch

from .._checks import require_int, require_tensor
from .._runtime import on_device
from .checks import Q_DTYPES, check_num_splits, check_scale_range, check_served, check_sm_scale
from .direct_launch import Launch, specialization
from .kernel import _decode_merge_kernel, _decode_split_kernel
from .launch import fp_parts, merge_launch, partial_buffers, query_group, split_launch, split_plan
from .paged import PagedQuantizedKV, code_tokens


class DecodePlan:
    """The fused decode of ``q_heads`` query heads of ``q_dtype`` over ``view``'s sequences,
    planned for lengths up to ``max_len`` (module docstring). The view's tensors are read at
    every run (their contents may change; they must not be replaced)."""

    def __init__(self, view: PagedQuantizedKV, q_heads: int, q_dtype: torch.dtype, max_len: int, *,
                 sm_scale: float | None = None, num_splits: int | None = None):
        if not isinstance(view, PagedQuantizedKV):
            raise TypeError(f"view must be a PagedQuantizedKV; got {type(view).__name__}")
        require_int("q_heads", q_heads)
        if q_heads <= 0 or q_heads % view.heads:
            raise ValueError(f"q_heads ({q_heads}) must be a positive multiple of the cache's kv heads ({view.heads})")
        if q_dtype not in Q_DTYPES:
            raise TypeError(f"q_dtype must be one of {Q_DTYPES}; got {q_dtype!r}")
        require_int("max_len", max_len)
        if max_len < 0:
            raise ValueError(f"max_len must be non-negative; got {max_len}")
        d = view.head_dim
        check_served(view.bits, d, view.group_size)
        if sm_scale is None:
            sm_scale = 1.0 / math.sqrt(d)
        check_sm_scale(sm_scale)
        check_num_splits(num_splits)
        check_scale_range(view)  # once: later appends flag theirs (ERROR_SCALE_RANGE, check_errors)
        self.view, self.q_heads, self.q_dtype, self.max_len, self.sm_scale = view, q_heads, q_dtype, max_len, sm_scale
        batch, device = view.block_table.shape[0], view.k_words.device
        self.shape = (batch, q_heads, d)
        codes = code_tokens([max_len], [max_len], view.group_size, view.sinks, view.window)
        self.splits, per = split_plan(batch, view.heads, codes, view.tile, device, num_splits, view.warps,
                                      fp_parts(view))
        self.mid_o, self.mid_lse = partial_buffers(batch, q_heads, d, self.splits + fp_parts(view), device)
        grid, args, options = split_launch(view, q_heads // view.heads, view.seq_lens, view.seq_lens, self.mid_o,
                                           self.mid_lse, sm_scale, self.splits, per)
        self._split = Launch(_decode_split_kernel, grid, args, options)
        grid, args, options = merge_launch(self.mid_o, self.mid_lse, (q_heads * d, d))  # a contiguous output
        self._merge = Launch(_decode_merge_kernel, grid, args, options)

    def serves(self, q, sm_scale: float | None = None) -> bool:
        """Whether run(q) with ``sm_scale`` (None: the default 1/sqrt(D)) fits this plan (shape, dtype,
        device, scale)."""
        scale = 1.0 / math.sqrt(self.shape[2]) if sm_scale is None else sm_scale
        return self._fits(q) and scale == self.sm_scale

    def _fits(self, q) -> bool:
        return (isinstance(q, torch.Tensor) and tuple(q.shape) == self.shape and q.dtype == self.q_dtype
                and q.device == self.view.k_words.device)

    def run(self, q: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode q [B, Hq, D] with the plan's sm_scale against the view's lengths now (each at most
        max_len; the caller keeps that: lengths are not read on the host). Returns out [B, Hq, D]
        in q's dtype."""
        require_tensor("q", q)
        if not self._fits(q):
            raise ValueError(f"q must be {list(self.shape)} {self.q_dtype} on {self.view.k_words.device} for this "
                             f"plan; got {list(q.shape)} {q.dtype} on {q.device}")
        if out is not None and (not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype
                                or out.device != q.device):
            raise ValueError(f"out must match q ({list(q.shape)}, {q.dtype}, {q.device})")
        return self.launch(q, out)

    def launch(self, q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        """run() without its checks, for a caller that made them (q served, out None or like q)."""
        if self.shape[0] == 0:
            return torch.empty_like(q) if out is None else out
        q = q if q.stride(-1) == 1 else q.contiguous()
        direct = out is not None and out.is_contiguous()
        result = out if direct else torch.empty(self.shape, dtype=q.dtype, device=q.device)
        with on_device(q.device):
            self._split(specialization(q), query_group(q))
            self._merge(specialization(result), self.mid_o, self.mid_lse, result)
        if out is not None and not direct:
            out.copy_(result)
            return out
        return result
