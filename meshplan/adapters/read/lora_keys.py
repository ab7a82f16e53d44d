"""What a framework file's LoRA keys say once the file's model is known, after the keys are read (keys.py reads each
key as it comes: lora_targets, read_patterns, target_parameters_kept keep what these look at in Reading.extra):
Bridge's path patterns against the model's places, PEFT's all-linear as every linear of the model and where it fails,
the modules exclude_modules takes out of the targets, and PEFT's target_parameters as the routed experts' weights."""
from __future__ import annotations

from meshplan.adapters.hf_modules import VISION_TOWER, HfLinear, hf_linears, peft_matches
from meshplan.adapters.lora import HF_PROJECTIONS, hf_projections
from meshplan.adapters.read.bridge_lora import model_places, places
from meshplan.adapters.read.keys import (
    BRIDGE_PATTERNS,
    LORA_EXCLUDE,
    LORA_NOT_MODELLED,
    PEFT_ALL_LINEAR,
    PEFT_VARIANTS,
    TARGET_PARAMETERS,
    Reading,
    convert,
)
from meshplan.arithmetic.lora import (
    DEFAULT_TARGETS,
    TARGETS,
    all_linear_targets,
    every_linear,
    lora_engine,
    model_targets,
    other_targets,
    peft_all_linear,
)
from meshplan.arithmetic.param_wrapper import WEIGHTS
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


def all_linear_on_model(reading: Reading) -> None:
    """A PEFT engine's all-linear (verl's or SkyRL's FSDP; keys.lora_targets read it as the four) as every linear the
    file's model has, its other linears named (arithmetic/lora.py every_linear: MLA's q/kv projections, a router or
    shared_expert_gate built as an nn.Linear), once the model is known; the four alone would be those linears only."""
    model = reading.request.get("model")
    if PEFT_ALL_LINEAR not in reading.extra or reading.variant not in PEFT_VARIANTS or not isinstance(model, str):
        return
    arch = _file_model(model)
    if arch is not None and "lora_targets" in reading.request:
        reading.request["lora_targets"] = all_linear_targets(arch)


def all_linear_that_fails(reading: Reading) -> None:
    """A file's all-linear on a PEFT engine (verl's or SkyRL's FSDP) for a model whose router is an nn.Linear returning
    a tuple (Llama 4, arithmetic/lora.py peft_all_linear): said as a setting that does not run, with the projections'
    list that does, which is what meshplan counts and render writes; unless exclude_modules leaves every router out,
    where it runs (exclusions_applied reads what it adapts)."""
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
    excluded = reading.extra.get(LORA_EXCLUDE)
    routers = [m.path for m in hf_linears(arch, _builds_tower(reading)) if m.place == "router"]
    if excluded is not None and excluded[0] and all(peft_matches(_exclude_value(excluded[0]), r) for r in routers):
        return  # exclude_modules leaves every router out: all-linear runs, what it adapts is exclusions_applied's
    reading.unsupported.append(
        f"{stated[1].where(reading.path)} = all-linear: on {arch.name} PEFT's all-linear wraps the router too "
        "(Llama4Router, an nn.Linear whose forward returns (scores, logits)) and the LoRA forward fails on the tuple; "
        f"meshplan counts target_modules=[{','.join(hf_projections(spec.targets))}], which runs")


def target_parameters_read(reading: Reading) -> None:
    """PEFT's target_parameters on an engine that passes it to PEFT (verl's FSDP, keys.target_parameters_kept), once
    the file's LoRA is read: PEFT wraps a parameter whose module name + '.' + its name is an entry or ends with '.' +
    one (peft tuners/tuners_utils.py), so an entry ending with a routed-expert weight's name (gate_up_proj, down_proj;
    'mlp.experts.down_proj' as verl's examples write it) is that weight of every MoE layer: lora_target_parameters
    (arithmetic/param_wrapper.py). Beside no LoRA rank PEFT is not applied and it is only said; an entry naming any
    other parameter is said with LORA_NOT_MODELLED (no estimate from the file)."""
    s = reading.extra.get(TARGET_PARAMETERS)
    if s is None:
        return
    where = f"{s.where(reading.path)} = {s.value}"
    text = str(s.value).strip().strip("'\"") if s.value is not None else ""
    names = [] if text in ("", "null", "None", "~", "[]") else [str(n) for n in convert("lora_targets", s.value)]
    if not names:
        reading.notes.append(f"{where}: no parameter wrapped")
        return
    if not reading.request.get("lora_rank"):
        reading.notes.append(f"{where}: the file trains no LoRA adapter (no lora_rank), so PEFT wraps nothing")
        return
    other = [n for n in names if not any(n == w or n.endswith("." + w) for w in WEIGHTS)]
    if other:
        reading.unsupported.append(
            f"{where}: {', '.join(other)} names no routed-expert weight meshplan counts (target_parameters entries "
            f"ending with {' or '.join(WEIGHTS)}); {LORA_NOT_MODELLED}")
        return
    reading.request["lora_target_parameters"] = [w for w in WEIGHTS if any(n == w or n.endswith("." + w)
                                                                          for n in names)]
    reading.sources["lora_target_parameters"] = s.where(reading.path)


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
    adapts the targets less what it excludes, matched on the modules transformers builds (peft_exclusion): the targets
    left, MLA's linears, a router or shared_expert_gate among them after all-linear, become lora_targets, the source
    saying so, and a vision tower left out whole lora_vision false; a target left in some of its modules only (v_proj
    of a fused linear, one layer's, the shared experts'), a linear no target names left adapted, or an unread model is
    said with LORA_NOT_MODELLED (no estimate from the file).
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
    if arch is None:
        reading.unsupported.append(f"{where}: the file names no model meshplan reads, so what it leaves out cannot be "
                                   f"told; {LORA_NOT_MODELLED}")
        return
    has = model_targets(arch)
    targets = list(request.get("lora_targets") or [t for t in DEFAULT_TARGETS if t in has])
    kept, tower, why = peft_exclusion(arch, targets, PEFT_ALL_LINEAR in reading.extra, _exclude_value(value),
                                      _builds_tower(reading))
    if why:
        reading.unsupported.append(f"{where}: {why}; {LORA_NOT_MODELLED}")
        return
    if not tower:
        reading.request["lora_vision"] = False
        reading.sources["lora_vision"] = f"{s.where(reading.path)} (it leaves {arch.name}'s vision tower out)"
    if kept == targets and tower:
        reading.notes.append(f"{where}: excludes none of the linears meshplan adapts ({', '.join(targets)})")
    elif kept != targets:
        reading.request["lora_targets"] = kept
        was = reading.sources.get("lora_targets", "the engine's default targets")
        asked = set(targets) | (other_targets(arch) if PEFT_ALL_LINEAR in reading.extra else set())
        gone = sorted(asked & has - set(kept))
        reading.sources["lora_targets"] = f"{was}, less {s.where(reading.path)} ({', '.join(gone)})"


