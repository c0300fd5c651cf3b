"""The decode benchmarks' peers (harness.peers), on CPU.

Peers that run here (SDPA math, FlexAttention eager, transformers' QuantizedCache with HQQ or
quanto when installed) are loaded with a random prompt, grown one token at a time across their
boundary (a KV block of the block mask, the quantized cache's residual window) and compared with
float64 attention over every token so far. The GPU-only peers (FlashInfer, flash-attn, SDPA
flash/cuDNN) are checked through what runs without their package: the paged layout and page
table FlashInfer is given, the adapters' calls against stand-in modules that do what the
packages' documentation says, and ``missing()`` naming the device or the package. kvbits' own
cache behind the same interface (suites/peers_support.py) is checked the same way, and the peers
benchmark's figures (``measure``) and records are checked on CPU.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from harness.peers import PEERS, availability, paged
from harness.peers.flash_attn import FlashAttnPeer
from harness.peers.flashinfer import FlashInferPeer
from harness.peers.hf_quantized import HFQuantizedPeer, stored_bytes
from harness.peers.sdpa import SdpaPeer
from suites.decode_loop_support import eager_figures, paged_cache
from suites.peers_support import (
    METHODS,
    KvbitsPeer,
    attention_error,
    exact_attention,
    extra_tokens,
    measure,
)

B, HQ, HKV, D = 2, 4, 2, 64  # GQA: two query heads per K/V head
FP16_TOL = 2e-3  # fp16 output rounding (2^-11 relative) of |out| < 2, plus fp32 accumulation
BF16_TOL = 1.6e-2  # the same at bf16's 2^-8


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v in float64: q [B, Hq, D], k, v [B, Hkv, n, D] -> [B, Hq, D];
    each K/V head repeated for its group of query heads."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("bhd,bhnd->bhn", q.double(), k64) / math.sqrt(q.shape[-1])
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(scores, dim=-1), v64)


def grow(peer, prompt: int, steps: int, *, seed: int = 0, dtype=torch.float16):
    """Load a random prompt of ``prompt`` tokens, then per step append one random token and attend
    a random query. Yields (q, out, k, v) per step, k and v [B, Hkv, n, D] every token so far."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    k, v = rand(B, HKV, prompt, D), rand(B, HKV, prompt, D)
    peer.load(k, v)
    for _ in range(steps):
        kt, vt = rand(B, HKV, D), rand(B, HKV, D)
        peer.append(kt, vt)
        k, v = torch.cat([k, kt[:, :, None]], 2), torch.cat([v, vt[:, :, None]], 2)
        q = rand(B, HQ, D)
        out = peer.attend(q)
        assert out.shape == q.shape and out.dtype == q.dtype
        yield q, out, k, v


def usable(name: str, **kwargs):
    peer = PEERS[name](B, HQ, HKV, D, 256, **kwargs)
    reason = peer.missing()
    if reason:
        pytest.skip(reason)
    return peer


# --- exact peers --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-efficient", "flex"])
def test_exact_peers_match_float64_attention(name):
    peer = usable(name)
    # 126 + 4 tokens: the length enters flex's second KV block (128) on the third append
    for q, out, k, v in grow(peer, 126, 4):
        err = (out.double() - reference(q, k, v)).abs().max().item()
        assert err < FP16_TOL, (name, k.shape[2], err)
    assert peer.length == 130
    assert peer.bytes_per_token() == 2 * HKV * D * 2


def test_sdpa_math_in_bf16():
    peer = SdpaPeer("math", B, HQ, HKV, D, 64, dtype=torch.bfloat16)
    for q, out, k, v in grow(peer, 20, 3, dtype=torch.bfloat16):
        assert (out.double() - reference(q, k, v)).abs().max().item() < BF16_TOL


def test_flex_mask_follows_a_fresh_load():
    """A second, shorter prompt: the block mask built for the first one is not reused."""
    peer = usable("flex")
    for _ in grow(peer, 200, 1):
        pass
    for q, out, k, v in grow(peer, 5, 2, seed=3):
        assert (out.double() - reference(q, k, v)).abs().max().item() < FP16_TOL


