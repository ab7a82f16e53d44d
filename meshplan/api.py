"""The operations every face of meshplan offers, taking flat requests: the CLI and the MCP tools call these.

Each function resolves the request once and hands `Job` and `Plan` to the pure module that owns the
computation. Heavy modules are imported inside the functions so `meshplan describe` and the MCP
server start fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.request.parse import checked_fields, model_required, names_no_model, parse_request
from meshplan.schema.imported import ImportedConfig
from meshplan.schema.measured import MeasuredRun, RunComparison
from meshplan.schema.model import ModelReport, ModelSummary
from meshplan.schema.reports import (
    CheckReport,
    MemoryReport,
    MinimumGpus,
    Recommendation,
    RenderResult,
    ThroughputReport,
    finding_line,
)
from meshplan.schema.request import Request

SCRIPT_SUFFIXES = (".sh", ".bash", ".slurm", ".sbatch")  # the launch scripts `model` may name (import_file's shell)


def script_model(model: str) -> str:
    """`model` the path of a launch script: the model its flags state (the catalog model they match, or the one they
    build, knowledge/flag_models.py), read again on every call, so an edited script is read as it is now."""
    if not isinstance(model, str) or not model.strip().endswith(SCRIPT_SUFFIXES):
        return model
    from meshplan.adapters.read import import_file

    imported = import_file(model.strip(), config_format="shell")
    if "model" in imported.request:
        return imported.request["model"]
    said = " ".join(left.said for left in imported.left_to_request if "model" in left.fields)
    raise MeshplanError(f"model {model.strip()[:200]}: the launch script's model is not read. "
                        + (said or "The script states no architecture flags."),
                        fix="Pass a catalog key or the model's config.json as model.")


def script_request(req: Request) -> Request:
    model = script_model(req.model)
    return req if model == req.model else req.model_copy(update={"model": model})


def describe_model(model: str) -> ModelReport:
    """The model's parameter counts; a blank model is no model, refused in the words every request gets."""
    from meshplan.knowledge.catalog import describe_model as describe

    if model is None or names_no_model(model):  # None: a describe without a model, as the CLI's and MCP's null
        raise model_required()
    if not isinstance(model, str):  # refused in the words a request's model of that type gets on every face
        parse_request({"model": model})
    return describe(script_model(model))


def list_models() -> list[ModelSummary]:
    from meshplan.knowledge.catalog import model_summaries

    return model_summaries()


def estimate_memory(req: Request, *, config: ImportedConfig | None = None) -> MemoryReport:
    """Per-GPU memory per stage; from a config file (`config`), its misspelt keys lead the warnings."""
    from meshplan.request.resolve import resolve

    job, plan = resolve(script_request(req))
    return _memory(job, plan, config)


def _memory(job: Any, plan: Any, config: ImportedConfig | None) -> MemoryReport:
    """estimate_memory's report of a resolved job and plan, a rule's refusal worded as check words it (PP001's ranked
    split)."""
    from meshplan.check.config import refused_as_check_words
    from meshplan.estimate.accuracy import with_band
    from meshplan.rl.memory import job_memory as estimate  # an RL job: the peak over its phases

    with refused_as_check_words(job, plan):
        report = with_band(estimate(job, plan), job, plan)  # the band: cards/accuracy.yaml
        said = _engine_cannot_start(report, plan)
        if said:
            report = report.model_copy(update={"warnings": [f"{said}.", *report.warnings]})
        return _warn_misspelt(_warn_no_effect(report, job, plan), config)


def _engine_cannot_start(memory: MemoryReport, plan: Any) -> str:
    """An RL job whose rollout engine holds no sequence's KV cache (rule RL006: vLLM and SGLang refuse to start),
    in words, '' otherwise: the memory face said 'fits' and the step time decoded one sequence at a time (Qwen2.5-7B
    on 8 H100 with SGLang at fraction 0.5: 851 s of generation) with no word of it; check alone said RL006."""
    if not memory.rollout_starved:
        return ""
    return (f"The rollout engine cannot start: at rollout_memory_fraction {plan.rollout_memory_fraction:g} its "
            "budget holds no sequence's KV cache once its weights and activations are in (rule RL006; `meshplan "
            "check` names the fraction or rollout_tp that holds one)")