def peft_exclusion(arch: Architecture, targets: list[str], all_linear: bool, excluded: str | list[str],
                   vision_built: bool) -> tuple[list[str], bool, str]:
    """The targets Hugging Face PEFT adapts once exclude_modules is applied, as meshplan names them (MLA's linears, a
    router or shared_expert_gate among them where all-linear adapted them), whether they still reach the vision tower
    (LoraSpec.vision: false where every adapted module of the tower is excluded, as '.*vision_model.*' does), and '';
    or no targets and why meshplan cannot count what is left: a target excluded in some of the modules it is made of
    only (a projection of a fused linear, some layers, some places, some of the tower's), or all-linear left adapting
    a linear no target names (hf_modules.HfLinear: the tower's MLP, Llama 4's router).
    The modules are those transformers builds (hf_modules.hf_linears): every nn.Linear but the output head for
    all-linear (peft 0.18.1 _maybe_include_all_linear_layers), else the targets' own; exclude_modules is matched on each
    full module name (hf_modules.peft_matches)."""
    if arch.layer_pattern is not None:
        return [], True, (f"{arch.name} is a hybrid model, whose transformers module names meshplan does not place "
                          "(it reads exclusions on attention + MLP or MoE decoders)")
    every = all_linear and every_linear(arch, LoraSpec(rank=1, targets=targets))
    adapted = [m for m in hf_linears(arch, vision_built) if every or m.target in targets]
    kept = [m for m in adapted if not peft_matches(excluded, m.path)]
    if len(kept) == len(adapted):
        return targets, True, ""
    tower = [m for m in adapted if m.place == VISION_TOWER]
    if tower and not [m for m in tower if m in kept]:  # the tower left out whole: LoraSpec.vision false
        adapted = [m for m in adapted if m.place != VISION_TOWER]
    if uncounted := [m for m in kept if m.target is None]:
        return [], True, (f"all-linear less these still adapts {len(uncounted)} linears of {arch.name} no LoRA target "
                          f"names (e.g. {uncounted[0].path}, in its {', '.join(sorted({m.place for m in uncounted}))}"
                          "), which meshplan counts no adapter on")
    left = []
    for target in TARGETS:
        have = [m for m in adapted if m.target == target]
        held = [m for m in have if m in kept]
        if held and len(held) < len(have):
            return [], True, _partly_excluded(target, have, held)
        if held:
            left.append(target)
    if not left:
        named = sorted({m.target for m in adapted if m.target})
        return [], True, f"excludes every target ({', '.join(named)}); PEFT then adapts no module and raises"
    vision = not tower or any(m in kept for m in tower)
    return (targets if every and set(left) >= model_targets(arch) else left), vision, ""


def _partly_excluded(target: str, have: list[HfLinear], held: list[HfLinear]) -> str:
    """Why a target excluded in some of its modules only is not counted, naming what was left out where."""
    gone = [m for m in have if m not in held]
    gone_names, held_names = ({m.path.rsplit(".", 1)[-1] for m in ms} for ms in (gone, held))
    if gone_names.isdisjoint(held_names):
        return (f"leaves {', '.join(sorted(gone_names))} out of a fused linear meshplan adapts whole ({target} = "
                f"{' + '.join(HF_PROJECTIONS[target])})")
    places = sorted({m.place for m in gone})
    return (f"excludes {target} ({', '.join(sorted(gone_names))}) in {len(gone)} of the {len(have)} modules it is "
            f"made of (e.g. {gone[0].path}, in the {', '.join(places)}), not in {held[0].path}; meshplan adapts a "
            "target in every layer and place the model holds it")


def _builds_tower(reading: Reading) -> bool:
    """Whether the PEFT engine (the FSDP one) builds a multimodal model's vision tower (the card's vision_tower), so
    the text model's modules sit under language_model. (adapters/hf_modules.py)."""
    card = framework_card(reading.framework)
    return card.vision_tower is not None and card.vision_tower.builds("fsdp")


def _exclude_value(value: object) -> str | list[str]:
    """An exclude_modules value as PEFT takes it: a string is one regular expression, a list the names (a Hydra list
    override, [a,b], is a list)."""
    text = value.strip().strip("'\"") if isinstance(value, str) else None
    if text is not None and not text.startswith("["):
        return text
    return [str(n) for n in convert("lora_targets", value)]


def _file_model(model: object) -> Architecture | None:
    try:
        return resolve_model(model) if isinstance(model, str) else None
    except MeshplanError:
        return None
