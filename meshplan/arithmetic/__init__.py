"""The terms every estimate is built from: the mesh (world-size laws, derived and expert DP, the fast domain),
the pipeline schedule (which layers each stage holds, micro-batches in flight), FLOPs and GEMM shapes, collective
times, activation and model-state bytes, what offload moves to host, LoRA adapters, Muon's step."""
