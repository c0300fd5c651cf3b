"""Bit-exact b-bit packing (b = 1..8) in the canonical LSB-first stream (docs/design.md section 3).

Computes: a row of N unsigned b-bit values v is one little-endian bit stream, value i holding
bits [b*i, b*i + b), so bit b*i + j of the stream is bit j of v[i]. Shapes and dtypes: values
uint8 ``[..., N]``, each < 2**b, N a multiple of ``values_per_group(b, layout)``; two views of
the same packed bytes:

* ``layout="byte"``: uint8 ``[..., N*b/8]``, groups of ``lcm(b, 8)`` bits; for b = 3
  an octet of 8 values in 3 bytes (v2 straddles b0->b1, v5 straddles b1->b2);
* ``layout="word"``: int32 ``[..., N*b/32]``, groups of ``lcm(b, 32)`` bits; for b = 3
  32 values in 3 words (lanes 10 and 21 straddle), exactly GPTQ's 3-bit stream.

Backends: ``torch`` (the reference: an explicit bit-plane expansion, any device),
``triton`` (the kernels below: the branchless register assembly for bytes, the ``lo | hi``
straddle formula for words; compiled on a GPU, interpreted on CPU tensors) and
``cuda`` (``kvbits/cuda/pack3.cu`` through the loader; b = 3 only).

Tested against the definition (a state's packed form is its own bits), the torch reference,
per-octet formulas written out apart from this code and GPTQ's packing loop, in
``suites/``: test_bijection.py (all 2^24 states of a 3-bit octet, both inverses), test_walking.py
(every lane and bit), test_golden.py, test_gptq.py, test_widths.py (b = 1..8) and
test_bad_input_packing.py; speed in test_bench_packing.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._checks import require_choice, require_dtype, require_int, require_tensor, resolve_backend
from ._runtime import on_device, triton_interpreted
from .aot import AotSpec

LAYOUTS = ("byte", "word")
BIT_WIDTHS = tuple(range(1, 9))
CUDA_BITS = (3,)


@dataclass(frozen=True)
class Geometry:
    """Group shape of a b-bit stream in one layout: ``values`` fit exactly in ``units``."""

    bits: int
    layout: str
    values: int  # values per group (a power of two)
    units: int  # bytes (byte layout) or int32 words (word layout) per group

    @property
    def unit_bits(self) -> int:
        return 8 if self.layout == "byte" else 32


def geometry(bits: int, layout: str) -> Geometry:
    unit = 8 if layout == "byte" else 32
    group_bits = bits * unit // math.gcd(bits, unit)
    return Geometry(bits, layout, group_bits // bits, group_bits // unit)


def values_per_group(bits: int, layout: str = "byte") -> int:
    """The multiple that a row's length N must be for ``bits`` in ``layout``."""
    return geometry(bits, layout).values


