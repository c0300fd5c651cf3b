"""A run directory written as results arrive, for runners outside pytest (mutants, sanitizer).

The manifest is written first, marked incomplete; each record is appended (one fsync'd line)
the moment it exists; :meth:`StreamedRun.finish` completes the manifest. A run killed midway
(a command limit, a lost machine) leaves every finished record and a manifest that the report
shows as an incomplete run, exactly as the pytest plugin's runs do.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Sequence
from pathlib import Path

from ..records import MANIFEST_FILE, RECORDS_FILE, Record, RecordWriter, utc_now, write_json_atomic


class StreamedRun:
    """Records and manifest of one run in ``run_dir``; :meth:`add` is safe from several threads."""

    def __init__(self, run_dir: Path, *, kind: str, leg: str | None, args: Sequence[str],
                 started: str | None = None, **extra) -> None:
        from .env import capture_or_fallback

        env = capture_or_fallback(leg)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / RECORDS_FILE).unlink(missing_ok=True)  # records append: a reused directory starts clean
        self.run_id = f"{env['leg']}@{self.run_dir.name}"
        self.leg = env["leg"]
        self.counts: dict[str, int] = {}
        self.manifest = {
            "run_id": self.run_id, "leg": self.leg, "mode": env["mode"], "env": env, "kind": kind,
            "started": started or utc_now(), "finished": None, "complete": False, "exitstatus": None,
            "args": list(args), "counts": self.counts, **extra,
        }
        self._lock = threading.Lock()
        self._write_manifest()
        self._writer = RecordWriter(self.run_dir / RECORDS_FILE)

    def _write_manifest(self) -> None:
        write_json_atomic(self.run_dir / MANIFEST_FILE, self.manifest)

    def add(self, record: Record) -> None:
        """Stamp ``record`` with this run's id and leg and append it now (the manifest's counts
        follow, as the pytest plugin's do)."""
        with self._lock:
            if self.manifest["complete"]:
                raise RuntimeError(f"run {self.run_id} is finished; no record can be added")
            record.run_id, record.leg = self.run_id, self.leg
            self._writer.write(record)
            self.counts[record.outcome] = self.counts.get(record.outcome, 0) + 1
            self._write_manifest()

    def finish(self, exitstatus: int = 0, **extra) -> None:
        """Mark the run complete (with ``extra`` manifest fields) and close the records file."""
        with self._lock:
            self.manifest.update(finished=utc_now(), complete=True, exitstatus=exitstatus, **extra)
            self._write_manifest()
            self._writer.close()


def write_run(run_dir: Path, records: Sequence[Record], *, kind: str, leg: str | None, args: Sequence[str],
              started: str, **extra) -> None:
    """Write ``records`` and a finished manifest into ``run_dir`` at once."""
    run = StreamedRun(run_dir, kind=kind, leg=leg, args=args, started=started, **extra)
    for record in records:
        run.add(record)
    run.finish()


def positive_int(text: str) -> int:
    """An argparse type for the runners' counts (``--jobs``): an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int; got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type for the runners' time limits (``--timeout``): a finite number above 0."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number; got {text}")
    return value
