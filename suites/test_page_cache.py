"""The paged KV cache a server decodes on (:class:`kvbits.decode.cache.PagedKVCache`).

Growing a ragged batch token by token and in (ragged) chunks stores exactly what one-shot
quantization of each sequence stores; the torch and Triton appends write the same pool; the
planned decode matches the float64 reference; freed pages are reused; a step captured in a
CUDA graph replays correctly (GPU); bad input is refused with the cache unchanged; NaN or Inf in
a prompt, a chunk or a token is refused on the device for its sequence, which keeps its length and
what it held, and ``check_errors`` names the call and the sequence; the torch decode reads only
what the sequences hold; ``nbytes`` is the cache's whole memory.

In the interpreter (CPU) every shape is tiny (H=2, D=64, G=32, pages of 64 tokens: each Triton
append of a completed group costs about 0.2 s per head there); on a GPU the shapes are
realistic (H=8, D=128, G=64, pages of 256 tokens, a few thousand tokens per sequence).
"""

from __future__ import annotations

import gc
import json
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from affine_support import fresh_seed, gpu_or_small  # noqa: F401  (the seed fixture)
from decode_support import device_params, errors, poisoned_like, tolerance

import kvbits
from kvbits.decode import PagedKVCache, decode_attention, reference_decode

BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class Size:
    heads: int
    head_dim: int
    group: int
    page: int


SMALL = Size(heads=2, head_dim=64, group=32, page=64)  # the interpreter
LARGE = Size(heads=8, head_dim=128, group=64, page=256)  # a GPU


def _size(device) -> Size:
    return gpu_or_small(SMALL, LARGE, device)


def _new_cache(size: Size, device, *, num_pages: int, max_seqs: int = 4, bits: int = 3,
               dtype=torch.float16, page: int | None = None, **kw) -> PagedKVCache:
    return PagedKVCache(num_pages=num_pages, page_size=page or size.page, heads=size.heads,
                        head_dim=size.head_dim, max_seqs=max_seqs, bits=bits, group_size=size.group,
                        dtype=dtype, device=device, **kw)


FP_TOKENS = ("fp", "none")  # the cache's fp sinks and window, or none beyond the partial group


def _fp_tokens(size: Size, device, which: str) -> dict:
    """PagedKVCache's sinks and window for ``which`` of FP_TOKENS: the defaults on a GPU; a group
    each in the interpreter, whose short sequences then still attend codes between them."""
    if which == "none":
        return {"sinks": 0, "window": 0}
    return gpu_or_small({"sinks": size.group, "window": size.group}, {}, device)


