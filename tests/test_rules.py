"""check_config: card and registry agree, every rule fails and passes where it should, fixes are computed."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.render import RefusedLayout
from meshplan.arithmetic.schedule import uneven_split
from meshplan.check.config import check_config
from meshplan.core.units import gib
from meshplan.knowledge.cards import CardError, framework_card, validate_card
from meshplan.request.resolve import resolve
from meshplan.rules.engine import (
    RULE_MODULES,
    Context,
    EstimateBlocked,
    RulesCard,
    backend_of,
    blocking_rules,
    finding,
    load_rules,
    memory_rules,
    require_estimable,
    rule,
    rule_specs,
    rules_card,
)
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Plan
from meshplan.schema.reports import MemoryReport, StageMemory
from meshplan.schema.request import Request

GIB = 1 << 30


def make(plan: dict | None = None, arch: dict | None = None, **request):
    """A (job, plan) from request fields, with optional Plan fields and Architecture fields overridden."""
    job, base = resolve(Request(**request))
    if plan:
        base = base.model_copy(update=plan)
    if arch:
        job = job.model_copy(update={"model": job.model.model_copy(update=arch)})
    return job, base


def ids(job, plan, include_memory=False) -> set[str]:
    return {f.id for f in check_config(job, plan, include_memory=include_memory).findings}


def report(peak: float, capacity: float) -> MemoryReport:
    """A one-stage memory report with the given peak and capacity in GiB (memory rules read only these)."""
    p, c = int(peak * GIB), int(capacity * GIB)
    stage = StageMemory(stage=0, layers=1, weights_bytes=p, gradients_bytes=0, optimizer_bytes=0,
                        activations_bytes=0, other_bytes=0, total_bytes=p)
    return MemoryReport(model="m", framework="megatron-core", plan=Plan(), stages=[stage], peak_bytes=p, peak_stage=0,
                        capacity_bytes=c, fits=p <= c, headroom_bytes=c - p, assumptions=[])


L8B = {"model": "llama-3.1-8b"}          # 32 heads, 8 KV heads, 32 layers
L70B = {"model": "llama-3.1-70b"}        # 64 heads, 8 KV heads, 80 layers
MIX = {"model": "mixtral-8x7b"}          # 8 experts, 32 layers
QWEN_MOE = {"model": "qwen3-30b-a3b"}    # 128 experts, 48 layers, 4 KV heads
GPT_OSS = {"model": "gpt-oss-20b"}       # 32 experts with biased linears
KIMI = {"model": "kimi-k2"}              # 61 layers
DSV3_VERL = {"model": "deepseek-v3", "gpu": "h20", "framework": "verl", "num_gpus": 96, "tp": 8, "pp": 12, "ep": 8,
             "etp": 1, "last_stage_layers": 6, "recompute": "full", "seq_length": 3072, "global_batch_size": 96,
             "param_offload": True, "optimizer_offload_fraction": 1.0}
DSV32 = {"model": "deepseek-v3.2", "num_gpus": 256, "pp": 8, "ep": 32, "first_stage_layers": 7,
         "last_stage_layers": 6, "seq_length": 8192}
RL = {"framework": "verl", "num_gpus": 16, "ep": 8, "job": "rl", "samples_per_prompt": 8}  # GRPO on 16 H100

# For every rule: (failing case, passing case). A case is make() keyword arguments; "report" gives the
# memory rules a synthetic estimate (peak, capacity in GiB) so their thresholds are tested exactly.
CASES: dict[str, tuple[dict, dict]] = {
    # precision knobs (meshplan/rules/precision.py PR*)
    "PR001": ({**L8B, "num_gpus": 8, "zero_stage": 0, "optimizer_state_dtype": "bf16"},
              {**L8B, "num_gpus": 8, "zero_stage": 1, "optimizer_state_dtype": "bf16"}),
    "PR002": ({**L8B, "num_gpus": 8, "framework": "torchtitan", "precision": "fp8", "fp8_recipe": "rowwise",
               "fp8_param_gather": True},
              {**L8B, "num_gpus": 8, "framework": "torchtitan", "precision": "fp8", "fp8_recipe": "tensorwise",
               "fp8_param_gather": True}),
    "PR003": ({**L8B, "num_gpus": 8, "gpu": "h100", "precision": "fp8", "fp8_recipe": "mxfp8"},
              {**L8B, "num_gpus": 8, "gpu": "b200", "precision": "fp8", "fp8_recipe": "mxfp8"}),
    "PR004": ({**L8B, "num_gpus": 8, "framework": "torchtitan", "grad_reduce_in_fp32": False},
              {**L8B, "num_gpus": 8, "framework": "megatron-core", "grad_reduce_in_fp32": False}),
    "PR005": ({**L8B, "num_gpus": 8, "zero_stage": 3, "optimizer": "muon"},
              {**L8B, "num_gpus": 8, "zero_stage": 1, "optimizer": "muon"}),
    "PR006": ({**L8B, "num_gpus": 8, "framework": "torchtitan", "fp8_activation_input_store": True},
              {**L8B, "num_gpus": 8, "framework": "megatron-bridge", "fp8_activation_input_store": True}),
    "PR007": ({**L8B, "num_gpus": 8, "framework": "megatron-bridge", "gpu": "h100", "precision": "fp8",
               "fp8_recipe": "blockwise", "fp8_dot_product_attention": True},
              {**L8B, "num_gpus": 8, "framework": "megatron-bridge", "gpu": "h100", "precision": "fp8",
               "fp8_recipe": "delayed", "fp8_dot_product_attention": True}),
    "PR009": ({**L8B, "num_gpus": 8, "cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"},
              {**L8B, "num_gpus": 8, "framework": "megatron-bridge", "cross_entropy_loss_fusion": True,
               "cross_entropy_fusion_impl": "te"}),
    "WS001": ({**L8B, "num_gpus": 10, "tp": 4}, {**L8B, "num_gpus": 12, "tp": 4}),
    "WS002": ({**MIX, "num_gpus": 12, "tp": 2, "ep": 8}, {**MIX, "num_gpus": 16, "tp": 2, "ep": 8}),
    "WS003": ({**L8B, "num_gpus": 16, "tp": 2, "dp": 4}, {**L8B, "num_gpus": 16, "tp": 2, "dp": 8}),
    "WS004": ({**L8B, "framework": "torchtitan", "num_gpus": 12, "tp": 8},
              {**L8B, "framework": "torchtitan", "num_gpus": 16, "tp": 8}),
    "WS005": ({**MIX, "framework": "torchtitan", "num_gpus": 12, "tp": 2, "ep": 8},
              {**MIX, "framework": "torchtitan", "num_gpus": 16, "tp": 2, "ep": 8}),
    "WS006": ({**MIX, "framework": "kempnerforge", "num_gpus": 12, "tp": 4, "ep": 8},
              {**MIX, "framework": "kempnerforge", "num_gpus": 32, "tp": 4, "ep": 2}),
    # hybrid sharding (dp_replicate): replicas split dp evenly, and need sharded states
    "DP001": ({**L8B, "num_gpus": 16, "tp": 2, "dp_replicate": 3}, {**L8B, "num_gpus": 16, "tp": 2, "dp_replicate": 4}),
    "DP002": ({**L8B, "num_gpus": 16, "zero_stage": 0, "dp_replicate": 2},
              {**L8B, "num_gpus": 16, "zero_stage": 1, "dp_replicate": 2}),
    "TP001": ({**L8B, "num_gpus": 3, "tp": 3}, {**L8B, "num_gpus": 4, "tp": 4}),
    # a hybrid's Mamba-2 mixer (Nemotron-H-8B: 128 heads, 8 groups; 32 attention heads, 8 KV heads)
    "HY001": ({"model": "nemotron-h-8b", "num_gpus": 8, "framework": "torchtitan"},
              {"model": "nemotron-h-8b", "num_gpus": 8, "framework": "megatron-bridge"}),
    "HY002": ({"model": "nemotron-h-8b", "num_gpus": 8, "framework": "verl"},
              {"model": "nemotron-h-8b", "num_gpus": 8, "framework": "megatron-core"}),
    "HY003": ({"model": "qwen3-next-80b-a3b", "num_gpus": 64, "framework": "torchtitan"},
              {"model": "qwen3-next-80b-a3b", "num_gpus": 64, "framework": "megatron-bridge"}),
    "HY004": ({"model": "qwen3-next-80b-a3b", "num_gpus": 64, "framework": "verl"},
              {"model": "qwen3-next-80b-a3b", "num_gpus": 64, "framework": "megatron-core"}),
    "TP007": ({"model": "qwen3-next-80b-a3b", "num_gpus": 32, "tp": 2, "cp": 16},
              {"model": "qwen3-next-80b-a3b", "num_gpus": 16, "tp": 2, "cp": 8}),
    "LORA006": ({"model": "qwen3-next-80b-a3b", "num_gpus": 64, "pp": 4, "ep": 8, "framework": "megatron-bridge",
                 "lora_rank": 16},
                {"model": "qwen3-next-80b-a3b", "num_gpus": 64, "pp": 4, "ep": 8, "framework": "megatron-bridge"}),
    "PP017": ({"model": "qwen3-next-80b-a3b", "num_gpus": 64, "pp": 4, "ep": 8, "framework": "megatron-bridge",
               "first_stage_layers": 23, "last_stage_layers": 25},
              {"model": "qwen3-next-80b-a3b", "num_gpus": 64, "pp": 4, "ep": 8, "framework": "megatron-bridge",
               "first_stage_layers": 22, "last_stage_layers": 26}),
    # DeepSeek Sparse Attention (DeepSeek-V3.2): Megatron-Core builds it, CP by all-gather only
    "DSA001": ({**DSV32, "framework": "torchtitan"}, {**DSV32, "framework": "megatron-core"}),
    "DSA002": ({**DSV32, "framework": "nemo-automodel"}, {**DSV32, "framework": "megatron-core"}),
    "DSA003": ({**DSV32, "cp": 2, "cp_comm_type": "p2p"}, {**DSV32, "cp": 2}),
    # a sliding window (Mistral-7B-v0.1, 4096 on every layer): TE's CP takes it over a2a or all-gather only, the
    # default where cp_comm_type is left out
    "CP006": ({"model": "mistral-7b", "num_gpus": 8, "cp": 2, "seq_length": 16384, "cp_comm_type": "p2p"},
              {"model": "mistral-7b", "num_gpus": 8, "cp": 2, "seq_length": 16384}),
    # Megatron-Bridge builds Gemma 2's attention itself (FlexAttention), which raises on context_parallel_size != 1;
    # its fix, cp=1 with the ranks to dp, passes; Megatron-Core runs the window through TE, which takes CP
    # settings with no effect on the plan (warnings, the rules card's no_effect: tests/test_unread_knobs.py)
    "CP008": ({**L8B, "num_gpus": 8, "cp_comm_type": "a2a"}, {**L8B, "num_gpus": 8, "cp": 2, "cp_comm_type": "a2a"}),
    "EP010": ({**L8B, "num_gpus": 8, "tp": 2, "etp": 2}, {**L8B, "num_gpus": 8, "tp": 2}),
    # Moonlight's shared experts overlapped beside the alltoall dispatcher (its Bridge 8-H100 recipe), and refused
    # beside a recomputed shared_experts module (Megatron-Core's ValueError)
    "EP012": ({"model": "moonlight-16b-a3b", "num_gpus": 8, "tp": 2, "ep": 8, "etp": 1, "sequence_parallel": True,
               "framework": "megatron-bridge", "moe_shared_expert_overlap": True, "recompute": "selective",
               "recompute_modules": ["shared_experts"]},
              {"model": "moonlight-16b-a3b", "num_gpus": 8, "tp": 2, "ep": 8, "etp": 1, "sequence_parallel": True,
               "framework": "megatron-bridge", "moe_shared_expert_overlap": True}),
    # DeepEP across GB200's 72-GPU NVLink domain (only HybridEP spans it: Megatron-Core's TransformerConfig), and
    # HybridEP there
    "EP013": ({"model": "qwen3-30b-a3b", "gpu": "gb200", "num_gpus": 16, "ep": 16, "moe_token_dispatcher": "flex",
               "moe_flex_backend": "deepep"},
              {"model": "qwen3-30b-a3b", "gpu": "gb200", "num_gpus": 16, "ep": 16, "moe_token_dispatcher": "flex",
               "moe_flex_backend": "hybridep"}),
    # the overlap on a model without shared experts: Megatron-Core starts the run and ignores it (warning)
    "EP014": ({**L8B, "num_gpus": 8, "moe_shared_expert_overlap": True},
              {"model": "moonlight-16b-a3b", "num_gpus": 8, "tp": 2, "ep": 8, "etp": 1, "sequence_parallel": True,
               "framework": "megatron-bridge", "moe_shared_expert_overlap": True}),
    "PP019": ({**L8B, "num_gpus": 8, "pipeline_schedule": "1f1b"}, {**L8B, "num_gpus": 8, "pp": 2,
                                                                    "pipeline_schedule": "1f1b"}),
    "RC009": ({**L8B, "num_gpus": 8, "pp": 2, "recompute": "full", "recompute_layers": 17},
              {**L8B, "num_gpus": 8, "pp": 2, "recompute": "full", "recompute_layers": 16}),
    "CP007": ({"model": "gemma-2-27b", "framework": "megatron-bridge", "num_gpus": 16, "tp": 8, "cp": 2},
              {"model": "gemma-2-27b", "framework": "megatron-bridge", "num_gpus": 16, "tp": 8, "dp": 2}),
    # torchtitan ships Llama 4 (models/llama4) in 0.1.x and 0.2.x only: 0.3.0 has no model code for it, 0.2.2 does
    "TT003": ({"model": "llama-4-scout", "framework": "torchtitan", "num_gpus": 16},
              {"model": "llama-4-scout", "framework": "torchtitan", "num_gpus": 16, "framework_version": "0.2.2"}),
    # torchtitan 0.1.0's Llama 4 (experiments/llama4, use_flex_attn) refuses selective AC; full passes, as does 0.2.2
    "RC008": ({"model": "llama-4-scout", "framework": "torchtitan", "num_gpus": 16, "framework_version": "0.1.0",
               "recompute": "selective"},
              {"model": "llama-4-scout", "framework": "torchtitan", "num_gpus": 16, "framework_version": "0.1.0",
               "recompute": "full"}),
    # torchtitan 0.2.x's FSDP2 shards over dp_shard x cp at cp > 1: its ZeRO-0 file there runs ZeRO-3 over CP (HSDP with
    # dp replicas), which zero_stage 3 at dp_replicate = dp states and meshplan estimates as it runs
    "TT004": ({**L8B, "framework": "torchtitan", "num_gpus": 16, "cp": 2, "seq_length": 8192, "zero_stage": 0,
               "framework_version": "0.2.2"},
              {**L8B, "framework": "torchtitan", "num_gpus": 16, "cp": 2, "seq_length": 8192, "zero_stage": 3,
               "dp_replicate": 8, "framework_version": "0.2.2"}),
    # Llama 4's chunked layers (8,192 tokens) on verl's FSDP engine: transformers' flash_attention_2 refuses them
    # past the chunk; at the chunk chunked and full causal attention are the same
    "CH001": ({"model": "llama-4-scout", "framework": "verl", "zero_stage": 3, "num_gpus": 16, "seq_length": 16384},
              {"model": "llama-4-scout", "framework": "verl", "zero_stage": 3, "num_gpus": 16, "seq_length": 8192}),
    "PP016": ({"model": "nemotron-h-8b", "num_gpus": 8, "pp": 2, "vpp": 2},
              {"model": "nemotron-h-8b", "num_gpus": 8, "pp": 4}),
    "TP006": ({"model": "nemotron-h-8b", "num_gpus": 16, "tp": 16},
              {"model": "nemotron-h-8b", "num_gpus": 16, "tp": 8}),
    "CP005": ({"model": "nemotron-h-8b", "num_gpus": 24, "tp": 8, "cp": 3},
              {"model": "nemotron-h-8b", "num_gpus": 16, "tp": 8, "cp": 2}),
    "TP002": ({**L8B, "num_gpus": 6, "tp": 6, "arch": {"num_attention_heads": 36, "num_kv_heads": 9}},
              {**L70B, "num_gpus": 16, "tp": 16}),
    "TP003": ({**L70B, "framework": "kempnerforge", "num_gpus": 16, "tp": 16},
              {**L70B, "framework": "kempnerforge", "num_gpus": 8, "tp": 8}),
    "TP004": ({**L70B, "num_gpus": 16, "tp": 16}, {**L70B, "num_gpus": 16, "tp": 8}),
    "FS001": ({**L8B, "framework": "verl", "zero_stage": 3, "num_gpus": 8, "tp": 2},
              {**L8B, "framework": "verl", "zero_stage": 3, "num_gpus": 8}),
    "SP001": ({**L8B, "num_gpus": 8, "sequence_parallel": True}, {**L8B, "num_gpus": 8}),
    "SP002": ({**L8B, "num_gpus": 8, "tp": 2, "sequence_parallel": False}, {**L8B, "num_gpus": 8, "tp": 2}),
    # Megatron-Core's sequence-parallel scatter of each CP rank's tokens over tp (it asserts at the first forward)
    "SP004": ({**L8B, "num_gpus": 8, "tp": 2, "seq_length": 4097}, {**L8B, "num_gpus": 8, "tp": 2, "seq_length": 4098}),
    "SP003": ({**L8B, "framework": "skyrl", "num_gpus": 8, "tp": 2, "sequence_parallel": False},
              {**L8B, "framework": "skyrl", "num_gpus": 8, "tp": 2}),
    "CP001": ({**L8B, "num_gpus": 8, "cp": 4, "seq_length": 8196}, {**L8B, "num_gpus": 8, "cp": 4, "seq_length": 8192}),
    # the step estimate exposes cp=8's ring at 512 tokens a rank; it hides cp=2's at 2,048 (recommend's first pick)
    "CP002": ({**L8B, "num_gpus": 8, "cp": 8, "with_memory": True},
              {**L8B, "num_gpus": 8, "cp": 2, "with_memory": True}),
    "CP003": ({**L8B, "num_gpus": 16, "tp": 4, "cp": 4, "cp_comm_type": "a2a", "seq_length": 32768},
              {**L8B, "num_gpus": 16, "tp": 4, "cp": 2, "cp_comm_type": "a2a", "seq_length": 32768}),
    "CP004": ({**L8B, "framework": "nanotron", "num_gpus": 16, "cp": 16, "seq_length": 8},
              {**L8B, "framework": "nanotron", "num_gpus": 16, "cp": 16, "seq_length": 16}),
    "TT002": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "tp": 8, "seq_length": 4100},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "tp": 8, "seq_length": 4096}),
    "UL001": ({**L8B, "framework": "verl", "zero_stage": 3, "num_gpus": 6, "cp": 3},
              {**L8B, "framework": "verl", "zero_stage": 3, "num_gpus": 8, "cp": 4}),
    "EP001": ({**L8B, "num_gpus": 8, "ep": 2}, {**MIX, "num_gpus": 8, "ep": 2}),
    "EP002": ({**QWEN_MOE, "num_gpus": 12, "ep": 12}, {**QWEN_MOE, "num_gpus": 16, "ep": 16}),
    "EP003": ({**MIX, "num_gpus": 8, "tp": 2, "ep": 4, "sequence_parallel": False},
              {**MIX, "num_gpus": 8, "tp": 2, "ep": 4}),
    "EP004": ({**GPT_OSS, "num_gpus": 8, "tp": 2, "ep": 4}, {**GPT_OSS, "num_gpus": 8, "tp": 2, "ep": 4, "etp": 1}),
    "EP005": ({**MIX, "num_gpus": 8, "arch_moe": {"top_k": 9}}, {**MIX, "num_gpus": 8}),
    "EP006": ({**L8B, "num_gpus": 8, "moe_token_dispatcher": "flex"}, {**MIX, "num_gpus": 16, "ep": 8,
                                                                        "moe_token_dispatcher": "flex"}),
    "EP007": ({**MIX, "framework": "deepspeed", "num_gpus": 16, "ep": 8, "moe_token_dispatcher": "flex"},
              {**MIX, "framework": "megatron-bridge", "num_gpus": 16, "ep": 8, "moe_token_dispatcher": "flex"}),
    "EP008": ({**MIX, "num_gpus": 8, "moe_token_dispatcher": "flex"},
              {**MIX, "num_gpus": 8, "ep": 8, "moe_token_dispatcher": "flex"}),
    "EP009": ({**MIX, "num_gpus": 16, "pp": 2, "ep": 8, "moe_a2a_overlap": True},
              {**MIX, "num_gpus": 16, "pp": 2, "vpp": 2, "ep": 8, "moe_a2a_overlap": True}),
    "CG001": ({**QWEN_MOE, "num_gpus": 16, "ep": 8, "cuda_graph_impl": "transformer_engine",
               "cuda_graph_modules": ["moe_preprocess"]},
              {**QWEN_MOE, "num_gpus": 16, "ep": 8, "cuda_graph_impl": "transformer_engine",
               "cuda_graph_modules": ["moe_router", "moe_preprocess"]}),
    "CG003": ({"model": "deepseek-v2-lite", "num_gpus": 32, "pp": 2, "vpp": 3, "ep": 8, "moe_a2a_overlap": True,
               "cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn", "mlp"]},
              {"model": "deepseek-v2-lite", "num_gpus": 32, "pp": 2, "vpp": 3, "ep": 8, "moe_a2a_overlap": True,
               "cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn", "moe_router",
                                                                               "moe_preprocess"]}),
    "CG002": ({**QWEN_MOE, "num_gpus": 16, "ep": 8, "cuda_graph_impl": "full_iteration"},
              {**QWEN_MOE, "num_gpus": 16, "ep": 8, "cuda_graph_impl": "transformer_engine",
               "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}),
    "TP005": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "tp": 2, "tp_comm_overlap": True},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "tp": 2, "tp_comm_overlap": True,
               "torch_compile": True}),
    "AT002": ({"model": "deepseek-v3", "num_gpus": 256, "ep": 64, "framework": "megatron-bridge",
               "attention_backend": "flash"},
              {"model": "deepseek-v3", "num_gpus": 256, "ep": 64, "framework": "megatron-bridge",
               "attention_backend": "fused"}),
    "AT001": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "attention_backend": "unfused"},
              {**L8B, "framework": "kempnerforge", "num_gpus": 8, "attention_backend": "unfused"}),
    "AT003": ({**L8B, "framework": "kempnerforge", "gpu": "mi300x", "num_gpus": 8, "attention_backend": "fused"},
              {**L8B, "framework": "kempnerforge", "gpu": "mi300x", "num_gpus": 8, "attention_backend": "flash"}),
    "CO001": ({**L8B, "num_gpus": 8, "torch_compile": True},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "torch_compile": True}),
    "TT001": ({**MIX, "framework": "torchtitan", "num_gpus": 8, "tp": 2, "ep": 4, "etp": 2},
              {**MIX, "framework": "torchtitan", "num_gpus": 8, "tp": 2, "ep": 4}),
    "DS001": ({**MIX, "framework": "deepspeed", "num_gpus": 12, "tp": 2, "ep": 4, "etp": 2},
              {**MIX, "framework": "deepspeed", "num_gpus": 16, "tp": 2, "ep": 4, "etp": 2}),
    "DS002": ({**L8B, "framework": "deepspeed", "num_gpus": 8, "pp": 2, "zero_stage": 2},
              {**L8B, "framework": "deepspeed", "num_gpus": 8, "pp": 2, "zero_stage": 1}),
    "DS004": ({**MIX, "framework": "deepspeed", "num_gpus": 16, "ep": 8, "zero_stage": 3},
              {**MIX, "framework": "deepspeed", "num_gpus": 16, "zero_stage": 3}),
    "DS003": ({**MIX, "framework": "deepspeed", "num_gpus": 16, "tp": 4, "ep": 2, "etp": 2},
              {**MIX, "framework": "deepspeed", "num_gpus": 16, "tp": 4, "ep": 2, "etp": 4}),
    "PP001": ({**KIMI, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 32},
              {**KIMI, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 32, "first_stage_layers": 3, "last_stage_layers": 2}),
    "PP002": ({**L8B, "num_gpus": 8, "pp": 4, "vpp": 3, "global_batch_size": 64},
              {**L8B, "num_gpus": 8, "pp": 4, "vpp": 4, "global_batch_size": 64}),
    "PP003": ({**L8B, "num_gpus": 8, "vpp": 2}, {**L8B, "num_gpus": 8, "pp": 2, "vpp": 2, "global_batch_size": 64}),
    "PP004": ({**KIMI, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 32, "first_stage_layers": 4, "last_stage_layers": 2},
              {**KIMI, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 32, "first_stage_layers": 4, "last_stage_layers": 1}),
    "PP005": ({**L8B, "num_gpus": 8, "pp": 4, "vpp": 2, "global_batch_size": 12},
              {**L8B, "num_gpus": 8, "pp": 4, "vpp": 2, "global_batch_size": 16}),
    "PP006": ({**L8B, "num_gpus": 8, "pp": 4, "global_batch_size": 4},
              {**L8B, "num_gpus": 8, "pp": 4, "global_batch_size": 8}),
    "PP010": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "global_batch_size": 4},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "global_batch_size": 8}),
    "PP011": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "vpp": 2, "global_batch_size": 18},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "vpp": 2, "global_batch_size": 20}),
    "PP012": ({**L8B, "num_gpus": 8, "pp": 4, "global_batch_size": 64, "pipeline_schedule": "dualpipev"},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "global_batch_size": 64,
               "pipeline_schedule": "dualpipev"}),
    "PP013": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "vpp": 4, "global_batch_size": 64,
               "pipeline_schedule": "dualpipev"},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "vpp": 2, "global_batch_size": 64,
               "pipeline_schedule": "dualpipev"}),
    "PP014": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "global_batch_size": 4,
               "pipeline_schedule": "dualpipev"},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "pp": 4, "global_batch_size": 4,
               "pipeline_schedule": "zero_bubble"}),
    "PP015": ({**QWEN_MOE, "num_gpus": 64, "pp": 2, "vpp": 2, "ep": 8, "global_batch_size": 64, "zero_stage": 3,
               "pipeline_schedule": "combined_1f1b"},
              {**QWEN_MOE, "num_gpus": 64, "pp": 2, "vpp": 2, "ep": 8, "global_batch_size": 64,
               "pipeline_schedule": "combined_1f1b"}),
    "PP007": ({**L8B, "num_gpus": 32, "pp": 16, "vpp": 4, "global_batch_size": 32},
              {**L8B, "num_gpus": 32, "pp": 16, "vpp": 2, "global_batch_size": 32}),
    "PP008": ({**L8B, "num_gpus": 16, "pp": 16}, {**L8B, "num_gpus": 8, "pp": 8}),
    "PP009": ({**KIMI, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 32, "pipeline_layout": "Et*4|(t*4|)*14L"},
              {**KIMI, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 32, "pipeline_layout": "Et*4|(t*4|)*14tL"}),
    "BS001": ({**L8B, "num_gpus": 8, "global_batch_size": 12}, {**L8B, "num_gpus": 8, "global_batch_size": 16}),
    # verl's PPO trainer (an RL job; a training job is its SFT trainer's, VL003): 6 over dp 4 x micro-batch 1
    "VL004": ({**L8B, "framework": "verl", "num_gpus": 8, "job": "rl", "prompts_per_step": 16,
               "samples_per_prompt": 1, "prompts_per_mini_batch": 4},
              {**L8B, "framework": "verl", "num_gpus": 8, "job": "rl", "prompts_per_step": 16,
               "samples_per_prompt": 1, "prompts_per_mini_batch": 8}),
    "VL001": ({**L8B, "framework": "verl", "num_gpus": 8, "tp": 2, "global_batch_size": 6, "job": "rl",
               "prompts_per_step": 6, "samples_per_prompt": 1},
              {**L8B, "framework": "verl", "num_gpus": 8, "tp": 2, "global_batch_size": 8, "job": "rl",
               "prompts_per_step": 8, "samples_per_prompt": 1}),
    # verl's SFT trainer (a training job on the FSDP engine): 24 over dp 4 is 6 a rank, not whole micro-batches of 4
    "VL003": ({**L8B, "framework": "verl", "num_gpus": 8, "zero_stage": 3, "cp": 2, "micro_batch_size": 4,
               "global_batch_size": 24},
              {**L8B, "framework": "verl", "num_gpus": 8, "zero_stage": 3, "cp": 2, "micro_batch_size": 4,
               "global_batch_size": 32}),
    "SK001": ({**L8B, "framework": "skyrl", "num_gpus": 8, "global_batch_size": 4},
              {**L8B, "framework": "skyrl", "num_gpus": 8, "global_batch_size": 10}),
    "KF001": ({**MIX, "framework": "kempnerforge", "num_gpus": 8, "pp": 2},
              {**MIX, "framework": "kempnerforge", "num_gpus": 8, "tp": 2}),
    "KF002": ({"model": "gemma-2-27b", "framework": "kempnerforge", "num_gpus": 8, "pp": 2},
              {"model": "gemma-2-27b", "framework": "kempnerforge", "num_gpus": 8, "tp": 2}),
    "KF003": ({**L8B, "framework": "kempnerforge", "num_gpus": 8, "tp": 2, "precision": "fp8"},
              {**L8B, "framework": "kempnerforge", "num_gpus": 8, "precision": "fp8"}),
    "KF004": ({**MIX, "framework": "kempnerforge", "num_gpus": 16, "tp": 2, "ep": 2, "etp": 2},
              {**MIX, "framework": "kempnerforge", "num_gpus": 16, "tp": 2, "ep": 2}),
    # NeMo AutoModel (nemo-automodel 0.7.0 mesh_utils.py, train_ft.py, experts.py)
    "AM001": ({**L8B, "framework": "nemo-automodel", "num_gpus": 12, "tp": 8},
              {**L8B, "framework": "nemo-automodel", "num_gpus": 16, "tp": 8}),
    "AM002": ({**MIX, "framework": "nemo-automodel", "num_gpus": 12, "tp": 2, "ep": 8},
              {**MIX, "framework": "nemo-automodel", "num_gpus": 16, "tp": 2, "ep": 8}),
    "AM003": ({**L8B, "framework": "nemo-automodel", "num_gpus": 8, "pp": 4, "vpp": 2, "global_batch_size": 6},
              {**L8B, "framework": "nemo-automodel", "num_gpus": 8, "pp": 4, "vpp": 2, "global_batch_size": 8}),
    "AM004": ({**L8B, "framework": "nemo-automodel", "num_gpus": 8, "tp": 2, "zero_stage": 0},
              {**L8B, "framework": "nemo-automodel", "num_gpus": 8, "zero_stage": 0}),
    "AM005": ({**MIX, "framework": "nemo-automodel", "num_gpus": 8, "ep": 8},
              {**MIX, "framework": "nemo-automodel", "num_gpus": 8, "ep": 8, "moe_token_dispatcher": "flex"}),
    "NT001": ({**L8B, "framework": "nanotron", "num_gpus": 8, "cp": 2},
              {**L8B, "framework": "nanotron", "num_gpus": 8, "tp": 2}),
    "AD001": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "zero_stage": 1},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "zero_stage": 3}),
    "SK002": ({**L8B, "framework": "skyrl", "num_gpus": 8, "cp": 2, "seq_length": 8192},
              {**L8B, "framework": "skyrl", "num_gpus": 8, "seq_length": 8192}),
    "VL002": ({**L8B, "framework": "verl", "zero_stage": 3, "num_gpus": 8, "cp": 2},
              {**L8B, "framework": "verl", "zero_stage": 3, "num_gpus": 8}),
    "FP001": ({**L8B, "gpu": "a100-80gb", "num_gpus": 8, "precision": "fp8"},
              {**L8B, "gpu": "h100", "num_gpus": 8, "precision": "fp8"}),
    "RC001": ({**L8B, "num_gpus": 8, "recompute": "selective", "recompute_layers": 2},
              {**L8B, "num_gpus": 8, "recompute": "full", "recompute_layers": 2}),
    "RC002": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "recompute": "full", "selective_ac_option": "2"},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "recompute": "selective", "selective_ac_option": "2"}),
    "RC003": ({**L8B, "num_gpus": 8, "recompute": "full", "recompute_method": "block"},
              {**L8B, "num_gpus": 8, "recompute": "full", "recompute_method": "block", "recompute_layers": 2}),
    "RC004": ({**L8B, "num_gpus": 8, "recompute": "selective", "recompute_modules": ["core_attn", "mla_up_proj"]},
              {**L8B, "num_gpus": 8, "recompute": "selective", "recompute_modules": ["core_attn", "mlp"]}),
    "RC005": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "recompute": "full", "recompute_layers": 2},
              {**L8B, "num_gpus": 8, "recompute": "full", "recompute_layers": 2}),
    # SkyRL's main_sft at ZeRO-3 (the FSDP strategy) always checkpoints every layer; its megatron strategy turns it off
    "RC006": ({**L8B, "framework": "skyrl", "num_gpus": 8, "zero_stage": 3, "recompute": "none"},
              {**L8B, "framework": "skyrl", "num_gpus": 8, "zero_stage": 1, "tp": 2, "recompute": "none"}),
    # a Gated DeltaNet hybrid's recompute_num_layers count decoder layers: two of meshplan's pattern layers each
    "RC007": ({"model": "qwen3-next-80b-a3b", "num_gpus": 64, "pp": 4, "ep": 8, "framework": "megatron-core",
               "recompute": "full", "recompute_method": "block", "recompute_layers": 3},
              {"model": "qwen3-next-80b-a3b", "num_gpus": 64, "pp": 4, "ep": 8, "framework": "megatron-core",
               "recompute": "full", "recompute_method": "block", "recompute_layers": 2}),
    "SQ001": ({"model": "gpt3-175b", "num_gpus": 8, "tp": 8, "seq_length": 4096},
              {"model": "gpt3-175b", "num_gpus": 8, "tp": 8, "seq_length": 2048}),
    "SQ002": ({"model": "qwen3-8b", "num_gpus": 8, "seq_length": 65536}, {"model": "qwen3-8b", "num_gpus": 8}),
    "MEM001": ({**L8B, "num_gpus": 8, "report": (90.0, 80.0)}, {**L8B, "num_gpus": 8, "report": (60.0, 80.0)}),
    "MEM002": ({**L8B, "num_gpus": 8, "report": (73.0, 80.0)}, {**L8B, "num_gpus": 8, "report": (71.9, 80.0)}),
    # DeepSeek-V3 on 96 H20 as verl ran it (docs/perf/dpsk.md): ~1.6 TiB of host memory per node with the optimizer
    "MEM003": ({**DSV3_VERL, "cpu_memory_per_node": 1024, "with_memory": True},
               {**DSV3_VERL, "cpu_memory_per_node": 2048, "with_memory": True}),
    "OF001": ({**L8B, "framework": "torchtitan", "num_gpus": 8, "optimizer_offload": True},
              {**L8B, "framework": "torchtitan", "num_gpus": 8, "param_offload": True}),
    "OF002": ({**L8B, "framework": "deepspeed", "num_gpus": 8, "zero_stage": 3, "activation_offload": True},
              {**L8B, "framework": "deepspeed", "num_gpus": 8, "zero_stage": 3, "activation_offload": True,
               "recompute": "full"}),
    # Megatron-Core's layer-wise CPU offload: fewer layers than the model's 32, pp 1, no recompute
    "OF003": ({**L8B, "framework": "megatron-core", "num_gpus": 8, "recompute": "none",
               "activation_offload_layers": 32},
              {**L8B, "framework": "megatron-core", "num_gpus": 8, "recompute": "none",
               "activation_offload_layers": 31}),
    # LoRA (meshplan/rules/lora.py): an engine with LoRA, targets the model has
    "LORA001": ({**L8B, "num_gpus": 8, "framework": "megatron-core", "job": "lora"},
                {**L8B, "num_gpus": 8, "framework": "megatron-bridge", "job": "lora"}),
    "LORA002": ({"model": "deepseek-v2-lite", "num_gpus": 8, "ep": 8, "framework": "megatron-bridge",
                 "lora_targets": ["linear_qkv", "linear_proj"]},
                {"model": "deepseek-v2-lite", "num_gpus": 8, "ep": 8, "framework": "megatron-bridge",
                 "lora_targets": ["linear_proj"]}),
    "LORA003": ({"model": "deepseek-v2-lite", "num_gpus": 8, "ep": 8, "framework": "megatron-bridge",
                 "lora_targets": ["linear_proj", "router"]},
                {"model": "deepseek-v2-lite", "num_gpus": 8, "framework": "verl", "zero_stage": 3, "job": "lora",
                 "lora_targets": ["linear_proj", "router"]}),
    "LORA004": ({"model": "qwen3-30b-a3b", "num_gpus": 8, "ep": 8, "framework": "megatron-bridge",
                 "lora_target_parameters": ["down_proj"]},
                {"model": "qwen3-30b-a3b", "num_gpus": 8, "framework": "verl", "zero_stage": 3, "job": "lora",
                 "lora_target_parameters": ["down_proj"]}),
    "LORA005": ({**L8B, "num_gpus": 8, "framework": "verl", "zero_stage": 3, "lora_target_parameters": ["down_proj"]},
                {"model": "qwen3-30b-a3b", "num_gpus": 8, "framework": "verl", "zero_stage": 3,
                 "lora_target_parameters": ["down_proj"]}),
    # RL jobs (meshplan/rules/rollout.py): the rollout engine's layout
    "RL001": ({**QWEN_MOE, **RL, "rollout_tp": 2, "rollout_ep": 4},
              {**QWEN_MOE, **RL, "rollout_tp": 2, "rollout_ep": 2}),
    "RL002": ({**QWEN_MOE, **RL, "rollout_tp": 3}, {**QWEN_MOE, **RL, "rollout_tp": 4}),
    "RL003": ({**QWEN_MOE, **RL, "rollout_gpus": 8}, {**QWEN_MOE, **RL, "rollout_gpus": 16}),
    "RL004": ({**QWEN_MOE, **RL, "rollout_tp": 16, "with_memory": True},  # its fix reads the engine's budget
              {**QWEN_MOE, **RL, "rollout_tp": 8, "with_memory": True}),
    # vLLM refuses expert parallelism on a model without experts (verl used to label it EP2 and rank it)
    "RL007": ({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "job": "rl", "rollout_tp": 2, "rollout_ep": 2},
              {**QWEN_MOE, **RL, "rollout_tp": 2, "rollout_ep": 2}),
    # GRPO over one response per prompt: verl and SkyRL take the group's mean 0 and std 1, no baseline
    "RL008": ({**QWEN_MOE, **RL, "samples_per_prompt": 1}, {**QWEN_MOE, **RL, "samples_per_prompt": 2}),
    "RL005": ({**QWEN_MOE, **RL, "response_length": 4096, "with_memory": True},  # the rollout wakes beside the trainer
              {**QWEN_MOE, **RL, "response_length": 4096, "param_offload": True,
               "optimizer_offload": True, "recompute": "full", "with_memory": True}),
    # a fraction whose budget the engine's weights fill: vLLM cannot start (check said ok, throughput estimated it)
    "RL006": ({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "job": "rl", "rollout_memory_fraction": 0.01,
               "with_memory": True},
              {"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "job": "rl", "rollout_memory_fraction": 0.11,
               "with_memory": True}),
}


def case_job(case: dict):
    """(job, plan) of a CASES entry (its arch / arch_moe overrides applied; `report` is left to the caller)."""
    case = {k: v for k, v in case.items() if k not in ("report", "with_memory")}
    arch = case.pop("arch", None)
    moe = case.pop("arch_moe", None)
    job, plan = make(None, arch, **case)
    if moe:
        model = job.model.model_copy(update={"moe": job.model.moe.model_copy(update=moe)})
        job = job.model_copy(update={"model": model})
    return job, plan


def run_case(rule_id: str, case: dict) -> set[str]:
    peak_capacity = case.get("report")
    job, plan = case_job(case)
    if peak_capacity is not None:
        ctx = Context(job, plan, memory_report=report(*peak_capacity))
        return {rule_id} if load_rules()[rule_id](ctx) is not None else set()
    return ids(job, plan, include_memory=case.get("with_memory", False))


def test_card_and_code_agree_and_every_rule_has_a_lifecycle():
    """Each condition in the rule modules has a card entry with status and since, and each card entry a condition."""
    import importlib

    code_ids = {fn.rule_id for name in RULE_MODULES for fn in vars(importlib.import_module(name)).values()
                if getattr(fn, "rule_id", None) and fn.__module__ == name}
    card = {r["id"]: r for r in load_card_raw()["rules"]}
    assert set(card) == code_ids, f"only in the card: {set(card) - code_ids}; only in code: {code_ids - set(card)}"
    for rule_id, entry in card.items():
        assert entry.get("status") in ("stable", "preview", "deprecated"), rule_id
        assert isinstance(entry.get("since"), str) and entry["since"].count(".") == 2, rule_id
    assert set(load_rules()) == code_ids
    assert memory_rules() == {"MEM001", "MEM002", "MEM003", "RL004", "RL005", "RL006", "CP002"}


def load_card_raw() -> dict:
    """cards/rules.yaml as written (before the schema fills defaults), to see which fields each entry spells."""
    from meshplan.knowledge.cards import read_card

    return read_card("rules")


def test_rules_load_explicitly_not_on_import():
    """Tagging a function registers nothing; only load_rules() indexes the conditions of RULE_MODULES."""

    @rule("ZZ999")
    def stray(ctx):  # defined outside RULE_MODULES: never collected
        return None

    assert stray.rule_id == "ZZ999" and "ZZ999" not in load_rules()


def test_rules_card_requires_a_lifecycle():
    good = rules_card().model_dump()
    for field in ("status", "since"):
        entry = {k: v for k, v in good["rules"][0].items() if k != field}
        with pytest.raises(CardError, match=field):
            validate_card("rules", dict(good, rules=[entry]), RulesCard)
    with pytest.raises(CardError, match="status"):
        validate_card("rules", dict(good, rules=[dict(good["rules"][0], status="beta")]), RulesCard)
    with pytest.raises(CardError, match="since"):
        validate_card("rules", dict(good, rules=[dict(good["rules"][0], since="last spring")]), RulesCard)


def test_a_rule_message_is_a_sentence_the_card_ends():
    """The card's message template ends the sentence (one home for its period): a face that adds more after it (the
    search's refusal, 'No layout can pass rule ...') reads it as it is, so a message without one is refused."""
    good = rules_card().model_dump()
    entry = dict(good["rules"][0], message="tp={tp} does not divide {heads} attention heads")
    with pytest.raises(CardError, match="message"):
        validate_card("rules", dict(good, rules=[entry]), RulesCard)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_a_fired_rules_message_ends_one_sentence(rule_id):
    """The values a condition fills in are clauses: the card's template puts the one final period (no '..')."""
    failing, _ = CASES[rule_id]
    job, plan = case_job(failing)
    if failing.get("report") is not None:
        ctx = Context(job, plan, memory_report=report(*failing["report"]))
        message = finding(rule_specs()[rule_id], load_rules()[rule_id](ctx)).message
    else:
        found = check_config(job, plan, include_memory=failing.get("with_memory", False)).findings
        message = next(f.message for f in found if f.id == rule_id)
    assert message.endswith((".", "?", "!")) and not message.endswith(".."), message


