"""The one parser every face shares: loose values (CLI flags, MCP arguments, batch lines, a Python dict) into a
`Request`. An unknown field is an error naming the field it most likely means (by a framework's own key, a
synonym or the spelling); a value out of bounds is one readable sentence per field.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from pydantic import ValidationError

from meshplan.arithmetic.pipeline_timeline import SCHEDULE_OF_ORDER
from meshplan.core.errors import MeshplanError, closest
from meshplan.knowledge.cards import framework_card
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.request import PATTERN_WORDS, Request

# Names people type for a request field that no framework card spells (the cards supply the frameworks' own
# keys, e.g. tensor_model_parallel_size -> tp); used only to say "did you mean", never to accept the name.
FIELD_SYNONYMS: dict[str, str] = {
    "world_size": "num_gpus", "gpu_count": "num_gpus", "num_gpu": "num_gpus", "num_devices": "num_gpus",
    "gpus": "num_gpus", "n_gpus": "num_gpus", "ngpus": "num_gpus",
    "nodes_gpus": "gpus_per_node", "gpus_per_host": "gpus_per_node", "nproc_per_node": "gpus_per_node",
    "network_bandwidth": "network_gbps_per_node", "inter_node_bandwidth": "network_gbps_per_node",
    "internode_bandwidth": "network_gbps_per_node", "nic_bandwidth": "network_gbps_per_node",
    "network_bandwidth_gbps_per_node": "network_gbps_per_node",
    "gpu_type": "gpu", "hardware": "gpu", "accelerator": "gpu", "device": "gpu",
    "seq_len": "seq_length", "sequence_length": "seq_length", "max_seq_len": "seq_length",
    "seq": "seq_length", "context_length": "seq_length",
    "model_name": "model", "model_id": "model", "hf_id": "model", "name": "model",
    "dtype": "precision", "mixed_precision": "precision",
    "tensor_parallel": "tp", "pipeline_parallel": "pp", "context_parallel": "cp", "expert_parallel": "ep",
    "data_parallel": "dp", "virtual_pipeline": "vpp", "zero": "zero_stage", "activation_checkpointing": "recompute",
    "gradient_checkpointing": "recompute", "mbs": "micro_batch_size", "gbs": "global_batch_size",
    "batch_size": "global_batch_size", "recompute_num_layers": "recompute_layers",
    "pipeline_parallel_schedule": "pipeline_schedule",  # torchtitan's key (also part of its vpp knob's key)
}



_ASCII_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _number_text(text: str, pattern: re.Pattern[str], what: str) -> str:
    """The text of a number typed on a command line, ASCII digits only: Python's int() and float() would also read
    other scripts' digits ('٨' as 8), which no other face accepts."""
    stripped = text.strip()
    if pattern.fullmatch(stripped):
        return stripped
    other = next((c for c in stripped if not c.isascii() and (c.isdigit() or c.isnumeric())), None)
    because = f": {other!r} (U+{ord(other):04X}) is not an ASCII digit 0-9" if other else ""
    raise ValueError(f"expected {what} written in ASCII digits, got {text[:40]!r}{because}")


def ascii_int(text: str) -> int:
    """A command-line integer: '8', '+8', '-1'; not '8.0', '٨' or '1_000'."""
    return int(_number_text(text, _ASCII_INT, "an integer"))


def ascii_float(text: str) -> float:
    """A command-line number: '0.5', '.5', '1e3', '2'; not 'nan', 'inf' or other scripts' digits."""
    return float(_number_text(text, _ASCII_FLOAT, "a number"))


def _key_name(key: str) -> str:
    """A framework key as a field-like name: '--tensor-model-parallel-size' -> 'tensor_model_parallel_size'."""
    key = re.sub(r"^\[[^\]]*\]\s*", "", key.strip())  # a TOML section before the key: '[activation_checkpoint] x'
    first = re.split(r"[\s=]", key, maxsplit=1)[0]
    return first.lstrip("-").rsplit(".", 1)[-1].replace("-", "_").lower()


