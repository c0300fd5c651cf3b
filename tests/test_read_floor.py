"""The read floor's kernel reads every word once; its launcher rejects what it cannot read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.measure.read_floor import read_chunks, read_floor_ms
from harness.measure.timing import graph_replay_ms, rotations

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_words(count: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (count,), generator=gen, dtype=torch.int32)


@pytest.mark.parametrize("words, programs, block", [
    (1, 1, 16), (63, 4, 16), (4096, 4, 64), (4097, 4, 64), (4097, 3, 128), (10_000, 7, 256), (50, 16, 32),
    (1000, 9, 1024),
], ids=lambda v: str(v))
def test_every_word_read_once(words, programs, block):
    x = random_words(words, words * 31 + programs)
    got = read_chunks(x.to(DEVICE), programs, block=block, warps=1).cpu().numpy()
    assert got.shape == (programs,)
    assert np.bitwise_xor.reduce(got) == np.bitwise_xor.reduce(x.numpy())


@pytest.mark.parametrize("words, programs, block", [(120, 7, 16), (150, 5, 64), (64, 16, 16)], ids=str)
def test_programs_own_contiguous_chunks(words, programs, block):
    """Flipping any one bit changes exactly one program's XOR; walking the words from the first to
    the last, the owners run in order, each a contiguous chunk, and balanced within the 16-word
    alignment (every program but the last holds the same count)."""
    x = random_words(words, words)
    base = read_chunks(x.to(DEVICE), programs, block=block, warps=1).cpu()
    owners = []
    for index in range(words):
        y = x.clone()
        y[index] ^= 1 << (index % 31)
        changed = (read_chunks(y.to(DEVICE), programs, block=block, warps=1).cpu() != base).nonzero().flatten()
        assert changed.numel() == 1, (index, changed.tolist())
        owners.append(int(changed))
    assert owners == sorted(owners) and owners[0] == 0
    counts = np.bincount(owners)
    assert len(set(counts[:-1])) <= 1 and counts[-1] <= counts[0]
    assert counts[0] % 16 == 0 or len(counts) == 1
    assert counts[0] - 16 < -(-words // programs) <= counts[0]


@pytest.mark.parametrize("bad, error, match", [
    (torch.zeros(8, dtype=torch.float32), TypeError, "x must be"),
    (torch.zeros(2, 4, dtype=torch.int32), TypeError, "x must be"),
    (torch.zeros(16, dtype=torch.int32)[::2], TypeError, "x must be"),
    (torch.zeros(0, dtype=torch.int32), ValueError, "x must hold"),
], ids=["float", "2-D", "strided", "empty"])
def test_bad_buffer(bad, error, match):
    with pytest.raises(error, match=match):
        read_chunks(bad, 2)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"programs": 0}, ValueError, "programs"), ({"programs": 2.0}, TypeError, "programs"),
    ({"programs": 2, "block": 100}, ValueError, "block"), ({"programs": 2, "block": 0}, ValueError, "block"),
    ({"programs": 2, "block": 8}, ValueError, "block"), ({"programs": 2, "warps": 3}, ValueError, "warps"),
    ({"programs": 2, "warps": 64}, ValueError, "warps"), ({"programs": True}, TypeError, "programs"),
], ids=["programs-0", "programs-float", "block-100", "block-0", "block-8", "warps-3", "warps-64", "programs-bool"])
def test_bad_launch_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        read_chunks(torch.ones(64, dtype=torch.int32), **kwargs)


def test_replay_runs_every_call_in_order_and_rejects_none():
    order = []
    calls = [lambda i=i: order.append(i) for i in range(3)]
    assert graph_replay_ms(calls, rep_ms=5) >= 0
    assert len(order) >= 6 and len(order) % 3 == 0 and order == [0, 1, 2] * (len(order) // 3)
    with pytest.raises(ValueError, match="calls"):
        graph_replay_ms([])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_floor_needs_a_gpu_and_rotation_is_single_on_cpu():
    with pytest.raises(RuntimeError, match="CUDA"):
        read_floor_ms(1 << 20)
    assert rotations(1) == 1
