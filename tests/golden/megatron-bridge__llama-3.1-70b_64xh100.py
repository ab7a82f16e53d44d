# Llama-3.1-70B on 64 x NVIDIA H100 SXM5 80GB: TP4 PP4 VPP5 CP2 DP2 (Megatron-Bridge 0.6.2, rendered by meshplan)
# cfg is the ConfigContainer your recipe returns; call cfg.validate() after these assignments.
cfg.model.normalization = 'RMSNorm'
cfg.model.layernorm_epsilon = 1e-05
cfg.model.gated_linear_unit = True
cfg.model.position_embedding_type = 'rope'
cfg.model.rotary_base = 500000
cfg.model.rope_scaling = True
cfg.model.rope_scaling_factor = 8.0
cfg.model.tensor_model_parallel_size = 4
cfg.model.pipeline_model_parallel_size = 4
cfg.model.virtual_pipeline_model_parallel_size = 5
cfg.model.context_parallel_size = 2
cfg.model.cp_comm_type = 'p2p'
cfg.model.sequence_parallel = True
cfg.model.recompute_granularity = 'selective'
cfg.model.recompute_method = None
cfg.model.recompute_num_layers = None
cfg.model.seq_length = 4096
cfg.ddp.use_distributed_optimizer = True
cfg.optimizer.use_distributed_optimizer = True
cfg.ddp.overlap_grad_reduce = True
cfg.ddp.overlap_param_gather = True
cfg.train.micro_batch_size = 1
cfg.train.global_batch_size = 512
cfg.dataset.seq_length = 4096