def test_flex_builds_its_block_mask_once_per_kv_block(monkeypatch):
    import torch.nn.attention.flex_attention as flex_attention

    built = []
    make = flex_attention.create_block_mask
    monkeypatch.setattr(flex_attention, "create_block_mask", lambda *a, **kw: built.append(1) or make(*a, **kw))
    peer = usable("flex")
    for _ in grow(peer, 125, 6):  # lengths 126..131: block 1 until 128, block 2 from 129
        pass
    assert len(built) == 2


# --- quantized peers (transformers' QuantizedCache) ----------------------------------------------

QUANTIZED = ["hf-hqq-4", "hf-hqq-3", "hf-hqq-2", "hf-quanto-int4", "hf-quanto-int2"]
RESIDUAL = 4  # a short residual window: six appends quantize the whole cache anew once


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_peers_against_float64_attention(name):
    """Three checks per step, against float64 attention over the original K/V:

    1. the peer's output is attention over the K/V it attends (``attended_kv``: the cache's
       dequantized part, its residual window, the new token) to fp16 rounding: the adapter maps
       heads, GQA, scale and order right;
    2. those K/V differ from the originals by at most ``passes`` quantization steps of the
       tensor's range, step = (max - min) / (2^bits - 1): each time the cache quantizes (the
       prompt at load, everything at each residual flush) a value moves by at most one step of
       the affine grid, HQQ's optimised zero included, which can put a value a full step away;
    3. the output differs from the exact attention by at most what those K/V errors allow:
       |dout| <= max|dV| + (e^{2 eps} - 1) (max V - min V) / 2 per channel, eps = scale *
       max_i |q . dk_i| (a score moved by eps moves each softmax weight by a factor within
       e^{+-2 eps}), plus the fp16 tolerance of check 1.
    """
    peer = usable(name, residual_length=RESIDUAL, group_size=64)
    passes = 1
    for step, (q, out, k, v) in enumerate(grow(peer, 40, 6), start=1):
        if step == RESIDUAL:
            passes += 1  # the window filled: transformers requantized everything
        k_hat, v_hat = peer.attended_kv()
        assert k_hat.shape == k.shape
        assert (out.double() - reference(q, k_hat, v_hat)).abs().max().item() < FP16_TOL, (name, step)

        for exact, approx in ((k, k_hat), (v, v_hat)):
            step_size = (exact.max() - exact.min()).item() / (2 ** peer.bits - 1)
            assert (approx.double() - exact.double()).abs().max().item() <= passes * step_size * 1.01

        dk, dv = (k_hat.double() - k.double()), (v_hat.double() - v.double())
        group = HQ // HKV
        q64 = q.double()
        eps = (torch.einsum("bhd,bhnd->bhn", q64, dk.repeat_interleave(group, 1)).abs().amax(-1)
               / math.sqrt(D))  # [B, Hq]
        v64 = v.double().repeat_interleave(group, 1)
        spread = (v64.amax(2) - v64.amin(2)) / 2  # [B, Hq, D]
        bound = (dv.abs().amax(dim=(1, 2))[:, None, :] + torch.expm1(2 * eps)[..., None] * spread
                 + FP16_TOL)
        assert ((out.double() - reference(q, k, v)).abs() <= bound).all(), (name, step)


@pytest.mark.parametrize("name", ["hf-hqq-4", "hf-quanto-int4"])
def test_quantized_bytes_per_token_count_codes_scales_and_window(name):
    peer = usable(name, residual_length=RESIDUAL, group_size=64)
    for _ in grow(peer, 64, 1):
        pass
    layer = peer.cache.layers[0]
    window = 2 * B * HKV * 1 * D * 2  # one fp16 token per sequence waits in the residual window
    quantized = stored_bytes([layer._quantized_keys, layer._quantized_values])
    assert peer.bytes_per_token() == (quantized + window) / (B * 65)
    # 4-bit codes, an fp16 scale and zero per 64 values: 0.5 + 4/64 bytes per value, both K and V
    assert quantized == 2 * B * HKV * D * 64 * (0.5 + 4 / 64)