def test_every_rule_has_a_passing_and_a_failing_case():
    assert set(CASES) == set(rule_specs())


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fails_and_passes(rule_id):
    failing, passing = CASES[rule_id]
    assert rule_id in run_case(rule_id, failing), f"{rule_id} should fire on {failing}"
    assert rule_id not in run_case(rule_id, passing), f"{rule_id} should not fire on {passing}"


BLOCKING = sorted(rule_id for rule_id, spec in rule_specs().items() if spec.severity == "error" and not spec.memory)


def test_every_structural_error_blocks_the_estimates():
    """One verdict on every face: the estimators run exactly the structural errors check reports."""
    assert {"WS001", "TP001", "TP005", "EP007", "PP007", "EP002", "BS001", "FP001"} <= set(BLOCKING)
    blocking = {spec.id for framework in FRAMEWORKS for zero in range(4)
                for spec, _ in blocking_rules(framework, backend_of(framework_card(framework), zero))}
    assert blocking == set(BLOCKING)


@pytest.mark.parametrize("rule_id", BLOCKING)
def test_estimators_stop_on_the_rules_own_finding(rule_id):
    """Both estimators refuse a layout that breaks a blocking rule with that rule's id, message and fix (the
    first blocking rule in card order, as check_config lists it); a layout that passes them is estimated."""
    from meshplan.estimate.memory import estimate_memory
    from meshplan.estimate.perf import estimate_throughput

    failing, passing = CASES[rule_id]
    job, plan = case_job(failing)
    blocking = [f for f in check_config(job, plan, include_memory=False).findings if f.id in BLOCKING]
    assert rule_id in {f.id for f in blocking}
    for estimate in (estimate_memory, estimate_throughput):
        with pytest.raises(EstimateBlocked) as info:
            estimate(job, plan)
        assert info.value.finding == blocking[0]
        assert info.value.reason == f"{blocking[0].id}: {blocking[0].message}" and info.value.fix == blocking[0].fix
    job, plan = case_job(passing)
    if not any(f.id in BLOCKING for f in check_config(job, plan, include_memory=False).findings):
        assert estimate_memory(job, plan).stages and estimate_throughput(job, plan).step_time_s > 0


