"""A NeMo AutoModel recipe YAML read into a request: its distributed, step_scheduler, model.backend, dataset, compile,
fp8, peft and quantization sections (the keys' meanings from cards/frameworks/nemo-automodel.yaml, as keys.py derives
them).
The YAML is parsed with yaml's safe loader (no `_target_` is imported or run).
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace

from meshplan.adapters.lora import known_projections, read_targets, unknown_projections
from meshplan.adapters.read.keys import (
    SPLIT_NOT_READ,
    Reading,
    apply,
    as_bool,
    key_table,
    normalize,
    read_section,
    state_stage_split,
    whole_value,
)
from meshplan.adapters.read.launch import RANK_LAUNCHERS, named_file, read_launch, usage_comment_world, world
from meshplan.adapters.read.settings import Setting, yaml_settings
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import resolve_model

FRAMEWORK = "nemo-automodel"
# The sections that say something about the layout; the rest (optimizer, loss_fn, dataloader, checkpoint, ci ...)
# are left unread, not listed as unsupported.
READ_SECTIONS = ("distributed", "step_scheduler", "model", "dataset", "compile", "fp8", "peft", "benchmark",
                 "quantization")
# ... but for the loss's fp32 upcast, MaskedCrossEntropy's (the recipes' default loss_fn; cards/memory.yaml
# fsdp2_automodel logits_bytes_without_upcast): another loss class's fp32_upcast is not that one.
MASKED_CE = "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy"
# AutoModel's config loader reads these strings as None (components/config/loader.py translate_value).
NONE_WORDS = frozenset({"none", "None", "null", "~"})
SPECIAL = frozenset({"zero_0", "zero_2", "zero_3", "micro_batch_size", "fp8", "moe_flex_dispatcher", "lora_targets",
                     "vpp", "uneven_pp", "param_offload", "pipeline_schedule"})


def recipe_settings(text: str, path: str) -> list[Setting]:
    """The settings of the sections AutoModel's layout lives in (a mapping with a `_target_` under offload_policy is
    one switch; its loader's none words read as null); a YAML error names its line."""
    settings = yaml_settings(text, path, "an AutoModel recipe", "Start from `distributed:` and `step_scheduler:` "
                             "sections.", switches=("offload_policy",), none_words=NONE_WORDS)
    loss = next((str(s.value) for s in settings if s.key == "loss_fn._target_"), MASKED_CE)
    return [s for s in settings if (s.key.split(".")[0] in READ_SECTIONS and not s.key.endswith("._target_")
                                    and (not s.key.startswith("benchmark.") or s.key == "benchmark.num_nodes"))
            or (s.key == "loss_fn.fp32_upcast" and loss == MASKED_CE)]


def _strategy(reading: Reading, left: list) -> None:
    """distributed.strategy (fsdp2 | ddp | megatron_fsdp) and FSDP2's reshard_after_forward into zero_stage."""
    strategy = next((s for s, m in left if m.target in ("zero_0", "zero_3")), None)
    reshard = next((s for s, m in left if m.target == "zero_2"), None)
    name = str(strategy.value).lower() if strategy is not None else "fsdp2"
    if name == "megatron_fsdp":
        reading.unsupported.append(f"{strategy.where(reading.path)} = megatron_fsdp: meshplan models AutoModel's fsdp2 "
                                   "and ddp strategies (megatron-core's Megatron-FSDP is framework megatron-core)")
        return
    if name == "ddp":
        reading.state("zero_stage", 0, strategy)
    elif reshard is not None and as_bool(reshard.value) is False:
        reading.state("zero_stage", 2, reshard)
    elif strategy is not None:
        reading.state("zero_stage", 3, strategy)


MOE_RESHARD = "moe_reshard_after_forward"


