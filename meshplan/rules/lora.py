"""The LoRA rules of cards/rules.yaml (LORA*): a LoRA job on an engine that has it, on linears the model has.

Each condition returns None when its rule passes (or the job trains every weight), else the numbers for the card's
message and fix templates; the facts are the framework cards' `lora` sections and adapter knobs
(meshplan/arithmetic/lora.py).
"""

from __future__ import annotations

from meshplan.arithmetic.lora import (
    MAMBA_TARGETS,
    MLA_TARGETS,
    PEFT_TARGETS,
    lora_engine,
    lora_engines,
    lora_frameworks,
    model_targets,
)
from meshplan.knowledge.cards import framework_card
from meshplan.rules.engine import Context, Values, rule
from meshplan.schema.choices import FRAMEWORKS


@rule("LORA001", reads=("zero_stage",))
def lora_needs_an_engine_with_it(ctx: Context) -> Values:
    spec = ctx.job.lora
    if spec is None or lora_engine(ctx.card, ctx.plan.zero_stage) is not None:
        return None
    card = ctx.card
    engine = card.engine_at(ctx.plan.zero_stage)
    adapter = card.adapter
    instead = None
    if adapter is not None:
        instead = adapter.versions[adapter.default_version].knobs["lora_rank"].instead
    others = [f for f in lora_frameworks() if f != ctx.framework]
    fix = instead or f"Use a framework that runs LoRA: {', '.join(others)}."
    where = f"its {engine} engine (zero_stage={ctx.plan.zero_stage})" if adapter and instead is None else "it"
    return {"framework": card.display_name, "rank": spec.rank, "where": where, "fix": fix}


@rule("LORA002", reads=())
def lora_targets_the_model_has(ctx: Context) -> Values:
    spec = ctx.job.lora
    if spec is None:
        return None
    has = model_targets(ctx.arch)
    missing = [t for t in spec.targets if t not in has]
    if not missing:
        return None
    mla = sorted(has & set(MLA_TARGETS))
    why = (f" (MLA attention: its q/kv linears are {', '.join(mla)}, not linear_qkv)"
           if mla and "linear_qkv" in missing else
           " (MLA attention's linear_q_proj, or linear_q_down_proj and linear_q_up_proj with a q_lora_rank)"
           if ctx.arch.mla is not None and set(missing) & set(MLA_TARGETS) else
           " (its attention is not MLA)" if set(missing) & set(MLA_TARGETS) else
           " (router: transformers builds it as an nn.Linear only in DeepSeek-V2's code; shared_expert_gate: "
           "Qwen2-MoE's)" if set(missing) & set(PEFT_TARGETS) else
           " (in_proj and out_proj are a hybrid's Mamba-2 mixer linears; it has no Mamba-2 layer)"
           if set(missing) & set(MAMBA_TARGETS) and ctx.arch.mamba is None else
           f" (its layer pattern {ctx.arch.layer_pattern} holds no layer with it: M holds in_proj and out_proj, * "
           "linear_qkv and linear_proj, - and E linear_fc1 and linear_fc2)" if ctx.arch.layer_pattern else "")
    return {"model": ctx.arch.name, "missing": ", ".join(missing), "why": why,
            "has": ", ".join(t for t in spec.targets if t in has) or ", ".join(sorted(has))}


@rule("LORA003", reads=("zero_stage",))
def peft_only_targets_on_a_peft_engine(ctx: Context) -> Values:
    spec = ctx.job.lora
    engine = lora_engine(ctx.card, ctx.plan.zero_stage)
    named = [t for t in (spec.targets if spec is not None else []) if t in PEFT_TARGETS]
    if not named or engine is None or engine.all_linear:  # no engine: LORA001 says so
        return None
    peft = [f"{f} ({name} engine)" for f in FRAMEWORKS  # every framework: one without LoRA has no engine listed
            for name, e in lora_engines(framework_card(f)).items() if e.all_linear]
    return {"targets": ", ".join(named), "framework": ctx.card.display_name,
            "engine": ctx.card.engine_at(ctx.plan.zero_stage), "peft": ", ".join(peft)}


@rule("LORA004", reads=("zero_stage",))
def target_parameters_on_a_peft_engine(ctx: Context) -> Values:
    spec = ctx.job.lora
    engine = lora_engine(ctx.card, ctx.plan.zero_stage)
    if spec is None or not spec.target_parameters or engine is None or engine.target_parameters:
        return None  # no engine: LORA001 says so
    peft = [f"{f} ({name} engine)" for f in FRAMEWORKS
            for name, e in lora_engines(framework_card(f)).items() if e.target_parameters]
    return {"weights": ", ".join(spec.target_parameters), "framework": ctx.card.display_name,
            "engine": ctx.card.engine_at(ctx.plan.zero_stage), "peft": ", ".join(peft)}


@rule("LORA005", reads=())
def target_parameters_need_routed_experts(ctx: Context) -> Values:
    spec = ctx.job.lora
    if spec is None or not spec.target_parameters or ctx.arch.moe is not None:
        return None
    return {"weights": ", ".join(spec.target_parameters), "model": ctx.arch.name}


@rule("LORA006", reads=())
def lora_on_a_gdn_hybrid(ctx: Context) -> Values:
    """LoRA on a Gated DeltaNet hybrid (qwen3_next): Megatron-Bridge's Qwen3-Next PEFT recipe raises
    NotImplementedError, so no LoRA plan of it is one the framework runs (the other frameworks build no GDN: HY003,
    HY004)."""
    if ctx.job.lora is None or ctx.arch.gdn is None:
        return None
    return {"model": ctx.arch.name, "framework": ctx.job.framework}
