"""Same-job A/B (harness/run/ab.py): the statistics on synthetic timings, the order of the rounds,
the base worktree's lifecycle around a fake benchmark in a throwaway git repository, ab.json, the
Markdown table and the report's A/B section."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.measure import ab_stats, noise
from harness.records import Record, RecordWriter, write_json_atomic
from harness.run import ab, ab_results

# -- statistics ------------------------------------------------------------------------------------


def rounds_of(rng: random.Random, shift: float, noise: float, rounds: int = 5) -> tuple[list[float], list[float]]:
    """Per-round medians of a base at 1 ms and a head at ``shift`` ms, each with relative noise."""
    base = [1.0 * (1 + rng.gauss(0, noise)) for _ in range(rounds)]
    head = [shift * (1 + rng.gauss(0, noise)) for _ in range(rounds)]
    return base, head


@pytest.mark.parametrize(("df", "expected"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)])
def test_t_quantile_matches_the_tables(df, expected):
    assert ab_stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert ab_stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_a_five_percent_shift_in_half_a_percent_of_noise_is_found():
    verdict = ab_stats.compare(*rounds_of(random.Random(0), 1.05, 0.005))
    assert verdict.significant and verdict.change == "slower"
    assert verdict.low <= 1.05 <= verdict.high
    assert verdict.rounds == 5 and verdict.method == ab_stats.PAIRED_T
    assert verdict.base_median == pytest.approx(1.0, rel=0.02)
    assert verdict.head_median == pytest.approx(1.05, rel=0.02)


def test_the_shift_is_found_every_time_and_the_interval_holds_it_about_95_percent_of_the_time():
    verdicts = [ab_stats.compare(*rounds_of(random.Random(seed), 1.05, 0.005)) for seed in range(400)]
    assert all(v.significant and v.change == "slower" for v in verdicts)
    coverage = sum(v.low <= 1.05 <= v.high for v in verdicts) / len(verdicts)
    assert 0.91 <= coverage <= 0.99


def test_a_speedup_is_called_faster():
    verdict = ab_stats.compare(*rounds_of(random.Random(3), 0.9, 0.005))
    assert verdict.significant and verdict.change == "faster" and verdict.high < 1


def test_equal_distributions_are_not_significant():
    verdict = ab_stats.compare(*rounds_of(random.Random(0), 1.0, 0.005))
    assert not verdict.significant and verdict.change == "within noise"
    assert verdict.low <= 1.0 <= verdict.high


def test_equal_distributions_are_almost_never_called_a_change():
    verdicts = [ab_stats.compare(*rounds_of(random.Random(seed), 1.0, 0.005)) for seed in range(400)]
    excluded = sum(v.high < 1 or v.low > 1 for v in verdicts) / len(verdicts)
    assert excluded < 0.1  # the interval alone misses 1 about 5% of the time ...
    assert sum(v.significant for v in verdicts) <= 4  # ... the 1% threshold leaves a fraction of a percent


def test_a_sure_change_below_the_practical_threshold_is_not_significant():
    verdict = ab_stats.compare(*rounds_of(random.Random(1), 1.004, 0.0001))
    assert verdict.low > 1  # the interval excludes 1 ...
    assert not verdict.significant  # ... but 0.4% is under MIN_EFFECT


def test_rounds_missing_on_one_side_are_left_out_of_the_pairs():
    verdict = ab_stats.compare([1.0, None, 1.0, 1.001], [1.05, 1.05, None, 1.052])
    assert verdict.rounds == 2
    assert verdict.head_median == pytest.approx(1.05)


def test_one_round_needs_the_repeat_spread_for_an_interval():
    bare = ab_stats.compare([1.0], [1.05])
    assert bare.ratio == pytest.approx(1.05) and bare.low is None and not bare.significant
    assert bare.change == "no interval"
    se = ab_stats.median_relative_se(1.0, 100, mad=0.01)
    assert se == pytest.approx(noise.MEDIAN_SE * noise.MAD_TO_SIGMA * 0.01 / 10)
    spread = ab_stats.compare([1.0], [1.05], repeat_se=(se, se))
    assert spread.method == ab_stats.REPEAT_SPREAD and spread.significant and spread.low <= 1.05 <= spread.high
    assert ab_stats.median_relative_se(1.0, 100) is None  # no spread recorded


def test_compare_refuses_unpaired_inputs():
    with pytest.raises(ValueError, match="one entry per round"):
        ab_stats.compare([1.0, 1.0], [1.0])


# -- the order of the rounds -----------------------------------------------------------------------


def test_rounds_alternate_which_side_runs_first():
    order = ab.round_order(4)
    assert order == [(1, "base"), (1, "head"), (2, "head"), (2, "base"),
                     (3, "base"), (3, "head"), (4, "head"), (4, "base")]
    firsts = [order[i][1] for i in range(0, len(order), 2)]
    assert firsts.count("base") == firsts.count("head")
    with pytest.raises(ValueError):
        ab.round_order(0)


# -- the worktree lifecycle with a fake benchmark --------------------------------------------------

BENCH = '''
import json, pathlib, random, subprocess, sys, zlib
SHIFT = {shift}
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(zlib.crc32(out.name.encode()))
cases = {{"test_shift": SHIFT, "test_same": 1.0, "test_{side}_only": 2.0}}
with open(out / "records.jsonl", "w") as fh:
    for case, ms in cases.items():
        fh.write(json.dumps({{"suite": "bench_fake", "case": case, "nodeid": "suites/test_bench_fake.py::" + case,
                             "outcome": "passed", "leg": "cpu-fake",
                             "metrics": {{"ms": ms * (1 + rng.gauss(0, 0.005))}}}}) + "\\n")
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
(out / "manifest.json").write_text(json.dumps({{"run_id": "cpu-fake@" + out.name, "leg": "cpu-fake", "complete": True,
                                               "started": "2026-01-01T00:00:00", "env": {{"commit": commit}}}}))
with open(sys.argv[2], "a") as log:
    log.write("{side}\\n")
'''


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A git repository of two commits: the base's fake benchmark times test_shift at 1 ms, the
    head's at 1.05 ms (0.5% noise each)."""
    for name, value in (("GIT_AUTHOR_NAME", "ab"), ("GIT_AUTHOR_EMAIL", "ab@example.invalid"),
                        ("GIT_COMMITTER_NAME", "ab"), ("GIT_COMMITTER_EMAIL", "ab@example.invalid")):
        monkeypatch.setenv(name, value)
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for side, shift in (("base", 1.0), ("head", 1.05)):
        (root / "bench.py").write_text(textwrap.dedent(BENCH.format(shift=shift, side=side)))
        _git(root, "add", "bench.py")
        _git(root, "commit", "-q", "-m", side)
    return root


