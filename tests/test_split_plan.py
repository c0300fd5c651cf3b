"""The fused decode's split rule (kernels.decode.split_count / split_plan), host arithmetic only."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernels import decode

SLOTS = (12 * 132, 8 * 132, 12 * 108, 6 * 16)  # H200 one-warp tiles at 168 and 255 registers, A100, small


def _planned(pairs: int, tiles: int, slots: int) -> tuple[int, int]:
    splits = max(1, min(tiles, decode.split_count(pairs, tiles, slots)))
    per = -(-tiles // splits)
    return -(-tiles // per), per


@pytest.mark.parametrize("slots", SLOTS)
def test_splits_stay_short_and_fill_whole_waves(slots):
    checked = multi = 0
    for pairs, tiles in itertools.product((1, 3, 8, 32, 64, 97, 1024, 5000), (1, 2, 7, 64, 511, 512, 2048, 9999)):
        splits, per = _planned(pairs, tiles, slots)
        checked += 1
        # every tile in exactly one split, none empty
        assert (splits - 1) * per < tiles <= splits * per, (pairs, tiles, splits, per)
        # no split longer than the limit unless each already holds one tile
        assert per <= decode.MAX_SPLIT_TILES or splits == tiles, (pairs, tiles, splits, per)
        programs = pairs * splits
        waves = -(-programs // slots)
        if waves > 1 and 2 * pairs <= slots:
            # several waves of fine enough grain: they run at least 3/4 full on average (no last
            # wave of a few programs running alone)
            assert 4 * programs >= 3 * waves * slots, (pairs, tiles, splits, programs)
            multi += 1
    assert checked == 64 and multi > 0


def test_one_wave_when_it_keeps_splits_short():
    slots = 12 * 132
    assert decode.split_count(32, 512, slots) == 49  # B1 H32 S32K: 47 splits of 11 tiles, one wave
    assert _planned(32, 512, slots) == (47, 11)
    assert _planned(64, 512, slots) == (24, 22)  # GQA B8 Hkv8 S32K: one wave
    assert _planned(32, 2048, slots) == (98, 21)  # S128K: one wave would need 42-tile splits; two waves
    assert _planned(1024, 128, slots) == (6, 22)  # B32 S8K: 3.9 waves
    assert _planned(32, 1, slots) == (1, 1)


def test_split_plan_uses_the_rule_and_honours_an_explicit_count():
    cpu = torch.device("cpu")
    assert decode.split_plan(1, 2, 0, 64, cpu) == (0, 1)
    assert decode.split_plan(1, 2, 64 * 10, 64, cpu, num_splits=3) == (3, 4)
    assert decode.split_plan(1, 2, 64 * 10, 64, cpu, num_splits=99) == (10, 1)
    splits, per = decode.split_plan(1, 1, 64 * 10, 64, cpu)  # the interpreter: a few programs
    assert splits * per >= 10 and splits <= 4


def test_resident_programs_follow_the_register_cap(monkeypatch):
    monkeypatch.setattr(decode, "MAX_REGISTERS", 168)
    assert (decode.resident_programs(1), decode.resident_programs(2)) == (12, 6)
    monkeypatch.setattr(decode, "MAX_REGISTERS", None)
    assert decode.resident_programs(1) == 8
