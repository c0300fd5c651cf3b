"""The run history: every recorded GPU run's cases in one database, for rolling baselines and
trends over many runs: a SQLite file on one machine, or a PostgreSQL server that a fleet of
runners shares (harness.history_db says how each is reached; one schema and one set of statements
serve both).

``python -m harness.history add RUN_DIR...`` appends run directories (``records.jsonl`` and
``manifest.json``, harness.records); ``list`` lists the runs; ``export --format csv|json`` writes
every case; ``prune --keep N`` keeps the newest N runs of each (leg, GPU) and, apart, its newest N
A/B rounds; ``baseline --leg L -o FILE`` writes the rolling baseline of L's last runs as a baseline
file (each case's spread across those runs, machines or visits, as its noise). The database is
``$KVH_HISTORY`` or ``--db``: a path (default ``~/.cache/kvbits/history.sqlite``) or a URL
``postgresql://user:password@host/db``.

Durability: each run goes in as one transaction keyed by its run id, so several runners or
processes may write at once, a run already present is not added twice, and a process killed
mid-write leaves the history as it was before that run. A SQLite file runs in WAL mode with a
busy timeout; a server that drops a writer or restarts is tried again. A history that is locked
past the timeout, unreadable, not a database or unreachable raises :class:`HistoryError` saying
which (a URL's password hidden) and what to do; callers report it and go on (a run's report
never depends on the history).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from .history_db import (
    BUSY_TIMEOUT_S,
    CASES,
    DEFAULT_PATH,
    RUNS,
    HistoryError,
    HistoryMissing,
    Location,
    as_location,
    history_location,
    reader,
    retrying,
    sa,
    shown,
    writer,
)
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

CASE_COLUMNS = ("run_id", "leg", "gpu", "commit_sha", "started", "suite", "nodeid", "variant", "backend", "device",
                "outcome", "duration_s", "metrics")


def _location(path: str | os.PathLike | None) -> Location:
    """``path`` (a file or a PostgreSQL URL), else ``$KVH_HISTORY``'s."""
    return history_location() if path is None else as_location(path)


def _text(value) -> str | None:
    """A value for a text column: None stays None; a server's text holds no NUL character."""
    return None if value is None else str(value).replace("\x00", "\ufffd")


def _oldest_first() -> tuple:
    return (RUNS.c.started.asc().nulls_first(), RUNS.c.run_id.asc())


def _newest_first() -> tuple:
    return (RUNS.c.started.desc().nulls_last(), RUNS.c.run_id.desc())


def run_key(manifest: dict, run_dir: Path) -> str:
    """The id a run directory has in the history: the manifest's run id and start time together,
    since a pipeline reuses one run directory (and run id) per kind and leg for every run."""
    return f"{manifest.get('run_id') or run_dir.name}@{manifest.get('started') or '-'}"


def _run_row(run_dir: Path) -> dict:
    """A run's row, keyed by :func:`run_key`."""
    manifest = read_manifest(run_dir)
    if not isinstance(manifest, dict):
        manifest = {}
    env = manifest.get("env") if isinstance(manifest.get("env"), dict) else {}
    return {"run_id": _text(run_key(manifest, run_dir)), "leg": _text(manifest.get("leg")),
            "mode": _text(manifest.get("mode")), "gpu": _text(env.get("gpu")), "commit_sha": _text(env.get("commit")),
            "torch": _text(env.get("torch")), "triton": _text(env.get("triton")),
            "started": _text(manifest.get("started")), "finished": _text(manifest.get("finished")),
            "complete": int(bool(manifest.get("complete")))}


def _case_rows(run_id: str, run_dir: Path) -> list[dict]:
    rows = []
    for r in read_records(run_dir / RECORDS_FILE).records:
        timed = isinstance(r.duration_s, (int, float)) and not isinstance(r.duration_s, bool)
        duration = r.duration_s if timed else None
        rows.append({"run_id": run_id, "suite": _text(r.suite), "nodeid": _text(r.nodeid), "variant": _text(r.variant),
                     "backend": _text(r.backend), "device": _text(r.device), "outcome": _text(r.outcome),
                     "duration_s": duration, "metrics": _text(json.dumps(r.metrics, sort_keys=True, default=str))})
    return rows


