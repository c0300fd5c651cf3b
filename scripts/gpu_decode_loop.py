"""The decode loop on a GPU: a step appends one token to every sequence and attends, as a model does.

    PYTHONUNBUFFERED=1 python scripts/gpu_decode_loop.py [--out DIR] [--steps N] [--quick]

For each shape: the kvbits step (PagedKVCache.append + attend) eager and replayed from one
captured CUDA graph, per-step time distribution over --steps steps (median, p99, max); the same
fp16 step (suites/decode_loop_support.py); the host time of one call of each public entry point
and of the pieces of a planned call; the cache's device memory against its nbytes. Then a serving
batch of ragged sequences growing, finishing and joining, against fp16 flash SDPA per sequence. Writes
decode_loop.json under --out (default $OUT or reports/decode_loop) and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "suites")]

import torch  # noqa: E402
from decode_loop_support import (  # noqa: E402
    fp16_steps,
    kvbits_steps,
    percentiles,
    prompt_cache,
    serving_arrivals,
    serving_batch,
    serving_max_len,
    step_inputs,
    timed_steps,
)

import kvbits  # noqa: E402
from harness.peers.serving import SdpaServer  # noqa: E402
from kvbits.decode import reference_decode  # noqa: E402
from suites.peers_support import KvbitsServer  # noqa: E402

START = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {msg}", flush=True)


def host_ms(fn, n=200) -> float:
    """Median host time of one call (enqueue only; the GPU is synchronized every 50 calls so that
    the launch queue never fills)."""
    times = []
    for i in range(n):
        if i % 50 == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def host_breakdown(plan, q, cache) -> dict:
    """Host time of the pieces of a planned step: the split kernel through its compiled launcher and
    through the JIT function, an output allocation, the lengths' update."""
    from kvbits.decode.direct_launch import specialization
    from kvbits.decode.kernel import _decode_split_kernel
    from kvbits.decode.launch import query_group

    split = plan._split
    key = specialization(q)
    out = {"direct_launch_engaged": split._runner is not None,
           "append_direct_engaged": any(x._runner is not None for x in cache._appender._launches.values())}
    query = query_group(q)
    out["split_direct"] = host_ms(lambda: split(key, query))
    out["split_jit"] = host_ms(lambda: _decode_split_kernel[split.grid](query, *split.fixed, **split.options))
    out["empty"] = host_ms(lambda: torch.empty(plan.shape, dtype=q.dtype, device=q.device))
    lens = cache.seq_lens
    out["lens_add"] = host_ms(lambda: lens.add_(0))
    out["capturing_query"] = host_ms(torch.cuda.is_current_stream_capturing)
    return out


def kvbits_case(b, hq, hkv, s, d, steps):
    log(f"kvbits B={b} Hq={hq} Hkv={hkv} S={s}: building")
    before = torch.cuda.memory_allocated()
    cache = prompt_cache(b, hkv, s, d, extra=3 * steps + 128, device="cuda")
    torch.cuda.synchronize()
    alloc = torch.cuda.memory_allocated() - before
    toks, qs = step_inputs(b, hq, hkv, d, "cuda", seed=s)
    # the grown cache's decode against float64 on its own export
    cache.append(toks[0], toks[1])
    o = cache.attend(qs[0])
    err = float((o.double() - reference_decode(qs[0], cache.to_contiguous())).abs().max())
    res = {"shape": f"B={b} Hq={hq} Hkv={hkv} S={s} D={d}", "max_abs_err": err, "nbytes": cache.nbytes(),
           "allocated": alloc, "bytes_per_token": cache.bytes_per_token()}
    # host time of one call of each public entry point
    view = cache.view()
    res["host_attend_ms"] = host_ms(lambda: cache.attend(qs[1]))
    plan = cache._plan
    res["host_plan_run_ms"] = host_ms(lambda: plan.run(qs[1]))
    res["host_decode_attention_ms"] = host_ms(lambda: kvbits.decode_attention(qs[1], view))
    res["host_breakdown_ms"] = host_breakdown(plan, qs[1], cache)
    res["host_append_ms"] = host_ms(lambda: cache.append(toks[2], toks[3]), n=50)
    figures = kvbits_steps(cache, toks, qs, steps)
    ob = figures.pop("out")
    res.update(figures)
    cache.check_errors()
    res["max_abs_err_after_replays"] = float((ob.double() - reference_decode(qs[0], cache.to_contiguous())).abs().max())
    res["lengths_after"] = cache.lengths()[:4]
    res["device_lengths_after"] = cache.sync_lengths()[:4]
    graph = torch.cuda.CUDAGraph()  # the frozen cache's attend alone, replayed
    with torch.cuda.graph(graph):
        cache.attend(qs[0], out=ob)
    per, _ = timed_steps(lambda i: graph.replay(), 200)
    res["graph_attend_only"] = percentiles(per)
    return res


