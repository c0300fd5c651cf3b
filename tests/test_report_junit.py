"""JUnit XML beside the page: well-formed, one testcase per record, outcomes mapped."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from synthetic import HOSTILE, env_for, rec, write_run

from harness.report import junit_tree, load_results, write_junit


def test_written_junit_parses_and_counts_match(rendered):
    root = ET.parse(rendered["junit"]).getroot()
    results = load_results([rendered["legs"][0].parent])
    records = [r for _, r in results.pairs()]
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(records) == int(root.get("tests"))
    assert int(root.get("failures")) == sum(r.outcome == "failed" for r in records) == 2
    assert int(root.get("errors")) == sum(r.outcome in ("error", "crashed", "timeout") for r in records) == 2
    assert int(root.get("skipped")) == len(root.findall(".//skipped")) == 1
    for suite in root.findall("testsuite"):
        assert int(suite.get("tests")) == len(suite.findall("testcase"))
    names = {suite.get("name") for suite in root.findall("testsuite")}
    assert "torch2.10-triton3.5 :: suites/decode" in names


def test_outcomes_messages_and_properties(tmp_path):
    run_dir = write_run(tmp_path / "r", [
        rec("x", "test_ok", backend="triton", variant="v", metrics={"ms": 0.5, "speedup": {"eager": 2.0}}),
        rec("x", "test_fail", "failed", message="E   AssertionError: 1 != 2\ntrace"),
        rec("x", "test_crash", "crashed", message="worker died"),
        rec("x", "test_slow", "timeout", message="Timeout (>10s)"),
        rec("x", "test_err", "error", message="fixture broke"),
        rec("x", "test_skip", "skipped", message="no GPU"),
        rec("x", f"test_hostile[{HOSTILE}\x00\x1b]", "failed", message=f"bad {HOSTILE} \x07\x0c"),
    ], leg="L", env=env_for("L", "gpu"))
    path = write_junit(tmp_path / "out" / "junit.xml", load_results([run_dir]))
    root = ET.parse(path).getroot()
    case = {c.get("name"): c for c in root.iter("testcase")}
    props = {p.get("name"): p.get("value") for p in case["test_ok"].iter("property")}
    assert props == {"backend": "triton", "variant": "v", "ms": "0.5", "speedup.eager": "2.0"}
    assert case["test_ok"].find("failure") is None and case["test_ok"].find("error") is None
    failure = case["test_fail"].find("failure")
    assert failure.get("message") == "AssertionError: 1 != 2" and "trace" in failure.text
    assert [case[n].find("error").get("type") for n in ("test_crash", "test_slow", "test_err")] == \
        ["crashed", "timeout", "error"]
    assert case["test_skip"].find("skipped").get("message") == "no GPU"
    hostile = next(name for name in case if name.startswith("test_hostile"))
    assert HOSTILE in hostile and "\x00" not in hostile
    assert HOSTILE in case[hostile].find("failure").text
    assert sorted(p.name for p in path.parent.iterdir()) == ["junit.xml"]


def test_empty_result_set_is_valid_junit(tmp_path):
    root = junit_tree(load_results([tmp_path / "missing"])).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "0" and list(root) == []
