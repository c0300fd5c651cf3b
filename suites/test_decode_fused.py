"""Fused low-bit flash-decoding: the kernel against the float64 reference on the dequantized cache.

Every case decodes into a NaN-poisoned buffer and requires every element written; the
kernel error must stay within 2e-3 for fp16 outputs. Cases with the original K/V also
record the quantization error (attention on the original K/V) as a figure. On CPU the
Triton kernel runs in the interpreter with small shapes; on a GPU it is compiled.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from decode_support import (
    device_params,
    errors,
    poisoned_like,
    random_kv,
    random_q,
    run_checked,
    varlen_cache,
)

import kvbits
from kvbits.decode import (
    decode_attention,
    decode_view,
    paged_from_contiguous,
    paged_to_contiguous,
    reference_decode,
)

pytestmark = pytest.mark.parametrize("device", device_params())


def _cache(k, v, bits=3, group_size=64, **kw):
    return kvbits.quantize_kv(k, v, bits, group_size=group_size, backend="torch", **kw)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_seed_case(record, device, backend):
    """The project's first fused-decode case (docs/design.md section 1): B*H = 8, S = 256, D = 64, 3 bits."""
    k, v = random_kv(2, 4, 256, 64, device=device, seed=10)
    q = random_q(2, 4, 64, device=device, seed=11)
    run_checked(record, q, _cache(k, v), backend=backend, original=(k, v))


@pytest.mark.parametrize("length", [1, 63, 257, 4097])
def test_lengths(record, device, length):
    """Residual only (1, 63), whole groups plus one residual token (257, 4097: 64 tiles)."""
    k, v = random_kv(1, 1, length, 64, device=device, seed=20 + length)
    q = random_q(1, 1, 64, device=device, seed=21)
    run_checked(record, q, _cache(k, v), original=(k, v))


def test_mixed_lengths(record, device):
    """One batch, four lengths; everything past each sequence is garbage (NaN scales)."""
    lens = [1, 70, 200, 129]
    k, v = random_kv(4, 2, max(lens), 64, device=device, seed=30)
    q = random_q(4, 4, 64, device=device, seed=31)
    run_checked(record, q, varlen_cache(k, v, lens))


@pytest.mark.parametrize("ratio", [1, 4, 8])
def test_gqa(record, device, ratio):
    """Hq / Hkv = 1, 4, 8: each K/V tile serves its group of query heads."""
    hkv = 8 // ratio
    k, v = random_kv(1, hkv, 150, 64, device=device, seed=40 + ratio)
    q = random_q(1, 8, 64, device=device, seed=41)
    run_checked(record, q, _cache(k, v), original=(k, v))


def test_partial_last_group(record, device):
    """Attended lengths that end inside a quantized group (100, 150 of 192) and inside the
    residual window (196 of 200), through the seq_lens override."""
    k, v = random_kv(3, 2, 200, 64, device=device, seed=50)
    q = random_q(3, 2, 64, device=device, seed=51)
    cache = varlen_cache(k, v, [192, 192, 200])
    lens = torch.tensor([100, 150, 196], dtype=torch.int32, device=device)
    run_checked(record, q, cache, seq_lens=lens, original=(k, v))


@pytest.mark.parametrize("num_splits", [1, 3, 64])
@pytest.mark.parametrize("tile, warps", [(64, 1), (32, 2), (16, 1), (64, 4)])
def test_partial_last_tile_layouts_and_splits(record, device, tile, warps, num_splits):
    """The masked last code tile (lengths 100, 150, 129 end inside a tile of 16, 32 or 64 tokens)
    under every tile size and warp count, with one split, a few, and one tile per split (where a
    split starts on the partial tile itself)."""
    k, v = random_kv(3, 2, 200, 64, device=device, seed=52)
    q = random_q(3, 2, 64, device=device, seed=53)
    cache = varlen_cache(k, v, [192, 192, 200])
    lens = torch.tensor([100, 150, 129], dtype=torch.int32, device=device)
    run_checked(record, q, decode_view(cache, tile=tile, warps=warps), seq_lens=lens,
                num_splits=num_splits, original=(k, v))