def test_check_names_the_rule_that_blocks_the_memory_estimate():
    job, plan = make(**L8B, num_gpus=8, tp=3)
    report_ = check_config(job, plan)
    assert report_.memory is None and not any(f.id.startswith("MEM") for f in report_.findings)
    assert "Memory not estimated until WS001 (GPU count not divisible by tp*pp*cp) is fixed." in report_.next_steps


def test_rules_card_schema_rejects_bad_entries():
    good = rules_card().model_dump()
    bad = dict(good, rules=[dict(good["rules"][0], frameworks=["megatron-lm"])])
    with pytest.raises(CardError, match="unknown framework"):
        validate_card("rules", bad, RulesCard)
    bad = dict(good, rules=[good["rules"][0], good["rules"][0]])
    with pytest.raises(CardError, match="appears twice"):
        validate_card("rules", bad, RulesCard)
    bad = dict(good, rules=[dict(good["rules"][0], severity="fatal")])
    with pytest.raises(CardError, match="severity"):
        validate_card("rules", bad, RulesCard)


def test_template_needing_an_unknown_value_is_a_card_error():
    spec = rule_specs()["TP001"].model_copy(update={"message": "tp={tp} and {nonexistent}"})
    with pytest.raises(CardError, match="TP001"):
        finding(spec, {"tp": 3, "heads": 32, "working": "{1}"})


