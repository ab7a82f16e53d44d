"""Megatron-Core / Megatron-LM flags, Megatron-Bridge ConfigContainer fields, and DeepSpeed configs.

Key names come from the packaged sources (megatron-core 0.19.2 `megatron/training/arguments.py`
and the dataclasses it generates flags from; megatron-bridge 0.6.2 `training/config.py`); the
proof tests read those files and fail on any name they do not define.
"""

from __future__ import annotations

from typing import Any

from meshplan.adapters.architecture import bias_flags, bridge_fields, core_flags, megatron_architecture
from meshplan.adapters.common import (
    DROPOUT_ON,
    Built,
    Split,
    attention_value,
    bridge_presets,
    flex_notes,
    hierarchical_cp,
    megatron_cpu_optimizer,
    megatron_dispatcher,
    megatron_recompute,
    moe_layer_freq,
    nodes,
    offload_modules,
    routing_notes,
    split_fields,
)
from meshplan.adapters.lora import BRIDGE_SETUP, bridge_lora
from meshplan.arithmetic.activation_passes import activation_fusable, default_activation_fusion
from meshplan.arithmetic.memory_states import convention, fp8_param_gather, fp8_recipe, precision_aware
from meshplan.arithmetic.schedule import decoder_layer_cut
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import attention_switches
from meshplan.knowledge.adapter_knobs import adapter_section, knob_table, shared_expert_overlap
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.gdn_config import decoder_layers
from meshplan.schema.model import DSASpec
from meshplan.schema.plan import Job, Plan

Flag = tuple[str, Any]  # (flag, value); value None = a switch, a list = several values


def _sharding(plan: Plan) -> str | None:
    """Megatron-FSDP's --data-parallel-sharding-strategy for ZeRO-2/3 (optim_grads / optim_grads_params)."""
    return {2: "optim_grads", 3: "optim_grads_params"}.get(plan.zero_stage)


def _dsa_flags(dsa: DSASpec) -> tuple[list[Flag], list[str]]:
    """DeepSeek Sparse Attention as Megatron-LM takes it (NVIDIA/Megatron-LM d98e8a6: TransformerConfig's
    experimental_attention_variant and dsa_indexer_* fields as flags, tests/functional_tests/test_cases/gpt/
    gpt3_mcore_te_tp2_pp2_dsa/model_config.yaml): the indexer's shapes, its KL loss over the selected keys (the
    paper's sparse stage, which the estimate times; RoPE fusion off is architecture.py's _rope); the loss
    coefficient is the user's, said in a note."""
    out: list[Flag] = [("--experimental-attention-variant", "dsa"), ("--dsa-indexer-n-heads", dsa.index_n_heads),
                       ("--dsa-indexer-head-dim", dsa.index_head_dim), ("--dsa-indexer-topk", dsa.index_topk),
                       ("--dsa-indexer-use-sparse-loss", None)]
    return out, ["The estimate times DSA's indexer trained by its KL loss over the selected keys (the DeepSeek-V3.2 "
                 "paper's sparse stage): add --dsa-indexer-loss-coeff with the weight you train with (Megatron-Core's "
                 "default None trains no indexer; Megatron's DSA functional test uses 0.01, Megatron-Bridge's GLM-5 "
                 "bridge 0.001), and --dsa-kernel-backend tilelang or cudnn for the fused kernels the estimate "
                 "assumes (the default none runs a PyTorch path that holds the s x s index scores in fp32)."]


def architecture_flags(job: Job) -> tuple[list[Flag], list[str]]:
    """The model as pretrain_gpt.py flags (names from megatron/training/arguments.py), and notes on what the
    flags cannot say (meshplan/adapters/architecture.py: rope, activation, norm and qk-norm)."""
    m = job.model
    settings, notes, core_notes = megatron_architecture(m, job.seq_length)
    own, unflagged = core_flags(settings)
    hybrid_model = m.layer_pattern is not None and m.gdn is None  # HybridModel: pretrain_mamba.py
    # a Gated DeltaNet hybrid's depth is its GPTModel's TransformerLayers, one per decoder layer
    depth = m.num_layers if m.gdn is None else decoder_layers(m.num_layers)
    flags: list[Flag] = [
        ("--num-layers", depth), ("--hidden-size", m.hidden_size),
        ("--ffn-hidden-size", m.ffn_hidden_size), ("--num-attention-heads", m.num_attention_heads),
    ][hybrid_model:]  # a hybrid's depth is its --hybrid-layer-pattern's (Megatron-LM ignores it)
    if m.mla is None and m.num_kv_heads != m.num_attention_heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", m.num_kv_heads)]
    if m.mla is None and m.head_dim * m.num_attention_heads != m.hidden_size:
        flags.append(("--kv-channels", m.head_dim))
    flags += [("--seq-length", job.seq_length),
              ("--max-position-embeddings", max(job.seq_length, m.max_position_embeddings or 0))]
    flags += own
    if not m.tie_word_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    flags += bias_flags(m)
    if m.mla is not None:
        flags += [("--multi-latent-attention", None), ("--kv-lora-rank", m.mla.kv_lora_rank),
                  ("--qk-head-dim", m.mla.qk_nope_head_dim), ("--qk-pos-emb-head-dim", m.mla.qk_rope_head_dim),
                  ("--v-head-dim", m.mla.v_head_dim)]
        if m.mla.q_lora_rank:
            flags.append(("--q-lora-rank", m.mla.q_lora_rank))
    if m.dsa is not None:
        dsa_flags, dsa_notes = _dsa_flags(m.dsa)
        flags += dsa_flags
        notes += dsa_notes
    if m.gdn is not None:  # GPTModel's Gated DeltaNet layers (gpt_builders.py; 0.19.2 knows only this spelling)
        flags.append(("--experimental-attention-variant", "gated_delta_net"))
    if m.moe is not None:
        flags += [("--num-experts", m.moe.num_experts), ("--moe-router-topk", m.moe.top_k),
                  ("--moe-ffn-hidden-size", m.moe.expert_ffn_hidden_size), ("--moe-grouped-gemm", None)]
        if m.moe.num_shared_experts:
            flags.append(("--moe-shared-expert-intermediate-size", m.moe.shared_expert_ffn_hidden_size))
        if m.moe.shared_expert_gate:  # TransformerConfig.moe_shared_expert_gate (Qwen2-MoE's sigmoid gate)
            flags.append(("--moe-shared-expert-gate", None))
        freq = moe_layer_freq(job) if not hybrid_model else None  # HybridModel's MoE layers: its pattern's E
        if freq:
            flags.append(("--moe-layer-freq", freq))
    if m.num_mtp_layers:
        flags.append(("--mtp-num-layers", m.num_mtp_layers))
    if m.mtp_repeated_layer:  # one MTP block applied at every depth (TransformerConfig.mtp_use_repeated_layer)
        flags.append(("--mtp-use-repeated-layer", None))
    return flags, notes + core_notes + unflagged


