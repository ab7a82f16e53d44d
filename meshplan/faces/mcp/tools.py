"""The eight MCP tools: each validates its flat arguments into a `Request`, calls `meshplan.api`, and words the answer.

The arguments are the fields of `meshplan.schema.request.Request`, so the tool schemas, the CLI flags and the
batch lines cannot drift apart: the signatures below are generated from that model (type, bounds,
default and description), which keeps every input schema flat and free of `$ref`. Every failure a
user can fix is re-raised as `ToolError` carrying the reason and the fix, because the SDK hides the
message of any other exception from the model.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal, TypeVar, get_args

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from meshplan import api
from meshplan.core.card_files import frameworks_with_section
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib, percent, plural
from meshplan.knowledge.model_config import is_model_config_json
from meshplan.request.parse import model_required, parse_request, request_error, unknown_field_error
from meshplan.schema.choices import StrictModel
from meshplan.schema.imported import ImportedConfig
from meshplan.schema.options import MinimumGpusOptions, RecommendOptions
from meshplan.schema.reports import ErrorBand, Recommendation, peak_words
from meshplan.schema.request import Request

from .cancellable import cancellable
from .results import (
    CheckAnswer,
    MemoryAnswer,
    MinimumGpusAnswer,
    ModelAnswer,
    ModelCatalog,
    RecommendationAnswer,
    RenderAnswer,
    ThroughputAnswer,
    extend,
)

# Every tool is a pure computation over the catalog: nothing is written, nothing leaves the machine.
READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)

# The frameworks the adapters can write a config for: those whose card has an `adapter` section (read from the card
# files' text: the card loader waits for the first call; adapters.capabilities.renderable_frameworks, from the
# loaded cards, is the same tuple, tests/test_cards.py).
RenderTarget = Literal[frameworks_with_section("adapter")]  # type: ignore[valid-type]

_KW = inspect.Parameter.KEYWORD_ONLY
OptionsT = TypeVar("OptionsT", bound=BaseModel)
_MODEL = Request.model_fields["model"]
ModelName = Annotated[(str, *_MODEL.metadata, Field(description=_MODEL.description))]


# --------------------------------------------------------------------------- arguments and errors


def request_parameters(*, skip: Iterable[str] = (), required: Iterable[str] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per `Request` field, carrying its type, bounds, default and description."""
    skip, required = set(skip), set(required)
    params = []
    for name, field in Request.model_fields.items():
        if name in skip:
            continue
        kind, description = field.annotation, field.description or ""
        if name in required:  # a field the request may leave out, but this tool cannot: no null, no default
            kind = next(arg for arg in get_args(kind) if arg is not type(None)) if get_args(kind) else kind
            description = description.split(" (default")[0]
        annotation = Annotated[(kind, *field.metadata,
                                Field(description=description, json_schema_extra=field.json_schema_extra))]
        default = inspect.Parameter.empty if field.is_required() or name in required else field.default
        if name == "model":  # config_text may name it, as `meshplan check --config FILE` reads it from the file
            annotation = Annotated[(kind | None, *field.metadata, Field(description=description))]
            default = None
        params.append(inspect.Parameter(name, _KW, annotation=annotation, default=default))
    return params + CONFIG_PARAMETERS


CONFIG_NAMES = ("config_text", "config_format")
# The user's own configuration, pasted: its fields start the request and the arguments given beside it win. Its size
# and emptiness are the reader's to refuse (adapters/read, MAX_CONFIG_CHARS), in the words `meshplan import` gives.
CONFIG_PARAMETERS = [
    inspect.Parameter("config_text", _KW, default=None, annotation=Annotated[str | None, Field(
        None, description="The text of the user's framework config or launch script (a "
        "Megatron-LM, DeepSpeed, Megatron-Bridge, verl, SkyRL or torchtitan shell script, a torchtitan or "
        "KempnerForge TOML, a DeepSpeed JSON, a NeMo AutoModel recipe YAML), or a Hugging Face config.json (a JSON "
        "object with model_type), read as the model: read, never run; its fields start the "
        "request (the model too, where it names one: then `model` may be left out) and every argument sent beside "
        "it overrides them, whatever its value; one left out or null leaves the file's (default: none)")]),
    inspect.Parameter("config_format", _KW, default=None, annotation=Annotated[
        Literal["shell", "toml", "json", "yaml"] | None, Field(None, description="config_text's format (default: "
                                                                          "detected from the text)")]),
]


