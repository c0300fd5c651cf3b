"""A serving batch in a peer's storage: sequences of different lengths that join with a prompt,
grow by one token per step and leave, the way a decoding server runs them.

:class:`Server` is the interface (the serving counterpart of :class:`harness.peers.base.Peer`):
:meth:`Server.add_sequence` starts a sequence with its prompt, :meth:`Server.append` writes one
token to every live sequence, :meth:`Server.attend` attends one query per live sequence over its
own tokens, :meth:`Server.free` ends one. Live sequences occupy rows 0..n-1 in
:attr:`Server.sequences` order (k, v and q of a step follow it); freeing one moves the last row
into its place, as a persistent batch (and :class:`kvbits.PagedKVCache`) does. The public
methods check their arguments and the room left; the subclass does the storage's work.

:class:`SdpaServer` is what plain PyTorch offers: one preallocated fp16/bf16 slot per sequence,
the step's tokens written with one indexed store, and one SDPA call per sequence (torch has no
ragged decode call). FlashInfer's paged server is in :mod:`harness.peers.flashinfer`.
"""

from __future__ import annotations

import math
from abc import abstractmethod

import torch

from .base import Method, check_problem, check_tokens
from .sdpa import SdpaMethod


class Server(Method):
    """One attention layer's K/V for up to ``max_seqs`` live sequences of at most ``max_len``
    tokens each: ``q_heads`` query heads over ``kv_heads`` K/V heads of ``head_dim`` channels,
    in ``dtype`` (fp16 or bf16) on ``device``; softmax scale ``1 / sqrt(head_dim)``. Nothing is
    allocated until :meth:`start` (so :meth:`missing` can be asked first)."""

    name: str = "server"

    def __init__(self, max_seqs: int, q_heads: int, kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype = torch.float16, device: str | torch.device = "cpu"):
        check_problem(max_seqs=max_seqs, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, max_len=max_len,
                      dtype=dtype)
        self.max_seqs, self.q_heads, self.kv_heads = max_seqs, q_heads, kv_heads
        self.head_dim, self.max_len, self.dtype = head_dim, max_len, dtype
        self.device = torch.device(device)
        self.sm_scale = 1.0 / math.sqrt(head_dim)
        self._ids: list[int] = []  # sequence id of each live row
        self._lens: list[int] = []  # tokens of each live row
        self._next_id = 0
        self._started = False

    # --- what a subclass provides (and Method's missing, version, bytes_per_token) ---------------

    @abstractmethod
    def _nbytes(self) -> int:
        """Device bytes of the storage :meth:`start` allocated."""

    @abstractmethod
    def _start(self) -> None:
        """Allocate the storage for max_seqs sequences of max_len tokens."""

    @abstractmethod
    def _add(self, row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a new sequence's prompt k, v [Hkv, S, D] in row ``row`` (the rows before it live)."""

    @abstractmethod
    def _free(self, row: int, last: int) -> None:
        """Release row ``row``'s storage; row ``last`` (the last live one) then moves into it
        (row == last: nothing moves). The host lists are the caller's."""

    @abstractmethod
    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write token k[r], v[r] [Hkv, D] at the end of every live row r (lengths: the host's
        before the step)."""

    @abstractmethod
    def _attend(self, q: torch.Tensor) -> torch.Tensor: ...

    def check_errors(self) -> None:
        """Raise for what the device found since the last check (a subclass whose kernels flag
        errors on the device); nothing to find here."""
        return None

    # --- the checked calls --------------------------------------------------------------------

    @property
    def sequences(self) -> list[int]:
        """Ids of the live sequences, in row order."""
        return list(self._ids)

    def lengths(self) -> list[int]:
        """Tokens of each live sequence, in row order."""
        return list(self._lens)

    def nbytes(self) -> int:
        """Device bytes of the storage (0 before :meth:`start` allocates it)."""
        return self._nbytes() if self._started else 0

    def start(self) -> None:
        """Allocate the storage (once; raises ValueError where :meth:`missing` says why not)."""
        if self._started:
            return
        reason = self.missing()
        if reason is not None:
            raise ValueError(f"{self.name} cannot run here: {reason}")
        self._start()
        self._started = True

    def add_sequence(self, k: torch.Tensor, v: torch.Tensor) -> int:
        """Start a sequence with a prompt k, v [Hkv, S, D] (1 <= S < max_len); returns its id, it
        takes the next row. Raises (nothing changed) when every row is taken."""
        self.start()
        for arg, t in (("k", k), ("v", v)):
            self._check(arg, t, (self.kv_heads, None, self.head_dim))
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
        if not 1 <= k.shape[1] < self.max_len:
            raise ValueError(f"k's prompt length must be in 1..max_len - 1 ({self.max_len - 1}); got {k.shape[1]}")
        if len(self._ids) == self.max_seqs:
            raise ValueError(f"{self.name} holds max_seqs={self.max_seqs} sequences already; free one first")
        row = len(self._ids)
        self._add(row, k, v)
        self._ids.append(self._next_id)
        self._lens.append(k.shape[1])
        self._next_id += 1
        return self._ids[row]

    def free(self, seq_id: int) -> None:
        """End a live sequence; the last row moves into its row."""
        if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id not in self._ids:
            raise ValueError(f"seq_id {seq_id!r} is not a live sequence (live: {self._ids})")
        row, last = self._ids.index(seq_id), len(self._ids) - 1
        self._free(row, last)
        self._ids[row], self._lens[row] = self._ids[last], self._lens[last]
        del self._ids[last], self._lens[last]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append one token to every live sequence: k, v [n, Hkv, D], rows in :attr:`sequences`
        order. Raises (nothing changed) when a sequence has no room left."""
        n = len(self._ids)
        for arg, t in (("k", k), ("v", v)):
            self._check(arg, t, (n, self.kv_heads, self.head_dim))
        if n and max(self._lens) >= self.max_len:
            full = [i for i, m in zip(self._ids, self._lens, strict=True) if m >= self.max_len]
            raise ValueError(f"sequences {full} hold max_len={self.max_len} tokens: k cannot be appended")
        if n:
            self._append(k, v)
            self._lens = [m + 1 for m in self._lens]

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Attention of one query per live sequence over its tokens: q [n, Hq, D] -> [n, Hq, D]."""
        self._check("q", q, (len(self._ids), self.q_heads, self.head_dim))
        return self._attend(q) if self._ids else torch.empty_like(q)

    def _check(self, arg: str, t, shape: tuple[int | None, ...]) -> None:
        check_tokens(arg, t, shape, self.dtype, self.device)


class SdpaServer(SdpaMethod, Server):
    """Plain PyTorch serving: K/V in slots [max_seqs, Hkv, max_len, D] of ``dtype`` (a sequence
    keeps its slot until freed; a freed slot is reused), one indexed store per step for all
    sequences' tokens (slots and positions on the device) and one SDPA call with ``backend``
    per sequence over its own tokens."""

    def __init__(self, backend: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_backend(backend)
        self._slots: list[int] = []  # storage slot of each live row
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None  # (slots, positions) of the rows

    def bytes_per_token(self) -> float:
        return 2 * self.kv_heads * self.head_dim * self.dtype.itemsize

    def _nbytes(self) -> int:
        return 2 * self.k_slots.numel() * self.k_slots.element_size()

    def _start(self) -> None:
        shape = (self.max_seqs, self.kv_heads, self.max_len, self.head_dim)
        self.k_slots = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_slots = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._free_slots = list(range(self.max_seqs - 1, -1, -1))

    def _add(self, row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        slot = self._free_slots.pop()
        self.k_slots[slot, :, :k.shape[1]] = k
        self.v_slots[slot, :, :v.shape[1]] = v
        self._slots.append(slot)
        self._index = None

    def _free(self, row: int, last: int) -> None:
        self._free_slots.append(self._slots[row])
        self._slots[row] = self._slots[last]
        del self._slots[last]
        self._index = None

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if self._index is None:  # the batch changed: its slots and positions to the device once
            host = torch.tensor([self._slots, self._lens], dtype=torch.int64)
            on = host.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else host
            self._index = (on[0], on[1])
        slots, positions = self._index
        self.k_slots[slots, :, positions] = k
        self.v_slots[slots, :, positions] = v
        positions.add_(1)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        gqa = self.q_heads != self.kv_heads
        with sdpa_kernel(self._backends):
            outs = [F.scaled_dot_product_attention(q[row:row + 1, :, None], self.k_slots[slot:slot + 1, :, :n],
                                                   self.v_slots[slot:slot + 1, :, :n], scale=self.sm_scale,
                                                   enable_gqa=gqa)
                    for row, (slot, n) in enumerate(zip(self._slots, self._lens, strict=True))]
        return torch.cat(outs)[:, :, 0]
