"""Mutation testing: planted kernel bugs that the suites must catch.

``python -m harness.mutants [--only NAME...] [--list] [--ci] [--results-dir DIR] [--jobs N]``

Each entry of :data:`CATALOGUE` is one bug, written as an exact text substitution
(``original`` -> ``mutated``) in one source file. The runner copies the project's
working tree into a temporary directory per worker (the sources here are never
touched), applies one mutant at a time, runs the suites mapped to it there with
pytest (``-x -q -p no:cacheprovider`` and a per-mutant timeout) and restores the
file. A mutant is *killed* when that run fails (a failing test, an error, a crash or
a timeout) and *survives* when every selected test passes.

Before any mutant runs, each distinct test selection runs once on the unmutated copy:
a selection that fails there, selects nothing or skips everything makes its mutants
an ERROR (a kill would prove nothing). So does a mutant whose ``original`` snippet
no longer occurs exactly once in its file, or whose mutated Python does not compile:
the catalogue cannot rot silently.

On a machine without a GPU the suites run in the Triton interpreter, and mutants of
CUDA sources or of branches that only compiled Triton takes are skipped (``gpu_only``);
on a GPU everything runs compiled. Results are printed as a table and written as
records (suite ``mutants``: outcome ``passed`` when killed, ``failed`` when it
survived, ``error`` for a catalogue error, ``skipped``; metrics ``killed_by``,
``seconds``) with a manifest into a run directory that ``python -m harness report``
renders.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .records import (
    RECORDS_FILE,
    Record,
    read_records,
    utc_now,
)
from .streamed_run import StreamedRun, positive_float, positive_int
from .subproc import ChildGroups, run_killable

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 600
BAD = ("failed", "error", "crashed", "timeout")
_SKIP_DIRS = {".git", "__pycache__", ".nox", ".venv", "reports", ".pytest_cache", ".ruff_cache",
              ".hypothesis", "build", "shared"}


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``original`` (which must occur exactly once) by ``mutated``.

    ``select``: pytest paths or node ids (``file::test``) that must catch it, cheapest
    first; ``k``: a ``-k`` expression applied to them (device-neutral: on CPU it picks
    the ``cpu-*`` cases, on a GPU box the ``cuda-*`` ones). ``gpu_only``: the code only
    runs on a GPU (CUDA source, or a branch only compiled Triton takes);
    ``interpreter_only``: the code is a branch only the Triton interpreter takes (its
    compiled twin has a mutant of its own). ``ci``: part of the CI-sized subset.
    """

    name: str
    path: str
    original: str
    mutated: str
    breaks: str
    select: tuple[str, ...]
    k: str | None = None
    gpu_only: bool = False
    ci: bool = False
    interpreter_only: bool = False

    @property
    def selection(self) -> tuple[tuple[str, ...], str | None]:
        return self.select, self.k


def _m(name, path, original, mutated, breaks, select, k=None, *, gpu_only=False, ci=False,
       interpreter_only=False) -> Mutant:
    select = (select,) if isinstance(select, str) else tuple(select)
    return Mutant(name, path, original, mutated, breaks, select, k, gpu_only, ci, interpreter_only)


PACKING = "kernels/packing.py"
PACK3_CU = "kernels/cuda/pack3.cu"
INT8 = "kernels/int8.py"
INT8_CU = "kernels/cuda/int8_quant.cu"
INT8_CPP = "kernels/cuda/int8_cpu_baseline.cpp"
AFFINE = "kernels/affine.py"
KV_CACHE = "kernels/kv_cache.py"
DECODE = "kernels/decode.py"
PAGED = "kernels/paged.py"
READ_FLOOR = "harness/read_floor.py"

GOLDEN = "suites/test_golden.py"
WALK_BITS = "suites/test_walking.py::test_walking_bits_through_the_packed_stream"
WALK_STRADDLE = "suites/test_walking.py::test_three_bit_straddling_lanes_in_both_layouts"
GPTQ = "suites/test_gptq.py"
INT8_CORE = "suites/test_int8_core.py"
INT8_VARIANTS = "suites/test_int8_variants.py"
AFFINE_BITS = "suites/test_affine_roundtrip.py::test_triton_matches_torch_bit_for_bit"
AFFINE_KINDS = "suites/test_affine_roundtrip.py::test_kinds_of_groups_reconstruct"
AFFINE_TILES = "suites/test_affine_roundtrip.py::test_every_tile_shape_writes_the_reference"
AFFINE_TIES = "suites/test_affine_roundtrip.py::test_exact_ties_round_half_to_even_in_both_backends"
AFFINE_CLAMP = "suites/test_affine_roundtrip.py::test_top_codes_are_clamped_in_both_backends"
STREAM = "suites/test_streaming.py::test_append_equals_one_shot"
FUSED = "suites/test_decode_fused.py"
READ_FLOOR_TESTS = "tests/test_read_floor.py"
SMALL_AFFINE = "1x2x64x64x32"  # the cheapest shape of the bit-for-bit affine test (D = 2 G)

