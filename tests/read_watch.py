"""A plan that notes which of its fields are read: the memo tests hold a memo's key to the fields its formulas read
(memory.ENGINE_FIELDS, perf.FACT_READS) by watching the reads."""

from __future__ import annotations


class ReadPlan:
    """Wraps a plan; every attribute read is noted in `read` and answered by the plan."""

    def __init__(self, plan):
        self._plan, self.read = plan, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._plan, name)
