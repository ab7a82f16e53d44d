#!/usr/bin/env bash
# Qwen3-30B-A3B on 16 x NVIDIA H100 SXM5 80GB: TP1 PP2 EP8 DP8 (torchtitan 0.3.0, rendered by meshplan)
set -euo pipefail
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
torchrun --nnodes 2 --nproc-per-node 8 \
  --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" \
  -m torchtitan.train \
  --module qwen3 --config qwen3_30b_a3b \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 8 \
  --parallelism.tensor_parallel_degree 1 \
  --parallelism.pipeline_parallel_degree 2 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.expert_parallel_degree 8 \
  --parallelism.no_enable_sequence_parallel \
  --parallelism.pipeline_parallel_schedule 1F1B \
  --parallelism.pipeline_parallel_layers_per_stage 24 \
  --parallelism.pipeline_parallel_first_stage_less_layers 0 \
  --parallelism.pipeline_parallel_last_stage_less_layers 0 \
  --parallelism.pipeline_parallel_microbatch_size 1 \
  --training.local_batch_size 32 \
  --training.global_batch_size 256 \
  --training.seq_len 4096 \
  --training.disable_cuda_graphs \
  activation-checkpoint:none
