"""Packing throughput: 3-bit unpack and pack of a 1 GiB packed stream (GPU; a small one on CPU).

Bytes counted: the packed stream once plus the values once (1 + 8/3 bytes per packed
byte), against the device copy bandwidth measured in the same run. Speed is recorded,
never asserted; every timed output is checked against the torch reference (computed
chunk by chunk, since the reference's bit-plane expansion needs 32x the stream's bytes).
The torch reference itself is timed on a 64 MiB stream. Each ms carries its repeats' spread
(ms_n, ms_min, ms_iqr, ms_mad) and what bounds it (bound: the device or the host's launch cost;
"cpu" for the torch reference on CPU tensors, a CPU baseline timed by the wall clock on a GPU host).
"""

from __future__ import annotations

import pytest
import torch

from harness.measure.timing import bandwidth_metrics, bound_metrics, time_call, write_bandwidth_gbps
from kvbits.packing import pack_bits, unpack_bits
from suites.packing_support import device_backend_params

pytestmark = pytest.mark.bench

STREAM_BYTES = {"cuda": 1 << 30, "cpu": 3 << 14}
TORCH_STREAM_BYTES = {"cuda": 64 << 20, "cpu": 3 << 14}
REFERENCE_CHUNK_ROWS = 1 << 20


def _size_label(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f}MiB-packed" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f}KiB-packed"


def _reference_pack(values: torch.Tensor) -> torch.Tensor:
    return torch.cat([pack_bits(chunk, 3, backend="torch", validate=False)
                      for chunk in values.split(REFERENCE_CHUNK_ROWS)])


@pytest.mark.parametrize("direction", ["unpack", "pack"])
@pytest.mark.parametrize("layout", ["byte", "word"])
@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_bench_pack_unpack_1gib(record, device, backend, layout, direction):
    if backend == "cuda" and layout == "word":
        pytest.skip("the CUDA kernels serve both layouts with the same bytes; timed once, as 'byte'")
    record.backend, record.device, record.variant = backend, device, f"{direction}-{layout}"
    nbytes = (TORCH_STREAM_BYTES if backend == "torch" else STREAM_BYTES)[device]
    values = torch.randint(0, 8, (nbytes // 12, 32), dtype=torch.uint8, device=device)  # 12 bytes per row
    packed = _reference_pack(values)
    packed_in = packed.view(torch.int32) if layout == "word" else packed
    if direction == "unpack":
        run = lambda: unpack_bits(packed_in, 3, layout=layout, backend=backend)
        expected = values
    else:
        run = lambda: pack_bits(values, 3, layout=layout, backend=backend, validate=False)
        expected = packed_in
    out = run()
    assert torch.equal(out, expected)
    del out
    timing = time_call(run, device=device)
    ms = timing.median
    metrics = bandwidth_metrics(packed.numel() + values.numel(), ms)
    metrics.update(timing.metrics(), **bound_metrics(run, ms, device=device))
    if device == "cuda":
        metrics["write_only_gbps"] = write_bandwidth_gbps()  # unpacking writes 2.67 B per byte read
    record.add(shape=_size_label(packed.numel()), packed_bytes=packed.numel(), **metrics)
