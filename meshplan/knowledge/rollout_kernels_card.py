"""cards/rollout_kernels.yaml: the kernels one decoder layer launches per decode step in a rollout engine run eager
(no CUDA graphs), per part of the layer, each part's kernels named from the engine's source. meshplan/rl/launches.py
adds the parts a layer has; calibration.yaml rl.eager_launch_s_per_kernel prices each launch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from meshplan.knowledge.cards import load_card
from meshplan.schema.choices import RolloutEngine


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KernelPart(_Card):
    """One part of a decoder layer: the kernels it launches per decode step, by name (the count is their number)."""

    kernels: list[str] = Field(min_length=1)
    source: str

    @property
    def count(self) -> int:
        return len(self.kernels)


class LayerParts(_Card):
    """Every part a decoder layer of a model meshplan knows can have, each named, so a card missing one fails when it
    loads (meshplan/rl/launches.py layer_kernels says which parts a layer has)."""

    norms: KernelPart
    layernorm_residual_adds: KernelPart = Field(description="LayerNorm models: the residual adds a fused RMSNorm "
                                                            "does inside")
    gqa_attention: KernelPart = Field(description="Multi-head / grouped-query attention, without its rotary")
    rotary: KernelPart
    qk_norm: KernelPart
    mla_attention: KernelPart = Field(description="Multi-head latent attention, without its q projections")
    mla_q_lora: KernelPart = Field(description="MLA's q through a low-rank down/up projection (q_lora_rank)")
    mla_q_direct: KernelPart = Field(description="MLA's q in one projection (no q_lora_rank)")
    dense_mlp: KernelPart
    routed_experts: KernelPart = Field(description="An MoE layer's router, top-k and fused routed experts")
    shared_experts: KernelPart
    shared_expert_gate: KernelPart
    tp_collectives: KernelPart = Field(description="Per layer at rollout TP > 1: attention's and the MLP's or MoE "
                                                   "layer's all-reduce")
    ep_dispatch: KernelPart = Field(description="An MoE layer's dispatch and combine with rollout EP > 1, in place "
                                                "of its all-reduce")


class EngineKernels(_Card):
    """One rollout engine's eager decode step, part by part."""

    eager_mode: str = Field(description="What the engine's eager switch turns off, from its source")
    read_at: str = Field(description="Which version of the engine's source the parts were counted from")
    parts: LayerParts


class RolloutKernelsCard(_Card):
    description: str
    engines: dict[RolloutEngine, EngineKernels]


def rollout_kernels() -> RolloutKernelsCard:
    return load_card("rollout_kernels", RolloutKernelsCard)
