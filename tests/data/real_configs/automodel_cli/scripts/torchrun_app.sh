#!/bin/bash
# slurm.sub's launch of the CLI module under torchrun (the recipe runs in-process on torchrun's ranks)
CONFIG=examples/llm_benchmark/llama3_1/llama3_1_8b_peft_benchmark.yaml
torchrun --nnodes=2 --nproc-per-node=8 -m nemo_automodel.cli.app ${CONFIG} --distributed.tp_size=4