class FakeBench:
    """The command of each run: ``python bench.py RESULTS_DIR LOG`` in the run's tree; notes the
    trees it was asked for, and fails or raises on the call numbers given."""

    def __init__(self, log: Path, *, fail_on: int | None = None, raise_on: int | None = None) -> None:
        self.log, self.fail_on, self.raise_on = log, fail_on, raise_on
        self.trees: list[Path] = []

    def __call__(self, tree: Path, results_dir: Path) -> list[str]:
        self.trees.append(tree)
        if len(self.trees) == self.raise_on:
            raise RuntimeError("planned error")
        if len(self.trees) == self.fail_on:
            return [sys.executable, "-c", "raise SystemExit(3)"]
        return [sys.executable, "bench.py", str(results_dir), str(self.log)]


def _worktrees(repo: Path) -> list[str]:
    return [line for line in _git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]


def test_both_trees_run_in_turns_and_the_worktree_goes_afterwards(repo, tmp_path, private_history):
    bench = FakeBench(tmp_path / "log")
    reports = tmp_path / "reports"
    outcome = ab.run_ab(ab.Setup(repo=repo, base_ref="HEAD~1", rounds=4, reports_dir=reports, command=bench,
                                 leg="cpu-fake", history=private_history))
    assert outcome.ok
    assert (tmp_path / "log").read_text().split() == ["base", "head", "head", "base", "base", "head", "head", "base"]
    base_tree = bench.trees[0]
    assert base_tree != repo
    assert bench.trees == [base_tree, repo, repo, base_tree, base_tree, repo, repo, base_tree]
    assert not base_tree.exists() and not base_tree.parent.exists()
    assert _worktrees(repo) == [f"worktree {repo}"]

    data = json.loads((reports / "ab.json").read_text())
    assert data["format"] == "kvh-ab" and data["rounds"] == 4 and data["rounds_done"] == 4 and data["failed"] is None
    assert data["base"] == {"ref": "HEAD~1", "commit": _git(repo, "rev-parse", "HEAD~1")}
    assert data["head"]["commit"] == _git(repo, "rev-parse", "HEAD") and data["head"]["dirty"] is False
    assert data["order"] == [["base", "head"], ["head", "base"], ["base", "head"], ["head", "base"]]
    assert {r["commit"] for r in data["runs"] if r["side"] == "base"} == {data["base"]["commit"]}
    assert [r["run_dir"] for r in data["runs"]][:2] == ["runs/ab-base-1", "runs/ab-head-1"]
    cases = {c["nodeid"].split("::")[1]: c for c in data["cases"]}
    assert set(cases) == {"test_shift", "test_same"}
    assert data["only_base"] == ["suites/test_bench_fake.py::test_base_only"]
    assert data["only_head"] == ["suites/test_bench_fake.py::test_head_only"]
    shift, same = cases["test_shift"], cases["test_same"]
    assert shift["significant"] and shift["change"] == "slower" and shift["rounds"] == 4
    assert shift["interval"][0] <= 1.05 <= shift["interval"][1]
    assert shift["base_median_ms"] == pytest.approx(1.0, rel=0.02) and len(shift["base_ms"]) == 4
    assert not same["significant"] and same["change"] == "within noise"
    assert data["cases"][0]["nodeid"].endswith("test_shift")  # changes first

    summary = (reports / "ab-summary.md").read_text()
    assert "## A/B: head vs HEAD~1" in summary and "test_shift" in summary

    from harness import history

    run_ids = [r["run_id"] for r in history.runs(private_history)]
    assert len(run_ids) == 8
    assert sum("@ab-base-" in r for r in run_ids) == 4 and sum("@ab-head-" in r for r in run_ids) == 4