def _expert_reshard(reading: Reading) -> None:
    """distributed.moe.reshard_after_forward against the zero stage read: with ep > 1 AutoModel builds
    MoEParallelizerConfig, whose reshard_after_forward (default false, the card's read source) decides alone whether
    the experts stay gathered from forward to backward. meshplan holds one policy for every unit (zero_stage 3
    reshards each, 2 keeps each gathered), so experts that differ from the rest are said, not estimated as the
    rest; left out at zero_stage 3 the default keeps them gathered. Before, the key was 'no meshplan field' even
    where it agreed, and its absence unsaid."""
    ep, dp = reading.request.get("ep", 1), reading.request.get("dp")
    if ep <= 1 or reading.request.get("zero_stage", 3) not in (2, 3):
        return
    if dp is not None and dp * reading.request.get("cp", 1) <= ep:  # no expert shard left to gather
        return
    zero = reading.request.get("zero_stage", 3)
    value, s = reading.extra.get(MOE_RESHARD, (None, None))
    gathered = value is None or as_bool(value) is False
    if gathered == (zero == 2):
        return
    where = s.where(reading.path) if s is not None else f"{reading.path} (distributed.moe.reshard_after_forward not " \
                                                           "given: AutoModel's default, false)"
    kept = "stay gathered from forward to backward" if gathered else "reshard after each forward"
    rest = "reshard" if zero == 3 else "stay gathered"
    reading.unsupported.append(
        f"{where}: the experts {kept} while the other FSDP units {rest} (zero_stage {zero}), which meshplan does not "
        "model (one policy for every unit: zero_stage 3 reshards each, 2 keeps each gathered); set "
        f"distributed.moe.reshard_after_forward: {'true' if zero == 3 else 'false'} for the estimate to hold"
        + (", or pass zero_stage=2 for an upper bound" if zero == 3 else ""))


