"""``python -m harness.quality record``: measure the quality suite's protocol on this machine and
write its figures as the record the suite gates on (``reports/baselines/quality.json``; review
the diff before committing it). ``python -m harness.quality study``: the emulated schemes'
figures (:mod:`harness.quality.emulate`) over a protocol, as a Markdown table."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from .caches import CacheSpec
from .emulate import ZEROS, Scheme
from .model import GGUF_FILE, MODEL_DIST, TEXTS, load_model, text_tokens
from .protocol import Figures, Protocol, measure

RECORD = Path("reports/baselines/quality.json")
SUITE_PROTOCOL = Protocol(prompt=256, steps=128, segments=1)
# how far a figure may move without a change of quality. Quantization is discontinuous: K/V
# computed in another order of float operations (the GPU's fused kernels against the CPU's torch
# path, the one-pass emulation against the steps) cross a code's rounding edge now and then, and
# over 128 scored tokens the figures move by up to a fifth (KL relative; a perplexity change
# by the absolute band plus the same fraction of itself, suites/test_quality.py)
NOISE = {"kl_relative": 0.25, "kl_absolute": 0.002, "perplexity_change": 0.03}


def _markdown(figures: dict[str, Figures]) -> str:
    lines = ["| cache | bytes/token | perplexity | change | mean KL | top-1 | greedy matched |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, f in figures.items():
        size = "" if f.bytes_per_token is None else f"{f.bytes_per_token:,.0f}"
        greedy = "" if f.greedy_matched is None else f"{f.greedy_matched:.1f}"
        lines.append(f"| {name} | {size} | {f.perplexity:.3f} | {100 * f.perplexity_change:+.2f}% | {f.kl:.4f} "
                     f"| {f.top1:.3f} | {greedy} |")
    return "\n".join(lines)


def _record(args) -> int:
    import kvbits.integrations.transformers  # noqa: F401  (registers the "kvbits" attention)
    from harness.run.env import dist_version

    model, tokenizer = load_model(args.device, torch.float32)
    specs = [CacheSpec("kvbits", bits) for bits in (2, 3, 4)] + [CacheSpec("kvbits", 3, sinks=0, window=0)]
    figures = measure(model, text_tokens(tokenizer), SUITE_PROTOCOL, specs)
    record = {
        "model": f"{GGUF_FILE} ({MODEL_DIST} {dist_version(MODEL_DIST)}), fp32",
        "text": TEXTS, "protocol": dataclasses.asdict(SUITE_PROTOCOL), "noise": NOISE,
        "measured_on": f"{args.device}, torch {torch.__version__}, transformers {dist_version('transformers')}",
        "figures": {s.name: {k: figures[s.name].__getattribute__(k)
                             for k in ("kl", "perplexity_change", "top1", "bytes_per_token")} for s in specs},
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(_markdown(figures))
    return 0


def _study(args) -> int:
    model, tokenizer = load_model(args.device, torch.float32)
    protocol = Protocol(prompt=args.prompt, steps=args.steps, segments=args.segments)
    schemes = [Scheme(bits, zero=zero, window=window, sinks=sinks)
               for bits in args.bits for zero in args.zero for window in args.window for sinks in args.sinks]
    print(protocol.describe())
    print(_markdown(measure(model, text_tokens(tokenizer), protocol, schemes)))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.quality", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="measure the suite's protocol and write the record it gates on")
    rec.add_argument("--out", type=Path, default=RECORD)
    study = sub.add_parser("study", help="the emulated schemes' figures as a Markdown table")
    study.add_argument("--prompt", type=int, default=256)
    study.add_argument("--steps", type=int, default=512)
    study.add_argument("--segments", type=int, default=4)
    study.add_argument("--bits", type=int, nargs="+", default=[2, 3, 4])
    study.add_argument("--zero", nargs="+", choices=ZEROS, default=["holds-zero"])
    study.add_argument("--window", type=int, nargs="+", default=[0])
    study.add_argument("--sinks", type=int, nargs="+", default=[0])
    for p in (rec, study):
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    return _record(args) if args.command == "record" else _study(args)


if __name__ == "__main__":
    sys.exit(main())
