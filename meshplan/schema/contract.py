"""Inputs and results shared by every face of meshplan: the CLI, the MCP tools, the adapters and the benchmarks.

The request fields are defined once here (`Request`); the CLI turns them into flags, the MCP server
into tool arguments, batch mode reads them from JSON lines. A request resolves into a `Job` (model,
cluster, training settings, framework) and a `Plan` (the parallel layout); every estimator is a pure
function of those two. Units are bytes, seconds and FLOP/s in every structured result.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.core.card_files import framework_names

# The frameworks meshplan knows: one per framework card (cards/frameworks/<name>.yaml), sorted by name. What
# each framework is (engine, byte convention, defaults, limits, what the search opens) is in its card.
FRAMEWORKS: tuple[str, ...] = framework_names()
Framework = Literal[FRAMEWORKS]  # type: ignore[valid-type]
Precision = Literal["bf16", "fp8"]
Recompute = Literal["none", "selective", "full"]
# Megatron-Core's selective recompute_modules (transformer_config.py; its default is ["core_attn"])
RecomputeModule = Literal["core_attn", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj", "layernorm"]
CpCommType = Literal["p2p", "a2a", "allgather", "a2a+p2p"]
# Megatron-Core's moe_token_dispatcher_type: "alltoall" sends every routed copy of a token to its expert's
# rank; "flex" (DeepEP / HybridEP backends) sends a token once per destination node and fans it out there.
MoeDispatcher = Literal["alltoall", "flex"]
# The attention implementation (each framework's own values: its card's attention.backends and adapter knob): flash
# (FlashAttention), fused (cuDNN / Transformer Engine FusedAttention), unfused (the scores materialised: softmax in
# its own kernel), auto (what the framework picks by itself: its card's attention section).
AttentionBackend = Literal["auto", "flash", "fused", "unfused"]
# Adam moments' dtype (Megatron's precision-aware optimizer --exp-avg-dtype / --exp-avg-sq-dtype choices)
OptimizerStateDtype = Literal["fp32", "bf16", "fp16", "fp8"]
# The optimizer: Adam, or Muon on the 2-D matrices (Megatron-Core --optimizer adam|muon; the rest stays on Adam)
Optimizer = Literal["adam", "muon"]
# FP8 scaling recipes: Transformer Engine's as Megatron-Core's --fp8-recipe names them (transformer_config.py
# fp8_recipe), and torchao's per-row scaling (torchtitan's float8 recipe_name rowwise)
Fp8Recipe = Literal["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"]
# An RL post-training job (meshplan/rl/rollout.py): what is run, with which algorithm, engine and placement.
JobKind = Literal["pretrain", "sft", "lora", "rl"]
# Megatron-Core linear names LoRA adapts (Megatron-Bridge peft/lora.py LoRA.target_modules; its default: all four)
LoraTarget = Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
RLAlgorithm = Literal["grpo", "dapo", "ppo"]
RolloutEngine = Literal["vllm", "sglang"]
Placement = Literal["colocated", "separate"]
Severity = Literal["error", "warning", "info"]

# Generous but finite bounds: absurd inputs get a clear validation error instead of an overflow.
MAX_GPUS = 1 << 30
MAX_DEGREE = 1 << 20
MAX_TOKENS = 1 << 30
# What leaving a layout degree out means: resolve() fills 1 for an estimate, recommend searches it (CLI --help and
# the MCP schemas show this text).
_SEARCHED = "(default: 1 for an estimate; searched by recommend)"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- architecture and hardware


class MoESpec(_Strict):
    """Routed and shared experts of a mixture-of-experts model."""

    num_experts: int = Field(ge=1, description="Routed experts per MoE layer")
    top_k: int = Field(ge=1, description="Routed experts each token uses")
    expert_ffn_hidden_size: int = Field(ge=1, description="FFN width of one routed expert")
    num_shared_experts: int = Field(0, ge=0)
    shared_expert_ffn_hidden_size: int = Field(0, ge=0, description="Total FFN width of all shared experts")
    moe_layers: list[int] = Field(description="Indices (0-based) of the decoder layers that are MoE")
    router_bias: bool = False
    expert_bias: bool = Field(False, description="Biases on the expert linear layers (gpt-oss)")
    score_correction_bias: bool = Field(False, description="DeepSeek-V3 style per-expert routing bias")
    num_groups: int = Field(1, ge=1, description="n_group: routed experts split into this many equal groups")
    group_topk: int = Field(1, ge=1, description="topk_group: groups a token's experts may come from")


class MLASpec(_Strict):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, Moonlight)."""

    q_lora_rank: int | None = None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


class RopeSpec(_Strict):
    """Rotary position embedding as config.json states it: rope_theta, rope_scaling (or transformers 5's
    rope_parameters) and partial_rotary_factor. It decides no count; the adapters render it."""

    theta: float | None = Field(None, gt=0, description="rope_theta, the rotary base; None when the config omits it")
    fraction: float = Field(1.0, gt=0, le=1, description="partial_rotary_factor: share of head dims that rotate")
    scaling: str | None = Field(None, description="rope_scaling's rope_type (llama3, yarn, linear, ...); None: none")
    factor: float | None = Field(None, gt=0)
    original_max_position_embeddings: int | None = Field(None, ge=1)
    low_freq_factor: float | None = Field(None, gt=0, description="llama3 scaling")
    high_freq_factor: float | None = Field(None, gt=0, description="llama3 scaling")
    beta_fast: float | None = Field(None, gt=0, description="yarn scaling")
    beta_slow: float | None = Field(None, gt=0, description="yarn scaling")
    mscale: float | None = Field(None, ge=0, description="yarn scaling")
    mscale_all_dim: float | None = Field(None, ge=0, description="yarn scaling")
    truncate: bool | None = Field(None, description="yarn: round the correction range to whole dims (default true)")