def parallel_flags(job: Job, plan: Plan) -> tuple[list[Flag], list[str]]:
    """TP/PP/VPP/CP/EP/SP/optimizer/recompute flags, plus notes on the choices made."""
    notes: list[str] = []
    flags: list[Flag] = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    split = decoder_split(job, plan)
    if plan.pipeline_layout is not None:
        # The layout sets vpp (its stages / pp); validate_args allows no other virtual-stage flag with it.
        flags.append(("--pipeline-model-parallel-layout", plan.pipeline_layout))
    elif plan.vpp > 1:
        if split.first is None and split.last is None and split.per_chunk:
            # --virtual-pipeline-model-parallel-size does not exist; VPP is set by layers per virtual stage.
            flags.append(("--num-layers-per-virtual-pipeline-stage", split.per_chunk))
        else:
            # validate_args forbids layers-per-vstage together with decoder-first/last.
            flags.append(("--num-virtual-stages-per-pipeline-rank", plan.vpp))
    if split.first is not None:
        flags.append(("--decoder-first-pipeline-num-layers", split.first))
    if split.last is not None:
        flags.append(("--decoder-last-pipeline-num-layers", split.last))
    flags += [(flag, None) for flag, on in (("--account-for-embedding-in-pipeline-split", plan.account_for_embedding),
                                            ("--account-for-loss-in-pipeline-split", plan.account_for_loss)) if on]
    flags.append(("--context-parallel-size", plan.cp))
    if plan.cp > 1:
        flags.append(("--cp-comm-type", plan.cp_comm_type))
        if plan.cp_comm_type == "a2a+p2p":
            sizes = hierarchical_cp(job, plan)
            flags.append(("--hierarchical-context-parallel-sizes", sizes))
            notes.append(f"a2a+p2p context parallelism: all-to-all over {sizes[0]} ranks inside a node, "
                         f"ring over {sizes[1]} groups.")
    if job.model.moe is not None:
        flags += [("--expert-model-parallel-size", plan.ep), ("--expert-tensor-parallel-size", plan.etp)]
        flags += [("--" + name.replace("_", "-"), value) for name, value in megatron_dispatcher(job, plan)]
        if plan.moe_a2a_overlap:  # 1F1B EP overlap; delay_wgrad_compute gives it the weight gradients to hide behind
            flags += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
        if shared_overlap_written(job, plan):  # rule EP012: shared experts, no a2a overlap (alltoall or flex)
            flags.append(("--moe-shared-expert-overlap", None))
    if plan.sequence_parallel:
        flags.append(("--sequence-parallel", None))
    if plan.tp_comm_overlap:  # Transformer Engine userbuffers (rule TP005: needs --sequence-parallel)
        flags.append(("--tp-comm-overlap", None))
    if plan.cuda_graph_impl != "none":  # rules CG001/CG002; arguments.py turns the TE RNG tracker on for graphs
        flags.append(("--cuda-graph-impl", plan.cuda_graph_impl))
        if plan.cuda_graph_modules:
            flags.append(("--cuda-graph-modules", list(plan.cuda_graph_modules)))
        if plan.cuda_graph_impl == "full_iteration":  # arguments.py asserts it off under the full-iteration graph
            flags.append(("--no-check-for-nan-in-loss-and-grad", None))
    backend = attention_value("megatron-core", "pretrain_gpt", plan.attention_backend)
    if backend:
        flags.append(("--attention-backend", backend))
    # written either way: Megatron-LM's own default is 0.1 (the estimate reads Plan.dropout, off unless asked)
    dropout = DROPOUT_ON if plan.dropout else 0.0
    flags += [("--attention-dropout", dropout), ("--hidden-dropout", dropout)]
    if plan.zero_stage == 1:
        flags.append(("--use-distributed-optimizer", None))
    elif plan.zero_stage in (2, 3):
        flags += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", _sharding(plan)),
                  ("--ckpt-format", "fsdp_dtensor")]
        notes.append("zero_stage 2/3 renders Megatron-FSDP (optim_grads / optim_grads_params); it needs "
                     "--ckpt-format fsdp_dtensor and CUDA_DEVICE_MAX_CONNECTIONS other than 1.")
    if plan.dp_replicate > 1:  # hybrid sharding: states over dp*cp / N, N replicas (outer strategy no_shard)
        flags.append(("--num-distributed-optimizer-instances", plan.dp_replicate))
    if plan.grad_reduce_overlap:  # the DP reduction bucketed behind the backward (Megatron-Core's default: off)
        flags.append(("--overlap-grad-reduce", None))
        if plan.zero_stage > 0:  # arguments.py: only with the distributed optimizer or Megatron-FSDP
            flags.append(("--overlap-param-gather", None))
    flags += [("--micro-batch-size", plan.micro_batch_size), ("--global-batch-size", job.global_batch_size)]
    rec = decoder_recompute(job, plan)
    if rec["recompute_granularity"]:
        flags.append(("--recompute-granularity", rec["recompute_granularity"]))
        if rec.get("recompute_modules"):
            flags.append(("--recompute-modules", rec["recompute_modules"]))
        if rec["recompute_method"]:
            flags += [("--recompute-method", rec["recompute_method"]),
                      ("--recompute-num-layers", rec["recompute_num_layers"])]
    flags.append(("--bf16", None))
    flags += precision_flags(job, plan)
    flags += offload_flags(job, plan)
    return flags, notes


