#!/usr/bin/env bash
# Llama-3.1-70B on 64 x NVIDIA H100 SXM5 80GB: TP4 PP4 VPP5 CP2 DP2 (verl 0.9.1, SFT trainer, rendered by meshplan)
set -euo pipefail
torchrun --nnodes=8 --nproc_per_node=8 -m verl.trainer.sft_trainer \
  engine=megatron \
  optim=megatron \
  model.path=meta-llama/Llama-3.1-70B \
  engine.tensor_model_parallel_size=4 \
  engine.pipeline_model_parallel_size=4 \
  engine.virtual_pipeline_model_parallel_size=5 \
  engine.context_parallel_size=2 \
  engine.expert_model_parallel_size=1 \
  engine.expert_tensor_parallel_size=1 \
  engine.sequence_parallel=true \
  engine.use_distributed_optimizer=true \
  data.train_batch_size=512 \
  data.micro_batch_size_per_gpu=1 \
  data.use_dynamic_bsz=false \
  data.max_length=4096 \
  ++engine.override_transformer_config.recompute_granularity=selective \
  ++engine.override_transformer_config.recompute_method=null \
  ++engine.override_transformer_config.recompute_num_layers=null \
  ++engine.override_transformer_config.cp_comm_type=p2p
