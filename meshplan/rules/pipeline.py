"""The pipeline rules of cards/rules.yaml (PP*): layers over pp and vpp, uneven splits and explicit layouts as
Megatron-Core checks them, micro-batches against the pipeline.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

import math
from typing import get_args

from meshplan.arithmetic.memory_states import uses_fsdp
from meshplan.arithmetic.pipeline_timeline import SCHEDULE_OF_ORDER, schedule_order
from meshplan.arithmetic.schedule import (
    compose_layout,
    decoder_layer_cut,
    model_uneven_split,
    plan_layout_problem,
    split_problem,
)
from meshplan.knowledge.adapter_knobs import default_render, knob_table
from meshplan.knowledge.cards import FrameworkCard, framework_card
from meshplan.knowledge.gdn_config import decoder_layers, split_layers
from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import (
    BATCH_READS,
    at_layout,
    ctx_param,
    divisors,
    fmt_set,
    kept_degrees,
    refusals_at,
    rl_batch_fix,
)
from meshplan.rules.world import tiled, tiling
from meshplan.schema.choices import FRAMEWORKS, PipelineSchedule
from meshplan.schema.plan import Job, Plan

# Pipeline sizes listed up to 32: at PP008's 4 layers per stage no catalog model (at most 126 layers) takes more.
MAX_LISTED_PP = 32



def _uneven_hint(ctx: Context, pp: int) -> str:
    split = model_uneven_split(ctx.arch, pp, ctx.plan.vpp)
    if split is None:
        return ""
    first, per, last = split
    middle = "" if pp < 3 else f", {per} on the middle stage" if pp == 3 else \
        f", {per} on each of the {pp - 2} middle stages"
    return f"; or keep pp={pp} with an uneven split: first_stage_layers={first}, last_stage_layers={last}{middle}"



def _explicit(values: dict) -> bool:
    """_explicit_split of a plan's field values."""
    return values["pipeline_layout"] is not None or bool(values["account_for_embedding"] or values["account_for_loss"])


def _even_or_given(values: dict, job: Job) -> bool:
    """PP001's screen: it passes wherever there is no pipeline, a split is given or the layers divide over pp, and
    fires everywhere else."""
    return (values["pp"] == 1 or values["first_stage_layers"] is not None or values["last_stage_layers"] is not None
            or job.model.num_layers % values["pp"] == 0 or _explicit(values))


@rule("PP001", reads=("tp", "pp", "cp", "ep", "etp", "vpp", "first_stage_layers", "last_stage_layers",
      "pipeline_layout", "account_for_embedding", "account_for_loss"), screen=_even_or_given, words=BATCH_READS)
def layers_divisible_by_pp(ctx: Context) -> Values:
    p, layers = ctx.plan, ctx.arch.num_layers
    if _even_or_given(p.__dict__, ctx.job):
        return None
    working = tiling(ctx, "pp", divisors(layers, upto=MAX_LISTED_PP))
    if p.vpp > 1:  # the plan's virtual stages stay: pp=1 would be PP003's, a pp they do not split PP002's
        keep = [d for d in working if d > 1 and layers % (d * p.vpp) == 0]
        named = kept_degrees(ctx, "pp", keep) if keep else f"{kept_degrees(ctx, 'pp', working)} with vpp=1"
    else:  # at the dp each leaves, the batch rules pass (fix_values.kept_degrees): pp=1 on 64 GPUs broke VL004
        named = kept_degrees(ctx, "pp", working)
    return {"layers": layers, "pp": p.pp, "working": named, "uneven": _uneven_hint(ctx, p.pp)}



@rule("PP002", reads=("pp", "vpp", "first_stage_layers", "last_stage_layers", "pipeline_layout",
      "account_for_embedding", "account_for_loss"))
def layers_divisible_by_vpp(ctx: Context) -> Values:
    """Megatron-Core's even split over pp x vpp virtual stages, in the layers it counts (gdn_config.split_layers: a
    Gated DeltaNet hybrid's decoder layers, whose GPTModel interleaves; it skipped every hybrid, so 48 decoder layers
    over pp=4 at vpp=5 passed check)."""
    p, layers = ctx.plan, split_layers(ctx.arch)
    if ctx.arch.layer_pattern is not None and ctx.arch.gdn is None:
        return None  # a Mamba-2 hybrid runs no virtual stages without '|' in its pattern (PP016), whatever they split
    if p.vpp == 1 or p.pp == 1 or p.first_stage_layers is not None or p.last_stage_layers is not None:
        return None
    if _explicit_split(p):
        return None
    if layers % p.pp:  # PP001 reports the even split itself
        return None
    per_rank = layers // p.pp
    if per_rank % p.vpp == 0:
        return None
    return {"layers": layers, "pp": p.pp, "vpp": p.vpp, "per_rank": per_rank,
            "working": fmt_set([v for v in divisors(per_rank) if v > 1]) or "none"}