def offload_flags(job: Job, plan: Plan) -> list[Flag]:
    """Fine-grained activation offloading and the in-step CPU optimizer as megatron-core 0.19.2 flags
    (transformer_config.py offload_modules; arguments.py --optimizer-cpu-offload needs
    --use-precision-aware-optimizer, written here unless the precision knobs already did)."""
    flags: list[Flag] = []
    if plan.activation_offload:
        flags += [("--fine-grained-activation-offloading", None), ("--offload-modules", offload_modules(job, plan))]
    if job.activation_offload_layers:  # layer-wise: validate_args turns cpu_offloading on from the count (rule OF003)
        flags.append(("--cpu-offloading-num-layers", job.activation_offload_layers))
    cpu = megatron_cpu_optimizer(job, plan)
    if cpu:
        flags += [("--optimizer-cpu-offload", None),
                  ("--optimizer-offload-fraction", cpu["optimizer_offload_fraction"]),
                  ("--overlap-cpu-optimizer-d2h-h2d", None)]
        if not precision_aware(plan):
            flags.append(("--use-precision-aware-optimizer", None))
    return flags


def precision_flags(job: Job, plan: Plan) -> list[Flag]:
    """The optimizer and precision knobs as megatron-core 0.19.2 flags: --optimizer muon (with
    --use-distributed-optimizer, arguments.py turns on its layer-wise distributed optimizer), --grad-reduce-in-bf16
    (fp32 is the bf16 default), the precision-aware optimizer's moment dtypes, the fp8 format and recipe (the
    card's default when left out), --fp8-param-gather, --no-bias-swiglu-fusion / --no-bias-gelu-fusion where
    the job runs the activation unfused, and --cross-entropy-loss-fusion with --cross-entropy-fusion-impl where the
    job fuses its loss."""
    flags: list[Flag] = [("--optimizer", plan.optimizer)] if plan.optimizer != "adam" else []
    if plan.grad_reduce_in_fp32 is False:
        flags.append(("--grad-reduce-in-bf16", None))
    if precision_aware(plan):
        flags += [("--use-precision-aware-optimizer", None), ("--exp-avg-dtype", plan.optimizer_state_dtype),
                  ("--exp-avg-sq-dtype", plan.optimizer_state_dtype)]
    if not job.bias_activation_fusion and activation_fusable(job.model):
        # store_false flags (the card's bias_activation_fusion knob), the one of the model's activation
        flags.append(("--no-bias-swiglu-fusion" if job.model.is_swiglu else "--no-bias-gelu-fusion", None))
    if job.cross_entropy_loss_fusion:  # a store_true flag and its implementation (rule PR009 refuses te on 0.19)
        flags += [("--cross-entropy-loss-fusion", None), ("--cross-entropy-fusion-impl", job.cross_entropy_fusion_impl)]
    if job.precision == "fp8":
        flags += [("--fp8-format", "hybrid"), ("--fp8-recipe", fp8_recipe(job, plan))]
        if plan.fp8_param_gather:
            flags.append(("--fp8-param-gather", None))
    return flags


def build_core(job: Job, plan: Plan, variant: str, version: str) -> Built:
    n = nodes(job)
    flags, notes = parallel_flags(job, plan)
    model, model_notes = architecture_flags(job)
    flex, flex_warnings = flex_notes(job, plan)
    connections = (plan.tp > 1 or plan.cp > 1) and plan.zero_stage < 2
    # HybridModel's entry point for a Mamba-2 hybrid; a Gated DeltaNet hybrid is a GPTModel (decoder_split)
    entry = "pretrain_mamba.py" if job.model.layer_pattern is not None and job.model.gdn is None else "pretrain_gpt.py"
    return Built(
        template="megatron_core.j2",
        context={"nodes": n, "flags": model + flags, "max_connections": connections, "to_add": model_notes,
                 "entry": entry},
        format="shell", filename=entry.replace(".py", ".sh"),
        notes=[*model_notes, *notes, *flex, *routing_notes(job, plan),
               "Data, tokenizer, optimizer and checkpoint flags are yours to add (--data-path, --tokenizer-type, "
               "--lr, --save ...); the flags here fix the model shape and the layout.",
               "There is no --virtual-pipeline-model-parallel-size flag: VPP is "
               "--num-layers-per-virtual-pipeline-stage (or --num-virtual-stages-per-pipeline-rank)."],
        warnings=(["Megatron-LM silently drops --sequence-parallel when TP is 1."]
                  if plan.sequence_parallel and plan.tp == 1 else []) + flex_warnings,
    )


# --------------------------------------------------------------------------- Megatron-Bridge


