"""The tile arrangement the fused decode reads, and its torch twins (docs/design.md section 3).

The codes rearranged from the canonical stream, invertibly, as tested against it:

**Decode tile arrangement.** The canonical stream packs value i of a row at bits
[b*i, b*i + b). The kernel instead reads tiles of ``tile`` tokens (16, 32 or 64), and
every one of its 32 * ``warps`` threads loads, in coalesced runs of up to four words,
exactly the words whose values form its own tensor-core operand fragment: no
shuffles between the load and the dot. Two ideas:

* pairs: a 32-value group lives in ``bits`` words ("planes") so that a mask, after a
  shift for the fields higher up (``(w >> s) & 0x00030003`` for 2 bits), yields two
  codes in one register, already in the operand's register pairs (read as fp16, the
  exact subnormals code * 2^-24). For
  bits 2 and 4, plane k holds 16/b pairs at bits [b*j, b*j + b) and [16 + b*j, ...);
  for bits 3, planes 0..2 hold 5 pairs each at bits [3j, 3j+3) and [16+3j, ...), and
  the last pair is spread over bits 15 and 31 of the three planes (value bit i in
  plane i). The kernel takes 3-bit pairs in classes by where they sit in their half-word after
  at most one shift: bits 0-2 (``w & 0x00070007``), bits 3-5 (``w & 0x00380038``, code * 8)
  and, in 64-token tiles, bits 6-8 (``w & 0x01C001C0``, code * 64): 26 machine instructions per
  32 values with two classes, 23 with three (:func:`three_bit_classes`, :func:`code_classes`).
  The class is bit 1 of the value index in the group, or 2 where its bits 2 and 3 are both set
  (with 64-token tiles, bits 4 and 5 of the reduction index in a K and in a V tile).
* fragments: a tile is a matrix [N, K] (K: the reduction axis of its product; K
  tiles are [t tokens, D], V tiles [D, t tokens]; the kernel takes N as the rows of the
  A operand, which holds per thread the same elements as this B-operand layout). In the
  B-operand layout of an m16n8k16 MMA with the warps along N, thread
  ``T = k2 + 2 k3 + 4 n0 + 8 n1 + 16 n2 + 32 n3 + 64 n4`` (bits of the row n and column
  k; as many n bits above n2 as there are warp bits) holds the
  K*N/(32*warps) values whose remaining bits vary; these are its groups of 32. In the
  kernel this is a reshape of the unpacked [T, groups * 32] tensor to
  [8*warps, 4, N/(8*warps), K/16, 4], a permutation (2, 0, 3, 1, 4) and a reshape to
  [N, K] (:func:`unpack_tile`, the kernel's twin in torch). A V tile's reduction axis holds
  its tokens in :func:`kernel_token_order` (a permutation inside each 16), the order into
  which the kernel permutes its softmax weights on their way to the V product.

Words of one tile are stored ``[plane, run, thread, word]``: a thread's groups of one plane,
in the order its operand fragment takes them, lie in runs of :func:`run_length` (up to 4)
consecutive words, so a warp reads each run with one access of 4 * run bytes per thread
(with 4 groups or more per thread, 16 bytes: 512 contiguous bytes per warp). :func:`decode_bit_table` and
:func:`unpack_tile` are the single definition; the packer is their inverse.
"""

from __future__ import annotations

import functools

import torch

from .._checks import require_choice, require_dtype, require_int, require_rank, require_tensor
from ..packing import pack_bits, unpack_bits

DECODE_BITS = (2, 3, 4)
DECODE_HEAD_DIMS = (64, 128, 256)
MAX_V_GROUPS = 4  # V scale groups per token (D / G) the kernel splits a V tile into
TILES = (16, 32, 64)  # tokens per tile
WARPS = (1, 2, 4)  # warps of the kernel program the arrangement is made for
DEFAULT_TILE, DEFAULT_WARPS = 64, 1  # measured on an H200: 1 warp beats 2 and 4 (no cross-warp steps)


def _field(w: torch.Tensor, shift: int, field: int) -> torch.Tensor:
    return (w >> shift) & field


