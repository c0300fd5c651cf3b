"""Run one validation pipeline: the suites, the benchmarks, then the report, always.

``python -m harness.run.pipeline KIND [options] [pytest args]`` with KIND one of

- ``tests``: harness unit tests and every suite in the Triton interpreter on CPU;
- ``verify``: the suites on whatever device there is (plus the benchmarks on a GPU);
- ``gpu_verify``: the suites over every GPU, then the benchmarks; refuses without CUDA;
- ``bench``: the benchmarks alone;
- ``report``: re-render the report from the run directories given (default: all).

The nox sessions of the same names call this module in their environment, and
``python -m harness.gpu_verify`` is ``gpu_verify`` on the installed torch/triton,
so a machine without nox runs exactly what ``nox -s gpu_verify`` runs. The device
is probed in a child process, so this process never holds a CUDA context.

Results land in ``reports/runs/<kind>-<leg>[-bench]/`` (both removed when the leg
starts, so a step it skips shows nothing old); the report of a kind
(``reports/<kind>-report.html``, ``<kind>-junit.xml``, ``<kind>-summary.md``; ``all-...``
for ``report``) covers every run directory of that kind, so the legs of one family share one
page and one family's run never overwrites another's report. The exit code is 0
only when every step succeeded; 3 means gpu_verify found no CUDA device. On a GPU, benchmark
cases slower than the baseline beyond threshold and noise, and cases whose error grew past its
factor, are run once more into ``<step's directory>-confirm`` before the report
(:func:`confirm_suspects`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..measure import timeline
from ..records import BASELINE_FORMAT, CONFIRM_SUFFIX, read_manifest
from . import commands, legs

NO_CUDA_EXIT = 3
FALLBACK_NOTICE = "no CUDA device: running in the Triton interpreter on CPU"

_PROBE = r"""
import json, os
info = {"torch": None, "triton": None, "cuda": None, "count": 0, "names": []}
try:
    import torch
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["count"] = torch.cuda.device_count()
        info["names"] = [torch.cuda.get_device_name(i) for i in range(info["count"])]
except Exception as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
try:
    import triton
    info["triton"] = triton.__version__
except Exception as exc:
    info.setdefault("error", f"{type(exc).__name__}: {exc}")