CATALOGUE: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ packing, Triton
    _m("pack-byte-wrong-shift", PACKING,
       "word = tl.sum(vals << (lanes * BITS)[None, :], axis=1)",
       "word = tl.sum(vals << (lanes * (BITS + 1))[None, :], axis=1)",
       "byte pack shifts lane i to bit (b+1)*i instead of b*i", GOLDEN, "triton"),
    _m("unpack-byte-wrong-mask", PACKING,
       "vals = ((word[:, None] >> (lanes * BITS)[None, :]) & ((1 << BITS) - 1)).to(tl.uint8)",
       "vals = ((word[:, None] >> (lanes * BITS)[None, :]) & ((1 << BITS) - 2)).to(tl.uint8)",
       "byte unpack masks with 2^b - 2: every value loses its LSB", GOLDEN, "triton"),
    _m("unpack-byte-v2-straddle", PACKING,
       "vals = ((word[:, None] >> (lanes * BITS)[None, :]) & ((1 << BITS) - 1)).to(tl.uint8)",
       "vals = ((word[:, None] >> (lanes * BITS)[None, :])"
       " & tl.where(lanes == 2, (1 << BITS) - 1 >> 1, (1 << BITS) - 1)[None, :]).to(tl.uint8)",
       "byte unpack drops v2's straddle bit (b1 bit 0 for 3 bits)", GOLDEN, "triton", ci=True),
    _m("pack-byte-v5-straddle", PACKING,
       "        vals = vals.to(tl.int32)\n    word = tl.sum(",
       "        vals = tl.where((lanes == 5)[None, :], vals & 1, vals).to(tl.int32)\n    word = tl.sum(",
       "byte pack drops v5's straddle bits (b2 bits 1:0 for 3 bits)", GOLDEN, "triton"),
    _m("unpack-word-lane10-straddle", PACKING,
       "hi = tl.where((straddles & (word_of + 1 == k))[None, :], w[:, None]",
       "hi = tl.where((straddles & (lanes != 10) & (word_of + 1 == k))[None, :], w[:, None]",
       "word unpack drops lane 10's high bit (W1 bit 0)", WALK_BITS, "triton", ci=True),
    _m("pack-word-lane21-straddle", PACKING,
       "part = part | tl.where((straddles & (word_of + 1 == k))[None, :], high, 0)",
       "part = part | tl.where((straddles & (lanes != 21) & (word_of + 1 == k))[None, :], high, 0)",
       "word pack drops lane 21's high bits (W2 bits 1:0)", WALK_STRADDLE, "triton"),
    _m("word-straddle-off-by-one", PACKING,
       "straddles = (start % 32) + BITS > 32",
       "straddles = (start % 32) + BITS > 33",
       "word layout straddle test off by one: a lane ending one bit past its word is not split",
       GPTQ, "triton"),
    _m("unpack-word-wrong-shift", PACKING,
       "lo = tl.where((word_of == k)[None, :], w[:, None] >> shift[None, :], lo)",
       "lo = tl.where((word_of == k)[None, :], w[:, None] >> (shift + 1)[None, :], lo)",
       "word unpack shifts one bit too far", GPTQ, "triton"),
    _m("pack-byte-swapped-bytes", PACKING,
       "out = ((word[:, None] >> (byte_idx * 8)[None, :]) & 0xFF).to(tl.uint8)",
       "out = ((word[:, None] >> ((byte_idx ^ 1) * 8)[None, :]) & 0xFF).to(tl.uint8)",
       "byte pack swaps bytes 0 and 1 of each group", GOLDEN, "triton"),
    _m("unpack-byte-next-group", PACKING,
       "raw = tl.load(src + groups[:, None] * NB + byte_idx[None, :],",
       "raw = tl.load(src + (groups[:, None] * NB + byte_idx[None, :] + NB) % (n_groups * NB),",
       "byte unpack reads the next group's bytes (off-by-one group)", GOLDEN, "triton"),
    _m("torch-msb-first-fields", PACKING,
       "out |= fields[..., j] << j",
       "out |= fields[..., j] << (width - 1 - j)",
       "torch reference fills each packed byte and each unpacked value MSB first", GOLDEN, "torch"),
    _m("pack-torch-stream-off-by-one", PACKING,
       "return _regroup(_bit_stream(values, bits), 8)",
       "return _regroup(_bit_stream(values, bits).roll(1, -1), 8)",
       "torch reference pack shifts the bit stream by one (a value's top bit wraps to bit 0)", GOLDEN,
       "torch"),
    _m("unpack-torch-stream-off-by-one", PACKING,
       "return _regroup(_bit_stream(packed, 8), bits)",
       "return _regroup(_bit_stream(packed, 8).roll(1, -1), bits)",
       "torch reference unpack reads the bit stream one bit late (a byte's top bit wraps to bit 0)", GOLDEN,
       "torch"),
    # ------------------------------------------------------------------ packing, CUDA
    _m("pack3-cuda-lane10-straddle", PACK3_CU,
       "if (kShift > 29) v |= hi_word << (32 - kShift);",
       "if (kShift > 30) v |= hi_word << (32 - kShift);",
       "CUDA quad unpack drops lane 10's high bit", ("suites/test_walking.py", GOLDEN), "cuda",
       gpu_only=True),
    _m("pack3-cuda-lane21-straddle", PACK3_CU,
       "if constexpr (kShift > 29) {",
       "if constexpr (kShift > 29 && I != 21) {",
       "CUDA quad pack drops lane 21's high bits", ("suites/test_walking.py", GOLDEN), "cuda",
       gpu_only=True),
    _m("pack3-cuda-tail-dropped", PACK3_CU,
       "for (int64_t o = 4 * n_quads + first; o < n_octets; o += stride) unpack_octet(",
       "for (int64_t o = 4 * n_quads + first; o < n_octets - (wide ? n_octets % 4 : 0); o += stride)"
       " unpack_octet(",
       "CUDA unpack skips the octets after the last whole quad (vectorized tail dropped)",
       (GOLDEN, GPTQ), "cuda", gpu_only=True),
    # ------------------------------------------------------------------ INT8, Triton and torch
    _m("int8-triton-tie-up", INT8,
       "y = (y + _RNE_MAGIC) - _RNE_MAGIC",
       "y = tl.floor(y + 0.5)",
       "Triton quantize rounds ties up (2.5 -> 3) instead of to even", f"{INT8_CORE}::test_cpu_quant_values",
       "triton", ci=True),
    _m("int8-torch-tie-up", INT8,
       "return torch.round((x.float() * inv).clamp_(QMIN, QMAX)).to(torch.int8)",
       "return torch.floor(0.5 + (x.float() * inv).clamp_(QMIN, QMAX)).to(torch.int8)",
       "torch reference rounds ties up instead of to even", f"{INT8_CORE}::test_cpu_quant_values", "torch"),
    _m("int8-triton-clamp-126", INT8,
       "y = tl.minimum(tl.maximum(y, -128.0), 127.0)",
       "y = tl.minimum(tl.maximum(y, -128.0), 126.0)",
       "Triton quantize clamps at 126: the column maximum loses a step", f"{INT8_VARIANTS}::test_1x4",
       "triton"),
    _m("int8-torch-scale-128", INT8,
       "amax / torch.full_like(amax, 127.0)",
       "amax / torch.full_like(amax, 128.0)",
       "torch reference scale divides by 128 instead of 127", f"{INT8_CORE}::test_compute_scales_simple",
       "torch"),
    _m("int8-triton-floor-inclusive", INT8,
       "s = tl.where(amax < _TINY, 0.0,",
       "s = tl.where(amax <= _TINY, 0.0,",
       "Triton scales: a column exactly at the 2^-64 floor gets scale 0", f"{INT8_CORE}::test_tiny_columns",
       "triton"),
    _m("int8-triton-flat-tail", INT8,
       "tl.store(q_ptr + offs, _codes_of(v, inv), mask=mask)",
       "tl.store(q_ptr + offs, _codes_of(v, inv), mask=mask & (offs < N - N % BLOCK))",
       "Triton codes pass drops the last partial block of the flat run (tail dropped)",
       f"{INT8_VARIANTS}::test_gpu_correctness", "triton and 260", ci=True),
    _m("int8-triton-absmax-signed", INT8,
       "acc = tl.maximum(acc, tl.abs(v.to(tl.float32)).to(tl.int32, bitcast=True))",
       "acc = tl.maximum(acc, v.to(tl.float32).to(tl.int32, bitcast=True))",
       "Triton scales take max(x) instead of max |x|", f"{INT8_CORE}::test_compute_scales_simple", "triton"),
    _m("int8-triton-dequant-wrong-column", INT8,
       "s = tl.load(scales_ptr + offs % D,",
       "s = tl.load(scales_ptr + (offs + 1) % D,",
       "Triton dequantize uses the next column's scale", f"{INT8_CORE}::test_cpu_dequant_values", "triton"),
    _m("int8-cpu-baseline-round-away", INT8_CPP,
       "static_cast<int8_t>(std::nearbyint(y))",
       "static_cast<int8_t>(std::round(y))",
       "C++ baseline rounds ties away from zero (std::round)", f"{INT8_CORE}::test_cpu_quant_values",
       "cpu_baseline"),
    # ------------------------------------------------------------------ INT8, CUDA
    _m("int8-cuda-vectorized-tail", INT8_CU,
       "  for (; g < groups; g += stride) store4(out + g * 4, transform(load4(in + g * 4)));",
       "  if (g < 0) store4(out + g * 4, transform(load4(in + g * 4)));",
       "vectorized kernel drops the groups after its 4-in-flight loop (tail dropped)",
       (INT8_VARIANTS, INT8_CORE), "vectorized", gpu_only=True),
    _m("int8-cuda-clamp-126", INT8_CU,
       "const float y = fminf(fmaxf(v * inv, -128.0f), 127.0f);",
       "const float y = fminf(fmaxf(v * inv, -128.0f), 126.0f);",
       "CUDA quantize clamps at 126", f"{INT8_VARIANTS}::test_1x4", "cuda", gpu_only=True),
    _m("int8-cuda-round-away", INT8_CU,
       "static_cast<int8_t>(__float2int_rn(y))",
       "static_cast<int8_t>(roundf(y))",
       "CUDA quantize rounds ties away from zero (roundf)", f"{INT8_CORE}::test_cpu_quant_values", "cuda",
       gpu_only=True),
    _m("int8-cuda-absmax-row-dropped", INT8_CU,
       "for (int r = 1; r < by; ++r) m = max(m, partial[(r * bx + tx) * kCols + c]);",
       "for (int r = 1; r < by - 1; ++r) m = max(m, partial[(r * bx + tx) * kCols + c]);",
       "CUDA scales pass: the block reduction skips its last row of partial maxima",
       (f"{INT8_CORE}::test_random_matches_oracle", INT8_VARIANTS), "cuda", gpu_only=True),
    _m("int8-cuda-tiled-last-row", INT8_CU,
       "if (row < T_ && col < D) tile[r][tx] = to_f32(in[row * D + col]);",
       "if (row < T_ - 1 && col < D) tile[r][tx] = to_f32(in[row * D + col]);",
       "tiled kernel never stages the last row into shared memory", INT8_VARIANTS, "tiled", gpu_only=True),
    # ------------------------------------------------------------------ affine quantization
    _m("affine-zero-point-sign", AFFINE,
       "zero = torch.clamp(torch.round(-lo0.double() * inv.double()).float(), 0.0, qmax)",
       "zero = torch.clamp(torch.round(lo0.double() * inv.double()).float(), 0.0, qmax)",
       "torch reference zero point from +min instead of -min (clamps to 0)", AFFINE_KINDS, "torch and randn"),
    _m("affine-triton-zero-truncated", AFFINE,
       "zero = _round_product(-lo0, inv, INTERPRET)",
       "zero = tl.floor(-lo0 * inv).to(tl.int32)",
       "Triton zero point truncated instead of rounded", AFFINE_BITS, SMALL_AFFINE),
    _m("affine-scale-rounded-to-nearest", AFFINE,
       "return torch.where(low.float() < s, bumped, low).float()",
       "return low.float()",
       "torch reference rounds the fp16 scale to nearest, not up (range may not fit)", AFFINE_BITS,
       SMALL_AFFINE),
    _m("affine-triton-codes-floor", AFFINE,
       "return ((y + 6755399441055744.0) - 6755399441055744.0).to(tl.int32)",
       "return tl.floor(y).to(tl.int32)",
       "Triton codes and zero points rounded down instead of to nearest", AFFINE_BITS, SMALL_AFFINE, interpreter_only=True),
    _m("affine-triton-tie-up", AFFINE,
       "return ((y + 6755399441055744.0) - 6755399441055744.0).to(tl.int32)",
       "return tl.floor(y + 0.5).to(tl.int32)",
       "Triton codes and zero points round ties up instead of to even", AFFINE_TIES, interpreter_only=True),
    _m("affine-triton-word1-shift", AFFINE,
       "w1 = ((b >> 8) | (c << 16)).to(tl.int32, bitcast=True)",
       "w1 = ((b >> 8) | (c << 15)).to(tl.int32, bitcast=True)",
       "Triton 3-bit store shifts octet c one bit short in word 3m+1", AFFINE_BITS, SMALL_AFFINE),
    _m("affine-triton-v-group-off-by-one", AFFINE,
       "p_off = dst_tok[:, None] * (D // G) + (pid_c * NG + tl.arange(0, NG))[None, :]",
       "p_off = dst_tok[:, None] * (D // G) + ((pid_c * NG + tl.arange(0, NG) + 1) % (D // G))[None, :]",
       "Triton V scale/zero stored in the neighbouring channel group (off-by-one group)", AFFINE_BITS,
       SMALL_AFFINE, ci=True),
    _m("affine-triton-wide-store-order", AFFINE,
       "tl.store(run, _quad(x0, y0, z0, x1), mask=run_mask)",
       "tl.store(run, _quad(x0, z0, y0, x1), mask=run_mask)",
       "Triton 16-byte code stores put words 3m+1 and 3m+2 in each other's place", AFFINE_TILES, "c128"),
    _m("affine-triton-v-scale-unmasked", AFFINE,
       "tl.store(scale + p_off, s.to(scale.dtype.element_ty), mask=row_mask)",
       "tl.store(scale + p_off, s.to(scale.dtype.element_ty))",
       "Triton V scales of a last tile's rows past the input written too", AFFINE_TILES, "v-t64"),
    _m("affine-compiled-products-off-by-one", AFFINE,
       "return tl.fma(x, inv, 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000",
       "return tl.fma(x, inv, 12582912.0).to(tl.int32, bitcast=True) - 0x4B3FFFFF",
       "compiled Triton codes and zero points one too high (magic-number offset)", AFFINE_BITS, "triton",
       gpu_only=True),
    _m("affine-triton-codes-unclamped", AFFINE,
       "return tl.minimum(q.to(tl.uint32, bitcast=True), (1 << BITS) - 1)",
       "return tl.maximum(q, 0).to(tl.uint32)",
       "Triton codes not clamped at the top: a group's maximum can carry into the next code",
       AFFINE_CLAMP),
    _m("stream-group-boundary", KV_CACHE,
       "            full = (r + t) // g * g\n",
       "            full = (r + t - 1) // g * g\n",
       "append: a group completed exactly by this append is left unquantized", STREAM, "groups and torch",
       ci=True),
    # ------------------------------------------------------------------ fused decode
    _m("decode-max-not-rescaled", DECODE,
       "    alpha = tl.exp2(m - m_new)\n    p = tl.exp2(qk - m_new[None, :])\n    l_acc = l_acc * alpha[None, :] + p",
       "    alpha = tl.where(m > float(\"-inf\"), 1.0, 0.0)\n    p = tl.exp2(qk - m_new[None, :])\n"
       "    l_acc = l_acc * alpha[None, :] + p",
       "online softmax over code tiles: sum and accumulator not rescaled when the max grows",
       f"{FUSED}::test_sm_scale_and_splits"),
    _m("decode-residual-max-not-rescaled", DECODE,
       "    alpha = tl.exp2(m - m_new)\n    p = tl.exp2(qk - m_new[:, None])\n    l = l * alpha + tl.sum(p, 1)",
       "    alpha = tl.where(m > float(\"-inf\"), 1.0, 0.0)\n    p = tl.exp2(qk - m_new[:, None])\n"
       "    l = l * alpha + tl.sum(p, 1)",
       "online softmax over the residual window: not rescaled when the max grows", f"{FUSED}::test_lengths"),
    _m("decode-residual-split-not-merged", DECODE,
       "ok = s < num_parts",
       "ok = s < num_parts - 1",
       "merge drops the last partial (the residual window's split)", f"{FUSED}::test_lengths", ci=True),
    _m("decode-merge-unweighted", DECODE,
       "w = tl.exp2(lse - tl.max(lse, 0))",
       "w = tl.where(lse > float(\"-inf\"), 1.0, 0.0)",
       "merge averages the splits instead of weighting them by their log-sum-exp",
       f"{FUSED}::test_sm_scale_and_splits"),
    _m("decode-scale-word-halves", DECODE,
       "lo, hi = tl.split(_halves(w, scale_dtype))",
       "hi, lo = tl.split(_halves(w, scale_dtype))",
       "each 32-bit scale word read the other way round (K channels 2j and 2j + 1, V groups 0 and 1 swapped)",
       f"{FUSED}::test_scale_words_and_the_16_bit_fallback", interpreter_only=True),
    _m("decode-page-wrap-late", DECODE,
       "wrap = (off >= page_size).to(tl.int32)",
       "wrap = (off > page_size).to(tl.int32)",
       "the tile after a page's last one is read past that page (the next block-table entry taken one tile late)",
       f"{FUSED}::test_paged_equals_contiguous"),
    _m("decode-merge-channel-block", DECODE,
       "d = tl.program_id(2) * DM + tl.arange(0, DM)",
       "d = tl.arange(0, DM)",
       "every merge program writes the first block of channels (the others are never written)",
       f"{FUSED}::test_seed_case", ci=True),
    _m("decode-gqa-wrong-kv-head", DECODE,
       "(h * GROUP + head) * stride_qh",
       "(h + head * tl.num_programs(1)) * stride_qh",
       "GQA: query heads interleaved over kv heads (head j -> kv head j % Hkv, not j // group)",
       f"{FUSED}::test_gqa"),
    _m("decode-reference-gqa-interleaved", DECODE,
       "qd = q.to(dtype).reshape(b, hkv, group, d)",
       "qd = q.to(dtype).reshape(b, group, hkv, d).transpose(1, 2)",
       "float64 reference maps query heads to the wrong kv heads", f"{FUSED}::test_gqa"),
    _m("decode-code-len-off-by-one-group", DECODE,
       "return length, tl.minimum(length, (cached // G) * G)",
       "return length, tl.minimum(length, ((cached - 1) // G) * G)",
       "a cache ending on a group boundary attends its last group from the residual window",
       f"{FUSED}::test_seed_case", "triton", ci=True),
    _m("decode-last-tile-dropped", DECODE,
       "t_end = tl.minimum(t_begin + tiles_per_split, (code_len + BLOCK_T - 1) // BLOCK_T)",
       "t_end = tl.minimum(t_begin + tiles_per_split, code_len // BLOCK_T)",
       "a partly attended last code tile is skipped (tail dropped)", f"{FUSED}::test_partial_last_group"),
    _m("decode-k-zero-point", DECODE,
       "bias = tl.sum(x * kz[:, None], 0)",
       "bias = tl.sum(x * (kz + 1.0)[:, None], 0)",
       "K zero point off by one code in the fused dequantization",
       (f"{FUSED}::test_seed_case", f"{FUSED}::test_gqa"), "triton"),
    _m("decode-v-zero-point", DECODE,
       "ps32 * z[:, None]",
       "ps32 * (z - 1.0)[:, None]",
       "V zero point off by one code in the fused dequantization", f"{FUSED}::test_seed_case", "triton"),
    _m("decode-v-code-unit", DECODE,
       "out0 = tl.trans(_head_part(acc0, G, HALF, VCOLS)) * UNIT_INV",
       "out0 = tl.trans(_head_part(acc0, G, HALF, VCOLS)) * UNIT_INV * 0.5",
       "V products scaled back by 2^23, not the 2^24 of the subnormal codes", f"{FUSED}::test_seed_case",
       "triton"),
    _m("decode-halves-swapped", DECODE,
       "return tl.join((w & 0xFFFF).to(tl.uint16), (w >> 16).to(tl.uint16)).to(DT, bitcast=True)",
       "return tl.join((w >> 16).to(tl.uint16), (w & 0xFFFF).to(tl.uint16)).to(DT, bitcast=True)",
       "the gathered weight and q*s words read high half first",
       ("suites/test_decode_layout.py::test_kernel_weight_operand", f"{FUSED}::test_seed_case")),
    _m("decode-compiled-pairs-swapped", DECODE,
       "\"mov.b32 $0, $1;\"",
       "\"prmt.b32 $0, $1, 0, 0x1032;\"",
       "compiled unpack swaps the two codes of each register (tensor-core fp16 pair)",
       f"{FUSED}::test_seed_case", gpu_only=True),
    _m("decode-top-bit-shift", DECODE,
       "last = (w0s9 & 0x00400040) | ((w1 >> 8) & 0x00800080) | ((w2 >> 7) & 0x01000100)",
       "last = (w0s9 & 0x00400040) | ((w1 >> 9) & 0x00800080) | ((w2 >> 7) & 0x01000100)",
       "3-bit unpack (three classes) reads the last pair's bit of plane 1 one bit off",
       ("suites/test_decode_layout.py::test_kernel_three_bit_pairs_match_the_twin", f"{FUSED}::test_seed_case")),
    _m("decode-top-bit-shift-two-classes", DECODE,
       "last = (w0s12 & 0x00080008) | ((w1 >> 11) & 0x00100010) | ((w2 >> 10) & 0x00200020)",
       "last = (w0s12 & 0x00080008) | ((w1 >> 12) & 0x00100010) | ((w2 >> 10) & 0x00200020)",
       "3-bit unpack (two classes, tiles under 64 tokens) reads the last pair's bit of plane 1 one bit off",
       ("suites/test_decode_layout.py::test_kernel_three_bit_pairs_match_the_twin",
        f"{FUSED}::test_two_v_groups_in_one_group_per_thread")),
    _m("decode-class-factor-value", DECODE,
       "tl.where(cls == 1, 0.125, 0.015625)),\n                tl.where(cls == 0, 1.0, tl.where(cls == 1, 8.0, 64.0)))",
       "tl.where(cls == 1, 0.25, 0.015625)),\n                tl.where(cls == 0, 1.0, tl.where(cls == 1, 4.0, 64.0)))",
       "3-bit codes held as code * 2^-21 weighted by 1/4 instead of 1/8",
       f"{FUSED}::test_seed_case", "triton"),
    _m("decode-class-two-factor-value", DECODE,
       "tl.where(cls == 1, 0.125, 0.015625)),\n                tl.where(cls == 0, 1.0, tl.where(cls == 1, 8.0, 64.0)))",
       "tl.where(cls == 1, 0.125, 0.03125)),\n                tl.where(cls == 0, 1.0, tl.where(cls == 1, 8.0, 32.0)))",
       "3-bit codes held as code * 2^-18 weighted by 1/32 instead of 1/64",
       f"{FUSED}::test_seed_case", "triton"),
    _m("decode-class-factor-bit", DECODE,
       "cls = (k >> 1) & 1",
       "cls = k & 1",
       "3-bit codes held as code * 2^-21 get the factor 1/8 by the wrong bit of their reduction index",
       f"{FUSED}::test_seed_case", "triton"),
    _m("decode-class-two-bits", DECODE,
       "cls = tl.where((k & 48) == 48, 2, cls)",
       "cls = tl.where((k & 40) == 40, 2, cls)",
       "3-bit codes held as code * 2^-18 picked by the wrong bits of their reduction index",
       f"{FUSED}::test_seed_case", "triton"),
    _m("decode-v-class-token-bit", DECODE,
       "(t & ~15) | ((t & 7) << 1) | ((t >> 3) & 1)",
       "(t & ~15) | ((t & 6) << 1) | ((t >> 1) & 2) | ((t >> 3) & 1)",
       "V tokens get the class factor of another token (bit 2 of the token read for bit 0)",
       f"{FUSED}::test_seed_case", "triton"),
    _m("decode-compiled-last-tile", DECODE,
       "for tile in range(t_begin, t_whole):",
       "for tile in range(t_begin, t_whole - 1):",
       "compiled split loop skips each split's last whole tile", f"{FUSED}::test_lengths", gpu_only=True),
    _m("decode-partial-tile-unmasked", DECODE,
       "t_whole = tl.maximum(t_begin, tl.minimum(t_end, code_len // BLOCK_T))",
       "t_whole = tl.maximum(t_begin, tl.minimum(t_end, (code_len + BLOCK_T - 1) // BLOCK_T))",
       "the last code tile, partly past code_len, attended without its token mask",
       f"{FUSED}::test_partial_last_group", ci=True),
    _m("decode-v-token-order", DECODE,
       "index = tl.reshape((8 * j + 2 * c + a) * HALF + n // (VCOLS // HALF)",
       "index = tl.reshape((8 * j + c + 4 * a) * HALF + n // (VCOLS // HALF)",
       "V product pairs the softmax weights with V codes in the wrong token order",
       f"{FUSED}::test_seed_case", "triton"),
    _m("decode-weight-halves-swapped", DECODE,
       "return lo16 | (hi16 << 16)",
       "return hi16 | (lo16 << 16)",
       "each word of V weights holds token t + 8's weight where token t's belongs (interpreter twin of the packing)",
       f"{FUSED}::test_seed_case", "triton"),
    _m("decode-v-group-halves-interleaved", DECODE,
       "return tl.split(tl.permute(tl.reshape(w, [T, 2, NRG // 2]), (0, 2, 1)))",
       "return tl.split(tl.reshape(w, [T, NRG // 2, 2]))",
       "V channel groups unpacked from every other word of a thread instead of its first and last half",
       (f"{FUSED}::test_head_dims", f"{FUSED}::test_group_sizes")),
    _m("decode-v-group-registers-interleaved", DECODE,
       "lo, hi = tl.split(tl.permute(tl.reshape(_code_pairs(w0, w1, w2, w3, BITS, CLASSES), [T, 2, 8]), (0, 2, 1)))",
       "lo, hi = tl.split(tl.reshape(_code_pairs(w0, w1, w2, w3, BITS, CLASSES), [T, 8, 2]))",
       "one group per thread: V channel groups taken from every other register instead of its two halves",
       f"{FUSED}::test_two_v_groups_in_one_group_per_thread"),
    _m("decode-word-runs-interleaved", DECODE,
       "w = tl.reshape(tl.permute(tl.join(w, _load_run(base + 4 * T, T, R)), (0, 2, 1)), [T, 8])",
       "w = tl.reshape(tl.join(w, _load_run(base + 4 * T, T, R)), [T, 8])",
       "the kernel takes a thread's two 4-word runs of a plane interleaved, not one after the other",
       f"{FUSED}::test_head_dims"),
    _m("paged-word-runs-of-two", PAGED,
       "return min(nrg, 4)",
       "return min(nrg, 2)",
       "decode arrangement stores 2-word runs where the kernel reads 16-byte runs",
       ("suites/test_decode_layout.py::test_thread_words_lie_in_runs", f"{FUSED}::test_seed_case")),
    _m("paged-word-runs-interleaved", PAGED,
       "src = per_f[:, :, value].reshape(threads, nrg // r, r, bits, 32)",
       "src = per_f[:, :, value].reshape(threads, r, nrg // r, bits, 32)",
       "packer interleaves a thread's runs of words instead of storing its groups in order",
       "suites/test_decode_layout.py::test_thread_words_lie_in_runs"),
    _m("paged-v-token-order", PAGED,
       "return (k & ~15) | ((k >> 1) & 7) | ((k & 1) << 3)",
       "return (k & ~15) | ((k & 7) << 1) | ((k >> 3) & 1)",
       "decode arrangement stores V tile tokens in an order the kernel does not read",
       "suites/test_decode_layout.py::test_v_token_order"),
    _m("paged-fragment-permutation", PAGED,
       "y = y.permute(*range(nd), nd + 2, nd + 0, nd + 3, nd + 1, nd + 4)",
       "y = y.permute(*range(nd), nd + 2, nd + 0, nd + 3, nd + 4, nd + 1)",
       "decode arrangement places values in the wrong MMA fragment registers",
       "suites/test_decode_layout.py::test_threads_hold_their_mma_fragments"),
    _m("paged-top-bit-shift", PAGED,
       "((w1 >> 11) & 0x00100010)",
       "((w1 >> 12) & 0x00100010)",
       "torch twin of the 3-bit unpack (two classes) reads the last pair's bit of plane 1 one bit off",
       "suites/test_decode_layout.py::test_bit_table_is_a_bijection"),
    _m("paged-top-bit-shift-three-classes", PAGED,
       "((w1 >> 8) & 0x00800080)",
       "((w1 >> 9) & 0x00800080)",
       "torch twin of the 3-bit unpack (three classes) reads the last pair's bit of plane 1 one bit off",
       "suites/test_decode_layout.py::test_bit_table_is_a_bijection"),
    # ------------------------------------------------------------------ the read floor (harness.read_floor)
    _m("read-floor-chunk-end-interpreted", READ_FLOOR,
       "acc ^= tl.load(x_ptr + idx, mask=idx < end, other=0)\n",
       "acc ^= tl.load(x_ptr + idx, mask=idx < end - 1, other=0)\n",
       "the interpreted flat read skips the last word of every chunk (a floor that reads less)",
       READ_FLOOR_TESTS, interpreter_only=True),
    _m("read-floor-chunk-end-compiled", READ_FLOOR,
       "acc ^= tl.load(x_ptr + idx, mask=idx < end, other=0, cache_modifier=\".cg\")",
       "acc ^= tl.load(x_ptr + idx, mask=idx < end - 1, other=0, cache_modifier=\".cg\")",
       "the compiled flat read skips the last word of every chunk (a floor that reads less)",
       READ_FLOOR_TESTS, gpu_only=True),
    _m("read-floor-chunks-overlap", READ_FLOOR,
       "end = tl.minimum(start + per_program, n)",
       "end = tl.minimum(start + per_program + 16, n)",
       "each program reads into the next one's chunk (words read twice)",
       READ_FLOOR_TESTS),
    _m("read-floor-chunk-rounded-down", READ_FLOOR,
       "per_program = -(-n // programs)",
       "per_program = n // programs",
       "chunks rounded down: the words past programs x chunk are never read",
       READ_FLOOR_TESTS),
)

