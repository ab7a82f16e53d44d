#!/usr/bin/env bash
# Llama-3.1-70B on 64 x NVIDIA H100 SXM5 80GB: TP4 PP4 CP2 DP2 (SkyRL 0.4.0, sft, rendered by meshplan)
set -euo pipefail
python -m skyrl.train.main_sft \
  strategy=megatron \
  model.path=meta-llama/Llama-3.1-70B \
  placement.num_nodes=8 \
  placement.num_gpus_per_node=8 \
  batch_size=512 \
  micro_train_batch_size_per_gpu=1 \
  max_length=4096 \
  megatron_config.tensor_model_parallel_size=4 \
  megatron_config.pipeline_model_parallel_size=4 \
  megatron_config.context_parallel_size=2 \
  megatron_config.expert_model_parallel_size=1 \
  megatron_config.expert_tensor_parallel_size=1 \
  megatron_config.transformer_config_kwargs.recompute_granularity=selective \
  megatron_config.transformer_config_kwargs.recompute_method=null \
  megatron_config.transformer_config_kwargs.recompute_num_layers=null \
  megatron_config.transformer_config_kwargs.cp_comm_type=p2p \
  remove_microbatch_padding=true
