"""Low-bit KV-cache kernels: b-bit packing, affine and INT8 quantization, fused decoding.

Public API (docs/design.md section 4)::

    kvbits.pack_bits(values, bits=3, *, layout="byte", backend=None)
    kvbits.unpack_bits(packed, bits=3, *, layout="byte", backend=None)
    kvbits.quantize_kv(k, v, bits=3, *, group_size=64, ...) -> QuantizedKV
    kvbits.dequantize_kv(qkv) -> (k_hat, v_hat)
    kvbits.decode_attention(q, qkv, *, seq_lens=None, sm_scale=None, backend=None)
    kvbits.PagedKVCache(num_pages, page_size, heads, head_dim, ...)  # add_sequence, append, attend, free
    kvbits.DecodePlan(view, q_heads, q_dtype, max_len).run(q)
    kvbits.int8.quantize_per_channel(x, *, variant=None) -> (q, scales)
    kvbits.int8.dequantize_per_channel(q, scales, *, variant=None)

Submodules load on first use, so ``import kvbits`` stays cheap.
"""

from __future__ import annotations

import importlib

from . import _runtime  # noqa: F401  (interpreter mode decided before any kernel is defined)

_EXPORTS = {
    "pack_bits": "packing",
    "unpack_bits": "packing",
    "quantize_kv": "kv_cache",
    "dequantize_kv": "kv_cache",
    "QuantizedKV": "kv_cache",
    "decode_attention": "decode",
    "PagedKVCache": "decode",
    "DecodePlan": "decode",
}
_SUBMODULES = ("packing", "affine", "kv_cache", "decode", "int8")

__all__ = [*_EXPORTS, *_SUBMODULES]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'kvbits' has no attribute {name!r}")
