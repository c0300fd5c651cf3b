"""The fused decode's split rule (kvbits.decode.launch.split_count through split_plan), host arithmetic
only: the GPU's SM count is stubbed, nothing runs on a device."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvbits.decode import launch as decode

CUDA = torch.device("cuda")  # only its type is read: split_plan takes the GPU branch
SMS = (132, 108, 16)  # H200, A100, a small part


def _plan(monkeypatch, sms: int, pairs: int, tiles: int, warps: int = 1, registers=168) -> tuple[int, int]:
    monkeypatch.setattr(decode, "sm_count", lambda device: sms)
    monkeypatch.setattr(decode, "MAX_REGISTERS", registers)
    monkeypatch.setattr(decode, "SPLIT_PROGRAMS_PER_SM", None)
    return decode.split_plan(pairs, 1, 64 * tiles, 64, CUDA, warps=warps)


@pytest.mark.parametrize("sms", SMS)
@pytest.mark.parametrize("registers", [168, None])
def test_splits_cover_the_tiles_stay_short_and_fill_whole_waves(monkeypatch, sms, registers):
    slots = (12 if registers == 168 else 8) * sms  # one-warp programs resident per SM, times SMs
    multi = 0
    for pairs, tiles in itertools.product((1, 3, 8, 32, 64, 97, 1024, 5000), (1, 2, 7, 64, 511, 512, 2048, 9999)):
        splits, per = _plan(monkeypatch, sms, pairs, tiles, registers=registers)
        covered = [min(tiles, (s + 1) * per) - s * per for s in range(splits)]
        assert sum(covered) == tiles and min(covered) >= 1, (pairs, tiles, splits, per)
        assert per <= decode.MAX_SPLIT_TILES or splits == tiles, (pairs, tiles, splits, per)
        programs = pairs * splits
        waves = -(-programs // slots)
        if waves > 1 and 2 * pairs <= slots:
            # several waves of fine enough grain: they run at least 3/4 full on average (no last
            # wave of a few programs running alone)
            assert 4 * programs >= 3 * waves * slots, (pairs, tiles, splits, programs)
            multi += 1
        if slots // pairs >= -(-tiles // decode.MAX_SPLIT_TILES):
            # short enough splits fit in one wave: the plan takes one wave
            assert programs <= slots, (pairs, tiles, splits, programs)
    assert multi > 0


def test_h200_plans(monkeypatch):
    assert _plan(monkeypatch, 132, 32, 512) == (47, 11)  # B1 H32 S32K: one wave
    assert _plan(monkeypatch, 132, 64, 512) == (24, 22)  # GQA B8 Hkv8 S32K: one wave
    assert _plan(monkeypatch, 132, 32, 2048) == (98, 21)  # S128K: one wave would need 42-tile splits
    assert _plan(monkeypatch, 132, 1024, 128) == (6, 22)  # B32 S8K: 3.9 waves
    assert _plan(monkeypatch, 132, 32, 1) == (1, 1)
    assert _plan(monkeypatch, 132, 32, 512, warps=2) == (24, 22)  # two-warp programs: half the slots


def test_fp_programs_take_part_of_the_slots(monkeypatch):
    """The fp-token programs per pair (fp_parts) come on top of the code splits, two to a slot:
    the default fp tokens' 4 parts leave 2 slots per pair fewer to the code splits."""
    monkeypatch.setattr(decode, "sm_count", lambda device: 132)
    monkeypatch.setattr(decode, "MAX_REGISTERS", 168)
    monkeypatch.setattr(decode, "SPLIT_PROGRAMS_PER_SM", None)
    slots = 12 * 132
    for pairs, tiles in ((32, 509), (64, 509), (32, 2045), (8, 61)):
        for parts in (1, 2, 3, 4, 6):
            splits, per = decode.split_plan(pairs, 1, 64 * tiles, 64, CUDA, parts=parts)
            left = slots - parts // decode.FP_PROGRAMS_PER_SLOT * pairs
            assert (splits, per) == decode.split_plan(pairs, 1, 64 * tiles, 64, CUDA, num_splits=decode.split_count(
                pairs, tiles, left)), (pairs, tiles, parts)
            if left // pairs >= -(-tiles // decode.MAX_SPLIT_TILES):  # one wave: the fp programs' share stays free
                assert pairs * (splits + parts // decode.FP_PROGRAMS_PER_SLOT) <= slots, (pairs, tiles, parts)
    assert decode.split_plan(64, 1, 64 * 509, 64, CUDA, parts=4) == (22, 24)  # GQA B8 Hkv8 S32K, the default fp
    assert decode.split_plan(32, 1, 64 * 509, 64, CUDA, parts=4) == (47, 11)  # B1 H32 S32K


def test_fixed_target_and_explicit_counts(monkeypatch):
    monkeypatch.setattr(decode, "sm_count", lambda device: 132)
    monkeypatch.setattr(decode, "SPLIT_PROGRAMS_PER_SM", 24)
    assert decode.split_plan(32, 1, 64 * 2048, 64, CUDA) == (98, 21)  # ceil(24 * 132 / 32) = 99 asked
    assert decode.split_plan(1, 2, 64 * 10, 64, CUDA, num_splits=3) == (3, 4)
    assert decode.split_plan(1, 2, 64 * 10, 64, CUDA, num_splits=99) == (10, 1)
    assert decode.split_plan(1, 2, 0, 64, CUDA) == (0, 1)


def test_interpreter_runs_a_few_programs():
    splits, per = decode.split_plan(1, 1, 64 * 10, 64, torch.device("cpu"))
    assert (splits, per) == (4, 3)


def test_resident_programs_follow_the_register_cap(monkeypatch):
    monkeypatch.setattr(decode, "MAX_REGISTERS", 168)
    assert (decode.resident_programs(1), decode.resident_programs(2)) == (12, 6)
    monkeypatch.setattr(decode, "MAX_REGISTERS", None)
    assert decode.resident_programs(1) == 8
