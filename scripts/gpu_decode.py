"""Fused 3-bit decode on a GPU: correctness of the compiled kernels, a layout and split sweep,
and the decode benchmark's table (fused vs fp16 SDPA vs the unfused path, bandwidth vs measured copy).

    PYTHONUNBUFFERED=1 python scripts/gpu_decode.py [--out DIR] [--sweep] [--profile]

Writes decode_gpu.json (every figure) under --out (default $OUT or reports/decode) and prints a
short table last. --profile runs one fused launch under ncu (hardware counters) afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "suites")]

import torch  # noqa: E402

import kvbits  # noqa: E402
from kvbits.decode import (  # noqa: E402
    DecodePlan,
    decode_attention,
    decode_view,
    paged_from_contiguous,
    reference_decode,
)
from kvbits.decode import launch as dec  # noqa: E402
from kvbits.decode import layout as arrangement  # noqa: E402

START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


def correctness() -> list[dict]:
    from decode_support import random_kv, random_q, varlen_cache

    rows = []
    cases = [  # name, B, Hq, Hkv, S, D, bits, G, dtype
        ("B*H=8 S=256 D=64", 2, 4, 4, 256, 64, 3, 64, torch.float16),
        ("GQA8 S=1000 D=128", 1, 8, 1, 1000, 128, 3, 64, torch.float16),
        ("GQA4 bf16 S=777 D=128", 2, 8, 2, 777, 128, 3, 64, torch.bfloat16),
        ("bits=2 S=300 D=128", 1, 2, 2, 300, 128, 2, 64, torch.float16),
        ("MHA S=4097 D=128", 1, 4, 4, 4097, 128, 3, 64, torch.float16),
    ]
    for name, b, hq, hkv, s, d, bits, g, dt in cases:
        k, v = random_kv(b, hkv, s, d, device="cuda", dtype=dt, seed=s)
        q = random_q(b, hq, d, device="cuda", dtype=dt, seed=s + 1)
        cache = kvbits.quantize_kv(k, v, bits, group_size=g, backend="triton")
        out = torch.full_like(q, float("nan"))
        decode_attention(q, cache, out=out)
        ref = reference_decode(q, cache)
        rows.append({"case": name, "finite": bool(torch.isfinite(out).all()),
                     "max_abs_err": float((out.double() - ref).abs().max()),
                     "tol": 2e-3 if dt == torch.float16 else 1.6e-2})
        log(f"check {name}: {rows[-1]}")
    # mixed lengths with garbage beyond each sequence; paged (shuffled pool) == contiguous, bit for bit
    lens = [5000, 77, 1, 2048]
    k, v = random_kv(4, 2, max(lens), 128, device="cuda", seed=7)
    q = random_q(4, 8, 128, device="cuda", seed=8)
    cache = varlen_cache(k.cpu(), v.cpu(), lens)
    cache = kvbits.QuantizedKV(cache.bits, cache.group_size, *(getattr(cache, f).cuda() for f in (
        "k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero", "k_residual", "v_residual", "seq_lens")))
    out = decode_attention(q, cache)
    ref = reference_decode(q, cache)
    pool = paged_from_contiguous(cache, 256, num_pages=200, generator=torch.Generator().manual_seed(9))
    same = bool(torch.equal(decode_attention(q, pool), out))
    rows.append({"case": "mixed lengths + paged", "finite": bool(torch.isfinite(out).all()),
                 "max_abs_err": float((out.double() - ref).abs().max()), "tol": 2e-3, "paged_equal": same})
    log(f"check mixed/paged: {rows[-1]}")
    return rows


def shape_case(b: int, hq: int, hkv: int, s: int, d: int, seed: int):
    """(label, q, 3-bit cache) of one decode shape on the GPU, from fresh random K/V."""
    from decode_support import random_kv, random_q

    k, v = random_kv(b, hkv, s, d, device="cuda", seed=seed)
    q = random_q(b, hq, d, device="cuda", seed=seed + 1)
    return f"B={b} Hq={hq} Hkv={hkv} S={s}", q, kvbits.quantize_kv(k, v, 3, backend="triton")


def fused_ms(q, cache, tile=None, warps=None) -> float:
    """Median ms of one fused call on ``cache`` in the given layout, rotating over copies of the cache
    so that each call reads from DRAM (as the benchmark times it)."""
    from decode_support import clone_cache

    from harness.measure.timing import graph_replay_ms, rotations

    view = decode_view(cache, tile=tile, warps=warps)
    copies = [cache] + [clone_cache(cache) for _ in range(rotations(view.read_bytes()) - 1)]
    views = [view] + [decode_view(c, tile=view.tile, warps=view.warps) for c in copies[1:]]
    plans = [DecodePlan(v, q.shape[1], q.dtype, cache.capacity) for v in views]
    ms = graph_replay_ms([lambda p=p: p.run(q) for p in plans])
    del plans, views, copies
    return ms


def sweep(layouts, targets, shapes) -> list[dict]:
    rows = []
    for shape in shapes:
        label, q, cache = shape_case(*shape, seed=11)
        for tile, warps in layouts:
            view = decode_view(cache, tile=tile, warps=warps)
            nbytes = view.read_bytes()
            for target in targets:
                dec.SPLIT_PROGRAMS_PER_SM = target
                ms = fused_ms(q, cache, tile, warps)
                rows.append({"shape": label, "layout": f"t{tile}w{warps}",
                             "programs_per_sm": target, "ms": ms, "gbps": nbytes / ms / 1e6})
                log(f"sweep {rows[-1]}")
        del cache
        torch.cuda.empty_cache()
    return rows


def table() -> list[dict]:
    from decode_support import GPU_BENCH_SHAPES, bench_shape

    rows = []
    for shape in GPU_BENCH_SHAPES:
        fig = bench_shape(*shape, device="cuda")
        rows.append(fig)
        log(f"bench {fig['shape']}: fused {fig['ms']:.4f} ms, sdpa {fig['sdpa_ms']:.4f}, "
            f"unfused {fig['unfused_ms']:.4f}, {fig['gbps']:.0f} GB/s ({fig.get('pct_of_peak', 0):.0f}%), "
            f"read floor {fig.get('read_floor_ms', 0):.4f} ms ({fig.get('pct_of_read_floor', 0):.0f}%), "
            f"err {fig['max_abs_err']:.2e}")
        torch.cuda.empty_cache()
    return rows


def tune() -> list[dict]:
    """Pipeline depth x register cap for the default layout, B=1 H=32 D=128 S=128K."""
    rows = []
    cases = [shape_case(1, 32, 32, 131072, 128, seed=31)]
    for stages in (2, 3, 4):
        for maxnreg in (None, 168, 128):
            dec.NUM_STAGES, dec.MAX_REGISTERS = stages, maxnreg
            total = 0.0
            for name, q, cache in cases:
                ms = fused_ms(q, cache)
                total += ms
                log(f"tune {name} stages={stages} maxnreg={maxnreg}: {ms:.4f} ms")
            rows.append({"num_stages": stages, "maxnreg": maxnreg, "ms": total})
    return rows


def grid() -> list[dict]:
    """Pipeline depth x split target over the benchmark shapes (GPU_BENCH_SHAPES), fused kernel
    only; sets the best (highest geometric-mean speed over the shapes) for the table."""
    import math

    from decode_support import GPU_BENCH_SHAPES

    rows = []
    for shape in GPU_BENCH_SHAPES:
        label, q, cache = shape_case(*shape, seed=41)
        for stages in (2, 3):
            for target in (None, 16, 24):
                dec.NUM_STAGES, dec.SPLIT_PROGRAMS_PER_SM = stages, target
                ms = fused_ms(q, cache)
                rows.append({"shape": label, "num_stages": stages,
                             "programs_per_sm": target, "ms": ms})
                log(f"grid {rows[-1]}")
        del cache
        torch.cuda.empty_cache()
    score = {}
    for r in rows:  # programs_per_sm None: the wave rule (decode.split_count)
        key = (r["num_stages"], r["programs_per_sm"])
        score[key] = score.get(key, 0.0) + math.log(r["ms"])
    (stages, target), _ = min(score.items(), key=lambda kv: kv[1])
    dec.NUM_STAGES, dec.SPLIT_PROGRAMS_PER_SM = stages, target
    log(f"table uses num_stages={stages}, {target} programs per SM")
    return rows


def bench_suite(out_dir: Path) -> list[dict]:
    """Run suites/test_bench_decode.py in this process (with its tuned settings); return its figures."""
    import pytest

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        code = pytest.main(["suites/test_bench_decode.py", "-q", "-p", "no:cacheprovider",
                            "--results-dir", str(out_dir / "bench")])
    finally:
        os.chdir(cwd)
    log(f"bench suite exit code {int(code)}")
    rows = []
    for line in (out_dir / "bench" / "records.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rows.append({**rec["metrics"], "layout": (rec.get("variant") or "").replace("fused-3bit-", "")})
    return rows


def profile_one(out_dir: Path) -> None:
    """Run one fused decode (B=1, H=32, D=128, S=128K) a few times, for ncu."""
    _, q, cache = shape_case(1, 32, 32, 131072, 128, seed=21)
    for _ in range(3):
        decode_attention(q, cache)
    torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "reports" / "decode"))
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--programs-per-sm", type=int, default=None)
    parser.add_argument("--warps", type=int, default=None, help="warps of the default layout")
    parser.add_argument("--suites", action="store_true", help="also run the decode suites on the GPU")
    parser.add_argument("--tune", action="store_true", help="sweep register cap and pipeline depth")
    parser.add_argument("--grid", action="store_true", help="sweep pipeline depth x split target on the table's shapes")
    parser.add_argument("--bench", action="store_true", help="run the bench suite instead of the table")
    parser.add_argument("--no-checks", action="store_true", help="skip the small correctness checks")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.programs_per_sm:
        dec.SPLIT_PROGRAMS_PER_SM = args.programs_per_sm
    if args.warps:
        arrangement.DEFAULT_WARPS = args.warps
    if args.profile_one:
        profile_one(out_dir)
        return 0
    import triton

    from harness.measure.timing import copy_bandwidth_gbps

    props = torch.cuda.get_device_properties(0)
    result = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "triton": triton.__version__}
    log(f"{result}")
    result["copy_gbps"] = copy_bandwidth_gbps()
    log(f"copy bandwidth {result['copy_gbps']:.0f} GB/s")
    result["checks"] = [] if args.no_checks else correctness()
    if args.sweep:
        targets = [None, 8, 12, 16, 24, 32]
        result["sweep"] = sweep([(64, 2), (64, 1)], targets, [(1, 32, 32, 131072, 128)])
        result["sweep"] += sweep([(64, 2), (64, 1)], targets, [(8, 32, 8, 32768, 128)])
        scores = {}
        for r in result["sweep"]:  # rank (layout, split target) by the summed time of both shapes
            scores[(r["layout"], r["programs_per_sm"])] = scores.get((r["layout"], r["programs_per_sm"]), 0) + r["ms"]
        (layout, target), _ = min(scores.items(), key=lambda kv: kv[1])
        dec.SPLIT_PROGRAMS_PER_SM = target
        arrangement.DEFAULT_WARPS = int(layout.split("w")[1])
        log(f"table uses {layout}, {target} programs per SM")
    if args.grid:
        result["grid"] = grid()
    if args.tune:
        result["tune"] = tune()
        best = min(result["tune"], key=lambda r: r["ms"])
        dec.NUM_STAGES, dec.MAX_REGISTERS = best["num_stages"], best["maxnreg"]
        log(f"table uses num_stages={dec.NUM_STAGES} maxnreg={dec.MAX_REGISTERS}")
    result["programs_per_sm"] = dec.SPLIT_PROGRAMS_PER_SM
    result["warps"] = arrangement.DEFAULT_WARPS
    result["num_stages"], result["maxnreg"] = dec.NUM_STAGES, dec.MAX_REGISTERS
    if args.bench:
        result["table"] = bench_suite(out_dir)
    else:
        result["table"] = table()
    (out_dir / "decode_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    if args.profile:
        cmd = ["ncu", "--clock-control", "none", "--kernel-name", "regex:_decode_split_kernel", "--launch-skip", "2",
               "--launch-count", "1", "--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis",
               "--section", "WarpStateStats", "--section", "Occupancy", "--section", "LaunchStats",
               "--section", "InstructionStats", "--section", "SchedulerStats",
               sys.executable, __file__, "--profile-one", "--out", str(out_dir),
               "--warps", str(arrangement.DEFAULT_WARPS)]
        if dec.SPLIT_PROGRAMS_PER_SM:
            cmd += ["--programs-per-sm", str(dec.SPLIT_PROGRAMS_PER_SM)]
        try:
            prof = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
            (out_dir / "ncu_decode.txt").write_text(prof.stdout + prof.stderr)
            log("ncu written" if prof.returncode == 0 else f"ncu rc={prof.returncode}: {prof.stderr[-500:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            log(f"ncu failed: {exc}")
    if args.suites:
        cmd = [sys.executable, "-m", "pytest", "suites/test_decode_fused.py", "suites/test_decode_bad_input.py",
               "-q", "-x", "-k", "cuda or bad_input", "-p", "no:cacheprovider",
               "--results-dir", str(out_dir / "suites")]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=130, cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
            (out_dir / "suites_gpu.txt").write_text(run.stdout[-20000:] + run.stderr[-5000:])
            result["suites"] = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else f"rc={run.returncode}"
        except subprocess.TimeoutExpired:
            result["suites"] = "timeout"
        log(f"suites on the GPU: {result['suites']}")
    print("\nshape                               layout  fused ms  sdpa ms  unfused ms  xSDPA  xUnfused  GB/s  %copy"
          "  floor ms  %floor  err")
    for r in result["table"]:
        print(f"{r['shape']:<36}{r['layout']:<7} {r['ms']:8.4f} {r['sdpa_ms']:8.4f} {r['unfused_ms']:10.4f} "
              f"{r['speedup']['sdpa_fp16']:6.2f} {r['speedup']['unfused']:8.2f} {r['gbps']:6.0f} "
              f"{r.get('pct_of_peak', 0):5.1f}  {r.get('read_floor_ms', 0):8.4f} {r.get('pct_of_read_floor', 0):6.1f}"
              f"  {r['max_abs_err']:.1e}")
    bad = [c for c in result["checks"]
           if not c["finite"] or c["max_abs_err"] > c["tol"] or c.get("paged_equal") is False]
    bad += [r for r in result["table"] if r["max_abs_err"] > 2e-3]
    print(f"copy {result['copy_gbps']:.0f} GB/s; programs/SM {result['programs_per_sm'] or 'wave rule'}; "
          f"warps {result['warps']}; {len(bad)} correctness problem(s); suites: {result.get('suites', 'not run')}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