MUTANT_NAMES = tuple(m.name for m in CATALOGUE)


# ------------------------------------------------------------------------------ applying
class CatalogueError(ValueError):
    """A mutant that cannot be applied to the current sources."""


def apply(mutant: Mutant, text: str) -> str:
    """``text`` with the mutant's substitution made; CatalogueError unless it occurs exactly once."""
    count = text.count(mutant.original)
    if count != 1:
        where = "no longer occurs" if count == 0 else f"occurs {count} times"
        raise CatalogueError(f"{mutant.name}: the original snippet {where} in {mutant.path}: "
                             f"{mutant.original.strip()[:80]!r}")
    if mutant.mutated == mutant.original:
        raise CatalogueError(f"{mutant.name}: the mutated snippet equals the original")
    mutated = text.replace(mutant.original, mutant.mutated)
    if mutant.path.endswith(".py"):
        try:
            compile(mutated, mutant.path, "exec")
        except SyntaxError as exc:
            raise CatalogueError(f"{mutant.name}: the mutated {mutant.path} does not compile: {exc}") from exc
    return mutated


def catalogue_problems(mutants: Iterable[Mutant] = CATALOGUE, root: Path = ROOT) -> list[str]:
    """Every reason a mutant cannot run as written against the sources under ``root``."""
    problems = []
    seen: set[str] = set()
    for mutant in mutants:
        if mutant.name in seen:
            problems.append(f"{mutant.name}: duplicate name")
        seen.add(mutant.name)
        source = root / mutant.path
        if not source.is_file():
            problems.append(f"{mutant.name}: no file {mutant.path}")
            continue
        try:
            apply(mutant, source.read_text(encoding="utf-8"))
        except CatalogueError as exc:
            problems.append(str(exc))
        for target in mutant.select:
            if not (root / target.split("::", 1)[0]).is_file():
                problems.append(f"{mutant.name}: selected test file {target.split('::', 1)[0]} does not exist")
    return problems


