"""The run history: every recorded GPU run's cases in one SQLite database (the standard library's
``sqlite3``), for rolling baselines and trends over many runs.

``python -m harness.history add RUN_DIR...`` appends run directories (``records.jsonl`` and
``manifest.json``, harness.records); ``list`` lists the runs; ``export --format csv|json``
writes every case; ``prune --keep N`` keeps the newest N runs of each (leg, GPU) and, apart, its
newest N A/B rounds; ``baseline --leg L -o FILE`` writes the rolling baseline of L's last runs as
a baseline file (each case's spread across those runs, machines or visits, as its noise). The
database is ``$KVH_HISTORY`` (default ``~/.cache/kvbits/history.sqlite``).

Durability: the database runs in WAL mode with a busy timeout, so several runners or processes
may write at once; each run goes in as one transaction, so a process killed mid-write leaves the
database as it was before that run; a run already present is not added twice. A database that is
locked past the timeout, unreadable or not a database raises :class:`HistoryError` saying which
file and what to do; callers report it and go on (a run's report never depends on the history).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sqlite3
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import closing
from pathlib import Path

from .measure.noise import Timing
from .records import (
    BASELINE_FORMAT,
    BASELINE_THRESHOLD_PCT,
    CONFIRM_SUFFIX,
    MANIFEST_FILE,
    OUTCOME_SEVERITY,
    RECORDS_FILE,
    read_manifest,
    read_records,
    utc_now,
    write_json_atomic,
)

DEFAULT_PATH = Path("~/.cache/kvbits/history.sqlite")
BUSY_TIMEOUT_S = 30.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, leg TEXT, mode TEXT, gpu TEXT, commit_sha TEXT, torch TEXT, triton TEXT,
    started TEXT, finished TEXT, complete INTEGER
);
CREATE TABLE IF NOT EXISTS cases (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE, suite TEXT, nodeid TEXT, variant TEXT,
    backend TEXT, device TEXT, outcome TEXT, duration_s REAL, metrics TEXT
);
CREATE INDEX IF NOT EXISTS cases_by_case ON cases (nodeid, variant);
"""
CASE_COLUMNS = ("run_id", "leg", "gpu", "commit_sha", "started", "suite", "nodeid", "variant", "backend", "device",
                "outcome", "duration_s", "metrics")


class HistoryError(RuntimeError):
    """The history database cannot be used (locked, unreadable, not a database)."""


def history_path(environ=os.environ) -> Path:
    """``$KVH_HISTORY``, else ``~/.cache/kvbits/history.sqlite``."""
    return Path(environ.get("KVH_HISTORY") or DEFAULT_PATH).expanduser()


def _connect(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except (sqlite3.Error, OSError) as exc:
        raise HistoryError(_explain(path, exc)) from exc
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            db.executescript(SCHEMA)
            return db
        except sqlite3.OperationalError as exc:
            # switching to WAL and creating the tables while another process does the same can be
            # refused at once, without the busy timeout's wait: try again until the timeout
            if not _busy(exc) or time.monotonic() > deadline:
                db.close()
                raise HistoryError(_explain(path, exc)) from exc
            time.sleep(0.05)
        except sqlite3.Error as exc:
            db.close()
            raise HistoryError(_explain(path, exc)) from exc


def _busy(exc: BaseException) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _explain(path: Path, exc: BaseException) -> str:
    text = str(exc)
    if _busy(exc):
        return f"history {path}: locked by another process for more than {BUSY_TIMEOUT_S:g} s ({text})"
    if "not a database" in text or "malformed" in text:
        return (f"history {path}: not a readable SQLite database ({text}); move it aside to start a new "
                f"history, or set KVH_HISTORY to another file")
    return f"history {path}: {type(exc).__name__}: {text}"


def run_key(manifest: dict, run_dir: Path) -> str:
    """The id a run directory has in the history: the manifest's run id and start time together,
    since a pipeline reuses one run directory (and run id) per kind and leg for every run."""
    return f"{manifest.get('run_id') or run_dir.name}@{manifest.get('started') or '-'}"


def _run_row(run_dir: Path) -> tuple:
    """A run's row, keyed by :func:`run_key`."""
    manifest = read_manifest(run_dir)
    if not isinstance(manifest, dict):
        manifest = {}
    env = manifest.get("env") if isinstance(manifest.get("env"), dict) else {}
    run_id = run_key(manifest, run_dir)
    return (run_id, manifest.get("leg"), manifest.get("mode"), env.get("gpu"), env.get("commit"),
            env.get("torch"), env.get("triton"), manifest.get("started"), manifest.get("finished"),
            int(bool(manifest.get("complete"))))


def add_runs(run_dirs: Iterable[str | os.PathLike], path: Path | None = None) -> list[str]:
    """Append each run directory's records, one transaction per run; returns the run ids added
    (a run already in the history is skipped, a directory without records too)."""
    path = history_path() if path is None else Path(path)
    added = []
    with closing(_connect(path)) as db:
        for run_dir in map(Path, run_dirs):
            if not (run_dir / RECORDS_FILE).exists() and not (run_dir / MANIFEST_FILE).exists():
                continue
            run = _run_row(run_dir)
            records = read_records(run_dir / RECORDS_FILE).records
            try:
                db.execute("BEGIN IMMEDIATE")
                if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run[0],)).fetchone():
                    db.execute("ROLLBACK")
                    continue
                db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", run)
                db.executemany("INSERT INTO cases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
                    (run[0], r.suite, r.nodeid, r.variant, r.backend, r.device, r.outcome, r.duration_s,
                     json.dumps(r.metrics, sort_keys=True, default=str)) for r in records])
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise HistoryError(_explain(path, exc)) from exc
            added.append(run[0])
    return added