# --------------------------------------------------------------------------- exact semantics and computed fixes


def finding_of(rule_id: str, job, plan, include_memory=False):
    return next(f for f in check_config(job, plan, include_memory=include_memory).findings if f.id == rule_id)


def test_tp_heads_fix_names_working_values():
    f = finding_of("TP001", *make(**L8B, num_gpus=24, tp=3))
    assert f.message == "tp=3 does not divide 32 attention heads."
    assert f.fix == "tp in {1, 2, 4, 8} works."
    assert f.severity == "error" and f.source
    # on 3 GPUs tp 2, 4 and 8 divide the heads but not the GPU count (WS001): only tp=1 works there
    assert finding_of("TP001", *make(**L8B, num_gpus=3, tp=3)).fix == "tp in {1} works."


def test_a_fix_without_num_gpus_lets_the_gpu_count_follow_the_layout():
    """num_gpus left out is the degrees' product (resolve), so changing tp changes the count with it: the fix names
    the tps the heads take inside the GPU's NVLink domain, not only those dividing the 3 GPUs tp=3 implied ({1})."""
    job, plan = make(**L70B, tp=3)
    assert job.num_gpus == 3 and job.world_follows_layout
    assert finding_of("TP001", job, plan).fix == "tp in {1, 2, 4, 8} works."
    assert finding_of("TP001", *make(**L70B, tp=3, pp=2, dp=2)).fix == "tp in {1, 2, 4, 8} works."
    # given, the count stays fixed: on 3 GPUs only tp=1 tiles
    job, plan = make(**L70B, num_gpus=3, tp=3)
    assert not job.world_follows_layout and finding_of("TP001", job, plan).fix == "tp in {1} works."