# ------------------------------------------------------------------------------ running
@dataclass
class Result:
    mutant: Mutant
    status: str  # killed | survived | error | skipped
    killed_by: str | None = None
    seconds: float = 0.0
    detail: str = ""

    OUTCOME = {"killed": "passed", "survived": "failed", "error": "error", "skipped": "skipped"}

    @property
    def outcome(self) -> str:
        return self.OUTCOME[self.status]


@dataclass
class RunOutput:
    """What one pytest run in a copy gave."""

    rc: int | None  # None: killed at the timeout
    seconds: float
    records: list[Record] = field(default_factory=list)
    tail: str = ""

    @property
    def first_bad(self) -> Record | None:
        return next((r for r in self.records if r.outcome in BAD), None)

    @property
    def n_passed(self) -> int:
        return sum(r.outcome == "passed" for r in self.records)


def project_files(root: Path = ROOT) -> list[str]:
    """Files of the working tree (tracked and untracked-but-not-ignored; all files outside git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, check=True, timeout=60)
        files = [f for f in out.stdout.decode().split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
    return sorted(f for f in files if (root / f).is_file() and f.split("/", 1)[0] not in _SKIP_DIRS)


def make_copy(dest: Path, root: Path = ROOT, files: Sequence[str] | None = None) -> Path:
    for rel in files if files is not None else project_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    return dest


def verify_copy(copy: Path) -> Path:
    """Make sure a child process in ``copy`` imports the copy's ``kernels`` (not an installed or
    editable one), or every mutant would silently test the original sources."""
    probe = "import importlib.util as u; print(u.find_spec('kernels').origin)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=copy, env=child_env(copy), capture_output=True,
                         text=True, timeout=120)
    origin = Path(out.stdout.strip() or "?").resolve()
    if out.returncode != 0 or copy.resolve() not in origin.parents:
        raise RuntimeError(f"a process in the copy {copy} imports kernels from {origin}, not from the copy: "
                           f"{out.stderr.strip()[-500:]}")
    return copy


def pytest_argv(select: Sequence[str], k: str | None, results_dir: Path, python: str = sys.executable) -> list[str]:
    argv = [python, "-m", "pytest", *select, "-x", "-q", "-p", "no:cacheprovider",
            "--results-dir", str(results_dir), "--leg", "mutant"]
    return argv + (["-k", k] if k else [])


def child_env(copy: Path, environ=os.environ) -> dict:
    env = {k: v for k, v in environ.items() if k not in ("KVH_RESULTS_DIR", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = str(copy)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a same-size mutant in the same second must not reuse a .pyc
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_selection(copy: Path, select: Sequence[str], k: str | None, timeout_s: float, scratch: Path,
                  groups: ChildGroups | None = None) -> RunOutput:
    """Run pytest on ``select`` in ``copy``; its records go to a fresh ``scratch`` directory.
    ``groups`` registers the pytest process so that an interrupt can kill it from another thread."""
    shutil.rmtree(scratch, ignore_errors=True)
    rc, out, seconds = run_killable(pytest_argv(select, k, scratch), env=child_env(copy), cwd=copy,
                                    timeout_s=timeout_s, groups=groups)
    records = read_records(scratch / RECORDS_FILE).records if (scratch / RECORDS_FILE).exists() else []
    return RunOutput(rc, seconds, records, out[-3000:])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("records:")]
    return lines[-1] if lines else ""


def clean_problem(run: RunOutput) -> str | None:
    """Why an unmutated run of a selection cannot serve to judge mutants (None when it can)."""
    if run.rc is None:
        return f"the unmutated selection did not finish within the timeout ({run.seconds:.0f} s)"
    if run.rc == 0 and run.n_passed:
        return None
    if run.rc == 0:
        return "every selected test was skipped on the unmutated sources"
    if run.rc == 5:
        return "the selection collects no test"
    bad = run.first_bad
    if bad is not None:
        return f"fails on the unmutated sources: {bad.nodeid} ({bad.outcome})"
    return f"pytest exit {run.rc} on the unmutated sources: {_last_line(run.tail)}"


def judge(mutant: Mutant, run: RunOutput) -> Result:
    """Killed, survived or error, from the mutant's pytest run."""
    if run.rc is None:
        return Result(mutant, "killed", f"timeout (no result within {run.seconds:.0f} s)", run.seconds,
                      "the run was stopped at the per-mutant timeout")
    if run.rc == 0:
        if not run.n_passed:
            return Result(mutant, "error", None, run.seconds, "every selected test was skipped")
        return Result(mutant, "survived", None, run.seconds, f"{run.n_passed} selected tests passed")
    if run.rc in (3, 4, 5):
        return Result(mutant, "error", None, run.seconds, f"pytest exit {run.rc}: {_last_line(run.tail)}")
    bad = run.first_bad
    if bad is not None:
        why = (bad.message or "").strip().splitlines()
        detail = next((line for line in why if line.startswith("E ")), why[-1] if why else "")
        return Result(mutant, "killed", bad.nodeid, run.seconds, detail.strip()[:300])
    if run.rc < 0:
        return Result(mutant, "killed", f"pytest died (signal {-run.rc})", run.seconds, _last_line(run.tail))
    return Result(mutant, "killed", f"pytest exit {run.rc}", run.seconds, _last_line(run.tail))