def _pipeline(reading: Reading, num_layers: int | None) -> None:
    """vpp from the schedule and layers_per_stage (AutoModel: ceil(layers / layers_per_stage) virtual stages, rounded
    to a multiple of pp as round_virtual_stages_to_pp_multiple says); the micro-batch is pp_microbatch_size."""
    pp = reading.request.get("pp", 1)
    if pp == 1:
        return
    if "pp_micro_batch_size" in reading.extra:
        reading.state("micro_batch_size", *reading.extra["pp_micro_batch_size"])
    else:
        reading.default("micro_batch_size", 1, "PipelineConfig.pp_microbatch_size")
    local = reading.whole("local_batch")
    if local is not None:  # train_ft.py: one run of the schedule over local_batch_size // pp_microbatch_size
        mb = int(reading.request.get("micro_batch_size", 1))
        reading.state("pipeline_microbatches", max(1, local // mb), reading.extra["local_batch"][1])
    schedule = str(reading.value("pp_schedule") or "1f1b").lower().replace("_", "")
    per_stage = reading.whole("layers_per_stage")
    if schedule not in ("interleaved1f1b", "loopedbfs", "dfs", "vschedule", "zerobubble"):
        return
    if per_stage is None or num_layers is None:
        reading.unresolved.append(f"{reading.extra['pp_schedule'][1].where(reading.path)} {schedule}: vpp is "
                                  "layers / (pp x layers_per_stage); pass --vpp")
        return
    stages = -(-num_layers // per_stage)
    rounding = reading.value("round_stages")
    if stages % pp and rounding in ("up", "down"):
        stages = stages + pp - stages % pp if rounding == "up" else stages - stages % pp
    where = reading.extra["layers_per_stage"][1]
    if stages < pp:  # rounded down to none, or fewer chunks than ranks: AutoModel builds no such pipeline
        reading.unresolved.append(f"{where.where(reading.path)}: {num_layers} layers at {per_stage} per stage make "
                                  f"{stages} virtual stages, fewer than pp={pp}; pass --vpp")
        return
    reading.state("vpp", max(1, stages // pp), where)
    if num_layers % stages:
        reading.notes.append(f"{where.where(reading.path)}: {num_layers} layers over {stages} virtual stages; "
                             f"AutoModel puts the {num_layers % stages} extra layers on the first stages, meshplan "
                             "estimates its own split of them")


LAYER = re.compile(r"(?:.*\.)?layers\.(\d+)")
"""A decoder layer's module name in a model part (AutoModel's generate_hf_model_fqn_per_model_part: model.layers.N)."""


def _stage_parts(reading: Reading, s: Setting) -> None:
    """distributed.pipeline.module_fqns_per_model_part (what meshplan renders for an uneven split): the decoder layers
    of each part, read back as first/last stage layers (keys.state_stage_split); any other split is named as unread."""
    parts = s.value if isinstance(s.value, list) and all(isinstance(p, list) for p in s.value) else None
    layers = [[int(m.group(1)) for name in part if (m := LAYER.fullmatch(str(name)))] for part in parts or []]
    order = [index for part in layers for index in part]
    if parts is None:
        why = "not a list of module-name lists"
    elif order != list(range(len(order))):
        why = "its decoder layers are not model.layers.0, 1, ... in order over the parts"
    else:
        why = state_stage_split(reading, [len(part) for part in layers], s)
    if why is not None:
        reading.unresolved.append(f"{s.where(reading.path)}: {why}, which first/last stage layers do not state; "
                                  f"{SPLIT_NOT_READ} (and --vpp)")


def _model(reading: Reading) -> int | None:
    """The catalog model the file names (its Hugging Face id); its layer count, for vpp."""
    if "model" not in reading.request:
        reading.leave(("model",), "model: the file names no model (pass --model)")
        return None
    try:
        return resolve_model(reading.request["model"]).num_layers
    except MeshplanError:
        where = reading.sources.pop("model")
        reading.leave(("model",), f"{where}: {reading.request.pop('model')} is not in meshplan's catalog (pass "
                                  "--model with a catalog key or a config.json)")
        return None


def read_automodel_yaml(text: str, path: str) -> Reading:
    """An AutoModel recipe YAML (`automodel <recipe>.yaml --nproc-per-node N`)."""
    reading = Reading(FRAMEWORK, path, variant="yaml")
    _read_settings(reading, recipe_settings(text, path))
    _ci_world(reading, text)
    usage_comment_world(reading, text)
    _mesh_world(reading)
    if "num_gpus" not in reading.request:
        world(reading)
    return reading


def _mesh_world(reading: Reading) -> None:
    """num_gpus where the recipe states dp_size beside tp, pp and cp and nothing else says the count: AutoModel builds
    one device mesh of dp x cp x tp x pp ranks over the world (the card's mesh_utils source: dp left unset is the
    world / (tp x cp x pp)), and torch's init_device_mesh refuses a mesh that is not the world, so the sizes say it.
    A recipe at dp_size 8, tp/pp/cp 1 was checked on 8 GPUs while its reading said the file gives no count."""
    sizes = {name: reading.request.get(name) for name in ("dp", "cp", "tp", "pp")}
    if "num_gpus" in reading.request or "gpus_per_node" in reading.extra or "gpus_per_node" in reading.request:
        return
    if not all(isinstance(value, int) and value >= 1 for value in sizes.values()):
        return
    count = sizes["dp"] * sizes["cp"] * sizes["tp"] * sizes["pp"]
    reading.state("num_gpus", count, f"dp x cp x tp x pp ({reading.sources['dp']}: AutoModel's mesh is the world)")


def automodel_entry() -> str:
    """A pattern for a command running one of AutoModel's example entry points or its CLI (its card's read.launcher
    and read.cli)."""
    read = read_section(FRAMEWORK)
    return "(?:^|[\\s/])(?:" + "|".join(re.escape(name) for name in [*read.launcher, *read.cli]) + r")(?:\s|$)"


def read_automodel_launch(text: str, path: str) -> Reading:
    """A script that launches an AutoModel example entry point (`[torchrun --nproc_per_node=2] examples/llm_finetune/
    finetune.py --config RECIPE.yaml --distributed.tp_size 2 ...`, as its functional tests do): the recipe it names
    read, with the command's --dotted.key overrides over it as AutoModel's parse_args_and_load_config sets them (the
    card's read.launcher_source), and the GPU count from the command's launcher. Refused before, as a shell file of
    no framework meshplan could tell."""
    launch = read_launch(text, path, FRAMEWORK, variant="launch")
    reading, command, k = launch.reading, launch.command, launch.k
    cli = _is_cli(command.words[k].text)
    if cli:
        recipe, overrides, counts = _app_argv(reading, command, k, launch.settings)
    else:
        recipe, overrides = _cli_overrides(command.words[k + 1:])
    if recipe is None and cli:
        raise MeshplanError(f"{path}:{command.line} {command.words[k].text}: no recipe YAML is given; AutoModel's CLI "
                            "takes it as its first argument (`automodel <config.yaml> [--nproc-per-node N] "
                            "[--key.subkey=override ...]`) and argparse stops without it.",
                            fix="Pass the recipe YAML the script runs, or add it to the command.")
    if recipe is None:
        raise MeshplanError(f"{path}:{command.line} {command.words[k].text}: no --config (or -c) recipe is given, "
                            "and AutoModel's parse_cli_argv then stops ('You must specify --config <path>').",
                            fix="Pass the recipe YAML the script runs, or add --config RECIPE.yaml to the command.")
    recipe_path, recipe_text = named_file(reading, recipe, "" if cli else "--config", (".yaml", ".yml"),
                                           "AutoModel's")
    named = {normalize(s.key) for s in overrides}
    kept = [replace(s, file=recipe_path) for s in recipe_settings(recipe_text, recipe_path)
            if not any(s.key == key or s.key.startswith(key + ".") for key in named)]
    if not cli:
        counts = _launcher_counts(reading, command, k, launch.settings)
    if cli and _other_launcher(reading, recipe_text, recipe_path):
        counts = []
    if any(normalize(s.key) == "--nnodes" for s in counts):  # the launcher's nodes start the ranks: a recipe's
        for s in [s for s in kept + overrides if s.key == "benchmark.num_nodes"]:  # benchmark.num_nodes starts none
            reading.notes.append(f"{s.where(reading.path)} = {s.value}: the recipe's word for its nodes, which "
                                 "launches nothing (benchmark.py at 36044ad does not read it); the launcher's --nnodes "
                                 "sets the nodes the ranks run on, and is read")
        kept, overrides = ([s for s in group if s.key != "benchmark.num_nodes"] for group in (kept, overrides))
    _read_settings(reading, kept + overrides + counts)
    world(reading)
    return reading


def _cli_overrides(words: list) -> tuple[object | None, list[Setting]]:
    """The --config word and the --dotted.key overrides of an AutoModel entry point's argv, as parse_cli_argv splits
    them (--config / -c the recipe; --a.b=v, --a.b v, a bare --a.b is True; other words skipped), each value as
    loader.translate_value reads it; only the sections the recipe reader reads are kept (recipe_settings)."""
    recipe, out, i = None, [], 0
    while i < len(words):
        text = words[i].text
        if text in ("--config", "-c") and i + 1 < len(words):
            recipe, i = words[i + 1], i + 2
            continue
        if text.startswith("--"):
            key = text.lstrip("-")
            if "=" in key:
                key, value, at = *key.split("=", 1), words[i]
                i += 1
            elif i + 1 < len(words) and not words[i + 1].text.startswith("--"):
                value, at = words[i + 1].text, words[i + 1]
                i += 2
            else:
                value, at = "True", words[i]
                i += 1
            if key.split(".")[0] in READ_SECTIONS and not key.endswith("._target_") and \
                    (not key.startswith("benchmark.") or key == "benchmark.num_nodes"):
                via = f"{at.var} at line {at.var_line}" if at.var and at.var_line else None
                read = translate_value(value)  # a null as the recipe's own YAML null reads ("null")
                out.append(Setting(key, "null" if read is None else read, words[i - 1].line, via, written=f"--{key}"))
            continue
        i += 1
    return recipe, out


def _is_cli(word: str) -> bool:
    """Whether a launch word is AutoModel's CLI (the card's read.cli: `automodel`, `-m nemo_automodel.cli.app`)."""
    return any(word == name or word.endswith("/" + name) for name in read_section(FRAMEWORK).cli)


NPROC = ("--nproc-per-node", "--nproc_per_node")
"""The one option of AutoModel's CLI parser (cli/app.py build_parser) besides its positional recipe."""


def _app_argv(reading: Reading, command, k: int, launcher: list[Setting]) -> tuple[object | None, list[Setting],
                                                                                    list[Setting]]:
    """AutoModel's CLI argv as cli/app.py reads it: argparse's parse_known_args takes --nproc-per-node (or
    --nproc_per_node, `=N` or `N`) and the first word that is no option as the recipe (an option it does not know
    takes no value from argparse, so it belongs before its value); the words left are passed to
    parse_args_and_load_config as parse_cli_argv's overrides (a --config there replaces the recipe). The ranks: a
    torchrun around it (the CLI then runs the recipe in-process on torchrun's ranks, InteractiveLauncher), else
    --nproc-per-node, else every GPU of the node (determine_local_world_size), which the script does not say."""
    words, recipe, nproc, extra, i = command.words[k + 1:], None, None, [], 0
    while i < len(words):
        text = words[i].text
        name, eq, value = text.partition("=")
        if name in NPROC and eq:
            nproc, i = (value, words[i]), i + 1
        elif text in NPROC and i + 1 < len(words):
            nproc, i = (words[i + 1].text, words[i + 1]), i + 2
        elif recipe is None and not text.startswith("-"):
            recipe, i = words[i], i + 1
        else:
            extra.append(words[i])
            i += 1
    given, overrides = _cli_overrides(extra)
    recipe = given if given is not None else recipe
    before = " ".join(w.text for w in command.words[:k])
    if any(name in before for name in RANK_LAUNCHERS):
        reading.notes.append(f"{reading.path}:{command.line} {command.words[k].text}: run under "
                             "torch.distributed.run, AutoModel's CLI runs the recipe in-process on its ranks "
                             "(InteractiveLauncher): the launcher's counts are read, not its own --nproc-per-node")
        return recipe, overrides, _launcher_counts(reading, command, k, launcher)
    if nproc is not None:
        return recipe, overrides, [Setting("--nproc-per-node", nproc[0], nproc[1].line, written="automodel "
                                           "--nproc-per-node")]
    if "gpus_per_node" not in reading.extra:
        reading.leave(("num_gpus",), f"{reading.path}:{command.line} {command.words[k].text}: no --nproc-per-node, "
                                     "so AutoModel's CLI starts a process on every GPU of the node it runs on "
                                     "(determine_local_world_size), which the script does not say (pass --num-gpus)")
    return recipe, overrides, []


def _other_launcher(reading: Reading, text: str, path: str) -> bool:
    """A recipe with a skypilot: or nemo_run: section, which AutoModel's CLI launches through that launcher (its
    nodes and GPUs in that section, not read): said, and the command's own counts not read."""
    sections = [name for name in ("skypilot", "nemo_run") if re.search(rf"^{name}\s*:", text, re.M)]
    if sections:
        reading.leave(("num_gpus",), f"{path}: its {sections[0]}: section makes AutoModel's CLI launch the recipe "
                                     f"through {sections[0]}, whose nodes and GPUs meshplan does not read (pass "
                                     "--num-gpus)")
    return bool(sections)


def translate_value(text: str) -> object:
    """AutoModel's loader.translate_value: none/None, true/True, false/False, else ast.literal_eval, else the text."""
    special = {"none": None, "None": None, "true": True, "True": True, "false": False, "False": False}
    if text in special:
        return special[text]
    try:
        return ast.literal_eval(text) if len(text) <= 1000 else text
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return text


def _launcher_counts(reading: Reading, command, k: int, launcher: list[Setting]) -> list[Setting]:
    """The ranks the command starts: srun's tasks (read by read_launch), torch.distributed.run's --nproc-per-node and
    --nnodes (read by the card's keys), and where no launcher starts ranks (`python finetune.py`,
    `coverage run finetune.py`), one process: one GPU."""
    if "gpus_per_node" in reading.extra:  # srun starts a rank per task (launch._srun_ranks): its count is read
        return []
    before = " ".join(w.text for w in command.words[:k])
    if any(name in before for name in RANK_LAUNCHERS):
        counts = [s for s in launcher if normalize(s.key) in ("--nproc-per-node", "--nnodes")]
        if not any(normalize(s.key) == "--nproc-per-node" for s in counts):
            reading.notes.append(f"{reading.path}:{command.line}: torch.distributed.run without --nproc-per-node "
                                 "starts one process per node (its default 1)")
            counts.append(Setting("--nproc-per-node", 1, command.line, written="torchrun's default --nproc-per-node"))
        return counts
    return [Setting("--nproc-per-node", 1, command.line,
                    written=f"{command.words[k].text} started by no launcher (one process)")]


def _read_settings(reading: Reading, settings: list[Setting]) -> None:
    """A recipe's settings (or a launch script's recipe with its overrides) read into the request."""
    left = apply(reading, settings, key_table(FRAMEWORK), SPECIAL)
    _strategy(reading, left)
    _expert_reshard(reading)
    for s, m in left:
        if m.target == "micro_batch_size" and reading.request.get("pp", 1) == 1:
            reading.state("micro_batch_size", s.value, s)
        elif m.target == "micro_batch_size":
            reading.extra["local_batch"] = (s.value, s)
        elif m.target == "fp8" and as_bool(s.value):
            reading.state("precision", "fp8", s)
        elif m.target == "moe_flex_dispatcher":
            flex = str(s.value) in ("deepep", "hybridep", "uccl_ep")
            reading.state("moe_token_dispatcher", "flex" if flex else "alltoall", s)
        elif m.target == "lora_targets":
            reading.state("lora_targets", _lora_targets(reading, s), s)
            reading.extra["peft_targets"] = (s.value, s)
        elif m.target == "param_offload":
            reading.state("param_offload", True, s)
        elif m.target == "uneven_pp":
            _stage_parts(reading, s)
    if reading.request.get("tp_comm_overlap") and not reading.request.get("torch_compile"):
        where = reading.sources["tp_comm_overlap"]
        reading.state("tp_comm_overlap", False, where)
        reading.notes.append(f"{where}: async TP is an Inductor pass (torch._inductor.config._micro_pipeline_tp); "
                             "without compile.enabled or distributed.enable_compile AutoModel runs TP without it")
    if "lora_rank" in reading.request:
        _lora_notes(reading)
    _pipeline(reading, _model(reading))


def _ci_world(reading: Reading, text: str) -> None:
    """The GPUs AutoModel's CI runs the recipe on, from its ci: block (the card's read.ci_world), where the recipe's
    settings state none: nodes (1 where left out) x nproc_per_node; ci.nodes alone leaves the count unread (the
    ranks per node are the CI cluster's default, not in the repository), as does node_multiplier (scaled at run
    time). Said as assumed: the CI's run of the recipe, not its setting."""
    ci = read_section(FRAMEWORK).ci_world
    if ci is None or "gpus_per_node" in reading.extra or "gpus_per_node" in reading.request \
            or "num_gpus" in reading.request:
        return
    block = {s.key: s for s in yaml_settings(text, reading.path, "an AutoModel recipe", "Start from `distributed:` "
                                             "and `step_scheduler:` sections.", none_words=NONE_WORDS)
             if s.key.startswith("ci.")}
    nodes, ranks, dynamic = (block.get(k) for k in (ci.nodes_key, ci.gpus_per_node_key, ci.dynamic_key))
    if ranks is None:
        if nodes is not None:
            reading.notes.append(f"num_gpus: {nodes.where(reading.path)} = {nodes.value}: AutoModel's CI runs the "
                                 f"recipe on {nodes.value} node(s) of its cluster's default GPUs per node, which the "
                                 "repository does not hold, so no count is read")
        return
    if dynamic is not None and as_bool(dynamic.value):
        reading.notes.append(f"num_gpus: {dynamic.where(reading.path)}: AutoModel's CI scales the recipe's nodes at "
                             "run time, so its ci: block gives no count")
        return
    stated = reading.whole("nodes")
    if nodes is not None and stated is not None and stated != whole_value(reading, nodes.value, nodes):
        reading.notes.append(f"num_gpus: {nodes.where(reading.path)} = {nodes.value} is not the "
                             f"{reading.extra['nodes'][1].where(reading.path)} = {stated} the recipe runs on, so its "
                             "ci: block gives no count")
        return
    if nodes is not None:
        reading.extra.setdefault("nodes", (nodes.value, nodes))
    reading.extra["gpus_per_node"] = (ranks.value, ranks)
    count = f"{nodes.value if nodes is not None else ci.default_nodes} x {ranks.value}"
    reading.assumed.append(
        f"num_gpus: {count}, AutoModel's CI run of the recipe ({ranks.where(reading.path)}"
        + (f", {nodes.where(reading.path)}" if nodes is not None else f"; no {ci.nodes_key}: {ci.default_nodes} node")
        + "), not a setting of the recipe; pass --num-gpus for the count it runs on")


def _lora_notes(reading: Reading) -> None:
    """What AutoModel's PeftConfig adapts where meshplan's four targets say more: left out, target_modules is '*_proj'
    (module_matcher.py ModuleMatcher), and neither that nor a projection name matches a MoE layer's routed experts,
    one GroupedExperts module named 'experts', whose adapters linear_fc1/linear_fc2 count."""
    stated = reading.extra.get("peft_targets")
    if stated is None:
        reading.notes.append("peft.target_modules not given: AutoModel's PeftConfig then targets '*_proj', every "
                             "attention and MLP projection (not lm_head)")
    names = [] if stated is None else stated[0] if isinstance(stated[0], list) else [stated[0]]
    if any("experts" in str(n) or str(n) == "*" for n in names) or "model" not in reading.request:
        return
    try:
        arch = resolve_model(reading.request["model"])
    except MeshplanError:
        return
    if arch.moe is not None:
        where = stated[1].where(reading.path) if stated else "peft.target_modules"
        reading.notes.append(f"{where}: no pattern matches {arch.name}'s routed experts (each layer's GroupedExperts, "
                             "'experts'), so AutoModel adapts none of them, while meshplan's linear_fc1/linear_fc2 "
                             "count their adapters: the estimate holds more adapter weights than the run ('*.experts' "
                             "adapts them)")


def _lora_targets(reading: Reading, s: Setting) -> list[str]:
    """peft.target_modules (module names or wildcards over the Hugging Face projections) as Megatron target names;
    patterns over other module names (DeepSeek-V4's own wq_a, wkv, wo_b) are said: refused when none is left, noted
    as not counted beside those read (before, an empty list met the request's own check: "at least 1 item")."""
    names = s.value if isinstance(s.value, list) else [s.value]
    if any(re.fullmatch(r"\*(\.)?_?proj|\*_proj|\*", str(n)) for n in names):
        return read_targets("all-linear", hf=True)
    targets = read_targets(names, hf=True)
    unknown = unknown_projections(names)
    where = s.where(reading.path)
    if not targets:
        raise MeshplanError(
            f"{where}: {[str(n) for n in names]} match no linear meshplan knows"
            + (f" ({', '.join(map(str, unknown))} name modules outside its Hugging Face projections)" if unknown else
               " (a Megatron linear needs every projection of its group)") + ".",
            fix=f"meshplan reads these projections, each group making one Megatron linear: {known_projections()}; "
                "as names, paths ending in them ('*.q_proj'), or '*_proj' / '*' for every projection.")
    if unknown:
        reading.notes.append(f"{where}: {', '.join(map(str, unknown))} name no projection meshplan knows: their "
                             "adapters are not counted")
    return targets
