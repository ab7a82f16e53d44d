"""verl and SkyRL launch scripts: Hydra `key=value` overrides (`+`, `++` and `~` prefixes read) on the RL entry point.

The mini-batch keys count prompts, so the trainer's global batch is the mini-batch times the samples per prompt
(the card's rl defaults when the file leaves it out). The reference and critic models' own layouts are noted,
not estimated.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from meshplan.adapters.read.hydra_compose import compose_defaults, said_composed
from meshplan.adapters.read.keys import Reading, apply, as_bool, key_table, lora_rank, read_section, whole_value
from meshplan.adapters.read.launch import read_launch, world
from meshplan.adapters.read.settings import Setting, flag_settings, yaml_settings
from meshplan.arithmetic.mesh import file_data_parallel, rl_job_gpus
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card, rl_card
from meshplan.knowledge.catalog import resolve_model

# Models other than the one trained whose keys the scripts repeat: their layout is not a request field.
OTHER_MODELS = ("actor_rollout_ref.ref.", "critic.", "reward_model.", "trainer.ref.", "trainer.critic.")
# verl's adv_estimator names for meshplan's algorithms (verl/trainer/ppo/core_algos.py AdvantageEstimator: gae is
# PPO's critic-based estimator); SkyRL's advantage_estimator uses the same names.
ALGORITHMS = {"gae": "ppo", "grpo": "grpo"}


def _settings(text: str, path: str, framework: str) -> tuple[Reading, list[Setting]]:
    _, command, k, reading, _ = read_launch(text, path, framework)
    settings = _kept(reading, flag_settings(command.words[k + 1:]))
    reading.state("job", "rl", f"{path}:{command.line} {command.words[k].text}")
    return reading, settings


def _kept(reading: Reading, raw: list[Setting]) -> list[Setting]:
    """The overrides (or a YAML config's flattened keys) that set the trained model's job: the reference, critic and
    reward models' own keys left out and said; a reward model loaded, said as not counted; `~` deletions noted."""
    path, settings = reading.path, []
    for s in raw:
        if s.key.lstrip("+~") == "reward_model.enable" and as_bool(s.value):
            reading.unsupported.append(f"{s.where(path)} = {s.value}: a reward model is loaded beside the trained "
                                       "one; meshplan counts none (its weights and passes are in no phase)")
        if s.key.lstrip("+~") == "critic.enable":  # verl's need_critic: this, else the estimator (gae)
            reading.extra["critic_enable"] = (s.value, s)
        if s.key.lstrip("+~").startswith(OTHER_MODELS):
            continue
        if s.key.startswith("~"):
            reading.notes.append(f"{s.where(path)}: deleted (Hydra '~'): the framework's default applies")
            continue
        if str(s.value) == MISSING:  # OmegaConf's mandatory value, left to the launch: not a value of the file
            reading.notes.append(f"{s.where(path)} = {MISSING}: OmegaConf's missing value (the launch must give it), "
                                 "so the file sets nothing here")
            continue
        settings.append(s)
    if any(s.key.lstrip("+~").startswith(OTHER_MODELS) for s in raw):
        reading.notes.append("the reference / critic models' own layout keys are not read: meshplan estimates the "
                             "trained model's")
    return settings


MISSING = "???"
"""OmegaConf's MISSING: a mandatory value the config leaves to its launch (verl's _generated_ppo_trainer.yaml
actor_rollout_ref.rollout.name), never a value; reading it raises MissingMandatoryValue."""


HYDRA_YAML = {"verl": ("actor_rollout_ref",), "skyrl": ("trainer", "generator")}
"""The top-level sections that mark an RL trainer's own Hydra YAML config (verl's ppo_trainer.yaml and the examples'
copies; SkyRL's trainer config), read as the same dotted keys the launch scripts' overrides give."""


def _yaml(text: str, path: str, framework: str) -> tuple[Reading, list[Setting]]:
    """An RL trainer's Hydra YAML config flattened into the dotted keys its overrides would give (one reader: the key
    table then reads them as it reads a launch script's), each at its line; the Hydra `hydra:` section and `_target_`
    keys left out, and a `defaults:` list said plainly: it pulls values from config files not given, whose keys this
    file leaves out and meshplan reads at the framework's defaults."""
    name = framework_card(framework).display_name
    every = yaml_settings(text, path, f"{name}'s Hydra config", f"Pass {name}'s trainer YAML or the launch script.",
                          refuses_duplicates=f"{name}'s Hydra loader (OmegaConf)")
    reading = Reading(framework, path)
    composed = compose_defaults(text, path, every, f"{name}'s Hydra config", f"Pass {name}'s trainer YAML or the "
                                "launch script.", f"{name}'s Hydra loader (OmegaConf)")
    for s in [] if composed is not None else every:
        if s.key == "defaults" and isinstance(s.value, list):
            pulled = [str(item) if not isinstance(item, dict) else ", ".join(f"{k}: {v}" for k, v in item.items())
                      for item in s.value if item != "_self_"]
            if pulled:
                reading.assumed.append(
                    f"{s.where(path)}: [{'; '.join(pulled)}]: Hydra composes this file over those config "
                    "files, which are not given: a key this file leaves out is read at meshplan's default for "
                    f"{name} (cards/frameworks/{framework}.yaml), not at theirs. Pass the launch script, or those "
                    "keys as flags")
    if composed is not None:
        said_composed(reading, composed, name, framework)
    raw = [s for s in (every if composed is None else composed.settings)
           if s.key.split(".")[0] not in ("defaults", "hydra") and not s.key.endswith("_target_")]
    base = next((Setting("--config-name", item, s.line) for s in every if s.key == "defaults" and
                 isinstance(s.value, list) for item in s.value if isinstance(item, str) and item != "_self_"), None)
    if base is not None:  # the primary config it composes over, as a launch script's --config-name names it
        reading.extra["config_name"] = (base.value, base)
    settings = _kept(reading, raw)
    sections = " and ".join(HYDRA_YAML[framework])
    reading.state("job", "rl", f"{path} ({name}'s RL trainer config: top-level {sections})")
    return reading, settings


def _algorithm(reading: Reading, left: list[tuple[Setting, object]]) -> None:
    """The file's advantage estimator as meshplan's algorithm: gae is PPO; grpo is meshplan's grpo where a KL term
    loads the reference model, else its dapo (no reference, no critic). The key was read as the request field
    itself, so 'gae' (every PPO config, what render writes) was refused and DAPO came back as grpo."""
    read = read_section(reading.framework)
    estimator = next((s for s, m in left if getattr(m, "target", None) == "algorithm"), None)
    if estimator is None and read.estimator_default is None:
        return
    text = read.estimator_default if estimator is None else str(estimator.value).strip("'\"")
    at = f"{reading.path} (not given: {reading.framework}'s default, cards/frameworks/{reading.framework}.yaml " \
         "read.estimator_default)" if estimator is None else estimator.where(reading.path)
    name = ALGORITHMS.get(text, text)
    if name not in ("grpo", "ppo", "dapo"):
        reading.unsupported.append(f"{at} = {text}: meshplan models grpo, dapo and ppo")
        return
    terms = [(n, reading.extra[n]) for n in ("kl_loss", "kl_in_reward") if n in reading.extra]
    on = [s.where(reading.path) for _, (value, s) in terms if value is True or as_bool(value)]
    if not any(n == "kl_loss" for n, _ in terms) and read.kl_loss_default:
        on.append(f"the KL loss, on by default (cards/frameworks/{reading.framework}.yaml read.kl_source)")
    if name == "grpo" and not on:
        reading.state("algorithm", "dapo", f"{at} = {text} with no KL term, so no reference model (meshplan's dapo)")
    elif name == "ppo" and not on:
        reading.state("algorithm", "ppo", at)
        reading.notes.append(f"{at} = {text} with no KL term: the run loads no reference model, which meshplan's "
                             "ppo counts (its memory and step are over by the reference's)")
    else:
        reading.state("algorithm", name, at)
    _critic_enable(reading, name == "ppo")


def _critic_enable(reading: Reading, ppo: bool) -> None:
    """verl's critic.enable where it says other than the estimator (need_critic: critic.enable, else gae): meshplan's
    ppo counts a critic and its grpo and dapo none, so the difference is said."""
    enable = reading.extra.get("critic_enable")
    trains = None if enable is None else as_bool(enable[0])
    if trains is None or trains == ppo:
        return
    words = ("a critic is trained beside the actor, which meshplan's grpo and dapo count none of" if trains else
             "the run trains no critic, which meshplan's ppo counts (its memory and step are over by the critic's)")
    reading.unsupported.append(f"{enable[1].where(reading.path)} = {enable[0]}: {words}")


def _not_modelled(reading: Reading) -> None:
    """What the file sets that meshplan's RL step does not model, said where it differs from the model: the log-prob
    passes' own micro-batch (meshplan's log-prob phase runs the training micro-batch), once dropped without a word.
    (The update's passes over the batch, ppo_epochs / update_epochs_per_batch, are the request's update_epochs.)"""
    log_prob, train = reading.whole("log_prob_micro_batch"), reading.request.get("micro_batch_size")
    packed = reading.extra.get("dynamic_batch")  # verl's use_dynamic_bsz: token-budget micro-batches, this size unused
    if log_prob is not None and log_prob != train and not (packed and (packed[0] is True or as_bool(packed[0]))):
        s = reading.extra["log_prob_micro_batch"][1]
        runs = f"micro_batch_size {train}" if train is not None else "the training micro_batch_size"
        reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: the log-prob passes' micro-batch; "
                                   f"meshplan's log_prob phase runs {runs} sequences a micro-batch")


