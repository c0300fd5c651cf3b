"""The transformers integration (:mod:`kvbits.integrations.transformers`): ``generate`` on a
Llama-architecture model with random weights (no download) through :class:`KVBitsCache` and the
``"kvbits"`` attention, against the same model with transformers' DynamicCache.

Per step, the logits' error (max abs over the vocabulary) against a float64 forward of the same
model over the same tokens (teacher forcing: a token flipped by quantization does not carry
over into later steps' errors) stays within bounds derived from the float reference (the run's
worst step and its median step); the prompt's step, exact attention in both, gives the
DynamicCache run's logits bit for bit; the first step where the greedy tokens differ from the
DynamicCache run is recorded. Also: a
left-padded batch of two against each row alone, sampling, the fused decode in the Triton
interpreter, transformers' own QuantizedCache at equal bits (where its backend is installed),
every configuration the cache refuses, and that a checkout hides no ``kernels`` package (the
import name of Hugging Face's hub-kernels distribution, which transformers imports).

In the interpreter (CPU) the model is tiny (hidden 256, 4 heads, 2 kv heads, head_dim 64, 2
layers, a 100-token prompt, group size 32); on a GPU it is hidden 2048, 32 heads, 8 kv heads, 4
layers, a 4096-token prompt, group size 64.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from packaging.version import Version

transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed (the suite's optional dependency: pip install -e .[transformers])")

from affine_support import fresh_seed, gpu_or_small  # noqa: E402, F401  (the seed fixture)
from decode_support import device_params  # noqa: E402
from transformers import (  # noqa: E402
    BartConfig,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    StaticCache,
)
from transformers.cache_utils import QuantizedCache  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.utils.import_utils import (  # noqa: E402
    KERNELS_MAX_VERSION,
    KERNELS_MIN_VERSION,
    is_kernels_available,
)

import kvbits  # noqa: E402
from harness.peers.base import dist_version  # noqa: E402
from kvbits.integrations.graph_generate import generate_graphed  # noqa: E402
from kvbits.integrations.transformers import ATTENTION_NAME, KVBitsCache  # noqa: E402

PAD = 0  # the pad token id (never drawn into a prompt)
# Measured at the CPU size on 30 random models per configuration (fp16 at 2, 3 and 4 bits, bf16 at
# 3), in units of the float64 logits' standard deviation over 2^bits - 1 levels (0.1 at 2 bits,
# 0.043 at 3, 0.02 at 4; logits' std 0.3): a step's logit error is about 1.9 units, the worst step
# of a run up to 3.9 (one model of another 30 reached 4.3: the max over the vocabulary is
# heavy-tailed), the median step of a run up to 2.0. The bounds allow about twice the worst of
# each, above the dtype's own error: a cache attending the wrong tokens is off by the logits' own
# spread in every step.
WORST_STEP_SPREAD = 8.0
MEDIAN_STEP_SPREAD = 4.0


@dataclass(frozen=True)
class Size:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    prompt: int
    new: int
    group: int

    def config(self) -> LlamaConfig:
        return LlamaConfig(hidden_size=self.hidden, intermediate_size=2 * self.hidden,
                           num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                           head_dim=self.head_dim, num_hidden_layers=self.layers, vocab_size=self.vocab,
                           max_position_embeddings=2 * (self.prompt + self.new), pad_token_id=PAD,
                           # no eos of the model's own: generate masks it until min_new_tokens, which
                           # generate_graphed does not apply (the eos case sets one for both)
                           eos_token_id=None, attn_implementation="sdpa")


SMALL = Size(hidden=256, heads=4, kv_heads=2, head_dim=64, layers=2, vocab=512, prompt=100, new=24, group=32)
LARGE = Size(hidden=2048, heads=32, kv_heads=8, head_dim=64, layers=4, vocab=32000, prompt=4096, new=64, group=64)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# The float64 comparisons run at the size their bound was measured on: a random-weight model of
# LARGE's width turns fp16 rounding alone into 0.4 of a logit (logits' std 0.9) and 3-bit K/V into
# 1.2, fused kernel and torch dequantization alike (H200), so a bound there would measure the
# model's sensitivity, not the cache. LARGE is served by the backend and padding comparisons.
REFERENCE_SIZE = SMALL


def _size(device) -> Size:
    return gpu_or_small(SMALL, LARGE, device)


def _models(size: Size, seed: int, dtype: torch.dtype, device) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(the model in ``dtype``, the same weights in float64), random weights drawn from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        master = LlamaForCausalLM(size.config()).eval()
    return copy.deepcopy(master).to(device, dtype), master.to(device, torch.float64)


def _prompt(gen: torch.Generator, size: Size, rows: int, length: int, device) -> torch.Tensor:
    return torch.randint(1, size.vocab, (rows, length), generator=gen).to(device)


def _generate(model, ids, mask=None, *, new: int, cache=None, attention="sdpa", sample_seed=None, sampling=None):
    """(sequences [B, S + new], per-step logits [B, new, V] in float64) of greedy generation (or
    sampling seeded with ``sample_seed``: plain, or with generate's arguments ``sampling``) with
    ``attention`` and ``cache``."""
    model.set_attn_implementation(attention)
    kw = ({"do_sample": False} if sample_seed is None
          else {"do_sample": True, "top_k": 0} if sampling is None else sampling)
    if sample_seed is not None:
        torch.manual_seed(sample_seed)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=new, min_new_tokens=new,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=PAD, **kw)
    model.set_attn_implementation("sdpa")
    return out.sequences, torch.stack(out.logits, 1).double()


def _teacher_forced(model, sequences, prompt_len: int, mask=None) -> torch.Tensor:
    """Logits [B, new, V] (float64) of one forward over ``sequences`` without a cache: what each
    generation step would give had every earlier step been exact."""
    if mask is not None:
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], sequences.shape[1] - mask.shape[1])], 1)[:, :-1]
    with torch.no_grad():
        logits = model(sequences[:, :-1], attention_mask=mask, use_cache=False).logits
    return logits[:, prompt_len - 1:].double()


def _step_errors(logits: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per step, max abs error over the batch and the vocabulary: [new]."""
    return (logits - ref).abs().amax(dim=(0, 2))


def _first_difference(a: torch.Tensor, b: torch.Tensor, start: int) -> int | None:
    """First generated step where two runs' tokens differ (None: never)."""
    differ = (a[:, start:] != b[:, start:]).any(dim=0).nonzero()
    return int(differ[0]) if len(differ) else None


def _first_logits_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """First step where two runs' logits [B, N, V] differ at all, over the steps both ran (None: never)."""
    steps = min(a.shape[1], b.shape[1])
    differ = (a[:, :steps] != b[:, :steps]).any(-1).any(0).nonzero()
    return int(differ[0]) if len(differ) else None


def _reproducible(kind: str, device) -> bool:
    """Whether a run repeats bit for bit. transformers' SDPA over a StaticCache on a GPU does not:
    the same seeded run's logits differ from its first decode step on (up to 6e-3 on an H100, with
    the greedy tokens parting at step 24 of 64), so there a rerun may part only from a step whose
    logits differ; the kvbits path repeats exactly on every device."""
    return kind != "static" or device == "cpu"


def _unit(ref: torch.Tensor, bits: int) -> float:
    """The float64 logits' standard deviation over the 2^bits - 1 quantization levels."""
    return float(ref.std()) / (2**bits - 1)


def _bounds(floor: float, ref: torch.Tensor, bits: int) -> dict:
    """The bounds of a run's per-step logit errors: its worst step and its median step."""
    return {"worst": floor + WORST_STEP_SPREAD * _unit(ref, bits),
            "median": floor + MEDIAN_STEP_SPREAD * _unit(ref, bits)}


def _check_within(err: torch.Tensor, bounds: dict) -> None:
    worst, median = float(err.max()), float(err.median())
    assert worst <= bounds["worst"], f"worst step's logit error {worst:.4g} > bound {bounds['worst']:.4g}"
    assert median <= bounds["median"], f"median step's logit error {median:.4g} > bound {bounds['median']:.4g}"


def _kvbits_cache(model, size: Size, bits: int = 3, **kw) -> KVBitsCache:
    """A cache for ``size``: fp sinks and window of one group each unless given (the defaults
    would hold a short sequence in fp whole, and its decode would attend no code)."""
    kw = {"sinks": size.group, "window": size.group, **kw}
    return KVBitsCache(model.config, max_cache_len=size.prompt + size.new, bits=bits, group_size=size.group, **kw)


def _quantized_reference(model, model64, ids, size: Size, bits: int) -> dict:
    """A kvbits generation's figures: per-step errors against the float64 reference, the dtype's
    own error on the same tokens (floor), the bound, and the cache."""
    cache = _kvbits_cache(model, size, bits)
    seq, logits = _generate(model, ids, new=size.new, cache=cache, attention=ATTENTION_NAME)
    ref = _teacher_forced(model64, seq, ids.shape[1])
    same_dtype = _teacher_forced(model, seq, ids.shape[1])
    err = _step_errors(logits, ref)
    floor = float(_step_errors(same_dtype, ref).max())
    return {"seq": seq, "logits": logits, "ref": ref, "err": err, "floor": floor, "cache": cache,
            "bounds": _bounds(floor, ref, bits)}


# ----------------------------------------------------------------------------- 1. generate
GENERATE = [pytest.param(dtype, 3, id=f"{name}-b3") for name, dtype in DTYPES.items()] + [
    pytest.param(torch.float16, 2, id="fp16-b2"), pytest.param(torch.float16, 4, id="fp16-b4")]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(("dtype", "bits"), GENERATE)
def test_greedy_generation_against_the_float_reference(record, seed, device, dtype, bits):
    """Greedy generate with KVBitsCache: the prompt's step equals the DynamicCache run's logits bit
    for bit (exact attention in both); the logit error against float64 teacher forcing of the
    worst step and of the median step within their bounds; the cache holds prompt + new - 1 tokens
    per sequence. At the size the bound was measured on, on every device (REFERENCE_SIZE)."""
    record.backend, record.device, record.variant = "kvbits", device, f"{str(dtype)[6:]}-b{bits}"
    size = REFERENCE_SIZE
    model, model64 = _models(size, seed, dtype, device)
    ids = _prompt(torch.Generator().manual_seed(seed), size, 1, size.prompt, device)
    run = _quantized_reference(model, model64, ids, size, bits)
    dyn_seq, dyn_logits = _generate(model, ids, new=size.new, cache=DynamicCache(config=model.config))
    err = run["err"]
    record.add(logit_err_per_step=[round(float(e), 5) for e in err], max_abs_err=float(err.max()),
               prompt_step_err=float(err[0]), dtype_floor=run["floor"], bound=run["bounds"]["worst"],
               median_step_err=float(err.median()), median_bound=run["bounds"]["median"],
               ref_logit_std=float(run["ref"].std()),
               first_token_difference=_first_difference(run["seq"], dyn_seq, size.prompt),
               cache_bytes=run["cache"].nbytes(), prompt=size.prompt, new=size.new)
    assert torch.equal(run["logits"][:, 0], dyn_logits[:, 0]), "the prompt's step must be exact attention"
    _check_within(err, run["bounds"])
    for layer in run["cache"].layers:
        assert layer.paged.lengths() == [size.prompt + size.new - 1]
    assert run["cache"].get_seq_length() == size.prompt + size.new - 1


FIXED_MODEL_SEED = 2  # a model and prompt whose greedy tokens agree for all 24 steps (CPU size, fp16, 3 bits)


@pytest.mark.parametrize("device", device_params())
def test_first_steps_agree_on_a_fixed_model(record, device):
    """On one fixed model (the CPU size on every device) the 3-bit cache's greedy tokens follow
    DynamicCache's for several steps (random-weight logits have top-2 margins of 1e-3, so a fresh
    model may flip a token at once)."""
    record.backend, record.device, record.variant = "kvbits", device, "fp16-b3-fixed"
    size = SMALL  # the seed was found at this size; on a GPU the decode is the fused kernel's
    model, _ = _models(size, FIXED_MODEL_SEED, torch.float16, device)
    ids = _prompt(torch.Generator().manual_seed(FIXED_MODEL_SEED), size, 1, size.prompt, device)
    seq, _ = _generate(model, ids, new=size.new, cache=_kvbits_cache(model, size), attention=ATTENTION_NAME)
    dyn_seq, _ = _generate(model, ids, new=size.new, cache=DynamicCache(config=model.config))
    first = _first_difference(seq, dyn_seq, size.prompt)
    record.add(first_token_difference=first, seed=FIXED_MODEL_SEED)
    assert first is None or first >= 4, f"greedy tokens differ at step {first}"


@pytest.mark.parametrize("device", device_params())
def test_sampling_against_the_float_reference(record, seed, device):
    """Sampling (top_k=0, seeded) with KVBitsCache: per-step logit error within the bound along
    the sampled tokens; the same seed draws the same tokens again (REFERENCE_SIZE)."""
    record.backend, record.device, record.variant = "kvbits", device, "fp16-b3-sample"
    size = REFERENCE_SIZE
    model, model64 = _models(size, seed, torch.float16, device)
    ids = _prompt(torch.Generator().manual_seed(seed), size, 1, size.prompt, device)
    seq, logits = _generate(model, ids, new=size.new, cache=_kvbits_cache(model, size), attention=ATTENTION_NAME,
                            sample_seed=seed)
    again, _ = _generate(model, ids, new=size.new, cache=_kvbits_cache(model, size), attention=ATTENTION_NAME,
                         sample_seed=seed)
    ref = _teacher_forced(model64, seq, size.prompt)
    err = _step_errors(logits, ref)
    bounds = _bounds(float(_step_errors(_teacher_forced(model, seq, size.prompt), ref).max()), ref, 3)
    record.add(max_abs_err=float(err.max()), bound=bounds["worst"], median_step_err=float(err.median()),
               median_bound=bounds["median"])
    assert torch.equal(seq, again), "a seeded sampling run must repeat"
    _check_within(err, bounds)


# ----------------------------------------------------------------------------- 2. padding
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("dtype", [DTYPES["fp16"], DTYPES["fp32"]], ids=["fp16", "fp32"])
def test_left_padded_batch_matches_each_row_alone(record, seed, device, dtype):
    """A batch of two prompts of different lengths, the shorter left-padded: each row's per-step
    logits match that row generated alone (unpadded) with its own KVBitsCache, and each
    sequence of the cache holds only its real tokens (pads never stored, never attended)."""
    record.backend, record.device, record.variant = "kvbits", device, f"{str(dtype)[6:]}-b3-pad"
    size = _size(device)
    model, model64 = _models(size, seed, dtype, device)
    gen = torch.Generator().manual_seed(seed)
    short = size.prompt - gpu_or_small(37, 1000, device)
    rows = [_prompt(gen, size, 1, size.prompt, device), _prompt(gen, size, 1, short, device)]
    ids = torch.full((2, size.prompt), PAD, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, size.prompt - row.shape[1]:] = row[0]
        mask[i, size.prompt - row.shape[1]:] = 1
    cache = _kvbits_cache(model, size)
    seq, logits = _generate(model, ids, mask, new=size.new, cache=cache, attention=ATTENTION_NAME)
    assert ([s.paged.lengths() for s in cache.layers]
            == [[size.prompt + size.new - 1, short + size.new - 1]] * size.layers)
    worst, quant = 0.0, 0.0
    for i, row in enumerate(rows):
        alone_seq, alone_logits = _generate(model, row, new=size.new, cache=_kvbits_cache(model, size),
                                            attention=ATTENTION_NAME)
        first = _first_difference(seq[i:i + 1, -size.new:], alone_seq[:, -size.new:], 0)
        steps = size.new if first is None else first + 1  # the same tokens so far: the same context
        worst = max(worst, float(_step_errors(logits[i:i + 1, :steps], alone_logits[:, :steps]).max()))
        ref = _teacher_forced(model64, alone_seq, row.shape[1])
        quant = max(quant, float(_step_errors(alone_logits, ref).max()))
        record.add(**{f"row{i}_first_token_difference": first})
    tolerance = _unit(logits, 3)
    record.add(max_abs_err=worst, quant_err=quant, short=short, tolerance=tolerance)
    # pads attended would move the short row's logits by about the logits' own spread; what is
    # left is the prompt's rounding in another batch shape, flipping a few codes
    assert worst <= tolerance, f"padded row vs alone: {worst:.4g} > {tolerance:.4g}"


# ----------------------------------------------------------------------------- 3. interpreter
@pytest.mark.parametrize("device", device_params())
def test_fused_decode_backend(record, seed, device):
    """backend='triton' (the fused decode and the append kernel; interpreted on CPU, so a short
    run there) gives the logits of backend='torch' (dequantize, then exact attention) within
    fp16 rounding of the attention outputs."""
    record.backend, record.device, record.variant = "triton", device, "fp16-b3"
    size = _size(device)
    size = gpu_or_small(Size(**{**vars(size), "prompt": 2 * size.group - 2, "new": 4}), size, device)
    model, _ = _models(size, seed, torch.float16, device)
    ids = _prompt(torch.Generator().manual_seed(seed), size, 1, size.prompt, device)
    runs = {b: _generate(model, ids, new=size.new, cache=_kvbits_cache(model, size, backend=b),
                         attention=ATTENTION_NAME) for b in ("torch", "triton")}
    first = _first_difference(runs["torch"][0], runs["triton"][0], size.prompt)
    steps = size.new if first is None else first + 1
    err = float(_step_errors(runs["triton"][1][:, :steps], runs["torch"][1][:, :steps]).max())
    tol = 0.05 * float(runs["torch"][1].std())
    record.add(max_abs_err=err, tolerance=tol, first_token_difference=first)
    assert err <= tol, f"triton vs torch backend: {err:.4g} > {tol:.4g}"


class _StreamStopped(Exception):
    pass


class _Recorder:
    """A streamer that keeps what it is handed, as generate's own streamers receive it; it raises
    at its ``stop_at``-th put when given one (an interrupted stream)."""

    def __init__(self, stop_at: int | None = None):
        self.puts, self.ended, self.stop_at = [], 0, stop_at

    def put(self, value) -> None:
        if len(self.puts) + 1 == self.stop_at:
            raise _StreamStopped("the streamer stops the run")
        self.puts.append(value)

    def end(self) -> None:
        self.ended += 1


def _check_streamed(streamer: _Recorder, ids: torch.Tensor, sequences: torch.Tensor) -> None:
    """The prompt [B, S], then each new token [B], all on the CPU, then one end: generate's way."""
    assert all(p.device.type == "cpu" for p in streamer.puts), "the streamer must be handed CPU tensors"
    assert torch.equal(streamer.puts[0], ids.cpu())
    new = sequences.shape[1] - ids.shape[1]
    assert [tuple(p.shape) for p in streamer.puts[1:]] == [(ids.shape[0],)] * new
    assert torch.equal(torch.stack(streamer.puts[1:], 1), sequences[:, ids.shape[1]:].cpu())
    assert streamer.ended == 1


def _graph_prompt(size: Size, seed: int, padded: bool, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One row, or a batch of two whose second row is shorter and left-padded (ids, mask)."""
    gen = torch.Generator().manual_seed(seed)
    if not padded:
        return _prompt(gen, size, 1, size.prompt, device), None
    short = size.prompt - gpu_or_small(37, 1000, device)
    ids = torch.full((2, size.prompt), PAD, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, n in enumerate((size.prompt, short)):
        ids[i, size.prompt - n:] = _prompt(gen, size, 1, n, device)[0]
        mask[i, size.prompt - n:] = 1
    return ids, mask


def _graph_cache(kind: str, model, size: Size, new: int):
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=size.prompt + new), "sdpa"
    return _kvbits_cache(model, size, backend="torch" if kind == "kvbits-torch" else None), ATTENTION_NAME


# (cache, left-padded, new tokens: None for the size's); 1 new token is the prompt's step alone, 2
# adds the warm-up, 3 the capture and one replay
GRAPHED = [pytest.param("kvbits", False, None, id="kvbits-one-row"),
           pytest.param("kvbits", True, None, id="kvbits-left-padded"),
           pytest.param("kvbits", False, 1, id="kvbits-1-new"),
           pytest.param("kvbits", True, 2, id="kvbits-2-new"),
           pytest.param("kvbits", False, 3, id="kvbits-3-new"),
           pytest.param("kvbits-torch", False, None, id="kvbits-torch-backend"),
           pytest.param("static", True, None, id="static-left-padded")]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(("kind", "padded", "new"), GRAPHED)
def test_graph_replayed_generation_matches_generate(record, seed, device, kind, padded, new):
    """generate_graphed (every decode step replayed from one captured CUDA graph on a GPU; eager
    steps on CPU and with backend='torch', whose appends read the host) gives generate's logits on
    the same kind of cache (until the tokens part, which on a GPU a near tie may make them do), a
    left-padded batch of two included; hands a streamer what generate hands it; and leaves the
    cache where generate leaves it: the same lengths per layer, on the host and on the device.
    transformers' StaticCache (bf16's counterpart of the loop) runs the same way with sdpa."""
    if kind == "kvbits-torch" and device == "cpu":
        pytest.skip("backend='torch' is the CPU's default: the kvbits-one-row case")
    record.backend, record.device = ("transformers" if kind == "static" else "kvbits"), device
    record.variant = f"fp16-graphed-{kind}" + ("-padded" if padded else "")
    size = _size(device)
    new = size.new if new is None else new
    model, _ = _models(size, seed, torch.float16, device)
    ids, mask = _graph_prompt(size, seed, padded, device)
    eager_cache, attention = _graph_cache(kind, model, size, new)
    seq, logits = _generate(model, ids, mask, new=new, cache=eager_cache, attention=attention)
    cache, _ = _graph_cache(kind, model, size, new)
    streamer = _Recorder()
    model.set_attn_implementation(attention)
    try:
        ours, our_logits = generate_graphed(model, ids, mask, cache=cache, max_new_tokens=new, return_logits=True,
                                            streamer=streamer)
    finally:
        model.set_attn_implementation("sdpa")
    first = _first_difference(ours, seq, size.prompt)
    steps = new if first is None else first + 1  # the same tokens so far: the same context
    err = float(_step_errors(our_logits.double()[:, :steps], logits[:, :steps]).max())
    # the reservation plans the decode for the longest length to come, generate's steps for the
    # length so far: other splits, so fp32 sums in another order on a GPU (a near tie may flip a
    # token); the torch path on CPU has no splits and must agree exactly
    tol = 0.0 if device == "cpu" else 0.05 * float(logits.std())
    record.add(max_abs_err=err, tolerance=tol, first_token_difference=first, new=new, rows=ids.shape[0])
    assert ours.shape == seq.shape and err <= tol, f"graph-replayed logits differ from generate's by {err:.4g}"
    assert first is None or device != "cpu", f"graph-replayed tokens differ from step {first}"
    _check_streamed(streamer, ids, ours)
    assert int(cache.get_seq_length()) == int(eager_cache.get_seq_length()) == size.prompt + new - 1
    if kind != "static":
        for ours_layer, eager_layer in zip(cache.layers, eager_cache.layers, strict=True):
            assert ours_layer.paged.lengths() == eager_layer.paged.lengths()
            assert ours_layer.paged.sync_lengths() == eager_layer.paged.lengths()  # what the device holds


def _eos_applied(new_tokens: torch.Tensor, eos: list[int]) -> torch.Tensor:
    """What generate makes of a run's new tokens [B, N] with ``eos``: each row's tokens after its
    first eos become PAD, and the run ends at the step where the last row finished."""
    hits = torch.isin(new_tokens, torch.tensor(eos, device=new_tokens.device))
    first = [int(row.nonzero()[0]) if row.any() else None for row in hits]
    out = new_tokens.clone()
    for r, f in enumerate(first):
        if f is not None:
            out[r, f + 1:] = PAD
    return out if None in first else out[:, :max(first) + 1]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("kind", ["kvbits", "static"])
@pytest.mark.parametrize("eos_from", ["arguments", "generation-config"])
def test_graph_replayed_generation_stops_at_eos(record, seed, device, kind, eos_from):
    """With eos_token_id (one id per row of a left-padded batch of two, drawn from the run without
    it), each row gets PAD after its eos and decoding stops once both rows have one: exactly the
    run without eos, cut as generate cuts it, whether the ids are arguments or set in the model's
    generation config (the same replays, so bit for bit wherever a run
    repeats bit for bit, and up to the first step whose logits differ where it does not: see
    ``_reproducible``), and on CPU exactly what generate gives; the cache holds the positions of
    the steps run."""
    record.backend, record.device = ("transformers" if kind == "static" else "kvbits"), device
    record.variant = f"fp16-graphed-{kind}-eos-{eos_from}"
    size = _size(device)
    model, _ = _models(size, seed, torch.float16, device)
    ids, mask = _graph_prompt(size, seed, True, device)
    runs, logits = {}, {}
    for name in ("full", "eos"):
        cache, attention = _graph_cache(kind, model, size, size.new)
        eos = None if name == "full" else [int(runs["full"][0, size.prompt + 3]), int(runs["full"][1, size.prompt + 5])]
        stop = {"eos_token_id": eos, "pad_token_id": None if eos is None else PAD}
        if eos_from == "generation-config":
            model.generation_config.update(**stop)
        model.set_attn_implementation(attention)
        try:
            runs[name], logits[name] = generate_graphed(model, ids, mask, cache=cache, max_new_tokens=size.new,
                                                        return_logits=True,
                                                        **(stop if eos_from == "arguments" else {}))
        finally:
            model.set_attn_implementation("sdpa")
    expected = _eos_applied(runs["full"][:, size.prompt:], eos)
    ours = runs["eos"][:, size.prompt:]
    # each row's logits until its eos (a finished row's later input is PAD, so its logits part there)
    ends = [int(hits.nonzero()[0]) + 1 if hits.any() else expected.shape[1]
            for hits in torch.isin(expected, torch.tensor(eos, device=expected.device))]
    row_parts = [_first_logits_difference(logits["full"][r:r + 1, :end], logits["eos"][r:r + 1, :end])
                 for r, end in enumerate(ends)]
    parted = min((p for p in row_parts if p is not None), default=None)
    record.add(new=expected.shape[1], eos=eos, logits_differ_from=parted)
    assert expected.shape[1] <= 6, "both rows hold an eos by step 5"
    # the rule holds of the run itself on every path: PAD after each row's eos, the stop when both have one
    assert torch.equal(_eos_applied(ours, eos), ours), "a finished row is not padded, or decoding went on"
    if not torch.isin(ours, torch.tensor(eos, device=ours.device)).any(-1).all():
        assert ours.shape[1] == size.new, "decoding stopped with a row unfinished"
    if _reproducible(kind, device) or parted is None:
        assert parted is None, f"the rerun's logits differ from step {parted}"
        assert torch.equal(ours, expected), "graph-replayed tokens with eos differ from the rule"
        assert int(cache.get_seq_length()) == size.prompt + expected.shape[1] - 1
    else:  # the same rule up to the step whose logits differ
        assert torch.equal(ours[:, :parted], expected[:, :parted]), "graph-replayed tokens with eos differ"
        assert int(cache.get_seq_length()) == size.prompt + ours.shape[1] - 1
    if device == "cpu":
        model.set_attn_implementation(attention)
        try:
            with torch.no_grad():
                theirs = model.generate(ids, attention_mask=mask,
                                        past_key_values=_graph_cache(kind, model, size, size.new)[0],
                                        max_new_tokens=size.new, eos_token_id=eos, pad_token_id=PAD, do_sample=False)
        finally:
            model.set_attn_implementation("sdpa")
        assert torch.equal(runs["eos"], theirs), "generate_graphed with eos differs from generate"


SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9}  # each of generate's warpers in play
# where the sampling settings come from: (the arguments both calls get, the model's generation
# config's settings, the warpers' settings generate resolves them to)
SAMPLING_SOURCES = {
    "arguments": ({"do_sample": True, **SAMPLING}, {}, SAMPLING),
    # top_k unset: generate's default of 50 applies
    "defaults": ({"do_sample": True, "temperature": 0.7, "top_p": 0.9}, {}, {**SAMPLING, "top_k": 50}),
    "generation-config": ({}, {"do_sample": True, "temperature": 0.7, "top_p": 0.9}, {**SAMPLING, "top_k": 50}),
}


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("kind", ["kvbits", "static"])
@pytest.mark.parametrize("source", list(SAMPLING_SOURCES))
def test_graph_replayed_sampling_draws_as_generate(record, seed, device, kind, source):
    """Sampling with temperature, top-k and top-p, seeded, on a left-padded batch of two, the
    settings given as arguments, partly left to generate's defaults, or left to the model's
    generation config: each token generate_graphed draws is the one generate's own rule
    (transformers' warpers with the settings generate resolves, then torch.multinomial) draws from
    the same logits after the same seed, the replayed steps' too (a graph's draws must follow the
    default generator as eager ones do); the seed repeats the run, another seed changes it; on CPU
    the run is generate's bit for bit, and on a GPU its logits are generate's until the tokens part."""
    record.backend, record.device = ("transformers" if kind == "static" else "kvbits"), device
    record.variant = f"fp16-graphed-{kind}-sample-{source}"
    arguments, configured, resolved = SAMPLING_SOURCES[source]
    size = _size(device)
    model, _ = _models(size, seed, torch.float16, device)
    model.generation_config.update(**configured)
    ids, mask = _graph_prompt(size, seed, True, device)

    def run(sample_seed: int):
        cache, attention = _graph_cache(kind, model, size, size.new)
        model.set_attn_implementation(attention)
        try:
            torch.manual_seed(sample_seed)
            return generate_graphed(model, ids, mask, cache=cache, max_new_tokens=size.new, return_logits=True,
                                    **arguments)
        finally:
            model.set_attn_implementation("sdpa")

    (seq, logits), (again, again_logits), (other, _) = run(seed), run(seed), run(seed + 1)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(resolved["temperature"]),
                                   TopKLogitsWarper(resolved["top_k"]), TopPLogitsWarper(resolved["top_p"])])
    torch.manual_seed(seed)
    drawn = torch.stack([torch.multinomial(warpers(None, logits[:, n]).softmax(-1), 1)[:, 0]
                         for n in range(size.new)], 1)
    their_cache, attention = _graph_cache(kind, model, size, size.new)
    theirs, their_logits = _generate(model, ids, mask, new=size.new, cache=their_cache, attention=attention,
                                     sample_seed=seed, sampling=arguments)
    first = _first_difference(seq, theirs, size.prompt)
    steps = size.new if first is None else first + 1
    err = float(_step_errors(logits.double()[:, :steps], their_logits[:, :steps]).max())
    tol = 0.0 if device == "cpu" else 0.05 * float(their_logits.std())
    repeated, parted = _first_difference(seq, again, size.prompt), _first_logits_difference(logits, again_logits)
    record.add(first_token_difference=first, max_abs_err=err, tolerance=tol, new=size.new,
               rerun_tokens_differ_from=repeated, rerun_logits_differ_from=parted)
    assert torch.equal(seq[:, size.prompt:], drawn), "the draws differ from generate's rule on the same logits"
    if _reproducible(kind, device):
        assert parted is None and repeated is None, \
            f"a seeded rerun differs: logits from {parted}, tokens from {repeated}"
    else:  # the same noise: tokens part only where the logits already do
        assert repeated is None or (parted is not None and parted <= repeated), \
            f"a seeded rerun's tokens differ from step {repeated}, its logits from {parted}"
    assert not torch.equal(seq, other), "another seed must draw other tokens"
    assert err <= tol, f"sampled steps' logits differ from generate's by {err:.4g}"
    assert first is None or device != "cpu", f"sampled tokens differ from generate's from step {first}"


@pytest.mark.parametrize("device", device_params())
def test_graph_replayed_greedy_ignores_sampling_settings(record, seed, device):
    """Greedy decoding given temperature and top_k, and greedy decoding asked for (do_sample=False)
    of a model whose generation config samples: each gives the tokens of plain greedy decoding, as
    generate does."""
    record.backend, record.device, record.variant = "kvbits", device, "fp16-graphed-greedy-with-sampling-settings"
    size = _size(device)
    model, _ = _models(size, seed, torch.float16, device)
    ids, mask = _graph_prompt(size, seed, True, device)
    runs = {}
    model.set_attn_implementation(ATTENTION_NAME)
    try:
        for name, arguments in (("greedy", {}), ("sampling-arguments", {"temperature": 0.3, "top_k": 2}),
                                ("config-samples", {"do_sample": False})):
            if name == "config-samples":
                model.generation_config.update(do_sample=True, temperature=0.3, top_k=2)
            runs[name] = generate_graphed(model, ids, mask, cache=_kvbits_cache(model, size), max_new_tokens=size.new,
                                          **arguments)
    finally:
        model.set_attn_implementation("sdpa")
    record.add(new=size.new)
    for name in ("sampling-arguments", "config-samples"):
        assert torch.equal(runs["greedy"], runs[name]), f"{name} changed greedy decoding"


class _NaNFromStep:
    """A forward hook for the model's head that makes the logits NaN from step ``first`` on (1: the
    prompt's), counting steps on the device so that graph replays count as well."""

    def __init__(self, first: int, device):
        self.first, self.steps = first, torch.zeros((), dtype=torch.long, device=device)

    def __call__(self, module, inputs, output):
        self.steps.add_(1)
        return output + torch.where(self.steps >= self.first, float("nan"), 0.0).to(output.dtype)


@pytest.mark.parametrize("device", device_params())
def test_graph_replayed_sampling_refuses_nan_probabilities(record, seed, device):
    """Logits that turn NaN from the fourth step (the second replay on a GPU): sampling raises a
    RuntimeError naming NaN, where generate's torch.multinomial raises; the same run with NaN from
    no step within reach raises nothing."""
    record.backend, record.device, record.variant = "kvbits", device, "fp16-graphed-sample-nan"
    size = _size(device)
    model, _ = _models(size, seed, torch.float16, device)
    ids, _ = _graph_prompt(size, seed, False, device)
    model.set_attn_implementation(ATTENTION_NAME)
    outcomes = {}
    try:
        for first in (4, size.new + 1):
            hook = model.lm_head.register_forward_hook(_NaNFromStep(first, device))
            try:
                generate_graphed(model, ids, cache=_kvbits_cache(model, size), max_new_tokens=size.new, do_sample=True)
                outcomes[first] = None
            except RuntimeError as error:
                outcomes[first] = str(error)
            finally:
                hook.remove()
    finally:
        model.set_attn_implementation("sdpa")
    record.add(outcomes=outcomes)
    assert outcomes[4] is not None and "held NaN" in outcomes[4], outcomes
    assert outcomes[size.new + 1] is None, outcomes


@pytest.mark.parametrize("device", device_params())
def test_graph_replayed_generation_stopped_by_its_streamer(record, seed, device):
    """A streamer that raises part-way through the replays: the exception reaches the caller and
    the cache's host counts match what its device holds (the replays issued), so that it can be
    read, or reset and used again."""
    record.backend, record.device, record.variant = "kvbits", device, "fp16-graphed-interrupted"
    size = _size(device)
    model, _ = _models(size, seed, torch.float16, device)
    ids, _ = _graph_prompt(size, seed, False, device)
    cache = _kvbits_cache(model, size)
    stop_at = 6  # the prompt, its token, the warm-up's token, then the replays' (put one replay late)
    model.set_attn_implementation(ATTENTION_NAME)
    try:
        with pytest.raises(_StreamStopped, match="the streamer stops the run"):
            generate_graphed(model, ids, cache=cache, max_new_tokens=size.new, streamer=_Recorder(stop_at))
    finally:
        model.set_attn_implementation("sdpa")
    held = [layer.paged.sync_lengths() for layer in cache.layers]  # read from the device
    record.add(held=held[0][0], seen=cache.get_seq_length())
    assert all(layer.paged.lengths() == h for layer, h in zip(cache.layers, held, strict=True))
    assert held == [[cache.get_seq_length()]] * size.layers
    assert size.prompt + stop_at - 3 <= cache.get_seq_length() < size.prompt + size.new - 1


# ----------------------------------------------------------------------------- 4. QuantizedCache
# (QuantizedCache backend, its module, the package that installs it, bits)
QUANTIZED = [pytest.param("hqq", "hqq", "hqq", 3, id="hqq-b3"),
             pytest.param("quanto", "optimum.quanto", "optimum-quanto", 4, id="quanto-b4")]


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize(("backend", "module", "package", "bits"), QUANTIZED)
def test_against_transformers_quantized_cache(record, seed, device, backend, module, package, bits):
    """transformers' QuantizedCache (HQQ at 3 bits, quanto at 4: what each backend offers) and
    KVBitsCache at the same bits and group size, each against the float64 reference along its
    own tokens: both within the bound (recorded side by side), at the size the bound was measured
    on, on every device (REFERENCE_SIZE)."""
    top = module.split(".")[0]  # find_spec of a dotted name raises when its parent is missing
    # transformers reads the installed version: files left by an uninstalled package are missing
    if (dist_version(package) is None or importlib.util.find_spec(top) is None
            or importlib.util.find_spec(module) is None):
        pytest.skip(f"{package} is not installed (transformers' QuantizedCache backend {backend!r})")
    record.backend, record.device, record.variant = f"kvbits-vs-{backend}", device, f"fp16-b{bits}"
    size = REFERENCE_SIZE
    model, model64 = _models(size, seed, torch.float16, device)
    ids = _prompt(torch.Generator().manual_seed(seed), size, 1, size.prompt, device)
    ours = _quantized_reference(model, model64, ids, size, bits)
    theirs = QuantizedCache(backend=backend, config=model.config, nbits=bits, q_group_size=size.group,
                            residual_length=size.group)
    seq, logits = _generate(model, ids, new=size.new, cache=theirs)
    their_err = _step_errors(logits, _teacher_forced(model64, seq, size.prompt))
    record.add(max_abs_err=float(ours["err"].max()), quantized_cache_err=float(their_err.max()),
               bound=ours["bounds"]["worst"], cache_bytes=ours["cache"].nbytes())
    _check_within(ours["err"], ours["bounds"])
    assert float(their_err.max()) <= ours["bounds"]["worst"], "QuantizedCache far off: is the comparison set up right?"


# ----------------------------------------------------------------------------- 5. bad input
def _tiny(**kw) -> LlamaConfig:
    base = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 64, "num_hidden_layers": 1, "vocab_size": 64, "pad_token_id": PAD}
    return LlamaConfig(**{**base, **kw})


