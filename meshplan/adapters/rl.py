"""verl (Hydra overrides) and SkyRL (OmegaConf dotlist) for RL and SFT post-training.

verl 0.9.1 keys come from its packaged YAML (`verl/trainer/config/`): plain `key=value` for keys
the YAML has, `++key=value` for `override_transformer_config.*` keys it lacks (Hydra rejects `+`
on an existing non-null key). SkyRL 0.4.0 keys are dataclass fields (`skyrl/train/config/`);
SkyRL rejects a `+` prefix, and VPP, recompute and uneven PP go into `transformer_config_kwargs`.
"""

from __future__ import annotations

from typing import Any

from meshplan.adapters.common import (
    DROPOUT_ON,
    Built,
    attention_value,
    flex_notes,
    hierarchical_cp,
    megatron_cpu_optimizer,
    megatron_dispatcher,
    megatron_recompute,
    nodes,
    offload_modules,
    rollout_tp,
    split_fields,
)
from meshplan.adapters.lora import skyrl_lora, verl_lora
from meshplan.arithmetic.activation_passes import default_activation_fusion
from meshplan.arithmetic.memory_states import fp8_recipe
from meshplan.core.errors import MeshplanError
from meshplan.schema.plan import Job, Plan

Override = tuple[str, Any]


def samples_per_prompt(job: Job, default: int) -> int:
    """Responses per prompt: the framework's default if it divides the global batch, else the largest of
    8, 4, 2, 1 that does (global_batch_size counts sequences = prompts x responses per prompt)."""
    for n in (default, 8, 4, 2, 1):
        if job.global_batch_size % n == 0:
            return n
    return 1


def _model_path(job: Job) -> str:
    return job.model.hf_id or job.model.name


def _transformer_overrides(job: Job, plan: Plan) -> list[Override]:
    """Megatron TransformerConfig fields that verl and SkyRL pass through (recompute, uneven PP, CP comm, and verl's
    bias_activation_fusion where the job's is not its Megatron-Bridge provider's)."""
    split = split_fields(job, plan)
    out: list[Override] = list(megatron_recompute(plan).items())
    if split.first is not None:
        out.append(("num_layers_in_first_pipeline_stage", split.first))
    if split.last is not None:
        out.append(("num_layers_in_last_pipeline_stage", split.last))
    out += [(f"account_for_{part}_in_pipeline_split", True)  # the embedding / loss counted as a layer of the split
            for part, on in (("embedding", plan.account_for_embedding), ("loss", plan.account_for_loss)) if on]
    if plan.cp > 1:
        out.append(("cp_comm_type", plan.cp_comm_type))
        if plan.cp_comm_type == "a2a+p2p":
            out.append(("hierarchical_context_parallel_sizes", hierarchical_cp(job, plan)))
    backend = attention_value(job.framework, "megatron" if job.framework == "verl" else "rl", plan.attention_backend,
                              mla=job.model.mla is not None)  # the Megatron engine: by_engine leaves it to mla_backend
    if backend:  # verl's config_converter / SkyRL's worker hand the string to Megatron-Core's AttnBackend
        out.append(("attention_backend", backend))
    if plan.dropout:
        out += [("attention_dropout", DROPOUT_ON), ("hidden_dropout", DROPOUT_ON)]
    # the provider's (verl's card, of the job's release); None: the framework has no switch
    default = default_activation_fusion(job.card.defaults, job.model, job.framework_version)
    if default is not None and job.bias_activation_fusion != default:
        out.append(("bias_activation_fusion", job.bias_activation_fusion))
    return out


# --------------------------------------------------------------------------- RL jobs (meshplan/rl/)


def _has_critic(job: Job) -> bool:
    """A critic is rendered for PPO, and for a plain training job as before (verl's packaged default is PPO)."""
    return job.rl is None or job.rl.algorithm == "ppo"


def rl_workload(job: Job, plan: Plan, default_n: int) -> tuple[int, int, int, str]:
    """(samples per prompt, prompts, rollout TP, a note): an RL job's own fields, else derived from the batch."""
    if job.rl is not None:
        return (job.rl.samples_per_prompt, job.rl.prompts_per_step, plan.rollout_tp,
                f"Rollout engine {plan.rollout_engine} TP{plan.rollout_tp} DP{plan.rollout_dp}"
                f"{f' EP{plan.rollout_ep}' if job.model.is_moe else ''} at "
                f"memory fraction {plan.rollout_memory_fraction:g} (meshplan memory gives each phase's peak).")
    n = samples_per_prompt(job, default_n)
    rtp = rollout_tp(job)
    return n, job.global_batch_size // n, rtp, (
        f"Rollout (vLLM/SGLang) tensor parallel size {rtp}: the smallest power of two whose bf16 weight shard takes "
        "at most half a GPU, leaving the rest to the KV cache.")


