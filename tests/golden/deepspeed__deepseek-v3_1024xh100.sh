#!/usr/bin/env bash
# DeepSeek-V3 on 1024 x NVIDIA H100 SXM5 80GB: TP8 PP16 DP8 (Megatron-DeepSpeed + DeepSpeed 0.18, rendered by meshplan)
set -euo pipefail
cat > ds_config.json <<'DS_CONFIG'
{
  "train_batch_size": 4096,
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 512,
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
torchrun --nnodes 128 --nproc-per-node 8 \
  --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" \
  pretrain_gpt.py \
  --num-layers 61 \
  --hidden-size 7168 \
  --ffn-hidden-size 18432 \
  --num-attention-heads 128 \
  --num-key-value-heads 128 \
  --seq-length 4096 \
  --max-position-embeddings 163840 \
  --swiglu \
  --untie-embeddings-and-output-weights \
  --use-rotary-position-embeddings \
  --tensor-model-parallel-size 8 \
  --pipeline-model-parallel-size 16 \
  --num-experts 1 1 1 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 256 \
  --topk 8 \
  --expert-interval 1 \
  --moe-expert-parallel-size 1 \
  --create-moe-param-group \
  --micro-batch-size 1 \
  --global-batch-size 4096 \
  --bf16 \
  --deepspeed \
  --deepspeed_config ds_config.json \
  --zero-stage 1 \
  --checkpoint-activations \
  --use-flash-attn-v2 \
  --attention-dropout 0.0 \
  --hidden-dropout 0.0
