"""What a framework file's LoRA keys say once the file's model is known, after the keys are read (keys.py reads each
key as it comes: lora_targets, read_patterns, lora_unmodelled keep what these look at in Reading.extra): Bridge's path
patterns against the model's places, PEFT's all-linear on a model where it fails, the modules exclude_modules takes
out of the targets, and the cost of a LoRA key meshplan does not count."""

from __future__ import annotations

import re

from meshplan.adapters.lora import HF_PROJECTIONS, hf_projections, projection_targets
from meshplan.adapters.read.bridge_lora import model_places, places
from meshplan.adapters.read.keys import (
    BRIDGE_PATTERNS,
    LORA_EXCLUDE,
    LORA_NOT_MODELLED,
    PEFT_ALL_LINEAR,
    PEFT_VARIANTS,
    UNMODELLED_LORA,
    Reading,
    convert,
)
from meshplan.arithmetic.lora import DEFAULT_TARGETS, lora_engine, model_targets, other_linears, peft_all_linear
from meshplan.arithmetic.param_wrapper import WEIGHTS, param_wrapper_flops, param_wrapper_params
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.schema.model import Architecture
from meshplan.schema.plan import LoraSpec


def patterns_on_model(reading: Reading) -> None:
    """A Bridge target_modules with path patterns against the file's model: a target the patterns adapt in every place
    the model holds it is kept, one they adapt in none of them is dropped (an entry matching no module at all, Bridge
    only warns: 'No modules matched'), one they adapt in some of them only is said and refused an estimate."""
    stated, model = reading.extra.get(BRIDGE_PATTERNS), reading.request.get("model")
    if stated is None or "lora_targets" not in reading.request:
        return
    every, s = stated
    where = f"{s.where(reading.path)} = {s.value}"
    try:
        arch = resolve_model(model) if isinstance(model, str) else None
    except MeshplanError:
        arch = None
    kept = []
    for target in reading.request["lora_targets"]:
        if target not in every:
            kept.append(target)
            continue
        have = model_places(arch, target) if arch is not None else set(places(target))
        adapted = every[target] & have
        if adapted == have and have:
            kept.append(target)
        elif not adapted and arch is not None:
            if have:  # else the model has no such linear at all: nothing to say
                reading.notes.append(f"{where}: adapts no {target} of {arch.name} (it holds {target} in its "
                                     f"{', '.join(sorted(have))}, which the patterns match none of)")
        else:
            of = f"{arch.name}'s" if arch is not None else "the model's (the file names no model)"
            reading.unsupported.append(
                f"{where}: adapts {target} in {', '.join(sorted(adapted)) or 'no place'} only, not in "
                f"{of} {', '.join(sorted(have - adapted))}; meshplan adapts a target in every place the model holds "
                f"it; {LORA_NOT_MODELLED}")
            kept.append(target)
    if kept:
        reading.request["lora_targets"] = kept
    else:  # no target left to state: the LoRA request from the file is refused (request_values)
        reading.request.pop("lora_targets")
        reading.unsupported.append(f"{where}: adapts no module of the model; {LORA_NOT_MODELLED}")


def all_linear_that_fails(reading: Reading) -> None:
    """A file's all-linear on a PEFT engine (verl's or SkyRL's FSDP) for a model whose router is an nn.Linear returning
    a tuple (Llama 4, arithmetic/lora.py peft_all_linear): said as a setting that does not run, with the projections'
    list that does, which is what meshplan counts and render writes."""
    stated, model, stage = (reading.extra.get(PEFT_ALL_LINEAR), reading.request.get("model"),
                            reading.request.get("zero_stage"))
    if stated is None or not isinstance(model, str) or not isinstance(stage, int):
        return
    try:
        arch = resolve_model(model)
    except MeshplanError:
        return  # an unread model is said where the model is read
    engine = lora_engine(framework_card(reading.framework), stage)
    spec = LoraSpec(rank=1, targets=list(reading.request.get("lora_targets") or DEFAULT_TARGETS))
    if engine is None or not engine.all_linear or peft_all_linear(arch, spec):
        return
    reading.unsupported.append(
        f"{stated[1].where(reading.path)} = all-linear: on {arch.name} PEFT's all-linear wraps the router too "
        "(Llama4Router, an nn.Linear whose forward returns (scores, logits)) and the LoRA forward fails on the tuple; "
        f"meshplan counts target_modules=[{','.join(hf_projections(spec.targets))}], which runs")


