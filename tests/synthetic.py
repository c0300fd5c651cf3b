"""Synthetic result sets written with the real RecordWriter: several legs, every outcome,
benchmarks with speedups and bandwidth, errors, bad-input records and hostile strings."""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness.records import MANIFEST_FILE, RECORDS_FILE, Record, RecordWriter, write_json_atomic

HOSTILE = '<script>alert("x")</script>'
RECORD_TIME = "2025-11-29T10:05:00.000+00:00"  # within the manifests' start and end
H200 = {"index": 0, "name": "NVIDIA H200", "sm_count": 132, "capability": "9.0", "memory_gib": 139.8,
        "l2_mib": 60.0, "driver": "580.95.05"}


def env_for(leg: str, mode: str, *, host: str = "gpu-runner-1", torch: str = "2.11.0+cu130",
            triton: str = "3.6.0") -> dict:
    gpu = mode == "gpu"
    return {
        "leg": leg, "mode": mode, "host": host, "platform": "Linux-6.8-x86_64", "cpu": "x86_64",
        "cpu_count": 16 if gpu else 2, "python": "3.11.2", "torch": torch,
        "torch_cuda": "13.0" if gpu else None, "triton": triton, "numpy": "2.3.1",
        "nvcc": "13.0", "optional": {"transformers": "5.17.0", "flashinfer-python": "0.6.18" if gpu else None,
                                     "flash-attn": None},
        "gpus": [H200] if gpu else [], "gpu": H200["name"] if gpu else None,
        "cuda_visible_devices": "0" if gpu else None, "triton_interpret": None if gpu else "1",
        "commit": "0123456789abcdef0123456789abcdef01234567", "ci": True,
    }


def write_run(run_dir: Path, records: list[Record], *, leg: str, env: dict | None = None,
              complete: bool | None = True, manifest: bool = True) -> Path:
    """A run directory as the plugin writes it; ``complete=None`` leaves the end-of-run entry out."""
    run_dir = Path(run_dir)
    with RecordWriter(run_dir / RECORDS_FILE) as writer:
        for record in records:
            record.leg = record.leg or leg
            record.run_id = record.run_id or f"{leg}@{run_dir.name}"
            record.time = RECORD_TIME
            writer.write(record)
    if manifest:
        env = env or env_for(leg, "interpreter")
        data = {"run_id": f"{leg}@{run_dir.name}", "leg": leg, "mode": env["mode"], "env": env,
                "started": "2025-11-29T10:00:00.000+00:00", "args": ["suites", "-n", "2"],
                "counts": {}, "complete": False, "finished": None}
        if complete is not None:
            data.update(complete=complete, finished="2025-11-29T10:07:12.000+00:00",
                        exitstatus=1 if complete else 2)
        write_json_atomic(run_dir / MANIFEST_FILE, data)
    return run_dir


def rec(suite: str, case: str, outcome: str = "passed", *, group: str = "suites", **kw) -> Record:
    return Record(suite=suite, case=case, nodeid=f"{group}/test_{suite}.py::{case}", outcome=outcome,
                  group=group, **kw)