# The signature of the tools that take the request alone.
REQUEST_PARAMETERS = request_parameters()

def with_signature(params: list[inspect.Parameter], returns: type) -> Callable[[Callable], Callable]:
    """Give a `**kwargs` tool function the explicit signature the SDK turns into its input schema."""

    def apply(fn: Callable) -> Callable:
        fn.__signature__ = inspect.Signature(params, return_annotation=returns)
        fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": returns}
        return fn

    return apply


def option_parameters(options: type[BaseModel]) -> list[inspect.Parameter]:
    """One keyword parameter per field of a tool's options model (the arguments it takes beside the request), with
    that field's type, bounds, default and description: the model is their one home, so the published schema and a
    direct Python call (which fills no default) read the same defaults."""
    return [inspect.Parameter(name, _KW, annotation=Annotated[(field.annotation, *field.metadata, Field(
                description=field.description))],
                              default=inspect.Parameter.empty if field.is_required() else field.default)
            for name, field in options.model_fields.items()]


def take_options(options: type[OptionsT], args: dict[str, Any]) -> OptionsT:
    """The tool's options taken out of `args` (the request's fields stay), validated by their model: a value left out
    takes the model's default, as the SDK fills it from the schema. Call inside tool_errors."""
    return options.model_validate({name: args.pop(name) for name in options.model_fields if name in args},
                                  strict=True)


@contextmanager
def tool_errors() -> Iterator[None]:
    """Turn meshplan's user-facing errors into `ToolError`, the only kind whose text reaches the model."""
    try:
        yield
    except MeshplanError as exc:
        raise ToolError(str(exc)) from exc
    except ValidationError as exc:
        raise ToolError(str(request_error(exc))) from exc


def to_request(args: dict[str, Any], config: ImportedConfig | None = None, scan_gpus: bool = False) -> Request:
    """The tool's request arguments as a `Request`; a null argument stays open, exactly as if left out. With
    config_text, the file's fields first (`config`: read_config's reading of it) and the arguments over them
    (meshplan.api.request_from_config; `scan_gpus`: minimum_gpus, the file's GPU count left out). `args` holds the
    arguments the caller sent and no others (strict_arguments passes no default), so any one of them overrides the
    file whatever its value, as a CLI flag does, and a framework left out lets the reader detect the file's."""
    text, fmt = args.pop("config_text", None), args.pop("config_format", None)
    if _is_model_json(text, fmt):
        # a model's config.json: the model, as its text (a `model` given beside it wins, as over any config's fields)
        return parse_request({**args, "model": args.get("model") or text})
    if text is not None:
        imported = config or api.import_config(text, framework=args.get("framework"), config_format=fmt)
        return api.request_from_config(imported, args, scan_gpus=scan_gpus)
    return parse_request(args)


def _is_model_json(text: str | None, config_format: str | None) -> bool:
    """Whether config_text is a model's config.json (read as the model), not a framework's config: one test for
    to_request and read_config."""
    return text is not None and config_format in (None, "json") and is_model_config_json(text)


def read_config(args: dict[str, Any]) -> ImportedConfig | None:
    """config_text read as to_request reads it (None without one), for the tools that also answer in its keys."""
    text = args.get("config_text")
    if text is None or _is_model_json(text, args.get("config_format")):
        return None  # none, or a model's config.json: to_request reads it as the model
    return api.import_config(text, framework=args.get("framework"), config_format=args.get("config_format"))


