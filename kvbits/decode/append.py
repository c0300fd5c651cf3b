"""Append tokens into a paged, decode-arranged cache on the device (no host sync; one launch for
one token per sequence, two for a chunk).

:class:`AppendLaunch` (and :func:`launch_append` for one call) writes T new tokens per sequence
(k, v ``[B, H, T, D]``) into a :class:`~kvbits.decode.paged.PagedQuantizedKV` whose
block table already names the pages those tokens reach. Where a sequence's partial group (in its
fp ring) and its new tokens complete groups of G tokens, each group is quantized (the affine scheme of
:mod:`kvbits.affine`, bit for bit: K per channel, V per token) and written straight into the
page in the tile arrangement the fused decode reads (:mod:`kvbits.decode.layout`); the last tokens
go to the ring (the partial group and the window before it) and the first ones to the sinks, in
fp (:mod:`kvbits.decode.paged`). ``seq_lens`` grows by each sequence's count. The
positions come from ``seq_lens`` on the device, so the host never waits, and one step (append,
then attend) can be captured in a CUDA graph and replayed as the lengths grow.

Triton path (:class:`AppendLaunch`), grid ``(B, H, groups * 2 * shares)`` with ``groups = (G -
1 + T) // G`` (at least 1): program (b, h, (j * 2 + role) * shares + share) quantizes K (role 0)
or V (role 1) of group j of sequence b's chunk when the chunk completes it (group 0 holds the
partial group's tokens first): the group's scales, zeros and codes in registers, the scales
and zeros stored into the page (share 0), then share ``share`` of the words of its tiles, each
bit of a word gathered from the code of the element that the arrangement puts there (a table of
``element * 8 + bit`` per word bit, :func:`word_sources`). A one-token append completes at most
one group per sequence, and its words are shared by ``shares`` programs per role
(WORD_SHARES), so that the step that completes a group costs little more than the others;
chunks take one program per group and role. The group-0 programs then write the chunk's last
tokens into the ring and its first into the sinks, and the last program of sequence b to finish adds
its count to ``seq_lens[b]``. The kernels take their arguments in named groups (the chunk, the
pool, the fp rows, the word tables, the per-sequence state), laid out in _append_kernel's
docstring.

**Values it cannot store.** Every value of a chunk is looked at on the device: a completed
group's through its scale (NaN or Inf in the group, or a finite value whose scale overflows the
scale dtype, make it NaN or beyond the dtype's largest), the rest where the group-0 program
copies the chunk's last RING tokens, which hold them (NaN and +-Inf alike). A step's token (one
per sequence, STEP) is tested in the one row that program loads, each thread its own elements:
a finite step runs no reduction and no atomic more than before. A sequence of whose chunk one
program found such a value keeps its length, ERROR_NOT_FINITE is or-ed into its error word, and
nothing the decode reads at that length changes: the pages, sinks and ring rows written lie past
it, except for ring rows of a chunk that reaches far past the sequence's last whole group
(_ring_waits): those are held back, the last program of a sequence that stored its chunk leaves
its former length in ``ring_from`` (else -1), and a second launch, :func:`_ring_kernel` (chunks of
more than one token only), writes them. A chunk one of whose completed groups finds no page is not
written at all (ERROR_NO_PAGE).

The torch path does the same on the host (any device): it reads the lengths, so it synchronizes.

Contract. Per completed group: codes, scales and zeros of :mod:`kvbits.affine` (``_quantize_torch``
bit for bit), the codes in the page's words as :func:`kvbits.decode.layout.pack_tile` lays them.
Shapes and dtypes: k, v fp16/bf16 ``[B, H, T, D]`` (or one token ``[B, H, D]``), the cache's
dtype; chunk lengths int32 ``[B]`` or None; the pool as :class:`~kvbits.decode.paged.PagedQuantizedKV`
holds it (words int32 ``[NP, H, P/TILE, W]``, K scales and zeros ``[NP, H, P/G, D]``, V's
``[NP, H, P, D/G]``, fp16/fp32); errors int32 ``[B]``, each sequence's ERROR_* bits or-ed in.
Tested against :func:`append_torch` (the same pool, tensor for tensor) and one-shot
``quantize_kv`` of each sequence's tokens, in ``suites/test_page_cache.py``; speed in
``suites/test_bench_decode_step.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.graph import increment_version

from .._runtime import on_device, triton_interpreted
from ..affine import SCALE_FLOOR, _affine_params_tl, _codes, _flagged, _group_range, _quantize_torch
from ..aot import AotSpec
from .checks import FP16_MAX
from .direct_launch import Launch, specialization
from .launch import fp_rows_group, fp_rows_signature, pool_group, pool_signature
from .layout import _pack_plan, pack_tile, tile_shape
from .paged import PagedQuantizedKV

# a sequence's error word (int32, one per sequence) or-s these in
ERROR_NO_PAGE = 1  # a completed group's block-table entry is not a page of the pool (chunk not placed)
ERROR_NOT_FINITE = 2  # the chunk held NaN or +-Inf, or a completed group's scale overflowed its dtype (not stored)
ERROR_SCALE_RANGE = 4  # a completed group's finite fp32 scale exceeds fp16's range (checks.FP16_MAX)
REFUSED = tl.constexpr(1 << 30)  # or-ed into a sequence's arrivals count: a program found ERROR_NOT_FINITE
FP16_LARGEST = tl.constexpr(FP16_MAX)  # the kernel's copy of checks.FP16_MAX
FP32_LARGEST = tl.constexpr(torch.finfo(torch.float32).max)  # |x| <= it: x is finite (NaN compares false)
PAGE_BLOCK = tl.constexpr(16)  # block-table entries a program checks at a time (_pages_missing)
MAX_WORDS_PER_STEP = 128  # words packed per step of the word loop, at most (the gathers' registers)
APPEND_WARPS = 4


def word_sources(bits: int, role: str, d: int, tile: int, warps: int, device) -> torch.Tensor:
    """int32 [W * 32] on ``device``: for bit j of word w of a ``role`` tile, ``(t * D + c) * 8 +
    bit``, the token t and channel c of the code it comes from and which bit of that code (the
    inverse of :func:`kvbits.decode.layout.unpack_tile`, token-major for K and V alike)."""
    src, bit = _pack_plan(bits, role, d, tile, warps, torch.device("cpu"))
    n, k = tile_shape(role, d, tile)
    token, channel = (src // k, src % k) if role == "k" else (src % k, src // k)
    return ((token * d + channel) * 8 + bit).to(torch.int32).reshape(-1).to(device)


# ----------------------------------------------------------------------------- Triton kernel
@triton.jit
def _role_rows(rows, K: tl.constexpr):
    """K's (K) or V's part of a pair of fp row tensors ``(k_ptr, v_ptr, stride_b, stride_h,
    stride_t)`` (tokens, ring, sinks): ``(ptr, stride_b, stride_h, stride_t)``, the rows of one
    role that the helpers below take."""
    k_ptr, v_ptr, stride_b, stride_h, stride_t = rows
    return (k_ptr if K else v_ptr), stride_b, stride_h, stride_t


@triton.jit
def _chunk_count(counts, b, RAGGED: tl.constexpr):
    """Sequence b's tokens in the chunk: counts ``(chunk_ptr, chunk)``, chunk_ptr[b] (RAGGED) or chunk."""
    chunk_ptr, chunk = counts
    if RAGGED:
        return tl.load(chunk_ptr + b)
    else:
        return chunk


