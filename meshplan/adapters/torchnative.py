"""torchtitan (0.3.x command-line overrides, 0.2.x TOML) and KempnerForge (TOML), both FSDP2-based.

Both shard data parallelism with FSDP2 (`dp_shard`) or replicate it (`dp_replicate`), so zero_stage 3
maps to sharding and 0 to replication; ZeRO-1/2 have no knob (the cards say so). torchtitan 0.3.0
keys: `torchtitan/config/configs.py` (ParallelismConfig, TrainingConfig) and the
activation-checkpoint subcommand in `torchtitan/distributed/activation_checkpoint.py`.
"""

from __future__ import annotations

from typing import Any

from meshplan.adapters.common import Built, attention_value, nodes, split_fields, split_fix
from meshplan.arithmetic import mesh
from meshplan.arithmetic.memory_states import cuda_graphs_off, fp8_recipe, replicates_by_sharding
from meshplan.arithmetic.pipeline_timeline import schedule_order
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.read_card import TomlModel
from meshplan.schema.plan import Job, Plan


def _dp(plan: Plan) -> tuple[int, int]:
    """(replicate, shard) degrees: FSDP2 shards for zero_stage 3 (over dp / dp_replicate, HSDP with dp_replicate
    replicas), replicates for 0 (mesh.torch_dp_degrees: DDP on torchtitan <= 0.2, fully_shard over a shard of one on
    0.3)."""
    return mesh.torch_dp_degrees(plan)


def torchtitan_pipeline(job: Job, plan: Plan) -> list[tuple[str, Any]]:
    """Pipeline keys that reproduce the plan's split exactly.

    torchtitan splits num_layers + first_less + last_less "effective layers" evenly over pp*vpp
    stages (distributed/pipeline_parallel.py, _generate_llm_fqn_per_model_part). With
    layers_per_stage = m for the middle stages and first_less = m - first, last_less = m - last,
    every stage gets exactly the plan's layers.
    """
    if plan.pp == 1:
        return []
    split = split_fields(job, plan)
    if split.first is None and split.last is None:
        if split.per_chunk is None:
            raise MeshplanError(
                f"{job.model.num_layers} layers do not divide into {split.stages} pipeline stages.",
                fix=split_fix(job, plan, lighter_ends=True) if plan.vpp == 1 else
                "Give a pp*vpp that divides the layer count, or vpp=1 with first_stage_layers/last_stage_layers.")
        m, first, last = split.per_chunk, split.per_chunk, split.per_chunk
    else:
        if plan.vpp > 1:
            raise MeshplanError("An uneven split with vpp > 1 is not rendered for torchtitan.",
                                fix="Use vpp=1 with first/last stage layers, or an even split.")
        m = split.per_chunk or max(split.first or 0, split.last or 0)
        first = split.first if split.first is not None else m
        last = split.last if split.last is not None else m
        if first > m or last > m:
            raise MeshplanError(
                f"torchtitan can only make the first/last stage lighter (first_less/last_less >= 0); "
                f"first={first}, last={last} exceed the middle stages' {m} layers.",
                fix=split_fix(job, plan, lighter_ends=True))
    return [("pipeline_parallel_schedule", torch_schedule_name("torchtitan", plan)),
            ("pipeline_parallel_layers_per_stage", m),
            ("pipeline_parallel_first_stage_less_layers", m - first),
            ("pipeline_parallel_last_stage_less_layers", m - last),
            ("pipeline_parallel_microbatch_size", plan.micro_batch_size)]


def torch_schedule_name(framework: str, plan: Plan) -> str:
    """The torch.distributed.pipelining schedule name the plan runs (its card's pipeline.schedules): the named
    pipeline_schedule's order at the plan's vpp, else the framework's default (interleaved with vpp > 1)."""
    facts = framework_card(framework).pipeline
    if plan.pipeline_schedule is not None:
        return facts.schedules[schedule_order(plan.pipeline_schedule, plan.vpp)]
    return (facts.interleaved or facts.schedule) if plan.vpp > 1 else facts.schedule


def torchtitan_registry(job: Job) -> tuple[str, str] | None:
    """(--module, --config) of torchtitan's config registry for a catalog model, from the card."""
    entry = framework_card("torchtitan").registry.get(job.model.key or "")
    return (entry.module, entry.config) if entry else None


