"""check_config: runs every rule of cards/rules.yaml that applies to the job's framework over one plan.

Structural rules are pure arithmetic (the conditions in meshplan/rules/) and run first; with
`include_memory=False` they are all that runs, which is what the search calls thousands of times. The
memory rules (meshplan/check/memory.py) read one estimate of the plan; when it does not fit, the fix is computed
by re-estimating a short list of nearby layouts and naming the ones that fit (meshplan/check/alternatives.py), so
the advice is a number, not a slogan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from meshplan.arithmetic.mesh import own_ep_ranks_note
from meshplan.check.split import framework_options, split_choice, split_words, with_option
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import memory_summary
from meshplan.knowledge.adapter_knobs import default_render, missing_knob
from meshplan.rl.memory import job_memory
from meshplan.rules.engine import Context, EstimateBlocked, finding, rules_for, verdicts
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import CheckReport, Finding, MemorySummary


def check_config(job: Job, plan: Plan, *, include_memory: bool = True) -> CheckReport:
    """Every applicable rule over the plan; `ok` is False when any finding is an error."""
    findings = verdicts(job).findings(job, plan)  # the structural rules in card order (rules/engine.py Verdicts)
    next_steps: list[str] = []
    structural_error = any(f.severity == "error" for f in findings)
    memory: MemorySummary | None = None
    if include_memory:
        findings = [as_user_reads(job, plan, f) for f in findings]
        memory, note = _memory_findings(Context(job, plan), findings)
        next_steps.extend(filter(None, [note, own_ep_ranks_note(job, plan)]))  # the memory report warns it too
    ok = not any(f.severity == "error" for f in findings)
    refusal = _render_refusal(job, plan) if ok and include_memory else None  # the search's structural form skips it
    next_steps.extend(_next_steps(ok, structural_error, findings, refusal))
    return CheckReport(ok=ok, framework=job.framework, model=job.model.name, plan=plan, findings=findings,
                       memory=memory, next_steps=next_steps)


def check_structure(job: Job, plan: Plan) -> list[Finding]:
    """Only the structural findings (no memory estimate): the cheap form the search prunes with."""
    return check_config(job, plan, include_memory=False).findings


class StructuralCheck:
    """check_config without the memory rules (check_structure's report: what the search prunes with), and
    `first_error_of` / `first_errors_over`: the first error among its findings, without building the report."""

    def __call__(self, job: Job, plan: Plan) -> CheckReport:
        return check_config(job, plan, include_memory=False)

    @staticmethod
    def first_error_of(job: Job, knobs: dict[str, Any], base: Plan | None, build: Callable[[], Plan]) -> Finding | None:
        """The first error of check_structure(job, build()) from the kept verdicts, without building the plan where
        they are kept (Verdicts.first_error_of: the plan's values are base's, a plan that differs from it in the knobs
        only, with the knobs)."""
        return verdicts(job).first_error_of(job, knobs, base, build)

    @staticmethod
    def first_errors_over(job: Job, variants: list[dict[str, Any]], base: Plan | None,
                          builds: list[Callable[[], Plan]]) -> list[Finding | None]:
        """first_error_of of each of plans that differ from one another in a few knobs (Verdicts.first_errors_over:
        the rules that read none of the knobs that differ are asked once)."""
        return verdicts(job).first_errors_over(job, variants, base, builds)


def _render_refusal(job: Job, plan: Plan) -> str | None:
    """What `render` says where the config it writes by default has no key for a setting the plan uses beyond its
    layout (AD001 refuses the layout's own knobs; fp8 on verl's engines is render's refusal alone), in render's words
    (adapters/capabilities.refuse_missing: the same card function), or None where it writes them all."""
    target = default_render(job.card, job, plan)
    if target is None:
        return None
    missing = missing_knob(job.card, *target, job, plan)
    if missing is None:
        return None
    version, variant = target
    return (f"{job.card.display_name} {version} ({variant}) cannot express {missing.setting}: {missing.reason} "
            f"({missing.instead.rstrip('.')})")


def _next_steps(ok: bool, structural_error: bool, findings: list[Finding],
                render_refusal: str | None = None) -> list[str]:
    if structural_error:
        ids = ", ".join(sorted({f.id for f in findings if f.severity == "error"}))
        return [f"Fix the errors ({ids}) with the values their fix names, then run `meshplan check` again; "
                "`meshplan recommend` lists layouts that pass every rule."]
    if not ok:  # only memory rules failed: name the ones that did, each with what its fix offers
        ids = sorted({f.id for f in findings if f.severity == "error"})
        if ids == ["MEM001"]:
            return ["Apply one of the layouts the MEM001 fix names, or run `meshplan recommend` for the fastest one "
                    "that fits."]
        return [f"Apply the fix{'es' if len(ids) > 1 else ''} of {', '.join(ids)}, then run `meshplan check` again; "
                "`meshplan recommend` lists layouts that fit."]
    if render_refusal is not None:  # the layout runs, but render refuses a setting: said here, not promised
        return ["The layout passes every rule of its framework: `meshplan throughput` predicts its speed; "
                f"`meshplan render` refuses it: {render_refusal}."]
    return ["The layout passes every rule of its framework: `meshplan throughput` predicts its speed, "
            "`meshplan render` writes it in the framework's own keys."]


def as_user_reads(job: Job, plan: Plan, found: Finding) -> Finding:
    """A finding as check gives it to a user: PP001's fix with the split recommend ranks first (_ranked_split), any
    other as the rule wrote it. The estimators' refusals (api: EstimateBlocked) are worded through it too, so memory,
    throughput and report name the same fix as check for the same layout."""
    return _ranked_split(job, plan, found) if found.id == "PP001" else found


@contextmanager
def refused_as_check_words(job: Job, plan: Plan) -> Iterator[None]:
    """An estimate a rule refuses (EstimateBlocked), re-raised with the finding as check words it (as_user_reads), so
    memory, throughput and report (meshplan/api.py) name the fix check names for the same layout."""
    try:
        yield
    except EstimateBlocked as exc:
        worded = as_user_reads(job, plan, exc.finding)
        if worded is exc.finding:
            raise
        raise EstimateBlocked(worded) from None


def _ranked_split(job: Job, plan: Plan, found: Finding) -> Finding:
    """PP001's fix naming the split recommend ranks first for this layout (split.split_choice, what MEM001's deeper
    pipelines name too) in place of the rule's arithmetic one. Where no split fits at the layout's other settings,
    the fastest split the rules pass, said not to fit (else the fix named only the pp that split evenly: DeepSeek-V3's
    61 layers at pp=16 vpp=2 on Megatron-Bridge got "pp in {1}", though its recipes run pp=16 with a layout string);
    as it was where no split passes the rules."""
    even = found.fix.split("; or keep")[0].rstrip(".")
    choice = split_choice(job, plan)
    if choice is None:
        return _split_pipeline_rules_pass(job, plan, found, even)
    if choice.fits:
        return found.model_copy(update={"fix": f"{even}; or keep pp={plan.pp} with the split recommend ranks first "
                                               f"for this layout: {split_words(choice.plan)}."})
    need = choice.fit_bytes / 2**30
    return found.model_copy(update={"fix": (
        f"{even}; or keep pp={plan.pp} with a split the rules pass, the fastest: {split_words(choice.plan)}. No split "
        f"fits this layout's memory as it stands (that one needs {need:,.1f} GiB of "
        f"{job.gpu.memory_bytes / 2**30:,.1f} GiB): with it set, MEM001's fix names what clears it.")})


def _split_pipeline_rules_pass(job: Job, plan: Plan, found: Finding, even: str) -> Finding:
    """PP001's fix where no split can be estimated at this layout, because another rule refuses every one of them
    (Kimi-K2's 61 layers at pp=16 with etp=2 on 256 GPUs: WS002): the first of the search's splits at this pp and vpp
    that the pipeline rules (PP*) pass, so the fix still names one that works once the other errors are fixed, rather
    than only the pp that splits evenly (pp in {1} for a prime layer count)."""
    for option in framework_options(job, plan.pp):
        if option.vpp != plan.vpp:
            continue
        candidate = with_option(plan, option)
        if not any(f.severity == "error" and f.id.startswith("PP") for f in verdicts(job).findings(job, candidate)):
            return found.model_copy(update={"fix": (
                f"{even}; or keep pp={plan.pp} with a split the pipeline rules pass: {split_words(candidate)} (which "
                "split is fastest is estimated once the layout's other errors are fixed).")})
    return found


# --------------------------------------------------------------------------- memory rules


def _memory_findings(ctx: Context, findings: list[Finding]) -> tuple[MemorySummary | None, str]:
    """Estimate once, then run the memory rules (meshplan/check/memory.py) over the estimate; nonsense layouts get a
    note instead."""
    try:
        report = job_memory(ctx.job, ctx.plan)  # an RL job: the peak over its phases
    except EstimateBlocked as exc:  # already a finding above: name it, do not repeat it
        return None, f"Memory not estimated until {exc.rule_id} ({exc.finding.title}) is fixed."
    except MeshplanError as exc:
        return None, f"Memory not estimated: {exc.reason}"
    with_memory = replace(ctx, memory_report=report)
    for spec, condition in rules_for(ctx.framework, ctx.backend, True):
        if spec.memory:
            values = condition(with_memory)
            if values is not None:
                findings.append(finding(spec, values))
    return memory_summary(report), ""
