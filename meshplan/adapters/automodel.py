"""NeMo AutoModel (nemo-automodel 0.7.0): the plan as the sections of an AutoModel recipe YAML.

AutoModel reads `distributed` (recipes/_dist_utils.py parse_distributed_section: strategy, the sizes, the FSDP2Config
flags, `pipeline` (PipelineConfig) and `moe` (MoEParallelizerConfig)), `step_scheduler` (global and local batch),
`model.backend` (BackendConfig: the MoE dispatcher, the attention backend), `compile`, `fp8` and `peft`. The keys are
the card's (cards/frameworks/nemo-automodel.yaml); tests/test_framework_validators.py loads the rendered YAML with
the pinned package's own parser.
"""

from __future__ import annotations

from typing import Any

from meshplan.adapters.common import Built, attention_value, nodes, split_fields, split_fix
from meshplan.adapters.lora import hf_projections
from meshplan.arithmetic.memory_states import fp8_recipe
from meshplan.arithmetic.schedule import layers_per_rank
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import knob_table
from meshplan.knowledge.cards import framework_card
from meshplan.schema.plan import Job, Plan

Section = list[tuple[str, Any]]

# The Hugging Face module names of a causal LM's pipeline parts (AutoModel's pipelining/functional.py
# generate_hf_model_fqn_per_model_part: the embedding on the first stage, the norm and lm_head on the last, the rotary
# embedding on every stage).
HF_PREFIX = "model."


def stage_fqns(counts: list[int]) -> list[list[str]]:
    """module_fqns_per_model_part for these decoder layers per stage, in AutoModel's own naming."""
    stages, start = [], 0
    for index, count in enumerate(counts):
        names = [f"{HF_PREFIX}embed_tokens"] if index == 0 else []
        names += [f"{HF_PREFIX}layers.{i}" for i in range(start, start + count)]
        start += count
        if index == len(counts) - 1:
            names += [f"{HF_PREFIX}norm", "lm_head"]
        stages.append([*names, f"{HF_PREFIX}rotary_emb"])
    return stages


def pipeline_section(job: Job, plan: Plan, version: str) -> Section:
    """distributed.pipeline: the schedule, the micro-batch and a split that gives every stage the plan's layers
    (layers_per_stage for an even split; the module names of each stage for first/last stage layers)."""
    split = split_fields(job, plan)
    schedule = "interleaved1f1b" if plan.vpp > 1 else "1f1b"
    if plan.pipeline_schedule is not None:  # the card's values (capabilities.refuse_missing refused the others)
        values = knob_table(framework_card("nemo-automodel"), version, "yaml")["pipeline_schedule"].values or {}
        schedule = values.get(plan.pipeline_schedule) or schedule
    section: Section = [("pp_schedule", schedule),
                        ("pp_microbatch_size", plan.micro_batch_size)]
    if split.first is None and split.last is None:
        if split.per_chunk is None:
            raise MeshplanError(
                f"{job.model.num_layers} layers do not divide into {split.stages} pipeline stages (AutoModel would "
                "put the extra layers on the first stages, which this plan does not estimate).",
                fix=split_fix(job, plan, lighter_ends=True) if plan.vpp == 1 else
                "Give a pp*vpp that divides the layer count, or vpp=1 with first_stage_layers/last_stage_layers.")
        return [*section, ("layers_per_stage", split.per_chunk)]
    if plan.vpp > 1:
        raise MeshplanError("An uneven split with vpp > 1 is not rendered for NeMo AutoModel.",
                            fix="Use vpp=1 with first/last stage layers, or an even split.")
    counts, _ = layers_per_rank(job.model.num_layers, plan.pp, plan.first_stage_layers, plan.last_stage_layers)
    return [*section, ("module_fqns_per_model_part", stage_fqns(counts))]


