"""What an eager rollout engine (enforce_eager: no CUDA graphs) adds to every decode step: the host launches each
layer's kernels one by one. The kernels per layer are the sum of the parts the layer has (cards/rollout_kernels.yaml,
counted from the engine's model code), a function of the model and the rollout layout, never of the model's name;
each launch costs calibration.yaml rl.eager_launch_s_per_kernel.
"""

from __future__ import annotations

from typing import NamedTuple

from meshplan.knowledge.calibration import calibration_card
from meshplan.knowledge.cards import CardError
from meshplan.knowledge.rollout_kernels_card import LayerParts, rollout_kernels
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Plan


def layer_parts(arch: Architecture, index: int, plan: Plan) -> list[str]:
    """The names of the card's parts decoder layer `index` launches per decode step: its norms (and a LayerNorm
    model's residual adds), its attention (MLA with its q path, else multi-head/grouped-query with its rotary and
    q/k norms where it has them), its dense MLP or MoE block (routed experts, shared experts and their gate where
    the model has them), and the rollout layout's collectives (attention's and the MLP's all-reduce at TP > 1; an
    MoE layer's dispatch and combine in place of its all-reduce at EP > 1)."""
    names = ["norms"]
    if arch.norm_type == "layernorm":
        names.append("layernorm_residual_adds")
    if arch.mla is not None:
        names += ["mla_attention", "mla_q_lora" if arch.mla.q_lora_rank else "mla_q_direct"]
    else:
        names.append("gqa_attention")
        if arch.rope is not None:
            names.append("rotary")
        if arch.qk_norm != "none":
            names.append("qk_norm")
    moe = arch.moe is not None and index in arch.moe.moe_layers
    if moe:
        names.append("routed_experts")
        if arch.moe.shared_expert_ffn_hidden_size > 0:
            names.append("shared_experts")
            if arch.moe.shared_expert_gate:
                names.append("shared_expert_gate")
    else:
        names.append("dense_mlp")
    if plan.rollout_tp > 1:
        names.append("tp_collectives")  # attention's all-reduce and the MLP's (an MoE layer's too, unless EP)
    if moe and plan.rollout_ep > 1:
        names.append("ep_dispatch")  # the MoE layer's dispatch and combine over TP x DP
    return names


def layer_kernels(arch: Architecture, index: int, plan: Plan, parts: LayerParts) -> int:
    """Kernels decoder layer `index` launches per decode step: the sum of its parts' counts, less the MoE layer's
    all-reduce that EP's dispatch and combine replace."""
    names = layer_parts(arch, index, plan)
    total = sum(getattr(parts, n).count for n in names)
    if "tp_collectives" in names and "ep_dispatch" in names:
        total -= 1  # the MoE layer reduces through the combine, not an all-reduce of its own
    return total


class EagerLaunches(NamedTuple):
    """One decode step's kernel launches on one engine GPU and what they cost the host."""

    kernels: int
    seconds: float
    words: str


def eager_launches(arch: Architecture, plan: Plan) -> EagerLaunches:
    """The launches of one eager decode step: every decoder layer's kernels (`layer_kernels`) at
    calibration.yaml rl.eager_launch_s_per_kernel each; none where the engine runs its CUDA graphs."""
    if not plan.rollout_enforce_eager:
        return EagerLaunches(0, 0.0, "")
    engine = rollout_kernels().engines.get(plan.rollout_engine)
    if engine is None:
        raise CardError(f"cards/rollout_kernels.yaml counts no kernels for the {plan.rollout_engine} engine.",
                        fix=f"Counted engines: {', '.join(rollout_kernels().engines)}.")
    parts = engine.parts
    # a layer's parts depend on its index only through whether it is an MoE layer: one of each kind is counted
    moe = set(arch.moe.moe_layers) & set(range(arch.num_layers)) if arch.moe is not None else set()
    dense = next((i for i in range(arch.num_layers) if i not in moe), None)
    per_kind = {i: layer_kernels(arch, i, plan, parts) for i in (dense, min(moe, default=None)) if i is not None}
    kernels = per_kind.get(dense, 0) * (arch.num_layers - len(moe)) + (per_kind[min(moe)] * len(moe) if moe else 0)
    s_per_kernel = calibration_card().rl.eager_launch_s_per_kernel.value
    kinds = sorted(set(per_kind.values()))
    spread = (f"{kinds[0]}" if len(kinds) == 1 else f"{kinds[0]}-{kinds[-1]}")
    words = (f"{kernels * s_per_kernel * 1e3:.1f} ms of eager kernel launches ({kernels:,} kernels: {spread} per "
             f"layer x {arch.num_layers} layers at {s_per_kernel * 1e6:.0f} us)")
    return EagerLaunches(kernels, kernels * s_per_kernel, words)