# What a pp a fix names must pass beside its layers and tiling (interleaved_pps): the rules that count a schedule run's
# micro-batches against pp, each framework's own (Megatron-Core's interleaving, torch's schedules, NeMo AutoModel's).
MICROBATCH_RULES = ("PP005", "PP010", "PP011", "PP014", "AM003")
# (and dp: microbatch_refusals sets the plan's dp to the derived one, which those rules then read back, so the verdict
# does not turn on the given dp, but its reads are declared as read)
MICROBATCH_READS = ("micro_batch_size", "pipeline_microbatches", "pipeline_schedule", "global_batch_size", "dp")
# The rules that refuse a pipeline beside the plan's other settings, whatever its size: NeMo AutoModel's DDP strategy
# (AM004, its ZeRO-0), Megatron-Core's combined 1F1B with Megatron-FSDP over virtual stages (PP015, moe_a2a_overlap at
# ZeRO-3): a fix names no pp that brings one in (splitting_pps)
PIPELINE_REFUSALS = ("AM004", "PP015")


def _pipeline_or_no_vpp(values: dict, job: Job) -> bool:
    """PP003's screen: it passes wherever vpp is 1 or there is a pipeline, and fires everywhere else."""
    return values["vpp"] == 1 or values["pp"] > 1


@rule("PP003", reads=("tp", "pp", "vpp", "cp", "ep", "etp", "zero_stage", *MICROBATCH_READS),
      words=("moe_a2a_overlap",), screen=_pipeline_or_no_vpp)
def vpp_needs_pp(ctx: Context) -> Values:
    """Megatron-Core refuses virtual stages without a pipeline; torchtitan, KempnerForge and NeMo AutoModel build no
    pipeline at pp=1 and run the model whole, so the vpp named is not the layout they run. vpp=1 always works; pp
    values only where interleaved_pps finds some, and where the layers split but the batch rules refuse every such pp,
    the fix says so beside vpp=1."""
    p = ctx.plan
    if _pipeline_or_no_vpp(p.__dict__, ctx.job):
        return None
    how = ("Megatron-Core refuses it ('pipeline-model-parallel size should be greater than 1')"
           if ctx.backend == "megatron" else
           f"{ctx.card.display_name} builds no pipeline at pp=1 and runs the model whole, "
           "not the layout named")
    split = splitting_pps(ctx, p.vpp)
    refused = {d: microbatch_refusals(ctx, d, p.vpp) for d in split}
    pps = [d for d in split if not refused[d]]
    ids = sorted({r for rules in refused.values() for r in rules})
    breaks = (f"each breaks {', '.join(ids)} at the default global batch it takes (global_batch_size not given)"
              if ctx.job.batch_follows_layout else
              f"at a global batch of {ctx.job.global_batch_size} each breaks {', '.join(ids)}")
    pipeline = (f", or pp in {fmt_set(pps)} with vpp={p.vpp}" if pps else
                f" (pp {fmt_set(split)} would split the layers into pp*vpp chunks, but {breaks})" if split else "")
    return {"vpp": p.vpp, "how": how, "pipeline": pipeline}



def interleaves(ctx: Context) -> bool:
    """Whether the framework runs virtual pipeline stages for this job at this ZeRO stage: its card has an
    interleaved schedule and the adapter `render` writes with a pipeline has a vpp key (AD001's table). A fix names
    vpp > 1 only where this holds. Reads zero_stage and tp, pp (the variant DEFAULT_VARIANTS picks)."""
    card = ctx.card
    if card.pipeline.interleaved is None:
        return False
    p = ctx.plan
    target = default_render(card, ctx.job, p.model_copy(update={"pp": max(p.pp, 2), "vpp": max(p.vpp, 2)}))
    return target is None or knob_table(card, *target)["vpp"].key is not None


def interleaved_pps(ctx: Context, vpp: int) -> list[int]:
    """pp values over 1 at which this job runs `vpp` virtual stages: splitting_pps, and the micro-batch rules pass
    (microbatch_refusals); none where nothing does. Reads tp, pp, cp, ep, etp, zero_stage, moe_a2a_overlap and
    MICROBATCH_READS."""
    return [d for d in splitting_pps(ctx, vpp) if not microbatch_refusals(ctx, d, vpp)]


