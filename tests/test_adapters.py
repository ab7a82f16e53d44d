"""Adapters: round trip (render, parse back, same plan), refusals that name the knob, quoting, golden files.

These run without any framework installed; tests/test_adapters_frameworks.py proves the keys against
the real packages.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from tree_under_test import tree_env

from meshplan import api
from meshplan.adapters.capabilities import KNOBS
from meshplan.adapters.parse import parse_plan, shell_tokens
from meshplan.adapters.render import TARGETS, render
from meshplan.arithmetic.memory_states import convention
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import attention_switches
from meshplan.knowledge.adapter_knobs import adapter_section, knob_table, knobs_in_use
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

GOLDEN = Path(__file__).parent / "golden"

# (framework, variant or None, request fields): realistic plans covering every knob each target has.
CASES: list[tuple[str, str | None, dict]] = [
    ("megatron-core", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, vpp=5, cp=2, global_batch_size=512,
                                 recompute="selective")),
    ("megatron-core", None, dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, global_batch_size=4096,
                                 recompute="full", recompute_layers=2)),
    ("megatron-core", None, dict(model="qwen3-30b-a3b", num_gpus=16, tp=2, pp=2, ep=8, cp=2, cp_comm_type="a2a+p2p",
                                 zero_stage=3, seq_length=32768, global_batch_size=64)),
    ("megatron-bridge", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, vpp=5, cp=2,
                                   global_batch_size=512, recompute="full")),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", num_gpus=16, tp=1, pp=2, ep=8,
                                           global_batch_size=256, zero_stage=2)),
    ("verl", None, dict(model="qwen3-30b-a3b", num_gpus=16, tp=2, pp=2, ep=4, cp=2, cp_comm_type="a2a",
                        global_batch_size=256, recompute="full", recompute_layers=4)),
    ("verl", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, vpp=5, global_batch_size=512,
                        recompute="selective")),
    ("verl", "fsdp", dict(model="qwen3-8b", num_gpus=16, cp=4, zero_stage=3, global_batch_size=256,
                          recompute="full")),
    ("skyrl", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, cp=2, global_batch_size=512,
                         recompute="selective")),  # no vpp: SkyRL runs no virtual stages (test_knob_refusals)
    ("skyrl", "sft", dict(model="qwen3-30b-a3b", num_gpus=16, tp=2, pp=2, ep=8, etp=1, global_batch_size=128)),
    ("skyrl", "fsdp", dict(model="qwen3-8b", num_gpus=8, cp=2, zero_stage=3, global_batch_size=64)),
    ("skyrl", None, dict(model="qwen3-8b", num_gpus=16, cp=2, zero_stage=3, global_batch_size=64, recompute="full",
                         param_offload=True)),  # a training job: main_sft, strategy fsdp (variant sft-fsdp)
    ("torchtitan", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, vpp=2, global_batch_size=512,
                              recompute="selective")),
    ("torchtitan", None, dict(model="qwen3-30b-a3b", num_gpus=16, tp=2, ep=8, cp=2, global_batch_size=128,
                              recompute="full")),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, zero_stage=0, global_batch_size=64)),
    ("kempnerforge", None, dict(model="llama-3.1-70b", num_gpus=32, tp=4, global_batch_size=256,
                                recompute="full")),
    ("kempnerforge", None, dict(model="mixtral-8x7b", num_gpus=32, tp=4, ep=2, global_batch_size=256)),
    ("kempnerforge", None, dict(model="llama-3.1-8b", num_gpus=16, global_batch_size=64, optimizer="muon")),
    ("deepspeed", None, dict(model="llama-3.1-8b", num_gpus=16, zero_stage=3, global_batch_size=256)),
    ("deepspeed", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, global_batch_size=512,
                             recompute="full")),
    # 12 GPUs of 8-GPU nodes: 3 nodes x 4 (request/resolve.launch_gpus_per_node), written and read back
    ("megatron-core", None, dict(model="llama-3.1-8b", num_gpus=12, tp=2, global_batch_size=96)),
    ("verl", None, dict(model="llama-3.1-8b", num_gpus=12, tp=2, global_batch_size=96)),
    ("skyrl", None, dict(model="llama-3.1-8b", num_gpus=12, tp=2, global_batch_size=96)),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=12, tp=2, global_batch_size=96)),
    # attention_backend and dropout (tests/test_attention_backend.py): each framework's own key and value.
    ("megatron-core", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, global_batch_size=64,
                                 attention_backend="unfused", dropout=True)),
    ("megatron-bridge", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, global_batch_size=64,
                                   attention_backend="flash", dropout=True)),
    ("megatron-bridge", "run_recipe", dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64,
                                           attention_backend="fused")),
    ("verl", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, global_batch_size=64, attention_backend="unfused",
                        dropout=True)),
    ("verl", "fsdp", dict(model="qwen3-8b", num_gpus=8, zero_stage=3, global_batch_size=64,
                          attention_backend="unfused")),
    ("skyrl", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, global_batch_size=64, attention_backend="fused",
                         dropout=True)),
    ("skyrl", "fsdp", dict(model="qwen3-8b", num_gpus=8, zero_stage=3, global_batch_size=64,
                           attention_backend="flash")),
    ("kempnerforge", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, attention_backend="fused")),
    # Muon: --optimizer muon (the layer-wise distributed optimizer with zero_stage=1), Bridge's muon / dist_muon.
    ("megatron-core", None, dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1,
                                 global_batch_size=4096, optimizer="muon")),
    ("megatron-bridge", None, dict(model="kimi-k2", num_gpus=512, tp=2, pp=16, ep=32, etp=1, zero_stage=0,
                                   global_batch_size=4096, optimizer="muon")),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=256,
                                           optimizer="muon")),
    # Precision knobs: the precision-aware optimizer, fp8 recipes, fp8 parameters and the gradient reduce dtype.
    ("megatron-core", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=2, global_batch_size=512,
                                 precision="fp8", fp8_recipe="blockwise", fp8_param_gather=True,
                                 optimizer_state_dtype="bf16", grad_reduce_in_fp32=False)),
    ("megatron-core", None, dict(model="qwen3-30b-a3b", gpu="b200", num_gpus=8, ep=8, global_batch_size=256,
                                 precision="fp8", fp8_recipe="mxfp8", optimizer_state_dtype="fp8")),
    ("megatron-bridge", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=2, global_batch_size=512,
                                   precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=False,
                                   optimizer_state_dtype="fp16", grad_reduce_in_fp32=False)),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", gpu="b200", num_gpus=16, ep=8,
                                           global_batch_size=256, precision="fp8", fp8_recipe="mxfp8",
                                           fp8_param_gather=True, optimizer_state_dtype="bf16")),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, grad_reduce_in_fp32=True)),
    # The flex MoE dispatcher (DeepEP on one-node NVLink, HybridEP on GB200's rack-wide NVLink).
    ("megatron-core", None, dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1,
                                 global_batch_size=4096, moe_token_dispatcher="flex")),
    ("megatron-core", None, dict(model="qwen3-30b-a3b", gpu="gb200", num_gpus=64, pp=2, ep=32, global_batch_size=256,
                                 moe_token_dispatcher="flex")),
    ("megatron-bridge", None, dict(model="qwen3-30b-a3b", num_gpus=32, pp=2, ep=16, global_batch_size=256,
                                   moe_token_dispatcher="flex")),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", gpu="gb200", num_gpus=64, pp=2, ep=32,
                                           global_batch_size=256, moe_token_dispatcher="flex")),
    ("verl", None, dict(model="qwen3-30b-a3b", num_gpus=32, tp=2, pp=2, ep=8, global_batch_size=256,
                        moe_token_dispatcher="flex")),
    ("skyrl", None, dict(model="qwen3-30b-a3b", num_gpus=32, tp=2, pp=2, ep=8, global_batch_size=320,
                         moe_token_dispatcher="flex")),
    ("skyrl", "sft", dict(model="qwen3-30b-a3b", gpu="gb200", num_gpus=32, pp=2, ep=16, global_batch_size=128,
                          moe_token_dispatcher="flex")),
    # Pipeline layouts (Megatron-Bridge's DeepSeek-V3 H100 and Kimi-K2 recipes) and the embedding/loss accounting.
    ("megatron-core", None, dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=8, ep=64, etp=1, global_batch_size=8192,
                                 recompute="full", pipeline_layout="Et|(tt|)*30mL")),
    ("megatron-bridge", "run_recipe", dict(model="kimi-k2", num_gpus=1024, tp=2, pp=16, ep=32, etp=1,
                                           global_batch_size=4096, pipeline_layout="Et*4|(t*4|)*14tL")),
    ("megatron-bridge", None, dict(model="llama-3.1-8b", num_gpus=8, pp=2, global_batch_size=64,
                                   account_for_embedding=True, account_for_loss=True)),
    *[(f, None, dict(model="llama-3.1-8b", num_gpus=8, pp=2, global_batch_size=64, account_for_embedding=True,
                     account_for_loss=True)) for f in ("verl", "skyrl")],
    ("verl", "megatron", dict(model="qwen3-235b-a22b", num_gpus=256, tp=4, pp=8, ep=4, global_batch_size=256,
                              account_for_embedding=True, account_for_loss=True)),
    # Megatron's uniform full recompute in chunks of N layers (recompute_method / recompute_num_layers).
    ("megatron-core", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, global_batch_size=512,
                                 recompute="full", recompute_method="uniform", recompute_layers=4)),
    ("verl", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, global_batch_size=512,
                        recompute="full", recompute_method="uniform", recompute_layers=2)),
    # CPU offload: activations, the in-step CPU optimizer (a share), FSDP2 / ZeRO offload, verl's phase offloads.
    ("megatron-core", None, dict(model="qwen3-30b-a3b", num_gpus=16, ep=16, global_batch_size=256,
                                 activation_offload=True, optimizer_offload_fraction=0.5)),
    ("megatron-bridge", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=2, global_batch_size=512,
                                   optimizer_offload=True)),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", num_gpus=16, pp=2, ep=8, global_batch_size=256,
                                           activation_offload=True, optimizer_offload_fraction=0.25)),
    ("verl", None, dict(model="deepseek-v3", gpu="h20", num_gpus=96, tp=8, pp=12, ep=8, etp=1, last_stage_layers=6,
                        global_batch_size=96, recompute="full", param_offload=True, optimizer_offload=True,
                        optimizer_offload_fraction=1.0)),
    ("verl", "fsdp", dict(model="qwen2.5-7b", num_gpus=8, zero_stage=3, global_batch_size=64, param_offload=True,
                          optimizer_offload=True, activation_offload=True)),
    # verl's precision-aware optimizer: bf16 Adam moments and gradient buffer (RL trainer and SFT Megatron engine)
    ("verl", "megatron", dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=256, job="rl",
                              samples_per_prompt=8, algorithm="ppo", optimizer_state_dtype="bf16",
                              grad_reduce_in_fp32=False)),
    ("verl", None, dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=256, optimizer_state_dtype="bf16")),
    ("skyrl", None, dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=320, job="rl",
                         samples_per_prompt=8, optimizer_state_dtype="fp8", grad_reduce_in_fp32=False)),
    ("skyrl", "sft", dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=128, optimizer_state_dtype="bf16",
                          optimizer_offload_fraction=0.5)),
    ("skyrl", None, dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, pp=2, global_batch_size=320, job="rl",
                         samples_per_prompt=8, precision="fp8", fp8_recipe="tensorwise")),
    ("skyrl", None, dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=320, optimizer_offload=False)),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, param_offload=True)),
    # torch.compile (torchtitan --compile.enable / [compile] enable, KempnerForge train.compile_model)
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, torch_compile=True)),
    ("kempnerforge", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, torch_compile=True)),
    ("deepspeed", None, dict(model="llama-3.1-8b", num_gpus=8, zero_stage=3, global_batch_size=64, param_offload=True,
                             optimizer_offload_fraction=0.5, recompute="full", activation_offload=True)),
    # TP communication overlap (Megatron --tp-comm-overlap, Bridge comm_overlap.tp_comm_overlap, torchtitan async TP)
    ("megatron-core", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, global_batch_size=512,
                                 tp_comm_overlap=True)),
    ("megatron-bridge", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, global_batch_size=512,
                                   tp_comm_overlap=True)),
    ("megatron-bridge", "run_recipe", dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, global_batch_size=512,
                                           tp_comm_overlap=True)),
    ("torchtitan", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=512, torch_compile=True,
                              tp_comm_overlap=True)),
    ("torchtitan", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=512, torch_compile=True,
                              tp_comm_overlap=True, framework_version="0.2.2")),
    # Megatron's recompute_modules (selective)
    ("megatron-core", None, dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, global_batch_size=4096,
                                 recompute="selective", recompute_modules=["mla_up_proj", "moe_act"])),
    ("megatron-bridge", None, dict(model="qwen3-30b-a3b", num_gpus=16, pp=2, ep=8, global_batch_size=256,
                                   recompute="selective", recompute_modules=["core_attn", "moe"])),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", num_gpus=16, pp=2, ep=8, global_batch_size=256,
                                           recompute="selective", recompute_modules=["layernorm"])),
    ("verl", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, global_batch_size=512,
                        recompute="selective", recompute_modules=["core_attn", "mlp"])),
    ("skyrl", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, global_batch_size=512,
                         recompute="selective", recompute_modules=["mlp"])),
    # LoRA (meshplan/arithmetic/lora.py): Megatron-Bridge's peft config, verl's and SkyRL's model LoRA fields, both
    # engines.
    ("megatron-bridge", None, dict(model="llama-3.1-70b", num_gpus=8, tp=2, pp=4, vpp=20, global_batch_size=32,
                                   precision="fp8", fp8_recipe="tensorwise", lora_rank=16,
                                   lora_targets=["linear_qkv"])),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", num_gpus=16, pp=2, ep=8, global_batch_size=256,
                                           job="lora")),
    ("verl", None, dict(model="qwen3-30b-a3b", num_gpus=16, tp=2, ep=8, global_batch_size=256, lora_rank=32)),
    ("verl", "fsdp", dict(model="qwen3-8b", num_gpus=8, zero_stage=3, global_batch_size=64, lora_rank=64,
                          lora_targets=["linear_qkv", "linear_proj"])),
    ("skyrl", None, dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=320, lora_rank=16,
                         lora_targets=["linear_qkv", "linear_fc2"])),
    ("skyrl", "fsdp", dict(model="qwen3-8b", num_gpus=8, zero_stage=3, global_batch_size=64, job="lora")),
    ("skyrl", "sft", dict(model="qwen3-8b", num_gpus=8, tp=2, global_batch_size=64, lora_rank=32,
                          lora_targets=["linear_qkv", "linear_proj"])),  # main_sft's model.lora (SFTConfig.model)
    # NeMo AutoModel's recipe YAML: FSDP2 (zero 3), its reshard_after_forward=False (zero 2), DDP (zero 0), PP with
    # interleaving, EP with DeepEP or its torch dispatcher, async TP, compile, fp8, CPU offload, PEFT LoRA.
    ("nemo-automodel", None, dict(model="llama-3.1-70b", num_gpus=64, tp=2, pp=4, vpp=2, global_batch_size=128,
                                  recompute="selective", sequence_parallel=True)),
    ("nemo-automodel", None, dict(model="deepseek-v3", num_gpus=256, ep=64, global_batch_size=256, recompute="full",
                                  moe_token_dispatcher="flex", attention_backend="fused")),
    ("nemo-automodel", None, dict(model="qwen3-30b-a3b", num_gpus=16, pp=2, ep=8, zero_stage=2, global_batch_size=64,
                                  micro_batch_size=2)),
    ("nemo-automodel", None, dict(model="llama-3.1-70b", num_gpus=32, pp=4, global_batch_size=128,
                                  pipeline_microbatches=4)),  # 16 micro-batches: 4 runs of 4
    ("nemo-automodel", None, dict(model="llama-3.1-8b", num_gpus=8, zero_stage=0, global_batch_size=64)),
    ("nemo-automodel", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=512, torch_compile=True,
                                  tp_comm_overlap=True, sequence_parallel=True, precision="fp8", fp8_recipe="rowwise",
                                  fp8_param_gather=True)),
    ("nemo-automodel", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, param_offload=True,
                                  attention_backend="unfused")),
    ("nemo-automodel", None, dict(model="llama-3.1-70b", num_gpus=8, tp=8, global_batch_size=32, lora_rank=16,
                                  lora_targets=["linear_qkv", "linear_fc2"])),
    # hybrid sharding (dp_replicate): each framework's own key, read back
    ("megatron-core", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, dp_replicate=2, global_batch_size=128)),
    ("megatron-core", None, dict(model="qwen3-30b-a3b", num_gpus=32, ep=8, zero_stage=3, dp_replicate=4,
                                 global_batch_size=128)),
    ("megatron-bridge", None, dict(model="llama-3.1-70b", num_gpus=64, tp=4, dp_replicate=2, global_batch_size=128)),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=32, zero_stage=3, dp_replicate=4, global_batch_size=128)),
    ("nemo-automodel", None, dict(model="llama-3.1-8b", num_gpus=32, dp_replicate=4, global_batch_size=128)),
    ("verl", "fsdp", dict(model="llama-3.1-8b", num_gpus=32, zero_stage=3, dp_replicate=4, global_batch_size=128)),
    *[("skyrl", v, dict(model="llama-3.1-8b", num_gpus=32, zero_stage=3, dp_replicate=4, global_batch_size=160,
                        **rl)) for v, rl in (("fsdp", {"job": "rl"}), ("sft-fsdp", {}))],
    # LoRA leaving Llama 4's vision tower out (lora_vision false): PEFT's exclude_modules, read back
    *[(f, v, dict(model="llama-4-scout", num_gpus=64, zero_stage=3, job="lora", lora_vision=False,
                  global_batch_size=256)) for f, v in (("verl", "fsdp"), ("skyrl", "fsdp"))],
    # LoRA on the routed experts' 3D weights (lora_target_parameters): verl's FSDP engine's PEFT target_parameters
    *[("verl", v, dict(model="qwen3-30b-a3b", num_gpus=8, zero_stage=3, job="lora", lora_rank=16, recompute="full",
                       lora_target_parameters=w, global_batch_size=64))
      for v, w in (("fsdp", ["gate_up_proj", "down_proj"]), ("sft-fsdp", ["down_proj"]))],
]


MEGATRON_BACKED = ("megatron-core", "megatron-bridge", "verl", "skyrl")


def _render(framework, variant, fields, **opts):
    job, plan = resolve(Request(framework=framework, **fields))
    return job, plan, render(framework, job, plan, variant=variant, **opts)


@pytest.mark.parametrize("framework,variant,fields", CASES, ids=[f"{c[0]}-{c[1] or 'default'}-{c[2]['model']}"
                                                                   for c in CASES])
def test_round_trip_gives_the_same_plan(framework, variant, fields):
    job, plan, result = _render(framework, variant, fields)
    parsed = parse_plan(framework, result.variant, result.text, job.model.num_layers)
    expected = {**plan.model_dump(), "lora": job.lora.model_dump() if job.lora else None}  # LoRA is the job's
    if result.variant == "megatron-deepspeed" and plan.attention_backend == "auto":
        # Megatron-DeepSpeed's own default (no flash switch: CoreAttention) is not the kernel the estimate's auto
        # times, so its script writes auto out as the switch the estimate runs, which reads back as that backend
        flash, _ = attention_switches(job, convention(job.card, plan.zero_stage)[1], plan)
        expected["attention_backend"] = "flash" if flash else "unfused"
    assert {k: expected[k] for k in parsed} == parsed
    assert ("lora" in parsed) == (job.lora is not None)  # a LoRA job's snippet says so, a full one's does not
    assert {"tp", "micro_batch_size", "zero_stage"} <= set(parsed)
    assert "dp" in parsed or result.format == "python"  # the python form runs inside a launch that sets the GPUs
    if job.model.moe is not None and framework in MEGATRON_BACKED and result.variant not in ("fsdp", "sft-fsdp"):
        assert parsed["moe_token_dispatcher"] == plan.moe_token_dispatcher  # always explicit for MoE


def test_uneven_pipeline_round_trips_for_megatron_family_and_torchtitan():
    fields = dict(model="llama-3.1-405b", num_gpus=1024, tp=8, pp=16, global_batch_size=2048)
    for framework in ("megatron-core", "megatron-bridge", "verl", "skyrl", "torchtitan", "nemo-automodel"):
        job, plan = resolve(Request(framework=framework, **fields))
        plan = plan.model_copy(update={"first_stage_layers": 7, "last_stage_layers": 7})  # 126 = 7 + 14*8 + 7
        result = render(framework, job, plan)
        parsed = parse_plan(framework, result.variant, result.text, job.model.num_layers)
        assert parsed["first_stage_layers"] == 7 and parsed["last_stage_layers"] == 7, framework


@pytest.mark.parametrize("framework,variant", [("megatron-core", None), ("megatron-bridge", None),
                                               ("megatron-bridge", "run_recipe")])
def test_pipeline_layout_and_accounting_round_trip(framework, variant):
    """The layout string (vpp read back from its stages) and the embedding/loss accounting, through render and parse;
    Megatron-Core gets no other virtual-stage flag next to the layout (validate_args allows one of the three)."""
    layout = dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=8, ep=64, etp=1, global_batch_size=8192,
                  recompute="full", pipeline_layout="Et|(tt|)*30mL")
    accounted = dict(model="llama-3.1-8b", num_gpus=8, pp=2, global_batch_size=64, account_for_embedding=True,
                     account_for_loss=True)
    for fields in (layout, accounted):
        job, plan, result = _render(framework, variant, fields)
        parsed = parse_plan(framework, result.variant, result.text, job.model.num_layers)
        assert {k: parsed[k] for k in ("pp", "vpp", "pipeline_layout", "account_for_embedding", "account_for_loss")} \
            == {k: getattr(plan, k) for k in ("pp", "vpp", "pipeline_layout", "account_for_embedding",
                                              "account_for_loss")}
    assert plan.account_for_embedding and plan.account_for_loss
    _, plan, result = _render(framework, variant, layout)
    assert plan.vpp == 4
    if framework == "megatron-core":
        assert "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'" in result.text
        assert "--num-virtual-stages-per-pipeline-rank" not in result.text
        assert "--num-layers-per-virtual-pipeline-stage" not in result.text
    elif variant is None:
        assert "cfg.model.pipeline_model_parallel_layout = 'Et|(tt|)*30mL'" in result.text


@pytest.mark.parametrize("framework", ["torchtitan", "verl", "skyrl", "deepspeed", "kempnerforge"])
def test_frameworks_without_layouts_refuse_them_with_the_nearest_knob(framework):
    fields = dict(model="llama-3.1-8b", num_gpus=8, pp=2, global_batch_size=64, pipeline_layout="Et*16|t*16L")
    with pytest.raises(MeshplanError, match=r"cannot express pipeline_layout='Et\*16\|t\*16L'") as err:
        _render(framework, None, fields)
    assert err.value.fix  # the card's `instead`


def test_megatron_core_never_emits_a_vpp_size_flag():
    _, _, result = _render("megatron-core", None, CASES[0][2])
    assert "--virtual-pipeline-model-parallel-size" not in result.text
    assert "--num-layers-per-virtual-pipeline-stage 4" in result.text  # 80 layers / (pp 4 * vpp 5)


def test_verl_uses_double_plus_for_override_transformer_config_only():
    _, _, result = _render("verl", None, CASES[5][2])
    for token in shell_tokens(result.text):
        if "override_transformer_config" in token:
            assert token.startswith("++"), token
        else:
            assert not token.startswith("+"), token


def test_skyrl_never_uses_a_plus_prefix_and_sft_is_top_level():
    for framework, variant, fields in CASES:
        if framework == "skyrl":
            _, _, result = _render(framework, variant, fields)
            assert not any(t.startswith("+") for t in shell_tokens(result.text))
    _, _, sft = _render("skyrl", "sft", CASES[9][2])
    assert "strategy=megatron" in sft.text and "megatron_config.tensor_model_parallel_size=2" in sft.text
    assert "trainer." not in sft.text


def test_a_training_job_rendered_as_an_rl_launch_says_so():
    """`render skyrl qwen3-8b --job sft` wrote SkyRL's RL entry point (main_base, a derived rollout) and verl's
    main_ppo with no word that they start a rollout engine the training job's estimate leaves out. SkyRL now
    renders its SFT trainer for a training job unless told --variant rl (test_a_skyrl_training_job_renders_main_sft);
    told, it still says so."""
    sft = dict(model="qwen3-8b", num_gpus=16, tp=2, job="sft")
    rl_launch = [w for w in _render("skyrl", "rl", sft)[2].warnings if "an RL run" in w]
    assert len(rl_launch) == 1 and "--variant sft" in rl_launch[0] and "skyrl.train.main_sft" in rl_launch[0]
    assert not any("an RL run" in w for v in ("sft", None) for w in _render("skyrl", v, sft)[2].warnings)
    assert any("verl.trainer.main_ppo" in w and "job=rl" in w for w in _render("verl", "megatron", sft)[2].warnings)
    assert not any("an RL run" in w for w in _render("verl", None, sft)[2].warnings)  # sft-megatron: no rollout
    rl = dict(model="qwen3-8b", num_gpus=8, job="rl")
    assert not any("an RL run" in w for f in ("verl", "skyrl") for w in _render(f, None, rl)[2].warnings)


def test_a_skyrl_training_job_renders_main_sft():
    """`render skyrl` of a training job (SFT, LoRA, pretraining) wrote SkyRL's RL entry point (main_base: a rollout
    engine and, by default, a reference model beside the trainer) with a warning, though SkyRL has an SFT trainer
    (main_sft, variant sft). It is the default now, with that trainer's defaults from the card: main_sft sets
    colocate_all false (sft_config.py build_skyrl_config_for_sft), so offload_after_step never acts
    (worker_dispatch.py) and the optimizer stays on the GPU; an RL job keeps main_base and its offload."""
    sft = dict(model="qwen3-8b", num_gpus=16, tp=2, job="sft")
    job, plan, result = _render("skyrl", None, sft)
    assert result.variant == "sft" and "python -m skyrl.train.main_sft" in result.text
    assert "trainer." not in result.text and not any("an RL run" in w for w in result.warnings)
    assert plan.optimizer_offload is False and not any("optimizer_offload not given" in n for n in job.notes)
    lora = _render("skyrl", None, dict(model="qwen3-8b", num_gpus=8, job="lora", lora_rank=16))[2]
    assert lora.variant == "sft" and "model.lora.rank=16" in lora.text
    with pytest.raises(MeshplanError, match="main_sft"):
        _render("skyrl", None, {**sft, "optimizer_offload": True})
    rl_job, rl_plan, rl = _render("skyrl", None, dict(model="qwen3-8b", num_gpus=8, job="rl"))
    assert rl.variant == "rl" and "skyrl.train.entrypoints.main_base" in rl.text and rl_plan.optimizer_offload
    assert any("optimizer_offload not given: on" in n for n in rl_job.notes)


def test_a_skyrl_zero3_training_job_renders_main_sft_with_fsdp():
    """A ZeRO-3 training job on SkyRL still rendered the RL entry point (main_base with trainer.strategy=fsdp, a rollout
    and a reference model the estimate leaves out), though main_sft runs the FSDP strategy too (SFTConfig.strategy
    "fsdp", fsdp_config, sequence_parallel_size). Variant sft-fsdp is its default now; an RL job keeps fsdp."""
    sft = dict(model="qwen3-8b", num_gpus=8, zero_stage=3, cp=2, job="sft", recompute="full", param_offload=True)
    job, plan, result = _render("skyrl", None, sft)
    assert result.variant == "sft-fsdp" and "python -m skyrl.train.main_sft" in result.text
    assert "trainer." not in result.text and not any("an RL run" in w for w in result.warnings)
    tokens = shell_tokens(result.text)
    assert {"strategy=fsdp", "sequence_parallel_size=2", "fsdp_config.cpu_offload=true"} <= set(tokens)
    parsed = parse_plan("skyrl", result.variant, result.text, job.model.num_layers)
    assert {k: plan.model_dump()[k] for k in parsed} == parsed
    read = api.import_config(result.text, path="run_skyrl_sft-fsdp.sh").request
    assert (read["job"], read["zero_stage"], read["cp"], read["recompute"]) == ("sft", 3, 2, "full")
    with pytest.raises(MeshplanError, match=r"cannot express recompute=none"):  # main_sft has no key to turn it off
        _render("skyrl", None, {**sft, "recompute": "none", "param_offload": False})
    lora = _render("skyrl", None, dict(model="qwen3-8b", num_gpus=8, zero_stage=3, job="lora", lora_rank=16,
                                           recompute="full"))[2]
    assert lora.variant == "sft-fsdp" and "model.lora.rank=16" in lora.text
    assert _render("skyrl", None, dict(model="qwen3-8b", num_gpus=8, zero_stage=3, job="rl"))[2].variant == "fsdp"
    with pytest.raises(MeshplanError, match="param_offload"):  # its optimizer is offloaded in-step with the rest
        _render("skyrl", None, {**sft, "optimizer_offload": True})


@pytest.mark.parametrize("framework,fields,knob", [
    ("torchtitan", dict(model="qwen3-30b-a3b", num_gpus=16, tp=2, ep=8, etp=2), "etp=2"),
    ("torchtitan", dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, moe_token_dispatcher="flex"),
     "moe_token_dispatcher=flex"),
    ("kempnerforge", dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, moe_token_dispatcher="flex"),
     "moe_token_dispatcher=flex"),
    ("deepspeed", dict(model="qwen3-30b-a3b", num_gpus=16, zero_stage=3, moe_token_dispatcher="flex"),
     "moe_token_dispatcher=flex"),
    ("verl", dict(model="qwen3-30b-a3b", num_gpus=16, zero_stage=3, moe_token_dispatcher="flex"),
     "moe_token_dispatcher=flex"),
    ("skyrl", dict(model="qwen3-30b-a3b", num_gpus=16, zero_stage=3, moe_token_dispatcher="flex", recompute="full"),
     "moe_token_dispatcher=flex"),
    ("kempnerforge", dict(model="llama-3.1-70b", num_gpus=32, tp=4, pp=4, vpp=2), "vpp=2"),
    ("deepspeed", dict(model="llama-3.1-8b", num_gpus=16, cp=2), "cp=2"),
    ("verl", dict(model="llama-3.1-8b", num_gpus=16, tp=2, zero_stage=3), "tp=2"),
    ("skyrl", dict(model="llama-3.1-8b", num_gpus=16, zero_stage=2), "zero_stage=2"),
    ("torchtitan", dict(model="llama-3.1-8b", num_gpus=16, zero_stage=1), "zero_stage=1"),
    ("torchtitan", dict(model="llama-3.1-8b", num_gpus=8, optimizer="muon"), "optimizer=muon"),
    ("torchtitan", dict(model="llama-3.1-8b", num_gpus=8, recompute="selective", recompute_modules=["mlp"]),
     "recompute_modules=['mlp']"),
    ("deepspeed", dict(model="llama-3.1-8b", num_gpus=8, recompute="full", recompute_method="uniform",
                       recompute_layers=2), "recompute_layers=2"),
    ("torchtitan", dict(model="llama-3.1-8b", num_gpus=8, recompute="full", recompute_method="uniform",
                        recompute_layers=2), "recompute_layers=2"),
])
def test_a_knob_the_framework_lacks_is_refused_with_what_to_use_instead(framework, fields, knob):
    job, plan = resolve(Request(framework=framework, **fields))
    with pytest.raises(MeshplanError) as exc:
        render(framework, job, plan)
    assert knob in exc.value.reason and exc.value.fix


def test_framework_rules_are_refused():
    job, plan = resolve(Request(framework="kempnerforge", model="mixtral-8x7b", num_gpus=32, pp=2, ep=2))
    with pytest.raises(MeshplanError, match="MoE"):
        render("kempnerforge", job, plan)
    job, plan = resolve(Request(framework="deepspeed", model="llama-3.1-70b", num_gpus=64, pp=4, zero_stage=3))
    with pytest.raises(MeshplanError, match="ZeRO stage 0 or 1"):
        render("deepspeed", job, plan)


def test_unknown_framework_variant_and_version_are_clear_errors():
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=8))
    with pytest.raises(MeshplanError, match="nanotron"):
        render("nanotron", job, plan)
    with pytest.raises(MeshplanError, match="Variants"):
        render("verl", job, plan, variant="nope")
    with pytest.raises(MeshplanError, match=r"0\.3\.0"):
        render("torchtitan", job, plan, version="9.9")


def test_torchtitan_version_prefix_selects_the_toml_form():
    _, _, result = _render("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2), version="0.2")
    assert result.version == "0.2.2" and result.format == "toml" and "[parallelism]" in result.text


def test_torch_compile_renders_and_parses_on_both_torchtitan_forms_and_kempnerforge():
    """torchtitan 0.3.0 --compile.enable, 0.2.2 [compile] enable; KempnerForge writes compile_model either way (its
    TrainConfig defaults to true, so an eager plan must say false)."""
    fields = dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64)
    for compile_on in (True, False):
        for version, needle in (("0.3", "--compile.enable"), ("0.2", "[compile]")):
            _, _, result = _render("torchtitan", None, dict(fields, torch_compile=compile_on), version=version)
            assert (needle in result.text) is compile_on
            assert parse_plan("torchtitan", result.variant, result.text, 32)["torch_compile"] is compile_on
        _, _, result = _render("kempnerforge", None, dict(fields, torch_compile=compile_on))
        assert f"compile_model = {str(compile_on).lower()}" in result.text
        assert parse_plan("kempnerforge", result.variant, result.text, 32)["torch_compile"] is compile_on


def test_every_framework_with_an_adapter_card_section_has_a_builder_and_no_other():
    from meshplan.adapters.render import BUILDERS

    assert set(TARGETS) == set(BUILDERS) and "nanotron" not in TARGETS


def test_every_card_knob_with_a_key_is_exercised_and_missing_ones_say_instead():
    for framework in TARGETS:
        section = adapter_section(framework_card(framework))
        for version in section.versions:
            for variant in section.variants:
                table = knob_table(framework_card(framework), version, variant)
                assert set(table) == set(KNOBS)
                assert all(k.key or k.instead for k in table.values())


def _lines(text: str, word: str) -> list[str]:
    return [line.strip().rstrip(" \\") for line in text.splitlines() if word in line]


def test_megatron_core_renders_the_dispatcher_and_picks_the_flex_backend_by_nvlink_domain():
    _, _, alltoall = _render("megatron-core", None, GOLDEN_CASES["qwen3-30b-a3b_16xh100"])
    assert _lines(alltoall.text, "dispatcher") == ["--moe-token-dispatcher-type alltoall"]  # not Megatron's allgather
    _, _, h100 = _render("megatron-core", None, dict(model="qwen3-30b-a3b", num_gpus=32, ep=16,
                                                     moe_token_dispatcher="flex"))
    assert _lines(h100.text, "dispatcher") == ["--moe-token-dispatcher-type flex",
                                               "--moe-flex-dispatcher-backend deepep"]
    assert any("DeepEP" in n and "installed" in n for n in h100.notes)
    job, _, gb200 = _render("megatron-core", None, dict(model="qwen3-30b-a3b", gpu="gb200", num_gpus=32, ep=16,
                                                        moe_token_dispatcher="flex"))
    assert job.gpu.nvlink_domain == 72 and job.gpus_per_node == 4
    assert _lines(gb200.text, "dispatcher") == ["--moe-token-dispatcher-type flex",
                                                "--moe-flex-dispatcher-backend hybridep"]
    assert any("hybridep" in n and "HybridEP" in n and "72 GPUs" in n for n in gb200.notes)
    # A node of its own NVLink domain (gpus_per_node = nvlink_domain = 72) is DeepEP's case again.
    _, _, one_domain = _render("megatron-core", None, dict(model="qwen3-30b-a3b", gpu="gb200", gpus_per_node=72,
                                                           num_gpus=144, ep=16, moe_token_dispatcher="flex"))
    assert "--moe-flex-dispatcher-backend deepep" in _lines(one_domain.text, "dispatcher")


def test_megatron_bridge_renders_the_dispatcher_like_its_own_flex_helper():
    _, _, alltoall = _render("megatron-bridge", None, GOLDEN_CASES["qwen3-30b-a3b_16xh100"])
    assert _lines(alltoall.text, "dispatcher") == ["cfg.model.moe_token_dispatcher_type = 'alltoall'"]
    assert "moe_shared_expert_overlap" not in alltoall.text
    for gpu, backend in (("h100", "deepep"), ("gb200", "hybridep")):
        _, _, flex = _render("megatron-bridge", None, dict(model="qwen3-30b-a3b", gpu=gpu, num_gpus=32, ep=16,
                                                           moe_token_dispatcher="flex"))
        assert _lines(flex.text, "model.moe_") == ["cfg.model.moe_token_dispatcher_type = 'flex'",
                                                    f"cfg.model.moe_flex_dispatcher_backend = {backend!r}",
                                                    "cfg.model.moe_shared_expert_overlap = False"]
        _, _, recipe = _render("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", gpu=gpu, num_gpus=32,
                                                                     ep=16, moe_token_dispatcher="flex"))
        assert f"model.moe_flex_dispatcher_backend={backend}" in _lines(recipe.text, "backend")


def test_rl_frameworks_render_the_dispatcher_through_megatron_fields():
    flex = dict(model="qwen3-30b-a3b", num_gpus=32, ep=16, moe_token_dispatcher="flex")
    _, _, verl = _render("verl", "megatron", flex)
    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"):
        p = f"++{role}.megatron.override_transformer_config."
        assert {p + "moe_token_dispatcher_type=flex", p + "moe_flex_dispatcher_backend=deepep"} <= set(
            shell_tokens(verl.text))
    _, _, sft = _render("verl", None, flex)  # a training job: the SFT trainer's Megatron engine (sft-megatron)
    p = "++engine.override_transformer_config."
    assert sft.variant == "sft-megatron" and {p + "moe_token_dispatcher_type=flex",
                                              p + "moe_flex_dispatcher_backend=deepep"} <= set(shell_tokens(sft.text))
    _, _, skyrl = _render("skyrl", "rl", dict(model="qwen3-30b-a3b", gpu="gb200", num_gpus=32, ep=16,
                                              global_batch_size=320, moe_token_dispatcher="flex"))
    tokens = set(shell_tokens(skyrl.text))
    for role in ("trainer.policy", "trainer.ref"):
        assert {f"{role}.megatron_config.moe_token_dispatcher_type=flex",
                f"{role}.megatron_config.transformer_config_kwargs.moe_flex_dispatcher_backend=hybridep"} <= tokens


def test_dense_models_render_no_dispatcher_even_when_flex_is_asked():
    for framework in ("megatron-core", "megatron-bridge", "verl", "skyrl", "torchtitan", "kempnerforge"):
        job, plan, result = _render(framework, None, dict(model="llama-3.1-8b", num_gpus=16, tp=2,
                                                          zero_stage=3 if framework in ("torchtitan", "kempnerforge")
                                                          else 1, moe_token_dispatcher="flex"))
        assert "moe_flex_dispatcher" not in knobs_in_use(job, plan)
        assert "dispatcher" not in result.text and "comm_backend" not in result.text, framework
        assert "moe_token_dispatcher" not in parse_plan(framework, result.variant, result.text, 32)


def test_flex_without_expert_parallelism_is_refused():
    job, plan = resolve(Request(framework="megatron-core", model="qwen3-30b-a3b", num_gpus=16,
                                moe_token_dispatcher="flex"))
    assert plan.ep == plan.etp == 1
    with pytest.raises(MeshplanError, match="ep=1 and etp=1") as exc:
        render("megatron-core", job, plan)
    assert "alltoall" in exc.value.fix


def test_torchtitan_0_2_renders_deepep_only_where_its_model_code_reads_it():
    fields = dict(model="deepseek-v3", num_gpus=256, pp=8, ep=32, global_batch_size=1024,
                  first_stage_layers=5, last_stage_layers=8)  # 61 = 5 + 6*8 + 8
    job, plan, result = _render("torchtitan", None, {**fields, "moe_token_dispatcher": "flex"}, version="0.2")
    assert 'expert_parallel_comm_backend = "deepep"' in result.text
    assert parse_plan("torchtitan", result.variant, result.text, 61)["moe_token_dispatcher"] == "flex"
    _, _, standard = _render("torchtitan", None, fields, version="0.2")
    assert 'expert_parallel_comm_backend = "standard"' in standard.text
    refusals = {"qwen3": dict(model="qwen3-30b-a3b", num_gpus=16, ep=8),  # qwen3's parallelize ignores the key
                "HybridEP": {**fields, "gpu": "gb200"},
                "etp": {**fields, "ep": 16, "etp": 2}}
    for reason, case in refusals.items():
        job, plan = resolve(Request(framework="torchtitan", moe_token_dispatcher="flex", **case))
        with pytest.raises(MeshplanError, match=reason):
            render("torchtitan", job, plan, version="0.2")


def test_torchtitan_every_nth_selective_renders_on_0_2_and_is_refused_elsewhere():
    """selective_ac_option N (every N-th block fully checkpointed) is torchtitan 0.2.x's; it round-trips through the
    0.2.2 TOML, 0.3.0 (op-level SAC only) and the Megatron family refuse it naming their nearest knob, and "op"
    renders as 0.3.0's plain selective."""
    fields = dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, recompute="selective",
                  selective_ac_option="2")
    job, plan, result = _render("torchtitan", None, fields, version="0.2")
    assert 'selective_ac_option = "2"' in result.text
    assert parse_plan("torchtitan", result.variant, result.text, 32)["selective_ac_option"] == "2"
    assert "selective_ac_option" not in parse_plan(
        "torchtitan", result.variant, _render("torchtitan", None, {**fields, "selective_ac_option": "op"},
                                              version="0.2")[2].text, 32)
    with pytest.raises(MeshplanError, match="selective_ac_option=2") as exc:
        render("torchtitan", job, plan)
    assert "version 0.2.2" in exc.value.fix
    op = _render("torchtitan", None, {**fields, "selective_ac_option": "op"})[2]
    assert "activation-checkpoint:selective" in op.text
    job, plan = resolve(Request(framework="megatron-core", **fields))
    with pytest.raises(MeshplanError, match="selective_ac_option=2") as exc:
        render("megatron-core", job, plan)
    assert "recompute_layers" in exc.value.fix