def test_residual_only(record, device):
    """S < G: nothing quantized, the residual window alone."""
    k, v = random_kv(2, 2, 40, 64, device=device, seed=60)
    q = random_q(2, 2, 64, device=device, seed=61)
    out = run_checked(record, q, _cache(k, v), original=(k, v))
    assert float((out.double() - reference_decode(q, _cache(k, v))).abs().max()) <= 2e-3


def test_large_logits(record, device):
    """Logits near 4e3 (exp would overflow without the running max): two tokens with identical
    keys tie exactly, so the answer is the mean of their values, far from every other token."""
    s, d = 192, 64
    k, v = random_kv(1, 1, s, d, device=device, seed=70, outliers=False)
    gen = torch.Generator(device=device).manual_seed(71)
    u = torch.randn(d, generator=gen, device=device)
    u = u / u.norm()
    k = k.float()
    k[0, 0, 5] = 3.0 * u * d**0.5
    k[0, 0, 40] = k[0, 0, 5]  # same K group: identical codes, identical logits
    k = k.to(torch.float16)
    q = (u * 4000.0 / 3.0).to(torch.float16).reshape(1, 1, d)
    cache = _cache(k, v)
    out = run_checked(record, q, cache)
    ref = reference_decode(q, cache)
    logits = (q.double()[0, 0] @ kvbits.dequantize_kv(cache, dtype=torch.float32)[0][0, 0].double().T) / d**0.5
    top = logits.topk(3).values
    record.add(max_logit=float(top[0]), logit_gap=float(top[1] - top[2]))
    assert float(top[0]) > 3e3 and float(top[0] - top[1]) == 0.0 and float(top[1] - top[2]) > 100
    assert float((out.double() - ref).abs().max()) <= 2e-3


def test_large_scales_keep_the_fp16_range(record, device):
    """K and V of magnitude 6e4 (scales up to about 17000): with q = 0 every weight is 1, so the V
    operand p * s reaches the scales themselves; with |q| = 3 along token 7's key (all +-6e4),
    q * sm_scale * log2(e) * K scale reaches about 9000 per channel and token 7 wins by logits of
    order 10^5 (one-hot, no near ties). The kernel's operands only shrink with the 3-bit class
    factors, so both stay finite and within 2e-3 of the largest |V|."""
    s, d, top = 192, 64, 60000.0
    k, v = random_kv(1, 1, s, d, device=device, seed=72, outliers=False)
    gen = torch.Generator(device=device).manual_seed(73)
    signs = torch.randint(0, 2, (d,), generator=gen, device=device).float() * 2 - 1
    k = k.float() / k.float().abs().max() * top
    k[0, 0, 7] = signs * top
    k = k.to(torch.float16)
    v = (v.float() / v.float().abs().max() * top).to(torch.float16)
    cache = _cache(k, v)
    assert float(cache.v_scale.float().abs().max()) > 8192 and float(cache.k_scale.float().abs().max()) > 8192
    for q in (torch.zeros(d, device=device), 3.0 * signs):
        out = run_checked(record, q.reshape(1, 1, d).to(torch.float16), cache, tol=2e-3 * top)
    v_hat = kvbits.dequantize_kv(cache, dtype=torch.float32)[1]
    assert float((out.double() - v_hat[0, 0, 7].double()).abs().max()) <= 2e-3 * top  # token 7's value


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("magnitude", [1e-2, 1.0, 1e4])
def test_value_magnitudes(record, device, bits, magnitude):
    """V of standard deviation 1e-2 to 1e4 (3-bit V scales about 2^-6.5 to 2^13): the error stays
    within 2e-3 of the largest output, relative, at every magnitude the kernel's fp16 weights carry
    in full (decode_attention's docstring: V scales from about 2^-8 for 3 bits)."""
    k, v = random_kv(1, 2, 192, 128, device=device, seed=74)
    v = (v.float() * magnitude).to(torch.float16)
    cache = kvbits.quantize_kv(k, v, bits, backend="torch")
    q = random_q(1, 2, 128, device=device, seed=75)
    largest = float(reference_decode(q, cache).abs().max())
    run_checked(record, q, cache, tol=2e-3 * largest)