@cache
def field_aliases() -> dict[str, str]:
    """Every known other name of a request field: the frameworks' own keys (from their cards) and FIELD_SYNONYMS."""
    aliases = dict(FIELD_SYNONYMS)
    for framework in FRAMEWORKS:
        adapter = framework_card(framework).adapter
        for version in adapter.versions.values() if adapter else ():
            for knob, spec in version.knobs.items():
                if knob in Request.model_fields and spec.key:  # the adapter knobs that are request fields
                    name = _key_name(spec.key)
                    if name.isidentifier():  # not a prose key such as '(implicit: ...)'
                        aliases.setdefault(name, knob)
    return {alias: field for alias, field in aliases.items() if alias not in Request.model_fields}


# How alike an unknown field and a known one must be (difflib's ratio) before "did you mean" names it: a typo
# ('num_gpu', 'seq_len', 'tpp') scores 0.8 and above; an unrelated word such as 'bogus' reaches 0.67 against 'gpus'
# on shared letters alone, and a wrong guess misleads more than none.
SUGGEST_CUTOFF = 0.75
SUBSTRING_MIN = 4  # a known name inside the unknown one ('gpus_total' -> gpus) counts only from this length


def likely_names(name: str, choices: Iterable[str]) -> list[str]:
    """The known names `name` most likely means, best first: close spellings, else a known name of at least
    SUBSTRING_MIN characters that contains it or that it contains; none when nothing is that close."""
    pool = list(choices)
    hits = difflib.get_close_matches(name, pool, n=1, cutoff=SUGGEST_CUTOFF)
    if hits:
        return hits
    return [c for c in pool if min(len(c), len(name)) >= SUBSTRING_MIN and (name in c or c in name)][:1]


def likely_field(name: str, allowed: Iterable[str]) -> str | None:
    """The allowed field an unknown name most likely means: a framework key or synonym of it first, then the
    closest spelling; None when nothing is close. The CLI's unknown-flag hint asks the same question."""
    allowed = list(allowed)
    aliases = {alias: field for alias, field in field_aliases().items() if field in allowed}
    lowered = str(name).lower().replace("-", "_")
    guess = aliases.get(lowered)
    if guess is None:
        hits = likely_names(lowered, [*allowed, *aliases])
        guess = aliases.get(hits[0], hits[0]) if hits else None
    return guess


def unknown_field_error(name: str, allowed: Iterable[str]) -> MeshplanError:
    """An unknown argument, with the valid field it most likely means (by framework key, synonym or spelling)."""
    allowed = sorted(set(allowed))
    guess = likely_field(name, allowed)
    shown = str(name)[:80]
    hint = f"Did you mean {guess!r}? " if guess else ""
    if not allowed:
        return MeshplanError(f"Unknown field {shown!r}.", fix="This takes no arguments: send none.")
    return MeshplanError(f"Unknown field {shown!r}.", fix=f"{hint}Valid fields: {', '.join(allowed)}.")


def validation_message(exc: ValidationError, *, what: str = "request") -> str:
    """A pydantic error as one readable sentence per field: where, what is allowed, and what was given. A request
    built with a field it does not have (a `Request(...)` call) is worded as parse_request words it: the first
    unknown field, with the field it most likely means."""
    unknown = _first_unknown_request_field(exc)
    if unknown is not None:
        return f"Invalid {what}: {unknown}."
    parts = []
    for err in exc.errors(include_url=False):
        message = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a whole-object check: the input is the whole request
            parts.append(message)
            continue
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "missing":  # the input is the whole object the field is missing from: not worth showing
            parts.append(f"{where}: required, and not given")
            continue
        if err["type"] == "string_pattern_mismatch" and err["loc"][-1] in PATTERN_WORDS:
            message = f"Input should be {PATTERN_WORDS[err['loc'][-1]]}"
        given = repr(err.get("input"))
        given = given if len(given) <= 80 else given[:77] + "..."
        parts.append(f"{where}: {message} (got {given})")
    return f"Invalid {what}: " + "; ".join(parts) + "."


