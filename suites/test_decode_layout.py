"""The decode cache layouts: the tile word arrangement and the paged pool are bijections with
the canonical format, each thread's words are its own tensor-core fragment, and the cached
decode view follows its cache."""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl
from decode_support import device_params, random_kv, varlen_cache

import kvbits
from kvbits._runtime import triton_interpreted
from kvbits.decode import layout, paged
from kvbits.decode.kernel import _q_operand, _three_bit_pairs, _weight_operand
from kvbits.packing import unpack_bits


def _served(d: int, tile: int, warps: int) -> bool:
    return tile >= 8 * warps and 1 <= d * tile // (1024 * warps) <= 8


# every bit width and head dim with the layouts the kernel picks; the other layouts at 3 bits
LAYOUTS = sorted({
    (bits, d, *layout.default_layout(d, g))
    for bits, d, g in itertools.product((2, 3, 4), layout.DECODE_HEAD_DIMS, (32, 64, 128)) if d % g == 0
} | {
    (3, d, tile, warps)
    for d, tile, warps in itertools.product(layout.DECODE_HEAD_DIMS, layout.TILES, layout.WARPS)
    if _served(d, tile, warps)
})


def _record(record, **metrics):
    record.backend, record.device, record.variant = "torch", "cpu", "layout"
    record.add(**metrics)


@pytest.mark.parametrize("bits, classes", [(2, 2), (3, 2), (3, 3), (4, 2)])
def test_bit_table_is_a_bijection(record, bits, classes):
    """Every (value, bit) of a 32-value group sits in exactly one (plane, position), and both
    values of a register pair sit at the same offset of the two 16-bit halves (3 bits: with two
    and with three classes of codes)."""
    table = layout.decode_bit_table(bits, classes)
    assert sorted(table) == [(n, i) for n in range(32) for i in range(bits)]
    where = {entry: slot for slot, entry in enumerate(table)}
    for n in range(0, 32, 2):
        for i in range(bits):
            lo, hi = where[(n, i)], where[(n + 1, i)]
            assert lo // 32 == hi // 32 and hi % 32 == lo % 32 + 16
    _record(record, states_checked=bits * 32, bit_errors=0)


@pytest.mark.parametrize("classes", [2, 3])
def test_three_bit_classes(record, classes):
    """The kernel's 3-bit classes: the pairs it takes at bits 0-2 (code * 2^-24 as fp16), 3-5
    (code * 2^-21) and, with three classes, 6-8 (code * 2^-18), with nothing else in their words,
    are the values of their class: bit 1 of the index in the group, or 2 where bits 2 and 3 are
    set too (three classes); random words and every single bit."""
    gen = torch.Generator().manual_seed(303)
    words = torch.randint(0, 2**32, (3, 4096), dtype=torch.int64, generator=gen)
    probes = torch.zeros(3, 96, dtype=torch.int64)
    for plane in range(3):
        probes[plane, plane * 32:(plane + 1) * 32] = 1 << torch.arange(32)
    counts = [0, 0, 0]
    for w in (words, probes):
        evens, odds = layout.three_bit_classes(*w, classes)
        values = layout.unpack_group(list(w), 3, classes).reshape(-1, 16, 2)  # [X, register, half]
        for r in range(16):  # register r: bit 0 of r picks the list, bits 3..1 the _join8 position
            k = (r >> 3 & 1) | (r >> 2 & 1) << 1 | (r >> 1 & 1) << 2
            reg, cls = (odds if r & 1 else evens)[k]
            want = 2 if classes == 3 and (r >> 1) & 3 == 3 else r & 1
            assert cls == want, (r, cls, want)
            counts[cls] += w is words
            assert not bool((reg & ~layout.THREE_BIT_FIELDS[cls]).any())
            assert torch.equal(values[:, r, 0], (reg >> 3 * cls) & 0xFFFF)
            assert torch.equal(values[:, r, 1], reg >> (16 + 3 * cls))
    assert counts == ([8, 8, 0] if classes == 2 else [6, 6, 4])
    _record(record, states_checked=(4096 + 96) * 32, bit_errors=0)