def _kv(gen: torch.Generator, shape, dtype, device):
    """Fresh K, V of ``shape`` (last dim D): normal, K with a few outlier channels (x6)."""
    k = torch.randn(*shape, generator=gen)
    v = torch.randn(*shape, generator=gen)
    d = shape[-1]
    k[..., torch.randperm(d, generator=gen)[: max(1, d // 16)]] *= 6.0
    return k.to(dtype).to(device), v.to(dtype).to(device)


def _q(gen: torch.Generator, n: int, heads: int, d: int, dtype, device) -> torch.Tensor:
    return torch.randn(n, heads, d, generator=gen).to(dtype).to(device)


def _ragged_counts(rnd: random.Random, n: int, t: int) -> list[int]:
    """n chunk lengths in [0, t]: one row takes none, one the whole chunk, the rest at random."""
    counts = [rnd.randint(0, t) for _ in range(n)]
    rows = list(range(n))
    rnd.shuffle(rows)
    counts[rows[0]] = 0
    if n > 1:
        counts[rows[1]] = t
    return counts


def _poison_tail(k: torch.Tensor, v: torch.Tensor, counts: list[int]) -> None:
    """NaN in every token past chunk_lens[i] of row i: tokens the append must not read."""
    for row, c in enumerate(counts):
        k[row, :, c:] = float("nan")
        v[row, :, c:] = float("nan")


class _Book:
    """The test's own account of the cache: every token each live sequence was given."""

    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        self.k: dict[int, list[torch.Tensor]] = {}
        self.v: dict[int, list[torch.Tensor]] = {}

    def add(self, k=None, v=None, *, backend=None) -> int:
        sid = self.cache.add_sequence(k, v, backend=backend)
        c = self.cache
        empty = torch.empty(c.heads, 0, c.head_dim, dtype=c.dtype, device=c.device)
        self.k[sid] = [empty if k is None else k]
        self.v[sid] = [empty if v is None else v]
        return sid

    def append(self, k, v, *, chunk_lens=None, backend=None) -> None:
        self.cache.append(k, v, chunk_lens=chunk_lens, backend=backend)
        self.took(k, v, chunk_lens)

    def took(self, k, v, chunk_lens=None) -> None:
        """Note what an append of k, v [n, H, D] or [n, H, T, D] gave each live row (copies: the
        caller may reuse the buffers, as the replays of a captured step do)."""
        kk, vv = (k, v) if k.dim() == 4 else (k.unsqueeze(2), v.unsqueeze(2))
        for row, sid in enumerate(self.cache.sequences):
            n = kk.shape[2] if chunk_lens is None else chunk_lens[row]
            self.k[sid].append(kk[row, :, :n].clone())
            self.v[sid].append(vv[row, :, :n].clone())

    def free(self, sid: int) -> None:
        self.cache.free(sid)
        del self.k[sid], self.v[sid]

    def tokens(self, sid: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat(self.k[sid], dim=1)[None], torch.cat(self.v[sid], dim=1)[None]

    def lengths(self) -> list[int]:
        return [sum(p.shape[1] for p in self.k[sid]) for sid in self.cache.sequences]


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """Bitwise view of a tensor (floats as same-width ints) for exact comparisons."""
    if t.is_floating_point():
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _check_export(cache: PagedKVCache, book: _Book) -> dict:
    """Compare the export of every live sequence with one-shot quantization of its tokens; assert
    the lengths; return figures (states_checked, bit_errors, max_abs_err) with the mismatches."""
    lens = book.lengths()
    assert cache.lengths() == lens, (cache.lengths(), lens)
    n = len(lens)
    assert cache.seq_lens[:n].tolist() == lens
    got = cache.to_contiguous()
    assert got.batch == n and got.seq_lens.tolist() == lens
    g, bits = cache.group_size, cache.bits
    checked, bad, worst, where = 0, 0, 0.0, {}
    for row, sid in enumerate(cache.sequences):
        k, v = book.tokens(sid)
        length = k.shape[2]
        if length == 0:
            continue
        ref = kvbits.quantize_kv(k, v, bits, group_size=g, scale_dtype=cache.k_scale.dtype, backend="torch")
        full = length // g * g
        pairs = {
            "k_codes": (got.k_codes[row, :, :full], ref.k_codes[0, :, :full]),
            "v_codes": (got.v_codes[row, :, :full], ref.v_codes[0, :, :full]),
            "k_scale": (got.k_scale[row, :, : full // g], ref.k_scale[0, :, : full // g]),
            "k_zero": (got.k_zero[row, :, : full // g], ref.k_zero[0, :, : full // g]),
            "v_scale": (got.v_scale[row, :, :full], ref.v_scale[0, :, :full]),
            "v_zero": (got.v_zero[row, :, :full], ref.v_zero[0, :, :full]),
            "k_residual": (got.k_residual[row, :, : length - full], ref.k_residual[0, :, : length - full]),
            "v_residual": (got.v_residual[row, :, : length - full], ref.v_residual[0, :, : length - full]),
        }
        # the fp tokens the decode reads besides the codes: the sinks and the ring's window, as given
        sinks = min(cache.sinks, length)
        window = torch.arange(min(max(cache.sinks, full - cache.window), full), full, device=k.device)
        ring = cache.k_residual.shape[2]
        for name, fp, x in (("k", cache.k_sink, k), ("v", cache.v_sink, v)):
            if sinks:
                pairs[f"{name}_sink"] = (fp[row, :, :sinks], x[0, :, :sinks])
        pairs["k_window"] = (cache.k_residual[row, :, window % ring], k[0, :, window])
        pairs["v_window"] = (cache.v_residual[row, :, window % ring], v[0, :, window])
        for name, (a, b) in pairs.items():
            assert a.shape == b.shape, (name, a.shape, b.shape)
            diff = int((_as_bits(a) != _as_bits(b)).sum())
            checked += a.numel()
            if diff:
                bad += diff
                where[f"seq{sid}(len {length}).{name}"] = diff
                if a.is_floating_point():
                    worst = max(worst, float((a.double() - b.double()).abs().nan_to_num(float("inf")).max()))
    return {"states_checked": checked, "bit_errors": bad, "max_abs_err": worst, "mismatches": where}


def _record_export(record, figures: dict) -> None:
    record.add(states_checked=figures["states_checked"], bit_errors=figures["bit_errors"],
               max_abs_err=figures["max_abs_err"])
    assert not figures["mismatches"], f"export differs from one-shot quantization: {figures['mismatches']}"


# ----------------------------------------------------------------------------- 1. growth
GROWTH = [pytest.param(2, torch.float16, id="b2-fp16"), pytest.param(3, torch.bfloat16, id="b3-bf16"),
          pytest.param(4, torch.float16, id="b4-fp16")]


def _prompt_lens(rnd: random.Random, size: Size, device) -> list[int]:
    """Three prompt lengths: residual only; just short of a page boundary; past a page boundary,
    just short of a group boundary. In the interpreter each is within 4 tokens of its boundary,
    so that a few single-token appends cross all three."""
    g, p = size.group, size.page
    if str(device).startswith("cuda"):
        return [rnd.randint(1, g - 1), rnd.randint(4 * p - g // 2, 4 * p - 1), rnd.randint(10 * p + 1, 12 * p)]
    return [rnd.randint(g - 4, g - 1), rnd.randint(p - 4, p - 1), rnd.randint(p + g - 4, p + g - 1)]


def _grow(book: _Book, rnd: random.Random, gen: torch.Generator, size: Size, mode: str, backend: str):
    """Append to every live sequence: one token at a time, or in random (ragged) chunks that
    cross group and page boundaries. Returns the chunk lengths used (for the record)."""
    c = book.cache
    n, h, d, g, p = len(c.sequences), size.heads, size.head_dim, size.group, size.page
    device, dtype = c.device, c.dtype
    if mode == "tokens":
        steps = gpu_or_small(6, 2 * g + 7, device)  # the interpreter: past each prompt's boundary
        k, v = _kv(gen, (steps, n, h, d), dtype, device)
        for t in range(steps):
            book.append(k[t], v[t], backend=backend)  # [n, H, D]
        return [1] * steps
    if device.type == "cuda":
        plan = [("chunk", rnd.randint(1, 3 * g)), ("ragged", rnd.randint(g, 3 * g)), ("token", 1),
                ("chunk", rnd.randint(p, p + 2 * g)), ("ragged", rnd.randint(1, g)),
                ("ragged", rnd.randint(p, p + 3 * g)), ("chunk", rnd.randint(1, g))]
    else:
        plan = [("chunk", rnd.randint(g // 2, g + g // 2)), ("ragged", rnd.randint(g // 2, g + g // 2)),
                ("token", 1), ("chunk", rnd.randint(1, g // 2))]
    used = []
    for kind, t in plan:
        if kind == "token":
            k, v = _kv(gen, (n, h, d), dtype, device)
            book.append(k, v, backend=backend)
            used.append(1)
            continue
        k, v = _kv(gen, (n, h, t, d), dtype, device)
        counts = None
        if kind == "ragged":
            counts = _ragged_counts(rnd, n, t)
            _poison_tail(k, v, counts)
        book.append(k, v, chunk_lens=counts, backend=backend)
        used.append(counts or t)
    return used


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["tokens", "chunks"])
@pytest.mark.parametrize(("bits", "dtype"), GROWTH)
@pytest.mark.parametrize("fp", FP_TOKENS)
def test_growth_equals_one_shot(record, seed, device, backend, mode, bits, dtype, fp):
    """A ragged batch of three prompts grown token by token or in random chunks (ragged ones too,
    whose tokens past chunk_lens are NaN) exports, per sequence, exactly the codes, scales,
    zeros and residual tokens of one-shot quantization of all its tokens, and holds the sinks and
    the window's tokens as given."""
    record.backend, record.device, record.variant = backend, device, f"b{bits}-{str(dtype)[6:]}-{mode}-{fp}"
    size = _size(device)
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=gpu_or_small(16, 64, device), bits=bits, dtype=dtype,
                       **_fp_tokens(size, device, fp))
    book = _Book(cache)
    lens = _prompt_lens(rnd, size, device)
    for n in lens:
        book.add(*_kv(gen, (size.heads, n, size.head_dim), dtype, device), backend=backend)
    assert cache.lengths() == lens
    chunks = _grow(book, rnd, gen, size, mode, backend)
    cache.check_errors()  # nothing found on the device (the NaN past chunk_lens is never read)
    record.add(prompts=lens, chunks=str(chunks)[:200], lengths=cache.lengths())
    _record_export(record, _check_export(cache, book))


# ----------------------------------------------------------------------------- 2. torch == triton
def _pool_diffs(a: PagedKVCache, b: PagedKVCache) -> dict:
    """Per tensor attribute, how many elements differ bitwise; the host state too."""
    diffs = {}
    for name, t in vars(a).items():
        if isinstance(t, torch.Tensor) and name != "ring_from":  # the Triton append's hand-over between launches
            u = getattr(b, name)
            assert t.shape == u.shape, name
            count = int((_as_bits(t) != _as_bits(u)).sum())
            if count:
                diffs[name] = count
    for what in ("sequences", "free_pages"):
        if getattr(a, what) != getattr(b, what):
            diffs[what] = (getattr(a, what), getattr(b, what))
    if a.lengths() != b.lengths():
        diffs["lengths"] = (a.lengths(), b.lengths())
    return diffs


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(("bits", "dtype"), GROWTH)
@pytest.mark.parametrize("fp", FP_TOKENS)
def test_torch_and_triton_write_the_same_pool(record, seed, device, bits, dtype, fp):
    """The same operations (prompts, an empty sequence, tokens, chunks, ragged chunks, a free and
    an add into the freed row) through append_torch and through the kernel leave every tensor
    of the two caches (pool, residual windows, block table, lengths, errors) bit-identical."""
    record.backend, record.device, record.variant = "torch-vs-triton", device, f"b{bits}-{str(dtype)[6:]}-{fp}"
    size = _size(device)
    g, p, h, d = size.group, size.page, size.heads, size.head_dim
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    caches = {b: _new_cache(size, device, num_pages=gpu_or_small(12, 64, device), bits=bits, dtype=dtype,
                            **_fp_tokens(size, device, fp)) for b in BACKENDS}
    far = gpu_or_small((g + 1, 2 * g - 1), (3 * p, 5 * p), device)
    script = [("add", rnd.randint(*far)), ("add", 0), ("add", rnd.randint(1, g - 1)), ("token", 1),
              ("ragged", rnd.randint(g // 2, g + g // 2)), ("free", 0), ("add", rnd.randint(p - 3, p + 3)),
              ("chunk", rnd.randint(1, g)), ("token", 1)]
    if device == "cuda":
        script += [("chunk", rnd.randint(p, 2 * p)), ("ragged", rnd.randint(p, 2 * p)), ("free", 1)]
    checked = 0
    for step, (op, t) in enumerate(script):
        n = len(caches["torch"].sequences)
        if op == "add":
            kv = _kv(gen, (h, t, d), dtype, device) if t else (None, None)
            ids = {b: c.add_sequence(*kv, backend=b) for b, c in caches.items()}
            assert ids["torch"] == ids["triton"]
        elif op == "free":
            for c in caches.values():
                c.free(c.sequences[t])
        else:
            shape = (n, h, d) if op == "token" else (n, h, t, d)
            k, v = _kv(gen, shape, dtype, device)
            counts = None
            if op == "ragged":
                counts = _ragged_counts(rnd, n, t)
                _poison_tail(k, v, counts)
            for b, c in caches.items():
                c.append(k, v, chunk_lens=counts, backend=b)
        diffs = _pool_diffs(caches["torch"], caches["triton"])
        checked += sum(x.numel() for x in vars(caches["torch"]).values() if isinstance(x, torch.Tensor))
        if diffs:
            record.add(states_checked=checked, bit_errors=sum(x for x in diffs.values() if isinstance(x, int)),
                       max_abs_err=float("nan"))
        assert not diffs, f"after step {step} ({op} {t}): {diffs}"
    for c in caches.values():
        c.check_errors()
    record.add(states_checked=checked, bit_errors=0, max_abs_err=0.0, script=str(script),
               lengths=caches["torch"].lengths())


# ----------------------------------------------------------------------------- 3. attend
def _attend_checked(cache: PagedKVCache, q: torch.Tensor, *, via_view: bool = True) -> dict:
    """attend into a NaN-poisoned buffer; every element written; within tolerance of the float64
    reference on the cache as the decode reads it (codes, sinks and ring), of decode_attention on
    the view (``via_view``: each Triton decode takes about a second in the interpreter) and of the
    torch backend."""
    out = poisoned_like(q)
    result = cache.attend(q, out=out, backend="triton")
    assert result is out, "attend(out=...) must return out"
    assert bool(torch.isfinite(out).all()), "output has unwritten (NaN) or non-finite elements"
    ref = reference_decode(q, cache.view())
    figures = errors(out, ref)
    via_torch = cache.attend(q, backend="torch")
    figures["torch_abs_err"] = float((via_torch.double() - ref).abs().max())
    limit = tolerance(q.dtype)
    assert figures["max_abs_err"] <= limit, f"attend vs reference: {figures['max_abs_err']:.3g} > {limit:g}"
    if via_view:
        other = decode_attention(q, cache.view(), backend="triton")
        figures["view_abs_err"] = float((out.double() - other.double()).abs().max())
        figures["view_ref_err"] = float((other.double() - ref).abs().max())
        assert figures["view_abs_err"] <= limit, (
            f"attend vs decode_attention(q, cache.view()): {figures['view_abs_err']:.3g} > {limit:g}; against the "
            f"reference, decode_attention is off by {figures['view_ref_err']:.3g}, attend by "
            f"{figures['max_abs_err']:.3g} (lengths {cache.lengths()})")
    assert figures["torch_abs_err"] <= limit, f"attend(torch) vs reference: {figures['torch_abs_err']:.3g}"
    return figures


def _attend_params() -> list:
    """(device, dtype, Hq / Hkv): every pair on a GPU; two in the interpreter (a Triton decode
    takes a second or two there), which still cover bf16 and GQA."""
    out = []
    for param in device_params():
        device = param.values[0]
        pairs = [(torch.float16, 1), (torch.bfloat16, 2)]
        if device == "cuda":
            pairs += [(torch.bfloat16, 1), (torch.float16, 2)]
        for dtype, ratio in pairs:
            out.append(pytest.param(device, dtype, ratio, marks=param.marks,
                                    id=f"{str(dtype)[6:]}-hq{ratio}x-{device}"))
    return out


@pytest.mark.parametrize(("device", "dtype", "ratio"), _attend_params())
@pytest.mark.parametrize("fp", FP_TOKENS)
def test_attend_matches_the_reference(record, seed, device, dtype, ratio, fp):
    """Decode steps over a ragged batch as it grows: within the plan's headroom (the plan kept)
    and past it (re-planned); GQA with Hq = 2 Hkv; with fp sinks and window and without."""
    record.backend, record.device, record.variant = "triton", device, f"{str(dtype)[6:]}-hq{ratio}x-{fp}"
    size = _size(device)
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    backend = "triton" if device == "cuda" else "torch"  # the appends (the attend is the subject)
    cache = _new_cache(size, device, num_pages=gpu_or_small(16, 64, device), dtype=dtype,
                       **_fp_tokens(size, device, fp))
    book = _Book(cache)
    for n in _prompt_lens(rnd, size, device):
        book.add(*_kv(gen, (size.heads, n, size.head_dim), dtype, device), backend=backend)
    hq, n = size.heads * ratio, len(cache.sequences)
    worst, checked, plans = {}, 0, []
    steps = ("prompts", "token", "chunk-past-plan")
    if device == "cuda":
        steps += ("token", "token", "chunk-past-plan", "token")
    for i, step in enumerate(steps):
        if step == "token":
            book.append(*_kv(gen, (n, size.heads, size.head_dim), dtype, device), backend=backend)
        elif step == "chunk-past-plan":  # the longest row grows past any plan's headroom
            grow = size.group + max(cache.lengths()) // 8 + 1
            book.append(*_kv(gen, (n, size.heads, grow, size.head_dim), dtype, device),
                        chunk_lens=[rnd.randint(0, grow) for _ in range(n - 1)] + [grow], backend=backend)
        last = i == len(steps) - 1
        figures = _attend_checked(cache, _q(gen, n, hq, size.head_dim, dtype, device),
                                  via_view=last or device == "cuda")
        plans.append(cache._plan)
        if step == "token":
            assert plans[-1] is plans[-2], "a token within the plan's headroom keeps the plan"
        elif step == "chunk-past-plan":
            assert plans[-1] is not plans[-2], "lengths past the plan's max_len need a new plan"
        checked += n * hq * size.head_dim
        for key, value in figures.items():
            worst[key] = max(worst.get(key, 0.0), value)
    record.add(states_checked=checked, bit_errors=0, lengths=cache.lengths(), **worst)


@pytest.mark.parametrize("device", device_params())
def test_fp_parts_under_every_split_count(record, seed, device):
    """Every partial written once, the code splits' and the fp parts' (sinks and ring, a group's
    rows each), under one split, a few and one tile per split; lengths within the sinks, within
    the ring and far past both."""
    record.backend, record.device, record.variant = "triton", device, "fp-parts-splits"
    size = _size(device)
    g, h, d = size.group, size.heads, size.head_dim
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=gpu_or_small(16, 64, device), sinks=g, window=g)
    for n in (g // 2, 3 * g + 5, gpu_or_small(7 * g + 3, 40 * g + 3, device)):
        cache.add_sequence(*_kv(gen, (h, n, d), cache.dtype, device))
    q = _q(gen, len(cache.sequences), h, d, cache.dtype, device)
    view = cache.view()
    ref = reference_decode(q, view)
    limit, worst = tolerance(q.dtype), 0.0
    tiles = -(-max(cache.lengths()) // view.tile)
    for num_splits in (1, 2, 3, tiles):
        out = poisoned_like(q)
        decode_attention(q, view, num_splits=num_splits, backend="triton", out=out)
        assert bool(torch.isfinite(out).all()), f"num_splits={num_splits}: unwritten (NaN) or non-finite output"
        err = float((out.double() - ref).abs().max())
        assert err <= limit, f"num_splits={num_splits}: {err:.3g} > {limit:g} (lengths {cache.lengths()})"
        worst = max(worst, err)
    record.add(states_checked=4 * q.numel(), bit_errors=0, max_abs_err=worst, lengths=cache.lengths())


def _poison_what_is_not_held(cache: PagedKVCache) -> int:
    """Poison everything of ``cache`` the decode must not read: the pages no live sequence's whole
    groups reach (NaN scales and zeros, all-ones words), the slots of a sequence's last page past
    its whole groups, its ring rows outside ``[min(max(sinks, full - window), full), length)``, its
    sink rows past its length, the rows past the live ones and its block-table entries past its
    pages (outside the pool). Returns how many pages no sequence reads."""
    g, p, t, ring = cache.group_size, cache.page_size, cache.tile, cache.k_residual.shape[2]
    nan = float("nan")
    read = set()
    for row, n in enumerate(cache.lengths()):
        full = n // g * g
        pages = cache.block_table[row, :-(-full // p)].tolist()
        read.update(pages)
        if full % p:  # the last page past the whole groups
            last, off = pages[-1], full % p
            for name in ("k_scale", "k_zero"):
                getattr(cache, name)[last, :, off // g:] = nan
            for name in ("v_scale", "v_zero"):
                getattr(cache, name)[last, :, off:] = nan
            cache.k_words[last, :, off // t:] = -1
            cache.v_words[last, :, off // t:] = -1
        cache.block_table[row, len(pages):] = cache.num_pages + 5
        kept = {q % ring for q in range(min(max(cache.sinks, full - cache.window), full), n)}
        for fp in (cache.k_residual, cache.v_residual):
            fp[row, :, [r for r in range(ring) if r not in kept]] = nan
        for fp in (cache.k_sink, cache.v_sink):
            if fp is not None:
                fp[row, :, min(n, cache.sinks):] = nan
    live = len(cache.sequences)
    for fp in (cache.k_residual, cache.v_residual, cache.k_sink, cache.v_sink):
        if fp is not None:
            fp[live:] = nan
    unread = [page for page in range(cache.num_pages) if page not in read]
    for name in ("k_scale", "k_zero", "v_scale", "v_zero"):
        getattr(cache, name)[unread] = nan
    cache.k_words[unread] = -1
    cache.v_words[unread] = -1
    return len(unread)


@pytest.mark.parametrize("num_pages", [16, 256])
@pytest.mark.parametrize("fp", FP_TOKENS)
def test_the_torch_decode_reads_only_what_sequences_hold(record, seed, num_pages, fp):
    """The torch decode (reference_decode, attend(backend="torch"), decode_attention on the view)
    reads each sequence's pages up to its last whole group and its fp rows up to its length, and
    nothing else: with everything else poisoned (_poison_what_is_not_held) its output is finite
    and bit-identical to the output before, whatever the pool's size."""
    record.backend, record.device, record.variant = "torch", "cpu", f"live-pages-only-{num_pages}-pages-{fp}"
    size = _size("cpu")
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    cache = _new_cache(size, "cpu", num_pages=num_pages, max_seqs=6, **_fp_tokens(size, "cpu", fp))
    lens = [301, rnd.randint(1, size.group - 1), rnd.randint(size.page, 2 * size.page), rnd.randint(1, 3 * size.group)]
    ids = [cache.add_sequence(*_kv(gen, (size.heads, n, size.head_dim), cache.dtype, "cpu"), backend="torch")
           for n in lens]
    cache.free(ids[1])  # the last row moves into its place; its pages go back to the pool
    cache.append(*_kv(gen, (len(ids) - 1, size.heads, size.head_dim), cache.dtype, "cpu"), backend="torch")
    q = _q(gen, len(ids) - 1, 2 * size.heads, size.head_dim, cache.dtype, "cpu")
    calls = {
        "reference_decode": lambda: reference_decode(q, cache.view()),
        "attend": lambda: cache.attend(q, backend="torch"),
        "decode_attention": lambda: decode_attention(q, cache.view(), backend="torch"),
    }
    before = {name: call() for name, call in calls.items()}
    unread = _poison_what_is_not_held(cache)
    record.add(lengths=cache.lengths(), pages_unread=unread)
    for name, call in calls.items():
        out = call()
        assert bool(torch.isfinite(out).all()), f"{name} read a poisoned element"
        assert torch.equal(_as_bits(out), _as_bits(before[name])), f"{name} changed"
    record.add(states_checked=sum(x.numel() for x in before.values()), bit_errors=0, max_abs_err=0.0)


# ----------------------------------------------------------------------------- 4. freed pages
def _pages_of(cache: PagedKVCache, row: int) -> list[int]:
    table = cache.block_table[row].tolist()
    return [p for p in table if p >= 0]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", BACKENDS)
def test_freed_pages_are_reused(record, seed, device, backend):
    """Add A, B, D; free A (D moves into A's row); add C, which takes A's former pages and one
    more; every sequence still exports and decodes right; freeing the last row moves nothing."""
    record.backend, record.device, record.variant = backend, device, "free-reuse"
    size = _size(device)
    g, h, d = size.group, size.heads, size.head_dim
    p = gpu_or_small(g, size.page, device)  # one group per page in the interpreter
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    num_pages = 12
    cache = _new_cache(size, device, num_pages=num_pages, page=p)
    book = _Book(cache)

    def prompt(pages, extra):  # a prompt filling `pages` pages and `extra` more tokens
        return _kv(gen, (h, pages * p + extra, d), cache.dtype, device)

    a = book.add(*prompt(2, rnd.randint(1, g - 1)), backend=backend)
    b = book.add(*prompt(0, rnd.randint(1, g - 1)), backend=backend)  # residual only: no page
    dd = book.add(*prompt(1, rnd.randint(1, g - 1)), backend=backend)
    assert cache.sequences == [a, b, dd]
    pages_a = _pages_of(cache, 0)
    assert len(pages_a) == 2 and _pages_of(cache, 1) == [] and len(_pages_of(cache, 2)) == 1
    assert cache.free_pages == num_pages - 3
    book.free(a)
    assert cache.sequences == [dd, b], "the last row moves into the freed row"
    assert cache.free_pages == num_pages - 1
    assert cache.view().block_table.shape[0] == 2
    c = book.add(*prompt(3, rnd.randint(1, g - 1)), backend=backend)
    assert cache.sequences == [dd, b, c]
    pages_c = _pages_of(cache, 2)
    assert len(pages_c) == 3 and set(pages_a) <= set(pages_c), (pages_a, pages_c)
    assert cache.free_pages == num_pages - 4
    assert len(set(pages_c) | set(_pages_of(cache, 0))) == 4, "pages are never shared"
    book.append(*_kv(gen, (3, h, d), cache.dtype, device), backend=backend)
    t = g + 1
    book.append(*_kv(gen, (3, h, t, d), cache.dtype, device), chunk_lens=[t, rnd.randint(0, t), t],
                backend=backend)
    figures = _check_export(cache, book)
    _record_export(record, figures)
    q = _q(gen, 3, h, d, cache.dtype, device)
    attn = _attend_checked(cache, q, via_view=False)
    book.free(c)  # the last row: nothing moves
    assert cache.sequences == [dd, b]
    book.free(dd)  # row 0: b moves into it
    assert cache.sequences == [b]
    assert cache.free_pages == num_pages - len(_pages_of(cache, 0))
    figures2 = _check_export(cache, book)
    _record_export(record, {k: figures[k] + figures2[k] if k != "mismatches" else figures2[k]
                            for k in figures})
    attn2 = _attend_checked(cache, _q(gen, 1, h, d, cache.dtype, device), via_view=False)
    record.add(max_abs_err=max(attn["max_abs_err"], attn2["max_abs_err"]), pages_a=pages_a, pages_c=pages_c)


# ----------------------------------------------------------------------------- 5. CUDA graph
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("history", ["fresh", "after-eager-steps"])
def test_cuda_graph_step_replays(record, seed, device, history):
    """reserve, one eager warm-up step, capture one step (append of static k, v and attend of a
    static q into a static out), replay it with new inputs: the export equals one-shot
    quantization of every token, the outputs the reference. 'after-eager-steps' decodes eagerly
    (a plan made for the lengths then) before reserving."""
    record.backend, record.device, record.variant = "triton", device, f"cuda-graph-{history}"
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    size = _size(device)
    h, d, g, p = size.heads, size.head_dim, size.group, size.page
    hq, dtype = 2 * h, torch.float16
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=64)
    book = _Book(cache)
    for n in (rnd.randint(1, g - 1), rnd.randint(3 * p, 4 * p), rnd.randint(8 * p, 8 * p + g)):
        book.add(*_kv(gen, (h, n, d), dtype, device))
    n = len(cache.sequences)
    if history == "after-eager-steps":
        for _ in range(3):
            book.append(*_kv(gen, (n, h, d), dtype, device))
            cache.attend(_q(gen, n, hq, d, dtype, device))
    replays = 600  # past any plan's headroom for these lengths (an eighth of about 2,100 tokens)
    cache.reserve(replays + 1)  # the warm-up step's token and the replays'
    free_after_reserve = cache.free_pages
    ks, vs = _kv(gen, (replays + 1, n, h, d), dtype, device)
    qs = _q(gen, (replays + 1) * n, hq, d, dtype, device).reshape(replays + 1, n, hq, d)
    static_k, static_v = ks[0].clone(), vs[0].clone()
    static_q, static_out = qs[0].clone(), torch.empty(n, hq, d, dtype=dtype, device=device)
    book.append(static_k, static_v)  # the eager warm-up step
    cache.attend(static_q, out=static_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cache.append(static_k, static_v)
        cache.attend(static_q, out=static_out)
    before = cache.lengths()
    worst, checked = 0.0, 0
    for i in range(1, replays + 1):
        static_k.copy_(ks[i])
        static_v.copy_(vs[i])
        static_q.copy_(qs[i])
        graph.replay()
        book.took(ks[i], vs[i])
        if i in (1, replays // 2, replays):  # the output of this replay against the reference
            torch.cuda.synchronize()
            assert cache.seq_lens[:n].tolist() == [x + i for x in before]
            ref = reference_decode(qs[i], cache.view())
            assert bool(torch.isfinite(static_out).all())
            err = float((static_out.double() - ref).abs().max())
            worst, checked = max(worst, err), checked + static_out.numel()
            assert err <= tolerance(dtype), f"replay {i}: {err:.3g} > {tolerance(dtype):g}"
    assert cache.lengths() == before, "the host sees no replay"
    cache.advance(replays)
    assert cache.lengths() == [x + replays for x in before]
    assert cache.sync_lengths() == [x + replays for x in before]
    assert cache.free_pages == free_after_reserve, "replays take no page from the host"
    cache.check_errors()
    figures = _check_export(cache, book)
    record.add(attend_abs_err=worst, lengths=cache.lengths())
    record.add(states_checked=figures["states_checked"] + checked, bit_errors=figures["bit_errors"],
               max_abs_err=worst)
    assert not figures["mismatches"], figures["mismatches"]


_PAST_THE_RESERVATION = r"""
import json, sys, torch
from kvbits.decode import PagedKVCache
seed, attend = int(sys.argv[1]), sys.argv[2] == "append+attend"
gen = torch.Generator().manual_seed(seed)
H, D, G, P = 8, 128, 64, 256
def rand(*shape):
    return torch.randn(*shape, generator=gen).half().cuda()
cache = PagedKVCache(num_pages=8, page_size=P, heads=H, head_dim=D, max_seqs=2, group_size=G, device="cuda")
cache.add_sequence(rand(H, P + G - 3, D), rand(H, P + G - 3, D))  # one page; the group [P, P + G) pending
cache.reserve(1)  # the warm-up's token: no page more
k, v, q = rand(1, H, D), rand(1, H, D), rand(1, H, D)
out = torch.empty_like(q)
cache.append(k, v)
cache.attend(q, out=out)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    cache.append(k, v)
    if attend:
        cache.attend(q, out=out)
for _ in range(3):  # the second completes the group [P, P + G), whose page was never reserved
    graph.replay()
result = {"error": None}
try:
    cache.check_errors()
except ValueError as e:
    result["error"] = str(e)
cache.check_errors()  # cleared
result["lengths"] = cache.sync_lengths()
result["expected"] = [P + G - 1]  # the length stays at the last token stored
print("RESULT " + json.dumps(result))
"""


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("step", ["append", "append+attend"])
def test_replays_past_the_reservation_show_in_check_errors(record, seed, device, step):
    """A captured step replayed past what reserve() gave: the group that completes without a page
    is not written, the length stays at the last token stored (the decode never reads a page that
    is not there), and check_errors says so ('reserve before replaying'), then is cleared; with
    the decode in the step too. Run in a child process: a fault there (an illegal address) would
    take this process's CUDA context, and every later GPU test, with it."""
    record.backend, record.device, record.variant = "triton", device, f"replays-past-reserve-{step}"
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    child = subprocess.run([sys.executable, "-c", _PAST_THE_RESERVATION, str(seed), step], cwd=root, env=env,
                           capture_output=True, text=True, timeout=300)
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    # the child's own words, its CUDA error names broken up ("CUDA- error", "cuda-ErrorIllegal..."):
    # the harness would take them for a fault in this process, whose context is intact, and stop
    tail = re.sub(r"(?i)(cuda)([ _]?error)", r"\1-\2", (child.stdout + child.stderr)[-1500:])
    status = child.returncode
    del child  # (not in an assertion's report: its repr holds the child's raw words)
    record.add(states_checked=1, bit_errors=0, max_abs_err=0.0, returncode=status)
    if status != 0 or not lines:
        pytest.fail(f"the replays failed (exit status {status}): {tail}")
    result = json.loads(lines[-1][len("RESULT "):])
    record.add(error_type="ValueError", error_message=result["error"])
    assert result["error"] is not None and "no page" in result["error"], result
    assert "NaN" not in result["error"], result
    assert result["lengths"] == result["expected"], result


@pytest.mark.parametrize("device", device_params())
def test_a_long_prompt_and_its_decode(record, seed, device):
    """A prompt whose append is one launch of many programs (on a GPU 8 heads x 2 x 4,700 groups:
    more than 2^16, past any narrow count of the programs that finished): the length on the
    device is the prompt's, the last group's codes equal one-shot quantization, and the decode
    of the next token matches the reference."""
    record.backend, record.device, record.variant = "triton", device, "long-prompt"
    size = _size(device)
    h, d, g, p = size.heads, size.head_dim, size.group, size.page
    n = gpu_or_small(2 * p + g + 5, 300_001, device)
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=-(-n // p) + 2, max_seqs=1)
    k, v = _kv(gen, (h, n, d), cache.dtype, device)
    cache.add_sequence(k, v, backend="triton")
    k1, v1 = _kv(gen, (1, h, d), cache.dtype, device)
    cache.append(k1, v1, backend="triton")
    assert cache.seq_lens[:1].tolist() == cache.lengths() == [n + 1]
    cache.check_errors()
    export = cache.to_contiguous()
    full = (n + 1) // g * g
    tail = kvbits.quantize_kv(torch.cat([k[None, :, full - g:n], k1[:, :, None]], 2),
                               torch.cat([v[None, :, full - g:n], v1[:, :, None]], 2), 3, group_size=g,
                               backend="torch")
    assert torch.equal(export.k_codes[0, :, full - g:full], tail.k_codes[0, :, :g])
    assert torch.equal(export.v_scale[0, :, full - g:full], tail.v_scale[0, :, :g])
    q = _q(gen, 1, h, d, cache.dtype, device)
    figures = _attend_checked(cache, q, via_view=False)
    record.add(states_checked=q.numel(), bit_errors=0, max_abs_err=figures["max_abs_err"], prompt=n)


@pytest.mark.parametrize("device", device_params())
def test_v_laid_out_unlike_k(record, seed, device):
    """k contiguous, v a transposed view (unit stride along D, other strides): the Triton append
    stores what the torch append stores (the kernel addresses k and v with one set of strides)."""
    record.backend, record.device, record.variant = "triton", device, "v-strides"
    size = _size(device)
    h, d, g = size.heads, size.head_dim, size.group
    gen = torch.Generator().manual_seed(seed)
    caches = [_new_cache(size, device, num_pages=4, max_seqs=2) for _ in BACKENDS]
    n = g + 5
    k, _ = _kv(gen, (2, h, n, d), caches[0].dtype, device)
    v = _kv(gen, (h, 2, n, d), caches[0].dtype, device)[1].transpose(0, 1)  # [2, H, n, D], strided
    assert v.stride() != k.stride() and v.stride(-1) == 1
    for cache, backend in zip(caches, BACKENDS, strict=True):
        cache.add_sequence()
        cache.add_sequence()
        cache.append(k, v, backend=backend)
    for name in ("v_words", "v_scale", "v_zero", "v_residual", "k_words", "seq_lens"):
        assert torch.equal(getattr(caches[0], name), getattr(caches[1], name)), name
    record.add(states_checked=v.numel(), bit_errors=0, max_abs_err=0.0)


@pytest.mark.parametrize("device", device_params())
def test_the_default_scale_after_an_explicit_one(record, seed, device):
    """attend(q, sm_scale=s) then attend(q): the second uses 1/sqrt(D), not the kept plan's s."""
    record.backend, record.device, record.variant = "triton", device, "sm-scale"
    size = _size(device)
    h, d, g = size.heads, size.head_dim, size.group
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=4, max_seqs=1)
    cache.add_sequence(*_kv(gen, (h, 2 * g + 3, d), cache.dtype, device), backend="triton")
    q = _q(gen, 1, h, d, cache.dtype, device)
    cache.attend(q, sm_scale=0.5, backend="triton")
    out = cache.attend(q, backend="triton")
    err = float((out.double() - reference_decode(q, cache.view())).abs().max())
    record.add(states_checked=out.numel(), max_abs_err=err)
    assert err <= tolerance(q.dtype)


@pytest.mark.parametrize("device", device_params())
def test_a_plan_covers_every_token_the_reserved_pages_hold(record, seed, device):
    """reserve() hands out whole pages; appends on the device alone (as replays of a captured step,
    which the host does not see) up to what those pages hold are all attended by the kept plan."""
    record.backend, record.device, record.variant = "triton", device, "plan-covers-pages"
    size = _size(device)
    h, d, p = size.heads, size.head_dim, 4 * size.page  # a page of 8 groups or more
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=4, max_seqs=1, page=p)
    cache.add_sequence()
    cache.reserve(size.group)  # one page of p tokens
    q = _q(gen, 1, h, d, cache.dtype, device)
    k, v = _kv(gen, (p + 3, 1, h, d), cache.dtype, device)
    cache.append(k[0], v[0], backend="triton")
    cache.attend(q, backend="triton")  # the plan, kept from here on
    plan = cache._plan
    cache.view()
    for i in range(1, p + 3):  # the device grows; the host's count does not
        cache._appender(k[i][:, :, None], v[i][:, :, None], None)
    out = cache.attend(q, backend="triton")
    assert cache._plan is plan
    cache.check_errors()
    assert cache.sync_lengths() == [p + 3]
    err = float((out.double() - reference_decode(q, cache.view())).abs().max())
    record.add(states_checked=out.numel(), max_abs_err=err)
    assert err <= tolerance(q.dtype)


POOL = ("k_words", "v_words", "k_scale", "k_zero", "v_scale", "v_zero")  # indexed by page first
ROWS = ("k_residual", "v_residual", "block_table", "seq_lens")  # indexed by row first


def _touched(before: dict, cache: PagedKVCache) -> dict[str, set[int]]:
    """Per pool tensor the pages, per row tensor the rows, whose bits differ from ``before``."""
    out = {}
    for name in POOL + ROWS:
        old, new = _as_bits(before[name]), _as_bits(getattr(cache, name))
        differs = (old != new).reshape(old.shape[0], -1).any(dim=1)
        if differs.any():
            out[name] = set(differs.nonzero().flatten().tolist())
    return out


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chunk_without_its_page_leaves_its_sequence_unchanged(record, seed, device, backend):
    """A ragged chunk appended on the device alone (as a replay, which the host neither sees nor
    hands pages to) where row 0's chunk completes a group in its page and one past its pages:
    row 0 keeps every bit (pool, residual window, length), check_errors names the missing page,
    and row 1, whose group lands in its page, takes its tokens as one-shot quantization does."""
    record.backend, record.device, record.variant = backend, device, "chunk-without-its-page"
    size = _size(device)
    h, d, g, p = size.heads, size.head_dim, size.group, size.page
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=4, max_seqs=2)
    book = _Book(cache)
    book.add(*_kv(gen, (h, p - g + 8, d), cache.dtype, device), backend=backend)  # one page, group [p - g, p) pending
    book.add(*_kv(gen, (h, g + 4, d), cache.dtype, device), backend=backend)  # one page, group [g, 2g) pending
    counts = [2 * g, g]  # row 0 reaches [p, p + g), in a page it lacks; row 1 completes [g, 2g)
    k, v = _kv(gen, (2, h, 2 * g, d), cache.dtype, device)
    _poison_tail(k, v, counts)
    before = _snapshot(cache)
    cache.view()
    cache._write(slice(0, 2), k, v, cache._on_device(counts), backend)  # no pages handed out
    touched = _touched(before, cache)
    record.add(touched=str(touched))
    assert all(rows == {1} for name, rows in touched.items() if name in ROWS), touched
    assert all(pages <= set(_pages_of(cache, 1)) for name, pages in touched.items() if name in POOL), touched
    assert not cache.arrivals.any()
    with pytest.raises(ValueError, match="no page"):
        cache.check_errors()
    cache.check_errors()  # cleared
    book.took(k, v, [0, g])
    assert cache.sync_lengths() == book.lengths()
    _record_export(record, _check_export(cache, book))


# ----------------------------------------------------------------------------- 6. bad input
def _snapshot(cache: PagedKVCache) -> dict:
    state = {name: t.clone() for name, t in vars(cache).items() if isinstance(t, torch.Tensor)}
    state.update(free_pages=cache.free_pages, lengths=cache.lengths(), sequences=cache.sequences)
    return state


def _changed(before: dict, cache: PagedKVCache) -> list[str]:
    after = _snapshot(cache)
    out = []
    for name, value in before.items():
        now = after[name]
        same = torch.equal(_as_bits(value), _as_bits(now)) if isinstance(value, torch.Tensor) else value == now
        if not same:
            out.append(name)
    return out


@dataclass
class _Ctx:
    """A cache of 2 sequences (a: 2G + 6 tokens, one page; b: G + 8, one page) in a pool of 6
    pages of 2G tokens, max_pages_per_seq 5, max_seqs 3; H=2, D=64, G=32 on every device."""

    cache: PagedKVCache
    a: int
    b: int
    device: str
    gen: torch.Generator

    def kv(self, *shape, dtype=torch.float16, device=None):
        return _kv(self.gen, shape, dtype, device or self.device)


SIZE_BAD = Size(heads=2, head_dim=64, group=32, page=64)


def _bad_ctx(device) -> _Ctx:
    gen = torch.Generator().manual_seed(1234)
    cache = _new_cache(SIZE_BAD, device, num_pages=6, max_seqs=3, max_pages_per_seq=5)
    a = cache.add_sequence(*_kv(gen, (2, 70, 64), torch.float16, device), backend="torch")
    b = cache.add_sequence(*_kv(gen, (2, 40, 64), torch.float16, device), backend="torch")
    return _Ctx(cache, a, b, device, gen)


def _construct(**kw):
    args = dict(num_pages=4, page_size=64, heads=2, head_dim=64, max_seqs=2, group_size=32)
    args.update(kw)
    return PagedKVCache(**args)


def _needs_gpu(x: _Ctx):
    if x.device != "cuda":
        pytest.skip("a CPU tensor for a CUDA cache needs a GPU")


def _freed(x: _Ctx):
    x.cache.free(x.b)


def _third(x: _Ctx):
    x.cache.add_sequence()


BAD = {
    # name: (setup or None, call, exception, text the message must contain)
    "free-unknown-id": (None, lambda x: x.cache.free(99), ValueError, "seq_id 99 is not a live sequence"),
    "free-freed-id": (_freed, lambda x: x.cache.free(x.b), ValueError, "is not a live sequence"),
    "free-a-bool": (None, lambda x: x.cache.free(True), ValueError, "seq_id True"),
    "free-a-string": (None, lambda x: x.cache.free("0"), ValueError, "seq_id '0'"),
    "add-pool-exhausted": (None, lambda x: x.cache.add_sequence(*x.kv(2, 5 * 64, 64)), ValueError,
                           "pool is exhausted"),
    "add-past-max-pages-per-seq": (None, lambda x: x.cache.add_sequence(*x.kv(2, 6 * 64, 64)), ValueError,
                                   "max_pages_per_seq=5"),
    "append-pool-exhausted": (None, lambda x: x.cache.append(*x.kv(2, 2, 200, 64)), ValueError,
                              "pool is exhausted"),
    "append-ragged-pool-exhausted": (None, lambda x: x.cache.append(*x.kv(2, 2, 260, 64), chunk_lens=[200, 260]),
                                     ValueError, "pool is exhausted"),
    "append-past-max-pages-per-seq": (None, lambda x: x.cache.append(*x.kv(2, 2, 5 * 64, 64)), ValueError,
                                      "max_pages_per_seq=5"),
    "append-one-row-past-max-pages": (None, lambda x: x.cache.append(*x.kv(2, 2, 5 * 64, 64),
                                                                     chunk_lens=[0, 5 * 64]),
                                      ValueError, "max_pages_per_seq=5"),
    "reserve-pool-exhausted": (None, lambda x: x.cache.reserve(200), ValueError, "pool is exhausted"),
    "reserve-negative": (None, lambda x: x.cache.reserve(-1), ValueError, "tokens must be non-negative"),
    "reserve-a-bool": (None, lambda x: x.cache.reserve(True), TypeError, "tokens must be an int"),
    "advance-a-float": (None, lambda x: x.cache.advance(1.0), TypeError, "tokens must be an int"),
    "append-wrong-dtype": (None, lambda x: x.cache.append(*x.kv(2, 2, 64, dtype=torch.float32)), TypeError,
                           "k must have dtype float16"),
    "append-bf16-to-fp16": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64, dtype=torch.bfloat16)), TypeError,
                            "k must have dtype float16"),
    "append-v-wrong-dtype": (None, lambda x: x.cache.append(x.kv(2, 2, 64)[0], x.kv(2, 2, 64, dtype=torch.bfloat16)[1]),
                             TypeError, "v must have dtype float16"),
    "append-wrong-heads": (None, lambda x: x.cache.append(*x.kv(2, 3, 64)), ValueError,
                           "k must be [2, H=2, T, D=64] (or without T for one token) for this cache's 2 live "
                           "sequences; got (2, 3, 1, 64)"),
    "append-wrong-heads-one-live": (_freed, lambda x: x.cache.append(*x.kv(1, 3, 64)), ValueError,
                                    "for this cache's 1 live sequence; got (1, 3, 1, 64)"),
    "append-wrong-head-dim": (None, lambda x: x.cache.append(*x.kv(2, 2, 128)), ValueError, "D=64"),
    "append-wrong-batch": (None, lambda x: x.cache.append(*x.kv(1, 2, 64)), ValueError, "2 live sequences"),
    "append-rank-2": (None, lambda x: x.cache.append(*x.kv(2, 64)), ValueError, "k must have 4 dimensions"),
    "append-kv-shape-mismatch": (None, lambda x: x.cache.append(x.kv(2, 2, 3, 64)[0], x.kv(2, 2, 2, 64)[1]),
                                 ValueError, "k and v must have the same shape"),
    "append-k-without-v": (None, lambda x: x.cache.append(x.kv(2, 2, 3, 64)[0], None), TypeError,
                           "v must be a torch.Tensor"),
    "append-not-a-tensor": (None, lambda x: x.cache.append(x.kv(2, 2, 64)[0].tolist(), x.kv(2, 2, 64)[1]),
                            TypeError, "k must be a torch.Tensor"),
    "append-strided-head-dim": (None, lambda x: x.cache.append(*(t.transpose(-1, -2) for t in x.kv(2, 2, 64, 3))),
                                ValueError, "unit stride along head_dim"),
    "append-meta-device": (None, lambda x: x.cache.append(*x.kv(2, 2, 64, device="meta")), ValueError,
                           "tensors must share one device"),
    "append-cpu-k-for-cuda-cache": (_needs_gpu, lambda x: x.cache.append(*x.kv(2, 2, 64, device="cpu")),
                                    ValueError, "tensors must share one device"),
    "append-cpu-v-for-cuda-cache": (_needs_gpu, lambda x: x.cache.append(x.kv(2, 2, 64)[0],
                                                                         x.kv(2, 2, 64, device="cpu")[1]),
                                    ValueError, "tensors must share one device"),
    "append-backend-unknown": (None, lambda x: x.cache.append(*x.kv(2, 2, 64), backend="numpy"), ValueError,
                               "backend must be one of"),
    "chunk-lens-a-tensor": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64), chunk_lens=torch.tensor([1, 2])),
                            TypeError, "chunk_lens must be a list or tuple of ints"),
    "chunk-lens-an-int": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64), chunk_lens=2), TypeError,
                          "chunk_lens must be a list or tuple of ints"),
    "chunk-lens-wrong-length": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64), chunk_lens=[1, 2, 3]),
                                ValueError, "chunk_lens must have one count per live sequence (2)"),
    "chunk-lens-past-t": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64), chunk_lens=[1, 4]), ValueError,
                          "chunk_lens[1] must be an int in [0, 3]"),
    "chunk-lens-negative": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64), chunk_lens=[-1, 2]), ValueError,
                            "chunk_lens[0] must be an int in [0, 3]"),
    "chunk-lens-a-bool": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64), chunk_lens=[True, 2]), ValueError,
                          "chunk_lens[0] must be an int"),
    "chunk-lens-a-float": (None, lambda x: x.cache.append(*x.kv(2, 2, 3, 64), chunk_lens=[1, 2.0]), ValueError,
                           "chunk_lens[1] must be an int"),
    "chunk-lens-one-token": (None, lambda x: x.cache.append(*x.kv(2, 2, 64), chunk_lens=[2, 0]), ValueError,
                             "chunk_lens[0] must be an int in [0, 1]"),
    "add-beyond-max-seqs": (_third, lambda x: x.cache.add_sequence(), ValueError, "max_seqs=3"),
    "add-k-without-v": (None, lambda x: x.cache.add_sequence(x.kv(2, 5, 64)[0]), ValueError,
                        "k and v must be given together"),
    "add-v-without-k": (None, lambda x: x.cache.add_sequence(None, x.kv(2, 5, 64)[1]), ValueError,
                        "k and v must be given together"),
    "add-wrong-dtype": (None, lambda x: x.cache.add_sequence(*x.kv(2, 5, 64, dtype=torch.float32)), TypeError,
                        "k must have dtype float16"),
    "add-wrong-heads": (None, lambda x: x.cache.add_sequence(*x.kv(4, 5, 64)), ValueError,
                        "k must be [H=2, S, D=64] or [1, H=2, S, D=64] (the prompt of the one sequence added); "
                        "got (1, 4, 5, 64)"),
    "add-batch-of-two": (None, lambda x: x.cache.add_sequence(*x.kv(2, 2, 5, 64)), ValueError,
                         "k must be [H=2, S, D=64] or [1, H=2, S, D=64] (the prompt of the one sequence added); "
                         "got (2, 2, 5, 64)"),
    "add-kv-shape-mismatch": (None, lambda x: x.cache.add_sequence(x.kv(2, 5, 64)[0], x.kv(2, 6, 64)[1]),
                              ValueError, "k and v must have the same shape"),
    "add-rank-2": (None, lambda x: x.cache.add_sequence(*x.kv(5, 64)), ValueError, "k must have 4 dimensions"),
    "add-meta-device": (None, lambda x: x.cache.add_sequence(*x.kv(2, 5, 64, device="meta")), ValueError,
                        "tensors must share one device"),
    "add-cpu-prompt-for-cuda-cache": (_needs_gpu, lambda x: x.cache.add_sequence(*x.kv(2, 5, 64, device="cpu")),
                                      ValueError, "tensors must share one device"),
    "add-backend-cuda": (None, lambda x: x.cache.add_sequence(*x.kv(2, 5, 64), backend="cuda"), ValueError,
                         "backend must be one of"),
    "attend-an-empty-sequence": (_third, lambda x: x.cache.attend(x.kv(3, 2, 64)[0], backend="torch"), ValueError,
                                 "sequence 2 of the cache is empty (cache.seq_lens[2] = 0): it holds no token to "
                                 "attend"),
    "attend-q-heads-not-multiple": (None, lambda x: x.cache.attend(x.kv(2, 3, 64)[0], backend="triton"), ValueError,
                                    "q_heads (3) must be a positive multiple"),
    "attend-q-float32": (None, lambda x: x.cache.attend(x.kv(2, 2, 64, dtype=torch.float32)[0], backend="triton"),
                         TypeError, "q_dtype must be one of"),
    "attend-out-wrong-shape": (None, lambda x: x.cache.attend(x.kv(2, 2, 64)[0], out=x.kv(2, 2, 32)[0],
                                                                        backend="triton"),
                               ValueError, "out must match q"),
    "ctor-page-not-multiple-of-group": (None, lambda x: _construct(page_size=48), ValueError,
                                        "page_size must be a positive multiple of 32"),
    "ctor-page-zero": (None, lambda x: _construct(page_size=0), ValueError, "page_size must be a positive"),
    "ctor-bits-5": (None, lambda x: _construct(bits=5), ValueError, "bits must be one of (2, 3, 4)"),
    "ctor-bits-8": (None, lambda x: _construct(bits=8), ValueError, "bits must be one of (2, 3, 4)"),
    "ctor-num-pages-zero": (None, lambda x: _construct(num_pages=0), ValueError, "num_pages must be positive"),
    "ctor-num-pages-negative": (None, lambda x: _construct(num_pages=-3), ValueError,
                                "num_pages must be positive"),
    "ctor-num-pages-float": (None, lambda x: _construct(num_pages=4.0), TypeError, "num_pages must be an int"),
    "ctor-max-seqs-zero": (None, lambda x: _construct(max_seqs=0), ValueError, "max_seqs must be positive"),
    "ctor-heads-zero": (None, lambda x: _construct(heads=0), ValueError, "heads must be positive"),
    "ctor-max-pages-per-seq-zero": (None, lambda x: _construct(max_pages_per_seq=0), ValueError,
                                    "max_pages_per_seq must be positive"),
    "ctor-group-16": (None, lambda x: _construct(group_size=16), ValueError, "group_size must be one of"),
    "ctor-dtype-fp32": (None, lambda x: _construct(dtype=torch.float32), TypeError, "dtype must be one of"),
    "ctor-head-dim-96": (None, lambda x: _construct(head_dim=96), ValueError, "head_dim"),
    "ctor-tile-over-group": (None, lambda x: _construct(tile=64), ValueError,
                             "tile (64) must not exceed the group size (32)"),
    "ctor-sinks-not-whole-groups": (None, lambda x: _construct(sinks=48), ValueError,
                                    "sinks must be a non-negative multiple of group_size=32; got 48"),
    "ctor-window-negative": (None, lambda x: _construct(window=-32), ValueError,
                             "window must be a non-negative multiple of group_size=32"),
    "ctor-window-float": (None, lambda x: _construct(window=64.0), TypeError, "window must be an int"),
}


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_rejected_and_the_cache_unchanged(record, device, case):
    setup, call, exc, text = BAD[case]
    record.backend, record.device, record.variant = "triton", device, case
    x = _bad_ctx(device)
    if setup is not None:
        setup(x)
    before = _snapshot(x.cache)
    with pytest.raises((TypeError, ValueError)) as info:
        call(x)
    record.add(error_type=type(info.value).__name__, error_message=str(info.value)[:300])
    assert isinstance(info.value, exc), f"expected {exc.__name__}, got {type(info.value).__name__}: {info.value}"
    assert text in str(info.value), f"{text!r} not in {str(info.value)!r}"
    changed = _changed(before, x.cache)
    assert not changed, f"the cache changed on bad input: {changed}"
    # ... and it still works: one more token and a decode (torch: no Triton launch needed)
    x.cache.append(*x.kv(len(x.cache.sequences), 2, 64), backend="torch")
    assert x.cache.lengths() == [n + 1 for n in before["lengths"]]


