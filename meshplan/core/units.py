"""Byte units, one home: every module that prints or compares GiB or GB reads them here."""

GIB = 1 << 30  # GiB: what torch's memory counters and every memory report use
GB = 10**9  # GB: what GPU and host-memory datasheets quote


def gib(nbytes: float) -> str:
    """Bytes as GiB to one decimal, with the unit ('12.3 GiB'): how findings, refusals and MCP summaries word them."""
    return f"{nbytes / GIB:.1f} GiB"
