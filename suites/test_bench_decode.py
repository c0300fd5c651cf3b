"""Decode benchmark (run by the bench session; records figures, never asserts on speed).

Per shape: the fused 3-bit kernel, fp16 scaled_dot_product_attention on the original K/V and
the unfused path (dequantize, then SDPA): ms per call (graph-replayed, inputs rotated past the
L2: harness.measure.timing.graph_replay_ms), speedups, and GB/s and % of the copy bandwidth measured in
the same run, over the bytes the fused kernel must read; on a GPU also the read floor of those
bytes (harness.measure.read_floor: one kernel that only reads them, timed alike) and the fused kernel's
speed as a percentage of it. The benchmark shapes (decode_support.GPU_BENCH_SHAPES) on a GPU; one
tiny shape in the interpreter on CPU.

The torch decode on CPU (``PagedKVCache.attend(backend="torch")``, what a machine without a GPU
runs) over one 301-token sequence in pools of 64 and 2048 pages: it reads the pages the sequence
holds, so its time does not follow the pool's size (timed by the wall clock on any machine).
"""

from __future__ import annotations

import pytest
import torch
from decode_support import bench_shape, bench_shapes

from harness.measure.timing import time_call
from kvbits import PagedKVCache

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


TORCH_POOLS = (64, 2048)  # pages of 256 tokens; the sequence holds 2 of them


@pytest.mark.parametrize("num_pages", TORCH_POOLS, ids=lambda n: f"pages{n}")
def test_bench_torch_decode_pool(record, num_pages):
    """One torch decode on CPU of a 301-token sequence (2 kv heads, 8 q heads, D=128, 3 bits) in a
    pool of ``num_pages`` pages: the same figure at 64 and 2048 pages."""
    record.backend, record.device, record.variant = "torch", "cpu", f"torch-decode-{num_pages}-pages"
    heads, q_heads, dim, tokens = 2, 8, 128, 301
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVCache(num_pages=num_pages, page_size=256, heads=heads, head_dim=dim, max_seqs=1)
    k, v = (torch.randn(heads, tokens, dim, generator=gen).half() for _ in range(2))
    cache.add_sequence(k, v, backend="torch")
    q = torch.randn(1, q_heads, dim, generator=gen).half()
    timing = time_call(lambda: cache.attend(q, backend="torch"), rep_ms=1000, device="cpu")
    record.add(ms=timing.median, **timing.metrics(), bound="cpu", num_pages=num_pages, tokens=tokens,
               pool_bytes=cache.nbytes())
    out = cache.attend(q, backend="torch")
    assert bool(torch.isfinite(out).all())
