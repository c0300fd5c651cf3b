"""The interface every peer adapter keeps: what the decode benchmarks time kvbits against.

A peer holds one attention layer's K/V cache for ``batch`` sequences of equal length in the
peer's own storage and API. The benchmark calls :meth:`Peer.load` with the prompt, then per step
:meth:`Peer.append` (one token per sequence) and :meth:`Peer.attend` (one query token per
sequence). The public methods check their arguments (``TypeError``/``ValueError`` naming the
argument) and hand over to the subclass's ``_load``/``_append``/``_attend``. A graph-capturable
peer's step (append + attend) may be captured in one CUDA graph and replayed; :meth:`Peer.replayed`
then tells it the length the replays reached.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod

import torch

from harness.run.env import dist_version  # noqa: F401  (the peers' modules take it from here)
from kvbits._checks import require_dtype, require_int, require_rank, require_tensor

DTYPES = (torch.float16, torch.bfloat16)  # the model dtypes a peer is asked to serve



def cuda_package_missing(device: torch.device, label: str, module: str, dist: str) -> str | None:
    """Why a peer that runs only on CUDA, through ``module`` of distribution ``dist``, cannot run
    on ``device`` (``label`` names it), or None when it can."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"{label} needs a CUDA device (device is {device})"
    try:
        importlib.import_module(module)
    except ImportError as e:
        return f"{dist} is not installed or does not import ({e}): pip install kvbits[peers]"
    return None


class Method(ABC):
    """What every decode method says of itself, as a peer (:class:`Peer`) or a serving batch's
    server (:class:`harness.peers.serving.Server`)."""

    name: str = "method"
    bits: int = 16  # bits per stored K/V element

    @abstractmethod
    def missing(self) -> str | None:
        """None when the method can run here, else why not (the package/version or device missing)."""

    @abstractmethod
    def version(self) -> str:
        """The method's package version, for the report's environment table."""

    @abstractmethod
    def bytes_per_token(self) -> float:
        """Bytes the method stores per token of one sequence, across the K/V heads of one layer."""


class Peer(Method):
    """One layer's K/V cache and decode attention in a peer's storage.

    Constructed with the problem only (nothing allocated: :meth:`missing` can be asked first):
    ``batch`` sequences, ``q_heads`` query heads over ``kv_heads`` K/V heads (GQA, ``q_heads %
    kv_heads == 0``) of ``head_dim`` channels, at most ``capacity`` tokens per sequence, K/V/q in
    ``dtype`` (fp16 or bf16) on ``device``. The softmax scale is ``1 / sqrt(head_dim)``.
    """

    name: str = "peer"
    graph_capturable: bool = False  # append + attend capturable in one CUDA graph as is

    def __init__(self, batch: int, q_heads: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float16, device: str | torch.device = "cpu"):
        check_problem(batch=batch, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, capacity=capacity,
                      dtype=dtype)
        self.batch, self.q_heads, self.kv_heads = batch, q_heads, kv_heads
        self.head_dim, self.capacity, self.dtype = head_dim, capacity, dtype
        self.device = torch.device(device)
        self.sm_scale = 1.0 / math.sqrt(head_dim)
        self.length = 0  # tokens per sequence so far

    # --- what a subclass provides (and Method's missing, version, bytes_per_token) ---------------

    @abstractmethod
    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None: ...

    @abstractmethod
    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None: ...

    @abstractmethod
    def _attend(self, q: torch.Tensor) -> torch.Tensor: ...

    # --- the checked calls the benchmark makes ------------------------------------------------

    def load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Start every sequence with a prompt: k, v [B, Hkv, S, D] in ``dtype``, 1 <= S <= capacity.
        Replaces whatever the cache held."""
        for arg, t in (("k", k), ("v", v)):
            self._check(arg, t, (self.batch, self.kv_heads, None, self.head_dim))
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
        if not 1 <= k.shape[2] <= self.capacity:
            raise ValueError(f"k's prompt length must be in 1..capacity ({self.capacity}); got {k.shape[2]}")
        self._load(k, v)
        self.length = k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append one token to every sequence: k, v [B, Hkv, D] in ``dtype``."""
        for arg, t in (("k", k), ("v", v)):
            self._check(arg, t, (self.batch, self.kv_heads, self.head_dim))
        if self.length == 0:
            raise RuntimeError(f"{self.name}: load a prompt before append")
        if self.length >= self.capacity:
            raise ValueError(f"{self.name}: capacity ({self.capacity} tokens) reached; k cannot be appended")
        self._append(k, v)
        self.length += 1

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Attention of one query token per sequence over its tokens so far: q [B, Hq, D] in
        ``dtype`` -> [B, Hq, D] in q's dtype."""
        self._check("q", q, (self.batch, self.q_heads, self.head_dim))
        if self.length == 0:
            raise RuntimeError(f"{self.name}: load a prompt before attend")
        return self._attend(q)

    def replayed(self, length: int) -> None:
        """Tell a graph-capturable peer that replays of a captured :meth:`append` + :meth:`attend`
        left every sequence at ``length`` tokens (1 <= length <= capacity). The host sees no
        replay, and counted the capture's append though the capture ran nothing: this sets
        :attr:`length` to what the device holds (a subclass that keeps host state of the length
        extends it), so that later appends and attends go on from there."""
        if not self.graph_capturable:
            raise RuntimeError(f"{self.name} is not graph-capturable: no step of it was replayed")
        if require_int("length", length) < 1 or length > self.capacity:
            raise ValueError(f"length must be in 1..capacity ({self.capacity}); got {length}")
        if self.length == 0:
            raise RuntimeError(f"{self.name}: load a prompt before replaying a step")
        self.length = length

    def _check(self, arg: str, t, shape: tuple[int | None, ...]) -> None:
        check_tokens(arg, t, shape, self.dtype, self.device)


def check_problem(*, dtype: torch.dtype, **sizes: int) -> None:
    """The sizes of a peer's or a server's problem positive ints (``q_heads`` a multiple of
    ``kv_heads``), ``dtype`` one of DTYPES: TypeError/ValueError naming the argument otherwise."""
    for arg, value in sizes.items():
        if require_int(arg, value) <= 0:
            raise ValueError(f"{arg} must be positive; got {value}")
    if sizes["q_heads"] % sizes["kv_heads"]:
        raise ValueError(f"q_heads ({sizes['q_heads']}) must be a multiple of kv_heads ({sizes['kv_heads']})")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be torch.float16 or torch.bfloat16; got {dtype}")


def check_tokens(arg: str, t, shape: tuple[int | None, ...], dtype: torch.dtype, device: torch.device) -> None:
    """t a tensor of ``dtype`` on ``device``'s type with ``shape`` (None: any size there)."""
    require_tensor(arg, t)
    require_rank(arg, t, len(shape))
    if any(want is not None and got != want for got, want in zip(t.shape, shape, strict=True)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{arg} must have shape [{want}]; got {tuple(t.shape)}")
    require_dtype(arg, t, (dtype,))
    if t.device.type != device.type:
        raise ValueError(f"{arg} must be on {device}; got {t.device}")