def test_stored_bytes_walks_containers():
    t = torch.zeros(3, 4, dtype=torch.float16)
    assert stored_bytes((t, {"scale": t, "nbits": 4}, [t[0]], None)) == 24 + 24 + 8


# --- FlashInfer's paged layout, without flashinfer ------------------------------------------------

def test_pages_reconstruct_the_prompt_exactly():
    x = torch.randn(B, HKV, 37, D, generator=torch.Generator().manual_seed(1)).half()
    pool = paged.to_pages(x, 16, 4)
    assert pool.shape == (B * 4, 16, HKV, D)
    indptr, indices, last = paged.page_table([37] * B, 16, 4)
    assert indptr.tolist() == [0, 3, 6] and indices.tolist() == [0, 1, 2, 4, 5, 6]
    assert last.tolist() == [5, 5] and indptr.dtype == indices.dtype == last.dtype == torch.int32
    for b, tokens in enumerate(paged.from_pages(pool, indptr, indices, last)):
        assert torch.equal(tokens, x[b])


def test_append_crosses_a_page_boundary():
    """Prompt of 15 tokens: the appends land in page 0's last slot, then page 1's first two."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(B, HKV, 15, D, generator=gen).half()
    pool = paged.to_pages(x, 16, 3)
    first = paged.first_pages(B, 3)
    positions = torch.full((B,), 15)
    tokens = []
    for _ in range(3):
        t = torch.randn(B, HKV, D, generator=gen).half()
        paged.write_token(pool, t, first, positions)
        positions += 1
        tokens.append(t[:, :, None])
    for b in range(B):
        assert torch.equal(pool[3 * b, 15], tokens[0][b, :, 0])
        assert torch.equal(pool[3 * b + 1, 0], tokens[1][b, :, 0])
        assert torch.equal(pool[3 * b + 1, 1], tokens[2][b, :, 0])
    indptr, indices, last = paged.page_table([18] * B, 16, 3)
    assert indices.tolist() == [0, 1, 3, 4] and last.tolist() == [2, 2]
    whole = torch.cat([x, *tokens], 2)
    for b, seq in enumerate(paged.from_pages(pool, indptr, indices, last)):
        assert torch.equal(seq, whole[b])


def test_ragged_page_table_and_appends():
    lengths = [1, 16, 17, 0, 33]
    indptr, indices, last = paged.page_table(lengths, 16, 3)
    assert indptr.tolist() == [0, 1, 2, 4, 4, 7]
    assert indices.tolist() == [0, 3, 6, 7, 12, 13, 14]
    assert last.tolist() == [1, 16, 1, 0, 1]
    pool = torch.zeros(15, 16, 1, 2)
    tok = torch.arange(10.0).reshape(5, 1, 2) + 1
    paged.write_token(pool, tok, paged.first_pages(5, 3), torch.tensor(lengths))
    hits = {tuple(hit) for hit in pool[..., 0, 0].nonzero().tolist()}
    assert hits == {(0, 1), (4, 0), (7, 1), (9, 0), (14, 1)}
    grown = paged.from_pages(pool, *paged.page_table([n + 1 for n in lengths], 16, 3))
    assert [s.shape[1] for s in grown] == [n + 1 for n in lengths]
    assert all(torch.equal(s[:, -1], tok[b]) for b, s in enumerate(grown))
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        paged.page_table([3, 49], 16, 3)


def test_fp8_pages_keep_e4m3_precision():
    x = torch.randn(B, HKV, 20, D, generator=torch.Generator().manual_seed(4)).half() * 3
    scale = paged.fp8_scale(x)
    stored = paged.to_fp8(x, scale)
    assert stored.dtype == torch.float8_e4m3fn
    back = stored.float() * scale
    # 3 mantissa bits: half an ulp is 2^-4 relative; below e4m3's normals (2^-6) the grid is 2^-9
    assert ((back - x.float()).abs() <= x.float().abs() * 2 ** -4 + scale * 2 ** -10).all()
    assert float(stored.float().abs().max()) == paged.FP8_HEADROOM


def test_plan_args():
    table = paged.page_table([20, 20], 16, 2)
    args, kwargs = paged.plan_args(table, 16, HQ, HKV, D, torch.float16, torch.float8_e4m3fn, 0.125)
    indptr, indices, last, *rest = args
    assert indptr.tolist() == [0, 2, 4] and indices.tolist() == [0, 1, 2, 3] and last.tolist() == [4, 4]
    assert rest == [HQ, HKV, D, 16]
    assert kwargs == {"q_data_type": torch.float16, "kv_data_type": torch.float8_e4m3fn,
                      "o_data_type": torch.float16, "sm_scale": 0.125}


# --- the GPU-only adapters' calls, against stand-in modules ------------------------------------------

class FakeDecodeWrapper:
    """What BatchDecodeWithPagedKVCacheWrapper's plan/run are documented to do, in torch."""

    plans: list = []

    def __init__(self, workspace, kv_layout):
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
        self.table = (indptr, indices, last_page_len)
        self.kw = kw
        FakeDecodeWrapper.plans.append(int(indptr[1]))

    def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None):
        k_pool, v_pool = paged_kv_cache
        assert k_pool.dtype == self.kw["kv_data_type"] and q.dtype == self.kw["q_data_type"]
        ks = paged.from_pages(k_pool.float(), *self.table)
        vs = paged.from_pages(v_pool.float(), *self.table)
        outs = [reference(q[b:b + 1], ks[b][None] * (k_scale or 1.0), vs[b][None] * (v_scale or 1.0))
                for b in range(q.shape[0])]  # one sequence at a time: the lengths may differ
        return torch.cat(outs).to(q.dtype)


