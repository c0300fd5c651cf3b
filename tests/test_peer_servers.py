"""The serving batch's methods (harness.peers.serving, harness.peers.flashinfer's server, kvbits'
behind the same interface), on CPU: sequences of different lengths join, grow and leave, and
after every step each method's attention of every live sequence is compared with float64
attention over that sequence's tokens; FlashInfer's server runs against the stand-in module of
tests/test_peers.py (its page pool, slot mapping and page table are its own, torch only). The
page pool's bookkeeping, bad input and the benchmark loop (decode_loop_support.serving_batch)
are checked too."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from harness.peers import PEERS, SERVERS, UNSERVED, paged
from harness.peers.flashinfer import FlashInferServer
from harness.peers.serving import SdpaServer
from suites.decode_loop_support import serving_arrivals, serving_batch, serving_max_len
from suites.peers_support import SERVING_METHODS, KvbitsServer
from tests.test_peers import FP16_TOL, fake_packages, reference  # noqa: F401  (fake_packages: a fixture)

HQ, HKV, D = 4, 2, 64
MAX_LEN = 120


def run_life(server, *, seed: int = 0) -> list[float]:
    """Three sequences join (prompts of 50, 16 and 58 tokens), grow, the middle one leaves (the last
    row moves into its place), a fourth joins, all grow on; after every step the worst absolute
    error of any live sequence's attention against float64 attention over its own tokens, one per
    step."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen).half()  # noqa: E731
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def join(n):
        k, v = rand(HKV, n, D), rand(HKV, n, D)
        held[server.add_sequence(k, v)] = (k, v)

    def step():
        ids = server.sequences
        kt, vt = rand(len(ids), HKV, D), rand(len(ids), HKV, D)
        server.append(kt, vt)
        for row, sid in enumerate(ids):
            k, v = held[sid]
            held[sid] = (torch.cat([k, kt[row][:, None]], 1), torch.cat([v, vt[row][:, None]], 1))
        q = rand(len(ids), HQ, D)
        out = server.attend(q)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert server.lengths() == [held[sid][0].shape[1] for sid in ids]
        return max(float((out[row:row + 1].double() - reference(q[row:row + 1], held[sid][0][None],
                                                                  held[sid][1][None])).abs().max())
                   for row, sid in enumerate(ids))

    for n in (50, 16, 58):
        join(n)
    worst = [step() for _ in range(3)]
    server.free(server.sequences[1])
    join(5)
    # the first sequence (50 + 17) and the moved one (58 + 17) complete a group of 64 tokens (kvbits
    # quantizes it into a page), every sequence crosses pages of 16 (FlashInfer's)
    worst += [step() for _ in range(14)]
    assert server.lengths() == [67, 75, 19]
    server.check_errors()
    return worst


def test_sdpa_server_serves_every_sequence_its_own_tokens():
    server = SdpaServer("math", 3, HQ, HKV, D, MAX_LEN)
    assert max(run_life(server)) < FP16_TOL
    assert server.nbytes() == 2 * 3 * HKV * MAX_LEN * D * 2
    assert sorted(server._free_slots) == [] and len(server.sequences) == 3


@pytest.mark.parametrize("kv", ["fp16", "fp8"])
def test_flashinfer_server_pages_come_and_go(fake_packages, kv):  # noqa: F811
    server = FlashInferServer(3, HQ, HKV, D, MAX_LEN, kv=kv, page_size=16)
    server.missing = lambda: None  # the stand-in module runs on CPU
    worst = run_life(server)
    assert max(worst) < (FP16_TOL if kv == "fp16" else 0.1)  # fp8: 2^-4 relative error on every K/V value
    pool = server.pool
    assert pool.num_pages == 3 * paged.pages_for(MAX_LEN, 16)
    lens = server.lengths()
    assert pool.used[:3] == [paged.pages_for(n, 16) for n in lens]
    for sid in server.sequences:
        server.free(sid)
    assert pool.free_pages == pool.num_pages and pool.used == [0, 0, 0]


def test_kvbits_server_is_the_paged_cache():
    server = KvbitsServer(4, 3, HQ, HKV, D, MAX_LEN)
    worst = run_life(server)
    assert max(worst) < 0.35  # 4-bit K/V: the quantization error, not a wrong sequence's tokens
    assert server.cache.lengths() == server.lengths()
    assert server.nbytes() == server.cache.nbytes()


def test_page_pool_slots_and_release():
    pool = paged.PagePool(6, 4, 3, 3)
    first = pool.slots([0, 1], [0, 0], [5, 2])  # row 0 takes pages 0, 1; row 1 page 2
    assert first.tolist() == [0, 1, 2, 3, 4, 8, 9]
    assert pool.slots([0, 1], [5, 2], [1, 3]).tolist() == [5, 10, 11, 12]  # row 1 takes page 3
    indptr, indices, last = pool.page_table([6, 5])
    assert indptr.tolist() == [0, 2, 4] and indices.tolist() == [0, 1, 2, 3] and last.tolist() == [2, 1]
    with pytest.raises(ValueError, match="exhausted"):
        pool.slots([0, 1, 2], [6, 5, 0], [0, 0, 12])  # row 2 needs three pages, two are free
    assert pool.free_pages == 2 and pool.used == [2, 2, 0]  # nothing taken
    with pytest.raises(ValueError, match="max_pages_per_seq"):
        pool.slots([0], [6], [7])
    pool.release(0, 1)  # row 1 moves into row 0
    assert pool.used == [2, 0, 0] and pool.table[0, :2].tolist() == [2, 3] and pool.free_pages == 4
    assert pool.slots([1], [0], [1]).tolist() == [0]  # page 0 again: freed pages are reused first


