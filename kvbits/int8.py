"""INT8 per-channel symmetric quantization of a KV matrix (docs/design.md section 5).

Shapes: ``x`` is ``[T, D]`` (tokens x channels) float32, float16 or bfloat16; ``scales`` is
``[D]`` float32; codes ``q`` are ``[T, D]`` int8; ``dequantize_per_channel`` returns ``[T, D]``
float32.

The arithmetic, kept bit for bit by every variant (so codes, scales and reconstructions of all
variants are identical, not merely close):

* ``amax_d = max_t |x[t, d]|``, in float32 (float16/bfloat16 inputs are widened exactly first).
* ``s_d = 0`` if ``amax_d < 2**-64`` (an all-zero or negligible column), else ``amax_d / 127``
  (IEEE float32 division, round to nearest even).
* ``inv_d = 0`` if ``s_d == 0`` else ``1 / s_d`` (IEEE float32 division): one division per column,
  never per element.
* ``q = round_half_even(clamp(x * inv_d, -128, 127))``: one float32 multiply by the precomputed
  reciprocal, then ties to even (``torch.round``'s rule: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2,
  63.5 -> 64, -2.5 -> -2). Since ``|x * inv_d| <= 127`` up to one rounding, ``-128`` never occurs.
* ``x_hat = float(q) * s_d`` (one float32 multiply); a zero-scale column reconstructs to 0.
* NaN or Inf anywhere in ``x`` raises ``ValueError`` naming the columns. The check reads the D
  scales (a non-finite value always makes its column's scale non-finite), not ``x`` again; on a
  GPU it costs one small device-to-host sync per call, which ``quantize_per_channel`` takes
  after queuing its codes pass (so tensors given as ``out=`` hold unspecified values when it
  raises). ``dequantize_per_channel`` refuses scales that no ``x`` gives, negative, NaN or Inf,
  with ``ValueError`` naming ``scales`` and the columns (one reduction and one 8-byte read back,
  before any kernel runs), besides their shape, dtype and device.

The ``2**-64`` floor keeps every scale, reciprocal and nonzero product a normal float (or a
product that rounds to code 0), so GPU code built with denormal flushing gives the same bits.

Variants (``variant=``):

=================  =========  ==========================================================
``torch``          any        the reference, plain torch operations
``cpu_baseline``   CPU        the C++ baseline (``kvbits/cuda/int8_cpu_baseline.cpp``), the CPU
                              code of *GPU-Accelerated KV Cache Quantization* (docs/design.md
                              section 1): OpenMP over columns for scales, serial
                              quantize/dequantize loops; float32 input only
``naive``          CUDA       one thread per element (``kvbits/cuda/int8_quant.cu``)
``tiled``          CUDA       32 x 32 tiles staged in shared memory
``coarsened``      CUDA       8 elements per thread, grid-stride
``vectorized``     CUDA       float4 / char4 accesses; needs ``D % 4 == 0`` (else ``ValueError``
                              naming D: pick ``coarsened``, or ``variant=None`` which does)
``triton``         CUDA, CPU  Triton kernels (compiled on a GPU; the interpreter on CPU tensors)
=================  =========  ==========================================================

Every CUDA variant shares one scales pass on the GPU (one read of ``x``: blocks over column
strips and row ranges, a shared-memory reduction, ``atomicMax`` on the float bits). ``triton``
has its own scales pass built the same way. ``variant=None`` picks ``vectorized`` for CUDA
tensors when ``D % 4 == 0`` and every output passed in is 16-byte aligned, else ``coarsened``,
and ``torch`` for CPU tensors. A variant that cannot run on the tensors' device raises
``ValueError``.

Outputs may be passed in (``out=``) to reuse memory; they must be contiguous, of the exact
shape, dtype and device (and 16-byte aligned for ``vectorized``).

Tested bit for bit (codes, scales and reconstructions) against a float64 oracle of the arithmetic
above (``oracle`` in ``suites/int8_support.py``, which uses no code under test), variant against
variant, and on the known values of the INT8 work's unit tests, in ``suites/``: test_int8_basics.py,
test_int8_core.py, test_int8_variants.py and test_int8_bad_input.py; speed in test_bench_int8.py.
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
import torch
import triton
import triton.language as tl

from ._checks import (
    require_choice,
    require_dtype,
    require_rank,
    require_same_device,
    require_tensor,
    resolve_backend,
)
from ._runtime import on_device, sm_count, triton_interpreted
from .aot import AotSpec

VARIANTS = ("torch", "cpu_baseline", "naive", "tiled", "coarsened", "vectorized", "triton")
CUDA_VARIANTS = {"naive": 0, "tiled": 1, "coarsened": 2, "vectorized": 3}
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QMIN, QMAX = -128, 127
TINY_AMAX = 2.0**-64

__all__ = [
    "VARIANTS",
    "CUDA_VARIANTS",
    "INPUT_DTYPES",
    "TINY_AMAX",
    "variants_for",
    "compute_scales",
    "quantize_per_channel",
    "dequantize_per_channel",
]


# ----------------------------------------------------------------------------- variant choice
def variants_for(device: torch.device | str) -> tuple[str, ...]:
    """The variants that can run on tensors of ``device`` in this process."""
    device = torch.device(device)
    if device.type == "cuda":
        names = ["torch", *CUDA_VARIANTS]
        if not triton_interpreted():
            names.append("triton")
        return tuple(names)
    names = ["torch", "cpu_baseline"]
    if triton_interpreted():
        names.append("triton")
    return tuple(names)


def _resolve_variant(variant: str | None, device: torch.device, D: int, outs=()) -> str:
    """The variant to run. ``None``: on CUDA the vectorized kernel where D % 4 == 0 and every given
    output tensor is 16-byte aligned (a slice of a larger buffer may not be), else coarsened;
    torch elsewhere."""
    if variant is None:
        if device.type == "cuda":
            aligned = all(t.data_ptr() % 16 == 0 for t in outs if isinstance(t, torch.Tensor))
            return "vectorized" if D % 4 == 0 and aligned else "coarsened"
        return "torch"
    require_choice("variant", variant, VARIANTS)
    if variant in CUDA_VARIANTS and device.type != "cuda":
        raise ValueError(
            f"variant={variant!r} runs on CUDA tensors; got tensors on {device} "
            f"(variants for {device}: {variants_for(device)})"
        )
    if variant == "cpu_baseline" and device.type != "cpu":
        raise ValueError(f"variant='cpu_baseline' runs on CPU tensors; got tensors on {device}")
    if variant == "triton":
        resolve_backend("triton", device, ("triton",))
    if variant == "vectorized" and D % 4:
        raise ValueError(
            f"variant='vectorized' needs D (the last dimension) to be a multiple of 4; got D={D} "
            "(use variant='coarsened' or variant=None)"
        )
    return variant


# ----------------------------------------------------------------------------- argument checks
def _check_matrix(name: str, t, dtypes) -> torch.Tensor:
    require_tensor(name, t)
    require_rank(name, t, 2)
    require_dtype(name, t, dtypes)
    if t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(
            f"{name} must have at least one row and one column; got shape {tuple(t.shape)}"
        )
    return t


def _check_scales(scales, D: int) -> None:
    require_tensor("scales", scales)
    require_rank("scales", scales, 1)
    require_dtype("scales", scales, (torch.float32,))
    if scales.shape[0] != D:
        raise ValueError(
            f"scales must have D={D} elements (one per column of q); got {scales.shape[0]}"
        )


def _require_scale_values(scales: torch.Tensor) -> None:
    """ValueError naming the columns whose scale is negative, NaN or Inf (quantize_per_channel gives
    every column ``amax / 127 >= 0``, finite). One reduction and one 8-byte copy to the host; the
    columns are looked for only when the smallest and largest scale say there are some."""
    lo, hi = torch.aminmax(scales)
    lo, hi = torch.stack([lo, hi]).tolist()
    if lo >= 0 and math.isfinite(hi):  # NaN fails both comparisons
        return
    columns = torch.nonzero(~(torch.isfinite(scales) & (scales >= 0))).flatten()
    shown = columns[:8].tolist()
    more = f" and {columns.numel() - 8} more" if columns.numel() > 8 else ""
    values = scales[columns[:8]].tolist()
    raise ValueError(f"scales must be finite and non-negative (amax / 127 of each column, as quantize_per_channel "
                     f"gives them); column(s) {shown}{more} hold {values}")


def _check_out(name: str, t, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    require_tensor(name, t)
    require_dtype(name, t, (dtype,))
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}; got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}; got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t


def _input(t: torch.Tensor, variant: str) -> torch.Tensor:
    """Contiguous, and 16-byte aligned for the vectorized variant (copied only when it is not)."""
    t = t.contiguous()
    if variant == "vectorized" and t.data_ptr() % 16:
        t = t.clone()
    return t


def _output(name: str, out, shape, dtype, device, variant: str) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _check_out(name, out, shape, dtype, device)
    if variant == "vectorized" and out.data_ptr() % 16:
        raise ValueError(f"{name} must be 16-byte aligned for variant='vectorized'")
    return out


def _require_finite_scales(scales: torch.Tensor) -> None:
    """ValueError naming the columns whose scale is NaN or Inf. One reduction and one 4-byte
    copy to the host on the way through (the largest scale is finite iff every scale is: NaN
    propagates through max); the columns are looked for only when it is not."""
    if math.isfinite(scales.amax().item()):
        return
    columns = torch.nonzero(~torch.isfinite(scales)).flatten()
    shown = columns[:8].tolist()
    more = f" and {columns.numel() - 8} more" if columns.numel() > 8 else ""
    raise ValueError(
        f"x contains NaN or Inf in column(s) {shown}{more}; quantization needs finite values"
    )


# ----------------------------------------------------------------------------- torch reference
def _scales_from_amax(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, 1/s) from float32 column maxima [D]. Divides by a tensor, never by a Python scalar: on
    CUDA, torch turns ``t / scalar`` into ``t * (1 / scalar)``, which is not the IEEE quotient."""
    zeros = torch.zeros_like(amax)
    scales = torch.where(amax < TINY_AMAX, zeros, amax / torch.full_like(amax, 127.0))
    inv = torch.where(scales == 0, zeros, torch.reciprocal(scales))
    return scales, inv


