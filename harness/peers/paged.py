"""The paged K/V layout of vLLM and FlashInfer, in torch alone (no flashinfer import), so that the
mapping the FlashInfer peer makes can be checked on a CPU.

A pool holds ``pages`` pages of ``page_size`` tokens, NHD: ``[pages, page_size, Hkv, D]``, one
pool for K and one for V. Sequence b owns the pool's pages ``[b * pages_per_seq, (b + 1) *
pages_per_seq)`` (its capacity, reserved up front) and uses the first ``ceil(n_b / page_size)``;
token i of it sits in page ``b * pages_per_seq + i // page_size`` at slot ``i % page_size``. The
page table is the CSR triple: ``kv_indptr int32 [B + 1]`` (sequence b's pages are
``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``), ``kv_indices int32`` and ``kv_last_page_len int32
[B]`` (tokens in the last page, 1..page_size; 0 for an empty sequence).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FP8 = torch.float8_e4m3fn
FP8_HEADROOM = 224.0  # the prompt's largest magnitude maps here: half of e4m3's 448 is left for later tokens


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold ``tokens`` tokens."""
    return -(-tokens // page_size)


def page_table(lengths: Sequence[int], page_size: int, pages_per_seq: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kv_indptr [B + 1], kv_indices [sum of pages used], kv_last_page_len [B]), int32 on the CPU,
    for sequences of ``lengths`` tokens (ragged allowed) in their reserved page ranges."""
    indptr, indices, last = [0], [], []
    for b, n in enumerate(lengths):
        used = pages_for(n, page_size)
        if n < 0 or used > pages_per_seq:
            raise ValueError(f"lengths[{b}] must be in 0..{pages_per_seq * page_size}; got {n}")
        indices.extend(range(b * pages_per_seq, b * pages_per_seq + used))
        indptr.append(len(indices))
        last.append(n - (used - 1) * page_size if used else 0)
    as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32)
    return as_int32(indptr), as_int32(indices), as_int32(last)


def to_pages(x: torch.Tensor, page_size: int, pages_per_seq: int) -> torch.Tensor:
    """The prompt x [B, Hkv, S, D] laid into a fresh pool [B * pages_per_seq, page_size, Hkv, D]
    (x's dtype and device; slots past S are zero)."""
    b, h, s, d = x.shape
    if pages_for(s, page_size) > pages_per_seq:
        raise ValueError(f"x's {s} tokens do not fit in {pages_per_seq} pages of {page_size}")
    pool = x.new_zeros(b, pages_per_seq * page_size, h, d)
    pool[:, :s] = x.transpose(1, 2)  # token-major within a sequence: NHD
    return pool.view(b * pages_per_seq, page_size, h, d)


def first_pages(batch: int, pages_per_seq: int, device=None) -> torch.Tensor:
    """Each sequence's first page in the pool: int64 [B]."""
    return torch.arange(batch, device=device) * pages_per_seq


def write_token(pool: torch.Tensor, x: torch.Tensor, first: torch.Tensor, positions: torch.Tensor) -> None:
    """Write token x[b] [Hkv, D] of every sequence at its position ``positions[b]`` (int64 [B], on
    the pool's device): page ``first[b] + positions[b] // page_size``, slot ``positions[b] %
    page_size``, as vLLM's slot mapping does. No host synchronization."""
    page_size = pool.shape[1]
    if pool.dtype == FP8:  # as bytes: index_put_ need not take float8 on every device
        pool, x = pool.view(torch.uint8), x.view(torch.uint8)
    pool[first + positions // page_size, positions % page_size] = x


def from_pages(pool: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
               kv_last_page_len: torch.Tensor) -> list[torch.Tensor]:
    """The inverse: each sequence's tokens [Hkv, n_b, D] read through the page table."""
    page_size = pool.shape[1]
    out = []
    for b in range(len(kv_last_page_len)):
        pages = kv_indices[int(kv_indptr[b]): int(kv_indptr[b + 1])].long()
        n = max(0, (len(pages) - 1) * page_size + int(kv_last_page_len[b]))
        tokens = pool[pages.to(pool.device)].reshape(-1, *pool.shape[2:])[:n]
        out.append(tokens.transpose(0, 1))
    return out


def fp8_scale(x: torch.Tensor) -> float:
    """A per-tensor scale for storing x in float8 e4m3 as x / scale (vLLM's per-layer k_scale /
    v_scale): x's largest magnitude maps to FP8_HEADROOM. Reads x on the host (load time only)."""
    return max(float(x.abs().max()), 1e-6) / FP8_HEADROOM


def to_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale in float8 e4m3 (round to nearest), computed in fp32."""
    return (x.float() / scale).to(FP8)


def plan_args(table: tuple[torch.Tensor, torch.Tensor, torch.Tensor], page_size: int, q_heads: int, kv_heads: int,
              head_dim: int, q_dtype: torch.dtype, kv_dtype: torch.dtype, sm_scale: float) -> tuple[tuple, dict]:
    """The arguments of ``BatchDecodeWithPagedKVCacheWrapper.plan`` (flashinfer 0.6) for a page
    table (indptr, indices, last_page_len: :func:`page_table`, :meth:`PagePool.page_table`):
    (indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size) and the
    keywords (q/kv/output dtypes, softmax scale)."""
    return (*table, q_heads, kv_heads, head_dim, page_size), {
        "q_data_type": q_dtype, "kv_data_type": kv_dtype, "o_data_type": q_dtype, "sm_scale": sm_scale}


class PagePool:
    """Pages of a pool of ``num_pages`` pages of ``page_size`` tokens handed to the rows of a
    serving batch as their tokens reach them, and taken back when a row is freed (vLLM's block
    manager, on the host): ``table`` int32 [max_seqs, max_pages_per_seq] holds each row's pages in
    order (-1 past them). Token i of a row sits at slot ``table[row, i // page_size] * page_size +
    i % page_size`` of the pool flattened to [num_pages * page_size, Hkv, D]."""

    def __init__(self, num_pages: int, page_size: int, max_seqs: int, max_pages_per_seq: int):
        for name, value in (("num_pages", num_pages), ("page_size", page_size), ("max_seqs", max_seqs),
                            ("max_pages_per_seq", max_pages_per_seq)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        self.num_pages, self.page_size = num_pages, page_size
        self.table = torch.full((max_seqs, max_pages_per_seq), -1, dtype=torch.int32)
        self.used = [0] * max_seqs  # pages of each row
        self._free = list(range(num_pages - 1, -1, -1))  # popped from the end: page 0 first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def slots(self, rows: Sequence[int], held: Sequence[int], counts: Sequence[int]) -> torch.Tensor:
        """Slots (int64 [sum of counts], rows in order) of tokens held[i] .. held[i] + counts[i] - 1
        of row rows[i], giving each row the pages they reach: all of them, or none and a ValueError."""
        need = [max(0, pages_for(h + c, self.page_size) - self.used[r]) for r, h, c in zip(rows, held, counts,
                                                                                            strict=True)]
        for r, h, c in zip(rows, held, counts, strict=True):
            if pages_for(h + c, self.page_size) > self.table.shape[1]:
                raise ValueError(f"row {r} would hold {h + c} tokens, more than max_pages_per_seq="
                                 f"{self.table.shape[1]} pages of {self.page_size}")
        if sum(need) > len(self._free):
            raise ValueError(f"the pool is exhausted: {sum(need)} more pages needed, {len(self._free)} free of "
                             f"{self.num_pages}")
        for r, n in zip(rows, need, strict=True):
            for _ in range(n):
                self.table[r, self.used[r]] = self._free.pop()
                self.used[r] += 1
        # one indexed read for every token: a step's slot mapping is a few tensor ops, not a few per row
        of_row = torch.tensor([r for r, c in zip(rows, counts, strict=True) for _ in range(c)], dtype=torch.int64)
        positions = torch.tensor([h + i for h, c in zip(held, counts, strict=True) for i in range(c)],
                                 dtype=torch.int64)
        return self.table[of_row, positions // self.page_size].long() * self.page_size + positions % self.page_size

    def release(self, row: int, last: int) -> None:
        """Row ``row``'s pages back to the pool; row ``last`` moves into it and is cleared."""
        self._free.extend(reversed(self.table[row, :self.used[row]].tolist()))
        if row != last:
            self.table[row] = self.table[last]
            self.used[row] = self.used[last]
        self.table[last] = -1
        self.used[last] = 0

    def page_table(self, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv_indptr [n + 1], kv_indices, kv_last_page_len [n]), int32 on the CPU, of rows 0..n-1
        holding ``lengths`` tokens (each at least 1), as FlashInfer's plan takes them."""
        lens = torch.tensor(list(lengths), dtype=torch.int32)
        used = (lens + self.page_size - 1) // self.page_size
        n = len(lens)
        taken = torch.arange(self.table.shape[1])[None, :] < used[:, None]
        indptr = torch.zeros(n + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(used, 0)
        return indptr, self.table[:n][taken], lens - (used - 1) * self.page_size
