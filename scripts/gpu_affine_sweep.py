"""Tile sweep of the affine quantize kernel on a GPU, K and V apart, against the copy bandwidth
measured in the same run: which tile (tokens x channels per program, warps) moves the
fp16 [8, 8, 32768, 128] cache of suites/test_bench_affine.py's target fastest.

    PYTHONUNBUFFERED=1 python scripts/gpu_affine_sweep.py [--out DIR] [--bits 3] [--group-size 64]
        [--registers 0 96 128 ...]

Every tile's cache (codes, scales, zeros) is compared bit for bit with the torch reference's
before it is timed; a wrong tile is reported and not timed. Bytes per side: the input read
once, codes, scales and zeros written once. Writes
affine_sweep_b<bits>_g<G>[_registers][_k_only|_v_only].json under --out (default
$OUT or reports/affine) and prints the table last, with the best K + best V against the default.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.measure.timing import bandwidth_metrics, copy_bandwidth_gbps, median_ms  # noqa: E402
from kvbits.affine import QuantizeTile, _launch_quantize, default_tile  # noqa: E402
from kvbits.kv_cache import QuantizedKV, quantize_into  # noqa: E402

SHAPE = (8, 8, 32768, 128)


def tiles(per_channel: bool, group_size: int, head_dim: int):
    """Every tile worth timing for one side (K tiles hold exactly one group of tokens)."""
    smallest = 32 if per_channel else group_size  # K rows may split into words of 32 values
    channels = [c for c in (smallest, group_size, 2 * group_size, head_dim) if c <= head_dim and head_dim % c == 0]
    token_choices = [group_size] if per_channel else [16, 32, 64, 128, 256]
    for tokens in token_choices:
        for ch in sorted(set(channels)):
            for warps in (1, 2, 4, 8):
                if 8 <= tokens * ch // (32 * warps) <= 256:  # elements per thread
                    yield QuantizeTile(tokens, ch, warps)


def row_label(row: dict) -> str:
    """``k t64 c128 w2 r96 (default)``: a row's side, tile and register cap."""
    cap = f" r{row['registers']}" if row["registers"] else ""
    return (f"{row['side']} t{row['tokens']} c{row['channels']} w{row['warps']}{cap}"
            + (" (default)" if row["default"] else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "reports" / "affine"))
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--side", choices=("k", "v", "both"), default="both", help="which side to sweep")
    parser.add_argument("--registers", type=int, nargs="+", default=None,
                        help="instead of the tile sweep, time each side's default tile under these register caps "
                             "per thread (0: no cap)")
    args = parser.parse_args()
    bits, g = args.bits, args.group_size
    b, h, s, d = SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(SHAPE, device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn(SHAPE, device="cuda", dtype=torch.float16, generator=gen)
    k[..., ::16] = k[..., ::16] * 30 + 7  # outlier channels

    def empty():
        return QuantizedKV.empty(b, h, d, bits=bits, group_size=g, capacity=s, dtype=torch.float16, device="cuda")

    ref = empty()
    quantize_into(ref, k, v, 0, "torch")
    copy = copy_bandwidth_gbps()
    rows = []
    for per_channel, x, side in ((True, k, "k"), (False, v, "v")):
        if args.side not in ("both", side):
            continue
        fields = [f"{side}_{f}" for f in ("codes", "scale", "zero")]
        moved = x.numel() * x.element_size() + sum(getattr(ref, f).numel() * getattr(ref, f).element_size()
                                                   for f in fields)
        default_of_side = default_tile(g, per_channel, d)
        if args.registers:
            candidates = [default_of_side._replace(registers=r) for r in args.registers]
        else:
            candidates = tiles(per_channel, g, d)
        for tile in candidates:
            got = empty()
            for f in fields:
                getattr(got, f).fill_(0xFF if f.endswith("codes") else float("nan"))
            codes, scale, zero = (getattr(got, f) for f in fields)

            def launch(x=x, codes=codes, scale=scale, zero=zero, per_channel=per_channel, tile=tile):
                _launch_quantize(x, codes, scale, zero, 0, g, bits, per_channel, tile)

            try:
                launch()
                torch.cuda.synchronize()
                ok = all(torch.equal(getattr(got, f).view(torch.uint8), getattr(ref, f).view(torch.uint8))
                         for f in fields)
                error = None
            except Exception as exc:  # a tile that does not compile is a row, not the end of the sweep
                ok, error = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            figures = bandwidth_metrics(moved, median_ms(launch)) if ok else {}
            ms = figures.get("ms")
            row = {"side": side, "tokens": tile.tokens, "channels": tile.channels, "warps": tile.warps,
                   "registers": tile.registers, "default": tile == default_of_side, "correct": ok, "error": error,
                   "ms": ms,
                   "gbps": figures.get("gbps"), "pct_of_copy": figures.get("pct_of_peak"), "bytes": moved}
            rows.append(row)
            timing = f"{ms:8.4f} ms {row['pct_of_copy']:6.1f}% of copy" if ok else (error or "WRONG")
            print(f"{row_label(row):<28} {timing}", flush=True)
            del got
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ("_registers" if args.registers else "") + ("" if args.side == "both" else f"_{args.side}_only")
    (out_dir / f"affine_sweep_b{bits}_g{g}{suffix}.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(0), "copy_gbps": copy, "shape": list(SHAPE), "bits": bits,
         "group_size": g, "rows": rows}, indent=2) + "\n")
    print(f"\ncopy {copy:,.0f} GB/s; bits {bits} G={g} fp16 {list(SHAPE)}; best per side:")
    best, default = {}, {}
    for side in ("k", "v"):
        timed = sorted((r for r in rows if r["side"] == side and r["correct"]), key=lambda r: r["ms"])
        for r in timed[:4]:
            print(f"  {row_label(r):<28} {r['ms']:.4f} ms {r['pct_of_copy']:.1f}% of copy")
        best[side] = timed[0] if timed else None
        default[side] = next((r for r in rows if r["side"] == side and r["default"]), None)
    for label, pick in (("default", default), ("best", best)):
        if pick["k"] and pick["v"] and pick["k"]["correct"] and pick["v"]["correct"]:
            ms = pick["k"]["ms"] + pick["v"]["ms"]
            moved = pick["k"]["bytes"] + pick["v"]["bytes"]
            print(f"  K + V {label}: {ms:.4f} ms, {bandwidth_metrics(moved, ms)['pct_of_peak']:.1f}% of copy")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