def distributed_section(job: Job, plan: Plan, version: str) -> tuple[Section, list[str]]:
    """The `distributed` section and its notes."""
    notes: list[str] = []
    section: Section = [("strategy", "ddp" if plan.zero_stage == 0 else "fsdp2"), ("dp_size", plan.dp),
                        ("tp_size", plan.tp), ("cp_size", plan.cp), ("pp_size", plan.pp), ("ep_size", plan.ep)]
    if plan.dp_replicate > 1:  # HSDP (FSDP2 only): dp_shard = dp_size / dp_replicate_size
        section.insert(2, ("dp_replicate_size", plan.dp_replicate))
    if plan.zero_stage != 0:
        section.append(("sequence_parallel", plan.sequence_parallel))
    ac = {"none": False, "full": True, "selective": "selective"}[plan.recompute]
    section.append(("activation_checkpointing", ac))
    if plan.zero_stage == 2:  # FSDP2Config: "Set False for a ZeRO-2-like benchmark where gathered parameters stay"
        section.append(("reshard_after_forward", False))
    if plan.zero_stage != 0 and plan.defer_fsdp_grad_sync is not None:  # FSDP2Config: held unsharded gradients
        section.append(("defer_fsdp_grad_sync", plan.defer_fsdp_grad_sync))
    if plan.tp_comm_overlap:  # FSDP2Config.enable_async_tensor_parallel: an Inductor pass (rule TP005: compile)
        section.append(("enable_async_tensor_parallel", True))
    if plan.zero_stage != 0 and plan.grad_reduce_in_fp32 is False:
        # FSDP2Config.mp_policy (36044ad components/distributed/config.py): a _target_ block replaces the default
        # policy whole, so it restates the default's other fields (bf16 compute and output, inputs cast)
        section.append(("mp_policy", [("_target_", "torch.distributed.fsdp.MixedPrecisionPolicy"),
                                      ("param_dtype", "bfloat16"), ("reduce_dtype", "bfloat16"),
                                      ("output_dtype", "bfloat16"), ("cast_forward_inputs", True)]))
    if plan.param_offload:  # torch CPUOffloadPolicy: shards, gradients and the optimizer step on the CPU
        section.append(("offload_policy", [("_target_", "torch.distributed.fsdp.CPUOffloadPolicy")]))
    if plan.pp > 1:
        section.append(("pipeline", pipeline_section(job, plan, version)))
    if plan.ep > 1:
        # MoEParallelizerConfig.reshard_after_forward defaults to False (the experts stay gathered from forward to
        # backward): the plan's zero stage says which one meshplan estimated
        section.append(("moe", [("reshard_after_forward", plan.zero_stage != 2)]))
        if plan.zero_stage == 3:
            notes.append("distributed.moe.reshard_after_forward: true (AutoModel's own default is false, which keeps "
                         "the experts gathered from forward to backward: zero_stage=2 in meshplan's terms).")
    return section, notes


def batch_section(job: Job, plan: Plan) -> tuple[Section, list[str]]:
    """step_scheduler: global_batch_size and local_batch_size. With PP the local batch is the pipeline's batch, cut
    into local_batch_size // pp_microbatch_size micro-batches (recipes/llm/train_ft.py); without PP it is one
    forward's batch and StepScheduler accumulates global / (local x dp) of them."""
    microbatches = plan.num_microbatches(job.global_batch_size)
    per_run = plan.pipeline_microbatches or microbatches  # Plan.pipeline_microbatches: one run of the schedule
    local = plan.micro_batch_size * per_run if plan.pp > 1 else plan.micro_batch_size
    note = (f"local_batch_size={local}: one pipeline pass of {per_run} micro-batches of pp_microbatch_size="
            f"{plan.micro_batch_size}, run {microbatches // per_run} time(s) per step" if plan.pp > 1 else
            f"local_batch_size={local}: one forward's batch, accumulated {microbatches} time(s) per step")
    return [("global_batch_size", job.global_batch_size), ("local_batch_size", local)], [note]


def backend_section(job: Job, plan: Plan, variant: str) -> Section:
    """model.backend (BackendConfig): the MoE dispatcher and the attention backend, where the plan sets them, and
    enable_fsdp_optimizations where the job keeps its FSDP units gathered (Job.fsdp_keep_gathered)."""
    backend: Section = []
    attn = attention_value("nemo-automodel", variant, plan.attention_backend, job.model.mla is not None)
    if attn is not None:
        backend.append(("attn", attn))
    if job.model.moe is not None and plan.ep > 1:
        backend.append(("dispatcher", job.moe_flex_backend if plan.moe_token_dispatcher == "flex" else "torch"))
    if job.fsdp_keep_gathered:  # MoEFSDPSyncMixin: units kept gathered and unreduced between micro-batches
        backend.append(("enable_fsdp_optimizations", True))
    return [("_target_", "nemo_automodel.components.models.common.BackendConfig"), *backend] if backend else []