def _entropy_loss(reading: Reading) -> None:
    """SkyRL's entropy loss as the request's entropy_coeff: use_entropy_loss on states its entropy_loss_coef (the
    card's read.entropy_coef_default where the file leaves it out), off states 0 where the file names a coefficient
    (a coefficient SkyRL does not use). verl's actor.entropy_coeff is the field itself (read.keys)."""
    switch, coef = reading.extra.get("use_entropy_loss"), reading.extra.get("entropy_loss_coef")
    if switch is None:
        if coef is not None:
            reading.state("entropy_coeff", 0.0, f"{coef[1].where(reading.path)} (use_entropy_loss left out: off)")
        return
    if not as_bool(switch[0]):
        reading.state("entropy_coeff", 0.0, switch[1])
    elif coef is not None:
        reading.state("entropy_coeff", coef[0], coef[1])
    else:
        default = read_section(reading.framework).entropy_coef_default
        reading.state("entropy_coeff", default, f"{switch[1].where(reading.path)} (entropy_loss_coef left out: "
                                                 f"{default}, cards/frameworks/{reading.framework}.yaml "
                                                 "read.entropy_coef_default)")


def _rl_fields(reading: Reading, left: list[tuple[Setting, object]]) -> None:
    _algorithm(reading, left)
    _not_modelled(reading)
    _entropy_loss(reading)
    mini = next((s for s, m in left if getattr(m, "target", None) == "global_batch_size"), None)
    prompts = reading.request.get("prompts_per_step")
    size = whole_value(reading, mini.value, mini) if mini is not None else None
    if size is not None and reading.request.get("job") == "rl" and prompts is not None and size != prompts:
        # An RL step's batch is its prompts x samples (meshplan/rl/job.py); the PPO mini-batch splits the update into
        # optimizer steps (meshplan/rl/step_time.py mini_batch_update): prompts_per_mini_batch, not global_batch_size
        reading.state("prompts_per_mini_batch", size, mini)
    elif mini is not None:
        n = reading.request.get("samples_per_prompt")
        if n is None:
            card = rl_card(reading.framework)
            assert card is not None, "verl and SkyRL run RL jobs: their cards have rl sections"
            n = card.defaults.samples_per_prompt
            reading.default("samples_per_prompt", n, f"cards/frameworks/{reading.framework}.yaml rl defaults")
        reading.state("global_batch_size", size * int(n),
                      f"{mini.where(reading.path)} x samples per prompt {n} (the mini-batch counts prompts)")


