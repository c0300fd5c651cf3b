"""Argument checks shared by every kernel wrapper.

Each check raises ``TypeError`` or ``ValueError`` naming the argument and what
was expected; nothing is silently reinterpreted.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ._runtime import triton_interpreted

BACKENDS = ("torch", "triton", "cuda")


def require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_dtype(name: str, tensor: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must have dtype {names}; got {str(tensor.dtype).replace('torch.', '')}")


def require_rank(name: str, tensor: torch.Tensor, rank: int | tuple[int, ...]) -> None:
    ranks = (rank,) if isinstance(rank, int) else tuple(rank)
    if tensor.dim() not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(f"{name} must have {want} dimensions; got shape {tuple(tensor.shape)}")


def require_int(name: str, value, allowed: Iterable[int] | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if allowed is not None:
        allowed = tuple(allowed)
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}; got {value}")
    return value


def require_choice(name: str, value, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
    return value


def require_same_device(**tensors: torch.Tensor) -> torch.device:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    for name, dev in devices.items():
        if dev != first:
            listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
            raise ValueError(f"tensors must share one device; got {listing} ({name} differs)")
    return first


def require_finite(name: str, tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} contains NaN or Inf; quantization needs finite values")


def resolve_backend(backend: str | None, device: torch.device, supported: Iterable[str] = BACKENDS) -> str:
    """Pick or check a backend for tensors on ``device``.

    ``None`` picks the compiled kernels on a GPU (``triton``, else ``cuda``, else ``torch``,
    the first that ``supported`` lists) and the torch reference on CPU (the interpreter
    is a checking tool, far slower than torch). An explicit choice is checked against
    the device and the interpreter mode.
    """
    supported = tuple(supported)
    if backend is None:
        if device.type == "cuda":
            for choice in ("triton", "cuda", "torch"):
                if choice in supported:
                    return choice
        return "torch"
    require_choice("backend", backend, supported)
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(f"backend='cuda' needs tensors on a CUDA device; got tensors on {device}")
    if backend == "triton":
        if device.type == "cpu" and not triton_interpreted():
            raise ValueError(
                "backend='triton' on CPU tensors needs the Triton interpreter "
                "(TRITON_INTERPRET=1 set before kernels are imported); move the tensors to a GPU"
            )
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"backend='triton' supports CPU (interpreter) or CUDA tensors; got {device}")
        if device.type == "cuda" and triton_interpreted():
            raise ValueError("backend='triton' on CUDA tensors cannot run while TRITON_INTERPRET=1 is set")
    return backend