def test_one_hot_oracle(record, device):
    """Integer K and V in [-3, 4] quantize exactly (scale 1, zero 3); a query aligned with one
    key makes the softmax exactly one-hot, so the output is that token's V, bit for bit."""
    s, d, target = 128, 64, 77
    gen = torch.Generator(device=device).manual_seed(80)
    k = torch.randint(-3, 5, (1, 1, s, d), generator=gen, device=device).float()
    v = torch.randint(-3, 5, (1, 1, s, d), generator=gen, device=device).float()
    k[0, 0, :2, :] = torch.tensor([-3.0, 4.0], device=device)[:, None]  # every K group spans [-3, 4]
    v[0, 0, :, :2] = torch.tensor([-3.0, 4.0], device=device)  # every V group too (G = D)
    k[0, 0, target] = torch.where(torch.arange(d, device=device) % 2 == 0, 4.0, -3.0)
    q = torch.where(torch.arange(d, device=device) % 2 == 0, 16.0, -16.0).reshape(1, 1, d)
    k, v, q = k.half(), v.half(), q.half()
    cache = _cache(k, v)
    k_hat, v_hat = kvbits.dequantize_kv(cache, dtype=torch.float32)
    assert torch.equal(k_hat, k.float()) and torch.equal(v_hat, v.float()), "grid values must round-trip"
    out = run_checked(record, q, cache, tol=1e-6)  # the float64 reference keeps ~1e-140 tails
    assert torch.equal(out[0, 0], v[0, 0, target]), "one-hot softmax must return the target's V exactly"


def test_paged_equals_contiguous(record, device):
    """The same cache in shuffled pages of a larger pool (unused pages are garbage) gives the
    same output bit for bit; and paged -> contiguous is the inverse."""
    lens = [300, 77, 256]
    k, v = random_kv(3, 2, max(lens), 64, device=device, seed=90)
    q = random_q(3, 4, 64, device=device, seed=91)
    cache = varlen_cache(k, v, lens, poison=False)
    paged = paged_from_contiguous(cache, 128, num_pages=17, generator=torch.Generator().manual_seed(92))
    record.variant = "paged"
    out_paged = run_checked(record, q, paged)
    out_contig = decode_attention(q, cache, backend="triton")
    assert torch.equal(out_paged, out_contig)
    back = paged_to_contiguous(paged)
    for name in ("k_codes", "v_codes", "k_scale", "k_zero", "v_scale", "v_zero"):
        assert torch.equal(getattr(back, name)[:, :, : getattr(cache, name).shape[2]], getattr(cache, name)), name
    record.add(pages=paged.num_pages, page_size=paged.page_size)


@pytest.mark.parametrize("bits", [2, 4])
def test_other_bit_widths(record, device, bits):
    k, v = random_kv(1, 2, 130, 64, device=device, seed=100 + bits)
    q = random_q(1, 2, 64, device=device, seed=101)
    run_checked(record, q, _cache(k, v, bits=bits), original=(k, v))


@pytest.mark.parametrize(("bits", "dim", "group_size"), [(8, 64, 64), (3, 32, 32), (2, 256, 32)])
def test_torch_decode_reads_what_the_fused_one_refuses(record, device, bits, dim, group_size):
    """The README's width table: backend="torch" decodes any cache quantize_kv makes (8 bits, head_dim
    32, eight V groups per token) as attention over its dequantized K/V; backend="triton" refuses it."""
    record.backend, record.device, record.variant = "torch", device, f"b{bits}-d{dim}-g{group_size}"
    k, v = random_kv(2, 2, 2 * group_size + 7, dim, device=device, seed=140 + bits)
    q = random_q(2, 4, dim, device=device, seed=141)
    cache = _cache(k, v, bits=bits, group_size=group_size)
    out = decode_attention(q, cache, backend="torch")
    k_hat, v_hat = kvbits.dequantize_kv(cache, dtype=torch.float32)
    ref = kvbits.decode.attention_reference(q, k_hat, v_hat, cache.seq_lens, 1.0 / dim ** 0.5)
    err = float((out.double() - ref).abs().max())
    record.add(max_abs_err=err, tolerance=2e-3, states_checked=out.numel())
    assert err <= 2e-3
    with pytest.raises(ValueError, match="use 'torch'"):
        decode_attention(q, cache, backend="triton")