class Estimates(NamedTuple):
    """A request's memory estimate and step time (None where it cannot be timed, `untimed` saying why)."""

    memory: MemoryReport
    throughput: ThroughputReport | None
    untimed: str | None = None


def memory_and_throughput(req: Request) -> Estimates:
    """estimate_memory and estimate_throughput of one request, the request resolved and its memory estimated once:
    the step time's unfit warning reads that estimate (_warn_unfit) where estimate_throughput makes its own. What
    the report face draws (faces/report/gather.py); a refused memory estimate raises, a refused step time is said."""
    from meshplan.check.config import refused_as_check_words
    from meshplan.request.resolve import resolve

    job, plan = resolve(script_request(req))
    memory = _memory(job, plan, None)
    try:
        with refused_as_check_words(job, plan):
            return Estimates(memory, _timed(job, plan, None, memory))
    except MeshplanError as exc:  # a plan that cannot be timed is still drawn; the reason is said
        return Estimates(memory, None, str(exc))


def _warn_no_effect(report: Any, job: Any, plan: Any) -> Any:
    """The report with the settings given that have no effect on this plan said after its own warnings, in the words
    `check` gives them (the rules card's no_effect rules: etp on a dense model, pipeline settings at pp 1, ...)."""
    from meshplan.rules.engine import no_effect_findings

    said = [finding_line(found) for found in no_effect_findings(job, plan)]
    return report.model_copy(update={"warnings": [*report.warnings, *said]}) if said else report


def _warn_misspelt(report: Any, config: ImportedConfig | None) -> Any:
    """The report with the file's misspelt keys first in its warnings: a key the file means but meshplan (and, for a
    key the framework does not know, the framework) does not read would otherwise change the answer unsaid."""
    if config is None or not config.misspelt:
        return report
    said = [f"{line}: the estimate runs without it" for line in config.misspelt]
    return report.model_copy(update={"warnings": [*said, *report.warnings]})


def estimate_throughput(req: Request, *, config: ImportedConfig | None = None) -> ThroughputReport:
    """The step time; with a cluster factor the user stored (meshplan compare --calibrate), scaled by it and said so
    (ThroughputReport.calibration, first assumption); from a config file, its misspelt keys lead the warnings."""
    from meshplan.check.config import refused_as_check_words
    from meshplan.request.resolve import resolve

    job, plan = resolve(script_request(req))
    with refused_as_check_words(job, plan):
        return _timed(job, plan, config)


def _timed(job: Any, plan: Any, config: ImportedConfig | None, memory: MemoryReport | None = None) -> ThroughputReport:
    """estimate_throughput's report of a resolved job and plan: warned where it does not fit (from `memory`, the
    caller's estimate of this job and plan, or one made here), the file's misspelt keys first, the stored cluster
    factor applied."""
    from meshplan.knowledge.cluster_calibration import calibrated, stored_factor

    report = _warn_misspelt(_warn_no_effect(_warn_unfit(_model_throughput(job, plan), job, plan, memory), job, plan),
                            config)
    factor = stored_factor(job.gpu.key, job.framework)
    return calibrated(report, factor) if factor is not None else report


def _warn_unfit(report: ThroughputReport, job: Any, plan: Any, memory: MemoryReport | None = None) -> ThroughputReport:
    """The step time of a layout whose memory estimate does not fit the GPU, with that said first: a step time alone
    reads as a plan that runs (Kimi-K2 on 7 H100 at TP1 PP1 got 264 tokens/s/GPU without a word). `memory`: the
    job's estimate where the caller made it (memory_and_throughput), else made here."""
    from meshplan.rl.memory import job_memory

    try:
        memory = memory if memory is not None else job_memory(job, plan)
    except MeshplanError:  # not estimable as memory: the throughput's own answer stands
        return report
    engine = _engine_cannot_start(memory, plan)
    if engine:
        report = report.model_copy(update={"warnings": [
            f"{engine}. The step time is what the layout would take decoding one sequence at a time.",
            *report.warnings]})
    if memory.fits:
        return report
    said = (f"This layout does not fit: its memory estimate peaks at {memory.fit_bytes / GIB:,.1f} GiB of the GPU's "
            f"{memory.capacity_bytes / GIB:,.1f} GiB (rule MEM001; `meshplan check` names layouts that fit). The step "
            "time is what the layout would take if it ran.")
    return report.model_copy(update={"warnings": [said, *report.warnings]})


