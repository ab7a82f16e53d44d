"""Job files read into a request: torchtitan (a 0.2.x TOML job file, or a 0.3 command line), KempnerForge's TOML
and a DeepSpeed JSON config. The keys' meanings come from the framework cards (keys.py).
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import replace

from meshplan.adapters.common import torchtitan_batch
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
from meshplan.adapters.read.launch import named_file, read_deepspeed_settings, read_launch, usage_comment_world, world
from meshplan.adapters.read.model_match import section_model
from meshplan.adapters.read.settings import Setting, flag_settings, json_settings, toml_settings
from meshplan.arithmetic.mesh import replica_size
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import adapter_section, knob_table
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model

_ZERO = frozenset({"zero_0", "zero_1", "zero_2", "zero_3"})


def _data_parallel(reading: Reading, shard_key: str, replicate_key: str) -> None:
    """FSDP shard x replicate degrees: zero_stage 3 when parameters are sharded, 0 for plain replication; a shard
    degree of -1 (the GPUs left over) leaves dp to the GPU count. dp is shard x replicate (torchtitan parallel_dims.py
    dp_replicate * dp_shard): the replicate degree is the request's dp_replicate where the card's knob states it
    (torchtitan), else the reader's extra (KempnerForge); read from the extra alone it was 1, and dp lost it. With a
    shard degree of 1 the replicas are plain data parallelism (render's zero_stage 0), not hybrid sharding, unless
    the file's cp is over 1 on a framework whose FSDP2 shards over the CP ranks too (the card's
    engine.torch_cp.shards_over_cp: torchtitan), which runs zero_stage 3 over them."""
    shard = reading.extra.get(shard_key)
    rep = int(reading.request.get(replicate_key) or reading.whole(replicate_key) or 1)
    if shard is None:
        return
    degree = reading.whole(shard_key, least=-1)  # -1: the GPUs left over
    if degree == 0:
        raise MeshplanError(f"{shard[1].where(reading.path)}: 0 is not a shard degree.",
                            fix="Use -1 (the GPUs left over) or a whole number of at least 1.")
    ring = framework_card(reading.framework).engine.torch_cp
    if degree == 1 and ring is not None and ring.shards_over_cp and int(reading.request.get("cp") or 1) > 1:
        cp = int(reading.request["cp"])
        reading.state("zero_stage", 3, shard[1])
        reading.notes.append(f"{shard[1].where(reading.path)} = 1 at context_parallel_degree {cp}: "
                             f"{reading.framework}'s FSDP2 shards over the data-shard x CP ranks whenever cp > 1 "
                             f"(ParallelDims.fsdp_enabled), so the states are sharded over {cp} ranks: zero_stage 3")
        reading.state("dp", rep, shard[1])
        return
    reading.state("zero_stage", 3 if degree != 1 else 0, shard[1])
    if degree == 1 and replicate_key in reading.request:  # replicas of unsharded states: dp itself, no HSDP
        reading.notes.append(f"{reading.sources.pop(replicate_key)} = {rep} with {shard[1].where(reading.path)} = 1: "
                             f"plain data parallelism over {rep} replicas (dp = {rep}, zero_stage 0)")
        del reading.request[replicate_key]
    if degree == -1:
        reading.notes.append(f"{shard[1].where(reading.path)} = -1: the data-parallel degree is the GPUs left over "
                             "(num_gpus / (tp x pp x cp))")
    else:
        reading.state("dp", degree * rep, shard[1])


def _drop_derived(reading: Reading, settings: list[Setting], keys: tuple[str, ...]) -> list[Setting]:
    """Settings of -1 ("derive it") for the keys that take it: noted, not stated."""
    out = []
    for s in settings:
        if s.key.split(".")[-1] in keys and str(s.value) == "-1" and "shard" not in s.key:
            reading.notes.append(f"{s.where(reading.path)} = -1: derived by the framework")
            continue
        out.append(s)
    return out


def torchtitan_common(reading: Reading, settings: list[Setting]) -> None:
    """torchtitan's keys, the same for the 0.2 TOML and the 0.3 flags (the card's knobs of both versions)."""
    settings = _drop_derived(reading, settings, ("global_batch_size",))
    table = key_table("torchtitan", variant="cli")
    left = apply(reading, settings, table, _ZERO | {"vpp", "micro_batch_size", "fp8", "uneven_pp", "fp8_mxfp8",
                                                    "fp8_tensorwise", "fp8_rowwise", "moe_flex_dispatcher"})
    _data_parallel(reading, "dp_shard", "dp_replicate")
    pp = reading.request.get("pp", 1)
    first_less: Setting | None = None  # parallelism.pipeline_parallel_first_stage_less_layers
    local = None  # training.local_batch_size under PP: one run of the schedule (adapters/common.torchtitan_batch)
    recipe: Setting | None = None  # [quantize.linear.float8] recipe_name (0.1's [float8]): the knobs it names
    recipes: list[str] = []
    for s, m in left:
        if m.target == "micro_batch_size" and pp == 1:
            reading.state("micro_batch_size", s.value, s)
            _torchtitan_global_batch(reading, s)
        elif m.target == "micro_batch_size":
            local = s
            _torchtitan_global_batch(reading, s)
        elif m.target == "moe_flex_dispatcher":
            reading.state("moe_token_dispatcher", "flex" if str(s.value) == "deepep" else "alltoall", s)
        elif m.target == "uneven_pp":
            first_less = s
        elif m.target in ("fp8_tensorwise", "fp8_rowwise"):  # one key, the recipe its value names
            recipe = s
            recipes.append(m.target.removeprefix("fp8_"))
    size = reading.extra.get("pp_micro_batch_size")
    if pp > 1 and local is not None:
        fields = torchtitan_batch(int(local.value), int(size[0]) if size else None, pp)
        reading.state("micro_batch_size", fields["micro_batch_size"], size[1] if size else local)
        reading.state("pipeline_microbatches", fields["pipeline_microbatches"], local)
    elif pp > 1 and size:
        reading.state("micro_batch_size", *size)
    converters = reading.value("converters") or []
    if any("float8" in str(c) for c in converters):
        reading.state("precision", "fp8", reading.extra["converters"][1])
    elif any(str(c).endswith(".mx") or str(c) == "mx" for c in converters):
        reading.state("precision", "fp8", reading.extra["converters"][1])
        reading.state("fp8_recipe", "mxfp8", reading.extra["converters"][1])
    if recipe is not None:
        _float8_recipe(reading, recipe, recipes, any("float8" in str(c) for c in converters))
    _torchtitan_model(reading)
    if "split_points" in reading.extra:  # 0.1's manual split: the stages it names, over the generated split
        _torchtitan_split_points(reading, reading.extra["split_points"][1], pp)
        return
    _torchtitan_split(reading, first_less)
    if pp > 1 and _multi_stage(reading):
        _torchtitan_vpp(reading, first_less, pp)


def _float8_recipe(reading: Reading, s: Setting, recipes: list[str], converted: bool) -> None:
    """fp8_recipe from the float8 converter's recipe_name ([quantize.linear.float8], 0.1's [float8]): the recipe of
    the card's knob (fp8_tensorwise, fp8_rowwise) whose name it is. Dropped unsaid before: both knobs left the
    key to this reader, which read neither. A recipe meshplan does not model (rowwise_with_gw_hp) is said; without
    the float8 converter in model.converters torchtitan converts no linear and the key does nothing (said)."""
    value = str(s.value).strip("'\"")
    if not converted:
        reading.notes.append(f"{s.where(reading.path)} = {value}: no float8 converter in model.converters, so "
                             "torchtitan converts no linear and the recipe does nothing")
    elif value in recipes:
        reading.state("fp8_recipe", value, s)
    else:
        reading.unsupported.append(f"{s.where(reading.path)} = {value}: no meshplan fp8_recipe (torchtitan's float8 "
                                   f"recipes meshplan models: {', '.join(recipes)}); pass --fp8-recipe")
        reading.unread.add("fp8_recipe")


def _torchtitan_split_points(reading: Reading, s: Setting, pp: int) -> None:
    """torchtitan 0.1's parallelism.pipeline_parallel_split_points (the card's read.keys split_points): the module
    each stage after the first starts at ('layers.N'), len + 1 stages each holding layers [start, stop) (v0.1.0
    models/llama3/infra/pipeline.py pipeline_llama_manual_split, used over generate_split_points and so over
    pipeline_parallel_layers_per_stage); one stage per rank is stated as first/last stage layers
    (keys.state_stage_split), several per rank as vpp, stages / pp. Inert at pp 1 (said); a split torchtitan
    refuses or meshplan cannot state is left unresolved."""
    where = s.where(reading.path)
    words = s.value if isinstance(s.value, list) else str(s.value).strip("'\"").split(",")
    found = [re.fullmatch(r"layers\.(\d+)", str(w).strip().strip("'\"")) for w in words if str(w).strip()]
    if pp == 1:
        reading.notes.append(f"{where}: no pipeline at pp 1, the split points do nothing")
        return
    if not found or not all(found):
        reading.unresolved.append(f"{where}: split points other than decoder layers ('layers.N'); {SPLIT_NOT_READ}")
        return
    points = [int(m.group(1)) for m in found]
    stages = len(points) + 1
    reading.notes.append(f"{where}: torchtitan 0.1's manual split into {stages} stages, read as it; 0.2.0 dropped the "
                         "key (module_fqns_per_model_part names each stage's modules) and refuses it at launch")
    if stages % pp or (stages > pp) != _multi_stage(reading):
        reading.unresolved.append(f"{where}: {stages} stages over pp={pp}, which torchtitan refuses with this "
                                  f"schedule (one stage per rank, or a multi-stage schedule's whole number of "
                                  f"stages per rank); {SPLIT_NOT_READ}")
        return
    if stages > pp:
        reading.state("vpp", stages // pp, f"{where} ({stages} stages over pp={pp})")
    if "model" not in reading.request:
        reading.unresolved.append(f"{where}: the last stage's layers are the model's after layers.{points[-1]}, and "
                                  f"the file names no model to count them; {SPLIT_NOT_READ}")
        return
    bounds = [0, *points, resolve_model(reading.request["model"]).num_layers]
    counts = [b - a for a, b in itertools.pairwise(bounds)]
    if min(counts) < 1:
        reading.unresolved.append(f"{where}: the stages hold {counts} decoder layers, one holding none (split points "
                                  f"out of order or past the model's {bounds[-1]} layers); {SPLIT_NOT_READ}")
        return
    if stages > pp:
        if len(set(counts)) > 1:
            reading.notes.append(f"{where}: torchtitan's virtual stages hold {counts} decoder layers; meshplan "
                                 f"estimates them split evenly over its {stages} virtual stages")
        return
    why = state_stage_split(reading, counts, s)
    if why is not None:
        reading.unresolved.append(f"{where}: {why}; {SPLIT_NOT_READ}")


def _torchtitan_global_batch(reading: Reading, local: Setting) -> None:
    """torchtitan's global_batch_size left out (or -1) is local_batch_size x the data-parallel degree, one micro-step
    per optimizer step (0.3.0 trainer.py, the card's batch semantics), not meshplan's 4.2M-token default: stated
    where the file gives dp, else said (dp is then the GPUs left over)."""
    if "global_batch_size" in reading.request:
        return
    size, dp = whole_value(reading, local.value, local), reading.request.get("dp")
    if dp:
        reading.state("global_batch_size", size * int(dp), f"{local.where(reading.path)} x dp (torchtitan's "
                                                            "global_batch_size -1: local_batch_size x dp)")
    else:
        reading.batch_per_dp = size
        reading.notes.append(f"{local.where(reading.path)}: without global_batch_size torchtitan steps on "
                             f"local_batch_size x dp = {size} x num_gpus / (tp x pp x cp) sequences, the global "
                             "batch once the GPU count is given")


def _torchtitan_split(reading: Reading, first_less: Setting | None) -> None:
    """The decoder layers of each stage as torchtitan splits them (distributed/pipeline_parallel.py, 0.2.2 and 0.3:
    the embedding and the output counted as first_less and last_less layers, 1 each by default; ceil((layers +
    first_less + last_less) / layers_per_stage) stages, or pp of them without layers_per_stage;
    generate_llm_fqn_per_model_part shares the effective layers evenly, the remainder to the first stages), then as
    first/last stage layers (keys.state_stage_split). One stage per rank only (a multi-stage schedule leaves vpp to
    the flags); without the model, layers_per_stage's stages are taken as full, as meshplan renders them."""
    per_stage, pp = reading.whole("layers_per_stage"), int(reading.request.get("pp", 1))
    if pp == 1 or _multi_stage(reading):
        if first_less is not None:
            reading.notes.append(f"{first_less.where(reading.path)}: the first stage holds {first_less.value} layers "
                                 "fewer")
        return
    fw = whole_value(reading, first_less.value, first_less, least=0) if first_less is not None else 1
    lw = reading.whole("last_less", least=0)
    lw = 1 if lw is None else lw
    source: Setting | str = (reading.extra["layers_per_stage"][1] if per_stage is not None else first_less
                             or f"{reading.sources.get('pp', reading.path)} (torchtitan's default split)")
    where = source.where(reading.path) if isinstance(source, Setting) else source
    if "model" in reading.request:
        counts = torchtitan_stage_layers(resolve_model(reading.request["model"]).num_layers, pp, per_stage, fw, lw)
        if isinstance(counts, str):  # torchtitan refuses the file at start-up: said where check lists what it could
            reading.unresolved.append(f"{where}: {counts}; the split is not read")  # not read (it was a note)
            return
    elif per_stage is not None:
        counts = [per_stage - fw] + [per_stage] * (pp - 2) + [per_stage - lw]
        reading.notes.append(f"{where}: {per_stage} layers per stage, the first {fw} and the last {lw} fewer, read "
                             "as full stages (the file names no model to count its layers)")
    else:
        reading.notes.append(f"{where}: torchtitan counts the embedding as {fw} and the output as {lw} layers of "
                             "the split; not read (the file names no model to count its layers)")
        return
    why = state_stage_split(reading, counts, source)
    if why is not None:
        reading.unresolved.append(f"{where}: {why}; {SPLIT_NOT_READ}")


def _torchtitan_vpp(reading: Reading, first_less: Setting | None, pp: int) -> None:
    """A multi-stage schedule's stages per rank as torchtitan counts them (distributed/pipeline_parallel.py: without
    pipeline_parallel_layers_per_stage 2 per rank; with it ceil((layers + first_less + last_less) / layers_per_stage)
    virtual stages, which pp must divide, at least 2 per rank), the model's layers from the catalog. Not read before:
    a rendered Interleaved1F1B config read back as vpp 1."""
    schedule = reading.extra["pp_schedule"][1]
    per_stage = reading.whole("layers_per_stage")
    if per_stage is None:
        reading.state("vpp", 2, f"{schedule.where(reading.path)} (torchtitan's default for a multi-stage schedule "
                                "without pipeline_parallel_layers_per_stage: 2 stages per rank)")
        return
    where = reading.extra["layers_per_stage"][1].where(reading.path)
    if "model" not in reading.request:
        reading.unresolved.append(f"{schedule.where(reading.path)} {schedule.value}: vpp is (layers + first_less + "
                                  f"last_less) / ({where} x pp), and the file names no model to count its layers; "
                                  "pass --vpp")
        return
    layers = resolve_model(reading.request["model"]).num_layers
    fw = whole_value(reading, first_less.value, first_less, least=0) if first_less is not None else 1
    lw = reading.whole("last_less", least=0)
    lw = 1 if lw is None else lw
    stages = -(-(layers + fw + lw) // per_stage)
    if stages % pp or stages // pp < 2:
        reading.unresolved.append(f"{where}: {stages} virtual stages over pp={pp}, which torchtitan refuses (pp must "
                                  "divide them, at least 2 per rank); vpp not read")
        return
    reading.state("vpp", stages // pp, f"{where} ({layers} layers + {fw} + {lw} over {per_stage} per stage: "
                                       f"{stages} virtual stages over pp={pp})")
    counts = _stage_counts(layers + fw + lw, stages, fw, lw)
    if len(set(counts)) > 1:
        reading.notes.append(f"{where}: torchtitan's virtual stages hold {counts} decoder layers; meshplan "
                             f"estimates {layers} layers split evenly over its {stages} virtual stages")


def _stage_counts(effective: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """torchtitan's generate_llm_fqn_per_model_part: the effective layers shared evenly over the stages, the first
    stages taking the remainder, the first and the last stage then less first_less and last_less."""
    counts = [effective // stages + (index < effective % stages) for index in range(stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return counts


def torchtitan_stage_layers(layers: int, pp: int, per_stage: int | None, first_less: int,
                            last_less: int) -> list[int] | str:
    """The decoder layers of each of torchtitan's pp stages (one per rank), or why torchtitan builds no such split:
    generate_llm_fqn_per_model_part's effective layers (layers + first_less + last_less) shared evenly, the first
    stages taking the remainder, the first and the last stage then less first_less and last_less. A stage may hold
    none (only the embedding): the caller states what meshplan can express."""
    effective = layers + first_less + last_less
    stages = pp if per_stage is None else -(-effective // per_stage)
    if stages != pp:  # pipeline_parallel.py: pp divides the stages, and a single-stage schedule runs 1 per rank
        return (f"{stages} stages over pp={pp}, which torchtitan refuses with a single-stage schedule (exactly 1 "
                f"stage per rank): layers_per_stage {-(-effective // pp)} gives one per rank, a multi-stage schedule "
                "(Interleaved1F1B) runs several")
    least = effective // stages
    if first_less > least or last_less > least:
        return (f"torchtitan refuses it: first_less {first_less} / last_less {last_less} above the {least} effective "
                "layers of a stage")
    return _stage_counts(effective, stages, first_less, last_less)


def _multi_stage(reading: Reading) -> bool:
    """Whether the file's pipeline schedule runs several stages per rank (vpp: layers / (pp x layers_per_stage))."""
    schedule = str(reading.value("pp_schedule") or "")
    return any(word in schedule for word in ("Interleaved", "Loop", "ZBV", "DualPipe"))


def _torchtitan_model(reading: Reading) -> None:
    """The catalog model whose torchtitan registry entry the file names (card `registry`)."""
    name, flavor, config = reading.value("model_name"), reading.value("model_flavor"), reading.value("model_config")
    wanted = str(config) if config else f"{name}_{flavor}".lower() if name and flavor else None
    if wanted is None:
        reading.leave(("model",), "model: the file names no model (pass --model)")
        return
    card = framework_card("torchtitan")
    hits = [key for key, entry in card.registry.items() if entry.config.lower() == wanted.lower()]
    if not config and name and flavor:  # a TOML release's own name and flavor (card flavors: 0.2.x's Llama 4)
        hits += [key for key, entry in card.flavors.items()
                 if (entry.name, entry.flavor) == (str(name), str(flavor))]
    source = reading.extra.get("model_config", reading.extra.get("model_flavor", reading.extra.get("model_name")))[1]
    if hits:
        reading.state("model", hits[0], source)
    else:
        reading.leave(("model",), f"{source.where(reading.path)}: torchtitan's {wanted} is not in meshplan's "
                                  "catalog (pass --model)")


def read_torchtitan_toml(text: str, path: str) -> Reading:
    """A torchtitan 0.2.x TOML job file ([model], [training], [parallelism], [activation_checkpoint] ...)."""
    reading = Reading("torchtitan", path, variant="cli")
    torchtitan_common(reading, toml_settings(text, path))
    world(reading)
    return reading


def _tyro_switch(s: Setting) -> Setting:
    """tyro's negated switch (--parallelism.no_enable_sequence_parallel, what render writes for a false one) as its
    field set to false; read as a key of its own it was 'no meshplan field' and the field took its default."""
    head, dot, last = s.key.rpartition(".")
    if s.value is not True or not last.startswith(("no_", "no-")):
        return s
    return replace(s, key=f"{head}{dot}{last[3:]}", value=False, written=s.key)


AC_SUBCOMMAND = "activation-checkpoint:"
"""tyro's subcommand word that picks torchtitan 0.3's activation-checkpoint config (activation-checkpoint:full), what
render writes last, after the switches."""


def _before_subcommand(s: Setting) -> Setting:
    """A switch given alone right before the subcommand word (`--compile.enable activation-checkpoint:none`, what
    render writes for torch_compile): the word is the subcommand, not the switch's value. Taken as the value, every
    rendered command with a switch last (compile, CPU offload, async TP) was refused on import."""
    return replace(s, value=True) if str(s.value).startswith(AC_SUBCOMMAND) else s


def read_torchtitan_cli(text: str, path: str) -> Reading:
    """torchtitan 0.3: `torchrun ... -m torchtitan.train --module M --config C --parallelism.x N ...`."""
    _, command, k, reading, settings = read_launch(text, path, "torchtitan", variant="cli")
    settings = [_tyro_switch(_before_subcommand(s)) for s in settings]
    for word in command.words[k + 1:]:
        if word.text.startswith(AC_SUBCOMMAND):
            settings.append(Setting("activation_checkpoint.mode", word.text.split(":", 1)[1], word.line))
    torchtitan_common(reading, settings)
    world(reading)
    return reading


def read_kempnerforge(text: str, path: str) -> Reading:
    """A KempnerForge configs/train/*.toml: [distributed], [train] and the [model] shape."""
    reading = Reading("kempnerforge", path, variant="toml")
    _kempnerforge_settings(reading, toml_settings(text, path))
    if not _kempnerforge_world(reading):
        usage_comment_world(reading, text)
        world(reading)
    return reading


def read_kempnerforge_launch(text: str, path: str) -> Reading:
    """A script launching KempnerForge's scripts/train.py (its slurm jobs: `srun ... python scripts/train.py
    configs/train/13b_24gpu_validation.toml`): the TOML it names read (train.py's sys.argv[1], load_config), with the
    command's --section.key=value overrides over it (loader._parse_cli_overrides, ast.literal_eval), and the ranks
    srun starts (a rank per task) beside the count the TOML's degrees state. Refused before as a shell file of no
    framework meshplan could tell."""
    launch = read_launch(text, path, "kempnerforge", variant="launch")
    reading, words = launch.reading, launch.command.words[launch.k + 1:]
    if not words:
        raise MeshplanError(f"{path}:{launch.command.line} {launch.command.words[launch.k].text}: no config TOML is "
                            "given (train.py prints its usage: 'train.py <config.toml> [--section.key=value ...]').",
                            fix="Pass the TOML the script runs, or add it to the command.")
    _refuse_argument(text, path, launch.script, launch.command, words[0])
    toml_path, toml_text = named_file(reading, words[0], "", (".toml",), "KempnerForge's")
    overrides = [replace(s, key=normalize(s.key), value=_literal(s.value), written=s.key)
                 for s in flag_settings(words[1:]) if s.key.startswith("--")]
    named = {s.key for s in overrides}
    kept = [replace(s, file=toml_path) for s in toml_settings(toml_text, toml_path) if s.key not in named]
    _kempnerforge_settings(reading, kept + overrides)
    launched = {name: reading.extra.pop(name) for name in ("nodes", "gpus_per_node") if name in reading.extra}
    if _kempnerforge_world(reading):
        count = _launched_count(launched)
        if count is not None and count != reading.request["num_gpus"]:
            reading.unsupported.append(
                f"{path}: the script starts {count} ranks ({_launched_where(reading, launched)}), the TOML's degrees "
                f"{reading.request['num_gpus']}: KempnerForge's DistributedConfig.validate_world_size refuses the run")
        return reading
    reading.extra.update(launched)
    world(reading)
    return reading


def _refuse_argument(text: str, path: str, script, command, word) -> None:
    """A TOML path that is the script's own argument (multinode.sh's CONFIG="${1:?Usage: ...}", then `srun ... python
    scripts/train.py "${CONFIG}"`): given when the script is run, not in it, so nothing can be read; refused with the
    argument named and the TOML its usage comment runs it with (read before as an empty word)."""
    argument = script.arguments.get(word.var or "")
    if argument is None:
        return
    usage = next((m.group(0) for line in text.splitlines() if line.lstrip().startswith("#")
                  for m in [re.search(r"[\w./-]+\.toml", line)] if m), None)
    raise MeshplanError(
        f"{path}:{command.line} scripts/train.py ${word.var}: the config TOML is {word.var}, set at line "
        f"{script.env[word.var].line} from the script's own argument {argument}, given on the command line that runs "
        "the script (SCRIPT ... CONFIG.toml [--section.key=value ...]), not in it: the script holds no job to read.",
        fix="Pass the config file the script runs, the TOML it is run with" + (
            f" (its usage comment runs {usage}: meshplan import {usage})" if usage else
            " (meshplan import CONFIG.toml)") + ", the overrides given after it as flags beside it.")


def _literal(value: object) -> object:
    """KempnerForge's _parse_cli_overrides value: ast.literal_eval, else the text (a bare --a.b is true)."""
    if value is True:
        return True
    try:
        return ast.literal_eval(str(value))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return value


def _launched_count(launched: dict) -> int | None:
    """nodes x ranks per node the launch starts, where both are whole numbers (one node where only ranks are given)."""
    try:
        return int(launched["gpus_per_node"][0]) * int(launched.get("nodes", (1,))[0])
    except (KeyError, TypeError, ValueError):
        return None


def _launched_where(reading: Reading, launched: dict) -> str:
    return " x ".join(s.where(reading.path) if isinstance(s, Setting) else str(s) for _, s in launched.values())


def _kempnerforge_settings(reading: Reading, settings: list[Setting]) -> None:
    """A configs/train/*.toml's settings (or a launch's TOML with its overrides) read into the request."""
    path = reading.path
    section = read_section("kempnerforge")
    built = section.model_section
    assert built is not None, "KempnerForge's card has a read.model_section"
    model_keys = {f"{built.section}.{k}" for k in built.defaults}  # read by section_model
    left = apply(reading, [s for s in settings if s.key not in model_keys], key_table("kempnerforge"),
                 _ZERO | {"global_batch_size", "fp8", "optimizer", "muon_ns_steps"})
    for s, m in left:
        if m.target == "fp8" and str(s.value) == "fp8":
            reading.state("precision", "fp8", s)
        elif m.target == "optimizer":
            _optimizer_name(reading, s)
        elif m.target == "muon_ns_steps":
            _ns_steps(reading, s)
    _data_parallel(reading, "dp_shard", "dp_replicate")
    accumulation, dp = reading.extra.get("accumulation"), reading.request.get("dp")
    if accumulation and dp and "micro_batch_size" in reading.request:
        reading.state("global_batch_size", reading.request["micro_batch_size"] * reading.whole("accumulation") * dp,
                      f"{accumulation[1].where(path)} x batch_size x dp")
    elif accumulation:
        reading.notes.append(f"{accumulation[1].where(path)}: global batch = batch_size x {accumulation[0]} x dp "
                             "(dp is the GPUs left over)")
    if "torch_compile" not in reading.request:
        reading.default("torch_compile", True, "TrainConfig.compile_model, cards/frameworks/kempnerforge.yaml")
    section_model(reading, settings)


def _kempnerforge_world(reading: Reading) -> bool:
    """The GPU count a configs/train/*.toml states through its degrees: KempnerForge's DistributedConfig
    .validate_world_size requires dp_replicate x dp_shard x tp x pp x cp x ep to be the world size, so a file with a
    whole dp_shard (not -1, the GPUs left over) states it. Its ep is a mesh dimension of its own (distributed/setup.py
    builds pp, dp_replicate, dp_shard, ep, tp), so the count is the card's world-size law's, arithmetic/mesh
    .replica_size x dp, which counts ep's ranks beside the data-parallel ones."""
    dp = reading.request.get("dp")
    if dp is None or "num_gpus" in reading.request:
        return False
    degrees = {name: int(reading.request.get(name, 1)) for name in ("tp", "pp", "cp", "ep")}
    law = framework_card("kempnerforge").world_size_law
    count = int(dp) * replica_size(law, degrees["tp"], degrees["pp"], degrees["cp"], degrees["ep"])
    said = " x ".join(f"{name} {value}" for name, value in {"dp": dp, **degrees}.items())
    reading.state("num_gpus", count, f"{reading.sources['dp']} ({said}: KempnerForge's DistributedConfig"
                                     ".validate_world_size, dp_replicate x dp_shard x tp x pp x cp x ep)")
    return True


def _optimizer_name(reading: Reading, s: Setting) -> None:
    """KempnerForge's [optimizer] name as meshplan's optimizer, by the card's knob values (adamw is adam, muon is
    muon); another of its registry's (lion, schedule_free_adamw) is said as not modelled."""
    card = framework_card("kempnerforge")
    knob = knob_table(card, adapter_section(card).default_version, "toml")["optimizer"]
    ours = {theirs: mine for mine, theirs in (knob.values or {}).items() if theirs}
    name = str(s.value).strip("'\"")
    if name in ours:
        reading.state("optimizer", ours[name], s)
    else:
        reading.unsupported.append(f"{s.where(reading.path)} = {name}: no meshplan optimizer (KempnerForge's "
                                   f"{', '.join(ours)} are)")


def _ns_steps(reading: Reading, s: Setting) -> None:
    """KempnerForge's optimizer.muon_ns_steps: meshplan times the card's muon.ns_steps Newton-Schulz iterations, so
    another count is said as not modelled (no estimate is made from the file)."""
    muon = framework_card("kempnerforge").muon
    assert muon is not None, "KempnerForge's card has a muon section"
    if str(s.value).strip("'\"") != str(muon.ns_steps):
        reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: meshplan times KempnerForge's Muon at "
                                   f"its default {muon.ns_steps} Newton-Schulz iterations (cards/frameworks/"
                                   "kempnerforge.yaml muon.ns_steps)")


def read_deepspeed_json(text: str, path: str) -> Reading:
    """A plain ds_config.json (pp = 1; tp = 1 unless AutoTP's tensor_parallel.autotp_size sets it: the data-parallel
    degree is train_batch_size / (micro x accumulation), the GPUs dp x tp)."""
    reading = Reading("deepspeed", path, variant="config")
    settings = json_settings(text, path)
    _refuse_foreign(path, "deepspeed", "ds_config", "keys", [s.key.split(".")[0] for s in settings])
    read_deepspeed_settings(reading, settings)
    if "tp" not in reading.request:
        reading.state("tp", 1, f"{path} (a ds_config alone: no tensor parallelism)")
    accumulation = reading.extra.get("accumulation")
    gbs, mbs = reading.request.get("global_batch_size"), reading.request.get("micro_batch_size")
    if gbs and mbs and accumulation and str(accumulation[0]).isdigit() and gbs % (mbs * int(accumulation[0])):
        # DeepSpeedConfig._batch_assertion: train_batch_size == micro x accumulation x world size, at any GPU count
        # (it read 500 / (2 x 32) as dp = 7, floored, and 7 GPUs)
        reading.unresolved.append(
            f"{reading.sources['global_batch_size']} {gbs} is not micro x {accumulation[1].where(path)} = "
            f"{mbs} x {accumulation[0]} = {mbs * int(accumulation[0])} x a GPU count: DeepSpeed's batch assertion "
            "(runtime/config.py, train_batch_size = micro x gradient_accumulation_steps x world size) refuses it on "
            "any count; dp and the GPU count not read")
    elif gbs and mbs and accumulation and str(accumulation[0]).isdigit():
        reading.state("dp", gbs // (mbs * int(accumulation[0])), f"{reading.sources['global_batch_size']} / "
                                                                  f"(micro x {accumulation[1].where(path)})")
        tp = reading.request["tp"]
        reading.state("num_gpus", reading.request["dp"] * tp, reading.sources["dp"] if tp == 1 else
                      f"dp x tp ({reading.sources['dp']}; {reading.sources['tp']})")
    if "num_gpus" not in reading.request:  # it was checked on 1 GPU, said nowhere
        reading.leave(("num_gpus",), "num_gpus: the file does not say how many GPUs (pass --num-gpus)")
    reading.state("pp", 1, f"{path} (a ds_config alone: no pipeline parallelism)")
    _ds_checkpointing(reading, settings)
    return reading


DS_CHECKPOINTING = (
    "deepspeed.initialize turns no activation checkpointing on; the model code does, which a ds_config does not say: "
    "Megatron-DeepSpeed's --checkpoint-activations (with --deepspeed-activation-checkpointing, "
    "setup_deepspeed_random_and_activation_checkpointing hands this file to deepspeed.checkpointing.configure), or "
    "Hugging Face's gradient_checkpointing (torch.utils.checkpoint, which reads no DeepSpeed setting)")
"""Why a plain ds_config's recompute is none (DeepSpeed edaa722 runtime/activation_checkpointing/checkpointing.py:
configure and checkpoint are the model code's to call; runtime/engine.py reads no activation_checkpointing)."""


def _ds_checkpointing(reading: Reading, settings: list[Setting]) -> None:
    """A plain ds_config's recompute: none, the file's own (nothing in it turns checkpointing on), said as assumed,
    with what its activation_checkpointing section does (how deepspeed.checkpointing.checkpoint runs where the model
    calls it, not whether it does) and what cpu_checkpointing then needs; --recompute beside the file changes it."""
    if "recompute" in reading.request:
        return
    path = reading.path
    section = next((s for s in settings if s.key.startswith("activation_checkpointing.")), None)
    reading.default("recompute", "none", "a ds_config turns no activation checkpointing on")
    said = "" if section is None else (f"; {section.where(path)}: its activation_checkpointing section sets how "
                                       "deepspeed.checkpointing.checkpoint runs where the model code calls it, not "
                                       "whether it does")
    if reading.request.get("activation_offload"):
        said += (f"; {reading.sources['activation_offload']} (activation_offload) moves to the CPU the inputs of the "
                 "layers the model code checkpoints through deepspeed.checkpointing, none without them (rule OF002)")
    reading.assumed.append(f"recompute = none: {DS_CHECKPOINTING}{said}. Pass --recompute full where the model code "
                           "checkpoints every layer")


def _refuse_foreign(path: str, framework: str, kind: str, what: str, found: list[str]) -> None:
    """A config file holding none of the framework's own top-level keys or sections (the card's read.sections) is
    not its config: refused with what it holds, never read as an empty config of the framework's defaults (a
    pyrightconfig.json came back 'deepspeed, tp 1', a pyproject.toml torchtitan's)."""
    own = read_section(framework).sections
    found = list(dict.fromkeys(found))
    if set(found) & set(own):
        return
    shown = ", ".join(found[:12]) + (f" and {len(found) - 12} more" if len(found) > 12 else "")
    raise MeshplanError(f"{path}: not a {framework} {kind}: its top-level {what} ({shown or 'none'}) include none of "
                        f"a {framework} {kind}'s ({', '.join(own[:8])}, ...).",
                        fix=f"Pass the {framework} {kind} the run reads, or the launch script that runs the training; "
                            "meshplan reads a JSON file as a DeepSpeed ds_config and a TOML file as a torchtitan or "
                            "KempnerForge job file.")


def _kempnerforge_model_only(settings: list[Setting]) -> bool:
    """A KempnerForge configs/model/*.toml: [model] alone in KempnerForge's own names (its ModelConfig's dim,
    n_layers: the card's read.model_section), not torchtitan's [model] name / flavor."""
    built = read_section("kempnerforge").model_section
    assert built is not None, "KempnerForge's card has a read.model_section"
    return any(s.key in (f"{built.section}.dim", f"{built.section}.n_layers") for s in settings)


def read_toml_any(text: str, path: str) -> Reading:
    """A TOML file: KempnerForge's ([distributed] / [train], or a [model] in its names) or torchtitan's ([parallelism]
    / [training]); a TOML of neither's sections (a pyproject.toml) refused with its sections."""
    settings = toml_settings(text, path)
    names = [s.key.split(".")[0] for s in settings]
    if "distributed" in names or "train" in names or _kempnerforge_model_only(settings):
        return read_kempnerforge(text, path)
    if not set(names) & set(read_section("torchtitan").sections):
        _refuse_foreign(path, "torchtitan", "TOML job file", "sections", names)
    return read_torchtitan_toml(text, path)


__all__ = ["as_bool", "read_deepspeed_json", "read_kempnerforge", "read_toml_any", "read_torchtitan_cli",
           "read_torchtitan_toml"]