def _torch_scales(x: torch.Tensor, scales: torch.Tensor, inv: torch.Tensor) -> None:
    s, r = _scales_from_amax(x.float().abs().amax(dim=0))
    scales.copy_(s)
    inv.copy_(r)


def _torch_quantize(x: torch.Tensor, inv: torch.Tensor, q: torch.Tensor) -> None:
    q.copy_(_codes(x, inv))


def _codes(x: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    return torch.round((x.float() * inv).clamp_(QMIN, QMAX)).to(torch.int8)


def _torch_dequantize(q: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    torch.mul(q.float(), scales, out=out)


def reference_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference as one function of ``x`` (what torch eager and torch.compile run)."""
    scales, inv = _scales_from_amax(x.float().abs().amax(dim=0))
    return _codes(x, inv), scales


def reference_dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``float(q) * scales`` (what torch eager and torch.compile run)."""
    return q.float() * scales


# ----------------------------------------------------------------------------- C++ / CUDA builds
_CPU_DECLARATIONS = """
void int8_cpu_compute_scales(at::Tensor x, at::Tensor scales);
void int8_cpu_quantize(at::Tensor x, at::Tensor scales, at::Tensor q);
void int8_cpu_dequantize(at::Tensor q, at::Tensor scales, at::Tensor out);
"""
_CUDA_DECLARATIONS = """
void int8_cuda_scales(at::Tensor x, at::Tensor scales, at::Tensor inv, int64_t stream_handle);
void int8_cuda_quantize(at::Tensor x, at::Tensor inv, at::Tensor q, int64_t variant, int64_t stream_handle);
void int8_cuda_dequantize(at::Tensor q, at::Tensor scales, at::Tensor out, int64_t variant, int64_t stream_handle);
"""


@functools.cache
def cpu_baseline_extension():
    """The C++ CPU baseline (``kvbits/cuda/int8_cpu_baseline.cpp``), built once per process through
    the shared loader."""
    from .cuda.loader import load_extension

    return load_extension(
        "int8_cpu_baseline",
        functions=["int8_cpu_compute_scales", "int8_cpu_quantize", "int8_cpu_dequantize"],
        declarations=_CPU_DECLARATIONS,
        extra_cflags=["-fopenmp", "-ffp-contract=off"],
        extra_ldflags=["-fopenmp"],
    )


@functools.cache
def cuda_extension():
    """The CUDA kernels of ``kvbits/cuda/int8_quant.cu``, built once per process."""
    from .cuda.loader import load_extension

    return load_extension(
        "int8_quant",
        functions=["int8_cuda_scales", "int8_cuda_quantize", "int8_cuda_dequantize"],
        declarations=_CUDA_DECLARATIONS,
    )


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


# ----------------------------------------------------------------------------- Triton kernels
_TINY: tl.constexpr = tl.constexpr(TINY_AMAX)
_RNE_MAGIC: tl.constexpr = tl.constexpr(
    12582912.0
)  # 1.5 * 2**23: y + M - M rounds |y| < 2**22 half to even


@triton.jit
def _absmax_kernel(
    x_ptr, amax_ptr, T, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, ITERS: tl.constexpr
):
    """Column max of |x| as float bits. x [T, D] fp32/fp16/bf16 contiguous; amax int32 [D], zeroed.

    Grid (cdiv(D, BLOCK_D), cdiv(T, BLOCK_T * ITERS)): program (c, s) covers columns
    [c*BLOCK_D, +BLOCK_D) over ITERS row tiles from s*BLOCK_T*ITERS and merges with ``atomic_max``
    (non-negative float bits order like the floats; NaN and Inf bits are above every finite
    value). The trip count is a constexpr: the interpreter cannot loop to a runtime bound under
    numpy 2, and a handful of power-of-two counts covers every shape.
    """
    cols = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    start = tl.program_id(1) * (BLOCK_T * ITERS)
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.int32)
    for i in range(ITERS):
        rows = start + i * BLOCK_T + tl.arange(0, BLOCK_T)
        mask = (rows < T)[:, None] & col_ok[None, :]
        v = tl.load(x_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], mask=mask, other=0.0)
        acc = tl.maximum(acc, tl.abs(v.to(tl.float32)).to(tl.int32, bitcast=True))
    tl.atomic_max(amax_ptr + cols, tl.max(acc, axis=0), mask=col_ok)