@pytest.mark.parametrize("dim, group_size", [(128, 64), (256, 128), (256, 64)])
def test_head_dims(record, device, dim, group_size):
    """D = 128 and D = 256, with G = 128 (two V scale groups per token) and G = 64 (four)."""
    k, v = random_kv(1, 1, group_size + 6, dim, device=device, seed=110 + dim)
    q = random_q(1, 2, dim, device=device, seed=111)
    run_checked(record, q, _cache(k, v, group_size=group_size), original=(k, v))


@pytest.mark.parametrize("group_size, dim", [(32, 64), (128, 128), (32, 128)])
def test_group_sizes(record, device, group_size, dim):
    """G = 32 (two V scale groups per token of D = 64, tile 32), G = 128 (one group, tile 64) and
    G = 32 of D = 128 (four groups per token, split by the threads' words of codes)."""
    k, v = random_kv(1, 1, 2 * group_size + 5, dim, device=device, seed=120 + group_size)
    q = random_q(1, 1, dim, device=device, seed=121)
    run_checked(record, q, _cache(k, v, group_size=group_size), original=(k, v))


def test_fp32_scales_and_fp32_cache(record, device):
    k, v = random_kv(1, 2, 150, 64, device=device, seed=130, dtype=torch.float32)
    q = random_q(1, 2, 64, device=device, seed=131)
    run_checked(record, q, _cache(k, v, scale_dtype=torch.float32), original=(k, v))


def test_bf16(record, device):
    k, v = random_kv(2, 1, 100, 64, device=device, seed=140, dtype=torch.bfloat16)
    q = random_q(2, 4, 64, device=device, seed=141, dtype=torch.bfloat16)
    run_checked(record, q, _cache(k, v), original=(k, v))


def test_sm_scale_and_splits(record, device):
    """An explicit sm_scale; one split, several, and more splits than tiles (empty splits)
    all agree with the reference."""
    k, v = random_kv(1, 2, 330, 64, device=device, seed=150)
    q = random_q(1, 2, 64, device=device, seed=151)
    cache = _cache(k, v)
    outs = [run_checked(record, q, cache, sm_scale=0.3, num_splits=n) for n in (1, 3, 64)]
    spread = max(errors(o, outs[0])["max_abs_err"] for o in outs)
    record.add(split_spread=spread)
    assert spread <= 2e-3


@pytest.mark.parametrize("append_backend", ["torch", "triton"])
def test_streaming_appends(record, device, append_backend):
    """Token-by-token appends across a group boundary, quantized by either backend (the Triton
    kernel writes behind torch's back): the cached decode view follows the cache."""
    k, v = random_kv(1, 1, 70, 64, device=device, seed=160)
    q = random_q(1, 1, 64, device=device, seed=161)
    cache = _cache(k[:, :, :60], v[:, :, :60])
    cache.reserve(128)  # the group completed at token 64 is written in place, not reallocated
    decode_attention(q, cache, backend="triton")  # build the cached view before the appends
    worst = 0.0
    for t in range(60, 70):
        cache.append(k[:, :, t], v[:, :, t], backend=append_backend)
        out = decode_attention(q, cache, backend="triton", out=poisoned_like(q))
        worst = max(worst, errors(out, reference_decode(q, cache))["max_abs_err"])
    record.backend, record.device = "triton", str(device)
    record.add(max_abs_err=worst, states_checked=10 * q.numel())
    assert worst <= 2e-3


@pytest.mark.parametrize("tile, warps", [(64, 4), (32, 1), (16, 1)])
def test_other_layouts(record, device, tile, warps):
    """Arrangements for other tile sizes and warp counts compute the same attention."""
    k, v = random_kv(1, 2, 100, 64, device=device, seed=170)
    q = random_q(1, 4, 64, device=device, seed=171)
    cache = _cache(k, v)
    run_checked(record, q, decode_view(cache, tile=tile, warps=warps))


