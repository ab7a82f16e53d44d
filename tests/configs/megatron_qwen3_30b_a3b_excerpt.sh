#!/bin/bash
# Trimmed excerpt of NVIDIA/Megatron-LM examples/post_training/modelopt/conf/Qwen/Qwen3-30B-A3B.sh (see
# SOURCES.txt): its MODEL_ARGS verbatim (the file is sourced by the modelopt scripts); the torchrun line that
# launches them, with the RL example qwen3_30b_a3b_moe.sh parallel sizes, is added.
MODEL_ARGS=" \
    --save-interval 100000 \
    --micro-batch-size 1 \
    --bf16 \
    --no-masked-softmax-fusion \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --position-embedding-type rope \
    --no-rope-fusion \
    --normalization RMSNorm \
    --swiglu \
    --num-layers 48 \
    --hidden-size 2048 \
    --ffn-hidden-size 6144 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 4 \
    --kv-channels 128 \
    --qk-layernorm \
    --num-experts 128 \
    --moe-ffn-hidden-size 768 \
    --moe-router-topk 8 \
    --moe-router-dtype fp32 \
    --moe-aux-loss-coeff 1e-3 \
    --moe-token-dispatcher-type alltoall \
    --moe-router-load-balancing-type aux_loss \
    --seq-length 4096 \
    --max-position-embeddings 40960 \
    --tokenizer-type HuggingFaceTokenizer \
    --make-vocab-size-divisible-by 1187 \
    --use-mcore-models \
    --rotary-percent 1.0 \
    --rotary-base 1000000 \
    --no-bias-swiglu-fusion \
    --sequence-parallel \
"

torchrun --nproc-per-node 8 pretrain_gpt.py ${MODEL_ARGS} --tensor-model-parallel-size 4 \
    --expert-model-parallel-size 2 --global-batch-size 256
