"""Cache schemes emulated in one forward pass, for choosing among schemes the kernels do not
implement yet; :mod:`harness.quality.protocol` measures the real cache.

Why one pass can stand for teacher-forced decoding: at decode step t the cache holds positions
0..t, and a stored position's quantized K/V never change once its group is complete. So the
step's query reads, for each earlier position j, either j's quantized K/V (j in a complete group
outside the full-precision parts) or its float16 K/V, the same values in every later step. A
forward over the whole segment whose attention (registered as ``"kvbits-emulated"``) gives query
t exactly that mixture, for every t past the prompt, computes what the decode steps compute:
each layer's K/V at a position come from that position's own mixed attention in the layers
below, as in the steps. The prompt's queries attend exactly, as the cache's prefill does. Up to
the order of float operations, the figures equal those of a cache storing the scheme;
``suites/test_quality.py`` holds the emulation of kvbits' own scheme to the real cache's figures.

A :class:`Scheme` says how groups are quantized (bits, group sizes, where the zero point may lie)
and which positions stay in float16: the window (positions of the newest ``window`` tokens
beyond the partial group, in whole groups) and the sinks (the first ``sinks`` positions), and
optional transforms of K and V before quantization (a Walsh-Hadamard rotation of the head
dimension; K quantized before its rotary embedding).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kvbits.affine import _round_up_to, quantize_dequantize

ATTENTION = "kvbits-emulated"
ZEROS = ("kvbits", "holds-zero", "integer", "float")


@dataclasses.dataclass(frozen=True)
class Scheme:
    """bits: V's bits (2 to 8), and K's unless k_bits is given; group_size: V's group (channels of
    a token), and K's (tokens of a channel) unless k_group_size is given; zero: "kvbits" (kvbits'
    own affine scheme, through :func:`kvbits.affine.quantize_dequantize`, bit for bit the cache's
    codes), "holds-zero" (the group's range stretched to hold 0, the integer zero point in
    [0, 2^b - 1]), "integer" (a plain min-max range, the integer zero point anywhere) or "float" (a
    stored minimum: x = q s + min); window: whole groups of the newest tokens kept in float16
    beyond the partial group (a multiple of the K group); sinks: the first positions kept in
    float16; rotate: "k", "v", "kv" or "" (a Walsh-Hadamard rotation of the head dimension before
    quantization, undone after); pre_rope: quantize K before its rotary embedding."""

    bits: int
    group_size: int = 64
    k_bits: int | None = None
    k_group_size: int | None = None
    zero: str = "kvbits"
    window: int = 0
    sinks: int = 0
    rotate: str = ""
    pre_rope: bool = False

    def __post_init__(self):
        if self.bits not in range(2, 9) or (self.k_bits is not None and self.k_bits not in range(2, 9)):
            raise ValueError(f"bits and k_bits must be in 2..8; got {self.bits}, {self.k_bits}")
        if self.zero not in ZEROS:
            raise ValueError(f"zero must be one of {ZEROS}; got {self.zero!r}")
        if self.rotate not in ("", "k", "v", "kv"):
            raise ValueError(f"rotate must be '', 'k', 'v' or 'kv'; got {self.rotate!r}")
        if self.window < 0 or self.window % self.k_group or self.sinks < 0:
            raise ValueError(f"window ({self.window}) must be a multiple of the K group ({self.k_group}) and sinks "
                             f"({self.sinks}) >= 0")

    @property
    def k_group(self) -> int:
        return self.k_group_size or self.group_size

    def label(self) -> str:
        parts = [f"{self.bits}bit" if self.k_bits in (None, self.bits) else f"K{self.k_bits}V{self.bits}",
                 f"g{self.group_size}" + ("" if self.k_group == self.group_size else f"/K{self.k_group}"),
                 self.zero]
        parts += [f"window {self.window}"] * bool(self.window) + [f"sinks {self.sinks}"] * bool(self.sinks)
        parts += [f"rotate {self.rotate}"] * bool(self.rotate) + ["pre-RoPE K"] * self.pre_rope
        return ", ".join(parts)


def fake_quantize(x: torch.Tensor, bits: int, group_size: int, per_channel: bool, zero: str) -> torch.Tensor:
    """x fp32 [B, H, T, D] with its complete groups replaced by their quantized values (scales
    rounded up to float16 as the cache stores them): per channel, groups of ``group_size``
    tokens (a partial last group unchanged); else groups of ``group_size`` channels of a token."""
    if zero == "kvbits":
        return quantize_dequantize(x, bits, group_size=group_size, grouping="channel" if per_channel else "token")
    b, h, t, d = x.shape
    full = t // group_size * group_size if per_channel else t
    if per_channel:
        groups, dim = x[:, :, :full].reshape(b, h, full // group_size, group_size, d), 3
    else:
        groups, dim = x.reshape(b, h, t, d // group_size, group_size), 4
    lo, hi = groups.amin(dim, keepdim=True), groups.amax(dim, keepdim=True)
    qmax = 2**bits - 1
    if zero == "holds-zero":
        lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
    s = _round_up_to((hi - lo) / qmax, torch.float16)
    s = torch.where(s > 0, s, torch.ones_like(s))
    if zero == "float":
        low = lo.half().float()
        x_hat = torch.clamp(torch.round((groups - low) / s), 0, qmax) * s + low
    else:
        z = torch.round(-lo / s)
        x_hat = (torch.clamp(torch.round(groups / s) + z, 0, qmax) - z) * s
    out = x.clone()
    out[:, :, :full] = x_hat.reshape(b, h, full, d)
    return out


def hadamard(n: int, device=None) -> torch.Tensor:
    """The orthonormal Walsh-Hadamard matrix fp32 [n, n] (n a power of two)."""
    if n & (n - 1):
        raise ValueError(f"a Walsh-Hadamard rotation needs a power-of-two size; got {n}")
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def stored(k: torch.Tensor, v: torch.Tensor, scheme: Scheme, rope) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantized K and V fp32 [B, H, T, D] a cache of ``scheme`` holds for float16 K, V."""
    d = k.shape[-1]
    rot = hadamard(d, k.device) if scheme.rotate else None
    kk = k * rope[0] - _rotate_half(k) * rope[1] if scheme.pre_rope else k  # undo the rotary embedding
    kk = kk @ rot if "k" in scheme.rotate else kk
    vv = v @ rot if "v" in scheme.rotate else v
    k_hat = fake_quantize(kk, scheme.k_bits or scheme.bits, scheme.k_group, True, scheme.zero)
    v_hat = fake_quantize(vv, scheme.bits, scheme.group_size, False, scheme.zero)
    k_hat = k_hat @ rot.T if "k" in scheme.rotate else k_hat
    v_hat = v_hat @ rot.T if "v" in scheme.rotate else v_hat
    if scheme.pre_rope:
        k_hat = k_hat * rope[0] + _rotate_half(k_hat) * rope[1]
    return k_hat, v_hat