def test_a_failed_round_stops_the_ab_and_still_removes_the_worktree(repo, tmp_path):
    bench = FakeBench(tmp_path / "log", fail_on=3)  # round 2's head, which runs first in round 2
    reports = tmp_path / "reports"
    outcome = ab.run_ab(ab.Setup(repo=repo, base_ref="HEAD~1", rounds=3, reports_dir=reports, command=bench))
    assert not outcome.ok and (outcome.failed.round, outcome.failed.side, outcome.failed.rc) == (2, "head", 3)
    assert len(bench.trees) == 3
    assert not bench.trees[0].exists() and _worktrees(repo) == [f"worktree {repo}"]
    data = json.loads((reports / "ab.json").read_text())
    assert data["failed"] == {"round": 2, "side": "head", "rc": 3} and data["rounds_done"] == 1
    assert [c["rounds"] for c in data["cases"]] == [1, 1]
    assert "**Stopped**: round 2 of the head exited 3" in (reports / "ab-summary.md").read_text()


def test_an_error_mid_way_still_removes_the_worktree(repo, tmp_path):
    bench = FakeBench(tmp_path / "log", raise_on=2)
    with pytest.raises(RuntimeError, match="planned error"):
        ab.run_ab(ab.Setup(repo=repo, base_ref="HEAD~1", rounds=2, reports_dir=tmp_path / "reports", command=bench))
    assert not bench.trees[0].exists() and _worktrees(repo) == [f"worktree {repo}"]
    assert not (tmp_path / "reports" / "ab.json").exists()