def megatron_fsdp(reading: Reading, s: Setting) -> None:
    """verl's Megatron engine on Megatron-FSDP (megatron.use_megatron_fsdp true, the card's read.keys
    megatron_fsdp): said as not modelled, so no estimate is made from the file. meshplan's zero_stage 3 on verl is
    its FSDP engine (strategy fsdp2, cp as Ulysses), another engine with other bytes; false is verl's default."""
    if as_bool(s.value):
        reading.unsupported.append(
            f"{s.where(reading.path)} = {s.value}: verl's Megatron engine on Megatron-FSDP, which meshplan does not "
            "model (its zero_stage 3 on verl is the FSDP engine, strategy fsdp2); set it false for the distributed "
            "optimizer (zero_stage 1), or plan the FSDP engine")


def read_verl(text: str, path: str) -> Reading:
    """A verl RL launch script: the overrides on its entry point."""
    return _read_verl(*_settings(text, path, "verl"))


def read_verl_yaml(text: str, path: str) -> Reading:
    """verl's RL trainer YAML (ppo_trainer.yaml, the examples' config/*.yaml): its keys as the overrides they are."""
    return _read_verl(*_yaml(text, path, "verl"))


def _read_verl(reading: Reading, settings: list[Setting]) -> Reading:
    path = reading.path
    engine = {s.key.lstrip("+"): str(s.value) for s in settings}
    if "config_name" in reading.extra:  # a YAML's defaults base (ppo_megatron_trainer): its --config-name
        engine.setdefault("--config-name", str(reading.extra["config_name"][0]))
    megatron = (engine.get("model_engine") == "megatron" or engine.get("actor_rollout_ref.actor.strategy") ==
                "megatron" or "megatron" in engine.get("--config-name", "") or any(".megatron." in k for k in engine))
    reading.variant = "megatron" if megatron else "fsdp"
    left = apply(reading, settings, key_table("verl", variant=reading.variant),
                 frozenset({"zero_0", "zero_1", "zero_2", "zero_3", "global_batch_size", "recompute_full",
                            "algorithm", "megatron_fsdp", "lora_rank"}))
    for s, m in left:
        if m.target == "megatron_fsdp":
            megatron_fsdp(reading, s)
        elif m.target == "lora_rank":  # 0, verl's default, is no LoRA
            lora_rank(reading, s)
        elif m.target in ("zero_0", "zero_1") and megatron and "zero_stage" not in reading.request:
            reading.state("zero_stage", 1 if as_bool(s.value) else 0, s)
        elif m.target == "zero_3" and megatron and as_bool(s.value):
            reading.state("zero_stage", 3, s)
        elif m.target == "recompute_full" and not megatron:
            reading.state("recompute", "full" if as_bool(s.value) else "none", s)
        elif m.target == "recompute_full":
            reading.state("recompute", granularity(s.value), s)
    if not megatron:
        reading.state("zero_stage", 3, f"{path} (verl's FSDP backend shards fully)")
        reading.state("tp", 1, f"{path} (verl's FSDP backend has no tensor parallelism)")
        reading.state("pp", 1, f"{path} (verl's FSDP backend has no pipeline parallelism)")
    elif "zero_stage" not in reading.request:
        reading.default("zero_stage", framework_card("verl").defaults.zero_stage,
                        "use_distributed_optimizer, cards/frameworks/verl.yaml defaults")
    _rl_fields(reading, left)
    dynamic_batch(reading)
    placeholder_model(reading)
    model_named_by_path(reading)
    framework_recompute(reading)
    if not trainer_world_default(reading):
        world(reading)
    one_step_off(reading)
    global_micro_batch(reading)
    return reading