def bridge_architecture(job: Job) -> tuple[list[tuple[str, Any]], list[str]]:
    """The model's rope, norm and qk-norm as cfg.model fields, and what no field can say. The recipe (or
    AutoBridge) supplies what has no plain value: the activation function and the layer spec."""
    settings, notes, _ = megatron_architecture(job.model, job.seq_length)
    return bridge_fields(settings), notes


def decoder_recompute(job: Job, plan: Plan) -> dict[str, object]:
    """megatron_recompute's fields, with recompute_num_layers in the GPTModel's TransformerLayers where the model is a
    Gated DeltaNet hybrid: meshplan counts its pattern layers, two per decoder layer (transformer_block.py
    _checkpointed_forward chunks and counts TransformerLayers), so N pattern layers are N / 2 decoder layers (rule
    RC007 refuses an odd N); uniform's one layer per chunk is one decoder layer. It wrote N, recomputing twice the
    layers a block recompute was planned with."""
    rec = megatron_recompute(plan)
    layers = rec.get("recompute_num_layers")
    if job.model.gdn is not None and isinstance(layers, int) and plan.recompute_layers is not None:
        rec["recompute_num_layers"] = max(1, decoder_layers(layers))
    return rec


def decoder_split(job: Job, plan: Plan) -> Split:
    """The plan's split in the layers Megatron-Core's GPTModel counts, on both Megatron faces (pretrain_gpt.py and
    Megatron-Bridge's Qwen3NextBridge): a Gated DeltaNet hybrid's in decoder layers (one TransformerLayer per mixer and
    MoE pair: half the pattern's layers; experimental_attention_variant_module_specs.py slices the layer specs by
    get_transformer_layer_offset / get_num_layers_to_build), refused where a stage or virtual chunk boundary cuts a
    decoder layer between its mixer and its MoE (rule PP017); every other model's as it is. A pipeline layout (its t
    a decoder layer) and the embedding / loss accounting already count decoder layers (schedule.explicit_stages):
    written as they are."""
    split = split_fields(job, plan)
    if job.model.gdn is None:
        return split
    cut = decoder_layer_cut(job.model, plan)  # rule PP017's test, so a forced render refuses what the rule does
    if cut is not None:
        raise MeshplanError(
            f"Megatron-Core builds {job.model.name} as a GPTModel of {decoder_layers(job.model.num_layers)} decoder "
            f"layers, each a Gated DeltaNet or attention mixer with its MoE (two layers of meshplan's pattern): {cut}.",
            fix="Use an even pipeline split (first/last_stage_layers even, pp x vpp dividing the decoder layers), "
                "or a pipeline_layout (t a decoder layer) or account_for_embedding / account_for_loss.")
    first, last, per_chunk = (None if n is None else decoder_layers(n) for n in (split.first, split.last,
                                                                                  split.per_chunk))
    return Split(split.stages, first, last, per_chunk)


def shared_overlap_written(job: Job, plan: Plan) -> bool:
    """moe_shared_expert_overlap as a Megatron render writes it: as the plan runs it (adapter_knobs.
    shared_expert_overlap: the framework's default yielding to the plan), or as asked on a model without shared
    experts, where Megatron-Core takes it and ignores it (rule EP014's warning)."""
    return shared_expert_overlap(job, plan) or (job.moe_shared_expert_overlap and job.moe_shared_expert_overlap_asked)