def test_without_num_gpus_the_gpu_count_holds_the_expert_grid():
    """num_gpus left out is the fewest GPUs that hold the degrees (mesh.smallest_world): `meshplan memory
    mixtral-8x7b --ep 8` took 1 GPU (tp*pp*cp*dp) and refused it with WS002 (not divisible by ep*etp = 8); on
    Megatron-Core the experts fold into the data-parallel ranks, so it is 8 GPUs, dp 8."""
    job, plan = make(**MIX, ep=8)
    assert (job.num_gpus, plan.dp) == (8, 8) and not ids(job, plan) & {"WS001", "WS002", "WS003"}
    assert any(n.startswith("num_gpus not given: 8 = ") for n in job.notes)
    job, plan = make(**MIX, ep=4, tp=2, pp=2)  # pp*lcm(tp*cp*dp, ep*etp) = 2*lcm(2, 8): etp defaults to tp
    assert (job.num_gpus, plan.dp) == (16, 4) and not ids(job, plan) & {"WS001", "WS002", "WS003"}
    job, plan = make(**MIX, ep=8, framework="torchtitan")  # torchtitan borrows EP from dp_shard*cp*tp
    assert (job.num_gpus, plan.dp) == (8, 8) and not ids(job, plan) & {"WS001", "WS002", "WS005"}
    assert make(**L70B, tp=4, pp=2)[0].num_gpus == 8  # a dense model: the degrees' product, as before
    # the fixes follow the same count: TP001 on Mixtral at ep=8 names every tp the heads and node take
    assert finding_of("TP001", *make(**MIX, tp=3, ep=8)).fix == "tp in {1, 2, 4, 8} works."


def test_computed_fixes_name_only_values_that_tile_the_gpu_count():
    # Each value a fix names passes its own rule and WS001/WS002 at this GPU count: before, Qwen2.5-7B's 28 heads
    # listed tp=7, GLM-4.5's 160 experts ep 5, 10, ..., 160, and seq 8200's divisors cp 5, 10, 20, 25, none of
    # which divides 64 GPUs.
    assert finding_of("TP001", *make(model="qwen2.5-7b", num_gpus=64, tp=8)).fix == "tp in {1, 2, 4} works."
    assert finding_of("EP002", *make(model="glm-4.5", num_gpus=64, ep=64)).fix == "ep in {1, 2, 4, 8, 16, 32} works."
    cp = finding_of("CP001", *make(**L8B, num_gpus=64, cp=16, seq_length=8200))
    assert cp.fix == "Use seq_length = 8192 or 8224, or cp in {2, 4}."
    # PP001: Qwen2.5-7B's 28 layers listed pp 7, 14, 28 on 24 GPUs; UL001 (verl's Ulysses) a size 28 on 64
    pp = finding_of("PP001", *make(model="qwen2.5-7b", num_gpus=24, pp=3))
    assert pp.fix.startswith("pp in {1, 2, 4} splits evenly;")
    # with virtual stages it named pp 1 (PP003: vpp without a pipeline) and 2 (PP002: 40 layers over vpp=7) for
    # Llama-3.1-70B at pp=6 vpp=7 on 72 GB200: the pps the plan's vpp splits, else the even ones at vpp=1
    pp = finding_of("PP001", *make(model="llama-3.1-70b", gpu="gb200", num_gpus=72, pp=6, vpp=7, cp=4))
    assert pp.fix.startswith("pp in {1, 2} with vpp=1 splits evenly"), pp.fix
    pp = finding_of("PP001", *make(model="llama-3.1-70b", num_gpus=96, pp=3, vpp=2))
    assert pp.fix.startswith("pp in {2, 4, 8} splits evenly"), pp.fix
    ul = finding_of("UL001", *make(model="qwen2.5-7b", framework="verl", num_gpus=64, cp=8, zero_stage=3))
    assert ul.fix == "Use a Ulysses size (cp) in {1, 2, 4}."
    # WS002 where no ep tiles the count said "or ep in none at this GPU count at this GPU count"
    ws = finding_of("WS002", *make(**MIX, num_gpus=64, ep=8, pp=3))
    assert ws.fix.endswith("Use num_gpus = 48 or 72 (multiples of pp*lcm(tp*cp, ep*etp) = 24, the smallest GPU count "
                            "for this layout); no ep tiles 64 GPUs at pp=3, etp=1.")
    # where no value tiles the count (with cp=4 no tp divides 7 GPUs: WS001 names the count), the rule's own stay:
    # those inside the job's fast domain, its 7 GPUs (mesh.job_domain), so not 8
    assert finding_of("TP001", *make(**L8B, num_gpus=7, tp=7, cp=4, seq_length=8200)).fix == "tp in {1, 2, 4} works."


def test_megatron_kv_rule_is_multiple_or_divisor_but_kempnerforge_is_strict():
    # Llama-3.1-70B: 8 KV heads. tp=16 is a multiple of 8: Megatron replicates, KempnerForge refuses.
    assert "TP002" not in ids(*make(**L70B, num_gpus=16, tp=16))
    assert "TP003" in ids(*make(**L70B, framework="kempnerforge", num_gpus=16, tp=16))


def test_megatron_world_laws_and_lcm_minimum():
    # tp*cp = 2*3 = 6, ep*etp = 4: minimum world = pp*lcm(6, 4) = 12, not max(6, 4) = 6.
    job, plan = make(**MIX, num_gpus=6, tp=2, cp=3, ep=4, etp=1, seq_length=6144)
    f = finding_of("WS002", job, plan)
    assert "pp*lcm(tp*cp, ep*etp) = 12" in f.fix
    assert not {"WS001", "WS002"} & ids(*make(**MIX, num_gpus=12, tp=2, cp=3, ep=4, etp=1, seq_length=6144))
    # CP is not in the expert grid: EP8 on 16 GPUs with CP2 is legal (expert-dp = 16/8 = 2).
    assert not {"WS001", "WS002"} & ids(*make(**MIX, num_gpus=16, cp=2, ep=8, seq_length=8192))


def test_ws002_fix_names_etp_one_first_when_whole_experts_tile_the_gpus():
    # Megatron-Bridge's DeepSeek-V3 recipe layout (TP2 PP16 EP64) with etp left unset: etp = tp = 2, so the
    # expert grid is 2*64*16 = 2048 > 1024 GPUs; the recipe sets etp=1, and 1*64*16 = 1024 divides 1024.
    job, plan = make(model="deepseek-v3", framework="megatron-bridge", num_gpus=1024, tp=2, pp=16, ep=64)
    assert plan.etp == 2
    f = finding_of("WS002", job, plan)
    assert f.fix.startswith("Set etp=1 (experts whole: etp*ep*pp = 1*64*16 = 1024 divides 1024), or keep etp=2")
    # ...and still the smallest GPU count pp*lcm(tp*cp, ep*etp) = 16*lcm(2, 128) = 2048, and the eps that
    # tile 1024/(pp*etp) = 32 ranks per stage and divide 256 experts.
    assert ("Use num_gpus = 2048 (multiples of pp*lcm(tp*cp, ep*etp) = 2048, the smallest GPU count for this "
            "layout), or ep in {1, 2, 4, 8, 16, 32}") in f.fix
    assert "WS002" not in ids(*make(model="deepseek-v3", framework="megatron-bridge", num_gpus=1024,
                                    tp=2, pp=16, ep=64, etp=1))


def test_ws002_fix_does_not_offer_etp_one_where_it_does_not_fit_or_is_already_set():
    # Mixtral on 12 GPUs, TP2 EP8, etp unset (= 2): grid 16; with etp=1 it is 8, which does not divide 12 either.
    job, plan = make(**MIX, num_gpus=12, tp=2, ep=8)
    assert plan.etp == 2
    f = finding_of("WS002", job, plan)
    assert "etp=1" not in f.fix
    assert f.fix == ("Use num_gpus = 16 (multiples of pp*lcm(tp*cp, ep*etp) = 16, the smallest GPU count for this "
                     "layout), or ep in {1, 2} at this GPU count.")
    # etp already 1: nothing to offer (6 GPUs, grid 4).
    assert "Set etp" not in finding_of("WS002", *make(**MIX, num_gpus=6, tp=2, cp=3, ep=4, etp=1,
                                                       seq_length=6144)).fix


def test_world_laws_differ_by_framework():
    # 32 GPUs, tp=4, ep=2: KempnerForge counts EP (dp = 32/(4*2) = 4); Megatron and torchtitan fold it (dp = 8).
    for framework in ("megatron-core", "torchtitan", "kempnerforge"):
        job, plan = make(**MIX, framework=framework, num_gpus=32, tp=4, ep=2)
        assert plan.dp == (4 if framework == "kempnerforge" else 8)
        assert not {f.id for f in check_config(job, plan, include_memory=False).findings if f.severity == "error"}
    # torchtitan: ep must divide dp_shard*cp*tp = 1*1*2 = 2 on 2 GPUs; ep=4 does not.
    job, plan = make(**MIX, framework="torchtitan", num_gpus=2, tp=2, ep=4)
    assert "WS005" in ids(job, plan)


def test_interleaving_needs_microbatches_divisible_by_pp():
    # dp = 8/4 = 2, mbs 1: gbs 12 -> 6 micro-batches, not a multiple of pp=4.
    f = finding_of("PP005", *make(**L8B, num_gpus=8, pp=4, vpp=2, global_batch_size=12))
    assert "6 micro-batches" in f.message
    assert "8 or 16" in f.fix


def test_torch_schedules_refuse_their_microbatch_counts():
    # torch Schedule1F1B: m >= stages; dp = 2, mbs 1, gbs 4 -> m = 2 < pp = 4; the estimators refuse it too.
    f = finding_of("PP010", *make(**L8B, framework="torchtitan", num_gpus=8, pp=4, global_batch_size=4))
    assert "2 micro-batches" in f.message and "global_batch_size >= 8" in f.fix and "pp <= 2" in f.fix
    with pytest.raises(EstimateBlocked, match="PP010"):
        require_estimable(*make(**L8B, framework="torchtitan", num_gpus=8, pp=4, global_batch_size=4))
    # ScheduleInterleaved1F1B: m = 9 over pp = 4 runs 2 rounds, and 9 is no multiple of 2; 8 and 10 are.
    f = finding_of("PP011", *make(**L8B, framework="torchtitan", num_gpus=8, pp=4, vpp=2, global_batch_size=18))
    assert "2 rounds" in f.message and "16 or 20" in f.fix
    # fewer micro-batches than stages is one round: torch accepts it (and so does meshplan, pricing the bubble)
    job, plan = make(**L8B, framework="torchtitan", num_gpus=8, pp=4, vpp=2, global_batch_size=6)
    assert "PP011" not in ids(job, plan)


def test_bubble_fraction_is_exact():
    # pp=4, dp=2, gbs=4, mbs=1: m=2, bubble (p-1)/m = 150% of compute, (p-1)/(m+p-1) = 60% of the step.
    f = finding_of("PP006", *make(**L8B, num_gpus=8, pp=4, global_batch_size=4))
    assert "150% of the compute time, 60% of the step" in f.message


def test_tp_across_nodes_names_the_slowdown():
    f = finding_of("TP004", *make(**L70B, num_gpus=16, tp=16))
    assert "450 GB/s" in f.message and "50 GB/s" in f.message and "about 9x slower" in f.message
    assert f.message.startswith("tp=16 is larger than the 8-GPU NVLink domain"), f.message


def test_a_tp_that_does_not_divide_the_domain_is_not_called_larger():
    """tp=3 on 24 H100 crosses the 8-GPU domain (ranks 6-8 on two nodes) though it is smaller: TP004 said 'tp=3 is
    larger than the 8-GPU NVLink domain'; it says the groups that straddle two domains."""
    f = finding_of("TP004", *make(**L8B, num_gpus=24, tp=3))
    assert f.message.startswith("tp=3 does not divide the 8-GPU NVLink domain"), f.message
    assert "straddle two domains" in f.message and "larger" not in f.message


def test_sequence_parallel_warnings():
    assert finding_of("SP001", *make(**L8B, num_gpus=8, sequence_parallel=True)).severity == "warning"
    assert finding_of("EP003", *make(**MIX, num_gpus=8, tp=2, ep=4, sequence_parallel=False)).severity == "warning"


def test_uneven_split_is_balanced_and_respects_vpp():
    assert uneven_split(61, 16) == (3, 4, 2)
    assert uneven_split(94, 16) == (5, 6, 5)
    assert uneven_split(126, 16) == (7, 8, 7)
    assert uneven_split(61, 8, 2) is None  # every part even cannot add up to 61
    f = finding_of("PP001", *make(**KIMI, num_gpus=1024, tp=2, pp=16, ep=32))
    assert "first_stage_layers=3, last_stage_layers=2, 4 on each of the 14 middle stages" in f.fix
    # one middle stage is named as one (it said "27 on each of the 1 middle stages")
    f = finding_of("PP001", *make(**L70B, num_gpus=24, pp=3))
    assert f.fix.endswith("first_stage_layers=27, last_stage_layers=26, 27 on the middle stage."), f.fix


