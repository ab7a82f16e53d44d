"""What a framework's adapter can write, read from its card's `adapter` section (pure card reading, no adapter code).

Knobs a framework lacks carry `key: null` and an `instead` saying what to do. `missing_knob` names the first knob a
plan uses that a version and variant cannot express: `render` refuses with it (adapters/capabilities.py
refuse_missing) and rule AD001 reports it in `check`, so both ask this one function and cannot drift. `unwritable`
asks the same tables (or a card's `cannot_run`, without an adapter) of one knob, for rule RC005.

Every function takes the framework's card, never its name: the rules, the search and the resolver hand it the job's
own (`job.card`, `ctx.card`: resolved once, tests/test_resolve_once.py), the adapters the card of the framework they
write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshplan.knowledge.adapter_card import AdapterKnob, AdapterSection
from meshplan.knowledge.cards import CardError, FrameworkCard
from meshplan.schema.choices import Engine
from meshplan.schema.plan import Job, Plan

# verl's and SkyRL's variants by (RL job, the engine they run): a training job runs their SFT trainer (verl
# sft_trainer, SkyRL main_sft), which starts no rollout engine, an RL job their RL trainer; on the FSDP engine or the
# Megatron one, which the plan's ZeRO stage selects (the card's engine.by_zero_stage: zero_stage 3 is FSDP).
ENGINE_VARIANTS: dict[str, dict[tuple[bool, Engine], str]] = {
    "verl": {(True, "fsdp"): "fsdp", (False, "fsdp"): "sft-fsdp", (True, "megatron"): "megatron",
             (False, "megatron"): "sft-megatron"},
    "skyrl": {(True, "fsdp"): "fsdp", (False, "fsdp"): "sft-fsdp", (True, "megatron"): "rl",
              (False, "megatron"): "sft"},
}


def engine_variant(card: FrameworkCard, job: Job, plan: Plan) -> str:
    """verl's or SkyRL's variant for the job's kind and the engine the plan's ZeRO stage runs (ENGINE_VARIANTS)."""
    return ENGINE_VARIANTS[card.name][(job.rl is not None, card.engine_at(plan.zero_stage))]


def variant_engine(framework: str, variant: str) -> Engine | None:
    """The engine a variant of verl or SkyRL runs (ENGINE_VARIANTS); None for another framework's."""
    return next((engine for (_, engine), name in ENGINE_VARIANTS.get(framework, {}).items() if name == variant), None)


# The variant `render` writes when none is given, per renderable framework (adapters/render.py BUILDERS), from the
# card of the framework written (a job may be rendered for another framework than its own).
DEFAULT_VARIANTS: dict[str, Callable[[FrameworkCard, Job, Plan], str]] = {
    "megatron-core": lambda card, job, plan: "pretrain_gpt",
    "megatron-bridge": lambda card, job, plan: "python",
    "deepspeed": lambda card, job, plan: "megatron-deepspeed" if plan.tp > 1 or plan.pp > 1 or plan.ep > 1
    else "config",
    "verl": engine_variant,
    "skyrl": engine_variant,
    "torchtitan": lambda card, job, plan: "cli",
    "kempnerforge": lambda card, job, plan: "toml",
    "nemo-automodel": lambda card, job, plan: "yaml",
}


def adapter_section(card: FrameworkCard) -> AdapterSection:
    """The `adapter` section of a framework card (meshplan/knowledge/adapter_card.py validates it when the card
    loads)."""
    section = card.adapter
    if section is None:
        raise CardError(f"cards/frameworks/{card.name}.yaml has no 'adapter' section.")
    return section


def knob_table(card: FrameworkCard, version: str, variant: str) -> dict[str, AdapterKnob]:
    """The knobs of one version and variant: the version's table with the variant's overrides."""
    section = adapter_section(card)
    return {**section.versions[version].knobs, **section.variant_knobs.get(variant, {})}