def bridge_settings(job: Job, plan: Plan) -> list[tuple[str, Any]]:
    """ConfigContainer fields (cfg.<section>.<field>) for the plan."""
    split = decoder_split(job, plan)
    s: list[tuple[str, Any]] = [
        ("model.tensor_model_parallel_size", plan.tp),
        ("model.pipeline_model_parallel_size", plan.pp),
        ("model.virtual_pipeline_model_parallel_size", plan.vpp if plan.vpp > 1 else None),
        ("model.context_parallel_size", plan.cp),
    ]
    if plan.cp > 1:
        s.append(("model.cp_comm_type", plan.cp_comm_type))
        if plan.cp_comm_type == "a2a+p2p":
            s.append(("model.hierarchical_context_parallel_sizes", hierarchical_cp(job, plan)))
    if job.model.moe is not None:
        s += [("model.expert_model_parallel_size", plan.ep), ("model.expert_tensor_parallel_size", plan.etp)]
        s += [(f"model.{name}", value) for name, value in megatron_dispatcher(job, plan)]
        if plan.moe_token_dispatcher == "flex":
            # What Bridge's own apply_flex_dispatcher_backend (training/flex_dispatcher_backend.py) does with flex
            # (the card's moe_shared_expert_overlap off_beside_flex, which rule EP012 holds a request to).
            s.append(("model.moe_shared_expert_overlap", False))
        if plan.moe_a2a_overlap:  # comm_overlap asserts moe_shared_expert_overlap off (training/comm_overlap.py)
            if plan.moe_token_dispatcher != "flex":
                s.append(("model.moe_shared_expert_overlap", False))
            s += [("comm_overlap.overlap_moe_expert_parallel_comm", True), ("comm_overlap.delay_wgrad_compute", True)]
        elif (job.model.has_shared_experts or job.moe_shared_expert_overlap) \
                and plan.moe_token_dispatcher != "flex":  # rules EP012, EP014 (no shared experts: a no-op)
            # written either way, as the plan runs it (the provider's default where the request leaves it out, off
            # beside a recomputed shared_experts module): a recipe may set it otherwise than its provider (the perf
            # recipes turn it off), and the estimate counts what the plan runs (shared_expert_overlap)
            s.append(("model.moe_shared_expert_overlap", shared_overlap_written(job, plan)))
    if job.mtp_asked:  # else the recipe's model keeps its checkpoint's MTP depth (its bridge reads the HF config)
        s += [("model.mtp_num_layers", job.model.num_mtp_layers or None),
              ("model.mtp_use_repeated_layer", job.model.mtp_repeated_layer)]
    s.append(("model.sequence_parallel", plan.sequence_parallel))
    if job.bias_activation_fusion != default_activation_fusion(job.card.defaults, job.model, job.framework_version):
        s.append(("model.bias_activation_fusion", job.bias_activation_fusion))  # not the model provider's default
    if (job.cross_entropy_loss_fusion, job.cross_entropy_fusion_impl) != job.card.defaults.cross_entropy(
            job.model.model_type):  # TransformerConfig fields of the provider, where not the provider's own
        s.append(("model.cross_entropy_loss_fusion", job.cross_entropy_loss_fusion))
        if job.cross_entropy_loss_fusion:
            s.append(("model.cross_entropy_fusion_impl", job.cross_entropy_fusion_impl))
    if job.fp8_activation_input_store:  # a TransformerConfig field of the provider (rule PR006: SwiGLU only)
        s.append(("model.activation_func_fp8_input_store", True))
    if plan.tp_comm_overlap:  # Bridge passes it to Megatron-Core's tp_comm_overlap (training/comm_overlap.py)
        s.append(("comm_overlap.tp_comm_overlap", True))
    if plan.cuda_graph_impl != "none":  # as Bridge's scripts/performance/utils/overrides.py _set_cuda_graph_overrides
        s += [("model.cuda_graph_impl", plan.cuda_graph_impl),
              ("model.cuda_graph_modules", list(plan.cuda_graph_modules)),
              ("rng.te_rng_tracker", True), ("model.use_te_rng_tracker", True)]
        if plan.cuda_graph_impl == "full_iteration":
            s.append(("rerun_state_machine.check_for_nan_in_loss", False))
    backend = attention_value("megatron-bridge", "python", plan.attention_backend)
    if backend:  # AttnBackend (an override names it: model.attention_backend=flash; build_bridge codes it in python)
        s.append(("model.attention_backend", backend))
    if plan.dropout:  # Bridge's model bridges set both to 0.0 (models/*/*_bridge.py): written only when on
        s += [("model.attention_dropout", DROPOUT_ON), ("model.hidden_dropout", DROPOUT_ON)]
    if split.first is not None:
        s.append(("model.num_layers_in_first_pipeline_stage", split.first))
    if split.last is not None:
        s.append(("model.num_layers_in_last_pipeline_stage", split.last))
    if plan.pipeline_layout is not None:
        s.append(("model.pipeline_model_parallel_layout", plan.pipeline_layout))
    s += [(f"model.account_for_{part}_in_pipeline_split", True)
          for part, on in (("embedding", plan.account_for_embedding), ("loss", plan.account_for_loss)) if on]
    s += [(f"model.{k}", v) for k, v in decoder_recompute(job, plan).items()]
    s.append(("model.seq_length", job.seq_length))
    fsdp = plan.zero_stage in (2, 3)
    s += [("ddp.use_distributed_optimizer", plan.zero_stage >= 1),
          ("optimizer.use_distributed_optimizer", plan.zero_stage >= 1)]
    if plan.dp_replicate > 1:  # hybrid sharding (DistributedDataParallelConfig)
        s.append(("ddp.num_distributed_optimizer_instances", plan.dp_replicate))
    # the DP reduction (and the distributed optimizer's parameter gather) overlapped as the plan times it: Bridge's
    # pretrain recipes set both on (recipes/common.py _pretrain_common), its SFT/PEFT recipes leave Megatron-Core's off
    s += [("ddp.overlap_grad_reduce", plan.grad_reduce_overlap),
          ("ddp.overlap_param_gather", plan.grad_reduce_overlap and plan.zero_stage > 0)]
    if fsdp:
        s += [("dist.use_megatron_fsdp", True), ("ddp.use_megatron_fsdp", True),
              ("ddp.data_parallel_sharding_strategy", _sharding(plan)), ("checkpoint.ckpt_format", "fsdp_dtensor")]
    s += [("train.micro_batch_size", plan.micro_batch_size), ("train.global_batch_size", job.global_batch_size),
          ("dataset.seq_length", job.seq_length)]
    s += bridge_precision(job, plan)
    if plan.activation_offload:
        s += [("model.fine_grained_activation_offloading", True), ("model.offload_modules", offload_modules(job, plan))]
    if job.activation_offload_layers:  # the provider's TransformerConfig needs the switch beside the count (OF003)
        s += [("model.cpu_offloading", True), ("model.cpu_offloading_weights", False),
              ("model.cpu_offloading_num_layers", job.activation_offload_layers)]
    s += [(f"optimizer.{k}", v) for k, v in megatron_cpu_optimizer(job, plan).items()
          if not (k == "use_precision_aware_optimizer" and precision_aware(plan))]
    return s


# The torch dtype of each optimizer_state_dtype as megatron-core's arguments.py maps it (fp8 moments are uint8 with
# a per-tensor scale in Transformer Engine's FusedAdam).
TORCH_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16", "fp8": "torch.uint8"}


class PyCode(str):
    """A value written as Python code in the python variant (a torch dtype), as its text in overrides."""

    def __repr__(self) -> str:
        return str(self)


