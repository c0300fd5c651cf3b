"""The version legs: the torch/triton (and, on a GPU, CUDA) stacks every session runs on.

Declared here once; ``noxfile.py``, the pipeline (``harness.run.pipeline``), the command lines
of ``harness.run.commands`` and the GitHub workflows (``python -m harness.run.commands matrix
gpu``) all read them from here. Nothing here imports torch or needs a GPU.

- ``INTERPRETER_LEGS``: CPU legs of ``nox -s tests``, one triton release each,
  all with the CPU build of ``CPU_TORCH``, kernels in the Triton interpreter.
- ``GPU_LEGS``: (torch, triton, CUDA) stacks of ``nox -s gpu_verify`` and
  ``nox -s container``, each pair the triton release that torch itself pins,
  each CUDA base matching the CUDA build of that torch (``load_inline``
  refuses an nvcc whose major version differs from torch's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CPU_TORCH = "2.13.0"
TORCH_INDEX = "https://download.pytorch.org/whl/{tag}"
CUDA_IMAGE = "nvidia/cuda:{cuda}-devel-ubuntu24.04"
IMAGE_NAME = "kvbits-gpu"


@dataclass(frozen=True)
class InterpreterLeg:
    """One CPU leg: the CPU build of torch with one triton release, kernels interpreted."""

    triton: str
    torch: str = CPU_TORCH

    @property
    def name(self) -> str:
        return stack_leg_name(self.torch, self.triton, gpu=False)

    @property
    def session(self) -> str:
        return f"tests(triton={self.triton!r})"


@dataclass(frozen=True)
class GpuLeg:
    """One GPU leg: a torch CUDA build, the triton release it pins, and its CUDA base image."""

    torch: str
    triton: str
    cuda: str  # CUDA toolkit of the base image, e.g. "13.0.1"
    index: str  # tag of the torch wheel index, e.g. "cu130"

    @property
    def name(self) -> str:
        return stack_leg_name(self.torch, self.triton, gpu=True)

    @property
    def params(self) -> str:
        return f"torch={self.torch!r}, triton={self.triton!r}"

    @property
    def session(self) -> str:
        return f"gpu_verify({self.params})"

    @property
    def container_session(self) -> str:
        return f"container({self.params})"

    @property
    def torch_index_url(self) -> str:
        return TORCH_INDEX.format(tag=self.index)

    @property
    def cuda_image(self) -> str:
        return CUDA_IMAGE.format(cuda=self.cuda)

    @property
    def image(self) -> str:
        return f"{IMAGE_NAME}:torch{self.torch}-triton{self.triton}-cuda{self.cuda}"


INTERPRETER_LEGS: tuple[InterpreterLeg, ...] = (
    InterpreterLeg("3.4.0"),  # the oldest release pyproject admits
    InterpreterLeg("3.6.0"),  # the release of the reference H200 stack
    InterpreterLeg("3.9.0"),  # the newest release on PyPI
)

GPU_LEGS: tuple[GpuLeg, ...] = (
    GpuLeg("2.8.0", "3.4.0", "12.8.1", "cu128"),
    GpuLeg("2.11.0", "3.6.0", "13.0.1", "cu130"),  # the reference H200 stack (docs/design.md section 9)
    GpuLeg("2.14.1", "3.8.0", "13.0.1", "cu130"),
)


def compile_triton_versions() -> tuple[str, ...]:
    """Every triton release named by either table, oldest first."""
    versions = {leg.triton for leg in INTERPRETER_LEGS} | {leg.triton for leg in GPU_LEGS}
    return tuple(sorted(versions, key=lambda v: tuple(int(p) for p in v.split("."))))


def interpreter_leg(triton: str) -> InterpreterLeg:
    for leg in INTERPRETER_LEGS:
        if leg.triton == triton:
            return leg
    raise ValueError(f"no interpreter leg for triton {triton!r}; legs: {[leg.triton for leg in INTERPRETER_LEGS]}")


def gpu_leg(torch: str, triton: str) -> GpuLeg:
    for leg in GPU_LEGS:
        if (leg.torch, leg.triton) == (torch, triton):
            return leg
    raise ValueError(f"no GPU leg for torch {torch!r} / triton {triton!r}; legs: {[leg.name for leg in GPU_LEGS]}")


def stack_leg_name(torch: str, triton: str, *, gpu: bool) -> str:
    """The one name of a torch/triton stack's leg, ``cpu-torch2.13.0-triton3.9.0``, whether the
    versions are a leg's pins or those installed (a ``--no-venv`` run, ``nox -s verify``): the
    local build label of an installed version (``2.13.0+cpu``, ``2.11.0+cu130``) is dropped, so
    that every session that runs the same stack names it alike."""
    return f"{'gpu' if gpu else 'cpu'}-torch{_public(torch)}-triton{_public(triton)}"


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def interpreter_leg_for(torch: str, triton: str | None) -> InterpreterLeg | None:
    """The interpreter leg whose pins are exactly ``torch`` and ``triton``, if any."""
    return next((leg for leg in INTERPRETER_LEGS if (leg.torch, leg.triton) == (torch, triton)), None)


LEG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def leg_name(text: str) -> str:
    """A version-leg name as given on the command line: letters, digits and ``._+-``, starting with
    a letter or digit (it names directories under the reports folder)."""
    if not LEG_NAME.fullmatch(text):
        raise ValueError(f"a leg name is letters, digits and ._+- starting with a letter or digit; got {text!r}")
    return text