def peft_section(job: Job) -> Section:
    """peft (PeftConfig): rank and the targets as wildcards over the module paths. AutoModel's ModuleMatcher compares
    a pattern with the module's full dotted name (model.layers.0.self_attn.q_proj), so a bare 'q_proj' matches no
    module and the job trains no adapter; '*.q_proj' matches every layer's. A MoE layer's routed experts are one
    GroupedExperts module ('experts'), whose GroupedExpertsLoRA adapts gate/up and down together (lora_experts.py):
    it is targeted where linear_fc1 and linear_fc2 both are, and a request naming one alone has no AutoModel config."""
    if job.lora is None:
        return []
    targets = [f"*.{name}" for name in hf_projections(job.lora.targets)]
    fc = {"linear_fc1", "linear_fc2"} & set(job.lora.targets)
    if job.model.moe is not None and len(fc) == 1:
        raise MeshplanError(
            f"NeMo AutoModel cannot adapt {fc.pop()} alone on {job.model.name}'s routed experts: its "
            "GroupedExpertsLoRA adapts an expert's gate/up and down projections together.",
            fix="Give lora_targets both linear_fc1 and linear_fc2, or neither.")
    if job.model.moe is not None and fc:
        targets.append("*.experts")
    return [("_target_", "nemo_automodel.components._peft.lora.PeftConfig"), ("dim", job.lora.rank),
            ("target_modules", targets)]


def fp8_section(job: Job, plan: Plan) -> Section:
    """fp8 (FP8Config, torchao Float8Linear): the recipe and the fp8 all-gather."""
    if job.precision != "fp8":
        return []
    section: Section = [("enabled", True), ("recipe_name", fp8_recipe(job, plan))]
    if plan.fp8_param_gather:
        section += [("enable_fsdp_float8_all_gather", True), ("precompute_float8_dynamic_scale_for_fsdp", True)]
    return section


def mapping(value: Any) -> Any:
    """Sections (lists of (key, value) tuples) as dicts in their order, for the template; lists stay lists."""
    if isinstance(value, list) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {k: mapping(v) for k, v in value}
    return [mapping(v) for v in value] if isinstance(value, list) else value


def build_automodel(job: Job, plan: Plan, variant: str, version: str) -> Built:
    distributed, notes = distributed_section(job, plan, version)
    batch, batch_notes = batch_section(job, plan)
    model: Section = [("_target_", "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained"),
                      ("pretrained_model_name_or_path", job.model.hf_id or job.model.name)]
    backend = backend_section(job, plan, variant)
    if backend:
        model.append(("backend", backend))
    sections: list[tuple[str, Any]] = [("step_scheduler", batch), ("distributed", distributed), ("model", model),
                                       ("dataset", [("seq_len", job.seq_length)])]
    if plan.torch_compile:
        sections.append(("compile", [("enabled", True)]))
    for name, section in (("fp8", fp8_section(job, plan)), ("peft", peft_section(job))):
        if section:
            sections.append((name, section))
    warnings = []
    if job.model.hf_id is None:
        warnings.append(f"{job.model.name} has no Hugging Face id in meshplan's catalog: set "
                        "model.pretrained_model_name_or_path to your checkpoint.")
    if job.model.moe is not None and plan.ep > 1 and plan.moe_token_dispatcher != "flex":
        warnings.append("model.backend.dispatcher: torch all-gathers every token over the EP group and all-reduces "
                        "the gathered output (rule AM005; the estimate times it so). DeepEP (flex) is AutoModel's "
                        "default where deep_ep is installed.")
    run = nodes(job)
    notes += [*batch_notes,
              f"Merge these sections into your recipe YAML (dataset, optimizer, checkpoint ...); run with `automodel "
              f"<recipe>.yaml --nproc-per-node {run.per_node}`" + (f" on {run.nnodes} nodes" if run.nnodes > 1 else "")
              + ". dataset.seq_len is the sequence length meshplan estimated."]
    return Built(template="nemo_automodel.j2", context={"sections": mapping(sections)}, format="yaml",
                 filename="automodel_parallel.yaml", notes=notes, warnings=warnings)
