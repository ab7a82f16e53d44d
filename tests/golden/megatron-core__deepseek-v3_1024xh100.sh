#!/usr/bin/env bash
# DeepSeek-V3 on 1024 x NVIDIA H100 SXM5 80GB: TP2 PP16 EP64 DP32 (Megatron-Core 0.19.2, rendered by meshplan)
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nnodes 128 --nproc-per-node 8 \
  --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --num-layers 61 \
  --hidden-size 7168 \
  --ffn-hidden-size 18432 \
  --num-attention-heads 128 \
  --seq-length 4096 \
  --max-position-embeddings 163840 \
  --normalization RMSNorm \
  --norm-epsilon 1e-06 \
  --swiglu \
  --position-embedding-type rope \
  --rotary-base 10000 \
  --rope-type yarn \
  --rotary-scaling-factor 40.0 \
  --mscale 1.0 \
  --mscale-all-dim 1.0 \
  --qk-layernorm \
  --moe-router-num-groups 8 \
  --moe-router-group-topk 4 \
  --untie-embeddings-and-output-weights \
  --disable-bias-linear \
  --multi-latent-attention \
  --kv-lora-rank 512 \
  --qk-head-dim 128 \
  --qk-pos-emb-head-dim 64 \
  --v-head-dim 128 \
  --q-lora-rank 1536 \
  --num-experts 256 \
  --moe-router-topk 8 \
  --moe-ffn-hidden-size 2048 \
  --moe-grouped-gemm \
  --moe-shared-expert-intermediate-size 2048 \
  --moe-layer-freq '([0]*3+[1]*58)' \
  --mtp-num-layers 1 \
  --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 16 \
  --decoder-first-pipeline-num-layers 4 \
  --decoder-last-pipeline-num-layers 1 \
  --context-parallel-size 1 \
  --expert-model-parallel-size 64 \
  --expert-tensor-parallel-size 1 \
  --moe-token-dispatcher-type alltoall \
  --sequence-parallel \
  --attention-dropout 0.0 \
  --hidden-dropout 0.0 \
  --use-distributed-optimizer \
  --overlap-grad-reduce \
  --overlap-param-gather \
  --micro-batch-size 1 \
  --global-batch-size 4096 \
  --recompute-granularity full \
  --recompute-method block \
  --recompute-num-layers 1 \
  --bf16