def fake_flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, softmax_scale=None):
    """flash-attn's documented semantics: k/v [B, 1, Hkv, D] written at cache_seqlens, attention
    over cache_seqlens + 1 tokens; q [B, 1, Hq, D] -> [B, 1, Hq, D]; cache_seqlens left as is."""
    rows = torch.arange(q.shape[0])
    n = int(cache_seqlens[0])
    if k is not None:
        k_cache[rows, cache_seqlens.long()] = k[:, 0]
        v_cache[rows, cache_seqlens.long()] = v[:, 0]
        n += 1
    assert softmax_scale == 1 / math.sqrt(q.shape[-1])
    out = reference(q[:, 0], k_cache[:, :n].transpose(1, 2), v_cache[:, :n].transpose(1, 2))
    return out.to(q.dtype)[:, None]


@pytest.fixture
def fake_packages(monkeypatch):
    FakeDecodeWrapper.plans = []
    monkeypatch.setitem(sys.modules, "flashinfer",
                        types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=FakeDecodeWrapper))
    monkeypatch.setitem(sys.modules, "flash_attn",
                        types.SimpleNamespace(flash_attn_with_kvcache=fake_flash_attn_with_kvcache))


@pytest.mark.parametrize("kv", ["fp16", "fp8"])
def test_flashinfer_adapter_pages_and_plans(fake_packages, kv):
    peer = FlashInferPeer(B, HQ, HKV, D, 64, kv=kv, page_size=16)
    # prompt 14 + 4: the appends fill page 0 and open page 1
    for q, out, k, v in grow(peer, 14, 4):
        tol = FP16_TOL if kv == "fp16" else 0.1  # fp8: 2^-4 relative error on every K/V value
        assert (out.double() - reference(q, k, v)).abs().max().item() < tol
    assert FakeDecodeWrapper.plans == [1, 1, 2, 2]  # re-planned every step: pages of sequence 0
    assert peer.bytes_per_token() == 2 * HKV * D * (1 if kv == "fp8" else 2)
    assert peer.k_pool.shape == (B * 4, 16, HKV, D)


