"""The catalog model a launch script's architecture flags describe. Every field the script states, and every one it
leaves to the framework's own default (Megatron-LM builds a dense MLP without --num-experts, tied embeddings without
--untie-embeddings-and-output-weights), is compared with each catalog model, so an MoE or MLA script is never read as
the dense model of the same width and depth; where none matches, the fields that differ are named, and a Megatron-LM
or Megatron-DeepSpeed script's model is built from its own flags (knowledge/flag_models.py, `flags_model`).

Which flag states which field, and the framework's default for an absent one, come from the framework card's
`read.model_flags` and `read.model_defaults`, never from a table here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NamedTuple

from meshplan.adapters.architecture import bridge_fields, core_restated, core_values, megatron_architecture, restated
from meshplan.adapters.read.keys import Reading, as_bool
from meshplan.adapters.read.settings import Setting
from meshplan.adapters.read.shell import Word
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import catalog_architecture, catalog_keys, resolve_model
from meshplan.knowledge.flag_models import (
    BUILDERS,
    build_from_flags,
    default_tokenizer,
    moe_layers,
    moe_pattern,
    read_flags,
    tokenizer_vocab_note,
)
from meshplan.knowledge.gdn_config import decoder_pattern_from_flags
from meshplan.knowledge.model_config import shapes_card
from meshplan.knowledge.model_counts import total_params
from meshplan.knowledge.read_card import SHAPE_FIELDS, ReadSection
from meshplan.knowledge.section_models import build_from_section
from meshplan.schema.model import Architecture

SWITCHES = frozenset({"mla", "untied", "swiglu", "qk_layernorm", "shared_expert_gate", "attention_output_gate"})
MOE_DETAILS = ("top_k", "expert_ffn_hidden_size", "shared_expert_ffn_hidden_size", "moe_layers", "num_groups",
               "group_topk")
MLA_DETAILS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MAMBA_DETAILS = ("mamba_num_heads", "mamba_head_dim", "mamba_num_groups", "mamba_state_dim")
TEXTS = frozenset({"layer_pattern"})  # a field stated as a word, not a count


class ArchValues(NamedTuple):
    """One model's architecture in the terms a launch script states it (0 experts: dense)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int
    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int
    moe_layers: tuple[int, ...]
    num_groups: int
    group_topk: int
    mla: bool
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    untied: bool
    swiglu: bool
    qk_layernorm: bool
    layer_pattern: str | None = None  # a hybrid's (M Mamba-2, * attention, - MLP, E MoE); None: a GPT model
    mamba_num_heads: int | None = None
    mamba_head_dim: int | None = None
    mamba_num_groups: int | None = None
    mamba_state_dim: int | None = None
    shared_expert_gate: bool = False
    attention_output_gate: bool = False
    linear_num_key_heads: int | None = None  # a Gated DeltaNet hybrid's (qwen3_next) mixer; None: none
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    index_n_heads: int | None = None  # DSA's indexer (DeepSeek-V3.2); None: dense attention
    index_head_dim: int | None = None
    index_topk: int | None = None


def arch_values(arch: Architecture) -> ArchValues:
    moe, mla = arch.moe, arch.mla
    return ArchValues(
        num_layers=arch.num_layers, hidden_size=arch.hidden_size, ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads, num_kv_heads=arch.num_kv_heads, vocab_size=arch.vocab_size,
        head_dim=arch.head_dim, num_experts=moe.num_experts if moe else 0, top_k=moe.top_k if moe else 0,
        expert_ffn_hidden_size=moe.expert_ffn_hidden_size if moe else 0,
        shared_expert_ffn_hidden_size=moe.shared_expert_ffn_hidden_size if moe else 0,
        moe_layers=tuple(moe.moe_layers) if moe else (), num_groups=moe.num_groups if moe else 1,
        group_topk=moe.group_topk if moe else 1, mla=mla is not None, q_lora_rank=mla.q_lora_rank if mla else None,
        kv_lora_rank=mla.kv_lora_rank if mla else 0, qk_nope_head_dim=mla.qk_nope_head_dim if mla else 0,
        qk_rope_head_dim=mla.qk_rope_head_dim if mla else 0, v_head_dim=mla.v_head_dim if mla else 0,
        untied=not arch.tie_word_embeddings, swiglu=arch.is_swiglu,
        qk_layernorm=arch.qk_norm != "none", layer_pattern=arch.layer_pattern,
        **({} if arch.mamba is None else dict(
            mamba_num_heads=arch.mamba.num_heads, mamba_head_dim=arch.mamba.head_dim,
            mamba_num_groups=arch.mamba.n_groups, mamba_state_dim=arch.mamba.state_size)),
        shared_expert_gate=moe.shared_expert_gate if moe else False, attention_output_gate=arch.attention_output_gate,
        **({} if arch.gdn is None else dict(
            linear_num_key_heads=arch.gdn.num_key_heads, linear_num_value_heads=arch.gdn.num_value_heads,
            linear_key_head_dim=arch.gdn.key_head_dim, linear_value_head_dim=arch.gdn.value_head_dim,
            linear_conv_kernel_dim=arch.gdn.conv_kernel)),
        **({} if arch.dsa is None else dict(
            index_n_heads=arch.dsa.index_n_heads, index_head_dim=arch.dsa.index_head_dim,
            index_topk=arch.dsa.index_topk)))


