#!/usr/bin/env bash
# Llama-3.1-70B on 64 x NVIDIA H100 SXM5 80GB: TP4 PP4 VPP5 CP2 DP2 (Megatron-Core 0.19.2, rendered by meshplan)
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nnodes 8 --nproc-per-node 8 \
  --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --num-layers 80 \
  --hidden-size 8192 \
  --ffn-hidden-size 28672 \
  --num-attention-heads 64 \
  --group-query-attention \
  --num-query-groups 8 \
  --seq-length 4096 \
  --max-position-embeddings 131072 \
  --normalization RMSNorm \
  --norm-epsilon 1e-05 \
  --swiglu \
  --position-embedding-type rope \
  --rotary-base 500000 \
  --use-rope-scaling \
  --rope-scaling-factor 8.0 \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --tensor-model-parallel-size 4 \
  --pipeline-model-parallel-size 4 \
  --num-layers-per-virtual-pipeline-stage 4 \
  --context-parallel-size 2 \
  --cp-comm-type p2p \
  --sequence-parallel \
  --attention-dropout 0.0 \
  --hidden-dropout 0.0 \
  --use-distributed-optimizer \
  --overlap-grad-reduce \
  --overlap-param-gather \
  --micro-batch-size 1 \
  --global-batch-size 512 \
  --recompute-granularity selective \
  --bf16
