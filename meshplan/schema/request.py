"""The request: the flat fields every tool, CLI flag and batch line shares, each with its bounds.

The CLI turns the fields into flags, the MCP server into tool arguments, batch mode reads them from JSON lines;
request/parse.py reads loose values into a `Request` (an unknown field named with the one it most likely means),
request/resolve.py turns it into the `Job` and `Plan` every estimator takes.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import ConfigDict, Field, field_validator

from meshplan.schema.choices import (
    AttentionBackend,
    CpCommType,
    CrossEntropyFusionImpl,
    CudaGraphImpl,
    CudaGraphModule,
    ExpertWeight,
    FlexBackend,
    Fp8Recipe,
    Framework,
    JobKind,
    LoraTarget,
    MoeDispatcher,
    Optimizer,
    OptimizerStateDtype,
    PipelineSchedule,
    Placement,
    Precision,
    Recompute,
    RecomputeModule,
    RLAlgorithm,
    RolloutEngine,
    StrictModel,
)

# Generous but finite bounds: absurd inputs get a clear validation error instead of an overflow.
MAX_GPUS = 1 << 30
MAX_DEGREE = 1 << 20
MAX_TOKENS = 1 << 30
MAX_NODE_GBPS = 1_000_000  # 1 Pb/s per node: over a thousand 800 Gb/s NICs (1,024 GPUs per node at most)
# A text field's pattern as a refusal says it ('String should match pattern ...' showed the user a regular expression)
PATTERN_WORDS = {
    "selective_ac_option": "'op' or a whole number of blocks, 1 to 9999",
    "framework_version": "a release number that starts with a digit (0.3, 0.19.2), main, or main@YYYY-MM-DD",
}
# What leaving a layout degree out means: resolve() fills 1 for an estimate, recommend searches it (CLI --help and
# the MCP schemas show this text).
_SEARCHED = "(default: 1 for an estimate; searched by recommend)"


class Request(StrictModel):
    """The request fields every tool, CLI flag and batch line shares.

    Strict types on every face (pydantic strict mode): an integer field takes an integer, not `true` or `"8"`; a
    float field an integer or a finite float (NaN and Infinity, which Python's json reads from a batch line or an MCP
    call, are refused as not finite: a bound's words, 'less than or equal to 1024 (got nan)', hid why); a switch
    `true`/`false` only. The CLI reads its flags' text into these types first (ASCII digits only: request/parse.py)."""

    model_config = ConfigDict(strict=True)

    model: str = Field(
        # a config.json's text is capped where it is read (model_config.MAX_CONFIG_BYTES); a name or path is
        # echoed in errors at most 200 characters long
        max_length=1 << 20,
        description="Catalog key (llama-3.1-70b), Hugging Face id (meta-llama/Llama-3.1-70B), path to a "
        "config.json or a config.json's text itself (a JSON object: over HTTP, where a path names the server's "
        "file), a size alone ('70B'), the path of a launch script (train.sh: the model its flags state), or "
        "a Megatron-LM script's architecture flags as import states them ('megatron-core flags: --num-layers 40 "
        "--hidden-size 5120 ...')",
    )
    gpu: str = Field(
        "h100", max_length=64, description="GPU type from the hardware catalog (h100, h200, b200, a100-80gb, ...)"
    )
    num_gpus: int | None = Field(None, ge=1, le=MAX_GPUS, description="Total GPUs (default: the plan's product)")
    gpus_per_node: int | None = Field(None, ge=1, le=1024, description="GPUs per node (default: the GPU's node)")
    network_gbps_per_node: float | None = Field(
        None, allow_inf_nan=False, ge=1, le=MAX_NODE_GBPS,
        description="The cluster's inter-node (scale-out) network per node in Gb/s, one direction: its NICs x their "
                    "line rate, as a cluster's spec sheet states it (DGX H100: 8 x 400 = 3200; 4x Omni-Path 100 Gb/s: "
                    "400), shared evenly by the node's GPUs (gpus_per_node, else the GPU's node); every inter-node "
                    "transfer is timed at it (default: the GPU card's network_bandwidth per GPU, e.g. H100's 400 Gb/s, "
                    "a DGX's one NIC per GPU)",
    )
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
    dp_replicate: int | None = Field(
        None, ge=1, le=MAX_GPUS,
        description="Hybrid sharding (HSDP): data-parallel replicas, each sharding the model states over dp / "
                    "dp_replicate ranks (Megatron num_distributed_optimizer_instances, torchtitan "
                    "data_parallel_replicate_degree, AutoModel dp_replicate_size, verl fsdp_size = dp / dp_replicate); "
                    "divides dp, needs zero_stage >= 1 (default 1: states sharded over all of dp; never searched)",
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
        None, min_length=1, max_length=len(get_args(RecomputeModule)), json_schema_extra={"uniqueItems": True},
        description="Megatron selective recompute: the modules recomputed (core_attn, mlp, moe, "
                                        "moe_act, shared_experts, mla_up_proj, layernorm, gdn_norm_out); left "
                                        "out: ['core_attn']",
    )
    selective_ac_option: str | None = Field(
        None, pattern=r"^(op|[1-9][0-9]{0,3})$",  # in words: PATTERN_WORDS
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
                          "grad_reduce_in_fp32, torchtitan mixed_precision_reduce, FSDP2's MixedPrecisionPolicy "
                          "reduce_dtype (verl, SkyRL, NeMo AutoModel) (default: the framework's, fp32 for Megatron, "
                          "torchtitan and FSDP2)",
    )
    fp8_recipe: Fp8Recipe | None = Field(
        None, description="FP8 scaling recipe with precision=fp8: delayed, tensorwise (current scaling), rowwise "
                          "(torchao), blockwise, mxfp8 (Blackwell) (default: the framework's, delayed for Megatron)",
    )
    fp8_activation_input_store: bool | None = Field(
        None, description="The MLP's SwiGLU keeps its input (fc1's output) for the backward as a float8_e4m3fn copy, "
                          "1 byte per element instead of 2, cast back to bf16 in the backward (Megatron-Core "
                          "activation_func_fp8_input_store; SwiGLU models only) (default: off)",
    )
    fp8_dot_product_attention: bool | None = Field(
        None, description="FP8 dot-product attention: Transformer Engine's cuDNN FP8 fused attention, Q, K, V and the "
                          "attention output kept in fp8 for the backward (Megatron-Core fp8_dot_product_attention, "
                          "Megatron-Bridge mixed_precision.fp8_dot_product_attention; precision=fp8 with a recipe "
                          "that passes fp8_dpa) (default: off)",
    )
    moe_shared_expert_overlap: bool | None = Field(
        None, description="The MoE layer's shared experts run on a stream of their own beside the token dispatch's "
                          "all-to-all, gathering the layer input over sequence parallelism themselves (Megatron-Core "
                          "moe_shared_expert_overlap; a model with shared experts, the alltoall or flex dispatcher, "
                          "not flex on Megatron-Bridge, whose flex setup turns it off) "
                          "(default: the framework's for the model: on for Megatron-Bridge's DeepSeek-V2/V3, "
                          "Kimi-K2 and GLM-4.5 providers, except beside the flex dispatcher, moe_a2a_overlap or a "
                          "recomputed shared_experts module; off elsewhere)",
    )
    bias_activation_fusion: bool | None = Field(
        None, description="Megatron-Core's bias_activation_fusion: the MLP's gated activation (SwiGLU, GeGLU, "
                          "gpt-oss's quick-GEGLU) as one compiled kernel; off, Megatron-Core's unfused glu(): the "
                          "activation, the product and (routed experts) the routing-weight multiply as separate "
                          "kernels, their intermediates kept for the backward (Megatron-Core and Megatron-Bridge "
                          "only) (default: the framework's: on for Megatron-Core's pretrain_gpt.py; on "
                          "Megatron-Bridge the model provider's, off for Qwen, Mistral, OLMoE, Nemotron and Gemma)",
    )
    cross_entropy_loss_fusion: bool | None = Field(
        None, description="Megatron-Core's cross_entropy_loss_fusion: the loss as one fused implementation "
                          "(cross_entropy_fusion_impl) instead of the unfused vocab-parallel cross-entropy's eager "
                          "fp32 ops (Megatron-Core and Megatron-Bridge only) (default: the framework's: off for "
                          "Megatron-LM's pretrain_gpt.py, on for Megatron-Bridge's GPTModelProvider)",
    )
    cross_entropy_fusion_impl: CrossEntropyFusionImpl | None = Field(
        None, description="Which fused cross-entropy runs with cross_entropy_loss_fusion: native (Megatron-Core's "
                          "compiled fused_vocab_parallel_cross_entropy, the fp32 softmax kept, 6 B per logit) or te "
                          "(Transformer Engine's Triton parallel_cross_entropy, the gradient written in place over the "
                          "bf16 logits, 2 B per logit; Megatron-LM 0.19 refuses it) (default: native; on "
                          "Megatron-Bridge te for the DeepSeek and Kimi providers)",
    )
    moe_token_dispatcher: MoeDispatcher | None = Field(
        None, description="MoE token dispatcher: alltoall, or flex (DeepEP/HybridEP: one copy per destination node); "
                          "default alltoall, the search picks flex for cross-node EP where the framework has it"
    )
    moe_flex_backend: FlexBackend | None = Field(
        None, description="The flex dispatcher's backend (Megatron-Core moe_flex_dispatcher_backend, NeMo AutoModel "
                          "model.backend.dispatcher): deepep (DeepEP: one node's NVLink, RDMA between nodes) or "
                          "hybridep (HybridEP: also a multi-node NVLink domain; its kernels permute the tokens as they "
                          "copy them); with moe_token_dispatcher=flex, or left out for recommend's flex layouts "
                          "(default: hybridep where one NVLink domain spans nodes, GB200/GB300 NVL72, else deepep; "
                          "every layout recommend weighs takes it)",
    )
    pipeline_schedule: PipelineSchedule | None = Field(
        None, description="Pipeline schedule: gpipe, 1f1b, interleaved_1f1b (vpp > 1), zero_bubble (torch's ZBV at "
                          "vpp 2, interleaved zero-bubble above), dualpipev (vpp 2), combined_1f1b (Megatron's 1F1B "
                          "with the expert all-to-all overlap, sets moe_a2a_overlap); the multi-chunk ones fill vpp=2 "
                          "when it is left out (default: the framework's, 1F1B or interleaved with vpp > 1; searched "
                          "by recommend where the framework runs more than one)",
    )
    pipeline_microbatches: int | None = Field(
        None, ge=1, le=65536,
        description="Micro-batches one run of the pipeline schedule takes where the framework runs it once per "
                    "gradient-accumulation step (torchtitan: training.local_batch_size / "
                    "parallelism.pipeline_parallel_microbatch_size; the step runs the schedule again, fill and drain "
                    "included, until global_batch_size) (default: every micro-batch of the step in one run)",
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
    cuda_graph_impl: CudaGraphImpl | None = Field(
        None, description="Megatron-Core CUDA graphs (--cuda-graph-impl / Megatron-Bridge model.cuda_graph_impl): "
                          "local (Megatron-Core's graph manager) or transformer_engine (TE make_graphed_callables), "
                          "per layer, of cuda_graph_modules; full_iteration, one graph of the forward-backward "
                          "iteration; none (default) runs eager. Dropless MoE layers cannot be captured (their token "
                          "counts vary): their experts stay eager, with their host launches and sync; graph memory "
                          "pools are not counted",
    )
    cuda_graph_modules: list[CudaGraphModule] | None = Field(
        None, description="What each layer's CUDA graphs capture (--cuda-graph-modules / model.cuda_graph_modules; "
                          "older releases' cuda_graph_scope): attn, mlp (dense layers), moe (drop-padding MoE only), "
                          "moe_router, moe_preprocess (with moe_router), mamba; left out or empty: the whole layer. "
                          "None under full_iteration",
    )
    moe_routing_imbalance: float | None = Field(
        None, allow_inf_nan=False, ge=1.0, le=1024.0,
        description="MoE routing imbalance: routed tokens on the most loaded expert-parallel rank over the mean (1.0 = "
                    "balanced; 1.3 = that rank gets 30% more); the step waits for that rank's expert GEMMs, permutes "
                    "and all-to-all, and it holds that many more routed activations (default 1.0, balanced, what "
                    "NVIDIA's benchmark recipes force with moe_router_force_load_balancing)",
    )
    moe_fake_balanced_gate: bool | None = Field(
        None,
        description="NeMo AutoModel's benchmark gate (model.backend.fake_balanced_gate, FakeBalancedGate at noise 0): "
                    "token t's top_k experts are (t x top_k + j) mod num_experts, consecutive, so the flex (DeepEP) "
                    "dispatcher sends it to the one or two EP ranks holding them instead of one rank per routed copy "
                    "(default false: learned routing)",
    )
    loss_fp32_upcast: bool | None = Field(
        None,
        description="Whether the cross-entropy casts the logits to fp32 first (NeMo AutoModel's MaskedCrossEntropy "
                    "loss_fn.fp32_upcast, default true; its llm_benchmark MoE recipes set false, keeping the loss's "
                    "log-softmax and gradients in bf16: half the loss's bytes per logit). Only a framework whose "
                    "memory convention prices both takes it (cards/memory.yaml logits_bytes_without_upcast)",
    )
    attention_backend: AttentionBackend | None = Field(
        None, description="Attention implementation: flash (FlashAttention-2), fused (cuDNN / Transformer Engine "
                          "FusedAttention; on ROCm CK or AOTriton), unfused (the s x s scores materialised and kept "
                          "for the backward, softmax and dropout as their own passes; Megatron-Core "
                          "--attention-backend unfused, Hugging Face attn_implementation eager) or auto (default: "
                          "what the framework picks by itself, its card's attention section)",
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
    grad_reduce_overlap: bool | None = Field(
        None, description="Overlap the data-parallel gradient reduction with the backward (and ZeRO-1/2's gather of "
                          "the updated parameters with the next forward): Megatron-Core --overlap-grad-reduce / "
                          "--overlap-param-gather (Megatron-Bridge ddp.overlap_grad_reduce), DeepSpeed "
                          "zero_optimization.overlap_comm (only these frameworks can turn it off); false leaves it "
                          "exposed after the backward (default: on, as meshplan's render writes it; the frameworks' "
                          "own defaults are off: Megatron-Core's, and DeepSpeed's below ZeRO-3)",
    )
    fsdp_keep_gathered: bool | None = Field(
        None, description="NeMo AutoModel's model.backend.enable_fsdp_optimizations (its MoE models' "
                          "MoEFSDPSyncMixin): without PP, every micro-batch's backward but the last leaves each "
                          "FSDP unit gathered and unreduced, so the next forward gathers nothing (one forward "
                          "all-gather per step) and every unit stays gathered to the end of the step (more memory, "
                          "less traffic) "
                          "(default false; under PP torch's pipeline stage does the same already)",
    )
    defer_fsdp_grad_sync: bool | None = Field(
        None, description="NeMo AutoModel's distributed.defer_fsdp_grad_sync (FSDP2Config): FSDP2's gradient "
                          "reduce-scatter only in the step's last micro-batch, each unit holding its unsharded fp32 "
                          "gradient until then (more memory, less traffic); false reduces every micro-batch (default: "
                          "the framework's own, true for NeMo AutoModel; other frameworks have no such setting)",
    )
    # --- RL post-training job (meshplan/rl/); frameworks with an `rl` card section (verl, SkyRL)
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
    mean_response_length: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Mean response, tokens, at most response_length: the log-prob passes "
                                               "and the update cost the mean, generation runs to the longest "
                                               "(default: every response at response_length)",
    )
    mean_prompt_length: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Mean prompt, tokens, at most prompt_length: the rollout prefills and "
                                               "caches it and the log-prob passes and the update cost it, memory "
                                               "plans for prompt_length (default: every prompt at prompt_length, "
                                               "the maximum the framework pads and filters to)",
    )
    prompts_per_mini_batch: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Prompts per optimizer step of the RL update (verl "
                                               "actor.ppo_mini_batch_size, SkyRL trainer.policy_mini_batch_size), at "
                                               "most prompts_per_step: each mini-batch is one pipeline flush, one "
                                               "gradient sync and one optimizer step (default: prompts_per_step, one "
                                               "optimizer step per RL step)",
    )
    update_epochs: int | None = Field(
        None, ge=1, le=1024, description="Passes of the RL update over the step's batch (verl actor.ppo_epochs, SkyRL "
                                         "trainer.update_epochs_per_batch), each running every mini-batch's "
                                         "optimizer step (default 1)",
    )
    entropy_coeff: float | None = Field(
        None, ge=0, le=1000, description="The entropy bonus' coefficient in the RL policy loss (verl "
                                         "actor.entropy_coeff; SkyRL trainer.algorithm.entropy_loss_coef with "
                                         "use_entropy_loss): nonzero computes the entropy with its gradient in every "
                                         "update micro-batch (default 0, both frameworks' own: off)",
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
        None, allow_inf_nan=False, gt=0.0, le=1.0,
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
        None, ge=1, le=MAX_DEGREE, description="Uneven PP: decoder layers on the first stage (a Gated DeltaNet "
                                               "hybrid's: layers of its pattern, two per decoder layer; default: even "
                                               "split)"
    )
    last_stage_layers: int | None = Field(
        None, ge=1, le=MAX_DEGREE, description="Uneven PP: decoder layers on the last stage (a Gated DeltaNet "
                                               "hybrid's: layers of its pattern, two per decoder layer; default: even "
                                               "split)"
    )
    pipeline_layout: str | None = Field(
        None, min_length=1, max_length=4096,
        description="Megatron's pipeline_model_parallel_layout, e.g. 'Et*3|(tt|)*29,m|L': stages split by '|' in "
                    "virtual-stage order, E embedding, t decoder layer (a Gated DeltaNet hybrid's too, as its GPTModel "
                    "counts: two of its pattern layers), m MTP layer, L loss, x*n and (...)*n repeat "
                    "(default: none, the even or first/last split; its stages are pp x vpp: sets them when left out)",
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
        None, allow_inf_nan=False, ge=0.0, lt=1.0,
        description="Share of GPU memory a layout must leave free to count as fitting (default: 0.10, rule MEM002); "
                    "recommend ranks, falls back and searches GPU counts with this one threshold",
    )
    activation_offload: bool | None = Field(
        None, description="Activation CPU offloading (Megatron fine-grained activation offloading, verl "
                          "enable_activation_offload, DeepSpeed cpu_checkpointing): the activations saved for backward "
                          "go to host memory except the layers in flight (default: off)",
    )
    activation_offload_layers: int | None = Field(
        None, ge=0, le=1024,
        description="Megatron-Core's layer-wise CPU offload (cpu_offloading with cpu_offloading_num_layers; NeMo's "
                    "and Megatron-Bridge's performance scripts' activation_offload_layers): the tensors the first N "
                    "layers save for backward go to host memory, the GPU keeping at most num_layers - N layers' at "
                    "once; fewer than the model's layers, no pipeline parallelism, no recompute (rule OF003) "
                    "(default: 0, none)",
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
        None, allow_inf_nan=False, ge=0.0, le=1.0,
        description="Share of this rank's optimizer state kept and stepped on the CPU (Megatron "
                    "optimizer_offload_fraction, DeepSpeed offload_optimizer ratio) (default: 1.0 with "
                    "optimizer_offload, else 0)",
    )
    framework_version: str | None = Field(
        None, min_length=1, max_length=32, pattern=r"^[0-9][0-9A-Za-z.+-]*$|^main$|^main@\d{4}-\d{2}-\d{2}$",
        # in words: PATTERN_WORDS
        description="The framework release the job runs (default: the one its card describes); a release whose "
                    "loss or recompute kept other tensors has its own memory convention (torchtitan 0.2.x: the "
                    "unchunked loss), and render writes that release's keys; main@YYYY-MM-DD: the development "
                    "branch on that day, without the card's release_changes made after it (NeMo AutoModel)",
    )
    cpu_memory_per_node: float | None = Field(
        None, allow_inf_nan=False, gt=0, le=1 << 20,
        description="Host memory per node in GiB; the offloaded state is checked against it (rule MEM003) "
                    "(default: not checked)",
    )
    mtp_num_layers: int | None = Field(
        None, ge=0, le=16,
        description="Multi-token-prediction depths trained (Megatron-Core mtp_num_layers; 0: none) (default: what the "
                    "framework's engine builds: the model's own MTP blocks, e.g. DeepSeek-V3's "
                    "num_nextn_predict_layers, on Megatron-Core, Megatron-Bridge and SkyRL's Megatron strategy; none "
                    "on verl, torchtitan or a Hugging Face FSDP engine; the card's engine.builds_model_mtp)",
    )
    mtp_use_repeated_layer: bool | None = Field(
        None, description="One MTP block's weights applied at every depth (Megatron-Core mtp_use_repeated_layer, "
                          "Megatron-Bridge's Nemotron 3 Super recipes): its weights held once (default: false)",
    )
    lora_rank: int | None = Field(
        None, ge=1, le=65536,
        description="LoRA: the adapters' rank; the base weights are frozen (no gradients or optimizer state) "
                    "(default with job=lora: the framework's default rank; given, the job is lora unless job=rl)",
    )
    lora_targets: list[LoraTarget] | None = Field(
        None, min_length=1, max_length=len(get_args(LoraTarget)), json_schema_extra={"uniqueItems": True},
        description="LoRA: the Megatron-Core linears adapted (linear_qkv, linear_proj, linear_fc1, linear_fc2; fc1 and "
                    "fc2 include a MoE model's experts; an MLA model's linear_q_proj, or linear_q_down_proj and "
                    "linear_q_up_proj, linear_kv_down_proj, linear_kv_up_proj; on verl's and SkyRL's FSDP engines "
                    "(Hugging Face PEFT) also a router or shared_expert_gate transformers builds as an nn.Linear, "
                    "DeepSeek-V2's and Qwen2-MoE's) (default: linear_qkv, linear_proj, linear_fc1, linear_fc2, "
                    "Megatron-Bridge's LoRA default, those the model has; on those FSDP engines PEFT's all-linear, "
                    "every linear the model has)",
    )

    lora_target_parameters: list[ExpertWeight] | None = Field(
        None, min_length=1, max_length=len(get_args(ExpertWeight)), json_schema_extra={"uniqueItems": True},
        description="LoRA on a MoE model's routed experts through Hugging Face PEFT's target_parameters (verl's FSDP "
                    "engine, model.target_parameters): the experts' 3D weights gate_up_proj and/or down_proj, each "
                    "wrapped in a ParamWrapper, one rank-r adapter per expert (default: none; the FSDP engine's "
                    "target_modules adapt no routed expert)",
    )

    lora_vision: bool | None = Field(
        None, description="LoRA on a multimodal model whose vision tower the engine builds (Llama 4 on verl's and "
                          "SkyRL's FSDP engines): whether the targets' adapters reach the tower's attention too, whose "
                          "q/k/v/o_proj the target names match (default: true; false is exclude_modules "
                          "'.*vision_model.*')",
    )

    @field_validator("cuda_graph_modules", mode="before")
    @classmethod
    def _plan_tuple(cls, names: object) -> object:
        """A Plan holds its modules as a tuple (hashable, for the memos); a plan's fields fed back as a request
        (api, MCP) take them as the list they are. Anything else meets the strict list check as given."""
        return list(names) if isinstance(names, tuple) else names

    @field_validator("recompute_modules", "lora_targets", "lora_target_parameters", "cuda_graph_modules")
    @classmethod
    def _each_once(cls, names: list[str] | None) -> list[str] | None:
        """A list of names is a set: a name given twice is refused, naming it (not silently kept or dropped)."""
        twice = sorted({n for n in names or () if names.count(n) > 1})
        if twice:
            raise ValueError(f"each name at most once ({', '.join(repr(n) for n in twice)} given more than once)")
        return names
