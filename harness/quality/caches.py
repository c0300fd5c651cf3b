"""The caches whose output quality is measured, each as a :class:`CacheSpec`: how to make one for a
model, which attention reads it, and the bytes a token takes in it.

- ``full``: transformers' ``DynamicCache`` in the model's dtype (the reference every other cache
  is compared with);
- ``fp16``: the same with K and V rounded to float16 as they are stored (what kvbits' residual
  window and any fp16 cache hold, for a float32 model);
- ``kvbits-<b>bit``: :class:`kvbits.integrations.transformers.KVBitsCache` (bits, group size,
  backend, fp sinks and window: ``-s<sinks>w<window>`` where not the defaults), read by the
  ``"kvbits"`` attention: the prompt attended exactly while it is quantized, every later token
  appended and decoded from the packed pages and the fp tokens;
- ``quanto-int<b>`` and ``hqq-<b>bit``: transformers' ``QuantizedCache`` with its defaults (group
  64, a 128-token full-precision window, everything re-quantized each time the window fills),
  where optimum-quanto or hqq is installed.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from harness.peers.hf_quantized import BACKEND_PACKAGE, GROUP_SIZE, RESIDUAL_LENGTH, stored_bytes
from harness.run.env import dist_version

KINDS = ("full", "fp16", "kvbits", "quanto", "hqq")


@dataclasses.dataclass(frozen=True)
class CacheSpec:
    """One cache setting. kind: one of KINDS; bits and group_size for the quantized kinds; backend,
    sinks and window: kvbits' (None: its defaults; backend "torch" or "triton")."""

    kind: str
    bits: int = 0
    group_size: int = 64
    backend: str | None = None
    sinks: int | None = None
    window: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}; got {self.kind!r}")
        if (self.kind in ("full", "fp16")) != (self.bits == 0):
            raise ValueError(f"bits={self.bits} for kind {self.kind!r}: the quantized kinds take 2 to 4 bits, the "
                             f"others none")

    @property
    def name(self) -> str:
        if self.kind in ("full", "fp16"):
            return self.kind
        if self.kind == "kvbits":
            fp = "" if self.sinks is None and self.window is None else f"-s{self.sinks}w{self.window}"
            return f"kvbits-{self.bits}bit" + ("" if self.group_size == 64 else f"-g{self.group_size}") + fp
        return f"quanto-int{self.bits}" if self.kind == "quanto" else f"hqq-{self.bits}bit"

    @property
    def attention(self) -> str:
        """The attn_implementation that reads this cache."""
        if self.kind == "kvbits":
            from kvbits.integrations.transformers import ATTENTION_NAME

            return ATTENTION_NAME
        return "sdpa"

    def missing(self) -> str | None:
        """Why this cache cannot run here, or None."""
        if self.kind in ("quanto", "hqq"):
            dist = BACKEND_PACKAGE[self.kind][1]
            if dist_version(dist) is None:
                return f"{dist} is not installed (pip install {dist})"
        return None

    def make(self, config, capacity: int):
        """A fresh cache for ``config``'s model holding up to ``capacity`` positions per row."""
        from transformers import DynamicCache
        from transformers.cache_utils import QuantizedCache

        if self.kind == "full":
            return DynamicCache(config=config)
        if self.kind == "fp16":
            return float16_cache_class()(config=config)
        if self.kind == "kvbits":
            from kvbits.integrations.transformers import KVBitsCache

            return KVBitsCache(config, max_cache_len=capacity, bits=self.bits, group_size=self.group_size,
                               backend=self.backend, sinks=self.sinks, window=self.window)
        return QuantizedCache(self.kind, config, nbits=self.bits, q_group_size=GROUP_SIZE,
                              residual_length=RESIDUAL_LENGTH)

    def bytes_per_token(self, cache, config, tokens: int, dtype: torch.dtype) -> float:
        """Bytes one token takes across the layers: kvbits' pages at steady state (codes, scales,
        zeros; its fp sinks and ring are a fixed size per sequence, PagedKVCache.sequence_bytes);
        QuantizedCache's stored tensors (codes, scales, zeros, the fp16/fp32 window) over
        the ``tokens`` it holds; K and V in ``dtype`` (float16 for ``fp16``) for the others."""
        if self.kind == "kvbits":
            return sum(layer.paged.bytes_per_token() for layer in cache.layers)
        if self.kind in ("quanto", "hqq"):
            return sum(stored_bytes(getattr(layer, attr, None)) for layer in cache.layers
                       for attr in ("_quantized_keys", "_quantized_values", "keys", "values")) / tokens
        size = 2 if self.kind == "fp16" else torch.empty((), dtype=dtype).element_size()
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 2 * config.num_hidden_layers * heads * head_dim * size


def version_of(spec: CacheSpec) -> str:
    """The versions that produced a spec's figures."""
    if spec.kind in ("quanto", "hqq"):
        dist = BACKEND_PACKAGE[spec.kind][1]
        return f"transformers {dist_version('transformers')}, {dist} {dist_version(dist)}"
    return f"transformers {dist_version('transformers')}"


@functools.cache
def float16_cache_class():
    """DynamicCache's subclass that rounds K and V to float16 (made on first use: transformers is
    an optional dependency)."""
    from transformers import DynamicCache

    class Float16Cache(DynamicCache):
        """DynamicCache storing K and V rounded to float16 (returned in the model's dtype)."""

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            def rounded(x):
                return x.to(torch.float16).to(x.dtype)

            return super().update(rounded(key_states), rounded(value_states), layer_idx, *args, **kwargs)

    return Float16Cache