@dataclass(frozen=True)
class Stated:
    """One architecture field as the script states it (or its framework's default for an absent flag)."""

    field: str
    value: Any
    said: str  # how the report names it: '--num-experts 8', '--swiglu not given'


def applies(name: str, arch: ArchValues, stated: dict[str, Stated]) -> bool:
    """Whether a stated field is compared with this model: a dense width only where the model has a dense layer,
    expert details only for an MoE model, MLA dims only for an MLA model (whose head width and latent norms they
    set instead of --kv-channels and --qk-layernorm)."""
    if name == "ffn_hidden_size":
        return len(arch.moe_layers) < arch.num_layers
    if name in MOE_DETAILS:
        return arch.num_experts > 0 and stated.get("num_experts", Stated("", 1, "")).value != 0
    if name in MLA_DETAILS:
        return arch.mla and bool(stated.get("mla", Stated("", True, "")).value)
    if name in ("head_dim", "qk_layernorm"):
        return not arch.mla
    if name in MAMBA_DETAILS:  # a hybrid's mixer (the pattern itself tells a hybrid from a GPT model)
        return arch.layer_pattern is not None and arch.linear_num_key_heads is None
    return True


def differences(arch: ArchValues, stated: dict[str, Stated], key: str) -> list[str]:
    """Each stated field this model does not have, with the model's own value."""
    return [f"{s.said} ({key}: {_show(getattr(arch, name))})" for name, s in stated.items()
            if applies(name, arch, stated) and getattr(arch, name) != s.value]


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return f"MoE layers {_layers(value)}"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _layers(layers: tuple[int, ...]) -> str:
    if not layers:
        return "none"
    if layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    steps = {b - a for a, b in pairwise(layers)}
    if len(steps) == 1 and len(layers) > 3:
        return f"{layers[0]},{layers[1]},...,{layers[-1]}"
    return ",".join(map(str, layers)) if len(layers) <= 8 else f"{len(layers)} layers from {layers[0]}"


def _distance(arch: Architecture, stated: dict[str, Stated]) -> float:
    """How far a model's depth and width are from the script's, for naming the nearest of those that differ."""
    return sum(abs(math.log(getattr(arch, f) / stated[f].value)) for f in ("num_layers", "hidden_size")
               if f in stated and stated[f].value > 0)


# --------------------------------------------------------------------------- reading the flags


def _flag_values(words: list[Word], flag: str) -> list[str]:
    """Every value after `flag` up to the next flag (Megatron-DeepSpeed's --num-experts takes one per MoE layer)."""
    out: list[str] = []
    for k, word in enumerate(words):
        if word.text.replace("_", "-") == flag:
            out = []
            for later in words[k + 1:]:
                if later.text.startswith("--"):
                    break
                out.append(later.text)
    return out


def _convert(name: str, value: Any) -> Any:
    if name in SWITCHES:  # a switch given is on (a word after it that is no false-like value is another word)
        return as_bool(value) is not False
    if value is None or str(value).strip("'\"") in ("None", "null"):
        return None
    if name in TEXTS:
        return str(value).strip("'\"")
    return int(str(value).strip("'\""))


