"""kvbits among its peers: this project's paged cache behind the peers' interface
(:class:`harness.peers.base.Peer`), and the figures of one peer at one shape, timed by the same
code for every peer (suites/decode_loop_support.py).

- :class:`KvbitsPeer`: :class:`kvbits.PagedKVCache` (2, 3 or 4 bits) as a peer.
- :data:`METHODS`: every peer of :data:`harness.peers.PEERS` and kvbits2, kvbits3, kvbits4.
- :class:`KvbitsServer` and :data:`SERVING_METHODS`: the same for a serving batch
  (:data:`harness.peers.SERVERS`, timed by decode_loop_support.serving_batch).
- :func:`activation_errors`: a method's attention error on a real model's K/V.
- :func:`measure`: one case's figures (decode step eager and under a CUDA graph, the frozen
  cache's attend, attention error on plain K and on K with outlier channels, bits, bytes per token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch

from harness.measure.timing import classify_bound
from harness.peers import PEERS, SERVERS, Peer
from harness.peers.base import dist_version
from harness.peers.serving import Server
from kvbits._checks import require_int, require_rank, require_tensor
from kvbits.decode import attention_reference
from kvbits.decode.layout import DECODE_BITS
from suites.decode_loop_support import (
    SOURCES,
    cycling_step,
    eager_figures,
    graph_figures,
    paged_cache,
    require_positive,
    spread_metrics,
    step_inputs,
)
from suites.decode_support import errors, random_kv, random_q


class KvbitsMethod:
    """What kvbits as a peer and as a server share: ``bits`` and ``group_size`` (checked), the
    name, whether the paged cache holds this head_dim, and the version. Mixed into a Peer or a
    Server, whose problem it reads."""

    def _init_bits(self, bits: int, group_size: int) -> None:
        require_int("bits", bits, DECODE_BITS)
        require_int("group_size", group_size)
        self.bits, self.group_size = bits, group_size
        self.name = f"kvbits{bits}"
        self.cache = None

    def _new_cache(self, sequences: int, tokens: int):
        return paged_cache(sequences, self.kv_heads, self.head_dim, tokens, device=self.device, bits=self.bits,
                           group_size=self.group_size, dtype=self.dtype)

    def missing(self) -> str | None:
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        try:  # the cache checks head_dim against the group size and the kernel's layout
            self._new_cache(1, 1)
        except (ValueError, TypeError) as e:
            return f"kvbits cannot hold head_dim={self.head_dim} at {self.bits} bits, group {self.group_size}: {e}"
        return None

    def version(self) -> str:
        return dist_version("kvbits") or "source checkout"


class KvbitsPeer(KvbitsMethod, Peer):
    """kvbits' decode loop as a peer: :class:`kvbits.PagedKVCache` with ``bits`` bits per stored
    K/V element (affine, groups of ``group_size``; the cache's default fp sinks and window),
    pages of decode_loop_support.PAGE tokens. :meth:`load` adds each sequence's prompt [Hkv, S, D]
    and reserves pages and the decode plan up to ``capacity``, so that a captured append + attend
    can be replayed up to it; append and attend are the cache's (the fused Triton decode on a GPU,
    the torch path on CPU)."""

    graph_capturable = True

    def __init__(self, bits: int, *args, group_size: int = 64, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_bits(bits, group_size)

    def bytes_per_token(self) -> float:
        """The pool's bytes per token across the kv heads (codes, scales, zeros); needs :meth:`load`."""
        if self.cache is None:
            raise RuntimeError(f"{self.name}: bytes_per_token is the cache's; load a prompt first")
        return self.cache.bytes_per_token()

    def _load(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache = None  # the previous cache's memory goes before the next one is allocated
        self.cache = self._new_cache(self.batch, self.capacity)
        for b in range(self.batch):
            self.cache.add_sequence(k[b], v[b])
        self.cache.reserve(self.capacity - k.shape[2])

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.append(k, v)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        return self.cache.attend(q)

    def replayed(self, length: int) -> None:
        super().replayed(length)
        self.cache.advance(length - self.cache.lengths()[0])  # the cache counted no replay either


class KvbitsServer(KvbitsMethod, Server):
    """kvbits serving a ragged batch: :class:`kvbits.PagedKVCache` (``bits`` bits, groups of
    ``group_size``, pages of decode_loop_support.PAGE tokens, enough for every sequence to reach
    max_len) behind :class:`harness.peers.serving.Server`; its rows are the cache's rows."""

    def __init__(self, bits: int, *args, group_size: int = 64, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_bits(bits, group_size)

    def bytes_per_token(self) -> float:
        """The pool's bytes per token across the kv heads (codes, scales, zeros); needs :meth:`start`."""
        self.start()
        return self.cache.bytes_per_token()

    def _nbytes(self) -> int:
        return self.cache.nbytes()

    def _start(self) -> None:
        self.cache = self._new_cache(self.max_seqs, self.max_len)

    def _add(self, row: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.add_sequence(k, v)

    def _free(self, row: int, last: int) -> None:
        self.cache.free(self.cache.sequences[row])

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache.append(k, v)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:
        return self.cache.attend(q)

    def check_errors(self) -> None:
        self.cache.check_errors()


METHODS: dict[str, Callable[..., Peer]] = {
    **PEERS, **{f"kvbits{bits}": partial(KvbitsPeer, bits) for bits in DECODE_BITS}}
SERVING_METHODS: dict[str, Callable[..., Server]] = {
    **SERVERS, **{f"kvbits{bits}": partial(KvbitsServer, bits) for bits in DECODE_BITS}}


def extra_tokens(eager_steps: int, graph_steps: int) -> int:
    """Tokens past the prompt that :func:`measure` appends at most: eager_steps + 1 eager steps,
    then graph_steps + 1 on the device and the capture on the host. A peer's capacity must hold
    the prompt and these."""
    return eager_steps + graph_steps + 2


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """float64 attention of q [B, Hq, D] over every token of k, v [B, Hkv, S, D] (GQA: query head
    i reads kv head i // (Hq / Hkv)) -> [B, Hq, D] float64, one kv head at a time so that a float64
    copy of one head's K/V is the largest buffer (128 MiB at S = 128K, D = 128)."""
    for arg, t, rank in (("q", q, 3), ("k", k, 4), ("v", v, 4)):
        require_rank(arg, require_tensor(arg, t), rank)
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"k and v must be [B, Hkv, S, D] for q [B, Hq, D] with Hq a multiple of Hkv; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    batch, q_heads, _ = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    lens = torch.full((batch,), seq, device=k.device)
    return torch.cat([attention_reference(q[:, h * group:(h + 1) * group], k[:, h:h + 1], v[:, h:h + 1], lens,
                                          sm_scale) for h in range(kv_heads)], dim=1)


def attention_error(peer: Peer, seq: int, *, outliers: bool, seed: int) -> float:
    """Relative RMS error ||out - ref|| / ||ref|| of the peer's attention after a prompt of ``seq``
    random tokens and one appended, against :func:`exact_attention` over the original K/V (fp16 or
    bf16 as the peer's dtype); K with a few outlier channels (x6, as decoder LLMs' keys) when
    ``outliers``. The peer's cache is replaced (:meth:`Peer.load`)."""
    _require_peer(peer)
    if require_positive("seq", seq) >= peer.capacity:
        raise ValueError(f"seq must leave room for one token in the peer's capacity ({peer.capacity}); got {seq}")
    k, v = random_kv(peer.batch, peer.kv_heads, seq + 1, peer.head_dim, dtype=peer.dtype, device=peer.device,
                     seed=seed, outliers=outliers)
    q = random_q(peer.batch, peer.q_heads, peer.head_dim, dtype=peer.dtype, device=peer.device, seed=seed + 1)
    peer.load(k[:, :, :seq].contiguous(), v[:, :, :seq].contiguous())
    peer.append(k[:, :, seq].contiguous(), v[:, :, seq].contiguous())
    return errors(peer.attend(q), exact_attention(q, k, v, peer.sm_scale))["max_rel_err"]


def activation_errors(method: str, layers: list, *, device, dtype: torch.dtype = torch.float16) -> dict:
    """A method's attention error on real activations: for each layer's (q, k, v) [1, H, S, D]
    (affine_support.minilm_activations), the method holds the first S - 1 tokens of K/V, one more
    is appended, and the last token's query attends; relative RMS error against
    :func:`exact_attention` over the same K/V in ``dtype``. kvbits goes through its contiguous
    cache (``quantize_kv``, ``QuantizedKV.append``, ``decode_attention``'s torch path, groups of
    64 channels or 32 where D is not a multiple of 64): the paged cache's arrangement starts at
    D = 64, and it stores the same codes bit for bit. Returns ``attn_rel_err_real`` (the mean over
    the layers) and ``attn_rel_err_real_max`` (the worst layer)."""
    import kvbits
    from kvbits.decode import decode_attention

    errs = []
    for q, k, v in layers:
        q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
        _, heads, seq, dim = k.shape
        query = q[:, :, -1].contiguous()
        prompt, last = (k[:, :, :-1].contiguous(), v[:, :, :-1].contiguous()), (k[:, :, -1], v[:, :, -1])
        if method.startswith("kvbits"):
            cache = kvbits.quantize_kv(*prompt, int(method.removeprefix("kvbits")),
                                        group_size=64 if dim % 64 == 0 else 32, backend="torch")
            cache.append(*last, backend="torch")
            out = decode_attention(query, cache, backend="torch")
        else:
            peer = METHODS[method](1, heads, heads, dim, seq, dtype=dtype, device=device)
            peer.load(*prompt)
            peer.append(*(t.contiguous() for t in last))
            out = peer.attend(query)
        errs.append(errors(out, exact_attention(query, k, v, 1.0 / math.sqrt(dim)))["max_rel_err"])
    return {"attn_rel_err_real": sum(errs) / len(errs), "attn_rel_err_real_max": max(errs)}


def _require_peer(peer) -> None:
    if not isinstance(peer, Peer):
        raise TypeError(f"peer must be a harness.peers.Peer; got {type(peer).__name__}")


def _check_measure(peer, seq: int, eager_steps: int, graph_steps: int) -> None:
    _require_peer(peer)
    require_positive("seq", seq)
    require_positive("eager_steps", eager_steps)
    if require_int("graph_steps", graph_steps) < 0:
        raise ValueError(f"graph_steps must be at least 0; got {graph_steps}")
    need = seq + extra_tokens(eager_steps, graph_steps)
    if peer.capacity < need:
        raise ValueError(f"peer's capacity ({peer.capacity}) must hold seq + extra_tokens(eager_steps, "
                         f"graph_steps) = {need} tokens")
    reason = peer.missing()
    if reason is not None:
        raise ValueError(f"peer {peer.name} cannot run here: {reason}")


def measure(peer: Peer, seq: int, *, eager_steps: int, graph_steps: int, seed: int = 0) -> dict:
    """The figures of one peer at one shape (the peer's batch, heads, head_dim and dtype; prompts
    of ``seq`` tokens; fixed seeds, so every peer sees the same K, V and queries):

    - ``ms``, ``p99_ms``, ``max_ms``, the spread (``ms_n``, ``ms_min``, ``ms_iqr``, ``ms_mad``),
      ``host_ms`` and ``bound``: the eager decode step (append one token to every sequence,
      attend one query each) over ``eager_steps`` steps after a warm-up step;
    - ``graph_ms``, ``graph_p99_ms``: the step captured in one CUDA graph and replayed
      ``graph_steps`` times, for a graph-capturable peer on a GPU (else None);
    - ``attend_ms`` (eager) and ``attend_graph_ms`` (replayed, else None): attend alone on the
      cache the steps left (frozen);
    - ``attn_rel_err`` and ``attn_rel_err_outliers``: :func:`attention_error` on plain random K
      and on K with outlier channels;
    - ``bits``, ``bytes_per_token`` (one sequence, the kv heads of one layer), ``method`` (the
      peer's name) and ``version``.

    The peer needs capacity for seq + :func:`extra_tokens` tokens; one that is missing here
    (:meth:`Peer.missing`) is a ValueError."""
    _check_measure(peer, seq, eager_steps, graph_steps)
    figures = {"attn_rel_err": attention_error(peer, seq, outliers=False, seed=seed + 10),
               "attn_rel_err_outliers": attention_error(peer, seq, outliers=True, seed=seed + 20)}
    k, v = random_kv(peer.batch, peer.kv_heads, seq, peer.head_dim, dtype=peer.dtype, device=peer.device,
                     seed=seed, outliers=False)
    peer.load(k, v)
    del k, v
    toks, qs = step_inputs(peer.batch, peer.q_heads, peer.kv_heads, peer.head_dim, peer.device, seed=seed + 1,
                           dtype=peer.dtype)
    eager = eager_figures(cycling_step(peer.append, peer.attend, toks, qs), eager_steps)
    graph = attend_graph = None
    if peer.graph_capturable and graph_steps and peer.device.type == "cuda":
        kb, vb, qb = toks[0].clone(), toks[1].clone(), qs[0].clone()

        def step():
            peer.append(kb, vb)
            peer.attend(qb)

        start = peer.length
        graph = graph_figures(step, graph_steps)
        peer.replayed(start + graph_steps + 1)  # the warm-up and the replays (graph_figures)
        attend_graph = graph_figures(lambda: peer.attend(qb), graph_steps)
    attend = eager_figures(lambda i: peer.attend(qs[i % SOURCES]), eager_steps)
    on_gpu = peer.device.type == "cuda"
    figures.update(
        ms=eager["median"], p99_ms=eager["p99"], max_ms=eager["max"], **spread_metrics(eager),
        host_ms=eager["issue"], bound=classify_bound(eager["issue"], eager["median"]) if on_gpu else "cpu",
        graph_ms=_pick(graph, "median"), graph_p99_ms=_pick(graph, "p99"), attend_ms=attend["median"],
        attend_graph_ms=_pick(attend_graph, "median"), bits=peer.bits, bytes_per_token=peer.bytes_per_token(),
        method=peer.name, version=peer.version())
    return figures


def _pick(timed: dict | None, key: str) -> float | None:
    return None if timed is None else timed[key]
