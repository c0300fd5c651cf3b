"""Result records: the schema, an atomic JSON Lines writer, and a tolerant reader.

One record per suite case::

    {"schema": 1, "run_id": str, "leg": str, "suite": str, "group": "suites"|"tests",
     "case": str, "nodeid": str, "backend": str|None, "variant": str|None,
     "device": str|None, "outcome": one of OUTCOMES, "duration_s": float,
     "metrics": {name: number|str|list}, "message": str|None, "worker": str|None,
     "time": ISO-8601 UTC}

A run directory holds ``records.jsonl`` and ``manifest.json`` (environment, leg,
mode, start/end, ``complete``). Each record is one ``os.write`` of one line on a
file opened with ``O_APPEND``, then fsync'd, so a run killed mid-way leaves every
finished record readable; the reader reports (never raises on) a truncated or
corrupt line.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1
OUTCOMES = ("passed", "failed", "error", "skipped", "crashed", "timeout")
RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"
BASELINE_FORMAT = "kvh-baseline"  # the "format" of a baseline file (harness/report/baseline.py)
BASELINE_THRESHOLD_PCT = 10.0  # a baseline file's slowdown threshold, in % (harness/report/baseline.py)
OUTCOME_SEVERITY = ("skipped", "passed", "failed", "error", "timeout", "crashed")  # least to most severe
# A run directory named ``<run>-confirm`` holds the confirmation re-run of ``<run>``'s suspected
# slowdowns (harness/run/pipeline.py): the report weighs it against them, never shows it as a leg.
CONFIRM_SUFFIX = "-confirm"
# The pytest ``user_properties`` key under which a test's record payload travels to the process
# that writes it (harness/plugin.py; harness/run/gpu_workers.py tags it with the GPU).
PROPERTY = "kvh_record"

# Metric names every suite uses the same way (others are free-form).
STANDARD_METRICS = {
    "states_checked": "distinct input states or elements compared",
    "bit_errors": "bits (or codes) that differ from the reference",
    "max_abs_err": "largest |out - ref|",
    "max_rel_err": "largest |out - ref| / |ref| (or relative norm error)",
    "tolerance": "the largest max_abs_err the case accepts (the limit its assertion checks)",
    "err_to_tol": "largest |out - ref| over the error that element may have, for bounds that vary by element "
                  "(the affine s/2); at most 1 passes",
    "ms": "median kernel time in milliseconds",
    "ms_n": "how many repeats the ms is the median of (for a rolling baseline: how many runs)",
    "ms_min": "the fastest repeat in ms",
    "ms_iqr": "interquartile range of the repeats in ms",
    "ms_mad": "median absolute deviation of the repeats from ms, in ms",
    "bound": "what the figure is bound by: 'device', 'host' (issuing the call costs the host at least "
             "about the device's time) or 'cpu' (timed on the CPU alone)",
    "host_ms": "the host's time to issue one call (back-to-back calls, no synchronization)",
    "busy_ms": "the device's busy time in one call (the profiler's kernel, copy and fill durations)",
    "gbps": "achieved bandwidth in GB/s over the fewest bytes the operation must move",
    "pct_of_peak": "gbps as a percentage of the copy bandwidth measured in the same run",
    "speedup": "mapping baseline name -> baseline_ms / ms",
}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _jsonable(value):
    """Make metrics JSON-safe: tensors and numpy scalars to Python, NaN/Inf to strings."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


# The JSON type of each field of a record as read back: (Python types, what the error says).
_FIELD_TYPES = {
    **dict.fromkeys(("suite", "case", "nodeid", "outcome", "group", "run_id", "leg", "time"), ((str,), "a string")),
    **dict.fromkeys(("backend", "variant", "device", "message", "worker"), ((str, type(None)), "a string or null")),
    "duration_s": ((int, float, str), "a number"),
    "metrics": ((dict,), "an object"),
    "schema": ((int,), "an integer"),
}


@dataclass
class Record:
    suite: str
    case: str
    nodeid: str
    outcome: str
    duration_s: float = 0.0
    backend: str | None = None
    variant: str | None = None
    device: str | None = None
    metrics: dict = field(default_factory=dict)
    message: str | None = None
    worker: str | None = None
    group: str = "suites"
    run_id: str = ""
    leg: str = ""
    time: str = field(default_factory=utc_now)
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}; got {self.outcome!r}")

    def to_json(self) -> str:
        data = {k: _jsonable(v) for k, v in self.__dict__.items()}
        return json.dumps(data, sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict) -> Record:
        """A record from its JSON object. TypeError or ValueError (which readers report as a bad
        line) when it is no object, misses a field or holds a field of the wrong type."""
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for name, value in known.items():
            types, what = _FIELD_TYPES[name]
            if isinstance(value, bool) or not isinstance(value, types):
                raise TypeError(f"field {name!r} must be {what}, got {type(value).__name__}")
        if "duration_s" in known:  # non-finite durations are written as strings ("nan")
            try:
                known["duration_s"] = float(known["duration_s"])
            except ValueError:
                raise ValueError(f"field 'duration_s' must be a number, got {known['duration_s']!r}") from None
        return cls(**known)


assert set(_FIELD_TYPES) == set(Record.__dataclass_fields__)


class RecordWriter:
    """Appends records to ``records.jsonl``, one atomic write per record."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: Record) -> None:
        line = (record.to_json() + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):  # pragma: no cover - disk full
            raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class ReadResult:
    records: list[Record]
    problems: list[str]


def read_records(path: str | os.PathLike) -> ReadResult:
    """Read a JSON Lines file; bad lines become ``problems``, never exceptions."""
    path = Path(path)
    records: list[Record] = []
    problems: list[str] = []
    if not path.exists():
        return ReadResult(records, [f"{path}: no such file"])
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(Record.from_dict(json.loads(line)))
        except (ValueError, TypeError) as exc:
            where = "last line (truncated?)" if number == len(lines) else f"line {number}"
            problems.append(f"{path.name}: {where} unreadable: {exc}")
    return ReadResult(records, problems)


def write_json_atomic(path: str | os.PathLike, data) -> None:
    """Write JSON to a temporary file in the same directory, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(_jsonable(data), fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_manifest(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / MANIFEST_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
