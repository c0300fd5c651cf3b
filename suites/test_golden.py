"""Golden vectors from the explicit per-octet formulas of the 3-bit byte layout (docs/design.md
section 3), written out here independently of the code under test: b0/b1/b2 from v0..v7 for
packing (``seed_pack``) and v0..v7 from b0/b1/b2 for unpacking (``seed_unpack``)."""

from __future__ import annotations

import pytest
import torch

from kvbits.packing import pack_bits, unpack_bits
from suites.packing_support import count_bit_errors, device_backend_params


def seed_pack(v: list[int]) -> list[int]:
    v0, v1, v2, v3, v4, v5, v6, v7 = v
    b0 = (v0 & 0x7) | ((v1 & 0x7) << 3) | ((v2 & 0x3) << 6)
    b1 = ((v2 >> 2) & 0x1) | ((v3 & 0x7) << 1) | ((v4 & 0x7) << 4) | ((v5 & 0x1) << 7)
    b2 = ((v5 >> 1) & 0x3) | ((v6 & 0x7) << 2) | ((v7 & 0x7) << 5)
    return [b0, b1, b2]


def seed_unpack(b: list[int]) -> list[int]:
    b0, b1, b2 = b
    return [
        b0 & 0x7,
        (b0 >> 3) & 0x7,
        ((b0 >> 6) & 0x3) | ((b1 & 0x1) << 2),
        (b1 >> 1) & 0x7,
        (b1 >> 4) & 0x7,
        ((b1 >> 7) & 0x1) | ((b2 & 0x3) << 1),
        (b2 >> 2) & 0x7,
        (b2 >> 5) & 0x7,
    ]


# Hand-checked vectors: the formulas above give these; they are also literal expectations.
LITERALS = [
    ([0, 0, 0, 0, 0, 0, 0, 0], [0x00, 0x00, 0x00]),
    ([7, 7, 7, 7, 7, 7, 7, 7], [0xFF, 0xFF, 0xFF]),
    ([1, 2, 3, 4, 5, 6, 7, 0], [0xD1, 0x58, 0x1F]),
    ([0, 0, 4, 0, 0, 0, 0, 0], [0x00, 0x01, 0x00]),  # v2's MSB lands in b1 bit 0
    ([0, 0, 3, 0, 0, 0, 0, 0], [0xC0, 0x00, 0x00]),  # v2's 2 LSBs land in b0 bits 7:6
    ([0, 0, 0, 0, 0, 1, 0, 0], [0x00, 0x80, 0x00]),  # v5's LSB lands in b1 bit 7
    ([0, 0, 0, 0, 0, 6, 0, 0], [0x00, 0x00, 0x03]),  # v5's 2 MSBs land in b2 bits 1:0
]


def test_literal_vectors_agree_with_the_seed_formulas():
    for values, packed in LITERALS:
        assert seed_pack(values) == packed
        assert seed_unpack(packed) == values


@pytest.mark.parametrize("octets", [1, 5, 4096])
@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_pack_and_unpack_match_the_seed_formulas(record, rng, device, backend, octets):
    record.backend, record.device = backend, device
    values = torch.randint(0, 8, (octets, 8), generator=rng, dtype=torch.uint8)
    values[: len(LITERALS)] = torch.tensor([v for v, _ in LITERALS][:octets], dtype=torch.uint8)
    golden_packed = torch.tensor([seed_pack(row) for row in values.tolist()], dtype=torch.uint8)
    stream = torch.randint(0, 256, (octets, 3), generator=rng, dtype=torch.uint8)
    golden_values = torch.tensor([seed_unpack(row) for row in stream.tolist()], dtype=torch.uint8)
    # One row holding every octet, so multi-octet rows (and their offsets) are exercised too.
    packed = pack_bits(values.reshape(1, -1).to(device), 3, backend=backend).cpu()
    unpacked = unpack_bits(stream.reshape(1, -1).to(device), 3, backend=backend).cpu()
    errors = count_bit_errors(packed.reshape(-1, 3), golden_packed)
    errors += count_bit_errors(unpacked.reshape(-1, 8), golden_values)
    record.add(states_checked=2 * octets, bit_errors=errors)
    assert errors == 0