class Workspace:
    """Copies of the project, one per worker, lent out one at a time; every pytest run in them
    is registered in :attr:`children`."""

    def __init__(self, jobs: int, root: Path = ROOT) -> None:
        self.children = ChildGroups()
        self.base = Path(tempfile.mkdtemp(prefix="kvh-mutants-"))
        files = project_files(root)
        self.pool: queue.Queue[Path] = queue.Queue()
        for i in range(jobs):
            self.pool.put(verify_copy(make_copy(self.base / f"w{i}", root, files)))

    def run(self, select, k, timeout_s, mutant: Mutant | None = None) -> tuple[RunOutput | None, str | None]:
        """Run a selection in a free copy, with ``mutant`` applied for the run; (output, problem)."""
        copy = self.pool.get()
        source = copy / mutant.path if mutant else None
        original = source.read_text(encoding="utf-8") if source else None
        try:
            if mutant:
                source.write_text(apply(mutant, original), encoding="utf-8")
            return run_selection(copy, select, k, timeout_s, copy / ".mutant-run", self.children), None
        except CatalogueError as exc:
            return None, str(exc)
        finally:
            if source is not None:
                source.write_text(original, encoding="utf-8")
            self.pool.put(copy)

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def _unrunnable(mutant: Mutant, gpu: bool, root: Path) -> Result | None:
    """The result of a mutant that is not run here (a catalogue error, or code this device does
    not execute); None for one that runs."""
    problem = next(iter(catalogue_problems([mutant], root)), None)
    if problem:
        return Result(mutant, "error", None, 0.0, problem)
    if mutant.gpu_only and not gpu:
        return Result(mutant, "skipped", None, 0.0, "needs a GPU (CUDA source or compiled-Triton branch)")
    if mutant.interpreter_only and gpu:
        return Result(mutant, "skipped", None, 0.0, "a branch only the Triton interpreter takes")
    return None


