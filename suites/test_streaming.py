"""Streaming cache: appending token by token or in chunks gives exactly the one-shot cache.

Each completed group of G tokens is quantized and packed; the partial group stays in
the residual window; capacity grows on demand; ragged batches append per sequence.
"""

from __future__ import annotations

import pytest
import torch
from affine_support import (
    cache_mismatches,
    device_backends,
    elements,
    fresh_seed,  # noqa: F401  (the seed fixture)
    gpu_or_small,
    quantize,
    random_kv,
)

import kvbits
from kvbits.kv_cache import QuantizedKV


def _stream(k, v, chunks, bits, g, backend, **kw) -> QuantizedKV:
    b, h, s, d = k.shape
    qkv = QuantizedKV.empty(b, h, d, bits=bits, group_size=g, dtype=k.dtype, device=k.device, **kw)
    start = 0
    sizes = iter(chunks)
    while start < s:
        n = min(next(sizes), s - start)
        if n == 1:
            qkv.append(k[:, :, start], v[:, :, start], backend=backend)  # one token, [B, H, D]
        else:
            qkv.append(k[:, :, start:start + n], v[:, :, start:start + n], backend=backend)
        start += n
    return qkv


def _cycle(*sizes):
    while True:
        yield from sizes


@pytest.mark.parametrize(("device", "backend"), device_backends())
@pytest.mark.parametrize("chunking", ["tokens", "mixed", "groups"])
@pytest.mark.parametrize(("bits", "g", "dtype"), [
    (3, 32, torch.float16), (2, 64, torch.bfloat16), (4, 32, torch.float32), (8, 32, torch.float16),
])
def test_append_equals_one_shot(record, seed, device, backend, bits, g, dtype, chunking):
    s = gpu_or_small(2 * g + 5, 16 * g + 5, device)
    if chunking == "tokens" and backend == "triton" and device == "cpu":
        s = g + 3  # every append is a launch in the interpreter
    k, v = random_kv((2, 2, s, 64), dtype, device, seed=seed, kind="outliers")
    chunks = {"tokens": _cycle(1), "mixed": _cycle(1, 3, g - 1, g, g + 5, 2), "groups": _cycle(g)}[chunking]
    streamed = _stream(k, v, chunks, bits, g, backend)
    one_shot = quantize(k, v, bits, g, backend)
    diff = cache_mismatches(one_shot, streamed)
    assert not diff, diff
    assert streamed.seq_lens.tolist() == [s, s]
    assert streamed.capacity >= s // g * g and streamed.capacity % g == 0
    k_hat, v_hat = kvbits.dequantize_kv(streamed)
    k_ref, v_ref = kvbits.dequantize_kv(one_shot)
    assert torch.equal(k_hat, k_ref) and torch.equal(v_hat, v_ref)
    record.backend, record.variant, record.device = backend, f"b{bits}-g{g}-{chunking}", device
    record.add(states_checked=elements(streamed), bit_errors=0, shape=f"2x2x{s}x64")


@pytest.mark.parametrize(("device", "backend"), device_backends())
def test_ragged_batch_appends_per_sequence(record, seed, device, backend):
    """Sequences of different lengths: each one streams exactly like its own one-shot cache."""
    g, extra = 32, 40
    lens = [5, 32, 70]
    s = max(lens) + extra
    k, v = random_kv((3, 2, s, 64), torch.float16, device, seed=seed)
    qkv = kvbits.quantize_kv(k[:, :, : max(lens)], v[:, :, : max(lens)], 3, group_size=g, backend=backend,
                              seq_lens=lens)
    assert qkv.seq_lens.tolist() == lens
    new_k, new_v = random_kv((3, 2, extra, 64), torch.float16, device, seed=seed + 1)
    for start, n in ((0, 1), (1, 30), (31, 9)):
        qkv.append(new_k[:, :, start:start + n], new_v[:, :, start:start + n], backend=backend)
    checked = 0
    for i, n in enumerate(lens):
        ki = torch.cat([k[i:i + 1, :, :n], new_k[i:i + 1]], dim=2)
        vi = torch.cat([v[i:i + 1, :, :n], new_v[i:i + 1]], dim=2)
        ref = quantize(ki, vi, 3, g, backend)
        row = qkv._rows(slice(i, i + 1))
        diff = cache_mismatches(ref, row)
        assert not diff, (i, diff)
        checked += elements(ref)
    k_hat, _ = kvbits.dequantize_kv(qkv)
    assert k_hat.shape[2] == max(lens) + extra
    assert bool((k_hat[0, :, lens[0] + extra:] == 0).all()), "positions past seq_lens are zero"
    record.backend, record.variant, record.device = backend, "ragged", device
    record.add(states_checked=checked, bit_errors=0)


