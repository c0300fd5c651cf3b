"""Where Triton kernels run: compiled on a CUDA device, or in the Triton interpreter.

Importing this module before any ``@triton.jit`` kernel is defined sets
``TRITON_INTERPRET=1`` when no CUDA device exists and the variable is unset, so
that the same kernels run on CPU tensors. An explicit ``TRITON_INTERPRET=0`` or
``=1`` in the environment always wins.
"""

from __future__ import annotations

import contextlib
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def triton_interpreted() -> bool:
    """True when Triton kernels run in the interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def run_mode() -> str:
    """``"gpu"`` when compiled kernels run on a CUDA device, else ``"interpreter"``."""
    return "gpu" if torch.cuda.is_available() and not triton_interpreted() else "interpreter"


def on_device(device: torch.device):
    """Make ``device`` current for kernel launches (Triton and raw CUDA launch on the current
    device, not on their tensors' device); a no-op context for CPU tensors."""
    if device.type != "cuda" or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()  # already current (entering the device's context costs a few us)
    return torch.cuda.device(device)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (for grids sized to the GPU); 1 for CPU tensors."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