class _ArgumentsAsSent(FuncMetadata):
    """Hands the tool the arguments as the client sent them, so `strict_arguments` can name a misspelt one.

    The SDK's own argument model ignores unknown names (`"tensor_parallel_size": 8` would silently run TP1)
    and reports a bad value as a raw pydantic dump; the published input schema is unchanged.
    """

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        """The SDK's pre-parse (a list sent as a JSON string, as some clients do), except for a field that takes
        text: it parses a string for every field not annotated exactly `str`, so a DeepSpeed JSON config sent as
        config_text (`str | None`) arrived as a dict and was refused as not a string."""
        parsed = self.pre_parse_json(arguments_to_validate)
        fields = self.arg_model.model_fields
        return {name: arguments_to_validate[name] if name in fields and _takes_text(fields[name].annotation) else value
                for name, value in parsed.items()}


def _takes_text(annotation: Any) -> bool:
    return annotation is str or str in get_args(annotation)


def strict_arguments(fn: Callable[..., Any], arg_model: type[BaseModel]) -> Callable[..., Any]:
    """Validate a call against the tool's input schema: an unknown name is an error naming the closest field, and a
    value of another JSON type than the schema's is refused (strict, as `Request` is on every face). A null for an
    argument with a default is that argument left out, as parse_request reads a null on every other face (a batch
    line's "seq_length": null took 4096 where this tool said 'Input should be a valid integer (got None)').

    The tool gets the arguments the client sent (the validated values of `model_fields_set`), never the schema's
    defaults: beside config_text a sent argument overrides the file whatever its value and one left out does not,
    as with the CLI's flags. Filled with every default, a tool could not tell seq_length=4096 sent from left out
    (it kept the file's 2048 where `meshplan min-gpus --seq-length 4096` did not)."""

    @functools.wraps(fn)
    def call(**arguments: Any) -> Any:
        with tool_errors():
            for name in arguments:
                if name not in arg_model.model_fields:  # named as every face names a request's fields
                    raise unknown_field_error(name, [f for f in arg_model.model_fields if f not in CONFIG_NAMES])
            arguments = {name: value for name, value in arguments.items()
                         if value is not None or arg_model.model_fields[name].is_required()}
            if (first := getattr(fn, "check_first", None)) is not None:  # a refusal worded by its one home
                first(arguments)
            validated = arg_model.model_validate(arguments, strict=True)  # Request's types: no `true` as 1, no "8"
        return fn(**{name: getattr(validated, name) for name in validated.model_fields_set})

    return call


def _same_args(tool: str, why: str) -> str:
    return f"Call {tool} with the same arguments {why}."


# --------------------------------------------------------------------------- tools


DESCRIBE_MODEL = (
    "Use when asked how many parameters a model has, how many are active per token, or what its "
    "architecture is. Returns exact total and active counts from the config (biases, norms, tied "
    "embeddings, MLA, shared experts; MTP blocks separately), the other active-count conventions vendors "
    "publish, and a per-component breakdown. `model` is a catalog key, a Hugging Face id, a path to a "
    "config.json, a size alone such as '70B' (a generic dense model, flagged as such), or a Megatron-LM launch "
    "script (its path, or its architecture flags as import_config states them): the model its flags build."
)


def describe_model(model: ModelName) -> ModelAnswer:
    with tool_errors():
        report = api.describe_model(model)
    kind = f"{report.active_params / 1e9:.2f}B active per token" if report.active_params != report.total_params else (
        "dense, every parameter active"
    )
    summary = f"{report.name}: {report.total_params:,} parameters ({report.total_params / 1e9:.2f}B), {kind}."
    if report.mtp_params:
        summary += f" Multi-token-prediction blocks add {report.mtp_params:,} (not in the total)."
    if report.generic:
        summary += " This is a generic llama-shaped model built from a size alone, not a real config."
    steps = [
        "Call recommend_parallelism with this model, a GPU type and count to get the fastest layout that fits.",
        "Call estimate_memory with a layout to see per-GPU memory per pipeline stage.",
    ]
    return extend(report, ModelAnswer, summary=summary, next_steps=steps)


