"""The framework card's LoRA facts (cards/frameworks/*.yaml `lora`, keyed by engine): whether an engine runs LoRA
jobs, its default rank and how it lays adapters out. Apart from cards.py, which holds the card; the arithmetic is
meshplan/arithmetic/lora.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshplan.schema.choices import LoraTarget


class LoraEngine(BaseModel):
    """LoRA on one engine of a framework (a `lora.<engine>` entry of its card)."""

    model_config = ConfigDict(extra="forbid")

    default_rank: int = Field(ge=1, description="The rank a LoRA job runs when the request leaves lora_rank out")
    default_rank_why: str
    default_targets_why: str | None = Field(
        None, description="Where the targets a LoRA job adapts when lora_targets is left out come from (the engine's "
                          "own default, e.g. Hugging Face PEFT's all-linear); absent: Megatron-Bridge's target_modules")
    adapters: Literal["fused", "per_projection"] = Field(
        description="fused: one adapter per Megatron-Core linear (fused QKV, fused gate/up: one A each); "
                    "per_projection: Hugging Face PEFT, one adapter per q/k/v and gate/up projection"
    )
    experts: Literal["shared", "per_expert", "none"] = Field(
        description="shared: one adapter per grouped expert linear, shared by the rank's local experts and "
                    "replicated over EP (Megatron-Bridge share_expert_adapters=True); per_expert: one per expert; "
                    "none: the routed experts get no adapter (Hugging Face PEFT's target_modules match nn.Linear "
                    "modules, and transformers 5 keeps a layer's routed experts as two 3D parameters)"
    )
    all_linear: bool = Field(
        False, description="Every target is written as Hugging Face PEFT's all-linear (verl's and SkyRL's FSDP "
                           "engines: their target_modules default), which adapts every nn.Linear but the output head, "
                           "so the model's other linears too (MLA's q/kv projections, Qwen2-MoE's shared_expert_gate, "
                           "a router built as a Linear): arithmetic/lora.py other_linears")
    adapts_mtp: bool = Field(
        False, description="The engine's LoRA adapts the multi-token-prediction blocks' linears too: Megatron-Bridge's "
                           "LoRA matches a target by module name over the whole GPTModel (peft/module_matcher.py: "
                           "name == pattern), so linear_qkv ... linear_fc2 of mtp.layers.<k>.mtp_model_layer match as "
                           "a decoder layer's do (arithmetic/lora.py mtp_adapters); PEFT on transformers' code has no "
                           "MTP block to adapt")
    target_parameters: bool = Field(
        False, description="The engine's LoRA takes Hugging Face PEFT's target_parameters, which wrap the routed "
                           "experts' 3D weights in a ParamWrapper (verl's FSDP engine: model.target_parameters into "
                           "LoraConfig); false: a request's lora_target_parameters is refused (rule LORA004)")
    hybrid_targets: list[LoraTarget] = Field(
        default_factory=list, description="The targets a job on a hybrid Mamba-2 model (model_type nemotron_h) adapts "
                                          "when it names none, those the model has: the engine's hybrid recipes' "
                                          "target_modules (Megatron-Bridge's: its four and the Mamba-2 mixer's "
                                          "in_proj, out_proj); empty: the engine's default")
    hybrid_targets_why: str | None = Field(None, description="Where hybrid_targets come from, said in the note")
    experts_why: str | None = Field(
        None, description="With experts none: why the routed experts get no adapter and what would adapt them, said in "
                          "the notes of a MoE model's LoRA job that targets linear_fc1 / linear_fc2")
    adapter_saves: Literal["parallel_adapter", "peft"] = Field(
        description="What an adapter keeps for its backward (arithmetic/lora.py adapter_activation_bytes). "
                    "parallel_adapter: Megatron-Bridge's ParallelLinearAdapter (peft/utils.py, LoRA dropout 0.0: an "
                    "Identity), whose linear_out keeps linear_in's rank-r output, whole (linear_in gathers or "
                    "all-reduces it over TP), and whose linear_in keeps its input: the base's own input tensor, "
                    "except under sequence parallelism where a layernorm-fused or column-parallel base hands it "
                    "the all-gathered input (return_layernorm_output_gathered; sequence_parallel_input_regather "
                    "off by default), a copy beside the base's local shard; peft: Hugging Face PEFT's lora.Linear "
                    "(and AutoModel's LinearLoRA), lora_B(lora_A(dropout(x))) with dropout 0.0, where each "
                    "projection's lora_B keeps its A's rank-r output and lora_A keeps x itself. On either, a linear "
                    "without an adapter keeps no input (activations.frozen_linear_bytes: torch's mm, TE's Linear, "
                    "LayerNormLinear and GroupedLinear save it only for a weight that needs a gradient)")
    source: str
