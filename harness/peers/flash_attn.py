"""flash-attn's ``flash_attn_with_kvcache``: the new token written into the cache and attended
in one call, the lengths a device tensor (``cache_seqlens``): the decode call of flash-attn users
and the engines built on it."""

from __future__ import annotations

import torch

from .base import Peer, cuda_package_missing, dist_version


class FlashAttnPeer(Peer):
    """K/V in [B, capacity, Hkv, D] (flash-attn's token-major cache) of the model's dtype, lengths
    ``cache_seqlens int32 [B]`` on the device. :meth:`append` stages the token in fixed buffers;
    :meth:`attend` hands them to ``flash_attn_with_kvcache``, which writes them at
    ``cache_seqlens`` and attends over ``cache_seqlens + 1`` tokens, then advances the lengths on
    the device. No host work depends on the length, so append + attend is graph-capturable."""

    name = "flash-attn"
    bits = 16
    graph_capturable = True

    def missing(self) -> str | None:
        return cuda_package_missing(self.device, "flash-attn", "flash_attn", "flash-attn")

    def version(self) -> str:
        return dist_version("flash-attn") or dist_version("flash_attn") or "not installed"

    def bytes_per_token(self) -> float:
        return 2 * self.kv_heads * self.head_dim * self.dtype.itemsize

    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        shape = (self.batch, self.capacity, self.kv_heads, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)  # as in preallocated.py
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.k_cache[:, : k.shape[2]] = k.transpose(1, 2)
        self.v_cache[:, : v.shape[2]] = v.transpose(1, 2)
        self.cache_seqlens = torch.full((self.batch,), k.shape[2], dtype=torch.int32, device=self.device)
        self._k_new = torch.empty(self.batch, 1, self.kv_heads, self.head_dim, dtype=self.dtype, device=self.device)
        self._v_new = torch.empty_like(self._k_new)
        self._staged = False  # a token waits in _k_new/_v_new for the next attend

    def _write_staged(self) -> None:
        """Write the staged token at cache_seqlens without attending (two appends in a row)."""
        rows = torch.arange(self.batch, device=self.device)
        pos = self.cache_seqlens.long()
        self.k_cache[rows, pos] = self._k_new[:, 0]
        self.v_cache[rows, pos] = self._v_new[:, 0]
        self.cache_seqlens.add_(1)

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if self._staged:
            self._write_staged()
        self._k_new[:, 0].copy_(k)
        self._v_new[:, 0].copy_(v)
        self._staged = True

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        from flash_attn import flash_attn_with_kvcache

        new = {"k": self._k_new, "v": self._v_new} if self._staged else {}
        out = flash_attn_with_kvcache(q[:, None], self.k_cache, self.v_cache, cache_seqlens=self.cache_seqlens,
                                      softmax_scale=self.sm_scale, **new)
        if self._staged:
            self.cache_seqlens.add_(1)  # the call wrote the token but leaves the lengths to the caller
            self._staged = False
        return out[:, 0]