@pytest.mark.parametrize("dim, group_size, tile, warps", [
    (64, 32, 16, 1), (128, 64, 16, 2), (64, 32, 32, 2),  # two V groups, one group of codes per thread
    (128, 32, 32, 4),  # four V groups from one group per thread: split by register bits r3 and r2
    (128, 32, 16, 1),  # four from two groups per thread: split by word, then by r3
    (256, 64, 64, 4),  # four from four groups per thread: split by word
])
def test_v_groups_split_by_words_and_registers(record, device, dim, group_size, tile, warps):
    """Arrangements in which a thread's code words of a V tile span two or four V scale groups:
    the kernel splits them between the channel groups as whole words where a thread holds enough
    of them, and within a group's registers where it does not."""
    k, v = random_kv(1, 2, 2 * group_size + 7, dim, device=device, seed=175 + tile + warps)
    q = random_q(1, 2, dim, device=device, seed=176)
    cache = _cache(k, v, group_size=group_size)
    run_checked(record, q, decode_view(cache, tile=tile, warps=warps), original=(k, v))


def test_strided_q_and_out(record, device):
    """q and out that are views with a non-unit stride along D give the contiguous result."""
    k, v = random_kv(1, 2, 100, 64, device=device, seed=180)
    cache = _cache(k, v)
    q = random_q(1, 4, 64, device=device, seed=181)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, Hq, D] with stride 1 along Hq
    assert not q_strided.is_contiguous()
    out_storage = torch.full((1, 64, 4), float("nan"), dtype=q.dtype, device=device)
    out_strided = out_storage.transpose(1, 2)
    expected = decode_attention(q, cache, backend="triton")
    got = decode_attention(q_strided, cache, backend="triton", out=out_strided)
    assert got is out_strided
    record.backend, record.device = "triton", str(device)
    record.add(max_abs_err=float((got.float() - expected.float()).abs().max()), states_checked=q.numel())
    assert torch.equal(got, expected)


def _shifted(t: torch.Tensor) -> torch.Tensor:
    """t's values in a tensor of the same shape and strides that starts 2 bytes past a 4-byte boundary."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    shifted = storage[1:].view(t.shape)
    shifted.copy_(t)
    return shifted


@pytest.mark.parametrize("moved", [None, "k_scale", "v_zero"])
def test_scale_words_and_the_16_bit_fallback(record, device, moved):
    """The kernel loads its 16-bit scales and zeros as 32-bit words (two K channels, a token's two V
    groups) where every row is 4-byte aligned; a cache whose scales start mid-word takes the
    16-bit loads. Both match the reference and each other."""
    from kvbits.decode import launch as decode

    k, v = random_kv(1, 2, 300, 128, device=device, seed=190)
    q = random_q(1, 4, 128, device=device, seed=191)
    aligned = _cache(k, v)
    cache = aligned
    if moved is not None:
        cache = dataclasses.replace(aligned, **{moved: _shifted(getattr(aligned, moved))})
    assert decode.scale_words(decode_view(cache)) is (moved is None)
    out = run_checked(record, q, cache, original=(k, v), variant=f"scale-words-{moved or 'aligned'}")
    if moved is not None:
        expected = decode_attention(q, aligned, backend="triton")
        assert float((out.float() - expected.float()).abs().max()) <= 1e-3


def test_scale_words_needs_16_bit_pairs(record, device):
    """fp32 scales, one V group per token, or zeros with other strides than their scales keep the
    16-bit (or 32-bit) loads."""
    from kvbits.decode import launch as decode

    k, v = random_kv(1, 1, 128, 128, device=device, seed=192)
    record.backend, record.device = "triton", str(device)
    assert decode.scale_words(decode_view(_cache(k, v)))
    assert not decode.scale_words(decode_view(_cache(k, v, scale_dtype=torch.float32)))
    assert not decode.scale_words(decode_view(_cache(k, v, group_size=128)))
    cache = _cache(k, v)
    wide = torch.zeros(*cache.v_zero.shape[:-1], 4, dtype=cache.v_zero.dtype, device=cache.v_zero.device)
    wide[..., :2] = cache.v_zero
    assert not decode.scale_words(decode_view(dataclasses.replace(cache, v_zero=wide[..., :2])))
    record.add(states_checked=4)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_empty_batch(record, device, backend):
    """A batch of no sequences gives an empty output on both backends (no launch, no error)."""
    cache = kvbits.QuantizedKV.empty(0, 2, 64, capacity=64, device=device)
    out = decode_attention(torch.zeros(0, 4, 64, dtype=torch.float16, device=device), cache, backend=backend)
    assert out.shape == (0, 4, 64) and out.dtype == torch.float16
    record.backend, record.device = backend, device
    record.add(states_checked=0)
