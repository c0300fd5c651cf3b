"""Walking patterns: lane isolation across byte (v2, v5) and word (lanes 10, 21) boundaries.

* every lane x every value x backgrounds 000 and 111 (3 bits: 32 x 8 x 2 rows of 32
  values), both layouts: the packed stream equals the definition bit for bit, it
  unpacks back with zero crosstalk into the neighbours, and uint8[12] == int32[3];
* walking single bits through the packed stream (a one on zeros, a zero on ones): each
  flips exactly one bit of exactly one lane, the lane and bit that the format names;
* the same lane sweeps for every width 1..8.
"""

from __future__ import annotations

import pytest
import torch

from kvbits.packing import pack_bits, unpack_bits
from suites.packing_support import count_bit_errors, device_backend_params, model_pack_row


def _walking_rows(bits: int, lanes: int) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    """One row per (lane, value, background): background everywhere, ``value`` at ``lane``."""
    top = (1 << bits) - 1
    rows, labels = [], []
    for background in (0, top):
        for lane in range(lanes):
            for value in range(1 << bits):
                row = [background] * lanes
                row[lane] = value
                rows.append(row)
                labels.append((lane, value, background))
    return torch.tensor(rows, dtype=torch.uint8), labels


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_walking_values_through_every_lane(record, device, backend, bits):
    if backend == "cuda" and bits != 3:
        pytest.skip("the CUDA backend implements 3 bits")
    lanes = 32  # one whole word group for every width: 32*bits bits
    record.backend, record.device, record.variant = backend, device, f"{bits}bit"
    rows, _ = _walking_rows(bits, lanes)
    expected = torch.tensor([list(model_pack_row(r, bits)) for r in rows.tolist()], dtype=torch.uint8)
    rows = rows.to(device)
    errors = 0
    for layout in ("byte", "word"):
        packed = pack_bits(rows, bits, layout=layout, backend=backend)
        as_bytes = packed.cpu().contiguous().view(torch.uint8)
        errors += count_bit_errors(as_bytes, expected)  # uint8[4*bits] == int32[bits] byte for byte
        back = unpack_bits(packed, bits, layout=layout, backend=backend)
        errors += count_bit_errors(back.cpu(), rows.cpu())  # zero crosstalk into neighbours
    record.add(states_checked=2 * rows.shape[0], bit_errors=errors, lanes=lanes)
    assert errors == 0


@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_three_bit_straddling_lanes_in_both_layouts(record, device, backend):
    """The 3-bit values that straddle a boundary (docs/design.md section 3): v2, v5 in each octet;
    lanes 10 and 21 across words."""
    record.backend, record.device = backend, device
    rows, labels = _walking_rows(3, 32)
    rows = rows.to(device)
    by_byte = pack_bits(rows, 3, layout="byte", backend=backend)
    by_word = pack_bits(rows, 3, layout="word", backend=backend)
    assert by_word.dtype == torch.int32 and by_word.shape == (rows.shape[0], 3)
    assert by_byte.shape == (rows.shape[0], 12)
    assert torch.equal(by_word.contiguous().view(torch.uint8), by_byte)
    words = by_word.cpu().to(torch.int64) & 0xFFFFFFFF
    checked = 0
    for index, (lane, value, background) in enumerate(labels):
        if background != 0 or lane not in (2, 5, 10, 21):
            continue
        w0, w1, w2 = (int(w) for w in words[index])
        if lane == 10:  # bits 30..32: 2 LSBs in W0[31:30], MSB in W1[0]
            assert (w0 >> 30) == value & 0x3 and (w1 & 0x1) == value >> 2 and w2 == 0
        elif lane == 21:  # bits 63..65: LSB in W1[31], 2 MSBs in W2[1:0]
            assert (w1 >> 31) == value & 0x1 and (w2 & 0x3) == value >> 1 and w0 == 0
        else:
            b0, b1, b2 = (int(b) for b in by_byte[index, :3].cpu())
            if lane == 2:  # bits 6..8: b0[7:6] and b1[0]
                assert (b0 >> 6) == value & 0x3 and (b1 & 0x1) == value >> 2 and b2 == 0
            else:  # lane 5, bits 15..17: b1[7] and b2[1:0]
                assert (b1 >> 7) == value & 0x1 and (b2 & 0x3) == value >> 1 and b0 == 0
        checked += 1
    record.add(states_checked=checked, bit_errors=0)
    assert checked == 4 * 8


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_walking_bits_through_the_packed_stream(record, device, backend, bits):
    """Flip one packed bit at a time (on all-zeros and on all-ones): exactly one lane changes,
    by exactly the bit the format assigns (lane = bit // bits, bit within lane = bit % bits)."""
    if backend == "cuda" and bits != 3:
        pytest.skip("the CUDA backend implements 3 bits")
    record.backend, record.device, record.variant = backend, device, f"{bits}bit"
    n_bits = 32 * bits  # one word group
    positions = torch.arange(n_bits)
    single = torch.zeros(n_bits, n_bits // 8, dtype=torch.uint8)
    single[positions, positions // 8] = (1 << (positions % 8)).to(torch.uint8)
    errors = 0
    for background in (0x00, 0xFF):
        stream = single ^ background  # walking one on zeros, walking zero on ones
        for layout in ("byte", "word"):
            packed = stream.view(torch.int32) if layout == "word" else stream
            values = unpack_bits(packed.to(device), bits, layout=layout, backend=backend).cpu().to(torch.int64)
            base = 0 if background == 0 else (1 << bits) - 1
            delta = values ^ base  # [n_bits, 32]: what each flipped bit changed, per lane
            expected = torch.zeros_like(delta)
            expected[positions, positions // bits] = 1 << (positions % bits)
            errors += count_bit_errors(delta.to(torch.uint8), expected.to(torch.uint8))
    record.add(states_checked=4 * n_bits, bit_errors=errors)
    assert errors == 0