def _model_named_first(arguments: dict[str, Any]) -> None:
    """describe_model's model left out or null refused as every face refuses a describe without a model (the schema
    said 'model: Input should be a valid string (got None)' where the api and the CLI say a model is required)."""
    if arguments.get("model") is None:
        raise model_required()


describe_model.check_first = _model_named_first  # type: ignore[attr-defined]  # strict_arguments runs it


LIST_MODELS = (
    "Use to see which models meshplan knows by name before passing one as `model`: every catalog entry "
    "with its key, Hugging Face id, family, model type and exact total and active parameter counts. Any "
    "Hugging Face config.json path, a size like '70B', or a Megatron-LM launch script (its path, or its "
    "architecture flags as import_config states them) also works as `model`."
)


def list_models() -> ModelCatalog:
    with tool_errors():
        models = api.list_models()
    return ModelCatalog(
        count=len(models),
        models=models,
        summary=f"{len(models)} models in the catalog; pass a key or a Hugging Face id as `model` to any tool.",
        next_steps=["Call describe_model for a per-component breakdown of one model."],
    )


ESTIMATE_MEMORY = (
    "Use when asked whether a layout fits in GPU memory, why a job ran out of memory, or where the "
    "memory goes. Returns per-GPU bytes for every pipeline stage split into weights, gradients, optimizer "
    "states, activations and other buffers, the peak (worst) stage, capacity, `fits` and headroom, plus "
    "the formulas and conventions used. Unset layout fields (tp, pp, cp, ep, dp, ...) default to 1 or are "
    "derived from num_gpus; the framework sets the byte conventions (Megatron distributed optimizer, "
    "DeepSpeed ZeRO, FSDP2)."
)


def _band_words(band: ErrorBand | None) -> str:
    """The error measured in the estimate's regime, as the CLI prints it (meshplan/estimate/accuracy.py)."""
    return f" Error measured in this regime: {band.text}." if band is not None else ""


@with_signature(REQUEST_PARAMETERS, MemoryAnswer)
def estimate_memory(**args: Any) -> MemoryAnswer:
    with tool_errors():
        config = read_config(args)
        report = api.estimate_memory(to_request(args, config), config=config)
    verdict = (
        f"fits with {gib(report.headroom_bytes)} headroom" if report.fits
        else f"does NOT fit: {gib(report.fit_bytes - report.capacity_bytes)} over"
    )
    summary = (
        f"{report.model} with {report.plan.short()} on {report.framework}: peak {peak_words(report)} per GPU on "
        f"pipeline stage {report.peak_stage} of {gib(report.capacity_bytes)}; {verdict}."
    )
    summary += _band_words(report.error_band)
    if report.fits:
        steps = [
            _same_args("check_config", "to run the framework's rules on this layout"),
            _same_args("estimate_throughput", "for step time, tokens/s per GPU and MFU"),
        ]
    else:
        steps = [
            _same_args("check_config", "for fixes that name layouts which fit"),
            "Call recommend_parallelism with the same model, GPU and num_gpus to search every layout that fits.",
        ]
    return extend(report, MemoryAnswer, summary=summary, next_steps=steps)


ESTIMATE_THROUGHPUT = (
    "Use when asked how fast a layout trains or why it is slow. Returns the predicted step time in "
    "seconds, tokens/s per GPU and in total, MFU, model FLOPs per step, and a breakdown of where the time "
    "goes: compute, exposed TP/CP/EP/DP/PP communication, the pipeline bubble and recompute. Takes the same "
    "layout arguments as estimate_memory."
)

RL_PARTS = {"generation_s": "generation", "log_prob_s": "log-prob passes", "update_s": "update",
            "reshard_s": "resharding", "offload_s": "phase offloads"}  # ThroughputReport.parts of an RL step, worded
_OVERHEADS = ("tp_comm_s", "cp_comm_s", "ep_comm_s", "dp_comm_s", "pp_comm_s", "bubble_s", "recompute_s", "other_s")