# torchtitan 0.2.2 model code that reads parallelism.expert_parallel_comm_backend (infra/parallelize.py);
# every other model's parallelize function ignores it.
DEEPEP_MODULES_0_2 = ("deepseek_v3", "llama4")


def torchtitan_0_2_dispatcher(job: Job, plan: Plan) -> tuple[list[tuple[str, Any]], list[str]]:
    """torchtitan 0.2.2's expert_parallel_comm_backend ("standard" or "deepep") and any warning.

    Refuses what torchtitan would reject or silently ignore: DeepEP needs ep > 1 and etp = 1
    (deepseek_v3/infra/parallelize.py raises otherwise), only the deepseek_v3 and llama4 model code
    reads the key, and 0.2.2 has no HybridEP, which a multi-node NVLink domain (GB200 NVL72) needs.
    """
    if job.model.moe is None:
        return [], []
    if plan.moe_token_dispatcher != "flex":
        return [("expert_parallel_comm_backend", "standard")], []
    problems = []
    if plan.ep == 1:
        problems.append("DeepEP needs expert_parallel_degree > 1")
    if plan.etp > 1:
        problems.append("DeepEP does not support expert tensor parallelism (etp must be 1)")
    if mesh.domain_spans_nodes(job.gpu, job.gpus_per_node):
        domain = mesh.fast_domain(job.gpu, job.gpus_per_node)
        problems.append(f"the {job.gpu.name} NVLink domain ({domain} GPUs) spans several nodes, which "
                        "needs HybridEP, and 0.2.2 offers only deepep")
    elif job.moe_flex_backend != "deepep":
        problems.append(f"moe_flex_backend={job.moe_flex_backend}: 0.2.2 offers only deepep")
    registry = torchtitan_registry(job)
    if registry is not None and registry[0] not in DEEPEP_MODULES_0_2:
        problems.append(f"its {registry[0]} model code ignores expert_parallel_comm_backend (only "
                        f"{' and '.join(DEEPEP_MODULES_0_2)} read it)")
    if problems:
        raise MeshplanError(
            "torchtitan 0.2.2 cannot run moe_token_dispatcher=flex here: " + "; ".join(problems) + ".",
            fix="Use moe_token_dispatcher=alltoall, or a Megatron-Core based framework (megatron-core, "
                "megatron-bridge, verl, skyrl), whose flex dispatcher has DeepEP and HybridEP.")
    warnings = [] if registry is not None else [
        f"torchtitan 0.2.2 reads expert_parallel_comm_backend only in the {' and '.join(DEEPEP_MODULES_0_2)} model "
        f"code; make sure {job.model.name}'s parallelize function passes use_deepep on."]
    return [("expert_parallel_comm_backend", "deepep")], warnings