def runs(path: Path | None = None) -> list[dict]:
    """Every run, oldest first, with its number of cases; none where the database does not exist
    (reading creates nothing)."""
    path = history_path() if path is None else Path(path)
    if not path.exists():
        return []
    with closing(_connect(path)) as db:
        try:
            rows = db.execute("SELECT r.run_id, r.leg, r.gpu, r.commit_sha, r.started, r.complete, COUNT(c.run_id) "
                              "FROM runs r LEFT JOIN cases c ON c.run_id = r.run_id GROUP BY r.run_id "
                              "ORDER BY r.started, r.run_id").fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(_explain(path, exc)) from exc
    keys = ("run_id", "leg", "gpu", "commit", "started", "complete", "cases")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def cases(path: Path | None = None, *, nodeid: str | None = None, leg: str | None = None,
          gpu: str | None = None) -> list[dict]:
    """Every case (metrics decoded), oldest run first; filtered by nodeid, leg and GPU when given."""
    path = history_path() if path is None else Path(path)
    where, args = [], []
    for column, value in (("c.nodeid", nodeid), ("r.leg", leg), ("r.gpu", gpu)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    query = ("SELECT c.run_id, r.leg, r.gpu, r.commit_sha, r.started, c.suite, c.nodeid, c.variant, c.backend, "
             "c.device, c.outcome, c.duration_s, c.metrics FROM cases c JOIN runs r ON r.run_id = c.run_id"
             + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.started, c.run_id, c.rowid")
    with closing(_connect(path)) as db:
        try:
            rows = db.execute(query, args).fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(_explain(path, exc)) from exc
    out = []
    for row in rows:
        item = dict(zip(CASE_COLUMNS, row, strict=True))
        item["metrics"] = json.loads(item["metrics"] or "{}")
        out.append(item)
    return out


def rolling_values(nodeid: str, metric: str, *, leg: str, gpu: str | None, last: int,
                   path: Path | None = None) -> list[float]:
    """The metric of a passed case over the newest ``last`` runs of one leg and GPU (oldest first):
    what a rolling baseline is made of."""
    values = [c["metrics"].get(metric) for c in cases(path, nodeid=nodeid, leg=leg, gpu=gpu)
              if c["outcome"] == "passed"]
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)][-last:]


def _connect_read_only(path: Path, timeout_s: float) -> sqlite3.Connection:
    """A connection that only reads: a missing file is an error, never created."""
    if not path.is_file():
        raise HistoryError(f"history {path}: no such file")
    try:
        return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s)
    except (sqlite3.Error, OSError) as exc:
        raise HistoryError(_explain(path, exc)) from exc


def _metric_of(metrics: str | None, metric: str) -> float | None:
    """A number from a case's metrics column; None when absent, not a number or unreadable."""
    try:
        value = json.loads(metrics or "{}").get(metric)
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _newest_runs(db: sqlite3.Connection, leg: str, gpu: str | None, last: int,
                 nodeids: list[str] | None) -> list[tuple]:
    """(run_id, commit, started) of the newest ``last`` runs of a leg and GPU, oldest first; with
    ``nodeids``, only the runs that ran one of them."""
    ran_one = ("" if nodeids is None else " AND EXISTS (SELECT 1 FROM cases c WHERE c.run_id = runs.run_id "
               f"AND c.nodeid IN ({', '.join('?' * len(nodeids))}))")
    rows = db.execute(f"SELECT run_id, commit_sha, started FROM runs WHERE leg = ? AND gpu IS ?{ran_one} "
                      "AND run_id NOT LIKE ? AND run_id NOT LIKE ? ORDER BY started DESC, run_id DESC LIMIT ?",
                      (leg, gpu, *(nodeids or ()), CONFIRM_RUN, AB_RUN, max(0, last)))
    return list(reversed(rows.fetchall()))


