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


def backend_missing(backend: str, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                    device: torch.device, sm_scale: float) -> str | None:
    """Why SDPA's ``backend`` cannot attend q_heads over kv_heads of head_dim in dtype on device
    (None when it can): the device, or what this torch's backend says to a two-token probe."""
    if backend in CUDA_ONLY and device.type != "cuda":
        return f"SDPA's {backend} backend needs a CUDA device (device is {device})"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device"
    from torch.nn.attention import sdpa_kernel

    q = torch.zeros(1, q_heads, 1, head_dim, dtype=dtype, device=device)
    kv = torch.zeros(1, kv_heads, 2, head_dim, dtype=dtype, device=device)
    try:
        with warnings.catch_warnings(), sdpa_kernel([sdpa_backend(backend)]):
            warnings.simplefilter("ignore")  # torch warns why each backend declined; the reason says it
            F.scaled_dot_product_attention(q, kv, kv, scale=sm_scale, enable_gqa=q_heads != kv_heads)
    except RuntimeError as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (f"torch {torch.__version__}'s SDPA {backend} backend cannot run {dtype} q_heads={q_heads} "
                f"kv_heads={kv_heads} head_dim={head_dim} on {device}: {why}")
    return None


class SdpaMethod:
    """What the SDPA peer and server share: the backend (checked, named), whether it runs here
    (:func:`backend_missing`) and torch's version. Mixed into a Peer or a Server, whose problem
    (heads, head_dim, dtype, device, sm_scale) it reads."""

    def _init_backend(self, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        self.backend = backend
        self.name = f"sdpa-{backend}"
        self._backends = [sdpa_backend(backend)]

    def missing(self) -> str | None:
        return backend_missing(self.backend, self.q_heads, self.kv_heads, self.head_dim, self.dtype, self.device,
                               self.sm_scale)

    def version(self) -> str:
        return str(torch.__version__)  # a str: torch.__version__ is a TorchVersion, which xdist cannot send


class SdpaPeer(SdpaMethod, PreallocatedPeer):
    """SDPA with one backend over the tokens so far: q [B, Hq, 1, D] against k, v [B, Hkv, n, D]
    (views of the cache, no copy), GQA through ``enable_gqa``. A graph of it would attend a fixed
    length (SDPA takes no device-side length), so it is not graph-capturable as is."""

    def __init__(self, backend: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(self._backends):
            return F.scaled_dot_product_attention(q, k, v, scale=self.sm_scale,
                                                  enable_gqa=self.q_heads != self.kv_heads)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        n = self.length
        return self._sdpa(q[:, :, None], self.k_cache[:, :, :n], self.v_cache[:, :, :n])[:, :, 0]
