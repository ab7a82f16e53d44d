"""The search's policy: what fits (one headroom), what "X% slower" means, when two plans are the same row, the
bounds it runs under (cards/search.yaml) and the SEARCH-* buckets it counts unranked plans in.

One headroom policy: a layout fits when its peak is at most capacity x (1 - headroom), headroom being the request's
or MEM002's min_headroom_fraction (cards/rules.yaml). The ranking, the answer when nothing keeps it, the warning about
a much faster layout it excludes, and the smallest-GPU-count scan (`minimum_gpus`) all use that one threshold.
check and memory read the same one (check/memory.headroom_threshold): a headroom the request gives is required there
too (memory's `fits`, MEM001); left out, `fits` means within capacity and MEM002 warns below the default.
"""

from __future__ import annotations

import math

from meshplan.check.split import headroom_threshold
from meshplan.estimate.memory import budget_bytes
from meshplan.rules.engine import memory_rules, rule_specs
from meshplan.schema.plan import Job
from meshplan.schema.reports import MemoryReport, MemorySummary
from meshplan.schema.request import Request
from meshplan.search.space import SearchComparison, SearchLimits, search_card

# Buckets for variants that no rule rejected but the search did not rank (ids never change meaning).
SLOWER = "SEARCH-SLOWER"  # valid or not yet checked, but its optimistic time is behind the top K
HEADROOM_RULE = "MEM002"  # cards/rules.yaml: fits, but with less than the minimum headroom
HOST_RULE = "MEM003"  # cards/rules.yaml: fits the GPU, but the node's host cannot hold what the plan offloads
ADAPTER_RULE = "AD001"  # cards/rules.yaml: the adapter has no key for a layout setting (space.adapter_refused_zeros)
DOMINATED = "SEARCH-DOMINATED"  # the same layout fits with less recompute, which is faster
NVLINK = "SEARCH-NVLINK"  # TP beyond the NVLink domain, not searched because layouts inside it fit
BUDGET = "SEARCH-BUDGET"  # not reached before the estimate budget ran out (cards/search.yaml max_evaluations)
UNTIMED = "SEARCH-UNTIMED"  # passes the rules but the cost model cannot time it (its reason is a warning)
SAME = "SEARCH-SAME"  # same predicted step time and memory as a ranked layout: folded into its row
SAME_STAGE = "SEARCH-SAME-STAGE"  # a ZeRO stage that is one plan with the one offered at its layout (zero_stages)
HEAVIER_STAGE = "SEARCH-HEAVIER-STAGE"  # the same layout at another ZeRO stage: no slower step, a lower peak
SEARCH_BUCKETS = {
    SLOWER: "not ranked: its optimistic step time (or its predicted one) is slower than the top K",
    DOMINATED: "not ranked: the same layout fits with less recompute, which is faster",
    NVLINK: "not searched: TP beyond the NVLink domain, and layouts inside the domain fit",
    BUDGET: "not reached before the search's budget of estimates ran out (cards/search.yaml max_evaluations)",
    UNTIMED: "passes the rules, but the throughput model cannot time it (reason in the warnings)",
    SAME: "folded into a ranked row: the same predicted step time and peak memory (listed in its equivalents)",
    SAME_STAGE: "not searched apart: a ZeRO stage that is the same plan at its layout as the stage offered there (its "
                "sharded states split over one rank: the same bytes and step; the row names it)",
    HEAVIER_STAGE: "not ranked: the same layout, micro-batch and recompute at another ZeRO stage runs the same "
                   "predicted step or a faster one with a lower peak (another engine or convention, e.g. "
                   "Megatron-FSDP beside the distributed optimizer at dp x cp 1, where it shards nothing, or "
                   "Megatron-Core's ZeRO 0 beside its distributed optimizer; the row names it)",
}
TIE = 1e-9  # relative step-time difference under which two plans have the same predicted numbers