def off_beside_flex(card: FrameworkCard, name: str) -> bool:
    """Whether the framework's own flex-dispatcher setup turns this knob off (its default version's off_beside_flex:
    Megatron-Bridge's apply_flex_dispatcher_backend, moe_shared_expert_overlap); False without an adapter."""
    if card.adapter is None:
        return False
    knob = card.adapter.versions[card.adapter.default_version].knobs.get(name)
    return knob is not None and knob.off_beside_flex


def shared_expert_overlap(job: Job, plan: Plan) -> bool:
    """Whether the plan's run overlaps the shared experts with the token dispatch (Megatron-Core's
    moe_shared_expert_overlap), the one predicate the memory, the search's floors, the time, the assumptions and the
    renders read: never on a model without shared experts (Megatron-Core ignores it there: rule EP014); the request's
    value as asked (rule EP012 refuses the plans that cannot run it); else the framework's default for the model
    (Job.moe_shared_expert_overlap, the card's defaults), which yields off where the run cannot keep it: beside the
    flex dispatcher on a framework whose flex setup turns it off (off_beside_flex: Megatron-Bridge's
    apply_flex_dispatcher_backend), beside moe_a2a_overlap (Megatron-Core asserts it off; Bridge's performance scripts
    set it False there) and beside a recomputed shared_experts module (Megatron-Core's ValueError)."""
    if not job.moe_shared_expert_overlap or not job.model.has_shared_experts:
        return False
    if job.moe_shared_expert_overlap_asked:
        return True
    if plan.moe_token_dispatcher == "flex" and off_beside_flex(job.card, "moe_shared_expert_overlap"):
        return False
    recomputed = plan.recompute == "selective" and "shared_experts" in (plan.recompute_modules or ())
    return not plan.moe_a2a_overlap and not recomputed


def shared_overlap_in_every_plan(job: Job) -> bool:
    """Whether every plan the search may give the job runs the shared-expert overlap (shared_expert_overlap): where
    the request asked for it (rule EP012 refuses the others), so a lower bound over plans counts its bytes there only
    (a default yields to the plan's dispatcher and overlap)."""
    return job.moe_shared_expert_overlap and job.moe_shared_expert_overlap_asked and job.model.has_shared_experts


def shared_overlap_in_some_plan(job: Job) -> bool:
    """Whether any plan the search may give the job runs the shared-expert overlap (shared_expert_overlap, before
    the plan's dispatcher, EP overlap and recompute have their say): what the search's step-time bounds over plans
    must allow for (search/bounds._alone_key)."""
    return job.moe_shared_expert_overlap and job.model.has_shared_experts