def trainer_world_default(reading: Reading) -> bool:
    """The GPUs the trainer runs on where the file sets none of its world keys (the card's read.trainer_world: verl's
    ppo_trainer.yaml 1 node x 8, main_ppo's resource pool), stated as the framework's default; False where the file
    sets one (world() reads it) or leaves one without a value (an unset variable: said, not defaulted)."""
    default = read_section(reading.framework).trainer_world
    if default is None or "num_gpus" in reading.request or any(
            name in reading.extra or name in reading.request or name in reading.unread
            for name in ("nodes", "gpus_per_node")):
        return False
    where = (f"{reading.path} ({' / '.join(default.keys)} not set: {reading.framework}'s default "
             f"{default.nodes} x {default.gpus_per_node}, "
             f"cards/frameworks/{reading.framework}.yaml read.trainer_world)")
    reading.state("num_gpus", default.nodes * default.gpus_per_node, where)
    reading.defaults["num_gpus"] = default.nodes * default.gpus_per_node
    return True


def one_step_off(reading: Reading) -> None:
    """verl's one-step-off recipe (verl.experimental.one_step_off_policy.main_ppo): the rollout on a pool of its own,
    rollout.nnodes x rollout.n_gpus_per_node (1 x 8 unless set), beside the trainer's (trainer.*: the actor, critic and
    reference), so placement separate and num_gpus the two together. The trainer's n_gpus_per_node is its share of a
    node, not the node's GPUs: not stated as gpus_per_node."""
    if "one_step_off_policy" not in reading.sources.get("job", ""):
        return
    nodes, per_node = reading.whole("rollout_nodes") or 1, reading.whole("rollout_gpus_per_node") or 8
    where = " x ".join(reading.extra[k][1].where(reading.path) for k in ("rollout_nodes", "rollout_gpus_per_node")
                       if k in reading.extra) or "rollout.nnodes 1 x n_gpus_per_node 8 (one_step_off_ppo_trainer.yaml)"
    reading.state("placement", "separate", f"{reading.sources['job']} (a rollout pool of its own)")
    reading.state("rollout_gpus", nodes * per_node, where)
    if "num_gpus" in reading.request:
        reading.state("num_gpus", rl_job_gpus(reading.request["num_gpus"], False, "separate", nodes * per_node),
                      f"{reading.sources['num_gpus']} (the trainer's) + rollout_gpus {nodes * per_node}")
    if "trainer.n_gpus_per_node" in reading.sources.get("gpus_per_node", ""):
        reading.request.pop("gpus_per_node")
        reading.notes.append(f"{reading.sources.pop('gpus_per_node')}: the trainer's GPUs on each node, beside the "
                             "rollout's: the node's own count is the GPU's (pass --gpus-per-node)")


