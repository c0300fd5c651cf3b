"""Output quality on a real decoder beside bytes per token: per protocol of the quality benchmark
(``suites/test_bench_quality.py``), a chart of each cache's mean KL divergence from the fp32
cache against the bytes a token takes, with the quality/size Pareto front, and a table of every
cache's and emulated scheme's figures.

Read from the benchmark's records: ``metrics["caches"]`` maps a cache's name (or an emulated
scheme's label) to its figures (``perplexity``, ``perplexity_change``, ``kl``, ``top1``,
optionally ``greedy_matched`` and ``bytes_per_token``, which emulated schemes lack), and
``metrics["protocol"]`` says what was scored. A record without them gives nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from .charts import RC, Chart, figure_uri  # noqa: E402
from .fmt import clean_text, fmt_sig, to_float  # noqa: E402
from .summary import Summary  # noqa: E402
from .tradeoff import KVBITS, PEER, finish_log_log, label_point, lower_front  # noqa: E402

REFERENCE = "full"  # the cache every KL is measured against: no point on a log scale


@dataclass(frozen=True)
class Entry:
    name: str
    perplexity_change: float
    kl: float
    top1: float
    greedy: float | None
    bytes_per_token: float | None  # None: an emulated scheme


@dataclass(frozen=True)
class Protocol:
    """One benchmark case: its label (the test's case), what it scored, its entries."""

    case: str
    protocol: str
    entries: list[Entry]


def _entry(name: str, figures) -> Entry | None:
    if not isinstance(figures, dict):
        return None
    values = [to_float(figures.get(k)) for k in ("perplexity_change", "kl", "top1")]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    size = to_float(figures.get("bytes_per_token"))
    return Entry(str(name), *values, to_float(figures.get("greedy_matched")), size if size and size > 0 else None)


def quality_protocols(summary: Summary) -> list[Protocol]:
    """The passed quality-benchmark records, one per case, in case order."""
    found: dict[str, Protocol] = {}
    for _, record in summary.results.pairs():
        caches = record.metrics.get("caches")
        if record.outcome != "passed" or not isinstance(caches, dict):
            continue
        entries = [e for e in (_entry(n, f) for n, f in caches.items()) if e is not None]
        if entries:
            found.setdefault(record.case, Protocol(record.case, str(record.metrics.get("protocol", "")), entries))
    return [found[case] for case in sorted(found)]


def quality_front(entries: list[Entry]) -> list[Entry]:
    """The real caches that no other beats in both bytes per token and KL, smallest first."""
    sized = [e for e in entries if e.bytes_per_token is not None and e.name != REFERENCE]
    return lower_front(sized, lambda e: e.bytes_per_token, lambda e: e.kl)


def quality_chart(protocol: Protocol) -> Chart | None:
    """Bytes per token (x) against mean KL from the fp32 cache (y), log-log, every real cache
    labelled, kvbits in red, the Pareto front as a step line. None when no cache has both."""
    points = [e for e in protocol.entries if e.bytes_per_token is not None and e.name != REFERENCE]
    if not points:
        return None
    floor = min((e.kl for e in points if e.kl > 0), default=1e-6) / 2  # fp16's KL can round to 0
    front = quality_front(points)
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(6.4, 3.6), layout="constrained")
        ax = fig.subplots()
        ax.step([e.bytes_per_token for e in front], [max(e.kl, floor) for e in front], where="post",
                color="#6e7781", linewidth=0.8, label="Pareto front")
        for entry in points:
            color = KVBITS if entry.name.startswith("kvbits") else PEER
            y = max(entry.kl, floor)
            ax.plot([entry.bytes_per_token], [y], marker="o", markersize=4, color=color, linestyle="none")
            label_point(ax, entry.bytes_per_token, y, entry.name, color)
        finish_log_log(ax, "bytes per token, all layers", "mean KL from the fp32 cache, nats")
    caption = (f"{len(points)} caches; on the Pareto front (nothing both smaller and closer to fp32): "
               f"{', '.join(e.name for e in front)}. {protocol.protocol}.")
    return Chart("quality", "", clean_text(protocol.case), clean_text(caption), figure_uri(fig),
                 f"mean KL divergence against bytes per token for {len(points)} caches, {clean_text(protocol.case)}")


def quality_charts(summary: Summary) -> list[Chart]:
    return [c for c in (quality_chart(p) for p in quality_protocols(summary)) if c is not None]


def quality_rows(protocol: Protocol) -> list[dict]:
    """Table rows: the real caches by bytes per token, then the emulated schemes by KL."""
    real = sorted((e for e in protocol.entries if e.bytes_per_token is not None), key=lambda e: e.bytes_per_token)
    emulated = sorted((e for e in protocol.entries if e.bytes_per_token is None), key=lambda e: e.kl)
    return [{"name": e.name, "kind": "cache" if e.bytes_per_token is not None else "emulated",
             "bytes_per_token": "" if e.bytes_per_token is None else f"{e.bytes_per_token:,.0f}",
             "perplexity_change": f"{100 * e.perplexity_change:+.2f}%", "kl": fmt_sig(e.kl, 3),
             "top1": f"{e.top1:.3f}", "greedy": "" if e.greedy is None else f"{e.greedy:.1f}"}
            for e in [*real, *emulated]]