def splitting_pps(ctx: Context, vpp: int) -> list[int]:
    """pp values over 1 that take `vpp` virtual stages on this job's layers and GPUs: the framework interleaves, the
    layers split evenly over pp*vpp chunks, the GPU count stays tiled (world.tiled), and no rule of
    PIPELINE_REFUSALS that passes now refuses the pipeline (PP003's 'pp in {2, 4, 8} with vpp=2' brought AM004 in at
    NeMo AutoModel's ZeRO-0, and PP015 beside moe_a2a_overlap at Megatron-Bridge's ZeRO-3). Reads tp, pp, cp, ep, etp,
    zero_stage, pipeline_schedule, moe_a2a_overlap."""
    if not interleaves(ctx):
        return []
    layers = ctx.arch.num_layers
    pps = tiled(ctx, "pp", [d for d in divisors(layers, upto=MAX_LISTED_PP) if d > 1 and layers % (d * vpp) == 0])
    if not pps:
        return []
    passing = [r for r in PIPELINE_REFUSALS if r not in refusals_at(ctx, PIPELINE_REFUSALS)]
    return [d for d in pps if not refusals_at(at_layout(ctx, {"pp": d, "vpp": vpp}), passing)]


def microbatch_refusals(ctx: Context, pp: int, vpp: int) -> list[str]:
    """The MICROBATCH_RULES the job's framework runs that refuse its plan at `pp` and `vpp`, as the request with them
    resolves (fix_values.at_layout: dp derived, a default batch moved with it): each rule's own condition, run on that
    plan. Reads tp, cp, ep, zero_stage and MICROBATCH_READS."""
    return refusals_at(at_layout(ctx, {"pp": pp, "vpp": vpp}), MICROBATCH_RULES)



def _uneven_sizes(values: dict, job: Job) -> tuple | None:
    """PP004's screen: it passes wherever no stage size is given or a layout decides the split; elsewhere the sizes,
    pp and vpp decide whether Megatron-Core refuses them (split_problem)."""
    first, last = values["first_stage_layers"], values["last_stage_layers"]
    if (first is None and last is None) or _explicit(values):
        return None
    return values["pp"], values["vpp"], first, last


@rule("PP004", reads=("tp", "pp", "cp", "ep", "etp", "vpp", "first_stage_layers", "last_stage_layers",
      "pipeline_layout", "zero_stage",
      "account_for_embedding", "account_for_loss"), screen=_uneven_sizes)
def uneven_split_valid(ctx: Context) -> Values:
    """Megatron-Core TransformerConfig.__post_init__ (uneven PP), in its order (schedule.split_problem); the fix is
    the split the search enumerates for this pp and vpp (schedule.uneven_split). With a layout or the embedding/loss
    accounting also given, __post_init__ refuses the combination before it looks at the sizes: PP009 reports that."""
    p, layers = ctx.plan, ctx.arch.num_layers
    first, last = p.first_stage_layers, p.last_stage_layers
    if _uneven_sizes(p.__dict__, ctx.job) is None:
        return None
    problem = split_problem(layers, p.pp, p.vpp, first, last)
    if not problem:
        return None
    if p.pp == 1:  # one stage, both first and last: Megatron does not ignore the sizes, it refuses them
        problem = (f"{problem}: pp=1 runs one stage, which holds all {layers} layers, and Megatron-Core's "
                   "TransformerConfig.__post_init__ raises ValueError ('Mismatch: ... middle layers remaining but ... "
                   "middle PP stages available') rather than ignore the stage sizes")
        return {"problem": problem, "layers": layers, "pp": p.pp, "split": _single_stage_fix(ctx)}
    split = model_uneven_split(ctx.arch, p.pp, p.vpp)  # the search's own split: recommend enumerates what check names
    if split:
        fix = f"first_stage_layers={split[0]}, last_stage_layers={split[2]}"
    elif _writes_layout(ctx) and (layout := compose_layout(split_layers(ctx.arch), p.pp, p.vpp,
                                                           ctx.arch.num_mtp_layers)):
        fix = (f'pipeline_layout="{layout}" (pp={p.pp}, vpp={p.vpp}; E embedding, t decoder layer, m MTP, L loss; '
               "drop first_stage_layers, drop last_stage_layers): no first/last split of these layers works at this "
               "pp and vpp")
    elif p.vpp > 1 and (plain := model_uneven_split(ctx.arch, p.pp)
                        or model_uneven_split(ctx.arch, p.pp, closest=True)):
        fix = (f"vpp=1, first_stage_layers={plain[0]}, last_stage_layers={plain[2]} (no first/last split of these "
               f"layers works at vpp={p.vpp})")
    else:
        fix = f"pp in {fmt_set(tiling(ctx, 'pp', divisors(layers, upto=MAX_LISTED_PP)))} with an even split"
    return {"problem": problem, "layers": layers, "pp": p.pp, "split": fix}


