"""torch's scaled_dot_product_attention over a preallocated fp16/bf16 cache, one backend chosen
with ``torch.nn.attention.sdpa_kernel``: what a plain PyTorch decode loop runs."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from .preallocated import PreallocatedPeer

BACKENDS = ("flash", "cudnn", "efficient", "math")
CUDA_ONLY = ("flash", "cudnn")  # the CUDA kernels these name; torch's CPU "flash" is another kernel


def sdpa_backend(backend: str):
    """The ``SDPBackend`` member a backend name selects."""
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]


class SdpaPeer(PreallocatedPeer):
    """SDPA with one backend over the tokens so far: q [B, Hq, 1, D] against k, v [B, Hkv, n, D]
    (views of the cache, no copy), GQA through ``enable_gqa``. A graph of it would attend a fixed
    length (SDPA takes no device-side length), so it is not graph-capturable as is."""

    def __init__(self, backend: str, *args, **kwargs):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        super().__init__(*args, **kwargs)
        self.backend = backend
        self.name = f"sdpa-{backend}"
        self._backends = [sdpa_backend(backend)]

    def missing(self) -> str | None:
        if self.backend in CUDA_ONLY and self.device.type != "cuda":
            return f"SDPA's {self.backend} backend needs a CUDA device (device is {self.device})"
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        # whether this torch's backend takes this dtype, head_dim and GQA here: a two-token probe
        q = torch.zeros(1, self.q_heads, 1, self.head_dim, dtype=self.dtype, device=self.device)
        kv = torch.zeros(1, self.kv_heads, 2, self.head_dim, dtype=self.dtype, device=self.device)
        try:
            with warnings.catch_warnings():  # torch warns why each backend declined; the reason says it
                warnings.simplefilter("ignore")
                self._sdpa(q, kv, kv)
        except RuntimeError as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return (f"torch {torch.__version__}'s SDPA {self.backend} backend cannot run {self.dtype} "
                    f"q_heads={self.q_heads} kv_heads={self.kv_heads} head_dim={self.head_dim} on "
                    f"{self.device}: {why}")
        return None

    def version(self) -> str:
        return str(torch.__version__)  # a str: torch.__version__ is a TorchVersion, which xdist cannot send

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(self._backends):
            return F.scaled_dot_product_attention(q, k, v, scale=self.sm_scale,
                                                  enable_gqa=self.q_heads != self.kv_heads)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        n = self.length
        return self._sdpa(q[:, :, None], self.k_cache[:, :, :n], self.v_cache[:, :, :n])[:, :, 0]