def test_flash_attn_adapter_writes_through_the_call(fake_packages):
    peer = FlashAttnPeer(B, HQ, HKV, D, 32)
    for q, out, k, v in grow(peer, 9, 3):
        assert (out.double() - reference(q, k, v)).abs().max().item() < FP16_TOL
    assert peer.cache_seqlens.tolist() == [12, 12]
    # two appends before one attend: the first is written, the second goes through the call
    gen = torch.Generator().manual_seed(9)
    toks = [torch.randn(B, HKV, D, generator=gen).half() for _ in range(4)]
    peer.append(toks[0], toks[1])
    peer.append(toks[2], toks[3])
    q = torch.randn(B, HQ, D, generator=gen).half()
    out = peer.attend(q)
    k = torch.cat([peer.k_cache[:, :14].transpose(1, 2)], 2)
    assert torch.equal(k[:, :, 12], toks[0]) and torch.equal(k[:, :, 13], toks[2])
    assert (out.double() - reference(q, k, peer.v_cache[:, :14].transpose(1, 2))).abs().max() < FP16_TOL


# --- availability -------------------------------------------------------------------------------

def test_registry_names_are_stable():
    assert list(PEERS) == ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex",
                           "flashinfer-fp16", "flashinfer-fp8", "flash-attn", "hf-quanto-int4",
                           "hf-quanto-int2", "hf-hqq-4", "hf-hqq-3", "hf-hqq-2"]
    for name, make in PEERS.items():
        assert make(1, 2, 1, 16, 8).name == name


def test_availability_on_cpu():
    rows = {name: (ok, reason) for name, ok, reason in availability("cpu")}
    assert set(rows) == set(PEERS)
    assert rows["sdpa-math"] == (True, None) and rows["flex"] == (True, None)
    for name in ("sdpa-flash", "sdpa-cudnn", "flashinfer-fp16", "flashinfer-fp8", "flash-attn"):
        ok, reason = rows[name]
        assert not ok and "CUDA" in reason, name
    for ok, reason in rows.values():
        assert ok == (reason is None)


def test_missing_names_the_package(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for module, peer, package in ((
            "flashinfer", FlashInferPeer(1, 2, 1, 64, 8, device="cuda"), "flashinfer-python"),
            ("flash_attn", FlashAttnPeer(1, 2, 1, 16, 8, device="cuda"), "flash-attn")):
        monkeypatch.setitem(sys.modules, module, None)  # None in sys.modules: the import fails
        assert package in peer.missing()
    for module, name, package in (("optimum.quanto", "hf-quanto-int4", "optimum-quanto"),
                                  ("hqq", "hf-hqq-3", "hqq")):
        monkeypatch.setitem(sys.modules, module, None)
        assert package in PEERS[name](1, 2, 1, 16, 8).missing()
    # a head_dim FlashInfer's kernels do not dispatch on: said before the package is looked for
    assert "head_dim" in FlashInferPeer(1, 2, 1, 32, 8, device="cuda").missing()


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error", "names"), [
    ({"batch": 0}, ValueError, "batch"),
    ({"batch": 2.0}, TypeError, "batch"),
    ({"q_heads": 3}, ValueError, "q_heads"),
    ({"capacity": -1}, ValueError, "capacity"),
    ({"dtype": torch.float32}, TypeError, "dtype"),
])
def test_bad_construction(kwargs, error, names):
    args = {"batch": B, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "capacity": 16, **kwargs}
    with pytest.raises(error, match=names):
        SdpaPeer("math", **args)


def test_bad_peer_options():
    with pytest.raises(ValueError, match="backend"):
        SdpaPeer("fast", B, HQ, HKV, D, 16)
    with pytest.raises(ValueError, match="kv"):
        FlashInferPeer(B, HQ, HKV, D, 16, kv="int4")
    with pytest.raises(ValueError, match="page_size"):
        FlashInferPeer(B, HQ, HKV, D, 16, page_size=0)
    with pytest.raises(ValueError, match="nbits"):
        HFQuantizedPeer("quanto", 3, B, HQ, HKV, D, 16)
    with pytest.raises(ValueError, match="residual_length"):
        HFQuantizedPeer("hqq", 4, B, HQ, HKV, D, 16, residual_length=0)