def global_micro_batch(reading: Reading) -> None:
    """verl's deprecated actor.ppo_micro_batch_size, sequences over the data-parallel ranks, as the micro-batch per GPU
    verl divides it into (fsdp_workers.py: by the device mesh over the Ulysses size; megatron_workers.py: by Megatron's
    data-parallel size); it was 'no meshplan field' and the micro-batch left to the default."""
    given = reading.extra.get("global_micro_batch")
    if given is None or "micro_batch_size" in reading.request:
        return
    gpus, where = reading.request.get("num_gpus"), given[1].where(reading.path)
    dp = file_data_parallel(gpus, *(int(reading.request.get(n, 1)) for n in ("tp", "pp", "cp"))) if gpus else None
    size = whole_value(reading, *given)
    if dp is None or size < dp:
        reading.unresolved.append(f"{where} = {given[0]}: sequences over the data-parallel ranks, which the file's "
                                  "GPU count does not divide into one a GPU at least (pass micro_batch_size)")
        return
    reading.state("micro_batch_size", size // dp, f"{where} = {given[0]} / data-parallel size {dp} (the deprecated "
                                                  "global micro-batch, divided as verl's workers do)")


def framework_recompute(reading: Reading) -> None:
    """The recompute a file leaving its keys out runs: the framework's default for its variant (the card's
    read.absent_by_variant: verl's FSDP actor and SkyRL's workers checkpoint every layer by default, read as none
    before), the method and layers only where that recompute is full. SkyRL's Megatron worker drops the recompute
    settings when trainer.gradient_checkpointing is false (megatron_worker.py), whatever the kwargs say."""
    read, where = read_section(reading.framework), f"cards/frameworks/{reading.framework}.yaml read.absent_by_variant"
    switch = reading.extra.get("gradient_checkpointing")
    if switch is not None and as_bool(switch[0]) is False and reading.variant in ("rl", "sft"):
        for name in ("recompute_method", "recompute_layers", "recompute_modules"):
            reading.request.pop(name, None)
            reading.sources.pop(name, None)
        reading.state("recompute", "none", f"{switch[1].where(reading.path)} (SkyRL's Megatron worker drops "
                                           "recompute_granularity, method and num_layers without it)")
    if any(t.startswith("recompute") or t == "gradient_checkpointing" for t in reading.unread):
        return  # a recompute key with no value (an unset variable): said as unresolved, no default stated over it
    for name, value in read.absent_by_variant.get(reading.variant or "", {}).items():
        if name in reading.request or (name != "recompute" and reading.request.get("recompute") != "full"):
            continue
        reading.state(name, value, f"{reading.path} (not given: {reading.framework}'s default, {where})")
        reading.defaults[name] = value


