"""The quality measurement's parts that need no model (harness/quality): the protocol's
segments and checks, the emulated schemes' quantizers and which positions they read quantized,
and the cache settings' names and checks."""

from __future__ import annotations

import pytest
import torch

from harness.quality.caches import CacheSpec
from harness.quality.emulate import Scheme, fake_quantize, hadamard, read_quantized
from harness.quality.protocol import Protocol, matched_before_divergence
from kvbits.affine import quantize_dequantize


def test_segments_cover_the_text_without_overlap():
    protocol = Protocol(prompt=4, steps=3, segments=3)
    tokens = torch.arange(40)
    segments = protocol.segments_of(tokens)
    assert [s.tolist() for s in segments] == [list(range(i * 8, i * 8 + 8)) for i in range(3)]
    assert [s[0].item() for s in Protocol(prompt=4, steps=3, segments=2, stride=5).segments_of(tokens)] == [0, 5]
    with pytest.raises(ValueError, match="3 segments of 8 tokens 8 apart need 24 tokens; the text has 23"):
        protocol.segments_of(tokens[:23])


@pytest.mark.parametrize(("kwargs", "name"), [({"prompt": 0}, "prompt"), ({"steps": -1}, "steps"),
                                              ({"segments": True}, "segments"), ({"stride": 0}, "stride"),
                                              ({"greedy": -2}, "greedy")])
def test_protocol_refuses_bad_sizes(kwargs, name):
    args = {"prompt": 4, "steps": 4, "segments": 1, **kwargs}
    with pytest.raises(ValueError, match=f"^{name} must be"):
        Protocol(**args)


def test_greedy_match_counts_leading_equal_tokens():
    a = torch.tensor([1, 2, 3, 4])
    assert matched_before_divergence(a, torch.tensor([1, 2, 9, 4])) == 2
    assert matched_before_divergence(a, torch.tensor([7, 2, 3, 4])) == 0
    assert matched_before_divergence(a, a.clone()) == 4


def test_cache_specs_are_named_and_checked():
    assert CacheSpec("kvbits", 3, sinks=0, window=0).name == "kvbits-3bit-s0w0"
    assert [CacheSpec("kvbits", 3).name, CacheSpec("kvbits", 2, group_size=32).name, CacheSpec("quanto", 4).name,
            CacheSpec("hqq", 3).name, CacheSpec("fp16").name] == [
        "kvbits-3bit", "kvbits-2bit-g32", "quanto-int4", "hqq-3bit", "fp16"]
    with pytest.raises(ValueError, match="kind must be one of"):
        CacheSpec("int8", 8)
    with pytest.raises(ValueError, match="bits=0 for kind 'kvbits'"):
        CacheSpec("kvbits")
    with pytest.raises(ValueError, match="bits=4 for kind 'full'"):
        CacheSpec("full", 4)


def test_read_quantized_keeps_prompt_window_and_sinks_exact():
    g = 4
    mask = read_quantized(20, 6, Scheme(3, group_size=g), "cpu")
    assert not mask[:6].any()  # the prompt's queries attend exactly
    # query 9 holds positions 0..9: groups 0 and 1 (0..7) complete, 8..9 the partial group
    assert mask[9].tolist() == [True] * 8 + [False] * 12
    assert mask[11].tolist() == [True] * 12 + [False] * 8  # 11 completes group 2
    windowed = read_quantized(20, 6, Scheme(3, group_size=g, window=4, sinks=2), "cpu")
    assert windowed[11].tolist() == [False] * 2 + [True] * 6 + [False] * 12
    assert not windowed[6].any()


@pytest.mark.parametrize("zero", ["holds-zero", "integer", "float"])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_emulated_quantizers_stay_within_half_a_step(zero, bits):
    g = torch.Generator().manual_seed(bits)
    x = (torch.randn(1, 2, 128, 64, generator=g) + torch.randn(1, 1, 1, 64, generator=g) * 4).half().float()
    for per_channel in (True, False):
        x_hat = fake_quantize(x, bits, 64, per_channel, zero)
        groups = x.reshape(1, 2, 2, 64, 64) if per_channel else x.reshape(1, 2, 128, 1, 64)
        dim = 3 if per_channel else 4
        lo, hi = groups.amin(dim, keepdim=True), groups.amax(dim, keepdim=True)
        if zero == "holds-zero":
            lo, hi = lo.clamp(max=0), hi.clamp(min=0)
        step = ((hi - lo) / (2**bits - 1)).half().float() * (1 + 2**-10)  # rounded up to fp16
        error = (x_hat.reshape(groups.shape) - groups).abs()
        slack = 1e-3 if zero == "float" else 1e-6  # the float zero point is stored in fp16
        assert (error <= step / 2 + slack * groups.abs().amax(dim, keepdim=True) + 1e-6).all(), (zero, per_channel)


def test_emulated_kvbits_scheme_is_kvbits_own_quantizer():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 100, 64, generator=g).half().float()
    assert torch.equal(fake_quantize(x, 3, 32, True, "kvbits"), quantize_dequantize(x, 3, group_size=32))
    assert torch.equal(fake_quantize(x, 3, 32, False, "kvbits"),
                       quantize_dequantize(x, 3, group_size=32, grouping="token"))


def test_hadamard_is_orthonormal_and_schemes_are_checked():
    h = hadamard(64)
    assert torch.allclose(h @ h.T, torch.eye(64), atol=1e-6)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(48)
    with pytest.raises(ValueError, match="zero must be one of"):
        Scheme(3, zero="none")
    with pytest.raises(ValueError, match="window .* must be a multiple of the K group"):
        Scheme(3, window=40)
    assert Scheme(2, k_bits=4, k_group_size=32, window=64, sinks=64).label() == \
        "K4V2, g64/K32, kvbits, window 64, sinks 64"
