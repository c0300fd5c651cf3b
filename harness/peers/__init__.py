"""Peers: the decode attention users would pick instead of kvbits, each adapted to one interface
(:class:`harness.peers.base.Peer`) so the decode benchmarks can time them side by side.

- ``base``: the interface and its argument checks.
- ``preallocated``: a preallocated fp16/bf16 cache written in place (shared by ``sdpa``, ``flex``).
- ``sdpa``: torch SDPA with one backend (flash, cuDNN, memory-efficient, math).
- ``flex``: FlexAttention with a block mask to the current length.
- ``paged``: vLLM/FlashInfer's paged layout and page table, torch only.
- ``flashinfer``: FlashInfer's paged decode, fp16/bf16 or fp8 K/V.
- ``flash_attn``: flash-attn's ``flash_attn_with_kvcache``.
- ``hf_quantized``: transformers' ``QuantizedCache`` (quanto, HQQ) and SDPA.
- ``serving``: the serving batch's interface (:class:`Server`: ragged sequences joining,
  growing and leaving) and plain PyTorch's server (SDPA per sequence); FlashInfer's paged server
  is in ``flashinfer``.

``PEERS`` maps a stable name to a factory taking the :class:`Peer` constructor's arguments,
``SERVERS`` the methods that serve a ragged batch to one taking :class:`Server`'s, ``UNSERVED``
the others to why; nothing else is held at module level. The peers' packages are imported only when used.
kvbits itself joins them in the peers benchmark (suites/peers_support.py: ``KvbitsPeer``, and
``measure``, which times every method alike).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .base import Peer
from .flash_attn import FlashAttnPeer
from .flashinfer import FlashInferPeer, FlashInferServer
from .flex import FlexPeer
from .hf_quantized import HFQuantizedPeer
from .sdpa import SdpaPeer
from .serving import SdpaServer, Server

PEERS: dict[str, Callable[..., Peer]] = {
    "sdpa-flash": partial(SdpaPeer, "flash"),
    "sdpa-cudnn": partial(SdpaPeer, "cudnn"),
    "sdpa-efficient": partial(SdpaPeer, "efficient"),
    "sdpa-math": partial(SdpaPeer, "math"),
    "flex": FlexPeer,
    "flashinfer-fp16": partial(FlashInferPeer, kv="fp16"),
    "flashinfer-fp8": partial(FlashInferPeer, kv="fp8"),
    "flash-attn": FlashAttnPeer,
    "hf-quanto-int4": partial(HFQuantizedPeer, "quanto", 4),
    "hf-quanto-int2": partial(HFQuantizedPeer, "quanto", 2),
    "hf-hqq-4": partial(HFQuantizedPeer, "hqq", 4),
    "hf-hqq-3": partial(HFQuantizedPeer, "hqq", 3),
    "hf-hqq-2": partial(HFQuantizedPeer, "hqq", 2),
}

SERVERS: dict[str, Callable[..., Server]] = {
    **{f"sdpa-{backend}": partial(SdpaServer, backend) for backend in ("flash", "efficient", "math")},
    "flashinfer-fp16": partial(FlashInferServer, kv="fp16"),
    "flashinfer-fp8": partial(FlashInferServer, kv="fp8"),
}

_ONE_LENGTH = ("transformers' QuantizedCache holds one length for the whole batch (sequences padded to it, none "
               "joining or leaving)")
UNSERVED: dict[str, str] = {  # why a peer has no server
    "sdpa-cudnn": "cuDNN's SDPA builds an execution graph for every new sequence length, so a batch whose "
                  "sequences grow builds one per sequence every step (seconds a step): no serving method",
    "flex": "no ragged adapter: its block mask is built for one length (a mask per sequence, rebuilt as they "
            "grow, is not written)",
    "flash-attn": "no ragged adapter: flash_attn_with_kvcache takes a length per sequence, but the package has "
                  "no wheel for the torch/CUDA this was built on, so an adapter could not be run",
    **{name: _ONE_LENGTH for name in PEERS if name.startswith("hf-")},
}


def availability(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16, *, batch: int = 1,
                 q_heads: int = 8, kv_heads: int = 2, head_dim: int = 128, capacity: int = 256
                 ) -> list[tuple[str, bool, str | None]]:
    """(name, usable, reason it is not or None) of every peer for this device, dtype and shape."""
    rows = []
    for name, make in PEERS.items():
        reason = make(batch, q_heads, kv_heads, head_dim, capacity, dtype=dtype, device=device).missing()
        rows.append((name, reason is None, reason))
    return rows


__all__ = ["PEERS", "SERVERS", "UNSERVED", "Peer", "Server", "availability"]
