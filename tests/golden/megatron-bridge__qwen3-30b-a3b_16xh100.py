# Qwen3-30B-A3B on 16 x NVIDIA H100 SXM5 80GB: TP1 PP2 EP8 DP8 (Megatron-Bridge 0.6.2, rendered by meshplan)
# cfg is the ConfigContainer your recipe returns; call cfg.validate() after these assignments.
cfg.model.normalization = 'RMSNorm'
cfg.model.layernorm_epsilon = 1e-06
cfg.model.gated_linear_unit = True
cfg.model.position_embedding_type = 'rope'
cfg.model.rotary_base = 1000000
cfg.model.qk_layernorm = True
cfg.model.tensor_model_parallel_size = 1
cfg.model.pipeline_model_parallel_size = 2
cfg.model.virtual_pipeline_model_parallel_size = None
cfg.model.context_parallel_size = 1
cfg.model.expert_model_parallel_size = 8
cfg.model.expert_tensor_parallel_size = 1
cfg.model.moe_token_dispatcher_type = 'alltoall'
cfg.model.sequence_parallel = False
cfg.model.recompute_granularity = None
cfg.model.recompute_method = None
cfg.model.recompute_num_layers = None
cfg.model.seq_length = 4096
cfg.ddp.use_distributed_optimizer = True
cfg.optimizer.use_distributed_optimizer = True
cfg.ddp.overlap_grad_reduce = True
cfg.ddp.overlap_param_gather = True
cfg.train.micro_batch_size = 1
cfg.train.global_batch_size = 256
cfg.dataset.seq_length = 4096
