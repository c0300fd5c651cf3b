"""pytest plugin: one record per test case, written by one process, crash- and kill-safe.

Tests ask for the ``record`` fixture and fill it in::

    def test_x(record):
        record.backend = "triton"
        record.add(states_checked=2**24, bit_errors=0)

Metrics travel with the test report (``user_properties``), so under pytest-xdist
the controller writes every record, and a worker that dies still leaves a
``crashed`` record for the test it was running. Options: ``--results-dir DIR``
(default ``$KVH_RESULTS_DIR`` or ``reports/runs/<UTC time>``; each run starts its
``records.jsonl`` afresh) and ``--leg NAME``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import sys
import time
from pathlib import Path

import pytest

from .measure import timeline
from .records import (
    MANIFEST_FILE,
    PROPERTY,
    RECORDS_FILE,
    Record,
    RecordWriter,
    utc_now,
    write_json_atomic,
)
from .run.commands import spread_controller, usable_cpus

# Exit statuses of a run that went to its end: every test passed, some failed, none was collected.
COMPLETE_EXIT_STATUSES = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
_TIMEOUT_PATTERN = re.compile(r"Timeout\s*(\(|>|\+)")


class CaseRecord:
    """What a test reports about itself; serialized into the test report."""

    def __init__(self, payload: dict) -> None:
        self._payload = payload

    def add(self, **metrics) -> None:
        self._payload["metrics"].update(metrics)

    @contextlib.contextmanager
    def raises(self, expected, *, match: str | None = None, input: str | None = None):
        """``pytest.raises`` that also files the error in the report's bad-input catalogue
        (``metrics["bad_inputs"]``: one entry per bad input a test tries)."""
        with pytest.raises(expected, match=match) as caught:
            yield caught
        self._payload["metrics"].setdefault("bad_inputs", []).append(
            {"input": input or "", "error_type": type(caught.value).__name__, "error_message": str(caught.value)}
        )

    @property
    def metrics(self) -> dict:
        return self._payload["metrics"]

    def __getattr__(self, name):
        if name in ("backend", "variant", "device"):
            return self._payload.get(name)
        raise AttributeError(name)

    def __setattr__(self, name, value) -> None:
        if name in ("backend", "variant", "device"):
            self._payload[name] = None if value is None else str(value)
        else:
            super().__setattr__(name, value)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kvh", "result records")
    group.addoption("--results-dir", default=None, help="directory for records.jsonl and manifest.json")
    group.addoption("--leg", default=None, help="version-leg name stored in every record")


@pytest.fixture
def record(request) -> CaseRecord:
    payload = {"backend": None, "variant": None, "device": None, "metrics": {}}
    request.node.user_properties.append((PROPERTY, payload))
    return CaseRecord(payload)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _suite_of(nodeid: str) -> tuple[str, str]:
    path = nodeid.split("::", 1)[0]
    parts = Path(path).parts
    group = parts[0] if len(parts) > 1 else ""
    stem = Path(path).stem
    return group, stem[5:] if stem.startswith("test_") else stem


def _text(report) -> str | None:
    """The report's message: a skip's reason as written (pytest keeps it as a (path, line,
    "Skipped: reason") tuple), else the longest form pytest gives, its last 4,000 characters."""
    if not report.longrepr:
        return None
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        reason = str(report.longrepr[2])
        return reason.removeprefix("Skipped: ")[-4000:]
    text = report.longreprtext if hasattr(report, "longreprtext") else str(report.longrepr)
    return text[-4000:]


COMPILES_KEY = "kvh_triton_compiles"  # a worker's compile counts in xdist's workeroutput


def _compile_once():
    """harness/compile/triton_cache.py when Triton loaded it as its cache manager in this process, else None."""
    return sys.modules.get("harness.compile.triton_cache")


class ProcessTimeline:
    """This process's moments (timeline.MARKS), in the controller and in each xdist worker; a
    worker hands its marks to the controller through xdist's ``workeroutput`` when it ends."""

    def __init__(self, config) -> None:
        self.config = config
        self.marks = timeline.Marks()
        self.marks.first("configured")

    def pytest_collection_finish(self, session) -> None:
        self.marks.first("collected")

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.marks.first("first_test")

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        self.marks.last("last_test_end")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session) -> None:
        self.marks.last("finished")
        output = getattr(self.config, "workeroutput", None)
        if isinstance(output, dict):
            output[timeline.KEY] = dict(self.marks.times)
            compile_once = _compile_once()
            if compile_once is not None:
                output[COMPILES_KEY] = dict(compile_once.STATS)