def stated_fields(reading: Reading, section: ReadSection, shape: dict[str, Any], flags: dict[str, Setting],
                  words: list[Word]) -> dict[str, Stated] | None:
    """The script's architecture: its shape flags, the card's `model_flags` given and, for those absent, the card's
    `model_defaults` (the framework's own); the derived ones (MoE layers, the experts' width) as the framework
    derives them. None where a flag's value cannot be read (an unset variable) or the script's model is none
    meshplan builds, said in `reading.unresolved`."""
    keys = section.model_shape
    out = {f: Stated(f, int(v), f"{k.split('|')[0]} {v}") for f, k, v in zip(SHAPE_FIELDS, keys, shape.values(),
                                                                                strict=False)
           if v is not None and str(v).lstrip("-").isdigit()}
    raw: dict[str, Any] = {}
    defaults = section.model_defaults
    for flag, name in section.model_flags.items():
        if flag in flags:
            raw[name] = (flags[flag].value, f"{flag} {flags[flag].value}" if name not in SWITCHES else flag)
            values = _flag_values(words, flag)
            if name == "num_experts" and len(set(values)) > 1:
                reading.leave(("model",), f"model: {flags[flag].where(reading.path)} {' '.join(values)}: a "
                                          "different expert count per MoE layer is no model meshplan builds (pass "
                                          "--model with the model's config.json)")
                return None
        elif name in defaults and name not in raw:  # (a field two flags state: the one given, else the default)
            raw[name] = (defaults[name], f"{flag} not given" if name in SWITCHES or defaults[name] in (None, 0)
                         else f"{flag} not given: {defaults[name]}")
    for name, (value, said) in raw.items():
        if name in ("moe_layer_freq", "expert_interval", "linear_attention_freq"):
            continue
        try:
            out[name] = Stated(name, _convert(name, value), said)
        except ValueError:  # an unset variable: the script's model cannot be told from the catalog's
            reading.leave(("model",), f"model: {said}: {value!r} is not a whole number, so the script's model is "
                                      "not read (pass --model)")
            return None
    if not gdn_stated(reading, section, flags, out, raw):
        return None
    return out if _derived(reading, out, raw) else None


def gdn_stated(reading: Reading, section: ReadSection, flags: dict[str, Setting], out: dict[str, Stated],
               raw: dict[str, Any]) -> bool:
    """A Megatron-Core GPTModel of Gated DeltaNet layers (the card's read.gated_delta_net: its variant flag given)
    stated as meshplan's hybrid pattern: --num-layers decoder layers, each its mixer from --linear-attention-freq (G
    or *, get_linear_attention_pattern) and its MLP from --moe-layer-freq (E or -, get_moe_layer_pattern), so the
    depth, pattern and MoE layers compare with the catalog's in pattern layers. False where it cannot be read."""
    facts = section.gated_delta_net
    if facts is None:
        return True
    variant = flags.get(facts.variant_flag)
    freq, said = raw.get("linear_attention_freq", (None, ""))
    if variant is None or str(variant.value).strip("'\"") not in facts.variants:
        given = [flags[f] for f, name in section.model_flags.items() if name == "linear_attention_freq" and f in flags]
        if given:  # Megatron-Core reads it for a linear attention variant only
            reading.unsupported.append(
                f"{given[0].where(reading.path)} = {given[0].value}: no Gated DeltaNet layer without "
                f"{facts.variant_flag} {facts.variants[0]} (Megatron-Core reads linear_attention_freq for a linear "
                "attention variant only): every layer is attention, as meshplan reads the model")
        return True
    if "num_layers" not in out:
        return True
    decoder = out["num_layers"].value
    if freq is None:
        reading.leave(("model",), f"model: {variant.where(reading.path)} {variant.value} without a linear attention "
                                  "frequency: Megatron-Core refuses it (linear_attention_freq must be set), so the "
                                  "script's model is not read (pass --model)")
        return False
    text = str(freq).strip().strip("'\"")
    try:
        linear = moe_pattern(text) if "[" in text else [0 if (i + 1) % int(text) == 0 else 1 for i in range(decoder)]
        if len(linear) != decoder:
            raise ValueError(f"its pattern has {len(linear)} entries for {decoder} layers")
        experts = out.get("num_experts")
        moe = set(moe_layers(raw.get("moe_layer_freq", (1, ""))[0], None, decoder)) if experts is None or \
            experts.value else set()
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as exc:
        reading.leave(("model",), f"model: {said}: not a layer pattern meshplan can read ({exc}), so the script's "
                                  "model is not read (pass --model)")
        return False
    pattern = decoder_pattern_from_flags(linear, [1 if i in moe else 0 for i in range(decoder)])
    out["num_layers"] = Stated("num_layers", len(pattern), f"{out['num_layers'].said} decoder layers "
                                                            f"({len(pattern)} pattern layers)")
    out["layer_pattern"] = Stated("layer_pattern", pattern, f"{variant.key} {variant.value} with {said}")
    out["moe_layers"] = Stated("moe_layers", tuple(i for i, k in enumerate(pattern) if k == "E"),
                               f"{raw.get('moe_layer_freq', (1, '--moe-layer-freq not given'))[1]} (MoE decoder "
                               f"layers {_layers(tuple(sorted(moe)))})")
    return True