class Architecture(_Strict):
    """The shapes that decide parameter count, memory and FLOPs; field meanings follow HF config.json."""

    key: str | None = Field(None, description="Catalog key, when the model is in the catalog")
    name: str
    hf_id: str | None = None
    model_type: str
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    ffn_hidden_size: int = Field(ge=1, description="Dense FFN width (dense layers only)")
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    activation: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: Literal["none", "head", "full"] = "none"
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: int = 2
    learned_position_embeddings: int = Field(0, ge=0, description="Rows of a learned absolute position table")
    attention_sinks: bool = False
    sliding_window: int | None = None
    rope: RopeSpec | None = Field(None, description="Rotary embedding; None with learned absolute positions")
    norm_eps: float | None = Field(None, gt=0, lt=1, description="Norm epsilon; None when the config omits it")
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    num_mtp_layers: int = Field(0, ge=0, description="Multi-token-prediction blocks (not in the total)")
    generic: bool = Field(False, description="True when built from a size alone, not a real config")
    origin: str = Field("catalog", description="catalog | config.json path | generic size")

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index in set(self.moe.moe_layers)


class GpuSpec(_Strict):
    """One accelerator and the node it usually sits in."""

    key: str
    name: str
    arch: Literal["ampere", "hopper", "blackwell", "cdna3"] | None = Field(
        None, description="GPU generation: which attention kernel a framework runs there and its fraction of peak "
                          "(cards/calibration.yaml attention_kernels); None: the shared attention_peak_fraction")
    memory_bytes: int = Field(gt=0)
    sm_count: int | None = Field(
        None, ge=1, description="Streaming multiprocessors (AMD: compute units); a GEMM beside a communication kernel "
                                "that holds some runs on the rest (perf.tp_hidden); None: that contention not modelled")
    bf16_flops: float = Field(gt=0, description="Dense BF16 peak, FLOP/s")
    fp8_flops: float | None = Field(None, description="Dense FP8 peak, FLOP/s (None: no FP8 tensor cores)")
    hbm_bandwidth: float = Field(gt=0, description="bytes/s")
    intra_node_bandwidth: float = Field(gt=0, description="NVLink/xGMI bytes/s per GPU, one direction")
    nvlink_domain: int = Field(ge=1, description="GPUs in one NVLink/xGMI domain")
    gpus_per_node: int = Field(ge=1)
    network_bandwidth: float = Field(gt=0, description="Scale-out bytes/s per GPU, one direction")
    host_bandwidth: float = Field(gt=0, description="GPU-host link (PCIe / NVLink-C2C) bytes/s per GPU, one direction")
    aliases: list[str] = []
    sources: list[str] = []
    notes: list[str] = []
    fp8_recipes: list[Fp8Recipe] = Field(
        default_factory=list, description="FP8 recipes its tensor cores run (Transformer Engine's support checks)"
    )
    fp8_any_layout: bool = Field(False, description="FP8 GEMMs in any layout (Blackwell), so no fp8 transpose copy")


# --------------------------------------------------------------------------- the request