@triton.jit
def _group_values(chunk, ring, b, h, start, held, t, c, RING: tl.constexpr):
    """Values (fp32) of tokens t (offsets in the group) and channels c of the group that starts at
    token ``start`` of sequence b, which held ``held`` tokens before this chunk: the ring's (row
    position % RING) below ``held``, the chunk's from there on (t and c broadcast; chunk and ring
    one role's rows, _role_rows)."""
    x_ptr, stride_xb, stride_xh, stride_xt = chunk
    r_ptr, stride_rb, stride_rh, stride_rt = ring
    pos = start + t
    old = pos < held
    res = tl.load(r_ptr + b * stride_rb + h * stride_rh + (pos % RING) * stride_rt + c, mask=old, other=0.0)
    new = tl.load(x_ptr + b * stride_xb + h * stride_xh + (pos - held).to(tl.int64) * stride_xt + c, mask=~old,
                  other=0.0)
    return tl.where(old, res.to(tl.float32), new.to(tl.float32))


@triton.jit
def _tile_words(words_ptr, table_ptr, flat, tile_base, first, NW: tl.constexpr, D: tl.constexpr,
                WORDS: tl.constexpr):
    """Write words [first, first + NW) of one tile from the codes of its group, flat uint32
    [G * D] token-major: bit j of word w is bit (entry & 7) of code tile_base * D + (entry >> 3),
    entry = table[w * 32 + j] (word_sources); the codes are gathered in registers."""
    j = tl.arange(0, 32)
    for w0 in range(0, NW, WORDS):
        w = first + w0 + tl.arange(0, WORDS)
        entry = tl.load(table_ptr + w[:, None] * 32 + j[None, :])  # [WORDS, 32]
        index = tl.reshape((entry >> 3) + tile_base * D, [WORDS * 32])
        code = tl.reshape(tl.gather(flat, index, 0), [WORDS, 32])
        picked = ((code >> (entry & 7).to(tl.uint32)) & 1) << j[None, :].to(tl.uint32)
        tl.store(words_ptr + w, tl.sum(picked, 1).to(tl.int32, bitcast=True))


