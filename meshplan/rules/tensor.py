"""The tensor- and sequence-parallel rules of cards/rules.yaml (TP*, FS001, SP*): heads against tp, TP inside
the NVLink domain, TP overlap's switch, sequence parallelism with TP.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.arithmetic import mesh
from meshplan.core.units import either_or
from meshplan.knowledge.adapter_knobs import unwritable
from meshplan.knowledge.cards import framework_card
from meshplan.rules.context import backend_of
from meshplan.rules.engine import Context, Values, rule, rule_specs
from meshplan.rules.fix_values import BATCH_READS, divisors, fmt_set, kept_degrees
from meshplan.rules.world import tiling
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Job, Plan


def _working_tp(ctx: Context, kv_rule: str) -> str:
    """TP values that satisfy the head rules, inside the NVLink domain (Context.fix_domain) when any do."""
    heads, kv = ctx.arch.num_attention_heads, ctx.arch.num_kv_heads

    def ok(t: int) -> bool:
        if heads % t:
            return False
        if kv_rule == "multiple_or_divisor":
            return kv % t == 0 or t % kv == 0
        if kv_rule == "divides":
            return kv % t == 0
        return True

    good = tiling(ctx, "tp", [t for t in divisors(heads) if ok(t)])
    inside = [t for t in good if t <= ctx.fix_domain]
    return _tp_set(ctx, inside or good)


def _tp_set(ctx: Context, tps: list[int]) -> str:
    """The tp values a fix names ('{2, 4}'), less tp=1 where the plan overlaps TP communication (tp_comm_overlap),
    which TP005 then refuses (no TP communication to overlap): 'tp in {1, 2, 4}' applied as tp=1 brought it in;
    where 1 is the only one, named with the overlap off. Of those, the ones at which the batch rules pass at the dp
    they leave (fix_values.kept_degrees). A rule calling it reads tp_comm_overlap and BATCH_READS."""
    if not ctx.plan.tp_comm_overlap:
        return kept_degrees(ctx, "tp", tps)
    wider = [t for t in tps if t > 1]
    return kept_degrees(ctx, "tp", wider) if wider else f"{kept_degrees(ctx, 'tp', tps)} with tp_comm_overlap=false"



@rule("TP001", reads=("tp", "pp", "cp", "ep", "etp", "tp_comm_overlap"), words=BATCH_READS)
def heads_divisible(ctx: Context) -> Values:
    tp, heads = ctx.plan.tp, ctx.arch.num_attention_heads
    if heads % tp == 0:
        return None
    return {"tp": tp, "heads": heads, "working": _working_tp(ctx, "none")}



@rule("TP002", reads=("tp", "pp", "cp", "ep", "etp", "tp_comm_overlap"), words=BATCH_READS)
def kv_groups_megatron(ctx: Context) -> Values:
    tp, kv = ctx.plan.tp, ctx.arch.num_kv_heads
    if kv % tp == 0 or tp % kv == 0:
        return None
    return {"tp": tp, "kv": kv, "working": _working_tp(ctx, "multiple_or_divisor")}



@rule("TP003", reads=("tp", "pp", "cp", "ep", "etp", "tp_comm_overlap"), words=BATCH_READS)
def kv_heads_divisible(ctx: Context) -> Values:
    tp, kv = ctx.plan.tp, ctx.arch.num_kv_heads
    if tp == 1 or kv % tp == 0:
        return None
    return {"tp": tp, "kv": kv, "working": _working_tp(ctx, "divides")}



@rule("TP004", reads=("tp", "tp_comm_overlap"), words=BATCH_READS)
def tp_inside_nvlink(ctx: Context) -> Values:
    gpu, tp = ctx.job.gpu, ctx.plan.tp
    domain = ctx.fast_domain
    if mesh.tp_fits_domain(tp, domain):
        return None
    slowdown = gpu.intra_node_bandwidth / gpu.network_bandwidth
    # a tp that does not divide the domain crosses it though it is smaller: tp=3 on 8 GPUs puts ranks 6-8 on two nodes
    wider = tp > domain
    return {"tp": tp, "domain": domain, "gpu": gpu.name, "spans": "is larger than" if wider else "does not divide",
            "groups": "every TP group sends" if wider else "the TP groups that straddle two domains send, and the "
                                                           "others wait for them,",
            "intra": f"{gpu.intra_node_bandwidth / 1e9:.0f}",
            "net": f"{gpu.network_bandwidth / 1e9:.0f}", "slowdown": f"{slowdown:.0f}",
            "working": _tp_set(ctx, divisors(domain))}



@rule("TP005", reads=("tp", "sequence_parallel", "tp_comm_overlap", "torch_compile"))
def tp_overlap_preconditions(ctx: Context) -> Values:
    """tp_comm_overlap on a framework without the switch, or without what its switch needs (the card's
    tp_overlap: sequence parallelism for Transformer Engine's userbuffers, torch.compile for async TP)."""
    p = ctx.plan
    if not p.tp_comm_overlap:
        return None
    facts = ctx.card.tp_overlap
    if facts.switch is None:
        supported = [n for n in FRAMEWORKS if framework_card(n).tp_overlap.switch is not None]
        return {"reason": f"{ctx.job.framework} has no TP communication overlap switch meshplan renders",
                "fix": f"Use tp_comm_overlap=false, or {', '.join(supported)}."}
    if p.tp <= 1:
        return {"reason": f"tp={p.tp}: there is no TP communication to overlap",
                "fix": "Use tp > 1, or tp_comm_overlap=false."}
    if facts.needs_sequence_parallel and not p.sequence_parallel:
        return {"reason": "sequence_parallel=false (the userbuffers overlap pipelines the sequence-parallel "
                          "all-gather and reduce-scatter)",
                "fix": "Set sequence_parallel=true, or tp_comm_overlap=false."}
    if facts.needs_compile and not p.torch_compile:
        return {"reason": "torch_compile=false (async TP is a torch.compile pass)",
                "fix": "Set torch_compile=true, or tp_comm_overlap=false."}
    return None



@rule("FS001", reads=("tp", "pp", "ep"))
def fsdp_backend_degrees(ctx: Context) -> Values:
    p = ctx.plan
    used = split_degrees(p.tp, p.pp, p.ep)
    if not used:
        return None
    return {"framework": ctx.framework, "used": ", ".join(used), "stages": either_or(megatron_stages(ctx.job))}


def split_degrees(tp: int, pp: int, ep: int) -> list[str]:
    """The model-parallel degrees over 1 among tp, pp and ep, as 'tp=2': what verl's and SkyRL's FSDP engine runs none
    of (FS001)."""
    return [f"{name}={value}" for name, value in (("tp", tp), ("pp", pp), ("ep", ep)) if value > 1]


def stage_refuses_degrees(job: Job, zero_stage: int, tp: int, ep: int) -> bool:
    """Whether FS001 refuses every plan with these tp and ep at this ZeRO stage, whatever its other fields: where the
    rule applies to the stage's engine (cards/rules.yaml frameworks and backends: verl's and SkyRL's FSDP engine) and
    one of them is over 1. The search's single-stage references leave such a stage out (search/zero_stages
    .reference_zeros): no plan of a layout with those degrees runs there for a reference to bound."""
    return bool(split_degrees(tp, 1, ep)) and rule_specs()["FS001"].applies_to(job.framework,
                                                                            backend_of(job.card, zero_stage))


def megatron_stages(job: Job) -> list[int]:
    """The ZeRO stages that select the framework's Megatron engine (its card's engine.by_zero_stage) and that its
    config as render writes it has a key for (verl has no ZeRO-2: AD001): the stages FS001's fix may name. Read from
    the card alone, not the plan (FS001 reads tp, pp and ep only)."""
    return [zero for zero in range(4) if backend_of(job.card, zero) == "megatron"
            and unwritable(job.card, job, Plan(zero_stage=zero), f"zero_{zero}") is None]



@rule("SP001", reads=("tp", "sequence_parallel"))
def sp_needs_tp(ctx: Context) -> Values:
    if not (ctx.plan.sequence_parallel and ctx.plan.tp == 1):
        return None
    return {"framework": ctx.framework}



@rule("SP002", reads=("tp", "sequence_parallel"))
def sp_advised_with_tp(ctx: Context) -> Values:
    if ctx.plan.tp == 1 or ctx.plan.sequence_parallel:
        return None
    return {"tp": ctx.plan.tp}



@rule("SP003", reads=("tp", "sequence_parallel"))
def skyrl_sets_sp(ctx: Context) -> Values:
    derived = ctx.plan.tp > 1
    if ctx.plan.sequence_parallel == derived:
        return None
    return {"given": str(ctx.plan.sequence_parallel).lower(), "derived": str(derived).lower(), "tp": ctx.plan.tp}


@rule("TP007", reads=("tp", "pp", "cp", "ep", "etp"))
def gdn_heads_divisible(ctx: Context) -> Values:
    """A Gated DeltaNet mixer: Megatron-Core's TransformerConfig asserts that tp x cp divides its key heads and its
    value heads (TP splits them, CP's all-to-all hands each rank whole heads); the fix names the tps, at the plan's
    cp, that also pass the attention layers' head rules (TP001, TP002)."""
    g, tp, cp = ctx.arch.gdn, ctx.plan.tp, ctx.plan.cp
    if g is None or (g.num_key_heads % (tp * cp) == 0 and g.num_value_heads % (tp * cp) == 0):
        return None
    heads, kv = ctx.arch.num_attention_heads, ctx.arch.num_kv_heads
    good = tiling(ctx, "tp", [t for t in divisors(g.num_key_heads) if g.num_key_heads % (t * cp) == 0
                              and g.num_value_heads % (t * cp) == 0 and heads % t == 0
                              and (kv % t == 0 or t % kv == 0)])
    inside = [t for t in good if t <= ctx.fix_domain]
    return {"tp": tp, "cp": cp, "keys": g.num_key_heads, "values": g.num_value_heads,
            "working": fmt_set(inside or good) if good else "none (lower cp)"}


@rule("TP006", reads=("tp", "pp", "cp", "ep", "etp", "tp_comm_overlap"), words=BATCH_READS)
def mamba_heads_divisible(ctx: Context) -> Values:
    """A hybrid model's Mamba-2 mixer: Megatron-Core's MambaMixer asserts that tp divides its heads and its groups;
    the fix names the tps that also pass the attention layers' head rules (TP001, TP002)."""
    m, tp = ctx.arch.mamba, ctx.plan.tp
    if m is None or (m.num_heads % tp == 0 and m.n_groups % tp == 0):
        return None
    heads, kv = ctx.arch.num_attention_heads, ctx.arch.num_kv_heads
    good = tiling(ctx, "tp", [t for t in divisors(m.n_groups) if m.num_heads % t == 0 and heads % t == 0
                              and (kv % t == 0 or t % kv == 0)])
    inside = [t for t in good if t <= ctx.fix_domain]
    return {"tp": tp, "heads": m.num_heads, "groups": m.n_groups, "working": _tp_set(ctx, inside or good)}