def _derived(reading: Reading, out: dict[str, Stated], raw: dict[str, Any]) -> bool:
    """The experts' width (the dense width where not given, as Megatron-LM's validate_args and Megatron-DeepSpeed's
    ParallelMLP take it) and the MoE layers, for an MoE script; False where its MoE layers cannot be read."""
    heads, pattern = out.get("mamba_num_heads"), out.get("layer_pattern")
    if heads is not None and heads.value is None and pattern is not None and pattern.value and "hidden_size" in out \
            and out.get("mamba_head_dim") is not None and out["mamba_head_dim"].value:
        # TransformerConfig.mamba_num_heads None: hidden_size x expand (2) // mamba_head_dim
        value = out["hidden_size"].value * 2 // out["mamba_head_dim"].value
        out["mamba_num_heads"] = Stated("mamba_num_heads", value, f"{heads.said}: hidden x 2 / head dim = {value}")
    experts = out.get("num_experts")
    if experts is not None and (experts.value is None or experts.value <= 1):
        out["num_experts"] = Stated("num_experts", 0, experts.said)  # one expert is a dense MLP (Megatron-DeepSpeed)
        return True
    if experts is None:
        return True
    if "expert_ffn_hidden_size" not in out and "ffn_hidden_size" in out:
        out["expert_ffn_hidden_size"] = Stated("expert_ffn_hidden_size", out["ffn_hidden_size"].value,
                                               f"{out['ffn_hidden_size'].said} (the experts' width)")
    source = raw.get("expert_interval") or raw.get("moe_layer_freq")
    if source is None or "num_layers" not in out or "moe_layers" in out:  # (a GDN GPTModel's: gdn_stated)
        return True
    deepest = shapes_card().bounds["num_hidden_layers"].max
    if not 1 <= out["num_layers"].value <= deepest:  # moe_layers lists every layer: 10**20 of them filled the memory
        reading.leave(("model",), f"model: {out['num_layers'].said} is outside 1 to {deepest:,} layers "
                                  "(cards/model_shapes.yaml), so the script's model is not read (pass --model)")
        return False
    try:
        layers = moe_layers(*(raw.get(k, (None, ""))[0] for k in ("moe_layer_freq", "expert_interval")),
                             out["num_layers"].value)
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as exc:
        reading.leave(("model",), f"model: {source[1]}: not a MoE layer pattern meshplan can read ({exc}), so the "
                                  "script's model is not read (pass --model)")
        return False
    out["moe_layers"] = Stated("moe_layers", layers, f"{source[1]} (MoE layers {_layers(layers)})")
    return True


def _number(value: Any) -> float | None:
    """A flag's number ('500000', '5e5'); None for what is not one ('abc', a flag alone), which matches no model."""
    try:
        return float(str(value).strip("'\""))
    except ValueError:
        return None


