"""The fused decode's Triton kernels (docs/design.md section 6): device code only; their launch
configuration and split plan are in :mod:`kvbits.decode.launch`.

Two kernels:

1. ``_decode_split_kernel``, grid ``(splits + parts, Hkv, B)``: program ``s < splits``
   walks tiles of ``BLOCK_T`` quantized tokens (inside one K scale group and one page)
   and keeps an online softmax (running max, per-token sums, accumulators) for the
   ``Hq / Hkv`` query heads of its kv head, so each K/V tile is loaded once for the whole
   group. Both tensor-core products take the code tiles as their A operand (tokens as M for
   the logits, channels as M for the output) and the query heads as N (8 or more, 16 before
   triton 3.5): each head's hi and lo column of q * s for the logits (mma_columns), one column
   of weights per head for the output (weight_columns). Each thread loads
   exactly the words of its own operand fragment (the tile arrangement of
   :mod:`kvbits.decode.layout`) and turns two codes into the fp16 pair the tensor cores read with a
   mask (and a shift for fields higher up):
   ``w & 0x00070007`` read as two fp16 numbers is the subnormals code * 2^-24,
   ``w & 0x00380038`` the subnormals code * 2^-21 and, with 64-token tiles,
   ``w & 0x01C001C0`` code * 2^-18, exact, and the tensor cores multiply them exactly (the
   power of two is applied to the fp32 results). For 3 bits the codes come out in these
   classes by their reduction index (bit 1; class 2 where bits 4 and 5 are set), and a factor
   1/8 or 1/64 on the other operand (q per channel, p per token) makes them all count as
   code * 2^-24 (_class_factors; the operands only shrink, so their fp16 range is that of
   q * s and p * s). Scales never touch the codes: K scales are folded into q per tile
   (on the one query head when Hq = Hkv, whose hi and lo words reach the operand by a gather,
   _q_operand; for GQA q is held channel-major, a channel's heads in neighbouring lanes, the
   order in which q*s's columns go to shared memory for the product: a head-major q stored
   them with bank conflicts) and V scales into p per channel
   group (each group's codes unpacked from its own words, or its own registers of a word,
   _load_tile_parts); zero points
   become a rank-1 correction (one bias per head for K, a sum over the tokens for V, per
   channel group). A tile's scales and zeros are loaded a tile ahead, 16-bit ones as 32-bit words
   where the rows allow it (two K channels, or a token's two V groups, a word: scale_words), and
   widened to fp32 only when their tile is attended, so nothing waits on them in the tile that
   loads them; the next tile's page position comes by increment (no division per tile). The
   rounding of q*s to fp16 is split into a hi and a lo column per head, so the logits carry
   about 22 bits (fewer once a low part falls below fp16's normal range, 3 and 6 bits sooner for
   the operands taken with 1/8 and 1/64): an error in a logit is an error in its weight's
   exponent. The weights p*s are rounded once to fp16, as flash attention rounds its
   probabilities (a relative 2^-12 on each term of the output, below the fp16 output's own
   rounding), and reach the V product's B operand from the logits' accumulator by a gather
   that compiles to one warp shuffle per operand register (_weight_operand): V tiles keep their
   tokens in the order that makes it so (:func:`kvbits.decode.layout.kernel_token_order`). Only the sequence's
   last code tile, which may end past the attended length, is masked (the loop over whole
   tiles has no token mask). The last programs attend the fp tokens, a group's rows each: the
   sinks and the ring (the partial group and the window before it). Each writes a
   normalized partial output and its log-sum-exp (base 2).
2. ``_decode_merge_kernel``, grid ``(Hq, B, D / MERGE_COLUMNS)``: merges the partials by
   log-sum-exp, one warp per 32 channels of a query head.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
UNIT_INV = tl.constexpr(16777216.0)  # 2^24: the products count codes as code * 2^-24 (_class_factors)
# Both 16-bit halves of a 32-bit register widened to fp32, low half to $0 (_widen, _widen_pair)
WIDEN_F16_PAIR = tl.constexpr("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }")
WIDEN_BF16_PAIR = tl.constexpr("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.bf16 $0, lo; cvt.f32.bf16 $1, hi; }")


@triton.jit
def _field(w, SHIFT: tl.constexpr, FIELD: tl.constexpr):
    return (w >> SHIFT) & FIELD


@triton.jit
def _join4(w, START: tl.constexpr, STEP: tl.constexpr, FIELD: tl.constexpr):
    return tl.join(tl.join(_field(w, START, FIELD), _field(w, START + STEP, FIELD)),
                   tl.join(_field(w, START + 2 * STEP, FIELD), _field(w, START + 3 * STEP, FIELD)))


@triton.jit
def _join8(a0, a1, a2, a3, a4, a5, a6, a7):
    return tl.join(tl.join(tl.join(a0, a1), tl.join(a2, a3)), tl.join(tl.join(a4, a5), tl.join(a6, a7)))


@triton.jit
def _three_bit_pairs(w0, w1, w2, CLASSES: tl.constexpr):
    """The 16 register pairs of a 3-bit group (twin: kvbits.decode.layout.three_bit_classes), joined last
    by bit 0 of the register index: pairs of codes at bits 0-2 of their half-words (read as fp16,
    code * 2^-24), at bits 3-5 (code * 2^-21) and, with CLASSES = 3, at bits 6-8 (code * 2^-18),
    each taken with one AND per pair after at most one shift (the last pair gathers bit 15 of the
    three planes). Two classes: the fields at bits 6-14 come down by shifts of 6, 9 and 12, 26
    machine instructions for 32 values (8 shifts, 18 LOP3, which fuse each OR with an AND), 33
    when every field was shifted down; the class is bit 1 of the value's index, hence of its
    reduction index in the tile. Three classes: one shift of 9 per plane, the fields at bits 6-8
    read where they are, 23 instructions (5 shifts, 18 LOP3); the class is 2 where bits 2 and 3
    of the value's index are set (_class_factors)."""
    LOW: tl.constexpr = 0x00070007
    HIGH: tl.constexpr = 0x00380038
    if CLASSES == 3:
        TOP: tl.constexpr = 0x01C001C0
        w0s9 = w0 >> 9
        w1s9 = w1 >> 9
        w2s9 = w2 >> 9
        last = (w0s9 & 0x00400040) | ((w1 >> 8) & 0x00800080) | ((w2 >> 7) & 0x01000100)
        evens = _join8(w0 & LOW, w1 & LOW, w2 & LOW, w0s9 & LOW, w1s9 & LOW, w2s9 & LOW, w0 & TOP, w1 & TOP)
        odds = _join8(w0 & HIGH, w1 & HIGH, w2 & HIGH, w0s9 & HIGH, w1s9 & HIGH, w2s9 & HIGH, w2 & TOP, last)
    else:
        w0s6 = w0 >> 6
        w1s6 = w1 >> 6
        w2s6 = w2 >> 6
        w0s12 = w0 >> 12
        w2s12 = w2 >> 12
        w1s9 = w1 >> 9
        last = (w0s12 & 0x00080008) | ((w1 >> 11) & 0x00100010) | ((w2 >> 10) & 0x00200020)
        evens = _join8(w0 & LOW, w1 & LOW, w2 & LOW, w0s6 & LOW, w1s6 & LOW, w2s6 & LOW, w0s12 & LOW, w2s12 & LOW)
        odds = _join8(w0 & HIGH, w1 & HIGH, w2 & HIGH, w0s6 & HIGH, w1s6 & HIGH, w2s6 & HIGH, w1s9 & HIGH, last)
    return tl.join(evens, odds)