@triton.jit
def _three_bit_pairs_probe(w_ptr, out_ptr, N: tl.constexpr, CLASSES: tl.constexpr):
    """The kernel's 3-bit pair extraction on N word triples: int32 [3, N] -> int32 [N, 16]."""
    i = tl.arange(0, N)
    w0 = tl.load(w_ptr + i).to(tl.uint32, bitcast=True)
    w1 = tl.load(w_ptr + N + i).to(tl.uint32, bitcast=True)
    w2 = tl.load(w_ptr + 2 * N + i).to(tl.uint32, bitcast=True)
    pairs = tl.reshape(_three_bit_pairs(w0, w1, w2, CLASSES), [N, 16])
    tl.store(out_ptr + i[:, None] * 16 + tl.arange(0, 16)[None, :], pairs.to(tl.int32, bitcast=True))


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("device", device_params())
def test_kernel_three_bit_pairs_match_the_twin(record, device, classes):
    """The kernel's _three_bit_pairs (compiled on a GPU, interpreted on CPU) returns, word for word,
    the registers of kvbits.decode.layout.three_bit_classes in the twin's join order (each at its class's
    field): random words and every single bit of the three planes, with two and three classes."""
    gen = torch.Generator().manual_seed(304)
    n = 256
    words = torch.randint(-2**31, 2**31, (3, n), dtype=torch.int64, generator=gen)
    for plane in range(3):
        words[plane, :96] = 0
        words[plane, plane * 32:(plane + 1) * 32] = 1 << torch.arange(32)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    out = torch.full((n, 16), -1, dtype=torch.int32, device=device)
    _three_bit_pairs_probe[(1,)](words.to(device), out, N=n, CLASSES=classes)
    evens, odds = layout.three_bit_classes(*(words.to(torch.int64) & 0xFFFFFFFF), classes)
    want = layout._join(layout._join8([r for r, _ in evens]), layout._join8([r for r, _ in odds])).reshape(n, 16)
    want = torch.where(want >= 2**31, want - 2**32, want).to(torch.int32)
    errors = int((out.cpu() != want).sum())
    record.backend, record.device, record.variant = "triton", device, "layout"
    record.add(states_checked=n * 96, bit_errors=errors)
    assert errors == 0


@triton.jit
def _weight_operand_probe(w_ptr, out_ptr, T: tl.constexpr, HALF: tl.constexpr, VCOLS: tl.constexpr,
                          INTERPRET: tl.constexpr):
    """The kernel's _weight_operand on fp32 [T, HALF] weights -> fp16 [T, VCOLS]."""
    w = tl.load(w_ptr + tl.arange(0, T)[:, None] * HALF + tl.arange(0, HALF)[None, :])
    ps = _weight_operand(w, T, HALF, VCOLS, INTERPRET)
    tl.store(out_ptr + tl.arange(0, T)[:, None] * VCOLS + tl.arange(0, VCOLS)[None, :], ps)


