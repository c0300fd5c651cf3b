"""The read floor's kernel reads every word once; its launcher rejects what it cannot read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.read_floor import read_chunks, read_floor_ms
from harness.timing import graph_replay_ms, rotations

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def chunk_xors(x: torch.Tensor, programs: int, block: int) -> np.ndarray:
    """Each program's expected XOR: numpy over the same contiguous chunks."""
    words = x.cpu().numpy()
    per = -(-max(len(words), 1) // programs)
    per = -(-per // block) * block
    return np.array([np.bitwise_xor.reduce(words[p * per:(p + 1) * per]) if p * per < len(words) else 0
                     for p in range(programs)], dtype=np.int32)


@pytest.mark.parametrize("words, programs, block", [
    (1, 1, 64), (63, 4, 64), (4096, 4, 64), (4097, 3, 128), (10_000, 7, 256), (50, 16, 32),
], ids=lambda v: str(v))
def test_every_word_read_once(words, programs, block):
    gen = torch.Generator().manual_seed(words * 31 + programs)
    x = torch.randint(-2**31, 2**31 - 1, (words,), generator=gen, dtype=torch.int32).to(DEVICE)
    got = read_chunks(x, programs, block=block, warps=1).cpu().numpy()
    np.testing.assert_array_equal(got, chunk_xors(x, programs, block))
    assert np.bitwise_xor.reduce(got) == np.bitwise_xor.reduce(x.cpu().numpy())


def test_a_flipped_bit_in_any_chunk_shows():
    """No word escapes: flipping one bit anywhere changes exactly its program's result."""
    x = torch.randint(-2**31, 2**31 - 1, (1000,), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    base = read_chunks(x.to(DEVICE), 5, block=64, warps=1).cpu()
    for index in (0, 255, 256, 511, 999):
        y = x.clone()
        y[index] ^= 1 << (index % 31)
        diff = (read_chunks(y.to(DEVICE), 5, block=64, warps=1).cpu() != base).nonzero().flatten().tolist()
        assert diff == [index // 256]


@pytest.mark.parametrize("bad, error, match", [
    (torch.zeros(8, dtype=torch.float32), TypeError, "int32"),
    (torch.zeros(2, 4, dtype=torch.int32), TypeError, "1-D"),
    (torch.zeros(16, dtype=torch.int32)[::2], TypeError, "contiguous"),
])
def test_bad_buffer(bad, error, match):
    with pytest.raises(error, match=match):
        read_chunks(bad, 2)


def test_bad_program_count():
    with pytest.raises(ValueError, match="programs"):
        read_chunks(torch.zeros(8, dtype=torch.int32), 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_floor_needs_a_gpu_and_rotation_is_single_on_cpu():
    with pytest.raises(RuntimeError, match="CUDA"):
        read_floor_ms(1 << 20)
    assert rotations(1) == 1
    calls = []
    assert graph_replay_ms([lambda: calls.append(1)]) > 0
    assert calls