def test_an_earlier_abs_runs_are_cleared(repo, tmp_path):
    stale = tmp_path / "reports" / "runs" / "ab-base-9"
    stale.mkdir(parents=True)
    ab.run_ab(ab.Setup(repo=repo, base_ref="HEAD~1", rounds=1, reports_dir=tmp_path / "reports",
                       command=FakeBench(tmp_path / "log")))
    assert not stale.exists()
    assert sorted(p.name for p in (tmp_path / "reports" / "runs").iterdir()) == ["ab-base-1", "ab-head-1"]


def test_an_unknown_base_stops_before_anything_runs(repo, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    assert ab.main(["no-such-ref", "--no-report"]) == 2
    assert "names no commit" in capsys.readouterr().out
    assert _worktrees(repo) == [f"worktree {repo}"]


def test_the_default_base_is_the_merge_base_with_main(repo):
    _git(repo, "checkout", "-q", "-b", "topic")
    (repo / "bench.py").write_text("# changed\n")
    _git(repo, "commit", "-q", "-am", "topic")
    assert ab.default_base(repo) == _git(repo, "rev-parse", "main")


# -- the command line and the pytest command -------------------------------------------------------


def test_base_is_the_first_argument_unless_it_is_an_option_or_a_test_path(tmp_path):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "test_bench_x.py").write_text("")
    assert ab.split_base(["HEAD~1", "-k", "decode"], tmp_path) == ("HEAD~1", ["-k", "decode"])
    assert ab.split_base(["-k", "decode"], tmp_path) == (None, ["-k", "decode"])
    assert ab.split_base(["suites/test_bench_x.py"], tmp_path) == (None, ["suites/test_bench_x.py"])
    assert ab.split_base(["suites/test_bench_y.py::test_a"], tmp_path)[0] is None


def test_the_bench_command_runs_the_trees_benchmark_files_or_the_paths_given(tmp_path):
    (tmp_path / "suites").mkdir()
    for name in ("test_bench_b.py", "test_bench_a.py", "test_other.py"):
        (tmp_path / "suites" / name).write_text("")
    out = tmp_path / "reports" / "runs" / "ab-head-1"
    argv = ab.BenchCommand(python="py", leg="gpu-x", selection=["-k", "decode"])(tmp_path, out)
    assert argv == ["py", "-m", "pytest", "suites/test_bench_a.py", "suites/test_bench_b.py",
                    "-m", "bench and not sweep", "--results-dir", str(out), "--leg", "gpu-x", "-k", "decode"]
    only = ab.BenchCommand(python="py", leg="gpu-x", selection=["suites/test_bench_b.py::test_q"])(tmp_path, out)
    assert only[3:5] == ["suites/test_bench_b.py::test_q", "-m"]


# -- ab.json, the Markdown table, the report section -----------------------------------------------


def write_round(run_dir: Path, times: dict[str, float], leg: str = "cpu-fake") -> Path:
    with RecordWriter(run_dir / "records.jsonl") as writer:
        for case, ms in times.items():
            writer.write(Record(suite="bench_fake", case=case, nodeid=f"suites/test_bench_fake.py::{case}",
                                outcome="passed", leg=leg, metrics={"ms": ms}))
    write_json_atomic(run_dir / "manifest.json", {"run_id": f"{leg}@{run_dir.name}", "leg": leg, "complete": True,
                                                  "mode": "interpreter", "env": {"leg": leg, "mode": "interpreter"}})
    return run_dir


