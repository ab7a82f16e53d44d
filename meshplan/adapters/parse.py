"""Reads a rendered snippet back into plan fields: the round-trip proof that the text says what the plan says.

Parsing uses each format's own reader (shlex for shell, tomllib, json, ast.literal_eval for the
Python assignments), never the adapters' internal lists, so a template that drops or garbles a key
fails the round trip.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import tomllib
from typing import Any

import yaml

from meshplan.adapters.common import (
    PRESET_CALL,
    absent_defaults,
    attention_backend_of,
    bridge_presets,
    plan_recompute,
    read_offload,
    torchtitan_batch,
)
from meshplan.adapters.lora import parsed_lora
from meshplan.adapters.read.keys import DTYPE_NAMES, schedule_named
from meshplan.arithmetic.schedule import parse_layout
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import adapter_section, knob_table
from meshplan.knowledge.cards import framework_card


def shell_tokens(text: str) -> list[str]:
    """The tokens of the snippet's commands (comments dropped, line continuations joined)."""
    return shlex.split(text.replace("\\\n", " "), comments=True)


def cli_flags(tokens: list[str]) -> dict[str, Any]:
    """--flag [values...]: no value -> True, one -> str, several -> list."""
    flags: dict[str, Any] = {}
    current: str | None = None
    for tok in tokens:
        if tok.startswith("--"):
            current = tok
            flags[current] = []
        elif current is not None:
            flags[current].append(tok)
    return {k: (True if not v else v[0] if len(v) == 1 else v) for k, v in flags.items()}


ENV_ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=")


def overrides(tokens: list[str]) -> dict[str, str]:
    """Hydra/OmegaConf key=value tokens, '+'/'++' prefixes kept in the key; a shell environment assignment
    (`export PYTORCH_CUDA_ALLOC_CONF=...`, an upper-case name) is not one."""
    return dict(tok.split("=", 1) for tok in tokens
                if "=" in tok and not tok.startswith("-") and not ENV_ASSIGNMENT.match(tok))


def _literal(text: str) -> Any:
    if text in ("null", "None"):
        return None
    if text in ("true", "false"):
        return text == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def python_assignments(text: str) -> dict[str, Any]:
    """cfg.<path> = <literal> lines; a torch dtype (torch.bfloat16) reads back as its text."""
    out = {}
    for m in re.finditer(r"^cfg\.([\w.]+) = (.+)$", text, re.M):
        value = m.group(2)
        if PRESET_CALL.fullmatch(value):
            out[m.group(1)] = PRESET_CALL.fullmatch(value).group(1)
            continue
        out[m.group(1)] = value if re.fullmatch(r"(torch|AttnBackend)\.\w+", value) else ast.literal_eval(value)
    return out


def _reduce_fp32(dtype: Any) -> dict[str, Any]:
    """grad_reduce_in_fp32 from the FSDP2 reduce_dtype a snippet names; nothing where it names none (the framework's
    default, fp32, which a plan leaves as None)."""
    return {} if dtype is None else {"grad_reduce_in_fp32": DTYPE_NAMES[str(dtype)] == "fp32"}


def _precision(aware: Any, dtype: Any, recipe: Any, gather: Any, reduce_fp32: Any) -> dict[str, Any]:
    """Plan precision fields from a snippet's values; the recipe and the reduce dtype only where it says them (left
    out, the framework runs its default, which a plan leaves as None)."""
    # the precision-aware optimizer without a moment dtype is the CPU optimizer's (offload), with fp32 moments
    out: dict[str, Any] = {"optimizer_state_dtype": DTYPE_NAMES[str(dtype)] if aware and dtype is not None else None}
    if gather is not None:
        out["fp8_param_gather"] = gather
    if recipe is not None:
        out["fp8_recipe"] = recipe
    if reduce_fp32 is not None:
        out["grad_reduce_in_fp32"] = reduce_fp32
    return out


def _world(nnodes: Any, per_node: Any) -> int:
    return int(nnodes) * int(per_node)