def test_server_bad_input():
    server = SdpaServer("math", 2, HQ, HKV, D, 16)
    k = torch.zeros(HKV, 4, D, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^k must have shape"):
        server.add_sequence(torch.zeros(HQ, 4, D, dtype=torch.float16), k)
    with pytest.raises(TypeError, match=r"^v must have dtype float16"):
        server.add_sequence(k, k.float())
    with pytest.raises(ValueError, match="prompt length"):
        server.add_sequence(torch.zeros(HKV, 16, D, dtype=torch.float16), torch.zeros(HKV, 16, D, dtype=torch.float16))
    a = server.add_sequence(k, k)
    server.add_sequence(k, k)
    with pytest.raises(ValueError, match="max_seqs"):
        server.add_sequence(k, k)
    with pytest.raises(ValueError, match="not a live sequence"):
        server.free(7)
    with pytest.raises(ValueError, match=r"^q must have shape"):
        server.attend(torch.zeros(1, HQ, D, dtype=torch.float16))
    tok = torch.zeros(2, HKV, D, dtype=torch.float16)
    for _ in range(12):
        server.append(tok, tok)
    with pytest.raises(ValueError, match="max_len"):
        server.append(tok, tok)
    assert server.lengths() == [16, 16]  # the refused append changed nothing
    server.free(a)
    assert len(server.sequences) == 1
    with pytest.raises(ValueError, match="max_seqs"):
        SdpaServer("math", 0, HQ, HKV, D, 16)
    with pytest.raises(ValueError, match="q_heads"):
        SdpaServer("math", 1, 3, HKV, D, 16)
    with pytest.raises(ValueError, match="backend"):
        SdpaServer("fast", 1, HQ, HKV, D, 16)
    with pytest.raises(ValueError, match="kv"):
        FlashInferServer(1, HQ, HKV, D, 16, kv="int4")


def test_servers_missing_on_cpu():
    assert SERVERS["sdpa-math"](1, HQ, HKV, D, 16).missing() is None
    for name in ("sdpa-flash", "flashinfer-fp16", "flashinfer-fp8"):
        assert "CUDA" in SERVERS[name](1, HQ, HKV, D, 16).missing(), name
    assert "kvbits cannot hold" in KvbitsServer(3, 1, HQ, HKV, 48, 16).missing()
    with pytest.raises(ValueError, match="cannot run here"):
        SERVERS["flashinfer-fp16"](1, HQ, HKV, D, 16).start()
    assert set(SERVING_METHODS) == {*SERVERS, "kvbits2", "kvbits3", "kvbits4"}
    assert set(SERVERS) | set(UNSERVED) == set(PEERS) and not set(SERVERS) & set(UNSERVED)


@pytest.mark.parametrize("method", ["sdpa-math", "kvbits3"])
def test_serving_batch_runs_every_arrival_to_its_end(method):
    arrivals = serving_arrivals(6, sequences=3, prompts=(40, 90), new_tokens=(2, 4))
    assert len(arrivals) == 3 * (2 + 6 // 2)
    made = []

    def make():
        made.append(SERVING_METHODS[method](3, HQ, HKV, D, serving_max_len(arrivals)))
        return made[-1]

    served = serving_batch(make, arrivals, 6)
    assert len(made) == 2  # the untimed run on a server of its own, then the timed one
    assert served["finite"] and served["tokens_per_s"] > 0 and served["step_ms"]["n"] == 6
    # the schedule, replayed here: who is live after 6 steps and how long each is
    live, lengths, queue, left = [], [], iter(arrivals), {}
    for sid in range(3):
        prompt, new = next(queue)
        live.append(sid), lengths.append(prompt)
        left[sid] = new
    joined = 3
    for _ in range(6):
        lengths = [n + 1 for n in lengths]
        for sid in list(live):
            left[sid] -= 1
            if left[sid] == 0:  # freed: the last row moves into its place, the next arrival joins last
                row = live.index(sid)
                live[row], lengths[row] = live[-1], lengths[-1]
                live.pop(), lengths.pop()
                prompt, new = next(queue)
                live.append(joined), lengths.append(prompt)
                left[joined] = new
                joined += 1
    assert joined > 3, "the schedule must free and join sequences"
    for server in made:  # both ran the same schedule
        assert server.sequences == live and server.lengths() == lengths


def test_serving_batch_bad_input():
    make = partial(SdpaServer, "math", 2, HQ, HKV, D, 64)
    with pytest.raises(ValueError, match=r"arrivals\[1\] new tokens must be at least 1"):
        serving_batch(make, [(8, 3), (8, 0)], 2)
    with pytest.raises(ValueError, match=r"arrivals\[0\] prompt tokens must be at least 1"):
        serving_batch(make, [(0, 3), (8, 3)], 2)
    with pytest.raises(TypeError, match=r"arrivals\[0\] must be a \(prompt tokens, new tokens\) pair"):
        serving_batch(make, [8, (8, 3)], 2)
    with pytest.raises(ValueError, match="the 2 arrivals ran out within 4 steps of 2 rows"):
        serving_batch(make, [(8, 1), (8, 1)], 4)  # both leave after one step, and nothing is left to join


def test_server_holds_no_bytes_before_it_starts():
    server = SdpaServer("math", 2, HQ, HKV, D, 16)
    assert server.nbytes() == 0
    server.start()
    assert server.nbytes() == 2 * 2 * HKV * 16 * D * 2