def _tiny_model(attention: str) -> LlamaForCausalLM:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(_tiny()).eval()
    model.set_attn_implementation(attention)
    return model


def _configured(**generation) -> LlamaForCausalLM:
    """The tiny kvbits model with ``generation`` set in its generation config."""
    model = _tiny_model(ATTENTION_NAME)
    model.generation_config.update(**generation)
    return model


def _ids(n: int, rows: int = 1) -> torch.Tensor:
    return torch.arange(1, n + 1).repeat(rows, 1) % 63 + 1


def _two_token_step():
    """A prompt, then a step of two tokens (what assisted decoding sends)."""
    model = _tiny_model(ATTENTION_NAME)
    cache = KVBitsCache(model.config, max_cache_len=64, group_size=32)
    with torch.no_grad():
        model(_ids(10), past_key_values=cache)
        model(_ids(2), past_key_values=cache)


def _past_max_len():
    model = _tiny_model(ATTENTION_NAME)
    with torch.no_grad():
        model.generate(_ids(10), past_key_values=KVBitsCache(model.config, max_cache_len=12, group_size=32),
                       max_new_tokens=8, do_sample=False, pad_token_id=PAD)


def _masked_new_token():
    model = _tiny_model(ATTENTION_NAME)
    cache = KVBitsCache(model.config, max_cache_len=64, group_size=32)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        model(_ids(10, 2), attention_mask=mask, past_key_values=cache)
        model(_ids(1, 2), attention_mask=torch.cat([mask, torch.tensor([[1], [0]])], 1), past_key_values=cache)