def test_bad_tensors_name_the_argument():
    peer = SdpaPeer("math", B, HQ, HKV, D, 8)
    good = torch.zeros(B, HKV, 4, D, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="load"):
        peer.append(good[:, :, 0], good[:, :, 0])
    with pytest.raises(ValueError, match=r"^k must have shape"):
        peer.load(torch.zeros(B, HQ, 4, D, dtype=torch.float16), good)
    with pytest.raises(TypeError, match=r"^v must have dtype float16"):
        peer.load(good, good.float())
    with pytest.raises(ValueError, match="prompt length"):
        peer.load(torch.zeros(B, HKV, 9, D, dtype=torch.float16), torch.zeros(B, HKV, 9, D, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"^k must be a torch.Tensor"):
        peer.load(good.tolist(), good)
    peer.load(good, good)
    with pytest.raises(ValueError, match=r"^q must have 3 dimensions"):
        peer.attend(torch.zeros(B, HQ, 1, D, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^q must have shape"):
        peer.attend(torch.zeros(B, HKV, D, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^v must have shape"):
        peer.append(good[:, :, 0], good[:, :, :2, 0])
    for _ in range(4):
        peer.append(good[:, :, 0], good[:, :, 0])
    with pytest.raises(ValueError, match="capacity"):
        peer.append(good[:, :, 0], good[:, :, 0])


# --- kvbits behind the same interface (suites/peers_support.py) -----------------------------------

KVBITS = ["kvbits2", "kvbits3", "kvbits4"]


def kvbits_bytes_per_token(bits: int) -> float:
    """Codes of K and V, and an fp16 scale and zero of each per 64 values (group 64), per kv head."""
    return HKV * (2 * D * bits / 8 + 4 * (D / 64) * 2)


@pytest.mark.parametrize("name", KVBITS)
def test_kvbits_peer_attends_what_it_stores(name):
    """Per step: the output is float64 attention over the cache's own dequantized K/V (the adapter
    maps heads, GQA and scale right), and those K/V are the original ones to within one
    quantization step of the tensor's range (it stores what it was given). 126 + 4 tokens: the
    second group of 64 completes on the second append."""
    from kvbits.decode import reference_decode
    from kvbits.decode.reference import held_kv

    peer = METHODS[name](B, HQ, HKV, D, 256)
    assert peer.missing() is None and peer.graph_capturable
    for q, out, k, v in grow(peer, 126, 4):
        stored = peer.cache.view()
        assert (out.double() - reference_decode(q, stored)).abs().max().item() < FP16_TOL
        for exact, approx in zip((k, v), held_kv(stored), strict=True):
            step_size = (exact.max() - exact.min()).item() / (2 ** peer.bits - 1)
            assert (approx.double() - exact.double()).abs().max().item() <= step_size * 1.01
    assert peer.length == 130 and peer.cache.lengths() == [130] * B
    assert peer.bytes_per_token() == kvbits_bytes_per_token(peer.bits)


def test_kvbits_peer_follows_replays():
    """Tokens the device appended unseen by the host (as replays of a captured step do; here the
    torch append on the cache's view): replayed() brings the peer's and the cache's host lengths to
    the device's, and the next step goes on from there."""
    from kvbits.decode import reference_decode
    from kvbits.decode.append import append_torch
    from kvbits.decode.cache import APPENDS

    peer = KvbitsPeer(3, B, HQ, HKV, D, 256)
    for _ in grow(peer, 60, 1):
        pass
    gen = torch.Generator().manual_seed(5)
    unseen = torch.randn(B, HKV, 6, D, generator=gen).half()
    append_torch(peer.cache.view(), unseen, unseen, None, peer.cache.errors[APPENDS, :B])  # 61 -> 67 on the "device"
    assert peer.length == 61 and peer.cache.lengths() == [61] * B
    peer.replayed(67)
    assert peer.length == 67 and peer.cache.lengths() == peer.cache.sync_lengths() == [67] * B
    tok, q = torch.randn(B, HKV, D, generator=gen).half(), torch.randn(B, HQ, D, generator=gen).half()
    peer.append(tok, tok)
    out = peer.attend(q)
    assert peer.cache.lengths() == peer.cache.sync_lengths() == [68] * B
    assert (out.double() - reference_decode(q, peer.cache.view())).abs().max().item() < FP16_TOL


def test_replayed_refuses_what_no_replay_explains():
    peer = KvbitsPeer(3, B, HQ, HKV, D, 64)
    with pytest.raises(RuntimeError, match="load"):
        peer.replayed(10)
    with pytest.raises(ValueError, match=r"^length must be in 1\.\.capacity \(64\)"):
        peer.replayed(65)
    with pytest.raises(TypeError, match="^length must be an int"):
        peer.replayed(10.0)
    with pytest.raises(RuntimeError, match="not graph-capturable"):
        SdpaPeer("math", B, HQ, HKV, D, 64).replayed(10)


def test_kvbits_peer_bad_options_and_shapes():
    with pytest.raises(ValueError, match="^bits must be one of"):
        KvbitsPeer(5, B, HQ, HKV, D, 16)
    with pytest.raises(TypeError, match="^bits must be an int"):
        KvbitsPeer(3.0, B, HQ, HKV, D, 16)
    with pytest.raises(TypeError, match="^group_size must be an int"):
        KvbitsPeer(3, B, HQ, HKV, D, 16, group_size="64")
    reason = KvbitsPeer(3, B, HQ, HKV, 48, 16).missing()  # V's groups of 64 channels do not divide 48
    assert "head_dim=48" in reason and "group_size=64" in reason
    with pytest.raises(RuntimeError, match="load a prompt first"):
        KvbitsPeer(3, B, HQ, HKV, D, 16).bytes_per_token()


def test_methods_are_the_peers_and_kvbits():
    assert list(METHODS) == [*PEERS, *KVBITS]
    for name, make in METHODS.items():
        peer = make(1, 2, 1, 64, 8)
        assert peer.name == name
        assert type(peer.version()) is str, name  # a record's metric: plain JSON, which xdist can send too


# --- one case's figures (measure) ---------------------------------------------------------------------

def test_exact_attention_goes_head_by_head_as_gqa_maps_them():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(*shape, generator=gen).half() for shape in ((B, HQ, D), (B, HKV, 33, D), (B, HKV, 33, D)))
    exact = exact_attention(q, k, v, 1 / math.sqrt(D))
    assert exact.dtype == torch.float64 and exact.shape == (B, HQ, D)
    assert torch.allclose(exact, reference(q, k, v), rtol=0, atol=1e-12)


MEASURED = ["ms", "p99_ms", "max_ms", "ms_n", "ms_min", "ms_iqr", "ms_mad", "host_ms", "bound", "graph_ms",
            "graph_p99_ms", "attend_ms", "attend_graph_ms", "attn_rel_err", "attn_rel_err_outliers", "bits",
            "bytes_per_token", "method", "version"]


@pytest.fixture(scope="module")
def measured() -> dict:
    """measure() of SDPA math and kvbits at 2, 3 and 4 bits at one small shape on CPU, long enough
    that kvbits attends codes between its fp sinks and window."""
    from kvbits.decode.cache import SINKS, WINDOW

    seq = 2 * (SINKS + WINDOW)
    return {name: measure(METHODS[name](B, HQ, HKV, D, seq + extra_tokens(2, 0)), seq, eager_steps=2, graph_steps=0)
            for name in ["sdpa-math", *KVBITS]}


def test_measure_gives_every_figure_of_a_case(measured):
    for name, figures in measured.items():
        assert sorted(figures) == sorted(MEASURED), name
        assert figures["method"] == name and figures["ms_n"] == 2 and figures["bound"] == "cpu"
        assert 0 < figures["ms_min"] <= figures["ms"] <= figures["max_ms"] and figures["attend_ms"] > 0
        assert figures["graph_ms"] is None and figures["attend_graph_ms"] is None  # no CUDA graph on CPU
    assert measured["sdpa-math"]["bytes_per_token"] == 2 * HKV * D * 2 and measured["sdpa-math"]["bits"] == 16
    for name in KVBITS:
        assert measured[name]["bytes_per_token"] == kvbits_bytes_per_token(measured[name]["bits"])


def test_measure_errors_are_against_the_original_kv(measured):
    """fp16 attention is exact to fp16 rounding; every fewer bit of kvbits costs accuracy, on
    plain K and on K with outlier channels alike (the same K/V and query for every method)."""
    for metric in ("attn_rel_err", "attn_rel_err_outliers"):
        errs = [measured[name][metric] for name in ["sdpa-math", *reversed(KVBITS)]]
        assert errs[0] < 1e-3, metric
        assert errs == sorted(errs) and errs[1] > 10 * errs[0], (metric, errs)


def test_attention_error_replaces_the_cache_and_is_reproducible():
    peer = KvbitsPeer(3, B, HQ, HKV, D, 128)
    first = attention_error(peer, 100, outliers=True, seed=3)
    assert peer.length == 101
    assert attention_error(peer, 100, outliers=True, seed=3) == first
    assert attention_error(peer, 100, outliers=False, seed=3) != first


def test_measure_bad_input():
    peer = KvbitsPeer(3, B, HQ, HKV, D, 64 + extra_tokens(2, 0))
    with pytest.raises(TypeError, match="^peer must be a harness.peers.Peer"):
        measure("kvbits3", 64, eager_steps=2, graph_steps=0)
    for kwargs, error, match in (({"seq": 0}, ValueError, "^seq must be at least 1"),
                                 ({"eager_steps": 0}, ValueError, "^eager_steps must be at least 1"),
                                 ({"graph_steps": -1}, ValueError, "^graph_steps must be at least 0"),
                                 ({"eager_steps": 1.5}, TypeError, "^eager_steps must be an int"),
                                 ({"graph_steps": 1}, ValueError, r"^peer's capacity \(68\) must hold .* = 69 tokens")):
        args = {"seq": 64, "eager_steps": 2, "graph_steps": 0, **kwargs}
        with pytest.raises(error, match=match):
            measure(peer, args.pop("seq"), **args)
    with pytest.raises(ValueError, match="^peer sdpa-flash cannot run here: SDPA's flash backend needs a CUDA"):
        measure(SdpaPeer("flash", B, HQ, HKV, D, 200), 64, eager_steps=2, graph_steps=0)


def test_helpers_bad_input():
    peer = KvbitsPeer(3, B, HQ, HKV, D, 64)
    with pytest.raises(TypeError, match="^peer must be a harness.peers.Peer"):
        attention_error(None, 10, outliers=False, seed=0)
    with pytest.raises(ValueError, match=r"^seq must leave room for one token in the peer's capacity \(64\)"):
        attention_error(peer, 64, outliers=False, seed=0)
    with pytest.raises(ValueError, match="^seq must be at least 1"):
        attention_error(peer, 0, outliers=False, seed=0)
    q, k = torch.zeros(B, HQ, D), torch.zeros(B, HKV, 5, D)
    with pytest.raises(ValueError, match="^k must have 4 dimensions"):
        exact_attention(q, k[0], k, 0.125)
    with pytest.raises(TypeError, match="^v must be a torch.Tensor"):
        exact_attention(q, k, None, 0.125)
    with pytest.raises(ValueError, match=r"^k and v must be \[B, Hkv, S, D\]"):
        exact_attention(torch.zeros(B, 3, D), k, k, 0.125)  # 3 query heads over 2 kv heads
    with pytest.raises(ValueError, match="^tokens must be at least 1"):
        paged_cache(1, HKV, D, 0, device="cpu")
    with pytest.raises(ValueError, match="^steps must be at least 1"):
        eager_figures(lambda i: None, 0)
