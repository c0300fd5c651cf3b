"""End-to-end benchmark: a transformers model decoding on its KV cache (run by the bench session
with the sweep; records figures, never asserts on speed).

A Llama-3-8B-shaped model (32 layers, hidden 4096, 32 query and 8 kv heads of 128, random
weights in bf16, the way serving benchmarks time models without their weights) takes a random
prompt of S tokens per row (prefill), then decodes STEPS tokens greedily one forward at a time,
eager, with: transformers' default DynamicCache (SDPA), its preallocated StaticCache (SDPA), its
QuantizedCache with quanto at 4 bits (what ``cache_implementation="quantized"`` gives; skipped
without optimum-quanto), and the 3-bit kvbits cache (:mod:`kvbits.integrations.transformers`);
then StaticCache and the kvbits cache again with every decode step replayed from one captured
CUDA graph (``static-graph``, ``kvbits-3bit-graph``:
:func:`kvbits.integrations.graph_generate.generate_graphed`, its steps timed through its
streamer, the capture left out): the bf16 cache and the packed one without the host's per-step
work; and the kvbits graph sampling (``kvbits-3bit-graph-sample``: temperature 0.6, top-p 0.9),
the cost of the draw over the vocabulary.
Per case: decode tokens per second and ms per step, prefill seconds, peak device memory above the
weights, the cache's bytes per token across the layers and the longest context one sequence fits
in 80 and 141 GB beside the weights. In the interpreter on CPU, a two-layer model at tiny sizes.
"""

from __future__ import annotations

import gc
import time

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the end-to-end benchmark needs transformers (the "
                                   "'transformers' extra)")
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from harness.peers.hf_quantized import GROUP_SIZE, RESIDUAL_LENGTH, HFQuantizedPeer, stored_bytes  # noqa: E402
from kvbits.integrations.graph_generate import generate_graphed  # noqa: E402
from kvbits.integrations.transformers import ATTENTION_NAME, KVBitsCache  # noqa: E402

pytestmark = [pytest.mark.bench, pytest.mark.sweep]

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, num_hidden_layers=32, vocab_size=128256)
TINY = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            num_hidden_layers=2, vocab_size=256)
# (batch, prompt tokens): batch 8 at 128K is left out: the bf16 caches need 128 GB for it
CASES = [(1, 8192), (1, 32768), (1, 131072), (8, 8192), (8, 32768)] if GPU else [(1, 96), (2, 70)]
CACHES = ("dynamic", "static", "static-graph", "quanto-int4", "kvbits-3bit", "kvbits-3bit-graph",
          "kvbits-3bit-graph-sample")
# what the sampled graph case draws with: Llama-3-8B-Instruct's generation settings (top_k left to
# generate's default, 50)
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}
STEPS = 32 if GPU else 3
MEMORY_GB = (80, 141)  # device sizes the longest context is given for


@pytest.fixture(scope="module")
def model():
    """The model in bf16 (fp32 on CPU) on DEVICE, weights drawn N(0, 0.02) from a fixed seed."""
    # no eos id: every timed run decodes all its steps (generate_graphed, like generate, stops at the config's)
    config = LlamaConfig(**(LLAMA3_8B if GPU else TINY), max_position_embeddings=max(s for _, s in CASES) + STEPS + 8,
                         eos_token_id=None)
    dtype = torch.bfloat16 if GPU else torch.float32
    with torch.device("meta"):  # no host copy of 8B parameters: allocated on the device, then drawn there
        net = LlamaForCausalLM(config)
    net = net.to_empty(device=DEVICE).to(dtype).eval()
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    net.model.rotary_emb = LlamaRotaryEmbedding(config).to(DEVICE)  # its frequencies are computed, not drawn
    yield net
    del net
    gc.collect()


def _cache(kind: str, net, capacity: int):
    if kind == "dynamic":
        return DynamicCache(config=net.config), "sdpa"
    if kind.startswith("static"):  # static, static-graph
        return StaticCache(config=net.config, max_cache_len=capacity), "sdpa"
    if kind == "quanto-int4":
        from transformers.cache_utils import QuantizedCache

        return QuantizedCache("quanto", net.config, nbits=4, q_group_size=GROUP_SIZE,
                              residual_length=RESIDUAL_LENGTH), "sdpa"
    return KVBitsCache(net.config, max_cache_len=capacity, bits=3), ATTENTION_NAME  # kvbits-3bit, -graph(-sample)


def _quanto_missing() -> str | None:
    """Why transformers' quanto cache cannot run here, or None (the quanto peer's own check)."""
    return HFQuantizedPeer("quanto", 4, 1, 1, 1, GROUP_SIZE, 1, device=DEVICE).missing()


def _sync():
    if GPU:
        torch.cuda.synchronize()


