"""The figures of a same-job A/B (harness/run/ab.py): ``ab.json`` built from the rounds' run
directories, read back for the report, and its Markdown table.

``ab.json``::

    {"format": "kvh-ab", "version": 1, "created": ISO-8601,
     "base": {"ref", "commit"}, "head": {"ref", "commit", "dirty"},
     "rounds": planned, "rounds_done": int, "order": [["base", "head"], ["head", "base"], ...],
     "device", "gpu", "leg", "metric": "ms", "confidence", "min_effect",
     "runs": [{"round", "side", "run_dir" (relative to ab.json's folder), "rc", "seconds", "commit"}],
     "failed": null or {"round", "side", "rc"},
     "cases": [{"nodeid", "suite", "backend", "variant", "base_ms": [per round], "head_ms": [...],
                "base_median_ms", "head_median_ms", "ratio", "interval": [low, high] or null,
                "significant", "change", "rounds", "method"}],
     "only_base": [nodeid], "only_head": [nodeid]}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..measure import ab_stats
from ..records import RECORDS_FILE, read_manifest, read_records, utc_now

AB_FILE = "ab.json"
AB_FORMAT = "kvh-ab"
AB_VERSION = 1
SIDES = ("base", "head")
MARKDOWN_ROWS = 40  # rows of the Markdown table; every case is in ab.json


@dataclass
class RoundRun:
    """One pytest run of one side in one round (rounds count from 1)."""

    round: int
    side: str
    run_dir: Path
    rc: int
    seconds: float = 0.0


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def case_times(run_dir: str | os.PathLike) -> dict[str, dict]:
    """The passed cases of a run directory that recorded a positive ``ms``, by node id: the time,
    what names the case, and the relative standard error of the median from the run's repeats
    when the record carries their spread (``ms_n`` with ``ms_mad`` or ``ms_iqr``)."""
    out: dict[str, dict] = {}
    for record in read_records(Path(run_dir) / RECORDS_FILE).records:
        metrics = record.metrics
        ms = _number(metrics.get("ms"))
        if record.outcome != "passed" or ms is None or ms <= 0:
            continue
        out[record.nodeid] = {
            "ms": ms, "suite": record.suite, "backend": record.backend, "variant": record.variant,
            "se": ab_stats.median_relative_se(ms, _number(metrics.get("ms_n")), mad=_number(metrics.get("ms_mad")),
                                              iqr=_number(metrics.get("ms_iqr"))),
        }
    return out


def _relative(path: Path, root: Path) -> str:
    try:
        return Path(os.path.relpath(path, root)).as_posix()
    except ValueError:  # another drive
        return str(path)


def _case(nodeid: str, times: dict[str, list[dict | None]], rounds: int) -> dict:
    base = [t["ms"] if t else None for t in times["base"]]
    head = [t["ms"] if t else None for t in times["head"]]
    paired = [i for i in range(rounds) if base[i] is not None and head[i] is not None]
    repeat_se = None
    if len(paired) == 1:
        i = paired[0]
        repeat_se = (times["base"][i]["se"], times["head"][i]["se"])
    verdict = ab_stats.compare(base, head, repeat_se=repeat_se)
    named = next(t for side in SIDES for t in times[side] if t)
    return {
        "nodeid": nodeid, "suite": named["suite"], "backend": named["backend"], "variant": named["variant"],
        "base_ms": base, "head_ms": head,
        "base_median_ms": verdict.base_median, "head_median_ms": verdict.head_median,
        "ratio": verdict.ratio,
        "interval": None if verdict.low is None else [verdict.low, verdict.high],
        "significant": verdict.significant, "change": verdict.change,
        "rounds": verdict.rounds, "method": verdict.method,
    }


def _order_key(case: dict) -> tuple:
    """Significant changes first (largest first), then the rest by node id."""
    ratio = case["ratio"] or 1.0
    return (not case["significant"], -abs(math.log(ratio)) if case["significant"] else 0.0, case["nodeid"])


def build(runs: Sequence[RoundRun], *, rounds: int, base: dict, head: dict, root: Path,
          order: Sequence[tuple[int, str]], device: str | None = None, gpu: str | None = None,
          leg: str = "", failed: RoundRun | None = None) -> dict:
    """``ab.json``'s content from the runs that ran (run directories written relative to ``root``,
    the folder ``ab.json`` goes in)."""
    times: dict[str, dict[str, list[dict | None]]] = {}
    run_rows = []
    for run in runs:
        for nodeid, found in case_times(run.run_dir).items():
            slots = times.setdefault(nodeid, {side: [None] * rounds for side in SIDES})
            slots[run.side][run.round - 1] = found
        commit = (read_manifest(run.run_dir).get("env") or {}).get("commit")
        run_rows.append({"round": run.round, "side": run.side, "run_dir": _relative(run.run_dir, root),
                         "rc": run.rc, "seconds": round(run.seconds, 2), "commit": commit})
    both = {n: t for n, t in times.items() if all(any(t[side]) for side in SIDES)}
    cases = sorted((_case(n, t, rounds) for n, t in both.items()), key=_order_key)
    return {
        "format": AB_FORMAT, "version": AB_VERSION, "created": utc_now(),
        "base": dict(base), "head": dict(head),
        "rounds": rounds, "rounds_done": len({r.round for r in runs if r.rc == 0 and _both_sides(runs, r.round)}),
        "order": [[side for r, side in order if r == n] for n in range(1, rounds + 1)],
        "device": device, "gpu": gpu, "leg": leg, "metric": "ms",
        "confidence": ab_stats.CONFIDENCE, "min_effect": ab_stats.MIN_EFFECT,
        "runs": run_rows,
        "failed": None if failed is None else {"round": failed.round, "side": failed.side, "rc": failed.rc},
        "cases": cases,
        "only_base": sorted(n for n, t in times.items() if n not in both and any(t["base"])),
        "only_head": sorted(n for n, t in times.items() if n not in both and any(t["head"])),
        "counts": _counts(cases),
    }


def _counts(cases: Sequence[dict]) -> dict[str, int]:
    return {change: sum(c["change"] == change for c in cases)
            for change in ("slower", "faster", "within noise", "no interval")}


def _both_sides(runs: Sequence[RoundRun], number: int) -> bool:
    return {r.side for r in runs if r.round == number and r.rc == 0} == set(SIDES)


def write(path: str | os.PathLike, ab: dict) -> Path:
    """``ab.json`` (written whole, then renamed over the old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(ab, indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


# -- reading it back -------------------------------------------------------------------------------

_CASE_DEFAULTS = {"suite": "", "backend": None, "variant": None, "base_median_ms": None, "head_median_ms": None,
                  "ratio": None, "interval": None, "significant": False, "change": "no interval", "rounds": 0,
                  "method": "", "base_ms": [], "head_ms": []}


def read(path: str | os.PathLike) -> dict:
    """An ``ab.json`` with every field the report shows present (defaults for missing ones);
    ValueError when it cannot be read or is no A/B file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the A/B figures: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != AB_FORMAT or not isinstance(data.get("cases"), list):
        raise ValueError(f"{path}: not an A/B file (format {AB_FORMAT!r} with a list of cases)")
    cases = []
    for case in data["cases"]:
        if not isinstance(case, dict) or not isinstance(case.get("nodeid"), str):
            continue
        full = {**_CASE_DEFAULTS, **case}
        for key in ("base_median_ms", "head_median_ms", "ratio"):
            full[key] = _number(full[key])
        interval = full["interval"]
        bounds = [_number(v) for v in interval] if isinstance(interval, list) and len(interval) == 2 else []
        full["interval"] = bounds if bounds and None not in bounds else None
        full["significant"] = full["significant"] is True
        cases.append(full)
    failed = data.get("failed")

    def side(key: str) -> dict:
        found = data.get(key)
        return {"ref": "", "commit": "", **(found if isinstance(found, dict) else {})}

    return {
        **{key: data.get(key) for key in ("created", "device", "gpu", "leg")},
        "failed": failed if isinstance(failed, dict) and {"round", "side", "rc"} <= set(failed) else None,
        "base": side("base"), "head": side("head"),
        "rounds": data.get("rounds") or 0, "rounds_done": data.get("rounds_done") or 0,
        "order": data.get("order") if isinstance(data.get("order"), list) else [],
        "confidence": _number(data.get("confidence")) or ab_stats.CONFIDENCE,
        "min_effect": _number(data.get("min_effect")) or ab_stats.MIN_EFFECT,
        "runs": [r for r in data.get("runs") or [] if isinstance(r, dict)],
        "cases": cases,
        "only_base": _names(data.get("only_base")), "only_head": _names(data.get("only_head")),
        "counts": _counts(cases),
    }


def _names(value) -> list[str]:
    return [str(n) for n in value] if isinstance(value, list) else []


def run_dirs_of(ab: dict, folder: Path) -> list[Path]:
    """The run directories an ``ab.json`` read from ``folder`` names, as paths."""
    return [folder / str(r["run_dir"]) for r in ab.get("runs", []) if r.get("run_dir")]


# -- the Markdown table ------------------------------------------------------------------------------


def _short(commit: str | None) -> str:
    return (commit or "?")[:10]


def _ms(value) -> str:
    number = _number(value)
    return "" if number is None else f"{number:.4g}"


def _ratio(value: float) -> str:
    return f"{value:.3f}" if 0.01 <= value < 100 else f"{value:.3g}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def heading(ab: dict) -> str:
    base = ab["base"]
    return f"A/B: head vs {base.get('ref') or _short(base.get('commit'))}"


def markdown(ab: dict) -> str:
    """The A/B as a Markdown section: heading, one line on what ran, a table (changes first)."""
    base, head = ab["base"], ab["head"]
    where = f"GPU {ab['device']}" + (f" ({ab['gpu']})" if ab.get("gpu") else "") if ab.get("device") else "CPU"
    pct = f"{ab['confidence'] * 100:g}%"
    lines = [
        f"## {heading(ab)}", "",
        f"Head `{_short(head.get('commit'))}`{' with uncommitted changes' if head.get('dirty') else ''} against "
        f"base `{_short(base.get('commit'))}`: {ab['rounds_done']} of {ab['rounds']} rounds on {where}, "
        f"each side first in every other round. Ratio: head/base of the median ms, with its {pct} interval; "
        f"a change counts when the interval excludes 1 and it is at least {ab['min_effect'] * 100:g}%.", "",
    ]
    if ab.get("failed"):
        failed = ab["failed"]
        lines += [f"**Stopped**: round {failed['round']} of the {failed['side']} exited {failed['rc']}; "
                  "the figures are those of the runs before.", ""]
    cases = ab["cases"]
    if not cases:
        lines += ["No case recorded a time on both sides.", ""]
        return "\n".join(lines)
    lines += [f"| case | base ms | head ms | head/base | {pct} interval | rounds | change |",
              "| --- | ---: | ---: | ---: | --- | ---: | --- |"]
    for case in cases[:MARKDOWN_ROWS]:
        interval = case["interval"]
        span = f"{_ratio(interval[0])} to {_ratio(interval[1])}" if interval else ""
        ratio = _ratio(case["ratio"]) if case["ratio"] is not None else ""
        change = f"**{case['change']}**" if case["significant"] else case["change"]
        lines.append(f"| `{_cell(case['nodeid'])}` | {_ms(case['base_median_ms'])} | {_ms(case['head_median_ms'])} "
                     f"| {ratio} | {span} | {case['rounds']} | {change} |")
    if len(cases) > MARKDOWN_ROWS:
        lines.append(f"\n{len(cases) - MARKDOWN_ROWS} more cases in ab.json.")
    counts = ab.get("counts") or {}
    lines += ["", ", ".join(f"{n} {change}" for change, n in counts.items() if n) + ".", ""]
    return "\n".join(lines)
