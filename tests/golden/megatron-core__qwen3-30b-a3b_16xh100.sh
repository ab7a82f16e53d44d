#!/usr/bin/env bash
# Qwen3-30B-A3B on 16 x NVIDIA H100 SXM5 80GB: TP1 PP2 EP8 DP8 (Megatron-Core 0.19.2, rendered by meshplan)
set -euo pipefail
torchrun --nnodes 2 --nproc-per-node 8 \
  --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --num-layers 48 \
  --hidden-size 2048 \
  --ffn-hidden-size 6144 \
  --num-attention-heads 32 \
  --group-query-attention \
  --num-query-groups 4 \
  --kv-channels 128 \
  --seq-length 4096 \
  --max-position-embeddings 40960 \
  --normalization RMSNorm \
  --norm-epsilon 1e-06 \
  --swiglu \
  --position-embedding-type rope \
  --rotary-base 1000000 \
  --qk-layernorm \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --num-experts 128 \
  --moe-router-topk 8 \
  --moe-ffn-hidden-size 768 \
  --moe-grouped-gemm \
  --tensor-model-parallel-size 1 \
  --pipeline-model-parallel-size 2 \
  --context-parallel-size 1 \
  --expert-model-parallel-size 8 \
  --expert-tensor-parallel-size 1 \
  --moe-token-dispatcher-type alltoall \
  --attention-dropout 0.0 \
  --hidden-dropout 0.0 \
  --use-distributed-optimizer \
  --overlap-grad-reduce \
  --overlap-param-gather \
  --micro-batch-size 1 \
  --global-batch-size 256 \
  --bf16
