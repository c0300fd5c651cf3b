"""The GPU visit scripts: each parses (bash -n, Python compile), the Python ones answer --help
without a GPU, the INT8 table is built from records, the mutant parts cover the catalogue, and
docs/sessions.md names every script."""

from __future__ import annotations

import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL = sorted((ROOT / "scripts").glob("*.sh"))
PYTHON = sorted((ROOT / "scripts").glob("*.py"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", SHELL, ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", PYTHON, ids=lambda p: p.name)
def test_python_scripts_compile(script, tmp_path):
    py_compile.compile(str(script), cfile=str(tmp_path / "out.pyc"), doraise=True)


@pytest.mark.parametrize("name", ["gpu_packing_sweep.py", "gpu_affine_sweep.py", "gpu_decode.py",
                                  "gpu_affine_profile.py", "int8_table.py"])
def test_python_scripts_answer_help_without_a_gpu(name):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / name), "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def test_every_script_is_documented():
    docs = (ROOT / "docs" / "sessions.md").read_text(encoding="utf-8")
    missing = [p.name for p in SHELL + PYTHON if f"scripts/{p.name}" not in docs and p.name != "int8_table.py"]
    assert not missing, f"scripts not described in docs/sessions.md: {missing}"


def test_int8_table_from_records(tmp_path):
    """The speedup table from benchmark records (its shapes named as in GPU-Accelerated KV Cache
    Quantization), and the target line at 131072 x 4096."""
    def record(shape, variant, ms, **extra):
        metrics = {"shape": shape, "ms": ms, "quant_ms": ms * 0.6, "dequant_ms": ms * 0.4, **extra}
        return {"schema": 1, "suite": "bench_int8", "group": "suites", "case": f"test_bench_int8[{shape}-{variant}]",
                "nodeid": f"suites/test_bench_int8.py::test_bench_int8[{shape}-{variant}]", "outcome": "passed",
                "duration_s": 1.0, "backend": "triton" if variant == "triton" else "cuda", "variant": variant,
                "device": "cuda", "leg": "L", "run_id": "L@r", "time": "2026-11-30T00:00:00Z",
                "message": None, "worker": None, "metrics": metrics}
    rows = [
        record("131072x4096", "triton", 1.94, pct_of_copy=91.3, copy_gbps=4238.0, gbps=3869.0,
               speedup={"cpu_baseline": 4224.0, "torch_eager": 4.87, "torch_compile": 0.91}, bit_errors=0),
        record("131072x4096", "torch_compile", 1.77, pct_of_copy=100.0, copy_gbps=4238.0, gbps=4250.0, bit_errors=665),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "int8_table.py"), str(path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Realistic Large LLM" in result.stdout and "131072x4096" in result.stdout
    assert "NOT MET" in result.stdout and "0.91x torch.compile" in result.stdout


@pytest.mark.parametrize("content", [None, "", '{"suite": "other"}\n'], ids=["missing", "empty", "no-bench"])
def test_int8_table_without_benchmark_records_fails(tmp_path, content):
    path = tmp_path / "records.jsonl"
    if content is not None:
        path.write_text(content)
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "int8_table.py"), str(path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "|" not in result.stdout, result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_mutant_parts_pick_every_mutant_once():
    """gpu_mutants.sh's parts (`all` runs each): every mutant of the catalogue in exactly one part."""
    from harness.checks.mutants import CATALOGUE, select_mutants

    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_mutants.sh"), "parts"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    picked: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        part, *texts = line.split()
        for mutant in select_mutants(None, ci=False, match=texts):
            picked.setdefault(mutant.name, []).append(part)
    assert not [m.name for m in CATALOGUE if m.name not in picked], "mutants in no part"
    assert not {name: parts for name, parts in picked.items() if len(parts) > 1}, "mutants in several parts"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_faults_skip_the_mutants_when_no_time_is_left(tmp_path):
    """With nothing left of the limit, gpu_faults.sh says so and runs no mutant (`timeout 0` would
    run them without any limit). python and python3 are stand-ins that log their arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    for tool in ("python", "python3"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n')
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_faults.sh"), "0"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mutants + sanitizer: SKIPPED" in result.stdout
    assert "harness.checks.mutants" not in calls.read_text() and "harness.checks.sanitize" not in calls.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(("runs", "message"), [
    ("suites-warm-all suites-cold-all", "warm run 'suites-warm-all' before any cold run"),
    ("suites-cold-all bogus", "unknown run 'bogus'"),
    ("suites-cold-gpu0 suites-cold-gpu0", "each run once"),
    ("suites-warm-gpu0-w1 suites-cold-all", "warm run 'suites-warm-gpu0-w1' before any cold run"),
    ("suites-cold-all suites-warm-gpu0-w0", "unknown run 'suites-warm-gpu0-w0'"),
    ("suites-cold-all suites-warm-gpu0-wx", "unknown run 'suites-warm-gpu0-wx'"),
])
def test_wall_runs_are_checked_before_any_gpu_time(runs, message, tmp_path):
    """A wrong KVH_WALL_RUNS stops gpu_verify_walls.sh at once (exit 2), before nvidia-smi or nox."""
    env = {"PATH": "/usr/bin:/bin", "KVH_WALL_RUNS": runs, "OUT": str(tmp_path)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_verify_walls.sh")], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_wall_runs_pass_their_workers_per_gpu_to_nox(tmp_path):
    """A run named ...-wN asks nox for N workers per GPU; a plain name leaves the default. The GPU
    tools are stand-ins on PATH: nvidia-smi lists two GPUs, `python3 -m nox` logs its arguments,
    one [bracket] each."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "nox-calls.txt"
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    (bin_dir / "python3").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "nox" ]; then shift 2; '
        f'{{ printf "%s " "$CUDA_VISIBLE_DEVICES"; printf "[%s]" "$@"; echo; }} >> "{calls}"; exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    for tool in ("nvidia-smi", "python3"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "TMPDIR": str(tmp_path),
           "KVH_WALL_RUNS": "suites-cold-all suites-warm-gpu0-w1 suites-warm-all-w3 suites-warm-all"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_verify_walls.sh")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = calls.read_text().splitlines()
    assert len(lines) == 4
    cold, warm_gpu0_w1, warm_all_w3, warm_all = lines
    assert cold.startswith("0,1 [") and cold.endswith("[--no-bench]")  # no empty argument either
    assert warm_gpu0_w1.startswith("0 [") and warm_gpu0_w1.endswith("[--no-bench][--workers-per-gpu][1]")
    assert warm_all_w3.startswith("0,1 [") and warm_all_w3.endswith("[--no-bench][--workers-per-gpu][3]")
    assert warm_all.endswith("[--no-bench]")
    assert "suites-warm-gpu0-w1" in (tmp_path / "out" / "walls.md").read_text()