def _join(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack([a, b], dim=-1)  # tl.join


def _join4(w: torch.Tensor, start: int, step: int, field: int) -> torch.Tensor:
    return _join(_join(_field(w, start, field), _field(w, start + step, field)),
                 _join(_field(w, start + 2 * step, field), _field(w, start + 3 * step, field)))


def _join8(a: list[torch.Tensor]) -> torch.Tensor:
    return _join(_join(_join(a[0], a[1]), _join(a[2], a[3])), _join(_join(a[4], a[5]), _join(a[6], a[7])))


THREE_BIT_FIELDS = (0x00070007, 0x00380038, 0x01C001C0)  # class c: a code at bits 3c..3c+2 of each half-word


def code_classes(tile: int) -> int:
    """How many classes of 3-bit codes (THREE_BIT_FIELDS) the arrangement of ``tile``-token tiles
    uses: 3 where a V tile's reduction spans four 16-token blocks (64-token tiles), whose two bits
    then mark the third class as reduction indices do; 2 for shorter tiles, whose class is bit 1
    of the reduction index alone."""
    return 3 if tile >= 64 else 2


def three_bit_classes(w0, w1, w2, classes: int = 2) -> tuple[list[tuple], list[tuple]]:
    """The 16 registers of a 3-bit group as the kernel extracts them (mirrors
    ``kvbits.decode._three_bit_pairs``), as (register, class) pairs, a register holding two codes
    at the field of its class (THREE_BIT_FIELDS: code * 8^class): the 8 registers whose index has
    bit 0 clear, then the 8 with it set, each in _join8 order. Fields at bits 0, 3, 6, 9 and 12
    of each plane's half-words, and the 16th pair from bit 15 of the three planes (value bit i in
    plane i).

    2 classes: bit 0 of the register index is the class; the fields at bits 6-14 come down by a
    shift of 6, 9 or 12 (8 shifts and 18 AND/OR per group). 3 classes: the fields at bits 6-8 stay
    where they are as the third class (registers 6, 7, 14 and 15: index bits 1 and 2 set), those
    at bits 9-14 come down by one shift of 9 per plane, and the 16th pair is gathered at bits 6-8
    (5 shifts and 18 AND/OR)."""
    low, high, top = THREE_BIT_FIELDS
    if classes == 3:
        s9 = [w >> 9 for w in (w0, w1, w2)]
        last = (s9[0] & 0x00400040) | ((w1 >> 8) & 0x00800080) | ((w2 >> 7) & 0x01000100)
        evens = [(w0 & low, 0), (w1 & low, 0), (w2 & low, 0), (s9[0] & low, 0), (s9[1] & low, 0), (s9[2] & low, 0),
                 (w0 & top, 2), (w1 & top, 2)]
        odds = [(w0 & high, 1), (w1 & high, 1), (w2 & high, 1), (s9[0] & high, 1), (s9[1] & high, 1),
                (s9[2] & high, 1), (w2 & top, 2), (last, 2)]
        return evens, odds
    s6 = [w >> 6 for w in (w0, w1, w2)]
    w0s12, w2s12, w1s9 = w0 >> 12, w2 >> 12, w1 >> 9
    last = (w0s12 & 0x00080008) | ((w1 >> 11) & 0x00100010) | ((w2 >> 10) & 0x00200020)
    evens = [w0 & low, w1 & low, w2 & low, s6[0] & low, s6[1] & low, s6[2] & low, w0s12 & low, w2s12 & low]
    odds = [w0 & high, w1 & high, w2 & high, s6[0] & high, s6[1] & high, s6[2] & high, w1s9 & high, last]
    return [(r, 0) for r in evens], [(r, 1) for r in odds]


def unpack_group(planes: list[torch.Tensor], bits: int, classes: int = 2) -> torch.Tensor:
    """The kernel's in-register unpacking, in torch: ``bits`` int64 word tensors [X]
    (values in [0, 2^32)) -> codes [X, 32]. Mirrors ``kvbits.decode._code_pairs``; for 3 bits
    each register's codes are brought down from its class's field (three_bit_classes)."""
    if bits == 2:
        f = 0x00030003
        w0, w1 = planes
        pairs = _join(_join(_join4(w0, 0, 2, f), _join4(w0, 8, 2, f)), _join(_join4(w1, 0, 2, f), _join4(w1, 8, 2, f)))
    elif bits == 3:
        evens, odds = three_bit_classes(*planes[:3], classes)
        pairs = _join(_join8([r >> 3 * c for r, c in evens]), _join8([r >> 3 * c for r, c in odds]))
    else:
        f = 0x000F000F
        w0, w1, w2, w3 = planes
        pairs = _join(_join(_join4(w0, 0, 4, f), _join4(w1, 0, 4, f)), _join(_join4(w2, 0, 4, f), _join4(w3, 0, 4, f)))
    halves = _join(pairs & 0xFFFF, pairs >> 16)
    return halves.reshape(*planes[0].shape, 32)


def run_length(nrg: int) -> int:
    """Words a thread reads in one access: its groups of one plane, up to 4 (16 bytes)."""
    return min(nrg, 4)


def tile_shape(role: str, d: int, tile: int) -> tuple[int, int]:
    """[N, K] of a tile: K tiles are [tile tokens, D], V tiles [D, tile tokens]."""
    return (tile, d) if role == "k" else (d, tile)


def groups_per_thread(n: int, k: int, warps: int) -> int:
    return n * k // (32 * warps * 32)


def check_arrangement(d: int, tile: int, warps: int) -> None:
    """Raise ValueError unless (head_dim, tile, warps) has an arrangement (1 to 8 groups per thread)."""
    if d not in DECODE_HEAD_DIMS or tile not in TILES or warps not in WARPS:
        raise ValueError(f"head_dim, tile and warps must be in {DECODE_HEAD_DIMS}, {TILES}, {WARPS}; "
                         f"got {d}, {tile}, {warps}")
    for role in ("k", "v"):
        n, k = tile_shape(role, d, tile)
        nrg = groups_per_thread(n, k, warps)
        if n < 8 * warps or not 1 <= nrg <= 8:
            raise ValueError(f"tile={tile}, warps={warps} does not fit head_dim {d} "
                             f"({nrg} groups of 32 values per thread; 1 to 8 are served)")


def default_layout(d: int, group_size: int) -> tuple[int, int]:
    """(tile, warps) the kernel uses for head_dim d and group size G: the largest tile that
    stays inside one K scale group, with the fewest warps (from DEFAULT_WARPS up) it fits
    (D = 256 needs 2 warps for a 64-token tile)."""
    tile = min(DEFAULT_TILE, group_size)
    for warps in (w for w in sorted(WARPS) if w >= DEFAULT_WARPS):
        try:
            check_arrangement(d, tile, warps)
        except ValueError:
            continue
        return tile, warps
    raise ValueError(f"no decode arrangement for head_dim {d} and group size {group_size}")


def _place(x: torch.Tensor, n: int, k: int, warps: int) -> torch.Tensor:
    """[..., T, NRG*32] per-thread values -> [..., N, K] (mirrors _load_tile in the kernel)."""
    lead = x.shape[:-2]
    y = x.reshape(*lead, 8 * warps, 4, n // (8 * warps), k // 16, 4)
    nd = len(lead)
    y = y.permute(*range(nd), nd + 2, nd + 0, nd + 3, nd + 1, nd + 4)
    return y.reshape(*lead, n, k)


def kernel_token_order(tile: int) -> torch.Tensor:
    """Which token of a V tile the kernel's V product reads at reduction index k: within each 16,
    k = 4c + 2a + b holds token 8b + 2c + a: lane c's reduction indices 4c .. 4c + 3 (of each 16)
    hold tokens 2c, 2c + 1, 8 + 2c, 9 + 2c, and each register's two halves (k, k + 1) tokens t
    and t + 8, the two rows one thread holds of the logits' accumulator. The V tile's codes are
    stored in this order; the kernel packs each thread's two weights into one word where they are
    and gathers the words to the operand's registers, one shuffle each."""
    k = torch.arange(tile)
    return (k & ~15) | ((k >> 1) & 7) | ((k & 1) << 3)


def _tile_elements(role: str, n: int, k: int) -> torch.Tensor:
    """[N, K]: the element (row-major index into the [N, K] tile) the kernel holds at each
    position: the identity for K tiles, kernel_token_order along the tokens of V tiles."""
    elements = torch.arange(n * k).reshape(n, k)
    return elements if role == "k" else elements[:, kernel_token_order(k)]


def held_tile(words: torch.Tensor, bits: int, role: str, d: int, tile: int = DEFAULT_TILE,
              warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """Decode-arranged words int32 [..., W] of tiles -> codes int64 [..., N, K] as the kernel holds
    them (the kernel's twin): a V tile's tokens in kernel_token_order."""
    n, k = tile_shape(role, d, tile)
    threads = 32 * warps
    nrg = groups_per_thread(n, k, warps)
    r = run_length(nrg)
    w = words.to(torch.int64).reshape(*words.shape[:-1], bits, nrg // r, threads, r) & 0xFFFFFFFF
    w = w.transpose(-3, -2).flatten(-2)  # [..., bits, T, NRG]
    planes = [w[..., p, :, :] for p in range(bits)]  # each [..., T, NRG]
    vals = unpack_group(planes, bits, code_classes(tile))  # [..., T, NRG, 32]
    return _place(vals.flatten(-2), n, k, warps)


def natural_from_held(held: torch.Tensor, role: str) -> torch.Tensor:
    """[..., N, K] as the kernel holds a tile -> the same values at their natural positions (a V
    tile's kernel_token_order undone; K tiles unchanged)."""
    n, k = held.shape[-2:]
    tiles = torch.empty_like(held)
    tiles.flatten(-2)[..., _tile_elements(role, n, k).flatten()] = held.flatten(-2)
    return tiles


def unpack_tile(words: torch.Tensor, bits: int, role: str, d: int, tile: int = DEFAULT_TILE,
                warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """Decode-arranged words int32 [..., W] of tiles -> codes uint8 [..., N, K], tokens in their
    natural order (held_tile with a V tile's kernel_token_order undone)."""
    return natural_from_held(held_tile(words, bits, role, d, tile, warps), role).to(torch.uint8)


@functools.cache
def decode_bit_table(bits: int, classes: int = 2) -> tuple[tuple[int, int], ...]:
    """Where each bit of a 32-value group lives: entry ``plane * 32 + position`` is
    ``(value index, bit of that value)``, found by probing :func:`unpack_group` (3 bits: with
    ``classes`` classes, code_classes)."""
    require_int("bits", bits, DECODE_BITS)
    probes = torch.zeros(bits, bits * 32, dtype=torch.int64)
    for plane in range(bits):
        probes[plane, plane * 32:(plane + 1) * 32] = 1 << torch.arange(32)
    out = unpack_group([probes[p] for p in range(bits)], bits, classes)  # [bits*32 probes, 32 values]
    table = []
    for probe in range(bits * 32):
        hits = out[probe].nonzero().flatten().tolist()
        assert len(hits) == 1, "each bit must land in exactly one value"
        value = hits[0]
        bit = int(out[probe, value]).bit_length() - 1
        assert int(out[probe, value]) == 1 << bit
        table.append((value, bit))
    assert len(set(table)) == bits * 32
    return tuple(table)


@functools.cache
def _pack_plan(bits: int, role: str, d: int, tile: int, warps: int, device: torch.device):
    """Index tensors that turn a tile [N, K] into words [W] (the inverse of unpack_tile)."""
    n, k = tile_shape(role, d, tile)
    threads = 32 * warps
    nrg = groups_per_thread(n, k, warps)
    # flat (thread, joined group position, value) index of every tile element
    where = _place(torch.arange(threads * nrg * 32).reshape(threads, nrg * 32), n, k, warps).flatten()
    order = torch.empty_like(where)
    order[where] = _tile_elements(role, n, k).flatten()  # order[(t, f, v)] = tile element
    per_f = order.reshape(threads, nrg, 32)
    table = decode_bit_table(bits, code_classes(tile))
    value = torch.tensor([v for v, _ in table])
    bit = torch.tensor([b for _, b in table])
    r = run_length(nrg)
    src = per_f[:, :, value].reshape(threads, nrg // r, r, bits, 32).permute(3, 1, 0, 2, 4)  # [bits, NRG/R, T, R, 32]
    bit = bit.reshape(bits, 1, 1, 1, 32).expand(bits, nrg // r, threads, r, 32)
    return src.reshape(-1, 32).to(device), bit.reshape(-1, 32).to(device)


def pack_tile(codes: torch.Tensor, bits: int, role: str, d: int, tile: int = DEFAULT_TILE,
              warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """Codes uint8 [..., N, K] of tiles -> decode-arranged words int32 [..., W]."""
    src, bit = _pack_plan(bits, role, d, tile, warps, codes.device)
    flat = codes.reshape(*codes.shape[:-2], -1).to(torch.int64)
    picked = (flat[..., src] >> bit) & 1  # [..., W, 32]
    words = (picked << torch.arange(32, device=codes.device)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _tiles(values: torch.Tensor, role: str, tile: int) -> torch.Tensor:
    """Token-major values [..., T, D] (T a multiple of tile) -> tiles [..., T/tile, N, K]."""
    *lead, t, d = values.shape
    tiles = values.reshape(*lead, t // tile, tile, d)
    return tiles if role == "k" else tiles.transpose(-1, -2)


def _untile(tiles: torch.Tensor, role: str) -> torch.Tensor:
    if role == "v":
        tiles = tiles.transpose(-1, -2)
    return tiles.flatten(-3, -2)


def _chunk_values(device: torch.device) -> int:
    """Values converted per step: bounds the int64 temporaries (larger on a GPU)."""
    return 1 << (26 if device.type == "cuda" else 22)


def _by_tiles(fn, x: torch.Tensor, rows: int, out_row: tuple, dtype: torch.dtype) -> torch.Tensor:
    """Apply ``fn`` to x [..., R*rows, C] (R tiles of ``rows`` rows) in chunks of whole tiles."""
    *lead, n, c = x.shape
    tiles = x.reshape(-1, rows, c)
    out = torch.empty(tiles.shape[0], *out_row, dtype=dtype, device=x.device)
    step = max(1, _chunk_values(x.device) // (rows * c * 8))
    for i in range(0, tiles.shape[0], step):
        out[i:i + step] = fn(tiles[i:i + step])
    return out.reshape(*lead, n // rows, *out_row)


def _check_conversion(name: str, x, dtype: torch.dtype, bits, role, d: int, tile, warps) -> None:
    """The arguments of a conversion between canonical codes and decode-arranged words."""
    require_tensor(name, x)
    require_dtype(name, x, (dtype,))
    require_rank(name, x, tuple(range(2, 9)))
    require_int("bits", bits, DECODE_BITS)
    require_choice("role", role, ("k", "v"))
    require_int("tile", tile)
    require_int("warps", warps)
    check_arrangement(d, tile, warps)


def words_from_codes(codes: torch.Tensor, bits: int, role: str, tile: int = DEFAULT_TILE,
                     warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """Canonical codes uint8 [..., T, D*b/8] (T a multiple of tile) -> int32 [..., T/tile, W]."""
    require_tensor("codes", codes)
    require_int("bits", bits, DECODE_BITS)
    d = codes.shape[-1] * 8 // bits if codes.dim() else 0
    _check_conversion("codes", codes, torch.uint8, bits, role, d, tile, warps)
    if codes.shape[-1] * 8 != d * bits or codes.shape[-2] % tile:
        raise ValueError(f"codes must be [..., T, D*{bits}/8] with T a multiple of tile={tile}; "
                         f"got {tuple(codes.shape)}")

    def convert(chunk: torch.Tensor) -> torch.Tensor:  # [n, tile, D*b/8] -> [n, W]
        values = unpack_bits(chunk.contiguous(), bits, layout="byte", backend="torch")
        return pack_tile(_tiles(values, role, tile)[:, 0], bits, role, d, tile, warps)

    return _by_tiles(convert, codes, tile, (tile * d * bits // 32,), torch.int32)


def codes_from_words(words: torch.Tensor, bits: int, role: str, d: int, tile: int = DEFAULT_TILE,
                     warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """The inverse of :func:`words_from_codes`: int32 [..., T/tile, W] -> uint8 [..., T, D*b/8]."""
    _check_conversion("words", words, torch.int32, bits, role, d, tile, warps)
    if words.shape[-1] != tile * d * bits // 32:
        raise ValueError(f"words must be [..., T/tile, {tile * d * bits // 32}] for a {tile}-token tile of "
                         f"head_dim {d} at {bits} bits; got {tuple(words.shape)}")

    def convert(chunk: torch.Tensor) -> torch.Tensor:  # [n, 1, W] -> [n, tile, D*b/8]
        values = _untile(unpack_tile(chunk, bits, role, d, tile, warps), role)
        return pack_bits(values.contiguous(), bits, layout="byte", backend="torch", validate=False)

    out = _by_tiles(convert, words.unsqueeze(-2), 1, (tile, d * bits // 8), torch.uint8)
    return out.reshape(*words.shape[:-2], words.shape[-2] * tile, d * bits // 8)
