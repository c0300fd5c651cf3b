"""What a transformers user gets from ``cache_implementation="quantized"``:
``transformers.cache_utils.QuantizedCache`` with the quanto (int4, int2) or HQQ (4, 3, 2 bits)
backend, one layer of it, and attention the way transformers runs it: SDPA over the K/V that the
cache's ``update`` returns (its quantized part dequantized, then its full-precision residual
window and the new token)."""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from .base import Peer, dist_version

BACKEND_BITS = {"quanto": (4, 2), "hqq": (4, 3, 2)}
BACKEND_PACKAGE = {"quanto": ("optimum.quanto", "optimum-quanto"), "hqq": ("hqq", "hqq")}
RESIDUAL_LENGTH = 128  # transformers' defaults for the quantized cache
GROUP_SIZE = 64


def stored_bytes(obj) -> int:
    """Bytes of the tensors in obj (tensors, tuples, lists and dicts of them; tensor subclasses,
    e.g. quanto's, counted by their inner tensors)."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            return sum(stored_bytes(getattr(obj, n)) for n in names)
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(stored_bytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(stored_bytes(x) for x in obj.values())
    return 0


class HFQuantizedPeer(Peer):
    """One layer of transformers' ``QuantizedCache(backend, nbits, residual_length, q_group_size)``
    (its default axes). :meth:`load` passes the prompt to ``update`` (layer 0), which quantizes it
    all; :meth:`append` passes one token [B, Hkv, 1, D], which joins the residual window until
    that fills, when everything is quantized anew; :meth:`attend` runs SDPA over the K/V the last
    update returned, as transformers' attention does with them. Not graph-capturable: the cache
    grows by concatenation."""

    def __init__(self, backend: str, nbits: int, *args, residual_length: int = RESIDUAL_LENGTH,
                 group_size: int = GROUP_SIZE, **kwargs):
        if backend not in BACKEND_BITS:
            raise ValueError(f"backend must be one of {tuple(BACKEND_BITS)}; got {backend!r}")
        if nbits not in BACKEND_BITS[backend]:
            raise ValueError(f"nbits for {backend} must be one of {BACKEND_BITS[backend]}; got {nbits!r}")
        for arg, value in (("residual_length", residual_length), ("group_size", group_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{arg} must be a positive int; got {value!r}")
        super().__init__(*args, **kwargs)
        self.backend, self.bits = backend, nbits
        self.residual_length, self.group_size = residual_length, group_size
        self.name = f"hf-quanto-int{nbits}" if backend == "quanto" else f"hf-hqq-{nbits}"

    def missing(self) -> str | None:
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        module, dist = BACKEND_PACKAGE[self.backend]
        for mod, name in (("transformers.cache_utils", "transformers"), (module, dist)):
            # an import alone can succeed on a package's leftover files; transformers reads the
            # installed version, so an uninstalled one is missing
            if dist_version(name) is None:
                return f"{name} is not installed: pip install {name}"
            try:
                importlib.import_module(mod)
            except ImportError as e:
                return f"{name} does not import ({e})"
        try:  # the cache's layers check the backend's version (quanto >= 0.2.5) when made
            self._new_cache()
        except (ImportError, ValueError) as e:
            return f"transformers {dist_version('transformers')} cannot use {dist} {dist_version(dist)}: {e}"
        return None

    def version(self) -> str:
        dist = BACKEND_PACKAGE[self.backend][1]
        return f"transformers {dist_version('transformers')}, {dist} {dist_version(dist)}"

    def _new_cache(self):
        from transformers import PretrainedConfig
        from transformers.cache_utils import QuantizedCache

        config = PretrainedConfig(num_hidden_layers=1)  # the cache reads only its layer count
        return QuantizedCache(self.backend, config, nbits=self.bits, q_group_size=self.group_size,
                              residual_length=self.residual_length)

    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache = self._new_cache()
        self._k, self._v = self.cache.update(k, v, 0)

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self._k, self._v = self.cache.update(k[:, :, None], v[:, :, None], 0)

    def attended_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V [B, Hkv, length, D] the next :meth:`attend` attends: the cache's dequantized part,
        its residual window and the last token (after :meth:`load` alone: the prompt as given, as
        transformers attends the prompt it prefills)."""
        return self._k, self._v

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q[:, :, None], self._k, self._v, scale=self.sm_scale,
                                              enable_gqa=self.q_heads != self.kv_heads)[:, :, 0]

    def bytes_per_token(self) -> float:
        """Measured after :meth:`load`: the layer's stored tensors (codes, scales and zeros of the
        quantized part, the full-precision residual window) over the tokens of its sequences."""
        if self.length == 0:
            raise RuntimeError(f"{self.name}: bytes_per_token is measured; load a prompt first")
        layer = self.cache.layers[0]
        stored = sum(stored_bytes(getattr(layer, attr, None))
                     for attr in ("_quantized_keys", "_quantized_values", "keys", "values"))
        return stored / (self.batch * self.length)
