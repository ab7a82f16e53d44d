"""Byte units, one home: every module that prints or compares GiB or GB reads them here."""

GIB = 1 << 30  # GiB: what torch's memory counters and every memory report use
GB = 10**9  # GB: what GPU and host-memory datasheets quote