def _generate_with(attention: str, cache_of, **kw):
    def run():
        model = _tiny_model(attention)
        with torch.no_grad():
            model.generate(_ids(10), past_key_values=cache_of(model), max_new_tokens=4, pad_token_id=PAD, **kw)
    return run


def _kv(model, **kw):
    return KVBitsCache(model.config, max_cache_len=64, group_size=32, **kw)


BAD = {
    # name: (callable, exception, text the message must contain)
    "head_dim_not_multiple_of_group": (lambda: KVBitsCache(_tiny(head_dim=48), max_cache_len=64, group_size=32),
                                       ValueError, "head_dim (48) must be a multiple of group_size (32)"),
    "sliding_window": (lambda: KVBitsCache(MistralConfig(sliding_window=16, num_hidden_layers=1), max_cache_len=64),
                       ValueError, "sliding_attention"),
    "encoder_decoder": (lambda: KVBitsCache(BartConfig(), max_cache_len=64), ValueError, "encoder-decoder"),
    "config_not_a_config": (lambda: KVBitsCache({"hidden_size": 128}, max_cache_len=64), TypeError, "config must be"),
    "bits_8": (lambda: KVBitsCache(_tiny(), max_cache_len=64, bits=8), ValueError, "bits must be one of"),
    "group_48": (lambda: KVBitsCache(_tiny(), max_cache_len=64, group_size=48), ValueError, "group_size must be"),
    "dtype_fp32": (lambda: KVBitsCache(_tiny(), max_cache_len=64, dtype=torch.float32), TypeError, "dtype must be"),
    "backend_cuda": (lambda: KVBitsCache(_tiny(), max_cache_len=64, backend="cuda"), ValueError, "backend must be"),
    "max_cache_len_zero": (lambda: KVBitsCache(_tiny(), max_cache_len=0), ValueError, "max_cache_len must be positive"),
    "page_not_multiple": (lambda: KVBitsCache(_tiny(), max_cache_len=64, group_size=32, page_size=48), ValueError,
                          "page_size must be a positive multiple"),
    "sinks_not_whole_groups": (lambda: KVBitsCache(_tiny(), max_cache_len=64, group_size=32, sinks=16), ValueError,
                               "sinks must be a non-negative multiple of group_size=32"),
    "window_negative": (lambda: KVBitsCache(_tiny(), max_cache_len=64, window=-64), ValueError,
                        "window must be a non-negative multiple"),
    "beam_search": (_generate_with(ATTENTION_NAME, _kv, num_beams=2, do_sample=False), ValueError, "beam search"),
    "multi_token_step": (_two_token_step, ValueError, "a step of 2 tokens after the prompt"),
    "past_max_cache_len": (_past_max_len, ValueError, "exceed max_cache_len=12"),
    "masked_new_token": (_masked_new_token, ValueError, "masks a row's new token"),
    "kvbits_attention_without_cache": (_generate_with(ATTENTION_NAME, lambda m: DynamicCache(config=m.config)),
                                       TypeError, "needs a KVBitsCache"),
    "cache_with_sdpa_attention": (_generate_with("sdpa", _kv), TypeError, "attn_implementation='kvbits'"),
    "graphed_without_kvbits_attention": (lambda: generate_graphed(_tiny_model("sdpa"), _ids(10), cache=_kv(
        _tiny_model("sdpa")), max_new_tokens=4), ValueError, "attn_implementation='kvbits'"),
    "graphed_past_max_cache_len": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(60), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=8), ValueError, "need 67 positions"),
    "graphed_no_new_token": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=0), ValueError, "max_new_tokens must be at least 1"),
    "graphed_other_cache": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=DynamicCache(),
                                                     max_new_tokens=2), TypeError, "cache must be a KVBitsCache"),
    "graphed_float_ids": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10).float(), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2), ValueError, "input_ids must be int64"),
    "graphed_right_padded": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), torch.tensor(
        [[1] * 8 + [0] * 2]), cache=_kv(_tiny_model(ATTENTION_NAME)), max_new_tokens=2), ValueError,
        "masks the last column of rows [0]"),
    "graphed_eos_not_int": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2, eos_token_id="2"), TypeError, "eos_token_id must be an int"),
    "graphed_repetition_penalty_configured": (lambda: generate_graphed(_configured(repetition_penalty=1.1), _ids(10),
        cache=_kv(_tiny_model(ATTENTION_NAME)), max_new_tokens=2), ValueError, "sets repetition_penalty=1.1"),
    "graphed_min_p_configured": (lambda: generate_graphed(_configured(min_p=0.05), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2, do_sample=True), ValueError, "sets min_p=0.05"),
    "graphed_contrastive_configured": (lambda: generate_graphed(_configured(penalty_alpha=0.6), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2), ValueError, "ask for contrastive_search"),
    "graphed_beams_configured": (lambda: generate_graphed(_configured(num_beams=2), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2), ValueError, "ask for beam_search"),
    "graphed_min_new_tokens_with_eos": (lambda: generate_graphed(_configured(min_new_tokens=3), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=4), ValueError, "sets min_new_tokens=3"),
    "graphed_top_p_negative": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2, do_sample=True, top_p=-0.1), ValueError, "top_p must be in"),
    "graphed_top_p_above_one": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2, do_sample=True, top_p=1.5), ValueError, "top_p must be in"),
    "graphed_top_k_float": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2, do_sample=True, top_k=4.0), TypeError, "top_k must be an int"),
    "graphed_zero_temperature": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=_kv(
        _tiny_model(ATTENTION_NAME)), max_new_tokens=2, do_sample=True, temperature=0.0), ValueError,
        "temperature must be positive"),
    "graphed_static_with_kvbits_attention": (lambda: generate_graphed(_tiny_model(ATTENTION_NAME), _ids(10), cache=
        StaticCache(config=_tiny(), max_cache_len=16), max_new_tokens=2), ValueError, "attn_implementation='sdpa'"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(record, name):
    """Each configuration the cache cannot serve raises a TypeError or ValueError naming why."""
    record.backend, record.device, record.variant = "kvbits", "cpu", name
    call, exc, text = BAD[name]
    with record.raises(exc, match=None, input=name) as caught:
        call()
    assert text in str(caught.value), f"{name}: {caught.value}"


# ----------------------------------------------------------------------------- 6. coexistence
def test_a_checkout_hides_no_hub_kernels_package(record):
    """Hugging Face's hub-kernels distribution has the top-level import name ``kernels``, which
    transformers imports (from 5.25 a requirement of it). With this repository first on sys.path,
    as the harness runs the suites, that name must not resolve inside the repository: it is the
    hub loader's where its distribution is installed and nothing otherwise, and transformers takes
    the loader exactly when the distribution's version is in its range."""
    record.backend, record.device, record.variant = "kvbits", "cpu", "import-name"
    root = Path(__file__).resolve().parents[1]
    assert Path(kvbits.__file__).resolve().parent == root / "kvbits", f"kvbits is not the checkout's: {kvbits.__file__}"
    spec = importlib.util.find_spec("kernels")
    origin = None if spec is None else Path(spec.origin or next(iter(spec.submodule_search_locations))).resolve()
    installed = dist_version("kernels")
    record.add(hub_kernels=installed, kernels_origin=str(origin),
               hub_kernels_range=f"[{KERNELS_MIN_VERSION}, {KERNELS_MAX_VERSION})")
    assert origin is None or root not in origin.parents, f"`import kernels` finds {origin} inside the checkout"
    assert (origin is None) == (installed is None), f"`import kernels` finds {origin}; its distribution: {installed}"
    in_range = installed is not None and (
        Version(KERNELS_MIN_VERSION) <= Version(installed) < Version(KERNELS_MAX_VERSION))
    assert is_kernels_available() == in_range, f"transformers' view of the hub loader ({installed}) is not its own"
