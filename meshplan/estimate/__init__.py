"""The arithmetic of one training step: the mesh, the pipeline schedule, FLOPs, collectives, activation and
model-state bytes, offload, LoRA, Muon, per-stage memory, step time, and the error band of each regime."""