def _first_unknown_request_field(exc: ValidationError) -> MeshplanError | None:
    """The Request model refuses an unknown field (extra='forbid'); this layer names the one it most likely means.
    Only the first unknown field is named, and no other error beside it: the first thing to fix."""
    if exc.title != Request.__name__:
        return None
    for err in exc.errors(include_url=False):
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            return unknown_field_error(str(err["loc"][0]), Request.model_fields)
    return None


def names_no_model(value: Any) -> bool:
    """Whether a request's model value names no model: '' or spaces, read as a model left out (parse_request; beside
    a config file, the file's model stands: api.request_from_config)."""
    return isinstance(value, str) and not value.strip()


def model_required() -> MeshplanError:
    """A request or a describe that names no model, in every face's words (the CLI has no list_models)."""
    return MeshplanError("A model is required.",
                         fix="Name the model (MODEL or --model; MCP: model): a catalog key (meshplan models; MCP: "
                             "list_models), a Hugging Face id, a config.json path, or a size such as '70B'.")


def checked_fields(values: Mapping[str, Any], *, also: Iterable[str] = ()) -> dict[str, Any]:
    """The request fields among `values`, each checked on its own (an unknown name, a type, a bound) as every face
    words it, a model not required: a request, or the fields given beside a config file, which fills the rest
    (api.request_from_config laid a wrong-typed field under the file's, and `"tp": "4k"` beside one ended in a
    TypeError). A null, or a blank model, is a field left out. Request has field validators only, so a field
    checked alone is checked as in the whole request."""
    return _checked(values, also)[0]


def _checked(values: Mapping[str, Any], also: Iterable[str]) -> tuple[dict[str, Any], Request]:
    """checked_fields's fields and the Request they validate to (its model 'unnamed' where they name none): one
    validation, which parse_request returns where a model is named."""
    if not isinstance(values, Mapping):
        raise MeshplanError(f"A request is a JSON object of fields, got {type(values).__name__}.",
                            fix='e.g. {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 2}')
    allowed = [*Request.model_fields, *also]
    for name in values:
        if name not in allowed:
            raise unknown_field_error(name, allowed)
    fields = {name: value for name, value in values.items() if name in Request.model_fields and value is not None}
    if names_no_model(fields.get("model")):  # said as a model left out is, on every face (the CLI's MODEL '' was;
        del fields["model"]  # MCP's model '' was not)
    try:
        return fields, Request.model_validate({"model": "unnamed", **fields})
    except ValidationError as exc:
        raise request_error(exc) from exc


def parse_request(values: Mapping[str, Any], *, also: Iterable[str] = ()) -> Request:
    """A `Request` from loose values, as every face receives them: unknown names are errors naming the closest
    field, and a null (or absent) optional field stays open for resolve() and the search to fill."""
    fields, request = _checked(values, also)
    if "model" not in fields:  # the other values are checked first, as MCP's argument check does before this
        raise model_required()
    return request


def request_error(exc: ValidationError) -> MeshplanError:
    """A request's pydantic error as every face words it (parse_request, the MCP tools' argument check, the CLI):
    one sentence per field, and a fix naming the value a misspelt choice most likely means."""
    return MeshplanError(validation_message(exc), fix=_choice_hint(exc))


_SWITCH_WORDS = {"true": "true", "false": "false", "yes": "true", "no": "false", "on": "true", "off": "false",
                 "1": "true", "0": "false"}