@pytest.mark.parametrize("tile, half, vcols", [(64, 4, 8), (64, 8, 8), (32, 4, 8), (16, 8, 16), (64, 16, 16)])
@pytest.mark.parametrize("device", device_params())
def test_kernel_weight_operand(record, device, tile, half, vcols):
    """The V product's B operand (_weight_operand, compiled on a GPU, interpreted on CPU): row k
    holds token kernel_token_order(tile)[k], column n head slot n // (vcols / half), each weight
    rounded once to fp16 (round to nearest even), bit for bit; weights spread over six decades."""
    gen = torch.Generator().manual_seed(305)
    w = torch.randn(tile, half, generator=gen) * 10.0 ** torch.randint(-4, 2, (tile, half), generator=gen)
    out = torch.full((tile, vcols), float("nan"), dtype=torch.float16, device=device)
    _weight_operand_probe[(1,)](w.to(device), out, T=tile, HALF=half, VCOLS=vcols, INTERPRET=triton_interpreted())
    want = w.half()[layout.kernel_token_order(tile)][:, torch.arange(vcols) // (vcols // half)]
    errors = int((out.cpu().view(torch.int16) != want.view(torch.int16)).sum())
    record.backend, record.device, record.variant = "triton", device, "layout"
    record.add(states_checked=tile * vcols, bit_errors=errors)
    assert errors == 0


@triton.jit
def _q_operand_probe(x_ptr, out_ptr, D: tl.constexpr, HALF: tl.constexpr, INTERPRET: tl.constexpr):
    """The kernel's _q_operand on fp32 q*s [D, 1] -> fp16 [D, 2 HALF]."""
    x = tl.reshape(tl.load(x_ptr + tl.arange(0, D)), [D, 1])
    qs = _q_operand(x, HALF, D, INTERPRET)
    tl.store(out_ptr + tl.arange(0, D)[:, None] * (2 * HALF) + tl.arange(0, 2 * HALF)[None, :], qs)


@pytest.mark.parametrize("d, half", [(128, 4), (64, 4), (256, 8), (128, 8)])
@pytest.mark.parametrize("device", device_params())
def test_kernel_q_operand(record, device, d, half):
    """The K product's B operand for one query head (_q_operand, compiled on a GPU, interpreted on
    CPU): every even column holds hi = fl16(q*s), every odd one lo = fl16(q*s - hi), bit for bit."""
    gen = torch.Generator().manual_seed(306)
    x = torch.randn(d, generator=gen) * 10.0 ** torch.randint(-3, 2, (d,), generator=gen)
    out = torch.full((d, 2 * half), float("nan"), dtype=torch.float16, device=device)
    _q_operand_probe[(1,)](x.to(device), out, D=d, HALF=half, INTERPRET=triton_interpreted())
    hi = x.half()
    lo = (x - hi.float()).half()
    want = torch.stack([hi, lo], 1).repeat(1, half)
    errors = int((out.cpu().view(torch.int16) != want.view(torch.int16)).sum())
    record.backend, record.device, record.variant = "triton", device, "layout"
    record.add(states_checked=d * 2 * half, bit_errors=errors)
    assert errors == 0


@pytest.mark.parametrize("bits, d, tile, warps", LAYOUTS, ids=[f"b{b}-d{d}-t{t}w{w}" for b, d, t, w in LAYOUTS])
def test_tile_arrangement_round_trip(record, bits, d, tile, warps):
    """codes -> words -> codes and words -> codes -> words are identities (random data, all
    layouts), and the kernel twin unpacks each tile to the canonical values."""
    gen = torch.Generator().manual_seed(bits * 1000 + d + tile + warps)
    codes = torch.randint(0, 256, (2, 3, 2 * tile, d * bits // 8), dtype=torch.uint8, generator=gen)
    values = unpack_bits(codes, bits)
    errors = 0
    for role in ("k", "v"):
        words = layout.words_from_codes(codes, bits, role, tile, warps)
        assert words.shape == (2, 3, 2, tile * d * bits // 32)
        errors += int((layout.codes_from_words(words, bits, role, d, tile, warps) != codes).sum())
        tiles = layout.unpack_tile(words, bits, role, d, tile, warps)
        want = values.reshape(2, 3, 2, tile, d)
        errors += int((tiles != (want if role == "k" else want.transpose(-1, -2))).sum())
        noise = torch.randint(-2**31, 2**31 - 1, words.shape, dtype=torch.int64, generator=gen).to(torch.int32)
        back = layout.words_from_codes(layout.codes_from_words(noise, bits, role, d, tile, warps), bits, role,
                                      tile, warps)
        errors += int((back != noise).sum())
    _record(record, states_checked=4 * codes.numel() * 8, bit_errors=errors)
    assert errors == 0


@pytest.mark.parametrize("d, tile, warps", [(128, 64, 4), (64, 32, 2), (128, 16, 1), (256, 64, 4)])
def test_threads_hold_their_mma_fragments(record, d, tile, warps):
    """Thread T's values are exactly the m16n8k16 B-operand fragment it holds with warps along N:
    lanes carry (k2, k3, n0, n1, n2), warps n3 n4..., registers every other bit."""
    for role in ("k", "v"):
        n, k = layout.tile_shape(role, d, tile)
        threads = 32 * warps
        per = n * k // threads
        # tag every value with its thread: the word arrangement of a tile whose value is T
        owner = torch.arange(threads).repeat_interleave(per).reshape(threads, per)
        placed = layout._place(owner, n, k, warps)  # [N, K] -> owning thread
        rows = torch.arange(n)[:, None]
        cols = torch.arange(k)[None, :]
        lane = ((cols >> 2) & 3) | ((rows & 7) << 2)
        warp = (rows >> 3) & (warps - 1)
        assert torch.equal(placed, lane + 32 * warp), role
    _record(record, states_checked=2 * d * tile, bit_errors=0)


@pytest.mark.parametrize("bits, d, tile, warps", LAYOUTS, ids=[f"b{b}-d{d}-t{t}w{w}" for b, d, t, w in LAYOUTS])
def test_thread_words_lie_in_runs(record, bits, d, tile, warps):
    """A thread's words of one plane are consecutive runs of run_length words, in the order of its
    groups: with every value of thread t's group f set to all ones and the rest zero, the tile's
    words are all ones exactly at [plane, f // run, t, f % run] of every plane and zero elsewhere
    (every bit of a word is a value bit)."""
    threads = 32 * warps
    checked = 0
    for role in ("k", "v"):
        n, k = layout.tile_shape(role, d, tile)
        per = n * k // threads
        nrg = layout.groups_per_thread(n, k, warps)
        run = layout.run_length(nrg)
        assert run == min(nrg, 4)  # 16-byte accesses
        owner, group = (layout.natural_from_held(layout._place(x.reshape(threads, per), n, k, warps), role) for x in (
            torch.arange(threads).repeat_interleave(per), torch.arange(per).repeat(threads) // 32))
        slot = torch.arange(bits * nrg * threads)  # [plane, run, thread, word]
        slot_owner, slot_group = (slot // run) % threads, (slot // (run * threads)) % (nrg // run) * run + slot % run
        for t in sorted({0, 1, 5, threads - 1}):
            for f in range(nrg):
                codes = torch.where((owner == t) & (group == f), (1 << bits) - 1, 0).to(torch.uint8)
                words = layout.pack_tile(codes, bits, role, d, tile, warps)
                want = torch.where((slot_owner == t) & (slot_group == f), -1, 0).to(torch.int32)
                assert torch.equal(words, want), (role, t, f)
                checked += words.numel()
    _record(record, states_checked=checked * 32, bit_errors=0)


@pytest.mark.parametrize("tile", layout.TILES)
def test_v_token_order(record, tile):
    """At the V product's reduction index k the kernel reads token kernel_token_order(tile)[k]: a
    permutation inside each 16 tokens under which lane c's indices k = 4c .. 4c + 3 (of each 16)
    hold tokens 2c, 2c + 1 of each 8, each register's two halves (k, k + 1) tokens t and t + 8
    (one thread's two rows of the logits' accumulator); the packed V tile holds its codes in that
    order."""
    order = layout.kernel_token_order(tile)
    errors = int((order.sort().values != torch.arange(tile)).sum())
    errors += int(((order >> 4) != (torch.arange(tile) >> 4)).sum())
    for block, c in itertools.product(range(tile // 16), range(4)):
        k = 16 * block + 4 * c + torch.arange(4)
        held = {16 * block + 8 * j + 2 * c + p for j in range(2) for p in range(2)}
        errors += len(set(order[k].tolist()) ^ held)
        errors += int((order[k[1::2]] != order[k[0::2]] + 8).sum())
    # the stored V tile follows the order: as the kernel holds it (before unpack_tile puts the
    # tokens back in order), column k of the words' values is token order[k]
    codes = torch.randint(0, 8, (2, 128, tile), dtype=torch.uint8)
    words = layout.pack_tile(codes, 3, "v", 128, tile, 1)
    errors += int((layout.held_tile(words, 3, "v", 128, tile, 1) != codes[:, :, order]).sum())
    errors += int((layout.unpack_tile(words, 3, "v", 128, tile, 1) != codes).sum())
    _record(record, states_checked=tile, bit_errors=errors)
    assert errors == 0


def test_paged_round_trip(record):
    """Contiguous -> shuffled pages in a larger pool -> contiguous gives back every tensor."""
    lens = [300, 77, 5]
    k, v = random_kv(3, 2, max(lens), 64, seed=200)
    cache = varlen_cache(k, v, lens, poison=False)
    pool = paged.paged_from_contiguous(cache, 128, num_pages=11, generator=torch.Generator().manual_seed(201))
    assert pool.block_table.unique().numel() == pool.block_table.numel()
    back = paged.paged_to_contiguous(pool)
    for name in ("k_codes", "v_codes", "k_scale", "k_zero", "v_scale", "v_zero", "k_residual", "v_residual",
                 "seq_lens"):
        ours, theirs = getattr(back, name), getattr(cache, name)
        assert torch.equal(ours[:, :, : theirs.shape[2]] if ours.dim() > 1 else ours, theirs), name
    _record(record, states_checked=cache.nbytes(), bit_errors=0, pages=pool.num_pages)


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("inference", [False, True], ids=["grad-mode", "inference-mode"])
def test_decode_follows_a_contiguous_cache_as_it_grows(record, device, inference):
    """Nothing is cached between calls: after an append inside the residual window, one that
    completes a group and a capacity change, each decode equals the reference over the cache as
    it is then, also for tensors made under torch.inference_mode (no version counters); each
    decode_view is a new arrangement of the codes as they are."""
    k, v = random_kv(1, 2, 140, 64, seed=210, device=device)
    q = torch.randn(1, 2, 64, generator=torch.Generator().manual_seed(212)).half().to(device)
    errors = []
    with torch.inference_mode(inference):
        cache = kvbits.quantize_kv(k[:, :, :100], v[:, :, :100], 3, backend="torch", capacity=128)
        first = paged.decode_view(cache)
        for grow in (lambda: cache.append(k[:, :, 100], v[:, :, 100], backend="torch"),  # residual window
                     lambda: cache.append(k[:, :, 101:130], v[:, :, 101:130], backend="torch"),  # completes a group
                     lambda: cache.reserve(512),
                     lambda: cache.append(k[:, :, 130:140], v[:, :, 130:140], backend="torch")):
            grow()
            out = kvbits.decode_attention(q, cache, backend="triton")
            errors.append(float((out.double() - kvbits.decode.reference_decode(q, cache)).abs().max()))
        view = paged.decode_view(cache)
    assert view is not first and view.page_size == 512
    want = layout.words_from_codes(cache.k_codes, 3, "k", view.tile, view.warps)
    assert torch.equal(view.k_words.reshape(want.shape), want)
    assert max(errors) <= 2e-3, errors
    record.backend, record.device, record.variant = "triton", device, "layout"
    record.add(states_checked=len(errors) * out.numel(), max_abs_err=max(errors))


@pytest.mark.parametrize("device", device_params())
def test_view_takes_the_caches_residual_window_as_it_is_now(record, device):
    """A decode takes the residual tensors the cache holds now, also when they were replaced by new
    tensors after a view of the cache was made."""
    k, v = random_kv(1, 1, 100, 64, seed=213, device=device)
    cache = kvbits.quantize_kv(k, v, 3, backend="torch")
    paged.decode_view(cache)
    cache.k_residual = torch.randn_like(cache.k_residual)
    cache.v_residual = torch.randn_like(cache.v_residual)
    q = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(214)).half().to(device)
    out = kvbits.decode_attention(q, cache, backend="triton")
    err = float((out.double() - kvbits.decode.reference_decode(q, cache)).abs().max())
    assert err <= 2e-3
    record.backend, record.device, record.variant = "triton", device, "layout"
    record.add(states_checked=out.numel(), max_abs_err=err)


def test_a_layout_given_in_part_keeps_what_was_given(record):
    """tile or warps alone: the one given is kept, the other is the default's."""
    k, v = random_kv(1, 1, 128, 128, seed=215)
    cache = kvbits.quantize_kv(k, v, 3, backend="torch")
    default_tile, _ = layout.default_layout(128, 64)
    view = paged.decode_view(cache, warps=2)
    assert (view.tile, view.warps) == (default_tile, 2)
    pool = paged.paged_from_contiguous(cache, 64, tile=32)
    assert pool.tile == 32
    _record(record, states_checked=2, bit_errors=0)


def test_read_bytes(record):
    """The bytes a decode step must read: codes, scales and zeros of quantized tokens, residual rows."""
    k, v = random_kv(2, 4, 200, 128, seed=220)
    cache = kvbits.quantize_kv(k, v, 3, backend="torch")
    view = paged.decode_view(cache)
    per_token = 4 * (2 * 128 * 3 / 8 + 4 * 2 * 2)  # heads * (K+V codes + K and V scale, zero)
    want = 2 * (192 * per_token + 8 * 4 * 2 * 128 * 2)
    assert view.read_bytes() == int(want)
    _record(record, states_checked=1, bytes=view.read_bytes())


@pytest.mark.parametrize("d, g", [(d, g) for d, g in itertools.product(layout.DECODE_HEAD_DIMS, (32, 64, 128))
                                  if d % g == 0])
def test_default_layout_takes_the_fewest_warps_that_fit(record, d, g):
    """The kernel's layout: the largest tile inside one K scale group (at most DEFAULT_TILE), on
    the fewest warps from DEFAULT_WARPS up that hold its fragments (D = 256 needs two warps for
    64 tokens), and never fewer warps than a smaller DEFAULT_WARPS setting would give."""
    tile, warps = layout.default_layout(d, g)
    assert tile == min(layout.DEFAULT_TILE, g)
    layout.check_arrangement(d, tile, warps)
    assert warps >= layout.DEFAULT_WARPS
    for fewer in (w for w in layout.WARPS if layout.DEFAULT_WARPS <= w < warps):
        with pytest.raises(ValueError):
            layout.check_arrangement(d, tile, fewer)
    _record(record, states_checked=1, layout=f"t{tile}w{warps}")


def test_default_warps_is_a_floor(record, monkeypatch):
    """Raising DEFAULT_WARPS (as the GPU sweep does) moves every default layout up to it."""
    monkeypatch.setattr(layout, "DEFAULT_WARPS", 2)
    assert layout.default_layout(128, 64) == (64, 2)
    assert layout.default_layout(256, 128) == (64, 2)
    monkeypatch.setattr(layout, "DEFAULT_WARPS", 1)
    assert layout.default_layout(128, 64) == (64, 1)
    assert layout.default_layout(64, 32) == (32, 1)
    _record(record, states_checked=4)
