"""GPTQ compatibility: for 3 bits the word layout is GPTQ's 3-word stream.

GPTQ's ``QuantLinear.pack`` (and exllama's loader) pack a column of 32 3-bit values
into 3 int32 rows: 10 whole values, one split across rows (bits 30..32), 10, one
split (bits 63..65), 10. Its loop is written out below as GPTQ writes it, on numpy
uint32 rows, and compared with ``pack_bits(..., layout="word")`` on the transposed
matrix (GPTQ streams down a column; the canonical stream runs along the last dim).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvbits.packing import pack_bits, unpack_bits
from suites.packing_support import count_bit_errors, device_backend_params


def gptq_pack_3bit(intweight: np.ndarray) -> np.ndarray:
    """intweight uint32 [rows, cols] (rows % 32 == 0) -> qweight uint32 [rows*3/32, cols]."""
    qweight = np.zeros((intweight.shape[0] // 32 * 3, intweight.shape[1]), dtype=np.uint32)
    i = row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + 10):
            qweight[row] |= intweight[j] << (3 * (j - i))
        i += 10
        qweight[row] |= intweight[i] << 30
        row += 1
        qweight[row] |= (intweight[i] >> 2) & 1
        i += 1
        for j in range(i, i + 10):
            qweight[row] |= intweight[j] << (3 * (j - i) + 1)
        i += 10
        qweight[row] |= intweight[i] << 31
        row += 1
        qweight[row] |= (intweight[i] >> 1) & 0x3
        i += 1
        for j in range(i, i + 10):
            qweight[row] |= intweight[j] << (3 * (j - i) + 2)
        i += 10
        row += 1
    return qweight


@pytest.mark.parametrize(("rows", "cols"), [(32, 1), (64, 7), (4096, 3)])
@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_word_layout_is_gptq_stream(record, rng, device, backend, rows, cols):
    record.backend, record.device, record.variant = backend, device, "word"
    intweight = torch.randint(0, 8, (rows, cols), generator=rng, dtype=torch.uint8)
    qweight = gptq_pack_3bit(intweight.numpy().astype(np.uint32))  # [rows*3/32, cols]
    expected = torch.from_numpy(qweight.T.copy().view(np.int32))  # [cols, rows*3/32]
    ours = pack_bits(intweight.T.contiguous().to(device), 3, layout="word", backend=backend).cpu()
    back = unpack_bits(expected.to(device), 3, layout="word", backend=backend).cpu()
    errors = count_bit_errors(ours, expected) + count_bit_errors(back, intweight.T.contiguous())
    record.add(states_checked=rows * cols, bit_errors=errors)
    assert ours.shape == expected.shape
    assert errors == 0
