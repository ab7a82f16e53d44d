"""The closed sets of values request and plan fields take (Literal types), and the strict base every schema model
shares: an unknown field is refused, never ignored.

The frameworks are one per framework card (cards/frameworks/<name>.yaml); what each value means in a framework is
in its card.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticUndefined

from meshplan.core.card_files import framework_names

# The frameworks meshplan knows: one per framework card (cards/frameworks/<name>.yaml), sorted by name. What
# each framework is (engine, byte convention, defaults, limits, what the search opens) is in its card.
FRAMEWORKS: tuple[str, ...] = framework_names()
Framework = Literal[FRAMEWORKS]  # type: ignore[valid-type]
Precision = Literal["bf16", "fp8"]
Recompute = Literal["none", "selective", "full"]
# Megatron-Core's selective recompute_modules (transformer_config.py; its default is ["core_attn"])
RecomputeModule = Literal["core_attn", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj", "layernorm",
                          "gdn_norm_out"]
CpCommType = Literal["p2p", "a2a", "allgather", "a2a+p2p"]
# Megatron-Core's moe_token_dispatcher_type: "alltoall" sends every routed copy of a token to its expert's
# rank; "flex" (DeepEP / HybridEP backends) sends a token once per destination node and fans it out there.
MoeDispatcher = Literal["alltoall", "flex"]
# The flex dispatcher's backend (Megatron-Core moe_flex_dispatcher_backend, core_v0.16.0 on; NeMo AutoModel's
# model.backend.dispatcher): DeepEP's kernels inside one node's NVLink and over RDMA between nodes, or HybridEP's,
# which also span a multi-node NVLink domain (GB200 NVL72) and permute the tokens as they copy them.
FlexBackend = Literal["deepep", "hybridep"]
# The attention implementation (each framework's own values: its card's attention.backends and adapter knob): flash
# (FlashAttention), fused (cuDNN / Transformer Engine FusedAttention; CK or AOTriton on ROCm), unfused (the scores
# materialised: softmax in its own kernel), auto (what the framework picks by itself: its card's attention section).
AttentionBackend = Literal["auto", "flash", "fused", "unfused"]
# The pipeline schedule (meshplan/arithmetic/pipeline_timeline.py replays each): gpipe (all forwards, then all
# backwards), 1f1b, interleaved_1f1b (vpp > 1), zero_bubble (the backward split into input and weight gradients, the
# weight gradients filling the bubble: torch ScheduleZBVZeroBubble in a V at vpp = 2, ScheduleInterleavedZeroBubble
# above), dualpipev (torch ScheduleDualPipeV, two chunks per rank in a V), combined_1f1b (Megatron-Core's 1F1B with
# overlap_moe_expert_parallel_comm: one micro-batch's expert all-to-all hidden behind another's compute). Which
# framework runs which: its card's pipeline.schedules.
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "dualpipev", "combined_1f1b"]
# Adam moments' dtype (Megatron's precision-aware optimizer --exp-avg-dtype / --exp-avg-sq-dtype choices)
OptimizerStateDtype = Literal["fp32", "bf16", "fp16", "fp8"]
# The optimizer: Adam, or Muon on the 2-D matrices (Megatron-Core --optimizer adam|muon; the rest stays on Adam)
Optimizer = Literal["adam", "muon"]
# Megatron-Core's fused cross-entropy implementations (cross_entropy_fusion_impl): its own torch.compile'd one and
# Transformer Engine's Triton parallel_cross_entropy
CrossEntropyFusionImpl = Literal["native", "te"]
# Megatron-Core's three cross-entropy losses (cards/memory.yaml megatron_cross_entropy's keys): its unfused
# vocab_parallel_cross_entropy and the two fused implementations
MegatronLoss = Literal["unfused", "native", "te"]
# FP8 scaling recipes: Transformer Engine's as Megatron-Core's --fp8-recipe names them (transformer_config.py
# fp8_recipe), and torchao's per-row scaling (torchtitan's float8 recipe_name rowwise)
Fp8Recipe = Literal["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"]
# Megatron-Core 0.19's CUDA graphs (transformer_config.py cuda_graph_impl and cuda_graph_modules, CudaGraphModule;
# Megatron-Bridge's model.cuda_graph_impl / model.cuda_graph_modules): per-layer graphs (local, transformer_engine)
# of the modules named, an empty list the whole transformer layer, or one graph of the forward-backward iteration
# (full_iteration, no modules). Older releases' cuda_graph_scope, full_iteration among its values, is read as these.
CudaGraphImpl = Literal["none", "local", "transformer_engine", "full_iteration"]
CudaGraphModule = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
# An RL post-training job (meshplan/rl/): what is run, with which algorithm, engine and placement.
JobKind = Literal["pretrain", "sft", "lora", "rl"]
# Megatron-Core linear names LoRA adapts (Megatron-Bridge peft/lora.py LoRA.target_modules; its default: these four)
DefaultLoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
# MLA attention's own linears (Megatron-Core MLASelfAttention: linear_q_proj without a q_lora_rank, else
# linear_q_down_proj and linear_q_up_proj; linear_kv_down_proj, linear_kv_up_proj), which Megatron-Bridge's MLA recipes
# target by name (recipes/moonlight/h100/moonlight_16b.py, recipes/glm/h100/glm5.py peft target_modules)
MlaLoraTarget = Literal["linear_q_proj", "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj",
                        "linear_kv_up_proj"]
# The other nn.Linear modules transformers builds in a decoder layer, which Hugging Face PEFT adapts when named (verl's
# and SkyRL's FSDP engines): DeepSeek-V2's router (mlp.gate, nn.Linear(hidden, experts)) and Qwen2-MoE's
# shared_expert_gate (nn.Linear(hidden, 1)); Megatron-Bridge's LoRA has no such names (arithmetic/lora.py other_linears)
PeftLoraTarget = Literal["router", "shared_expert_gate"]
# A hybrid model's Mamba-2 mixer linears (Megatron-Core MambaMixer in_proj, out_proj), which Megatron-Bridge's
# Nemotron-H and Nemotron 3 recipes add to the four (recipes/nemotronh/h100/nemotron_3_nano.py mamba_target_modules)
MambaLoraTarget = Literal["in_proj", "out_proj"]
LoraTarget = Literal[DefaultLoraTarget, MlaLoraTarget, MambaLoraTarget, PeftLoraTarget]
# The routed experts' two 3D nn.Parameters in transformers 5's MoE code (Qwen3MoeExperts and the other families:
# gate_up_proj, E x 2I x H where gated, and down_proj, E x H x I), the names Hugging Face PEFT's target_parameters end
# with (verl's model.target_parameters): LoRA on them through PEFT's ParamWrapper (arithmetic/param_wrapper.py)
ExpertWeight = Literal["gate_up_proj", "down_proj"]
RLAlgorithm = Literal["grpo", "dapo", "ppo"]
# A framework's training engine family: what rules.yaml's `backends` and the card sections keyed by engine name
Engine = Literal["megatron", "fsdp", "deepspeed", "nanotron"]
# How an engine pads a micro-batch to its context-parallel split itself (a framework card's engine.cp_padding):
# per_sequence, each sequence to a multiple of tp*2*cp (tp at cp 1); packed, the micro-batch's sequences packed and
# their total to a multiple of cp (Ulysses). arithmetic/activations.cp_rank_tokens counts the tokens it leaves a rank.
CpPadding = Literal["per_sequence", "packed"]
RolloutEngine = Literal["vllm", "sglang"]
Placement = Literal["colocated", "separate"]
Severity = Literal["error", "warning", "info"]


class StrictModel(BaseModel):
    """A schema model that refuses a field it does not define (request/parse.py words the refusal for a request)."""

    model_config = ConfigDict(extra="forbid")

    def copied(self, update: dict[str, Any]) -> Self:
        """self.model_copy(update=update), part for part as pydantic's __copy__ and update make it (the field values
        with the update's, the fields set with its names, the extra and private values copied; nothing validated), in
        about 60% of its instructions: model_copy copies each part through copy.copy and checks the config, and the
        search copies a layout's plan for each knob set it asks (Llama-3.1-70B on 64 H100: ~700 a first ask)."""
        made = _new(type(self))
        _set(made, "__dict__", self.__dict__ | update)
        extra = self.__pydantic_extra__
        _set(made, "__pydantic_extra__", None if extra is None else dict(extra))
        _set(made, "__pydantic_fields_set__", self.__pydantic_fields_set__ | update.keys())
        private = getattr(self, "__pydantic_private__", None)
        _set(made, "__pydantic_private__", None if private is None else {
            name: value for name, value in private.items() if value is not PydanticUndefined})
        return made


_new, _set = object.__new__, object.__setattr__