def test_cp002_reads_the_step_estimate_recommend_ranks_with():
    """CP002's fixed 4,096 tokens per rank told `check llama-3.1-8b --num-gpus 8 --cp 2` that the exchange could not be
    hidden and to use cp=1, of the layout `recommend` ranks first (TP1 PP1 CP2 DP4), whose ring the estimate hides
    and whose cp=1 does not fit. It fires now where the estimate exposes CP traffic, with that figure, and its fix is
    the same estimate at each smaller cp: the fastest that fits."""
    from meshplan.adapters.read.fixes import fix_changes
    from meshplan.estimate.perf import estimate_throughput

    job, plan = make(**L8B, num_gpus=8, cp=2)
    assert estimate_throughput(job, plan).breakdown.cp_comm_s == 0
    assert "CP002" not in ids(job, plan, include_memory=True)
    job, plan = make(**L8B, num_gpus=8, cp=8)
    exposed = estimate_throughput(job, plan).breakdown.cp_comm_s
    f = finding_of("CP002", job, plan, include_memory=True)
    assert f"{exposed:.3g} s of the" in f.message and "512 tokens per CP rank" in f.message
    # cp=1 does not fit (80.4 of 79.6 GiB); cp=2, recommend's first pick, fits and hides its ring
    assert f.fix.startswith("Use cp=2 (dp=4): predicted "), f.fix
    assert "meshplan recommend" in f.fix and fix_changes(f.fix, {"cp": 8}) == [{"cp": 2, "dp": 4}]


def test_uneven_split_checks_follow_megatron():
    job, plan = make(**KIMI, num_gpus=1024, tp=2, pp=16, ep=32, vpp=2)
    plan = plan.model_copy(update={"first_stage_layers": 3, "last_stage_layers": 2})
    f = finding_of("PP004", job, plan)
    assert "first_stage_layers=3 is not divisible by vpp=2" in f.message
    # sizes over the model said "the -8 middle layers do not split evenly over 3 middle stages"
    f = finding_of("PP004", *make(model="llama-3.1-8b", num_gpus=8, pp=4, first_stage_layers=40))
    assert "the first and last stages given hold 40 layers, more than the model's 32" in f.message, f.message


@pytest.mark.parametrize(("framework", "change"), [
    ("megatron-bridge", {"pipeline_layout": "Et|(tt|)*30mL", "first_stage_layers": None, "last_stage_layers": None}),
    ("megatron-core", {"pipeline_layout": "Et|(tt|)*30mL", "first_stage_layers": None, "last_stage_layers": None}),
    ("verl", {"vpp": 1})])
def test_an_uneven_split_no_first_last_sizes_fix_at_this_vpp_names_one_that_works(framework, change):
    """DeepSeek-V3 (61 layers) at pp=8 vpp=4 with first_stage_layers=7: no first/last sizes work (each a multiple of 4,
    the 61 - first - last left a multiple of 24), and PP004's fix said 'Use pp in {1} with an even split'. It names
    a pipeline layout where the framework's config has the key (Megatron-Core, Megatron-Bridge), else the sizes at
    vpp=1 (verl writes no layout); the fix applied passes every pipeline rule."""
    from meshplan.adapters.read.fixes import fix_changes
    fields = dict(model="deepseek-v3", gpu="h100", num_gpus=1024, framework=framework, tp=4, pp=8, vpp=4, ep=64,
                  etp=1, first_stage_layers=7, last_stage_layers=6)
    f = finding_of("PP004", *make(**fields))
    assert "first_stage_layers=7 is not divisible by vpp=4" in f.message and "pp in {1}" not in f.fix, f.fix
    (applied,) = fix_changes(f.fix, fields)
    assert applied == change
    fixed = {k: v for k, v in {**fields, **applied}.items() if v is not None}
    errors = {g.id for g in check_config(*make(**fixed)).findings if g.severity == "error"}
    assert not {e for e in errors if e.startswith("PP")}, errors


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
@pytest.mark.parametrize("sizes", [{"first_stage_layers": 4}, {"last_stage_layers": 4},
                                   {"first_stage_layers": 2, "last_stage_layers": 4}])
def test_stage_sizes_at_pp1_are_refused_as_megatron_refuses_them_with_a_fix_that_works(framework, sizes):
    """Llama-3.1-8B at pp=1 with first_stage_layers=4: Megatron-Core's TransformerConfig.__post_init__ does not ignore
    the size at one stage, it raises 'Mismatch: 28 middle layers remaining but 0 middle PP stages available'. PP004's
    fix said 'Use pp in {1, 2, 4, 8} with an even split', naming the pp=1 the user had. It now says the one stage
    holds every layer and names fixes that pass: the sizes dropped, or a pp at which they are kept; recommend
    pinned to pp=1 refuses with the same rule and fix."""
    from meshplan import api
    from meshplan.adapters.read.fixes import fix_changes
    from meshplan.core.errors import MeshplanError
    from meshplan.request.parse import parse_request
    fields = dict(model="llama-3.1-8b", num_gpus=8, framework=framework, pp=1, **sizes)
    f = finding_of("PP004", *make(**fields))
    assert "pp=1 runs one stage, which holds all 32 layers" in f.message and "Mismatch" in f.message, f.message
    assert "pp in {1" not in f.fix and ("drop first_stage_layers" in f.fix or "drop last_stage_layers" in f.fix), f.fix
    changes = fix_changes(f.fix, fields)
    assert changes[0] == {name: None for name in sizes} and len(changes) == 2, changes
    for applied in changes:
        fixed = {k: v for k, v in {**fields, **applied}.items() if v is not None}
        errors = {g.id for g in check_config(*make(**fixed)).findings if g.severity == "error"}
        assert not {e for e in errors if e.startswith("PP")}, (applied, errors)
    with pytest.raises(MeshplanError, match="No layout can pass rule PP004") as refused:
        api.recommend(parse_request(fields), top_k=1)
    assert refused.value.fix == f.fix


def test_an_uneven_split_that_leaves_a_middle_stage_without_a_layer_is_pp007_on_every_engine():
    """OLMoE (16 layers) at pp=16 with last_stage_layers=5 leaves 11 layers for 15 middle stages. PP004 (Megatron's
    own checks) covers the Megatron engines only; elsewhere the estimate split them evenly into empty stages and
    raised a bare ValueError out of `memory` and recommend (found by a sampler of requests that fix knobs)."""
    from meshplan.core.errors import MeshplanError
    from meshplan.estimate.memory import estimate_memory
    fields = dict(model="olmoe-1b-7b", framework="nemo-automodel", gpu="h200", num_gpus=32, pp=16, zero_stage=3,
                  global_batch_size=256, seq_length=1024)
    f = finding_of("PP007", *make(**fields, last_stage_layers=5))
    assert "15 model chunks (the 15 stages between the given first/last stages x vpp 1) but only 11 layers" in f.message
    assert "Use last_stage_layers <= 1, or fewer stages" in f.fix  # the field given, not one left unset
    with pytest.raises(MeshplanError, match="PP007"):
        estimate_memory(*make(**fields, last_stage_layers=5))
    assert "PP007" not in {f.id for f in check_config(*make(**fields, last_stage_layers=1)).findings}  # 15 for 15
    # without middle stages the given sizes must add up to the model's layers (the estimate raised it, unnamed)
    f = finding_of("PP007", *make(**{**fields, "pp": 2}, first_stage_layers=4, last_stage_layers=1))
    assert f.message == ("With pp=2, first_stage_layers + last_stage_layers = 5 on the given stages, but the model "
                         "has 16 layers.") and f.fix == "Use last_stage_layers=12."
    # sizes over the model with stages left to fill: the bound that leaves each of them a layer (it said "Use first
    # and last stage sizes that leave layers for the middle stages", at pp=2 where there is none)
    f = finding_of("PP007", *make(**{**fields, "pp": 2}, first_stage_layers=20))
    assert f.fix == "Use first_stage_layers <= 15."
    assert "PP007" not in {f.id for f in check_config(*make(**{**fields, "pp": 2}, first_stage_layers=15)).findings}


def test_virtual_stages_on_a_framework_without_an_interleaved_schedule_are_pp013():
    """nanotron and DeepSpeed run one stage per rank (their cards' pipeline.interleaved is null): vpp > 1 without a
    named schedule was accepted and estimated as interleaved."""
    for framework in ("nanotron", "deepspeed"):
        f = finding_of("PP013", *make(**L8B, framework=framework, num_gpus=8, pp=2, vpp=2, zero_stage=0))
        assert "with vpp=2: they run one stage per rank" in f.message and f.fix == "Use vpp=1."
    for framework in ("megatron-core", "kempnerforge"):
        assert "PP013" not in {f.id for f in check_config(*make(**L8B, framework=framework, num_gpus=8, pp=2, vpp=2,
                                                                 zero_stage=0 if framework == "megatron-core" else 3
                                                                 )).findings}


def test_moe_bias_rule_is_about_add_bias_linear():
    # gpt-oss has biased linears: etp must be 1 whatever tp is; Mixtral has none.
    assert "EP004" in ids(*make(**GPT_OSS, num_gpus=8, ep=4, etp=2))
    # Megatron-Core defaults an unset ETP to TP, so biased MoE with tp=2 fails unless etp=1 is given.
    assert "EP004" in ids(*make(**GPT_OSS, num_gpus=8, tp=2, ep=4))
    assert "EP004" not in ids(*make(**MIX, num_gpus=8, tp=2, ep=4, etp=2))


def test_ep_divisors_fix():
    f = finding_of("EP002", *make(**QWEN_MOE, num_gpus=12, ep=12))
    assert f.fix == "ep in {1, 2, 4} works."  # 8 and above divide the 128 experts, not the 12 GPUs


def test_structural_check_skips_memory():
    job, plan = make(**L70B, num_gpus=8, tp=8)
    quick = check_config(job, plan, include_memory=False)
    assert quick.memory is None and not any(f.id.startswith("MEM") for f in quick.findings)


