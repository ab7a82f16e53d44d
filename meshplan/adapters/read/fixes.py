"""check's fixes as edits of the user's own file: the override lines, flags, TOML keys or JSON fragments to paste.

A finding's fix names the values that work (`pp=2`, `sequence_parallel=false`, `num_gpus = 128`, `tp in 2, 4`),
alternatives joined by "or". Each named request field is written with the key the file itself used for it (its
line and key from `meshplan import`), else with the framework card's adapter key for that knob (the same mapping
the import reads, keys.py), in the file's syntax: Megatron/torchtitan flags, Hydra overrides (verl, SkyRL, Bridge
run_recipe), Bridge Python (`cfg.model.x = 4`), TOML sections, nested JSON. A field the framework has no key for is
said in meshplan's words with the card's reason.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from meshplan.adapters.read.keys import SWITCH_KNOBS, VALUE_KNOBS, convert, read_section
from meshplan.adapters.read.pyconfig import AC_MODES
from meshplan.knowledge.adapter_card import AdapterKnob
from meshplan.knowledge.adapter_knobs import adapter_section, knob_table
from meshplan.knowledge.cards import framework_card
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.imported import ConfigFix, FileChange, ImportedConfig
from meshplan.schema.reports import Finding
from meshplan.schema.request import Request

# `name = value`, and `name = dp*tp*pp = 2*4 = 8` (a chain: its last value); a value that is a product is none, and
# so is a name that ends a product (`mbs*dp*pp = 12` states a product's value, not pp=12).
ASSIGN = re.compile(r"(?<![\w*/])([a-z][a-z0-9_]*)\s*=\s*((?:[\w.*+\-]+\s*=\s*)*)([A-Za-z0-9_.+\-]+)(?![\w*])")
# `name="value"`: a text value, quoted where it holds characters an ASSIGN value cannot (a pipeline layout's |, *, ())
QUOTED = re.compile(r'(?<![\w*/])([a-z][a-z0-9_]*)="([^"]+)"')
NAME = re.compile(r"[a-z][a-z0-9_]*")
CHOICE = re.compile(r"\b([a-z][a-z0-9_]*) in \{?\[?(\d[\d, ]*)")
SOURCE = re.compile(r"^(?P<path>\S+):(?P<line>\d+) (?P<key>\S+)(?: \(\$(?P<via>[^)]*)\))?$")
NO_FIX = re.compile(r"\bnone of\b", re.I)
# MEM001's near misses before the changes that fit together (check/memory.py does_not_fit: 'no single change fits
# (pp=2: 81.3 GiB, tp=2: 90.0 GiB); together, pp=2 + tp=2 (60.1 GiB peak) fits'): figures, not changes
MISSES = re.compile(r"\bno single change fits \(.*?\); together, ")
# An alternative that opens with another framework ('use megatron-bridge, or verl/SkyRL with zero_stage=3': LORA001)
# moves the job there; its settings are that framework's, not an edit of this file
OTHER_FRAMEWORK = re.compile(r"^\s*(?:use\s+)?(" + "|".join(map(re.escape, FRAMEWORKS)) + r")(?![\w-])", re.I)
DROP = re.compile(r"\b[Dd]rop ([a-z][a-z0-9_]*)")
MAX_OPTIONS = 3
NOT_A_CHANGE = frozenset({"model", "framework"})
# The fields the resolver derives from others when a request leaves them out (request/resolve.py: etp from tp where
# the card defaults it to tp, sequence parallelism from tp and pp): named beside a change of what they follow, a value
# already in effect is still an edit, or the file left without it would take the new default (MEM001's
# 'tp=2, etp=1' on a file that leaves etp at 1 read as tp=2 alone: etp 2).
FOLLOWS = {"etp": frozenset({"tp"}), "sequence_parallel": frozenset({"tp", "pp"})}


def fix_changes(fix: str, current: dict[str, Any], in_effect: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The request changes each alternative of a fix names (alternatives split at 'or'); an alternative that names
    no field with a value the field accepts, or only the values already set (by the file, `current`, or in the
    checked layout, `in_effect`: WS002's 'no ep tiles 8 GPUs at pp=16, etp=1' on a file that leaves etp at 1),
    gives none."""
    in_effect = in_effect or {}
    options: list[dict[str, Any]] = []
    for alternative in re.split(r",?\s+or\s+", MISSES.sub("", fix)):
        elsewhere = OTHER_FRAMEWORK.match(alternative)
        if elsewhere and elsewhere.group(1).lower() != str(current.get("framework", "")).lower():
            continue
        found = [(name, m.group(3)) for m in ASSIGN.finditer(alternative) for name in _assigned(m)]
        found += [(m.group(1), m.group(2).split(",")[0]) for m in CHOICE.finditer(alternative)]
        found += [(m.group(1), m.group(2)) for m in QUOTED.finditer(alternative)]
        change: dict[str, Any] = {}
        for name, text in found:
            if name in Request.model_fields and name not in NOT_A_CHANGE and name not in change:
                try:
                    value = convert(name, text.rstrip("."))
                except (ValueError, TypeError):
                    continue
                follows = bool(FOLLOWS.get(name, frozenset()) & change.keys())
                if current.get(name) != value and (name in current or in_effect.get(name) != value or follows):
                    change[name] = value
        for name in DROP.findall(alternative):  # `pp=4 (drop first_stage_layers)`: a field the file set, cleared
            if name in Request.model_fields and name not in NOT_A_CHANGE and current.get(name) is not None:
                change.setdefault(name, None)
        if change and change not in options:
            options.append(change)
    return options[:MAX_OPTIONS]