def _insert_run(engine, location: Location, run: dict, case_rows: list[dict]) -> bool:
    """One run and its cases in one transaction; False when the run is there already (added by
    another writer: the run id is the primary key, so the second insert fails and nothing of it
    stays). A connection lost on the way is tried again; when an attempt had sent its commit
    before the loss, finding the run there afterwards means that commit went through."""
    committing = []

    def attempt(_number: int) -> bool:
        with engine.connect() as connection:
            connection.execute(RUNS.insert(), run)
            if case_rows:
                connection.execute(CASES.insert(), case_rows)
            committing.append(True)
            connection.commit()
        return True

    try:
        return retrying(location, attempt)
    except sa.exc.IntegrityError:
        return bool(committing)


def add_runs(run_dirs: Iterable[str | os.PathLike], path: str | os.PathLike | None = None) -> list[str]:
    """Append each run directory's records, one transaction per run; returns the run ids added
    (a run already in the history is skipped, a directory without records too). ``path``: a
    SQLite file or a PostgreSQL URL (default ``$KVH_HISTORY``)."""
    location = _location(path)
    added = []
    with writer(location) as engine:
        for run_dir in map(Path, run_dirs):
            if not (run_dir / RECORDS_FILE).exists() and not (run_dir / MANIFEST_FILE).exists():
                continue
            run = _run_row(run_dir)
            if _insert_run(engine, location, run, _case_rows(run["run_id"], run_dir)):
                added.append(run["run_id"])
    return added


def runs(path: str | os.PathLike | None = None) -> list[dict]:
    """Every run, oldest first, with its number of cases; none where there is no history yet
    (reading creates nothing)."""
    try:
        with reader(_location(path)) as connection:
            rows = connection.execute(
                sa.select(RUNS.c.run_id, RUNS.c.leg, RUNS.c.gpu, RUNS.c.commit_sha, RUNS.c.started, RUNS.c.complete,
                          sa.func.count(CASES.c.run_id))
                .select_from(RUNS.outerjoin(CASES, CASES.c.run_id == RUNS.c.run_id))
                .group_by(RUNS.c.run_id).order_by(*_oldest_first())).all()
    except HistoryMissing:
        return []
    keys = ("run_id", "leg", "gpu", "commit", "started", "complete", "cases")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def cases(path: str | os.PathLike | None = None, *, nodeid: str | None = None, leg: str | None = None,
          gpu: str | None = None) -> list[dict]:
    """Every case (metrics decoded), oldest run first; filtered by nodeid, leg and GPU when given;
    none where there is no history yet."""
    try:
        with reader(_location(path)) as connection:
            query = (sa.select(CASES.c.run_id, RUNS.c.leg, RUNS.c.gpu, RUNS.c.commit_sha, RUNS.c.started,
                               CASES.c.suite, CASES.c.nodeid, CASES.c.variant, CASES.c.backend, CASES.c.device,
                               CASES.c.outcome, CASES.c.duration_s, CASES.c.metrics)
                     .join_from(CASES, RUNS, CASES.c.run_id == RUNS.c.run_id)
                     .order_by(*_oldest_first(), CASES.c.rowid))
            for column, value in ((CASES.c.nodeid, nodeid), (RUNS.c.leg, leg), (RUNS.c.gpu, gpu)):
                if value is not None:
                    query = query.where(column == value)
            rows = connection.execute(query).all()
    except HistoryMissing:
        return []
    out = []
    for row in rows:
        item = dict(zip(CASE_COLUMNS, row, strict=True))
        item["metrics"] = json.loads(item["metrics"] or "{}")
        out.append(item)
    return out


def rolling_values(nodeid: str, metric: str, *, leg: str, gpu: str | None, last: int,
                   path: str | os.PathLike | None = None) -> list[float]:
    """The metric of a passed case over the newest ``last`` runs of one leg and GPU (oldest first):
    what a rolling baseline is made of."""
    values = [c["metrics"].get(metric) for c in cases(path, nodeid=nodeid, leg=leg, gpu=gpu)
              if c["outcome"] == "passed"]
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)][-last:]


def _metric_of(metrics: str | None, metric: str) -> float | None:
    """A number from a case's metrics column; None when absent, not a number or unreadable."""
    try:
        value = json.loads(metrics or "{}").get(metric)
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _trend_runs():
    """The runs a trend or a rolling baseline is drawn from: re-runs and A/B rounds left out."""
    return sa.and_(RUNS.c.run_id.not_like(CONFIRM_RUN), RUNS.c.run_id.not_like(AB_RUN))


