"""Bad input to pack_bits / unpack_bits: each a clear ValueError or TypeError naming the
argument, recorded (type and message) for the report's bad-input catalogue."""

from __future__ import annotations

import pytest
import torch

from kvbits.packing import pack_bits, unpack_bits

u8 = torch.uint8


def _cases():
    values = torch.randint(0, 8, (4, 16), dtype=u8)
    packed = pack_bits(values, 3, backend="torch")
    words = pack_bits(torch.randint(0, 8, (2, 32), dtype=u8), 3, layout="word", backend="torch")
    yield "value >= 2**bits", lambda: pack_bits(torch.full((1, 8), 8, dtype=u8), 3), ValueError, "values"
    yield "value >= 2**bits (1 bit)", lambda: pack_bits(torch.full((1, 8), 2, dtype=u8), 1), ValueError, "values"
    yield "float values", lambda: pack_bits(values.float(), 3), TypeError, "values"
    yield "int32 values", lambda: pack_bits(values.int(), 3), TypeError, "values"
    yield "not a tensor", lambda: pack_bits([1, 2, 3, 4, 5, 6, 7, 0], 3), TypeError, "values"
    yield "row not a multiple of 8", lambda: pack_bits(values[:, :12], 3), ValueError, "multiple of 8"
    yield "row not a multiple of 32 (word)", lambda: pack_bits(values, 3, layout="word"), ValueError, "multiple of 32"
    yield "empty values", lambda: pack_bits(torch.empty(0, 8, dtype=u8), 3), ValueError, "empty"
    yield "0-d values", lambda: pack_bits(torch.tensor(3, dtype=u8), 3), ValueError, "dimension"
    yield "bits = 0", lambda: pack_bits(values, 0), ValueError, "bits"
    yield "bits = 9", lambda: pack_bits(values, 9), ValueError, "bits"
    yield "bits as float", lambda: pack_bits(values, 3.0), TypeError, "bits"
    yield "unknown layout", lambda: pack_bits(values, 3, layout="nibble"), ValueError, "layout"
    yield "unknown backend", lambda: pack_bits(values, 3, backend="numpy"), ValueError, "backend"
    yield "cuda backend on CPU tensor", lambda: pack_bits(values, 3, backend="cuda"), ValueError, "cuda"
    yield "packed bytes not whole groups", lambda: unpack_bits(packed[:, :5], 3), ValueError, "multiple of 3"
    yield "int32 packed for byte layout", lambda: unpack_bits(words, 3), TypeError, "packed"
    yield "uint8 packed for word layout", lambda: unpack_bits(packed, 3, layout="word"), TypeError, "packed"
    yield "empty packed", lambda: unpack_bits(torch.empty(2, 0, dtype=u8), 3), ValueError, "empty"
    yield "float packed", lambda: unpack_bits(packed.float(), 3), TypeError, "packed"
    yield "validate not a bool", lambda: pack_bits(values, 3, validate="no"), TypeError, "validate must be a bool"


CASES = list(_cases())


@pytest.mark.parametrize(("call", "error", "mentions"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(record, call, error, mentions):
    record.backend, record.device = "any", "cpu"
    with pytest.raises(error) as caught:
        call()
    record.add(error_type=type(caught.value).__name__, error_message=str(caught.value))
    assert mentions in str(caught.value)