def _megatron_plan(get, world: int, num_layers: int, pp: int) -> dict[str, Any]:
    """Plan fields from Megatron-style names; `get(name)` returns the value or None."""
    tp, cp = int(get("tensor_model_parallel_size") or 1), int(get("context_parallel_size") or 1)
    vpp = get("virtual_pipeline_model_parallel_size")
    return {"tp": tp, "pp": pp, "cp": cp, "vpp": int(vpp) if vpp not in (None, "null") else 1,
            "ep": int(get("expert_model_parallel_size") or 1), "etp": int(get("expert_tensor_parallel_size") or 1),
            "dp": world // (tp * pp * cp)}


def parse_plan(framework: str, variant: str, text: str, num_layers: int) -> dict[str, Any]:
    """The plan fields a snippet expresses (a subset of Plan's fields, by framework)."""
    return _PARSERS[framework](variant, text, num_layers)


def _core(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    tokens = shell_tokens(text)
    launch = cli_flags(tokens[: tokens.index("pretrain_gpt.py")])
    f = cli_flags(tokens[tokens.index("pretrain_gpt.py") + 1:])
    pp = int(f["--pipeline-model-parallel-size"])
    first, last = f.get("--decoder-first-pipeline-num-layers"), f.get("--decoder-last-pipeline-num-layers")
    vpp = 1
    layout = f.get("--pipeline-model-parallel-layout")
    if layout is not None:
        vpp = len(parse_layout(layout)) // pp
    elif "--num-layers-per-virtual-pipeline-stage" in f:
        vpp = int(f["--num-layers"]) // (pp * int(f["--num-layers-per-virtual-pipeline-stage"]))
    elif "--num-virtual-stages-per-pipeline-rank" in f:
        vpp = int(f["--num-virtual-stages-per-pipeline-rank"])
    tp, cp = int(f["--tensor-model-parallel-size"]), int(f["--context-parallel-size"])
    zero = 1 if "--use-distributed-optimizer" in f else {"optim_grads": 2, "optim_grads_params": 3}.get(
        f.get("--data-parallel-sharding-strategy"), 0) if "--use-megatron-fsdp" in f else 0
    out = {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "dp": _world(launch["--nnodes"], launch["--nproc-per-node"])
           // (tp * pp * cp), "sequence_parallel": "--sequence-parallel" in f, "zero_stage": zero,
           "dp_replicate": int(f.get("--num-distributed-optimizer-instances", 1)),
           "micro_batch_size": int(f["--micro-batch-size"]),
           "first_stage_layers": int(first) if first else None, "last_stage_layers": int(last) if last else None,
           "pipeline_layout": layout, "account_for_embedding": "--account-for-embedding-in-pipeline-split" in f,
           "account_for_loss": "--account-for-loss-in-pipeline-split" in f,
           **plan_recompute(f.get("--recompute-granularity"), f.get("--recompute-method"),
                            f.get("--recompute-num-layers"), f.get("--recompute-modules"))}
    if "--expert-model-parallel-size" in f:
        out.update(ep=int(f["--expert-model-parallel-size"]), etp=int(f["--expert-tensor-parallel-size"]))
    if "--moe-token-dispatcher-type" in f:
        out["moe_token_dispatcher"] = f["--moe-token-dispatcher-type"]
    if "--overlap-moe-expert-parallel-comm" in f:
        out["moe_a2a_overlap"] = True
    out["tp_comm_overlap"] = "--tp-comm-overlap" in f
    out["cuda_graph_impl"] = f.get("--cuda-graph-impl", "none")
    modules = f.get("--cuda-graph-modules") or []
    out["cuda_graph_modules"] = tuple([modules] if isinstance(modules, str) else modules)
    out.update(_script_attention("megatron-core", "pretrain_gpt", f, _attention("megatron-core", "pretrain_gpt",
                                                                                 f.get("--attention-backend"))))
    if cp > 1:
        out["cp_comm_type"] = f["--cp-comm-type"]
    out["optimizer"] = f.get("--optimizer", "adam")
    out.update(_precision("--use-precision-aware-optimizer" in f, f.get("--exp-avg-dtype"), f.get("--fp8-recipe"),
                          True if "--fp8-param-gather" in f else None, False if "--grad-reduce-in-bf16" in f else None))
    out.update(read_offload({"fine_grained_activation_offloading": "--fine-grained-activation-offloading" in f,
                             "optimizer_cpu_offload": "--optimizer-cpu-offload" in f,
                             "optimizer_offload_fraction": f.get("--optimizer-offload-fraction", 1.0)}))
    return out


def _bridge(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    if variant == "run_recipe":
        s = {k: _literal(v) for k, v in overrides(shell_tokens(text)).items()}
        tokens = shell_tokens(text)
        launch = cli_flags(tokens[: tokens.index("scripts/training/run_recipe.py")])
        world = _world(launch["--nnodes"], launch["--nproc-per-node"])
    else:
        s = python_assignments(text)
        world = None
    m = {k[len("model."):]: v for k, v in s.items() if k.startswith("model.")}
    pp = int(m["pipeline_model_parallel_size"])
    out = _megatron_plan(m.get, world or 0, num_layers, pp)
    if world is None:
        out.pop("dp")
    fsdp = s.get("ddp.data_parallel_sharding_strategy")
    out.update(sequence_parallel=bool(m["sequence_parallel"]),
               zero_stage={"optim_grads": 2, "optim_grads_params": 3}.get(fsdp, 1 if s["ddp.use_distributed_optimizer"]
                                                                         else 0),
               micro_batch_size=int(s["train.micro_batch_size"]),
               dp_replicate=int(s.get("ddp.num_distributed_optimizer_instances", 1)),
               first_stage_layers=m.get("num_layers_in_first_pipeline_stage"),
               last_stage_layers=m.get("num_layers_in_last_pipeline_stage"),
               pipeline_layout=m.get("pipeline_model_parallel_layout"),
               account_for_embedding=bool(m.get("account_for_embedding_in_pipeline_split")),
               account_for_loss=bool(m.get("account_for_loss_in_pipeline_split")),
               **plan_recompute(m.get("recompute_granularity"), m.get("recompute_method"),
                                m.get("recompute_num_layers"), m.get("recompute_modules")))
    if out["cp"] > 1:
        out["cp_comm_type"] = m["cp_comm_type"]
    if "moe_token_dispatcher_type" in m:
        out["moe_token_dispatcher"] = m["moe_token_dispatcher_type"]
    if s.get("comm_overlap.overlap_moe_expert_parallel_comm"):
        out["moe_a2a_overlap"] = True
    out["tp_comm_overlap"] = bool(s.get("comm_overlap.tp_comm_overlap"))
    out["cuda_graph_impl"] = m.get("cuda_graph_impl", "none")
    out["cuda_graph_modules"] = tuple(m.get("cuda_graph_modules") or ())
    backend = m.get("attention_backend")
    out.update(_attention("megatron-bridge", "python", str(backend).removeprefix("AttnBackend.") if backend else None,
                          m.get("attention_dropout")))
    mp = {}
    if "mixed_precision" in s:  # a registered preset (its fp8_param_gather goes with the recipe), fields over it
        preset = bridge_presets().named(str(s["mixed_precision"]))
        if preset is None:
            raise MeshplanError(
                f"mixed_precision={s['mixed_precision']!r} is not one of Megatron-Bridge's registered presets that "
                "meshplan knows.",
                fix="Name one of " + ", ".join(p.name for p in bridge_presets().presets)
                    + ", or set the cfg.mixed_precision fields themselves.")
        mp = {"fp8_recipe": None if preset.recipe == "bf16" else preset.recipe}
    mp.update({k[len("mixed_precision."):]: v for k, v in s.items() if k.startswith("mixed_precision.")})
    out["optimizer"] = "muon" if "muon" in str(s.get("optimizer.optimizer", "adam")) else "adam"
    out.update(_precision(s.get("optimizer.use_precision_aware_optimizer"), s.get("optimizer.exp_avg_dtype"),
                          mp.get("fp8_recipe"), mp.get("fp8_param_gather"), mp.get("grad_reduce_in_fp32")))
    out.update(parsed_lora(s.get("peft.dim"), s.get("peft.target_modules")))
    out.update(read_offload({**m, **{k[len("optimizer."):]: v for k, v in s.items() if k.startswith("optimizer.")}}))
    return out


def _verl_sft(o: dict[str, Any], text: str) -> dict[str, Any]:
    """verl's SFT trainer (variant sft-fsdp): torchrun's world, sft_trainer_engine.yaml's engine, model, data keys."""
    world, cp = _torchrun_world(text), int(o["engine.ulysses_sequence_parallel_size"])
    return {**parsed_lora(o.get("model.lora_rank"), o.get("model.target_modules"), hf=True,
                          exclude=o.get("model.exclude_modules"), wrapped=o.get("model.target_parameters")),
            "tp": 1, "pp": 1, "cp": cp, "dp": world // cp, "zero_stage": 3,
            "micro_batch_size": int(o["data.micro_batch_size_per_gpu"]),
            "dp_replicate": _replicas(world, o.get("engine.fsdp_size", -1)),
            **_attention("verl", "fsdp", o.get("model.override_config.attn_implementation")),
            "recompute": "full" if o["model.enable_gradient_checkpointing"] else "none",
            "activation_offload": bool(o.get("model.enable_activation_offload")),
            "param_offload": bool(o.get("engine.param_offload")),
            "optimizer_offload": bool(o.get("engine.optimizer_offload")),
            **_reduce_fp32(o.get("engine.mixed_precision.reduce_dtype"))}


def _replicas(world: int, fsdp_size: Any) -> int:
    """dp_replicate from verl's / SkyRL's fsdp_config.fsdp_size: world / the shard group, 1 for every rank (-1)."""
    shard = int(fsdp_size)
    return world // shard if 0 < shard < world else 1


def _torchrun_world(text: str) -> int:
    nodes, per_node = (int(re.search(rf"--{flag}[= ](\d+)", text).group(1)) for flag in ("nnodes", "nproc_per_node"))
    return nodes * per_node


def _verl(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    o = {k.lstrip("+"): _literal(v) for k, v in overrides(shell_tokens(text)).items()}
    if variant == "sft-fsdp":
        return _verl_sft(o, text)
    sft = variant == "sft-megatron"  # the SFT trainer's Megatron engine: engine.*, data.*, model.* keys
    world = _torchrun_world(text) if sft else _world(o["trainer.nnodes"], o["trainer.n_gpus_per_node"])
    mbs = int(o["data.micro_batch_size_per_gpu" if sft else "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"])
    model = "model." if sft else "actor_rollout_ref.model."
    lora = parsed_lora(o.get(model + "lora_rank"), o.get(model + "target_modules"), hf=True,
                       exclude=o.get(model + "exclude_modules"), wrapped=o.get(model + "target_parameters")) \
        if variant == "fsdp" \
        else parsed_lora(o.get(model + "lora.rank"), o.get(model + "lora.target_modules"))
    if variant == "fsdp":
        cp = int(o["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"])
        return {**lora, "tp": 1, "pp": 1, "cp": cp, "dp": world // cp, "zero_stage": 3, "micro_batch_size": mbs,
                "dp_replicate": _replicas(world, o.get("actor_rollout_ref.actor.fsdp_config.fsdp_size", -1)),
                **_attention("verl", "fsdp", o.get("actor_rollout_ref.model.override_config.attn_implementation")),
                "recompute": "full" if o["actor_rollout_ref.model.enable_gradient_checkpointing"] else "none",
                "activation_offload": bool(o.get("actor_rollout_ref.model.enable_activation_offload")),
                "param_offload": bool(o.get("actor_rollout_ref.actor.fsdp_config.param_offload")),
                "optimizer_offload": bool(o.get("actor_rollout_ref.actor.fsdp_config.optimizer_offload")),
                **_reduce_fp32(o.get("actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype"))}
    p = "engine." if sft else "actor_rollout_ref.actor.megatron."
    t = p + "override_transformer_config."
    m = {k[len(p):]: v for k, v in o.items() if k.startswith(p)}
    out = _megatron_plan(m.get, world, num_layers, int(m["pipeline_model_parallel_size"]))
    out.update(lora)
    out.update(sequence_parallel=bool(m["sequence_parallel"]), micro_batch_size=mbs,
               zero_stage=1 if m["use_distributed_optimizer"] else 0,  # verl's zero_stage 3: its FSDP engine
               first_stage_layers=o.get(t + "num_layers_in_first_pipeline_stage"),
               last_stage_layers=o.get(t + "num_layers_in_last_pipeline_stage"),
               account_for_embedding=bool(o.get(t + "account_for_embedding_in_pipeline_split")),
               account_for_loss=bool(o.get(t + "account_for_loss_in_pipeline_split")),
               **plan_recompute(o.get(t + "recompute_granularity"), o.get(t + "recompute_method"),
                                o.get(t + "recompute_num_layers"), o.get(t + "recompute_modules")))
    out.update(_attention("verl", "megatron", o.get(t + "attention_backend"), o.get(t + "attention_dropout")))
    if out["cp"] > 1:
        out["cp_comm_type"] = o[t + "cp_comm_type"]
    if t + "moe_token_dispatcher_type" in o:
        out["moe_token_dispatcher"] = o[t + "moe_token_dispatcher_type"]
    aware = "optim." if sft else "actor_rollout_ref.actor.optim."
    grads = o.get(aware + "main_grads_dtype")
    out.update(_precision(o.get(aware + "use_precision_aware_optimizer"), o.get(aware + "exp_avg_dtype"), None, None,
                          None if grads is None else DTYPE_NAMES[str(grads)] == "fp32"))
    optim = aware + "override_optimizer_config."
    cpu = read_offload({**{k[len(t):]: v for k, v in o.items() if k.startswith(t)},
                        **{k[len(optim):]: v for k, v in o.items() if k.startswith(optim)}})
    out.update(cpu, param_offload=bool(m.get("param_offload")), optimizer_offload=bool(m.get("optimizer_offload")))
    out.setdefault("optimizer_offload_fraction", 0.0)
    return out


def _skyrl(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    o = {k: _literal(v) for k, v in overrides(shell_tokens(text)).items()}
    assert not any(k.startswith("+") for k in o), "SkyRL rejects a '+' prefix"
    sft = variant in ("sft", "sft-fsdp")  # main_sft's SFTConfig keys
    model = "model." if sft else "trainer.policy.model."  # main_sft's SFTConfig.model (skyrl_lora)
    lora = parsed_lora(o.get(f"{model}lora.rank"), o.get(f"{model}lora.target_modules"),
                       hf=variant in ("fsdp", "sft-fsdp"), exclude=o.get(f"{model}lora.exclude_modules"))
    if variant == "sft-fsdp":  # gradient checkpointing and flash attention: TrainerConfig defaults main_sft keeps
        cp, world = int(o["sequence_parallel_size"]), _world(o["placement.num_nodes"], o["placement.num_gpus_per_node"])
        return {**lora, "tp": 1, "pp": 1, "cp": cp, "dp": world // cp, "zero_stage": 3, "recompute": "full",
                "micro_batch_size": int(o["micro_train_batch_size_per_gpu"]),
                "dp_replicate": _replicas(world, o.get("fsdp_config.fsdp_size", -1)),
                "param_offload": bool(o.get("fsdp_config.cpu_offload", False)),
                **_reduce_fp32(o.get("fsdp_config.mixed_precision.reduce_dtype"))}
    if variant == "sft":
        world, p = _world(o["placement.num_nodes"], o["placement.num_gpus_per_node"]), "megatron_config."
        mbs = int(o["micro_train_batch_size_per_gpu"])
    else:
        world = _world(o["trainer.placement.policy_num_nodes"], o["trainer.placement.policy_num_gpus_per_node"])
        p, mbs = "trainer.policy.megatron_config.", int(o["trainer.micro_train_batch_size_per_gpu"])
    if variant == "fsdp":
        cp = int(o["trainer.policy.sequence_parallel_size"])
        flash = o.get("trainer.flash_attn")
        return {**lora, "tp": 1, "pp": 1, "cp": cp, "dp": world // cp, "zero_stage": 3, "micro_batch_size": mbs,
                "dp_replicate": _replicas(world, o.get("trainer.policy.fsdp_config.fsdp_size", -1)),
                **_attention("skyrl", "fsdp", None if flash is None else str(flash)),
                "recompute": "full" if o["trainer.gradient_checkpointing"] else "none",
                **_reduce_fp32(o.get("trainer.policy.fsdp_config.mixed_precision.reduce_dtype"))}
    m = {k[len(p):]: v for k, v in o.items() if k.startswith(p)}
    kw = {k[len("transformer_config_kwargs."):]: v for k, v in m.items() if k.startswith("transformer_config_kwargs.")}
    get = lambda name: m.get(name, kw.get(name))  # noqa: E731
    out = _megatron_plan(get, world, num_layers, int(m["pipeline_model_parallel_size"]))
    out.update(lora)
    out.update(sequence_parallel=kw.get("sequence_parallel", out["tp"] > 1), micro_batch_size=mbs, zero_stage=1,
               first_stage_layers=kw.get("num_layers_in_first_pipeline_stage"),
               last_stage_layers=kw.get("num_layers_in_last_pipeline_stage"),
               account_for_embedding=bool(kw.get("account_for_embedding_in_pipeline_split")),
               account_for_loss=bool(kw.get("account_for_loss_in_pipeline_split")),
               **plan_recompute(kw.get("recompute_granularity"), kw.get("recompute_method"),
                                kw.get("recompute_num_layers"), kw.get("recompute_modules")))
    out.update(_attention("skyrl", variant, kw.get("attention_backend"), kw.get("attention_dropout")))
    if out["cp"] > 1:
        out["cp_comm_type"] = kw["cp_comm_type"]
    if "moe_token_dispatcher_type" in m:
        out["moe_token_dispatcher"] = m["moe_token_dispatcher_type"]
    opt = "optimizer_config_kwargs."
    out.update(_precision(m.get(opt + "use_precision_aware_optimizer"), m.get(opt + "exp_avg_dtype"),
                          m.get("fp8_recipe"), None, m.get("ddp_config.grad_reduce_in_fp32")))
    return out


def _torchtitan(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    if text.lstrip().startswith("#") and "[parallelism]" in text:
        doc = tomllib.loads(text)
        par, train, ac = doc["parallelism"], doc["training"], doc["activation_checkpoint"]["mode"]
        sp = par["tensor_parallel_degree"] > 1
        etp = par["expert_tensor_parallel_degree"]
        dispatcher = {"standard": "alltoall", "deepep": "flex"}.get(par.get("expert_parallel_comm_backend"))
        option = doc["activation_checkpoint"].get("selective_ac_option")
    else:
        tokens = shell_tokens(text)
        f = cli_flags([t for t in tokens if not t.startswith("activation-checkpoint:")])  # the subcommand
        par = {k.split(".", 1)[1]: _literal(v) for k, v in f.items() if k.startswith("--parallelism.")}
        train = {k.split(".", 1)[1]: _literal(v) for k, v in f.items() if k.startswith("--training.")}
        ac = next(t.split(":", 1)[1] for t in tokens if t.startswith("activation-checkpoint:"))
        sp = "enable_sequence_parallel" in par
        etp, dispatcher, option = 1, None, None
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    pp = par["pipeline_parallel_degree"]
    out = {"tp": par["tensor_parallel_degree"], "pp": pp, "cp": par["context_parallel_degree"],
           "ep": par["expert_parallel_degree"], "etp": etp, "dp": rep * shard, "zero_stage": 3 if shard > 1 or
           rep == 1 else 0, "sequence_parallel": sp, "recompute": ac, "vpp": 1,
           "dp_replicate": rep if shard > 1 else 1,  # HSDP: replicas of the FSDP2 shards
           **torchtitan_batch(train["local_batch_size"], par.get("pipeline_parallel_microbatch_size"), pp,
                              dp=rep * shard, global_batch_size=train.get("global_batch_size"))}
    if dispatcher is not None:
        out["moe_token_dispatcher"] = dispatcher
    if train.get("mixed_precision_reduce") == "float32":
        out["grad_reduce_in_fp32"] = True
    out["param_offload"] = bool(train.get("enable_cpu_offload"))
    if text.lstrip().startswith("#") and "[parallelism]" in text:
        out.update(_torchtitan_float8(doc))
        out["torch_compile"] = bool(doc.get("compile", {}).get("enable"))
        out["tp_comm_overlap"] = bool(par.get("enable_async_tensor_parallel"))
    else:
        out["torch_compile"] = f.get("--compile.enable") is True
        out["tp_comm_overlap"] = f.get("--compile.enable_async_tensor_parallel") is True
    if ac == "selective" and option not in (None, "op"):
        out["selective_ac_option"] = str(option)
    if pp > 1:
        m = par["pipeline_parallel_layers_per_stage"]
        first_less, last_less = par["pipeline_parallel_first_stage_less_layers"], par[
            "pipeline_parallel_last_stage_less_layers"]
        out["vpp"] = (num_layers + first_less + last_less) // m // pp
        out.update(_schedule("torchtitan", par.get("pipeline_parallel_schedule")))
        out["first_stage_layers"] = m - first_less if first_less else None
        out["last_stage_layers"] = m - last_less if last_less else None
    return out


def _torchtitan_float8(doc: dict[str, Any]) -> dict[str, Any]:
    """torchtitan 0.2.x TOML: the fp8 recipe (from the converter and its section) and the fp8 all-gather."""
    converters = doc.get("model", {}).get("converters", [])
    linear = doc.get("quantize", {}).get("linear", {})
    if "quantize.linear.mx" in converters:
        return {"fp8_recipe": "mxfp8"}
    if "quantize.linear.float8" in converters:
        f8 = linear["float8"]
        return {"fp8_recipe": f8["recipe_name"], **({"fp8_param_gather": True}
                                                     if f8.get("enable_fsdp_float8_all_gather") else {})}
    return {}


def _kempnerforge(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    doc = tomllib.loads(text)
    d, t = doc["distributed"], doc["train"]
    return {"tp": d["tp"], "pp": d["pp"], "cp": d["cp"], "ep": d["ep"], "dp": d["dp_shard"] * d["dp_replicate"],
            "zero_stage": 3 if d["dp_replicate"] == 1 and d["dp_shard"] > 1 else 0 if d["dp_shard"] == 1 else 3,
            "micro_batch_size": t["batch_size"], "recompute": t["activation_checkpointing"],
            **_attention("kempnerforge", variant, doc.get("model", {}).get("sdpa_backend")),
            **_schedule("kempnerforge", d.get("pp_schedule")),
            "torch_compile": bool(t.get("compile_model", True)),  # TrainConfig.compile_model defaults to true
            "optimizer": "muon" if doc.get("optimizer", {}).get("name") == "muon" else "adam"}  # default adamw


def _schedule(framework: str, name: Any) -> dict[str, Any]:
    """pipeline_schedule read back where the snippet names one other than the framework's default (1F1B, or its
    interleaved form, which vpp says): the card's pipeline.schedules name it."""
    named = schedule_named(framework, str(name)) if name else None
    if named is None or named in (framework_card(framework).pipeline.order, "interleaved_1f1b"):
        return {}
    return {"pipeline_schedule": named}


def _attention(framework: str, variant: str, backend: Any, dropout: Any = None) -> dict[str, Any]:
    """attention_backend read back (absent: auto) and dropout where the snippet turns it on (a probability > 0)."""
    out: dict[str, Any] = {"attention_backend": attention_backend_of(framework, variant, backend)}
    if dropout is not None and float(dropout) > 0:
        out["dropout"] = True
    return out


def _deepspeed(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    if variant == "config":
        cfg = json.loads(text)
        tp = pp = 1
        dp = cfg["train_batch_size"] // (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"])
        flags: dict[str, Any] = {}
    else:
        cfg = json.loads(text.split("<<'DS_CONFIG'\n", 1)[1].split("\nDS_CONFIG\n", 1)[0])
        tokens = shell_tokens(text.split("\nDS_CONFIG\n", 1)[1])
        launch = cli_flags(tokens[: tokens.index("pretrain_gpt.py")])
        flags = cli_flags(tokens[tokens.index("pretrain_gpt.py") + 1:])
        tp, pp = int(flags["--tensor-model-parallel-size"]), int(flags["--pipeline-model-parallel-size"])
        dp = _world(launch["--nnodes"], launch["--nproc-per-node"]) // (tp * pp)
    zero = cfg["zero_optimization"]
    out = {"tp": tp, "pp": pp, "dp": dp, "zero_stage": zero["stage"],
           "ep": int(flags.get("--moe-expert-parallel-size", 1)),
           "micro_batch_size": cfg["train_micro_batch_size_per_gpu"],
           "param_offload": zero.get("offload_param", {}).get("device") == "cpu",
           "optimizer_offload": zero.get("offload_optimizer", {}).get("device") == "cpu",
           "activation_offload": bool(cfg.get("activation_checkpointing", {}).get("cpu_checkpointing"))}
    if out["optimizer_offload"]:
        out["optimizer_offload_fraction"] = float(zero["offload_optimizer"].get("ratio", 1.0))
    if variant != "config":  # a plain ds_config cannot say which layers the model code checkpoints
        out["recompute"] = "full" if "--checkpoint-activations" in flags else flags.get("--recompute-granularity",
                                                                                        "none")
        out.update(_megatron_deepspeed_attention(flags))
    return out


def _megatron_deepspeed_attention(flags: dict[str, Any]) -> dict[str, Any]:
    """attention_backend and dropout of a Megatron-DeepSpeed script: the flash switch read back, and the dropout
    flags and what the script leaves out as _script_attention reads them (no flash switch is CoreAttention)."""
    card = framework_card("deepspeed")
    knobs = knob_table(card, adapter_section(card).default_version, "megatron-deepspeed")
    out = _attention("deepspeed", "megatron-deepspeed", "true") if knobs["attention_backend"].key in flags else {}
    return _script_attention("deepspeed", "megatron-deepspeed", flags, out)


def _script_attention(framework: str, variant: str, flags: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """`out` (the attention read back) with the dropout of a Megatron-style script: on where a dropout flag
    (attention, hidden) is above 0, and what the script leaves out at its launcher's own defaults
    (common.absent_defaults, the card's read.absent_by_variant: a dropout flag left out is 0.1 in Megatron-LM's
    pretrain_gpt.py and in Megatron-DeepSpeed)."""
    card = framework_card(framework)
    keys = (knob_table(card, adapter_section(card).default_version, variant)["dropout"].key or "").split()
    out = dict(out)
    if any(float(flags[key]) > 0 for key in keys if key in flags):
        out["dropout"] = True
    return {**out, **absent_defaults(framework, variant, flags, out)}


def _automodel(variant: str, text: str, num_layers: int) -> dict[str, Any]:
    """NeMo AutoModel's recipe YAML: distributed (sizes, strategy, pipeline, moe), step_scheduler, model.backend,
    compile, fp8 and peft (yaml.safe_load, as its own loader reads the file)."""
    doc = yaml.safe_load(text)
    d, steps = doc["distributed"], doc["step_scheduler"]
    pipe, pp = d.get("pipeline") or {}, d["pp_size"]
    backend = doc.get("model", {}).get("backend") or {}
    ac = d.get("activation_checkpointing", False)
    out: dict[str, Any] = {
        "tp": d["tp_size"], "pp": pp, "cp": d["cp_size"], "ep": d["ep_size"], "etp": 1, "dp": d["dp_size"],
        "dp_replicate": int(d.get("dp_replicate_size") or 1),
        "zero_stage": 0 if d.get("strategy") == "ddp" else 2 if d.get("reshard_after_forward") is False else 3,
        "sequence_parallel": bool(d.get("sequence_parallel", False)),
        "recompute": "selective" if ac == "selective" else "full" if ac is True else "none",
        "micro_batch_size": pipe["pp_microbatch_size"] if pp > 1 else steps["local_batch_size"],
        "torch_compile": bool((doc.get("compile") or {}).get("enabled", False)),
        "tp_comm_overlap": bool(d.get("enable_async_tensor_parallel", False)),
        "param_offload": "offload_policy" in d, "vpp": 1,
        **_attention("nemo-automodel", variant, backend.get("attn"))}
    if "dispatcher" in backend:
        out["moe_token_dispatcher"] = "flex" if backend["dispatcher"] in ("deepep", "hybridep") else "alltoall"
    out.update(_reduce_fp32((d.get("mp_policy") or {}).get("reduce_dtype")))  # FSDP2Config.mp_policy's
    fp8 = doc.get("fp8") or {}
    if fp8.get("enabled"):
        out["fp8_recipe"] = fp8["recipe_name"]
        out["fp8_param_gather"] = bool(fp8.get("enable_fsdp_float8_all_gather"))
    if pp > 1:  # one run of the schedule per accumulation step: fewer micro-batches than the step's when GA > 1
        per_run, every = steps["local_batch_size"] // pipe["pp_microbatch_size"], steps["global_batch_size"] // (
            pipe["pp_microbatch_size"] * d["dp_size"])
        out["pipeline_microbatches"] = per_run if per_run != every else None
    if pp > 1 and "layers_per_stage" in pipe:
        out["vpp"] = num_layers // (pipe["layers_per_stage"] * pp)
    elif pp > 1:
        counts = [sum(name.startswith("model.layers.") for name in stage)
                  for stage in pipe["module_fqns_per_model_part"]]
        middle = counts[1] if len(counts) > 2 else None
        out["first_stage_layers"] = counts[0] if counts[0] != middle else None
        out["last_stage_layers"] = counts[-1] if counts[-1] != middle else None
    peft = doc.get("peft") or {}
    return {**out, **parsed_lora(peft.get("dim"), peft.get("target_modules"), hf=True)}


_PARSERS = {"megatron-core": _core, "megatron-bridge": _bridge, "verl": _verl, "skyrl": _skyrl,
            "torchtitan": _torchtitan, "kempnerforge": _kempnerforge, "deepspeed": _deepspeed,
            "nemo-automodel": _automodel}