def test_knobs_in_use_reflect_the_plan():
    job, plan = resolve(Request(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, recompute="full",
                                recompute_layers=1, precision="fp8"))
    used = set(knobs_in_use(job, plan))
    assert {"tp", "pp", "ep", "sequence_parallel", "recompute_full", "recompute_layers", "fp8", "zero_1"} <= used
    assert not {"cp", "vpp", "etp", "uneven_pp", "moe_flex_dispatcher"} & used
    flex = plan.model_copy(update={"moe_token_dispatcher": "flex"})
    assert "moe_flex_dispatcher" in knobs_in_use(job, flex)


# --------------------------------------------------------------------------- safety


HOSTILE = ["x; rm -rf ~", "$(touch pwned)", "`touch pwned`", "a'b\"c", "x\nrm -rf ~", "x && touch pwned"]


def _read_back(value: str) -> str:
    """An override value as verl's Hydra or SkyRL's OmegaConf.from_cli reads it, for values without backslashes
    (tests/test_adapters_frameworks.py checks the general case against the real readers)."""
    if value.startswith('"'):
        return json.loads(value)  # SkyRL: a JSON string is a YAML scalar
    if value.startswith("'"):
        return value[1:-1].replace("\\'", "'")  # Hydra: a quote inside quotes is escaped with a backslash
    return value


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("framework", ["megatron-core", "verl", "skyrl", "torchtitan", "deepspeed",
                                       "megatron-bridge"])