@with_signature(REQUEST_PARAMETERS, ThroughputAnswer)
def estimate_throughput(**args: Any) -> ThroughputAnswer:
    with tool_errors():
        config = read_config(args)
        report = api.estimate_throughput(to_request(args, config), config=config)
    summary = (
        f"{report.model} with {report.plan.short()} on {report.framework}: {report.step_time_s:.3g} s per step, "
        f"{report.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {report.mfu:.1%}"
        + (" (the actor update's)." if report.rl is not None else ".")
    )
    if report.rl is not None:  # an RL step: its phases, the breakdown the actor's training step beside them
        summary += " Parts: " + ", ".join(f"{RL_PARTS[name]} {value:.3g} s"
                                           for name, value in report.parts().items() if value > 0) + "."
        for words in (report.rl.overlap_words(), report.actor_step_words()):
            summary += f" {words[:1].upper()}{words[1:]}." if words else ""
    else:
        costs = {name: getattr(report.breakdown, name) for name in _OVERHEADS}
        worst = max(costs, key=costs.get)
        if costs[worst] > 0:
            summary += f" Largest cost besides compute: {worst[:-2].replace('_', ' ')} ({costs[worst]:.3g} s)."
    summary += _band_words(report.error_band)
    if report.calibration is not None:  # the user's stored cluster factor (meshplan compare --calibrate)
        summary += f" {report.calibration.words().capitalize()}."
    steps = [
        "Call recommend_parallelism with the same model, GPU and num_gpus to compare against the fastest layout.",
        _same_args("estimate_memory", "to confirm the layout fits"),
    ]
    return extend(report, ThroughputAnswer, summary=summary, next_steps=steps)


CHECK_CONFIG = (
    "Use when the user has a parallel layout or a training config and asks whether it is valid, whether "
    "it fits, or what will break. Runs every rule of the framework (world-size law, head and layer "
    "divisibility, sequence/context/expert parallel constraints, batch divisibility, pipeline bubble, "
    "NVLink domain, memory) and returns findings, each with a stable rule id, severity, a message with the "
    "numbers and a fix naming values that work. `ok` is false when any finding is an error; that is a "
    "normal answer, not a tool failure."
)


@with_signature(REQUEST_PARAMETERS, CheckAnswer)
def check_config(**args: Any) -> CheckAnswer:
    with tool_errors():
        config = read_config(args)
        report = api.check_config(to_request(args, config), config=config)  # with config_text: fixes in its keys
    from meshplan.check.headline import layout_text  # the framework cards load with the first check

    counts = {s: sum(f.severity == s for f in report.findings) for s in ("error", "warning", "info")}
    where = f"{layout_text(report)} on {report.framework}"
    if report.ok:
        summary = f"Valid: {where} breaks no rule ({counts['warning']} warnings, {counts['info']} notes)."
    else:
        ids = ", ".join(sorted({f.id for f in report.findings if f.severity == "error"}))
        summary = f"INVALID: {where} breaks {counts['error']} rule(s) ({ids}); each finding's fix names working values."
    if report.memory is not None:
        summary += f" Peak memory {peak_words(report.memory)} of {gib(report.memory.capacity_bytes)} per GPU."
    steps = list(report.next_steps)
    if report.ok:
        steps.append(_same_args("render_config", "(plus framework) to get the config to paste"))
    else:
        steps.append("Call recommend_parallelism with the same model, GPU and num_gpus for valid layouts.")
    return extend(report, CheckAnswer, summary=summary, next_steps=steps)


