"""A preallocated K/V cache in the model's dtype, written in place: the storage of the SDPA and
FlexAttention peers (and of the fp16 step in suites/decode_loop_support.py)."""

from __future__ import annotations

import torch

from .base import Peer


class PreallocatedPeer(Peer):
    """K/V in two tensors [B, Hkv, capacity, D] of ``dtype``, allocated (zeroed) by :meth:`load`; the prompt
    copied to positions [0, S), each appended token written at position ``length``. Subclasses
    attend over ``k_cache[:, :, :length]`` in their own way."""

    bits = 16

    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        shape = (self.batch, self.kv_heads, self.capacity, self.head_dim)
        # zeros, not empty: a kernel reading a whole block past the length (flex) multiplies the
        # unwritten V by a zero weight, and 0 * NaN from uninitialized memory is NaN
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.k_cache[:, :, : k.shape[2]] = k
        self.v_cache[:, :, : v.shape[2]] = v

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_cache[:, :, self.length] = k
        self.v_cache[:, :, self.length] = v

    def bytes_per_token(self) -> float:
        return 2 * self.kv_heads * self.head_dim * self.dtype.itemsize