def mini_batch_prompts(job: Job, prompts: int) -> tuple[int, str]:
    """The prompts of one optimizer step (the RL job's prompts_per_mini_batch, else the step's `prompts`: one
    optimizer step per batch) and words for the notes."""
    mini = job.rl.prompts_per_mini_batch if job.rl is not None and job.rl.prompts_per_mini_batch else prompts
    steps = -(-prompts // mini)
    return mini, ("one optimizer step per batch" if steps == 1 else
                  f"{steps} optimizer steps per batch of {prompts} prompts")


def verl_rl_overrides(job: Job, plan: Plan, notes: list[str]) -> list[Override]:
    """verl's rollout section, lengths and algorithm for an RL job (verl/trainer/config/rollout/rollout.yaml,
    data/legacy_data.yaml, algorithm adv_estimator; the reference model follows use_kl_loss)."""
    if job.rl is None:
        return []
    if plan.placement == "separate":
        raise MeshplanError("meshplan renders verl's colocated hybrid engine only; a separate rollout pool is verl's "
                            "one-step-off recipe (verl/experimental/one_step_off_policy), another entry point.",
                            fix="Use placement colocated for verl, or SkyRL (colocate_all false) for separate pools.")
    rl, ref = job.rl, job.rl_card.reference_model[job.rl.algorithm]
    rollout = "actor_rollout_ref.rollout"
    notes.append(f"{rl.algorithm.upper()}: adv_estimator {'gae' if rl.algorithm == 'ppo' else 'grpo'}, "
                 f"use_kl_loss {ref} (a reference model {'is' if ref else 'is not'} loaded); "
                 + ("a critic is trained." if rl.algorithm == "ppo" else "no critic."))
    return [("data.max_prompt_length", rl.prompt_length), ("data.max_response_length", rl.response_length),
            ("algorithm.adv_estimator", "gae" if rl.algorithm == "ppo" else "grpo"),
            ("actor_rollout_ref.actor.use_kl_loss", ref),
            (f"{rollout}.name", plan.rollout_engine), (f"{rollout}.data_parallel_size", plan.rollout_dp),
            (f"{rollout}.expert_parallel_size", plan.rollout_ep),
            (f"{rollout}.gpu_memory_utilization", plan.rollout_memory_fraction),
            *([(f"{rollout}.enforce_eager", True)] if plan.rollout_enforce_eager else [])]


def skyrl_rl_overrides(job: Job, plan: Plan, notes: list[str]) -> list[Override]:
    """SkyRL's generator and algorithm for an RL job (skyrl/train/config/config.py InferenceEngineConfig,
    SamplingParams, AlgorithmConfig)."""
    if job.rl is None:
        return []
    rl, ref = job.rl, job.rl_card.reference_model[job.rl.algorithm]
    engine = "generator.inference_engine"
    o: list[Override] = [("trainer.max_prompt_length", rl.prompt_length),
                         ("generator.sampling_params.max_generate_length", rl.response_length),
                         ("trainer.algorithm.advantage_estimator", "gae" if rl.algorithm == "ppo" else "grpo"),
                         ("trainer.algorithm.use_kl_loss", ref),
                         (f"{engine}.data_parallel_size", plan.rollout_dp),
                         (f"{engine}.expert_parallel_size", plan.rollout_ep),
                         (f"{engine}.gpu_memory_utilization", plan.rollout_memory_fraction),
                         *([(f"{engine}.enforce_eager", True)] if plan.rollout_enforce_eager else [])]
    if rl.algorithm == "ppo":
        n = nodes(job)
        o += [("trainer.critic.model.path", _model_path(job)), ("trainer.placement.critic_num_nodes", n.nnodes),
              ("trainer.placement.critic_num_gpus_per_node", n.per_node)]
    notes.append(f"{rl.algorithm.upper()}: advantage_estimator {'gae' if rl.algorithm == 'ppo' else 'grpo'}, "
                 f"use_kl_loss {ref}.")
    return o


# --------------------------------------------------------------------------- verl


def verl_overrides(job: Job, plan: Plan, variant: str) -> tuple[list[Override], list[str]]:
    n = nodes(job)
    rollout, prompts, rtp, rtp_note = rl_workload(job, plan, 1)  # an RL job's own, else derived from the batch
    mini, steps = mini_batch_prompts(job, prompts)
    notes = [rtp_note,
             f"global_batch_size {job.global_batch_size} = data.train_batch_size {prompts} prompts x rollout.n "
             f"{rollout}; ppo_mini_batch_size {mini} ({steps})."]
    o: list[Override] = []
    if variant == "megatron":
        o.append(("model_engine", "megatron"))
    o += [("actor_rollout_ref.model.path", _model_path(job)),
          ("trainer.nnodes", n.nnodes), ("trainer.n_gpus_per_node", n.per_node),
          ("data.train_batch_size", prompts), ("actor_rollout_ref.rollout.n", rollout),
          ("actor_rollout_ref.actor.ppo_mini_batch_size", mini),
          *((("actor_rollout_ref.actor.ppo_epochs", job.rl.update_epochs),) if job.rl and job.rl.update_epochs else ()),
          *((("actor_rollout_ref.actor.entropy_coeff", job.rl.entropy_coeff),) if job.rl and job.rl.entropy_coeff
            else ()),
          ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", plan.micro_batch_size),
          ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", plan.micro_batch_size),
          ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", plan.micro_batch_size),
          ("actor_rollout_ref.rollout.tensor_model_parallel_size", rtp)]
    if variant == "megatron":
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")[:3 if _has_critic(job) else 2]:
            o += [(f"{role}.megatron.tensor_model_parallel_size", plan.tp),
                  (f"{role}.megatron.pipeline_model_parallel_size", plan.pp),
                  (f"{role}.megatron.virtual_pipeline_model_parallel_size", plan.vpp if plan.vpp > 1 else None),
                  (f"{role}.megatron.context_parallel_size", plan.cp),
                  (f"{role}.megatron.expert_model_parallel_size", plan.ep),
                  (f"{role}.megatron.expert_tensor_parallel_size", plan.etp),
                  (f"{role}.megatron.sequence_parallel", plan.sequence_parallel)]
            if role != "actor_rollout_ref.ref":
                o.append((f"{role}.megatron.use_distributed_optimizer", plan.zero_stage >= 1))
            o += [(f"++{role}.megatron.override_transformer_config.{k}", v)
                  for k, v in [*_transformer_overrides(job, plan), *megatron_dispatcher(job, plan)]]
        o += [(f"{role}.optim.{k}", v) for role in ("actor_rollout_ref.actor", "critic")[:2 if _has_critic(job) else 1]
              for k, v in verl_precision_aware(plan).items()]
        o += _verl_megatron_offload(job, plan)
        notes.append("override_transformer_config keys use '++' (add or override): the packaged YAML lacks most "
                     "of them, and Hydra's '+' fails on a key that already has a value.")
    else:
        o.append(("actor_rollout_ref.actor.strategy", "fsdp2"))
        if _has_critic(job):
            # the critic's engine is critic.fsdp (0.9.1 ray_trainer: engine_config = critic_cfg.engine); unlike the
            # actor's, its deprecated top-level ulysses_sequence_parallel_size is not copied there
            o += [("critic.strategy", "fsdp2"), ("critic.fsdp.ulysses_sequence_parallel_size", plan.cp)]
        o += [("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", plan.cp),
              ("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size", plan.cp),
              ("actor_rollout_ref.actor.fsdp_config.fsdp_size", fsdp_group(plan)),
              ("actor_rollout_ref.model.enable_gradient_checkpointing", plan.recompute == "full"),
              ("actor_rollout_ref.model.use_remove_padding", True)]
        backend = attention_value("verl", "fsdp", plan.attention_backend)
        if backend:  # the Hugging Face attn_implementation verl loads the model with (workers/config/model.py)
            o.append(("++actor_rollout_ref.model.override_config.attn_implementation", backend))
        o += [(key, True) for key, on in (
            ("actor_rollout_ref.model.enable_activation_offload", plan.activation_offload),
            ("actor_rollout_ref.actor.fsdp_config.param_offload", plan.param_offload),
            ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", plan.optimizer_offload)) if on]
        if _has_critic(job):  # the critic runs as the actor's plan (rl/memory, rl/step_time): its own keys say so,
            # its packaged defaults being checkpointing on, offloads off (0.9.1 _generated_ppo_trainer.yaml critic:)
            o.append(("critic.model.enable_gradient_checkpointing", plan.recompute == "full"))
            o += [(key, True) for key, on in (("critic.model.enable_activation_offload", plan.activation_offload),
                                              ("critic.fsdp.param_offload", plan.param_offload),
                                              ("critic.fsdp.optimizer_offload", plan.optimizer_offload)) if on]
        o += fsdp_reduce_dtype("++actor_rollout_ref.actor.fsdp_config.mixed_precision", plan)
        if _has_critic(job):  # as the Megatron engine's optim fields, the critic's too (its engine: critic.fsdp)
            o += fsdp_reduce_dtype("++critic.fsdp.mixed_precision", plan)
        notes.append("FSDP backend: context parallelism is Ulysses sequence parallelism (cp -> "
                     "ulysses_sequence_parallel_size), which needs use_remove_padding=True; FSDP shards over all GPUs.")
    return o + verl_rl_overrides(job, plan, notes), notes


def fsdp_reduce_dtype(section: str, plan: Plan) -> list[Override]:
    """verl's and SkyRL's FSDP2 MixedPrecisionPolicy reduce_dtype, bf16 where the plan reduces in bf16
    (grad_reduce_in_fp32 false), under their fsdp_config's mixed_precision `section` (verl's packaged YAML lacks it:
    '++'; SkyRL's dataclass builds it with its other fields' defaults); nothing otherwise (fp32, their default)."""
    return [(f"{section}.reduce_dtype", "bf16")] if plan.grad_reduce_in_fp32 is False else []


def megatron_precision_aware(plan: Plan) -> dict[str, object]:
    """Megatron-Core OptimizerConfig fields of low-precision Adam moments as SkyRL 0.4.0 passes them through
    optimizer_config_kwargs (its coerce_optimizer_dtype_kwargs turns the names into torch dtypes); {} for fp32."""
    if plan.optimizer_state_dtype in (None, "fp32"):
        return {}
    return {"use_precision_aware_optimizer": True, "exp_avg_dtype": plan.optimizer_state_dtype,
            "exp_avg_sq_dtype": plan.optimizer_state_dtype}


def verl_precision_aware(plan: Plan) -> dict[str, object]:
    """verl 0.9.1's McoreOptimizerConfig fields for bf16 Adam moments and a bf16 gradient buffer: its precision-aware
    optimizer switch with exp_avg_dtype / exp_avg_sq_dtype and main_grads_dtype, which it hands to Megatron-Core's
    OptimizerConfig (utils/megatron/optimizer.py) and, for the gradients, the DDP config
    (engine/megatron/transformer_impl.py _resolve_override_ddp_config); {} for fp32 moments and gradients. The
    moments' fields are Megatron-Core's own (megatron_precision_aware)."""
    out = megatron_precision_aware(plan)
    if plan.grad_reduce_in_fp32 is False:
        out |= {"use_precision_aware_optimizer": True, "main_grads_dtype": "bf16"}
    return out


def fsdp_group(plan: Plan) -> int:
    """verl's and SkyRL's fsdp_config.fsdp_size: the shard group, all ranks (-1), or one replica's dp*cp /
    dp_replicate (hybrid sharding: both build the (ddp, fsdp) mesh as (world / fsdp_size, fsdp_size))."""
    return -1 if plan.dp_replicate == 1 else plan.dp * plan.cp // plan.dp_replicate


def _verl_megatron_offload(job: Job, plan: Plan) -> list[Override]:
    """The trained models' offloads on verl's Megatron backend: the phase offloads (engine/megatron.yaml), the
    in-step CPU optimizer through override_optimizer_config, activation offloading through
    override_transformer_config; the actor's, and PPO's critic's, which meshplan runs as the actor's plan
    (rl/memory, rl/step_time) and whose keys verl 0.9.1 leaves off by default (critic/megatron_critic.yaml)."""
    o: list[Override] = []
    for role in ("actor_rollout_ref.actor", "critic")[:2 if _has_critic(job) else 1]:
        o += [(f"{role}.megatron.{knob}", True) for knob, on in (
            ("param_offload", plan.param_offload), ("optimizer_offload", plan.optimizer_offload)) if on]
        o += [(f"++{role}.optim.override_optimizer_config.{k}", v)
              for k, v in megatron_cpu_optimizer(job, plan).items()]
        if plan.activation_offload:
            o += [(f"++{role}.megatron.override_transformer_config.fine_grained_activation_offloading", True),
                  (f"++{role}.megatron.override_transformer_config.offload_modules", offload_modules(job, plan))]
    return o


def training_lengths(job: Job) -> tuple[int, int, str]:
    """(prompt, response, a note) for a training job written as an RL launcher: the two lengths its trainer reads
    (verl's data.max_prompt_length/max_response_length, SkyRL's max_prompt_length/max_generate_length) summing to
    the job's seq_length, split in the framework's own default proportion (its card's rl.defaults). Left out, the
    file ran and read back at those defaults' sum (verl's 1,024 tokens), not the sequence meshplan estimated."""
    d = job.rl_card.defaults
    prompt = max(1, job.seq_length * d.prompt_length // (d.prompt_length + d.response_length))
    response = job.seq_length - prompt
    if response < 1:
        raise MeshplanError(f"seq_length={job.seq_length} cannot be written as an RL launcher's prompt + response "
                            "length (each at least one token).",
                            fix="Use seq_length >= 2, or the framework's SFT variant.")
    return prompt, response, (
        f"prompt {prompt} + response {response} = seq_length {job.seq_length} tokens, split as "
        f"{job.card.display_name}'s defaults ({d.prompt_length} + {d.response_length}); set them for your task.")


def rl_launch_warning(job: Job, entry: str, instead: str = "") -> list[str]:
    """What a training job's script runs on an RL framework: its RL trainer, whose rollout engine and reference model
    the training job's estimate leaves out (`render skyrl llama-3.1-8b --job sft` wrote an RL launch silently)."""
    if job.rl is not None:
        return []
    return [f"This is {entry}, an RL run: beside the training step meshplan estimated for this job it starts a "
            "rollout engine (vLLM/SGLang), and a reference model where its algorithm's KL term needs one, which that "
            f"estimate leaves out; ask with job=rl for the RL step's memory and time{instead}."]


def verl_sft_overrides(job: Job, plan: Plan) -> tuple[list[Override], list[str]]:
    """verl 0.9.1's SFT trainer on the FSDP engine (torchrun -m verl.trainer.sft_trainer, sft_trainer_engine.yaml):
    the batch in sequences over torchrun's world, use_dynamic_bsz off (on by default) so each micro-batch is the
    plan's micro_batch_size_per_gpu sequences, max_length the sequence length. A training job on main_ppo started a
    rollout engine and a reference model the job's estimate leaves out."""
    o: list[Override] = [
        ("model.path", _model_path(job)), ("engine.strategy", "fsdp2"),
        ("engine.ulysses_sequence_parallel_size", plan.cp),
        ("engine.fsdp_size", -1 if plan.dp_replicate == 1 else plan.dp * plan.cp // plan.dp_replicate),
        ("data.train_batch_size", job.global_batch_size), ("data.micro_batch_size_per_gpu", plan.micro_batch_size),
        ("data.use_dynamic_bsz", False), ("data.max_length", job.seq_length),
        ("model.enable_gradient_checkpointing", plan.recompute == "full"), ("model.use_remove_padding", True)]
    backend = attention_value("verl", "fsdp", plan.attention_backend)
    if backend:  # the Hugging Face attn_implementation (hf_model.yaml override_config)
        o.append(("++model.override_config.attn_implementation", backend))
    o += [(key, True) for key, on in (("model.enable_activation_offload", plan.activation_offload),
                                      ("engine.param_offload", plan.param_offload),
                                      ("engine.optimizer_offload", plan.optimizer_offload)) if on]
    o += fsdp_reduce_dtype("++engine.mixed_precision", plan)
    return o, ["verl's SFT trainer on the FSDP engine: context parallelism is Ulysses sequence parallelism "
               "(engine.ulysses_sequence_parallel_size, with use_remove_padding); data.train_batch_size is the "
               "global batch in sequences, split over dp = GPUs / Ulysses size.",
               "Set data.train_files / val_files and the dataset's keys (data.messages_key) for your task; "
               "multi-node runs also need torchrun's rendezvous (--rdzv_endpoint or --master_addr)."]


def verl_sft_megatron_overrides(job: Job, plan: Plan) -> tuple[list[Override], list[str]]:
    """verl 0.9.1's SFT trainer on the Megatron engine: the engine and optim groups set to megatron (Hydra group
    overrides, as tests/special_e2e/sft/run_sft_engine.sh does) and the actor's Megatron keys under engine.*
    (McoreEngineConfig); the batch as the FSDP engine's (data.*, dp = Megatron's data-parallel size)."""
    e = "engine."
    o: list[Override] = [
        ("engine", "megatron"), ("optim", "megatron"), ("model.path", _model_path(job)),
        (e + "tensor_model_parallel_size", plan.tp), (e + "pipeline_model_parallel_size", plan.pp),
        (e + "virtual_pipeline_model_parallel_size", plan.vpp if plan.vpp > 1 else None),
        (e + "context_parallel_size", plan.cp), (e + "expert_model_parallel_size", plan.ep),
        (e + "expert_tensor_parallel_size", plan.etp), (e + "sequence_parallel", plan.sequence_parallel),
        (e + "use_distributed_optimizer", plan.zero_stage >= 1),
        ("data.train_batch_size", job.global_batch_size), ("data.micro_batch_size_per_gpu", plan.micro_batch_size),
        ("data.use_dynamic_bsz", False), ("data.max_length", job.seq_length)]
    o += [(f"++{e}override_transformer_config.{k}", v)
          for k, v in [*_transformer_overrides(job, plan), *megatron_dispatcher(job, plan)]]
    o += [(e + knob, True) for knob, on in (("param_offload", plan.param_offload),
                                            ("optimizer_offload", plan.optimizer_offload)) if on]
    o += [(f"optim.{k}", v) for k, v in verl_precision_aware(plan).items()]
    o += [(f"++optim.override_optimizer_config.{k}", v)
          for k, v in megatron_cpu_optimizer(job, plan).items()]
    if plan.activation_offload:
        o += [(f"++{e}override_transformer_config.fine_grained_activation_offloading", True),
              (f"++{e}override_transformer_config.offload_modules", offload_modules(job, plan))]
    return o, ["verl's SFT trainer on the Megatron engine (engine=megatron optim=megatron): data.train_batch_size is "
               "the global batch in sequences, split over Megatron's data-parallel ranks (GPUs / (tp x pp x cp)).",
               "override_transformer_config keys use '++' (add or override): the packaged YAML lacks most of them.",
               "Set data.train_files / val_files and the dataset's keys (data.messages_key) for your task; "
               "multi-node runs also need torchrun's rendezvous (--rdzv_endpoint or --master_addr)."]


def build_verl(job: Job, plan: Plan, variant: str, version: str) -> Built:
    if variant in ("sft-fsdp", "sft-megatron"):
        sft = verl_sft_overrides if variant == "sft-fsdp" else verl_sft_megatron_overrides
        overrides, notes = sft(job, plan)
        overrides += verl_lora(job, variant, notes)
        n = nodes(job)
        return Built(template="verl_sft.j2", context={"overrides": overrides, "nnodes": n.nnodes,
                                                      "per_node": n.per_node},
                     format="hydra", filename="run_verl_sft.sh", notes=notes, warnings=flex_notes(job, plan)[1],
                     exports_env=True)
    overrides, notes = verl_overrides(job, plan, variant)
    overrides += verl_lora(job, variant, notes)  # LoRA (meshplan/adapters/lora.py)
    flex, warnings = flex_notes(job, plan)
    if job.rl is None:
        prompt, response, said = training_lengths(job)
        overrides += [("data.max_prompt_length", prompt), ("data.max_response_length", response)]
        notes.append(f"data.max_prompt_length + data.max_response_length: {said}")
    return Built(template="verl.j2", context={"overrides": overrides}, format="hydra",
                 filename=f"run_verl_{variant}.sh",
                 notes=[*notes, *flex, "Set data.train_files, data.max_prompt_length + data.max_response_length "
                                       f"(together {job.seq_length} tokens here) and the algorithm for your task."],
                 warnings=[*rl_launch_warning(job, "verl's PPO trainer (verl.trainer.main_ppo)"), *warnings])


# --------------------------------------------------------------------------- SkyRL


SKYRL_SFT = ("sft", "sft-fsdp")  # main_sft's variants (SFTConfig keys), the megatron and FSDP strategies


def skyrl_sft_fsdp(job: Job, plan: Plan) -> list[Override]:
    """main_sft with strategy fsdp: SFTConfig's keys (sft_config.py copies fsdp_config and sequence_parallel_size onto
    the trainer's); gradient checkpointing and flash attention are TrainerConfig defaults it does not expose."""
    n = nodes(job)
    o: list[Override] = [
        ("strategy", "fsdp"), ("model.path", _model_path(job)), ("placement.num_nodes", n.nnodes),
        ("placement.num_gpus_per_node", n.per_node), ("batch_size", job.global_batch_size),
        ("micro_train_batch_size_per_gpu", plan.micro_batch_size), ("max_length", job.seq_length),
        ("sequence_parallel_size", plan.cp), ("fsdp_config.fsdp_size", fsdp_group(plan))]
    if plan.param_offload:
        o.append(("fsdp_config.cpu_offload", True))
    return o + fsdp_reduce_dtype("fsdp_config.mixed_precision", plan)


def skyrl_overrides(job: Job, plan: Plan, variant: str) -> tuple[list[Override], list[str]]:
    n = nodes(job)
    notes: list[str] = []
    if variant == "sft-fsdp":
        return skyrl_sft_fsdp(job, plan), ["FSDP strategy: context parallelism is Ulysses sequence parallelism "
                                           "(sequence_parallel_size)."]
    megatron = variant in ("rl", "sft")
    kwargs = list(megatron_recompute(plan).items()) + [
        (k, v) for k, v in _transformer_overrides(job, plan) if not k.startswith("recompute_")
    ]
    if plan.vpp > 1:
        kwargs.insert(0, ("virtual_pipeline_model_parallel_size", plan.vpp))
    if plan.sequence_parallel != (plan.tp > 1):
        kwargs.append(("sequence_parallel", plan.sequence_parallel))  # SkyRL's own rule is SP = (TP > 1)
    if job.mtp_asked:  # else the provider keeps the checkpoint's depth (AutoBridge reads num_nextn_predict_layers)
        kwargs += [("mtp_num_layers", job.model.num_mtp_layers or None),
                   ("mtp_use_repeated_layer", job.model.mtp_repeated_layer)]
    if variant == "sft":
        prefix, o = "megatron_config", [("strategy", "megatron"), ("model.path", _model_path(job)),
                                        ("placement.num_nodes", n.nnodes),
                                        ("placement.num_gpus_per_node", n.per_node),
                                        ("batch_size", job.global_batch_size),
                                        ("micro_train_batch_size_per_gpu", plan.micro_batch_size),
                                        ("max_length", job.seq_length)]
    else:
        rollout, prompts, rtp, rtp_note = rl_workload(job, plan, 5)  # an RL job's own, else derived from the batch
        mini, steps = mini_batch_prompts(job, prompts)
        engines = (plan.rollout_gpus if job.rl else job.num_gpus) // (rtp * (plan.rollout_dp if job.rl else 1))
        prefix = "trainer.policy.megatron_config"
        o = [("trainer.strategy", "megatron" if megatron else "fsdp"),
             ("trainer.policy.model.path", _model_path(job)),
             ("trainer.placement.colocate_all", plan.placement != "separate"),
             ("trainer.placement.policy_num_nodes", n.nnodes),
             ("trainer.placement.policy_num_gpus_per_node", n.per_node),
             ("trainer.placement.ref_num_nodes", n.nnodes),
             ("trainer.placement.ref_num_gpus_per_node", n.per_node),
             ("trainer.train_batch_size", prompts), ("trainer.policy_mini_batch_size", mini),
             *((("trainer.update_epochs_per_batch", job.rl.update_epochs),) if job.rl and job.rl.update_epochs else ()),
             *((("trainer.algorithm.use_entropy_loss", True), ("trainer.algorithm.entropy_loss_coef",
                                                                 job.rl.entropy_coeff))
               if job.rl and job.rl.entropy_coeff else ()),
             ("generator.n_samples_per_prompt", rollout),
             ("trainer.micro_train_batch_size_per_gpu", plan.micro_batch_size),
             ("trainer.micro_forward_batch_size_per_gpu", plan.micro_batch_size),
             ("generator.inference_engine.tensor_parallel_size", rtp),
             ("generator.inference_engine.num_engines", engines)]
        o += skyrl_rl_overrides(job, plan, notes)
        if job.rl is None:
            prompt, response, said = training_lengths(job)
            o += [("trainer.max_prompt_length", prompt), ("generator.sampling_params.max_generate_length", response)]
            notes.append(f"trainer.max_prompt_length + generator.sampling_params.max_generate_length: {said}")
        notes += [rtp_note, f"global_batch_size {job.global_batch_size} = train_batch_size {prompts} prompts x "
                  f"n_samples_per_prompt {rollout}; policy_mini_batch_size {mini} ({steps}).",
                  f"Inference engines: {engines} x TP {rtp}"
                  + (" on their own GPUs (colocate_all false)." if plan.placement == "separate" else
                     " on the same GPUs (colocate_all needs num_engines x TP x DP = policy GPUs).")]
    if not megatron:
        start = len(o)
        o += [("trainer.policy.sequence_parallel_size", plan.cp), ("trainer.ref.sequence_parallel_size", plan.cp),
              ("trainer.policy.fsdp_config.fsdp_size", fsdp_group(plan)),
              ("trainer.gradient_checkpointing", plan.recompute == "full")]
        if plan.param_offload:
            o.append(("trainer.policy.fsdp_config.cpu_offload", True))
        o += fsdp_reduce_dtype("trainer.policy.fsdp_config.mixed_precision", plan)
        if attention_value("skyrl", "fsdp", plan.attention_backend) == "true":  # flash_attention_2, SkyRL's default
            o.append(("trainer.flash_attn", True))
        if not plan.optimizer_offload:  # SkyRL's default is on (cards/frameworks/skyrl.yaml offload)
            o.append(("trainer.policy.optimizer_config.offload_after_step", False))
        if job.rl is not None and job.rl.algorithm == "ppo":
            # the critic (FSDP only) is estimated as the policy's plan: its own CriticConfig keys say so, whose
            # defaults (0.4.0 config.py: sequence_parallel_size 1, cpu_offload off, offload_after_step on) are not
            # it; CriticConfig has the policy's shape, so each policy key above is written again under the critic
            o += [("trainer.critic." + key.removeprefix("trainer.policy."), value) for key, value in o[start:]
                  if key.startswith("trainer.policy.")]
        notes.append("FSDP strategy: context parallelism is Ulysses sequence parallelism (sequence_parallel_size).")
        return o, notes
    roles = [prefix] if variant == "sft" else [prefix, "trainer.ref.megatron_config"]
    for role in roles:
        o += [(f"{role}.tensor_model_parallel_size", plan.tp), (f"{role}.pipeline_model_parallel_size", plan.pp),
              (f"{role}.context_parallel_size", plan.cp), (f"{role}.expert_model_parallel_size", plan.ep),
              (f"{role}.expert_tensor_parallel_size", plan.etp)]
        dispatcher = dict(megatron_dispatcher(job, plan))
        if "moe_token_dispatcher_type" in dispatcher:  # a MegatronConfig field of its own (default alltoall)
            o.append((f"{role}.moe_token_dispatcher_type", dispatcher.pop("moe_token_dispatcher_type")))
        o += [(f"{role}.transformer_config_kwargs.{k}", v) for k, v in [*kwargs, *dispatcher.items()]]
    if plan.cp > 1:
        o.append(("remove_microbatch_padding" if variant == "sft" else "trainer.remove_microbatch_padding", True))
    if variant != "sft" and not plan.optimizer_offload:  # SkyRL's default is on
        o.append(("trainer.policy.optimizer_config.offload_after_step", False))
    if job.precision == "fp8":  # MegatronConfig.fp8 / fp8_recipe, folded into its TransformerConfig kwargs
        o += [(f"{prefix}.fp8", "hybrid"), (f"{prefix}.fp8_recipe", fp8_recipe(job, plan))]
    optimizer = {**megatron_cpu_optimizer(job, plan), **megatron_precision_aware(plan)}  # one switch
    o += [(f"{prefix}.optimizer_config_kwargs.{k}", v) for k, v in optimizer.items()]
    if plan.grad_reduce_in_fp32 is False:  # MegatronDDPConfig's default is True
        o.append((f"{prefix}.ddp_config.grad_reduce_in_fp32", False))
    notes.append("SkyRL turns sequence parallelism on whenever TP > 1 (no key of its own); VPP, recompute and "
                 "uneven PP are TransformerConfig fields under transformer_config_kwargs, which SkyRL does not "
                 "check itself (Megatron-Core does, on the workers).")
    return o, notes


def build_skyrl(job: Job, plan: Plan, variant: str, version: str) -> Built:
    overrides, notes = skyrl_overrides(job, plan, variant)
    overrides += skyrl_lora(job, variant, notes)  # LoRA (meshplan/adapters/lora.py)
    flex, warnings = flex_notes(job, plan)
    module = "skyrl.train.main_sft" if variant in SKYRL_SFT else "skyrl.train.entrypoints.main_base"
    if variant not in SKYRL_SFT:
        sft = "sft-fsdp" if variant == "fsdp" else "sft"
        warnings = [*rl_launch_warning(job, f"SkyRL's RL trainer ({module})", f"; variant {sft} (--variant {sft}) "
                                       "writes SkyRL's SFT trainer, skyrl.train.main_sft"), *warnings]
    return Built(template="skyrl.j2", context={"overrides": overrides, "module": module}, format="hydra",
                 filename=f"run_skyrl_{variant}.sh", notes=[*notes, *flex], warnings=warnings)