def _assigned(match: re.Match[str]) -> list[str]:
    """The names an assignment sets: its first, and each plain name of a chain (`tp=pp=ep=1` sets all three; in
    `num_gpus = dp*tp*pp = 8` the product is a formula, not a name)."""
    chained = [part.strip() for part in match.group(2).split("=")]
    return [match.group(1), *(part for part in chained if NAME.fullmatch(part))]


def _value_text(value: Any, style: str) -> str:
    if isinstance(value, bool):
        return ("True" if value else "False") if style == "python" else ("true" if value else "false")
    if isinstance(value, str) and style in ("python", "toml", "json"):
        return json.dumps(value)
    if isinstance(value, list):
        return json.dumps(value) if style in ("python", "toml", "json") else ",".join(map(str, value))
    return str(value)


def written(key: str, value: Any, fmt: str, variant: str | None, framework: str = "megatron-bridge",
            variable: str | None = None) -> str:
    """`key` set to `value` in the file's syntax (a Python config: Bridge's `cfg`, or the script's own name for it,
    `variable`; torchtitan's `config`)."""
    if fmt == "toml":
        section, _, name = key.rpartition(".")
        return (f"[{section}] " if section else "") + f"{name} = {_value_text(value, 'toml')}"
    if fmt == "json":
        nested: Any = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        return json.dumps(nested)
    if variant == "python" and framework == "torchtitan":  # its Python job config: an attribute of the config
        return f"config.{key.lstrip('-')} = {_value_text(value, 'python')}"
    if key.startswith("--"):
        if isinstance(value, bool) and "." not in key:  # an argparse store_true flag
            return key if value else f"(remove {key})"
        return f"{key} {_value_text(value, 'shell')}"
    if variant == "python":
        return f"{variable or 'cfg'}.{key} = {_value_text(value, 'python')}"
    return f"{key}={_value_text(value, 'hydra')}"


LOOK_UP: Any = object()  # a knob argument left to the function to look up (_card_knob)


def _card_value(imported: ImportedConfig, field: str, value: Any, knob: AdapterKnob | None = LOOK_UP) -> Any:
    """The value as the framework's key takes it: the card's word for it where the knob has a vocabulary
    (AdapterKnob.values: DeepSpeed's offload device 'cpu' for true, KempnerForge's 'adamw' for adam), else as is.
    A fix wrote {"offload_optimizer": {"device": true}}, which DeepSpeed's OffloadDeviceEnum refuses."""
    knob = _card_knob(imported, field, value) if knob is LOOK_UP else knob
    word = "true" if value is True else "false" if value is False else str(value)
    theirs = (knob.values or {}).get(word) if knob is not None else None
    return value if theirs is None else _word_value(theirs)


def _word_value(word: str) -> Any:
    """A card's value word as the key takes it: 'true' / 'false' a switch's boolean (Megatron-Bridge's
    ddp.use_distributed_optimizer for zero_stage 1 / 0), any other word as written ('optim_grads_params')."""
    return {"true": True, "false": False}.get(word, word)