def _newest_runs(connection, leg: str, gpu: str | None, last: int, nodeids: list[str] | None) -> list[tuple]:
    """(run_id, commit, started) of the newest ``last`` runs of a leg and GPU, oldest first; with
    ``nodeids``, only the runs that ran one of them."""
    query = (sa.select(RUNS.c.run_id, RUNS.c.commit_sha, RUNS.c.started)
             .where(RUNS.c.leg == leg, RUNS.c.gpu.is_not_distinct_from(gpu), _trend_runs())
             .order_by(*_newest_first()).limit(max(0, last)))
    if nodeids is not None:
        query = query.where(sa.exists().where(CASES.c.run_id == RUNS.c.run_id, CASES.c.nodeid.in_(nodeids)))
    return list(reversed(connection.execute(query).all()))


def case_series(metric: str, *, leg: str, gpu: str | None, last: int, nodeids: Iterable[str] | None = None,
                path: str | os.PathLike | None = None, timeout_s: float = BUSY_TIMEOUT_S
                ) -> tuple[list[dict], dict[tuple[str, str | None], list[float | None]]]:
    """``metric`` of each case over the newest ``last`` runs of one leg and GPU, oldest first: the
    runs (run_id, commit, started) and, per (nodeid, variant), one value per run, None where the
    case did not pass or lacks the metric. ``nodeids``: only these cases, and only the runs that
    ran one of them (a pipeline's suites and benchmarks go in as two runs). Reads only; a missing,
    locked (past ``timeout_s``), unreachable or unreadable history raises :class:`HistoryError`."""
    wanted = None if nodeids is None else sorted(set(nodeids))
    with reader(_location(path), timeout_s) as connection:
        runs_rows = _newest_runs(connection, leg, gpu, last, wanted)
        ids = [row[0] for row in runs_rows]
        case_rows = connection.execute(
            sa.select(CASES.c.run_id, CASES.c.nodeid, CASES.c.variant, CASES.c.outcome, CASES.c.metrics)
            .where(CASES.c.run_id.in_(ids)).order_by(CASES.c.rowid)).all()
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
             "outcome": max((row[4] for row in rows), key=_severity), "runs_n": len(rows)}
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


def rolling_baseline(leg: str, gpu: str | None, *, last: int = 5, path: str | os.PathLike | None = None,
                     timeout_s: float = BUSY_TIMEOUT_S, exclude: Iterable[str] = ()) -> dict:
    """A baseline (the dict ``harness.report.baseline.compare`` takes) from the run history: each
    case as it ran in the newest ``last`` complete runs of ``leg`` on ``gpu`` that ran it (a
    pipeline's suites and benchmarks go in as separate runs; confirmation re-runs are left out):
    the median of its per-run medians as ``ms``, their spread across the runs as its noise
    (``ms_n`` runs, ``ms_min``, ``ms_iqr``, ``ms_mad``, ``spread: "runs"``), the worst outcome and
    errors, and ``runs_n``, the runs it was taken from. ``exclude``: run ids (:func:`run_key`) left
    out, such as those of the run compared, once it is in the history itself. Reads only;
    HistoryError as for :func:`case_series`."""
    if last < 1:
        raise ValueError(f"last must be at least 1; got {last}")
    location = _location(path)
    with reader(location, timeout_s) as connection:
        rows = connection.execute(
            sa.select(CASES.c.suite, CASES.c.nodeid, CASES.c.backend, CASES.c.variant, CASES.c.outcome,
                      CASES.c.metrics, RUNS.c.run_id, RUNS.c.mode, RUNS.c.commit_sha)
            .join_from(CASES, RUNS, CASES.c.run_id == RUNS.c.run_id)
            .where(RUNS.c.leg == leg, RUNS.c.gpu.is_not_distinct_from(gpu), RUNS.c.complete == 1, _trend_runs())
            .order_by(*_newest_first(), CASES.c.rowid)).all()
    excluded = set(exclude)
    rows = [tuple(row) for row in rows if row[6] not in excluded]
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
                   "rolling": last, "history": shown(location)},
        "cases": {key: _rolling_entry(list(runs_of_case.values()), leg, env)
                  for key, runs_of_case in sorted(per_case.items())},
    }


