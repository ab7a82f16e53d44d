"""Megatron-Bridge recipes resolved through their chain, read with `ast`, never imported or run.

A recipe module (src/megatron/bridge/recipes/**, perf_recipes/**) defines `def <name>() -> ConfigContainer:`
functions that start from another recipe (`cfg = llama3_70b_pretrain_config()`) and set fields
(`cfg.model.tensor_model_parallel_size = 4`). The chosen function (FILE.py:NAME, else the first recipe in the file)
is read with every base recipe the same file defines, base first, so a field the recipe sets wins over its base's;
a base defined in another module is named as not read. The recipe's name states its model, GPU count, GPU and
precision (the card's read.recipe_names), which also resolves `--recipe NAME` in a run_recipe.py script.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any

from meshplan.adapters.read.keys import SPLIT_NOT_READ, Reading, key_table, lookup, read_section
from meshplan.adapters.read.model_match import layout_settings, recipe_overrides, restated_architecture
from meshplan.adapters.read.settings import Setting
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import CardError, model_card
from meshplan.knowledge.catalog import catalog_keys, resolve_model
from meshplan.knowledge.hardware import gpu_catalog

DETECT = re.compile(r"->\s*ConfigContainer\s*:")
NAME = re.compile(r"^(?P<model>[a-z0-9_]+?)_(?P<job>pretrain|sft|peft)(?:_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)"
                  r"_(?P<precision>[a-z0-9]+))?(?:_[a-z0-9_]+)?_config$")
MAX_DEPTH = 8


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def recipe_models(name: str) -> list[str]:
    """The catalog keys a recipe's model name is (nemotronh_8b: nemotron-h-8b), compared without punctuation; where
    no key is, the models one of whose aliases (its repository name for a Hugging Face id) is (nemotron_3_nano, the
    Bridge recipes' name of NVIDIA-Nemotron-3-Nano-30B-A3B: the alias nemotron-3-nano)."""
    plain = _plain(name)
    keys = [key for key in catalog_keys() if _plain(key) == plain]
    return keys or [key for key in catalog_keys()
                    if any(_plain(alias.rsplit("/", 1)[-1]) == plain for alias in model_card(key).aliases)]


def name_facts(name: str) -> tuple[dict[str, Any], list[tuple[tuple[str, ...], str]]]:
    """(request fields, what the name states that meshplan cannot use, each with the request fields that settle it)
    from a recipe function's name."""
    found = NAME.match(name)
    if found is None:
        return {}, [((), f"recipe {name}: not a <model>_<job>[_<N>gpu_<gpu>_<precision>]_config name")]
    spec = read_section("megatron-bridge").recipe_names
    if spec is None:
        raise CardError("cards/frameworks/megatron-bridge.yaml: read.recipe_names is missing; a recipe's name is read "
                        "with it.")
    fields: dict[str, Any] = {"job": spec.jobs[found.group("job")]}
    if found.group("job") in spec.grad_reduce_overlap:  # its base recipe's ddp (card read.recipe_names)
        fields["grad_reduce_overlap"] = spec.grad_reduce_overlap[found.group("job")]
    left: list[tuple[tuple[str, ...], str]] = []
    models = recipe_models(found.group("model"))
    if models:
        fields["model"] = models[0]
    else:
        left.append((("model",), f"model {found.group('model')}: not in meshplan's catalog (pass --model)"))
    if found.group("gpus"):
        fields["num_gpus"] = int(found.group("gpus"))
        gpu, precision = found.group("gpu"), found.group("precision")
        if gpu in gpu_catalog():
            fields["gpu"] = gpu
        else:
            left.append((("gpu",), f"GPU {gpu}: not in meshplan's GPU catalog (pass --gpu)"))
        if precision in spec.precisions:
            fields.update(spec.precisions[precision].model_dump(exclude_none=True))
        else:
            left.append((("precision",), f"precision {precision}: meshplan models bf16 and FP8 (tensorwise, "
                                          "blockwise, mxfp8)"))
    return fields, left


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """The module's own literal constants (`SEQUENCE_LENGTH_128K: int = 131072`, what Bridge's recipes/llama/h100
    set cfg.model.seq_length to): a recipe's `cfg.a.b = NAME` reads as the value, not as a helper object."""
    found: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                found[target.id] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                found.pop(target.id, None)  # rebound to something not literal: no longer known
    return found


def _literal(value: ast.expr, constants: dict[str, Any]) -> Any:
    if isinstance(value, ast.Name) and value.id in constants:
        return constants[value.id]
    return ast.literal_eval(value)


def _assignments(node: ast.FunctionDef, functions: dict[str, ast.FunctionDef], constants: dict[str, Any],
                 depth: int = 0) -> tuple[list[Setting], list[str]]:
    """`cfg.a.b = literal` settings (a module constant's value included) of a recipe and, first, of the recipes it
    starts from (same file); the base recipes named in other modules."""
    settings: list[Setting] = []
    elsewhere: list[str] = []
    for stmt in node.body:
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        target, value = stmt.targets[0], stmt.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            base = value.func.id
            if base in functions and depth < MAX_DEPTH:
                inner, more = _assignments(functions[base], functions, constants, depth + 1)
                settings, elsewhere = inner + settings, more + elsewhere
            elif base.endswith("_config"):
                elsewhere.append(base)
        elif isinstance(target, ast.Attribute):
            parts: list[str] = []
            at: ast.AST = target
            while isinstance(at, ast.Attribute):
                parts.insert(0, at.attr)
                at = at.value
            if isinstance(at, ast.Name) and at.id == "cfg" and parts == ["comm_overlap"]:
                # the comm-overlap helper object: kept (not read) only so that state_name_facts knows it is set
                if not (isinstance(value, ast.Constant) and value.value is None):
                    settings.append(Setting("comm_overlap", Computed(ast.unparse(value)), stmt.lineno))
                continue
            if isinstance(at, ast.Name) and at.id == "cfg" and len(parts) >= 2:
                try:
                    literal = _literal(value, constants)
                except (ValueError, SyntaxError):
                    if not re.fullmatch(r"(torch|AttnBackend)\.\w+", ast.unparse(value)):
                        # a helper object (comm_overlap config, env vars) or a value the recipe computes
                        # (pipeline_model_parallel_layout = _get_kimi_k2_pipeline_layout(16, 1)): kept as Computed,
                        # so a later literal of the key still wins and a last computed one is said (computed_keys)
                        settings.append(Setting(".".join(parts), Computed(ast.unparse(value)), stmt.lineno))
                        continue
                    literal = ast.unparse(value)  # a torch dtype (exp_avg_dtype = torch.bfloat16), AttnBackend.x
                if literal is not None:  # None: the field left at Megatron-Core's default
                    settings.append(Setting(".".join(parts), literal, stmt.lineno))
    return settings + peft_settings(node, constants), elsewhere


class Computed(str):
    """A recipe's value that is no literal (a call, a variable): its source text, never evaluated."""


def say_computed(reading: Reading, settings: list[Setting]) -> None:
    """Each key the recipe computes last (a Computed value) that sets a request field (the card's key table) said as
    not read; a pipeline split's with SPLIT_NOT_READ where pp > 1 (request_values then refuses an estimate of an even
    split the recipe does not run). Skipped as helper objects before, Kimi-K2's `cfg.model.pipeline_model_parallel_
    layout = _get_kimi_k2_pipeline_layout(16, 1)` left pp 16 to an even split of 61 layers, which PP001 refused as the
    recipe's own error."""
    table = key_table("megatron-bridge", variant="python")
    for s in settings:
        if not isinstance(s.value, Computed) or not lookup(table, s.key):
            continue
        split = "layout" in s.key or "pipeline_stage" in s.key
        if split and int(reading.request.get("pp", 1)) < 2:
            continue  # one stage: no split to read
        reading.unresolved.append(f"{reading.path}:{s.line} {s.key} = {s.value}: computed by the recipe, not read; "
                                  + (SPLIT_NOT_READ if split else "pass the field beside the file"))


PEFT_BUILDERS = ("default_peft_config", "LoRA")
"""What a recipe builds its cfg.peft with (recipes/utils/dataset_utils.py default_peft_config(scheme, **kwargs) passes
the keywords to LoRA(**kwargs) for 'lora'); its literal keywords are the LoRA's fields."""


def peft_settings(node: ast.FunctionDef, constants: dict[str, Any]) -> list[Setting]:
    """The LoRA a recipe sets as peft.<field> settings, wherever in its body (the MLA recipes set it under `if
    peft_scheme is lora`, Bridge 067f987 recipes/moonlight/h100/moonlight_16b.py): `cfg.peft = default_peft_config(
    scheme, dim=8, target_modules=[...])`, or a variable built so (`peft_cfg = default_peft_config(scheme)`), its
    `peft_cfg.dim = 8` / `peft_cfg.target_modules = [...]` assignments, then `cfg.peft = peft_cfg` (recipes/glm/h100/
    glm5.py)."""
    built: dict[str, list[Setting]] = {}
    out: list[Setting] = []
    for stmt in sorted((n for n in ast.walk(node) if isinstance(n, ast.Assign) and len(n.targets) == 1),
                       key=lambda n: n.lineno):
        target, value = ast.unparse(stmt.targets[0]), stmt.value
        fields: list[Setting] = []
        if isinstance(value, ast.Call) and ast.unparse(value.func).rsplit(".", 1)[-1] in PEFT_BUILDERS:
            for keyword in value.keywords:
                try:
                    fields.append(Setting(f"peft.{keyword.arg}", _literal(keyword.value, constants), stmt.lineno))
                except (ValueError, SyntaxError):
                    continue  # a value computed at run time: left to the LoRA's default
            built[target] = fields
            if target == "cfg.peft":
                out += fields
        elif isinstance(value, ast.Name) and value.id in built and target == "cfg.peft":
            out += built[value.id]
        elif isinstance(stmt.targets[0], ast.Attribute) and target.rsplit(".", 1)[0] in set(built) - {"cfg.peft"}:
            try:
                field = Setting(f"peft.{stmt.targets[0].attr}", _literal(value, constants), stmt.lineno)
            except (ValueError, SyntaxError):
                continue
            built[target.rsplit(".", 1)[0]].append(field)
    return [s for s in out if s.key in ("peft.dim", "peft.target_modules")]


def read_bridge_recipe(text: str, path: str, apply: Any) -> Reading:
    """A recipe module's function, through its chain; `apply(reading, settings)` maps the cfg keys (launch.py)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise MeshplanError(f"{path}:{exc.lineno}: not Python ({exc.msg}).",
                            fix="Pass the recipe module as it is (it is parsed, never run).") from None
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    recipes = [n for n, f in functions.items() if DETECT.search(ast.unparse(f).split("\n", 1)[0])]
    file, _, wanted = path.rpartition(":") if re.search(r"\.py:\w+$", path) else (path, "", "")
    if wanted and wanted not in recipes:
        raise MeshplanError(f"{file}: no recipe {wanted!r}.", fix=f"Use one of: {', '.join(recipes) or '(none)'}.")
    if not recipes:
        raise MeshplanError(f"{file}: no function returning a ConfigContainer.", fix="Pass a Bridge recipe module.")
    name = wanted or recipes[0]
    reading = Reading("megatron-bridge", file, variant="python")
    constants = module_constants(tree)
    settings, elsewhere = _assignments(functions[name], functions, constants)
    last: dict[str, Setting] = {s.key: s for s in settings}  # the recipe's own value wins over its base's
    latest = {k: s for k, s in last.items() if not isinstance(s.value, Computed)}
    section = read_section("megatron-bridge")
    apply(reading, layout_settings(list(latest.values()), section))
    say_computed(reading, list(last.values()))
    layout_helpers(reading, functions[name])
    state_hf_model(reading, functions[name], functions, constants)
    state_name_facts(reading, name, functions[name].lineno, sets_comm_overlap(last))
    recipe_overrides(reading, list(latest.values()), section)
    restated_architecture(reading, list(latest.values()), section)
    reading.notes.append(f"read recipe {name}()" + (f"; its base recipes {', '.join(elsewhere)} are in other "
                                                    "modules (not read: pass what they set as flags)" if elsewhere
                                                    else ""))
    return reading


def layout_helpers(reading: Reading, node: ast.FunctionDef) -> None:
    """A helper call that sets the model's pipeline layout (DeepSeek-V3's recipes call
    set_deepseek_v3_pipeline_model_parallel_layout(cfg.model), which picks it for the pp and vpp) is not read: said,
    so the request from the file asks for the split rather than estimating an even one (PP001 on the recipe)."""
    if "pipeline_layout" in reading.request or int(reading.request.get("pp", 1)) < 2:
        return
    for stmt in node.body:
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        name = ast.unparse(call.func) if call is not None else ""
        if call is not None and re.search(r"pipeline\w*layout", name) and any(
                ast.unparse(a).startswith("cfg.model") for a in call.args):
            reading.unresolved.append(f"{reading.path}:{stmt.lineno} {name}(cfg.model): the pipeline layout this "
                                      f"helper sets is not read; {SPLIT_NOT_READ}")


def hf_model(node: ast.FunctionDef, functions: dict[str, ast.FunctionDef], constants: dict[str, Any],
             depth: int = 0) -> tuple[str, int] | None:
    """(Hugging Face id, line) of the model a recipe builds from, else None: `cfg.model =
    AutoBridge.from_hf_pretrained("org/name").to_megatron_provider(...)` (the recipes since Megatron-Bridge's AutoBridge
    refactor), or a cfg.model built by a provider function of the same module that calls it, the id a module constant
    (Bridge 067f987 recipes/moonlight/h100/moonlight_16b.py: cfg.model = _moonlight_16b_finetuning_model_provider(...),
    which calls _moonlight_16b_model_provider(), AutoBridge.from_hf_pretrained(_MOONLIGHT_16B_MODEL_ID)); the recipe's
    own cfg.model wins over the base recipe's it starts from (`cfg = moonlight_16b_peft_2gpu_h100_bf16_config()`)."""
    found = None
    for stmt in node.body:
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or depth >= MAX_DEPTH:
            continue
        target, value = ast.unparse(stmt.targets[0]), stmt.value
        base = value.func.id if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else None
        if target == "cfg" and base in functions:
            found = hf_model(functions[base], functions, constants, depth + 1) or found
        elif target == "cfg.model":
            built = _built_from(value, functions, constants, depth)
            found = (built, stmt.lineno) if built is not None else found
    return found


