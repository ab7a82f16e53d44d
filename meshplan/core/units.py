"""Byte units, one home: every module that prints or compares GiB or GB reads them here; and the few other small
wording helpers every layer shares."""

import math

GIB = 1 << 30  # GiB: what torch's memory counters and every memory report use
GB = 10**9  # GB: what GPU and host-memory datasheets quote
TERA = 10**12  # TFLOP/s: what the frameworks log a GPU's model FLOP rate in
GBIT_BYTES = 10**9 / 8  # bytes/s in one Gb/s: the decimal gigabits a NIC's or a cluster's datasheet quotes


def gib(nbytes: float) -> str:
    """Bytes as GiB to one decimal, with the unit ('12.3 GiB'): how findings, refusals and MCP summaries word them."""
    return f"{nbytes / GIB:.1f} GiB"


def percent(fraction: float, digits: int = 3) -> str:
    """A fraction as a percentage to `digits` significant figures (0.1 -> '10%', 0.032 -> '3.2%') that never rounds
    to a misleading 0% or 100%: a fraction strictly between 0 and 1 gets the decimals it needs to stay off both
    (0.999999 -> '99.9999%'), up to six; past that it is bounded ('>99.999999%', '<0.000001%') rather than rounded
    onto the end it does not reach."""
    value = fraction * 100
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}%"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    while 0 < fraction < 1 and not 0 < round(value, decimals) < 100:
        decimals += 1
    if decimals > 6:
        return (">99.999999%" if fraction > 0.5 else "<0.000001%") if 0 < fraction < 1 else f"{value:.1e}%"
    text = f"{value:.{decimals}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "%"


def si_count(n: float, unit: str) -> str:
    """A count to three significant figures with its SI prefix ('4.19M tokens', '2.1M tokens', '1.02T tokens'), so a
    large number never reads as a long run of digits before an 'M'."""
    rounded = float(f"{n:.3g}")
    for scale, prefix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(rounded) >= scale:
            text = f"{rounded / scale:,.{max(0, 3 - len(str(int(abs(rounded / scale)))))}f}"
            return (text.rstrip("0").rstrip(".") if "." in text else text) + f"{prefix} {unit}"
    return f"{n:,.0f} {unit}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 count', '2 counts' (`many` for an irregular plural), the count written with thousands separators."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def either_or(values: list) -> str:
    """Alternatives in words: '3', '0 or 3', '0, 1 or 3'."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