# ----------------------------------------------------------------------------- torch reference
def _bit_stream(x: torch.Tensor, width: int) -> torch.Tensor:
    """uint8 [..., n] -> uint8 [..., n*width] of 0/1: bit j of x[..., i] at position width*i + j."""
    shifts = torch.arange(width, device=x.device, dtype=torch.uint8)
    return ((x.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def _regroup(stream: torch.Tensor, width: int) -> torch.Tensor:
    """uint8 [..., n] of 0/1 -> uint8 [..., n/width]: field i takes bit j from stream[width*i + j]."""
    fields = stream.unflatten(-1, (-1, width))
    out = torch.zeros_like(fields[..., 0])
    for j in range(width):  # one pass per bit plane (a sum over a dim of 8 is several times slower on CPU)
        out |= fields[..., j] << j
    return out


def _pack_torch(values: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., N] -> uint8 [..., N*bits/8]: expand to bit planes, regroup by 8."""
    return _regroup(_bit_stream(values, bits), 8)


def _unpack_torch(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., M] -> uint8 [..., M*8/bits]: expand bytes to bits, regroup by ``bits``."""
    return _regroup(_bit_stream(packed, 8), bits)


# ----------------------------------------------------------------------------- Triton kernels
@triton.jit
def _pack_bytes_kernel(
    src, dst, n_groups,
    BITS: tl.constexpr, NV: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr,
    WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Pack b-bit values into the byte layout.

    src: uint8 [n_groups * NV] values < 2**BITS; dst: uint8 [n_groups * NB].
    Each group of NV values is assembled in one register (int32, or int64 when
    lcm(BITS, 8) > 32) by shifting lane i to bit BITS*i, then split into NB bytes.
    For BITS = 3: word24 = v0 | v1 << 3 | ... | v7 << 21 -> b0, b1, b2.
    """
    groups = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = groups < n_groups
    lanes = tl.arange(0, NV)
    vals = tl.load(src + groups[:, None] * NV + lanes[None, :], mask=in_range[:, None], other=0)
    if WIDE:
        vals = vals.to(tl.int64)
    else:
        vals = vals.to(tl.int32)
    word = tl.sum(vals << (lanes * BITS)[None, :], axis=1)  # disjoint bits: sum == or
    byte_idx = tl.arange(0, NB_P2)
    out = ((word[:, None] >> (byte_idx * 8)[None, :]) & 0xFF).to(tl.uint8)
    tl.store(dst + groups[:, None] * NB + byte_idx[None, :], out,
             mask=in_range[:, None] & (byte_idx < NB)[None, :])


@triton.jit
def _unpack_bytes_kernel(
    src, dst, n_groups,
    BITS: tl.constexpr, NV: tl.constexpr, NB: tl.constexpr, NB_P2: tl.constexpr,
    WIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Unpack the byte layout into b-bit values.

    src: uint8 [n_groups * NB]; dst: uint8 [n_groups * NV].
    Branchless register assembly: word = b0 | b1 << 8 | b2 << 16 | ... makes the
    straddling values contiguous, then every lane is (word >> BITS*i) & mask.
    """
    groups = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = groups < n_groups
    byte_idx = tl.arange(0, NB_P2)
    raw = tl.load(src + groups[:, None] * NB + byte_idx[None, :],
                  mask=in_range[:, None] & (byte_idx < NB)[None, :], other=0)
    if WIDE:
        raw = raw.to(tl.int64)
    else:
        raw = raw.to(tl.int32)
    word = tl.sum(raw << (byte_idx * 8)[None, :], axis=1)  # disjoint bits: sum == or
    lanes = tl.arange(0, NV)
    vals = ((word[:, None] >> (lanes * BITS)[None, :]) & ((1 << BITS) - 1)).to(tl.uint8)
    tl.store(dst + groups[:, None] * NV + lanes[None, :], vals, mask=in_range[:, None])


@triton.jit
def _word_lanes(BITS: tl.constexpr, NV: tl.constexpr):
    """Where each of the NV lanes of a word group lives: its word, its shift within that word,
    and whether it straddles into the next word (shift + BITS > 32)."""
    lanes = tl.arange(0, NV)
    start = lanes * BITS
    word_of = start // 32
    shift = (start % 32).to(tl.uint32)
    straddles = (start % 32) + BITS > 32
    return lanes, word_of, shift, straddles


@triton.jit
def _pack_words_kernel(
    src, dst, n_groups,
    BITS: tl.constexpr, NV: tl.constexpr, NW: tl.constexpr, BLOCK: tl.constexpr,
):
    """Pack b-bit values into the int32 word layout.

    src: uint8 [n_groups * NV]; dst: int32 [n_groups * NW]. Lane i starts at bit
    s = BITS*i % 32 of word w = BITS*i // 32; a lane with s + BITS > 32 straddles
    and sends its high part (v >> (32 - s)) to word w + 1.
    """
    groups = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = groups < n_groups
    lanes, word_of, shift, straddles = _word_lanes(BITS, NV)
    vals = tl.load(src + groups[:, None] * NV + lanes[None, :], mask=in_range[:, None], other=0)
    vals = vals.to(tl.uint32)
    low = vals << shift[None, :]
    high = vals >> ((32 - shift) & 31)[None, :]
    for k in tl.static_range(NW):
        part = tl.where((word_of == k)[None, :], low, 0)
        part = part | tl.where((straddles & (word_of + 1 == k))[None, :], high, 0)
        word = tl.sum(part, axis=1)  # disjoint bits: sum == or
        tl.store(dst + groups * NW + k, word.to(tl.int32, bitcast=True), mask=in_range)


@triton.jit
def _unpack_words_kernel(
    src, dst, n_groups,
    BITS: tl.constexpr, NV: tl.constexpr, NW: tl.constexpr, BLOCK: tl.constexpr,
):
    """Unpack the int32 word layout into b-bit values with the ``lo | hi`` straddle formula.

    src: int32 [n_groups * NW]; dst: uint8 [n_groups * NV]. Per lane i with word
    w and shift s: lo = W[w] >> s; hi = (W[w + 1] << (32 - s) & 31) where s + BITS > 32;
    q = (lo | hi) & mask. Each of the NW words is loaded once (32-bit loads).
    """
    groups = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = groups < n_groups
    lanes, word_of, shift, straddles = _word_lanes(BITS, NV)
    lo = tl.zeros([BLOCK, NV], dtype=tl.uint32)
    hi = tl.zeros([BLOCK, NV], dtype=tl.uint32)
    for k in tl.static_range(NW):
        w = tl.load(src + groups * NW + k, mask=in_range, other=0).to(tl.uint32, bitcast=True)
        lo = tl.where((word_of == k)[None, :], w[:, None] >> shift[None, :], lo)
        hi = tl.where((straddles & (word_of + 1 == k))[None, :], w[:, None] << ((32 - shift) & 31)[None, :], hi)
    vals = ((lo | hi) & ((1 << BITS) - 1)).to(tl.uint8)
    tl.store(dst + groups[:, None] * NV + lanes[None, :], vals, mask=in_range[:, None])


def _values_per_program(kernel, interpreted: bool) -> int:
    # The interpreter pays per program, so it gets large blocks; compiled kernels get
    # enough programs to fill the GPU with a few thousand values each. Measured on an H200
    # (3 bits, 1 GiB stream, scripts/gpu_packing_sweep.py): the word unpack reaches 84.5% of
    # the copy bandwidth with 16384 values per program and 4 warps, 63.5% with 4096; the
    # other kernels are fastest at 4096. Other widths take the 3-bit shapes (not swept).
    if interpreted:
        return 1 << 20
    return 16384 if kernel is _unpack_words_kernel else 4096


def _byte_kernel_args(geo: Geometry) -> dict:
    return {
        "BITS": geo.bits,
        "NV": geo.values,
        "NB": geo.units,
        "NB_P2": triton.next_power_of_2(geo.units),
        "WIDE": geo.bits * geo.values > 32,
    }


def _launch(kernel, src: torch.Tensor, dst: torch.Tensor, n_groups: int, geo: Geometry, **meta) -> None:
    block = max(1, _values_per_program(kernel, triton_interpreted()) // geo.values)
    block = min(block, triton.next_power_of_2(max(n_groups, 1)))
    grid = (triton.cdiv(n_groups, block),)
    with on_device(src.device):
        kernel[grid](src, dst, n_groups, BLOCK=block, **meta)


def _pack_triton(values: torch.Tensor, geo: Geometry) -> torch.Tensor:
    n_groups = values.numel() // geo.values
    if geo.layout == "byte":
        out = torch.empty(n_groups * geo.units, dtype=torch.uint8, device=values.device)
        _launch(_pack_bytes_kernel, values, out, n_groups, geo, **_byte_kernel_args(geo))
    else:
        out = torch.empty(n_groups * geo.units, dtype=torch.int32, device=values.device)
        _launch(_pack_words_kernel, values, out, n_groups, geo, BITS=geo.bits, NV=geo.values, NW=geo.units)
    return out


def _unpack_triton(packed: torch.Tensor, geo: Geometry) -> torch.Tensor:
    n_groups = packed.numel() // geo.units
    out = torch.empty(n_groups * geo.values, dtype=torch.uint8, device=packed.device)
    if geo.layout == "byte":
        _launch(_unpack_bytes_kernel, packed, out, n_groups, geo, **_byte_kernel_args(geo))
    else:
        _launch(_unpack_words_kernel, packed, out, n_groups, geo, BITS=geo.bits, NV=geo.values, NW=geo.units)
    return out


# ----------------------------------------------------------------------------- CUDA
_CUDA_DECLARATIONS = """
torch::Tensor pack3_cuda(torch::Tensor values);
torch::Tensor unpack3_cuda(torch::Tensor packed);
"""


def _cuda_module():
    from .cuda import load_extension

    return load_extension("pack3", functions=["pack3_cuda", "unpack3_cuda"], declarations=_CUDA_DECLARATIONS)


# ----------------------------------------------------------------------------- public API
def _check_common(name: str, tensor, bits, layout) -> Geometry:
    require_tensor(name, tensor)
    require_int("bits", bits, BIT_WIDTHS)
    require_choice("layout", layout, LAYOUTS)
    if tensor.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the row); got a 0-d tensor")
    if tensor.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(tensor.shape)}); there is nothing to pack or unpack")
    return geometry(bits, layout)


def _check_cuda_bits(backend: str, bits: int) -> None:
    if backend == "cuda" and bits not in CUDA_BITS:
        raise ValueError(f"backend='cuda' implements bits={CUDA_BITS}; got bits={bits} (use 'triton' or 'torch')")


def pack_bits(
    values: torch.Tensor, bits: int = 3, *, layout: str = "byte", backend: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Pack unsigned ``bits``-bit values into the canonical stream.

    values: uint8 [..., N], every value < 2**bits, N a multiple of
    ``values_per_group(bits, layout)``. Returns uint8 [..., N*bits/8] (``layout="byte"``)
    or int32 [..., N*bits/32] (``layout="word"``), on the device of ``values``.
    Non-contiguous inputs are packed correctly (a contiguous copy is made).
    ``validate=False`` skips the range check (one extra read of ``values``).
    """
    geo = _check_common("values", values, bits, layout)
    require_dtype("values", values, (torch.uint8,))
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool; got {type(validate).__name__}")
    n = values.shape[-1]
    if n % geo.values:
        raise ValueError(
            f"values: the last dimension ({n}) must be a multiple of {geo.values} for "
            f"{bits}-bit values in the {layout} layout"
        )
    if validate:
        top = int(values.max())
        if top >= 1 << bits:
            raise ValueError(f"values must be < 2**bits = {1 << bits} for bits={bits}; found {top}")
    backend = resolve_backend(backend, values.device)
    _check_cuda_bits(backend, bits)
    flat = values.contiguous()
    out_len = n * bits // geo.unit_bits
    if backend == "torch":
        out = _pack_torch(flat, bits)
        return out.view(torch.int32) if layout == "word" else out
    if backend == "cuda":
        out = _cuda_module().pack3_cuda(flat.reshape(-1))
        out = out.view(torch.int32) if layout == "word" else out
    else:
        out = _pack_triton(flat.reshape(-1), geo)
    return out.reshape(*values.shape[:-1], out_len)


def unpack_bits(
    packed: torch.Tensor, bits: int = 3, *, layout: str = "byte", backend: str | None = None
) -> torch.Tensor:
    """Unpack the canonical stream back to values.

    packed: uint8 [..., M] (``layout="byte"``, M a multiple of the group's bytes) or
    int32 [..., W] (``layout="word"``). Returns uint8 [..., M*8/bits] or [..., W*32/bits].
    """
    geo = _check_common("packed", packed, bits, layout)
    require_dtype("packed", packed, (torch.uint8,) if layout == "byte" else (torch.int32,))
    m = packed.shape[-1]
    if m % geo.units:
        unit = "bytes" if layout == "byte" else "int32 words"
        raise ValueError(
            f"packed: the last dimension ({m}) must be a multiple of {geo.units} {unit} for "
            f"{bits}-bit values in the {layout} layout"
        )
    backend = resolve_backend(backend, packed.device)
    _check_cuda_bits(backend, bits)
    flat = packed.contiguous()
    out_len = m * geo.unit_bits // bits
    if backend == "torch":
        stream = flat.view(torch.uint8) if layout == "word" else flat
        return _unpack_torch(stream, bits)
    if backend == "cuda":
        out = _cuda_module().unpack3_cuda(flat.reshape(-1).view(torch.uint8))
    else:
        out = _unpack_triton(flat.reshape(-1), geo)
    return out.reshape(*packed.shape[:-1], out_len)


# ----------------------------------------------------------------------------- AOT specializations
def _aot_specs() -> list[AotSpec]:
    specs = []
    for bits in BIT_WIDTHS:
        for layout in LAYOUTS:
            geo = geometry(bits, layout)
            if layout == "byte":
                meta = _byte_kernel_args(geo)
                pack, unpack, packed_t = _pack_bytes_kernel, _unpack_bytes_kernel, "*u8"
            else:
                meta = {"BITS": bits, "NV": geo.values, "NW": geo.units}
                pack, unpack, packed_t = _pack_words_kernel, _unpack_words_kernel, "*i32"
            sig_pack = {"src": "*u8", "dst": packed_t, "n_groups": "i64"}
            sig_unpack = {"src": packed_t, "dst": "*u8", "n_groups": "i64"}
            for name, kernel, signature in ((f"pack_{layout}_b{bits}", pack, sig_pack),
                                            (f"unpack_{layout}_b{bits}", unpack, sig_unpack)):
                block = max(1, _values_per_program(kernel, interpreted=False) // geo.values)
                specs.append(AotSpec(name, kernel, signature, {**meta, "BLOCK": block}))
    return specs


AOT_SPECS = _aot_specs()