def match_stated(stated: dict[str, Stated] | None, reading: Reading, rope: tuple[Any, bool] | None = None,
                 named: str | None = None) -> bool:
    """The catalog model whose architecture matches every stated field, or the nearest ones (the model the file
    `named`, first) with the fields that differ; among models that match, those with the file's rotary base and rope
    scaling (`rope`) first. True where the file states a model and no catalog model has it."""
    if stated is None:
        return False
    if len([f for f in SHAPE_FIELDS if f in stated]) < 3:
        reading.leave(("model",), "model: the file names no model (pass --model)")
        return False
    misses: dict[str, list[str]] = {}
    for key in catalog_keys():  # a hybrid's pattern is a stated field: a GPT script never matches one, nor the reverse
        misses[key] = differences(arch_values(catalog_architecture(key)), stated, key)
    hits = [key for key, miss in misses.items() if not miss]
    if rope is not None and len(hits) > 1:
        def same_rope(key: str) -> bool:
            spec = catalog_architecture(key).rope
            theta_ok = rope[0] is None or (spec is not None and spec.theta == _number(rope[0]))
            return theta_ok and (spec is not None and spec.scaling is not None) == rope[1]
        hits.sort(key=lambda key: not same_rope(key))
    experts = stated.get("num_experts")
    moe = experts is not None and experts.value != 0
    said = ", ".join(s.said for s in stated.values() if s.field in SHAPE_FIELDS or (
        s.field in ("mla", "layer_pattern") and s.value) or (
        moe and s.field in ("num_experts", "top_k")))
    if hits:
        reading.state("model", hits[0], f"{reading.path} ({said}: the architecture of {hits[0]})")
        if len(hits) > 1:
            reading.notes.append(f"model: {', '.join(hits)} share this architecture; {hits[0]} taken")
        return False
    pattern = stated.get("layer_pattern")
    hybrid = pattern is not None and bool(pattern.value)
    kind = ("hybrid " if hybrid else "") + ("MoE " if moe else "")
    def nearness(key: str) -> tuple[bool, bool, bool, int, float, str]:
        """The named model, then those of the script's kind (a hybrid's layer pattern or none: a pretrain_mamba.py
        script's nearest were Nemotron-4 340B and Llama 3 8B; then dense or MoE), then the fewest fields that
        differ, then depth and width."""
        arch = catalog_architecture(key)
        return (key != named, (arch.layer_pattern is not None) != hybrid, arch.is_moe != moe, len(misses[key]),
                _distance(arch, stated), key)
    nearest = sorted(misses, key=nearness)[:2]
    reading.leave(
        ("model",), f"model: no catalog model has this {kind}architecture ({said}); nearest: "
        + "; ".join(f"{key} differs in {', '.join(misses[key])}" for key in nearest)
        + ". Pass --model with the model's config.json")
    return True


MISSED = "model: no catalog model has this "


def flags_model(reading: Reading, flags: dict[str, Setting]) -> None:
    """A model no catalog card has, built from the script's own flags as its framework builds it
    (knowledge/flag_models.py), each field with the flag and line that set it; where it cannot be built, the flag
    and what to do."""
    if reading.framework not in BUILDERS:
        return
    pattern = [flag for flag, name in framework_card(reading.framework).read.model_flags.items()
               if name == "layer_pattern" and flag in flags]
    if pattern:
        reading.leave(("model",), f"model: not built from the file's flags either: {pattern[0]} states a hybrid "
                                  "model's layers, which meshplan builds from a config.json (model_type nemotron_h) "
                                  "only. Pass --model with the model's config.json, or a catalog key.")
        return
    known = read_flags(reading.framework)
    flags = dict(flags)
    launcher_tokenizer = default_tokenizer(reading.framework, flags)
    if launcher_tokenizer is not None:  # --vocab-file without --tokenizer-type: the launcher's own default
        read = framework_card(reading.framework).read
        flags["--tokenizer-type"] = Setting("--tokenizer-type", launcher_tokenizer, flags["--vocab-file"].line,
                                            written=f"--vocab-file, and the launcher's default --tokenizer-type "
                                                    f"({' '.join((read.default_tokenizer_source or '').split())})")
    given = {k: s.value for k, s in flags.items() if k in known}
    try:
        built = build_from_flags(reading.framework, given)
    except MeshplanError as exc:
        reading.leave(("model",), f"model: not built from the file's flags either: {exc.reason} {exc.fix}")
        return
    reading.unresolved = [u for u in reading.unresolved if not u.startswith(MISSED)]
    reading.left_to_request = [u for u in reading.left_to_request if not u.said.startswith(MISSED)]
    reading.state("model", built.arch.origin, f"{reading.path} (built from its flags: no catalog model has this "
                                              "architecture)")
    said = [f"{f.name} {_show(f.value)} ({flags[f.flag].where(reading.path) if f.given else f.flag + ' not given'})"
            for f in built.fields if f.given or f.value is not False]
    reading.notes.append("model: no catalog model has this architecture, so it is built from the file's flags as "
                         f"{framework_card(reading.framework).display_name} builds it: {'; '.join(said)}")
    vocab = tokenizer_vocab_note(reading.framework, given)
    if vocab is not None:  # the tokenizer's file is not read: its size is the card's, assumed where it takes a file
        (reading.assumed if vocab[1] else reading.notes).append(f"model: {vocab[0]}")


