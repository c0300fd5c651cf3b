"""Accuracy, speed and memory of the decode methods side by side: per shape, each method's decode
step time against its attention-output error with the Pareto front drawn, and a table of what a
token costs and the longest context each method fits in a given memory.

Read from the records of the peers benchmark (``suites/test_bench_peers.py``), whose metrics
carry ``method``, ``bits``, ``ms`` (the decode step: append one token, attend; eager),
``graph_ms`` (the same step replayed from a CUDA graph, where the method allows one), ``attn_rel_err``
(relative RMS error of the attention output against float64 attention on the original K/V; the
chart takes ``attn_rel_err_outliers``, on K with outlier channels, where the record has it),
``bytes_per_token`` (one layer, the shape's kv heads) and ``pareto_group`` (the shape, e.g.
``B1-Hq32-Hkv32-S32768-D128``). A record without them is no point.

The same benchmark's serving-batch records (``method``, ``tokens_per_s``, ``ms``, ``p99_ms``,
``nbytes``) and real-activation records (``method``, ``attn_rel_err_real``,
``attn_rel_err_real_max``) give one more row per method: :func:`method_rows`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from .charts import RC, Chart, figure_uri  # noqa: E402
from .fmt import clean_text, fmt_sig, to_float  # noqa: E402
from .summary import Summary  # noqa: E402

ERROR_METRICS = ("attn_rel_err_outliers", "attn_rel_err")  # the chart's error, first present
# The model the memory table speaks of: a Llama-3-8B shape (32 layers, 8 kv heads of 128 channels,
# 16.06 GB of bf16 weights); the longest context is one sequence's, beside the weights.
MODEL = {"name": "Llama-3-8B shape", "layers": 32, "kv_heads": 8, "head_dim": 128, "weights_gb": 16.06}
MEMORIES_GB = (80, 141)
KVBITS = "#cf222e"
PEER = "#1f6feb"
GROUP = re.compile(r"Hkv(\d+)-.*D(\d+)")


@dataclass(frozen=True)
class Point:
    method: str
    bits: float | None
    ms: float
    error: float
    bytes_per_token: float | None
    group: str
    graph_ms: float | None = None  # the step replayed from a CUDA graph (None: not capturable)


def _point(metrics: dict) -> Point | None:
    ms = to_float(metrics.get("ms"))
    error = next((e for e in (to_float(metrics.get(m)) for m in ERROR_METRICS) if e is not None), None)
    method, group = metrics.get("method"), metrics.get("pareto_group")
    if not (method and group and ms and ms > 0 and error is not None and math.isfinite(error)):
        return None
    graph_ms = to_float(metrics.get("graph_ms"))
    return Point(str(method), to_float(metrics.get("bits")), ms, error, to_float(metrics.get("bytes_per_token")),
                 str(group), graph_ms if graph_ms and graph_ms > 0 else None)


def tradeoff_points(summary: Summary) -> dict[str, list[Point]]:
    """The passed records' points by shape (pareto_group), each method once (its first record)."""
    groups: dict[str, dict[str, Point]] = {}
    for _, record in summary.results.pairs():
        point = _point(record.metrics) if record.outcome == "passed" else None
        if point is not None:
            groups.setdefault(point.group, {}).setdefault(point.method, point)
    return {group: list(points.values()) for group, points in sorted(groups.items())}


def lower_front(items: list, x, y) -> list:
    """The items no other beats in both ``x(item)`` and ``y(item)``, smaller being better (ties in
    x: the smaller y), smallest x first."""
    front: list = []
    for item in sorted(items, key=lambda i: (x(i), y(i))):
        if not front or y(item) < y(front[-1]):
            front.append(item)
    return front


def pareto_front(points: list[Point]) -> list[Point]:
    """The points no other point beats in both time and error (ties in time: the smaller error),
    fastest first."""
    return lower_front(points, lambda p: p.ms, lambda p: p.error)


def label_point(ax, x: float, y: float, name: str, color: str) -> None:
    """A method's name beside its point."""
    ax.annotate(clean_text(name), (x, y), xytext=(3, 3), textcoords="offset points", fontsize=6.5, color=color)


