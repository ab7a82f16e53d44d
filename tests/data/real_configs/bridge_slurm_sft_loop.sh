#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
MODEL_NAME=nemotron_3_nano
SEQ_LENGTH=2048
GLOBAL_BATCH_SIZE=16
MICRO_BATCH_SIZE=1
PARALLELISM_CONFIGS=("4,1,8,1,True" "2,2,8,1,True" "2,1,8,2,True")
SRUN_CMD="srun --mpi=pmix --container-image=$CONTAINER_IMAGE"
for CONFIG in "${PARALLELISM_CONFIGS[@]}"; do
    IFS=',' read -r TP PP EP CP SP <<< "$CONFIG"
    CLI_OVERRIDES="\
        train.global_batch_size=$GLOBAL_BATCH_SIZE \
        train.micro_batch_size=$MICRO_BATCH_SIZE \
        model.tensor_model_parallel_size=$TP \
        model.pipeline_model_parallel_size=$PP \
        model.expert_model_parallel_size=$EP \
        model.sequence_parallel=$SP \
        model.context_parallel_size=$CP \
        model.seq_length=$SEQ_LENGTH"
    CMD="uv run --no-sync python scripts/training/run_recipe.py"
    CMD="$CMD --recipe ${MODEL_NAME}_sft_config"
    CMD="$CMD $CLI_OVERRIDES"
    $SRUN_CMD bash -c "$CMD"
done