RECOMMEND = (
    "Use first when someone asks how to parallelize, shard or lay out an LLM training job on a number of "
    "GPUs. Searches every TP/PP/VPP/CP/EP/ETP/DP/ZeRO/micro-batch/recompute layout the framework can "
    "express, drops those that break a rule or do not fit in memory, and ranks the rest by predicted step "
    "time. A layout fits when it keeps `headroom` of GPU memory free (default 10%, rule MEM002). Returns "
    "the top candidates (layouts with identical numbers folded into one row), each with its plan, memory "
    "summary, throughput and rationale; how many layouts were considered and rejected per rule id; and what "
    "the published decision tables suggest for this job. Layout fields you set (tp, pp, ...) constrain the "
    "search; fields you leave out (or pass as null) are searched. When nothing keeps the headroom, "
    "`candidates` is empty and the answer names the fastest layout with less headroom and the smallest GPU "
    "count that fits."
)


# num_gpus too may come from config_text; without either the api says to pass it
@with_signature([*request_parameters(), *option_parameters(RecommendOptions)], RecommendationAnswer)
def recommend_parallelism(**args: Any) -> RecommendationAnswer:
    with tool_errors():
        options = take_options(RecommendOptions, args)
        rec = api.recommend(to_request(args), top_k=options.top_k)
    if not rec.candidates:
        # Nothing ranked is still an answer (the same one the CLI and the api give): say why and what would work.
        return extend(rec, RecommendationAnswer, summary=_nothing_ranked(rec) + warnings_words(rec.warnings),
                      next_steps=_retry_steps(rec))
    best = rec.candidates[0]
    summary = (
        f"Best of {rec.considered:,} layouts for {rec.model} on {plural(rec.num_gpus, 'GPU')} ({rec.framework}): "
        f"{best.plan.short()}, micro-batch {best.plan.micro_batch_size}, recompute {best.plan.recompute}: "
        f"{best.throughput.step_time_s:.3g} s per step, {best.throughput.tokens_per_s_per_gpu:,.0f} tokens/s "
        f"per GPU, MFU {best.throughput.mfu:.1%}, peak memory {peak_words(best.memory)} of "
        f"{gib(best.memory.capacity_bytes)}."
    )
    summary += _band_words(best.throughput.error_band) + warnings_words(rec.warnings)
    steps = [
        "Call render_config with the chosen plan's fields (tp, pp, vpp, cp, ep, etp, dp, micro_batch_size, "
        "recompute, ...) and the framework to get the config to paste.",
        "Call check_config with the chosen plan's fields to see its warnings in full.",
    ]
    return extend(rec, RecommendationAnswer, summary=summary, next_steps=steps)


def _nothing_ranked(rec: Recommendation) -> str:
    thin = rec.best_below_headroom
    text = f"No layout of {rec.model} on {plural(rec.num_gpus, 'GPU')} passes the rules and keeps " \
           f"{percent(rec.headroom or 0)} of GPU memory free ({rec.considered:,} considered)."
    if thin is not None:
        free = thin.memory.headroom_bytes / thin.memory.capacity_bytes
        text += (f" The fastest that fits with less: {thin.plan.short()}, micro-batch {thin.plan.micro_batch_size}, "
                 f"recompute {thin.plan.recompute}, {thin.throughput.tokens_per_s_per_gpu:,.0f} tokens/s per GPU with "
                 f"{gib(thin.memory.headroom_bytes)} ({free:.1%}) free.")
    elif rec.closest:  # each miss named as the CLI's table names it: a split where two would read alike
        from meshplan.check.split import layout_cells  # loaded already: recommend just ran

        misses = [f"{layout} (micro-batch {m.plan.micro_batch_size}, ZeRO {m.plan.zero_stage}, recompute "
                  f"{m.plan.recompute}: {gib(m.memory.peak_bytes)} of {gib(m.memory.capacity_bytes)})"
                  for m, layout in zip(rec.closest, layout_cells([m.plan for m in rec.closest]), strict=True)]
        text += " Closest misses: " + "; ".join(misses) + "."
    if rec.min_gpus:
        text += f" The smallest GPU count that keeps the headroom is {rec.min_gpus}."
    return text


