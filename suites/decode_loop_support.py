"""The decode step as a model runs it, timed: shared by the decode-step benchmark, the peers
benchmark (suites/peers_support.py) and scripts/gpu_decode_loop.py.

A step appends one token to every sequence and attends with one query token per sequence.
kvbits: :class:`kvbits.decode.cache.PagedKVCache` (append + attend), eager and replayed from one
captured CUDA graph. fp16: a preallocated fp16 cache, the token written in place and flash SDPA
over the tokens so far (eager), or a captured step at the starting length (graph: SDPA takes no
device-side length, so a graph of it attends a fixed length).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from harness.measure.timing import Timing
from kvbits._checks import require_int
from kvbits.decode import PagedKVCache

PAGE = 256  # tokens per page of the benchmarks' pools
SOURCES = 8  # distinct token and query tensors a timed loop cycles through
ISSUE_STEPS = 32  # steps whose host time gives the issue cost: too few to fill the launch queue


def percentiles(ms: list[float]) -> dict:
    """median, p99, max and mean of per-step times (nearest rank), and their spread: the fastest,
    the interquartile range and the median absolute deviation (harness.measure.timing.Timing)."""
    xs = sorted(ms)

    def pick(p: float) -> float:
        return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]

    spread = Timing.of(xs)
    return {"median": pick(0.5), "p99": pick(0.99), "max": xs[-1], "mean": sum(xs) / len(xs), "n": len(xs),
            "min": spread.min, "iqr": spread.iqr, "mad": spread.mad}


def spread_metrics(steps: dict) -> dict:
    """The spread of per-step times (a :func:`percentiles` dict) as record metrics beside ``ms``."""
    return {"ms_n": steps["n"], "ms_min": steps["min"], "ms_iqr": steps["iqr"], "ms_mad": steps["mad"]}


def require_positive(name: str, value) -> int:
    """value, an int >= 1 (TypeError or ValueError naming ``name`` otherwise)."""
    if require_int(name, value) < 1:
        raise ValueError(f"{name} must be at least 1; got {value}")
    return value


def paged_cache(batch: int, heads: int, dim: int, tokens: int, *, device, bits: int = 3, group_size: int = 64,
                dtype: torch.dtype = torch.float16) -> PagedKVCache:
    """An empty cache for ``batch`` sequences of up to ``tokens`` tokens each: pages of PAGE tokens,
    enough for ``tokens`` per sequence and one spare page each; K/V of ``heads`` heads of ``dim``
    channels in ``dtype``."""
    pages = require_positive("batch", batch) * (-(-require_positive("tokens", tokens) // PAGE) + 1)
    return PagedKVCache(pages, PAGE, heads, dim, max_seqs=batch, bits=bits, group_size=group_size, dtype=dtype,
                        device=device)


def prompt_cache(batch: int, heads: int, seq: int, dim: int, *, extra: int, device, bits: int = 3,
                 group_size: int = 64, seed: int = 0) -> PagedKVCache:
    """A cache of ``batch`` sequences, each added with a random prompt of ``seq`` tokens, with pages
    for ``extra`` more tokens each."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cache = paged_cache(batch, heads, dim, seq + extra, device=device, bits=bits, group_size=group_size)
    for _ in range(batch):
        k = torch.randn(heads, seq, dim, generator=gen, device=device, dtype=torch.float16)
        v = torch.randn(heads, seq, dim, generator=gen, device=device, dtype=torch.float16)
        cache.add_sequence(k, v)
    return cache