def _unclean_selections(runnable: Sequence[Mutant], workspace: Workspace, pool: ThreadPoolExecutor,
                        timeout_s: float, progress) -> dict[tuple, str]:
    """Each distinct selection run once on the unmutated sources: why each that cannot judge
    its mutants cannot."""
    unclean: dict[tuple, str] = {}
    selections = list(dict.fromkeys(m.selection for m in runnable))
    runs = pool.map(lambda s: workspace.run(*s, timeout_s), selections)
    for selection, (run, _) in zip(selections, runs, strict=True):
        problem = clean_problem(run)
        if problem:
            unclean[selection] = problem
            progress(f"  clean check FAILED {' '.join(selection[0])} -k {selection[1]}: {problem}")
    return unclean


def run_mutants(mutants: Sequence[Mutant], *, jobs: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
                gpu: bool | None = None, check_clean: bool = True, root: Path = ROOT,
                progress=print, on_result=None) -> list[Result]:
    """Run each mutant against its selection in copies of ``root``; results in catalogue order.
    ``on_result(result)`` is called as each result is known (from worker threads), so that a
    run cut short keeps what it finished. An interrupt (or any exception) in the calling
    thread kills the pytest runs of every worker and reaches the caller once they are gone."""
    def known(result: Result) -> Result:
        if on_result is not None:
            on_result(result)
        return result

    gpu = gpu_available() if gpu is None else gpu
    results: dict[str, Result] = {}
    runnable = []
    for mutant in mutants:
        result = _unrunnable(mutant, gpu, root)
        if result is None:
            runnable.append(mutant)
        else:
            results[mutant.name] = known(result)
    if not runnable:
        return [results[m.name] for m in mutants]
    workspace = Workspace(max(1, min(jobs, len(runnable))), root)
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        unclean = _unclean_selections(runnable, workspace, pool, timeout_s, progress) if check_clean else {}

        def one(mutant: Mutant) -> Result:
            if mutant.selection in unclean:
                return known(Result(mutant, "error", None, 0.0, unclean[mutant.selection]))
            run, problem = workspace.run(*mutant.selection, timeout_s, mutant)
            result = Result(mutant, "error", None, 0.0, problem) if problem else judge(mutant, run)
            progress(f"  {result.status:<8} {mutant.name} ({result.seconds:.1f} s)"
                     + (f" by {result.killed_by}" if result.killed_by else f": {result.detail}"))
            return known(result)

        for result in pool.map(one, runnable):
            results[result.mutant.name] = result
    except BaseException:
        workspace.children.kill_all()  # the workers' pytest runs are in sessions of their own
        raise
    finally:
        try:
            pool.shutdown(wait=True, cancel_futures=True)  # prompt: their children are dead, no new one starts
        finally:
            workspace.close()
    return [results[m.name] for m in mutants]