def unmodelled_lora_said(reading: Reading) -> None:
    """The LoRA key meshplan does not count, said as not modelled with LORA_NOT_MODELLED (a LoRA request from the file
    is refused, request_values), with what it would cost on the file's model at its rank where both are read:
    PEFT's ParamWrapper on the routed experts' two weights (arithmetic/param_wrapper.py)."""
    stated = reading.extra.get(UNMODELLED_LORA)
    if stated is None:
        return
    facts, s = stated
    cost = ""
    model, rank = reading.request.get("model"), reading.request.get("lora_rank")
    try:
        arch = resolve_model(model) if isinstance(model, str) and isinstance(rank, int) and rank > 0 else None
    except MeshplanError:
        arch = None
    names = [str(name) for name in convert("lora_targets", s.value)]  # a list as the target names are
    weights = tuple(w for w in WEIGHTS if any(name.endswith(w) for name in names))
    if arch is not None and arch.moe is not None and weights:
        per_token, per_batch = param_wrapper_flops(arch, rank, weights)
        cost = (f" (on {arch.name} at rank {rank}, {' and '.join(weights)}: "
                f"{param_wrapper_params(arch, rank, weights):,} adapter parameters, {per_token:.3g} FLOPs per token "
                f"of expert weight gradients and {per_batch:.3g} per micro-batch)")
    reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: {facts.what}{cost}; {LORA_NOT_MODELLED}")


_PEFT_NAMES = {p: f"model.layers.0.{'mlp' if t in ('linear_fc1', 'linear_fc2') else 'self_attn'}.{p}"
               for t, names in HF_PROJECTIONS.items() for p in names}
"""Each Hugging Face projection's module path in a decoder layer (transformers' Llama/Qwen/DeepSeek code), what PEFT
matches a string exclude_modules against (re.fullmatch on the module's full name)."""


_EXCLUSIVE = {
    "megatron-bridge": "Megatron-Bridge's LoRA takes exclude_modules only with an empty target_modules (peft/"
                       "module_matcher.py asserts it), and without them adapts every linear it does not name, the "
                       "output layer too unless named",
    "nemo-automodel": "NeMo AutoModel's PeftConfig takes exclude_modules only without target_modules (components/_peft/"
                      "module_matcher.py: mutually exclusive), and without them adapts every linear it does not name, "
                      "lm_head too unless named",
}
"""The LoRA engines whose exclude_modules is a mode of its own, not the targets less some (verl's and SkyRL's Megatron
engines hand theirs to Megatron-Bridge's LoRA)."""