print(json.dumps(info))
"""


def probe(python: str = sys.executable, env: dict | None = None) -> dict:
    """torch/triton versions and visible CUDA devices of ``python``, asked in a child process."""
    out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"torch": None, "triton": None, "cuda": None, "count": 0, "names": [],
                "error": (out.stderr.strip().splitlines() or ["probe failed"])[-1]}
    return json.loads(lines[-1])


def visible_devices(count: int, environ=os.environ) -> list[str]:
    """Device ids for ``count`` visible GPUs: entries of CUDA_VISIBLE_DEVICES when set."""
    listed = [p.strip() for p in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if p.strip()]
    if "CUDA_VISIBLE_DEVICES" in environ and listed:
        return listed[:count]
    return [str(i) for i in range(count)]


STATIC_BASELINE = "static-budget.json"  # machine-code figures per interpreter leg (no timings)


def without_local_versions(name: str) -> str:
    """A leg name with the local labels of its versions dropped: ``gpu-torch2.11.0+cu130-triton3.6.0``
    and ``gpu-torch2.11.0-triton3.6.0`` (a leg's pins) name the same stack."""
    return re.sub(r"\+[0-9A-Za-z.]*", "", name)


def is_baseline(path: Path) -> bool:
    """Whether ``path`` is a baseline file the report reads, not some other JSON kept beside them."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == BASELINE_FORMAT


def gpu_baselines(folder: Path) -> list[Path]:
    """The baseline files in ``folder``, the machine-code one of the interpreter legs aside."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if p.name != STATIC_BASELINE and is_baseline(p))


def pick_baseline(explicit: str | None, leg: str, *, gpu: bool, root: Path = Path(".")) -> str | None:
    """The baseline to compare against: an explicit path or $KVH_BASELINE; on a GPU run
    otherwise ``reports/baselines/<leg>.json`` (with or without the local label of the torch
    version, ``+cu130``, on either side), or the only GPU baseline there; without a GPU
    ``reports/baselines/static-budget.json`` (the kernels' machine-code figures per leg)."""
    chosen = explicit or os.environ.get("KVH_BASELINE")
    if chosen:
        return chosen
    folder = root / commands.REPORTS_DIR / "baselines"
    if not gpu:
        static = folder / STATIC_BASELINE
        return str(static) if static.is_file() else None
    found = gpu_baselines(folder)
    named = [p for p in found if p.stem == leg]
    same_stack = [p for p in found if without_local_versions(p.stem) == without_local_versions(leg)]
    for candidates in (named, same_stack, found):
        if len(candidates) == 1:
            return str(candidates[0])
    return None


def family_run_dirs(kind: str, reports_dir: str) -> list[str]:
    """Every run directory of ``kind`` under ``reports_dir/runs`` (all legs run so far)."""
    runs = Path(reports_dir) / commands.RUNS_SUBDIR
    if not runs.is_dir():
        return []
    return sorted(str(p) for p in runs.glob(f"{kind}-*") if p.is_dir())


def all_run_dirs(reports_dir: str) -> list[str]:
    """The run directories of every pipeline kind (not the ad-hoc ones of plain pytest runs)."""
    return sorted(d for kind in commands.KINDS for d in family_run_dirs(kind, reports_dir))


HISTORY_KINDS = ("gpu_verify", "bench")  # the GPU runs kept in the run history (harness.history) unless --history


def kept_in_history(kind: str, gpu: bool, asked: bool) -> bool:
    """Whether a pipeline run of ``kind`` goes into the run history: GPU runs of HISTORY_KINDS, and
    any run (CPU ones included) when ``--history`` asked."""
    return asked or (gpu and kind in HISTORY_KINDS)


def record_history(run_dirs: Sequence[str], path: Path | str | None = None) -> list[str]:
    """Append a run's directories to the run history and say so (a confirmation re-run is no run
    of its own there); a history that cannot be used is said, never fatal (the run's report
    stands on its own)."""
    from .. import history

    target = history.history_location() if path is None else history.as_location(path)
    try:
        added = history.add_runs([d for d in run_dirs if not d.endswith(CONFIRM_SUFFIX)], target)
    except history.HistoryError as exc:
        _say(f"history: {exc}; this run is not in it")
        return []
    _say(f"history: {len(added)} run(s) added to {history.shown(target)}")
    return added


def suspected_regressions(results_dir: str, baseline: str, python: str = sys.executable) -> list[str]:
    """Node ids of the cases in ``results_dir`` whose kernel timing is slower than ``baseline``
    beyond threshold and noise, or whose error grew past its factor (``python -m harness
    suspects``, in a child: the report's comparison is not this package's to import); none when
    that cannot be told, which is said."""
    argv = [python, "-m", "harness", "suspects", results_dir, "--baseline", baseline]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _say(f"confirm: could not compare {results_dir} with {baseline}: {exc}")
        return []
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        _say(f"confirm: could not compare {results_dir} with {baseline}: {reason}")
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def rerun_argv(argv: Sequence[str], nodeids: Sequence[str], results_dir: str) -> list[str]:
    """A suites or benchmark step's pytest command narrowed to ``nodeids``, recording into
    ``results_dir``."""
    out = list(argv)
    out[out.index("--results-dir") + 1] = results_dir
    where = out.index("suites")
    return [*out[:where], *nodeids, *out[where + 1:]]


CONFIRMED_STEPS = {"suites": "confirm suites", "benchmarks": "confirm"}  # step -> its re-run's name


def confirm_suspects(steps: Sequence, gpus: Sequence[str], baseline: str | None, timings: list[dict],
                     python: str = sys.executable) -> list[str]:
    """Re-run once, into ``<step's run directory>-confirm``, each suites or benchmark step's
    suspects against ``baseline``: the kernel cases slower beyond threshold and noise, and the
    cases whose error grew past its factor (their re-run draws fresh random inputs). The report
    then counts a suspect only when its re-run shows it too (harness/report/baseline.py). The
    steps' own results are never touched, and a re-run that fails fails nothing (its suspects
    stay unsettled, so counted). Without a GPU or a baseline nothing is run. Returns the re-runs'
    directories."""
    if not gpus or baseline is None:
        return []
    done = []
    for step in steps:
        name = CONFIRMED_STEPS.get(step.name)
        if name is None or not step.results_dir:
            continue
        suspects = suspected_regressions(step.results_dir, baseline, python)
        if not suspects:
            continue
        out = step.results_dir + CONFIRM_SUFFIX
        shutil.rmtree(out, ignore_errors=True)
        _say(f"confirm: {len(suspects)} {step.name} case(s) beyond the baseline's threshold and noise; running "
             f"them once more")
        _run(name, rerun_argv(step.argv, suspects, out), step.env, timings, ok=(0, 1))
        done.append(out)
    return done


def _say(text: str) -> None:
    print(f"[kvh] {text}", flush=True)


def _run(name: str, argv: Sequence[str], env: dict, timings: list[dict], ok: Sequence[int] = (0,)) -> int:
    _say(f"{name}: {subprocess.list2cmdline(list(argv))}")
    start = time.perf_counter()
    try:
        rc = subprocess.run(list(argv), env={**os.environ, **env}).returncode
    except OSError as exc:
        _say(f"{name}: could not start: {exc}")
        rc = 127
    seconds = time.perf_counter() - start
    timings.append({"step": name, "rc": rc, "ok": rc in ok, "seconds": round(seconds, 2),
                    "argv": list(argv)})
    _say(f"{name}: exit {rc} after {seconds:.1f} s")
    return rc


def render(run_dirs: Sequence[str], reports_dir: str, baseline: str | None, timings: list[dict],
           python: str = sys.executable, steps: str | None = None, family: str = commands.ALL_FAMILIES) -> int:
    """Render ``family``'s report; ``--summary-md`` appends, so the previous summary goes first."""
    Path(reports_dir).mkdir(parents=True, exist_ok=True)
    summary = Path(commands.report_paths(family, reports_dir)["summary"])
    if summary.exists():
        summary.unlink()
    if not run_dirs:
        _say("report: no run directory to render")
        timings.append({"step": "report", "rc": 1, "ok": False, "seconds": 0.0, "argv": []})
        return 1
    return _run("report", commands.report_command(python, run_dirs, reports_dir=reports_dir,
                                                  baseline=baseline, steps=steps, family=family), {}, timings)


def _say_timeline(name: str, results_dir: str) -> None:
    """Where the step's time went outside its tests (the run manifest's timeline)."""
    manifest = read_manifest(results_dir)
    line = timeline.describe(manifest.get("timeline") if isinstance(manifest, dict) else None)
    if line:
        _say(f"{name}: {line}")
    compiles = timeline.describe_compiles(manifest.get("triton_compiles") if isinstance(manifest, dict) else None)
    if compiles:
        _say(f"{name}: Triton kernels {compiles}")


def _print_table(timings: list[dict], wall: float) -> None:
    _say("steps:")
    for t in timings:
        verdict = "ok" if t["ok"] else "FAILED"
        print(f"      {t['step']:<11} {verdict:<7} exit {t['rc']:<4} {t['seconds']:8.1f} s", flush=True)
    print(f"      {'total':<11} {'':<7} {'':<9} {wall:8.1f} s", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.run.pipeline", description=__doc__.splitlines()[0],
                                     epilog="Other arguments go to pytest (e.g. -k pack -x); for `report`, "
                                            "they are the run directories to render (default: all).",
                                     allow_abbrev=False)
    parser.add_argument("kind", choices=(*commands.KINDS, "report"))
    parser.add_argument("--leg", default=None, type=_leg_argument,
                        help="version-leg name (default: from the installed torch/triton and the device)")
    parser.add_argument("--reports-dir", default=commands.REPORTS_DIR)
    parser.add_argument("--baseline", default=None, help="baseline JSON for the report's regression table")
    parser.add_argument("--workers-per-gpu", type=int, default=None,
                        help="pytest-xdist workers pinned to each GPU (default: the host's cores / 2 "
                             f"shared over the GPUs, at most {commands.MAX_WORKERS_PER_GPU})")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmarks on a GPU")
    parser.add_argument("--history", action="store_true",
                        help="add this run to the run history (python -m harness.history; its trend charts) on "
                             "any machine, CPU runs included; GPU runs of gpu_verify and bench are added without it")
    parser.add_argument("--timeout", type=int, default=commands.DEFAULT_TIMEOUT_S,
                        help="per-test timeout in seconds when pytest-timeout is installed (0: none)")
    return parser


def _leg_argument(text: str) -> str:
    try:
        return legs.leg_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, pytest_extra = parser.parse_known_args(argv)
    python = sys.executable
    start = time.perf_counter()
    timings: list[dict] = []

    if args.kind == "report":
        dirs = pytest_extra or all_run_dirs(args.reports_dir)
        rc = render(dirs, args.reports_dir, args.baseline, timings, python)
        return 0 if rc == 0 else 1

    interpreted = args.kind == "tests"
    info = probe(python, env={**os.environ, **commands.INTERPRETER_ENV} if interpreted else None)
    if not (info.get("torch") and info.get("triton")):
        _say(f"cannot import torch and triton with {python}: {info.get('error')}")
        return 2
    gpus = [] if interpreted else visible_devices(info["count"])
    if args.kind == "gpu_verify" and not gpus:
        print(f"gpu_verify needs a CUDA device, and torch {info['torch']} ({python}) sees none "
              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}). "
              "Nothing was run. Use `nox -s verify` or `nox -s tests` to run in the Triton "
              "interpreter on CPU.", file=sys.stderr, flush=True)
        return NO_CUDA_EXIT
    leg = args.leg or legs.stack_leg_name(info["torch"], info["triton"], gpu=bool(gpus))
    if gpus:
        names = ", ".join(f"{d}: {n}" for d, n in zip(gpus, info["names"], strict=False))
        _say(f"{args.kind}: {len(gpus)} CUDA device(s) [{names}]; torch {info['torch']} "
             f"(CUDA {info['cuda']}), triton {info['triton']}; leg {leg}")
    else:
        if args.kind != "tests":
            print(FALLBACK_NOTICE, flush=True)
        _say(f"{args.kind}: Triton interpreter on CPU; torch {info['torch']}, triton {info['triton']}; leg {leg}")

    has_timeout = importlib.util.find_spec("pytest_timeout") is not None
    workers_per_gpu = args.workers_per_gpu
    if workers_per_gpu is None:
        workers_per_gpu = commands.default_workers_per_gpu(len(gpus), commands.usable_cpus()) if gpus else 1
    if gpus and args.kind != "bench":
        _say(f"{args.kind}: {workers_per_gpu} pytest-xdist worker(s) pinned to each GPU")
    steps = commands.plan(args.kind, python=python, leg=leg, gpus=gpus, reports_dir=args.reports_dir,
                          workers_per_gpu=workers_per_gpu, bench=not args.no_bench,
                          timeout=(args.timeout or None) if has_timeout else None, extra=pytest_extra)
    failed = True  # until every step has run: an interrupted pipeline never reports success
    try:
        failed = False
        for folder in commands.leg_run_dirs(args.kind, leg, reports_dir=args.reports_dir):
            shutil.rmtree(folder, ignore_errors=True)  # a skipped step's old results are not this run's
            shutil.rmtree(folder + CONFIRM_SUFFIX, ignore_errors=True)
        for step in steps:
            rc = _run(step.name, step.argv, step.env, timings, step.ok)
            if step.results_dir:
                _say_timeline(step.name, step.results_dir)
            if rc == 5 and step.name == "suites":
                _say("suites: no test was collected, so nothing was checked")
            failed |= rc not in step.ok
        confirm_suspects(steps, gpus, pick_baseline(args.baseline, leg, gpu=bool(gpus)), timings, python)
    except BaseException:
        failed = True
        raise
    finally:
        steps_file = Path(args.reports_dir) / f"{args.kind}-steps.json"

        def write_steps() -> float:
            wall = time.perf_counter() - start
            record = {"kind": args.kind, "leg": leg, "gpus": gpus, "gpu_names": info["names"],
                      "torch": info["torch"], "triton": info["triton"], "wall_s": round(wall, 2),
                      "steps": timings, "failed": failed}
            steps_file.parent.mkdir(parents=True, exist_ok=True)
            steps_file.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            return wall

        write_steps()  # the steps so far go into the report; the report step itself is added after
        baseline = pick_baseline(args.baseline, leg, gpu=bool(gpus))
        if baseline is None:
            _say(f"report: no baseline for leg {leg} in {commands.REPORTS_DIR}/baselines/ "
                 "(--baseline or $KVH_BASELINE names one); no regression is checked")
        failed |= render(family_run_dirs(args.kind, args.reports_dir), args.reports_dir, baseline,
                         timings, python, steps=str(steps_file), family=args.kind) != 0
        if kept_in_history(args.kind, bool(gpus), args.history):
            record_history(family_run_dirs(args.kind, args.reports_dir))
        wall = write_steps()
        _print_table(timings, wall)
    _say(f"{args.kind}: {'FAILED' if failed else 'passed'} in {wall:.1f} s; "
         f"report {commands.report_paths(args.kind, args.reports_dir)['html']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
