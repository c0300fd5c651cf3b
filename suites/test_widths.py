"""Every width 1..8 bits in both layouts.

* exhaustive over one full group's states wherever that is at most 2^24 states
  (byte layout: 1, 2, 4, 8 bits, one byte per group, and 6 bits, 4 values in 3 bytes;
  3 bits is the bijection suite's), both inverses;
* hypothesis properties elsewhere (5 and 7 bits in bytes; all widths in words): the
  packed stream equals the definition (a Python-int model), unpacks back, and the word
  view is the byte view's bytes;
* shapes: batched leading dims and awkward row lengths.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbits.packing import geometry, pack_bits, unpack_bits
from suites.packing_support import (
    backends_for,
    count_bit_errors,
    device_backend_params,
    lanes_of,
    model_pack_row,
    model_unpack_row,
    state_chunks,
)

EXHAUSTIVE = [1, 2, 4, 6, 8]  # widths whose byte group has at most 2^24 states


@pytest.mark.parametrize("bits", EXHAUSTIVE)
@pytest.mark.parametrize(("device", "backend"), device_backend_params(bits=0))
def test_every_group_state_both_inverses(record, device, backend, bits):
    geo = geometry(bits, "byte")
    group_bits = bits * geo.values
    record.backend, record.device, record.variant = backend, device, f"{bits}bit"
    errors = checked = 0
    for states in state_chunks(group_bits, device):
        values = lanes_of(states, bits, geo.values)  # every value state of one group
        stream = lanes_of(states, 8, geo.units)  # ... whose packed form is the state itself
        packed = pack_bits(values, bits, backend=backend)
        errors += count_bit_errors(packed, stream)
        errors += count_bit_errors(unpack_bits(packed, bits, backend=backend), values)
        errors += count_bit_errors(pack_bits(unpack_bits(stream, bits, backend=backend), bits, backend=backend), stream)
        checked += len(states)
    record.add(states_checked=checked, bit_errors=errors)
    assert checked == 1 << group_bits
    assert errors == 0


def _cpu_backends() -> list[str]:
    return backends_for("cpu", bits=0)


@st.composite
def rows_of(draw, bits: int, layout: str):
    group = geometry(bits, layout).values
    groups = draw(st.integers(1, 4))
    return draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=group * groups, max_size=group * groups))


PROPERTY_CASES = [
    pytest.param(bits, layout, id=f"{bits}bit-{layout}")
    for layout in ("byte", "word")
    for bits in range(1, 9)
    if layout == "word" or bits not in (*EXHAUSTIVE, 3)  # the rest are covered exhaustively
]


@pytest.mark.parametrize("backend", _cpu_backends())
@pytest.mark.parametrize(("bits", "layout"), PROPERTY_CASES)
def test_random_rows_match_the_bit_stream_model(record, backend, layout, bits):
    record.backend, record.device, record.variant = backend, "cpu", f"{bits}bit-{layout}"
    examples = []

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(row=rows_of(bits, layout))
    def check(row):
        values = torch.tensor([row], dtype=torch.uint8)
        packed = pack_bits(values, bits, layout=layout, backend=backend)
        as_bytes = bytes(packed.contiguous().view(torch.uint8).reshape(-1).tolist())
        assert as_bytes == model_pack_row(row, bits)
        assert unpack_bits(packed, bits, layout=layout, backend=backend).tolist() == [row]
        assert model_unpack_row(as_bytes, bits) == row
        examples.append(len(row))

    check()
    record.add(states_checked=sum(examples), bit_errors=0, examples=len(examples))


@pytest.mark.parametrize("shape", [(7, 3, 64), (1, 8), (2, 1, 1, 256), (33, 96)])
@pytest.mark.parametrize("layout", ["byte", "word"])
@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize(("device", "backend"), device_backend_params(bits=0))
def test_batched_shapes_agree_with_the_reference(record, rng, device, backend, bits, layout, shape):
    group = geometry(bits, layout).values
    if shape[-1] % group:
        shape = (*shape[:-1], shape[-1] * group)
    record.backend, record.device, record.variant = backend, device, f"{bits}bit-{layout}"
    values = torch.randint(0, 1 << bits, shape, generator=rng, dtype=torch.uint8)
    rows = [list(model_pack_row(row, bits)) for row in values.reshape(-1, shape[-1]).tolist()]
    expected = torch.tensor(rows, dtype=torch.uint8).reshape(*shape[:-1], -1)  # from the format's definition
    if layout == "word":
        expected = expected.view(torch.int32)
    packed = pack_bits(values.to(device), bits, layout=layout, backend=backend)
    errors = count_bit_errors(packed.cpu(), expected)
    errors += count_bit_errors(unpack_bits(packed, bits, layout=layout, backend=backend).cpu(), values)
    record.add(states_checked=values.numel(), bit_errors=errors, shape="x".join(map(str, shape)))
    assert packed.shape == expected.shape
    assert errors == 0


@pytest.mark.parametrize(("device", "backend"), device_backend_params(3))
def test_non_contiguous_input_packs_correctly(record, rng, device, backend):
    record.backend, record.device = backend, device
    base = torch.randint(0, 8, (64, 48), generator=rng, dtype=torch.uint8).to(device)
    strided = base.t()  # [48, 64], last-dim stride 48
    assert not strided.is_contiguous()
    packed = pack_bits(strided, 3, backend=backend)
    expected = pack_bits(strided.contiguous().cpu(), 3, backend="torch")
    errors = count_bit_errors(packed.cpu(), expected)
    packed_view = torch.cat([packed, packed], dim=-1)[:, ::2]  # non-contiguous packed bytes
    errors += count_bit_errors(
        unpack_bits(packed_view, 3, backend=backend).cpu(),
        unpack_bits(packed_view.contiguous().cpu(), 3, backend="torch"),
    )
    record.add(states_checked=strided.numel(), bit_errors=errors)
    assert errors == 0