def correctness_records(rng: random.Random, device: str, *, fail: bool = False) -> list[Record]:
    out = []
    for backend in ("torch", "triton"):
        out.append(rec("bijection", f"test_exhaustive_24bit[{device}-{backend}]", backend=backend, device=device,
                       duration_s=rng.uniform(0.5, 3), metrics={"states_checked": 2**24, "bit_errors": 0}))
        for n in (8, 96, 4104):
            out.append(rec("walking", f"test_walking_ones[{device}-{backend}-N{n}]", backend=backend, device=device,
                           duration_s=rng.uniform(0.01, 0.2), metrics={"states_checked": n * 3, "bit_errors": 0}))
    for group_size in (32, 64, 128):
        for shape in ("1x8x128", "3x5x67"):
            err = rng.uniform(1e-3, 4e-3)
            out.append(rec("affine", f"test_round_trip[{device}-G{group_size}-{shape}]", backend="triton",
                           variant=f"G{group_size}", device=device, duration_s=rng.uniform(0.05, 0.4),
                           metrics={"states_checked": 4096 * group_size, "max_abs_err": err,
                                    "max_rel_err": err / 3, "bit_errors": 0, "err_to_tol": err / 4e-3}))
    for s in (1, 257, 4096):
        outcome = "failed" if fail and s == 257 else "passed"
        msg = ("E   AssertionError: max_abs_err 3.1e-02 > tol 2e-03 at B=2 H=8 S=257\n"
               "E   assert 0.031 <= 0.002") if outcome == "failed" else None
        out.append(rec("decode", f"test_decode_matches_fp64[{device}-S{s}]", outcome, backend="triton",
                       variant="splitk", device=device, message=msg, duration_s=rng.uniform(0.1, 1.5),
                       metrics={"elements_checked": 8 * 128 * s, "max_abs_err": 3.1e-2 if outcome == "failed"
                                else rng.uniform(1e-5, 9e-5), "max_rel_err": rng.uniform(1e-4, 8e-4),
                                "quant_err_vs_fp16": rng.uniform(0.01, 0.05), "tolerance": 2e-3}))
    out.append(rec("decode", f"test_decode_cuda_only[{device}]", "skipped" if device == "cpu" else "passed",
                   backend="cuda", message="Skipped: the cuda backend needs a CUDA device" if device == "cpu"
                   else None, device=device))
    for variant in ("naive", "vectorized", "warp", "fused"):
        out.append(rec("int8", f"test_quantize_per_channel[{device}-{variant}-131x4096]", backend="cuda"
                       if device != "cpu" else "torch", variant=variant, device=device,
                       duration_s=rng.uniform(0.02, 0.3),
                       metrics={"elements_checked": 131 * 4096, "max_abs_err": rng.uniform(1e-3, 5e-3),
                                "max_rel_err": rng.uniform(2e-3, 8e-3)}))
    for name, etype, message in (
        ("test_pack_rejects_float[values]", "TypeError", "values: expected dtype torch.uint8, got torch.float32"),
        ("test_pack_rejects_length[N=7]", "ValueError", "values: last dimension 7 is not a multiple of 8"),
        ("test_unpack_rejects_rank", "ValueError", "packed: expected rank >= 1, got a 0-d tensor"),
    ):
        out.append(rec("bad_input", name, backend="torch", device=device,
                       metrics={"error_type": etype, "error_message": message}))
    return out


def bench_records(rng: random.Random, device: str, *, slow: float = 1.0, with_peak: bool = True) -> list[Record]:
    out = []
    peak = 4250.0
    for s in (4096, 32768, 131072):
        sdpa = 0.49 * s / 131072 + 0.01
        for variant, factor in (("splitk", 0.8), ("dot", 1.2), ("unpacked", 0.95)):
            ms = sdpa * factor * slow * rng.uniform(0.97, 1.03)
            nbytes = 32 * 128 * s * 2 * 3 // 8
            gbps = nbytes / (ms * 1e-3) / 1e9
            metrics = {"ms": ms, "gbps": gbps, "bytes": nbytes, "shape": f"B=1 H=32 D=128 S={s}",
                       "speedup": {"sdpa_fp16": sdpa / ms, "torch_eager": 9.0 * sdpa / ms}}
            if with_peak:
                floor_ms = nbytes / (peak * 1e6) + 0.004
                metrics.update(copy_gbps=peak, pct_of_peak=100 * gbps / peak, read_floor_ms=floor_ms,
                               pct_of_read_floor=100 * floor_ms / ms)
            out.append(rec("bench_decode", f"test_bench_decode[{variant}-S{s}]", backend="triton",
                           variant=variant, device=device, duration_s=rng.uniform(1, 4), metrics=metrics))
    for variant, factor in (("naive", 3.0), ("vectorized", 1.1), ("warp", 0.9), ("fused", 0.7)):
        ms = 2.47 * factor * slow * rng.uniform(0.97, 1.03) / 1.4
        nbytes = 131072 * 4096 * (4 + 1 + 4)
        gbps = nbytes / (ms * 1e-3) / 1e9
        metrics = {"ms": ms, "gbps": gbps, "shape": "131072x4096 fp32",
                   "speedup": {"torch_compile": 2.47 / ms, "torch_eager": 6.1 / ms}}
        if with_peak:
            metrics.update(copy_gbps=peak, pct_of_peak=100 * gbps / peak)
        out.append(rec("bench_int8", f"test_bench_int8[{variant}]", backend="cuda", variant=variant,
                       device=device, duration_s=rng.uniform(1, 3), metrics=metrics))
    return out


