"""The expert-parallel rules of cards/rules.yaml (EP*): experts on a MoE model, divisible by ep, the flex
dispatcher and the all-to-all overlap where the framework has them.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.arithmetic.mesh import domain_spans_nodes, fast_domain
from meshplan.knowledge.cards import framework_card
from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import BATCH_READS, divisors, kept_degrees, layout_words
from meshplan.rules.precision import default_version_knob, keyless_refusal, lacks_key
from meshplan.rules.world import eps_beside_overlap, tiling
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Job


@rule("EP001", reads=("ep",), words=BATCH_READS)
def ep_needs_moe(ctx: Context) -> Values:
    """ep=1 is the fix; where ep is a mesh dimension of its own (KempnerForge's), dp grows with it, and the fix names
    what must follow (fix_values.layout_words: the batch at the new dp, a stated dp)."""
    if ctx.plan.ep == 1 or ctx.arch.is_moe:
        return None
    follows = layout_words(ctx, {"ep": 1, "etp": 1})
    return {"ep": ctx.plan.ep, "model": ctx.arch.name, "follows": f" with {follows}" if follows else ""}



@rule("EP002", reads=("tp", "pp", "cp", "ep", "etp"), words=BATCH_READS)
def experts_divisible(ctx: Context) -> Values:
    """The eps it names leave 1 out beside moe_a2a_overlap, as WS002's do (world.eps_beside_overlap: 'ep in {1, 2, 4,
    8}' applied as ep=1 brought EP009 in, bench/random_requests.py fixes 18 1000); where 1 is the only one, with the
    overlap off."""
    if not ctx.arch.is_moe or ctx.num_experts % ctx.plan.ep == 0:
        return None
    working = tiling(ctx, "ep", divisors(ctx.num_experts))
    wider = eps_beside_overlap(ctx, working)
    said = kept_degrees(ctx, "ep", wider) if wider else f"{kept_degrees(ctx, 'ep', working)} with moe_a2a_overlap=false"
    return {"ep": ctx.plan.ep, "experts": ctx.num_experts, "working": said}



@rule("EP003", reads=("tp", "ep", "sequence_parallel"))
def ep_tp_without_sp(ctx: Context) -> Values:
    p = ctx.plan
    if p.ep == 1 or p.tp == 1 or p.sequence_parallel:
        return None
    return {"ep": p.ep, "tp": p.tp}



def _biased_linear(ctx: Context) -> list[str]:
    """Megatron's add_bias_linear covers the attention output and MLP linears (qkv bias is separate)."""
    arch = ctx.arch
    out = []
    if arch.o_bias:
        out.append("attention output")
    if arch.mlp_bias:
        out.append("MLP")
    if arch.moe is not None and arch.moe.expert_bias:
        out.append("expert")
    return out



@rule("EP004", reads=("etp",))
def moe_bias_needs_etp1(ctx: Context) -> Values:
    if not ctx.arch.is_moe or ctx.plan.etp == 1:
        return None
    biased = _biased_linear(ctx)
    if not biased:
        return None
    return {"etp": ctx.plan.etp, "model": ctx.arch.name, "biased": ", ".join(biased)}



@rule("EP005", reads=())
def topk_within_experts(ctx: Context) -> Values:
    moe = ctx.arch.moe
    if moe is None or moe.top_k <= moe.num_experts:
        return None
    return {"top_k": moe.top_k, "experts": moe.num_experts}



@rule("EP006", reads=("moe_token_dispatcher",))
def flex_needs_moe(ctx: Context) -> Values:
    if ctx.plan.moe_token_dispatcher != "flex" or ctx.arch.is_moe:
        return None
    return {"model": ctx.arch.name}



@rule("EP007", reads=("zero_stage", "moe_token_dispatcher"))
def flex_dispatcher_available(ctx: Context) -> Values:
    card = ctx.card
    # the engines that run it: Megatron-Core's, and those a card names (NeMo AutoModel vendors the flex dispatcher
    # into its FSDP2 engine)
    engines = ("megatron", *(card.flex_dispatcher_engines.engines if card.flex_dispatcher_engines else ()))
    if ctx.plan.moe_token_dispatcher != "flex" or (card.flex_dispatcher and ctx.backend in engines):
        return None
    supported = [name for name in FRAMEWORKS if framework_card(name).flex_dispatcher]
    engine = f"{ctx.job.framework} ({ctx.backend} engine)" if ctx.backend != "megatron" else ctx.job.framework
    return {"framework": engine, "supported": ", ".join(supported) + " on their Megatron-Core engine"}



@rule("EP008", reads=("ep", "etp", "moe_token_dispatcher"))
def flex_needs_expert_parallelism(ctx: Context) -> Values:
    p = ctx.plan
    if p.moe_token_dispatcher != "flex" or not ctx.arch.is_moe or p.ep * p.etp > 1:
        return None
    return {"ep": p.ep, "etp": p.etp}



@rule("EP010", reads=("tp", "etp"))
def etp_on_dense_model(ctx: Context) -> Values:
    """etp > 1 on a dense model, which Megatron-Core starts and ignores (only its MoE layers read it; the expert grid
    it still builds is WS002's): a warning, the estimates those of etp=1."""
    p = ctx.plan
    if p.etp == 1 or ctx.arch.is_moe:
        return None
    return {"etp": p.etp, "tp": p.tp, "model": ctx.arch.name}



@rule("EP012", reads=("moe_token_dispatcher", "moe_a2a_overlap", "recompute", "recompute_modules"))
def shared_expert_overlap_preconditions(ctx: Context) -> Values:
    """moe_shared_expert_overlap where Megatron-Core runs it as meshplan estimates it (Megatron-LM 24bad8e677
    transformer_config.py): a framework with the key, a model with shared experts (without them a no-op: EP014), not
    beside a recomputed shared_experts module (ValueError) nor overlap_moe_expert_parallel_comm (assert), and the
    alltoall or flex dispatcher (ValueError on any other; the flex dispatcher calls the shared experts' pre_forward_comm
    as alltoall does, token_dispatcher.py), except beside flex on a framework whose flex setup turns the overlap off
    (the knob's off_beside_flex: Megatron-Bridge's apply_flex_dispatcher_backend), where the run holds none of it.
    Only as the request asks it: the framework's default yields off to such a plan (adapter_knobs.
    shared_expert_overlap), as Bridge's flex setup and performance scripts turn it off."""
    job, card, p = ctx.job, ctx.card, ctx.plan
    if not job.moe_shared_expert_overlap or not job.moe_shared_expert_overlap_asked:
        return None
    values = {"framework": card.display_name, "model": ctx.arch.name}
    refused = keyless_refusal(card, "moe_shared_expert_overlap", values)
    if refused:
        return refused
    if not ctx.arch.has_shared_experts:
        return None  # Megatron-Core runs it as a no-op there: EP014's warning
    if p.recompute == "selective" and "shared_experts" in (p.recompute_modules or ()):
        return {**values, "why": "Megatron-Core refuses it beside a recomputed shared_experts module",
                "fix": "Drop shared_experts from recompute_modules, or leave moe_shared_expert_overlap out."}
    if p.moe_a2a_overlap:
        return {**values,
                "why": "Megatron-Core asserts it off under overlap_moe_expert_parallel_comm (moe_a2a_overlap)",
                "fix": "Leave one of moe_a2a_overlap and moe_shared_expert_overlap out."}
    if p.moe_token_dispatcher == "flex" and default_version_knob(card, "moe_shared_expert_overlap").off_beside_flex:
        return {**values, "why": f"{card.display_name} turns it off beside the flex dispatcher (its flex setup, "
                                 "apply_flex_dispatcher_backend), so the run keeps none of what it would hold",
                "fix": "Set moe_token_dispatcher=alltoall, or leave moe_shared_expert_overlap out."}
    return None


def flex_backend_refusal(job: Job) -> dict[str, str] | None:
    """Why the job's flex dispatcher backend (Job.moe_flex_backend) cannot run on its GPU and framework release, as
    rule EP013's values, or None where it can: DeepEP across a multi-node NVLink domain (Megatron-Core's
    TransformerConfig: 'Currently only "hybridep" backend supports the MNNVL case'; meshplan times DeepEP's intranode
    kernels inside one node), a backend the release lacks or a GPU it refuses (the card's flex_backends, from its
    validator). What the search asks before it gives a layout the flex dispatcher (engine.run_search)."""
    card, gpu, backend = job.card, job.gpu, job.moe_flex_backend
    values = {"backend": backend, "framework": card.display_name, "gpu": gpu.name}
    other = "hybridep" if backend == "deepep" else "deepep"
    if backend == "deepep" and domain_spans_nodes(gpu, job.gpus_per_node):
        return {**values, "why": f"its NVLink domain ({fast_domain(gpu, job.gpus_per_node)} GPUs) spans several "
                                 f"{job.gpus_per_node}-GPU nodes, which only HybridEP covers (DeepEP's kernels reach "
                                 "one node's NVLink)",
                "fix": "Set moe_flex_backend=hybridep, or leave it out (hybridep on this GPU)."}
    facts = card.flex_backends
    if facts is None:
        return None
    release = job.framework_version or card.version
    runs, there = facts.runs(backend), facts.runs(other)
    instead = (f"Set moe_flex_backend={other}." if there is not None and there.takes(gpu) and not (
        other == "deepep" and domain_spans_nodes(gpu, job.gpus_per_node)) else "Use moe_token_dispatcher=alltoall.")
    if runs is None:
        return {**values, "why": f"{card.display_name} {release} has no {backend} backend", "fix": instead}
    if not runs.takes(gpu):
        return {**values, "why": f"{card.display_name} {release} runs {backend} on {runs.words()} only",
                "fix": instead}
    return None


@rule("EP013", reads=("moe_token_dispatcher",))
def flex_backend_the_job_cannot_run(ctx: Context) -> Values:
    """The flex dispatcher on a backend its GPU or framework release cannot run (flex_backend_refusal)."""
    if ctx.plan.moe_token_dispatcher != "flex" or not ctx.arch.is_moe:
        return None
    return flex_backend_refusal(ctx.job)


@rule("EP014", reads=())
def shared_expert_overlap_without_shared_experts(ctx: Context) -> Values:
    """moe_shared_expert_overlap on a model without shared experts, on a framework with the key: Megatron-Core checks
    and uses it only with moe_shared_expert_intermediate_size set (transformer_config.py; MoELayer hands the
    dispatcher shared experts only where it builds them), so the run starts and ignores it: a warning, the
    estimates those without it. As the request asks it (a framework's default is off on such a model)."""
    if not (ctx.job.moe_shared_expert_overlap and ctx.job.moe_shared_expert_overlap_asked) \
            or ctx.arch.has_shared_experts \
            or lacks_key(ctx.card, "moe_shared_expert_overlap"):
        return None
    return {"model": ctx.arch.name}


def _overlap_asserts(values: dict, job: Job) -> tuple | None:
    """EP009's screen: it passes wherever the overlap is off; with it on, the engine (ZeRO stage), whether there is EP,
    a pipeline without virtual stages, the recompute and 'moe' among its modules decide it (the model beside them)."""
    if not values["moe_a2a_overlap"]:
        return None
    return (values["zero_stage"], values["ep"] > 1, values["pp"] > 1 and values["vpp"] <= 1, values["recompute"],
            "moe" in (values["recompute_modules"] or ()))


@rule("EP009", reads=("pp", "vpp", "ep", "zero_stage", "recompute", "recompute_modules", "moe_a2a_overlap"),
      screen=_overlap_asserts)
def a2a_overlap_preconditions(ctx: Context) -> Values:
    """The first of Megatron-Core's overlap_moe_expert_parallel_comm asserts the plan breaks, with a fix that works."""
    p, arch = ctx.plan, ctx.arch
    if not p.moe_a2a_overlap:
        return None
    card = ctx.card
    if not arch.is_moe:
        return {"reason": f"{arch.name} has no experts", "fix": "Leave moe_a2a_overlap unset for a dense model."}
    if not (card.adapter is not None and card.adapter.renders("moe_a2a_overlap")) or ctx.backend != "megatron":
        supported = [n for n in FRAMEWORKS if (c := framework_card(n)).adapter is not None
                     and c.adapter.renders("moe_a2a_overlap")]
        return {"reason": f"{ctx.job.framework} has no schedule that overlaps one micro-batch's expert all-to-all "
                          "with another's compute that meshplan can render",
                "fix": f"Use moe_a2a_overlap=false, or {', '.join(supported)}."}
    if p.ep <= 1:
        return {"reason": f"ep={p.ep}: there is no expert all-to-all to hide",
                "fix": "Use ep > 1, or moe_a2a_overlap=false."}
    if p.pp > 1 and p.vpp <= 1:
        vpps = [v for v in range(2, 9) if (arch.num_layers // p.pp) % v == 0] or [2]
        return {"reason": f"pp={p.pp} without virtual pipeline stages (Megatron-Core asserts vpp is set when pp > 1)",
                "fix": f"Set vpp (e.g. {vpps[0]}), or pp=1, or moe_a2a_overlap=false."}
    if p.recompute == "full":
        return {"reason": "full recompute (Megatron-Core asserts recompute_granularity != full)",
                "fix": "Use recompute=selective without 'moe' in recompute_modules, or moe_a2a_overlap=false."}
    if p.recompute == "selective" and "moe" in (p.recompute_modules or ()):
        return {"reason": "'moe' in recompute_modules", "fix": "Drop 'moe' from recompute_modules (moe_act is "
                                                                 "allowed), or moe_a2a_overlap=false."}
    if arch.num_mtp_layers > 1:
        return {"reason": f"{arch.num_mtp_layers} MTP layers (at most one with the overlap)",
                "fix": "Use moe_a2a_overlap=false for this model."}
    return None