def _cache_bytes_per_token(kind: str, cache, config, tokens: int) -> float:
    """Bytes one token takes in the cache across the layers (kvbits: its pool's codes, scales and
    zeros; quanto: what its layers store, codes, scales, zeros and the bf16 residual window, over
    the ``tokens`` held; the bf16 caches: K and V)."""
    if kind.startswith("kvbits-3bit"):
        return sum(layer.paged.bytes_per_token() for layer in cache.layers)
    if kind == "quanto-int4":
        return sum(stored_bytes(getattr(layer, attr, None)) for layer in cache.layers
                   for attr in ("_quantized_keys", "_quantized_values", "keys", "values")) / tokens
    dtype_bytes = 2 if GPU else 4
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * dtype_bytes


@pytest.mark.parametrize("kind", CACHES)
@pytest.mark.parametrize(("batch", "prompt"), CASES, ids=[f"B{b}-S{s}" for b, s in CASES])
def test_bench_generate(record, model, batch, prompt, kind):
    record.backend, record.device, record.variant = "transformers", DEVICE, kind
    if kind == "quanto-int4" and (reason := _quanto_missing()):
        pytest.skip(reason)
    config = model.config
    gen = torch.Generator(device=DEVICE).manual_seed(prompt + batch)
    ids = torch.randint(0, config.vocab_size, (batch, prompt), generator=gen, device=DEVICE)
    cache, attention = _cache(kind, model, prompt + STEPS + GRAPH_EXTRA + 1)
    model.set_attn_implementation(attention)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if GPU:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    try:
        if "-graph" in kind:
            prefill_s, ms, token = _graphed_steps(model, ids, cache, SAMPLING if kind.endswith("-sample") else {})
        else:
            prefill_s, ms, token = _eager_steps(model, ids, cache, prompt)
    finally:
        model.set_attn_implementation("sdpa")
    median = sorted(ms)[len(ms) // 2]
    per_token = _cache_bytes_per_token(kind, cache, config, batch * cache.get_seq_length())
    figures = {"ms": median, "tokens_per_s": batch / (median / 1e3), "prefill_s": prefill_s,
               "bytes_per_token": per_token, "max_ms": max(ms),
               "shape": f"Llama-3-8B-shaped ({config.num_hidden_layers} layers, random weights), B={batch} "
                        f"S={prompt}, {STEPS} {'sampled' if kind.endswith('-sample') else 'greedy'} steps, "
                        + ("replayed from a CUDA graph" if "-graph" in kind else "eager")}
    if GPU:
        figures["peak_gb_above_weights"] = (torch.cuda.max_memory_allocated() - before) / 1e9
        for gb in MEMORY_GB:  # one sequence, beside the weights and 10% for activations
            figures[f"longest_context_{gb}gb"] = int((gb * 1e9 * 0.9 - weights) // per_token)
    record.add(**figures)
    assert token.shape == (batch, 1) and bool((token >= 0).all())
    assert cache.get_seq_length() == prompt + STEPS + (GRAPH_EXTRA if "-graph" in kind else 0)


def _eager_steps(model, ids, cache, prompt: int) -> tuple[float, list[float], torch.Tensor]:
    """(prefill seconds, ms of each of STEPS greedy steps, the last token [B, 1]): one forward each,
    with the attention mask ``generate`` passes (all ones: no padding), which a StaticCache's mask
    over its slots is built from."""
    with torch.no_grad():
        _sync()
        t0 = time.perf_counter()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1:].argmax(-1)
        _sync()
        prefill_s = time.perf_counter() - t0
        ms = []
        for step in range(STEPS):
            position = torch.arange(prompt + step, prompt + step + 1, device=DEVICE)
            _sync()
            t0 = time.perf_counter()
            mask = torch.ones(ids.shape[0], prompt + step + 1, dtype=torch.long, device=DEVICE)
            out = model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True,
                        cache_position=position, logits_to_keep=1)
            token = out.logits[:, -1:].argmax(-1)
            _sync()
            ms.append((time.perf_counter() - t0) * 1e3)
    return prefill_s, ms, token


# the graphed run's tokens past STEPS: the prompt's, the eager warm-up's, the first replay's (its
# put waits for the second) and the last's (put after it, with nothing queued)
GRAPH_EXTRA = 3


class _StepClock:
    """A generate streamer that synchronizes at every put and keeps the time: put 1 the prompt,
    put 2 the prompt step's token, put 3 the warm-up step's, then one per replay, each once the
    next replay is queued (so put 4 comes once the second replay is done)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        _sync()
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _graphed_steps(model, ids, cache, sampling: dict) -> tuple[float, list[float], torch.Tensor]:
    """generate_graphed with STEPS + GRAPH_EXTRA + 1 new tokens (greedy, or ``sampling``'s draw):
    (prefill seconds, ms of each of the STEPS replays between the second and the last, each a
    replay and its token's copy, the last token [B, 1])."""
    clock = _StepClock()
    sequences = generate_graphed(model, ids, cache=cache, max_new_tokens=STEPS + GRAPH_EXTRA + 1, streamer=clock,
                                 **sampling)
    t = clock.times
    replays = t[3:-1]  # the second replay's end (the capture before the first left out) and each one after
    return t[1] - t[0], [(b - a) * 1e3 for a, b in zip(replays, replays[1:], strict=False)], sequences[:, -1:]
