"""Number parsing and formatting shared by the HTML page, the text and Markdown summaries."""

from __future__ import annotations

import functools
import math
import re

# Control characters (illegal in XML 1.0, noisy in HTML) and lone surrogates (a JSON string may
# hold them, but no UTF-8 file can).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def to_float(value) -> float | None:
    """A metric as float: numbers and the strings "nan"/"inf" (how records store them); else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def non_finite(number: float) -> str:
    """The one spelling of a non-finite value in every table and summary: NaN, inf or -inf."""
    if math.isnan(number):
        return "NaN"
    return "inf" if number > 0 else "-inf"


def finite_only(fmt):
    """A formatter of finite numbers made a formatter of any metric value: "" for what is no
    number, the one spelling of a non-finite one (:func:`non_finite`), else ``fmt(number)``."""

    @functools.wraps(fmt)
    def formatted(value, *args, **kwargs) -> str:
        number = to_float(value)
        if number is None:
            return ""
        return fmt(number, *args, **kwargs) if math.isfinite(number) else non_finite(number)

    return formatted


def clean_text(text, limit: int | None = None) -> str:
    """Printable text: control characters and lone surrogates replaced, so that it can be
    written as UTF-8 HTML, Markdown or XML."""
    text = _CONTROL.sub("\N{REPLACEMENT CHARACTER}", "" if text is None else str(text))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "\N{HORIZONTAL ELLIPSIS}"
    return text


def first_line(text, limit: int = 160) -> str:
    """The most telling line of a failure message: the first ``E   ...`` line, else the last
    non-blank line."""
    if not text:
        return ""
    lines = [line for line in str(text).splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    line = errors[0] if errors else (lines[-1].strip() if lines else "")
    return clean_text(line, limit)


@finite_only
def fmt_count(number: float) -> str:
    if abs(number) < 1e6:
        return f"{int(number):,}" if number == int(number) else f"{number:,.2f}"
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(number) >= scale:
            return f"{number / scale:.3g}{suffix}"
    return str(number)  # pragma: no cover


@finite_only
def fmt_err(number: float) -> str:
    if number == 0:
        return "0"
    return f"{number:.2e}"


@finite_only
def fmt_sig(number: float, digits: int = 3) -> str:
    """Three significant digits without exponent for everyday magnitudes (ms, GB/s)."""
    if number == 0:
        return "0"
    if abs(number) >= 10 ** digits:
        return f"{number:,.0f}"
    if abs(number) < 1e-3:
        return f"{number:.2e}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(number)))))
    return f"{number:.{decimals}f}"


@finite_only
def fmt_ratio(number: float) -> str:
    """An error-to-tolerance ratio to three significant digits, rounded away from 1: a case within
    its tolerance never reads 1.00 (0.99999 is 0.999), one past it never does either (1.0001 is 1.01)."""
    if number <= 0 or number < 1e-300:  # no digits to round away from 1 (and 10 ** 300 overflows)
        return fmt_sig(number)
    scale = 10 ** (2 - math.floor(math.log10(number)))
    scaled = round(number * scale, 6)  # float noise (15.499999999) is no step away from 1
    return fmt_sig((math.floor(scaled) if number < 1 else math.ceil(scaled)) / scale)


@finite_only
def fmt_pct(number: float) -> str:
    return f"{number:.1f}%"


@finite_only
def fmt_x(number: float) -> str:
    return f"{fmt_sig(number)}\N{MULTIPLICATION SIGN}"


@finite_only
def fmt_signed_pct(number: float) -> str:
    return f"{number:+.1f}%"


@finite_only
def fmt_duration(number: float) -> str:
    """Seconds as ms, s, minutes or hours."""
    if number == 0:
        return "0"
    if number < 1:
        return f"{number * 1e3:.0f} ms" if number >= 1e-3 else f"{number * 1e3:.2f} ms"
    if number < 60:
        return f"{number:.1f} s"
    minutes, rest = divmod(int(round(number)), 60)
    if minutes < 60:
        return f"{minutes}m {rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def fmt_metric(name: str, value) -> str:
    """A standard metric formatted the way its column expects."""
    if name in ("max_abs_err", "max_rel_err"):
        return fmt_err(value)
    if name in ("states_checked", "elements_checked", "bit_errors"):
        return fmt_count(value)
    if name == "pct_of_peak":
        return fmt_pct(value)
    if name in ("ms", "gbps"):
        return fmt_sig(value)
    if name == "duration_s":
        return fmt_duration(value)
    number = to_float(value)
    return fmt_sig(number) if number is not None else clean_text(value, 80)