class Request(_Strict):
    """The request fields every tool, CLI flag and batch line shares."""

    @model_validator(mode="before")
    @classmethod
    def _name_unknown_fields(cls, data: object) -> object:
        """An unknown field is an error that names the field it most likely means, on every face alike."""
        if isinstance(data, dict):
            for name in data:
                if name not in cls.model_fields:
                    from meshplan.request.resolve import (
                        unknown_field_error,  # the aliases come from the framework cards
                    )

                    raise ValueError(str(unknown_field_error(name, cls.model_fields)))
        return data

    model: str = Field(
        max_length=4096,  # PATH_MAX: longer is never a real name or path, and would be echoed in errors
        description="Catalog key (llama-3.1-70b), Hugging Face id (meta-llama/Llama-3.1-70B), path to a "
        "config.json, or a size alone ('70B')",
    )
    gpu: str = Field(
        "h100", max_length=64, description="GPU type from the hardware catalog (h100, h200, b200, a100-80gb, ...)"
    )
    num_gpus: int | None = Field(None, ge=1, le=MAX_GPUS, description="Total GPUs (default: the plan's product)")
    gpus_per_node: int | None = Field(None, ge=1, le=1024, description="GPUs per node (default: the GPU's node)")
    seq_length: int = Field(4096, ge=1, le=MAX_TOKENS, description="Tokens per sequence")
    global_batch_size: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Sequences per optimizer step (default: see assumptions)"
    )
    micro_batch_size: int | None = Field(
        None, ge=1, le=65536,
        description="Sequences per micro-batch per rank (default: 1 for an estimate; searched by recommend)",
    )
    precision: Precision = Field("bf16", description="Compute precision of the linear layers")
    framework: Framework = Field("megatron-core", description="Training framework")
    tp: int | None = Field(None, ge=1, le=MAX_DEGREE, description=f"Tensor-parallel size {_SEARCHED}")
    pp: int | None = Field(None, ge=1, le=MAX_DEGREE, description=f"Pipeline-parallel size {_SEARCHED}")
    vpp: int | None = Field(
        None, ge=1, le=MAX_DEGREE, description=f"Virtual pipeline stages per rank, 1 = none {_SEARCHED}"
    )
    cp: int | None = Field(None, ge=1, le=MAX_DEGREE, description=f"Context-parallel size {_SEARCHED}")
    ep: int | None = Field(None, ge=1, le=MAX_DEGREE, description=f"Expert-parallel size {_SEARCHED}")
    etp: int | None = Field(
        None, ge=1, le=MAX_DEGREE,
        description="Expert tensor-parallel size (default: tp for a Megatron MoE model, else 1; searched by recommend)",
    )
    dp: int | None = Field(None, ge=1, le=MAX_GPUS, description="Data-parallel size (default: derived)")
    sequence_parallel: bool | None = Field(None, description="Megatron sequence parallelism (default: on when tp>1)")
    zero_stage: int | None = Field(
        None, ge=0, le=3, description="0-3; FSDP = 3; Megatron distributed optimizer = 1 (default: framework's)"
    )
    recompute: Recompute | None = Field(
        None, description="Activation recomputation (default: none for an estimate; searched by recommend)"
    )
    recompute_layers: int | None = Field(
        None, ge=0, description="Layers per stage fully recomputed, full only (default: every layer of the stage)"
    )
    recompute_method: Literal["uniform", "block"] | None = Field(
        None, description="Megatron full recompute: block = the first recompute_layers layers of each stage "
                          "recomputed, the rest not (the default when recompute_layers is set); uniform = every layer, "
                          "in chunks of recompute_layers (default 1) checkpointed together (the default otherwise)",
    )
    recompute_modules: list[RecomputeModule] | None = Field(
        None, min_length=1, description="Megatron selective recompute: the modules recomputed (core_attn, mlp, moe, "
                                        "moe_act, shared_experts, mla_up_proj, layernorm); left out: ['core_attn']",
    )
    selective_ac_option: str | None = Field(
        None, pattern=r"^(op|[1-9][0-9]{0,3})$",
        description="torchtitan's selective AC (with recompute=selective): 'op' = op-level SAC (the default; the only "
                    "one of 0.3.x), or N = every N-th block fully checkpointed and the others not (0.2.x)",
    )
    cp_comm_type: CpCommType | None = Field(None, description="Context-parallel communication (default p2p ring)")
    optimizer: Optimizer | None = Field(
        None, description="adam, or muon: Muon (one momentum buffer) on the 2-D weight matrices, Adam on embeddings, "
                          "output layer, norms and biases (Megatron-Core --optimizer muon) (default: adam)",
    )
    optimizer_state_dtype: OptimizerStateDtype | None = Field(
        None, description="Adam moments' dtype: bf16/fp16/fp8 = Megatron's precision-aware optimizer (exp_avg_dtype, "
                          "exp_avg_sq_dtype; needs the distributed optimizer) (default: fp32, the optimizer's own)",
    )
    fp8_param_gather: bool | None = Field(
        None, description="FP8 weights kept and all-gathered in fp8 instead of bf16 plus an fp8 copy (Megatron "
                          "fp8_param_gather, torchtitan enable_fsdp_float8_all_gather; precision=fp8) (default: off)",
    )
    grad_reduce_in_fp32: bool | None = Field(
        None, description="Gradients accumulated and reduced in fp32 (true) or bf16 (false): Megatron "
                          "grad_reduce_in_fp32, torchtitan mixed_precision_reduce (default: the framework's, fp32 for "
                          "Megatron and torchtitan)",
    )
    fp8_recipe: Fp8Recipe | None = Field(
        None, description="FP8 scaling recipe with precision=fp8: delayed, tensorwise (current scaling), rowwise "
                          "(torchao), blockwise, mxfp8 (Blackwell) (default: the framework's, delayed for Megatron)",
    )
    moe_token_dispatcher: MoeDispatcher | None = Field(
        None, description="MoE token dispatcher: alltoall, or flex (DeepEP/HybridEP: one copy per destination node); "
                          "default alltoall, the search picks flex for cross-node EP where the framework has it"
    )
    moe_a2a_overlap: bool | None = Field(
        None, description="Hide the expert all-to-all behind another micro-batch's compute (Megatron-Core "
                          "overlap_moe_expert_parallel_comm with delay_wgrad_compute, Megatron-Bridge "
                          "comm_overlap): needs ep > 1, vpp with pp > 1, no full recompute (default: false)",
    )
    tp_comm_overlap: bool | None = Field(
        None, description="Hide the TP/SP all-gathers and reduce-scatters behind the GEMMs beside them: Megatron-Core "
                          "--tp-comm-overlap / Megatron-Bridge comm_overlap.tp_comm_overlap (Transformer Engine "
                          "userbuffers; needs sequence_parallel and tp > 1), torchtitan async TP "
                          "enable_async_tensor_parallel (needs torch_compile and tp > 1) (default: the framework's, "
                          "off; without it Megatron still hides the backward reduce-scatter behind the weight "
                          "gradient GEMM)",
    )
    moe_routing_imbalance: float | None = Field(
        None, ge=1.0, le=1024.0,
        description="MoE routing imbalance: routed tokens on the most loaded expert-parallel rank over the mean (1.0 = "
                    "balanced; 1.3 = that rank gets 30% more); the step waits for that rank's expert GEMMs, permutes "
                    "and all-to-all, and it holds that many more routed activations (default 1.0, balanced, what "
                    "NVIDIA's benchmark recipes force with moe_router_force_load_balancing)",
    )
    attention_backend: AttentionBackend | None = Field(
        None, description="Attention implementation: flash (FlashAttention-2), fused (cuDNN / Transformer Engine "
                          "FusedAttention), unfused (the s x s scores materialised and kept for the backward, softmax "
                          "and dropout as their own passes; Megatron-Core --attention-backend unfused, Hugging Face "
                          "attn_implementation eager) or auto (default: what the framework picks by itself, its "
                          "card's attention section)",
    )
    dropout: bool | None = Field(
        None, description="Attention and hidden dropout on (Megatron-Core --attention-dropout/--hidden-dropout 0.1, "
                          "Megatron-LM's own default): dropout masks kept for the backward, and with unfused "
                          "attention a dropout pass over the scores (default: off, as production recipes run)",
    )
    torch_compile: bool | None = Field(
        None, description="torch.compile on (torchtitan --compile.enable, compiling each block and the loss; "
                          "KempnerForge train.compile_model, the whole model): fused elementwise kernels and, where "
                          "the loss is compiled, no fp32 copy of the logits (default: the framework's own, eager "
                          "for torchtitan, compiled for KempnerForge)",
    )
    expandable_segments: bool | None = Field(
        None, description="PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: before "
                          "an out-of-memory error it unmaps cached free pages and maps them where needed, so the "
                          "job fits when its allocated peak does (the reserved peak is still reported) (default: "
                          "how the framework's own launcher sets it, its card's allocator section)",
    )
    # --- RL post-training job (meshplan/rl/rollout.py); frameworks with an `rl` card section (verl, SkyRL)
    job: JobKind | None = Field(
        None, description="What the job is: pretrain, sft (the same training step), or rl (rollout, log-prob passes "
                          "and update; verl and SkyRL) (default: pretrain; rl when an RL field is given)",
    )
    algorithm: RLAlgorithm | None = Field(
        None, description="RL algorithm: grpo (reference model for the KL loss), dapo (no reference, no KL) or ppo "
                          "(reference and critic) (default: grpo)",
    )
    prompts_per_step: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Prompts per RL step (verl data.train_batch_size, SkyRL "
                                               "trainer.train_batch_size) (default: global_batch_size / "
                                               "samples_per_prompt, else the framework's default)",
    )
    samples_per_prompt: int | None = Field(
        None, ge=1, le=65536, description="Responses sampled per prompt (verl rollout.n, SkyRL n_samples_per_prompt) "
                                          "(default: the framework's, verl 1, SkyRL 5)",
    )
    prompt_length: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Longest prompt, tokens (default: seq_length - response_length when "
                                               "seq_length is given, else the framework's default)",
    )
    response_length: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Longest response, tokens; the trainer's sequence is prompt + response "
                                               "(default: the framework's, verl 512, SkyRL 1024)",
    )
    rollout_engine: RolloutEngine | None = Field(
        None, description="Rollout inference engine: vllm or sglang (default vllm; SkyRL runs vLLM only)"
    )
    rollout_tp: int | None = Field(
        None, ge=1, le=MAX_DEGREE, description="Rollout engine tensor-parallel size (default: the framework's, verl 2, "
                                               "SkyRL 1)",
    )
    rollout_dp: int | None = Field(
        None, ge=1, le=MAX_DEGREE, description="Rollout engine data-parallel (attention DP) ranks per replica "
                                               "(default: 1)",
    )
    rollout_ep: int | None = Field(
        None, ge=1, le=MAX_DEGREE, description="Rollout engine expert-parallel size; when > 1 it must be rollout_tp x "
                                               "rollout_dp (default: 1, experts sharded by the rollout TP)",
    )
    rollout_memory_fraction: float | None = Field(
        None, gt=0.0, le=1.0,
        description="Rollout engine memory fraction (verl gpu_memory_utilization, SkyRL gpu_memory_utilization): "
                    "vLLM's share of total GPU memory, SGLang's mem_fraction_static (default: the framework's, "
                    "verl 0.5, SkyRL 0.8)",
    )
    placement: Placement | None = Field(
        None, description="colocated: the rollout engine sleeps on the trainer's GPUs between phases; separate: its "
                          "own rollout_gpus (default: colocated)",
    )
    rollout_gpus: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="GPUs running the rollout engine: with placement separate, taken out of "
                                             "num_gpus (required there); colocated: all of them (default)",
    )
    rollout_enforce_eager: bool | None = Field(
        None, description="Rollout engine without CUDA graphs (verl and SkyRL enforce_eager): no graph memory, every "
                          "decode step launches its kernels from the host (default: false, the frameworks' default)",
    )
    first_stage_layers: int | None = Field(
        None, ge=1, le=MAX_DEGREE, description="Uneven PP: decoder layers on the first stage (default: even split)"
    )
    last_stage_layers: int | None = Field(
        None, ge=1, le=MAX_DEGREE, description="Uneven PP: decoder layers on the last stage (default: even split)"
    )
    pipeline_layout: str | None = Field(
        None, min_length=1, max_length=4096,
        description="Megatron's pipeline_model_parallel_layout, e.g. 'Et*3|(tt|)*29,m|L': stages split by '|' in "
                    "virtual-stage order, E embedding, t decoder layer, m MTP layer, L loss, x*n and (...)*n repeat "
                    "(default: none, the even or first/last split; sets vpp when vpp is left out)",
    )
    account_for_embedding: bool | None = Field(
        None, description="Megatron's account_for_embedding_in_pipeline_split: the embedding counts as one layer in "
                          "the even split, so the first stage builds one decoder layer fewer (default: false)",
    )
    account_for_loss: bool | None = Field(
        None, description="Megatron's account_for_loss_in_pipeline_split: the loss counts as one layer in the even "
                          "split, so the last stage builds one decoder layer fewer (default: false)",
    )
    headroom: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="Share of GPU memory a layout must leave free to count as fitting (default: 0.10, rule MEM002); "
                    "recommend ranks, falls back and searches GPU counts with this one threshold",
    )
    activation_offload: bool | None = Field(
        None, description="Activation CPU offloading (Megatron fine-grained activation offloading, verl "
                          "enable_activation_offload, DeepSpeed cpu_checkpointing): the activations saved for backward "
                          "go to host memory except the layers in flight (default: off)",
    )
    param_offload: bool | None = Field(
        None, description="Parameter offload to host memory as the framework does it: in the step (FSDP2 "
                          "CPUOffloadPolicy, DeepSpeed offload_param) or between the phases of an RL job (verl "
                          "param_offload) — the framework card says which (default: off)",
    )
    grad_offload: bool | None = Field(
        None, description="Gradient offload to host memory between the phases of an RL job (verl grad_offload) "
                          "(default: off)",
    )
    optimizer_offload: bool | None = Field(
        None, description="Optimizer-state offload: in the step with the Adam step on the CPU (Megatron "
                          "optimizer_cpu_offload, DeepSpeed offload_optimizer) or between RL phases (verl "
                          "optimizer_offload), as the framework card says (default: off; on when "
                          "optimizer_offload_fraction > 0)",
    )
    optimizer_offload_fraction: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Share of this rank's optimizer state kept and stepped on the CPU (Megatron "
                    "optimizer_offload_fraction, DeepSpeed offload_optimizer ratio) (default: 1.0 with "
                    "optimizer_offload, else 0)",
    )
    framework_version: str | None = Field(
        None, min_length=1, max_length=32, pattern=r"^[0-9][0-9A-Za-z.+-]*$|^main$",
        description="The framework release the job runs (default: the one its card describes); a release whose "
                    "loss or recompute kept other tensors has its own memory convention (torchtitan 0.2.x: the "
                    "unchunked loss), and render writes that release's keys",
    )
    cpu_memory_per_node: float | None = Field(
        None, gt=0, le=1 << 20,
        description="Host memory per node in GiB; the offloaded state is checked against it (rule MEM003) "
                    "(default: not checked)",
    )
    lora_rank: int | None = Field(
        None, ge=1, le=65536,
        description="LoRA: the adapters' rank; the base weights are frozen (no gradients or optimizer state) "
                    "(default with job=lora: the framework's default rank; given, the job is lora unless job=rl)",
    )
    lora_targets: list[LoraTarget] | None = Field(
        None, min_length=1, max_length=4,
        description="LoRA: the Megatron-Core linears adapted (linear_qkv, linear_proj, linear_fc1, linear_fc2; fc1 and "
                    "fc2 include a MoE model's experts) (default: all four, Megatron-Bridge's LoRA default)",
    )