def test_a_hostile_model_name_cannot_inject_a_command(framework, name, tmp_path):
    job, plan = resolve(Request(framework=framework, model="llama-3.1-8b", num_gpus=8, tp=2))
    arch = job.model.model_copy(update={"name": name, "hf_id": name, "key": None})
    job = job.model_copy(update={"model": arch})
    variant = {"deepspeed": "megatron-deepspeed", "megatron-bridge": "run_recipe"}.get(framework)
    result = render(framework, job, plan, variant=variant)
    if result.format == "python":
        compile(result.text, "layout.py", "exec")
        return
    # The name only ever appears as one whole shell word (or inside a comment line).
    tokens = shell_tokens(result.text)
    assert not any(t in ("rm", "touch", "&&", ";") for t in tokens)
    if framework in ("verl", "skyrl"):  # and the framework reads the name back whole
        paths = [t.split("=", 1)[1] for t in tokens if t.split("=", 1)[0].endswith("model.path")]
        assert paths and all(_read_back(value) == name for value in paths), paths
    # Run it with every external command replaced by a no-op: nothing may be created.
    stub = tmp_path / "bin"
    stub.mkdir()
    for cmd in ("torchrun", "python", "python3"):
        (stub / cmd).write_text("#!/bin/sh\nexit 0\n")
        (stub / cmd).chmod(0o755)
    script = tmp_path / "run.sh"
    script.write_text(result.text)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "RECIPE": "recipe",
           "TORCHTITAN_MODULE": "llama3", "TORCHTITAN_CONFIG": "llama3_8b"}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "pwned").exists() and not list(tmp_path.glob("home*"))


