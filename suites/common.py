"""Helpers every suite shares."""

from __future__ import annotations

import torch

from kvbits._runtime import triton_interpreted


def triton_skip_reason(device: str) -> str | None:
    """Why Triton cannot run on ``device`` in this process, or None when it can: CPU tensors need
    the interpreter (TRITON_INTERPRET=1), compiled Triton needs a GPU and the interpreter off."""
    if device == "cuda":
        if not torch.cuda.is_available():
            return "needs a CUDA device"
        if triton_interpreted():
            return "compiled Triton needs TRITON_INTERPRET unset or 0"
        return None
    if not triton_interpreted():
        return "Triton on CPU tensors needs the interpreter (TRITON_INTERPRET=1); this run compiles for the GPU"
    return None


def available_devices() -> list[str]:
    """Devices the suites run on: the CPU always, the GPU when there is one."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