def step_inputs(batch: int, q_heads: int, kv_heads: int, dim: int, device, *, seed: int = 1,
                dtype: torch.dtype = torch.float16):
    """SOURCES token tensors [B, Hkv, D] and queries [B, Hq, D] (random, in ``dtype``)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    toks = [torch.randn(batch, kv_heads, dim, generator=gen, device=device, dtype=dtype)
            for _ in range(SOURCES)]
    qs = [torch.randn(batch, q_heads, dim, generator=gen, device=device, dtype=dtype)
          for _ in range(SOURCES)]
    return toks, qs


def cycling_step(append, attend, toks, qs):
    """The eager decode step i of a timed loop: append(toks[i], toks[i + 3]) (one token per
    sequence, K and V) then attend(qs[i]), indices modulo SOURCES (:func:`step_inputs`)."""

    def step(i):
        append(toks[i % SOURCES], toks[(i + 3) % SOURCES])
        attend(qs[i % SOURCES])

    return step


def timed_steps(step, n: int) -> tuple[list[float], float]:
    """(per-step ms, wall ms per step) of ``n`` calls step(i): CUDA events between steps on a GPU
    (host gaps included where the host is slower), the wall clock on CPU."""
    per, wall, _ = timed_steps_issued(step, n)
    return per, wall


def timed_steps_issued(step, n: int) -> tuple[list[float], float, float]:
    """:func:`timed_steps` and the host's time to issue one step: the wall clock over the first
    ISSUE_STEPS steps, issued back to back before any synchronization (on CPU, the wall ms per step)."""
    if not torch.cuda.is_available():
        per = []
        for i in range(n):
            t0 = time.perf_counter()
            step(i)
            per.append((time.perf_counter() - t0) * 1e3)
        return per, sum(per) / n, sum(per) / n
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    issued_after = min(n, ISSUE_STEPS)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    events[0].record()
    for i in range(n):
        step(i)
        events[i + 1].record()
        if i + 1 == issued_after:
            issue = (time.perf_counter() - t0) * 1e3 / issued_after
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / n
    return [events[i].elapsed_time(events[i + 1]) for i in range(n)], wall, issue


def _captured(fn) -> torch.cuda.CUDAGraph:
    """fn run once on a side stream (warm-up, as torch.cuda.graph asks), then captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def eager_figures(step, steps: int) -> dict:
    """step(0) once (warm-up: first-use compiles and plans), then ``steps`` timed calls step(i):
    per-step percentiles (:func:`percentiles`), ``wall`` ms per step and ``issue``, the host's ms to
    issue one (:func:`timed_steps_issued`). step runs steps + 1 times."""
    require_positive("steps", steps)
    step(0)
    per, wall, issue = timed_steps_issued(step, steps)
    return {**percentiles(per), "wall": wall, "issue": issue}


def graph_figures(step, steps: int) -> dict:
    """step() run once on a side stream (warm-up), captured in one CUDA graph and the graph replayed
    ``steps`` times, timed as :func:`eager_figures` times its calls. GPU only. On the device step
    runs steps + 1 times (the warm-up and the replays; the capture runs nothing), on the host
    twice (the warm-up and the capture): a step that grows a cache grows it by steps + 1 tokens,
    which the host does not see."""
    require_positive("steps", steps)
    graph = _captured(step)
    per, wall, issue = timed_steps_issued(lambda i: graph.replay(), steps)
    return {**percentiles(per), "wall": wall, "issue": issue}


def kvbits_steps(cache: PagedKVCache, toks, qs, steps: int) -> dict:
    """Eager steps, then (on a GPU) steps replayed from one captured step: per-step percentiles,
    wall ms per step and the host's ms to issue one step of each; the cache grows by 2 * steps + 2
    tokens."""
    cache.reserve(steps + 1)
    figures = {"eager": eager_figures(cycling_step(cache.append, cache.attend, toks, qs), steps)}
    if not torch.cuda.is_available():
        return figures
    kb, vb, qb = toks[0].clone(), toks[1].clone(), qs[0].clone()
    ob = torch.empty_like(qb)
    cache.reserve(steps + 1)

    def step():
        cache.append(kb, vb)
        cache.attend(qb, out=ob)

    figures["graph"] = graph_figures(step, steps)
    cache.advance(steps)
    figures["out"] = ob
    return figures