def placeholder_model(reading: Reading) -> None:
    """The model path verl's packaged config holds in place of one (the card's read.placeholder_model), which its
    example Hydra configs inherit: no model, said as such and left to the request, where check refused it as a path
    with no config.json."""
    section = read_section(reading.framework)
    model = reading.request.get("model")
    if section.placeholder_model is None or not isinstance(model, str) or (
            Path(model).expanduser() != Path(section.placeholder_model).expanduser()):
        return
    where = reading.sources.pop("model")
    del reading.request["model"]
    reading.leave(("model",), f"model: {where} = {model} is verl's packaged placeholder path "
                              f"({section.placeholder_model_source}), not a model: pass the model (--model, or the "
                              "tool's model argument)")


def model_named_by_path(reading: Reading) -> None:
    """A model path that is not on this machine and is no catalog id, whose last folder names a catalog model (the
    RL scripts load a local copy of the Hugging Face repository, $HOME/models/Qwen3-235B-A22B): that model, said."""
    model = reading.request.get("model")
    if not isinstance(model, str) or "/" not in model:
        return
    try:
        resolve_model(model)
        return
    except MeshplanError:
        pass
    name = model.rstrip("/").rsplit("/", 1)[-1]
    if not name or server_files.exists(model):  # a remote caller's path is on its own machine, not probed here
        return
    try:
        resolve_model(name)
    except MeshplanError:
        return
    reading.state("model", name, f"{reading.sources['model']} = {model} (its folder's name: a local copy of {name}, "
                                 "not on this machine)")