class RecordingPlugin:
    def __init__(self, config) -> None:
        self.config = config
        self.worker_marks: dict[str, dict] = {}
        self.triton_compiles: dict[str, int] = {}  # summed over workers (harness/compile/triton_cache.py)
        leg = config.getoption("leg") or os.environ.get("KVH_LEG")
        from .run.env import BackgroundCapture, capture

        self._env: dict | None = None
        self._env_pending = None
        if spread_controller(os.environ) and leg:  # torch is the workers' to import: capture in a child
            self._env_pending = BackgroundCapture(leg)
        else:
            self._env = capture(leg)
        self.leg = leg or self.env["leg"]
        default = os.environ.get("KVH_RESULTS_DIR") or Path("reports") / "runs" / _dt.datetime.now(
            _dt.timezone.utc
        ).strftime("%Y%m%dT%H%M%SZ")
        self.run_dir = Path(config.getoption("results_dir") or default)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = f"{self.leg}@{self.run_dir.name}"
        # Only this process writes records (xdist workers hand theirs over in their reports), and it
        # starts before any worker: a reused results directory holds this run's records alone.
        (self.run_dir / RECORDS_FILE).write_bytes(b"")
        self.writer = RecordWriter(self.run_dir / RECORDS_FILE)
        self.pending: dict[str, dict] = {}
        self.bench_total = 0  # known when this process collects (serial runs); 0: unknown
        self.progress = None
        self.started: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.manifest = {
            "run_id": self.run_id,
            "leg": self.leg,
            "mode": self._env and self._env["mode"],
            "env": self._env,
            "started": utc_now(),
            "finished": None,
            "complete": False,
            "args": list(config.invocation_params.args),
            "counts": {},
        }
        write_json_atomic(self.run_dir / MANIFEST_FILE, self.manifest)
        self.process = ProcessTimeline(config)
        config.pluginmanager.register(self.process, "kvh-timeline")

    @property
    def env(self) -> dict:
        """This run's environment (harness.run.env.capture), waiting for the background capture."""
        if self._env is None:
            self._env = self._env_pending.result()
            self.manifest.update(mode=self._env["mode"], env=self._env)
            write_json_atomic(self.run_dir / MANIFEST_FILE, self.manifest)
        return self._env

    def _env_when_ready(self) -> None:
        """Fill the manifest's environment as soon as the background capture has finished."""
        if self._env is None and self._env_pending.ready():
            self.env  # noqa: B018  (resolves and writes the manifest)

    # -- benchmark progress: one line per timed case as it lands ------------------------
    def pytest_collection_finish(self, session) -> None:
        self.bench_total = sum(1 for item in session.items if item.get_closest_marker("bench"))

    def _progress_line(self, record: Record) -> None:
        ms = record.metrics.get("ms")
        if not isinstance(ms, (int, float)) or isinstance(ms, bool):
            return
        if self.progress is None:
            from .measure.progress import BenchProgress

            self.progress = BenchProgress(self.bench_total, label="bench", config=self.config)
        pct = record.metrics.get("pct_of_peak")
        note = f"{pct:.1f}% of copy" if isinstance(pct, (int, float)) else record.outcome
        self.progress.report(f"{record.suite}::{record.case}", ms, note)

    # -- a file that cannot be collected (import error) is an error record too ---------
    def pytest_collectreport(self, report) -> None:
        if not report.failed:
            return
        group, suite = _suite_of(report.nodeid)
        record = Record(
            suite=suite,
            group=group,
            case="<collection>",
            nodeid=report.nodeid,
            outcome="error",
            message=_text(report),
            run_id=self.run_id,
            leg=self.leg,
        )
        self.writer.write(record)
        self.counts["error"] = self.counts.get("error", 0) + 1
        self.manifest["counts"] = dict(self.counts)

    # -- collecting phases into one record ---------------------------------------
    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.started[nodeid] = time.monotonic()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """pytest-xdist: a worker ended; keep its timeline marks (none when it crashed)."""
        output = getattr(node, "workeroutput", None) or {}
        marks = output.get(timeline.KEY)
        name = getattr(getattr(node, "gateway", None), "id", None)
        if isinstance(marks, dict) and name:
            self.worker_marks[str(name)] = marks
        compiles = output.get(COMPILES_KEY)
        if isinstance(compiles, dict):
            for key, n in compiles.items():
                if isinstance(n, int) and not isinstance(n, bool):
                    self.triton_compiles[key] = self.triton_compiles.get(key, 0) + n

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "???":  # pytest-xdist: the worker died while running this test
            elapsed = time.monotonic() - self.started.pop(report.nodeid, time.monotonic())
            limit = _timeout_s(self.config)
            if limit and elapsed + 0.5 >= limit:  # --timeout-method thread ends the worker process
                message = (f"Timeout (>{limit:g}s): pytest-timeout ended the worker after {elapsed:.1f} s\n"
                           f"{_text(report) or ''}")
                self._finish(report, "timeout", message, extra_duration=elapsed)
            else:
                self._finish(report, "crashed", _text(report), extra_duration=elapsed)
            return
        state = self.pending.setdefault(report.nodeid, {"duration": 0.0, "outcome": None, "message": None})
        state["duration"] += report.duration
        for name, value in report.user_properties:
            if name == PROPERTY:
                state["payload"] = value
        worker = getattr(report, "node", None)
        if worker is not None and hasattr(worker, "gateway"):
            state["worker"] = worker.gateway.id
        outcome = self._phase_outcome(report)
        if outcome and state["outcome"] in (None, "passed"):
            state["outcome"] = outcome
            if outcome != "passed":
                state["message"] = _text(report)
        if report.when == "teardown":
            self._finish(report, state["outcome"] or "passed", state["message"])

    @staticmethod
    def _phase_outcome(report) -> str | None:
        if report.skipped:
            return "skipped" if report.when != "teardown" else None
        if report.failed:
            text = _text(report) or ""
            if _TIMEOUT_PATTERN.search(text):
                return "timeout"
            return "failed" if report.when == "call" else "error"
        return "passed" if report.when == "call" else None

    def _finish(self, report, outcome: str, message: str | None, extra_duration: float | None = None) -> None:
        state = self.pending.pop(report.nodeid, {"duration": 0.0})
        payload = state.get("payload") or {}
        for name, value in getattr(report, "user_properties", ()):
            if name == PROPERTY:
                payload = value
        group, suite = _suite_of(report.nodeid)
        case = report.nodeid.split("::", 1)[1] if "::" in report.nodeid else report.nodeid
        record = Record(
            suite=suite,
            group=group,
            case=case,
            nodeid=report.nodeid,
            outcome=outcome,
            duration_s=round(state["duration"] + (extra_duration or 0.0), 6),
            backend=payload.get("backend"),
            variant=payload.get("variant"),
            device=payload.get("device"),
            metrics=payload.get("metrics") or {},
            message=message,
            worker=state.get("worker") or _worker_id_of(report),
            run_id=self.run_id,
            leg=self.leg,
        )
        self.writer.write(record)
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        self.manifest["counts"] = dict(self.counts)
        self._progress_line(record)
        self._env_when_ready()

    # -- end of run ------------------------------------------------------------------
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        for nodeid, state in list(self.pending.items()):  # interrupted between phases
            self.pending.pop(nodeid)
            self.writer.write(
                Record(
                    suite=_suite_of(nodeid)[1],
                    group=_suite_of(nodeid)[0],
                    case=nodeid.split("::", 1)[-1],
                    nodeid=nodeid,
                    outcome=state.get("outcome") if state.get("outcome") not in (None, "passed") else "crashed",
                    duration_s=state["duration"],
                    message=state.get("message") or "run ended before this test finished",
                    run_id=self.run_id,
                    leg=self.leg,
                )
            )
        self.writer.close()
        self.env  # noqa: B018  (the manifest below carries it)
        self.process.marks.last("finished")
        self.manifest["timeline"] = timeline.build(self.process.marks.times, self.worker_marks)
        if self.triton_compiles:
            self.manifest["triton_compiles"] = dict(self.triton_compiles)
        self.manifest["finished"] = utc_now()
        self.manifest["complete"] = exitstatus in COMPLETE_EXIT_STATUSES and not session.shouldstop
        self.manifest["exitstatus"] = int(exitstatus)
        write_json_atomic(self.run_dir / MANIFEST_FILE, self.manifest)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items())) or "no cases"
        terminalreporter.write_sep("-", "kv harness records")
        terminalreporter.write_line(f"leg {self.leg} ({self.env['mode']}): {counts}")
        terminalreporter.write_line(f"records: {self.run_dir / RECORDS_FILE}")