# ----------------------------------------------------------------------------- 7. values the cache cannot store
# One rule for the paged cache (docs/design.md section 4): add_sequence and append never read K/V on
# the host; every value is looked at on the device, and a sequence whose tokens hold NaN or +-Inf
# (or a value whose group's scale overflows the scale dtype) stores none of that call's tokens: its
# length stays, what the decode reads at that length is unchanged, and check_errors names the call
# and the sequence. Three paths (a prompt, a chunk, one token) x where the value lies (a group the
# call completes, or the tokens the ring keeps in fp) x the value x backend.
BAD_VALUES = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "beyond-fp16-scale": 1e30}
PATHS = {
    # path: (the clean sequences' lengths before the call, the call's tokens per row, the bad row) in
    # groups G and tokens; "group": the bad value in a group the call completes, "ring": in its last
    # tokens, which the ring keeps. The chunk reaches far enough past each row's last whole group
    # that its ring rows would overwrite rows the decode attends: they wait for the verdict
    # (append._ring_waits)
    "prompt": ((1, 5), (2, 5), 1),
    "chunk": ((1, 3), (2, 4), 0),
    "token": ((1, -1), (0, 1), 0),
    "token-in-sinks": ((0, 5), (0, 1), 0),  # row 1's token at position 6, below the sinks (a group of them)
}


