# DeepSeek-V3 on 1024 x NVIDIA H100 SXM5 80GB: TP2 PP16 EP64 DP32 (Megatron-Bridge 0.6.2, rendered by meshplan)
# cfg is the ConfigContainer your recipe returns; call cfg.validate() after these assignments.
cfg.model.tensor_model_parallel_size = 2
cfg.model.pipeline_model_parallel_size = 16
cfg.model.virtual_pipeline_model_parallel_size = None
cfg.model.context_parallel_size = 1
cfg.model.expert_model_parallel_size = 64
cfg.model.expert_tensor_parallel_size = 1
cfg.model.moe_token_dispatcher_type = 'alltoall'
cfg.model.sequence_parallel = True
cfg.model.num_layers_in_first_pipeline_stage = 4
cfg.model.num_layers_in_last_pipeline_stage = 1
cfg.model.recompute_granularity = 'full'
cfg.model.recompute_method = 'block'
cfg.model.recompute_num_layers = 1
cfg.model.seq_length = 4096
cfg.ddp.use_distributed_optimizer = True
cfg.optimizer.use_distributed_optimizer = True
cfg.train.micro_batch_size = 1
cfg.train.global_batch_size = 4096
cfg.dataset.seq_length = 4096
