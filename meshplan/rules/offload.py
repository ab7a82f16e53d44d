"""The offload rules (OF001, OF002, OF003): what the framework's engine can offload, what its activation offload needs
and where Megatron-Core refuses its layer-wise CPU offload.
Whether the node's host memory holds what is offloaded (MEM003) reads the memory estimate (meshplan/check/memory.py)."""

from __future__ import annotations

from meshplan.arithmetic.offload import unsupported_offloads
from meshplan.knowledge.gdn_config import split_layers
from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.precision import lacks_key


@rule("OF001", reads=("zero_stage", "activation_offload", "param_offload", "grad_offload", "optimizer_offload",
      "optimizer_offload_fraction"))
def offload_the_engine_lacks(ctx: Context) -> Values:
    problems = unsupported_offloads(ctx.card, ctx.job, ctx.plan)
    if not problems:
        return None
    knob, why, fix = problems[0]
    if not fix.startswith("Use zero_stage"):  # the card's nearest knob works only with this one off: said first
        fix = f"Set {knob}={'0' if knob == 'optimizer_offload_fraction' else 'false'}; {fix}"
    return {"knob": knob, "framework": ctx.card.display_name, "zero": ctx.plan.zero_stage, "why": why, "fix": fix}


@rule("OF002", reads=("zero_stage", "recompute", "activation_offload"))
def activation_offload_needs_recompute(ctx: Context) -> Values:
    plan = ctx.plan
    if not plan.activation_offload:
        return None
    sem = ctx.card.offload_at(plan.zero_stage)
    if sem is None or not sem.activation_requires or plan.recompute in sem.activation_requires:
        return None
    return {"recompute": plan.recompute, "framework": ctx.card.display_name,
            "what": "the inputs its activation checkpointing keeps", "allowed": "|".join(sem.activation_requires)}


@rule("OF003", reads=("pp", "vpp", "recompute", "activation_offload", "cuda_graph_impl"))
def layer_offload_refused(ctx: Context) -> Values:
    """Megatron-Core's layer-wise CPU offload (Job.activation_offload_layers) where its TransformerConfig refuses it
    (core_v0.13.0 and core_v0.19.0 __post_init__): as many layers as the block has or more (Transformer Engine keeps
    the last one), pipeline parallelism, any recompute, fine-grained activation offloading beside it, and CUDA graphs
    other than the full-iteration one; or a framework with no key for it, or a Mamba hybrid, whose stack never
    enters the offload context."""
    job, p, card = ctx.job, ctx.plan, ctx.card
    n = job.activation_offload_layers
    if not n:
        return None
    values = {"layers": n, "framework": card.display_name}
    instead = lacks_key(card, "activation_offload_layers")
    if instead:
        return {**values, "why": f"the {card.display_name} config meshplan writes has no key for it", "fix": instead}
    arch = job.model
    if arch.layer_pattern is not None and arch.gdn is None:
        return {**values, "why": "Megatron-Core builds a Mamba hybrid as its HybridModel, whose layer stack runs no "
                                 "CPU offload context (megatron/core/ssm at core_v0.19.0): nothing is offloaded",
                "fix": "Drop activation_offload_layers; recompute frees this model's activations instead."}
    layers = split_layers(arch)  # Megatron-Core's num_layers: a Gated DeltaNet hybrid's decoder layers
    if n >= layers:
        return {**values, "why": f"Megatron-Core offloads fewer layers than the model's {layers} ('CPU offloading can "
                                 f"be done only for layers less than {layers}')",
                "fix": f"Set activation_offload_layers to at most {layers - 1} (fewer leave layers for the copies to "
                       "run under)."}
    if p.pp > 1:
        return {**values, "why": f"pp={p.pp}: Megatron-Core has no pipeline parallelism with CPU offloading",
                "fix": "Set pp=1, or drop activation_offload_layers."}
    if p.recompute != "none":
        return {**values, "why": f"recompute={p.recompute}: Megatron-Core's CPU offloading does not work with "
                                 "activation recomputation",
                "fix": "Set recompute=none, or drop activation_offload_layers."}
    if p.activation_offload:
        return {**values, "why": "activation_offload (fine-grained activation offloading) cannot run beside it",
                "fix": "Drop one of activation_offload and activation_offload_layers."}
    if p.cuda_graph_impl not in ("none", "full_iteration"):
        return {**values, "why": f"cuda_graph_impl={p.cuda_graph_impl}: Megatron-Core runs CUDA graphs with CPU "
                                 "offloading only as the full-iteration graph",
                "fix": "Set cuda_graph_impl=none, or drop activation_offload_layers."}
    return None