def _poison_one(k, v, row: int, path: str, where: str, value: float, role: str, g: int) -> None:
    """One bad value in row ``row`` of a call's k, v [n, H, T, D]: in its first completed group or among
    its last tokens."""
    x = k if role == "k" else v
    t = x.shape[2]
    pos = {"group": min(2, t - 1), "ring": t - 1}[where]
    x[row, x.shape[1] - 1, pos, 5] = value


def _not_finite_params() -> list:
    out = []
    for path in PATHS:
        for where in ("group", "ring"):
            for i, value in enumerate(BAD_VALUES):
                if value == "beyond-fp16-scale" and where == "ring":
                    continue  # a finite bf16 value: stored in fp (its group's completion is refused later)
                if path == "token-in-sinks" and where == "group":
                    continue  # its token completes no group
                role = "kv"[(i + (where == "ring")) % 2]
                out.append(pytest.param(path, where, value, role, id=f"{path}-{where}-{value}-in-{role}"))
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter casts the codes of NaN
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("path", "where", "value", "role"), _not_finite_params())
def test_values_the_cache_cannot_store_are_refused_on_the_device(record, seed, device, backend, path, where,
                                                                 value, role):
    """add_sequence (a prompt) or append (a chunk, one token) of a value that is not finite (or whose
    group's scale overflows fp16) returns without looking at it; check_errors then names the call
    and the sequence; that sequence keeps its length (0 for a prompt) and every token it held as it
    was (its export equals one-shot quantization of them, its fp sinks and window included), the
    other sequence takes its tokens; a second check passes; both grow right afterwards."""
    record.backend, record.device, record.variant = backend, device, f"{path}-{where}-{value}-in-{role}"
    size = _size(device)
    g, h, d = size.group, size.heads, size.head_dim
    dtype = torch.bfloat16 if value == "beyond-fp16-scale" else torch.float16
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=12, dtype=dtype, **_fp_tokens(size, device, "fp"))
    book = _Book(cache)
    (held_groups, held_extra), (new_groups, new_extra), bad_row = PATHS[path]
    held = held_groups * g + held_extra
    if path == "prompt":
        book.add(*_kv(gen, (h, held, d), dtype, device), backend=backend)
        k, v = _kv(gen, (1, h, new_groups * g + new_extra, d), dtype, device)
        _poison_one(k, v, 0, path, where, BAD_VALUES[value], role, g)
        sid = cache.add_sequence(k[0], v[0], backend=backend)
        book.k[sid], book.v[sid] = [k[0, :, :0]], [v[0, :, :0]]  # none of it stored
        call = "add_sequence"
    else:
        lens = [held, held + 1 if path.startswith("token") else held + g - 4]  # token: row 0 completes its group
        for n in lens:
            book.add(*_kv(gen, (h, n, d), dtype, device), backend=backend)
        t = new_groups * g + new_extra
        k, v = _kv(gen, (2, h, t, d), dtype, device)
        if where == "ring" and path.startswith("token"):
            bad_row = 1  # row 1's token stays in its partial group
        _poison_one(k, v, bad_row, path, where, BAD_VALUES[value], role, g)
        if path.startswith("token"):
            k, v = k[:, :, 0], v[:, :, 0]
        cache.append(k, v, backend=backend)
        book.took(k, v, [0 if row == bad_row else t for row in range(2)])
        sid, call = cache.sequences[bad_row], "append"
    with pytest.raises(ValueError) as info:
        cache.check_errors()
    message = str(info.value)
    record.add(error_type=type(info.value).__name__, error_message=message)
    assert message.startswith(f"{call}: sequence {sid}: k or v held NaN or Inf"), message
    assert "no page" not in message and ";" not in message, message
    cache.check_errors()  # cleared
    assert cache.lengths() == book.lengths() == cache.seq_lens[:len(cache.sequences)].tolist()
    _record_export(record, _check_export(cache, book))
    # the refused sequence grows from where it was, the other one with it
    n = len(cache.sequences)
    book.append(*_kv(gen, (n, h, g + 3, d), dtype, device), backend=backend)
    book.append(*_kv(gen, (n, h, d), dtype, device), backend=backend)
    cache.check_errors()
    _record_export(record, _check_export(cache, book))
    out = cache.attend(_q(gen, n, h, d, dtype, device), backend="torch")
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_sequence_freed_before_the_check_is_still_said(record, seed, device, backend):
    """A token with NaN refused for one sequence and an Inf in another's prompt, the first freed
    before check_errors: the message names both calls, the freed sequence as such."""
    record.backend, record.device, record.variant = backend, device, "freed-before-the-check"
    size = _size(device)
    h, d = size.heads, size.head_dim
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=8)
    first = cache.add_sequence(*_kv(gen, (h, 5, d), cache.dtype, device), backend=backend)
    cache.add_sequence(*_kv(gen, (h, 7, d), cache.dtype, device), backend=backend)
    k, v = _kv(gen, (2, h, d), cache.dtype, device)
    k[0, 0, 0] = float("nan")
    cache.append(k, v, backend=backend)
    k, v = _kv(gen, (h, 9, d), cache.dtype, device)
    v[1, 8, 3] = float("inf")
    third = cache.add_sequence(k, v, backend=backend)
    cache.free(first)
    with pytest.raises(ValueError) as info:
        cache.check_errors()
    record.add(error_type=type(info.value).__name__, error_message=str(info.value))
    assert str(info.value).startswith(f"add_sequence: sequence {third}: k or v held NaN or Inf"), str(info.value)
    assert "; append: a sequence freed since: k or v held NaN or Inf" in str(info.value), str(info.value)
    assert cache.lengths() == [0, 8]  # the third sequence moved into the freed row: 0 tokens stored
    cache.check_errors()  # cleared


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("via", ["prompt", "append-after-a-plan"])
def test_fp32_scales_beyond_fp16_show_in_check_errors(record, seed, device, backend, via):
    """fp32 scales: a completed group whose scale exceeds fp16's range (bf16 values of 1e6) shows in
    check_errors, naming fp16, then is cleared; a plan made before it never re-reads the scales
    (the fused decode takes them as fp16 operands: it would decode NaN), a new plan refuses them."""
    record.backend, record.device, record.variant = backend, device, f"fp32-scale-beyond-fp16-{via}"
    size = _size(device)
    g, h, d = size.group, size.heads, size.head_dim
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=8, dtype=torch.bfloat16, scale_dtype=torch.float32)
    k, v = _kv(gen, (h, g + 3, d), cache.dtype, device)
    if via == "prompt":
        cache.add_sequence(k * 1e6, v, backend=backend)
    else:
        cache.add_sequence(k[:, :g - 2], v[:, :g - 2], backend=backend)
        cache.add_sequence(k, v, backend=backend)
        cache.check_errors()  # fp32 scales within fp16's range: nothing to find
        cache.attend(_q(gen, 2, h, d, cache.dtype, device), backend="triton")  # the plan, kept from here on
        k, v = _kv(gen, (2, h, 4, d), cache.dtype, device)
        cache.append(k * 1e6, v, backend=backend)  # completes row 0's first group
    with pytest.raises(ValueError) as info:
        cache.check_errors()
    record.add(error_type=type(info.value).__name__, error_message=str(info.value))
    assert "fp16's range" in str(info.value) and "NaN" not in str(info.value), str(info.value)
    cache.check_errors()  # cleared
    with pytest.raises(ValueError, match="beyond what backend='triton' carries"):
        cache.plan(h)