def knobs_in_use(job: Job, plan: Plan) -> list[str]:
    """The knobs a plan actually uses (a degree of 1 or an off switch uses nothing)."""
    used = ["micro_batch_size", "global_batch_size", f"zero_{plan.zero_stage}"]
    for name in LAYOUT_DEGREES:
        if getattr(plan, name) > 1:
            used.append(name)
    if plan.cp > 1 and plan.cp_comm_type != "p2p":
        used.append("cp_comm_type")
    if plan.sequence_parallel:
        used.append("sequence_parallel")
    used.append(f"recompute_{plan.recompute}")  # none too: a config may have no way to turn checkpointing off
    if plan.recompute == "full" and plan.recompute_layers is not None:
        used.append("recompute_layers")
        if plan.recompute_method == "uniform" and plan.recompute_layers > 1:
            used.append("recompute_method")
    if plan.recompute == "selective" and plan.recompute_modules is not None:
        used.append("recompute_modules")
    if plan.recompute == "selective" and plan.selective_ac_option not in (None, "op"):
        used.append("selective_ac_option")  # "op" is what every torchtitan selective means
    if plan.first_stage_layers is not None or plan.last_stage_layers is not None:
        used.append("uneven_pp")
    for name in ("pipeline_layout", "account_for_embedding", "account_for_loss"):
        if getattr(plan, name) not in (None, False):
            used.append(name)
    if job.precision == "fp8":
        used.append("fp8")
    if job.model.moe is not None and plan.moe_token_dispatcher == "flex":
        used += ["moe_flex_dispatcher", "moe_flex_backend"]
    if job.model.moe is not None and plan.moe_a2a_overlap:
        used.append("moe_a2a_overlap")
    if (job.moe_shared_expert_overlap and job.moe_shared_expert_overlap_asked) or shared_expert_overlap(job, plan):
        used.append("moe_shared_expert_overlap")  # asked (a no-op without shared experts: EP014), or the run's
    if job.activation_offload_layers:
        used.append("activation_offload_layers")
    if plan.torch_compile:
        used.append("torch_compile")
    if plan.tp_comm_overlap:
        used.append("tp_comm_overlap")
    if plan.cuda_graph_impl != "none":
        used.append("cuda_graphs")
    if job.lora is not None:  # a LoRA job (meshplan/arithmetic/lora.py): rank and targets
        used += ["lora_rank", "lora_targets"]
    if job.mtp_asked:  # the MTP depth (and repeated layer) the request set (request/mtp_depth.py)
        used.append("mtp_num_layers")
    if plan.attention_backend != "auto":
        used.append("attention_backend")
    if plan.pipeline_schedule is not None:
        used.append("pipeline_schedule")
    if plan.dropout:
        used.append("dropout")
    used += precision_knobs(job, plan)
    used += [name for name in ("activation_offload", "param_offload", "grad_offload", "optimizer_offload")
             if getattr(plan, name)]
    if plan.optimizer_offload_fraction > 0:
        used.append("optimizer_offload_fraction")
    return used


def precision_knobs(job: Job, plan: Plan) -> list[str]:
    """The optimizer and precision knobs a plan uses: an optimizer other than adam, a moment dtype other than fp32,
    fp8 weights, an explicit reduce dtype, and an explicit fp8 recipe (left out = the framework's own default,
    nothing to render)."""
    used = ["optimizer"] if plan.optimizer != "adam" else []  # adam: every framework's default, nothing to render
    if plan.optimizer_state_dtype not in (None, "fp32"):
        used.append("optimizer_state_dtype")
    if plan.fp8_param_gather:
        used.append("fp8_param_gather")
    if plan.grad_reduce_in_fp32 is not None:
        used.append("grad_reduce_fp32" if plan.grad_reduce_in_fp32 else "grad_reduce_bf16")
    if job.precision == "fp8" and plan.fp8_recipe is not None:
        used.append(f"fp8_{plan.fp8_recipe}")
    used += [name for name in ("fp8_activation_input_store", "fp8_dot_product_attention") if getattr(job, name)]
    return used


