"""The timing distribution (harness.measure.timing): what a timed call keeps of its repeats, on CPU."""

from __future__ import annotations

import time

import pytest

from harness.measure import timing
from harness.measure.timing import Timing


def test_a_timing_summarizes_its_repeats():
    t = Timing.of([5.0, 1.0, 3.0, 2.0, 100.0])
    assert (t.n, t.median, t.min) == (5, 3.0, 1.0)
    assert t.iqr == pytest.approx(5.0 - 2.0)  # quartiles 2 and 5 (inclusive method)
    assert t.mad == 2.0  # deviations 2, 2, 0, 1, 97: an outlier moves neither median nor MAD
    assert t.metrics() == {"ms_n": 5, "ms_min": 1.0, "ms_iqr": pytest.approx(3.0), "ms_mad": 2.0}
    assert Timing.of([0.25]) == Timing(1, 0.25, 0.25, 0.0, 0.0)
    with pytest.raises(ValueError, match="at least one sample"):
        Timing.of([])


def test_timings_scale_and_add():
    quant, dequant = Timing.of([1.0, 1.1, 1.2]), Timing.of([2.0, 2.2, 2.4, 2.6])
    pair = quant.plus(dequant)
    assert pair.median == pytest.approx(quant.median + dequant.median)
    assert (pair.n, pair.min) == (3, pytest.approx(3.0))
    assert pair.mad == pytest.approx(quant.mad + dequant.mad) and pair.iqr == pytest.approx(quant.iqr + dequant.iqr)
    half = dequant.scaled(0.5)
    assert (half.median, half.min, half.iqr, half.mad, half.n) == pytest.approx(
        (dequant.median / 2, 1.0, dequant.iqr / 2, dequant.mad / 2, 4))
    assert quant.metrics("quant_ms")["quant_ms_mad"] == pytest.approx(0.1)


def test_a_call_timed_on_cpu_keeps_its_wall_clock_repeats():
    def sleepy():
        time.sleep(0.002)

    t = timing.time_call(sleepy, rep_ms=30)
    assert 3 <= t.n <= 20 and 2.0 <= t.min <= t.median < 10.0
    assert t.iqr >= 0 and t.mad >= 0
    assert timing.median_ms(sleepy, rep_ms=10) >= 2.0


def test_graph_replay_on_cpu_is_per_call():
    calls = [lambda: time.sleep(0.001)] * 4
    t = timing.graph_replay_timing(calls, rep_ms=5)
    assert 1.0 <= t.min <= t.median < 4.0  # one pass of four calls, divided by four
    assert timing.graph_replay_ms(calls, rep_ms=5) == pytest.approx(t.median, rel=1.0)
    with pytest.raises(ValueError, match="at least one callable"):
        timing.graph_replay_timing([])


def test_bound_on_cpu_and_the_host_bound_rule():
    assert timing.bound_metrics(lambda: None, 0.01) == {"bound": "cpu"}
    assert timing.bound_metrics(lambda: None, 0.01, device="cpu") == {"bound": "cpu"}
    ratio = timing.HOST_BOUND_RATIO
    assert timing.classify_bound(0.030, 0.005) == "host"  # launch cost far over the kernel's time
    assert timing.classify_bound(ratio * 0.1, 0.1) == "host"
    assert timing.classify_bound(0.5 * ratio * 0.1, 0.1) == "device"


def test_bound_on_a_gpu_weighs_the_devices_idle_time(monkeypatch):
    """The host's issue time decides when it is well under the figure; otherwise (a slow host, or a
    call that waits for the device) the device's idle time inside the figure does."""
    monkeypatch.setattr(timing, "_on_gpu", lambda device=None: True)
    for host, busy, figure, bound in ((0.01, None, 1.0, "device"),    # the host keeps well ahead
                                      (0.045, 0.005, 0.05, "host"),    # the device idles 90% of the figure
                                      (2.5, 2.4, 2.5, "device"),       # a read-back: the host waits on the device
                                      (0.045, None, 0.05, "host")):    # no profiler: the host's time decides
        monkeypatch.setattr(timing, "host_issue_ms", lambda fn, h=host: h)
        monkeypatch.setattr(timing, "device_busy_ms", lambda fn, b=busy: b)
        found = timing.bound_metrics(lambda: None, figure)
        assert found["bound"] == bound and found["host_ms"] == host
        assert found.get("busy_ms") == (busy if host >= timing.HOST_BOUND_RATIO * figure else None)