def peer_records(rng: random.Random, device: str) -> list[Record]:
    """The peers benchmark's points at one shape: decode step, attention error, bytes per token."""
    layer_fp16 = 2 * 32 * 128 * 2
    out = []
    for method, ms, err, bits, per_element in (
            ("sdpa-flash", 0.147, 1.2e-4, 16, 16), ("sdpa-cudnn", 0.160, 1.3e-4, 16, 16),
            ("flex", 1.07, 1.2e-4, 16, 16), ("flashinfer-fp16", 0.139, 1.1e-4, 16, 16),
            ("flashinfer-fp8", 0.081, 2.4e-2, 8, 8), ("hf-hqq-4", 2.9, 3.9e-2, 4, 4.5),
            ("hf-quanto-int2", 3.4, 0.31, 2, 2.5), ("kvbits-2bit", 0.041, 0.16, 2, 2.5),
            ("kvbits-3bit", 0.047, 6.1e-2, 3, 3.5), ("kvbits-4bit", 0.052, 2.9e-2, 4, 4.5)):
        metrics = {"method": method, "ms": ms * rng.uniform(0.97, 1.03), "attn_rel_err": err, "bits": bits,
                   "bytes_per_token": layer_fp16 * per_element / 16, "pareto_group": "B1-Hq32-Hkv32-S32768-D128",
                   "shape": "B=1 Hq=32 Hkv=32 S=32768 D=128"}
        out.append(rec("bench_peers", f"test_bench_peer[{method}-B1-S32768]", backend="peer", variant=method,
                       device=device, duration_s=rng.uniform(1, 3), metrics=metrics))
    return out


def write_legs(root: Path, *, seed: int = 6) -> list[Path]:
    """Three legs: two GPU legs (one with a failure, a crash, a timeout and a slowdown)
    and an interpreter leg whose run was killed (no end-of-run entry, truncated last line)."""
    rng = random.Random(seed)
    root = Path(root)
    a = correctness_records(rng, "cuda:0") + bench_records(rng, "cuda:0") + peer_records(rng, "cuda:0")
    b = correctness_records(rng, "cuda:0", fail=True) + bench_records(rng, "cuda:0", slow=1.25)
    b.append(rec("int8", f"test_hostile[{HOSTILE}]", "failed", backend="cuda", device="cuda:0",
                 message=f"E   ValueError: bad {HOSTILE} & <b>bold</b>\x07 end"))
    b.append(rec("decode", "test_decode_long_context[S1048576]", "crashed", backend="triton",
                 message="worker 'gw1' crashed while running 'suites/test_decode.py::test_decode_long_context'"))
    b.append(rec("walking", "test_walking_slow", "timeout", backend="triton",
                 message="Failed: Timeout (>300.0s) from pytest-timeout."))
    c = correctness_records(rng, "cpu") + bench_records(rng, "cpu", slow=400.0, with_peak=False)
    c += [rec("harness_self", "test_ok", group="tests", duration_s=0.01)]
    legs = [
        write_run(root / "leg-torch2.11", a, leg="torch2.11-triton3.6", env=env_for("torch2.11-triton3.6", "gpu")),
        write_run(root / "leg-torch2.10", b, leg="torch2.10-triton3.5",
                  env=env_for("torch2.10-triton3.5", "gpu", torch="2.10.0+cu130", triton="3.5.1")),
        write_run(root / "leg-cpu", c, leg="cpu-interpreter", env=env_for("cpu-interpreter", "interpreter",
                  host="ci-cpu-7", torch="2.13.0+cpu"), complete=None),
    ]
    with open(legs[2] / RECORDS_FILE, "a", encoding="utf-8") as fh:
        fh.write('{"schema": 1, "suite": "decode", "case": "test_cut_off_mid_wr')
    return legs