# ------------------------------------------------------------------------------ reporting
def kill_rate(results: Sequence[Result]) -> tuple[int, int]:
    """(killed, judged): judged counts killed and survived mutants (errors and skips excluded)."""
    killed = sum(r.status == "killed" for r in results)
    return killed, killed + sum(r.status == "survived" for r in results)


def table(results: Sequence[Result]) -> str:
    rows = [("mutant", "file", "what it breaks", "killed by", "time", "result")]
    for r in results:
        killer = (r.killed_by or (r.detail if r.status != "killed" else "")).removeprefix("suites/")
        rows.append((r.mutant.name, r.mutant.path.removeprefix("kernels/"), r.mutant.breaks, killer,
                     f"{r.seconds:.1f}s", r.status.upper() if r.status != "killed" else "killed"))
    limits = (34, 30, 60, 80, 7, 8)
    cells = [[c if len(c) <= w else c[: w - 3] + "..." for c, w in zip(row, limits, strict=True)] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(limits))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    killed, judged = kill_rate(results)
    counts = {s: sum(r.status == s for r in results) for s in ("survived", "error", "skipped")}
    lines.append(f"kill rate {killed}/{judged}" + "".join(f", {n} {s}" for s, n in counts.items() if n))
    return "\n".join(lines)


def result_record(r: Result, gpu: bool) -> Record:
    message = r.detail if r.status != "killed" else (f"killed by {r.killed_by}: {r.detail}" if r.detail else None)
    return Record(
        suite="mutants", group="harness", case=r.mutant.name, nodeid=f"harness/mutants::{r.mutant.name}",
        outcome=r.outcome, duration_s=round(r.seconds, 3), backend=_backend_of(r.mutant),
        variant=r.mutant.path, device="cuda" if gpu else "cpu",
        metrics={"killed_by": r.killed_by or "", "seconds": round(r.seconds, 2), "breaks": r.mutant.breaks},
        message=message,
    )