def serving(steps):
    arrivals = serving_arrivals(steps, sequences=32, prompts=(1024, 16384), new_tokens=(64, 1024))
    problem = (32, 32, 8, 128, serving_max_len(arrivals))
    served = serving_batch(lambda: KvbitsServer(3, *problem, device="cuda"), arrivals, steps)
    fp16 = serving_batch(lambda: SdpaServer("flash", *problem, device="cuda"), arrivals, min(steps, 256))
    served["fp16_per_sequence"] = {key: fp16[key] for key in ("tokens_per_s", "step_ms", "nbytes")}
    served.pop("lengths")
    return served


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/decode_loop"))
    ap.add_argument("--steps", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="4K and 32K only, 256 steps, no serving batch")
    ap.add_argument("--word-shares", type=int, help="programs sharing a completed group's K or V words "
                                                    "(page_append.WORD_SHARES)")
    args = ap.parse_args()
    if args.word_shares:
        from kvbits.decode import append as page_append

        page_append.WORD_SHARES = args.word_shares
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = 256 if args.quick else args.steps
    shapes = [(1, 32, 32, 4096, 128), (1, 32, 32, 32768, 128), (1, 32, 32, 131072, 128), (8, 32, 8, 32768, 128)]
    if args.quick:
        shapes = shapes[:2]
    rows = []
    for b, hq, hkv, s, d in shapes:
        row = kvbits_case(b, hq, hkv, s, d, steps)
        row["fp16"] = fp16_steps(b, hq, hkv, s, d, steps, "cuda")
        rows.append(row)
        log(json.dumps(row))
        (out / "decode_loop.json").write_text(json.dumps({"shapes": rows}, indent=1))
    serve = None if args.quick else serving(steps)
    if serve:
        log(json.dumps(serve))
    (out / "decode_loop.json").write_text(json.dumps({"shapes": rows, "serving": serve}, indent=1))
    print(f"\n{'shape':34} {'kv eager':>9} {'fp16 eager':>10} {'x':>5} {'kv graph':>9} {'p99':>7} {'max':>7}"
          f" {'fp16 graph':>10} {'x':>5} {'attend':>7} {'host attend/plan/api/append ms':>32} {'mem=nbytes':>10}")
    for r in rows:
        e, g, fe, fg = r["eager"], r["graph"], r["fp16"]["eager"], r["fp16"]["graph"]
        print(f"{r['shape']:34} {e['median']:9.4f} {fe['median']:10.4f} {fe['median'] / e['median']:5.2f}"
              f" {g['median']:9.4f} {g['p99']:7.4f} {g['max']:7.4f} {fg['median']:10.4f}"
              f" {fg['median'] / g['median']:5.2f} {r['graph_attend_only']['median']:7.4f}"
              f" {r['host_attend_ms']:.4f}/{r['host_plan_run_ms']:.4f}/{r['host_decode_attention_ms']:.4f}/"
              f"{r['host_append_ms']:.4f} {str(r['allocated'] - r['nbytes']):>10}  err {r['max_abs_err']:.1e}/"
              f"{r['max_abs_err_after_replays']:.1e}")
    if serve:
        print(f"serving: kvbits {serve['tokens_per_s']:.0f} tok/s, fp16 flash SDPA per sequence "
              f"{serve['fp16_per_sequence']['tokens_per_s']:.0f} tok/s, step p50 {serve['step_ms']['median']:.3f} ms "
              f"p99 {serve['step_ms']['p99']:.3f}, prefill {serve['prefill_s']:.2f} s")


if __name__ == "__main__":
    main()
