"""verl's SFT trainer: `torchrun -m verl.trainer.sft_trainer` (verl 0.9.1, the FSDP engine's keys) and the older
`verl.trainer.fsdp_sft_trainer` (its keys read as sft_trainer's), as a launch script or the trainer's Hydra YAML.

A training job on verl's FSDP engine (a LoRA job with model.lora_rank > 0): zero_stage 3, no TP or PP, Ulysses as cp,
data.train_batch_size the global batch in sequences, torchrun's world the GPUs. With `engine=megatron` (read.sft
engines) the Megatron engine's job instead: its engine.* keys (tensor, pipeline, context and expert parallel sizes,
use_distributed_optimizer, override_transformer_config's recompute) read as render's variant sft-megatron writes
them. What each entry point runs when a key is left out, the keys that are no adapter knob and the values that change
nothing meshplan plans are the card's (cards/frameworks/verl.yaml read.sft); the RL entry point's reader is hydra.py.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.adapters.read.hydra import granularity, megatron_fsdp, model_named_by_path
from meshplan.adapters.read.hydra_compose import compose_defaults, said_composed
from meshplan.adapters.read.keys import (
    Reading,
    apply,
    as_bool,
    key_table,
    lora_rank,
    normalize,
    read_section,
)
from meshplan.adapters.read.launch import read_launch, world
from meshplan.adapters.read.settings import Setting, yaml_settings
from meshplan.knowledge.read_card import SftEngine, SftEntry, SftRead
from meshplan.schema.request import Request

DETECT = re.compile(r"verl\.trainer\.(?:fsdp_)?sft_trainer\b")
"""A launch script of either SFT entry point (checked before the RL reader's `verl.trainer`)."""
# The optimizer's hyper-parameters and the data loader's settings: no step's memory or time (optim.optimizer is
# read.sft neutral); the data keys the trainer reads are in the key table, looked up first.
UNPLANNED = re.compile(r"^(optim|data|trainer|checkpoint|profiler)\.")
WHERE = "cards/frameworks/verl.yaml read.sft"


def _sft() -> SftRead:
    sft = read_section("verl").sft
    assert sft is not None, "verl's card has a read.sft section"
    return sft


def _entry(launcher: str) -> SftEntry:
    return next(e for e in _sft().entries if launcher == e.launcher or launcher.endswith("." + e.launcher.rsplit(
        ".", 1)[-1]) or e.launcher.endswith(launcher))


def read_verl_sft(text: str, path: str) -> Reading:
    """A launch script of verl's SFT trainer (torchrun -m verl.trainer.sft_trainer / fsdp_sft_trainer)."""
    launch = read_launch(text, path, "verl")
    word = launch.command.words[launch.k].text
    entry = _entry(word.rsplit("/", 1)[-1].removesuffix(".py").replace("/", "."))
    launch.reading.state("job", "sft", f"{path}:{launch.command.line} {word}")
    return _read(launch.reading, launch.settings, entry)


def read_verl_sft_yaml(text: str, path: str) -> Reading:
    """The SFT trainer's Hydra YAML (verl/trainer/config/sft_trainer.yaml or a copy): every key at its line; the
    defaults list's engine group (`- engine@engine: megatron`) read as the `engine=` override it is."""
    every = yaml_settings(text, path, "verl's SFT config", "Pass sft_trainer.yaml or a copy.",
                          refuses_duplicates="verl's Hydra loader (OmegaConf)")
    composed = compose_defaults(text, path, every, "verl's SFT config", "Pass sft_trainer.yaml or a copy.",
                                "verl's Hydra loader (OmegaConf)")
    reading = Reading("verl", path)
    if composed is not None:
        said_composed(reading, composed, "verl", "verl")
    settings = [s for s in (every if composed is None else composed.settings)
                if s.key.split(".")[0] not in ("defaults", "hydra") and not s.key.endswith("_target_")]
    for s in every:
        if s.key == "defaults" and isinstance(s.value, list):
            settings += [Setting(group.split("@")[0], value, s.line) for item in s.value if isinstance(item, dict)
                         for group, value in item.items() if group.split("@")[0] in ("engine", "optim")]
    legacy = any(s.key in ("model.partial_pretrain", "ulysses_sequence_parallel_size") for s in settings)
    entry = _sft().entries[-1 if legacy else 0]
    reading.state("job", "sft", f"{path} (verl's SFT trainer config, run by {entry.launcher})")
    return _read(reading, settings, entry)


MEGATRON_SPECIAL = frozenset({"zero_0", "zero_1", "megatron_fsdp", "recompute_full", "lora_rank"})
"""The Megatron engine's keys read by _megatron_knob (and lora_rank by _lora), not as the key table's value."""


def _engine(settings: list[Setting]) -> tuple[SftEngine | None, list[Setting]]:
    """The engine group the file names beside the FSDP default (read.sft engines: `engine=megatron`), and the
    settings less its engine and optim group overrides, which its variant's key table reads instead."""
    engines = _sft().engines
    named = next((str(s.value).strip("'\"") for s in settings if s.key.lstrip("+") == "engine"), None)
    if named not in engines:
        return None, settings
    return engines[named], [s for s in settings if not (s.key.lstrip("+") in ("engine", "optim")
                                                        and str(s.value).strip("'\"") == named)]


def _read(reading: Reading, settings: list[Setting], entry: SftEntry) -> Reading:
    sft = _sft()
    engine, settings = _engine(settings)
    reading.variant = engine.variant if engine else sft.variant
    table = key_table("verl", variant=reading.variant, read_keys=sft.keys)
    settings = _planned(reading, [_renamed(s, entry) for s in settings], table)
    left = apply(reading, settings, table, MEGATRON_SPECIAL if engine else frozenset({"zero_3", "lora_rank"}))
    for s, m in left:
        if m.target == "lora_rank":
            _lora(reading, s, entry)
        elif engine is not None:
            _megatron_knob(reading, s, m.target)
        elif m.target == "zero_3":
            _strategy(reading, s)
    if engine is None:
        where = f"{reading.path} (verl's SFT trainer runs the FSDP engine"
        reading.state("zero_stage", 3, f"{where}, which shards fully)")
        reading.state("tp", 1, f"{where}: no tensor parallelism)")
        reading.state("pp", 1, f"{where}: no pipeline parallelism)")
    else:
        _defaults(reading, engine, f"the Megatron engine's default ({WHERE} engines)")
    _defaults(reading, entry)
    if "lora_rank" not in reading.request:  # no LoRA: the targets name nothing trained
        reading.request.pop("lora_targets", None)
        reading.sources.pop("lora_targets", None)
    if engine is None:
        _ulysses_padding(reading, entry)
    _token_budget(reading, entry)
    model_named_by_path(reading)
    world(reading)
    return reading


def _renamed(s: Setting, entry: SftEntry) -> Setting:
    """An older entry point's key as sft_trainer's (keys_as: a key, or a prefix ending in '.'), cited as written."""
    key = s.key.lstrip("+")
    for old, new in entry.keys_as.items():
        if key == old or (old.endswith(".") and key.startswith(old)):
            return Setting(new + key[len(old):], s.value, s.line, s.via, s.alone, written=s.key)
    return s


def _planned(reading: Reading, settings: list[Setting], table: dict[str, Any]) -> list[Setting]:
    """The settings left for the key table: a neutral key at its value (read.sft neutral) dropped, at another said
    as not modelled; the optimizer's and the data loader's settings the table does not read dropped; Hydra's '~'
    said."""
    neutral, said, out = _sft().neutral, read_section("verl").said, []
    for s in settings:
        key = normalize(s.key)
        if s.key.startswith("~"):
            reading.notes.append(f"{s.where(reading.path)}: deleted (Hydra '~'): the framework's default applies")
        elif key in neutral:
            if not _same(s.value, neutral[key].value):
                reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: {neutral[key].otherwise}")
        elif key in table or key in said or not UNPLANNED.match(key):
            out.append(s)
    return out


def _same(value: Any, neutral: Any) -> bool:
    if neutral is None:
        return value is None or str(value).strip("'\"") in ("null", "None", "~", "")
    if isinstance(neutral, bool):
        return as_bool(value) is neutral
    return str(value).strip("'\"").lower() == str(neutral).lower()


def _strategy(reading: Reading, s: Setting) -> None:
    """engine.strategy (fsdp_sft_trainer's model.strategy): fsdp and fsdp2 both shard fully (FSDP1 FULL_SHARD,
    FSDP2 fully_shard); meshplan counts FSDP2's bytes for verl's FSDP engine."""
    text = str(s.value).strip("'\"")
    if text == "fsdp":
        reading.notes.append(f"{s.where(reading.path)} = fsdp: FSDP1 (FULL_SHARD); meshplan counts FSDP2's bytes "
                             "for verl's FSDP engine, which shards the same states")
    elif text != "fsdp2":
        reading.unsupported.append(f"{s.where(reading.path)} = {text}: meshplan plans verl's SFT trainer on FSDP "
                                   "(fsdp, fsdp2)")


def _megatron_knob(reading: Reading, s: Setting, target: str) -> None:
    """The Megatron engine's ZeRO and recompute keys (engine/megatron.yaml): use_distributed_optimizer is zero_stage
    1 or 0, use_megatron_fsdp true not modelled (hydra.megatron_fsdp), recompute_granularity null none (as the RL
    reader reads the actor's)."""
    if target in ("zero_0", "zero_1"):
        reading.state("zero_stage", 1 if as_bool(s.value) else 0, s)
    elif target == "megatron_fsdp":
        megatron_fsdp(reading, s)
    elif target == "recompute_full":
        reading.state("recompute", granularity(s.value), s)


def _defaults(reading: Reading, entry: SftEntry | SftEngine, said: str | None = None) -> None:
    """The request fields the file leaves to the entry point's (or its engine's) defaults, stated with that
    default's source."""
    said = said or f"{getattr(entry, 'launcher', '')}'s default, {WHERE}"
    for name, value in entry.defaults.items():
        if name in Request.model_fields and name not in reading.request and name not in reading.unread:
            reading.state(name, value, f"{reading.path} (not given: {said})")
            reading.defaults[name] = value


def _switch(reading: Reading, name: str, entry: SftEntry) -> tuple[Any, str]:
    """A reader's value (remove_padding, dynamic_batch, token_budget) and where it comes from: the file or the
    entry point's default."""
    if name in reading.extra:
        value, s = reading.extra[name]
        return value, s.where(reading.path)
    return entry.defaults.get(name), f"{entry.launcher}'s default {name} ({WHERE})"


def _lora(reading: Reading, s: Setting, entry: SftEntry) -> None:
    """model.lora_rank > 0 trains the adapters alone (a LoRA job); 0, verl's default, is no LoRA (read as the field,
    0 was refused as no rank)."""
    if lora_rank(reading, s) is not None:
        reading.state("job", "lora", f"{s.where(reading.path)} ({entry.launcher} with a LoRA rank)")


def _ulysses_padding(reading: Reading, entry: SftEntry) -> None:
    """Both entry points refuse Ulysses without the pad tokens removed (fsdp_sft_trainer.py asserts it, the 0.9.1
    FSDP engine raises ValueError): said as the file's error, not estimated as if it ran."""
    cp = int(reading.request.get("cp", 1))
    value, where = _switch(reading, "remove_padding", entry)
    if cp > 1 and as_bool(value) is False:
        reading.unsupported.append(f"{where} = {value}: with Ulysses size {cp} ({reading.sources['cp']}) verl's "
                                   "SFT trainer refuses to start ('sequence parallel is only supported when "
                                   "remove_padding is enabled'); set use_remove_padding=true")


def _token_budget(reading: Reading, entry: SftEntry) -> None:
    """sft_trainer's data.use_dynamic_bsz (on by default): micro-batches packed to max_token_len_per_gpu x Ulysses
    tokens, micro_batch_size_per_gpu unused; at the file's max_length that is budget * cp // length sequences, at
    least one (workers/engine/utils.py prepare_micro_batches)."""
    on, where = _switch(reading, "dynamic_batch", entry)
    if not as_bool(on):
        return
    budget, at = _switch(reading, "token_budget", entry)
    length = reading.request.get("seq_length")
    if budget is None or not length:
        reading.unresolved.append(f"{where}: token-budget micro-batches need max_token_len_per_gpu and max_length")
        return
    tokens = int(float(str(budget).strip("'\""))) * int(reading.request.get("cp", 1))
    stated = "micro_batch_size" in reading.request and "micro_batch_size" not in reading.defaults
    if stated:
        reading.notes.append(f"{reading.sources['micro_batch_size']} is not used: use_dynamic_bsz packs "
                             "micro-batches to the token budget")
    reading.defaults.pop("micro_batch_size", None)
    reading.state("micro_batch_size", max(1, tokens // int(length)),
                  f"{at} = {budget} tokens per micro-batch (use_dynamic_bsz, {where}) / {length} tokens per sequence")