def read_quantized(tokens: int, prompt: int, scheme: Scheme, device) -> torch.Tensor:
    """bool [T, T]: whether query t reads position j's quantized K/V: t past the prompt, j in a
    complete K group older than the window, j not a sink."""
    t = torch.arange(tokens, device=device)[:, None]
    j = torch.arange(tokens, device=device)[None, :]
    g = scheme.k_group
    cut = torch.div(t + 1, g, rounding_mode="floor") * g - scheme.window
    return (t >= prompt) & (j < cut) & (j >= scheme.sinks)


def emulated_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, *,
                       kvbits_scheme: Scheme, kvbits_prompt: int, kvbits_rope, **kwargs):
    """The ``"kvbits-emulated"`` attention: query [B, Hq, T, D] over key, value [B, Hkv, T, D]
    (one unpadded sequence from position 0), each query past the prompt reading the mixture of
    :func:`read_quantized`; q, K and V rounded to float16 as the cache takes them. Returns
    ([B, T, Hq, D] in query's dtype, None)."""
    q, k, v = (x.half().float() for x in (query, key, value))
    k_hat, v_hat = stored(k, v, kvbits_scheme, kvbits_rope)
    group = q.shape[1] // k.shape[1]
    k, v, k_hat, v_hat = (x.repeat_interleave(group, 1) for x in (k, v, k_hat, v_hat))
    tokens = q.shape[2]
    quant = read_quantized(tokens, kvbits_prompt, kvbits_scheme, q.device)
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    logits = torch.where(quant, q @ k_hat.transpose(-1, -2), q @ k.transpose(-1, -2)) * scale
    p = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    out = (p * quant) @ v_hat + (p * ~quant) @ v
    return out.transpose(1, 2).to(query.dtype).contiguous(), None


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, emulated_attention)


def emulated_log_probs(model, segment: torch.Tensor, scheme: Scheme, prompt: int) -> torch.Tensor:
    """Log-probabilities fp32 [steps, vocab] of each decode step's next token over ``segment``,
    as :func:`harness.quality.protocol.teacher_forced` gives them for a cache of ``scheme``."""
    register()
    device = next(model.parameters()).device
    ids = segment.to(device)[None, :-1]
    positions = torch.arange(ids.shape[1], device=device)[None]
    model.set_attn_implementation(ATTENTION)
    with torch.inference_mode():
        cos, sin = model.model.rotary_emb(torch.zeros(1, device=device), positions)
        rope = (cos[:, None].float(), sin[:, None].float())
        logits = model(input_ids=ids, use_cache=False, kvbits_scheme=scheme, kvbits_prompt=prompt,
                       kvbits_rope=rope).logits
    return logits[0, prompt:].float().log_softmax(-1)