@triton.jit
def _code_pairs(w0, w1, w2, w3, BITS: tl.constexpr, CLASSES: tl.constexpr):
    """Planes uint32 [T, NRG] -> uint32 [T, NRG, 2, 2, 2, 2]: each group's 16 registers of two
    masked code fields, register r of a group at index bits (r3, r2, r1, r0). Read as two fp16
    numbers (_place_pairs) a register holds code * 2^-24 (3 bits: code * 2^-24, 2^-21 or 2^-18
    by class, _three_bit_pairs), fp16 subnormals whose bit patterns are the masked fields, as the
    tensor cores take them. Twin of kvbits.decode.layout.unpack_group; every step stays in registers."""
    if BITS == 2:
        F: tl.constexpr = 0x00030003
        pairs = tl.join(tl.join(_join4(w0, 0, 2, F), _join4(w0, 8, 2, F)),
                        tl.join(_join4(w1, 0, 2, F), _join4(w1, 8, 2, F)))
    elif BITS == 3:
        pairs = _three_bit_pairs(w0, w1, w2, CLASSES)
    else:
        F4: tl.constexpr = 0x000F000F
        pairs = tl.join(tl.join(_join4(w0, 0, 4, F4), _join4(w1, 0, 4, F4)),
                        tl.join(_join4(w2, 0, 4, F4), _join4(w3, 0, 4, F4)))
    return pairs


@triton.jit
def _class_factors(k, BITS: tl.constexpr, CLASSES: tl.constexpr):
    """(factor, 1 / factor) fp32 for reduction indices k of a tile: the other operand's factor that
    makes every code, as the kernel holds it, count as code * 2^-24: for 3 bits 8^-class, the class
    being bit 1 of k (codes held as code * 2^-24 or code * 2^-21), and with CLASSES = 3 class 2
    (code * 2^-18) where bits 4 and 5 of k are set; 1 throughout for 2 and 4 bits. A factor below 1
    keeps every fp16 operand within the range it had (q * s and p * s only shrink); the zero
    points take 1 / factor."""
    if BITS == 3:
        cls = (k >> 1) & 1
        if CLASSES == 3:
            cls = tl.where((k & 48) == 48, 2, cls)
        return (tl.where(cls == 0, 1.0, tl.where(cls == 1, 0.125, 0.015625)),
                tl.where(cls == 0, 1.0, tl.where(cls == 1, 8.0, 64.0)))
    else:
        one = (k * 0 + 1).to(tl.float32)
        return one, one


@triton.jit
def _v_index(t):
    """The V product's reduction index of natural token t of a tile (the inverse of
    kvbits.decode.layout.kernel_token_order: within each 16, token 8b + 2c + a at 4c + 2a + b)."""
    return (t & ~15) | ((t & 7) << 1) | ((t >> 3) & 1)


@triton.jit
def _halves(w, DT: tl.constexpr):
    """uint32 [...] -> DT (a 16-bit type) [..., 2]: the low and the high half of each word, bit for
    bit, by integer ops, which mean the same in every layout."""
    return tl.join((w & 0xFFFF).to(tl.uint16), (w >> 16).to(tl.uint16)).to(DT, bitcast=True)


@triton.jit
def _fp16_pairs(pairs, INTERPRET: tl.constexpr):
    """uint32 [...] -> fp16 [..., 2] as _halves. Compiled, an opaque move, so that the compiler keeps
    each word whole as the register the tensor cores read (seen through, it splits the shifts and
    masks into 16-bit halves and packs them again). The move takes its two outputs from the
    registers the layout puts side by side, the join's two halves in the operand layouts
    _place_pairs gives it; elsewhere (the gathered words) _halves is the safe reading, and there
    the compiler keeps the words whole by itself."""
    if INTERPRET:
        return _halves(pairs, tl.float16)
    else:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [tl.join(pairs, pairs)],
                                         dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _load_run(ptr, T: tl.constexpr, R: tl.constexpr):
    """Each thread's R consecutive words (one 4 * R byte access): uint32 [T, R]."""
    w = tl.load(ptr + tl.arange(0, T)[:, None] * R + tl.arange(0, R)[None, :])
    return w.to(tl.uint32, bitcast=True)


@triton.jit
def _load_plane(ptr, PLANE: tl.constexpr, NRG: tl.constexpr, T: tl.constexpr):
    """Plane PLANE of the thread's NRG groups, in runs of up to 4 words per thread (kvbits.decode.layout):
    uint32 [T, NRG]."""
    R: tl.constexpr = NRG if NRG < 4 else 4
    base = ptr + PLANE * NRG * T
    w = _load_run(base, T, R)
    if NRG == 8:
        w = tl.reshape(tl.permute(tl.join(w, _load_run(base + 4 * T, T, R)), (0, 2, 1)), [T, 8])
    return w


@triton.jit
def _load_words(ptr, NRG: tl.constexpr, T: tl.constexpr, BITS: tl.constexpr):
    """The BITS planes of the thread's NRG groups of one tile: uint32 [T, NRG] each (planes past
    BITS repeat plane 1 and are not read)."""
    w0 = _load_plane(ptr, 0, NRG, T)
    w1 = _load_plane(ptr, 1, NRG, T)
    w2 = w1
    w3 = w1
    if BITS >= 3:
        w2 = _load_plane(ptr, 2, NRG, T)
    if BITS == 4:
        w3 = _load_plane(ptr, 3, NRG, T)
    return w0, w1, w2, w3


