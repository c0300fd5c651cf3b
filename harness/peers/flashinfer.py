"""FlashInfer's paged decode (``BatchDecodeWithPagedKVCacheWrapper``, plan then run) over a
vLLM-style page pool with fp16/bf16 or fp8 (e4m3) K/V: what a vLLM or SGLang user runs. The
layout itself is :mod:`harness.peers.paged`; flashinfer is imported only here, when it is used."""

from __future__ import annotations

import torch

from . import paged
from .base import Peer, cuda_package_missing, dist_version
from .serving import Server

KVS = ("fp16", "fp8")  # "fp16": K/V stored in the model's dtype (fp16 or bf16)
PAGE_SIZE = 16  # vLLM's default block size
WORKSPACE_BYTES = 128 << 20  # the float workspace FlashInfer's examples allocate
HEAD_DIMS = (64, 128, 256, 512)  # what its kernels dispatch on (flashinfer/utils.cuh, DISPATCH_HEAD_DIM)


class FlashInferMethod:
    """What the FlashInfer peer and server share: the K/V storage (``kv``: the model's dtype, or
    float8 e4m3 with one scale per K and per V), the page size, whether FlashInfer runs here and
    its version. Mixed into a Peer or a Server, whose problem it reads."""

    def _init_kv(self, kv: str, page_size: int) -> None:
        if kv not in KVS:
            raise ValueError(f"kv must be one of {KVS}; got {kv!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size must be a positive int; got {page_size!r}")
        self.kv, self.page_size = kv, page_size
        self.name = f"flashinfer-{kv}"
        self.bits = 8 if kv == "fp8" else 16
        self.kv_dtype = paged.FP8 if kv == "fp8" else self.dtype
        self.k_scale = self.v_scale = None  # fp16 K/V pass none: a v_scale makes run scale the output again

    def missing(self) -> str | None:
        if self.head_dim not in HEAD_DIMS:
            return f"FlashInfer's kernels take head_dim {', '.join(map(str, HEAD_DIMS))}; got {self.head_dim}"
        return cuda_package_missing(self.device, "FlashInfer", "flashinfer", "flashinfer-python")

    def version(self) -> str:
        return dist_version("flashinfer-python") or "not installed"

    def bytes_per_token(self) -> float:
        return 2 * self.kv_heads * self.head_dim * self.kv_dtype.itemsize

    def _store(self, x: torch.Tensor, scale: float | None) -> torch.Tensor:
        return paged.to_fp8(x, scale) if self.kv == "fp8" else x


class FlashInferPeer(FlashInferMethod, Peer):
    """K/V in two NHD page pools [B * pages_per_seq, page_size, Hkv, D] (the model's dtype, or
    float8 e4m3 with one scale per K and per V set at load); an append writes each sequence's token
    at its slot (positions on the device); attend re-plans when the length changed since the last
    plan (host work, as vLLM does every step) and runs. The plan runs on the host, so the step is
    not graph-capturable as is."""

    def __init__(self, *args, kv: str = "fp16", page_size: int = PAGE_SIZE, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_kv(kv, page_size)
        self.pages_per_seq = paged.pages_for(self.capacity, page_size)

    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        import flashinfer

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
            table = paged.page_table([self.length] * self.batch, self.page_size, self.pages_per_seq)
            args, kwargs = paged.plan_args(table, self.page_size, self.q_heads, self.kv_heads, self.head_dim,
                                           self.dtype, self.kv_dtype, self.sm_scale)
            self._wrapper.plan(*args, **kwargs)
            self._planned = self.length
        # k_scale folds into the softmax scale, v_scale multiplies the output (flashinfer's run)
        return self._wrapper.run(q, (self.k_pool, self.v_pool), k_scale=self.k_scale, v_scale=self.v_scale)


class FlashInferServer(FlashInferMethod, Server):
    """FlashInfer serving a ragged batch as vLLM and SGLang run it: K/V in two NHD page pools
    [pages, page_size, Hkv, D] (the model's dtype, or float8 e4m3 with one scale per K and per V,
    set from the first prompt, as a per-layer scale is: a later value past twice that prompt's
    largest saturates at e4m3's 448), pages handed out as tokens reach them and
    taken back when a sequence ends (:class:`harness.peers.paged.PagePool`); each step writes every
    sequence's token through a slot mapping built on the host (one copy to the device), plans the
    decode for the new lengths (host work, every step) and runs it."""

    def __init__(self, *args, kv: str = "fp16", page_size: int = PAGE_SIZE, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_kv(kv, page_size)

    def _nbytes(self) -> int:
        return 2 * self.k_pool.numel() * self.k_pool.element_size()

    def _start(self) -> None:
        import flashinfer

        per_seq = paged.pages_for(self.max_len, self.page_size)
        self.pool = paged.PagePool(self.max_seqs * per_seq, self.page_size, self.max_seqs, per_seq)
        shape = (self.pool.num_pages, self.page_size, self.kv_heads, self.head_dim)
        self.k_pool = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")

    def _write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Tokens k, v [T, Hkv, D] at pool slots int64 [T] (host), copied to the device unsynchronized."""
        if self.device.type == "cuda":
            slots = slots.pin_memory().to(self.device, non_blocking=True)
        for pool, x, scale in ((self.k_pool, k, self.k_scale), (self.v_pool, v, self.v_scale)):
            flat, x = pool.view(-1, *pool.shape[2:]), self._store(x, scale)
            if flat.dtype == paged.FP8:  # as bytes: index_put_ need not take float8 on every device
                flat, x = flat.view(torch.uint8), x.view(torch.uint8)
            flat[slots] = x

    def _add(self, row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.kv == "fp8" and self.k_scale is None:
            self.k_scale, self.v_scale = paged.fp8_scale(k), paged.fp8_scale(v)
        n = k.shape[1]
        self._write(self.pool.slots([row], [0], [n]), k.transpose(0, 1), v.transpose(0, 1))

    def _free(self, row: int, last: int) -> None:
        self.pool.release(row, last)

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        n = len(self._lens)
        self._write(self.pool.slots(range(n), self._lens, [1] * n), k, v)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        args, kwargs = paged.plan_args(self.pool.page_table(self._lens), self.page_size, self.q_heads,
                                       self.kv_heads, self.head_dim, self.dtype, self.kv_dtype, self.sm_scale)
        self._wrapper.plan(*args, **kwargs)  # the lengths changed: every step re-plans, as vLLM's does
        return self._wrapper.run(q, (self.k_pool, self.v_pool), k_scale=self.k_scale, v_scale=self.v_scale)
