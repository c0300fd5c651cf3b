"""Fused low-bit flash-decoding over the packed KV cache, and the paged cache it reads as it grows
(docs/design.md section 6).

One package, a module per job:

- :mod:`.layout`: the tile arrangement of the codes that the kernel reads, and its torch twins
  (``words_from_codes``/``codes_from_words``, ``unpack_tile``);
- :mod:`.paged`: :class:`PagedQuantizedKV` (a page pool, block table, residual window and
  lengths) and its bijection with the contiguous :class:`~kvbits.kv_cache.QuantizedKV`
  (``paged_from_contiguous``, ``paged_to_contiguous``, ``decode_view``);
- :mod:`.kernel`: the split and merge Triton kernels (device code only);
- :mod:`.launch`: the split plan, partial buffers, launch arguments and AOT specializations;
- :mod:`.direct_launch`: launches through the compiled kernel's own launcher;
- :mod:`.checks`: the argument checks;
- :mod:`.reference`: exact references (``reference_decode``, ``attention_reference``);
- :mod:`.api`: ``decode_attention`` (one call, checks and all);
- :mod:`.plan`: :class:`DecodePlan` (plan once per batch composition, run per step);
- :mod:`.append`: the append kernel writing tokens into pages;
- :mod:`.cache`: :class:`PagedKVCache`, the cache a decode loop or a server runs on.

``decode_attention(q, cache)``: one query token per sequence, q ``[B, Hq, D]`` fp16/bf16,
against a :class:`~kvbits.kv_cache.QuantizedKV` or a :class:`PagedQuantizedKV` holding ``Hkv``
kv heads (``Hq % Hkv == 0``); returns ``[B, Hq, D]`` in q's dtype. Nothing is cached between
calls: a loop keeps a :class:`DecodePlan` or a :class:`PagedKVCache`.
"""

from __future__ import annotations

from .api import decode_attention
from .cache import PagedKVCache
from .paged import PagedQuantizedKV, decode_view, paged_from_contiguous, paged_to_contiguous
from .plan import DecodePlan
from .reference import attention_reference, reference_decode

__all__ = [
    "DecodePlan",
    "PagedKVCache",
    "PagedQuantizedKV",
    "attention_reference",
    "decode_attention",
    "decode_view",
    "paged_from_contiguous",
    "paged_to_contiguous",
    "reference_decode",
]