class LoraSpec(_Strict):
    """A LoRA job's adapters (meshplan/arithmetic/lora.py): frozen base weights, trainable rank-r A (in x r) and B (r x
    out)."""

    rank: int = Field(ge=1)
    targets: list[LoraTarget] = Field(min_length=1)


class RLJob(_Strict):
    """An RL step's workload: prompts x samples sequences of prompt + response tokens (meshplan/rl/rollout.py)."""

    algorithm: RLAlgorithm = "grpo"
    prompts_per_step: int = Field(ge=1)
    samples_per_prompt: int = Field(ge=1)
    prompt_length: int = Field(ge=1)
    response_length: int = Field(ge=1)


class Job(_Strict):
    """What is trained, on what, with which settings: everything but the layout."""

    model: Architecture
    gpu: GpuSpec
    num_gpus: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    global_batch_size: int = Field(ge=1)
    precision: Precision = "bf16"
    framework: Framework = "megatron-core"
    rl: RLJob | None = Field(None, description="The RL job's rollout workload (None: a training job)")
    lora: LoraSpec | None = Field(None, description="LoRA adapters on a frozen base (None: every weight trained)")
    cpu_memory_per_node: int | None = Field(None, ge=1, description="Host memory per node, bytes (None: unchecked)")
    framework_version: str | None = Field(None, description="The framework release (None: the card's version)")
    moe_routing_imbalance: float = Field(1.0, ge=1.0, description="Most loaded EP rank's routed tokens over the mean")
    notes: list[str] = Field(default_factory=list, description="How defaults were filled in")