def _model_throughput(job: Any, plan: Any) -> ThroughputReport:
    from meshplan.estimate.accuracy import with_band
    from meshplan.rl.step_time import job_throughput as estimate  # an RL job: the whole RL step, by part

    return with_band(estimate(job, plan), job, plan)  # the error measured in its regime (cards/accuracy.yaml)


def check_config(req: Request, *, config: ImportedConfig | None = None) -> CheckReport:
    """The rules' findings; checked from a config file (`config`, what import_config read), each fix also as edits
    of that file in its own keys and syntax (`config_fixes`)."""
    from meshplan.check.config import check_config as check
    from meshplan.request.resolve import resolve

    job, plan = resolve(script_request(req))
    report = check(job, plan)
    if config is None:
        return report
    from meshplan.adapters.read.fixes import config_fixes

    settled = _settled_beside(req, config)
    return report.model_copy(update={"config_fixes": config_fixes(config, report.findings, report.plan.model_dump()),
                                     "config_unread": config.unsupported + [
                                         line for line in config.unresolved if line not in settled],
                                     "config_assumed": [line for line in config.assumed
                                                        if not _given_beside(line.split(" = ", 1)[0], req, config)]})


def _settled_beside(req: Request, config: ImportedConfig) -> set[str]:
    """The unresolved lines the request fields given beside the file settle (ImportedConfig.left_to_request: 'num_gpus:
    the file does not say how many GPUs (pass --num-gpus)' with --num-gpus): the check ran with them, so not said."""
    return {left.said for left in config.left_to_request
            if all(_given_beside(name, req, config) for name in left.fields)}


def _given_beside(name: str, req: Request, config: ImportedConfig) -> bool:
    """Whether the request gives field `name` beside the file (a flag next to --config), so that what the file
    implies of it was not what the check ran at."""
    return name not in config.request and getattr(req, name, None) is not None


def recommend(req: Request, top_k: int = 5) -> Recommendation:
    from meshplan.rl.job import is_rl_request

    req = script_request(req)  # a launch script read once
    if is_rl_request(req):  # the whole RL step: actor layout, rollout engine, memory fraction, offloads
        from meshplan.search.rl import recommend_rl

        return recommend_rl(req, top_k=top_k)
    from meshplan.search import recommend as search

    return search(req, top_k=top_k)


def minimum_gpus(req: Request, max_gpus: int | None = None) -> MinimumGpus:
    """The smallest GPU count at which a layout passes the rules and keeps the headroom, and the best layout there."""
    from meshplan.search import minimum_gpus as scan

    req = script_request(req)  # a launch script read once
    return scan(req, max_gpus=max_gpus)


def render_config(framework: str, req: Request, *, force: bool = False, **options: Any) -> RenderResult:
    """The plan in `framework`'s own keys, after its rules: a rule error (a layout the framework rejects, or one
    that does not fit) raises `RefusedLayout` with the findings and their fixes, unless `force`; then, and for
    warnings, the findings travel in `warnings`."""
    from meshplan.adapters.render import render, request_at_version, require_target, require_variant, vet_layout
    from meshplan.check.config import check_config as check
    from meshplan.request.resolve import resolve

    require_target(framework)
    require_variant(framework, options.get("variant"))
    req = request_at_version(framework, script_request(req), options.get("version"))
    job, plan = resolve(req.model_copy(update={"framework": framework}))
    notes, warnings = vet_layout(job, plan, check(job, plan), force=force)
    result = render(framework, job, plan, **options)
    return result.model_copy(update={"notes": [*result.notes, *notes], "warnings": [*warnings, *result.warnings]})


def import_config(text: str, *, path: str = "<config_text>", framework: str | None = None,
                  config_format: str | None = None) -> ImportedConfig:
    """The request a framework config or launch script states, field by field with its line (never run)."""
    from meshplan.adapters.read import import_config as read

    return read(text, path, framework, config_format)


def import_file(path: str, *, framework: str | None = None, config_format: str | None = None) -> ImportedConfig:
    """import_config of a file on disk."""
    from meshplan.adapters.read import import_file as read

    return read(path, framework, config_format)