def finish_log_log(ax, xlabel: str, ylabel: str) -> None:
    """Both axes logarithmic and labelled, the grid behind the points, the legend top right."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(which="both")
    ax.set_axisbelow(True)
    ax.legend(loc="upper right", frameon=False, fontsize=6.5)


def _is_kvbits(point: Point) -> bool:
    return point.method.startswith("kvbits")


def tradeoff_chart(group: str, points: list[Point]) -> Chart:
    """Decode-step time (x) against attention-output error (y), log-log, every method labelled,
    kvbits in red, the Pareto front (of the eager steps) as a step line; where a method's step can
    be replayed from a CUDA graph, that time too, hollow, joined to its eager point."""
    front = pareto_front(points)
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(6.4, 3.6), layout="constrained")
        ax = fig.subplots()
        xs, ys = [p.ms for p in front], [p.error for p in front]
        ax.step(xs, ys, where="post", color="#6e7781", linewidth=0.8, label="Pareto front")
        graphed = [p for p in points if p.graph_ms is not None]
        for point in points:
            color = KVBITS if _is_kvbits(point) else PEER
            ax.plot([point.ms], [max(point.error, 1e-12)], marker="o", markersize=4, color=color, linestyle="none")
            if point.graph_ms is not None:
                label = "replayed from a CUDA graph" if point is graphed[0] else None
                ax.plot([point.ms, point.graph_ms], [max(point.error, 1e-12)] * 2, color=color, linewidth=0.6,
                        linestyle=":", marker="o", markersize=4, markerfacecolor="none", markevery=[1],
                        label=label)
            label_point(ax, point.ms, max(point.error, 1e-12), point.method, color)
        finish_log_log(ax, "decode step, ms (median)", "attention-output error (relative RMS)")
    on_front = ", ".join(p.method for p in front)
    graphs = (f" Hollow, joined to its eager point: the step replayed from a CUDA graph "
              f"({', '.join(p.method for p in graphed)}; the others cannot be captured as they run)."
              if graphed else "")
    caption = (f"{len(points)} methods, eager steps; on the Pareto front (nothing both faster and more accurate): "
               f"{on_front}. Error against float64 attention on the original K/V.{graphs}")
    return Chart("tradeoff", "", clean_text(group), caption, figure_uri(fig),
                 f"decode step time against attention error for {len(points)} methods at {clean_text(group)}")


def tradeoff_charts(summary: Summary) -> list[Chart]:
    return [tradeoff_chart(group, points) for group, points in tradeoff_points(summary).items()]


def _bits_per_element(point: Point) -> float | None:
    """What one K or V element costs the method in bits, its scales and zeros included, from the
    bytes per token of its shape's kv heads (pareto_group's Hkv and D)."""
    found = GROUP.search(point.group)
    if point.bytes_per_token is None or not found:
        return None
    kv_heads, head_dim = int(found.group(1)), int(found.group(2))
    return 8 * point.bytes_per_token / (2 * kv_heads * head_dim)


def memory_rows(summary: Summary, model: dict = MODEL, memories_gb=MEMORIES_GB) -> list[dict]:
    """Per method (the first shape that has it): bits per stored element, bytes per token of
    ``model`` and the longest context of one sequence beside its weights in each memory."""
    rows: dict[str, tuple[float, dict]] = {}  # method -> (bits per element, its row)
    per_token_elements = 2 * model["layers"] * model["kv_heads"] * model["head_dim"]
    for points in tradeoff_points(summary).values():
        for point in points:
            bits = _bits_per_element(point)
            if point.method in rows or bits is None:
                continue
            per_token = bits / 8 * per_token_elements
            rows[point.method] = bits, {
                "method": point.method, "bits": fmt_sig(point.bits) if point.bits is not None else "",
                "bits_per_element": f"{bits:.2f}", "bytes_per_token": f"{per_token:,.0f}",
                "contexts": [f"{int((gb - model['weights_gb']) * 1e9 // per_token):,}" for gb in memories_gb],
            }
    return [row for _, row in sorted(rows.values(), key=lambda pair: pair[0])]


def _sig(value) -> str:
    number = to_float(value)
    return "" if number is None or not math.isfinite(number) else fmt_sig(number)


def method_rows(summary: Summary) -> list[dict]:
    """Per method (its first passed record of each kind): the serving batch's decode tokens per
    second, step median and p99 (ms) and storage (GB), and the attention error on real activations
    (mean over the layers, worst layer); blank where the method has no such record. The fastest
    server first, the methods without a serving record after them."""
    rows: dict[str, dict] = {}
    for _, record in summary.results.pairs():
        metrics, method = record.metrics, record.metrics.get("method")
        if record.outcome != "passed" or not method:
            continue
        row = rows.setdefault(str(method), dict.fromkeys(("serving", "ms", "p99_ms", "gb", "real", "real_max"), "")
                              | {"method": str(method)})
        served = to_float(metrics.get("tokens_per_s"))
        if served is not None and "tokens_per_s" not in row:
            nbytes = to_float(metrics.get("nbytes"))
            row.update(tokens_per_s=served, serving=f"{served:,.0f}", ms=_sig(metrics.get("ms")),
                       p99_ms=_sig(metrics.get("p99_ms")), gb=f"{nbytes / 1e9:.2f}" if nbytes else "")
        real = to_float(metrics.get("attn_rel_err_real"))
        if real is not None and not row["real"]:
            row.update(real=_sig(real), real_max=_sig(metrics.get("attn_rel_err_real_max")))
    kept = [row for row in rows.values() if row["serving"] or row["real"]]
    return sorted(kept, key=lambda row: (-row.get("tokens_per_s", -1.0), row["method"]))