def search_limits() -> SearchLimits:
    """The search's work bounds (cards/search.yaml `limits`): counts of estimates and GPU counts, never time."""
    return search_card().limits


def search_comparison() -> SearchComparison:
    """The thresholds for comparing layouts (cards/search.yaml `comparison`)."""
    return search_card().comparison


def slower_by(tokens_per_s: float, reference: float) -> float:
    """The one meaning of "X% slower" in every answer: the share of the reference's throughput a layout loses,
    1 - tokens_per_s / reference (0.25: a quarter fewer tokens/s/GPU, a step 1/0.75 = 1.33x as long). Both are
    compared at the same global batch on the same GPUs, so this is also 1 - t_reference / t_layout; it never
    exceeds 100%."""
    return 1.0 - tokens_per_s / reference if reference > 0 else 0.0


def same_numbers(time_s: float, peak_bytes: int) -> tuple[float, int]:
    """Plans with this key are indistinguishable to the cost model (e.g. a factor moved between CP and the
    micro-batch): one ranked row, not several."""
    return float(f"{time_s:.9g}"), peak_bytes


def heavier_twin(time_s: float, peak_bytes: int, other_time_s: float, other_peak_bytes: int) -> bool:
    """Whether a plan is dominated by its twin, the same layout, micro-batch and recompute at another ZeRO stage:
    a predicted step no faster (same_numbers' step time) and a strictly higher peak. A user gains nothing by running
    it (Megatron-FSDP at dp x cp 1 shards nothing and holds its own buffers: Llama-3.1-8B PP7 DP1 on 7 H100, 54.6 GiB
    beside the distributed optimizer's 50.0 at the same 52.05 s; Megatron-Core's ZeRO 0 on 8 H100 at TP1 PP4 VPP3
    DP2, 62.9 GiB at 46.09 s beside ZeRO 1's 50.2 GiB at 46.08 s), so the search and the oracle both leave it out,
    SEARCH-HEAVIER-STAGE, and the row it loses to names it with its step. A twin that is faster with more memory is
    a trade a user may take: a row of its own, as the fastest K are."""
    return same_numbers(time_s, 0)[0] >= same_numbers(other_time_s, 0)[0] and peak_bytes > other_peak_bytes


def min_headroom_fraction() -> float:
    """The free share of memory a recommended layout keeps: MEM002's threshold, so rules and search agree."""
    return float(rule_specs()[HEADROOM_RULE].params["min_headroom_fraction"])


def headroom_for(req: Request) -> float:
    """The headroom this request is answered with: its own, else MEM002's default (check's threshold too)."""
    return headroom_threshold(req.headroom)


def memory_budget(job: Job, headroom: float) -> int:
    """Bytes a layout may use and still count as fitting: capacity x (1 - headroom), as memory's `fits` counts it."""
    return budget_bytes(job.gpu.memory_bytes, headroom)


def headroom_that_ranks(memory: MemoryReport | MemorySummary) -> float:
    """The headroom under which a layout with this memory is ranked: its free share of the GPU, rounded down to
    0.001 so that passing it as `headroom` keeps the layout inside the budget."""
    return math.floor(memory.headroom_bytes / memory.capacity_bytes * 1000) / 1000


def memory_rule_id() -> str:
    """The rules card's 'does not fit' error id (the memory rule with severity error)."""
    errors = sorted(r for r in memory_rules() if rule_specs()[r].severity == "error")
    return errors[0] if errors else "MEM001"


def budget_cut(max_evaluations: int) -> str:
    """What an answer cut by the estimate budget (`max_evaluations`, the search's) says (a warning and an assumption):
    a count of work, the same on every machine, so the cut answer is still a pure function of the request."""
    return (f"The search stopped at its budget of {max_evaluations:,} memory and throughput estimates "
            "(cards/search.yaml max_evaluations) before the queue was exhausted: the ranked layouts are the fastest "
            "found within it, not proven optimal. Fix more fields (tp, pp, ep, micro_batch_size, ...) to shrink the "
            "space.")
