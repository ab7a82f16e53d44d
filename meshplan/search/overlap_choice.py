"""moe_a2a_overlap where it changes the pipeline's schedule: the search times a plan both ways and keeps the faster.

Without a pipeline the EP overlap only hides all-to-all time (moe_time.overlapped_a2a exposes at most the plain
all-to-all), so the plan with it dominates the plan without and the search builds that one alone (plans.a2a_overlap).
With pp > 1 and no schedule named, Megatron-Core runs the overlap as the combined 1F1B schedule (Plan.runs_schedule):
each steady-state forward fused with the backward beside it, one more warm-up forward, and a fused step waits for both
inputs. Its bubble can outweigh what it hides: Mixtral-8x7B on 24 H100, TP2 PP3 VPP11 EP8 DP4, steps in 34.359 s with
the overlap and 34.266 s without (all-to-all 0.98 s inside the node, bubble 0.08 -> 1.13 s), so a search that took the
overlap as dominant ranked the slower one. Here a key's plan is the faster of the two (the overlap's where they tie):
its step's floor the least of both floors, its estimate the faster estimate. The bounds before the step's floor hold
for both, since their per-token references take the faster of the overlapped and the plain reference
(bounds._per_token: the plain one is the faster where it hides its all-to-all behind the shared experts,
adapter_knobs.shared_expert_overlap, which yields off beside the EP overlap) and the interleaved bubble (at most the
combined schedule's). The plain plan is only taken where it passes the structural rules too; its memory is
the overlap's (the memory estimate does not read the switch). The oracle (search/oracle.py) asks `plain_twin` too.
"""

from __future__ import annotations

from meshplan.schema.plan import Plan
from meshplan.schema.reports import ThroughputReport


class OverlapChoice:
    """SearchPlans' choice of moe_a2a_overlap where the combined schedule may be slower (its fields fixed, caches,
    calls and engine; plan(), a2a_overlap() and kept_terms() are SearchPlans')."""

    def plain_twin(self, lay, zero: int, recompute: str, mbs: int) -> Plan | None:
        """The plan without the EP overlap where the search would turn it on at pp > 1 with no schedule named (the
        overlap then runs the combined 1F1B schedule) and the plan without it passes the structural rules; else None
        (the overlap's plan is the key's, or the plain one already is)."""
        if lay.pp == 1 or lay.schedule or "moe_a2a_overlap" in self.fixed or not self.a2a_overlap(lay, zero, recompute):
            return None
        key = (lay, zero, recompute, mbs)
        twin = self.plain_twins.get(key, False)
        if twin is False:
            plain = self.plan(lay, zero, recompute, mbs, overlap=False)
            twin = self.plain_twins[key] = plain if self.engine.check(self.job, plain).ok else None
        return twin

    def twin_bound(self, key: tuple) -> float:
        """A lower bound of the step of the key's plain twin (a plan without the EP overlap, at most its step's floor):
        none here; the search's bounds give one (bounds.StepTimeBounds)."""
        return 0.0

    def least_floor(self, key: tuple, floor: float) -> float:
        """The step's floor of the key's plan (`floor`: the overlap's), or of its plain twin where that is less; the
        twin's terms are not worked out where its bound (twin_bound) is at least `floor`: the least is then `floor`,
        or the twin's floor where that is as much (DeepSeek-V3 on 2,048 H100: 139 of 149 twins' terms)."""
        twin = self.plain_twin(*key)
        if twin is None:
            return floor
        terms = self.caches.plain_terms.get(key)
        if terms is None:
            if self.twin_bound(key) >= floor:
                return floor
            self.calls["throughput"] += 1
            terms = self.caches.plain_terms[key] = self.kept_terms("plain terms", key, lambda: twin)
        return min(floor, terms.floor)

    def faster(self, key: tuple, report: ThroughputReport) -> ThroughputReport:
        """The key's estimate (`report`: the overlap's plan's), or its plain twin's where that is faster."""
        twin = self.plain_twin(*key)
        if twin is None:
            return report
        terms = self.caches.plain_terms.pop(key, None)
        if terms is None and self.twin_bound(key) >= report.step_time_s:  # not faster (a tie keeps the overlap's)
            return report
        if terms is not None and self.engine.finish is not None:
            plain = self.engine.finish(terms)
        else:
            self.calls["throughput"] += 1
            plain = self.engine.throughput(self.job, twin)
        return plain if plain.step_time_s < report.step_time_s else report
