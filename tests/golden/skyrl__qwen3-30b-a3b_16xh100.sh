#!/usr/bin/env bash
# Qwen3-30B-A3B on 16 x NVIDIA H100 SXM5 80GB: TP1 PP2 EP8 DP8 (SkyRL 0.4.0, sft, rendered by meshplan)
set -euo pipefail
python -m skyrl.train.main_sft \
  strategy=megatron \
  model.path=Qwen/Qwen3-30B-A3B \
  placement.num_nodes=2 \
  placement.num_gpus_per_node=8 \
  batch_size=256 \
  micro_train_batch_size_per_gpu=1 \
  max_length=4096 \
  megatron_config.tensor_model_parallel_size=1 \
  megatron_config.pipeline_model_parallel_size=2 \
  megatron_config.context_parallel_size=1 \
  megatron_config.expert_model_parallel_size=8 \
  megatron_config.expert_tensor_parallel_size=1 \
  megatron_config.moe_token_dispatcher_type=alltoall \
  megatron_config.transformer_config_kwargs.recompute_granularity=null \
  megatron_config.transformer_config_kwargs.recompute_method=null \
  megatron_config.transformer_config_kwargs.recompute_num_layers=null
