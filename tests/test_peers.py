"""The decode benchmarks' peers (harness.peers), on CPU.

Peers that run here (SDPA math, FlexAttention eager) are loaded with a random prompt, grown one
token at a time across their boundary (a KV block of the block mask) and compared with float64
attention over every token so far. SDPA's CUDA-only backends are checked through ``missing()``
naming the device.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.peers import PEERS, availability
from harness.peers.sdpa import SdpaPeer

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


# --- availability -------------------------------------------------------------------------------

def test_registry_names_are_stable():
    assert list(PEERS) == ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex"]
    for name, make in PEERS.items():
        assert make(1, 2, 1, 16, 8).name == name


def test_availability_on_cpu():
    rows = {name: (ok, reason) for name, ok, reason in availability("cpu")}
    assert set(rows) == set(PEERS)
    assert rows["sdpa-math"] == (True, None) and rows["flex"] == (True, None)
    for name in ("sdpa-flash", "sdpa-cudnn"):
        ok, reason = rows[name]
        assert not ok and "CUDA" in reason, name
    for ok, reason in rows.values():
        assert ok == (reason is None)


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
