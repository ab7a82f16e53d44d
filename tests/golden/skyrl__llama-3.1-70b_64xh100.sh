#!/usr/bin/env bash
# Llama-3.1-70B on 64 x NVIDIA H100 SXM5 80GB: TP4 PP4 CP2 DP2 (SkyRL 0.4.0, rl, rendered by meshplan)
set -euo pipefail
python -m skyrl.train.entrypoints.main_base \
  trainer.strategy=megatron \
  trainer.policy.model.path=meta-llama/Llama-3.1-70B \
  trainer.placement.colocate_all=true \
  trainer.placement.policy_num_nodes=8 \
  trainer.placement.policy_num_gpus_per_node=8 \
  trainer.placement.ref_num_nodes=8 \
  trainer.placement.ref_num_gpus_per_node=8 \
  trainer.train_batch_size=64 \
  trainer.policy_mini_batch_size=64 \
  generator.n_samples_per_prompt=8 \
  trainer.micro_train_batch_size_per_gpu=1 \
  trainer.micro_forward_batch_size_per_gpu=1 \
  generator.inference_engine.tensor_parallel_size=4 \
  generator.inference_engine.num_engines=16 \
  trainer.policy.megatron_config.tensor_model_parallel_size=4 \
  trainer.policy.megatron_config.pipeline_model_parallel_size=4 \
  trainer.policy.megatron_config.context_parallel_size=2 \
  trainer.policy.megatron_config.expert_model_parallel_size=1 \
  trainer.policy.megatron_config.expert_tensor_parallel_size=1 \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity=selective \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_method=null \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_num_layers=null \
  trainer.policy.megatron_config.transformer_config_kwargs.cp_comm_type=p2p \
  trainer.ref.megatron_config.tensor_model_parallel_size=4 \
  trainer.ref.megatron_config.pipeline_model_parallel_size=4 \
  trainer.ref.megatron_config.context_parallel_size=2 \
  trainer.ref.megatron_config.expert_model_parallel_size=1 \
  trainer.ref.megatron_config.expert_tensor_parallel_size=1 \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_granularity=selective \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_method=null \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_num_layers=null \
  trainer.ref.megatron_config.transformer_config_kwargs.cp_comm_type=p2p \
  trainer.remove_microbatch_padding=true