def test_shell_values_are_quoted_with_shlex():
    job, plan = resolve(Request(framework="verl", model="llama-3.1-8b", num_gpus=8, tp=2))
    job = job.model_copy(update={"model": job.model.model_copy(update={"hf_id": "org/model with space"})})
    text = render("verl", job, plan).text
    assert shlex.quote("model.path='org/model with space'") in text  # the SFT trainer's (sft-megatron)


# --------------------------------------------------------------------------- golden files

GOLDEN_CASES = {
    "llama-3.1-70b_64xh100": dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, vpp=5, cp=2,
                                  global_batch_size=512, recompute="selective"),
    "qwen3-30b-a3b_16xh100": dict(model="qwen3-30b-a3b", num_gpus=16, tp=1, pp=2, ep=8, global_batch_size=256),
    "deepseek-v3_1024xh100": dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1,
                                  global_batch_size=4096, recompute="full", recompute_layers=1,
                                  first_stage_layers=4, last_stage_layers=1),  # 61 = 4 + 14*4 + 1
}
# Per framework the layout it can express (KempnerForge: MoE needs pp=1 and EP takes its own ranks; SkyRL: no vpp).
GOLDEN_OVERRIDES = {
    ("kempnerforge", "llama-3.1-70b_64xh100"): dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4,
                                                   global_batch_size=512, recompute="full"),
    ("kempnerforge", "qwen3-30b-a3b_16xh100"): dict(model="qwen3-30b-a3b", num_gpus=16, tp=1, ep=8,
                                                   global_batch_size=256),
    ("kempnerforge", "deepseek-v3_1024xh100"): dict(model="deepseek-v3", num_gpus=1024, tp=8, ep=64,
                                                   global_batch_size=4096, recompute="full"),
    ("skyrl", "llama-3.1-70b_64xh100"): dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, cp=2,
                                            global_batch_size=512, recompute="selective"),  # no virtual stages
    ("torchtitan", "llama-3.1-70b_64xh100"): dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, vpp=2,
                                                 global_batch_size=512, recompute="selective"),
    ("torchtitan", "deepseek-v3_1024xh100"): dict(model="deepseek-v3", num_gpus=1024, pp=16, ep=64,
                                                 global_batch_size=4096, recompute="full",
                                                 first_stage_layers=4, last_stage_layers=1),
    ("deepspeed", "llama-3.1-70b_64xh100"): dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4,
                                                global_batch_size=512, recompute="full"),
    ("deepspeed", "qwen3-30b-a3b_16xh100"): dict(model="qwen3-30b-a3b", num_gpus=16, zero_stage=3,
                                                global_batch_size=256),
    ("deepspeed", "deepseek-v3_1024xh100"): dict(model="deepseek-v3", num_gpus=1024, tp=8, pp=16,
                                                global_batch_size=4096, recompute="full"),
    ("nemo-automodel", "llama-3.1-70b_64xh100"): dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, vpp=5, cp=2,
                                                     global_batch_size=512, recompute="selective",
                                                     sequence_parallel=True),
    ("nemo-automodel", "qwen3-30b-a3b_16xh100"): dict(model="qwen3-30b-a3b", num_gpus=16, tp=1, pp=2, ep=8,
                                                     global_batch_size=256, moe_token_dispatcher="flex"),
    ("nemo-automodel", "deepseek-v3_1024xh100"): dict(model="deepseek-v3", num_gpus=1024, pp=16, ep=64,
                                                     global_batch_size=4096, recompute="full",
                                                     moe_token_dispatcher="flex",
                                                     first_stage_layers=4, last_stage_layers=1),
}


