"""The paged, decode-arranged cache the fused decode reads, and its bijection with the
contiguous :class:`~kvbits.kv_cache.QuantizedKV` (docs/design.md section 3).

**Paged pool.** Fixed-size pages of ``page_size`` tokens (a multiple of the tile and
of the group size G), shared by all sequences through a block table, as vLLM and
FlashInfer do. With ``NP`` pages, H kv heads, head_dim D, P = page_size, tile t and
W = t * D * bits / 32 words per tile::

    k_words   int32 [NP, H, P/t, W]             K tiles [t tokens, D]
    k_scale   sdt   [NP, H, P/G, D]             K per channel, groups of G tokens
    k_zero    sdt   [NP, H, P/G, D]
    v_words   int32 [NP, H, P/t, W]             V tiles [D, t tokens]
    v_scale   sdt   [NP, H, P, D/G]             V per token, groups of G channels
    v_zero    sdt   [NP, H, P, D/G]
    k_residual, v_residual  dt [B, H, R, D]     the fp ring, per sequence: token t at row t % R
    k_sink, v_sink  dt [B, H, S, D] or None     the first S tokens of each sequence in fp
    block_table int32 [B, max_pages]            token t of sequence i: page
                                                block_table[i, t // P], row t % P
    seq_lens  int32 [B]

**Full-precision tokens** (KVQuant's and KIVI's attention sinks and recent window). The pages
hold every complete group of G tokens, codes of the sequence from its first token on. The decode
reads from codes only the positions [S, end) with ``end = max(S, min(length, full - W))``
(:func:`code_end`; full = the tokens in whole groups, W = R - G the window): the first S
positions (the sinks) come from ``k_sink``/``v_sink``, and the positions from ``max(S, full -
W)`` to the length from the ring, which holds the last R tokens appended: the partial group and
the W tokens before it. With S = 0 and R = G (no sinks, no window) the ring is the partial group
alone. S and W are multiples of G. Only :class:`~kvbits.decode.cache.PagedKVCache` keeps sinks
and a window (their fp values are not part of the contiguous format, which holds the codes).

A contiguous :class:`QuantizedKV` is the special case of one page per sequence
(``page_size`` = the capacity, block table ``[[0], [1], ...]``); when the capacity
is a multiple of the tile its scale tensors are used as they are, without a
copy (:func:`decode_view`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import require_int, require_tensor
from ..kv_cache import CacheLengths, QuantizedKV
from .layout import (
    DECODE_BITS,
    DECODE_HEAD_DIMS,
    check_arrangement,
    codes_from_words,
    default_layout,
    words_from_codes,
)


@dataclass
class PagedQuantizedKV(CacheLengths):
    """A paged, decode-arranged low-bit KV cache (layout in this module's docstring)."""

    bits: int
    group_size: int
    page_size: int
    tile: int
    warps: int
    k_words: torch.Tensor
    k_scale: torch.Tensor
    k_zero: torch.Tensor
    v_words: torch.Tensor
    v_scale: torch.Tensor
    v_zero: torch.Tensor
    k_residual: torch.Tensor
    v_residual: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_sink: torch.Tensor | None = None
    v_sink: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return self.block_table.shape[0]

    @property
    def sinks(self) -> int:
        """The first tokens of each sequence attended from their fp values (k_sink, v_sink)."""
        return 0 if self.k_sink is None else self.k_sink.shape[2]

    @property
    def ring(self) -> int:
        """Rows of the fp ring (k_residual, v_residual): the window and the partial group."""
        return self.k_residual.shape[2]

    @property
    def window(self) -> int:
        """Tokens of whole groups before the partial group attended from the ring (R - G)."""
        return self.ring - self.group_size

    @property
    def heads(self) -> int:
        return self.k_words.shape[1]

    @property
    def num_pages(self) -> int:
        return self.k_words.shape[0]

    @property
    def device(self) -> torch.device:
        return self.k_words.device

    def code_end(self, seq_lens: torch.Tensor | None = None) -> torch.Tensor:
        """int32 [B]: the end of the positions attended from codes for ``seq_lens`` (default the
        cache's), which begin at the sinks (module docstring)."""
        lens = self.seq_lens if seq_lens is None else seq_lens.to(self.seq_lens.device)
        return code_end(lens, self.seq_lens, self.group_size, self.sinks, self.window)

    def read_bytes(self, seq_lens: torch.Tensor | None = None) -> int:
        """Fewest bytes a decode step must read from this cache: codes, scales and zeros of
        every token attended from codes, and the fp rows attended (q and the output excluded)."""
        lens = self.seq_lens if seq_lens is None else seq_lens
        qlen = (self.code_end(lens) - self.sinks).clamp(min=0).to(torch.int64)
        rlen = lens.to(self.seq_lens.device).to(torch.int64) - qlen
        d, g, h = self.head_dim, self.group_size, self.heads
        sdt = self.k_scale.element_size()
        per_token = 2 * d * self.bits / 8 + 2 * sdt * (d / g) + 2 * sdt * (d / g)
        residual = 2 * d * self.k_residual.element_size()
        return int(h * (per_token * int(qlen.sum()) + residual * int(rlen.sum())))


def code_end(lens: torch.Tensor, cached: torch.Tensor, group_size: int, sinks: int, window: int) -> torch.Tensor:
    """The end of the positions attended from codes, ``max(sinks, min(lens, full - window))`` with
    ``full = cached // G * G`` (the kernel's _code_length), for lengths attended ``lens`` of caches
    holding ``cached`` tokens."""
    full = cached // group_size * group_size
    return torch.clamp(torch.minimum(lens.to(full.dtype), full - window), min=sinks)


def code_tokens(lens: list[int], cached: list[int], group_size: int, sinks: int, window: int) -> int:
    """The most tokens any of the sequences attends from codes (code_end less the sinks), for host
    lengths: what the split plan covers."""
    if not lens:
        return 0
    return int(code_end(torch.tensor(lens), torch.tensor(cached), group_size, sinks, window).max()) - sinks


def ring_groups(residual: torch.Tensor, seq_lens: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B, H, G, D]: each sequence's partial group (positions full .. full + G - 1, full = its
    tokens in whole groups) gathered from its ring ``residual`` [B, H, R, D] (row t % R)."""
    b, h, ring, d = residual.shape
    full = (seq_lens.to(torch.int64) // group_size * group_size).to(residual.device)
    slots = (full[:, None] + torch.arange(group_size, device=residual.device)) % ring  # [B, G]
    return residual.gather(2, slots[:, None, :, None].expand(b, h, group_size, d))


def _require_page_size(page_size: int, group_size: int, tile: int) -> None:
    require_int("page_size", page_size)
    unit = max(group_size, tile)
    if page_size <= 0 or page_size % unit:
        raise ValueError(
            f"page_size must be a positive multiple of {unit} (the group size {group_size} and the "
            f"{tile}-token tile); got {page_size}"
        )


def _require_cache(cache) -> None:
    if not isinstance(cache, QuantizedKV):
        raise TypeError(f"cache must be a QuantizedKV; got {type(cache).__name__}")
    require_int("cache.bits", cache.bits, DECODE_BITS)
    if cache.head_dim not in DECODE_HEAD_DIMS:
        raise ValueError(f"cache.head_dim must be one of {DECODE_HEAD_DIMS} for the decode layout; "
                         f"got {cache.head_dim}")


def _layout_or_default(cache: QuantizedKV, tile: int | None, warps: int | None) -> tuple[int, int]:
    """(tile, warps) as given, each one left out taken from default_layout."""
    default_tile, default_warps = default_layout(cache.head_dim, cache.group_size)
    return (default_tile if tile is None else tile), (default_warps if warps is None else warps)


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    extra = rows - x.shape[2]
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 3) + (0, extra)) if extra else x


def paged_from_contiguous(
    cache: QuantizedKV,
    page_size: int,
    *,
    num_pages: int | None = None,
    generator: torch.Generator | None = None,
    tile: int | None = None,
    warps: int | None = None,
) -> PagedQuantizedKV:
    """Copy a contiguous cache into a page pool.

    Each sequence gets ``ceil(capacity / page_size)`` pages (at least one). With a
    ``generator`` the pages are scattered over the pool in a random order (as an
    allocator that reuses freed pages leaves them); otherwise they are assigned in
    order. ``num_pages`` (at least the pages needed) sizes the pool; unused pages hold
    garbage (NaN scales, all-ones words) that a correct kernel never reads. ``tile`` and
    ``warps`` choose the word arrangement (the kernel's tile and program size; default
    :func:`default_layout`).
    """
    _require_cache(cache)
    tile, warps = _layout_or_default(cache, tile, warps)
    require_int("tile", tile)
    require_int("warps", warps)
    check_arrangement(cache.head_dim, tile, warps)
    if tile > cache.group_size:
        raise ValueError(f"tile ({tile}) must not exceed the group size ({cache.group_size})")
    g = cache.group_size
    _require_page_size(page_size, g, tile)
    b, h = cache.batch, cache.heads
    per_seq = max(1, -(-cache.capacity // page_size))
    need = b * per_seq
    if num_pages is None:
        num_pages = need
    require_int("num_pages", num_pages)
    if num_pages < need:
        raise ValueError(f"num_pages must be at least {need} (B={b} x {per_seq} pages); got {num_pages}")
    dev = cache.device
    order = torch.arange(num_pages) if generator is None else torch.randperm(num_pages, generator=generator)
    block_table = order[:need].reshape(b, per_seq).to(torch.int32).to(dev)
    rows = per_seq * page_size

    def pages(x: torch.Tensor) -> torch.Tensor:
        # [B, H, per_seq*r, ...] -> [B*per_seq, H, r, ...] in block-table order
        x = x.reshape(b, h, per_seq, x.shape[2] // per_seq, *x.shape[3:]).transpose(1, 2)
        return x.reshape(b * per_seq, h, *x.shape[3:])

    def pool(src: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((num_pages, *src.shape[1:]), fill, dtype=src.dtype, device=dev)
        out[block_table.reshape(-1).long()] = src
        return out

    def words(codes: torch.Tensor, role: str) -> torch.Tensor:
        return pool(pages(words_from_codes(_pad_rows(codes, rows), cache.bits, role, tile, warps)), -1)

    nan = float("nan")
    return PagedQuantizedKV(
        bits=cache.bits,
        group_size=g,
        page_size=page_size,
        tile=tile,
        warps=warps,
        k_words=words(cache.k_codes, "k"),
        k_scale=pool(pages(_pad_rows(cache.k_scale, rows // g)), nan),
        k_zero=pool(pages(_pad_rows(cache.k_zero, rows // g)), nan),
        v_words=words(cache.v_codes, "v"),
        v_scale=pool(pages(_pad_rows(cache.v_scale, rows)), nan),
        v_zero=pool(pages(_pad_rows(cache.v_zero, rows)), nan),
        k_residual=cache.k_residual.clone(),
        v_residual=cache.v_residual.clone(),
        block_table=block_table,
        seq_lens=cache.seq_lens.clone(),
    )


def gather_pages(x: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """[NP, H, r, ...] rows of a page pool -> [B, H, P r, ...]: each row of ``pages`` [B, P]
    (page indices) read in its order, its pages' rows end to end."""
    b, per_seq = pages.shape
    y = x[pages.reshape(-1).long()].reshape(b, per_seq, x.shape[1], *x.shape[2:]).transpose(1, 2)
    return y.reshape(b, x.shape[1], per_seq * x.shape[2], *x.shape[3:])


