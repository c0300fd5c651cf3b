"""Packing throughput: 3-bit unpack and pack of a 1 GiB packed stream (GPU; a small one on CPU).

Bytes counted: the packed stream once plus the values once (1 + 8/3 bytes per packed
byte), against the device copy bandwidth measured in the same run. Speed is recorded,
never asserted; every timed output is also checked against the torch reference.
"""

from __future__ import annotations

import pytest
import torch

from harness.timing import bandwidth_metrics, median_ms
from kernels.packing import pack_bits, unpack_bits
from suites.packing_support import device_backend_params

pytestmark = pytest.mark.bench

GPU_PACKED_BYTES = 1 << 30
CPU_PACKED_BYTES = 3 << 14


def _stream(device: str) -> torch.Tensor:
    n = GPU_PACKED_BYTES if device == "cuda" else CPU_PACKED_BYTES
    n -= n % 12
    rows = n // 12
    return torch.randint(0, 256, (rows, 12), dtype=torch.uint8, device=device)


def _size_label(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f}MiB-packed" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f}KiB-packed"


@pytest.mark.parametrize("direction", ["unpack", "pack"])
@pytest.mark.parametrize("layout", ["byte", "word"])
@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_bench_pack_unpack_1gib(record, device, backend, layout, direction):
    if backend == "cuda" and layout == "word":
        pytest.skip("the CUDA kernels serve both layouts with the same bytes; timed once, as 'byte'")
    record.backend, record.device, record.variant = backend, device, f"{direction}-{layout}"
    packed = _stream(device)
    packed_in = packed.view(torch.int32) if layout == "word" else packed
    values = unpack_bits(packed_in, 3, layout=layout, backend="torch" if device == "cpu" else backend)
    if direction == "unpack":
        run = lambda: unpack_bits(packed_in, 3, layout=layout, backend=backend)
        check = lambda out: torch.equal(out, values)
    else:
        run = lambda: pack_bits(values, 3, layout=layout, backend=backend, validate=False)
        check = lambda out: torch.equal(out, packed_in)
    assert check(run())
    ms = median_ms(run)
    nbytes = packed.numel() + values.numel()
    metrics = bandwidth_metrics(nbytes, ms)
    reference_ms = None
    if backend != "torch":
        torch_run = (lambda: unpack_bits(packed_in, 3, layout=layout, backend="torch")) if direction == "unpack" else (
            lambda: pack_bits(values, 3, layout=layout, backend="torch", validate=False)
        )
        reference_ms = median_ms(torch_run)
        metrics["speedup"] = {"torch_reference": reference_ms / ms}
    record.add(shape=_size_label(packed.numel()), packed_bytes=packed.numel(), **metrics)