def _built_from(expr: ast.AST, functions: dict[str, ast.FunctionDef], constants: dict[str, Any],
                depth: int) -> str | None:
    """The Hugging Face id a from_hf_pretrained call in `expr` names (a string or a module constant), or one a
    function of the module that `expr` calls does, followed down to MAX_DEPTH calls."""
    for call in ast.walk(expr):
        if not isinstance(call, ast.Call):
            continue
        if isinstance(call.func, ast.Attribute) and call.func.attr == "from_hf_pretrained" and call.args:
            try:
                named = _literal(call.args[0], constants)
            except (ValueError, SyntaxError):
                continue
            if isinstance(named, str):
                return named
        elif isinstance(call.func, ast.Name) and call.func.id in functions and depth < MAX_DEPTH:
            inner = functions[call.func.id]
            built = _built_from(ast.Module(body=inner.body, type_ignores=[]), functions, constants, depth + 1)
            if built is not None:
                return built
    return None


def state_hf_model(reading: Reading, node: ast.FunctionDef, functions: dict[str, ast.FunctionDef],
                   constants: dict[str, Any]) -> None:
    """The catalog model of the Hugging Face id the recipe builds from (hf_model); one outside the catalog is left to
    the recipe's name (state_name_facts)."""
    found = hf_model(node, functions, constants)
    if found is None:
        return
    try:
        key = resolve_model(found[0]).key
    except MeshplanError:
        reading.notes.append(f"{reading.path}:{found[1]} AutoBridge.from_hf_pretrained({found[0]!r}): not in "
                             "meshplan's catalog")
        return
    reading.state("model", key, f"{reading.path}:{found[1]} AutoBridge.from_hf_pretrained({found[0]!r})")