@triton.jit
def _finalize_kernel(scales_ptr, inv_ptr, D, BLOCK: tl.constexpr):
    """scales [D] fp32 holds amax on entry and s on exit; inv [D] fp32 gets 1/s (0 where s == 0)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    amax = tl.load(scales_ptr + offs, mask=mask, other=0.0)
    s = tl.where(amax < _TINY, 0.0, tl.math.div_rn(amax, tl.full([BLOCK], 127.0, tl.float32)))
    safe = tl.where(s == 0.0, 1.0, s)
    inv = tl.where(s == 0.0, 0.0, tl.math.div_rn(tl.full([BLOCK], 1.0, tl.float32), safe))
    tl.store(scales_ptr + offs, s, mask=mask)
    tl.store(inv_ptr + offs, inv, mask=mask)


@triton.jit
def _codes_of(x, inv):
    """round_half_even(clamp(x * inv, -128, 127)) as int8. Clamping first keeps the multiply out
    of any fused add; the magic-number add/subtract then rounds half to even exactly."""
    y = x.to(tl.float32) * inv
    y = tl.minimum(tl.maximum(y, -128.0), 127.0)
    y = (y + _RNE_MAGIC) - _RNE_MAGIC
    return y.to(tl.int8)


@triton.jit
def _quantize_kernel(x_ptr, inv_ptr, q_ptr, N, D, BLOCK: tl.constexpr):
    """q = round_half_even(clamp(x * inv, -128, 127)). x [T, D] fp32/fp16/bf16 and q [T, D] int8
    contiguous, seen flat (N = T * D elements); inv [D] fp32, indexed by column (flat index mod D).

    Grid (cdiv(N, BLOCK),): each program one run of BLOCK consecutive elements, so every access to
    x and q is a full-width vector whatever D is; the D reciprocals (a gather) stay in L2.
    """
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    inv = tl.load(inv_ptr + offs % D, mask=mask, other=0.0, eviction_policy="evict_last")
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(q_ptr + offs, _codes_of(v, inv), mask=mask)


@triton.jit
def _dequantize_kernel(q_ptr, scales_ptr, out_ptr, N, D, BLOCK: tl.constexpr):
    """out = float(q) * scales. q [T, D] int8, out [T, D] fp32 contiguous, seen flat (N = T * D);
    scales [D] fp32 by column. Grid as the quantize kernel."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    s = tl.load(scales_ptr + offs % D, mask=mask, other=0.0, eviction_policy="evict_last")
    q = tl.load(q_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, q.to(tl.float32) * s, mask=mask)


