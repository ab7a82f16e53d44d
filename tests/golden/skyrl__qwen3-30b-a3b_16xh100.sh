#!/usr/bin/env bash
# Qwen3-30B-A3B on 16 x NVIDIA H100 SXM5 80GB: TP1 PP2 EP8 DP8 (SkyRL 0.4.0, rl, rendered by meshplan)
set -euo pipefail
python -m skyrl.train.entrypoints.main_base \
  trainer.strategy=megatron \
  trainer.policy.model.path=Qwen/Qwen3-30B-A3B \
  trainer.placement.colocate_all=true \
  trainer.placement.policy_num_nodes=2 \
  trainer.placement.policy_num_gpus_per_node=8 \
  trainer.placement.ref_num_nodes=2 \
  trainer.placement.ref_num_gpus_per_node=8 \
  trainer.train_batch_size=32 \
  trainer.policy_mini_batch_size=32 \
  generator.n_samples_per_prompt=8 \
  trainer.micro_train_batch_size_per_gpu=1 \
  trainer.micro_forward_batch_size_per_gpu=1 \
  generator.inference_engine.tensor_parallel_size=2 \
  generator.inference_engine.num_engines=8 \
  trainer.policy.megatron_config.tensor_model_parallel_size=1 \
  trainer.policy.megatron_config.pipeline_model_parallel_size=2 \
  trainer.policy.megatron_config.context_parallel_size=1 \
  trainer.policy.megatron_config.expert_model_parallel_size=8 \
  trainer.policy.megatron_config.expert_tensor_parallel_size=1 \
  trainer.policy.megatron_config.moe_token_dispatcher_type=alltoall \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity=null \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_method=null \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_num_layers=null \
  trainer.ref.megatron_config.tensor_model_parallel_size=1 \
  trainer.ref.megatron_config.pipeline_model_parallel_size=2 \
  trainer.ref.megatron_config.context_parallel_size=1 \
  trainer.ref.megatron_config.expert_model_parallel_size=8 \
  trainer.ref.megatron_config.expert_tensor_parallel_size=1 \
  trainer.ref.megatron_config.moe_token_dispatcher_type=alltoall \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_granularity=null \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_method=null \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_num_layers=null
