"""What the packing suites share: backends per device, the exhaustive state spaces,
and an independent bit-level model of the canonical stream written with Python ints."""

from __future__ import annotations

import pytest
import torch

from kvbits.packing import CUDA_BITS, geometry
from suites.common import available_devices, triton_skip_reason


def backends_for(device: str, bits: int = 3) -> list[str]:
    """Backends that implement ``bits`` on ``device`` (``bits=0``: those serving every width)."""
    names = ["torch"] + (["triton"] if triton_skip_reason(device) is None else [])
    if device == "cuda" and bits in CUDA_BITS:
        names.append("cuda")
    return names


def device_backend_params(bits: int = 3) -> list:
    """pytest params ``(device, backend)`` for every backend runnable here."""
    return [
        pytest.param(device, backend, id=f"{device}-{backend}")
        for device in available_devices()
        for backend in backends_for(device, bits)
    ]


def lanes_of(states: torch.Tensor, bits: int, lanes: int) -> torch.Tensor:
    """Split integer states into ``lanes`` fields of ``bits`` bits: uint8 [len(states), lanes],
    field i = (s >> bits*i) & mask (so a state's canonical packed stream is s itself)."""
    shifts = torch.arange(lanes, device=states.device, dtype=torch.int64) * bits
    return ((states[:, None] >> shifts) & ((1 << bits) - 1)).to(torch.uint8)


def all_states(bits: int, values: int, device: str) -> torch.Tensor:
    """Every combination of ``values`` lanes of ``bits`` bits: uint8 [2**(bits*values), values]."""
    return lanes_of(torch.arange(1 << (bits * values), dtype=torch.int64, device=device), bits, values)


def all_byte_states(n_bytes: int, device: str) -> torch.Tensor:
    """Every ``n_bytes``-byte string, little-endian counting: uint8 [2**(8*n_bytes), n_bytes]."""
    return lanes_of(torch.arange(1 << (8 * n_bytes), dtype=torch.int64, device=device), 8, n_bytes)


def state_chunks(total_bits: int, device: str, chunk_bits: int = 20):
    """The integers [0, 2**total_bits) in consecutive int64 chunks (bounded memory on CPU)."""
    step = 1 << min(total_bits, chunk_bits if torch.device(device).type == "cpu" else total_bits)
    for start in range(0, 1 << total_bits, step):
        yield torch.arange(start, start + step, dtype=torch.int64, device=device)


def model_pack_row(values: list[int], bits: int) -> bytes:
    """The canonical stream of one row, from its definition: value i at bits [b*i, b*i + b)."""
    stream = 0
    for i, v in enumerate(values):
        stream |= v << (bits * i)
    return stream.to_bytes(len(values) * bits // 8, "little")


def model_unpack_row(packed: bytes, bits: int) -> list[int]:
    stream = int.from_bytes(packed, "little")
    return [(stream >> (bits * i)) & ((1 << bits) - 1) for i in range(len(packed) * 8 // bits)]


_POPCOUNT = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64)


def count_bit_errors(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of differing bits between two tensors of the same shape and integer dtype."""
    a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if torch.equal(a, b):
        return 0
    table = _POPCOUNT.to(a.device)
    return int(table[(a ^ b).to(torch.int64)].sum())


def row_multiple(bits: int, layout: str) -> int:
    return geometry(bits, layout).values
