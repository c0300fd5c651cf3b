"""Affine b-bit quantization of K and V into the packed cache (docs/design.md section 5).

Scheme, defined once and kept bit for bit by the torch reference and the Triton
kernel. For each group of values x (fp16 / bf16 / fp32 input, computed in fp32)::

    lo, hi = min(x), max(x)
    s = (hi - lo) * fl32(1 / (2^b - 1))          # fp32: a plain min-max range
    s = max(s, max(|lo|, |hi|) / ZERO_SPAN[b])   # |z| <= ZERO_SPAN[b]: 64 (2-4 bits), 1024 (8)
    s = |lo| if hi == lo (a constant group), 1 if the constant is 0
    s = the smallest scale-dtype value >= s      # rounded UP to fp16 (exact for fp32)
    s = max(s, SCALE_FLOOR[scale dtype])         # 2^-24 for fp16, 2^-126 for fp32
    inv = 1 / s                                  # fp32, IEEE division, the STORED s
    z = rne(-lo * inv)                           # an integer, |z| <= ZERO_SPAN[b]; -lo * inv EXACT
    q = clamp(rne(x * inv) + z, 0, 2^b - 1)      # x * inv EXACT (fp64 product / fma)
    x_hat = (q - z) * s

``rne`` rounds half to even; ``fl32`` is one fp32 rounding. The range is the group's
own, [lo, hi], not stretched to hold 0: the zero point z may lie outside the codes
[0, 2^b - 1] (a group of keys around +8 has z near -8 / s), which spends every code on
values the group holds (measured on a real decoder, ``harness/quality``: KL divergence
from the fp32 cache 7% lower at 3 bits and 5% at 2 than a range holding 0). The
second line bounds |z|: z is then exact in a float16 zero, and the fused decode's
zero-point terms (``(q * s) . z``, accumulated beside the codes' products) stay within
64 steps of the codes' own size (at 2-4 bits). It binds only for a group whose range is
under (2^b - 1) / ZERO_SPAN[b] of its magnitude (1/21 at 2 bits, 1/9 at 3, 1/4 at 4 and 8);
on SmolLM2 a span of 64 and no bound at all gave the same quality.

The products x * inv and -lo * inv are rounded once, straight to an integer (one
fma on a GPU, an exact fp64 product in the reference). Rounding both exactly makes
q >= 0 hold by itself (x >= lo and rne is monotonic and odd), so only the upper
clamp ever binds. Rounding s up makes the whole range fit in 2^b - 1 steps, so
``|x - x_hat| <= s / 2`` (plus fp32 rounding) for every x of the group;
quantizing with the stored s makes ``requant(dequant(q)) == q`` exact. A constant
group c is reconstructed exactly whenever c is representable in the scale dtype and
c == 0 or |c| >= SCALE_FLOOR (s = |c|, z = -sign(c), q = 0). A group holding
NaN or Inf, or one whose scale overflows the scale dtype, is an error
(``ValueError``); nothing is silently clamped.

Grouping: K per channel along tokens (a group is G tokens of one channel), V per
token along channels (G channels of one token). Codes are packed along D in the
canonical LSB-first stream (``kvbits.packing``). The cache layout is documented
in :mod:`kvbits.kv_cache`.

Kernel (``_quantize_kernel``): K or V fp16/bf16/fp32 ``[B, H, T, D]`` (any strides, T whole
groups) into codes uint8 ``[B, H, capacity, D*b/8]`` and scales and zeros fp16/fp32 (K
``[B, H, capacity/G, D]``, V ``[B, H, capacity, D/G]``), equal bit for bit to the torch
reference ``_quantize_torch``. Tested in ``suites/``: test_affine_roundtrip.py (torch == Triton
on every tile shape, ties, clamping, the round trip and the bound above), test_streaming.py
(appending equals one-shot), test_affine_bad_input.py, test_accuracy_affine.py (attention error
figures); speed in test_bench_affine.py, machine code in test_sass_budget.py.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.graph import increment_version

from ._checks import (
    require_dtype,
    require_finite,
    require_int,
    require_rank,
    require_same_device,
    require_tensor,
)
from ._runtime import on_device, triton_interpreted
from .aot import AotSpec
from .packing import pack_bits

BIT_WIDTHS = (2, 3, 4, 8)
GROUP_SIZES = (32, 64, 128)
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SCALE_DTYPES = (torch.float16, torch.float32)
BACKENDS = ("torch", "triton")
SCALE_FLOOR = {torch.float16: 2.0**-24, torch.float32: 2.0**-126}
# |z| <= ZERO_SPAN[bits] (module docstring); powers of two, so max(|lo|, |hi|) / span is exact
ZERO_SPAN = {2: 64, 3: 64, 4: 64, 8: 1024}
ZERO_SPAN_INV = tl.constexpr(1.0 / 64)  # the kernels' copy: 2-4 bits, and 16 times it at 8 (_affine_params_tl)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ----------------------------------------------------------------------------- torch reference
def _round_up_to(s: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """fp32 s >= 0 -> the smallest ``scale_dtype`` value >= s, as fp32 (NaN and Inf pass through)."""
    if scale_dtype == torch.float32:
        return s
    low = s.to(scale_dtype)
    bumped = (low.view(torch.int16) + 1).view(scale_dtype)  # next value up, for positive low
    return torch.where(low.float() < s, bumped, low).float()


def affine_params(lo: torch.Tensor, hi: torch.Tensor, bits: int, scale_dtype: torch.dtype):
    """Group parameters from group minima and maxima (the scheme in this module's docstring).

    lo, hi: fp32 [...] (same shape). Returns ``(scale, zero, inv)``, all fp32 [...]:
    ``scale`` and ``zero`` hold values exactly representable in ``scale_dtype``,
    ``inv = 1 / scale``. A group with NaN or Inf gets a NaN scale.
    """
    qmax = float((1 << bits) - 1)
    s = (hi - lo) * torch.tensor(1.0 / qmax, dtype=torch.float32, device=lo.device)
    s = torch.maximum(s, torch.maximum(lo.abs(), hi.abs()) * (1.0 / ZERO_SPAN[bits]))  # NaN stays NaN
    constant = hi == lo
    s = torch.where(constant, torch.where(lo == 0, torch.ones_like(lo), lo.abs()), s)
    s = _round_up_to(s, scale_dtype)
    floor = SCALE_FLOOR[scale_dtype]
    s = torch.where(s < floor, torch.full_like(s, floor), s)
    inv = torch.ones_like(s) / s  # tensor / tensor: IEEE division on every device
    # exact product; + 0.0 makes the zero of a group with lo == 0 +0.0 (as the kernel's), not -0.0
    zero = torch.round(-lo.double() * inv.double()).float() + 0.0
    return s, zero, inv


def quantize_codes(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, inv: torch.Tensor, bits: int):
    """fp32 x and broadcastable fp32 group parameters -> uint8 codes in [0, 2^b - 1].

    ``x * inv`` is formed exactly (fp64) and rounded once, half to even."""
    q = torch.round(x.double() * inv.double()).float() + zero
    return torch.clamp(q, 0.0, float((1 << bits) - 1)).to(torch.uint8)


def dequantize_codes(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Codes and broadcastable group parameters -> fp32 ``(q - zero) * scale``."""
    return (q.float() - zero.float()) * scale.float()


def _quantize_groups(xg: torch.Tensor, dim: int, bits: int, scale_dtype: torch.dtype):
    """Quantize fp32 ``xg`` in groups along ``dim``: codes (shape of xg), scale, zero (dim reduced)."""
    lo = xg.amin(dim=dim, keepdim=True)
    hi = xg.amax(dim=dim, keepdim=True)
    scale, zero, inv = affine_params(lo, hi, bits, scale_dtype)
    q = quantize_codes(xg, scale, zero, inv, bits)
    return q, scale.squeeze(dim), zero.squeeze(dim)


def _group_view(x: torch.Tensor, group_size: int, per_channel: bool) -> tuple[torch.Tensor, int]:
    """[B, H, T, D] -> grouped fp32 view and the group dimension.

    per channel (K): [B, H, T/G, G, D], groups along dim 3 (tokens);
    per token (V):   [B, H, T, D/G, G], groups along dim 4 (channels).
    """
    b, h, t, d = x.shape
    if per_channel:
        return x.float().reshape(b, h, t // group_size, group_size, d), 3
    return x.float().reshape(b, h, t, d // group_size, group_size), 4


def _quantize_torch(x: torch.Tensor, bits: int, group_size: int, scale_dtype: torch.dtype, per_channel: bool):
    """[B, H, T, D] (T a multiple of G for K) -> packed codes [B, H, T, D*b/8], scale, zero (sdt)."""
    xg, dim = _group_view(x, group_size, per_channel)
    q, scale, zero = _quantize_groups(xg, dim, bits, scale_dtype)
    codes = pack_bits(q.reshape(x.shape), bits, layout="byte", backend="torch", validate=False)
    return codes, scale.to(scale_dtype), zero.to(scale_dtype)


def quantize_dequantize(
    x: torch.Tensor, bits: int = 3, *, group_size: int = 64, grouping: str = "channel",
    scale_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """Affine round trip of x [B, H, S, D] without packing: returns x_hat, fp32 [B, H, S, D].

    ``grouping="channel"``: per channel along tokens (how K is cached); tokens past
    the last full group of G are returned unchanged (the residual window).
    ``grouping="token"``: per token along channels (how V is cached; D must be a
    multiple of G). Used to compare groupings for K in accuracy studies.
    """
    _check_tensor("x", x)
    _check_config(bits, group_size, scale_dtype)
    if grouping not in ("channel", "token"):
        raise ValueError(f"grouping must be 'channel' or 'token'; got {grouping!r}")
    per_channel = grouping == "channel"
    if not per_channel:
        _check_head_dim(x.shape[-1], group_size)
    full = x.shape[2] // group_size * group_size if per_channel else x.shape[2]
    out = x.float().clone()
    if full:
        xg, dim = _group_view(x[:, :, :full], group_size, per_channel)
        q, scale, zero = _quantize_groups(xg, dim, bits, scale_dtype)
        _check_scales("x", x, scale)
        x_hat = dequantize_codes(q, scale.unsqueeze(dim), zero.unsqueeze(dim))
        out[:, :, :full] = x_hat.reshape(x.shape[0], x.shape[1], full, x.shape[3])
    require_finite("x", out)
    return out


# ----------------------------------------------------------------------------- Triton kernel
@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _group_range(x, AXIS: tl.constexpr, INTERPRET: tl.constexpr):
    """Group min and max of x along AXIS as fp32; NaN when the group holds NaN (Inf stays Inf).

    Compiled: NaN-propagating min/max (max.NaN.f32). The interpreter's tl.min / tl.max
    drop NaN and its custom reductions are slow, so there a non-finite element is
    detected by sum(x * 0), which is NaN exactly then.
    """
    if INTERPRET:
        x = x.to(tl.float32)
        bad = tl.sum(x * 0.0, AXIS)
        return tl.min(x, AXIS) + bad, tl.max(x, AXIS) + bad
    else:
        if x.dtype == tl.bfloat16:  # the NaN-propagating combine computes bf16 in fp32
            x = x.to(tl.float32)
        lo = tl.reduce(x, AXIS, _min_nan)
        hi = tl.reduce(x, AXIS, _max_nan)
        return lo.to(tl.float32), hi.to(tl.float32)


@triton.jit
def _affine_params_tl(lo, hi, BITS: tl.constexpr, SCALE_FP16: tl.constexpr, FLOOR: tl.constexpr,
                      INTERPRET: tl.constexpr):
    """Triton twin of :func:`affine_params`: fp32 lo, hi -> fp32 scale, zero, inv."""
    QMAX: tl.constexpr = (1 << BITS) - 1
    s = (hi - lo) * (1.0 / QMAX)  # NaN or Inf in the group makes s NaN or Inf
    least = tl.maximum(tl.abs(lo), tl.abs(hi), propagate_nan=tl.PropagateNan.ALL) * ZERO_SPAN_INV
    if BITS == 8:
        least = least * (1.0 / 16)  # ZERO_SPAN[8] = 16 * ZERO_SPAN[4]: exact, a power of two
    s = tl.maximum(s, least, propagate_nan=tl.PropagateNan.ALL)
    const_s = tl.where(lo == 0.0, 1.0, tl.abs(lo))
    s = tl.where(hi == lo, const_s, s)
    if SCALE_FP16:
        low = s.to(tl.float16)
        bumped = (low.to(tl.int16, bitcast=True) + 1).to(tl.float16, bitcast=True)
        s = tl.where(low.to(tl.float32) < s, bumped, low).to(tl.float32)
    s = tl.where(s < FLOOR, FLOOR, s)
    inv = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    zero = _round_product(-lo, inv, INTERPRET).to(tl.float32)  # |zero| <= ZERO_SPAN[BITS] for a finite group
    return s, zero, inv


@triton.jit
def _round_product(x, inv, INTERPRET: tl.constexpr):
    """rne(x * inv) of fp32 x and inv, the exact product rounded once, as int32 (|x * inv| < 2^22).

    Compiled: fma(x, inv, 1.5 * 2^23) rounds the exact product to an integer held in
    the low mantissa bits, read back as an int by subtracting the constant's bit pattern.
    Interpreter: the exact product in fp64, rounded there."""
    if INTERPRET:
        y = x.to(tl.float64) * inv.to(tl.float64)
        return ((y + 6755399441055744.0) - 6755399441055744.0).to(tl.int32)
    else:
        return tl.fma(x, inv, 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000


@triton.jit
def _codes(x, inv, zero, BITS: tl.constexpr, INTERPRET: tl.constexpr):
    """clamp(rne(x * inv) + zero, 0, 2^BITS - 1) as uint32, x * inv rounded once.

    One unsigned minimum clamps both ends: for a finite group q >= 0 already (module
    docstring), and a non-finite group (an error for the caller) still gets codes of BITS
    bits, which keeps the other codes of its packed words intact.
    """
    q = _round_product(x, inv, INTERPRET) + zero.to(tl.int32)
    return tl.minimum(q.to(tl.uint32, bitcast=True), (1 << BITS) - 1)


@triton.jit
def _columns_of_four(w):
    """The four columns of w [R, N, 4] along its last dim, each [R, N]."""
    even, odd = tl.split(tl.reshape(w, [w.shape[0], w.shape[1], 2, 2]))  # (m0, m2), (m1, m3)
    m0, m2 = tl.split(even)
    m1, m3 = tl.split(odd)
    return m0, m1, m2, m3


@triton.jit
def _quad(p, q, r, s):
    """[R, N, 4] whose last dim is (p, q, r, s), from four [R, N] tensors."""
    return tl.reshape(tl.join(tl.join(p, r), tl.join(q, s)), [p.shape[0], p.shape[1], 4])


@triton.jit
def _store_codes(codes, base, q, mask, BITS: tl.constexpr):
    """Pack uint32 codes q [R, C] row by row into the canonical stream and store it as int32 words.

    codes: uint8 pointer; codes + base[r] is the first byte of row r's C*BITS/8 bytes
    (a multiple of 4); mask [R, 1] or None: the rows to write. BITS in (2, 4, 8):
    32/BITS values per word. BITS = 3: each 32 values m are 96 bits: four 24-bit octets
    a, b, c, d (v0 | v1 << 3 | ... | v7 << 21) give words 3m = a | b << 24,
    3m+1 = b >> 8 | c << 16, 3m+2 = c >> 16 | d << 8. When C is a multiple of 128, each
    128 values (48 bytes) are stored as three 16-byte vectors of 4 consecutive words
    (rows 16-byte aligned: one wide store each); otherwise each word k of every 32 values
    is stored with its own 4-byte store.
    """
    R: tl.constexpr = q.shape[0]
    C: tl.constexpr = q.shape[1]
    word_ptr = codes.to(tl.pointer_type(tl.int32)) + base // 4
    if BITS == 3:
        lanes = (tl.arange(0, 8) * 3).to(tl.uint32)
        octets = tl.sum(tl.reshape(q, [R, C // 32, 4, 8]) << lanes[None, None, None, :], axis=3)
        ac, bd = tl.split(tl.reshape(octets, [R, C // 32, 2, 2]))
        a, c = tl.split(ac)
        b, d = tl.split(bd)
        w0 = (a | (b << 24)).to(tl.int32, bitcast=True)
        w1 = ((b >> 8) | (c << 16)).to(tl.int32, bitcast=True)
        w2 = ((c >> 16) | (d << 8)).to(tl.int32, bitcast=True)
        if C % 128 == 0:
            N: tl.constexpr = C // 128  # 48-byte runs of 4 x 32 values per row
            x0, x1, x2, x3 = _columns_of_four(tl.reshape(w0, [R, N, 4]))
            y0, y1, y2, y3 = _columns_of_four(tl.reshape(w1, [R, N, 4]))
            z0, z1, z2, z3 = _columns_of_four(tl.reshape(w2, [R, N, 4]))
            run = word_ptr[:, :, None] + tl.arange(0, N)[None, :, None] * 12 + tl.arange(0, 4)[None, None, :]
            run_mask = None if mask is None else mask[:, :, None]
            tl.store(run, _quad(x0, y0, z0, x1), mask=run_mask)
            tl.store(run + 4, _quad(y1, z1, x2, y2), mask=run_mask)
            tl.store(run + 8, _quad(z2, x3, y3, z3), mask=run_mask)
        else:
            m = word_ptr + tl.arange(0, C // 32)[None, :] * 3
            tl.store(m, w0, mask=mask)
            tl.store(m + 1, w1, mask=mask)
            tl.store(m + 2, w2, mask=mask)
    else:
        VPW: tl.constexpr = 32 // BITS
        lanes = (tl.arange(0, VPW) * BITS).to(tl.uint32)
        words = tl.sum(tl.reshape(q, [R, C // VPW, VPW]) << lanes[None, None, :], axis=2)  # disjoint bits
        tl.store(word_ptr + tl.arange(0, C // VPW)[None, :], words.to(tl.int32, bitcast=True), mask=mask)


@triton.jit
def _flagged(s, SCALE_MAX: tl.constexpr):
    """1 where a scale is NaN or beyond the scale dtype's largest value, else 0 (int32)."""
    return ((s != s) | (s > SCALE_MAX)).to(tl.int32)


@triton.jit
def _quantize_kernel(
    source, cache, errors,
    # the scheme
    D: tl.constexpr, G: tl.constexpr, BITS: tl.constexpr, PER_CHANNEL: tl.constexpr,
    SCALE_FP16: tl.constexpr, FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr, FLAG_ERRORS: tl.constexpr,
    INTERPRET: tl.constexpr,
    # the tile
    TOKENS: tl.constexpr, CHANNELS: tl.constexpr, EVEN_TOKENS: tl.constexpr,
):
    """Quantize one [TOKENS, CHANNELS] tile of K (PER_CHANNEL) or V into the cache.

    source ``(src, heads, src_tokens, stride_b, stride_h, stride_t, stride_d)``: src fp16/bf16/fp32
    [B, heads, src_tokens, D] (any strides), src_tokens a multiple of G
    cache ``(codes, scale, zero, capacity, tok_offset)``: codes uint8 [B, H, capacity, D*BITS/8];
    scale, zero fp16/fp32, K: [B, H, capacity/G, D], V: [B, H, capacity, D/G]
    errors: int32 [1], set to 1 (FLAG_ERRORS) where a group's scale is NaN (NaN or Inf in the
    group) or beyond SCALE_MAX (the scale dtype overflows); never cleared here
    Tile: K takes TOKENS == G tokens (one group per channel); V takes any power-of-two
    TOKENS (rows past src_tokens masked unless EVEN_TOKENS); CHANNELS divides D and is a
    multiple of G for V, of 32 for K. Source token t lands at cache token tok_offset + t
    (tok_offset a multiple of G). Grid: (cdiv(src_tokens, TOKENS), D / CHANNELS, B * H).
    Every input element is read once.
    """
    src, heads, src_tokens, stride_b, stride_h, stride_t, stride_d = source
    codes, scale, zero, capacity, tok_offset = cache
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b = bh // heads
    h = bh % heads
    tok = pid_t * TOKENS + tl.arange(0, TOKENS)  # source tokens of this tile
    chan = pid_c * CHANNELS + tl.arange(0, CHANNELS)
    ptrs = src + b * stride_b + h * stride_h + tok.to(tl.int64)[:, None] * stride_t + chan[None, :] * stride_d
    if EVEN_TOKENS:
        row_mask = None
        x_in = tl.load(ptrs)  # min and max are exact in the input dtype (fp16: two per instruction)
    else:
        row_mask = (tok < src_tokens)[:, None]
        x_in = tl.load(ptrs, mask=row_mask, other=0.0)
    dst_tok = bh * capacity + tok_offset + tok  # cache row of each token, int64
    if PER_CHANNEL:
        lo, hi = _group_range(x_in, 0, INTERPRET)
        s, z, inv = _affine_params_tl(lo, hi, BITS, SCALE_FP16, FLOOR, INTERPRET)
        q = _codes(x_in.to(tl.float32), inv[None, :], z[None, :], BITS, INTERPRET)
        group_row = bh * (capacity // G) + (tok_offset // G) + pid_t
        p_off = group_row * D + chan
        tl.store(scale + p_off, s.to(scale.dtype.element_ty))
        tl.store(zero + p_off, z.to(zero.dtype.element_ty))
        bad = tl.sum(_flagged(s, SCALE_MAX), 0)
    else:
        NG: tl.constexpr = CHANNELS // G  # groups per row of the tile
        xg = tl.reshape(x_in, [TOKENS, NG, G])
        lo, hi = _group_range(xg, 2, INTERPRET)
        s, z, inv = _affine_params_tl(lo, hi, BITS, SCALE_FP16, FLOOR, INTERPRET)
        q = tl.reshape(_codes(xg.to(tl.float32), inv[:, :, None], z[:, :, None], BITS, INTERPRET),
                       [TOKENS, CHANNELS])
        p_off = dst_tok[:, None] * (D // G) + (pid_c * NG + tl.arange(0, NG))[None, :]
        tl.store(scale + p_off, s.to(scale.dtype.element_ty), mask=row_mask)
        tl.store(zero + p_off, z.to(zero.dtype.element_ty), mask=row_mask)
        bad = tl.sum(tl.sum(_flagged(s, SCALE_MAX), 1), 0)  # masked rows are zeros: a finite scale
    if FLAG_ERRORS:  # one read-back of a flag replaces a pass over the scales on the host's side
        tl.atomic_or(errors, 1, mask=bad > 0)
    row_bytes: tl.constexpr = D * BITS // 8
    tile_bytes: tl.constexpr = CHANNELS * BITS // 8
    _store_codes(codes, dst_tok[:, None] * row_bytes + pid_c * tile_bytes, q, row_mask, BITS)


class QuantizeTile(NamedTuple):
    """One program's tile of the quantize kernel: tokens x channels, its warps, and a cap on
    registers per thread (0: the compiler's choice; a lower cap lets more programs share an SM)."""

    tokens: int
    channels: int
    warps: int
    registers: int = 0


# Measured on an H200 (3 bits, fp16 [8, 8, 32768, 128], scripts/gpu_affine_sweep.py): K tiles
# of one group of tokens over 128 channels (rows of 48 bytes: three 16-byte stores), V tiles of
# few tokens and few warps. Preferred channels; a launch takes the largest that divides D.
_DEFAULT_TILES = {
    (True, 32): QuantizeTile(32, 128, 1), (True, 64): QuantizeTile(64, 128, 2),
    (True, 128): QuantizeTile(128, 128, 2),
    (False, 32): QuantizeTile(32, 64, 1), (False, 64): QuantizeTile(32, 64, 1),
    (False, 128): QuantizeTile(16, 128, 1),
}


def default_tile(group_size: int, per_channel: bool, head_dim: int) -> QuantizeTile:
    """The tile a launch uses unless told otherwise: the preferred one, its channels halved
    until they divide head_dim (a multiple of group_size)."""
    tile = _DEFAULT_TILES[per_channel, group_size]
    channels = tile.channels
    while head_dim % channels and channels > group_size:
        channels //= 2
    return tile._replace(channels=channels)


def check_tile(tile: QuantizeTile, group_size: int, per_channel: bool, head_dim: int) -> None:
    """ValueError naming the field when ``tile`` cannot quantize groups of group_size."""
    tokens, channels, warps, registers = tile
    for name, n in (("tokens", tokens), ("channels", channels), ("warps", warps)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1 or n & (n - 1):
            raise ValueError(f"tile.{name} must be a power of two; got {n!r}")
    if not isinstance(registers, int) or isinstance(registers, bool) or not (registers == 0 or 24 <= registers <= 255):
        raise ValueError(f"tile.registers must be 0 (no cap) or 24 to 255; got {registers!r}")
    if per_channel and tokens != group_size:
        raise ValueError(f"tile.tokens must equal group_size={group_size} for K (per-channel groups); got {tokens}")
    unit = 32 if per_channel else group_size  # K rows pack whole words of 32 values; V rows whole groups
    if channels % unit or head_dim % channels:
        raise ValueError(f"tile.channels must be a multiple of {unit} dividing D={head_dim}; got {channels}")
    if not per_channel and tokens < 2:
        raise ValueError(f"tile.tokens must be at least 2; got {tokens}")


def _launch_quantize(x, codes, scale, zero, tok_offset, group_size, bits, per_channel, tile=None,
                     errors=None) -> None:
    """Quantize whole groups x [B, H, T, D] into codes, scale and zero at tok_offset (shapes:
    _quantize_kernel); ``errors`` (int32 [1] on x's device, optional) is set to 1 for a
    non-finite or overflowing scale."""
    b, h, t, d = x.shape
    if t % group_size:
        raise ValueError(f"x must hold whole groups of group_size={group_size} tokens; got {t}")
    if tile is None:
        tile = default_tile(group_size, per_channel, d)
    else:
        check_tile(tile, group_size, per_channel, d)
    grid = (triton.cdiv(t, tile.tokens), d // tile.channels, b * h)
    with on_device(x.device):
        _quantize_kernel[grid](
            source=(x, h, t, *x.stride()),
            cache=(codes, scale, zero, codes.shape[2], tok_offset),
            errors=codes if errors is None else errors,  # codes: a pointer left unread
            D=d, G=group_size, BITS=bits, PER_CHANNEL=per_channel,
            SCALE_FP16=scale.dtype == torch.float16, FLOOR=SCALE_FLOOR[scale.dtype],
            SCALE_MAX=torch.finfo(scale.dtype).max, FLAG_ERRORS=errors is not None,
            INTERPRET=triton_interpreted(), TOKENS=tile.tokens, CHANNELS=tile.channels,
            EVEN_TOKENS=t % tile.tokens == 0, num_warps=tile.warps,
            **({"maxnreg": tile.registers} if tile.registers else {}),
        )
    # torch does not see a kernel's writes: bump the version counters as a torch write would
    for written in (codes, scale, zero):
        increment_version(written)


# ----------------------------------------------------------------------------- checks
def _check_tensor(name: str, x) -> None:
    require_tensor(name, x)
    require_dtype(name, x, INPUT_DTYPES)
    require_rank(name, x, 4)


def _check_config(bits, group_size, scale_dtype) -> None:
    require_int("bits", bits, BIT_WIDTHS)
    require_int("group_size", group_size, GROUP_SIZES)
    if not isinstance(scale_dtype, torch.dtype) or scale_dtype not in SCALE_DTYPES:
        raise TypeError(f"scale_dtype must be torch.float16 or torch.float32; got {scale_dtype!r}")


def _check_head_dim(d: int, group_size: int) -> None:
    if d % group_size:
        raise ValueError(
            f"head_dim D={d} must be a multiple of group_size={group_size} "
            "(V is quantized in groups of G channels)"
        )


def _check_scales(name: str, x: torch.Tensor, scale: torch.Tensor) -> None:
    """Raise ValueError when a group scale is not finite: NaN/Inf input, or scale-dtype overflow."""
    if scale.numel() and not bool(torch.isfinite(scale).all()):
        require_finite(name, x)
        dtype = scale.dtype
        raise ValueError(
            f"{name}: a group's range is too wide for {_dtype_name(dtype)} scales "
            f"(its scale exceeds {torch.finfo(dtype).max:g}); use scale_dtype=torch.float32"
        )


def _check_kv(k, v) -> None:
    _check_tensor("k", k)
    _check_tensor("v", v)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, H, S, D]; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.dtype != v.dtype:
        raise TypeError(f"k and v must have the same dtype; got k {_dtype_name(k.dtype)}, v {_dtype_name(v.dtype)}")
    if k.shape[1] == 0 or k.shape[3] == 0:
        raise ValueError(f"k and v need at least one head and one channel (H, D >= 1); got shape {tuple(k.shape)}")
    require_same_device(k=k, v=v)


# ----------------------------------------------------------------------------- AOT specializations
_TRITON_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def _aot_configs():
    """(input dtype, bits, group size, scale dtype): every bit width and every group size
    once, and the other input and scale dtypes at the defaults; K and V each."""
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    configs = [(f16, bits, 64, f16) for bits in BIT_WIDTHS]
    configs += [(f16, 3, g, f16) for g in GROUP_SIZES if g != 64]
    configs += [(f16, 3, 64, f32), (bf16, 3, 64, f16), (f32, 3, 64, f32)]
    return configs


# Multiples of 16 when K/V are contiguous [B, H, S, 128] and S, capacity and offsets are whole
# groups: how a launch specializes them, so the AOT build is the kernel that runs.
_CONTIGUOUS_MULTIPLES = ("src_tokens", "capacity", "tok_offset", "stride_b", "stride_h", "stride_t")


def _aot_specs() -> list[AotSpec]:
    specs = []
    for dtype, bits, group_size, scale_dtype in _aot_configs():
        for per_channel in (True, False):
            side = "k" if per_channel else "v"
            tile = default_tile(group_size, per_channel, 128)
            name = f"quantize_{side}_{_dtype_name(dtype)}_b{bits}_g{group_size}_{_dtype_name(scale_dtype)}"
            stype = _TRITON_TYPES[scale_dtype]
            signature = {
                "source": {"src": _TRITON_TYPES[dtype], "heads": "i32", "src_tokens": "i32", "stride_b": "i64",
                           "stride_h": "i64", "stride_t": "i64", "stride_d": "i64"},
                "cache": {"codes": "*u8", "scale": stype, "zero": stype, "capacity": "i32", "tok_offset": "i32"},
                "errors": "*i32",
            }
            constexprs = {
                "stride_d": 1, "D": 128, "G": group_size, "BITS": bits, "PER_CHANNEL": per_channel,
                "SCALE_FP16": scale_dtype == torch.float16, "FLOOR": SCALE_FLOOR[scale_dtype],
                "SCALE_MAX": torch.finfo(scale_dtype).max, "FLAG_ERRORS": True,
                "INTERPRET": False, "TOKENS": tile.tokens, "CHANNELS": tile.channels, "EVEN_TOKENS": True,
            }
            specs.append(AotSpec(name, _quantize_kernel, signature, constexprs, tile.warps,
                                 divisible_ints=_CONTIGUOUS_MULTIPLES))
    return specs


AOT_SPECS = _aot_specs()