def _tile(D: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D) of the scales pass: 32 x 128 compiled, INTERPRETER_ELEMENTS-element
    tiles in the interpreter (fewer programs)."""
    if not triton_interpreted():
        return 32, min(triton.next_power_of_2(D), 128)
    block_d = min(triton.next_power_of_2(D), 256)
    return max(1, INTERPRETER_ELEMENTS // block_d), block_d


SCALES_WARPS = 8  # H200: 8 warps per scales-pass program beat 4 on every benchmark shape
FLAT_BLOCK = 1024  # elements per program of the flat passes (compiled)
INTERPRETER_ELEMENTS = 65536  # elements per program of every pass in the interpreter


def _device_programs(device: torch.device) -> int:
    if device.type == "cuda":
        return sm_count(device) * 4
    return 2


def _triton_scales(x: torch.Tensor, scales: torch.Tensor, inv: torch.Tensor) -> None:
    T, D = x.shape
    block_t, block_d = _tile(D)
    col_blocks = triton.cdiv(D, block_d)
    row_tiles = triton.cdiv(T, block_t)
    wanted_splits = max(1, _device_programs(x.device) // col_blocks)
    iters = min(64, triton.next_power_of_2(triton.cdiv(row_tiles, wanted_splits)))
    splits = triton.cdiv(row_tiles, iters)
    scales.zero_()
    _absmax_kernel[(col_blocks, splits)](
        x, scales.view(torch.int32), T, D, BLOCK_T=block_t, BLOCK_D=block_d, ITERS=iters,
        num_warps=SCALES_WARPS,
    )
    _finalize_kernel[(triton.cdiv(D, 1024),)](scales, inv, D, BLOCK=1024)


def _triton_elementwise(kernel, src: torch.Tensor, param: torch.Tensor, dst: torch.Tensor) -> None:
    """A flat pass over src [T, D] with one [D] parameter into dst [T, D] (all contiguous).

    Under the interpreter numpy computes it, and would warn about the non-finite values of an
    input that the NaN/Inf check (which follows the codes pass) rejects: the check speaks."""
    n = src.numel()
    interpreted = triton_interpreted()
    block = INTERPRETER_ELEMENTS if interpreted else FLAT_BLOCK
    with np.errstate(invalid="ignore") if interpreted else contextlib.nullcontext():
        kernel[(triton.cdiv(n, block),)](src, param, dst, n, src.shape[1], BLOCK=block, num_warps=4)


# ----------------------------------------------------------------------------- dispatch
def _scales_and_inverse(x: torch.Tensor, variant: str, scales: torch.Tensor) -> torch.Tensor:
    """Fill ``scales`` [D]; return inv [D] (1/s, 0 where s == 0). The caller checks ``scales``
    for NaN/Inf (``_require_finite_scales``) once its kernels are queued."""
    inv = torch.empty_like(scales)
    with on_device(x.device):
        if variant == "torch":
            _torch_scales(x, scales, inv)
        elif variant == "cpu_baseline":
            cpu_baseline_extension().int8_cpu_compute_scales(x, scales)
        elif variant == "triton":
            _triton_scales(x, scales, inv)
        else:
            cuda_extension().int8_cuda_scales(x, scales, inv, _stream(x.device))
    return inv


def compute_scales(
    x: torch.Tensor, *, variant: str | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-channel scales of ``x`` [T, D]: float32 [D], ``s_d = max_t |x[t, d]| / 127`` (0 below 2**-64)."""
    _check_matrix("x", x, INPUT_DTYPES)
    variant = _resolve_variant(variant, x.device, x.shape[1], (out,))
    _check_baseline_dtype(variant, x)
    x = _input(x, variant)
    scales = _output("out", out, (x.shape[1],), torch.float32, x.device, variant)
    _scales_and_inverse(x, variant, scales)
    _require_finite_scales(scales)
    return scales