def open_run(run_dir: Path, *, leg: str | None, args: Sequence[str], started: str) -> StreamedRun:
    """The run directory that mutant records stream into (suite ``mutants``), readable by the report."""
    return StreamedRun(run_dir, kind="mutants", leg=leg, args=args, started=started)


def finish_run(run: StreamedRun, results: Sequence[Result]) -> None:
    killed, judged = kill_rate(results)
    run.finish(kill_rate=f"{killed}/{judged}")


def write_results(results: Sequence[Result], run_dir: Path, *, leg: str | None, args: Sequence[str],
                  started: str, gpu: bool) -> None:
    """Records and a manifest in ``run_dir`` at once, for results already in hand."""
    run = open_run(run_dir, leg=leg, args=args, started=started)
    for result in results:
        run.add(result_record(result, gpu))
    finish_run(run, results)


def _backend_of(mutant: Mutant) -> str:
    if mutant.path.endswith(".cu"):
        return "cuda"
    if mutant.path.endswith(".cpp"):
        return "cpp"
    return "triton" if "tl." in mutant.original + mutant.mutated or "range(" in mutant.original else "torch"


def select_mutants(only: Sequence[str] | None, ci: bool, match: Sequence[str] | None = None) -> list[Mutant]:
    """The catalogue, or its CI subset; narrowed to ``only`` (exact names) and to names or
    paths containing one of ``match``."""
    chosen = [m for m in CATALOGUE if m.ci] if ci else list(CATALOGUE)
    if match:
        chosen = [m for m in chosen if any(s in m.name or s in m.path for s in match)]
    if only:
        unknown = [n for n in only if n not in MUTANT_NAMES]
        if unknown:
            raise ValueError(f"unknown mutant(s) {unknown}; known: {', '.join(MUTANT_NAMES)}")
        chosen = [m for m in chosen if m.name in only]
    return chosen


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only (see --list)")
    parser.add_argument("--match", nargs="+", metavar="TEXT",
                        help="run the mutants whose name or file contains one of these (e.g. int8 decode)")
    parser.add_argument("--list", action="store_true", help="print the catalogue (and any catalogue error) and exit")
    parser.add_argument("--ci", action="store_true", help="the CI-sized subset (a few minutes on 2 CPU cores)")
    parser.add_argument("--results-dir", metavar="DIR",
                        help="run directory for the records (default reports/runs/mutants-<UTC time>)")
    parser.add_argument("--jobs", type=positive_int, default=1, metavar="N", help="mutants run in parallel (default 1)")
    parser.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds one mutant's pytest run may take (default %(default)s)")
    parser.add_argument("--no-clean-check", action="store_true",
                        help="skip the run of each selection on the unmutated sources")
    parser.add_argument("--leg", default=None, help="version-leg name stored in the records")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        mutants = select_mutants(args.only, args.ci, args.match)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not mutants:
        print("no mutant matches the selection", file=sys.stderr)
        return 2
    if args.list:
        problems = catalogue_problems(mutants)
        for m in mutants:
            flags = ",".join(f for f, on in (("gpu-only", m.gpu_only), ("cpu-only", m.interpreter_only),
                                             ("ci", m.ci)) if on)
            print(f"{m.name:<36} {m.path:<30} {flags:<12} {m.breaks}")
        print(f"{len(mutants)} mutants ({sum(not m.gpu_only for m in mutants)} run on CPU)")
        for problem in problems:
            print(f"CATALOGUE ERROR: {problem}")
        return 1 if problems else 0
    gpu = gpu_available()
    started = utc_now()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = Path(args.results_dir or ROOT / "reports" / "runs" / f"mutants-{stamp}")
    where = "compiled on the GPU" if gpu else "in the Triton interpreter on CPU (gpu-only mutants skipped)"
    print(f"[mutants] {len(mutants)} mutants, {args.jobs} job(s), {where}", flush=True)
    start = time.perf_counter()
    try:
        run = open_run(run_dir, leg=args.leg, args=sys.argv[1:] if argv is None else list(argv), started=started)
    except OSError as exc:
        print(f"[mutants] cannot write the run directory {run_dir}: {exc}", file=sys.stderr, flush=True)
        return 2
    results = run_mutants(mutants, jobs=args.jobs, timeout_s=args.timeout, gpu=gpu,
                          check_clean=not args.no_clean_check, progress=lambda s: print(s, flush=True),
                          on_result=lambda r: run.add(result_record(r, gpu)))
    finish_run(run, results)
    print(table(results), flush=True)
    print(f"[mutants] {time.perf_counter() - start:.0f} s in all", flush=True)
    print(f"records: {run_dir / RECORDS_FILE}", flush=True)
    return 0 if all(r.status in ("killed", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