def describe_knob(name: str, plan: Plan, job: Job) -> str:
    value = {
        "zero_0": "zero_stage=0", "zero_1": "zero_stage=1", "zero_2": "zero_stage=2", "zero_3": "zero_stage=3",
        "recompute_none": "recompute=none", "recompute_selective": "recompute=selective",
        "recompute_full": "recompute=full",
        "recompute_layers": f"recompute_layers={plan.recompute_layers}",
        "selective_ac_option": f"selective_ac_option={plan.selective_ac_option}",
        "recompute_method": f"recompute_method={plan.recompute_method}",
        "recompute_modules": f"recompute_modules={plan.recompute_modules}",
        "uneven_pp": f"first_stage_layers={plan.first_stage_layers}, last_stage_layers={plan.last_stage_layers}",
        "fp8": "precision=fp8", "cp_comm_type": f"cp_comm_type={plan.cp_comm_type}",
        "sequence_parallel": "sequence_parallel=true", "moe_flex_dispatcher": "moe_token_dispatcher=flex",
        "moe_a2a_overlap": "moe_a2a_overlap=true", "moe_flex_backend": f"moe_flex_backend={job.moe_flex_backend}",
        "moe_shared_expert_overlap": "moe_shared_expert_overlap=true",
        "activation_offload_layers": f"activation_offload_layers={job.activation_offload_layers}",
        "torch_compile": "torch_compile=true",
        "tp_comm_overlap": "tp_comm_overlap=true",
        "cuda_graphs": f"cuda_graph_impl={plan.cuda_graph_impl}, cuda_graph_modules={list(plan.cuda_graph_modules)}",
        "attention_backend": f"attention_backend={plan.attention_backend}",
        "dropout": "dropout=true", "pipeline_schedule": f"pipeline_schedule={plan.pipeline_schedule}",
        "pipeline_layout": f"pipeline_layout={plan.pipeline_layout!r}", "account_for_embedding":
        "account_for_embedding=true", "account_for_loss": "account_for_loss=true",
        "optimizer": f"optimizer={plan.optimizer}",
        "optimizer_state_dtype": f"optimizer_state_dtype={plan.optimizer_state_dtype}",
        "fp8_param_gather": "fp8_param_gather=true", "grad_reduce_fp32": "grad_reduce_in_fp32=true",
        "fp8_activation_input_store": "fp8_activation_input_store=true",
        "fp8_dot_product_attention": "fp8_dot_product_attention=true",
        "grad_reduce_bf16": "grad_reduce_in_fp32=false",
        "activation_offload": "activation_offload=true", "param_offload": "param_offload=true",
        "grad_offload": "grad_offload=true", "optimizer_offload": "optimizer_offload=true",
        "optimizer_offload_fraction": f"optimizer_offload_fraction={plan.optimizer_offload_fraction:g}",
        **{f"fp8_{r}": f"fp8_recipe={r}" for r in ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")},
    }.get(name)
    if name == "mtp_num_layers":
        value = (f"mtp_num_layers={job.model.num_mtp_layers}"
                 + (", mtp_use_repeated_layer=true" if job.model.mtp_repeated_layer else ""))
    if name in ("lora_rank", "lora_targets") and job.lora is not None:
        value = f"lora_rank={job.lora.rank}" if name == "lora_rank" else f"lora_targets={job.lora.targets}"
    return value or f"{name}={getattr(plan, name, '?')}"



@dataclass(frozen=True)
class MissingKnob:
    """A knob a plan uses that one framework version and variant cannot express, and what to do instead."""

    knob: str  # the adapter knob name (cards' adapter tables)
    setting: str  # the plan's setting, as the user writes it (zero_stage=1)
    reason: str  # a clause ("it has no such knob", or which values its key takes): the sentence ends it
    instead: str


# The knobs of the parallel layout itself (degrees and ZeRO stage): the ones rule AD001 asks about. The rest (fp8,
# account_for_embedding, ...) are settings an adapter may not write yet; `render` alone refuses those.
LAYOUT_KNOBS: frozenset[str] = frozenset({"tp", "pp", "vpp", "cp", "ep", "etp", "zero_0", "zero_1", "zero_2", "zero_3",
                                         "dp_replicate"})


# The knobs that tell a pipeline its split. Rule AD001 asks about them where the framework partitions the layers itself
# (its card's pipeline.partition, DeepSpeed's): there a given split is not the split that runs, so the layout itself
# differs; where a framework is told its split, a key missing is render's refusal alone.
SPLIT_KNOBS: frozenset[str] = frozenset({"uneven_pp", "pipeline_layout", "account_for_embedding", "account_for_loss"})


def missing_knob(card: FrameworkCard, version: str, variant: str, job: Job, plan: Plan,
                 only: frozenset[str] | None = None) -> MissingKnob | None:
    """The first knob the plan uses (of `only`, when given) that this framework version and variant cannot express,
    or None."""
    table = knob_table(card, version, variant)
    for name in knobs_in_use(job, plan):
        if only is not None and name not in only:
            continue
        knob = table[name]
        chosen = {"pipeline_schedule": plan.pipeline_schedule, "optimizer": plan.optimizer,
                  "optimizer_state_dtype": plan.optimizer_state_dtype, "attention_backend": plan.attention_backend,
                  "moe_flex_backend": job.moe_flex_backend}.get(
            name)  # the knobs with a vocabulary (AdapterKnob.values) a value may be missing from; a switch's values
        # (DeepSpeed's offload device) only say how its key writes it
        if chosen is not None and knob.values is not None and knob.key is not None and \
                knob.values.get(str(chosen)) is None:
            takes = ", ".join(k for k, v in knob.values.items() if v is not None)
            return MissingKnob(name, describe_knob(name, plan, job), f"its {knob.key} takes {takes}", knob.instead)
        if knob.key is None:
            return MissingKnob(name, describe_knob(name, plan, job), "it has no such knob", knob.instead)
    return None


def missing_layout_knob(card: FrameworkCard, version: str, variant: str, job: Job, plan: Plan) -> MissingKnob | None:
    """missing_knob(..., only=LAYOUT_KNOBS), what rule AD001 asks of every plan the search checks. The layout knobs a
    plan uses (knobs_in_use's, in its order: its ZeRO stage, then each degree over 1) and whether the version and
    variant can write them depend on few fields, so the first one missing is kept per (card's adapter section,
    version, variant, those knobs, pipeline schedule, attention backend); its setting is worded from the plan."""
    section = adapter_section(card)
    used = (f"zero_{plan.zero_stage}", *(name for name in LAYOUT_DEGREES if getattr(plan, name) > 1))
    key = (id(section), card.name, version, variant, used, plan.pipeline_schedule, plan.attention_backend)
    hit = _layout_missing.get(key)
    if hit is None:
        found = missing_knob(card, version, variant, job, plan, LAYOUT_KNOBS)
        hit = _layout_missing[key] = (section, found and (found.knob, found.reason, found.instead))
    if hit[1] is None:
        return None
    name, reason, instead = hit[1]
    return MissingKnob(name, describe_knob(name, plan, job), reason, instead)


def rendered_knob(card: FrameworkCard, job: Job, plan: Plan, name: str) -> AdapterKnob | None:
    """The knob `name` on the version and variant `render` writes by default for this plan (verl's and SkyRL's: the
    engine its ZeRO stage runs, ENGINE_VARIANTS); None where the framework has no adapter."""
    target = default_render(card, job, plan)
    return None if target is None else knob_table(card, *target)[name]


def unwritable_reason(card: FrameworkCard, job: Job, plan: Plan, name: str) -> str | None:
    """What the run does instead of the missing knob `name` (its card `reason`, REASON_KNOBS), on the version and
    variant `render` writes by default; None where that config can write it, or on a card without an adapter (whose
    cannot_run gives no reason: rule RC006 refuses there)."""
    knob = rendered_knob(card, job, plan, name)
    return knob.reason if knob is not None and knob.key is None else None


def unwritable(card: FrameworkCard, job: Job, plan: Plan, name: str) -> str | None:
    """What to do instead where the framework cannot run the knob `name` for this plan: on the version and variant
    `render` writes by default, a key null (its `instead`); on a card without an adapter, its `cannot_run` entry.
    None where it can. Rule RC005 asks it (the plan's fields it reads: zero_stage, tp, pp, ep, through
    DEFAULT_VARIANTS)."""
    knob = rendered_knob(card, job, plan, name)
    if knob is None:
        return card.cannot_run.get(name)
    return knob.instead if knob.key is None else None


LAYOUT_DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp_replicate")  # the degrees a plan uses when over 1, in order
_layout_missing: dict[tuple, tuple[AdapterSection, tuple[str, str, str] | None]] = {}  # (the section kept alive)


def default_render(card: FrameworkCard, job: Job, plan: Plan) -> tuple[str, str] | None:
    """(version, variant) `render` writes for this job when neither is given, or None when the framework has no
    adapter: the request's release when the adapter has that version, else the card's default version."""
    if not card.renderable or card.name not in DEFAULT_VARIANTS:
        return None
    section = adapter_section(card)
    version = job.framework_version if job.framework_version in section.versions else section.default_version
    return version, DEFAULT_VARIANTS[card.name](card, job, plan)
