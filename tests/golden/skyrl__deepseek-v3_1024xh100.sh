#!/usr/bin/env bash
# DeepSeek-V3 on 1024 x NVIDIA H100 SXM5 80GB: TP2 PP16 EP64 DP32 (SkyRL 0.4.0, sft, rendered by meshplan)
set -euo pipefail
python -m skyrl.train.main_sft \
  strategy=megatron \
  model.path=deepseek-ai/DeepSeek-V3 \
  placement.num_nodes=128 \
  placement.num_gpus_per_node=8 \
  batch_size=4096 \
  micro_train_batch_size_per_gpu=1 \
  max_length=4096 \
  megatron_config.tensor_model_parallel_size=2 \
  megatron_config.pipeline_model_parallel_size=16 \
  megatron_config.context_parallel_size=1 \
  megatron_config.expert_model_parallel_size=64 \
  megatron_config.expert_tensor_parallel_size=1 \
  megatron_config.moe_token_dispatcher_type=alltoall \
  megatron_config.transformer_config_kwargs.recompute_granularity=full \
  megatron_config.transformer_config_kwargs.recompute_method=block \
  megatron_config.transformer_config_kwargs.recompute_num_layers=1 \
  megatron_config.transformer_config_kwargs.num_layers_in_first_pipeline_stage=4 \
  megatron_config.transformer_config_kwargs.num_layers_in_last_pipeline_stage=1