def request_from_config(imported: ImportedConfig, given: Mapping[str, Any] | None = None, *,
                        scan_gpus: bool = False) -> Request:
    """The Request a file states, with the fields `given` beside it (flags, tool arguments) over the file's;
    `scan_gpus` for minimum_gpus: the file's GPU count left out (the scan finds it)."""
    from meshplan.adapters.read import request_values

    # each field given checked before the file's values are laid under it (a blank model is no model given, as
    # parse_request reads it: the file's model stands)
    given = checked_fields(given or {})
    req = parse_request(request_values(imported, given, scan_gpus))
    _refused_from_the_file(req, imported, given)
    return req


def _refused_from_the_file(req: Request, imported: ImportedConfig, given: Mapping[str, Any]) -> None:
    """Raise, with the file's line, a refusal the resolver gives a field the file set (MeshplanError.fields: the MTP
    depth's, request/mtp_depth.py), where every face would otherwise say it without naming the file. Any other
    refusal is left to the operation, which words it (a search's answer, a check's finding)."""
    from meshplan.request.resolve import resolve

    try:
        resolve(script_request(req))
    except MeshplanError as exc:
        read = {name: source for name, source in imported.sources.items() if given.get(name) is None}
        if set(exc.fields) & set(read):
            raise exc.cited(read) from None


def read_log(text: str, *, path: str = "<log_text>", framework: str | None = None) -> MeasuredRun:
    """What a training log measured (peak memory, step time, throughput), each figure with its line."""
    from meshplan.adapters.logs import read_log as read

    return read(text, path, framework)


def log_file_text(path: str) -> str:
    """A log file's text for read_log or compare_run, read up to one character past what a log may hold, never whole
    (a long run's stdout can be gigabytes)."""
    from meshplan.adapters.logs import log_file_text as read

    return read(path)


def compare_run(req: Request, log_text: str, *, log_path: str = "<log_text>", calibrate: bool = False
                ) -> RunComparison:
    """The request's prediction beside what its run's log measured, with the error band of its regime. Nothing is
    fitted unless `calibrate`: then measured / predicted step time is stored as this cluster's factor (a user file,
    meshplan/knowledge/cluster_calibration.py) that every later throughput answer applies and states."""
    from meshplan.check.measured import compare_run as compare
    from meshplan.estimate.accuracy import with_band
    from meshplan.knowledge.cluster_calibration import store_ratio, stored_factor
    from meshplan.request.resolve import resolve
    from meshplan.rl.memory import job_memory

    job, plan = resolve(script_request(req))
    measured = read_log(log_text, path=log_path, framework=job.framework)
    logged, taken = measured.global_batch_size, []
    if req.global_batch_size is None and logged is not None and logged != job.global_batch_size:
        # the run's own batch where the request left it to the default: a step of the default batch is not what the
        # log timed
        job, plan = resolve(script_request(req).model_copy(update={"global_batch_size": logged}))
        taken = [f"global_batch_size not given: {logged:,} sequences, the log's ({measured.path}), not the default "
                 "batch: the step predicted is the one the log timed."]
    throughput = _model_throughput(job, plan)
    memory = with_band(job_memory(job, plan), job, plan)
    result = compare(job, memory, throughput, measured, stored_factor(job.gpu.key, job.framework))
    result = result.model_copy(update={"notes": [*taken, *result.notes]})
    if not calibrate:
        return result
    step = next(f for f in result.figures if f.figure == "step_time")
    if step.measured is None:
        raise MeshplanError(f"{log_path} states no step time or throughput: nothing to calibrate against.",
                            fix="Pass a log with iteration / step metrics lines.")
    if step.error is None:  # the log's step is another batch's (check/measured.py): its ratio is no cluster factor
        raise MeshplanError(f"{log_path} times steps of {measured.global_batch_size:,} sequences and the request "
                            f"predicts {job.global_batch_size:,}: their ratio is not this cluster's factor.",
                            fix=f"Pass global_batch_size={measured.global_batch_size} (--global-batch-size), the "
                                "log's, to calibrate against it.")
    stored = store_ratio(job.gpu.key, job.framework, step.measured / throughput.step_time_s, log_path)
    return result.model_copy(update={"stored": stored})



compare = compare_run  # `meshplan compare`'s name for the same operation