def dynamic_batch(reading: Reading) -> None:
    """verl's actor.use_dynamic_bsz: micro-batches packed to ppo_max_token_len_per_gpu tokens (times cp), the
    micro-batch size ignored; at the script's maximum sequence length (prompt + response) that is budget * cp // length
    sequences per micro-batch; a budget below one sequence is unresolved (verl asserts it holds the longest).
    The micro-batches it packs exceed the budget, their count the MAX over the DP ranks (rounded up to the
    virtual-pipeline group where vpp > 1): rl/packing.py sizes the update at the largest."""
    switch, budget = reading.extra.get("dynamic_batch"), reading.extra.get("token_budget")
    if switch is None or not (switch[0] is True or as_bool(switch[0])):
        return
    length = (reading.request.get("prompt_length") or 0) + (reading.request.get("response_length") or 0)
    if budget is None or not length:
        reading.unresolved.append(f"{switch[1].where(reading.path)}: token-budget micro-batches need "
                                  "ppo_max_token_len_per_gpu and the prompt and response lengths to be read")
        return
    tokens = int(float(str(budget[0]).strip("'\""))) * int(reading.request.get("cp", 1))
    if tokens < length:  # verl utils/seqlen_balancing.py rearrange_micro_batches: assert max_token_len >= max_seq_len
        reading.unresolved.append(f"{budget[1].where(reading.path)} = {budget[0]} tokens per micro-batch is below "
                                  f"the longest sequence ({length} tokens, prompt + response): verl's "
                                  "rearrange_micro_batches asserts max_token_len >= the sequence length")
        return
    stated = reading.request.get("micro_batch_size")
    reading.state("micro_batch_size", max(1, tokens // length),
                  f"{budget[1].where(reading.path)} = {budget[0]} tokens per micro-batch (use_dynamic_bsz, "
                  f"{switch[1].where(reading.path)}) / {length} tokens per sequence")
    if stated is not None:
        reading.notes.append(f"ppo_micro_batch_size_per_gpu = {stated} is not used: use_dynamic_bsz packs "
                             "micro-batches to the token budget")


def read_skyrl(text: str, path: str) -> Reading:
    """A SkyRL launch script: the overrides on its entry point (main_base, or main_sft)."""
    return _read_skyrl(*_settings(text, path, "skyrl"), sft="main_sft" in text)


def read_skyrl_yaml(text: str, path: str) -> Reading:
    """SkyRL's RL trainer YAML (top-level trainer and generator): its keys as the overrides they are."""
    return _read_skyrl(*_yaml(text, path, "skyrl"), sft=False)


def _read_skyrl(reading: Reading, settings: list[Setting], sft: bool) -> Reading:
    path = reading.path
    values = {s.key.lstrip("+"): str(s.value).strip("'\"") for s in settings}
    strategy = values.get("trainer.strategy", values.get("strategy", "fsdp2" if not sft else "megatron"))
    # main_sft runs either strategy too (SFTConfig.strategy "megatron" or "fsdp"): its fsdp was read as Megatron's
    reading.variant = "fsdp" if strategy.startswith("fsdp") else "sft" if sft else "rl"
    if sft:
        reading.request.pop("job")
        reading.state("job", "sft", f"{path} (skyrl.train.main_sft)")
        settings = _sft_keys(settings)
    left = apply(reading, settings, key_table("skyrl", variant=reading.variant),
                 frozenset({"zero_0", "zero_1", "zero_2", "zero_3", "global_batch_size", "recompute_full",
                            "algorithm", "fp8"}))
    for s, m in left:
        if m.target == "global_batch_size" and sft:  # SFTConfig.batch_size: sequences, not prompts
            reading.state("global_batch_size", s.value, s)
        elif m.target == "fp8" and str(s.value).strip("'\"") not in ("null", "None", ""):  # MegatronConfig.fp8's format
            reading.state("precision", "fp8", s)
        elif m.target == "recompute_full" and reading.variant == "fsdp":
            reading.state("recompute", "full" if as_bool(s.value) else "none", s)
        elif m.target == "recompute_full":
            reading.state("recompute", granularity(s.value), s)
    if sft and reading.request.get("lora_rank"):  # main_sft trains the adapters alone (SFTConfig.model.lora)
        reading.state("job", "lora", f"{reading.sources['lora_rank']} (skyrl.train.main_sft with a LoRA rank)")
    stage = 3 if reading.variant == "fsdp" else framework_card("skyrl").defaults.zero_stage
    source = reading.extra.get("strategy")
    reading.state("zero_stage", stage, source[1] if source else f"{path} (trainer.strategy not given: {strategy})")
    if reading.variant == "fsdp":
        reading.state("tp", 1, f"{path} (SkyRL's FSDP strategy has no tensor parallelism)")
        reading.state("pp", 1, f"{path} (SkyRL's FSDP strategy has no pipeline parallelism)")
    if not sft:
        _rl_fields(reading, left)
    model_named_by_path(reading)
    framework_recompute(reading)
    world(reading)
    if not sft:
        skyrl_pools(reading)
    elif reading.variant == "fsdp":  # read with the RL entry point's FSDP keys; the file is main_sft's (a fix's keys)
        reading.variant = "sft-fsdp"
    return reading


def skyrl_pools(reading: Reading) -> None:
    """SkyRL's trainer.placement.colocate_all false: the rollout engines on GPUs of their own (placement separate,
    num_engines x TP x DP of them) and PPO's critic on as many as the policy's (the rl card's
    critic_apart_when_separate), so num_gpus is the job's, theirs added to the policy's. Read as the policy's alone,
    such a file was a colocated job on a quarter of its GPUs."""
    policy = reading.request.get("num_gpus")
    _other_pools(reading, policy)
    card = rl_card("skyrl")
    assert card is not None, "SkyRL runs RL jobs: its card has an rl section"
    engines = reading.whole("num_engines")
    tp = int(reading.request.get("rollout_tp", card.defaults.rollout_tp))
    dp = int(reading.request.get("rollout_dp", card.defaults.rollout_dp))
    where = reading.extra["num_engines"][1].where(reading.path) if engines else "num_engines 1 (SkyRL's default)"
    colocate = reading.extra.get("colocate_all")
    if colocate is None or as_bool(colocate[0]) is not False:
        if engines and policy and engines * tp * dp != policy:  # validate_cfg (the card's rules_source) refuses it
            reading.unsupported.append(
                f"{where}: {engines} engines x rollout TP {tp} x DP {dp} = {engines * tp * dp} GPUs, but colocate_all "
                f"runs them on the policy's {policy}, and SkyRL's validate_cfg refuses a count that differs; meshplan "
                f"plans the {policy} GPUs' {policy // (tp * dp) or 1} engines")
        return
    reading.state("placement", "separate", colocate[1])
    rollout = (engines or 1) * tp * dp
    reading.state("rollout_gpus", rollout, f"{where} x rollout TP {tp} x DP {dp}")
    if policy is None:
        return
    critic = card.critic_on_own_gpus(reading.request.get("algorithm", card.defaults.algorithm), "separate")
    reading.state("num_gpus", rl_job_gpus(policy, critic, "separate", rollout),
                  f"{reading.sources['num_gpus']} (the policy's){' + as many for the critic' if critic else ''} + "
                  f"rollout_gpus {rollout} (colocate_all false)")


def _other_pools(reading: Reading, policy: int | None) -> None:
    """The reference's and critic's GPU counts, where the file gives both of a pair: meshplan runs each on as many as
    the policy's, so another count is said, not dropped."""
    for role in ("ref", "critic"):
        nodes, per_node = reading.whole(f"{role}_nodes"), reading.whole(f"{role}_gpus_per_node")
        if policy is None or nodes is None or per_node is None or nodes * per_node == policy:
            continue
        where = reading.extra[f"{role}_gpus_per_node"][1].where(reading.path)
        reading.unsupported.append(f"{where}: the {role} model on {nodes * per_node} GPUs; meshplan runs it on as "
                                   f"many as the policy's {policy}")


def _sft_keys(settings: list[Setting]) -> list[Setting]:
    """main_sft's keys as the RL entry point's (the card's read.sft_keys: SFTConfig's top-level megatron_config,
    placement and batch), so one key table reads both."""
    renames = read_section("skyrl").sft_keys
    out = []
    for s in settings:
        key = s.key.lstrip("+")
        to = renames.get(key) or next((new + key[len(old):] for old, new in renames.items()
                                        if old.endswith(".") and key.startswith(old)), key)
        out.append(replace(s, key=to, written=s.key) if to != key else s)
    return out


def granularity(value: object) -> str:
    """Megatron's recompute_granularity as a recompute: null (what render writes for none, Megatron's default) is
    none; it was passed on as 'null' and the import of a rendered verl/SkyRL config refused it."""
    text = str(value).strip("'\"")
    return "none" if text.lower() in ("null", "none", "~", "false") else text
