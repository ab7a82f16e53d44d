#!/usr/bin/env bash
# Qwen3-30B-A3B on 16 x NVIDIA H100 SXM5 80GB: TP1 PP2 EP8 DP8 (verl 0.9.1, SFT trainer, rendered by meshplan)
set -euo pipefail
torchrun --nnodes=2 --nproc_per_node=8 -m verl.trainer.sft_trainer \
  engine=megatron \
  optim=megatron \
  model.path=Qwen/Qwen3-30B-A3B \
  engine.tensor_model_parallel_size=1 \
  engine.pipeline_model_parallel_size=2 \
  engine.virtual_pipeline_model_parallel_size=null \
  engine.context_parallel_size=1 \
  engine.expert_model_parallel_size=8 \
  engine.expert_tensor_parallel_size=1 \
  engine.sequence_parallel=false \
  engine.use_distributed_optimizer=true \
  data.train_batch_size=256 \
  data.micro_batch_size_per_gpu=1 \
  data.use_dynamic_bsz=false \
  data.max_length=4096 \
  ++engine.override_transformer_config.recompute_granularity=null \
  ++engine.override_transformer_config.recompute_method=null \
  ++engine.override_transformer_config.recompute_num_layers=null \
  ++engine.override_transformer_config.moe_token_dispatcher_type=alltoall