def test_memory_error_names_fitting_alternatives():
    # Llama-3.1-70B TP8 PP1 DP8 on 64 H100 at 8K without recompute needs 88 GiB (8.4 over); MEM001's fix re-estimates
    # its neighbours, and three of them fit (zero_stage=3, pp=2, pp=4). The case is held over the GPU's memory (it
    # must not skip itself when the memory model moves: then this test, not the synthetic one, has to change).
    from meshplan.estimate.memory import estimate_memory

    job, plan = make(**L70B, num_gpus=64, tp=8, seq_length=8192)
    report_ = check_config(job, plan)
    assert not report_.memory.fits, "the case must be over the GPU's memory for MEM001 to name alternatives"
    f = next(f for f in report_.findings if f.id == "MEM001")
    assert f.severity == "error" and not report_.ok
    assert f"stage {report_.memory.peak_stage}" in f.message and "GiB" in f.message and "over" in f.message
    assert "fit" in f.fix
    # Every alternative the fix names really fits.
    named = [part.split(" (")[0] for part in f.fix.removesuffix(" fits.").removesuffix(" fit.").split(" or ")]
    assert named
    for label in named:
        key, value = label.split("=")
        changed = plan.model_copy(update={key: int(value) if value.isdigit() else value})
        if key == "pp":
            changed = changed.model_copy(update={"dp": 64 // (changed.tp * changed.pp * changed.cp)})
        assert estimate_memory(job, changed).fits, label


def test_memory_fix_neighbours_follow_the_card():
    """MEM001's neighbours come from its params (doubling, pp up to 4x, the cp threshold), not from code."""
    from meshplan.check.alternatives import _candidates

    assert rule_specs()["MEM001"].params == {"max_alternatives": 3, "degree_factor": 2, "max_pp_factor": 4,
                                             "max_changes": 2, "cp_min_tokens_per_rank": 4096}
    job, plan = make(**L70B, num_gpus=64, tp=8, seq_length=8192)
    labels = [label.split(" (")[0] for label, _ in _candidates(Context(job, plan))]
    assert {"pp=2", "pp=4", "cp=2"} <= set(labels) and "pp=8" not in labels
    assert not any(label.startswith("tp=") for label in labels)  # tp=16 leaves the 8-GPU NVLink domain (TP004)
    job, plan = make(**L70B, num_gpus=64, tp=8, seq_length=8190)  # under 2 x its 4,096 tokens per rank
    assert not any(label.startswith("cp=") for label, _ in _candidates(Context(job, plan)))


def test_memory_error_when_nothing_nearby_fits():
    # Llama-3.1-70B on one node of 8: only the CPU optimizer fits it on the GPUs, and a 512 GiB host cannot hold
    # it (about 1 TiB per node: fp32 parameters, a gradient copy and Adam moments of 8.8 B parameters per GPU).
    job, plan = make(**L70B, num_gpus=8, tp=8, cpu_memory_per_node=512)
    f = finding_of("MEM001", job, plan, include_memory=True)
    assert "none of the nearby layouts fits" in f.fix
    assert "optimizer_offload=true: " in f.fix and "host per node of 512.0 GiB" in f.fix


def _named_changes(ctx: Context, fix: str) -> list[dict]:
    """The plan changes behind each alternative a MEM001 fix names ("a (..) or b + c (..) fits")."""
    from meshplan.check.alternatives import _candidates

    changes = dict(_candidates(ctx))
    named = fix.split("together, ")[-1].removesuffix(" fits.").removesuffix(" fit.")
    out = []
    for alternative in named.split(") or "):
        merged: dict = {}
        for label in alternative.split(" (")[0].split(" + "):
            merged |= changes[label]
        out.append(merged)
    return out


def test_memory_fix_names_the_cpu_optimizer_with_its_host_memory():
    from meshplan.check.alternatives import _neighbour
    from meshplan.estimate.memory import estimate_memory

    job, plan = make(**L70B, num_gpus=8, tp=8, framework="megatron-core")
    f = finding_of("MEM001", job, plan, include_memory=True)
    assert f.fix.startswith("optimizer_offload=true (") and f.fix.endswith(" fits.")
    (change,) = _named_changes(Context(job, plan), f.fix)
    fixed = estimate_memory(job, _neighbour(Context(job, plan), change))
    assert fixed.fits and fixed.host_bytes_per_node > 0
    assert f"{gib(fixed.fit_bytes)} peak, {gib(fixed.host_bytes_per_node)} host per node" in f.fix


def test_memory_fix_combines_two_changes_when_none_fits_alone():
    # GLM-4.5-Air's Megatron-Bridge recipe on 32 H100 (TP1 PP4 EP8, first/last stage 11 layers): expert-dp is 1,
    # so nothing shards its experts' optimizer states; with a 256 GiB host the CPU optimizer is out too. Each
    # change alone falls short; the fix names pairs, and every pair it names fits and passes every rule.
    from meshplan.check.alternatives import _neighbour
    from meshplan.estimate.memory import estimate_memory

    job, plan = make(model="glm-4.5-air", framework="megatron-bridge", num_gpus=32, tp=1, pp=4, ep=8, etp=1,
                     recompute="selective", first_stage_layers=11, last_stage_layers=11, seq_length=4096,
                     global_batch_size=2048, cpu_memory_per_node=256)
    f = finding_of("MEM001", job, plan, include_memory=True)
    assert f.fix.startswith("no single change fits (") and "; together, " in f.fix
    assert "recompute=full: " in f.fix and "but 428.4 GiB host per node of 256.0 GiB" in f.fix
    changes = _named_changes(Context(job, plan), f.fix)
    assert len(changes) == rule_specs()["MEM001"].params["max_alternatives"]
    for change in changes:
        fixed = _neighbour(Context(job, plan), change)
        assert estimate_memory(job, fixed).fits, change
        assert not [x for x in check_config(job, fixed, include_memory=False).findings if x.severity == "error"]


def test_headroom_threshold_is_ten_percent():
    job, plan = make(**L8B, num_gpus=8)
    low = load_rules()["MEM002"](Context(job, plan, memory_report=report(72.5, 80.0)))
    assert low is not None and low["share"] == "9.4%"
    assert load_rules()["MEM002"](Context(job, plan, memory_report=report(72.0, 80.0))) is None


def test_headroom_fix_names_only_changes_the_plan_has_not_made():
    """MEM002's fix was one sentence for every plan: recompute=selective on a plan recomputing in full (more memory),
    micro_batch_size=1 at 1, a larger zero_stage at the framework's highest. It names what this plan can still do: the
    nearby layouts MEM001's fix tries (check/alternatives.py), each with its estimated peak and the share it leaves
    free, never a direction ('a larger pp or tp', which it named before: tests/test_fix_applied.py applies each)."""
    from meshplan.adapters.read.fixes import fix_changes  # one alternative each, as check --config offers them

    rule_ = load_rules()["MEM002"]
    job, plan = make(**L70B, num_gpus=16, tp=8, pp=2, recompute="full", zero_stage=1)
    values = rule_(Context(job, plan, memory_report=report(72.5, 80.0)))
    assert values["changes"] == ("optimizer_state_dtype=bf16 (51.0 GiB peak, 36% free) or optimizer_offload=true "
                                 "(26.3 GiB peak, 67% free, 525.8 GiB host per node)")
    job, plan = make(**L8B, num_gpus=8, micro_batch_size=2, zero_stage=3)
    values = rule_(Context(job, plan, memory_report=report(72.5, 80.0)))
    assert values["changes"] == ("micro_batch_size=1 (45.8 GiB peak, 43% free) or recompute=selective (69.4 GiB "
                                 "peak, 13% free) or pp=2 (62.7 GiB peak, 21% free)")
    assert fix_changes(values["changes"], {}) == [{"micro_batch_size": 1}, {"recompute": "selective"}, {"pp": 2}]


def test_a_rollout_fraction_holding_no_sequence_is_rl006_with_fixes_that_clear_it():
    """Qwen3-8B GRPO on 8 H100 at rollout_memory_fraction 0.01: vLLM's 0.8 GiB cannot hold its 7.6 GiB of weights,
    yet check said ok and throughput estimated a step (the RL recommend counts it under RL006 too). Each value the
    fix names clears RL006. Where the plan fits, only a change that still fits, estimated, is named:
    rollout_memory_fraction=0.11 at 0.01 overflowed the rollout phase (82.5 GiB of 79.6 GiB: MEM001, RL005).
    Fused bias + SwiGLU, as verl's own Megatron scripts set it: verl 0.9.1 runs Qwen3 unfused by default (its
    Megatron-Bridge provider; cards/frameworks/verl.yaml defaults), whose update peak, 82.1 GiB (80.3 fused), fits
    no H100 at any fraction, so the case of a plan that fits would be gone."""
    base = dict(model="qwen3-8b", framework="verl", num_gpus=8, job="rl", bias_activation_fusion=True)
    for fraction, named, changes in (
            (0.01, ["rollout_tp=4 with rollout_memory_fraction=0.06 or more", "(79.6 GiB peak)"],
             [{"rollout_tp": 4, "rollout_memory_fraction": 0.06}]),
            (0.08, ["rollout_memory_fraction=0.11", "rollout_tp=4"],  # does not fit at 0.08 either: both named
             [{"rollout_memory_fraction": 0.11}, {"rollout_tp": 4}])):
        job, plan = make(**base, rollout_memory_fraction=fraction)
        f = finding_of("RL006", job, plan, include_memory=True)
        assert "the engine cannot start" in f.message and all(n in f.fix for n in named), f.fix
        for change in changes:
            fixed = check_config(*make(**base, **{"rollout_memory_fraction": fraction, **change}))
            assert "RL006" not in {x.id for x in fixed.findings}, change
            assert fraction > 0.01 or fixed.ok, (change, fixed.findings)



def test_rl006_names_the_rollout_tp_that_holds_the_weights_and_render_says_why_in_its_headline():
    """Qwen3-235B-A22B GRPO on 256 H100 at verl's defaults (rollout TP 2, fraction 0.5): 219 GiB of engine weights per
    GPU. The fix tried rollout_tp 4 alone and fell back to 'GPUs with more memory'; it now doubles rollout_tp within
    the NVLink domain to the least that holds a sequence, with the fraction that then holds one (8 at 0.7). Render's
    headline said 'breaks 1 rule (RL006): .' (the step fits, so no reason was given); it names the rule's title.
    That change holds a sequence but overflows the rollout phase (82.6 GiB of 79.6 GiB: MEM001, RL005), so on this
    plan, which fits, it is no longer named: the fix says none fits, with its figure, and names no edit."""
    base = dict(model="qwen3-235b-a22b", framework="verl", gpu="h100", num_gpus=256, tp=4, pp=8, ep=4, job="rl",
                account_for_embedding=True, account_for_loss=True)
    f = finding_of("RL006", *make(**base), include_memory=True)
    assert f.fix.startswith("None of the changes that hold a sequence fits (rollout_tp=8 with rollout_memory_fraction"
                            "=0.7 or more (") and ": 82.6 GiB)" in f.fix, f.fix
    from meshplan.adapters.read.fixes import NO_FIX
    assert NO_FIX.search(f.fix)  # check --config offers no edit from it
    fixed = check_config(*make(**base, rollout_tp=8, rollout_memory_fraction=0.7))
    assert "RL006" not in {x.id for x in fixed.findings}
    assert {"MEM001", "RL005"} <= {x.id for x in fixed.findings}
    with pytest.raises(RefusedLayout) as refused:
        api.render_config("verl", Request(**base))
    assert "(RL006): the rollout engine's budget holds no sequence." in refused.value.reason


def test_the_rl_recommend_counts_a_fraction_holding_no_sequence_under_rl006():
    """What check calls RL006 the RL recommend counts under RL006 too (it was SEARCH-NO-KV): one name per condition on
    every face, and the answer's words say what it means."""
    from meshplan import api
    from meshplan.schema.request import Request

    rec = api.recommend(Request(model="qwen3-8b", framework="verl", num_gpus=8, job="rl", algorithm="grpo",
                                gpu="h100", rollout_memory_fraction=0.01))
    assert not rec.candidates and rec.rejected.get("RL006", 0) > 0 and "SEARCH-NO-KV" not in rec.rejected
    assert "no room for one sequence's KV cache (RL006)" in rec.rationale


# --------------------------------------------------------------------------- published recipes pass


RECIPES = [
    # (framework, request) -- sources: Megatron-Bridge recipes and perf-parallelism-strategies skill MoE table,
    # Megatron Core parallelism guide (Llama-3 70B 4D example), KempnerForge parallelism recipes.
    ("megatron-bridge", dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, global_batch_size=4096,
                             first_stage_layers=4, last_stage_layers=1)),
    ("megatron-core", dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, cp=2, seq_length=8192)),
    ("megatron-core", dict(model="mixtral-8x7b", num_gpus=64, tp=1, pp=4, ep=8)),
    ("megatron-bridge", dict(model="olmoe-1b-7b", num_gpus=8, ep=8)),
    ("megatron-bridge", dict(model="moonlight-16b-a3b", num_gpus=16, tp=2, ep=8, etp=1)),
    ("megatron-bridge", dict(model="deepseek-v2", num_gpus=128, pp=4, ep=32)),
    ("megatron-bridge", dict(model="glm-4.5-air", num_gpus=32, pp=4, ep=8, first_stage_layers=11,
                             last_stage_layers=11)),
    ("megatron-bridge", dict(model="qwen3-30b-a3b", num_gpus=16, tp=4, pp=2, ep=4, etp=1)),
    ("megatron-bridge", dict(model="glm-4.5", num_gpus=256, tp=2, pp=8, ep=16, etp=1, first_stage_layers=10,
                             last_stage_layers=10)),
    ("megatron-bridge", dict(model="qwen3-235b-a22b", num_gpus=256, tp=4, pp=16, ep=8, etp=1, first_stage_layers=5,
                             last_stage_layers=5)),
    ("megatron-bridge", dict(model="kimi-k2", num_gpus=1024, tp=2, pp=16, ep=32, etp=1, first_stage_layers=3,
                             last_stage_layers=2)),
    ("kempnerforge", dict(model="llama-3.1-70b", gpu="h200", num_gpus=32, tp=4)),
    ("kempnerforge", dict(model="llama-3.1-70b", gpu="h200", num_gpus=32, tp=4, pp=4)),
    ("kempnerforge", dict(model="mixtral-8x7b", gpu="h200", num_gpus=32, tp=4, ep=2)),
    ("torchtitan", dict(model="llama-3.1-70b", num_gpus=64, tp=8)),
    ("verl", dict(model="qwen3-235b-a22b", num_gpus=128, pp=8, vpp=2, ep=8, first_stage_layers=10,
                  last_stage_layers=12, global_batch_size=256)),
]


