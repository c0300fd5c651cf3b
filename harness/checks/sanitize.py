"""compute-sanitizer over every GPU kernel at small shapes.

``python -m harness.checks.sanitize [--tools memcheck racecheck initcheck] [--kernels NAME...]
[--results-dir DIR] [--sanitizer PATH] [--timeout S] [--jobs N] [--list]``

For each kernel of :data:`KERNELS` this module has a driver (``python -m harness.checks.sanitize
--run-kernel NAME``) that builds small inputs on the GPU, calls the kernel once per
configuration, synchronizes and checks the result against the torch reference. Each
driver first runs plainly (which also compiles the Triton kernels and builds the CUDA
extensions into their caches), then once under each sanitizer tool. The tool's summary
(``ERROR SUMMARY: N errors``, racecheck's ``RACECHECK SUMMARY: N hazards displayed (E
errors, W warnings)``) is parsed into one record per (tool, kernel): suite ``sanitize``,
case ``tool:kernel``, outcome ``passed`` (no error), ``failed`` (errors found),
``error`` (no summary: the driver or the tool failed) or ``timeout``; metrics ``errors``,
``warnings`` and the first finding. The caching allocator is off under the sanitizer
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) so that every tensor is its own allocation and an
access past its end is caught.

Without a CUDA device, or without compute-sanitizer (``$COMPUTE_SANITIZER``, ``PATH``,
``/usr/local/cuda*/bin``), it says so and exits with status 3: nothing is checked.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..records import Record, utc_now
from ..run.streamed_run import StreamedRun, positive_float, positive_int
from ..run.subproc import ChildGroups, env_with_repo, run_killable

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("memcheck", "racecheck", "initcheck")
NOT_RUNNABLE_EXIT = 3
DEFAULT_TIMEOUT_S = 900
SANITIZER_ENV = {"TRITON_INTERPRET": "0", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "PYTHONUNBUFFERED": "1"}
TOOL_OPTIONS = {
    "memcheck": ["--leak-check", "no"],
    "racecheck": ["--racecheck-report", "hazard"],
    "initcheck": [],
}

_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?", re.I)
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)", re.I)
_PREFIX = re.compile(r"^=+\s?")
_NOT_A_FINDING = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "Target application returned",
                  "This tool", "LEAK SUMMARY", "at ", "Saved host backtrace", "Host Frame", "Device Frame",
                  "Address ", "Access ", "by thread", "is out of bounds", "and is ")


# ------------------------------------------------------------------------------ drivers
def _gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(1234)


def _same(name: str, got, want) -> None:
    import torch

    if not torch.equal(got, want):
        bad = int((got != want).sum())
        raise AssertionError(f"{name}: {bad} of {want.numel()} elements differ from the torch reference")


def _drive_packing(backend: str) -> None:
    """Every width and layout the backend serves, with a tail of whole groups past a multiple
    of 4 and (for CUDA) a buffer not aligned for the wide path."""
    import torch

    from kvbits.packing import CUDA_BITS, pack_bits, unpack_bits, values_per_group

    g = _gen()
    widths = CUDA_BITS if backend == "cuda" else (1, 2, 3, 4, 5, 6, 7, 8)
    for bits in widths:
        for layout in ("byte", "word"):
            n = values_per_group(bits, layout) * 7
            base = torch.randint(0, 1 << bits, (3 * n + 1,), device="cuda", dtype=torch.uint8, generator=g)
            for values in (base[: 3 * n].view(3, n), base[1:].view(3, n)):  # aligned, then 1 byte off
                packed = pack_bits(values, bits, layout=layout, backend=backend)
                _same(f"pack {bits}-bit {layout}", packed, pack_bits(values, bits, layout=layout, backend="torch"))
                back = unpack_bits(packed, bits, layout=layout, backend=backend)
                _same(f"unpack {bits}-bit {layout}", back, values)


def _drive_int8(variant: str) -> None:
    import torch

    from kvbits import int8

    g = _gen()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in ((67, 36), (5, 4), (130, 260)):
            x = (torch.randn(shape, device="cuda", generator=g) * 3).to(dtype)
            q, scales = int8.quantize_per_channel(x, variant=variant)
            q_ref, s_ref = int8.quantize_per_channel(x, variant="torch")
            _same(f"int8 {variant} codes {dtype} {shape}", q, q_ref)
            _same(f"int8 {variant} scales {dtype} {shape}", scales, s_ref)
            x_hat = int8.dequantize_per_channel(q, scales, variant=variant)
            _same(f"int8 {variant} dequantize {shape}", x_hat, int8.dequantize_per_channel(q, scales, variant="torch"))


def _drive_affine() -> None:
    import torch

    import kvbits
    from kvbits.affine import QuantizeTile, _launch_quantize
    from kvbits.kv_cache import QuantizedKV

    g = _gen()
    for bits, group_size, d in ((3, 64, 128), (4, 32, 64), (2, 128, 128), (8, 64, 64)):
        k = torch.randn(2, 2, 2 * group_size + 5, d, device="cuda", generator=g).half()
        v = torch.randn(2, 2, 2 * group_size + 5, d, device="cuda", generator=g).half()
        got = kvbits.quantize_kv(k, v, bits, group_size=group_size, backend="triton")
        want = kvbits.quantize_kv(k, v, bits, group_size=group_size, backend="torch")
        for name in ("k_codes", "v_codes", "k_scale", "v_scale", "k_zero", "v_zero"):
            _same(f"affine {bits}-bit G{group_size} {name}", getattr(got, name), getattr(want, name))
    # a V tile of 64 tokens over 96: the last program's masked loads and stores
    v = torch.randn(2, 2, 96, 64, device="cuda", generator=g).half()
    want = kvbits.quantize_kv(v, v, 3, group_size=32, backend="torch")
    qkv = QuantizedKV.empty(2, 2, 64, bits=3, group_size=32, capacity=96, device="cuda")
    _launch_quantize(v, qkv.v_codes, qkv.v_scale, qkv.v_zero, 0, 32, 3, False, QuantizeTile(64, 64, 2))
    for name in ("v_codes", "v_scale", "v_zero"):
        _same(f"affine masked V tile {name}", getattr(qkv, name)[:, :, :96], getattr(want, name)[:, :, :96])


def _drive_decode() -> None:
    import torch

    import kvbits
    from kvbits.decode import decode_attention, reference_decode

    g = _gen()
    for bits, d, group_size, hq, hkv, lens in ((3, 64, 64, 4, 2, (200, 70)), (2, 128, 64, 8, 8, (129, 64)),
                                              (4, 256, 128, 4, 1, (300, 1))):
        s = max(lens)
        k = torch.randn(len(lens), hkv, s, d, device="cuda", generator=g).half()
        v = torch.randn(len(lens), hkv, s, d, device="cuda", generator=g).half()
        cache = kvbits.quantize_kv(k, v, bits, group_size=group_size, backend="torch", seq_lens=list(lens))
        q = torch.randn(len(lens), hq, d, device="cuda", generator=g).half()
        out = decode_attention(q, cache, backend="triton")
        err = float((out.double() - reference_decode(q, cache)).abs().max())
        if not err <= 2e-3:
            raise AssertionError(f"decode {bits}-bit D={d}: max abs error {err:.3g} against the reference")


KERNELS: dict[str, Callable[[], None]] = {
    "packing-triton": lambda: _drive_packing("triton"),
    "packing-cuda": lambda: _drive_packing("cuda"),
    "int8-naive": lambda: _drive_int8("naive"),
    "int8-tiled": lambda: _drive_int8("tiled"),
    "int8-coarsened": lambda: _drive_int8("coarsened"),
    "int8-vectorized": lambda: _drive_int8("vectorized"),
    "int8-triton": lambda: _drive_int8("triton"),
    "affine-triton": _drive_affine,
    "decode-triton": _drive_decode,
}


def run_kernel(name: str) -> int:
    """The driver: call one kernel on the GPU (what runs under the sanitizer)."""
    import torch

    if not torch.cuda.is_available():
        print(f"--run-kernel {name}: no CUDA device", file=sys.stderr)
        return NOT_RUNNABLE_EXIT
    KERNELS[name]()
    torch.cuda.synchronize()
    print(f"driver {name}: ok", flush=True)
    return 0


# ------------------------------------------------------------------------------ the tool
def find_sanitizer(environ=os.environ) -> str | None:
    """compute-sanitizer from ``$COMPUTE_SANITIZER``, ``PATH``, or the newest ``/usr/local/cuda*``."""
    explicit = environ.get("COMPUTE_SANITIZER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("compute-sanitizer", path=environ.get("PATH"))
    if found:
        return found
    candidates = sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")
                        + glob.glob("/usr/local/cuda*/compute-sanitizer/compute-sanitizer"))
    usable = [c for c in candidates if os.access(c, os.X_OK)]
    return usable[-1] if usable else None


def sanitizer_command(sanitizer: str, tool: str, kernel: str, python: str = sys.executable) -> list[str]:
    if tool not in TOOLS:
        raise ValueError(f"tool must be one of {TOOLS}; got {tool!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {tuple(KERNELS)}; got {kernel!r}")
    return [sanitizer, "--tool", tool, "--print-limit", "20", *TOOL_OPTIONS[tool],
            *driver_command(kernel, python)]


def driver_command(kernel: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "harness.checks.sanitize", "--run-kernel", kernel]


def sanitizer_env(environ=os.environ) -> dict:
    return {**env_with_repo(environ), **SANITIZER_ENV}


@dataclass
class Summary:
    """What a sanitizer's output says: errors (None when it printed no summary), warnings,
    and the first finding line."""

    errors: int | None
    warnings: int = 0
    first: str | None = None


def parse_output(text: str) -> Summary:
    errors: int | None = None
    warnings = 0
    for match in _RACE_SUMMARY.finditer(text):
        errors = (errors or 0) + int(match.group(2))
        warnings += int(match.group(3))
    if errors is None:
        for match in _ERROR_SUMMARY.finditer(text):
            errors = (errors or 0) + int(match.group(1))
    first = None
    for line in text.splitlines():
        if not _PREFIX.match(line):
            continue
        body = _PREFIX.sub("", line).strip()
        if body and body[0].isalpha() and not body.startswith(_NOT_A_FINDING):
            first = body[:300]
            break
    return Summary(errors, warnings, first)


@dataclass
class Check:
    tool: str
    kernel: str
    outcome: str  # passed | failed | error | timeout
    errors: int | None
    warnings: int
    seconds: float
    detail: str

    def record(self) -> Record:
        metrics = {"errors": -1 if self.errors is None else self.errors, "warnings": self.warnings,
                   "tool": self.tool, "kernel": self.kernel, "seconds": round(self.seconds, 2)}
        if self.detail:
            metrics["finding"] = self.detail[:300]
        backend = "cuda" if self.kernel.endswith("-cuda") or self.kernel.split("-")[-1] in (
            "naive", "tiled", "coarsened", "vectorized") else "triton"
        return Record(suite="sanitize", group="harness", case=f"{self.tool}:{self.kernel}",
                      nodeid=f"harness/sanitize::{self.tool}:{self.kernel}", outcome=self.outcome,
                      duration_s=round(self.seconds, 3), backend=backend, variant=self.kernel, device="cuda",
                      metrics=metrics, message=self.detail or None)


def judge(tool: str, kernel: str, rc: int | None, output: str, seconds: float) -> Check:
    if rc is None:
        return Check(tool, kernel, "timeout", None, 0, seconds, f"no result within {seconds:.0f} s")
    summary = parse_output(output)
    tail = [line for line in output.strip().splitlines() if line.strip()][-3:]
    if summary.errors is None:
        return Check(tool, kernel, "error", None, 0, seconds,
                     f"no sanitizer summary (exit {rc}): {' | '.join(tail)}"[:500])
    if summary.errors:
        return Check(tool, kernel, "failed", summary.errors, summary.warnings, seconds,
                     summary.first or f"{summary.errors} errors")
    if rc != 0:
        return Check(tool, kernel, "error", 0, summary.warnings, seconds,
                     f"the driver failed under {tool} (exit {rc}): {' | '.join(tail)}"[:500])
    return Check(tool, kernel, "passed", 0, summary.warnings, seconds, summary.first if summary.warnings else "")


Runner = Callable[[list[str], dict, float], tuple[int | None, str, float]]


def run_command(cmd: list[str], env: dict, timeout_s: float,
                groups: ChildGroups | None = None) -> tuple[int | None, str, float]:
    """(exit code or None at the timeout, stdout+stderr, seconds); the process group is killed at
    the timeout. A command that cannot start gives exit 127 and the reason as its output."""
    try:
        return run_killable(cmd, env=env, cwd=ROOT, timeout_s=timeout_s, groups=groups)
    except OSError as exc:
        return 127, f"cannot run {cmd[0]}: {exc}", 0.0


def run_checks(tools: Sequence[str], kernels: Sequence[str], *, sanitizer: str, timeout_s: float = DEFAULT_TIMEOUT_S,
               python: str = sys.executable, runner: Runner | None = None, progress=print,
               on_check=None, jobs: int = 1) -> list[Check]:
    """Each kernel's driver once plainly, then under each tool; one Check per (tool, kernel),
    in the order of ``kernels`` then ``tools``. ``on_check(check)`` is called as each check is
    known, so that a run cut short keeps them. ``jobs`` kernels are checked at once (each in
    its own processes, its tools one after another). ``runner`` runs one command (default
    :func:`run_command`). An interrupt (or any exception) in the calling thread kills every
    running child and starts no further one."""
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int; got {jobs!r}")
    env = sanitizer_env()
    lock = threading.Lock()
    stop = threading.Event()  # set on an interrupt: kernels still running start no further tool
    children = ChildGroups()
    run = runner or partial(run_command, groups=children)

    def known(check: Check) -> Check:
        with lock:
            if on_check is not None:
                on_check(check)
        return check

    def say(line: str) -> None:
        with lock:
            progress(line)

    def check_kernel(kernel: str) -> list[Check]:
        rc, out, seconds = run(driver_command(kernel, python), env, timeout_s)
        if rc != 0:
            tail = " | ".join([line for line in out.strip().splitlines() if line.strip()][-3:])
            why = "timed out" if rc is None else f"exit {rc}"
            outcome = "timeout" if rc is None else "error"
            say(f"  {kernel}: driver FAILED without the sanitizer ({why}) {tail}")
            return [known(Check(tool, kernel, outcome, None, 0, seconds if rc is None else 0.0,
                                f"the driver fails without the sanitizer ({why}): {tail}"[:500])) for tool in tools]
        found = []
        for tool in tools:
            if stop.is_set():
                break
            check = judge(tool, kernel, *run(sanitizer_command(sanitizer, tool, kernel, python), env, timeout_s))
            errors = "?" if check.errors is None else check.errors
            say(f"  {tool:<9} {kernel:<16} {check.outcome:<7} errors {errors} ({check.seconds:.0f} s)"
                + (f": {check.detail}" if check.outcome != "passed" and check.detail else ""))
            found.append(known(check))
        return found

    try:
        per_kernel = _map_in_threads(check_kernel, kernels, jobs)
    except BaseException:
        # an interrupt (Ctrl-C, a command limit's SIGINT) reaches this thread only: kernels not
        # started are dropped, running ones lose their child and start no further tool
        stop.set()
        children.kill_all()
        raise
    return [check for checks in per_kernel for check in checks]


def _map_in_threads(function: Callable, items: Sequence, jobs: int) -> list:
    """``[function(item) for item in items]``, ``jobs`` items at once (in this thread for 1)."""
    if jobs == 1:
        return [function(item) for item in items]
    pool = ThreadPoolExecutor(max_workers=min(jobs, max(1, len(items))))
    try:
        return list(pool.map(function, items))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def table(checks: Sequence[Check], tools: Sequence[str]) -> str:
    cell = {(c.kernel, c.tool): c for c in checks}
    kernels = list(dict.fromkeys(c.kernel for c in checks))
    rows = [("kernel", *tools)]
    for kernel in kernels:
        row = [kernel]
        for tool in tools:
            c = cell.get((kernel, tool))
            row.append("-" if c is None else {"passed": "clean", "failed": f"{c.errors} errors"}.get(
                c.outcome, c.outcome.upper()))
        rows.append(tuple(row))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    clean = sum(c.outcome == "passed" for c in checks)
    lines.append(f"{clean}/{len(checks)} checks clean; "
                 f"{sum(c.errors or 0 for c in checks)} sanitizer errors in all")
    return "\n".join(lines)


def unavailable_reason(sanitizer: str | None) -> str | None:
    """Why nothing can be checked on this machine (None when it can)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return "torch is not installed"
    if not torch.cuda.is_available():
        return ("no CUDA device: compute-sanitizer checks GPU kernels, so nothing was checked on this machine "
                "(run `nox -s sanitize` or `python -m harness.checks.sanitize` on a GPU box)")
    if sanitizer is None:
        return ("compute-sanitizer not found (looked at $COMPUTE_SANITIZER, PATH and /usr/local/cuda*/bin): "
                "install the CUDA toolkit's sanitizer or set COMPUTE_SANITIZER=/path/to/compute-sanitizer")
    return None


