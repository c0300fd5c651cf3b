"""Affine quantization: requantizing a dequantized code gives the code back, torch == Triton bit
for bit, reconstruction bound.

Round trip: for every code q, every bit width and both scale dtypes, with the
scale and zero point of real groups (random, tiny, huge, constant, offset,
outlier; (64, 128) tiles), ``clamp(round((q - z) * s / s + z), 0, 2^b - 1) == q``.
"""

from __future__ import annotations

import math

import pytest
import torch
from affine_support import (
    cache_mismatches,
    device_backends,
    elements,
    fresh_seed,  # noqa: F401  (the seed fixture)
    gpu_or_small,
    make_values,
    poison,
    quantize,
    random_kv,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import kvbits
from kvbits.affine import (
    SCALE_FLOOR,
    ZERO_SPAN,
    QuantizeTile,
    _launch_quantize,
    affine_params,
    check_tile,
    default_tile,
    dequantize_codes,
    quantize_codes,
    quantize_dequantize,
)
from kvbits.kv_cache import QuantizedKV, quantize_into

BITS = (2, 3, 4, 8)
SCALE_DTYPES = (torch.float16, torch.float32)
KINDS = ("randn", "outliers", "offset", "tiny", "huge", "constant", "zeros")


def _sdt_id(sdt):
    return str(sdt).replace("torch.", "")


def _tile_params(kind: str, bits: int, sdt: torch.dtype, per_channel: bool):
    """Scale and zero of every group of one (64, 128) tile (fp32 input), from the reference."""
    dtype = torch.float32 if sdt == torch.float32 else torch.float16
    g = torch.Generator().manual_seed(1000 * bits + len(kind))
    x = make_values(kind, (64, 128), dtype, "cpu", g).float()
    xg = x.reshape(1, 64, 128) if per_channel else x.reshape(64, 2, 64)
    dim = 1 if per_channel else 2
    scale, zero, inv = affine_params(xg.amin(dim, keepdim=True), xg.amax(dim, keepdim=True), bits, sdt)
    return scale.flatten(), zero.flatten(), inv.flatten()


@pytest.mark.parametrize("per_channel", [True, False], ids=["k-per-channel", "v-per-token"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sdt", SCALE_DTYPES, ids=_sdt_id)
@pytest.mark.parametrize("bits", BITS)
def test_requant_of_dequant_is_identity(record, bits, sdt, kind, per_channel):
    """requant(dequant(q)) == q for every code q on the groups of a (64, 128) tile, with finite,
    positive scales exact in the scale dtype and integer zeros: no NaN, no division by zero."""
    scale, zero, inv = _tile_params(kind, bits, sdt, per_channel)
    assert bool(torch.isfinite(scale).all()) and bool((scale > 0).all())
    assert torch.equal(scale.to(sdt).float(), scale), "scales must be exact in the scale dtype"
    # an integer within ZERO_SPAN, exact in the scale dtype (a plain min-max range may put it outside the codes)
    assert torch.equal(zero.round(), zero) and bool((zero.abs() <= ZERO_SPAN[bits]).all())
    assert torch.equal(zero.to(sdt).float(), zero)
    q = torch.arange(2**bits, dtype=torch.float32)[:, None].expand(-1, scale.numel())
    x_hat = dequantize_codes(q, scale, zero)
    seed_formula = torch.clamp(torch.round(x_hat / scale + zero), 0, 2**bits - 1)
    kernel_formula = quantize_codes(x_hat, scale, zero, inv, bits).float()
    bad = int((seed_formula != q).sum()) + int((kernel_formula != q).sum())
    record.backend, record.variant, record.device = "torch", f"b{bits}-{_sdt_id(sdt)}-{kind}", "cpu"
    record.add(states_checked=2 * q.numel(), bit_errors=bad, shape="64x128")
    assert bad == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=_sdt_id)
@pytest.mark.parametrize("bits", BITS)
def test_requant_through_dequantize_kv(record, seed, bits, dtype):
    """Dequantize a real cache to the input dtype, requantize with its own s and z: same codes.

    bf16 keeps 8 significant bits, so (q - z) * s is exact enough only for b <= 4."""
    if dtype == torch.bfloat16 and bits == 8:
        pytest.skip("bf16 x_hat cannot hold 8-bit codes exactly (8 significant bits)")
    k, v = random_kv((2, 2, 128, 64), dtype, "cpu", seed=seed)
    qkv = quantize(k, v, bits, 32, "torch")
    k_hat, v_hat = kvbits.dequantize_kv(qkv)
    assert k_hat.dtype == dtype and k_hat.shape == k.shape
    q_k = kvbits.unpack_bits(qkv.k_codes, bits).reshape(2, 2, 4, 32, 64)
    q_v = kvbits.unpack_bits(qkv.v_codes, bits).reshape(2, 2, 128, 2, 32)
    ks, kz = qkv.k_scale.float()[:, :, :, None], qkv.k_zero.float()[:, :, :, None]
    vs, vz = qkv.v_scale.float()[..., None], qkv.v_zero.float()[..., None]
    rk = quantize_codes(k_hat.float().reshape(q_k.shape), ks, kz, 1 / ks, bits)
    rv = quantize_codes(v_hat.float().reshape(q_v.shape), vs, vz, 1 / vs, bits)
    bad = int((rk != q_k).sum()) + int((rv != q_v).sum())
    record.backend, record.variant, record.device = "torch", f"b{bits}-{_sdt_id(dtype)}", "cpu"
    record.add(states_checked=q_k.numel() + q_v.numel(), bit_errors=bad)
    assert bad == 0


@pytest.mark.parametrize(("device", "backend"), device_backends())
@pytest.mark.parametrize("kind", ["randn", "outliers", "offset", "tiny", "huge", "constant", "zeros"])
def test_kinds_of_groups_reconstruct(record, seed, device, backend, kind):
    """Random, outlier, offset, tiny, huge and constant groups: finite params, error <= s/2."""
    dtype = torch.float32 if kind == "huge" else torch.float16
    sdt = torch.float32 if kind == "huge" else torch.float16
    k, v = random_kv((1, 2, 64 + 7, 64), dtype, device, seed=seed, kind=kind)
    qkv = quantize(k, v, 3, 32, backend, scale_dtype=sdt)
    k_hat, v_hat = kvbits.dequantize_kv(qkv, dtype=torch.float32)
    worst, worst_to_bound = 0.0, 0.0
    n = int(qkv.quantized_lens()[0])
    for x, x_hat, scale, per_channel in ((k, k_hat, qkv.k_scale, True), (v, v_hat, qkv.v_scale, False)):
        s = scale.float().repeat_interleave(32, dim=2 if per_channel else 3)[:, :, :n]
        err = (x[:, :, :n].float() - x_hat[:, :, :n]).abs()
        slack = x[:, :, :n].float().abs() * 2.0**-21
        assert bool(torch.isfinite(x_hat).all())
        assert bool((err <= s / 2 + slack).all()), f"max excess {(err - s / 2).max().item()}"
        assert torch.equal(x_hat[:, :, n:], x[:, :, n:].float()), "residual tokens must be kept exactly"
        worst = max(worst, float(err.max()))
        worst_to_bound = max(worst_to_bound, float((err / (s / 2 + slack)).max()))
        if kind in ("constant", "zeros") and sdt == torch.float16:
            assert torch.equal(x_hat[:, :, :n], x[:, :, :n].float()), "constant groups reconstruct exactly"
    record.backend, record.variant, record.device = backend, kind, device
    record.add(max_abs_err=worst, states_checked=2 * k.numel(), err_to_tol=worst_to_bound)


SHAPES = [
    # (B, H, S, D, G): aligned, residual tails, one group, D = 3 G, a single token
    (1, 2, 64, 64, 32),
    (2, 3, 64 + 5, 64, 32),
    (1, 1, 128 + 63, 128, 64),
    (2, 1, 96, 96, 32),
    (1, 2, 128, 256, 128),
    (1, 1, 1, 64, 64),
]


@pytest.mark.parametrize(("device", "backend"), [p for p in device_backends() if "triton" in p.id])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bits", BITS)
def test_triton_matches_torch_bit_for_bit(record, seed, device, backend, bits, shape):
    """The Triton kernel writes exactly the reference's codes, scales and zeros (bytes compared: an
    all-positive group's zero point is +0.0 in both, never -0.0)."""
    b, h, s, d, g = shape
    s = gpu_or_small(s, s * 64, device)
    combos = [(torch.float16, torch.float16, "outliers"), (torch.float16, torch.float16, "offset")]
    if bits == 3:
        combos += [(torch.float32, torch.bfloat16, "outliers"), (torch.float16, torch.float32, "outliers")]
    checked = 0
    for i, (sdt, dtype, kind) in enumerate(combos):
        k, v = random_kv((b, h, s, d), dtype, device, seed=seed + i, kind=kind)
        ref = quantize(k, v, bits, g, "torch", scale_dtype=sdt)
        got = quantize(k, v, bits, g, backend, scale_dtype=sdt)
        diff = cache_mismatches(ref, got)
        assert not diff, f"{sdt} {dtype}: {diff}"
        checked += elements(ref)
    record.backend, record.variant, record.device = backend, f"b{bits}", device
    record.add(states_checked=checked, bit_errors=0, shape=f"{b}x{h}x{s}x{d} G{g}")


@pytest.mark.parametrize(("device", "backend"), [p for p in device_backends() if "triton" in p.id])
@pytest.mark.parametrize("bits", [3, 4])
def test_kernel_writes_only_its_rows(record, seed, device, backend, bits):
    """Into a poisoned cache at a token offset, from a strided (non-contiguous) input: every
    element of the target rows is written and equals the reference; the rest stays poison."""
    g, d, offset, t = 32, 64, 64, 64
    qkv = QuantizedKV.empty(2, 2, d, bits=bits, group_size=g, capacity=192, device=device)
    poison(qkv)
    k_big, v_big = random_kv((2, 2, t, 2 * d), torch.float16, device, seed=seed)
    k, v = k_big[..., ::2], v_big[..., 1::2]  # stride 2 along D
    quantize_into(qkv, k, v, offset, backend)
    ref = quantize(k.contiguous(), v.contiguous(), bits, g, "torch")
    rows, groups = slice(offset, offset + t), slice(offset // g, (offset + t) // g)
    for name, sel in (("k_codes", rows), ("v_codes", rows), ("v_scale", rows), ("v_zero", rows),
                      ("k_scale", groups), ("k_zero", groups)):
        got, want = getattr(qkv, name), getattr(ref, name)
        assert torch.equal(got[:, :, sel], want), name
        outside = torch.cat([got[:, :, : sel.start], got[:, :, sel.stop:]], dim=2)
        if outside.is_floating_point():
            assert bool(outside.isnan().all()), f"{name} written outside its rows"
        else:
            assert bool((outside == 0xFF).all()), f"{name} written outside its rows"
    record.backend, record.variant, record.device = backend, f"b{bits}-offset{offset}-strided", device
    record.add(states_checked=elements(ref), bit_errors=0)


_TILES = [  # (per_channel, tokens, channels, warps, D) at G=32: one group, whole rows, rows past the end,
    # and 128-value runs (three 16-byte stores per 48 bytes) once and twice per row
    (True, 32, 32, 1, 64), (True, 32, 64, 2, 64), (False, 32, 32, 1, 64), (False, 64, 64, 2, 64),
    (False, 128, 32, 4, 64), (False, 2, 64, 1, 64), (True, 32, 128, 2, 128), (False, 64, 128, 4, 256),
    (True, 32, 256, 4, 256), (False, 16, 256, 1, 256), (True, 32, 32, 1, 128),
]


@pytest.mark.parametrize(("device", "backend"), [p for p in device_backends() if "triton" in p.id])
@pytest.mark.parametrize(("per_channel", "tokens", "channels", "warps", "d"), _TILES,
                         ids=[f"{'k' if t[0] else 'v'}-t{t[1]}-c{t[2]}-w{t[3]}-d{t[4]}" for t in _TILES])
def test_every_tile_shape_writes_the_reference(record, seed, device, backend, per_channel, tokens, channels, warps,
                                               d):
    """Each tile a launch may take (several groups per row, many tokens per program, a last
    program past the end) writes exactly the reference's codes, scales and zeros into a
    poisoned cache at a token offset, and nothing outside the target rows."""
    g, offset, t, bits = 32, 32, 96, 3
    qkv = QuantizedKV.empty(2, 3, d, bits=bits, group_size=g, capacity=192, device=device)
    poison(qkv)
    k, v = random_kv((2, 3, t, d), torch.float16, device, seed=seed, kind="outliers")
    x = k if per_channel else v
    side = "k" if per_channel else "v"
    codes, scale, zero = (getattr(qkv, f"{side}_{f}") for f in ("codes", "scale", "zero"))
    _launch_quantize(x, codes, scale, zero, offset, g, bits, per_channel, QuantizeTile(tokens, channels, warps))
    ref = quantize(k, v, bits, g, "torch")
    rows = slice(offset, offset + t)
    params = slice(offset // g, (offset + t) // g) if per_channel else rows
    for name, sel in (("codes", rows), ("scale", params), ("zero", params)):
        got, want = getattr(qkv, f"{side}_{name}"), getattr(ref, f"{side}_{name}")
        assert torch.equal(got[:, :, sel], want[:, :, : sel.stop - sel.start]), name
        outside = torch.cat([got[:, :, : sel.start], got[:, :, sel.stop:]], dim=2)
        untouched = outside.isnan().all() if outside.is_floating_point() else (outside == 0xFF).all()
        assert bool(untouched), f"{side}_{name} written outside its rows"
    record.backend, record.variant, record.device = backend, f"{side}-t{tokens}-c{channels}-w{warps}-d{d}", device
    record.add(states_checked=x.numel(), bit_errors=0)


@pytest.mark.parametrize(("device", "backend"), [p for p in device_backends() if "triton" in p.id])
@pytest.mark.parametrize("channels", [32, 64])
def test_k_tiles_narrower_than_the_group_write_the_reference(record, seed, device, backend, channels):
    """K groups run along tokens, so a K tile may cover fewer channels than G (any multiple of 32)."""
    g, bits = 64, 3
    qkv = QuantizedKV.empty(2, 3, 128, bits=bits, group_size=g, capacity=128, device=device)
    poison(qkv)
    k, v = random_kv((2, 3, 128, 128), torch.float16, device, seed=seed, kind="outliers")
    _launch_quantize(k, qkv.k_codes, qkv.k_scale, qkv.k_zero, 0, g, bits, True, QuantizeTile(g, channels, 1))
    ref = quantize(k, v, bits, g, "torch")
    for name in ("k_codes", "k_scale", "k_zero"):
        assert torch.equal(getattr(qkv, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)), name
    record.backend, record.variant, record.device = backend, f"k-t{g}-c{channels}-w1-d128-g{g}", device
    record.add(states_checked=k.numel(), bit_errors=0)


@pytest.mark.parametrize(("tile", "per_channel", "match"), [
    (QuantizeTile(64, 32, 1), True, "tile.tokens must equal group_size"),
    (QuantizeTile(32, 48, 1), False, "tile.channels must be a power of two"),
    (QuantizeTile(32, 16, 1), False, "tile.channels must be a multiple of 32 dividing D=64"),
    (QuantizeTile(32, 16, 1), True, "tile.channels must be a multiple of 32 dividing D=64"),
    (QuantizeTile(32, 32, 1, 16), False, "tile.registers must be 0 \\(no cap\\) or 24 to 255"),
    (QuantizeTile(32, 128, 1), True, "dividing D=64"),
    (QuantizeTile(32, 32, 3), False, "tile.warps must be a power of two"),
    (QuantizeTile(1, 32, 1), False, "tile.tokens must be at least 2"),
    (QuantizeTile(32, 32, True), False, "tile.warps must be a power of two"),
])
def test_bad_tile_is_a_value_error_naming_the_field(tile, per_channel, match):
    x = torch.randn(1, 1, 32, 64, dtype=torch.float16)
    qkv = QuantizedKV.empty(1, 1, 64, bits=3, group_size=32, capacity=32)
    with pytest.raises(ValueError, match=match):
        _launch_quantize(x, qkv.k_codes, qkv.k_scale, qkv.k_zero, 0, 32, 3, per_channel, tile)


@pytest.mark.parametrize("per_channel", [True, False], ids=["k", "v"])
def test_every_default_tile_passes_the_tile_check(per_channel):
    """Launches take their default tile unchecked: every one must be one check_tile accepts."""
    for group_size in (32, 64, 128):
        for d in range(group_size, 513, group_size):
            check_tile(default_tile(group_size, per_channel, d), group_size, per_channel, d)


def test_partial_group_is_a_value_error_naming_x():
    x = torch.randn(1, 1, 40, 64, dtype=torch.float16)
    qkv = QuantizedKV.empty(1, 1, 64, bits=3, group_size=32, capacity=64)
    for per_channel in (True, False):
        with pytest.raises(ValueError, match="x must hold whole groups of group_size=32 tokens; got 40"):
            _launch_quantize(x, qkv.v_codes, qkv.v_scale, qkv.v_zero, 0, 32, 3, per_channel)


@pytest.mark.parametrize("sdt", SCALE_DTYPES, ids=_sdt_id)
@pytest.mark.parametrize("bits", BITS)
def test_codes_never_need_the_lower_clamp(record, bits, sdt):
    """For every finite group, rne(x * inv) + z >= 0 before any clamp, with z = rne(-lo * inv)
    exactly and |z| <= ZERO_SPAN: the Triton kernel clamps the upper end only (kvbits/affine.py).
    The groups span wide fp16 ranges of both signs, where one fp32 rounding of -lo * inv instead
    of the exact product moves z by one in about 1 group in 10,000 (and the group's minimum to
    code -1); narrow groups far from 0 are where |z| reaches its bound."""
    g = torch.Generator().manual_seed(17 * bits)
    n = 200_000
    lo = -(torch.rand(n, generator=g) * 100).half().float()
    hi = (torch.rand(n, generator=g) * 100).half().float()
    lo[: n // 4] = hi[: n // 4] * 0.25  # all-positive groups
    hi[n // 4 : n // 2] = lo[n // 4 : n // 2] * 0.25  # all-negative groups
    hi[n // 2 : n // 2 + 1000] = (lo[n // 2 : n // 2 + 1000] * 0.99).half().float()  # narrow, far from 0
    hi[-16:] = lo[-16:]  # constant groups
    scale, zero, inv = affine_params(lo, hi, bits, sdt)
    exact_zero = torch.round(-lo.double() * inv.double())
    assert torch.equal(exact_zero.float(), zero), "z is the exact product's rounding, never clamped"
    assert float(zero.abs().max()) == ZERO_SPAN[bits], "the narrow groups reach the zero point's bound"
    assert bool((zero[: n // 4] <= 0).all()) and bool((zero[n // 4 : n // 2] >= 2**bits - 1).all()), \
        "groups of one sign put z outside the codes"
    lowest = torch.round(lo.double() * inv.double()) + zero.double()  # the group minimum's code
    highest = torch.round(hi.double() * inv.double()) + zero.double()
    assert float(lowest.min()) >= 0.0
    assert float(highest.max()) <= (1 << bits)  # one above the top code at most: the clamp binds
    record.add(states_checked=n)


@settings(max_examples=200, deadline=None)
@given(
    bits=st.sampled_from(BITS),
    sdt=st.sampled_from(SCALE_DTYPES),
    values=st.lists(
        st.floats(min_value=-6e4, max_value=6e4, allow_nan=False, allow_infinity=False, width=32),
        min_size=32, max_size=32,
    ),
    constant=st.booleans(),
)
def test_reconstruction_bound_property(bits, sdt, values, constant):
    """|x - x_hat| <= s/2 (+ fp32 rounding of x / s) for every x of every group, both groupings."""
    x = torch.tensor(values, dtype=torch.float32)
    if constant:
        x = x[:1].expand(32).clone()
    for grouping, shape in (("token", (1, 1, 1, 32)), ("channel", (1, 1, 32, 1))):
        xs = x.reshape(shape)
        if grouping == "channel":  # D must be a multiple of G: 32 channels, each the same group
            xs = xs.expand(1, 1, 32, 32).contiguous()
        x_hat = quantize_dequantize(xs, bits, group_size=32, grouping=grouping, scale_dtype=sdt)
        lo, hi = xs.amin(), xs.amax()
        scale, zero, _ = affine_params(lo.reshape(1), hi.reshape(1), bits, sdt)
        s = float(scale)
        err = (xs - x_hat).abs()
        bound = s / 2 + xs.abs() * 2.0**-21
        assert bool((err <= bound).all()), (grouping, s, float(err.max()))
        c = float(x[0])
        if constant and c == float(x[0].to(sdt)) and (c == 0 or abs(c) >= SCALE_FLOOR[sdt]):
            assert torch.equal(x_hat, xs), "a representable constant reconstructs exactly"
        assert math.isfinite(s) and s > 0


@pytest.mark.parametrize(("device", "backend"), [p for p in device_backends() if "triton" in p.id])
def test_exact_ties_round_half_to_even_in_both_backends(record, device, backend):
    """Groups spanning [-0.875, 0.875 - 2^-12] get the fp16 scale 0.25 exactly (3 bits), so
    odd multiples of 0.125 land on exact halves of a code and the zero point itself is a tie:
    the Triton kernel must round them as the reference does, to even."""
    g, d = 32, 64
    ties = torch.tensor([-0.875, -0.625, -0.375, -0.125, 0.125, 0.375, 0.625, 0.875 - 2**-12])
    cyclic = ties[(torch.arange(g)[:, None] + torch.arange(d)[None, :]) % len(ties)]  # [g, d]

    def shuffled() -> torch.Tensor:
        # rows in any order, channels shuffled within each group of G: every K group (a channel
        # over G tokens) and every V group (G channels of a token) still holds all eight values
        cols = torch.cat([j * g + torch.randperm(g) for j in range(d // g)])
        return cyclic[torch.randperm(g)][:, cols].to(torch.float16).reshape(1, 1, g, d).to(device)

    k, v = shuffled(), shuffled()
    ref = quantize(k, v, 3, g, "torch")
    got = quantize(k, v, 3, g, backend)
    assert bool((ref.k_scale == 0.25).all()) and bool((ref.v_scale == 0.25).all())
    x_over_s = k.float() / 0.25 + ref.k_zero.float()[..., :1, :].repeat_interleave(g, dim=2)
    assert bool((x_over_s.frac().abs() == 0.5).any()), "the inputs must contain exact ties"
    diff = cache_mismatches(ref, got)
    record.backend, record.variant, record.device = backend, "b3-ties", device
    record.add(states_checked=elements(ref), bit_errors=0 if not diff else len(diff))
    assert not diff, diff


@pytest.mark.parametrize(("device", "backend"), [p for p in device_backends() if "triton" in p.id])
def test_top_codes_are_clamped_in_both_backends(record, device, backend):
    """Groups spanning [-4.265625, 4.265625] get the fp16 scale 1.21875 and zero point 4 (3 bits),
    and their maximum lands just past a tie (hi / s = 3.50000005): rne(hi / s) + z = 8, one past
    the top code. Both backends must clamp it to 7 (an unclamped 8 would carry into the next
    code of the packed word)."""
    g, d = 32, 64
    values = torch.tensor([-4.265625, -3.0, -1.5, -0.5, 0.5, 1.5, 3.0, 4.265625])
    cyclic = values[(torch.arange(g)[:, None] + torch.arange(d)[None, :]) % len(values)]
    # every K group (a channel over G tokens) and V group (G channels of a token) holds all eight
    k = cyclic.to(torch.float16).reshape(1, 1, g, d).to(device)
    v = cyclic.roll(3, dims=0).to(torch.float16).reshape(1, 1, g, d).to(device)
    scale, zero, inv = affine_params(torch.tensor([-4.265625]), torch.tensor([4.265625]), 3, torch.float16)
    assert float(scale) == 1.21875 and float(zero) == 4.0
    assert float(torch.round(torch.tensor(4.265625).double() * inv.double()) + zero.double()) == 8.0
    ref = quantize(k, v, 3, g, "torch")
    got = quantize(k, v, 3, g, backend)
    assert bool((ref.k_scale == 1.21875).all()) and bool((ref.v_scale == 1.21875).all())
    diff = cache_mismatches(ref, got)
    record.backend, record.variant, record.device = backend, "b3-top-clamp", device
    record.add(states_checked=elements(ref), bit_errors=0 if not diff else len(diff))
    assert not diff, diff