@pytest.mark.parametrize(("framework", "request_"), RECIPES, ids=[f"{f}-{r['model']}" for f, r in RECIPES])
def test_published_recipes_have_no_structural_error(framework, request_):
    job, plan = make(framework=framework, **request_)
    errors = [f for f in check_config(job, plan, include_memory=False).findings if f.severity == "error"]
    assert not errors, [f"{f.id}: {f.message}" for f in errors]


@pytest.mark.parametrize("request_", [
    dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, cp=2, seq_length=8192),
    dict(model="mixtral-8x7b", num_gpus=64, tp=1, pp=4, ep=8),
])
def test_published_recipes_fit(request_):
    report_ = check_config(*make(**request_))
    assert report_.ok, [f"{f.id}: {f.message}" for f in report_.findings]
    assert report_.memory is not None and report_.memory.fits


def test_skyrl_batch_rule_on_fewer_gpus_than_one_replica_defers_to_the_world_law():
    """Found by the real-validator harness: W=4 with pp*cp = 8 used to divide by zero in SK001."""
    found = ids(*make(model="llama-3.1-8b", framework="skyrl", num_gpus=4, pp=4, cp=2, seq_length=8192,
                      global_batch_size=2))
    assert "WS001" in found and "SK001" not in found


def test_precision_rules_name_the_nearest_setting():
    """PR003's fix is the nearest recipe both the GPU and the framework run; PR001 and PR002 name what works."""
    def fix(rule_id, **fields):
        job, plan = case_job({**L8B, "num_gpus": 8, **fields})
        return next(f.fix for f in check_config(job, plan, include_memory=False).findings if f.id == rule_id)

    assert fix("PR003", precision="fp8", fp8_recipe="mxfp8").startswith("Use fp8_recipe=blockwise ")  # H100
    assert fix("PR003", precision="fp8", fp8_recipe="rowwise").startswith("Use fp8_recipe=blockwise ")  # no rowwise
    assert fix("PR003", precision="fp8", fp8_recipe="mxfp8", gpu="mi300x").startswith("Use fp8_recipe=tensorwise ")
    assert fix("PR003", precision="fp8", fp8_recipe="delayed", framework="torchtitan").startswith(
        "Use fp8_recipe=tensorwise ")  # torchao scales dynamically
    assert "precision=fp8" in fix("PR003", fp8_recipe="delayed")
    assert "zero_stage=1" in fix("PR001", optimizer_state_dtype="fp8", zero_stage=3)
    assert "torchtitan keeps Adam moments" in fix("PR001", optimizer_state_dtype="bf16", framework="torchtitan")
    assert "DistMuon" in fix("PR005", optimizer="muon", framework="torchtitan")  # lacks the knob: its instead
    assert "optimizer_state_dtype" in fix("PR005", optimizer="muon", zero_stage=1, optimizer_state_dtype="bf16")
    assert "optimizer_state_dtype" in fix("PR005", optimizer="muon", zero_stage=1, optimizer_offload=True)
    assert "zero_stage=1" in fix("PR002", precision="fp8", fp8_param_gather=True, zero_stage=0)


def test_verls_rl_batch_fix_names_the_prompts_per_step_that_divides():
    """VL001 fires on an RL job only, whose batch is prompts_per_step x samples_per_prompt: its fix named a
    global_batch_size (8 or 16 for 5 x 3 over 8 GPUs) that no whole prompts_per_step at 3 samples gives, and its
    message said the unit twice ('n_gpus = 8 (...) = 8'). Now the fix names the prompts_per_step values whose batch
    divides, and the fix applied passes."""
    from meshplan import api

    ask = dict(model="qwen3-8b", framework="verl", num_gpus=8, zero_stage=3, job="rl", samples_per_prompt=3)
    found = [f for f in api.check_config(Request(**ask, prompts_per_step=5)).findings if f.id == "VL001"]
    assert len(found) == 1 and "= 8 (" not in found[0].message, found
    assert found[0].message.endswith("is not divisible by n_gpus (the FSDP backend's minimal batch) = 8.")
    assert found[0].fix == "Use prompts_per_step = 8 (x samples_per_prompt 3 = 24 sequences).", found[0].fix
    fixed = api.check_config(Request(**ask, prompts_per_step=8)).findings
    assert not [f for f in fixed if f.id == "VL001"]


def test_skyrls_batch_fix_names_prompts_for_an_rl_job_and_the_batch_for_a_training_job():
    """SK001 reads an RL job's batch too: 'Use global_batch_size = 8' at 3 samples a prompt named no whole
    prompts_per_step. A training job's fix is still its global_batch_size."""
    from meshplan import api

    ask = dict(model="qwen3-8b", framework="skyrl", num_gpus=8, zero_stage=3)
    rl = [f for f in api.check_config(Request(**ask, job="rl", samples_per_prompt=3, prompts_per_step=1)).findings
          if f.id == "SK001"]
    assert len(rl) == 1 and rl[0].fix == "Use prompts_per_step = 8 (x samples_per_prompt 3 = 24 sequences).", rl
    sft = [f for f in api.check_config(Request(**ask, global_batch_size=4)).findings if f.id == "SK001"]
    assert len(sft) == 1 and sft[0].fix == "Use global_batch_size = 8.", sft


def test_a_memory_fix_naming_tp_alone_fits_as_the_request_with_that_tp():
    """MEM001's tp neighbour turned sequence parallelism on whatever the framework does: Gemma-2-27B on 24 A100s with
    DeepSpeed (which runs, and renders, no Megatron-style sequence parallelism) at tp=4 was told "tp=8 (67.8 GiB
    peak) fits", and the request with tp=8 needed 118.6 GiB (its sequence_parallel off, as DeepSpeed's card
    defaults it). The neighbour now keeps the plan's sequence parallelism at tp > 1 and, from tp=1, takes what the
    framework turns on with tp (defaults.sequence_parallel_with_tp), as the request with that tp resolves."""
    from meshplan.adapters.read.fixes import fix_changes

    fields = dict(model="gemma-2-27b", framework="deepspeed", gpu="a100-80gb", num_gpus=24, tp=4,
                  optimizer_offload=True, seq_length=32768, zero_stage=3)
    report_ = api.check_config(Request(**fields))
    f = next(f for f in report_.findings if f.id == "MEM001")
    for alternative in f.fix.removesuffix(" fits.").removesuffix(" fit.").split(") or "):
        (change,) = fix_changes(alternative.split(" (")[0], fields)[:1]
        fixed = api.check_config(Request(**(fields | change)))
        assert fixed.memory.fits, (alternative, change)


def test_a_memory_fix_names_the_knob_that_steps_the_optimizer_on_the_cpu():
    """verl's Megatron engine offloads its optimizer between phases with optimizer_offload; the CPU optimizer inside
    the step is Megatron-Core's, through optimizer_offload_fraction (cards/frameworks/verl.yaml offload). MEM001's
    neighbour set both and was named "optimizer_offload=true": DeepSeek-V2 TP1 PP4 CP4 EP8 on 32 H20 was told
    "optimizer_offload=true (79.9 GiB peak) fits", and with it the training step still needed 158.8 GiB."""
    from meshplan.adapters.read.fixes import fix_changes

    fields = dict(model="deepseek-v2", framework="verl", gpu="h20", num_gpus=32, pp=4, cp=4, ep=8,
                  global_batch_size=1024, micro_batch_size=1)
    f = next(f for f in api.check_config(Request(**fields)).findings if f.id == "MEM001")
    assert "optimizer_offload_fraction=1.0 (" in f.fix and "optimizer_offload=true" not in f.fix
    for alternative in f.fix.removesuffix(" fits.").removesuffix(" fit.").split(") or "):
        (change,) = fix_changes(alternative.split(" (")[0], fields)[:1]
        assert api.check_config(Request(**(fields | change))).memory.fits, (alternative, change)


def test_a_memory_fix_widening_tp_splits_the_experts_as_the_framework_does():
    """SkyRL (Megatron-Core's default etp = tp): Llama-4-Scout CP2 EP8 on 24 H200 was told "optimizer_state_dtype=bf16
    + tp=2 (138.2 GiB peak) fits", estimated with the experts whole (etp 1); the request with tp=2 splits them over
    tp (etp 2), whose expert grid 24 GPUs do not tile (WS002). The tp neighbour keeps the plan's etp and names it
    ("tp=2, etp=1") where the framework's default would split the experts over the new tp."""
    from meshplan.adapters.read.fixes import fix_changes

    fields = dict(model="llama-4-scout", framework="skyrl", gpu="h200", num_gpus=24, cp=2, zero_stage=1, ep=8,
                  mtp_num_layers=1)
    f = next(f for f in api.check_config(Request(**fields)).findings if f.id == "MEM001")
    named = f.fix.split("together, ")[-1].removesuffix(" fits.").removesuffix(" fit.").split(") or ")
    for alternative in named:
        change: dict = {}
        for label in alternative.split(" (")[0].split(" + "):
            change |= fix_changes(label, fields)[0]
        fixed = api.check_config(Request(**(fields | change)))
        assert fixed.memory is not None and fixed.memory.fits, (alternative, [x.id for x in fixed.findings])
    assert "tp=2, etp=1, sequence_parallel=true (" in f.fix


def test_a_memory_fix_deepening_the_pipeline_runs_it_as_the_framework_does():
    """KempnerForge turns sequence parallelism off in its pipeline stages (cards/frameworks/kempnerforge.yaml
    defaults.sequence_parallel_off_for: pipeline). Llama-3.1-70B TP8 on 16 H100 at 8K was told "pp=2 + recompute=full
    (76.4 GiB peak) fits", estimated with sequence parallelism kept; the request with pp=2 runs without it and
    recompute=full needed 81.2 GiB. The pp neighbour now runs as the request with that pp resolves."""
    fields = dict(model="llama-3.1-70b", framework="kempnerforge", gpu="h100", num_gpus=16, tp=8, seq_length=8192)
    f = next(f for f in api.check_config(Request(**fields)).findings if f.id == "MEM001")
    deeper = api.check_config(Request(**fields, pp=2)).memory
    assert f"pp=2: {gib(deeper.fit_bytes)}" in f.fix  # the figure the fix tried is the request's own
    assert "pp=2 + recompute=full" not in f.fix and not api.check_config(
        Request(**fields, pp=2, recompute="full")).memory.fits


def test_a_memory_fix_turning_sequence_parallelism_on_with_tp_says_so():
    """A plan at tp=1 states sequence parallelism off (a rendered Megatron-Bridge recipe writes
    cfg.model.sequence_parallel = False); MEM001's tp=2 neighbour turns it on, as the framework does with tp, and was
    named "tp=2": Qwen3-8B with Muon on 32 A100s, sequence_parallel=false given, was told "tp=2 (115.3 GiB peak)" and
    the request with tp=2 needed 133.6 GiB. The label now names the switch, so the request it makes is the one
    estimated."""
    from meshplan.adapters.read.fixes import fix_changes

    fields = dict(model="qwen3-8b", framework="megatron-bridge", gpu="a100-80gb", num_gpus=32, optimizer="muon",
                  seq_length=8192, sequence_parallel=False, micro_batch_size=4)
    f = next(f for f in api.check_config(Request(**fields)).findings if f.id == "MEM001")
    assert "tp=2, sequence_parallel=true" in f.fix
    (change,) = fix_changes("tp=2, sequence_parallel=true", fields, resolve(Request(**fields))[1].model_dump())
    assert change == {"tp": 2, "sequence_parallel": True}
    assert gib(api.check_config(Request(**(fields | change))).memory.fit_bytes) in f.fix


@pytest.mark.parametrize("framework", rule_specs()["WS003"].frameworks)
def test_a_dp_against_the_gpu_count_is_refused_in_the_framework_s_own_words(framework):
    """WS003 said 'Megatron derives dp from the GPU count' on every framework it runs on, DeepSpeed and nanotron too:
    on DeepSpeed it is Megatron-DeepSpeed's arguments and DeepSpeed's batch assertion, on nanotron its own config's
    dp, asserted against the world size. Each card says how it sets dp (limits.data_parallel, with its source), and
    the message says that."""
    card = framework_card(framework)
    assert card.limits.data_parallel and card.limits.data_parallel_source, framework
    req = Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, dp=4, framework=framework)
    found = next(f for f in api.check_config(req).findings if f.id == "WS003")
    assert found.message.endswith(f": {card.limits.data_parallel}."), found.message
    assert ("Megatron derives" not in found.message) and (framework != "deepspeed" or "DeepSpeed" in found.message)
