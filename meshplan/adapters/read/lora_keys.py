"""What a framework file's LoRA keys say once the file's model is known, after the keys are read (keys.py reads each
key as it comes: lora_targets, read_patterns, lora_unmodelled keep what these look at in Reading.extra): Bridge's path
patterns against the model's places, PEFT's all-linear on a model where it fails, and the cost of a LoRA key meshplan
does not count."""

from __future__ import annotations

from meshplan.adapters.lora import hf_projections
from meshplan.adapters.read.bridge_lora import model_places, places
from meshplan.adapters.read.keys import (
    BRIDGE_PATTERNS,
    LORA_NOT_MODELLED,
    PEFT_ALL_LINEAR,
    UNMODELLED_LORA,
    Reading,
    convert,
)
from meshplan.arithmetic.lora import DEFAULT_TARGETS, lora_engine, peft_all_linear
from meshplan.arithmetic.param_wrapper import WEIGHTS, param_wrapper_flops, param_wrapper_params
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
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