def case_series(metric: str, *, leg: str, gpu: str | None, last: int, nodeids: Iterable[str] | None = None,
                path: Path | None = None, timeout_s: float = BUSY_TIMEOUT_S
                ) -> tuple[list[dict], dict[tuple[str, str | None], list[float | None]]]:
    """``metric`` of each case over the newest ``last`` runs of one leg and GPU, oldest first: the
    runs (run_id, commit, started) and, per (nodeid, variant), one value per run, None where the
    case did not pass or lacks the metric. ``nodeids``: only these cases, and only the runs that
    ran one of them (a pipeline's suites and benchmarks go in as two runs). Reads only; a missing,
    locked (past ``timeout_s``) or unreadable database raises :class:`HistoryError`."""
    path = history_path() if path is None else Path(path)
    wanted = None if nodeids is None else sorted(set(nodeids))
    with closing(_connect_read_only(path, timeout_s)) as db:
        try:
            runs_rows = _newest_runs(db, leg, gpu, last, wanted)
            ids = [row[0] for row in runs_rows]
            case_rows = db.execute(f"SELECT run_id, nodeid, variant, outcome, metrics FROM cases WHERE run_id IN "
                                   f"({', '.join('?' * len(ids))}) ORDER BY rowid", ids).fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(_explain(path, exc)) from exc
    column = {run_id: i for i, run_id in enumerate(ids)}
    series: dict[tuple[str, str | None], list[float | None]] = {}
    for run_id, nodeid, variant, outcome, metrics in case_rows:
        if wanted is None or nodeid in wanted:
            values = series.setdefault((nodeid, variant), [None] * len(ids))
            if outcome == "passed":
                values[column[run_id]] = _metric_of(metrics, metric)
    return [{"run_id": r, "commit": c, "started": s} for r, c, s in runs_rows], series


ROLLING_TIMINGS = ("ms", "gbps", "pct_of_peak")  # medians over the runs in a rolling baseline
ROLLING_ERRORS = ("max_abs_err", "max_rel_err", "bit_errors")  # worst over the runs
CONFIRM_RUN = f"%{CONFIRM_SUFFIX}@%"  # run ids of confirmation re-runs (leg@<run dir>-confirm@started)
AB_RUN = "%@ab-%"  # run ids of A/B rounds (leg@ab-base-3@started, harness/run/ab.py): two commits, no trend


def _number(value) -> float | None:
    """A metric as a float (numbers, and the strings non-finite ones are written as), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _case_identity(suite: str, nodeid: str) -> tuple[str, str]:
    """(``group/suite``, case id) of a stored case, as the recording plugin derives them from its
    node id: the group is the node id's first folder, the case what follows ``::``."""
    parts = Path(nodeid.split("::", 1)[0]).parts
    group = parts[0] if len(parts) > 1 else ""
    return (f"{group}/{suite}" if group else suite), (nodeid.split("::", 1)[1] if "::" in nodeid else nodeid)


def _spread_across(values: list[float]) -> dict:
    """How a case's per-run medians spread: how many, the fastest, interquartile range, MAD."""
    return {**Timing.of(values).metrics("ms"), "spread": "runs"}


def _severity(outcome: str) -> int:
    """How bad an outcome is (an unknown one counts as the worst)."""
    return OUTCOME_SEVERITY.index(outcome) if outcome in OUTCOME_SEVERITY else len(OUTCOME_SEVERITY)


def _worst(values: list[float]) -> float | str:
    worst = max(values, key=lambda v: (math.isnan(v), v))
    return worst if math.isfinite(worst) else str(worst)


def _rolling_entry(rows: list[tuple], leg: str, env: str) -> dict:
    """One case's baseline entry from its newest runs' rows (suite, nodeid, backend, variant,
    outcome, metrics), newest first: medians of the passed runs' figures, the spread of their ms
    across the runs, the worst outcome and errors."""
    suite, nodeid, backend, variant = rows[0][:4]
    group_suite, case = _case_identity(suite, nodeid)
    entry = {"suite": group_suite, "case": case, "backend": backend, "variant": variant, "env": env, "legs": [leg],
             "outcome": max((row[4] for row in rows), key=_severity)}
    passed = [json.loads(row[5] or "{}") for row in rows if row[4] == "passed"]
    for name in ROLLING_TIMINGS:
        values = [v for v in (_number(m.get(name)) for m in passed) if v is not None and math.isfinite(v) and v > 0]
        if values:
            entry[name] = statistics.median(values)
            if name == "ms":
                entry.update(_spread_across(values))
    for name in ROLLING_ERRORS:
        values = [v for v in (_number(m.get(name)) for m in passed) if v is not None]
        if values:
            entry[name] = _worst(values)
    bounds = Counter(m.get("bound") for m in passed if isinstance(m.get("bound"), str))
    if bounds:
        entry["bound"] = bounds.most_common(1)[0][0]
    return entry


