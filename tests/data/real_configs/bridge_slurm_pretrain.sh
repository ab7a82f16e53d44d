#!/bin/bash
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
set -euo pipefail
RECIPE_NAME=qwen3_30b_a3b_pretrain_config
SEQ_LENGTH=4096
GLOBAL_BATCH_SIZE=128
MICRO_BATCH_SIZE=1
# TP,PP,EP,CP
PARALLELISM_CONFIG=${PARALLELISM_CONFIG:-2,4,8,1}
SRUN_CMD="srun --mpi=pmix --container-image=$CONTAINER_IMAGE"
OLD_IFS=$IFS
IFS=',' read -r TP PP EP CP <<< "$PARALLELISM_CONFIG"
IFS=$OLD_IFS
NNODES=${SLURM_JOB_NUM_NODES:-8}
NPROC_PER_NODE=${SLURM_GPUS_PER_NODE:-4}
CLI_OVERRIDES=" \
    model.seq_length=$SEQ_LENGTH \
    train.global_batch_size=$GLOBAL_BATCH_SIZE \
    train.micro_batch_size=$MICRO_BATCH_SIZE \
    model.tensor_model_parallel_size=$TP \
    model.pipeline_model_parallel_size=$PP \
    model.expert_model_parallel_size=$EP \
    model.context_parallel_size=$CP"
CMD="uv run --no-sync python -m torch.distributed.run \
    --nproc_per_node=$NPROC_PER_NODE \
    --nnodes=$NNODES \
    --node_rank=\$SLURM_PROCID \
    /opt/Megatron-Bridge/scripts/training/run_recipe.py \
    --recipe $RECIPE_NAME \
    $CLI_OVERRIDES"
echo "$CMD"
$SRUN_CMD bash -lc "
    set -euo pipefail
    export CUDA_DEVICE_MAX_CONNECTIONS=1
    cd /opt/Megatron-Bridge
    $CMD
"