def _as_json(kind: str, given: Any) -> tuple[str, str] | None:
    """A number, switch or list sent as text ("8", "true", "yes", "core_attn" or "core_attn,mlp" for a list) where
    the field takes the JSON value (fields are strict on every face), or a whole number sent as a JSON float (8.0,
    which JSON Schema's "integer" admits and a strict field does not): the JSON type and the value to send; None for
    anything else."""
    if kind == "int_type" and isinstance(given, float) and given.is_integer() and abs(given) < 2**53:
        return "integer", str(int(given))
    if not isinstance(given, str):
        return None
    text = given.strip()
    if kind == "int_type" and text.isascii() and text.isdigit():
        return "number", str(int(text))
    if kind == "bool_type" and text.lower() in _SWITCH_WORDS:  # 'true', and the words a YAML or a shell says it with
        return "boolean", _SWITCH_WORDS[text.lower()]
    if kind == "list_type" and (items := [word for word in re.split(r"[,\s]+", text) if word]):
        return "list", "[" + ", ".join(f'"{item}"' for item in items) + "]"
    if kind == "float_type":
        try:
            number = float(text)
        except ValueError:
            return None
        return ("number", repr(number)) if math.isfinite(number) else None
    return None


def _choice_hint(exc: ValidationError) -> str | None:
    """'Did you mean ...?' for the first text field outside its choices ('VERL', 'verl ', 'megatron_bridge'): the
    closest allowed value, as the CLI's choices and an unknown field's name already get; a framework's own name for a
    pipeline schedule gets meshplan's (_schedule_hint)."""
    for err in exc.errors(include_url=False):
        given, expected = err.get("input"), (err.get("ctx") or {}).get("expected")
        where = ".".join(str(part) for part in err["loc"])
        if err["loc"] == ("pipeline_schedule",) and (said := _schedule_hint(given)):
            return said
        if err["loc"] == ("framework",) and (said := framework_variant_hint(given)):
            return said
        if (typed := _as_json(err["type"], given)) is not None:
            sent = f"the string {given!r}" if isinstance(given, str) else f"the float {given!r}"
            return f"Send {where} as a JSON {typed[0]}, {where}={typed[1]}, not {sent}."
        if err["type"] != "literal_error" or not isinstance(given, str) or not isinstance(expected, str):
            continue
        allowed = re.findall(r"'([^']*)'", expected)
        hits = closest(given.strip().replace("_", "-"), allowed, n=1) or closest(given.strip(), allowed, n=1)
        if hits:
            return f"Did you mean {where}={hits[0]!r}?"
    return None


def framework_variant_hint(value: Any) -> str | None:
    """A render variant's name given as the framework ('megatron-deepspeed', what a DeepSpeed job with tp, pp or ep
    over 1 is rendered for): the one framework whose card lists it (adapter.variants), with what the variant renders;
    None where two list it or it starts a framework's name. The api, MCP and CLI say the same."""
    if not isinstance(value, str):
        return None
    name = value.strip().lower().replace("_", "-")
    if any(framework.startswith(name) for framework in FRAMEWORKS):  # 'megatron' (verl's variant): megatron-core's
        return None  # start, which the closest framework name answers
    owners = [(framework, card.adapter.variants[name]) for framework in FRAMEWORKS
              if (card := framework_card(framework)).adapter is not None and name in card.adapter.variants
              and name not in FRAMEWORKS]
    if len(owners) != 1:
        return None
    framework, renders = owners[0]
    return (f"{value!r} is not a framework but a render variant of framework {framework!r} ({renders}): pass "
            f"framework={framework!r}; render picks the variant from the layout, or takes variant={name!r}.")


def _schedule_hint(value: Any) -> str | None:
    """A framework's own name given as pipeline_schedule (torchtitan's ZBVZeroBubble): the value meshplan calls it,
    from the framework cards' pipeline.schedules."""
    if not isinstance(value, str):
        return None
    names = [(framework, order, name) for framework in FRAMEWORKS
             for order, name in framework_card(framework).pipeline.schedules.items()]
    for same in (lambda name: name == value.strip(), lambda name: name.lower() == value.strip().lower()):
        for framework, order, name in names:
            if same(name):
                return (f"{value!r} is {framework}'s name for pipeline_schedule={SCHEDULE_OF_ORDER[order]!r}; "
                        f"pass that.")
    return None