def rolling_baseline(leg: str, gpu: str | None, *, last: int = 5, path: Path | None = None,
                     timeout_s: float = BUSY_TIMEOUT_S, exclude: Iterable[str] = ()) -> dict:
    """A baseline (the dict ``harness.report.baseline.compare`` takes) from the run history: each
    case as it ran in the newest ``last`` complete runs of ``leg`` on ``gpu`` that ran it (a
    pipeline's suites and benchmarks go in as separate runs; confirmation re-runs are left out):
    the median of its per-run medians as ``ms``, their spread across the runs as its noise
    (``ms_n`` runs, ``ms_min``, ``ms_iqr``, ``ms_mad``, ``spread: "runs"``), the worst outcome and
    errors. ``exclude``: run ids (:func:`run_key`) left out, such as those of the run compared,
    once it is in the history itself. Reads only; HistoryError as for :func:`case_series`."""
    if last < 1:
        raise ValueError(f"last must be at least 1; got {last}")
    path = history_path() if path is None else Path(path)
    query = ("SELECT c.suite, c.nodeid, c.backend, c.variant, c.outcome, c.metrics, r.run_id, r.mode, r.commit_sha "
             "FROM cases c JOIN runs r ON r.run_id = c.run_id WHERE r.leg = ? AND r.gpu IS ? AND r.complete = 1 "
             "AND r.run_id NOT LIKE ? AND r.run_id NOT LIKE ? ORDER BY r.started DESC, r.run_id DESC, c.rowid")
    with closing(_connect_read_only(path, timeout_s)) as db:
        try:
            rows = db.execute(query, (leg, gpu, CONFIRM_RUN, AB_RUN)).fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(_explain(path, exc)) from exc
    excluded = set(exclude)
    rows = [row for row in rows if row[6] not in excluded]
    per_case: dict[str, dict[str, tuple]] = {}  # key -> run id -> its (first) row, newest run first
    for row in rows:
        key = "::".join((*_case_identity(row[0], row[1]), row[2] or "-", row[3] or "-"))
        runs_of_case = per_case.setdefault(key, {})
        if len(runs_of_case) < last or row[6] in runs_of_case:
            runs_of_case.setdefault(row[6], row)
    env = f"{rows[0][7] or 'gpu'}/{gpu or 'cpu'}" if rows else f"gpu/{gpu or 'cpu'}"
    used = sorted({run_id for runs_of_case in per_case.values() for run_id in runs_of_case})
    commits = sorted({row[8] for row in rows if row[6] in used and row[8]})
    return {
        "format": BASELINE_FORMAT, "version": 1, "created": utc_now(),
        "source": {"legs": [leg], "environments": [env], "commits": commits, "hosts": [], "runs": used,
                   "rolling": last, "history": str(path)},
        "cases": {key: _rolling_entry(list(runs_of_case.values()), leg, env)
                  for key, runs_of_case in sorted(per_case.items())},
    }


def _gpu_models(leg: str, path: Path, timeout_s: float = BUSY_TIMEOUT_S) -> list[str]:
    """The GPU models of ``leg``'s complete runs that a rolling baseline may take (re-runs and A/B
    rounds left out), read only."""
    query = ("SELECT DISTINCT gpu FROM runs WHERE leg = ? AND complete = 1 AND gpu IS NOT NULL "
             "AND run_id NOT LIKE ? AND run_id NOT LIKE ? ORDER BY gpu")
    with closing(_connect_read_only(path, timeout_s)) as db:
        try:
            return [row[0] for row in db.execute(query, (leg, CONFIRM_RUN, AB_RUN))]
        except sqlite3.Error as exc:
            raise HistoryError(_explain(path, exc)) from exc