def section_model(reading: Reading, settings: list[Setting]) -> None:
    """The model a file's architecture section states (KempnerForge's [model]), built as the framework's model code
    builds it (knowledge/section_models.py), every field left out at the framework's default and said: the catalog
    model with the same architecture and parameter count where there is one, else the built model itself. A section
    beside it whose parts meshplan does not count (a VLM's [vlm]) leaves the model to the request, said."""
    spec = framework_card(reading.framework).read.model_section
    assert spec is not None, f"{reading.framework}'s card has a read.model_section"
    prefix = f"{spec.section}."
    given = {s.key.removeprefix(prefix): s for s in settings if s.key.startswith(prefix)
             and s.key.removeprefix(prefix) in spec.defaults}
    refused = next(((s, why) for s in settings for name, why in spec.refused_sections.items()
                    if s.key.split(".")[0] == name), None)
    if refused is not None:
        reading.leave(("model",), f"model: {refused[0].where(reading.path)} [{refused[0].key.split('.')[0]}]: "
                                  f"{refused[1]}; pass --model to plan the text decoder alone")
        return
    if not given:
        reading.leave(("model",), "model: the file names no model (pass --model)")
        return
    try:
        built = build_from_section(reading.framework, {k: s.value for k, s in given.items()})
    except MeshplanError as exc:
        reading.leave(("model",), f"model: not built from the file's [{spec.section}] section: {exc.reason} {exc.fix}")
        return
    mine, count = arch_values(built.arch), total_params(built.arch)
    hits = [key for key in catalog_keys() if arch_values(catalog_architecture(key)) == mine
            and total_params(catalog_architecture(key)) == count]
    said = "; ".join(f"{f.name} {f.value} ({given[f.name].where(reading.path)})" for f in built.fields if f.given)
    left = "; ".join(f"{f.name} {f.value}" for f in built.fields if not f.given)
    display = framework_card(reading.framework).display_name
    home = next((s.file for s in given.values() if s.file), reading.path)  # the TOML a launch script names
    if hits:
        reading.state("model", hits[0], f"{home} [{spec.section}] ({count:,} parameters as {display} builds "
                                        f"it: the architecture of {hits[0]})")
        if len(hits) > 1:
            reading.notes.append(f"model: {', '.join(hits)} share this architecture; {hits[0]} taken")
    else:
        reading.state("model", built.arch.origin, f"{home} [{spec.section}] (built as {display} builds it, "
                                                  f"{count:,} parameters: no catalog model has this architecture)")
    reading.notes.append(f"model: the [{spec.section}] section's architecture as {display}'s model code builds it: "
                         f"{said}" + (f"; left to its defaults (cards/frameworks/{reading.framework}.yaml "
                                      f"read.model_section): {left}" if left else ""))