def exclusions_applied(reading: Reading) -> None:
    """A LoRA job's exclude_modules, once its targets and model are read. Hugging Face PEFT (verl's and SkyRL's FSDP
    engines; peft 0.18.1 tuners/tuners_utils.py check_target_module_exists: a string is re.fullmatch'ed on a module's
    full name, a list entry matches a name or its last dotted parts; verl/utils/model.py check_exclude_modules alike)
    adapts the targets less what it excludes: projections making up whole linears are taken out of lora_targets, the
    source saying so; part of a fused linear (v_proj alone), a name meshplan cannot place, or all-linear less some on
    a model whose other linears all-linear adapts too is said with LORA_NOT_MODELLED (no estimate from the file).
    Megatron-Bridge's LoRA (its own engine, verl's and SkyRL's Megatron engines, which pass exclude_modules to it)
    asserts exclude_modules is empty when target_modules is set (peft/module_matcher.py ModuleMatcher.match), and
    with target_modules empty adapts every linear it does not name, the output layer among them: said likewise, as
    NeMo AutoModel's (the two mutually exclusive; lm_head adapted unless named)."""
    stated = reading.extra.get(LORA_EXCLUDE)
    request = reading.request
    if stated is None or ("lora_rank" not in request and "lora_targets" not in request):
        return
    value, s = stated
    where = f"{s.where(reading.path)} = {value}"
    if value is None or str(value).strip().strip("'\"") in ("", "null", "None", "~", "[]"):
        return
    if reading.variant not in PEFT_VARIANTS:
        reading.unsupported.append(f"{where}: {_EXCLUSIVE.get(reading.framework, _EXCLUSIVE['megatron-bridge'])}, "
                                   "linears meshplan counts no adapter on; name the adapted linears in target_modules "
                                   f"instead; {LORA_NOT_MODELLED}")
        return
    arch = _file_model(request.get("model"))
    has = model_targets(arch) if arch is not None else set(DEFAULT_TARGETS)
    targets = list(request.get("lora_targets") or [t for t in DEFAULT_TARGETS if t in has])
    excluded, unplaced = _excluded_projections(value)
    if not excluded and not unplaced and (arch is None or arch.vision is not None):  # ('.*visual.*', verl's example)
        of = f"{arch.name}'s vision tower" if arch is not None else "the model (the file names none)"
        unplaced = f"matches none of the decoder's projections; meshplan cannot tell what it leaves out of {of}"
    if unplaced:
        reading.unsupported.append(f"{where}: {unplaced}; {LORA_NOT_MODELLED}")
        return
    if excluded and PEFT_ALL_LINEAR in reading.extra and arch is not None and _other_linears(arch):
        reading.unsupported.append(
            f"{where}: all-linear less {', '.join(sorted(excluded))} still adapts {arch.name}'s other linears "
            f"({', '.join(_other_linears(arch))}), which meshplan counts only with every target; "
            + LORA_NOT_MODELLED)
        return
    whole = set(projection_targets(excluded)) & set(targets)
    part = sorted(p for t in targets if t not in whole for p in HF_PROJECTIONS[t] if p in excluded)
    if part:
        reading.unsupported.append(f"{where}: leaves {', '.join(part)} out of a fused linear meshplan adapts whole ("
                                   + ", ".join(f"{t} = {' + '.join(HF_PROJECTIONS[t])}" for t in targets)
                                   + f"); {LORA_NOT_MODELLED}")
        return
    kept = [t for t in targets if t not in whole]
    if not kept:
        reading.unsupported.append(f"{where}: excludes every target ({', '.join(targets)}); PEFT then adapts no "
                                   f"module and raises; {LORA_NOT_MODELLED}")
        return
    if whole:
        reading.request["lora_targets"] = kept
        was = reading.sources.get("lora_targets", "the engine's default targets")
        reading.sources["lora_targets"] = f"{was}, less {s.where(reading.path)} ({', '.join(sorted(whole))})"
    else:  # a projection the targets do not hold, or none on a model without a vision tower: nothing counted changes
        reading.notes.append(f"{where}: excludes none of the linears meshplan adapts ({', '.join(targets)})")


def _excluded_projections(value: object) -> tuple[set[str], str]:
    """The decoder projections an exclude_modules value excludes, as PEFT matches it, and what of it meshplan cannot
    place ('' where all of it is placed)."""
    text = value.strip().strip("'\"") if isinstance(value, str) else None
    if text is not None and not text.startswith("["):  # a string: one regular expression on the full name
        try:
            pattern = re.compile(text)
        except re.error as exc:
            return set(), f"not a regular expression PEFT can match ({exc})"
        return {p for p, path in _PEFT_NAMES.items() if pattern.fullmatch(path)}, ""
    names = convert("lora_targets", value)  # a list, as the target names are
    unknown = [n for n in names if n.rsplit(".", 1)[-1] not in _PEFT_NAMES
               or not _PEFT_NAMES[n.rsplit(".", 1)[-1]].removeprefix("model.layers.0.").endswith(n)]
    if unknown:  # (a path naming a layer, 'layers.0.mlp.down_proj', excludes that layer's only)
        return set(), (f"{', '.join(unknown)} name(s) no projection meshplan adapts on every layer (PEFT matches a "
                       f"name or its last dotted parts; meshplan places {', '.join(_PEFT_NAMES)})")
    return {n.rsplit(".", 1)[-1] for n in names}, ""


def _file_model(model: object) -> Architecture | None:
    try:
        return resolve_model(model) if isinstance(model, str) else None
    except MeshplanError:
        return None


def _other_linears(arch: Architecture) -> list[str]:
    """The names of the decoder's linears beside the four that all-linear adapts (arithmetic/lora.py other_linears)."""
    return sorted({a.target for index in range(arch.num_layers) for a in other_linears(arch, index)})