def paged_to_contiguous(paged: PagedQuantizedKV) -> QuantizedKV:
    """The inverse of :func:`paged_from_contiguous`: capacity = pages per sequence x page_size. Of
    a paged cache with sinks or a window, the codes of every complete group and the partial group
    (the contiguous format keeps no other fp tokens)."""
    if not isinstance(paged, PagedQuantizedKV):
        raise TypeError(f"paged must be a PagedQuantizedKV; got {type(paged).__name__}")
    d = paged.head_dim

    def gather(x: torch.Tensor) -> torch.Tensor:
        return gather_pages(x, paged.block_table)

    return QuantizedKV(
        bits=paged.bits,
        group_size=paged.group_size,
        k_codes=codes_from_words(gather(paged.k_words), paged.bits, "k", d, paged.tile, paged.warps),
        k_scale=gather(paged.k_scale),
        k_zero=gather(paged.k_zero),
        v_codes=codes_from_words(gather(paged.v_words), paged.bits, "v", d, paged.tile, paged.warps),
        v_scale=gather(paged.v_scale),
        v_zero=gather(paged.v_zero),
        k_residual=ring_groups(paged.k_residual, paged.seq_lens, paged.group_size),
        v_residual=ring_groups(paged.v_residual, paged.seq_lens, paged.group_size),
        seq_lens=paged.seq_lens.clone(),
    )


