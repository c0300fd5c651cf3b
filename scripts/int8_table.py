"""Markdown tables from an INT8 benchmark run (suites/test_bench_int8.py records).

    python scripts/int8_table.py reports/runs/<run>/records.jsonl > int8_table.md

First the summary in the form of GPU-Accelerated KV Cache Quantization's results table (best
variant per shape and its speedups, the shapes named as there), then every variant, then the
target at 131072 x 4096: best variant >= 1.25x torch.compile on quant + dequant and >= 90% of
the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.records import read_records  # noqa: E402

# The shapes' names in the results table of GPU-Accelerated KV Cache Quantization.
SHAPE_NAMES = {
    "1024x64": "Trivial Correctness",
    "2048x128": "Small",
    "16384x256": "Medium",
    "65536x256": "Large",
    "131072x256": "Very Large",
    "131072x1024": "Realistic Small LLM",
    "131072x2048": "Realistic Medium LLM",
    "131072x4096": "Realistic Large LLM",
    "131072x8192": "Realistic V. Large LLM",
    "262144x128": "Massive Attention",
}
KERNEL_VARIANTS = ("torch", "naive", "tiled", "coarsened", "vectorized", "triton")
TARGET_SHAPE, TARGET_SPEEDUP, TARGET_PCT = "131072x4096", 1.25, 90.0


def _fmt(value, digits=3) -> str:
    if value is None or isinstance(value, str):
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


def _rows(path: str) -> tuple[dict[str, dict[str, dict]], list[str]]:
    """The passed bench_int8 records' metrics by shape and variant, and the file's problems."""
    result = read_records(path)
    shapes: dict[str, dict[str, dict]] = {}
    for rec in result.records:
        if rec.suite != "bench_int8" or rec.outcome != "passed":
            continue
        shape = rec.metrics.get("shape")
        shapes.setdefault(shape, {})[rec.variant] = rec.metrics
    return shapes, result.problems


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="int8_table.py", description=__doc__.splitlines()[0])
    parser.add_argument("records", help="records.jsonl of a run of suites/test_bench_int8.py")
    return parser


def main(argv: list[str]) -> int:
    """The tables on stdout; exit 1 when the file has problems (each also a comment in the
    output) or no passed bench_int8 record."""
    args = build_parser().parse_args(argv)
    shapes, problems = _rows(args.records)
    for problem in problems:
        print(f"<!-- {problem} -->")
        print(problem, file=sys.stderr)
    if not shapes:
        print(f"{args.records}: no passed bench_int8 record", file=sys.stderr)
        return 1
    order = [s for s in SHAPE_NAMES if s in shapes] + [s for s in shapes if s not in SHAPE_NAMES]
    print("## INT8 per-channel quantize + dequantize: best variant per shape\n")
    print(
        "| Test | Shape (T x D) | Best variant | total ms | vs CPU baseline | vs torch eager | vs torch.compile "
        "| GB/s | % of copy | L2 err | max-abs err | attn err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    best_of = {}
    for shape in order:
        candidates = {v: m for v, m in shapes[shape].items() if v in KERNEL_VARIANTS and "ms" in m}
        if not candidates:
            continue
        variant, m = min(candidates.items(), key=lambda item: item[1]["ms"])
        best_of[shape] = (variant, m)
        sp = m.get("speedup", {})
        print(
            f"| {SHAPE_NAMES.get(shape, '')} | {shape} | {variant} | {_fmt(m['ms'])} | {_fmt(sp.get('cpu_baseline'))}x "
            f"| {_fmt(sp.get('torch_eager'))}x | {_fmt(sp.get('torch_compile'))}x | {_fmt(m.get('gbps'), 4)} "
            f"| {_fmt(m.get('pct_of_peak'))} | {_fmt(m.get('l2_err'))} | {_fmt(m.get('max_abs_err'))} "
            f"| {_fmt(m.get('attn_err'))} |"
        )
    print("\n## Every variant (ms: quant / dequant / total)\n")
    print("| Shape | Variant | quant ms | dequant ms | total ms | GB/s | % of copy | bit errors |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in order:
        for variant, m in sorted(
            shapes[shape].items(), key=lambda item: item[1].get("ms", float("inf"))
        ):
            print(
                f"| {shape} | {variant} | {_fmt(m.get('quant_ms'))} | {_fmt(m.get('dequant_ms'))} "
                f"| {_fmt(m.get('ms'))} | {_fmt(m.get('gbps'), 4)} | {_fmt(m.get('pct_of_peak'))} "
                f"| {m.get('bit_errors', '-')} |"
            )
    if TARGET_SHAPE in best_of:
        variant, m = best_of[TARGET_SHAPE]
        speedup = m.get("speedup", {}).get("torch_compile")
        pct = m.get("pct_of_peak")
        ok = (
            speedup is not None
            and pct is not None
            and speedup >= TARGET_SPEEDUP
            and pct >= TARGET_PCT
        )
        print(
            f"\nTarget at {TARGET_SHAPE} fp32: best variant {variant}, {_fmt(speedup)}x torch.compile "
            f"(need >= {TARGET_SPEEDUP}), {_fmt(pct)}% of copy bandwidth {_fmt(m.get('copy_gbps'), 4)} GB/s "
            f"(need >= {TARGET_PCT}%): {'MET' if ok else 'NOT MET'}"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