def golden_job_plan(framework: str, case: str):
    """The (job, plan) of one golden case for one framework (its override, if any)."""
    fields = GOLDEN_OVERRIDES.get((framework, case), GOLDEN_CASES[case])
    return resolve(Request(framework=framework, **fields))


def golden_renderings():
    for framework in TARGETS:
        for case in GOLDEN_CASES:
            result = render(framework, *golden_job_plan(framework, case))
            suffix = {"python": "py", "shell": "sh", "hydra": "sh"}.get(result.format, result.format)
            yield GOLDEN / f"{framework}__{case}.{suffix}", result


def test_golden_files_match():
    """Regenerate with MESHPLAN_REGEN_GOLDEN=1 python -m pytest tests/test_adapters.py -k golden."""
    regen = os.environ.get("MESHPLAN_REGEN_GOLDEN") == "1"
    seen = set()
    for path, result in golden_renderings():
        seen.add(path.name)
        if regen:
            path.write_text(result.text)
        assert path.exists(), f"missing golden file {path.name} (run with MESHPLAN_REGEN_GOLDEN=1)"
        assert path.read_text() == result.text, f"{path.name} changed; review and regenerate"
    assert len(seen) == 3 * len(TARGETS)


def test_cli_render_prints_the_snippet_and_json(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "render", "torchtitan", "llama-3.1-8b",
                           "--num-gpus", "8", "--tp", "2", "--json"], capture_output=True, text=True, cwd=tmp_path,
                          env=tree_env())
    assert proc.returncode == 0, proc.stderr
    assert '"framework": "torchtitan"' in proc.stdout and "--parallelism.tensor_parallel_degree 2" in proc.stdout
    etp = [sys.executable, "-m", "meshplan.faces.cli", "render", "torchtitan", "--model", "qwen3-30b-a3b",
           "--num-gpus", "16",
           "--ep", "8", "--etp", "2"]
    # the rules refuse it first (TT001): exit 1
    proc = subprocess.run(etp, capture_output=True, text=True, env=tree_env())
    assert proc.returncode == 1 and "TT001" in proc.stderr and "expert_tensor_parallel_degree" in proc.stderr
    # then the adapter has no such knob
    proc = subprocess.run([*etp, "--force"], capture_output=True, text=True, env=tree_env())
    assert proc.returncode == 2 and "expert_tensor_parallel_degree" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("framework", "launch"), [
    ("megatron-core", ["--nnodes 3 --nproc-per-node 4"]),
    ("deepspeed", ["--nnodes 3 --nproc-per-node 4"]),
    ("torchtitan", ["--nnodes 3 --nproc-per-node 4"]),
    ("verl", ["--nnodes=3 --nproc_per_node=4"]),  # sft_trainer: a training job
    ("skyrl", ["placement.num_nodes=3", "placement.num_gpus_per_node=4"]),  # main_sft: a training job
    ("nemo-automodel", ["--nproc-per-node 4` on 3 nodes"]),
])
def test_a_count_filling_no_whole_node_launches_as_the_jobs_nodes(framework, launch):
    """12 GPUs of 8-GPU nodes run as 3 nodes x 4 on every framework (before: refused, 'do not fill whole 8-GPU
    nodes'); the request's own gpus_per_node=8 is still refused."""
    request = Request(model="llama-3.1-8b", gpu="h100", num_gpus=12, tp=2, framework=framework)
    job, plan = resolve(request)
    result = render(framework, job, plan)
    text = result.text + " ".join(result.notes)
    assert all(words in text for words in launch), text
    with pytest.raises(MeshplanError, match="whole 8-GPU nodes"):  # refused as the request resolves, on every face
        resolve(request.model_copy(update={"gpus_per_node": 8}))