def _timeout_s(config) -> float:
    """The per-test timeout of pytest-timeout (``--timeout`` or the ``timeout`` ini value), 0 if none."""
    try:
        value = config.getoption("timeout", None) or config.getini("timeout")
        return float(value or 0)
    except (ValueError, TypeError):
        return 0.0


# A CUDA error after which the process's context is unusable: every later CUDA call fails too.
_CUDA_CONTEXT_LOST = re.compile(
    r"CUDA error: (an illegal memory access|an illegal instruction|misaligned address|unspecified launch "
    r"failure|device-side assert|invalid program counter|uncorrectable ECC)|cudaErrorIllegalAddress"
    r"|CUDA_ERROR_ILLEGAL_ADDRESS|CUDA_ERROR_LAUNCH_FAILED", re.IGNORECASE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that loses the CUDA context must cost only itself: in an xdist worker, end the
    worker at once (the controller records ``crashed`` and a fresh worker runs the rest);
    in a single process, stop the run (the manifest says incomplete) instead of failing
    every later GPU test."""
    yield
    if call.excinfo is None or not _CUDA_CONTEXT_LOST.search(str(call.excinfo.value)):
        return
    why = f"{item.nodeid}: {type(call.excinfo.value).__name__}: {str(call.excinfo.value).splitlines()[0]}"
    if _is_worker(item.config):
        sys.stderr.write(f"kv harness: the CUDA context is lost ({why}); ending this worker\n")
        sys.stderr.flush()
        os._exit(70)
    item.session.shouldstop = f"the CUDA context is lost ({why})"


def _worker_id_of(report) -> str | None:
    node = getattr(report, "node", None)
    gateway = getattr(node, "gateway", None)
    return getattr(gateway, "id", None)


def worker_cpu_threads(environ=os.environ, cpu_count: int | None = None) -> int | None:
    """CPU threads for torch in one pytest-xdist worker: the host's cores shared over the workers
    (each torch process would otherwise start one thread per core, and N workers would run N
    times too many). None outside xdist or when OMP_NUM_THREADS already decides."""
    workers = environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or not environ.get("PYTEST_XDIST_WORKER") or environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, (cpu_count or usable_cpus()) // max(1, int(workers)))


def _one_gc_pass_at_exit(config) -> None:
    """pytest's unraisableexception plugin ends every pytest process with five ``gc.collect()``
    passes (a count chosen for PyPy, whose finalizers can resurrect objects); with torch and
    triton loaded each pass walks a large heap, about 0.4 s on a small CI host, in the controller
    and in every xdist worker. On CPython reference counting frees the rest and one pass finds
    every cycle, as pytest itself concluded in its later releases. A value already set (pytester
    sets 0) is kept."""
    if sys.implementation.name != "cpython":
        return
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:  # another pytest: its own default
        return
    if gc_collect_iterations_key not in config.stash:
        config.stash[gc_collect_iterations_key] = 1


def pytest_runtest_logfinish(nodeid, location) -> None:
    """A Triton compile that failed in this test keeps its compile lock (harness/compile/triton_cache.py)
    while a traceback holds its cache manager: drop it, so that other workers stop waiting."""
    compile_once = _compile_once()
    if compile_once is not None:
        compile_once.release_all()


def pytest_configure(config) -> None:
    _one_gc_pass_at_exit(config)
    if _is_worker(config):
        config.pluginmanager.register(ProcessTimeline(config), "kvh-timeline")
        threads = worker_cpu_threads()
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        return
    config.pluginmanager.register(RecordingPlugin(config), "kvh-recording")