def write_history(path: Path, root: Path, *, leg: str = "torch2.11-triton3.6", runs: int = 6, step_at: int = 4,
                  step: float = 1.3) -> list[Path]:
    """A run history (harness.history) of ``runs`` earlier GPU runs of ``leg``, one a day, on commits
    0000000, 1111111, ...: the benchmarks of :func:`bench_records`, ``step`` times slower from run
    ``step_at`` on (a change point there)."""
    from harness import history

    dirs = []
    for i in range(runs):
        records = bench_records(random.Random(100 + i), "cuda:0", slow=step if i >= step_at else 1.0)
        run_dir = write_run(Path(root) / f"history-{i}", records, leg=leg,
                            env={**env_for(leg, "gpu"), "commit": f"{i:x}" * 40})
        manifest = json.loads((run_dir / MANIFEST_FILE).read_text())
        manifest["started"] = f"2025-11-{10 + i:02d}T10:00:00.000+00:00"
        (run_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
        dirs.append(run_dir)
    history.add_runs(dirs, Path(path))
    return dirs


# What the suites' bad inputs raise, as a full catalogue has them: parametrized case ids and
# messages that name the accepted values (the page must keep both readable, printed too).
CATALOGUE_INPUTS = (
    ("ValueError", "{name}: the last dimension {n} is not a multiple of the group size 32; pad it or pass "
                   "group_size=None"),
    ("TypeError", "{name} must have dtype float16, bfloat16 or float32; got torch.int{n}"),
    ("ValueError", "{name} contains NaN or Inf in group(s) [{n}, {m}]; quantization needs finite values"),
    ("ValueError", "variant must be one of ('torch', 'cpu_baseline', 'naive', 'tiled', 'coarsened', 'vectorized', "
                   "'triton'); got '{name}-{n}'"),
    ("torch.OutOfMemoryError", "seq_id {n} needs {m} more pages than the {name} pool holds (capacity "
                               "{n}{m} pages of 16 tokens)"),
)


def catalogue_records(device: str, *, per_suite: int = 40) -> list[Record]:
    """``per_suite`` distinct bad inputs in each of four suites, with the long ids and messages of a
    real catalogue, and three suites of passing cases (a few hundred rows none of which failed)."""
    out = []
    for suite in ("affine_bad_input", "page_cache", "decode_bad_input", "transformers_cache"):
        for i in range(per_suite):
            etype, message = CATALOGUE_INPUTS[i % len(CATALOGUE_INPUTS)]
            name = ("k", "v", "residual_k", "block_table")[i % 4]
            case = f"test_bad_input_is_rejected_and_the_cache_unchanged[{name}-{suite}-case-{i}-{device}-triton]"
            out.append(rec(suite, case, backend="triton", device=device, metrics={
                "error_type": etype, "error_message": message.format(name=name, n=i + 3, m=2 * i + 5)}))
    for suite in ("widths", "streaming", "decode_layout"):
        for i in range(120):
            out.append(rec(suite, f"test_round_trip_keeps_every_value[{suite}-G{32 << i % 3}-S{i}-{device}]",
                           backend="triton", variant=f"G{32 << i % 3}", device=device, duration_s=0.01,
                           metrics={"states_checked": 4096 + i, "bit_errors": 0, "max_abs_err": 1e-3 + i * 1e-6,
                                    "err_to_tol": 0.5 + i / 400}))
    return out