class Plan(_Strict):
    """A parallel layout. GPU count = tp*cp*pp*dp; the MoE part folds ep*etp into the same ranks."""

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    vpp: int = Field(1, ge=1, description="Virtual stages per pipeline rank; 1 = no interleaving")
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    etp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    sequence_parallel: bool = False
    zero_stage: int = Field(1, ge=0, le=3)
    micro_batch_size: int = Field(1, ge=1)
    recompute: Recompute = "none"
    recompute_layers: int | None = None
    recompute_method: Literal["uniform", "block"] | None = None  # full recompute; None: block with layers, else uniform
    recompute_modules: list[RecomputeModule] | None = None  # Megatron selective; None: its default ["core_attn"]
    selective_ac_option: str | None = None  # torchtitan: None or "op" = op-level SAC, "N" = every N-th block full AC
    cp_comm_type: CpCommType = "p2p"
    optimizer: Optimizer = "adam"  # muon: one momentum on the matrices Muon covers, Adam on the rest
    optimizer_state_dtype: OptimizerStateDtype | None = None  # None: fp32 moments, no precision-aware optimizer
    fp8_param_gather: bool | None = None  # fp8 weights instead of bf16 + fp8 copy; None: the framework default (off)
    grad_reduce_in_fp32: bool | None = None  # None: the framework's default (its memory convention's grad bytes)
    fp8_recipe: Fp8Recipe | None = None  # None: the framework's default recipe (precision=fp8 only)
    moe_token_dispatcher: MoeDispatcher = "alltoall"
    moe_a2a_overlap: bool = False  # EP all-to-all overlapped with the other micro-batch's compute (1F1B)
    tp_comm_overlap: bool = False  # TP/SP collectives pipelined with their GEMMs (the framework card's tp_overlap)
    torch_compile: bool = False  # torch.compile on (what it compiles: the framework card's compile section)
    expandable_segments: bool = False  # PyTorch allocator's expandable segments: the allocated peak decides the fit
    attention_backend: AttentionBackend = "auto"  # auto: the framework's own pick (its card's attention section)
    dropout: bool | None = None  # attention + hidden dropout; None: the framework's convention (cards/memory.yaml)
    # the rollout engine of an RL job (None: not an RL job); meshplan/rl/rollout.py
    rollout_engine: RolloutEngine | None = None
    rollout_tp: int | None = Field(None, ge=1)
    rollout_dp: int | None = Field(None, ge=1)
    rollout_ep: int | None = Field(None, ge=1)
    rollout_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    placement: Placement | None = None
    rollout_gpus: int | None = Field(None, ge=1, description="GPUs running the engine (separate: beside the trainer's)")
    rollout_enforce_eager: bool = False
    first_stage_layers: int | None = Field(None, ge=0, description="Uneven PP: layers on the first stage")
    last_stage_layers: int | None = Field(None, ge=0, description="Uneven PP: layers on the last stage")
    pipeline_layout: str | None = Field(
        None, min_length=1, max_length=4096,
        description="Megatron's pipeline_model_parallel_layout string (schedule.parse_layout); None = no layout",
    )
    account_for_embedding: bool = Field(False, description="The embedding counts as a layer in the even split")
    account_for_loss: bool = Field(False, description="The loss counts as a layer in the even split")
    activation_offload: bool = Field(False, description="Activations saved for backward offloaded to host")
    param_offload: bool = Field(False, description="Parameters offloaded (in the step or between phases: the card)")
    grad_offload: bool = Field(False, description="Gradients offloaded between RL phases")
    optimizer_offload: bool = Field(False, description="Optimizer state offloaded (in the step or between phases)")
    optimizer_offload_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of the optimizer state stepped on the CPU in the step"
    )

    def num_microbatches(self, global_batch_size: int) -> int:
        return max(1, global_batch_size // (self.micro_batch_size * self.dp))

    def short(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        if self.vpp > 1:
            parts.append(f"VPP{self.vpp}")
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp > 1:
            parts.append(f"ETP{self.etp}")
        parts.append(f"DP{self.dp}")
        return " ".join(parts)


# --------------------------------------------------------------------------- results


class ComponentCount(_Strict):
    name: str
    params: int
    active_params: int
    note: str = ""


class ModelReport(_Strict):
    """Parameter counts of one model, exact from its config, under each vendor's convention."""

    name: str
    key: str | None
    hf_id: str | None
    model_type: str
    origin: str
    generic: bool
    total_params: int = Field(description="All weights: embeddings, head (if untied), norms, biases; no MTP")
    active_params: int = Field(description="What one token touches: top-k routed experts, embeddings and head")
    active_params_excl_input_embedding: int = Field(description="DeepSeek / gpt-oss convention")
    active_params_non_embedding: int = Field(description="Without input embedding and head (Moonlight, GLM)")
    non_embedding_params: int = Field(description="Total without input embedding and head (Qwen, Gemma)")
    mtp_params: int = Field(description="Multi-token-prediction blocks, not in the total")
    components: list[ComponentCount]
    architecture: Architecture
    published: dict | None = Field(None, description="Published counts and their source (catalog models)")
    assumptions: list[str] = []


class ModelSummary(_Strict):
    key: str
    name: str
    hf_id: str | None
    model_type: str
    family: str
    total_params: int
    active_params: int


class StageMemory(_Strict):
    stage: int
    layers: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    other_bytes: int
    total_bytes: int
    detail: dict[str, int] = Field(default_factory=dict, description="Finer breakdown, bytes")
    host_bytes: int = Field(0, description="Host (CPU) memory this stage's GPU offloads to, bytes")


class PhaseMemory(_Strict):
    """One phase of an RL step on the worst GPU of the pool it runs on (meshplan/rl/rollout.py)."""

    phase: Literal["rollout", "log_prob", "actor_update", "critic_update"]
    pool: Literal["trainer", "rollout"] = Field(description="The GPUs it runs on (one pool when colocated)")
    peak_bytes: int
    fit_bytes: int = Field(description="What decides this phase's fit: its peak, or with expandable segments a "
                                       "training phase's allocated peak (memory.fit_figure)")
    stage: int = Field(description="The trainer's pipeline stage whose GPU peaks (0 on a separate rollout pool)")
    detail: dict[str, int] = Field(default_factory=dict, description="Where the bytes go")
    note: str = ""


class ErrorBand(_Strict):
    """How far meshplan's estimate was from measured runs like this one (cards/accuracy.yaml,
    meshplan/estimate/accuracy.py)."""

    regime: str = Field(description="The measured regime the request falls in (cards/accuracy.yaml)")
    label: str = Field(description="The regime in words")
    median_error: float | None = Field(description="Median |predicted / measured - 1| there (None: no measured run)")
    bias: float | None = Field(description="Median signed error there: > 0 predicts too high (None: no measured run)")
    runs: int = Field(description="Measured runs the figures come from")
    source: str = Field(description="The bench scripts and data sets that measured it")
    unvalidated: list[str] = Field(description="Terms of this estimate no measured run exercised")
    text: str = Field(description="The band in one line, as the faces print it")


class MemoryReport(_Strict):
    """Per-GPU memory of every pipeline stage; the worst stage decides whether the job fits."""

    model: str
    framework: str
    plan: Plan
    stages: list[StageMemory]
    peak_bytes: int
    peak_stage: int
    capacity_bytes: int
    fits: bool
    headroom_bytes: int
    fit_bytes: int = Field(0, description="The figure compared with capacity_bytes (fits, headroom_bytes): peak_bytes, "
                                          "or with expandable segments the allocated peak plus page rounding")
    fit_basis: Literal["reserved", "allocated"] = Field(
        "reserved", description="Which peak decided the fit: reserved (peak_bytes, the caching allocator's reserve "
                                "included) or allocated (expandable segments: cached pages are unmapped before OOM)")
    host_bytes_per_node: int = Field(
        0, description="Host memory one node needs for what its GPUs offload (the worst stage x GPUs per node)"
    )
    host_capacity_bytes: int | None = Field(None, description="cpu_memory_per_node when given, bytes")
    phases: list[PhaseMemory] = Field(
        default_factory=list, description="RL job: each phase's peak; peak_bytes is the largest (empty: training job)"
    )
    peak_phase: str | None = Field(None, description="RL job: the phase whose peak is peak_bytes")
    limited_by: Literal["gpu", "host"] | None = Field(
        None, description="What runs out first: GPU memory (a phase over capacity) or host memory (offloads over "
                          "cpu_memory_per_node); None when both fit"
    )
    assumptions: list[str]
    warnings: list[str] = []
    error_band: ErrorBand | None = Field(
        None, description="The error measured in this regime (meshplan/estimate/accuracy.py)")


class ThroughputBreakdown(_Strict):
    compute_s: float
    tp_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    dp_comm_s: float = 0.0
    pp_comm_s: float = 0.0
    bubble_s: float = 0.0
    recompute_s: float = 0.0
    other_s: float = 0.0
    offload_s: float = Field(0.0, description="Exposed host transfers and the CPU optimizer step (offload.py)")


class RLStepTime(_Strict):
    """Seconds of one RL step by part (meshplan/rl/rollout.py): colocated phases add, a separate rollout pool overlaps
    the next batch's generation with this batch's training (verl one-step-off)."""

    step_s: float
    generation_s: float = Field(description="Prefill and decode of every response (the rollout)")
    prefill_s: float
    decode_s: float
    log_prob_s: float = Field(description="Old-policy, reference (and critic value) forward passes")
    update_s: float = Field(
        description="The actor's (and critic's) training step, meshplan.estimate.perf.estimate_throughput")
    reshard_s: float = Field(description="New weights from the trainer's layout to the engine's")
    offload_s: float = Field(description="Phase offloads: states out to the host and back each step")
    replicas: int = Field(description="Engine replicas: rollout GPUs / (rollout TP x DP)")
    sequences_at_once: int = Field(description="Sequences one replica decodes at once (its KV cache, max_num_seqs)")
    decode_waves: int = Field(description="Rounds of sequences_at_once each replica decodes to finish its share")
    decode_step_s: float = Field(description="One decode step at that batch: weights and KV read, all-reduces")
    update_mfu: float = Field(description="The actor update's MFU (what verl reports as MFU)")
    limited_by: str = Field(description="The part that takes longest")


class ThroughputReport(_Strict):
    """Predicted step time, tokens/s per GPU and MFU, with where the time goes."""

    model: str
    framework: str
    plan: Plan
    step_time_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    mfu: float
    model_flops_per_step: float
    breakdown: ThroughputBreakdown
    assumptions: list[str]
    warnings: list[str] = []
    rl: RLStepTime | None = Field(None, description="RL job: the step's parts; step_time_s is the whole RL step")
    error_band: ErrorBand | None = Field(
        None, description="The error measured in this regime (meshplan/estimate/accuracy.py)")


class Finding(_Strict):
    id: str
    severity: Severity
    title: str = ""
    message: str
    fix: str
    source: str = ""


class MemorySummary(_Strict):
    peak_bytes: int
    peak_stage: int
    capacity_bytes: int
    fits: bool
    headroom_bytes: int
    fit_bytes: int = 0  # what decided fits (MemoryReport.fit_bytes)
    fit_basis: Literal["reserved", "allocated"] = "reserved"
    host_bytes_per_node: int = Field(0, description="Host memory per node the plan's offloads take (MemoryReport's)")


class CheckReport(_Strict):
    """Every rule of the framework run over the plan: ok means no error."""

    ok: bool
    framework: str
    model: str
    plan: Plan
    findings: list[Finding]
    memory: MemorySummary | None = None
    next_steps: list[str] = []


class Candidate(_Strict):
    rank: int
    plan: Plan
    memory: MemorySummary
    throughput: ThroughputReport
    rationale: str
    equivalents: list[Plan] = Field(
        default_factory=list,
        description="Other layouts with the same predicted step time and peak memory (e.g. a factor moved between CP "
                    "and the micro-batch), folded into this row instead of filling the top K",
    )


RenderFormat = Literal["python", "shell", "yaml", "hydra", "toml", "json"]


class RenderResult(_Strict):
    """A plan rendered for one framework: the text to paste, and what the reader must know about it."""

    framework: str
    variant: str
    version: str = Field(description="Framework version the snippet targets")
    format: RenderFormat = Field(description="python | shell | yaml | hydra | toml | json")
    text: str = Field(description="The config snippet to paste")
    filename: str = Field(description="A suggested file name for the snippet")
    plan: Plan = Field(description="The layout that was rendered")
    notes: list[str] = Field(default_factory=list, description="Choices the adapter made, and why")
    warnings: list[str] = Field(default_factory=list, description="Things that will surprise a user")


class NearMiss(_Strict):
    """A layout that almost fits: what an impossible job is closest to, and by how much it is over."""

    plan: Plan
    memory: MemorySummary
    over_bytes: int = Field(description="Peak memory minus capacity on the worst stage")
    rationale: str


class Recommendation(_Strict):
    """Ranked layouts that fit, why the first one won, and how it compares with the decision tables."""

    model: str
    framework: str
    num_gpus: int
    candidates: list[Candidate]
    considered: int = Field(description="Layouts in the searched space; = len(candidates) + sum(rejected)")
    rejected: dict[str, int] = Field(
        default_factory=dict,
        description="Layouts not ranked, per rule id (cards/rules.yaml) or SEARCH-* bucket (see assumptions)",
    )
    decision_table: str = ""
    rationale: str = ""
    warnings: list[str] = []
    assumptions: list[str] = []
    evaluated: int = Field(0, description="Memory and throughput estimates the search computed")
    global_batch_size: int | None = Field(None, description="Sequences per step every layout was compared at")
    min_gpus: int | None = Field(None, description="When nothing fits: the smallest GPU count where a layout fits")
    closest: list[NearMiss] = Field(default_factory=list, description="When nothing fits: the nearest misses")
    headroom: float | None = Field(
        None, description="Share of GPU memory every ranked layout leaves free (the request's, else MEM002's default)"
    )
    best_below_headroom: Candidate | None = Field(
        None,
        description="The fastest layout that fits only with less than `headroom` free: given when nothing keeps "
                    "the headroom, or when it is much faster than the best ranked layout (a smaller headroom ranks it)",
    )


class MinimumGpus(_Strict):
    """The smallest GPU count at which some layout passes the rules and fits with the headroom kept.

    Fit is not monotone in the GPU count (a count must be divisible by the layout's degrees), so the counts are
    scanned in increasing order, never bisected; the scan is bounded in time and in count, and says which bound
    stopped it."""

    model: str
    framework: str
    gpu: str
    num_gpus: int | None = Field(description="The smallest count that fits; None when none fits within the bounds")
    candidate: Candidate | None = Field(None, description="The fastest layout at that count (recommend's #1)")
    headroom: float = Field(description="Share of GPU memory the layout must leave free (the request's, else MEM002's)")
    global_batch_size: int | None = Field(None, description="Sequences per step at that count")
    searched_from: int = Field(description="First GPU count checked (counts below cannot hold the model states)")
    searched_to: int = Field(description="Last GPU count checked")
    counts_checked: int = Field(description="How many GPU counts were checked")
    stepping: str = Field(description="Which counts were checked, in words")
    stopped_by: Literal["found", "max_gpus", "time", "rules"] = Field(
        description="found: a count fits; max_gpus: none fits up to the limit; time: the time bound was hit first; "
                    "rules: a rule rejects the fixed fields at every count"
    )
    rationale: str
    assumptions: list[str] = []