# ----------------------------------------------------------------------------- 8. nbytes
def _round512(n: int) -> int:
    return -(-n // 512) * 512


def _tensors(cache: PagedKVCache) -> list[torch.Tensor]:
    return [t for t in vars(cache).values() if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("device", device_params())
def test_nbytes_is_the_whole_cache(record, seed, device):
    """nbytes is the sum of every tensor the cache holds; appends and decodes keep those tensors
    (same storage, same size). On a GPU: creating the cache allocates exactly those tensors
    (each rounded up to the allocator's 512 bytes); a decode step allocates the plan's two
    buffers once and nothing after, and never holds a copy of the cache even briefly."""
    record.backend, record.device, record.variant = "triton", device, "nbytes"
    size = _size(device)
    h, d, g, p = size.heads, size.head_dim, size.group, size.page
    gen = torch.Generator().manual_seed(seed)
    cuda = device == "cuda"

    def allocated() -> int:  # what the caching allocator holds for live tensors, garbage collected
        gc.collect()
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    if cuda:
        base = allocated()
    cache = _new_cache(size, device, num_pages=gpu_or_small(8, 64, device), max_seqs=4)
    if cuda:
        grown = allocated() - base
    held = _tensors(cache)
    total = sum(t.numel() * t.element_size() for t in held)
    assert cache.nbytes() == total, (cache.nbytes(), total)
    pool = sum(t.numel() * t.element_size() for t in (cache.k_words, cache.v_words, cache.k_scale,
                                                       cache.k_zero, cache.v_scale, cache.v_zero))
    assert cache.bytes_per_token() == pytest.approx(pool / (cache.num_pages * cache.page_size), rel=1e-12)
    fp = sum(t.numel() * t.element_size() for t in (cache.k_residual, cache.v_residual, cache.k_sink, cache.v_sink))
    assert cache.sequence_bytes() * cache.max_seqs == fp  # the fp sinks and ring of every row
    if cuda:
        rounded = sum(_round512(t.numel() * t.element_size()) for t in held)
        assert grown == rounded, f"creating the cache allocated {grown} bytes; its tensors take {rounded}"
    ptrs = [t.data_ptr() for t in held]
    book = _Book(cache)
    lens = [gpu_or_small(40, 8 * p + g - 10, device), gpu_or_small(70, 3000, device)]
    for n in lens:
        book.add(*_kv(gen, (h, n, d), cache.dtype, device))
    n = len(lens)
    q = _q(gen, n, 2 * h, d, cache.dtype, device)
    out = torch.empty_like(q)
    steps = gpu_or_small(2, g + 2, device)  # on a GPU: past a group, and a page for row 0
    ks, vs = _kv(gen, (steps + 1, n, h, d), cache.dtype, device)  # every step's inputs, made beforehand
    pages = cache.free_pages
    plan_bytes, peak = 0, 0
    gc.disable()  # nothing collected inside the measured steps but what they free themselves
    try:
        if cuda:
            before_plan = allocated()
        cache.append(ks[0], vs[0])  # the first step makes the plan
        cache.attend(q, out=out, backend="triton")
        if cuda:
            torch.cuda.synchronize()
            plan = cache._plan
            plan_bytes = _round512(plan.mid_o.nbytes) + _round512(plan.mid_lse.nbytes)
            first = torch.cuda.memory_allocated() - before_plan
            assert first == plan_bytes, f"the first step kept {first} bytes; the plan's buffers take {plan_bytes}"
            steady = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        for i in range(1, steps + 1):
            cache.append(ks[i], vs[i])
            if cuda:  # (a Triton decode takes a second or two in the interpreter)
                cache.attend(q, out=out, backend="triton")
        if cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - steady
            assert torch.cuda.memory_allocated() == steady, "decode steps left memory allocated"
    finally:
        gc.enable()
    if cuda:
        assert cache.free_pages < pages  # a page was taken on the way
        assert peak <= 64 * 1024, f"a decode step took {peak} bytes at its peak (a copy of the cache?)"
        record.add(created_bytes=grown, plan_bytes=plan_bytes, step_peak_bytes=peak)
    for i in range(steps + 1):
        book.took(ks[i], vs[i])
    assert [t.data_ptr() for t in _tensors(cache)] == ptrs and cache.nbytes() == total
    record.add(nbytes=total)
    _record_export(record, _check_export(cache, book))


# ----------------------------------------------------------------------------- a step does not wait
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("step", ["token", "token-new-page", "ragged-chunk"])
def test_a_step_does_not_synchronize(record, seed, device, step):
    """append ('one kernel launch and no host synchronization on a GPU') and attend with a kept
    plan, under torch.cuda.set_sync_debug_mode('error'): a token that stays in its pages, a token
    that completes a group in a new page (pages come from the pool as groups complete), and a
    ragged chunk that takes no page."""
    record.backend, record.device, record.variant = "triton", device, f"no-sync-{step}"
    if device != "cuda":
        pytest.skip("host synchronization is a GPU matter")
    size = _size(device)
    h, d, g, p = size.heads, size.head_dim, size.group, size.page
    gen = torch.Generator().manual_seed(seed)
    cache = _new_cache(size, device, num_pages=32)
    book = _Book(cache)
    for n in (p + g - 2, 3 * p + 5):  # row 0: after two tokens, the group [p, p + g) completes
        book.add(*_kv(gen, (h, n, d), cache.dtype, device))
    q = _q(gen, 2, h, d, cache.dtype, device)
    out = torch.empty_like(q)
    book.append(*_kv(gen, (2, h, d), cache.dtype, device))  # warm-up: compile, plan
    cache.attend(q, out=out)
    if step == "token":
        book.append(*_kv(gen, (2, h, d), cache.dtype, device))  # the next token stays in its page
    k, v = _kv(gen, (2, h, 4, d) if step == "ragged-chunk" else (2, h, d), cache.dtype, device)
    counts = [0, 4] if step == "ragged-chunk" else None
    pages = cache.free_pages
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):  # the mode works: a read of the device is refused
            cache.seq_lens.sum().item()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    try:
        torch.cuda.set_sync_debug_mode("error")
        try:
            cache.append(k, v, chunk_lens=counts)
            cache.attend(q, out=out)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    except RuntimeError as e:
        pytest.fail(f"a decode step synchronized the host ({step}; lengths {cache.lengths()}, "
                    f"{pages - cache.free_pages} page(s) taken): {e}")
    book.took(k, v, counts)
    assert cache.free_pages == pages - (step == "token-new-page")
    figures = _check_export(cache, book)
    figures["max_abs_err"] = _attend_checked(cache, q)["max_abs_err"]
    _record_export(record, figures)
