#!/usr/bin/env bash
# DeepSeek-V3 on 1024 x NVIDIA H100 SXM5 80GB: TP2 PP16 EP64 DP32 (verl 0.9.1, SFT trainer, rendered by meshplan)
set -euo pipefail
torchrun --nnodes=128 --nproc_per_node=8 -m verl.trainer.sft_trainer \
  engine=megatron \
  optim=megatron \
  model.path=deepseek-ai/DeepSeek-V3 \
  engine.tensor_model_parallel_size=2 \
  engine.pipeline_model_parallel_size=16 \
  engine.virtual_pipeline_model_parallel_size=null \
  engine.context_parallel_size=1 \
  engine.expert_model_parallel_size=64 \
  engine.expert_tensor_parallel_size=1 \
  engine.sequence_parallel=true \
  engine.use_distributed_optimizer=true \
  data.train_batch_size=4096 \
  data.micro_batch_size_per_gpu=1 \
  data.use_dynamic_bsz=false \
  data.max_length=4096 \
  ++engine.override_transformer_config.recompute_granularity=full \
  ++engine.override_transformer_config.recompute_method=block \
  ++engine.override_transformer_config.recompute_num_layers=1 \
  ++engine.override_transformer_config.num_layers_in_first_pipeline_stage=4 \
  ++engine.override_transformer_config.num_layers_in_last_pipeline_stage=1 \
  ++engine.override_transformer_config.attention_backend=fused \
  ++engine.override_transformer_config.moe_token_dispatcher_type=alltoall