def write_rolling_baseline(output: str | os.PathLike, leg: str, gpu: str | None = None, *, last: int = 5,
                           path: Path | None = None, threshold_pct: float = BASELINE_THRESHOLD_PCT) -> dict:
    """Write :func:`rolling_baseline` of ``leg`` on ``gpu`` (default: the only GPU model the leg ran
    on) as a baseline file, so that the spread of the runs it was made from, across machines or
    visits when they were, is the noise a later run is judged by; ValueError when no or several
    GPU models qualify or no run does."""
    if gpu is None:
        models = _gpu_models(leg, history_path() if path is None else Path(path))
        if len(models) != 1:
            raise ValueError(f"--gpu is needed: leg {leg} ran on {models or 'no GPU'} in the history")
        gpu = models[0]
    data = rolling_baseline(leg, gpu, last=last, path=path)
    if not data["cases"]:
        raise ValueError(f"the history holds no complete run of leg {leg} on {gpu}")
    data["threshold_pct"] = threshold_pct
    write_json_atomic(output, data)
    return data


def prune(keep: int, path: Path | None = None) -> int:
    """Keep the newest ``keep`` runs of each (leg, GPU), and apart from them its newest ``keep`` A/B
    rounds (a push's ten rounds must not crowd out the runs trends are drawn from); returns how
    many runs were removed."""
    if keep < 0:
        raise ValueError(f"keep must be non-negative; got {keep}")
    path = history_path() if path is None else Path(path)
    with closing(_connect(path)) as db:
        try:
            db.execute("BEGIN IMMEDIATE")
            doomed = [row[0] for row in db.execute(
                "SELECT run_id FROM (SELECT run_id, ROW_NUMBER() OVER (PARTITION BY leg, gpu, run_id LIKE ? "
                "ORDER BY started DESC, run_id DESC) AS n FROM runs) WHERE n > ?", (AB_RUN, keep))]
            db.executemany("DELETE FROM runs WHERE run_id = ?", [(r,) for r in doomed])
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise HistoryError(_explain(path, exc)) from exc
    return len(doomed)


def export(fmt: str, out, path: Path | None = None) -> int:
    """Every case as CSV (metrics as one JSON column) or JSON (a list) to the text stream ``out``."""
    rows = cases(path)
    if fmt == "json":
        json.dump(rows, out, indent=1, default=str)
        out.write("\n")
    elif fmt == "csv":
        writer = csv.DictWriter(out, fieldnames=CASE_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "metrics": json.dumps(row["metrics"], sort_keys=True)})
    else:
        raise ValueError(f"format must be 'csv' or 'json'; got {fmt!r}")
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    description = " ".join(__doc__.split("\n\n")[0].split())  # the first paragraph, whole
    parser = argparse.ArgumentParser(prog="python -m harness.history", description=description)
    parser.add_argument("--db", help="the database (default $KVH_HISTORY or ~/.cache/kvbits/history.sqlite)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("add", help="append run directories").add_argument("runs", nargs="+")
    sub.add_parser("list", help="list the runs")
    exp = sub.add_parser("export", help="write every case")
    exp.add_argument("--format", choices=("csv", "json"), default="csv")
    exp.add_argument("-o", "--output", help="file (default: standard output)")
    sub.add_parser("prune", help="keep the newest runs of each leg and GPU").add_argument(
        "--keep", type=int, required=True)
    base = sub.add_parser("baseline", help="write a baseline file from a leg's last runs, their spread as the noise")
    base.add_argument("--leg", required=True)
    base.add_argument("--gpu", help="the GPU model (default: the only one the leg ran on)")
    base.add_argument("--last", type=int, default=5, help="the newest complete runs to take (default %(default)s)")
    base.add_argument("-o", "--output", required=True, help="the baseline file to write")
    args = parser.parse_args(argv)
    path = Path(args.db).expanduser() if args.db else history_path()
    try:
        if args.command == "add":
            added = add_runs(args.runs, path)
            print(f"{len(added)} run(s) added to {path}")
        elif args.command == "list":
            listed = runs(path)
            if not listed:
                print(f"no runs in {path}")
            for run in listed:
                print(f"{run['started'] or '-':32} {run['run_id']:60} {run['gpu'] or '-':20} "
                      f"{(run['commit'] or '-')[:12]:12} {run['cases']:6d} cases"
                      f"{'' if run['complete'] else ' (incomplete)'}")
        elif args.command == "export":
            if args.output:
                with open(args.output, "w", encoding="utf-8", newline="") as fh:
                    count = export(args.format, fh, path)
                print(f"{count} case(s) written to {args.output}")
            else:
                export(args.format, sys.stdout, path)
        elif args.command == "baseline":
            data = write_rolling_baseline(args.output, args.leg, args.gpu, last=args.last, path=path)
            print(f"{len(data['cases'])} case(s) of {len(data['source']['runs'])} run(s) written to {args.output}")
        else:
            print(f"{prune(args.keep, path)} run(s) removed from {path}")
    except (HistoryError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