def bridge_precision(job: Job, plan: Plan) -> list[tuple[str, Any]]:
    """The optimizer and precision knobs as ConfigContainer fields: Muon on cfg.optimizer.optimizer, the
    precision-aware optimizer on cfg.optimizer, and the fp8 format, recipe (the card's default when left out),
    fp8_param_gather and grad_reduce_in_fp32 on cfg.mixed_precision, whose setup() writes them over the model,
    optimizer and DDP configs (a model.fp8 set directly is overwritten by the recipe's mixed_precision)."""
    s: list[tuple[str, Any]] = []
    if plan.optimizer == "muon":  # Bridge's optim.py: the "dist_" prefix asks for the layer-wise distributed optimizer
        s.append(("optimizer.optimizer", "dist_muon" if plan.zero_stage >= 1 else "muon"))
    if precision_aware(plan):
        dtype = PyCode(TORCH_DTYPES[plan.optimizer_state_dtype])
        s += [("optimizer.use_precision_aware_optimizer", True), ("optimizer.exp_avg_dtype", dtype),
              ("optimizer.exp_avg_sq_dtype", dtype)]
    if job.precision == "fp8":
        s += [("mixed_precision.fp8", "hybrid"), ("mixed_precision.fp8_recipe", fp8_recipe(job, plan))]
        if plan.fp8_param_gather is not None:
            s.append(("mixed_precision.fp8_param_gather", plan.fp8_param_gather))
        if job.fp8_dot_product_attention:  # setup() writes it over the model's fp8_dot_product_attention
            s.append(("mixed_precision.fp8_dot_product_attention", True))
    if plan.grad_reduce_in_fp32 is not None:
        s.append(("mixed_precision.grad_reduce_in_fp32", plan.grad_reduce_in_fp32))
    return s


def preset_settings(settings: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """run_recipe.py overrides: the mixed_precision.<field> settings as the one registered preset that holds them
    (the recipe's mixed_precision may be a preset name, whose fields an override cannot reach), or an error naming
    the python variant, which sets the fields themselves."""
    fields = {k.split(".", 1)[1]: v for k, v in settings if k.startswith("mixed_precision.")}
    if not fields:
        return settings
    presets = bridge_presets()
    recipe, gather = fields.get("fp8_recipe", "bf16"), fields.get("fp8_param_gather")
    named = presets.of_recipe(str(recipe), None if gather is None else str(gather).lower() == "true")
    # no registered preset turns FP8 attention on (fp8_dot_product_attention: the python variant sets the field)
    preset = (named[0].name if named and fields.get("grad_reduce_in_fp32", True)
              and not fields.get("fp8_dot_product_attention") else None)
    if preset is None:
        raise MeshplanError(
            f"Megatron-Bridge's run_recipe.py overrides can name a mixed-precision preset, and none has "
            f"{', '.join(f'{k}={v}' for k, v in fields.items())}.",
            fix="Render variant 'python' (it sets cfg.mixed_precision's fields), or ask for a preset's settings: "
                + "; ".join(f"{p.recipe} with fp8_param_gather={str(p.fp8_param_gather).lower()} -> {p.name}"
                            for p in presets.presets) + ".")
    return [(k, v) for k, v in settings if not k.startswith("mixed_precision.")] + [("mixed_precision", preset)]


def bridge_preset(job: Job, plan: Plan) -> str:
    """The registered mixed-precision preset of the plan's recipe (bf16_mixed without fp8), with its fp8_param_gather
    where one has it: what the python variant starts cfg.mixed_precision from before setting its fields (a recipe's
    mixed_precision may be a preset name: recipes/common.py _pretrain_common sets "bf16_mixed")."""
    presets = bridge_presets()
    recipe = fp8_recipe(job, plan) or "bf16"
    exact = presets.of_recipe(recipe, fp8_param_gather(job, plan))
    return (exact or presets.of_recipe(recipe))[0].name  # fields set the rest


def build_bridge(job: Job, plan: Plan, variant: str, version: str) -> Built:
    model, model_notes = bridge_architecture(job)
    settings = model + bridge_settings(job, plan) + bridge_lora(job)  # LoRA: cfg.peft (meshplan/adapters/lora.py)
    flex, warnings = flex_notes(job, plan)
    notes = [*model_notes,
             "Apply after building the ConfigContainer from a recipe of this model; the model.* architecture fields "
             "restate its config (the recipe keeps the activation function and layer spec). Bridge defers the "
             "Megatron-Core __post_init__ checks to cfg.validate(), so run it after these assignments.", *flex,
             *routing_notes(job, plan)]
    if flex:
        notes.append("With flex, moe_shared_expert_overlap is set False as Bridge's apply_flex_dispatcher_backend "
                     "does; cfg.validate() checks the backend against the GPU it runs on "
                     "(validate_flex_dispatcher_backend).")
    if plan.moe_a2a_overlap and job.model.moe is not None:
        notes.append("moe_a2a_overlap: comm_overlap.overlap_moe_expert_parallel_comm with delay_wgrad_compute; the "
                     "run_recipe overrides need a recipe that builds cfg.comm_overlap (the perf recipes do), the "
                     "python variant creates one when the recipe leaves it None.")
    if plan.tp_comm_overlap:
        notes.append("tp_comm_overlap: comm_overlap.tp_comm_overlap (Transformer Engine userbuffers); the "
                     "run_recipe overrides need a recipe that builds cfg.comm_overlap (the perf recipes do), the "
                     "python variant creates one when the recipe leaves it None.")
    if variant == "run_recipe":
        if plan.optimizer_state_dtype == "fp8":
            raise MeshplanError("run_recipe.py reads a dtype override by name, and fp8 moments are torch.uint8, which "
                                "it has no name for (utils/activation_map.py DTYPE_MAP).",
                                fix="Render variant 'python' (cfg.optimizer.exp_avg_dtype = torch.uint8), or use "
                                    "optimizer_state_dtype=bf16.")
        settings = preset_settings(settings)
        n = nodes(job)
        return Built(template="megatron_bridge_recipe.j2", context={"settings": settings, "nodes": n,
                                                                    "to_add": model_notes,
                                                                    "mode": "lora" if job.lora else None},
                     format="shell", filename="run_recipe.sh",
                     notes=[*notes, "scripts/training/run_recipe.py is in the Megatron-Bridge repository "
                                    "(not the wheel); set RECIPE to a recipe function of your model."],
                     warnings=warnings)
    setup = ("import torch",) if any(isinstance(v, PyCode) for _, v in settings) else ()
    if any(k == "model.attention_backend" for k, _ in settings):  # an AttnBackend member, not its name
        settings = [(k, PyCode(f"AttnBackend.{v}") if k == "model.attention_backend" else v) for k, v in settings]
        setup += ("from megatron.core.transformer.enums import AttnBackend",)
    if (plan.moe_a2a_overlap and job.model.moe is not None) or plan.tp_comm_overlap:  # a recipe may leave it None
        setup += ("from megatron.bridge.training.comm_overlap import CommOverlapConfig",
                  "if cfg.comm_overlap is None:", "    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)")
    setup += BRIDGE_SETUP if job.lora else ()
    if any(k.startswith("mixed_precision.") for k, _ in settings):
        setup += ("from megatron.bridge.training.mixed_precision import get_mixed_precision_config",
                  f"cfg.mixed_precision = get_mixed_precision_config({bridge_preset(job, plan)!r})")
    return Built(template="megatron_bridge.j2", context={"settings": settings, "to_add": model_notes, "setup": setup},
                 format="python", filename="layout.py", notes=notes, warnings=warnings)


# --------------------------------------------------------------------------- DeepSpeed


def ds_config(job: Job, plan: Plan) -> dict[str, Any]:
    """ds_config.json: batch sizes (train = micro * accumulation * dp), bf16/fp16, ZeRO stage."""
    accumulation = job.global_batch_size // (plan.micro_batch_size * plan.dp)
    if accumulation * plan.micro_batch_size * plan.dp != job.global_batch_size:
        raise MeshplanError(
            f"DeepSpeed requires train_batch_size = micro * accumulation * dp: {job.global_batch_size} is not a "
            f"multiple of {plan.micro_batch_size} * {plan.dp}.",
            fix=f"Use a global batch that is a multiple of {plan.micro_batch_size * plan.dp}.",
        )
    config: dict[str, Any] = {
        "train_batch_size": job.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": plan.zero_stage},
        "gradient_clipping": 1.0,
    }
    if plan.zero_stage > 0:  # DeepSpeed's default is on at stage 3 only: written as the plan times it
        config["zero_optimization"]["overlap_comm"] = plan.grad_reduce_overlap
    if plan.zero_stage == 3:
        config["zero_optimization"]["contiguous_gradients"] = True
    if plan.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": plan.tp > 1,
                                              "contiguous_memory_optimization": False}
        if plan.activation_offload:  # the checkpointed inputs on the CPU (rule OF002: needs recompute full)
            config["activation_checkpointing"]["cpu_checkpointing"] = True
    if plan.param_offload:
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    if plan.optimizer_offload:
        offload: dict[str, Any] = {"device": "cpu", "pin_memory": True}
        if 0 < plan.optimizer_offload_fraction < 1:
            offload["ratio"] = plan.optimizer_offload_fraction  # ZeRO-Offload++: that share steps on the CPU
        config["zero_optimization"]["offload_optimizer"] = offload
    return config


