"""Rule MEM003 in the search's counts: a plan within the GPU budget whose offloads the node's host cannot hold
(cpu_memory_per_node) is counted under MEM003, as `check` names it, not under the GPU's memory rule. Only a request
with a host limit has any; only the plans the search rejects are looked at, and a verdict the host stopped before
every pipeline stage was read is completed without the host only where the plan is counted."""

from __future__ import annotations

from collections import Counter

from meshplan.schema.reports import MemoryReport
from meshplan.search.policy import HOST_RULE


class HostCounts:
    """SearchPlans' MEM003 bookkeeping (its fields host_short, host_seen, gpu_over, count_host; fits() notes each
    plan it rejects under a host limit, the engine's counts move those only the host rejected)."""

    def host_rejected(self, key: tuple, report: MemoryReport | None) -> None:
        """Note a plan fits() rejected under a host limit unless its report or verdict has it over the GPU budget:
        in host_short, True where it is within the budget (only the host rejected it: MEM003), None where the host
        stopped its verdict before every pipeline stage was read (host_only settles it where it is counted); each
        note counted in host_seen. Only a request with cpu_memory_per_node asks, only of rejected plans."""
        if key not in self.host_short:
            known = self.caches.verdicts.get(key) if report is None else None
            if (report.fit_bytes if known is None else known.figure) > self.budget:  # type: ignore[union-attr]
                return
            # the host stopped the verdict before every stage was read only where it names a stage (`over`) and the
            # plan has more than one: a verdict that read them all (complete, or the RL actor engine's host over a GPU
            # fit: over None) has the GPU's whole figure, within the budget; one that read no GPU figure (the engine
            # refused the plan by a host it knew: not gpu_read) is settled by host_only where it is counted
            read_all = known is None or (known.gpu_read and (known.complete or known.over is None or key[0].pp == 1))
            self.host_short[key] = True if read_all else None
        self.host_seen += 1

    def host_recount(self, rejected: Counter, lay, mbs: int, stages, low: int, high: int) -> None:
        """Of the plans counted rejected under the memory rule, those of `stages` ((ZeRO stage, mask of the
        recomputes the rules pass) pairs) at recompute indices low..high-1 that only the host rejected are moved to
        MEM003 (host_only: a verdict the host stopped is completed without the host there, not counted as an estimate,
        so the search's estimate budget and what it ranks stay as they were); the caller asks only when host_short
        has any."""
        recomputes = self.recomputes
        moved = sum(1 for zero, mask in stages for i in range(low, high)
                    if mask >> i & 1 and self.host_only((lay, zero, recomputes[i], mbs)))
        if moved:
            rejected[self.engine.memory_rule] -= moved
            rejected[HOST_RULE] += moved

    def host_only(self, key: tuple) -> bool:
        """Whether only the host rejected the plan (host_short), a verdict the host stopped completed without it."""
        short = self.host_short.get(key, False)
        if short is None:
            checked = self.caches.checks.get(key, False) is None
            pp = key[0].pp
            verdict = self.engine.memory_fit(  # type: ignore[misc]
                self.job, self.plan(*key), self.budget, None, self.gpu_over.get(pp, 0), checked)
            if verdict.over is not None:
                self.gpu_over[pp] = verdict.over
            short = self.host_short[key] = verdict.complete
        return short
