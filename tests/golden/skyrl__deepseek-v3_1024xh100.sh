#!/usr/bin/env bash
# DeepSeek-V3 on 1024 x NVIDIA H100 SXM5 80GB: TP2 PP16 EP64 DP32 (SkyRL 0.4.0, rl, rendered by meshplan)
set -euo pipefail
python -m skyrl.train.entrypoints.main_base \
  trainer.strategy=megatron \
  trainer.policy.model.path=deepseek-ai/DeepSeek-V3 \
  trainer.placement.colocate_all=true \
  trainer.placement.policy_num_nodes=128 \
  trainer.placement.policy_num_gpus_per_node=8 \
  trainer.placement.ref_num_nodes=128 \
  trainer.placement.ref_num_gpus_per_node=8 \
  trainer.train_batch_size=512 \
  trainer.policy_mini_batch_size=512 \
  generator.n_samples_per_prompt=8 \
  trainer.micro_train_batch_size_per_gpu=1 \
  trainer.micro_forward_batch_size_per_gpu=1 \
  generator.inference_engine.tensor_parallel_size=8 \
  generator.inference_engine.num_engines=128 \
  trainer.policy.megatron_config.tensor_model_parallel_size=2 \
  trainer.policy.megatron_config.pipeline_model_parallel_size=16 \
  trainer.policy.megatron_config.context_parallel_size=1 \
  trainer.policy.megatron_config.expert_model_parallel_size=64 \
  trainer.policy.megatron_config.expert_tensor_parallel_size=1 \
  trainer.policy.megatron_config.moe_token_dispatcher_type=alltoall \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity=full \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_method=block \
  trainer.policy.megatron_config.transformer_config_kwargs.recompute_num_layers=1 \
  trainer.policy.megatron_config.transformer_config_kwargs.num_layers_in_first_pipeline_stage=4 \
  trainer.policy.megatron_config.transformer_config_kwargs.num_layers_in_last_pipeline_stage=1 \
  trainer.ref.megatron_config.tensor_model_parallel_size=2 \
  trainer.ref.megatron_config.pipeline_model_parallel_size=16 \
  trainer.ref.megatron_config.context_parallel_size=1 \
  trainer.ref.megatron_config.expert_model_parallel_size=64 \
  trainer.ref.megatron_config.expert_tensor_parallel_size=1 \
  trainer.ref.megatron_config.moe_token_dispatcher_type=alltoall \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_granularity=full \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_method=block \
  trainer.ref.megatron_config.transformer_config_kwargs.recompute_num_layers=1 \
  trainer.ref.megatron_config.transformer_config_kwargs.num_layers_in_first_pipeline_stage=4 \
  trainer.ref.megatron_config.transformer_config_kwargs.num_layers_in_last_pipeline_stage=1