def _single_stage_fix(ctx: Context) -> str:
    """PP004's fix at pp=1: the stage sizes dropped (the one stage holds every layer), or the pipeline sizes over 1,
    tiling the GPUs, at which Megatron-Core accepts the sizes as given (split_problem)."""
    p, layers = ctx.plan, ctx.arch.num_layers
    given = [(name, getattr(p, name)) for name in ("first_stage_layers", "last_stage_layers")
             if getattr(p, name) is not None]
    drop = ", ".join(f"drop {name}" for name, _ in given)
    fix = f"pp=1 without first/last stage sizes ({drop}: its one stage holds all {layers} layers)"
    keep = tiled(ctx, "pp", [d for d in range(2, min(layers, MAX_LISTED_PP) + 1)
                             if not split_problem(layers, d, p.vpp, p.first_stage_layers, p.last_stage_layers)])
    if keep:
        sizes = " and ".join(f"{name}={value}" for name, value in given)
        fix += f", or pp in {fmt_set(keep)} with {sizes} kept"
    return fix


def _writes_layout(ctx: Context) -> bool:
    """Whether the config render writes for this job has a pipeline layout key (Megatron-Core's
    --pipeline-model-parallel-layout, Megatron-Bridge's model.pipeline_model_parallel_layout): PP004 names a layout
    only where the user can give one. Reads zero_stage, tp, pp (the variant DEFAULT_VARIANTS picks)."""
    target = default_render(ctx.card, ctx.job, ctx.plan)
    return target is not None and knob_table(ctx.card, *target)["pipeline_layout"].key is not None



@rule("PP009", reads=("pp", "vpp", "first_stage_layers", "last_stage_layers", "pipeline_layout",
      "account_for_embedding", "account_for_loss"))
def pipeline_layout_valid(ctx: Context) -> Values:
    """An explicit pipeline_model_parallel_layout, or the embedding/loss counted in the split, that Megatron-Core
    would refuse (schedule.plan_layout_problem); the fix is a layout that works for this pp and vpp."""
    p = ctx.plan
    problem = plan_layout_problem(ctx.arch, p)
    if not problem:
        return None
    layers = split_layers(ctx.arch)  # a Gated DeltaNet hybrid's decoder layers: what its layout's t counts
    working = compose_layout(layers, p.pp, p.vpp, ctx.arch.num_mtp_layers)
    drop = "".join(f", drop {name}" for name in ("first_stage_layers", "last_stage_layers", "account_for_embedding",
                                                  "account_for_loss") if getattr(p, name))  # only what the plan gives
    fix = (f'Use pipeline_layout="{working}" (pp={p.pp}, vpp={p.vpp}; E embedding, t decoder layer, m MTP, L loss'
           f'{drop}).' if working else f"Use pp*vpp <= {layers + 2} stages.")
    return {"layers": layers, "pp": p.pp, "vpp": p.vpp, "problem": problem, "working": fix}



def _explicit_split(p: Plan) -> bool:
    """A layout or the embedding/loss accounting decides the split; PP009 checks it instead of PP001/PP002/PP007."""
    return _explicit(p.__dict__)



@rule("PP005", reads=("pp", "vpp", "dp", "micro_batch_size", "pipeline_microbatches", "global_batch_size"))
def interleave_microbatches(ctx: Context) -> Values:
    p = ctx.plan
    if p.vpp == 1 or p.pp == 1:
        return None
    m = ctx.microbatches
    if m >= p.pp and m % p.pp == 0:
        return None
    unit, batch = p.micro_batch_size * p.dp * p.pp, ctx.schedule_batch
    return {"m": m, "pp": p.pp, "vpp": p.vpp, "gbs": batch, "unit": unit, "run": ctx.schedule_run,
            "gbss": rl_batch_fix(ctx, batch, unit, mini_batch=ctx.per_mini_batch)}



@rule("PP006", reads=("pp", "vpp", "dp", "micro_batch_size", "pipeline_microbatches", "global_batch_size"))
def bubble(ctx: Context) -> Values:
    p = ctx.plan
    m = ctx.microbatches
    if p.pp == 1 or p.vpp > 1 or m >= p.pp or m == 0:
        return None
    overhead = (p.pp - 1) / m
    share = (p.pp - 1) / (m + p.pp - 1)
    per_stage = int(ctx_param(ctx, "PP006", "microbatches_per_stage"))
    target = p.micro_batch_size * p.dp * per_stage * p.pp
    return {"m": m, "pp": p.pp, "bubble": f"{overhead:.0%}", "share": f"{share:.0%}",
            "gbs": ctx.job.global_batch_size, "target": target, "per_stage": per_stage}



@rule("PP007", reads=("pp", "vpp", "first_stage_layers", "last_stage_layers", "pipeline_layout",
      "account_for_embedding", "account_for_loss"))