def recipe_overrides(reading: Reading, settings: list[Setting], section: ReadSection) -> None:
    """A recipe's model under the file's architecture overrides (Megatron-Bridge's `model.num_moe_experts=64`, keys
    from the card's `read.model_flags`): where one changes the recipe's model, the catalog model with the changed
    architecture, else none, the fields named; one that cannot be read leaves the model unread (never the recipe's
    model with its overrides dropped). A vocab_size override is the tokenizer's rows on the same model (Bridge 067f987
    recipes/moonlight/h100/moonlight_16b.py keeps 163842 finetuning-token rows on Moonlight's 163840): said, and the
    model kept with its own vocabulary (its layers are the same; the embedding and output rows differ by the rows
    the file adds, times the hidden size)."""
    keys = section.model_flags
    given = {keys[s.key]: s for s in settings if s.key in keys}
    model = reading.request.get("model")
    if model is None or not given:
        return
    recipe = arch_values(resolve_model(model))
    stated: dict[str, Stated] | None = {
        name: Stated(name, getattr(recipe, name), f"{model}'s {name} {_show(getattr(recipe, name))}")
        for name in ArchValues._fields}
    raw: dict[str, Any] = {}
    for name, s in given.items():
        if name == "moe_layer_freq":
            raw[name] = (s.value, f"{s.key}={s.value}")
            continue
        try:
            stated[name] = Stated(name, _convert(name, s.value), f"{s.key}={s.value}")
        except ValueError:
            stated = None
            reading.leave(("model",), f"model: {s.where(reading.path)} = {s.value!r} is not a whole number, so the "
                                      f"recipe's {model} with it is not read (pass --model)")
            break
    if stated is not None and {"num_layers", "moe_layer_freq", "num_experts"} & set(given):
        del stated["moe_layers"]  # the recipe's MoE layers no longer apply; a stated pattern gives them again
        if raw and not _derived(reading, stated, raw):
            stated = None
    if stated is not None and "vocab_size" in given and stated["vocab_size"].value != recipe.vocab_size:
        vocab = given["vocab_size"]
        reading.unsupported.append(
            f"{vocab.where(reading.path)} = {vocab.value}: the tokenizer's rows, not {model}'s "
            f"({recipe.vocab_size}); meshplan plans {model} with its own vocabulary")
        stated["vocab_size"] = Stated("vocab_size", recipe.vocab_size, f"{model}'s vocab_size {recipe.vocab_size}")
    if stated is not None and all(getattr(recipe, name) == stated[name].value for name in stated):
        return
    reading.request.pop("model")
    reading.sources.pop("model", None)
    match_stated(stated, reading, named=model)


def layout_settings(settings: list[Setting], section: ReadSection) -> list[Setting]:
    """A Megatron-Bridge file's settings less the model's own keys (the card's model_flags, and the architecture a
    rendered file restates: restated_architecture reads both), which are never applied as layout settings."""
    return [s for s in settings if s.key not in section.model_flags and not restated(s.key)]


def restated_architecture(reading: Reading, settings: list[Setting], section: ReadSection, core: bool = False
                          ) -> None:
    """The keys a rendered Megatron-Bridge file restates the model with (adapters/architecture.py FIELDS: norm, rope,
    gating), or with `core` the flags of a Megatron-Core script (CORE_FLAGS), read back as the model's, never as 'no
    meshplan field': compared with the named model's own (a recipe's, or the one the script's shape flags name, as
    megatron_architecture writes them), each that differs said; where the file names no model (cfg assignments),
    said with the card's model_flags keys as the architecture of the model to be passed beside the file."""
    restates, face = (core_restated, core_values) if core else (
        restated, lambda arch: bridge_fields(megatron_architecture(arch, 0)[0]))
    keys = [s for s in settings if restates(s.key) and s.key not in section.model_flags]
    model = reading.request.get("model")
    if model is None:
        shape = [s.key for s in settings if s.key in section.model_flags] + [s.key for s in keys]
        if shape:
            reading.notes.append(f"{', '.join(shape)}: the model's architecture (what meshplan's render restates the "
                                 "recipe's model with), no layout setting; the file names no model to compare them "
                                 "with: pass the model they describe (--model)")
        return
    if not keys:
        return
    arch = resolve_model(model)
    own = dict(face(arch))  # the fields alone: no sequence-length note read
    key = (lambda k: k.replace("_", "-")) if core else (lambda k: k)  # argparse takes both spellings
    differ = [f"{s.where(reading.path)} = {s.value}: not {model}'s ({_show_own(own.get(key(s.key)))}); meshplan "
              f"plans {model} as its config states it" for s in keys if not _same(s.value, own.get(key(s.key)))]
    reading.unsupported += differ
    if not differ:
        reading.notes.append(f"{', '.join(s.key for s in keys)}: {model}'s architecture, each as it states it")


def _same(value: Any, own: Any) -> bool:
    """Whether a file's value (a Python literal or an override's word) is the model's own."""
    if isinstance(own, bool):
        return as_bool(value) is own
    text = str(value).strip().strip("'\"")
    if isinstance(own, int | float):
        try:
            return float(text) == float(own)
        except ValueError:
            return False
    return own is not None and text == str(own)


def _show_own(value: Any) -> str:
    return "not set by it: Megatron-Core's default" if value is None else f"its {value}"
