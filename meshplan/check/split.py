"""The pipeline splits a framework can be told for one pp, and the fastest of them for a fixed layout.

`pipeline_options` is the pipeline part of the search's space (meshplan/search/space.py enumerates it for every pp);
`fastest_split` ranks those options at one fixed layout by the same estimates recommend ranks by, so that the split
`meshplan check` names (PP001's fix, MEM001's deeper-pipeline alternatives) is the one recommend ranks first for that
layout (issue 23).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import NamedTuple

from meshplan.arithmetic.schedule import (
    VirtualSplit,
    end_light_splits,
    pipeline_split,
    split_problem,
    virtual_split,
)
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import budget_bytes
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.cards import FrameworkCard
from meshplan.knowledge.gdn_config import pipeline_unit, split_layers
from meshplan.rl.memory import job_memory
from meshplan.rules.engine import rule_specs
from meshplan.rules.fix_values import divisors
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan


def headroom_threshold(asked: float | None) -> float:
    """The free share of GPU memory a plan should keep: the request's headroom (then `fits` requires it, MEM001), else
    MEM002's min_headroom_fraction (a warning). MEM002 (check/memory.py), recommend (search/policy.py headroom_for) and
    fastest_split read this one."""
    return float(rule_specs()["MEM002"].params["min_headroom_fraction"]) if asked is None else float(asked)


class PipelineOption(NamedTuple):
    vpp: int
    first: int | None  # first_stage_layers (per pipeline rank)
    last: int | None  # last_stage_layers
    split: VirtualSplit | None = None  # or the split per virtual stage (embedding/loss counted, an explicit layout)


@cache
def megatron_uneven(framework: str) -> bool:
    """Whether the framework splits an uneven pipeline the Megatron-Core way, interleaving included: there rule
    PP004 is the law, and every split it accepts is one the search may enumerate."""
    return rule_specs()["PP004"].applies_to(framework, "megatron")


def pipeline_options(num_layers: int, pp: int, interleave: bool, uneven_interleave: bool,
                     fixed_split: tuple[int | None, int | None] | None = None, *, layouts: bool = False,
                     mtp_layers: int = 0, own_partition: bool = False) -> tuple[PipelineOption, ...]:
    """(vpp, first, last, split) the search tries for one pp: for each vpp dividing the layers (every part of a split
    is a multiple of vpp), the split schedule.pipeline_split chooses. Where the framework splits unevenly the
    Megatron-Core way (`uneven_interleave`, rule PP004 its law) also, without interleaving, every first/last of
    schedule.end_light_splits (the end stages, which also hold the embedding and the loss, lighter; every other
    stage at the fewest layers the heaviest can hold); where it takes an explicit layout (`layouts`: Megatron's
    pipeline_model_parallel_layout and account_for_embedding/loss_in_pipeline_split), every end_light_splits split
    over pp x vpp virtual stages at any vpp, as the embedding/loss counted or a layout string (schedule.virtual_split,
    its MTP layers with the loss). A user's first/last stays as given: with vpp 1 even when invalid (so a rule can
    say why), and with every vpp > 1 that PP004 accepts. A framework that partitions the layers itself
    (`own_partition`: its card's pipeline.partition, DeepSpeed's) can be told no split: its one option is no split
    (schedule.own_stages gives its counts), at any vpp that splits every stage evenly."""
    if fixed_split is not None:
        first, last = fixed_split
        out: list[PipelineOption] = [PipelineOption(1, first, last)]
        if interleave and uneven_interleave and pp > 1:
            out += [PipelineOption(v, first, last) for v in divisors(num_layers)[1:]
                    if not split_problem(num_layers, pp, v, first, last)]
        return tuple(out)
    if pp > num_layers:
        return ()
    if own_partition:
        return tuple(PipelineOption(v, None, None) for v in (divisors(num_layers) if pp > 1 and interleave else [1])
                     if v == 1 or num_layers % (pp * v) == 0)
    out = []
    for v in divisors(num_layers) if pp > 1 and interleave else [1]:
        split = pipeline_split(num_layers, pp, v)
        if split is not None and (v == 1 or split == (None, None) or uneven_interleave):
            out.append(PipelineOption(v, *split))
    if pp > 1 and uneven_interleave:
        out += [PipelineOption(1, a, b) for a, n, b in end_light_splits(num_layers, pp)
                if a and b and not a == n == b and chosen_split(a, n, b) and PipelineOption(1, a, b) not in out]
    if pp > 1 and layouts:
        for v in range(1, (num_layers + 2) // pp + 1) if interleave else (1,):
            for a, n, b in end_light_splits(num_layers, pp * v):
                if (v == 1 and a and b) or a == n == b or not chosen_split(a, n, b):
                    continue  # first/last says it, the even split, or a split no knob or recipe helper writes
                out.append(PipelineOption(v, None, None, virtual_split(num_layers, pp, v, a, b, mtp_layers)))
    return tuple(out)


def model_pipeline_options(arch: Architecture, pp: int, interleave: bool, uneven_interleave: bool,
                           fixed_split: tuple[int | None, int | None] | None = None, *, layouts: bool = False,
                           own_partition: bool = False) -> tuple[PipelineOption, ...]:
    """pipeline_options over the layers the framework's split counts (gdn_config.split_layers), each option's sizes in
    the model's own layers: a Gated DeltaNet hybrid's options are whole decoder layers, two pattern layers each (its
    GPTModel's TransformerLayers: rule PP017 refuses a split of an odd number of pattern layers), its layout strings
    and accounting told in decoder layers as they are (schedule.explicit_stages). A split the request fixes is kept in
    the model's layers as given."""
    unit = pipeline_unit(arch)
    if unit == 1 or fixed_split is not None:
        return pipeline_options(arch.num_layers, pp, interleave, uneven_interleave, fixed_split, layouts=layouts,
                                mtp_layers=arch.num_mtp_layers, own_partition=own_partition)
    return tuple(PipelineOption(
        o.vpp, None if o.first is None else o.first * unit, None if o.last is None else o.last * unit,
        None if o.split is None else replace(o.split, counts=tuple(n * unit for n in o.split.counts)))
        for o in pipeline_options(split_layers(arch), pp, interleave, uneven_interleave, layouts=layouts,
                                  mtp_layers=arch.num_mtp_layers, own_partition=own_partition))


def chosen_split(first: int, middle: int, last: int) -> bool:
    """Whether an end_light_splits entry is one a framework's own knob or a published recipe's helper writes: the
    embedding and/or the loss counted as one layer (Megatron-Core's account_for_embedding/loss_in_pipeline_split:
    each end one layer lighter at most), or every virtual stage filled in order and the rest on the last (Megatron-
    Bridge's _get_deepseek_v3_pipeline_layout / _get_kimi_k2_pipeline_layout tables and the DeepSeek-V3 perf
    recipes' strings: 16,16,16,13; 4 x 15 + 1; E+t | (tt|)*30 | mL). The entries between, each one layer moved
    between the two ends, are left out: no framework or recipe writes them, and each would cost the search a layout
    per (pp, vpp) and degree."""
    return first == min(middle, first + last) or (middle - first <= 1 and middle - last <= 1)


def writes_layouts(card: FrameworkCard) -> bool:
    """Whether the framework's adapter (its default version) writes an explicit pipeline layout and the
    embedding/loss accounting (cards/frameworks/*.yaml adapter knobs pipeline_layout, account_for_*)."""
    section = card.adapter
    if section is None:
        return False
    knobs_ = section.versions[section.default_version].knobs
    return all(knobs_.get(name) is not None and knobs_[name].key is not None
               for name in ("pipeline_layout", "account_for_embedding", "account_for_loss"))


def framework_options(job: Job, pp: int) -> tuple[PipelineOption, ...]:
    """The options the search enumerates for this job's model and framework at `pp` (no split fixed)."""
    arch = job.model
    card = job.card
    return model_pipeline_options(arch, pp, bool(card.search.vpp), megatron_uneven(job.framework),
                                  layouts=writes_layouts(job.card), own_partition=own_partition(card))


def own_partition(card: FrameworkCard) -> bool:
    """Whether the framework partitions the pipeline's layers itself, so no split can be told it (its card's
    pipeline.partition)."""
    return card.pipeline.partition != "told"


def with_option(plan: Plan, option: PipelineOption) -> Plan:
    """The plan with this pipeline option in place of its own split (vpp included)."""
    split = option.split.fields() if option.split is not None else {
        "pipeline_layout": None, "account_for_embedding": False, "account_for_loss": False}
    return plan.model_copy(update={"vpp": option.vpp, "first_stage_layers": option.first,
                                   "last_stage_layers": option.last, **split})


def split_words(plan: Plan) -> str:
    """How a plan's split is set, in request fields."""
    if plan.pipeline_layout is not None:
        return f'pipeline_layout="{plan.pipeline_layout}"'
    if plan.account_for_embedding or plan.account_for_loss:
        return ", ".join(f"account_for_{name}=true" for name, on in (("embedding", plan.account_for_embedding),
                                                                         ("loss", plan.account_for_loss)) if on)
    if plan.first_stage_layers is not None or plan.last_stage_layers is not None:
        return f"first_stage_layers={plan.first_stage_layers}, last_stage_layers={plan.last_stage_layers}"
    return "the even split"


def layout_cells(plans: list[Plan]) -> list[str]:
    """Each row's layout as a table or a list names it: its degrees (Plan.short), and its pipeline split where another
    row reads the same in degrees, micro-batch, ZeRO stage and recompute (the search ranks, and keeps as closest
    misses, each split of one layout as a row of its own: two 'TP1 PP7 DP1' rows, mbs 1, ZeRO 3, full recompute, at
    150.47 and 155.23 GiB differed only in first/last stage layers). The split is written as request fields, without
    the comma a list of folded plans separates them with."""
    def cells(p: Plan) -> tuple:
        return p.short(), p.micro_batch_size, p.zero_stage, p.recompute

    # only where the split tells such rows apart: two RL rows alike but for the rollout engine both ran the even split
    # of one stage, and each read 'TP1 PP1 DP8 the even split'
    splits: dict[tuple, set[str]] = {}
    for p in plans:
        splits.setdefault(cells(p), set()).add(split_words(p))
    return [f"{p.short()} {split_words(p).replace(', ', ' ')}" if len(splits[cells(p)]) > 1 else p.short()
            for p in plans]


class SplitChoice(NamedTuple):
    """split_choice's answer: the plan with its split, whether it fits, and the bytes that decide the fit."""

    plan: Plan
    fits: bool
    fit_bytes: int


def fastest_split(job: Job, plan: Plan) -> Plan | None:
    """The plan with the split recommend ranks first for its fixed layout (every other field kept, vpp too): of the
    search's options at this pp and vpp (pipeline_options), the fastest by estimate_throughput among those the rules
    pass (the estimators refuse what they refuse) and that fit the memory recommend ranks by (capacity less the
    request's headroom, else MEM002's; search/policy.py reads the same threshold); the first in the search's order
    on a tie. None when no option passes."""
    choice = split_choice(job, plan)
    return choice.plan if choice is not None and choice.fits else None


def split_choice(job: Job, plan: Plan) -> SplitChoice | None:
    """fastest_split's plan, or where no option fits, the fastest the rules pass, said not to fit (what PP001's fix
    names: the split to set before the memory rules can say what clears them); None where no option passes. Each
    option's memory is estimated once; those over the budget are timed only where none fits."""
    budget = budget_bytes(job.gpu.memory_bytes, headroom_threshold(job.headroom))
    best: tuple[float, SplitChoice] | None = None
    over: list[SplitChoice] = []
    for option in framework_options(job, plan.pp):
        if option.vpp != plan.vpp:
            continue
        candidate = with_option(plan, option)
        try:
            memory = job_memory(job, candidate)
        except MeshplanError:  # a rule refuses it (EstimateBlocked)
            continue
        fits = memory.fit_bytes <= budget and (job.cpu_memory_per_node is None
                                              or memory.host_bytes_per_node <= job.cpu_memory_per_node)
        if fits:
            best = _faster(job, SplitChoice(candidate, True, memory.fit_bytes), best)
        else:
            over.append(SplitChoice(candidate, False, memory.fit_bytes))
    for choice in over if best is None else ():
        best = _faster(job, choice, best)
    return None if best is None else best[1]


def _faster(job: Job, choice: SplitChoice, best: tuple[float, SplitChoice] | None) -> tuple[float, SplitChoice] | None:
    """The choice timed against the best so far (the earlier on a tie); a choice the model cannot time is passed."""
    try:
        step = estimate_throughput(job, choice.plan).step_time_s
    except MeshplanError:  # a rule refuses it (EstimateBlocked), or the model cannot time it
        return best
    return (step, choice) if best is None or step < best[0] else best