# ----------------------------------------------------------------------------- decode view
def decode_view(cache: QuantizedKV, *, tile: int | None = None, warps: int | None = None) -> PagedQuantizedKV:
    """The decode arrangement of a contiguous cache: one page per sequence, made at this call.

    ``tile``/``warps`` default to :func:`~kvbits.decode.layout.default_layout` for the cache's
    head_dim and group. The view holds its own arranged codes (a copy of the codes' size, O(S)
    work); when the capacity is a multiple of the tile it shares the cache's scales and zeros,
    and it always shares its residual window and ``seq_lens``. It does not follow later writes to
    the cache's codes or scales: make it again after an append that completes a group. A cache
    that grows token by token is a :class:`~kvbits.decode.cache.PagedKVCache`, which is written
    in this arrangement.
    """
    _require_cache(cache)
    require_tensor("cache.k_codes", cache.k_codes)
    tile, warps = _layout_or_default(cache, tile, warps)
    check_arrangement(cache.head_dim, tile, warps)
    if tile > cache.group_size:
        raise ValueError(f"tile ({tile}) must not exceed the group size ({cache.group_size})")
    return _arranged(cache, tile, warps)


def _arranged(cache: QuantizedKV, tile: int, warps: int) -> PagedQuantizedKV:
    """A new decode arrangement of a contiguous cache (decode_view): one page per sequence."""
    b, cap = cache.batch, cache.capacity
    if cap % tile or cap % cache.group_size or cap == 0:
        page = max(-(-cap // tile) * tile, tile, cache.group_size)
        page = -(-page // cache.group_size) * cache.group_size
        return paged_from_contiguous(cache, page, tile=tile, warps=warps)
    return PagedQuantizedKV(
        bits=cache.bits,
        group_size=cache.group_size,
        page_size=cap,
        tile=tile,
        warps=warps,
        k_words=words_from_codes(cache.k_codes, cache.bits, "k", tile, warps),
        k_scale=cache.k_scale,
        k_zero=cache.k_zero,
        v_words=words_from_codes(cache.v_codes, cache.bits, "v", tile, warps),
        v_scale=cache.v_scale,
        v_zero=cache.v_zero,
        k_residual=cache.k_residual,
        v_residual=cache.v_residual,
        block_table=torch.arange(b, dtype=torch.int32, device=cache.device).reshape(b, 1),
        seq_lens=cache.seq_lens,
    )