def stages_have_layers(ctx: Context) -> Values:
    """Every chunk holds a layer and every layer a stage: pp*vpp chunks for the model's layers, or, with first/last
    stage sizes given, the middle stages' chunks for the layers those sizes leave (schedule.layers_per_rank splits
    them evenly, and refuses sizes over the model or, without middle stages, short of it; PP004 checks Megatron's own
    conditions, this one every engine's)."""
    p, layers = ctx.plan, ctx.arch.num_layers
    if _explicit_split(p):  # a stage may hold E, m or L alone there (PP009 checks it)
        return None
    chunks = p.pp * p.vpp
    if chunks > layers:
        return {"problem": f"pp*vpp = {p.pp}*{p.vpp} = {chunks} model chunks but only {layers} layers: some stages "
                           "would hold no layer", "fix": f"pp*vpp <= {layers}"}
    given = [n for n in (p.first_stage_layers, p.last_stage_layers) if n is not None]
    if p.pp == 1 or not given:
        return None
    middle, left = p.pp - len(given), layers - sum(given)
    sizes = f"first_stage_layers + last_stage_layers = {sum(given)}" if len(given) == 2 else f"{given[0]} layers"
    named = " + ".join(name for name in ("first_stage_layers", "last_stage_layers") if getattr(p, name) is not None)
    bound = f"{named} <= {layers - middle * p.vpp}"  # what leaves every other stage's chunks a layer
    if left < 0 or (not middle and left):
        fix = f"last_stage_layers={layers - given[0]}" if not middle else bound
        return {"problem": f"With pp={p.pp}, {sizes} on the given stages, but the model has {layers} layers",
                "fix": fix}
    if middle * p.vpp <= left:
        return None
    return {"problem": f"{middle * p.vpp} model chunks (the {middle} stages between the given first/last stages x vpp "
                       f"{p.vpp}) but only {left} layers for them: some stages would hold no layer",
            "fix": f"{bound}, or fewer stages"}



@rule("PP008", reads=("pp",))
def shallow_pipeline(ctx: Context) -> Values:
    p, layers = ctx.plan, ctx.arch.num_layers
    minimum = ctx_param(ctx, "PP008", "min_layers_per_stage")
    if p.pp == 1 or layers / p.pp >= minimum:
        return None
    fewer = max(1, math.floor(layers / minimum))
    return {"pp": p.pp, "layers": layers, "per": f"{layers / p.pp:.1f}", "minimum": int(minimum),
            "fewer": fewer}



@rule("PP010", reads=("pp", "vpp", "dp", "micro_batch_size", "pipeline_microbatches", "pipeline_schedule",
      "global_batch_size"))
def torch_1f1b_microbatches(ctx: Context) -> Values:
    """torch Schedule1F1B.__init__: n_microbatches >= the number of stages (torchtitan's 1F1B at vpp = 1)."""
    p = ctx.plan
    if p.pp == 1 or p.vpp > 1 or ctx.microbatches >= p.pp or named_order(p) not in (None, "1f1b"):  # GPipe: no check
        return None
    return fewer_microbatches_than_stages(ctx)


def fewer_microbatches_than_stages(ctx: Context) -> Values:
    """The values of a rule refusing a schedule run with fewer micro-batches than stages (PP010, AM003): the count,
    the batch unit that gives one per stage, and the micro-batch size this global batch allows for it."""
    p = ctx.plan
    m = ctx.microbatches
    unit = p.micro_batch_size * p.dp * p.pp
    gbs = ctx.job.global_batch_size
    mbs = gbs // (p.dp * p.pp) if gbs % (p.dp * p.pp) == 0 and gbs >= p.dp * p.pp else 0
    return {"m": m, "pp": p.pp, "target": unit, "unit": unit, "most": max(1, m),
            "mbs": f", micro_batch_size={mbs} at this batch" if mbs else ""}



