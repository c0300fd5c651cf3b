"""A paged low-bit KV cache a server can decode on: :class:`PagedKVCache`.

A pool of fixed-size pages in the decode arrangement (:mod:`kvbits.decode.layout`), a block table
per sequence and a few full-precision tokens per sequence, in the conventions of vLLM and
FlashInfer.
Sequences are added (with or without a prompt) and freed (their pages go back to the pool);
each step appends one token to every live sequence in one kernel launch (a chunk in two:
:mod:`kvbits.decode.append`) and attends with the fused decode through a plan made once per
batch composition (:class:`kvbits.decode.plan.DecodePlan`). The prompt and every appended
token are written straight into the arrangement the kernel reads: nothing is rebuilt, and
the cache's device memory is :meth:`PagedKVCache.nbytes`.

Full-precision tokens (``sinks`` and ``window``; :mod:`kvbits.decode.paged`): the decode attends
each sequence's first ``sinks`` tokens (attention sinks, which the softmax weighs heavily) and
its newest tokens (the partial group and the ``window`` before it) in the input dtype, and only
the tokens between them from codes. The pages still hold every complete group; the fp tokens
cost a fixed ``(sinks + window + G) * H * D * 2`` element bytes per sequence
(:meth:`PagedKVCache.sequence_bytes`), nothing per token. Measured on SmolLM2-135M (perplexity
change with the cache read by every scored token, reports/baselines/BENCHMARKS.md): 3 bits
+2.5% without them, under +1% with 64 sinks and a 128-token window. ``sinks=0, window=0`` is
the scheme without them.

Live sequences occupy rows 0..n-1 of the batch, in :attr:`PagedKVCache.sequences` order (q, k
and v of a step follow it); freeing a sequence moves the last row into its place, as a
persistent batch does. The host keeps each sequence's length as its own calls grew it, so that
it allocates pages without reading the device; after replays of a captured step, which the
host does not see, :meth:`PagedKVCache.sync_lengths` reads them back (or
:meth:`PagedKVCache.advance` states them).

Life of a cache::

    cache = PagedKVCache(num_pages=1024, page_size=256, heads=8, head_dim=128, max_seqs=32,
                         device="cuda")
    a = cache.add_sequence(k_prompt, v_prompt)   # [H, S, D] each: quantized into pages
    cache.append(k, v)                           # [n, H, D]: one token to every live sequence
    out = cache.attend(q)                        # [n, Hq, D]: fused decode
    cache.free(a)                                # its pages back to the pool
"""

from __future__ import annotations

import dataclasses

import torch

from .._checks import (
    require_dtype,
    require_int,
    require_rank,
    require_same_device,
    require_tensor,
    resolve_backend,
)
from .._runtime import triton_interpreted
from ..affine import INPUT_DTYPES, _check_config, _check_head_dim
from ..kv_cache import CacheLengths, QuantizedKV
from .append import (
    ERROR_NO_PAGE,
    ERROR_NOT_FINITE,
    ERROR_SCALE_RANGE,
    AppendLaunch,
    append_torch,
    word_sources,
)
from .checks import FP16_MAX
from .layout import DECODE_BITS, check_arrangement, default_layout
from .paged import PagedQuantizedKV, _require_page_size, paged_to_contiguous
from .plan import DecodePlan

BACKENDS = ("torch", "triton")
APPENDS, ADDS = 0, 1  # the rows of PagedKVCache.errors: what append found, what add_sequence found
CALLS = {ADDS: "add_sequence", APPENDS: "append"}
SINKS, WINDOW = 64, 128  # default fp tokens, rounded up to whole groups (fp_tokens)
PLAN_HEADROOM = 8  # a plan covers the longest sequence plus an eighth, so that growth rarely re-plans