def _gpu_models(leg: str, location: Location, timeout_s: float = BUSY_TIMEOUT_S) -> list[str]:
    """The GPU models of ``leg``'s complete runs that a rolling baseline may take (re-runs and A/B
    rounds left out), read only."""
    with reader(location, timeout_s) as connection:
        return list(connection.execute(
            sa.select(RUNS.c.gpu).distinct()
            .where(RUNS.c.leg == leg, RUNS.c.complete == 1, RUNS.c.gpu.is_not(None), _trend_runs())
            .order_by(RUNS.c.gpu)).scalars())


def write_rolling_baseline(output: str | os.PathLike, leg: str, gpu: str | None = None, *, last: int = 5,
                           path: str | os.PathLike | None = None,
                           threshold_pct: float = BASELINE_THRESHOLD_PCT) -> dict:
    """Write :func:`rolling_baseline` of ``leg`` on ``gpu`` (default: the only GPU model the leg ran
    on) as a baseline file, so that the spread of the runs it was made from, across machines or
    visits when they were, is the noise a later run is judged by; ValueError when no or several
    GPU models qualify or no run does."""
    if gpu is None:
        models = _gpu_models(leg, _location(path))
        if len(models) != 1:
            raise ValueError(f"--gpu is needed: leg {leg} ran on {models or 'no GPU'} in the history")
        gpu = models[0]
    data = rolling_baseline(leg, gpu, last=last, path=path)
    if not data["cases"]:
        raise ValueError(f"the history holds no complete run of leg {leg} on {gpu}")
    data["threshold_pct"] = threshold_pct
    write_json_atomic(output, data)
    return data


def prune(keep: int, path: str | os.PathLike | None = None) -> int:
    """Keep the newest ``keep`` runs of each (leg, GPU), and apart from them its newest ``keep`` A/B
    rounds (a push's ten rounds must not crowd out the runs trends are drawn from), in one
    transaction (a removed run's cases go with it); returns how many runs were removed."""
    if keep < 0:
        raise ValueError(f"keep must be non-negative; got {keep}")
    location = _location(path)
    with writer(location) as engine:
        def attempt(_number: int) -> int:
            numbered = sa.select(RUNS.c.run_id, sa.func.row_number().over(
                partition_by=(RUNS.c.leg, RUNS.c.gpu, RUNS.c.run_id.like(AB_RUN)),
                order_by=_newest_first()).label("n")).subquery()
            with engine.connect() as connection:
                removed = connection.execute(RUNS.delete().where(RUNS.c.run_id.in_(
                    sa.select(numbered.c.run_id).where(numbered.c.n > keep)))).rowcount
                connection.commit()
            return removed

        return retrying(location, attempt)


def export(fmt: str, out, path: str | os.PathLike | None = None) -> int:
    """Every case as CSV (metrics as one JSON column) or JSON (a list) to the text stream ``out``."""
    rows = cases(path)
    if fmt == "json":
        json.dump(rows, out, indent=1, default=str)
        out.write("\n")
    elif fmt == "csv":
        table = csv.DictWriter(out, fieldnames=CASE_COLUMNS)
        table.writeheader()
        for row in rows:
            table.writerow({**row, "metrics": json.dumps(row["metrics"], sort_keys=True)})
    else:
        raise ValueError(f"format must be 'csv' or 'json'; got {fmt!r}")
    return len(rows)


def main(argv: Sequence[str] | None = None) -> int:
    description = " ".join(__doc__.split("\n\n")[0].split())  # the first paragraph, whole
    parser = argparse.ArgumentParser(prog="python -m harness.history", description=description)
    parser.add_argument("--db", help="the database: a SQLite file or postgresql://user:password@host/db "
                                     f"(default $KVH_HISTORY or {DEFAULT_PATH})")
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
    path = _location(args.db)
    try:
        if args.command == "add":
            added = add_runs(args.runs, path)
            print(f"{len(added)} run(s) added to {shown(path)}")
        elif args.command == "list":
            listed = runs(path)
            if not listed:
                print(f"no runs in {shown(path)}")
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
            print(f"{prune(args.keep, path)} run(s) removed from {shown(path)}")
    except (HistoryError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
