"""FlashInfer's paged decode (``BatchDecodeWithPagedKVCacheWrapper``, plan then run) over a
vLLM-style page pool with fp16/bf16 or fp8 (e4m3) K/V: what a vLLM or SGLang user runs. The
layout itself is :mod:`harness.peers.paged`; flashinfer is imported only here, when it is used."""

from __future__ import annotations

import torch

from . import paged
from .base import Peer, cuda_package_missing, dist_version

KVS = ("fp16", "fp8")  # "fp16": K/V stored in the model's dtype (fp16 or bf16)
PAGE_SIZE = 16  # vLLM's default block size
WORKSPACE_BYTES = 128 << 20  # the float workspace FlashInfer's examples allocate


class FlashInferPeer(Peer):
    """K/V in two NHD page pools [B * pages_per_seq, page_size, Hkv, D] (the model's dtype, or
    float8 e4m3 with one scale per K and per V set at load); an append writes each sequence's token
    at its slot (positions on the device); attend re-plans when the length changed since the last
    plan (host work, as vLLM does every step) and runs. The plan runs on the host, so the step is
    not graph-capturable as is."""

    def __init__(self, *args, kv: str = "fp16", page_size: int = PAGE_SIZE, **kwargs):
        if kv not in KVS:
            raise ValueError(f"kv must be one of {KVS}; got {kv!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive int; got {page_size!r}")
        super().__init__(*args, **kwargs)
        self.kv, self.page_size = kv, page_size
        self.name = f"flashinfer-{kv}"
        self.bits = 8 if kv == "fp8" else 16
        self.kv_dtype = paged.FP8 if kv == "fp8" else self.dtype
        self.pages_per_seq = paged.pages_for(self.capacity, page_size)

    def missing(self) -> str | None:
        return cuda_package_missing(self.device, "FlashInfer", "flashinfer", "flashinfer-python")

    def version(self) -> str:
        return dist_version("flashinfer-python") or "not installed"

    def bytes_per_token(self) -> float:
        return 2 * self.kv_heads * self.head_dim * self.kv_dtype.itemsize

    def _store(self, x: torch.Tensor, scale: float | None) -> torch.Tensor:
        return paged.to_fp8(x, scale) if self.kv == "fp8" else x

    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        import flashinfer

        # fp16 K/V pass no scales: a v_scale makes run scale the output in one more launch
        self.k_scale = paged.fp8_scale(k) if self.kv == "fp8" else None
        self.v_scale = paged.fp8_scale(v) if self.kv == "fp8" else None
        self.k_pool = paged.to_pages(self._store(k, self.k_scale), self.page_size, self.pages_per_seq)
        self.v_pool = paged.to_pages(self._store(v, self.v_scale), self.page_size, self.pages_per_seq)
        self._first = paged.first_pages(self.batch, self.pages_per_seq, self.device)
        self._positions = torch.full((self.batch,), k.shape[2], dtype=torch.int64, device=self.device)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        self._planned = 0  # the length the wrapper was planned for

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # fp8: the cast is a kernel of its own before the write (vLLM fuses it into the write)
        paged.write_token(self.k_pool, self._store(k, self.k_scale), self._first, self._positions)
        paged.write_token(self.v_pool, self._store(v, self.v_scale), self._first, self._positions)
        self._positions.add_(1)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        if self._planned != self.length:
            args, kwargs = paged.plan_args([self.length] * self.batch, self.page_size, self.pages_per_seq,
                                           self.q_heads, self.kv_heads, self.head_dim, self.dtype,
                                           self.kv_dtype, self.sm_scale)
            self._wrapper.plan(*args, **kwargs)
            self._planned = self.length
        # k_scale folds into the softmax scale, v_scale multiplies the output (flashinfer's run)
        return self._wrapper.run(q, (self.k_pool, self.v_pool), k_scale=self.k_scale, v_scale=self.v_scale)