def build_torchtitan(job: Job, plan: Plan, variant: str, version: str) -> Built:
    replicate, shard = _dp(plan)
    parallelism: list[tuple[str, Any]] = [
        ("data_parallel_replicate_degree", replicate), ("data_parallel_shard_degree", shard),
        ("tensor_parallel_degree", plan.tp), ("pipeline_parallel_degree", plan.pp),
        ("context_parallel_degree", plan.cp), ("expert_parallel_degree", plan.ep),
    ]
    dispatcher_warnings: list[str] = []
    if version.startswith("0.3"):
        parallelism.append(("enable_sequence_parallel", plan.sequence_parallel))
    else:
        parallelism.append(("expert_tensor_parallel_degree", plan.etp))
        dispatcher, dispatcher_warnings = torchtitan_0_2_dispatcher(job, plan)
        parallelism += dispatcher
    parallelism += torchtitan_pipeline(job, plan)
    # with PP one local batch is one run of the schedule (Plan.pipeline_microbatches, all of the step's by default)
    local = plan.micro_batch_size * (plan.schedule_microbatches(job.global_batch_size) if plan.pp > 1 else 1)
    training = [("local_batch_size", local), ("global_batch_size", job.global_batch_size),
                ("seq_len", job.seq_length)]
    if plan.param_offload:  # FSDP2 CPUOffloadPolicy: shards, gradients and the optimizer step on the CPU
        training.append(("enable_cpu_offload", True))
    if plan.grad_reduce_in_fp32:  # the only value torchtitan's mixed_precision_reduce takes (rule PR004)
        training.append(("mixed_precision_reduce", "float32"))
    notes = [f"local_batch_size is the per-rank batch of one gradient-accumulation step ({training[0][1]}); with PP "
             f"it is cut into micro-batches of pipeline_parallel_microbatch_size={plan.micro_batch_size}, one run of "
             "the schedule; torchtitan accumulates such steps until global_batch_size."]
    if replicates_by_sharding(job.card, plan.zero_stage, version):  # the card's engine.replica_shard
        notes.append(f"data_parallel_shard_degree = 1: torchtitan {version} still wraps each block in fully_shard, "
                     f"a shard of {plan.cp} rank{'s' if plan.cp > 1 else ''} with {replicate} replicas (HSDP, not "
                     "DDP): fp32 sharded states, each block's bf16 parameters copied in and freed around its "
                     "forward and backward, each block's fp32 gradient all-reduced across the replicas as its "
                     "backward ends; meshplan estimates it as zero_stage 3 at dp_replicate = dp.")
    registry = torchtitan_registry(job)
    # torch.compile of each block and the loss (0.3.0 CompileConfig / 0.2.2 Compile; components default both)
    compile_keys = [("enable", True)] if plan.torch_compile else []
    if plan.tp_comm_overlap and version.startswith("0.3"):  # async TP: a compile pass since 0.3.0 (rule TP005)
        compile_keys.append(("enable_async_tensor_parallel", True))
    elif plan.tp_comm_overlap:  # 0.2.x: [parallelism] enable_async_tensor_parallel, still needing compile
        parallelism.append(("enable_async_tensor_parallel", True))
    warnings = []
    flavor = framework_card("torchtitan").flavors.get(job.model.key or "")
    if registry is None and version.startswith("0.3"):
        warnings.append(f"torchtitan has no registry config for {job.model.name}: write one (config_registry.py) "
                        "and set TORCHTITAN_MODULE and TORCHTITAN_CONFIG.")
    elif flavor is None and not version.startswith("0.3"):
        warnings.append(f"torchtitan {version} has no model flavor for {job.model.name}: the TOML names no [model], "
                        "so torchtitan would train its default (name llama3, flavor debugmodel); register a "
                        "TrainSpec for it and set [model] name and flavor.")
    if version.startswith("0.3"):
        if cuda_graphs_off(plan):
            training.append(("disable_cuda_graphs", True))
            notes.append("--training.disable_cuda_graphs: registry configs that enable CUDA graphs reject pipeline "
                         "parallelism and the default all-to-all expert dispatcher (it synchronises with the CPU); "
                         "torchtitan's own ConfigManager raises otherwise.")
        ac = {"none": "none", "selective": "selective", "full": "full"}[plan.recompute]
        return Built(template="torchtitan.j2",
                     context={"nodes": nodes(job), "parallelism": parallelism, "training": training, "ac": ac,
                              "registry": registry, "compile": compile_keys},
                     format="shell", filename="run_torchtitan.sh", notes=notes, warnings=warnings)
    ac_section = {"mode": plan.recompute}
    if plan.recompute == "selective":
        ac_section["selective_ac_option"] = plan.selective_ac_option or "op"  # "op": what 0.3.x keeps as selective
    if plan.moe_token_dispatcher == "flex" and job.model.moe is not None:
        notes.append("expert_parallel_comm_backend = deepep: DeepEP (github.com/deepseek-ai/DeepEP) must be "
                     "installed on every node; it sends a token once per destination node and fans it out over "
                     "NVLink.")
    sections = toml_model_section(flavor, torchtitan_0_2_float8(job, plan))
    return Built(template="torchtitan_toml.j2",
                 context={"parallelism": parallelism, "training": training, "ac": ac_section,
                          "registry": registry, "quantize": sections, "compile": compile_keys},
                 format="toml", filename="torchtitan_job.toml",
                 notes=[*notes, "torchtitan 0.2.x: pass with --job.config_file torchtitan_job.toml."],
                 warnings=warnings + dispatcher_warnings)