def beside_changes(imported: ImportedConfig, field: str, value: Any, knob: AdapterKnob | None) -> list[FileChange]:
    """The keys the framework reads the field's new value only beside (`knob`'s AdapterKnob.beside, the card's knob
    for that value), in the file's syntax: a fix of zero_stage=3 on a Megatron-Bridge file wrote
    ddp.data_parallel_sharding_strategy alone, which Megatron-Core reads only with ddp.use_megatron_fsdp on. Only
    where the file does not state the value already (ImportedConfig.beside_stated): a key it states with another value
    is changed on its own line, not written a second time."""
    if value is None or knob is None:
        return []
    fmt = imported.config_format or "shell"
    out = []
    for key, word in (knob.beside or {}).items():
        stated = imported.beside_stated.get(key)
        if stated is not None and _word_of(stated.value) == word:
            continue  # the file says it already
        text = written(stated.key if stated else key, _word_value(word), fmt, imported.variant, imported.framework,
                       imported.config_variable)
        if stated is None:
            out.append(FileChange(field=field, value=value, key=key, text=text))
        else:
            out.append(FileChange(field=field, value=value, key=stated.key, line=stated.line,
                                  text=f"{text}  # line {stated.line}, was {_word_of(stated.value)}"))
    return out


def _word_of(value: Any) -> str:
    """A file's value as a card's value word: a boolean (a YAML true, a flag given alone) 'true' / 'false'."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _card_knob(imported: ImportedConfig, field: str, value: Any) -> AdapterKnob | None:
    """The card's knob for the field (zero_<stage> / recompute_<mode> for the fields a knob per value sets) in the
    version and variant the file is written for."""
    card = framework_card(imported.framework)
    section = adapter_section(card)
    variant = imported.variant if imported.variant in section.variants else next(iter(section.variants))
    fmt = imported.config_format or "shell"
    version = next((v for v, spec in section.versions.items() if getattr(spec, "format", None) == fmt),
                   section.default_version)  # torchtitan: 0.2's TOML keys for a TOML file, 0.3's flags for a script
    table = knob_table(card, version, variant)
    knob = field if field in VALUE_KNOBS | SWITCH_KNOBS or field in table else {
        "zero_stage": f"zero_{value}", "recompute": f"recompute_{value}"}.get(field)
    return table.get(knob) if knob else None


def _card_key(imported: ImportedConfig, field: str, value: Any,
              knob: AdapterKnob | None = LOOK_UP) -> tuple[str | None, str | None]:
    """(the card's key for the field's knob, why there is none): the knob named after the field, or zero_<stage> /
    recompute_<mode> for the fields a knob per value sets."""
    spec = _card_knob(imported, field, value) if knob is LOOK_UP else knob
    if spec is None:
        return None, f"meshplan knows no {imported.framework} key for {field}"
    if not spec.key or spec.key.startswith("("):
        return None, spec.key or getattr(spec, "instead", None) or f"{imported.framework} has no key for {field}"
    return _entry_key(imported, spec.key), None


def _entry_key(imported: ImportedConfig, key: str) -> str:
    """A card key as the file's entry point writes it: SkyRL main_sft's SFTConfig key for the RL entry point's (the
    card's read.sft_keys, read backwards), whose strict config refuses the other; verl's fsdp_sft_trainer key for
    sft_trainer's (read.sft's keys_as of the entry point the file runs, read backwards)."""
    if imported.variant not in ("sft", "sft-fsdp", "sft-megatron"):
        return key
    sft = read_section(imported.framework).sft
    if sft is not None:
        entry = next((e for e in sft.entries if re.search(rf"{re.escape(e.launcher)}\b", imported.sources.get(
            "job", ""))), None)
        pairs = list(entry.keys_as.items()) if entry is not None else []
        return next((old + key[len(new):] for old, new in pairs
                     if key == new or (new.endswith(".") and key.startswith(new))), key)
    for short, long in read_section(imported.framework).sft_keys.items():
        if key == long or (long.endswith(".") and key.startswith(long)):
            return short + key[len(long):]
    return key


def _same_key(imported: ImportedConfig, field: str, value: Any, key: str) -> bool:
    """Whether the file's own key takes the new value too: always for a value knob; for zero_stage and recompute
    (a knob per value) only when the card's key is the same for the file's value and the new one
    (`zero_optimization.stage`, torchtitan's `activation_checkpoint.mode`), not `--use-distributed-optimizer`."""
    if field not in ("zero_stage", "recompute"):
        return True
    keys = {_card_key(imported, field, v)[0] for v in (imported.request.get(field), value)}
    return len(keys) == 1 and (keys.pop() or "").split()[0].lstrip("[").endswith(key.rsplit(".", 1)[-1])


def _flag_words(imported: ImportedConfig, field: str, value: Any, key: str) -> tuple[str, str] | None:
    """(new, old): the words the file's flag `key` takes for the field's new value and has for its own, where the
    card's key for each value (a knob per value: zero_stage, recompute) is flags carrying it, the same but for that
    word (Megatron-Core's '--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads[_params]'): the file's
    own line changed, not the card's key written whole beside it (its --use-megatron-fsdp a second time). None
    otherwise."""
    if field not in ("zero_stage", "recompute") or not key.startswith("--"):
        return None
    new, old = (_card_key(imported, field, v)[0] for v in (value, imported.request.get(field)))
    new_words, old_words = (new or "").split(), (old or "").split()
    if key not in new_words or len(new_words) != len(old_words) or new_words == old_words:
        return None
    at = new_words.index(key) + 1
    if at == len(new_words) or new_words[at].startswith("-") or new_words[:at] + new_words[at + 1:] != \
            old_words[:at] + old_words[at + 1:]:
        return None
    return new_words[at], old_words[at]


def file_change(imported: ImportedConfig, field: str, value: Any, knob: AdapterKnob | None = LOOK_UP) -> FileChange:
    """The field's new value as an edit of the file's own key, else the card's `knob` for it (looked up where not
    given), in the file's syntax."""
    fmt = imported.config_format or "shell"
    if knob is LOOK_UP:
        knob = _card_knob(imported, field, value) if value is not None else None
    source = SOURCE.match(imported.sources.get(field, ""))
    if value is None:  # a field the fix drops: the file's own key taken out, so the framework's default holds
        where = (source.group("key"), int(source.group("line"))) if source is not None else _stated_through(
            imported, field)
        return FileChange(field=field, value=None, key=where[0], line=where[1],
                          text=f"(remove {where[0]})  # line {where[1]}" if where[0] else f"(leave {field} out)")
    through = _stated_through(imported, field) if field == "dp" else (None, None)
    if through[0] is not None:  # a ds_config's dp, the quotient of its batch keys: the framework derives the new one
        return FileChange(field=field, value=value, key=through[0], line=through[1],
                          text=f"(remove {through[0]})  # line {through[1]}: "
                               f"{framework_card(imported.framework).display_name} derives it, dp {value}")
    if source is not None and (words := _flag_words(imported, field, value, source.group("key"))) is not None:
        key, line = source.group("key"), int(source.group("line"))
        return FileChange(field=field, value=value, key=key, line=line,
                          text=f"{key} {words[0]}  # line {line}, was {words[1]}")
    if source is not None and _same_key(imported, field, value, source.group("key")):
        key = source.group("key")
        text = written(key, _card_value(imported, field, value, knob), fmt, imported.variant, imported.framework,
                       imported.config_variable)
        was = imported.request.get(field)
        if field in ("zero_stage", "recompute"):  # the file's own word for it (use_distributed_optimizer false, not 0)
            was = _card_value(imported, field, was)
            was = str(was).lower() if isinstance(was, bool) else was
        via = f", through ${source.group('via')}" if source.group("via") else ""
        return FileChange(field=field, value=value, key=key, line=int(source.group("line")),
                          text=f"{text}  # line {source.group('line')}, was {was}{via}")
    if imported.variant == "python" and imported.framework == "torchtitan" and field == "recompute":
        ac = {mode: name for name, mode in AC_MODES.items()}[value]  # activation_checkpoint=SelectiveAC.Config()
        return FileChange(field=field, value=value, key="activation_checkpoint",
                          text=f"config.activation_checkpoint = {ac}.Config()")
    key, why = _card_key(imported, field, value, knob)
    if key is None and field == "dp" and field not in imported.sources:
        # a file that states no dp, for a framework with no key for it, runs the dp its GPU count leaves (Megatron's
        # world / (tp x pp x cp), verl's and SkyRL's too): the fix's dp follows from its other changes, no edit
        # ('dp=16  # meshplan knows no verl key for dp' was written as a line to paste)
        return FileChange(field=field, value=value, key=None,
                          text=f"(dp {value} follows: {framework_card(imported.framework).display_name} derives it "
                               "from the GPU count, no key to set)")
    if key is None:
        stated = imported.sources.get(field)
        why = f"the file states it as {stated}" if stated and field not in ("zero_stage", "recompute") else why
        return FileChange(field=field, value=value, key=None, text=f"{field}={value}  # {why}")
    if fmt == "toml" and key.startswith("--") and "." in key:  # torchtitan: a --section.key override is that TOML key
        key = key[2:]
    flag = key.startswith("--")
    if " " in key.strip() and not flag and not key.startswith(("[", "(")):
        # a knob whose key carries its value ('distributed.strategy ddp', AutoModel's): the key set to it in the
        # file's syntax, as every other fix line ('distributed.strategy ddp' read as a line to paste into YAML)
        key, _, carried = key.strip().partition(" ")
        text = written(key, yaml.safe_load(carried), fmt, imported.variant, imported.framework,
                       imported.config_variable)
    elif (" " in key.strip() and not key.startswith("[")) or (flag and field in ("zero_stage", "recompute")):
        text = key  # the knob's key carries its value ('--recompute-granularity selective'), or is a switch
    else:
        text = written(key, _card_value(imported, field, value, knob), "shell" if flag else fmt, imported.variant,
                       imported.framework, imported.config_variable)
    if flag and fmt in ("toml", "json"):  # a ds_config's Megatron-DeepSpeed flags: the launcher's, not the file's
        text += "  # on the launch command line, not in this file"
    return FileChange(field=field, value=value, key=key, text=text)


def _stated_through(imported: ImportedConfig, field: str) -> tuple[str | None, int | None]:
    """(key, line) of the key a file states `field` through where no key of its own sets it: a ds_config's dp, the
    quotient of its batch keys, is dropped by removing gradient_accumulation_steps (the card's read.dp_through),
    which DeepSpeed then derives from the GPU count; '(leave dp out)' named no edit of the file."""
    key = read_section(imported.framework).dp_through if field == "dp" else None
    found = re.search(rf":(\d+) {re.escape(key)}\b", imported.sources.get(field, "")) if key else None
    return (key, int(found.group(1))) if found else (None, None)


# The fields a file stating dp through the batch keys ties together (DeepSpeed's _batch_assertion: train_batch_size
# = micro-batch x gradient_accumulation_steps x dp, dp = GPUs / (tp x pp x cp)): a change of any moves the product
BATCH_PRODUCT = frozenset({"micro_batch_size", "global_batch_size", "dp", "tp", "pp", "cp", "num_gpus"})


def _dp_through_released(imported: ImportedConfig, option: dict[str, Any]) -> dict[str, Any]:
    """The option with the key the file states dp through removed (dp dropped) where it changes a field of the batch
    product: MEM001's 'micro_batch_size=1' on a ds_config stating train_batch_size 256, micro 4 and accumulation 8
    wrote the micro-batch alone, and DeepSpeed asserts 256 == 1 x 8 x 8 (WS003 on the fixed file); with
    gradient_accumulation_steps removed DeepSpeed derives it (256 // 1 // 8 = 32)."""
    if "dp" in option or not BATCH_PRODUCT & option.keys() or _stated_through(imported, "dp")[0] is None:
        return option
    return option | {"dp": None}


def _changes(imported: ImportedConfig, field: str, value: Any) -> list[FileChange]:
    """A field's new value as the file's lines: its own key's change, then the keys the card writes beside it, the
    card's knob for the value looked up once for both."""
    knob = _card_knob(imported, field, value) if value is not None else None
    return [file_change(imported, field, value, knob), *beside_changes(imported, field, value, knob)]


def config_fixes(imported: ImportedConfig, findings: list[Finding],
                 in_effect: dict[str, Any] | None = None) -> list[ConfigFix]:
    """Each finding whose fix names field values, as edits of the imported file (none that writes a value the
    checked layout, `in_effect`, already has)."""
    out = []
    for finding in findings:
        if NO_FIX.search(finding.fix):  # "none of the nearby layouts fits (pp=2: 130 GiB ...)": misses, not fixes
            continue
        options = [_dp_through_released(imported, o) for o in fix_changes(finding.fix, imported.request, in_effect)]
        if options:
            out.append(ConfigFix(finding=finding.id, fix=finding.fix, options=[
                [change for field, value in option.items()
                 for change in _changes(imported, field, value)]
                for option in options]))
    return out