def _retry_steps(rec: Recommendation) -> list[str]:
    steps = []
    if rec.min_gpus:
        steps.append(f"Call recommend_parallelism again with num_gpus={rec.min_gpus}.")
    if rec.best_below_headroom is not None:
        from meshplan.search import headroom_that_ranks  # loaded already: recommend just ran

        ranks = headroom_that_ranks(rec.best_below_headroom.memory)
        steps.append(f"Or accept thinner memory headroom: call recommend_parallelism again with headroom={ranks:g}.")
    steps.append("Call minimum_gpus with the same model, GPU and framework for the smallest GPU count that fits.")
    return steps


RENDER_CONFIG = (
    "Use once a layout is chosen, to write it in the framework's own configuration: Megatron-Bridge "
    "Python (cfg.model/ddp/optimizer/train), Megatron-Core torchrun flags, verl Hydra overrides, SkyRL "
    "overrides, torchtitan command-line overrides (or TOML for 0.2.x), a KempnerForge TOML section, or a "
    "DeepSpeed ds_config.json. Only keys the real framework accepts are emitted; a plan the framework "
    "cannot express fails with the knob and what to use instead, and a layout that breaks one of its rules "
    "(the framework would reject it, or it does not fit in memory) fails with the findings and their fixes "
    "unless force=true."
)


class RenderTargetOption(StrictModel):
    """render_config's first argument: the framework to write, required (a request defaults it; a render does not)."""

    framework: RenderTarget = Field(description="Framework whose config to write")


class RenderOptions(StrictModel):
    """render_config's arguments after the request's."""

    variant: str | None = Field(None, max_length=64, description="Framework-specific form (verl: megatron|fsdp; "
                                                                 "skyrl: rl|sft)")
    version: str | None = Field(None, max_length=32, description="Framework version to target (e.g. torchtitan 0.2)")
    force: bool = Field(False, description=(
        "Render even when the layout breaks a rule of the framework (it would be rejected or not fit); the findings "
        "then come back in `warnings`. Leave false unless the user insists"))


@with_signature([*option_parameters(RenderTargetOption), *request_parameters(skip=("framework",)),
                 *option_parameters(RenderOptions)], RenderAnswer)
def render_config(**args: Any) -> RenderAnswer:
    with tool_errors():
        framework = take_options(RenderTargetOption, args).framework
        options = take_options(RenderOptions, args)
        chosen = {k: v for k, v in {"variant": options.variant, "version": options.version}.items() if v is not None}
        result = api.render_config(framework, to_request(args), force=options.force, **chosen)
    fields = {name: getattr(result, name) for name in RenderAnswer.model_fields if hasattr(result, name)}
    summary = (
        f"{result.plan.short()} written as {result.format} for {framework} {result.version} "
        f"({len(result.text.splitlines())} lines); paste `text`"
        + (f" as {result.filename}." if result.filename else ".")
    )
    summary += warnings_words(result.warnings)
    steps = [_same_args("check_config", "(and this framework) before launching, if not done yet")]
    return RenderAnswer(**fields | {"summary": summary, "next_steps": steps})


def _render_target_first(arguments: dict[str, Any]) -> None:
    """render_config's framework refused before the schema's list of values, in the words the CLI gives (its one home,
    adapters/render.require_target: why, a memory convention only, and the close name)."""
    if isinstance(arguments.get("framework"), str):
        from meshplan.adapters.render import require_target

        require_target(arguments["framework"])


render_config.check_first = _render_target_first  # type: ignore[attr-defined]  # strict_arguments runs it


MINIMUM_GPUS = (
    "Use when asked for the fewest GPUs a training job needs, or whether a model can be trained on a given GPU "
    "type at all. Scans GPU counts in increasing order (fit is not monotone in the count: a count must divide by "
    "the layout's degrees) and returns the smallest one at which some layout passes the framework's rules and "
    "keeps `headroom` of GPU memory free, with recommend_parallelism's best layout there; bounded in time and "
    "count, and it says which bound stopped it. Layout fields you set (tp, pp, ...) constrain every count."
)


