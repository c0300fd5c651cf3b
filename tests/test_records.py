"""The record schema, the atomic JSON Lines writer and the tolerant reader (harness/records.py)."""

from __future__ import annotations

import json
import math
import multiprocessing
import random

import numpy as np
import pytest
import torch

from harness.records import (
    MANIFEST_FILE,
    OUTCOMES,
    Record,
    RecordWriter,
    read_manifest,
    read_records,
    write_json_atomic,
)


def _record(i: int, **kw) -> Record:
    return Record(suite="packing", case=f"test_x[{i}]", nodeid=f"suites/test_packing.py::test_x[{i}]",
                  outcome=kw.pop("outcome", "passed"), **kw)


def test_round_trip_keeps_every_field(tmp_path):
    rng = random.Random()
    records = [
        _record(i, outcome=OUTCOMES[i % len(OUTCOMES)], backend="triton", variant=f"v{i}", device="cpu",
                duration_s=rng.random(), message=f"line one\nline two {i}", worker=f"gw{i % 2}", leg="L",
                metrics={"states_checked": rng.randrange(1, 2**24), "max_abs_err": rng.random(),
                         "speedup": {"torch_eager": rng.uniform(0.5, 5)}, "shape": "B=1 S=7"})
        for i in range(12)
    ]
    with RecordWriter(tmp_path / "records.jsonl") as writer:
        for record in records:
            writer.write(record)
    result = read_records(tmp_path / "records.jsonl")
    assert result.problems == []
    assert [r.__dict__ for r in result.records] == [r.__dict__ for r in records]


def test_metrics_become_json_safe(tmp_path):
    record = _record(0, metrics={"a": torch.tensor(2.5), "b": np.float32(0.25), "c": np.int64(7),
                                 "nan": float("nan"), "inf": -math.inf, "t": (1, 2), "obj": object})
    with RecordWriter(tmp_path / "r.jsonl") as writer:
        writer.write(record)
    line = (tmp_path / "r.jsonl").read_text()
    assert "NaN" not in line and "Infinity" not in line.replace('"-inf"', "")
    metrics = read_records(tmp_path / "r.jsonl").records[0].metrics
    assert metrics["a"] == 2.5 and metrics["b"] == 0.25 and metrics["c"] == 7
    assert metrics["nan"] == "nan" and metrics["inf"] == "-inf" and metrics["t"] == [1, 2]
    assert isinstance(metrics["obj"], str)


def test_unknown_outcome_is_rejected():
    with pytest.raises(ValueError, match="outcome must be one of"):
        _record(0, outcome="exploded")


@pytest.mark.parametrize("cut", [1, 17, -2])
def test_truncated_last_line_is_a_problem_not_an_exception(tmp_path, cut):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        for i in range(5):
            writer.write(_record(i))
    text = path.read_text()
    last = text.splitlines()[-1]
    path.write_text(text[: len(text) - len(last) - 1] + last[:cut] if cut > 0 else text[:cut])
    result = read_records(path)
    assert len(result.records) == 4
    assert len(result.problems) == 1 and "last line (truncated?)" in result.problems[0]


def test_corrupt_middle_line_names_its_number(tmp_path):
    path = tmp_path / "records.jsonl"
    good = _record(0).to_json()
    bad_outcome = json.dumps({**json.loads(good), "outcome": "nope"})
    path.write_text("\n".join([good, "{not json", bad_outcome, "", good]) + "\n")
    result = read_records(path)
    assert len(result.records) == 2
    assert [p.split(": ")[1] for p in result.problems] == ["line 2 unreadable", "line 3 unreadable"]


@pytest.mark.parametrize(("change", "why"), [
    ({"metrics": None}, "field 'metrics' must be an object, got NoneType"),
    ({"metrics": [1]}, "field 'metrics' must be an object, got list"),
    ({"case": 3}, "field 'case' must be a string, got int"),
    ({"backend": ["triton"]}, "field 'backend' must be a string or null, got list"),
    ({"message": {"E": 1}}, "field 'message' must be a string or null, got dict"),
    ({"duration_s": "slow"}, "field 'duration_s' must be a number, got 'slow'"),
    ({"duration_s": True}, "field 'duration_s' must be a number, got bool"),
    ({"schema": 1.5}, "field 'schema' must be an integer, got float"),
    ({"outcome": None}, "field 'outcome' must be a string, got NoneType"),
    ({"suite": None}, "field 'suite' must be a string, got NoneType"),
])
def test_a_field_of_the_wrong_type_is_a_problem_not_an_exception(tmp_path, change, why):
    path = tmp_path / "records.jsonl"
    good = _record(0).to_json()
    path.write_text("\n".join([good, json.dumps({**json.loads(good), **change}), good]) + "\n")
    result = read_records(path)
    assert len(result.records) == 2
    assert result.problems == [f"records.jsonl: line 2 unreadable: {why}"]


def test_a_line_that_is_no_object_is_a_problem_and_a_non_finite_duration_reads_back(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(["[1, 2]", '"text"', "7", _record(0, duration_s=float("nan")).to_json()]) + "\n")
    result = read_records(path)
    assert [p.split(": ", 2)[2] for p in result.problems] == [
        "expected a JSON object, got list", "expected a JSON object, got str", "expected a JSON object, got int"]
    (record,) = result.records
    assert isinstance(record.duration_s, float) and math.isnan(record.duration_s)


def test_missing_file_and_manifest(tmp_path):
    result = read_records(tmp_path / "nope.jsonl")
    assert result.records == [] and "no such file" in result.problems[0]
    assert read_manifest(tmp_path) == {}
    (tmp_path / MANIFEST_FILE).write_text('{"complete": tr')
    assert read_manifest(tmp_path) == {}


def test_write_json_atomic_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / MANIFEST_FILE
    write_json_atomic(path, {"complete": False, "x": float("nan")})
    write_json_atomic(path, {"complete": True, "n": np.int32(3)})
    assert read_manifest(path.parent) == {"complete": True, "n": 3}
    assert sorted(p.name for p in path.parent.iterdir()) == [MANIFEST_FILE]


def _append_many(args):
    path, worker, n = args
    with RecordWriter(path) as writer:
        for i in range(n):
            writer.write(_record(i, worker=worker, message="x" * (i * 37 % 3000)))


def test_concurrent_writers_never_interleave_lines(tmp_path):
    path = tmp_path / "records.jsonl"
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_append_many, [(path, "a", 150), (path, "b", 150)])
    result = read_records(path)
    assert result.problems == []
    assert sorted((r.worker, r.case) for r in result.records) == sorted(
        (w, f"test_x[{i}]") for w in "ab" for i in range(150))