def build_deepspeed(job: Job, plan: Plan, variant: str, version: str) -> Built:
    if plan.pp > 1 and plan.zero_stage > 1:
        raise MeshplanError(
            f"DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only; got zero_stage={plan.zero_stage} with "
            f"pp={plan.pp}.", fix="Use zero_stage=1 with pipeline parallelism, or pp=1 for ZeRO-2/3.")
    config = ds_config(job, plan)
    if variant == "config":
        if plan.tp > 1 or plan.pp > 1 or plan.ep > 1:
            raise MeshplanError("A plain ds_config.json cannot express tp/pp/ep > 1.",
                                fix="Use variant 'megatron-deepspeed', which adds the Megatron-DeepSpeed flags.")
        notes = ["Pass it with deepspeed.initialize(config='ds_config.json') or --deepspeed_config."]
        if plan.recompute != "none":
            notes.append(f"recompute={plan.recompute}: a ds_config turns no recomputation on; its "
                         "activation_checkpointing section configures DeepSpeed's checkpointing "
                         "(deepspeed.checkpointing.configure) for the layers your model code wraps with "
                         "deepspeed.checkpointing.checkpoint; wrap every decoder layer, as the estimate counts. A "
                         "Hugging Face model's gradient_checkpointing_enable() recomputes each layer too, through "
                         "torch.utils.checkpoint, which this section's settings (cpu_checkpointing among them) do "
                         "not reach.")
        return Built(template="deepspeed.j2", context={"config": config}, format="json",
                     filename="ds_config.json", notes=notes)
    m = job.model
    experts, moe_notes = deepspeed_experts(job, plan)
    every_layer_moe = m.moe is not None and len(m.moe.moe_layers) == m.num_layers
    flags: list[Flag] = [
        ("--num-layers", m.num_layers), ("--hidden-size", m.hidden_size),
        ("--ffn-hidden-size", m.moe.expert_ffn_hidden_size if every_layer_moe else m.ffn_hidden_size),
        ("--num-attention-heads", m.num_attention_heads), ("--num-key-value-heads", m.num_kv_heads),
    ]
    if m.mla is None and m.head_dim * m.num_attention_heads != m.hidden_size:
        flags.append(("--kv-channels", m.head_dim))  # else hidden / heads: a narrower or wider attention
    flags += [("--seq-length", job.seq_length),
              ("--max-position-embeddings", max(job.seq_length, m.max_position_embeddings or 0))]
    if m.is_swiglu:
        flags.append(("--swiglu", None))
    if not m.tie_word_embeddings:  # Megatron-DeepSpeed ties them unless told: a vocab x hidden matrix fewer
        flags.append(("--untie-embeddings-and-output-weights", None))
    if not m.learned_position_embeddings:
        flags.append(("--use-rotary-position-embeddings", None))
    flags += [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    if plan.pp == 1:
        flags.append(("--no-pipeline-parallel", None))
    flags += experts
    flags += [("--micro-batch-size", plan.micro_batch_size), ("--global-batch-size", job.global_batch_size),
              ("--bf16", None), ("--deepspeed", None), ("--deepspeed_config", "ds_config.json"),
              ("--zero-stage", plan.zero_stage)]
    if plan.recompute == "full":
        # DeepSpeed still drives full recompute through the old --checkpoint-activations switch.
        flags.append(("--checkpoint-activations", None))
    elif plan.recompute == "selective":
        flags.append(("--recompute-granularity", "selective"))
    flags += megatron_deepspeed_attention(job, plan)
    return Built(template="megatron_deepspeed.j2",
                 context={"nodes": nodes(job), "config": config, "flags": flags},
                 format="shell", filename="pretrain_megatron_deepspeed.sh",
                 notes=["Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed) is not on PyPI: the flags used here are "
                        "listed with their source in cards/frameworks/deepspeed.yaml (megatron_deepspeed_flags).",
                        "Norm, bias and tokenizer flags differ between Megatron-DeepSpeed forks; add your model's.",
                        *deepspeed_architecture_notes(job), *moe_notes])


def megatron_deepspeed_attention(job: Job, plan: Plan) -> list[Flag]:
    """The attention and dropout the estimate times (memory.attention_switches: the plan's, auto and a dropout left
    out the deepspeed memory convention's), written out: Megatron-DeepSpeed's own defaults are CoreAttention with the
    scores materialised and dropout 0.1 (cards/frameworks/deepspeed.yaml read.absent_by_variant), so the flash switch
    (the adapter knob's key) is written where the estimate runs flash and both dropouts always, 0.0 where it is off."""
    card = framework_card("deepspeed")
    flash, dropout = attention_switches(job, convention(card, plan.zero_stage, job.framework_version)[1], plan)
    table = knob_table(card, adapter_section(card).default_version, "megatron-deepspeed")
    flags: list[Flag] = [(table["attention_backend"].key, None)] if flash else []
    probability = DROPOUT_ON if dropout else 0.0
    return flags + [(key, probability) for key in table["dropout"].key.split()]


def deepspeed_experts(job: Job, plan: Plan) -> tuple[list[Flag], list[str]]:
    """A MoE model's flags for Megatron-DeepSpeed, which builds each layer with more than one expert as
    deepspeed.moe.layer.MoE(ep_size=--moe-expert-parallel-size) (megatron/model/transformer.py): without them it
    trains a dense model. --expert-interval defaults to 2, so it is written as 1 with one expert count per layer where
    not every layer is MoE (1 = a dense MLP); ZeRO's optimizers need the MoE parameters in a group of their own."""
    m = job.model
    if m.moe is None:
        return [], []
    moe = m.moe
    counts = moe.num_experts if len(moe.moe_layers) == m.num_layers else [
        moe.num_experts if i in set(moe.moe_layers) else 1 for i in range(m.num_layers)]
    flags: list[Flag] = [("--num-experts", counts), ("--topk", moe.top_k), ("--expert-interval", 1),
                         ("--moe-expert-parallel-size", plan.ep), ("--create-moe-param-group", None)]
    missing = []
    if moe.num_shared_experts:
        missing.append(f"{moe.num_shared_experts} shared expert(s)")
    if len(moe.moe_layers) < m.num_layers and m.ffn_hidden_size != moe.expert_ffn_hidden_size:
        missing.append(f"dense layers {m.ffn_hidden_size} wide beside experts {moe.expert_ffn_hidden_size} wide "
                       "(one --ffn-hidden-size builds both)")
    if moe.num_groups > 1 or moe.score_correction_bias or moe.router_bias:
        missing.append("its router (grouped top-k, routing biases)")
    notes = ["DeepSpeed-MoE's gate gives each expert a fixed capacity (top-k x tokens / experts at the default "
             "--moe-train-capacity-factor 1.0) and drops the tokens over it, so each expert computes the mean load "
             "meshplan estimates at moe_routing_imbalance 1.0."]
    if missing:
        notes.append(f"Megatron-DeepSpeed's MoE flags cannot state {m.name}'s " + ", ".join(missing) + ".")
    return flags, notes


def deepspeed_architecture_notes(job: Job) -> list[str]:
    """What the Megatron-DeepSpeed flags here leave out of the model (the card lists no flag for them)."""
    m, facts = job.model, []
    if m.rope is not None:
        if m.rope.theta is not None:
            facts.append(f"rope base {m.rope.theta:g}")
        if m.rope.scaling:
            facts.append(f"{m.rope.scaling} rope scaling (factor {m.rope.factor:g})")
        if m.rope.fraction != 1:
            facts.append(f"rotary on {m.rope.fraction:.0%} of each head")
    if m.norm_eps is not None:
        facts.append(f"norm epsilon {m.norm_eps:g}")
    if m.gated_mlp and not m.is_swiglu:
        facts.append(f"a gated MLP with {m.activation} (not --swiglu's SiLU)")
    if m.qk_norm != "none":
        facts.append("q/k norms")
    return [f"Add {m.name}'s " + ", ".join(facts) + " with your fork's flags; the flags here do not set them."] \
        if facts else []