@triton.jit
def _pages_missing(pages, num_pages, b, held, n_new, G: tl.constexpr):
    """How many block-table entries of sequence b that the groups its chunk completes reach are
    not pages of the pool (0: the chunk can be placed), read PAGE_BLOCK entries at a time."""
    bt_ptr, stride_bt_b, table_cols, page_size = pages
    first = held // G * G  # the first group the chunk may complete
    end = (held + n_new) // G * G  # past the last group it completes
    entry0 = first // page_size
    count = tl.where(end > first, (end - 1) // page_size + 1 - entry0, 0)
    missing = count * 0
    i = count * 0
    while i < count:  # a run-time bound: a prompt's chunk reaches many pages, a step's one
        k = i + tl.arange(0, PAGE_BLOCK)
        reached = k < count
        idx = entry0 + k
        page = tl.load(bt_ptr + b * stride_bt_b + idx, mask=reached & (idx < table_cols), other=-1)
        missing += tl.sum((reached & ((page < 0) | (page >= num_pages))).to(tl.int32), 0)
        i += PAGE_BLOCK
    return missing


@triton.jit
def _count_beyond_fp16(s, SCALE_MAX: tl.constexpr, PER_CHANNEL: tl.constexpr):
    """How many of a group's finite fp32 scales (K [D], V [G, D/G]) exceed fp16's largest value
    (checks.FP16_MAX)."""
    beyond = ((s > FP16_LARGEST) & (s <= SCALE_MAX)).to(tl.int32)
    if PER_CHANNEL:
        return tl.sum(beyond, 0)
    else:
        return tl.sum(tl.sum(beyond, 1), 0)


@triton.jit
def _copy_rows(chunk, out, b, h, held, end, first, rows, period, store, D: tl.constexpr):
    """Copy (where ``store``) the chunk's tokens among positions first + [0, rows) (those in [held,
    end)) to the fp rows ``out`` of sequence b, kv head h: position p at row p % period (chunk and
    out one role's rows, _role_rows). Returns where their values are not finite, bool [rows, D]."""
    x_ptr, stride_xb, stride_xh, stride_xt = chunk
    out_ptr, stride_ob, stride_oh, stride_ot = out
    pos = first + tl.arange(0, rows)
    keep = ((pos >= held) & (pos < end))[:, None]
    c = tl.arange(0, D)[None, :]
    src = b * stride_xb + h * stride_xh + (pos - held).to(tl.int64)[:, None] * stride_xt + c
    row = tl.where(pos >= 0, pos, 0) % period
    x = tl.load(x_ptr + src, mask=keep)
    # where(store, keep, False), not keep & store: the interpreter refuses a mask of a tensor and a scalar
    tl.store(out_ptr + b * stride_ob + h * stride_oh + row[:, None] * stride_ot + c, x,
             mask=tl.where(store, keep, False))
    return keep & _not_finite(x)


@triton.jit
def _not_finite(x):
    """Where x is NaN or +-Inf (NaN compares false)."""
    return ~(tl.abs(x.to(tl.float32)) <= FP32_LARGEST)


@triton.jit
def _refuse(verdict, bad):
    """Refuse this program's sequence where ``bad`` (bool, a scalar or a tensor; no atomic runs
    where it is all False): ERROR_NOT_FINITE into its error word and REFUSED into its arrivals
    count, which its last program reads (verdict ``(err_ptr, arrivals_ptr)``, the sequence's). A
    tensor's atomics come from several threads: a barrier orders them before the program's
    arrival."""
    err_ptr, arrivals_ptr = verdict
    at = bad.to(tl.int32) * 0
    tl.atomic_or(err_ptr + at, 2, mask=bad, sem="relaxed")  # ERROR_NOT_FINITE
    tl.atomic_or(arrivals_ptr + at, REFUSED, mask=bad, sem="relaxed")


@triton.jit
def _copy_token(chunk, ring, sinks, verdict, b, h, held, SINKS: tl.constexpr, RING: tl.constexpr, D: tl.constexpr):
    """A step's token (one per sequence, at position ``held``) of sequence b, kv head h into its
    ring row and, below SINKS, its sink row, and the sequence refused where it is not finite: the
    one row loaded is the one tested, each thread its own elements (no reduction), and neither row
    is attended at length ``held`` (chunk, ring, sinks one role's rows, _role_rows)."""
    x_ptr, stride_xb, stride_xh, _ = chunk  # one token: no stride along T
    r_ptr, stride_rb, stride_rh, stride_rt = ring
    sink_ptr, stride_sink_b, stride_sink_h, stride_sink_t = sinks
    c = tl.arange(0, D)
    x = tl.load(x_ptr + b * stride_xb + h * stride_xh + c)
    tl.store(r_ptr + b * stride_rb + h * stride_rh + (held % RING) * stride_rt + c, x)
    if SINKS > 0:
        tl.store(sink_ptr + b * stride_sink_b + h * stride_sink_h + held * stride_sink_t + c, x,
                 mask=held + c * 0 < SINKS)
    _refuse(verdict, _not_finite(x))
    tl.debug_barrier()  # every thread's refusal before the program's arrival


@triton.jit
def _copy_ring(chunk, ring, b, h, held, end, store, G: tl.constexpr, RING: tl.constexpr, D: tl.constexpr):
    """Copy (where ``store``) the last RING of the chunk's tokens (positions [held, end)) into the ring
    of sequence b, kv head h (row position % RING; chunk and ring one role's rows, _role_rows);
    returns how many of their values are not finite."""
    first = tl.maximum(held, end - RING)  # the chunk's first token the ring keeps
    not_finite = tl.zeros([G, D], tl.int1)
    for i in tl.static_range(RING // G):
        if first + i * G < end:  # blocks past the chunk hold none of its tokens (a one-token chunk's: one block)
            not_finite |= _copy_rows(chunk, ring, b, h, held, end, first + i * G, G, RING, store, D)
    return tl.sum(tl.sum(not_finite.to(tl.int32), 1), 0)


@triton.jit
def _ring_waits(held, end, G: tl.constexpr):
    """Whether a chunk of positions [held, end) may write ring rows that the decode attends at
    length ``held`` (it reaches past the group after the sequence's last whole group, which a
    prompt's chunk, held = 0, and a step's never do): its ring rows then wait for every program's
    verdict (_ring_kernel writes them)."""
    return (held > 0) & (end > held // G * G + G)


@triton.jit
def _append_role(tokens, fp_rows, pool, tables, verdict, b, h, j, share, held, n_new,
                 D: tl.constexpr, G: tl.constexpr, BITS: tl.constexpr, TILE: tl.constexpr, SINKS: tl.constexpr,
                 RING: tl.constexpr, SHARES: tl.constexpr, WORDS: tl.constexpr, STEP: tl.constexpr,
                 PER_CHANNEL: tl.constexpr, SCALE_FP16: tl.constexpr, FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """K (PER_CHANNEL: its scales per channel) or V of one program of a chunk whose completed
    groups all have their pages: quantize the chunk's group j when the chunk completes it (share 0
    stores its scales and zeros), write share ``share`` of its tiles' words, and (group 0, share 0)
    the chunk's last RING tokens into the ring (row position % RING; unless _ring_waits) and its
    tokens below SINKS into the sinks (STEP: the one token, _copy_token). Refuses the sequence
    (_refuse, verdict the sequence's) where its group's scales are flagged (share 0) or the ring's
    tokens are not finite (group 0). The groups as _append_kernel's, of which it takes its role's."""
    ring, sinks = fp_rows
    k_words, k_scales, v_words, v_scales, pages = pool
    bt_ptr, stride_bt_b, table_cols, page_size = pages
    k_table_ptr, v_table_ptr = tables
    err_ptr, arrivals_ptr = verdict
    chunk = _role_rows(tokens, PER_CHANNEL)
    ring_rows = _role_rows(ring, PER_CHANNEL)
    sink_rows = _role_rows(sinks, PER_CHANNEL)
    w_ptr, stride_w_p, stride_w_h, stride_w_t = k_words if PER_CHANNEL else v_words
    s_ptr, z_ptr, stride_s_p, stride_s_h, stride_s_r = k_scales if PER_CHANNEL else v_scales
    table_ptr = k_table_ptr if PER_CHANNEL else v_table_ptr
    start = held // G * G + j * G  # first token of the group
    NW: tl.constexpr = TILE * D * BITS // 32 // SHARES  # words of a tile this program writes
    off = start % page_size
    if start + G <= held + n_new:  # the chunk completes this group
        page = tl.load(bt_ptr + b * stride_bt_b + start // page_size).to(tl.int64)
        x = _group_values(chunk, ring_rows, b, h, start, held, tl.arange(0, G)[:, None], tl.arange(0, D)[None, :],
                          RING)
        if PER_CHANNEL:  # one scale per channel over the group's tokens
            lo, hi = _group_range(x, 0, INTERPRET)
            s, z, inv = _affine_params_tl(lo, hi, BITS, SCALE_FP16, FLOOR, INTERPRET)
            codes = tl.reshape(_codes(x, inv[None, :], z[None, :], BITS, INTERPRET), [G * D])
            at = page * stride_s_p + h * stride_s_h + (off // G) * stride_s_r + tl.arange(0, D)
            bad = tl.sum(_flagged(s, SCALE_MAX), 0)
        else:  # one scale per token and group of G channels
            xg = tl.reshape(x, [G, D // G, G])
            lo, hi = _group_range(xg, 2, INTERPRET)
            s, z, inv = _affine_params_tl(lo, hi, BITS, SCALE_FP16, FLOOR, INTERPRET)
            codes = tl.reshape(_codes(xg, inv[:, :, None], z[:, :, None], BITS, INTERPRET), [G * D])
            at = (page * stride_s_p + h * stride_s_h + (off + tl.arange(0, G)[:, None]) * stride_s_r
                  + tl.arange(0, D // G)[None, :])
            bad = tl.sum(tl.sum(_flagged(s, SCALE_MAX), 1), 0)
        if share == 0:
            tl.store(s_ptr + at, s.to(s_ptr.dtype.element_ty))
            tl.store(z_ptr + at, z.to(z_ptr.dtype.element_ty))
            if bad > 0:  # the scalar's atomics come from one thread, as the arrival's
                _refuse(verdict, bad > 0)
            if not SCALE_FP16:  # fp32 scales: the fused decode takes them as fp16 operands
                wide = _count_beyond_fp16(s, SCALE_MAX, PER_CHANNEL)
                if wide > 0:
                    tl.atomic_or(err_ptr, 4)  # ERROR_SCALE_RANGE
        for i in tl.static_range(G // TILE):
            tile_idx = (off + i * TILE) // TILE
            _tile_words(w_ptr + page * stride_w_p + h * stride_w_h + tile_idx * stride_w_t, table_ptr,
                        codes, i * TILE, share * NW, NW, D, WORDS)
    if (j == 0) & (share == 0):  # the chunk's last RING tokens into the ring, its first into the sinks
        # after this program's reads of the ring (the only reader of this role's whose rows a write
        # may reach: a one-token chunk writes the row of its token, which no group reads)
        tl.debug_barrier()
        if STEP:
            _copy_token(chunk, ring_rows, sink_rows, verdict, b, h, held, SINKS, RING, D)
        else:
            end = held + n_new
            found = _copy_ring(chunk, ring_rows, b, h, held, end, ~_ring_waits(held, end, G), G, RING, D)
            if found > 0:
                _refuse(verdict, found > 0)
            if held < SINKS:  # rows past the length at which a refused chunk leaves the sequence: never attended
                for i in tl.static_range(SINKS // G):
                    _copy_rows(chunk, sink_rows, b, h, held, end, i * G, G, SINKS, True, D)


@triton.jit
def _append_kernel(
    tokens, counts, pool, num_pages, fp_rows, tables, sequences,
    # the cache's layout
    D: tl.constexpr, G: tl.constexpr, BITS: tl.constexpr, TILE: tl.constexpr, SINKS: tl.constexpr,
    RING: tl.constexpr,
    # the chunk and the programs
    RAGGED: tl.constexpr, SHARES: tl.constexpr, WORDS: tl.constexpr, STEP: tl.constexpr,
    # the scales
    SCALE_FP16: tl.constexpr, FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Append chunk tokens of one (sequence b, kv head h): program (j * 2 + role) * SHARES + share
    quantizes K (role 0) or V (role 1) of the chunk's group j and writes share ``share`` of its
    words (SHARES > 1 only for one-token chunks: more programs for the one group a step may
    complete). STEP: one token per sequence (chunk == 1, not RAGGED), whose ring rows never wait.

    Arguments come in groups, each a tuple (nested where a group has parts), unpacked by name by
    the functions that read them; pool and fp_rows are the split kernel's
    (kvbits.decode.launch.pool_group, fp_rows_group):

    - tokens ``(k_ptr, v_ptr, stride_xb, stride_xh, stride_xt)``: the chunk's k, v [B, H, T, D]
      (D contiguous, one set of strides for both) in the cache's dtype.
    - counts ``(chunk_ptr, chunk)``: the chunk's tokens per sequence, chunk_ptr int32 [B] (RAGGED)
      or ``chunk`` for all.
    - pool ``(k_words, k_scales, v_words, v_scales, pages)``: k_words, v_words ``(kw_ptr,
      stride_kw_p, stride_kw_h, stride_kw_t)``, int32 [NP, H, P/TILE, W]; k_scales ``(ks_ptr,
      kz_ptr, stride_ks_p, stride_ks_h, stride_ks_g)``, K scales and zeros [NP, H, P/G, D];
      v_scales ``(vs_ptr, vz_ptr, stride_vs_p, stride_vs_h, stride_vs_t)``, V scales and zeros
      [NP, H, P, D/G]; pages ``(bt_ptr, stride_bt_b, table_cols, page_size)``, the block table
      int32 [B, table_cols] and P. num_pages: NP (an entry outside [0, NP) names no page).
    - fp_rows ``(ring, sinks)``: ring ``(kr_ptr, vr_ptr, stride_r_b, stride_r_h, stride_r_t)``,
      k/v_residual [B, H, RING, D] (the fp ring, RING a multiple of G); sinks ``(ksink_ptr,
      vsink_ptr, stride_sink_b, stride_sink_h, stride_sink_t)``, k/v_sink [B, H, SINKS, D] (any
      pointers when SINKS = 0).
    - tables ``(k_table_ptr, v_table_ptr)``: int32 [W * 32] each (word_sources).
    - sequences ``(lens_ptr, err_ptr, arrivals_ptr, ring_from_ptr)``, int32 [B] each: the lengths
      (grown by the program of sequence b that finishes last, as arrivals, zero between launches,
      counts them); the error words (each sequence's ERROR_* bits or-ed in); ring_from (below).

    A sequence a group of whose chunk finds no page is left as it was (pool, window, length):
    every program of it sees the same entries. A sequence whose chunk holds a value it cannot
    store keeps its length (module docstring): its programs or REFUSED into its arrivals count,
    which the last one reads; it leaves in ring_from the length before a stored chunk whose ring
    rows wait (_ring_waits, written by _ring_kernel), else -1.
    """
    lens_ptr, err_ptr, arrivals_ptr, ring_from_ptr = sequences
    k_words, k_scales, v_words, v_scales, pages = pool
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    j = tl.program_id(2) // (2 * SHARES)
    role = tl.program_id(2) // SHARES % 2
    share = tl.program_id(2) % SHARES
    held = tl.load(lens_ptr + b)
    n_new = _chunk_count(counts, b, RAGGED)
    placed = _pages_missing(pages, num_pages, b, held, n_new, G) == 0
    if placed:
        verdict = (err_ptr + b, arrivals_ptr + b)  # where a refusal of sequence b goes (_refuse)
        if role == 0:
            _append_role(tokens, fp_rows, pool, tables, verdict, b, h, j, share, held, n_new, D, G, BITS, TILE,
                         SINKS, RING, SHARES, WORDS, STEP, True, SCALE_FP16, FLOOR, SCALE_MAX, INTERPRET)
        else:
            _append_role(tokens, fp_rows, pool, tables, verdict, b, h, j, share, held, n_new, D, G, BITS, TILE,
                         SINKS, RING, SHARES, WORDS, STEP, False, SCALE_FP16, FLOOR, SCALE_MAX, INTERPRET)
    elif (h == 0) & (tl.program_id(2) == 0):
        tl.atomic_or(err_ptr + b, 1)  # ERROR_NO_PAGE
    # the sequence's last program to finish grows its length: every program of it has read the
    # length (and the ring) before its arrival (release), and the last one sees them all
    # (acquire); a chunk that could not be placed, or that a program refused, leaves it, so that
    # it never claims tokens that were not stored
    arrived = tl.atomic_add(arrivals_ptr + b, 1, sem="acq_rel")
    if arrived % REFUSED == tl.num_programs(1) * tl.num_programs(2) - 1:
        stored = placed & (arrived < REFUSED)
        end = held + n_new
        if stored:
            tl.store(lens_ptr + b, end)
        if not STEP:  # a step's ring rows never wait
            tl.store(ring_from_ptr + b, tl.where(stored & _ring_waits(held, end, G), held, -1))
        tl.store(arrivals_ptr + b, 0)


@triton.jit
def _ring_kernel(tokens, counts, ring, ring_from_ptr,
                 D: tl.constexpr, G: tl.constexpr, RING: tl.constexpr, RAGGED: tl.constexpr):
    """The ring rows _append_kernel held back (_ring_waits) of the sequences that stored their chunk:
    program (b, h, role) copies the chunk's last RING tokens of kv head h, K (role 0) or V, into the
    ring. tokens, counts and ring (fp_rows' ring) as _append_kernel's; ring_from int32 [B]: the
    length before the chunk, or -1 (nothing to write)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    held = tl.load(ring_from_ptr + b)
    if held >= 0:
        end = held + _chunk_count(counts, b, RAGGED)
        if tl.program_id(2) == 0:
            _copy_ring(_role_rows(tokens, True), _role_rows(ring, True), b, h, held, end, True, G, RING, D)
        else:
            _copy_ring(_role_rows(tokens, False), _role_rows(ring, False), b, h, held, end, True, G, RING, D)


# ----------------------------------------------------------------------------- launch
WORD_SHARES = 6  # programs per (sequence, kv head, K or V) sharing the words of a one-token append's group


def word_split(words: int, tokens: int) -> tuple[int, int]:
    """(programs sharing the ``words`` words of a K or V tile, words per step of each one's loop)
    for chunks of ``tokens`` tokens: for one token, the most programs up to WORD_SHARES whose
    share is a whole number of steps of a power of two words (32 at least); for chunks one."""
    def step(share: int) -> int:
        return max(w for w in (32, 64, 128) if w <= MAX_WORDS_PER_STEP and share % w == 0)

    if tokens != 1:
        return 1, step(words)
    shares = max(s for s in range(1, WORD_SHARES + 1) if words % (32 * s) == 0)
    return shares, step(words // shares)


class AppendLaunch:
    """Appends into ``view`` (its tensors fixed; the lengths, residual windows and block table read
    at each launch), with the word tables ``sources`` (k, v: word_sources) and the error words
    ``errors`` int32 [B] (one per sequence of the view): the arguments laid out once, each call a
    launch of _append_kernel (and for a chunk of more than one token one of _ring_kernel), with
    ``arrivals`` int32 [B] (zeros) for the kernel's count of finished programs and ``ring_from``
    int32 [B] for what it hands _ring_kernel. No host synchronization."""

    def __init__(self, view: PagedQuantizedKV, sources: tuple[torch.Tensor, torch.Tensor], errors: torch.Tensor,
                 arrivals: torch.Tensor, ring_from: torch.Tensor):
        self.view, self.sources, self.errors = view, sources, errors
        sdt = view.k_scale.dtype
        fp_rows = fp_rows_group(view)
        ring, _ = fp_rows
        self._fixed = dict(pool=pool_group(view), num_pages=view.num_pages, fp_rows=fp_rows, tables=tuple(sources),
                           sequences=(view.seq_lens, errors, arrivals, ring_from))
        self._ring_fixed = dict(ring=ring, ring_from_ptr=ring_from)
        self._ring_options = dict(D=view.head_dim, G=view.group_size, RING=view.ring, num_warps=APPEND_WARPS)
        self._options = dict(D=view.head_dim, G=view.group_size, BITS=view.bits, TILE=view.tile, SINKS=view.sinks,
                             RING=view.ring,
                             SCALE_FP16=sdt == torch.float16, FLOOR=SCALE_FLOOR[sdt], SCALE_MAX=torch.finfo(sdt).max,
                             INTERPRET=triton_interpreted(), num_warps=APPEND_WARPS)
        self._launches: dict[tuple, Launch] = {}

    def __call__(self, k: torch.Tensor, v: torch.Tensor, chunk_lens: torch.Tensor | None) -> None:
        """Append k, v [B, H, T, D], or one token [B, H, D] (unit stride along D; the caller checks
        shapes and dtypes), chunk_lens int32 [B] on the device or None (T for every sequence)."""
        if v.stride() != k.stride():  # the kernel addresses k and v with one set of strides
            k, v = k.contiguous(), v.contiguous()
        if k.dim() == 3:  # one token: its stride along T is never used
            (b, h, _), t = k.shape, 1
            strides = (*k.stride()[:2], 0)
        else:
            b, h, t, _ = k.shape
            strides = k.stride()[:3]
        if b == 0 or t == 0:
            return
        tokens = (k, v, *strides)
        ragged = chunk_lens is not None
        key = (t, ragged)
        launch = self._launches.get(key)
        if launch is None:
            g = self.view.group_size
            shares, step = word_split(self.view.tile * self.view.head_dim * self.view.bits // 32, t)
            groups = max(1, (g - 1 + t) // g)
            launch = self._launches[key] = Launch(
                _append_kernel, (b, h, groups * 2 * shares), self._fixed,
                dict(self._options, RAGGED=ragged, SHARES=shares, WORDS=step, STEP=t == 1 and not ragged))
        view = self.view
        counts = (chunk_lens if ragged else view.seq_lens, t)  # the lengths stand in for an unread chunk_ptr
        specialized = (specialization(k), specialization(v), t)  # what the per-call arguments specialize on
        with on_device(k.device):
            launch(specialized, tokens, counts)
            if t > 1:  # a chunk: the ring rows _append_kernel may have held back
                self._ring_launch(key, b, h)(specialized, tokens, counts)
        # the kernel wrote these in place: bump their version counters as a torch write would
        increment_version([x for x in (view.seq_lens, view.k_scale, view.v_scale) if not x.is_inference()])

    def _ring_launch(self, key: tuple, b: int, h: int) -> Launch:
        """The _ring_kernel launch of chunks launched with ``key``."""
        ring = self._launches.get((key, "ring"))
        if ring is None:
            ring = self._launches[key, "ring"] = Launch(_ring_kernel, (b, h, 2), self._ring_fixed,
                                                        dict(self._ring_options, RAGGED=key[1]))
        return ring


def launch_append(view: PagedQuantizedKV, k: torch.Tensor, v: torch.Tensor, chunk_lens: torch.Tensor | None,
                  errors: torch.Tensor) -> None:
    """One append through a fresh :class:`AppendLaunch` (tables made for this call; a cache keeps
    its own launch and tables instead); ``errors`` int32 [B], each sequence's ERROR_* bits."""
    tables = tuple(word_sources(view.bits, role, view.head_dim, view.tile, view.warps, k.device) for role in "kv")
    arrivals = torch.zeros(view.seq_lens.shape[0], dtype=torch.int32, device=k.device)
    AppendLaunch(view, tables, errors, arrivals, torch.full_like(arrivals, -1))(k, v, chunk_lens)


# ----------------------------------------------------------------------------- torch twin
def append_torch(view: PagedQuantizedKV, k: torch.Tensor, v: torch.Tensor, chunk_lens: torch.Tensor | None,
                 errors: torch.Tensor) -> None:
    """What _append_kernel does, in torch (reads the lengths on the host; ``errors`` int32 [B], each
    sequence's ERROR_* bits): a sequence a group of whose chunk finds no page is left as it was,
    one whose chunk holds a value the cache cannot store keeps its length."""
    counts = [k.shape[2]] * k.shape[0] if chunk_lens is None else chunk_lens.tolist()
    for b, (held, n_new) in enumerate(zip(view.seq_lens.tolist(), list(counts), strict=True)):
        if not _has_its_pages(view, b, held, n_new):
            errors[b] |= ERROR_NO_PAGE
            counts[b] = 0  # the length never claims tokens that were not stored
            continue
        found = _append_sequence_torch(view, b, held, k[b, :, :n_new], v[b, :, :n_new])
        if found:
            errors[b] |= found
        if found & ERROR_NOT_FINITE:
            counts[b] = 0
    view.seq_lens += torch.tensor(counts, dtype=view.seq_lens.dtype, device=view.seq_lens.device)


def _has_its_pages(view: PagedQuantizedKV, b: int, held: int, n_new: int) -> bool:
    """Whether every group that n_new tokens complete on sequence b, which holds ``held``, lies in
    a page of the pool (_pages_missing)."""
    g, p = view.group_size, view.page_size
    first, end = held // g * g, (held + n_new) // g * g
    if end <= first:
        return True
    wanted = range(first // p, -(-end // p))
    entries = view.block_table[b, wanted.start:wanted.stop]
    return len(entries) == len(wanted) and bool(((entries >= 0) & (entries < view.num_pages)).all())


def _append_sequence_torch(view: PagedQuantizedKV, b: int, held: int, k: torch.Tensor, v: torch.Tensor) -> int:
    """Append k, v [H, n, D] to sequence b, which holds ``held`` tokens and has the pages they
    reach (its length is the caller's); returns the ERROR_* bits of its completed groups and its
    ring's tokens (ERROR_NOT_FINITE: the caller leaves the length)."""
    g, p, d = view.group_size, view.page_size, view.head_dim
    found = 0
    r = held % g
    old = torch.arange(held - r, held, device=k.device) % view.ring  # the partial group's ring rows
    ks = torch.cat([view.k_residual[b, :, old], k], dim=1)  # [H, r + n, D]
    vs = torch.cat([view.v_residual[b, :, old], v], dim=1)
    full = (r + k.shape[1]) // g * g
    for j in range(full // g):
        start = held - r + j * g
        page, off = int(view.block_table[b, start // p]), start % p
        kg, vg = ks[None, :, j * g:(j + 1) * g], vs[None, :, j * g:(j + 1) * g]
        _, k_scale, k_zero = _quantize_torch(kg, view.bits, g, view.scale_dtype, True)
        _, v_scale, v_zero = _quantize_torch(vg, view.bits, g, view.scale_dtype, False)
        found |= _scale_errors(k_scale, view.scale_dtype) | _scale_errors(v_scale, view.scale_dtype)
        view.k_scale[page, :, off // g] = k_scale[0, :, 0]
        view.k_zero[page, :, off // g] = k_zero[0, :, 0]
        view.v_scale[page, :, off:off + g] = v_scale[0]
        view.v_zero[page, :, off:off + g] = v_zero[0]
        codes = _codes_of(kg, vg, view)
        for i in range(g // view.tile):
            rows = slice(i * view.tile, (i + 1) * view.tile)
            tile_idx = (off + i * view.tile) // view.tile
            for role, c in zip(("k", "v"), codes, strict=True):
                tile = c[:, rows] if role == "k" else c[:, rows].transpose(-1, -2)
                words = view.k_words if role == "k" else view.v_words
                words[page, :, tile_idx] = pack_tile(tile, view.bits, role, d, view.tile, view.warps)
    end = held + k.shape[1]
    kept = torch.arange(max(held, end - view.ring), end, device=k.device)  # the chunk's tokens the ring keeps
    if not (bool(torch.isfinite(k[:, kept - held]).all()) and bool(torch.isfinite(v[:, kept - held]).all())):
        found |= ERROR_NOT_FINITE
    waits = held > 0 and end > held // g * g + g  # the kernel's _ring_waits
    if not (waits and found & ERROR_NOT_FINITE):
        view.k_residual[b, :, kept % view.ring] = k[:, kept - held]
        view.v_residual[b, :, kept % view.ring] = v[:, kept - held]
    if view.sinks:
        first = torch.arange(held, max(held, min(end, view.sinks)), device=k.device)  # the chunk's sink tokens
        view.k_sink[b, :, first] = k[:, first - held]
        view.v_sink[b, :, first] = v[:, first - held]
    return found


def _scale_errors(scale: torch.Tensor, scale_dtype: torch.dtype) -> int:
    """ERROR_NOT_FINITE where a group's scale is NaN or Inf in the scale dtype; ERROR_SCALE_RANGE
    where a finite fp32 scale exceeds fp16's range (the kernel's _flagged and _count_beyond_fp16)."""
    scale = scale.to(scale_dtype)
    finite = torch.isfinite(scale)
    found = 0 if bool(finite.all()) else ERROR_NOT_FINITE
    if scale_dtype == torch.float32 and bool((finite & (scale > FP16_MAX)).any()):
        found |= ERROR_SCALE_RANGE
    return found


def _codes_of(kg: torch.Tensor, vg: torch.Tensor, view: PagedQuantizedKV) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpacked codes uint8 [H, G, D] of one K group and one V group [1, H, G, D]."""
    from ..affine import _group_view, _quantize_groups

    out = []
    for x, per_channel in ((kg, True), (vg, False)):
        xg, dim = _group_view(x, view.group_size, per_channel)
        q, _, _ = _quantize_groups(xg, dim, view.bits, view.scale_dtype)
        out.append(q.reshape(x.shape)[0])
    return out[0], out[1]


# ----------------------------------------------------------------------------- AOT specializations
# what a step's launch specializes as multiples of 16 (D = 128): the strides of its contiguous token
# [B, H, D] (along T: 0), of the rings and sinks, and the page size
STEP_DIVISIBLE = ("stride_xb", "stride_xh", "stride_xt", "stride_r_b", "stride_r_h", "stride_r_t", "stride_sink_b",
                  "stride_sink_h", "stride_sink_t", "page_size")


def _aot_specs() -> list[AotSpec]:
    specs = []
    for dtype, d, g, bits, tile, sinks, window in (("fp16", 128, 64, 3, 64, 0, 0), ("bf16", 128, 64, 2, 64, 0, 0),
                                                    ("fp16", 64, 32, 4, 32, 0, 0), ("fp16", 128, 64, 3, 64, 64, 128)):
        ptr = f"*{dtype}"
        fp = f"_s{sinks}r{g + window}" if sinks or window else ""
        tokens = {"k_ptr": ptr, "v_ptr": ptr, "stride_xb": "i32", "stride_xh": "i32", "stride_xt": "i32"}
        counts = {"chunk_ptr": "*i32", "chunk": "i32"}
        fp_rows = fp_rows_signature(ptr)
        sig = {"tokens": tokens, "counts": counts, "pool": pool_signature("*fp16"), "num_pages": "i32",
               "fp_rows": fp_rows, "tables": {"k_table_ptr": "*i32", "v_table_ptr": "*i32"},
               "sequences": {"lens_ptr": "*i32", "err_ptr": "*i32", "arrivals_ptr": "*i32", "ring_from_ptr": "*i32"}}
        # the 3-bit ones stand for a step (one token: the JIT makes chunk == 1 a constant), the others for chunks
        step = bits == 3
        specs.append(AotSpec(
            f"page_append_{dtype}_d{d}_g{g}_b{bits}_t{tile}{fp}", _append_kernel, sig,
            {"D": d, "G": g, "BITS": bits, "TILE": tile, "SINKS": sinks, "RING": g + window, "RAGGED": False,
             **dict(zip(("SHARES", "WORDS"), word_split(tile * d * bits // 32, 1 if step else 2), strict=True)),
             "STEP": step, **({"chunk": 1} if step else {}), "SCALE_FP16": True,
             "FLOOR": SCALE_FLOOR[torch.float16], "SCALE_MAX": 65504.0, "INTERPRET": False},
            num_warps=APPEND_WARPS, divisible_ints=STEP_DIVISIBLE if step else (),
        ))
        ring_sig = {"tokens": tokens, "counts": counts, "ring": fp_rows["ring"], "ring_from_ptr": "*i32"}
        specs.append(AotSpec(f"page_append_ring_{dtype}_d{d}_g{g}_r{g + window}", _ring_kernel, ring_sig,
                             {"D": d, "G": g, "RING": g + window, "RAGGED": False}, num_warps=APPEND_WARPS))
    return specs


AOT_SPECS = _aot_specs()
