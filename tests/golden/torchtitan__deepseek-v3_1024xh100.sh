#!/usr/bin/env bash
# DeepSeek-V3 on 1024 x NVIDIA H100 SXM5 80GB: TP1 PP16 EP64 DP64 (torchtitan 0.3.0, rendered by meshplan)
set -euo pipefail
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
torchrun --nnodes 128 --nproc-per-node 8 \
  --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" \
  -m torchtitan.train \
  --module deepseek_v3 --config deepseek_v3_671b \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 64 \
  --parallelism.tensor_parallel_degree 1 \
  --parallelism.pipeline_parallel_degree 16 \
  --parallelism.context_parallel_degree 1 \
  --parallelism.expert_parallel_degree 64 \
  --parallelism.no_enable_sequence_parallel \
  --parallelism.pipeline_parallel_schedule 1F1B \
  --parallelism.pipeline_parallel_layers_per_stage 4 \
  --parallelism.pipeline_parallel_first_stage_less_layers 0 \
  --parallelism.pipeline_parallel_last_stage_less_layers 3 \
  --parallelism.pipeline_parallel_microbatch_size 1 \
  --training.local_batch_size 64 \
  --training.global_batch_size 4096 \
  --training.seq_len 4096 \
  --training.disable_cuda_graphs \
  activation-checkpoint:full
