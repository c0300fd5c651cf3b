"""Peers benchmark: kvbits (2, 3, 4 bits) against the decode attention users would pick instead
(harness/peers: SDPA flash/cuDNN/efficient/math over a preallocated fp16 cache, FlexAttention,
FlashInfer paged fp16/fp8, flash-attn's kvcache call, transformers' QuantizedCache with quanto or
HQQ), every method timed through one interface by the same code (suites/peers_support.py).
Run by ``nox -s peers`` (marker ``peers``) and by the bench session; every case is ``sweep``, so
gpu_verify does not time them. Records figures, never asserts on speed.

Per method and shape: the eager decode step (``ms``: append one token to every sequence, attend),
the step under a CUDA graph where the peer allows one (``graph_ms``), attend alone on the frozen
cache (``attend_ms``), the attention-output error against float64 attention on the original K/V
on plain random K and on K with outlier channels, bits and bytes per token; ``pareto_group`` (the
shape) feeds the report's trade-off chart and memory table (harness/report/tradeoff.py). A peer
whose package or device is missing is skipped, naming it. On a GPU 32K and 128K tokens; tiny
shapes on CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from suites.peers_support import METHODS, KvbitsPeer, extra_tokens, measure

pytestmark = [pytest.mark.bench, pytest.mark.peers, pytest.mark.sweep]

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# (B, Hq, Hkv, S, D); on CPU S is a multiple of kvbits' group size (64) and D one it serves
SHAPES = [(1, 32, 32, 32768, 128), (1, 32, 32, 131072, 128)] if GPU else [(1, 2, 2, 256, 64)]
EAGER_STEPS, GRAPH_STEPS = (160, 1024) if GPU else (3, 3)  # past the HF caches' 128-token window
BLOCK = 256  # capacities in whole blocks of 256 tokens: the unit of the paged and block-masked layouts


def capacity(seq: int) -> int:
    """Tokens each peer holds at most: the prompt and what measure() appends, in whole BLOCKs."""
    return -(-(seq + extra_tokens(EAGER_STEPS, GRAPH_STEPS)) // BLOCK) * BLOCK


def shape_id(shape: tuple) -> str:
    return "B{}-Hq{}-Hkv{}-S{}-D{}".format(*shape)


CASES = [pytest.param(method, shape, id=f"{method}-{shape_id(shape)}") for shape in SHAPES for method in METHODS]


@pytest.mark.parametrize(("method", "shape"), CASES)
def test_bench_peer(record, method, shape):
    batch, q_heads, kv_heads, seq, dim = shape
    record.backend, record.device, record.variant = "peer", DEVICE, method
    peer = METHODS[method](batch, q_heads, kv_heads, dim, capacity(seq), device=DEVICE)
    reason = peer.missing()
    if reason is not None:
        pytest.skip(f"{method}: {reason}")
    figures = measure(peer, seq, eager_steps=EAGER_STEPS, graph_steps=GRAPH_STEPS)
    record.add(**figures, pareto_group=shape_id(shape), reference=not isinstance(peer, KvbitsPeer),
               shape=f"B={batch} Hq={q_heads} Hkv={kv_heads} S={seq} D={dim} steps={EAGER_STEPS}/{GRAPH_STEPS}")
    # a benchmark's output is still checked: a peer whose attention is not finite is broken
    for name in ("attn_rel_err", "attn_rel_err_outliers"):
        assert math.isfinite(figures[name]), f"{method}: {name} = {figures[name]}"
    if isinstance(peer, KvbitsPeer):  # the host's count of the replays is what the device holds
        peer.cache.check_errors()
        assert peer.cache.sync_lengths() == [peer.length] * batch