@with_signature([*request_parameters(skip=("num_gpus",)), *option_parameters(MinimumGpusOptions)], MinimumGpusAnswer)
def minimum_gpus(**args: Any) -> MinimumGpusAnswer:
    with tool_errors():
        options = take_options(MinimumGpusOptions, args)
        report = api.minimum_gpus(to_request(args, scan_gpus=True), max_gpus=options.max_gpus)
    if report.num_gpus is not None and report.candidate is not None:
        best = report.candidate
        summary = (
            f"{report.model} on {report.gpu} ({report.framework}) needs at least {plural(report.num_gpus, 'GPU')} "
            f"to keep {percent(report.headroom)} of memory free: {best.plan.short()}, "
            f"micro-batch {best.plan.micro_batch_size}, "
            f"recompute {best.plan.recompute}, peak {gib(best.memory.peak_bytes)} of "
            f"{gib(best.memory.capacity_bytes)}, {best.throughput.tokens_per_s_per_gpu:,.0f} tokens/s per GPU."
        )
        steps = [f"Call recommend_parallelism with num_gpus={report.num_gpus} (or more) to compare layouts there."]
    elif report.memory_floor is not None:  # a proof: no count fits, raising max_gpus cannot help
        summary = f"{report.model} on {report.gpu} ({report.framework}): {report.rationale}"
        steps = [f"Call minimum_gpus again with {change}." for change in report.memory_floor.changes] or \
            ["Change the model, sequence length, framework or GPU: no GPU count fits this request."]
    else:
        summary = f"No GPU count fits {report.model} on {report.gpu} within the bounds: {report.rationale}"
        steps = ["Call check_config with the fixed fields to see which rule rejects them, or raise max_gpus."]
    return extend(report, MinimumGpusAnswer, summary=summary + warnings_words(report.warnings), next_steps=steps)


def warnings_words(warnings: list[str]) -> str:
    """The summary's sentence for an answer with warnings (render's, recommend's, minimum_gpus'): an agent reading the
    summary alone launched a recommended layout without a word of its EP014 / budget-cut warnings. Empty without."""
    return f" {len(warnings)} warning(s): read `warnings` before launching." if warnings else ""


ToolSpec = tuple[Callable[..., Any], str, str]  # the function, its title, its description

TOOLS: list[ToolSpec] = [
    (recommend_parallelism, "Recommend a parallel layout", RECOMMEND),
    (check_config, "Check a parallel layout", CHECK_CONFIG),
    (estimate_memory, "Estimate per-GPU memory", ESTIMATE_MEMORY),
    (estimate_throughput, "Estimate step time and MFU", ESTIMATE_THROUGHPUT),
    (render_config, "Render a framework config", RENDER_CONFIG),
    (describe_model, "Describe a model", DESCRIBE_MODEL),
    (list_models, "List catalog models", LIST_MODELS),
    (minimum_gpus, "Smallest GPU count that fits", MINIMUM_GPUS),
]


def _checked(tool: Tool, output: tuple[type[BaseModel], dict[str, Any]] | None) -> Tool:
    """`tool` with its arguments checked as sent and, when `output` is given, that result model and output schema."""
    meta = tool.fn_metadata
    model, schema = output or (meta.output_model, meta.output_schema)
    tool.fn = strict_arguments(tool.fn, meta.arg_model)
    tool.fn_metadata = _ArgumentsAsSent(arg_model=meta.arg_model, output_schema=schema, output_model=model,
                                        wrap_output=meta.wrap_output)
    return tool


def sdk_tool(fn: Callable[..., Any], title: str, description: str,
             output: tuple[type[BaseModel], dict[str, Any]] | None = None) -> Tool:
    """One tool as the SDK builds it from the function: cancellable, read-only, its arguments checked as sent. `output`
    is its result model with that model's output schema as published (tool_list.py); without it the SDK derives both."""
    tool = Tool.from_function(cancellable(fn), name=fn.__name__, title=title, description=description,
                              annotations=READ_ONLY, structured_output=False if output else None)
    return _checked(tool, output)
