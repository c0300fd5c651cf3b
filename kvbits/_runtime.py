"""Where Triton kernels run: compiled on a CUDA device, or in the Triton interpreter.

Importing this module before any ``@triton.jit`` kernel is defined sets
``TRITON_INTERPRET=1`` when no CUDA device exists and the variable is unset, so
that the same kernels run on CPU tensors. An explicit ``TRITON_INTERPRET=0`` or
``=1`` in the environment always wins. Whatever was imported first (triton, or a
package that imports it, such as transformers), the interpreter then works:
see :func:`_interpret_triton_library`.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def triton_interpreted() -> bool:
    """True when Triton kernels run in the interpreter (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _interpret_triton_library() -> None:
    """Rebuild triton's own library for the interpreter when triton was imported before it was chosen.

    triton (3.4 through 3.9) decides at each ``@triton.jit`` decoration, from TRITON_INTERPRET as
    it reads then (``triton.knobs.runtime.interpret``), whether the function is compiled
    (``JITFunction``) or interpreted (``InterpretedFunction``); nothing decides it again at launch.
    kvbits' kernels are decorated after the variable is set above, but triton.language's own
    ``@triton.jit`` library (``tl.sum``, ``tl.max``, ``tl.cdiv``, ... and the same as ``tensor``
    methods) is decorated at ``import triton``: imported first with the variable unset, it is
    compiled-only, and an interpreted kernel calling it fails with "Cannot call @triton.jit'd
    outside of the scope of a kernel". Each such function of triton.language's modules and of its
    ``tensor`` class is replaced here by the ``InterpretedFunction`` of the same Python function,
    which is what ``import triton`` builds under TRITON_INTERPRET=1. Nothing is done when the
    library is already interpreted (triton imported after this module, or with the variable set).
    Kernels that other packages defined before kvbits was imported stay compiled.
    """
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    rebuilt: dict[int, InterpretedFunction] = {}

    def interpreted(value):
        if type(value) is not JITFunction:  # exactly: an InterpretedFunction is left as it is
            return None
        if id(value) not in rebuilt:
            rebuilt[id(value)] = InterpretedFunction(value.fn)
        return rebuilt[id(value)]

    namespaces = [module for name, module in list(sys.modules.items())
                  if module is not None and (name == tl.__name__ or name.startswith(tl.__name__ + "."))]
    for namespace in [*namespaces, tl.core.tensor]:
        for name, value in list(vars(namespace).items()):
            replacement = interpreted(value)
            if replacement is not None:
                setattr(namespace, name, replacement)


if triton_interpreted() and "triton" in sys.modules:
    _interpret_triton_library()


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
