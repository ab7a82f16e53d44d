#!/usr/bin/env bash
# Llama-3.1-70B on 64 x NVIDIA H100 SXM5 80GB: TP4 PP4 DP4 (Megatron-DeepSpeed + DeepSpeed 0.18, rendered by meshplan)
set -euo pipefail
cat > ds_config.json <<'DS_CONFIG'
{
  "train_batch_size": 512,
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 128,
  "bf16": {
    "enabled": true
  },
  "zero_optimization": {
    "stage": 1,
    "overlap_comm": true
  },
  "gradient_clipping": 1.0,
  "activation_checkpointing": {
    "partition_activations": true,
    "contiguous_memory_optimization": false
  }
}
DS_CONFIG
torchrun --nnodes 8 --nproc-per-node 8 \
  --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --num-layers 80 \
  --hidden-size 8192 \
  --ffn-hidden-size 28672 \
  --num-attention-heads 64 \
  --num-key-value-heads 8 \
  --seq-length 4096 \
  --max-position-embeddings 131072 \
  --swiglu \
  --untie-embeddings-and-output-weights \
  --use-rotary-position-embeddings \
  --tensor-model-parallel-size 4 \
  --pipeline-model-parallel-size 4 \
  --micro-batch-size 1 \
  --global-batch-size 512 \
  --bf16 \
  --deepspeed \
  --deepspeed_config ds_config.json \
  --zero-stage 1 \
  --checkpoint-activations \
  --use-flash-attn-v2 \
  --attention-dropout 0.0 \
  --hidden-dropout 0.0