def _check_baseline_dtype(variant: str, x: torch.Tensor) -> None:
    if variant == "cpu_baseline" and x.dtype != torch.float32:
        raise TypeError(
            f"x must have dtype float32 for variant='cpu_baseline'; got {str(x.dtype).replace('torch.', '')}"
        )


def quantize_per_channel(
    x: torch.Tensor,
    *,
    variant: str | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` [T, D] to int8 codes [T, D] and float32 scales [D] (rules in the module doc).

    ``out=(q, scales)`` writes into given tensors. Raises ``ValueError`` for NaN/Inf in ``x``, a
    variant that cannot run on ``x``'s device, or ``vectorized`` with ``D % 4 != 0`` or an output
    that is not 16-byte aligned.
    """
    _check_matrix("x", x, INPUT_DTYPES)
    T, D = x.shape
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
        raise TypeError("out must be a (q, scales) pair of tensors")
    variant = _resolve_variant(variant, x.device, D, out or ())
    _check_baseline_dtype(variant, x)
    q = _output(
        "out[0] (q)", None if out is None else out[0], (T, D), torch.int8, x.device, variant
    )
    scales = _output(
        "out[1] (scales)", None if out is None else out[1], (D,), torch.float32, x.device, variant
    )
    x = _input(x, variant)
    inv = _scales_and_inverse(x, variant, scales)
    with on_device(x.device):
        if variant == "torch":
            _torch_quantize(x, inv, q)
        elif variant == "cpu_baseline":
            cpu_baseline_extension().int8_cpu_quantize(x, scales, q)
        elif variant == "triton":
            _triton_elementwise(_quantize_kernel, x, inv, q)
        else:
            cuda_extension().int8_cuda_quantize(
                x, inv, q, CUDA_VARIANTS[variant], _stream(x.device)
            )
    _require_finite_scales(scales)  # once every kernel is queued: the one host sync comes last
    return q, scales


def dequantize_per_channel(
    q: torch.Tensor,
    scales: torch.Tensor,
    *,
    variant: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reconstruct ``x_hat = float(q) * scales``: q int8 [T, D], scales float32 [D] -> float32 [T, D].
    Raises ``ValueError`` for a negative, NaN or Inf scale (one read back of the smallest and largest)."""
    _check_matrix("q", q, (torch.int8,))
    T, D = q.shape
    _check_scales(scales, D)
    require_same_device(q=q, scales=scales)
    _require_scale_values(scales)
    variant = _resolve_variant(variant, q.device, D, (out,))
    result = _output("out", out, (T, D), torch.float32, q.device, variant)
    q = _input(q, variant)
    scales = _input(scales, variant)
    with on_device(q.device):
        if variant == "torch":
            _torch_dequantize(q, scales, result)
        elif variant == "cpu_baseline":
            cpu_baseline_extension().int8_cpu_dequantize(q, scales, result)
        elif variant == "triton":
            _triton_elementwise(_dequantize_kernel, q, scales, result)
        else:
            cuda_extension().int8_cuda_dequantize(
                q, scales, result, CUDA_VARIANTS[variant], _stream(q.device)
            )
    return result


# ----------------------------------------------------------------------------- ahead-of-time specs
def _aot_specs() -> list[AotSpec]:
    specs = []
    for dtype in ("fp32", "fp16", "bf16"):
        specs.append(
            AotSpec(
                f"int8_absmax_{dtype}",
                _absmax_kernel,
                {"x_ptr": f"*{dtype}", "amax_ptr": "*i32", "T": "i32", "D": "i32"},
                {"BLOCK_T": 32, "BLOCK_D": 128, "ITERS": 16},
                num_warps=SCALES_WARPS,
                divisible_ints=("D",),
            )
        )
        specs.append(
            AotSpec(
                f"int8_quantize_{dtype}",
                _quantize_kernel,
                {"x_ptr": f"*{dtype}", "inv_ptr": "*fp32", "q_ptr": "*i8", "N": "i32", "D": "i32"},
                {"BLOCK": FLAT_BLOCK},
                divisible_ints=("N", "D"),
            )
        )
    specs.append(
        AotSpec(
            "int8_finalize",
            _finalize_kernel,
            {"scales_ptr": "*fp32", "inv_ptr": "*fp32", "D": "i32"},
            {"BLOCK": 1024},
        )
    )
    specs.append(
        AotSpec(
            "int8_dequantize",
            _dequantize_kernel,
            {"q_ptr": "*i8", "scales_ptr": "*fp32", "out_ptr": "*fp32", "N": "i32", "D": "i32"},
            {"BLOCK": FLAT_BLOCK},
            divisible_ints=("N", "D"),
        )
    )
    return specs


AOT_SPECS = _aot_specs()