@triton.jit
def _place_pairs(pairs, N: tl.constexpr, K: tl.constexpr, WARPS: tl.constexpr, INTERPRET: tl.constexpr):
    """Per-thread code registers uint32 [T, ...] (_code_pairs, in value order) of an [N, K] tile
    -> fp16 [N, K] holding the codes as exact subnormals (code * 2^-24, and for 3 bits
    code * 2^-21 or 2^-18 by the class of the K index, _class_factors), already in the register
    layout of a tensor-core operand (kvbits.decode.layout: reshape, permute, reshape)."""
    vals = tl.reshape(_fp16_pairs(pairs, INTERPRET), [8 * WARPS, 4, N // (8 * WARPS), K // 16, 4])
    return tl.reshape(tl.permute(vals, (2, 0, 3, 1, 4)), [N, K])


@triton.jit
def _load_tile(ptr, N: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr, CLASSES: tl.constexpr, WARPS: tl.constexpr,
               INTERPRET: tl.constexpr):
    """Decode-arranged words of one tile -> fp16 [N, K] held codes (_place_pairs)."""
    return _load_tile_parts(ptr, N, K, 1, BITS, CLASSES, WARPS, INTERPRET)[0]


@triton.jit
def _split_rows(x, T: tl.constexpr, PARTS: tl.constexpr):
    """Per-thread values [T, R] -> a tuple of PARTS [T, R / PARTS], part j the thread's values
    j R / PARTS to (j + 1) R / PARTS - 1, in order (PARTS 1, 2 or 4)."""
    R: tl.constexpr = x.shape[1] // PARTS
    if PARTS == 1:
        return (x,)
    elif PARTS == 2:
        first, last = tl.split(tl.permute(tl.reshape(x, [T, 2, R]), (0, 2, 1)))
        return first, last
    else:
        # [T, R, high bit, low bit] of the part's index, split by the low bit, then the high one
        low0, low1 = tl.split(tl.permute(tl.reshape(x, [T, 2, 2, R]), (0, 3, 1, 2)))
        p0, p2 = tl.split(low0)
        p1, p3 = tl.split(low1)
        return p0, p1, p2, p3


@triton.jit
def _load_tile_parts(ptr, N: tl.constexpr, K: tl.constexpr, PARTS: tl.constexpr, BITS: tl.constexpr,
                     CLASSES: tl.constexpr, WARPS: tl.constexpr, INTERPRET: tl.constexpr):
    """_load_tile as a tuple of PARTS (1, 2 or 4) row blocks, fp16 [N / PARTS, K] each, part j
    rows [j N / PARTS, (j + 1) N / PARTS): a V tile's channel groups. The top bits of a row are
    the top bits of the thread's value index (_place_pairs): split first as whole words (the
    thread's groups), then, where a part is one group, as its registers (index bits r3, r2 of
    _code_pairs). Either way each part is unpacked straight into its own operand layout (no
    16-bit halves to regroup)."""
    T: tl.constexpr = 32 * WARPS
    NRG: tl.constexpr = N * K // (T * 32)
    WORD_PARTS: tl.constexpr = PARTS if NRG >= PARTS else NRG
    REG_PARTS: tl.constexpr = PARTS // WORD_PARTS
    w0, w1, w2, w3 = _load_words(ptr, NRG, T, BITS)
    a0 = _split_rows(w0, T, WORD_PARTS)
    a1 = _split_rows(w1, T, WORD_PARTS)
    a2 = _split_rows(w2, T, WORD_PARTS)
    a3 = _split_rows(w3, T, WORD_PARTS)
    pairs = _code_pairs(a0[0], a1[0], a2[0], a3[0], BITS, CLASSES)
    REGS: tl.constexpr = 16 * NRG // WORD_PARTS  # registers of a word part (_code_pairs)
    parts = _place_parts(pairs, T, REGS, N // PARTS, K, REG_PARTS, WARPS, INTERPRET)
    for j in tl.static_range(1, WORD_PARTS):
        pairs = _code_pairs(a0[j], a1[j], a2[j], a3[j], BITS, CLASSES)
        parts = parts + _place_parts(pairs, T, REGS, N // PARTS, K, REG_PARTS, WARPS, INTERPRET)
    return parts


@triton.jit
def _place_parts(pairs, T: tl.constexpr, REGS: tl.constexpr, N: tl.constexpr, K: tl.constexpr, PARTS: tl.constexpr,
                 WARPS: tl.constexpr, INTERPRET: tl.constexpr):
    """_code_pairs registers of whole groups -> a tuple of PARTS [N, K] operands, split by the
    registers' top index bits (_split_rows)."""
    if PARTS == 1:
        return (_place_pairs(pairs, N, K, WARPS, INTERPRET),)
    else:
        regs = _split_rows(tl.reshape(pairs, [T, REGS]), T, PARTS)
        placed = (_place_pairs(regs[0], N, K, WARPS, INTERPRET),)
        for i in tl.static_range(1, PARTS):
            placed = placed + (_place_pairs(regs[i], N, K, WARPS, INTERPRET),)
        return placed


@triton.jit
def _online_update(m, l, acc, qk, v, valid):
    """One flash-decoding step. qk [M, T] fp32 (log2 domain), v [T, D], valid [T] bool."""
    qk = tl.where(valid[None, :], qk, float("-inf"))
    m_new = tl.maximum(m, tl.max(qk, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l, acc


@triton.jit
def _hi_lo(x):
    """fp32 x -> (fl16(x), fl16(x - fl16(x))): an fp16 pair whose sum carries about 22 bits."""
    hi = x.to(tl.float16)
    return hi, (x - hi.to(tl.float32)).to(tl.float16)


@triton.jit
def _fold_k_scales(q32, ks, kz, HALF: tl.constexpr, D: tl.constexpr, INTERPRET: tl.constexpr):
    """K scales [D] folded into q32 [D, QROWS] (one query head per column): (the K product's B
    operand fp16 [D, 2 HALF], bias [HALF] = (q*s) . zero). Columns 2 h and 2 h + 1 hold head h's
    hi(q*s) = fl16(q*s) and lo(q*s) = fl16(q*s - hi), whose sum carries about 22 bits.

    With one query head per kv head (QROWS = 1) every head slot repeats it (and every bias entry
    its bias): each thread packs its channel pairs' hi and lo into 32-bit words where they are
    computed and the words are gathered into the operand's registers (_q_operand; no shared
    memory). For GQA (QROWS = HALF) each head's hi and lo join into its two columns where they
    are, and the compiler takes the operand through shared memory (a gather there shuffles more
    and spills)."""
    x = q32 * ks[:, None]
    bias = tl.sum(x * kz[:, None], 0)
    if q32.shape[1] == 1:
        return _q_operand(x, HALF, D, INTERPRET), tl.zeros([HALF], tl.float32) + bias
    else:
        hi, lo = _hi_lo(x)
        return tl.reshape(tl.join(hi, lo), [D, 2 * HALF]), bias


@triton.jit
def _q_operand(x, HALF: tl.constexpr, D: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 q*s [D, 1] of one query head -> fp16 [D, 2 HALF], column n its hi (n even) or lo (n odd)."""
    hi = x.to(tl.float16).to(tl.float32)
    hi_even, hi_odd = tl.split(tl.reshape(hi, [D // 2, 2]))
    lo_even, lo_odd = tl.split(tl.reshape(x - hi, [D // 2, 2]))
    words = tl.reshape(tl.join(_f16x2(hi_even, hi_odd, INTERPRET), _f16x2(lo_even, lo_odd, INTERPRET)), [D])
    pair = tl.arange(0, D // 2)[:, None]
    n = tl.arange(0, 2 * HALF)[None, :]
    index = tl.reshape(2 * pair + n % 2, [D * HALF])
    halves = tl.reshape(_halves(tl.gather(words, index, 0), tl.float16), [D // 2, 2 * HALF, 2])
    return tl.reshape(tl.permute(halves, (0, 2, 1)), [D, 2 * HALF])


@triton.jit
def _head_cols(x, HALF: tl.constexpr, VCOLS: tl.constexpr):
    """[HALF] per head slot -> [VCOLS], the V product's columns: slot n // (VCOLS / HALF) in
    column n (two neighbouring columns a slot where VCOLS = 2 HALF, as the logits' accumulator
    holds the slots: no shuffle)."""
    if VCOLS == HALF:
        return x
    else:
        return tl.reshape(tl.join(x, x), [VCOLS])


@triton.jit
def _head_part(acc, G: tl.constexpr, HALF: tl.constexpr, VCOLS: tl.constexpr):
    """V accumulator [G, VCOLS] -> [G, HALF]: each head slot's first column (_head_cols)."""
    if VCOLS == HALF:
        return acc
    else:
        first, _ = tl.split(tl.reshape(acc, [G, HALF, 2]))
        return first


@triton.jit
def _f16x2(lo, hi, INTERPRET: tl.constexpr):
    """fp32 lo, hi -> uint32 words holding fl16(lo) in the low and fl16(hi) in the high half (one
    round-to-nearest-even convert of both, compiled)."""
    if INTERPRET:
        lo16 = lo.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
        hi16 = hi.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
        return lo16 | (hi16 << 16)
    else:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.uint32,
                                         is_pure=True, pack=1)


@triton.jit
def _weight_operand(w, T: tl.constexpr, HALF: tl.constexpr, VCOLS: tl.constexpr, INTERPRET: tl.constexpr):
    """Softmax weights with the V scales folded in, fp32 [T, HALF] (natural token order, the
    logits' accumulator layout) -> the V product's B operand fp16 [T, VCOLS]: row k holds token
    kvbits.decode.layout.kernel_token_order[k] (16 j + 4 c + 2 a + b: token 16 j + 8 b + 2 c + a),
    column n head slot n // (VCOLS / HALF) (_head_cols), each weight rounded once to fp16 (as flash
    attention rounds its probabilities; the output's own fp16 rounding is larger). Tokens t and t + 8 of each 16, which
    one thread holds in the logits' accumulator, are packed into one 32-bit word where they are,
    and the words gathered into the rows the tensor cores read: with one warp, one shuffle per
    register of the operand (the rows' order is chosen for that)."""
    lo, hi = tl.split(tl.permute(tl.reshape(w, [T // 16, 2, 8, HALF]), (0, 2, 3, 1)))  # tokens 16 i + r, + 8
    words = tl.reshape(_f16x2(lo, hi, INTERPRET), [T // 16 * 8 * HALF])
    j = tl.arange(0, T // 16)[:, None, None, None]
    c = tl.arange(0, 4)[None, :, None, None]
    a = tl.arange(0, 2)[None, None, :, None]
    n = tl.arange(0, VCOLS)[None, None, None, :]
    index = tl.reshape((8 * j + 2 * c + a) * HALF + n // (VCOLS // HALF), [T // 16 * 8 * VCOLS])
    halves = tl.reshape(_halves(tl.gather(words, index, 0), tl.float16), [T // 16, 4, 2, VCOLS, 2])
    return tl.reshape(tl.permute(halves, (0, 1, 2, 4, 3)), [T, VCOLS])


@triton.jit
def _v_group(acc, zacc, p, alpha, v, s, z, HALF: tl.constexpr, VCOLS: tl.constexpr, BLOCK_T: tl.constexpr,
             INTERPRET: tl.constexpr):
    """V product of one channel group with its per-token scale s [T] folded into p [T, HALF].

    acc [G, VCOLS] += (held code) @ fl16(p * s) (_weight_operand); zacc [HALF] += sum over the
    tile's tokens of (p * s) * z (2^24 acc - zacc is the dequantized product). s and z are fp32
    [T], s with the class factors folded in and z divided by them; v [G, T] holds its tokens in
    kvbits.decode.layout's V tile order.
    """
    ps32 = p * s[:, None]
    ps = _weight_operand(ps32, BLOCK_T, HALF, VCOLS, INTERPRET)
    acc = tl.dot(v, ps, acc * _head_cols(alpha, HALF, VCOLS)[None, :])
    zacc = zacc * alpha + tl.sum(ps32 * z[:, None], 0)
    return acc, zacc


@triton.jit
def _tile_params(
    pool, h, page, page_idx, off, t0, live, code_len, D: tl.constexpr, G: tl.constexpr,
    BLOCK_T: tl.constexpr, SCALE_WORDS: tl.constexpr,
):
    """The fetched tile at token t0 of its sequence, token off of its page_idx-th block-table entry
    (page, _page): its position (page, page_idx, off) and its scales (K scale and zero [D] per
    channel, V scales and zeros: tuples of D / G [T], one per channel group) as loaded (masked
    tokens read as 0): widened to fp32 only where the tile is attended (_tile_scales), a tile later, so that
    nothing waits on these loads in the tile that issues them. SCALE_WORDS (16-bit scales, two V
    groups per token, 4-byte aligned rows, scale_words): K scales and zeros come as uint32
    [D / 4, 2] words of two channels, each token's two V scales (and zeros) as one uint32 word
    (a tuple of one word), which needs no packing of 16-bit halves after the load.
    Loaded one tile ahead of their use by plain loads (the code words come through the compiler's
    pipelined asynchronous copies)."""
    NGV: tl.constexpr = D // G
    k_words, k_scales, v_words, v_scales, pages = pool
    ks_ptr, kz_ptr, stride_ks_p, stride_ks_h, stride_ks_g = k_scales
    vs_ptr, vz_ptr, stride_vs_p, stride_vs_h, stride_vs_t = v_scales
    d = tl.arange(0, D)
    tt = tl.arange(0, BLOCK_T)
    krow = page * stride_ks_p + h * stride_ks_h + (off // G) * stride_ks_g
    # Vector masks built by a vector comparison: triton 3.9's interpreter keeps a scalar
    # comparison's result as int32 data, which `&` would carry into a load mask it rejects.
    if SCALE_WORDS:
        # words as [D / 4, 2]: a [T]-shaped load would share its per-thread vector width with the V
        # scale loads (the compiler's coalescing groups loads of one shape), which want one per thread
        dw = tl.reshape(tl.arange(0, D // 2), [D // 4, 2])
        kword = krow // 2 + dw
        w_live = dw < tl.where(live, D // 2, 0)
        ks = tl.load(ks_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + kword, mask=w_live, other=0)
        kz = tl.load(kz_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + kword, mask=w_live, other=0)
    else:
        k_live = d < tl.where(live, D, 0)
        ks = tl.load(ks_ptr + krow + d, mask=k_live, other=0.0)
        kz = tl.load(kz_ptr + krow + d, mask=k_live, other=0.0)
    vbase = page * stride_vs_p + h * stride_vs_h + (off + tt) * stride_vs_t
    valid = (t0 + tt < code_len) & (tt < tl.where(live, BLOCK_T, 0))
    if SCALE_WORDS:
        vs = (tl.load((vs_ptr + vbase).to(tl.pointer_type(tl.uint32)), mask=valid, other=0),)
        vz = (tl.load((vz_ptr + vbase).to(tl.pointer_type(tl.uint32)), mask=valid, other=0),)
    else:
        vs = (tl.load(vs_ptr + vbase, mask=valid, other=0.0),)
        vz = (tl.load(vz_ptr + vbase, mask=valid, other=0.0),)
        for g in tl.static_range(1, NGV):
            vs = vs + (tl.load(vs_ptr + vbase + g, mask=valid, other=0.0),)
            vz = vz + (tl.load(vz_ptr + vbase + g, mask=valid, other=0.0),)
    return (page, page_idx, off), (ks, kz, vs, vz)


@triton.jit
def _page(pages, b, page_idx, live):
    """Block-table entry page_idx of sequence b (0 where not live), as int64."""
    bt_ptr, stride_bt_b, table_cols, page_size = pages
    return tl.load(bt_ptr + b * stride_bt_b + page_idx, mask=live, other=0).to(tl.int64)


@triton.jit
def _code_length(lengths, b, G: tl.constexpr, SINKS: tl.constexpr, WINDOW: tl.constexpr):
    """(tokens attended, end of those attended from codes, tokens in whole groups) of sequence b:
    codes are attended from SINKS on, up to the length or the window before the partial group
    (twin: kvbits.decode.paged.code_end)."""
    lens_ptr, cache_lens_ptr = lengths
    length = tl.load(lens_ptr + b)
    full = (tl.load(cache_lens_ptr + b) // G) * G
    return length, tl.maximum(tl.minimum(length, full - WINDOW), SINKS), full


@triton.jit
def _next_position(page_idx, off, page_size, BLOCK_T: tl.constexpr):
    """(page_idx, off) of the tile after the one at token off of block-table entry page_idx (page
    sizes are multiples of the tile): no division per tile."""
    off = off + BLOCK_T
    wrap = (off >= page_size).to(tl.int32)
    return page_idx + wrap, off - wrap * page_size


@triton.jit
def _widen(x, INTERPRET: tl.constexpr):
    """fp16 / bf16 / fp32 -> fp32 where it stands: compiled, an opaque cvt of two values at a time
    (a 32-bit register), so that the compiler neither moves it next to the load it waits on nor
    repeats it in the products' wider layouts."""
    if INTERPRET or x.dtype == tl.float32:
        return x.to(tl.float32)
    elif x.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(WIDEN_BF16_PAIR, "=r,=r,r", [x], dtype=tl.float32, is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise(WIDEN_F16_PAIR, "=r,=r,r", [x], dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _widen_pair(w, scale_dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """uint32 words of two 16-bit scales (scale_dtype: fp16 or bf16; low half first) -> (low, high) fp32."""
    if INTERPRET:
        lo, hi = tl.split(_halves(w, scale_dtype))
        return lo.to(tl.float32), hi.to(tl.float32)
    elif scale_dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(WIDEN_BF16_PAIR, "=r,=r,r", [w], dtype=(tl.float32, tl.float32),
                                         is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(WIDEN_F16_PAIR, "=r,=r,r", [w], dtype=(tl.float32, tl.float32),
                                         is_pure=True, pack=1)


@triton.jit
def _channel_pairs(w, SDT: tl.constexpr, INTERPRET: tl.constexpr):
    """uint32 [D / 4, 2], word (i, j) holding channels 4 i + 2 j and 4 i + 2 j + 1 -> fp32 [D]."""
    lo, hi = _widen_pair(w, SDT, INTERPRET)
    return tl.reshape(tl.join(lo, hi), [4 * w.shape[0]])


@triton.jit
def _tile_scales(scales, SDT: tl.constexpr, NGV: tl.constexpr, SCALE_WORDS: tl.constexpr, INTERPRET: tl.constexpr):
    """A tile's scales and zeros as _tile_params loaded them -> fp32 (ks, kz [D]; vs, vz: tuples of
    NGV [T], one per V channel group)."""
    ks, kz, vs, vz = scales
    if SCALE_WORDS:
        ks = _channel_pairs(ks, SDT, INTERPRET)
        kz = _channel_pairs(kz, SDT, INTERPRET)
        vs = _widen_pair(vs[0], SDT, INTERPRET)
        vz = _widen_pair(vz[0], SDT, INTERPRET)
    else:
        ks = _widen(ks, INTERPRET)
        kz = _widen(kz, INTERPRET)
        vs_words, vz_words = vs, vz
        vs = (_widen(vs_words[0], INTERPRET),)
        vz = (_widen(vz_words[0], INTERPRET),)
        for g in tl.static_range(1, NGV):
            vs = vs + (_widen(vs_words[g], INTERPRET),)
            vz = vz + (_widen(vz_words[g], INTERPRET),)
    return ks, kz, vs, vz


@triton.jit
def _code_tile(
    state, fetched, pool, q32, h, tile, code_len, HALF: tl.constexpr, VCOLS: tl.constexpr, D: tl.constexpr,
    G: tl.constexpr, BITS: tl.constexpr, CLASSES: tl.constexpr, SCALE_WORDS: tl.constexpr, BLOCK_T: tl.constexpr,
    WARPS: tl.constexpr, INTERPRET: tl.constexpr, MASKED: tl.constexpr,
):
    """Attend one tile of BLOCK_T quantized tokens (one page, one K scale group) and return the
    softmax state (m, l_acc, accs, zaccs: one V accumulator and zero sum per channel group);
    fetched is the tile's position and scales (_tile_params).
    MASKED: the tile may end past code_len (the sequence's last code tile), whose logits beyond
    it are -inf.

    K: the tile's per-channel scales are folded into q (q * s, split into an fp16 hi and lo
    column per head, the N dimension) and its zero points become one bias per head, so the
    codes enter the tensor cores (A operand, tokens as M) as they are unpacked, code * 2^-24
    (3 bits: or code * 2^-21 and 2^-18, where q carries 1/8 and 1/64, _class_factors), exact fp16
    subnormals which the tensor cores multiply exactly; the fp32 results are scaled back by 2^24:
    logits = 2^24 (held code) @ (q*s*f) - (q*s) . zero, hi and lo columns summed. Small operands
    (codes, not 1024 + code as the fp16 magic number would give) keep the tensor-core
    accumulation exact enough over 100K tokens.
    V: per-token scales folded into p, rounded once to fp16, one product per channel group (_v_group).
    """
    NGV: tl.constexpr = D // G
    m, l_acc, accs, zaccs = state
    position, scales = fetched
    page, page_idx, off = position
    k_words, k_scales, v_words, v_scales, pages = pool
    kw_ptr, stride_kw_p, stride_kw_h, stride_kw_t = k_words
    vw_ptr, stride_vw_p, stride_vw_h, stride_vw_t = v_words
    ks_ptr, kz_ptr, stride_ks_p, stride_ks_h, stride_ks_g = k_scales
    ks, kz, vs, vz = _tile_scales(scales, ks_ptr.dtype.element_ty, NGV, SCALE_WORDS, INTERPRET)
    kinv = _class_factors(tl.arange(0, D), BITS, CLASSES)[1]  # q32 carries the factors (_code_partial)
    qs, bias = _fold_k_scales(q32, ks, kz * kinv, HALF, D, INTERPRET)
    kptr = kw_ptr + page * stride_kw_p + h * stride_kw_h + (off // BLOCK_T) * stride_kw_t
    k_codes = _load_tile(kptr, BLOCK_T, D, BITS, CLASSES, WARPS, INTERPRET)  # [BLOCK_T, D], held codes
    qk = tl.sum(tl.reshape(tl.dot(k_codes, qs), [BLOCK_T, HALF, 2]), 2) * UNIT_INV - bias[None, :]
    if MASKED:
        valid = tile * BLOCK_T + tl.arange(0, BLOCK_T) < code_len
        qk = tl.where(valid[:, None], qk, float("-inf"))  # [BLOCK_T, HALF], log2 domain
    m_new = tl.maximum(m, tl.max(qk, 0))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(qk - m_new[None, :])
    l_acc = l_acc * alpha[None, :] + p

    vptr = vw_ptr + page * stride_vw_p + h * stride_vw_h + (off // BLOCK_T) * stride_vw_t
    # the class of V token t: by its reduction index (kernel_token_order)
    vf, vinv = _class_factors(_v_index(tl.arange(0, BLOCK_T)), BITS, CLASSES)
    v_codes = _load_tile_parts(vptr, D, BLOCK_T, NGV, BITS, CLASSES, WARPS, INTERPRET)  # [G, BLOCK_T] held codes each
    acc, zacc = _v_group(accs[0], zaccs[0], p, alpha, v_codes[0], vs[0] * vf, vz[0] * vinv, HALF, VCOLS, BLOCK_T,
                         INTERPRET)
    new_accs, new_zaccs = (acc,), (zacc,)
    for g in tl.static_range(1, NGV):
        acc, zacc = _v_group(accs[g], zaccs[g], p, alpha, v_codes[g], vs[g] * vf, vz[g] * vinv, HALF, VCOLS, BLOCK_T,
                             INTERPRET)
        new_accs, new_zaccs = new_accs + (acc,), new_zaccs + (zacc,)
    return m_new, l_acc, new_accs, new_zaccs


@triton.jit
def _store_partial(partials, b, heads, split, out, col0, keep, X: tl.constexpr):
    mid_o_ptr, stride_mo_b, stride_mo_h, stride_mo_s = partials
    cols = col0 + tl.arange(0, X)
    ptrs = mid_o_ptr + b * stride_mo_b + heads[:, None] * stride_mo_h + split * stride_mo_s + cols[None, :]
    tl.store(ptrs, out, mask=keep[:, None])


@triton.jit
def _store_lse(lses, b, heads, split, m, l, keep):
    mid_lse_ptr, stride_ml_b, stride_ml_h = lses
    lse = tl.where(l > 0.0, m + tl.log2(tl.where(l > 0.0, l, 1.0)), float("-inf"))
    tl.store(mid_lse_ptr + b * stride_ml_b + heads * stride_ml_h + split, lse, mask=keep)


@triton.jit
def _tile_step(
    state, fetched, pool, q32, b, h, tile, t_end, code_len, HALF: tl.constexpr, VCOLS: tl.constexpr,
    D: tl.constexpr, G: tl.constexpr, BITS: tl.constexpr, CLASSES: tl.constexpr, SCALE_WORDS: tl.constexpr,
    BLOCK_T: tl.constexpr, WARPS: tl.constexpr, INTERPRET: tl.constexpr, MASKED: tl.constexpr,
):
    """One step of a split's tile loop: fetch the next tile's page and scales, attend this tile
    (whose position and scales, fetched, the previous step loaded). Returns the softmax state and
    the next tile's fetched position and scales."""
    k_words, k_scales, v_words, v_scales, pages = pool
    bt_ptr, stride_bt_b, table_cols, page_size = pages
    position, scales = fetched
    page, page_idx, off = position
    next_idx, next_off = _next_position(page_idx, off, page_size, BLOCK_T)
    live = tile + 1 < t_end
    nxt = _tile_params(pool, h, _page(pages, b, next_idx, live), next_idx, next_off, (tile + 1) * BLOCK_T, live,
                       code_len, D, G, BLOCK_T, SCALE_WORDS)
    state = _code_tile(state, fetched, pool, q32, h, tile, code_len, HALF, VCOLS, D, G, BITS, CLASSES, SCALE_WORDS,
                       BLOCK_T, WARPS, INTERPRET, MASKED)
    return state, nxt


@triton.jit
def _code_partial(
    query, qk_scale, pool, lengths, tiles_per_split, output, b, h, split,
    GROUP: tl.constexpr, QROWS: tl.constexpr, COLS: tl.constexpr, VCOLS: tl.constexpr, D: tl.constexpr,
    G: tl.constexpr, BITS: tl.constexpr, CLASSES: tl.constexpr, SCALE_WORDS: tl.constexpr, BLOCK_T: tl.constexpr,
    SINKS: tl.constexpr, WINDOW: tl.constexpr, WARPS: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Attend the split's tiles of quantized tokens and store its partial output and lse."""
    q_ptr, stride_qb, stride_qh = query
    k_words, k_scales, v_words, v_scales, pages = pool
    bt_ptr, stride_bt_b, table_cols, page_size = pages
    partials, lses = output
    NGV: tl.constexpr = D // G
    HALF: tl.constexpr = COLS // 2
    # q32 [D, QROWS], one head per column (heads padded by repeats), from a channel-major load:
    # a channel's heads sit in neighbouring lanes, the order in which the K product's q*s columns
    # are stored to shared memory (from a head-major q those stores conflict)
    flat = tl.arange(0, D * QROWS)
    channel = flat // QROWS
    head = (flat % QROWS) % GROUP
    q = tl.load(q_ptr + b * stride_qb + (h * GROUP + head) * stride_qh + channel)
    q32 = tl.reshape(q.to(tl.float32) * qk_scale * _class_factors(channel, BITS, CLASSES)[0], [D, QROWS])
    # one V accumulator and zero-point sum per channel group
    accs, zaccs = (tl.zeros([G, VCOLS], tl.float32),) * NGV, (tl.zeros([HALF], tl.float32),) * NGV
    state = (tl.full([HALF], float("-inf"), tl.float32), tl.zeros([BLOCK_T, HALF], tl.float32), accs, zaccs)
    t_begin = SINKS // BLOCK_T + split * tiles_per_split  # the sinks' tiles are attended from fp
    t0 = t_begin * BLOCK_T
    page_idx = t0 // page_size
    # the first page is read before the sequence's length, bounded by the block table's width
    # alone, so that the two loads go out together (past the length, its scales and codes are
    # not read)
    page = _page(pages, b, page_idx, page_idx < table_cols)
    code_len = _code_length(lengths, b, G, SINKS, WINDOW)[1]
    t_end = tl.minimum(t_begin + tiles_per_split, (code_len + BLOCK_T - 1) // BLOCK_T)
    fetched = _tile_params(pool, h, page, page_idx, t0 - page_idx * page_size, t0, t_begin < t_end, code_len,
                           D, G, BLOCK_T, SCALE_WORDS)
    # Tiles before t_whole hold code_len's tokens throughout and skip the token mask; at most the
    # split's last tile (the sequence's last code tile) ends past code_len.
    t_whole = tl.maximum(t_begin, tl.minimum(t_end, code_len // BLOCK_T))
    if INTERPRET:  # the interpreter cannot run range() over run-time bounds
        tile = t_begin
        while tile < t_whole:
            state, fetched = _tile_step(state, fetched, pool, q32, b, h, tile, t_end, code_len, HALF, VCOLS, D, G,
                                        BITS, CLASSES, SCALE_WORDS, BLOCK_T, WARPS, INTERPRET, False)
            tile += 1
    else:  # a for loop: the compiler software-pipelines its loads (NUM_STAGES)
        for tile in range(t_begin, t_whole):
            state, fetched = _tile_step(state, fetched, pool, q32, b, h, tile, t_end, code_len, HALF, VCOLS, D, G,
                                        BITS, CLASSES, SCALE_WORDS, BLOCK_T, WARPS, INTERPRET, False)
    if t_whole < t_end:  # the last code tile, partly past code_len: masked
        state, fetched = _tile_step(state, fetched, pool, q32, b, h, t_whole, t_end, code_len, HALF, VCOLS, D, G,
                                    BITS, CLASSES, SCALE_WORDS, BLOCK_T, WARPS, INTERPRET, True)
    m, l_acc, accs, zaccs = state
    l = tl.sum(l_acc, 0)
    inv = 1.0 / tl.where(l > 0.0, l, 1.0)
    heads = tl.arange(0, HALF)
    for g in tl.static_range(NGV):  # channel group g: channels [g G, (g + 1) G)
        out = tl.trans(_head_part(accs[g], G, HALF, VCOLS)) * UNIT_INV - zaccs[g][:, None]
        _store_partial(partials, b, h * GROUP + heads, split, out * inv[:, None], g * G, heads < GROUP, G)
    _store_lse(lses, b, h * GROUP + heads, split, m, l, heads < GROUP)


@triton.jit
def _fp_rows(state, q, k_ptr, v_ptr, base, rows, ok, stride_t, qk_scale, D: tl.constexpr, DOT: tl.constexpr):
    """Attend 16 fp rows (ok: those attended) of one sequence's K and V at base + rows * stride_t."""
    at = base + rows[:, None] * stride_t + tl.arange(0, D)[None, :]
    k = tl.load(k_ptr + at, mask=ok[:, None], other=0.0).to(DOT)
    v = tl.load(v_ptr + at, mask=ok[:, None], other=0.0).to(DOT)
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    return _online_update(state[0], state[1], state[2], qk, v, ok)


@triton.jit
def _residual_partial(
    query, fp_rows, output, b, h, split, part, length, full, qk_scale,
    GROUP: tl.constexpr, COLS: tl.constexpr, D: tl.constexpr,
    G: tl.constexpr, SINKS: tl.constexpr, RING: tl.constexpr, WINDOW: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Attend part ``part`` of the fp tokens, G rows 16 at a time, and store its partial: part p <
    SINKS / G the sinks' rows [p G, (p + 1) G), the others G of the ring's positions from
    max(SINKS, full - WINDOW) to the length (row position % RING) each. The products run in q's
    dtype on the tensor cores (fp32 in the interpreter, whose bf16 arithmetic is off)."""
    q_ptr, stride_qb, stride_qh = query
    ring, sinks = fp_rows
    kr_ptr, vr_ptr, stride_r_b, stride_r_h, stride_r_t = ring
    ksink_ptr, vsink_ptr, stride_sink_b, stride_sink_h, stride_sink_t = sinks
    partials, lses = output
    HALF: tl.constexpr = COLS // 2
    DOT: tl.constexpr = tl.float32 if INTERPRET else q_ptr.dtype.element_ty
    MR: tl.constexpr = 16 if HALF < 16 else HALF
    heads = tl.arange(0, MR)
    q = tl.load(q_ptr + b * stride_qb + (h * GROUP + heads)[:, None] * stride_qh + tl.arange(0, D)[None, :],
                mask=(heads < GROUP)[:, None], other=0.0).to(DOT)
    state = (tl.full([MR], float("-inf"), tl.float32), tl.zeros([MR], tl.float32), tl.zeros([MR, D], tl.float32))
    if part < SINKS // G:
        first = part * G
        if first < length:  # the part's first row holds a token: the running max is finite from it on
            for c in tl.static_range(G // 16):
                rows = first + c * 16 + tl.arange(0, 16)
                state = _fp_rows(state, q, ksink_ptr, vsink_ptr, b * stride_sink_b + h * stride_sink_h, rows,
                                 rows < length, stride_sink_t, qk_scale, D, DOT)
    else:
        first = tl.maximum(full - WINDOW, SINKS) + (part - SINKS // G) * G
        if first < length:
            for c in tl.static_range(G // 16):
                pos = first + c * 16 + tl.arange(0, 16)
                state = _fp_rows(state, q, kr_ptr, vr_ptr, b * stride_r_b + h * stride_r_h, pos % RING,
                                 pos < length, stride_r_t, qk_scale, D, DOT)
    m, l, acc = state
    _store_partial(partials, b, h * GROUP + heads, split, acc / tl.where(l > 0.0, l, 1.0)[:, None], 0,
                   heads < GROUP, D)
    _store_lse(lses, b, h * GROUP + heads, split, m, l, heads < GROUP)


@triton.jit
def _decode_split_kernel(
    query, qk_scale, pool, fp_rows, lengths, plan, output,
    # the query heads and the head dimension
    GROUP: tl.constexpr, QROWS: tl.constexpr, COLS: tl.constexpr, VCOLS: tl.constexpr, D: tl.constexpr,
    # the code tiles
    G: tl.constexpr, BITS: tl.constexpr, CLASSES: tl.constexpr, SCALE_WORDS: tl.constexpr, BLOCK_T: tl.constexpr,
    # the fp rows
    SINKS: tl.constexpr, RING: tl.constexpr,
    # the launch
    WARPS: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Partial attention of one split of one (sequence, kv head).

    Arguments come in groups, each a tuple (nested where a group has parts), unpacked by name by
    the functions that read them:

    - query ``(q_ptr, stride_qb, stride_qh)``: q [B, Hq, D] fp16/bf16, unit stride along D;
      qk_scale = sm_scale * log2(e).
    - pool, the paged code cache ``(k_words, k_scales, v_words, v_scales, pages)``:
      k_words, v_words ``(kw_ptr, stride_kw_p, stride_kw_h, stride_kw_t)``: int32
      [NP, H, P/BLOCK_T, W] (tiles, kvbits.decode.layout); k_scales ``(ks_ptr, kz_ptr, stride_ks_p,
      stride_ks_h, stride_ks_g)``: K scales and zeros [NP, H, P/G, D], one set of strides for both;
      v_scales ``(vs_ptr, vz_ptr, stride_vs_p, stride_vs_h, stride_vs_t)``: V scales and zeros
      [NP, H, P, D/G]; pages ``(bt_ptr, stride_bt_b, table_cols, page_size)``: the block
      table int32 [B, table_cols] and P, the tokens of a page.
    - fp_rows ``(ring, sinks)``: ring ``(kr_ptr, vr_ptr, stride_r_b, stride_r_h, stride_r_t)``,
      k/v_residual [B, H, RING, D] (the partial group and a window of RING - G tokens before it);
      sinks ``(ksink_ptr, vsink_ptr, stride_sink_b, stride_sink_h, stride_sink_t)``, k/v_sink
      [B, H, SINKS, D] (the first tokens in fp; any pointers when SINKS = 0).
    - lengths ``(lens_ptr, cache_lens_ptr)``: int32 [B], attended length and cache length.
    - plan ``(num_splits, tiles_per_split)``: the split plan (kvbits.decode.launch.split_plan).
    - output ``(partials, lses)``: partials ``(mid_o_ptr, stride_mo_b, stride_mo_h, stride_mo_s)``,
      mid_o fp32 [B, Hq, splits+parts, D] (normalized); lses ``(mid_lse_ptr, stride_ml_b,
      stride_ml_h)``, mid_lse fp32 [B, Hq, splits+parts] (log2-sum-exp, -inf when the split is
      empty).

    Codes are attended from SINKS (a multiple of BLOCK_T) on (_code_length). Programs
    ``num_splits`` on attend the fp tokens, G rows each: (SINKS + RING) / G parts
    (_residual_partial).
    GROUP = Hq / Hkv; QROWS = fold_rows(GROUP); COLS = mma_columns(GROUP); VCOLS = weight_columns(GROUP);
    CLASSES = code_classes(BLOCK_T);
    SCALE_WORDS = scale_words(view) (16-bit scales and zeros loaded as 32-bit words, _tile_params).
    """
    WINDOW: tl.constexpr = RING - G
    split = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    num_splits, tiles_per_split = plan
    if split < num_splits:
        _code_partial(query, qk_scale, pool, lengths, tiles_per_split, output, b, h, split,
                      GROUP, QROWS, COLS, VCOLS, D, G, BITS, CLASSES, SCALE_WORDS, BLOCK_T, SINKS, WINDOW, WARPS,
                      INTERPRET)
    else:
        length, _, full = _code_length(lengths, b, G, SINKS, WINDOW)
        _residual_partial(query, fp_rows, output, b, h, split, split - num_splits, length, full, qk_scale,
                          GROUP, COLS, D, G, SINKS, RING, WINDOW, INTERPRET)


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h, stride_ob, stride_oh,
    num_parts,
    DM: tl.constexpr, PARTS: tl.constexpr,
):
    """out[b, h, c] = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max) over the splits, for the
    DM channels c of program (h, b, j): [j DM, (j+1) DM).

    mid_o fp32 [B, Hq, parts, D], mid_lse fp32 [B, Hq, parts]; out [B, Hq, D] (q dtype).
    """
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    s = tl.arange(0, PARTS)
    d = tl.program_id(2) * DM + tl.arange(0, DM)
    ok = s < num_parts
    lse = tl.load(mid_lse_ptr + b * stride_ml_b + h * stride_ml_h + s, mask=ok, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    o = tl.load(mid_o_ptr + b * stride_mo_b + h * stride_mo_h + s[:, None] * stride_mo_s + d[None, :],
                mask=ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty))