def fp16_steps(batch: int, q_heads: int, kv_heads: int, seq: int, dim: int, steps: int, device) -> dict:
    """The fp16 step: a preallocated fp16 cache of seq + steps tokens, eager (flash SDPA over the
    tokens so far) and, on a GPU, replayed from one captured step at length seq + 1."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device=device).manual_seed(seq + 1)
    cap = seq + steps + 2
    ck = torch.randn(batch, kv_heads, cap, dim, generator=gen, device=device, dtype=torch.float16)
    cv = torch.randn(batch, kv_heads, cap, dim, generator=gen, device=device, dtype=torch.float16)
    toks, qs = step_inputs(batch, q_heads, kv_heads, dim, device, seed=seq + 2)
    backends = [SDPBackend.FLASH_ATTENTION] if device == "cuda" else [SDPBackend.MATH]

    def attend(q, n):
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q[:, :, None], ck[:, :, :n], cv[:, :, :n],
                                                  enable_gqa=q_heads != kv_heads)

    def eager(i):
        pos = seq + i
        ck[:, :, pos] = toks[i % SOURCES]
        cv[:, :, pos] = toks[(i + 3) % SOURCES]
        attend(qs[i % SOURCES], pos + 1)

    figures = {"eager": eager_figures(eager, steps)}
    if device != "cuda":
        return figures
    pos = torch.tensor([seq], device=device)
    kb, vb, qb = toks[0][:, :, None].clone(), toks[1][:, :, None].clone(), qs[0].clone()

    def fixed():
        ck.index_copy_(2, pos, kb)
        cv.index_copy_(2, pos, vb)
        attend(qb, seq + 1)

    figures["graph"] = graph_figures(fixed, steps)
    return figures


def serving_arrivals(steps: int, *, sequences: int, prompts: tuple[int, int], new_tokens: tuple[int, int],
                     seed: int = 5) -> list[tuple[int, int]]:
    """(prompt tokens, new tokens) of every sequence a serving batch of ``sequences`` live ones can
    start in ``steps`` steps: prompts drawn from the range ``prompts``, new tokens from ``new_tokens``
    (fixed seed: every method serves the same arrivals)."""
    import random

    require_positive("steps", steps)
    rnd = random.Random(seed)
    return [(rnd.randint(*prompts), rnd.randint(*new_tokens))
            for _ in range(require_positive("sequences", sequences) * (2 + steps // new_tokens[0]))]


def serving_max_len(arrivals: list[tuple[int, int]]) -> int:
    """The longest a sequence of these arrivals grows (its prompt, its new tokens and one more)."""
    return max(p + n for p, n in arrivals) + 1


def serving_batch(make, arrivals: list[tuple[int, int]], steps: int, *, seed: int = 5) -> dict:
    """A serving batch on the server ``make()`` returns (a :class:`harness.peers.serving.Server` for
    up to max_seqs sequences of :func:`serving_max_len` tokens): the first max_seqs arrivals join
    with random prompts, and each sequence, once it has its new tokens, is freed and replaced by
    the next arrival; one eager step (append one token to every live sequence, attend one query
    each) at a time, synchronized. The same schedule runs first, untimed, on a server of its own:
    every kernel specialization and plan the timed run meets is compiled there, as a server
    warms up before it serves. Returns decode tokens per second, per-step percentiles (wall
    clock), the median host time to issue a step (before its synchronization), prefill seconds,
    the storage's bytes, the lengths at the end and whether the last step's output is finite."""
    require_positive("steps", steps)
    for i, arrival in enumerate(arrivals):
        if not (isinstance(arrival, tuple) and len(arrival) == 2):
            raise TypeError(f"arrivals[{i}] must be a (prompt tokens, new tokens) pair; got {arrival!r}")
        require_positive(f"arrivals[{i}] prompt tokens", arrival[0])
        require_positive(f"arrivals[{i}] new tokens", arrival[1])  # 0 would never leave its row
    warm = make()
    _serve(warm, arrivals, steps, seed)
    del warm  # its storage goes before the timed server's is allocated
    server = make()
    return {**_serve(server, arrivals, steps, seed), "nbytes": server.nbytes(), "lengths": server.lengths()}


def _serve(server, arrivals: list[tuple[int, int]], steps: int, seed: int) -> dict:
    device = server.device
    gen = torch.Generator(device=device).manual_seed(seed)
    queue = iter(arrivals)
    left: dict[int, int] = {}
    prefill = 0.0
    h, d = server.kv_heads, server.head_dim

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def join():
        nonlocal prefill
        arrival = next(queue, None)
        if arrival is None:
            raise ValueError(f"the {len(arrivals)} arrivals ran out within {steps} steps of {server.max_seqs} rows: "
                             f"give more (serving_arrivals draws enough)")
        prompt, new = arrival
        k = torch.randn(h, prompt, d, generator=gen, device=device, dtype=server.dtype)
        sync()
        t0 = time.perf_counter()
        left[server.add_sequence(k, k.clone())] = new
        sync()
        prefill += time.perf_counter() - t0

    for _ in range(server.max_seqs):
        join()
    tok = torch.randn(server.max_seqs, h, d, generator=gen, device=device, dtype=server.dtype)
    q = torch.randn(server.max_seqs, server.q_heads, d, generator=gen, device=device, dtype=server.dtype)
    per_step, issue, generated = [], [], 0
    for _ in range(steps):
        n = len(server.sequences)
        sync()
        t0 = time.perf_counter()
        server.append(tok[:n], tok[:n])
        out = server.attend(q[:n])
        issued = time.perf_counter()
        sync()
        per_step.append((time.perf_counter() - t0) * 1e3)
        issue.append((issued - t0) * 1e3)
        generated += n
        for sid in server.sequences:
            left[sid] -= 1
            if left[sid] == 0:
                del left[sid]
                server.free(sid)
                join()
    server.check_errors()
    return {"tokens_per_s": generated / (sum(per_step) / 1e3), "step_ms": percentiles(per_step),
            "issue_ms": statistics.median(issue), "prefill_s": prefill, "finite": bool(torch.isfinite(out).all())}
