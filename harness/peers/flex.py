"""FlexAttention decode over a preallocated fp16/bf16 cache: one query token against the whole
capacity, a block mask skipping the blocks past the current length."""

from __future__ import annotations

import torch

from .preallocated import PreallocatedPeer

KV_BLOCK = 128  # tokens per block of the block mask (flex_attention's default block size)


class FlexPeer(PreallocatedPeer):
    """``flex_attention`` with q [B, Hq, 1, D] against the cache [B, Hkv, capacity, D] (GQA through
    ``enable_gqa``). The mask reads the length from a device tensor, so the block mask is rebuilt
    only when the length enters a new KV block (every ``KV_BLOCK`` tokens), not every step; the
    rebuild is host work, so the step is not graph-capturable as is.

    On CUDA the call is ``torch.compile``d (the fused kernel); on CPU it runs eagerly: eager flex
    computes the same masked attention unfused, while compiling it on CPU takes tens of seconds of
    C++ compilation per shape, too slow for the CPU tests."""

    name = "flex"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mask = None
        self._mask_blocks = 0  # KV blocks the block mask lets through
        self._flex = None

    def missing(self) -> str | None:
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        return None

    def version(self) -> str:
        return str(torch.__version__)  # a str: torch.__version__ is a TorchVersion, which xdist cannot send

    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        super()._load(k, v)
        self._lens = torch.full((self.batch,), k.shape[2], dtype=torch.int32, device=self.device)
        lens = self._lens

        def within(b, h, q_idx, kv_idx):
            return kv_idx < lens[b]

        self._within = within  # one mask function per load: a compiled flex sees the same one
        self._mask, self._mask_blocks = None, 0
        if self._flex is None:
            self._flex = torch.compile(flex_attention) if self.device.type == "cuda" else flex_attention

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        super()._append(k, v)
        self._lens.add_(1)  # on the device: no host synchronization

    def _block_mask(self):
        from torch.nn.attention.flex_attention import create_block_mask

        blocks = -(-self.length // KV_BLOCK)
        if blocks != self._mask_blocks:
            # blocks past the length now are empty; the block holding it stays partial and its
            # mask reads lens when run, so the mask holds until the length enters the next block
            self._mask = create_block_mask(self._within, self.batch, None, 1, self.capacity,
                                           device=self.device, BLOCK_SIZE=KV_BLOCK)
            self._mask_blocks = blocks
        return self._mask

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        out = self._flex(q[:, :, None], self.k_cache, self.v_cache, block_mask=self._block_mask(),
                         scale=self.sm_scale, enable_gqa=self.q_heads != self.kv_heads)
        return out[:, :, 0]