@pytest.mark.parametrize(("device", "backend"), device_backends()[:1])
def test_capacity_grows_and_keeps_data(record, seed, device, backend):
    g = 32
    k, v = random_kv((1, 1, 5 * g, 32), torch.float16, device, seed=seed)
    qkv = QuantizedKV.empty(1, 1, 32, bits=3, group_size=g, capacity=g, device=device)
    qkv.append(k[:, :, : 2 * g + 1], v[:, :, : 2 * g + 1], backend=backend)
    assert qkv.capacity >= 2 * g
    qkv.reserve(10 * g)
    assert qkv.capacity == 10 * g
    qkv.append(k[:, :, 2 * g + 1:], v[:, :, 2 * g + 1:], backend=backend)
    assert not cache_mismatches(quantize(k, v, 3, g, backend), qkv)
    record.backend, record.device = backend, device
    record.add(states_checked=elements(qkv), capacity=qkv.capacity)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("sdt", [torch.float16, torch.float32], ids=["fp16-scales", "fp32-scales"])
def test_bytes_per_token_and_compression(record, bits, g, sdt):
    """bytes_per_token equals the storage the codes, scales and zeros take per token of capacity."""
    d, h, cap = 128, 4, 4 * 128
    qkv = QuantizedKV.empty(2, h, d, bits=bits, group_size=g, capacity=cap, scale_dtype=sdt)
    stored = sum(getattr(qkv, f).numel() * getattr(qkv, f).element_size()
                 for f in ("k_codes", "v_codes", "k_scale", "k_zero", "v_scale", "v_zero"))
    per_token = stored / (qkv.batch * cap)
    assert qkv.bytes_per_token() == pytest.approx(per_token, rel=0, abs=1e-9)
    assert qkv.fp16_bytes_per_token() == h * 2 * d * 2
    ratio = qkv.compression_vs_fp16()
    sdt_bytes = 2 if sdt == torch.float16 else 4
    assert ratio == pytest.approx(16 / (bits + 2 * 8 * sdt_bytes / g))
    assert qkv.nbytes() > stored
    record.backend, record.variant, record.device = "torch", f"b{bits}-g{g}-{str(sdt)[6:]}", "cpu"
    record.add(bytes_per_token=qkv.bytes_per_token(), compression_vs_fp16=ratio, head_dim=d, heads=h)


def test_token_by_token_appends_grow_the_capacity_geometrically(record):
    """Appending 1,024 tokens one at a time reallocates the codes a logarithmic number of times
    (never one group at a time), and never holds more than twice the capacity it needs."""
    g, n = 32, 1024
    k, v = random_kv((1, 1, n, 32), torch.float16, "cpu", seed=5)
    qkv = QuantizedKV.empty(1, 1, 32, bits=3, group_size=g)
    storages = set()
    for t in range(n):
        qkv.append(k[:, :, t], v[:, :, t], backend="torch")
        storages.add(qkv.k_codes.data_ptr())
        assert qkv.capacity <= max(2 * (t + 1), g)
    assert len(storages) <= 8, len(storages)
    assert not cache_mismatches(quantize(k, v, 3, g, "torch"), qkv)
    record.backend, record.device = "torch", "cpu"
    record.add(states_checked=elements(qkv), reallocations=len(storages))


def test_appended_values_keep_no_autograd_graph(record):
    k, v = random_kv((1, 2, 40, 64), torch.float32, "cpu", seed=6)
    k.requires_grad_(True)
    qkv = QuantizedKV.empty(1, 2, 64, bits=3, group_size=32, dtype=torch.float32)
    qkv.append(k, v, backend="torch")
    assert not qkv.k_residual.requires_grad and qkv.k_residual.grad_fn is None
    record.add(states_checked=1)


def test_an_empty_batch_appends_nothing(record):
    qkv = QuantizedKV.empty(0, 2, 64, bits=3, group_size=32)
    qkv.append(torch.zeros(0, 2, 64, dtype=torch.float16), torch.zeros(0, 2, 64, dtype=torch.float16))
    assert qkv.seq_lens.numel() == 0 and qkv.capacity == 0
    record.add(states_checked=1)