@pytest.fixture
def ab_reports(tmp_path) -> Path:
    """reports/ with three rounds of a base and a head (one case 5% slower, one the same, one
    with a '|' in its id) and the ab.json that names them."""
    reports = tmp_path / "reports"
    rng = random.Random(11)
    runs = []
    order = ab.round_order(3)
    for number, side in order:
        shift = 1.05 if side == "head" else 1.0
        times = {"test_shift": shift * (1 + rng.gauss(0, 0.005)), "test_same": 2 * (1 + rng.gauss(0, 0.005)),
                 "test_pipe[a|b]": 3 * (1 + rng.gauss(0, 0.005))}
        runs.append(ab_results.RoundRun(number, side, write_round(ab.round_dir(reports, side, number), times), 0))
    data = ab_results.build(runs, rounds=3, base={"ref": "main", "commit": "b" * 40},
                            head={"ref": "HEAD", "commit": "h" * 40, "dirty": True}, root=reports, order=order,
                            device="0", gpu="NVIDIA H200", leg="cpu-fake")
    ab_results.write(reports / ab_results.AB_FILE, data)
    return reports


def test_the_markdown_table(ab_reports):
    data = ab_results.read(ab_reports / "ab.json")
    text = ab_results.markdown(data)
    lines = text.splitlines()
    assert lines[0] == "## A/B: head vs main"
    assert "Head `hhhhhhhhhh` with uncommitted changes against base `bbbbbbbbbb`" in text
    assert "3 of 3 rounds on GPU 0 (NVIDIA H200)" in text
    header = next(i for i, line in enumerate(lines) if line.startswith("| case |"))
    assert lines[header] == "| case | base ms | head ms | head/base | 95% interval | rounds | change |"
    assert lines[header + 1] == "| --- | ---: | ---: | ---: | --- | ---: | --- |"
    rows = [line for line in lines[header + 2:] if line.startswith("| ")]
    assert len(rows) == 3
    assert rows[0].startswith("| `suites/test_bench_fake.py::test_shift` |") and rows[0].endswith("| 3 | **slower** |")
    assert any("test_pipe[a\\|b]" in row for row in rows)
    assert all(len(row.replace("\\|", "").split("|")) == 9 for row in rows)
    assert "1 slower, 2 within noise." in text


def test_an_ab_without_cases_says_so():
    data = {"base": {"ref": "main", "commit": "b"}, "head": {"commit": "h"}, "rounds": 2, "rounds_done": 2,
            "device": None, "confidence": 0.95, "min_effect": 0.01, "cases": [], "failed": None}
    text = ab_results.markdown(data)
    assert "on CPU" in text and "No case recorded a time on both sides." in text and "| case |" not in text


def test_read_refuses_what_is_no_ab_file(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"format": "kvh-baseline", "cases": []}))
    with pytest.raises(ValueError, match="not an A/B file"):
        ab_results.read(tmp_path / "x.json")
    with pytest.raises(ValueError, match="cannot read"):
        ab_results.read(tmp_path / "missing.json")


def _render(args: list[str], out: Path) -> str:
    from harness.report.cli import main

    assert main(["report", *args, "-o", str(out), "--no-junit", "--no-history"]) == 0
    return out.read_text(encoding="utf-8")


def test_the_report_shows_the_ab_found_beside_its_run_directories(ab_reports, tmp_path):
    pytest.importorskip("jinja2")
    html = _render([str(ab_reports / "runs" / "ab-head-3")], tmp_path / "page.html")
    assert '<section id="ab">' in html and "A/B: head vs main" in html
    assert "suites/test_bench_fake.py::test_shift" in html and ">slower<" in html


def test_the_report_shows_the_ab_named_on_the_command_line(ab_reports, tmp_path):
    pytest.importorskip("jinja2")
    other = write_round(tmp_path / "elsewhere" / "run", {"test_x": 1.0})
    html = _render([str(other), "--ab", str(ab_reports / "ab.json")], tmp_path / "page.html")
    assert '<section id="ab">' in html


def test_a_report_of_other_runs_leaves_an_ab_beside_them_out(ab_reports, tmp_path):
    pytest.importorskip("jinja2")
    other = write_round(ab_reports / "runs" / "gpu_verify-x", {"test_x": 1.0})
    html = _render([str(other)], tmp_path / "page.html")
    assert 'id="ab"' not in html and "A/B: head vs" not in html
