#!/bin/bash
# The recipe's own "To run this recipe" line, with a TP override as AutoModel's CLI passes it on
automodel examples/llm_benchmark/llama3_1/llama3_1_8b_peft_benchmark.yaml --nproc-per-node 8 --distributed.tp_size 2