def torch_interleave_rounds(microbatches: int, pp: int) -> int:
    """torch ScheduleInterleaved1F1B's number_of_rounds: max(1, m // pp)."""
    return max(1, microbatches // pp)


def _torch_interleavable(microbatches: int, pp: int) -> bool:
    return microbatches % torch_interleave_rounds(microbatches, pp) == 0


@rule("PP011", reads=("pp", "vpp", "dp", "micro_batch_size", "pipeline_microbatches", "pipeline_schedule",
      "global_batch_size"))
def torch_interleaved_microbatches(ctx: Context) -> Values:
    """torch ScheduleInterleaved1F1B.__init__: n_microbatches a multiple of max(1, n_microbatches // pp)."""
    p = ctx.plan
    m = ctx.microbatches
    if p.pp == 1 or p.vpp == 1 or _torch_interleavable(m, p.pp):
        return None
    if named_order(p) not in (None, "interleaved_1f1b", "interleaved_zero_bubble"):  # ZBV, DualPipeV: no rounds
        return None
    below = next(k for k in range(m, 0, -1) if _torch_interleavable(k, p.pp))
    above = next(k for k in range(m, 2 * m + p.pp) if _torch_interleavable(k, p.pp))
    unit = p.micro_batch_size * p.dp
    schedule = "InterleavedZeroBubble" if named_order(p) == "interleaved_zero_bubble" else "Interleaved1F1B"
    return {"m": m, "pp": p.pp, "vpp": p.vpp, "schedule": schedule, "rounds": torch_interleave_rounds(m, p.pp),
            "unit": unit,
            "gbss": f"{below * unit} or {above * unit}", "good": f"{below} or {above}"}



# --------------------------------------------------------------------------- named schedules (pipeline_schedule)

SINGLE_CHUNK = ("gpipe", "1f1b")
MULTI_CHUNK = ("interleaved_1f1b", "zero_bubble", "dualpipev")


def named_order(p: Plan) -> str | None:
    """The order a named pipeline_schedule runs at the plan's vpp; None when the plan names none."""
    return schedule_order(p.pipeline_schedule, p.vpp) if p.pipeline_schedule is not None else None


def offered_schedules(card: FrameworkCard) -> list[str]:
    """The pipeline_schedule values a framework runs (its card's pipeline.schedules), in the Literal's order."""
    orders = card.pipeline.schedules or {card.pipeline.order: ""}
    names = {SCHEDULE_OF_ORDER[o] for o in orders}
    return [s for s in get_args(PipelineSchedule) if s in names]


@rule("PP012", reads=("vpp", "pipeline_schedule"))
def schedule_offered(ctx: Context) -> Values:
    """The framework's card lists the order the named schedule runs at this vpp (zero_bubble: ZBV at vpp 2,
    interleaved zero-bubble above)."""
    p = ctx.plan
    order = named_order(p)
    if order is None:
        return None
    facts = ctx.card.pipeline
    if order in (facts.schedules or {facts.order: ""}):
        return None
    offered = offered_schedules(ctx.card)
    runs_other = p.pipeline_schedule in offered  # zero_bubble: the framework runs it at another vpp
    where = f" at vpp={p.vpp} (it runs it as {_zero_bubble_words(ctx.card)})" if runs_other else ""
    others = [n for n in FRAMEWORKS if schedule_order(p.pipeline_schedule, p.vpp) in
              (framework_card(n).pipeline.schedules or {})]
    return {"schedule": p.pipeline_schedule, "framework": ctx.job.framework, "where": where,
            "offered": " or ".join(offered), "default": facts.schedule,
            "others": f"frameworks that run it here: {', '.join(others)}." if others else "no framework runs it here."}


def _zero_bubble_words(card: FrameworkCard) -> str:
    schedules = card.pipeline.schedules
    forms = {"zbv_zero_bubble": "ZBV at vpp=2", "interleaved_zero_bubble": "interleaved zero-bubble at vpp > 2"}
    return " and ".join(words for order, words in forms.items() if order in schedules)


def _schedule_and_chunks(values: dict, job: Job) -> tuple:
    """PP013's screen: whether it fires is decided by the schedule named, whether there is a pipeline and whether vpp
    is 1, 2 or more (the job's card beside them); the other fields it reads word its fix."""
    return values["pipeline_schedule"], values["pp"] > 1, min(values["vpp"], 3)


@rule("PP013", reads=("tp", "pp", "vpp", "cp", "ep", "etp", "zero_stage", *MICROBATCH_READS),
      words=("moe_a2a_overlap",), screen=_schedule_and_chunks)
def schedule_chunks(ctx: Context) -> Values:
    """gpipe and 1f1b run one chunk per rank, interleaved_1f1b and zero_bubble two or more, dualpipev exactly two. A
    fix names virtual stages only where the framework runs them (interleaves)."""
    p = ctx.plan
    name = p.pipeline_schedule
    if name in MULTI_CHUNK and p.pp == 1 and p.vpp == 1:  # vpp > 1 without a pipeline: PP003
        pps = interleaved_pps(ctx, 2)
        return {"schedule": name, "vpp": p.vpp, "reason": "it schedules the virtual stages of a pipeline, and pp=1 "
                                                          "has none",
                "fix": f"Use pp in {fmt_set(pps)} with vpp=2, or leave pipeline_schedule out." if pps else
                       "Leave pipeline_schedule out."}
    card = ctx.card
    if name is None and p.pp > 1 and p.vpp > 1 and card.pipeline.interleaved is None:
        # no schedule named: the framework's own, and it has no interleaved one (its card: nanotron, DeepSpeed)
        return {"schedule": f"{' or '.join(offered_schedules(ctx.card))} (all {card.display_name} runs)",
                "vpp": p.vpp, "reason": "they run one stage per rank (the framework has no interleaved schedule)",
                "fix": "Use vpp=1."}
    if name is None or p.pp == 1:
        return None
    if name in SINGLE_CHUNK and p.vpp > 1:
        multi = [s for s in offered_schedules(ctx.card) if s in MULTI_CHUNK] if interleaves(ctx) else []
        return {"schedule": name, "vpp": p.vpp, "reason": "it runs one stage per rank (torchtitan refuses more for a "
                                                           "single-stage schedule; Megatron-Core interleaves whenever "
                                                           "vpp > 1)",
                "fix": f"Use vpp=1{', or pipeline_schedule=' + ' or '.join(multi) if multi else ''}."}
    if name in MULTI_CHUNK and (p.vpp < 2 or (name == "dualpipev" and p.vpp != 2)):
        per_rank = ctx.arch.num_layers // p.pp
        working = [v for v in range(2, 9) if per_rank % v == 0] or [2]
        exact = name == "dualpipev"
        if not interleaves(ctx):  # the framework runs one stage per rank: the schedule is what to change
            fix = ("Use vpp=1 and pipeline_schedule=1f1b (or leave pipeline_schedule out)." if p.vpp > 1 else
                   "Use pipeline_schedule=1f1b, or leave it out.")
        else:
            fix = "Use vpp=2." if exact else f"Use vpp={working[0]} (or leave vpp out: 2), or pipeline_schedule=1f1b."
        return {"schedule": name, "vpp": p.vpp,
                "reason": "it runs exactly two virtual stages per rank, in a V" if exact else
                          "it runs two or more virtual stages per rank", "fix": fix}
    return None


@rule("PP014", reads=("pp", "vpp", "dp", "micro_batch_size", "pipeline_microbatches", "pipeline_schedule",
      "global_batch_size"))
def dualpipev_microbatches(ctx: Context) -> Values:
    """torch ScheduleDualPipeV.__init__: n_microbatches >= the stages (2 x pp)."""
    p = ctx.plan
    m = ctx.microbatches
    if named_order(p) != "dualpipev" or p.pp == 1 or m >= 2 * p.pp:
        return None
    target = 2 * p.pp * p.micro_batch_size * p.dp
    gbs = ctx.job.global_batch_size
    unit = 2 * p.pp * p.dp
    mbs = gbs // unit if gbs % unit == 0 and gbs >= unit else 0
    return {"m": m, "pp": p.pp, "stages": 2 * p.pp, "target": target,
            "mbs": f", micro_batch_size={mbs} at this batch" if mbs and mbs != p.micro_batch_size else ""}


def _named_with_overlap(values: dict, job: Job) -> tuple:
    """PP015's screen: the schedule named, the overlap and the ZeRO stage decide it, with whether the pipeline has
    virtual stages."""
    return (values["pipeline_schedule"], values["moe_a2a_overlap"], values["zero_stage"],
            values["pp"] > 1 and values["vpp"] > 1)


@rule("PP015", reads=("pp", "vpp", "zero_stage", "pipeline_schedule", "moe_a2a_overlap"), screen=_named_with_overlap)
def combined_1f1b_as_named(ctx: Context) -> Values:
    """Megatron-Core runs combined 1F1B exactly when overlap_moe_expert_parallel_comm is on (a named schedule other
    than combined_1f1b cannot keep moe_a2a_overlap), and refuses it with Megatron-FSDP over virtual stages."""
    p = ctx.plan
    if p.pipeline_schedule == "combined_1f1b" and not p.moe_a2a_overlap:
        return {"reason": "pipeline_schedule=combined_1f1b with moe_a2a_overlap=false: Megatron-Core runs its "
                          "combined 1F1B only with overlap_moe_expert_parallel_comm",
                "fix": "Use moe_a2a_overlap=true (or leave it out), or pipeline_schedule=1f1b / interleaved_1f1b."}
    if p.pipeline_schedule not in (None, "combined_1f1b") and p.moe_a2a_overlap:
        return {"reason": f"pipeline_schedule={p.pipeline_schedule} with moe_a2a_overlap=true: with the overlap on "
                          "Megatron-Core always runs its combined 1F1B",
                "fix": "Use pipeline_schedule=combined_1f1b, or moe_a2a_overlap=false."}
    if p.runs_schedule == "combined_1f1b" and p.pp > 1 and p.vpp > 1 and uses_fsdp(ctx.job.card, p.zero_stage):
        return {"reason": f"combined 1F1B (moe_a2a_overlap) with zero_stage={p.zero_stage} (Megatron-FSDP) over "
                          f"vpp={p.vpp}: Megatron-Core refuses EP overlap 1F1B with FSDP for interleaved pipelines "
                          "(combined_1f1b.py)",
                "fix": "Use zero_stage=1 (the distributed optimizer), or pp=1, or moe_a2a_overlap=false with another "
                       "pipeline_schedule."}
    return None


@rule("PP019", reads=("pp", "vpp", "pipeline_schedule", "account_for_embedding", "account_for_loss"))
def pipeline_knobs_without_pipeline(ctx: Context) -> Values:
    """Pipeline settings at pp 1, which the frameworks start and ignore (their pipeline builders alone read them): a
    one-chunk schedule the framework runs (another is PP012's or PP013's), the embedding / loss accounting, and
    pipeline_microbatches (Job.given_unread: the resolver leaves it out of a plan without a pipeline). A warning, the
    estimates those without them."""
    p = ctx.plan
    if p.pp != 1:
        return None
    given = [knob for knob in ctx.job.given_unread if knob.startswith("pipeline_microbatches=")]
    if p.pipeline_schedule in SINGLE_CHUNK and schedule_offered(ctx) is None:
        given.append(f"pipeline_schedule={p.pipeline_schedule}")
    given += [f"{name}=true" for name in ("account_for_embedding", "account_for_loss") if getattr(p, name)]
    if not given:
        return None
    one = len(given) == 1
    return {"knobs": " and ".join(given), "names": " and ".join(k.split("=")[0] for k in given),
            "framework": ctx.card.display_name, "them": "it" if one else "them", "they": "it" if one else "they",
            "have": "has" if one else "have"}


@rule("PP016", reads=("vpp", "pipeline_layout", "account_for_embedding", "account_for_loss"))
def hybrid_pattern_split(ctx: Context) -> Values:
    """A hybrid model's pipeline: HybridModel cuts the pattern by layer count (select_pipeline_segment), so no
    virtual stages, explicit layout or embedding/loss accounting without '|' separators in the pattern."""
    if ctx.arch.layer_pattern is None or ctx.arch.gdn is not None:  # a Gated DeltaNet hybrid: a GPTModel (PP017)
        return None
    return hybrid_model_split_problem(ctx.plan)


def hybrid_model_split_problem(p: Plan) -> Values:
    """What HybridModel's select_pipeline_segment cannot take from a pattern without '|' separators: PP016's test,
    and the import's refusal of a Gated DeltaNet hybrid's pretrain_mamba.py script (adapters/read/decoder_split.py
    refuse_hybrid_model_split)."""
    if p.vpp > 1:
        return {"reason": f"vpp={p.vpp}", "fix": "Use vpp=1 (one chunk per pipeline stage)."}
    if p.pipeline_layout:
        return {"reason": "pipeline_layout is set", "fix": "Leave pipeline_layout out; give first_stage_layers / "
                                                          "last_stage_layers for an uneven split."}
    if p.account_for_embedding or p.account_for_loss:
        return {"reason": "account_for_embedding / account_for_loss is set",
                "fix": "Leave them out; give first_stage_layers / last_stage_layers for lighter end stages."}
    return None


@rule("PP017", reads=("pp", "vpp", "first_stage_layers", "last_stage_layers", "pipeline_layout",
                      "account_for_embedding", "account_for_loss"))
def gdn_decoder_layer_split(ctx: Context) -> Values:
    """A Gated DeltaNet hybrid on Megatron-Core's GPTModel (pretrain_gpt.py with experimental_attention_variant
    gated_delta_net; Megatron-Bridge's Qwen3NextBridge builds the same), whose TransformerLayers are decoder layers,
    each two layers of meshplan's pattern (mixer, MoE): a stage or virtual chunk of an odd number of pattern layers
    cuts a decoder layer in two (render's decoder_split refuses it); virtual stages of whole decoder layers interleave
    (get_num_layers_to_build). A layout or embedding / loss accounting counts decoder layers as the GPTModel does
    (schedule.explicit_stages), so it cuts none (PP009 says what Megatron-Core refuses in it). The fix names the even
    splits (pp dividing the decoder layers, or first / last stage sizes even)."""
    what = decoder_layer_cut(ctx.arch, ctx.plan)
    if what is None:
        return None
    decoder = decoder_layers(ctx.arch.num_layers)
    working = fmt_set([q for q in divisors(decoder) if 1 < q <= MAX_LISTED_PP]) or "none"
    return {"pp": ctx.plan.pp, "decoder": decoder, "working": working, "what": what}