def sets_comm_overlap(keys: Iterable[str]) -> bool:
    """Whether a file's cfg keys set cfg.comm_overlap (the helper object, or a field of it): what state_name_facts'
    `comm_overlap` asks, of a recipe module's assignments and of run_recipe.py's overrides alike."""
    return any(key == "comm_overlap" or key.startswith("comm_overlap.") for key in keys)


def state_name_facts(reading: Reading, name: str, line: int | None, comm_overlap: bool = False) -> None:
    """The fields a recipe's name states, where the file does not state them itself. `comm_overlap`: the file sets
    cfg.comm_overlap, which turns the DP overlap on where data_parallel_size > 1 unless it sets it (Bridge's
    training/comm_overlap.py): the job's base recipe's DP overlap is then not stated (meshplan's default, on)."""
    fields, left = name_facts(name)
    where = f"{reading.path}" + (f":{line}" if line else "") + f" recipe name {name}"
    if comm_overlap:
        fields.pop("grad_reduce_overlap", None)
    for field, value in fields.items():
        if field not in reading.request:
            reading.state(field, value, where + (" (its job's base recipe leaves ddp.overlap_grad_reduce at "
                                                 "Megatron-Core's default, off)" if field == "grad_reduce_overlap"
                                                 else ""))
    for settled_by, said in left:
        if not settled_by:
            reading.unresolved.append(said)
        elif not all(f in reading.request for f in settled_by):  # else the file states them elsewhere
            reading.leave(settled_by, said)
