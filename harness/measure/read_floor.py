"""The read floor: the time one kernel takes to do nothing but read a given number of bytes.

The copy bandwidth (harness.measure.timing) is measured on 2 GB, where a kernel's fixed costs
vanish. A kernel that reads tens of megabytes pays them in full: its launch, its programs' first
memory latency, the wave's ragged end. ``read_floor_ms(nbytes)`` times a flat, coalesced read of
``nbytes`` (each program XOR-reduces a contiguous chunk with pipelined loads that bypass L1)
the way the kernels it bounds are timed (graph-replayed, inputs rotated past the L2), so a
benchmark can say how far a kernel is from anything that reads the same bytes at that size.

Kernel contract (``_read_chunks_kernel``): x int32 ``[n]`` contiguous, out int32 ``[programs]``;
``out[p] = XOR of x[p * per_program : min(n, (p + 1) * per_program)]``, so the XOR of out is the
XOR of x and every word is read once. Tested against numpy's XOR of the same words in
``tests/test_read_floor.py``; used by ``suites/test_bench_decode.py`` (``pct_of_read_floor``).
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl

from kvbits._runtime import triton_interpreted
from kvbits.aot import AotSpec

from .timing import graph_replay_ms, rotations

FLOOR_BLOCK = 4096  # int32 words one program reads per step (16 KB)
FLOOR_WARPS = 8
FLOOR_PROGRAMS_PER_SM = 4  # H200, 117 MB: within 3% of the fastest of 132 to 1,584 programs of 1 to 16 warps


CHUNK_ALIGN = 16  # words: every program's chunk starts 64-byte aligned, so its loads stay vectorized


@triton.jit
def _read_chunks_kernel(x_ptr, out_ptr, n, per_program, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """XOR of the int32 words [pid * per_program, min(n, (pid + 1) * per_program)) of x into out[pid]:
    every word below n is read by exactly one program, once."""
    pid = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK)
    start = pid * per_program
    end = tl.minimum(start + per_program, n)
    acc = tl.zeros([BLOCK], tl.int32)
    if INTERPRET:  # the interpreter cannot run range() over run-time bounds
        i = 0
        while i < per_program:
            idx = start + i + offsets
            acc ^= tl.load(x_ptr + idx, mask=idx < end, other=0)
            i += BLOCK
    else:  # three loads in flight per program (the compiler's pipelined copies)
        for i in tl.range(0, per_program, BLOCK, num_stages=3):
            idx = start + i + offsets
            acc ^= tl.load(x_ptr + idx, mask=idx < end, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.xor_sum(acc, 0))


def _power_of_two(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{low}, {high}], got {value}")


def read_chunks(x: torch.Tensor, programs: int, *, block: int = FLOOR_BLOCK, warps: int = FLOOR_WARPS) -> torch.Tensor:
    """Launch the flat read over int32 ``x`` on ``programs`` programs (each a contiguous chunk of
    ``x``, ``block`` words a step, ``warps`` warps); returns each program's XOR (int32
    [programs]), whose XOR is the XOR of every word of x."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.dim() != 1 or not x.is_contiguous():
        raise TypeError("x must be a contiguous 1-D int32 tensor")
    if x.numel() == 0:
        raise ValueError("x must hold at least one word")
    if isinstance(programs, bool) or not isinstance(programs, int):
        raise TypeError(f"programs must be an int, got {type(programs).__name__}")
    if programs < 1:
        raise ValueError(f"programs must be at least 1, got {programs}")
    _power_of_two("block", block, CHUNK_ALIGN, 1 << 16)
    _power_of_two("warps", warps, 1, 32)
    n = x.numel()
    per_program = -(-n // programs)
    per_program = -(-per_program // CHUNK_ALIGN) * CHUNK_ALIGN
    out = torch.empty(programs, dtype=torch.int32, device=x.device)
    _read_chunks_kernel[(programs,)](x, out, n, per_program, BLOCK=block, INTERPRET=triton_interpreted(),
                                     num_warps=warps)
    return out


@cache
def read_floor_ms(nbytes: int, device_index: int = 0) -> float:
    """Median ms of the flat read of ``nbytes`` (rounded up to whole int32 words), graph-replayed over
    rotated buffers, measured once per size and process. Needs a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("the read floor needs a CUDA device")
    words = -(-nbytes // 4)
    with torch.cuda.device(device_index):
        programs = FLOOR_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device_index).multi_processor_count
        buffers = [torch.ones(words, dtype=torch.int32, device="cuda") for _ in range(rotations(nbytes))]
        ms = graph_replay_ms([lambda x=x: read_chunks(x, programs) for x in buffers])
        del buffers
        torch.cuda.empty_cache()
    return ms


# ----------------------------------------------------------------------------- AOT specialization
# The flat read as read_floor_ms launches it (kvbits.aot compiles it with the kernels it bounds,
# named by harness.measure.HARNESS_KERNEL_MODULES):
# chunks a multiple of CHUNK_ALIGN words, sizes below 2**31 words.
AOT_SPECS = [AotSpec("read_floor_chunks", _read_chunks_kernel,
                     {"x_ptr": "*i32", "out_ptr": "*i32", "n": "i32", "per_program": "i32"},
                     {"BLOCK": FLOOR_BLOCK, "INTERPRET": False}, num_warps=FLOOR_WARPS,
                     divisible_ints=("per_program",))]