class PagedKVCache(CacheLengths):
    """A page pool with sequences (module docstring). Appends and the decode run on ``device``.
    ``sinks`` and ``window``: full-precision tokens per sequence, multiples of group_size (None:
    SINKS and WINDOW rounded up to whole groups; 0 and 0: none beyond the partial group).
    (head_dim, dtype and scale_dtype as every cache derives them: CacheLengths.)"""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        heads: int,
        head_dim: int,
        *,
        max_seqs: int,
        max_pages_per_seq: int | None = None,
        bits: int = 3,
        group_size: int = 64,
        dtype: torch.dtype = torch.float16,
        scale_dtype: torch.dtype = torch.float16,
        device: torch.device | str = "cpu",
        tile: int | None = None,
        warps: int | None = None,
        sinks: int | None = None,
        window: int | None = None,
    ):
        for name, value in (("num_pages", num_pages), ("heads", heads), ("max_seqs", max_seqs)):
            require_int(name, value)
            if value <= 0:
                raise ValueError(f"{name} must be positive; got {value}")
        require_int("bits", bits, DECODE_BITS)
        _check_config(bits, group_size, scale_dtype)
        require_int("head_dim", head_dim)
        _check_head_dim(head_dim, group_size)
        if dtype not in INPUT_DTYPES[:2]:
            raise TypeError(f"dtype must be one of {INPUT_DTYPES[:2]} (the K/V and q dtype); got {dtype!r}")
        default_tile, default_warps = default_layout(head_dim, group_size)
        tile = default_tile if tile is None else require_int("tile", tile)
        warps = default_warps if warps is None else require_int("warps", warps)
        check_arrangement(head_dim, tile, warps)
        if tile > group_size:
            raise ValueError(f"tile ({tile}) must not exceed the group size ({group_size})")
        _require_page_size(page_size, group_size, tile)
        sinks, window = fp_tokens(group_size, sinks, window)
        if max_pages_per_seq is None:
            max_pages_per_seq = num_pages
        require_int("max_pages_per_seq", max_pages_per_seq)
        if max_pages_per_seq <= 0:
            raise ValueError(f"max_pages_per_seq must be positive; got {max_pages_per_seq}")
        device = torch.device(device)
        words = tile * head_dim * bits // 32
        kw = {"device": device}
        zeros = torch.zeros
        self.bits, self.group_size, self.page_size, self.tile, self.warps = bits, group_size, page_size, tile, warps
        self.k_words = zeros(num_pages, heads, page_size // tile, words, dtype=torch.int32, **kw)
        self.v_words = zeros(num_pages, heads, page_size // tile, words, dtype=torch.int32, **kw)
        self.k_scale = zeros(num_pages, heads, page_size // group_size, head_dim, dtype=scale_dtype, **kw)
        self.k_zero = zeros(num_pages, heads, page_size // group_size, head_dim, dtype=scale_dtype, **kw)
        self.v_scale = zeros(num_pages, heads, page_size, head_dim // group_size, dtype=scale_dtype, **kw)
        self.v_zero = zeros(num_pages, heads, page_size, head_dim // group_size, dtype=scale_dtype, **kw)
        self.k_residual = zeros(max_seqs, heads, group_size + window, head_dim, dtype=dtype, **kw)  # the ring
        self.v_residual = zeros(max_seqs, heads, group_size + window, head_dim, dtype=dtype, **kw)
        self.k_sink = zeros(max_seqs, heads, sinks, head_dim, dtype=dtype, **kw) if sinks else None
        self.v_sink = zeros(max_seqs, heads, sinks, head_dim, dtype=dtype, **kw) if sinks else None
        self.block_table = torch.full((max_seqs, max_pages_per_seq), -1, dtype=torch.int32, **kw)
        self.seq_lens = zeros(max_seqs, dtype=torch.int32, **kw)
        # the append kernel's ERROR_* bits per call (APPENDS, ADDS) and row; column max_seqs: sequences freed since
        self.errors = zeros(2, max_seqs + 1, dtype=torch.int32, **kw)
        self.arrivals = zeros(max_seqs, dtype=torch.int32, **kw)  # the append kernel's counts (append.py)
        # per row, what the append kernel hands its ring launch (append._ring_kernel): -1, or a length
        self.ring_from = torch.full((max_seqs,), -1, dtype=torch.int32, **kw)
        # where each bit of a K and a V tile's words comes from (append.word_sources)
        self.k_sources, self.v_sources = (word_sources(bits, role, head_dim, tile, warps, device) for role in "kv")
        self._free_pages = list(range(num_pages - 1, -1, -1))  # popped from the end: page 0 first
        self._ids: list[int] = []  # sequence id of each live row
        self._pages: list[list[int]] = []  # pages of each live row, in block-table order
        self._lens: list[int] = []  # tokens of each live row, as the host's calls grew it
        self._next_id = 0
        self._room: int | None = None  # tokens every live row can still take without a new page (None: count)
        self._on_gpu = device.type == "cuda"
        self._view: PagedQuantizedKV | None = None
        self._appender: AppendLaunch | None = None  # appends into the live view
        self._plan: DecodePlan | None = None
        self._planned_len = 0  # the longest length reserve() prepared for

    # -- what it holds -----------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.k_words.shape[0]

    @property
    def heads(self) -> int:
        return self.k_words.shape[1]

    @property
    def device(self) -> torch.device:
        return self.k_words.device

    @property
    def max_seqs(self) -> int:
        return self.block_table.shape[0]

    @property
    def sinks(self) -> int:
        """The first tokens of each sequence attended in full precision."""
        return 0 if self.k_sink is None else self.k_sink.shape[2]

    @property
    def window(self) -> int:
        """Tokens before the partial group attended in full precision."""
        return self.k_residual.shape[2] - self.group_size

    @property
    def sequences(self) -> list[int]:
        """Ids of the live sequences, in row order (the order of q, k and v in a step)."""
        return list(self._ids)

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    def lengths(self) -> list[int]:
        """Tokens of each live sequence, as the host's calls grew them (row order)."""
        return list(self._lens)

    def nbytes(self) -> int:
        """Device bytes of every tensor the cache holds: the pool, the fp tokens (rings and sinks),
        the block table, the lengths and the append's word tables (the cache's whole device
        memory; a decode plan's partial-output buffers are apart)."""
        return sum(t.numel() * t.element_size() for t in (
            self.k_words, self.v_words, self.k_scale, self.k_zero, self.v_scale, self.v_zero,
            self.k_residual, self.v_residual, *(() if self.k_sink is None else (self.k_sink, self.v_sink)),
            self.block_table, self.seq_lens, self.errors, self.arrivals, self.ring_from, self.k_sources,
            self.v_sources))

    def bytes_per_token(self) -> float:
        """Pool bytes one token takes across the heads: codes, and its share of scales and zeros."""
        d, g, sdt = self.head_dim, self.group_size, self.k_scale.element_size()
        return self.heads * (2 * d * self.bits / 8 + 4 * (d / g) * sdt)

    def sequence_bytes(self) -> int:
        """Bytes of full-precision tokens each sequence row holds whatever its length: its ring
        (the partial group and the window) and its sinks, K and V, across the heads."""
        return 2 * self.heads * (self.sinks + self.k_residual.shape[2]) * self.head_dim * self.k_residual.element_size()

    def view(self) -> PagedQuantizedKV:
        """The live rows as the decode kernel reads them: the pool's tensors and rows 0..n-1 of
        the residual windows, block table and lengths (views, no copy)."""
        n = len(self._ids)
        if self._view is None or self._view.block_table.shape[0] != n:
            self._view = self._rows_view(slice(0, n))
            self._appender = AppendLaunch(self._view, (self.k_sources, self.v_sources), self.errors[APPENDS, :n],
                                          self.arrivals[:n], self.ring_from[:n])
        return self._view

    def _rows_view(self, rows: slice) -> PagedQuantizedKV:
        return PagedQuantizedKV(
            bits=self.bits, group_size=self.group_size, page_size=self.page_size, tile=self.tile, warps=self.warps,
            k_words=self.k_words, k_scale=self.k_scale, k_zero=self.k_zero, v_words=self.v_words,
            v_scale=self.v_scale, v_zero=self.v_zero, k_residual=self.k_residual[rows],
            v_residual=self.v_residual[rows], block_table=self.block_table[rows], seq_lens=self.seq_lens[rows],
            k_sink=None if self.k_sink is None else self.k_sink[rows],
            v_sink=None if self.v_sink is None else self.v_sink[rows],
        )

    # -- sequences ---------------------------------------------------------------------
    def add_sequence(self, k: torch.Tensor | None = None, v: torch.Tensor | None = None, *,
                     backend: str | None = None) -> int:
        """Start a sequence, with a prompt k, v [H, S, D] (or [1, H, S, D]) quantized into its
        pages, or empty. Returns its id; it takes the next row. Raises (cache unchanged) when
        every row is taken or the pool has too few free pages. The prompt's values are looked at
        on the device, not on the host: one that holds NaN or Inf is not stored (the sequence stays,
        empty) and :meth:`check_errors` says so."""
        if len(self._ids) == self.max_seqs:
            raise ValueError(f"the cache holds max_seqs={self.max_seqs} sequences already; free one first")
        if (k is None) != (v is None):
            raise ValueError("k and v must be given together (or neither, for an empty sequence)")
        if k is not None:
            if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == v.dim() == 3:
                k, v = k.unsqueeze(0), v.unsqueeze(0)
            self._check_tokens(k, v, 1, prompt=True)
        backend = resolve_backend(backend, self.device, BACKENDS)
        tokens = 0 if k is None else k.shape[2]
        need = self._pages_for(0, tokens, [])
        if need > len(self._free_pages):
            raise ValueError(self._exhausted(need))
        row = len(self._ids)
        self._ids.append(self._next_id)
        self._next_id += 1
        self._pages.append([])
        self._lens.append(0)
        self.block_table[row].fill_(-1)
        self.seq_lens[row] = 0
        self._plan, self._room = None, None
        if tokens:
            self._grow_tables([0] * row + [tokens])
            self._write(slice(row, row + 1), k, v, None, backend, adding=True)
            self._lens[row] = tokens
        return self._ids[row]

    def free(self, seq_id: int) -> None:
        """End a sequence: its pages go back to the pool and the last row moves into its row."""
        row = self._row(seq_id)
        last = len(self._ids) - 1
        self._free_pages.extend(reversed(self._pages[row]))
        self.errors[:, -1] |= self.errors[:, row]  # what its calls found is still said, without its id
        self.errors[:, row] = self.errors[:, last]
        self.errors[:, last] = 0
        if row != last:
            for t in (self.block_table, self.seq_lens, self.k_residual, self.v_residual, self.k_sink, self.v_sink):
                if t is not None:
                    t[row] = t[last]
            self._ids[row], self._pages[row], self._lens[row] = self._ids[last], self._pages[last], self._lens[last]
        self.block_table[last].fill_(-1)
        self.seq_lens[last] = 0
        del self._ids[last], self._pages[last], self._lens[last]
        self._plan, self._room = None, None

    def _row(self, seq_id) -> int:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id not in self._ids:
            raise ValueError(f"seq_id {seq_id!r} is not a live sequence of this cache (live: {self._ids})")
        return self._ids.index(seq_id)

    # -- pages -------------------------------------------------------------------------
    def _pages_for(self, held: int, new: int, pages: list[int]) -> int:
        """How many more pages a row holding ``held`` tokens in ``pages`` needs for ``new`` more
        (pages hold whole groups only: the partial group is in the row's ring)."""
        quantized = (held + new) // self.group_size * self.group_size
        total = max(-(-quantized // self.page_size), len(pages))
        if total > self.block_table.shape[1]:
            raise ValueError(f"a sequence of {held + new} tokens needs {total} pages of {self.page_size} tokens, "
                             f"more than max_pages_per_seq={self.block_table.shape[1]}")
        return total - len(pages)

    def _exhausted(self, need: int) -> str:
        return f"the pool is exhausted: {need} more pages needed, {len(self._free_pages)} free of {self.num_pages}"

    def _grow_tables(self, new: list[int]) -> None:
        """Give each row the pages new[row] more tokens reach: all of them, or none and a
        ValueError."""
        needs = [self._pages_for(held, n, pages) for held, n, pages in zip(self._lens, new, self._pages, strict=True)]
        if sum(needs) > len(self._free_pages):
            raise ValueError(self._exhausted(sum(needs)))
        self._room = None
        for row, need in enumerate(needs):
            if need:
                pages = [self._free_pages.pop() for _ in range(need)]
                first = len(self._pages[row])
                self._pages[row].extend(pages)
                self._set_entries(self.block_table[row, first:first + need], pages)

    def _on_device(self, values: list[int]) -> torch.Tensor:
        """int32 host values as a device tensor without a synchronizing copy (pinned, asynchronous)."""
        host = torch.tensor(values, dtype=torch.int32)
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def _set_entries(self, entries: torch.Tensor, pages: list[int]) -> None:
        """Block-table entries set to ``pages`` with no host synchronization: one fill for a page (the
        common case, a value carried by the launch), an asynchronous copy for more."""
        if len(pages) == 1:
            entries.fill_(pages[0])
        else:
            entries.copy_(self._on_device(pages))

    def reserve(self, tokens: int) -> None:
        """Give every live sequence the pages ``tokens`` more tokens reach and plan the decode for
        the lengths they reach: what replays of a captured step need, since the host sees none
        of them. Raises (nothing taken) when the pool has too few free pages."""
        require_int("tokens", tokens)
        if tokens < 0:
            raise ValueError(f"tokens must be non-negative; got {tokens}")
        self._grow_tables([tokens] * len(self._ids))
        # the plan covers every token the pages now held can store (and a partial group past
        # them), so that no stored token is left out of a replayed decode
        held = max((len(pages) for pages in self._pages), default=0) * self.page_size + self.group_size
        self._planned_len = max(max(self._lens, default=0) + tokens, held)
        if self._plan is not None and self._plan.max_len < self._planned_len:
            self._plan = None  # replays will reach lengths past it

    def advance(self, tokens: int) -> None:
        """Tell the host that every live sequence grew by ``tokens`` (replays of a captured step
        that appends): no read of the device. :meth:`sync_lengths` reads them instead."""
        require_int("tokens", tokens)
        if tokens < 0:
            raise ValueError(f"tokens must be non-negative; got {tokens}")
        self._lens = [n + tokens for n in self._lens]
        self._room = None

    def sync_lengths(self) -> list[int]:
        """Read the lengths back from the device (one synchronization) and return them."""
        self._lens = self.seq_lens[:len(self._ids)].tolist()
        self._room = None
        return list(self._lens)

    def check_errors(self) -> None:
        """Raise ValueError for what add_sequence and append found on the device since the last
        check, naming the call and the sequences (reads the device: one synchronization), and clear
        it. A sequence whose tokens a call did not store (a chunk without its page, or K/V holding
        NaN or Inf) kept the length it had before that call (0 for a prompt): the host's lengths
        are read back from the device then (:meth:`sync_lengths`)."""
        found = self.errors.tolist()
        if not any(any(words) for words in found):
            return
        self.errors.zero_()
        what = []
        for call, name in CALLS.items():
            for bit, why in _ERRORS.items():
                ids = [sid for row, sid in enumerate(self._ids) if found[call][row] & bit]
                freed = found[call][-1] & bit
                if ids or freed:
                    who = [f"sequence {ids[0]}" if len(ids) == 1 else f"sequences {ids}"] if ids else []
                    who += ["a sequence freed since"] if freed else []
                    what.append(f"{name}: {' and '.join(who)}: {why}")
        if any(words[row] & (ERROR_NO_PAGE | ERROR_NOT_FINITE) for words in found for row in range(len(self._ids))):
            self.sync_lengths()
        raise ValueError("; ".join(what))

    # -- appending ---------------------------------------------------------------------
    def append(self, k: torch.Tensor, v: torch.Tensor, *, chunk_lens=None, backend: str | None = None) -> None:
        """Append one token (k, v [n, H, D]) or a chunk (k, v [n, H, T, D]) to every live sequence,
        in row order; ``chunk_lens`` (n ints, each in [0, T]) takes only the first chunk_lens[i]
        tokens of row i (a ragged batch). Pages come from the pool as groups complete. One kernel
        launch (two for a chunk) and no host synchronization on a GPU; under CUDA graph capture
        the pages must have been reserved (:meth:`reserve`). Raises (cache unchanged) on bad
        shapes, dtypes or devices and when the pool runs out. Values are looked at on the device,
        not on the host: a sequence whose tokens hold NaN or Inf takes none of them (its length
        stays) and :meth:`check_errors` says so."""
        n = len(self._ids)
        kernel = self._on_gpu if backend is None else backend == "triton" and (self._on_gpu or triton_interpreted())
        if (chunk_lens is None and kernel and self._plain_tokens(k, v, n)
                and not (self._on_gpu and torch.cuda.is_current_stream_capturing())):
            t = 1 if k.dim() == 3 else k.shape[2]
            room = self._min_room() if self._room is None else self._room
            if room >= t:  # a decode step: every row's pages hold what it takes, nothing to find on the host
                self._room = room - t
                self.view()  # (re)made when the rows changed
                self._appender(k, v, None)
                self._lens = [held + t for held in self._lens]
                return
        if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == v.dim() == 3:
            k, v = k.unsqueeze(2), v.unsqueeze(2)
        if not self._plain_tokens(k, v, n):
            self._check_tokens(k, v, n)
        if backend is None and self._on_gpu:
            backend = "triton"
        else:
            backend = resolve_backend(backend, self.device, BACKENDS)
        t = k.shape[2]
        counts = [t] * n if chunk_lens is None else _chunk_counts(chunk_lens, n, t)
        capturing = self._on_gpu and torch.cuda.is_current_stream_capturing()
        if capturing and chunk_lens is not None:
            raise ValueError("chunk_lens under CUDA graph capture: the counts' copy to the device would be "
                             "replayed from a host buffer that is gone; capture equal chunks (chunk_lens=None)")
        if capturing:
            missing = [self._ids[r] for r in range(n) if self._pages_for(self._lens[r], counts[r], self._pages[r])]
            if missing:
                raise ValueError(f"sequences {missing} need pages that were not reserved: call reserve() before "
                                 f"capturing a step")
        elif any(c > self._row_room(held, pages)
                 for held, c, pages in zip(self._lens, counts, self._pages, strict=True)):
            self._grow_tables(counts)
        lens = None if chunk_lens is None else self._on_device(counts)
        self._write(slice(0, n), k, v, lens, backend)
        if not capturing:
            self._lens = [a + b for a, b in zip(self._lens, counts, strict=True)]
        self._room = None

    def _write(self, rows: slice, k, v, chunk_lens, backend: str, *, adding: bool = False) -> None:
        """Append k, v into the sequences of ``rows`` (all live rows, or the one new row ``adding``)."""
        live = not adding and rows == slice(0, len(self._ids))
        view = self.view() if live else self._rows_view(rows)
        errors = self.errors[ADDS if adding else APPENDS, rows]
        if backend == "torch":
            append_torch(view, k, v, chunk_lens, errors)
        else:
            launch = self._appender if live else AppendLaunch(view, (self.k_sources, self.v_sources), errors,
                                                              self.arrivals[rows], self.ring_from[rows])
            launch(k, v, chunk_lens)

    def _row_room(self, held: int, pages: list[int]) -> int:
        """Tokens a row holding ``held`` tokens in ``pages`` can still take before a completed group
        needs a page it does not have (:meth:`_pages_for` is then nonzero)."""
        # past its pages' last token a row holds less than a group (page_size is a multiple of it)
        return len(pages) * self.page_size + self.group_size - 1 - held

    def _min_room(self) -> int:
        """The fewest tokens a live row can still take without a new page (0 with no live row)."""
        return min((self._row_room(held, pages) for held, pages in zip(self._lens, self._pages, strict=True)),
                   default=0)

    def _plain_tokens(self, k, v, batch: int) -> bool:
        """The common case, checked quickly: k, v tensors [batch, H, T, D] or [batch, H, D] of the
        cache's dtype and device, unit stride along D."""
        return (type(k) is torch.Tensor and type(v) is torch.Tensor and k.shape == v.shape and k.dim() in (3, 4)
                and k.shape[0] == batch and k.shape[1] == self.heads and k.shape[-1] == self.head_dim
                and k.dtype == v.dtype == self.dtype and k.device == v.device == self.device
                and k.stride(-1) == 1 and v.stride(-1) == 1)

    def _check_tokens(self, k, v, batch: int, *, prompt: bool = False) -> None:
        """k, v [batch, H, T, D] of the cache's dtype and device: a step's tokens for the ``batch``
        live sequences, or (``prompt``) one new sequence's prompt, given as [H, S, D] or [1, H, S, D]."""
        h, d = self.heads, self.head_dim
        for name, x in (("k", k), ("v", v)):
            require_tensor(name, x)
            require_rank(name, x, 4)
            require_dtype(name, x, (self.dtype,))
            want = (batch, h, x.shape[2], d)
            if tuple(x.shape) != want:
                if prompt:
                    raise ValueError(f"{name} must be [H={h}, S, D={d}] or [1, H={h}, S, D={d}] (the prompt of the "
                                     f"one sequence added); got {tuple(x.shape)}")
                live = f"{batch} live sequence{'' if batch == 1 else 's'}"
                raise ValueError(f"{name} must be [{batch}, H={h}, T, D={d}] (or without T for one token) for "
                                 f"this cache's {live}; got {tuple(x.shape)}")
            if x.stride(-1) != 1:
                raise ValueError(f"{name} must have unit stride along head_dim; got strides {x.stride()}")
        require_same_device(k=k, v=v, cache=self.k_words)
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")

    # -- decoding ----------------------------------------------------------------------
    def plan(self, q_heads: int, q_dtype: torch.dtype | None = None, *, sm_scale: float | None = None,
             num_splits: int | None = None) -> DecodePlan:
        """A decode plan for the live sequences (:class:`~kvbits.decode.plan.DecodePlan`), sized
        for the longest of them with headroom, or for what :meth:`reserve` reserved."""
        longest = max(max(self._lens, default=0), self._planned_len)
        planned = longest + max(self.group_size, longest // PLAN_HEADROOM)
        return DecodePlan(self.view(), q_heads, q_dtype or self.dtype, planned, sm_scale=sm_scale,
                          num_splits=num_splits)

    def attend(self, q: torch.Tensor, *, out: torch.Tensor | None = None, sm_scale: float | None = None,
               backend: str | None = None) -> torch.Tensor:
        """Fused decode of q [n, Hq, D] (fp16/bf16, row order) over every live sequence's tokens.
        The plan is kept while the batch, q's heads and dtype, and sm_scale stay and the lengths
        stay within it; a step is then two kernel launches and no host synchronization.
        backend='torch' dequantizes and attends in torch (:func:`kvbits.decode_attention`), which
        None picks on CPU (the fused kernel on a GPU)."""
        if (not self._on_gpu if backend is None else resolve_backend(backend, self.device, BACKENDS) == "torch"):
            from .api import decode_attention

            return decode_attention(q, self.view(), sm_scale=sm_scale, backend="torch", out=out)
        plan = self._plan
        if (plan is None or not plan.serves(q, sm_scale) or max(self._lens, default=0) > plan.max_len
                or plan.view is not self._view):
            require_tensor("q", q)
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise ValueError("no decode plan serves this step: call attend() once before capturing it "
                                 "(and reserve() for the replays)")
            plan = self._plan = self.plan(q.shape[1] if q.dim() == 3 else 0, q.dtype, sm_scale=sm_scale)
            return plan.run(q, out=out)
        if out is not None and (not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype
                                or out.device != q.device):
            raise ValueError(f"out must match q ({list(q.shape)}, {q.dtype}, {q.device})")
        return plan.launch(q, out)

    # -- interchange -------------------------------------------------------------------
    def to_contiguous(self) -> QuantizedKV:
        """The live sequences as a contiguous :class:`QuantizedKV` in the canonical stream (export,
        GPTQ's format), capacity the most pages any sequence holds (an explicit conversion, never
        on the decode path)."""
        width = max((len(p) for p in self._pages), default=0) or 1
        # rows padded with a page of their own (page 0 for a row with none): past a sequence's
        # length the export holds whatever that page does, as any capacity beyond a length
        rows = [p + [p[0] if p else 0] * (width - len(p)) for p in self._pages]
        table = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), width).to(self.device)
        return paged_to_contiguous(dataclasses.replace(self.view(), block_table=table))


_ERRORS = {
    ERROR_NO_PAGE: "a completed group had no page in its block-table row, so that chunk was not stored (reserve "
                   "before replaying)",
    ERROR_NOT_FINITE: "k or v held NaN or Inf (or a value whose group's scale overflows the scale dtype), so none "
                      "of that call's tokens was stored: the sequence keeps the length it had",
    ERROR_SCALE_RANGE: f"a completed group's fp32 scale exceeds fp16's range ({FP16_MAX:g}), which the fused decode "
                       f"(backend='triton') carries as fp16 operands: attend with backend='torch'",
}


def fp_tokens(group_size: int, sinks, window) -> tuple[int, int]:
    """(sinks, window) as given, each checked (a non-negative multiple of group_size), or by
    default SINKS and WINDOW rounded up to whole groups."""
    out = []
    for name, value, default in (("sinks", sinks, SINKS), ("window", window, WINDOW)):
        if value is None:
            value = -(-default // group_size) * group_size
        require_int(name, value)
        if value < 0 or value % group_size:
            raise ValueError(f"{name} must be a non-negative multiple of group_size={group_size}; got {value}")
        out.append(value)
    return out[0], out[1]


def _chunk_counts(chunk_lens, n: int, t: int) -> list[int]:
    """chunk_lens as n host ints in [0, t]."""
    if isinstance(chunk_lens, torch.Tensor) or not isinstance(chunk_lens, (list, tuple)):
        raise TypeError(f"chunk_lens must be a list or tuple of ints (the host's counts, so that nothing waits "
                        f"on the device); got {type(chunk_lens).__name__}")
    if len(chunk_lens) != n:
        raise ValueError(f"chunk_lens must have one count per live sequence ({n}); got {len(chunk_lens)}")
    for i, c in enumerate(chunk_lens):
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= t:
            raise ValueError(f"chunk_lens[{i}] must be an int in [0, {t}] (T of k and v); got {c!r}")
    return list(chunk_lens)