def _executable(path: str) -> str:
    """An argparse type for ``--sanitizer``: a file this user may execute, as a path or a name
    found on PATH."""
    found = shutil.which(path)
    if found is None:
        raise argparse.ArgumentTypeError(f"not an executable file, nor one on PATH: {path}")
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.checks.sanitize", description=__doc__.splitlines()[0])
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--kernels", nargs="+", choices=tuple(KERNELS), default=list(KERNELS), metavar="NAME",
                        help=f"kernels to check (default all: {', '.join(KERNELS)})")
    parser.add_argument("--results-dir", metavar="DIR",
                        help="run directory for the records (default reports/runs/sanitize-<UTC time>)")
    parser.add_argument("--sanitizer", type=_executable, metavar="PATH", help="the compute-sanitizer executable")
    parser.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds one run may take (default %(default)s)")
    parser.add_argument("--leg", default=None, help="version-leg name stored in the records")
    parser.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                        help="kernels checked at once, each its tools in turn (default %(default)s)")
    parser.add_argument("--list", action="store_true", help="print the kernels and tools and exit")
    parser.add_argument("--run-kernel", choices=tuple(KERNELS), help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run_kernel:
        return run_kernel(args.run_kernel)
    if args.list:
        print("tools:   " + " ".join(TOOLS))
        print("kernels: " + " ".join(KERNELS))
        return 0
    sanitizer = args.sanitizer or find_sanitizer()
    reason = unavailable_reason(sanitizer)
    if reason:
        print(f"[sanitize] NOT RUN: {reason}", file=sys.stderr, flush=True)
        return NOT_RUNNABLE_EXIT
    started = utc_now()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = Path(args.results_dir or ROOT / "reports" / "runs" / f"sanitize-{stamp}")
    print(f"[sanitize] {sanitizer}: {' '.join(args.tools)} over {len(args.kernels)} kernels", flush=True)
    try:
        run = StreamedRun(run_dir, kind="sanitize", leg=args.leg,
                          args=sys.argv[1:] if argv is None else list(argv), started=started, sanitizer=sanitizer)
    except OSError as exc:
        print(f"[sanitize] cannot write the run directory {run_dir}: {exc}", file=sys.stderr, flush=True)
        return 2
    checks = run_checks(args.tools, args.kernels, sanitizer=sanitizer, timeout_s=args.timeout,
                        progress=lambda s: print(s, flush=True), on_check=lambda c: run.add(c.record()),
                        jobs=args.jobs)
    run.finish()
    print(table(checks, args.tools), flush=True)
    print(f"records: {run_dir / 'records.jsonl'}", flush=True)
    return 0 if all(c.outcome == "passed" for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
