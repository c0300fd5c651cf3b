"""Decode benchmark (run by the bench session; records figures, never asserts on speed).

Per shape: the fused 3-bit kernel, fp16 scaled_dot_product_attention on the original K/V and
the unfused path (dequantize, then SDPA): ms per call (graph-replayed, inputs rotated past the
L2: harness.measure.timing.graph_replay_ms), speedups, and GB/s and % of the copy bandwidth measured in
the same run, over the bytes the fused kernel must read; on a GPU also the read floor of those
bytes (harness.measure.read_floor: one kernel that only reads them, timed alike) and the fused kernel's
speed as a percentage of it. The benchmark shapes (decode_support.GPU_BENCH_SHAPES) on a GPU; one
tiny shape in the interpreter on CPU.
"""

from __future__ import annotations

import pytest
import torch
from decode_support import bench_shape, bench_shapes

pytestmark = pytest.mark.bench


@pytest.mark.parametrize("shape", bench_shapes(), ids=lambda s: "B{}-Hq{}-Hkv{}-S{}-D{}".format(*s))
def test_bench_decode(record, shape):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    record.backend, record.device, record.variant = "triton", device, "fused-3bit"
    figures = bench_shape(*shape, device=device)
    record.variant = f"fused-3bit-{figures.pop('layout')}"
    record.add(**figures, tolerance=2e-3)
    # correctness still applies to a benchmark's output; speed is only recorded
    assert figures["max_abs_err"] <= 2e-3