def toml_model_section(flavor: TomlModel | None, sections: list[tuple[str, list[tuple[str, Any]]]]
                       ) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The TOML sections with [model] name and flavor first where the card names the model's flavor (its `flavors`:
    torchtitan 0.2.x's models, which default to llama3 debugmodel), merged into the [model] table fp8's converters
    open (one table, not two)."""
    if flavor is None:
        return sections
    keys: list[tuple[str, Any]] = [("name", flavor.name), ("flavor", flavor.flavor)]
    rest = [(name, items) for name, items in sections if name != "model"]
    given = [item for name, items in sections if name == "model" for item in items]
    return [("model", keys + given), *rest]


def torchtitan_0_2_float8(job: Job, plan: Plan) -> list[tuple[str, list[tuple[str, Any]]]]:
    """torchtitan 0.2.2's fp8 as TOML sections: [model] converters names the linear converter (quantize.linear.float8,
    or quantize.linear.mx for mxfp8) and its section sets the recipe and the fp8 all-gather (config/job_config.py
    Float8Linear, MXLinear; components/quantization registers the converter names)."""
    if job.precision != "fp8":
        return []
    recipe = fp8_recipe(job, plan)
    if recipe == "mxfp8":
        if plan.fp8_param_gather:
            raise MeshplanError("torchtitan 0.2.2 gathers fp8 weights with Float8Linear only (MXLinear has no "
                                "enable_fsdp_float8_all_gather).",
                                fix="Drop fp8_param_gather, or use fp8_recipe=tensorwise.")
        return [("model", [("converters", ["quantize.linear.mx"])]),
                ("quantize.linear.mx", [("recipe_name", "mxfp8_cublas")])]
    section: list[tuple[str, Any]] = [("recipe_name", recipe)]
    if plan.fp8_param_gather:
        section += [("enable_fsdp_float8_all_gather", True), ("precompute_float8_dynamic_scale_for_fsdp", True)]
    return [("model", [("converters", ["quantize.linear.float8"])]), ("quantize.linear.float8", section)]


# --------------------------------------------------------------------------- KempnerForge


def build_kempnerforge(job: Job, plan: Plan, variant: str, version: str) -> Built:
    m = job.model
    if m.moe is not None and plan.pp > 1:
        raise MeshplanError("KempnerForge forbids MoE models with pp > 1 (JobConfig.validate: 'PP=1 is mandatory "
                            "for MoE').", fix="Use pp=1 and spread the experts with ep.")
    if m.tie_word_embeddings and plan.pp > 1:
        raise MeshplanError("KempnerForge forbids tied embeddings with pp > 1.", fix="Use pp=1 for this model.")
    if job.precision == "fp8" and plan.tp > 1:
        raise MeshplanError("KempnerForge forbids fp8 with tp > 1.", fix="Use tp=1 or precision=bf16.")
    replicate, shard = _dp(plan)
    distributed = [("dp_shard", shard), ("dp_replicate", replicate), ("tp", plan.tp), ("pp", plan.pp),
                   ("pp_schedule", plan.pipeline_schedule or "1f1b"), ("cp", plan.cp), ("ep", plan.ep)]
    accumulation = plan.num_microbatches(job.global_batch_size)
    train = [("batch_size", plan.micro_batch_size), ("grad_accum_steps", accumulation),
             ("seq_len", job.seq_length), ("mixed_precision", job.precision),
             ("activation_checkpointing", plan.recompute),
             ("compile_model", plan.torch_compile)]  # written either way: KempnerForge's default is true
    automatic_sp = plan.tp > 1 and plan.pp == 1 and not m.tie_word_embeddings and m.moe is None
    warnings = [] if plan.sequence_parallel == automatic_sp else [
        f"KempnerForge decides sequence parallelism itself (on when tp > 1 without PP, tied embeddings or MoE): it "
        f"will be {'on' if automatic_sp else 'off'} here, not {'on' if plan.sequence_parallel else 'off'} as planned."]
    backend = attention_value("kempnerforge", variant, plan.attention_backend)
    model = [("sdpa_backend", backend)] if backend else []  # ModelConfig.sdpa_backend (default auto)
    # OptimizerConfig.name: written for Muon only (adamw, the default, stays the file's own choice)
    optimizer = [("name", "muon")] if plan.optimizer == "muon" else []
    return Built(template="kempnerforge.j2",
                 context={"distributed": distributed, "train": train, "optimizer": optimizer, "model": model},
                 format="toml", filename="kempnerforge_layout.toml", warnings=warnings,
                 notes=[*filter(None, [mesh.own_ep_ranks_note(job, plan)]),
                        f"grad_accum_steps {accumulation} = global_batch_size {job.global_batch_size} / "
                        f"(batch_size {plan.micro_batch_size} x data-parallel {plan.dp}).",
                        "Merge these sections into your configs/train/*.toml ([model] stays yours)."])
