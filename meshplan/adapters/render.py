"""render(framework, job, plan): the plan as a snippet the framework accepts, with notes and warnings.

Each target module computes the framework's own keys from the plan (pure functions, no I/O);
a Jinja template per target lays them out. StrictUndefined makes a missing template variable an
error instead of an empty string, and every user-controlled string that reaches a shell snippet
passes through `shlex.quote` (the `q` filter), so a hostile model name cannot inject a command.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import jinja2

from meshplan.adapters import automodel, megatron, rl, torchnative
from meshplan.adapters.capabilities import refuse_missing, renderable_frameworks, resolve_version
from meshplan.adapters.common import Builder
from meshplan.arithmetic.mesh import rl_job_gpus
from meshplan.check.headline import layout_text
from meshplan.core.errors import MeshplanError, closest
from meshplan.core.units import either_or, gib
from meshplan.knowledge.adapter_knobs import (
    DEFAULT_VARIANTS,
    adapter_section,
    engine_variant,
    knob_table,
    variant_engine,
)
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.releases import resolve_release
from meshplan.request.parse import parse_request
from meshplan.rl.memory import critic_apart
from meshplan.rules.engine import memory_rules, unwritable_rules
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import CheckReport, MemorySummary, RenderResult, finding_line
from meshplan.schema.request import Request

# --------------------------------------------------------------------------- value formatting (filters)


def _comment(value: Any) -> str:
    """One line of comment text: control characters (newlines) would end the comment in every format."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", str(value))


# Words Hydra's grammar or OmegaConf's YAML reader turn into a bool, None or a float when bare (any case).
_RESERVED = frozenset({"null", "true", "false", "yes", "no", "on", "off", "nan", "inf"})


def _bare(text: str) -> bool:
    """A string both readers keep as that string when it is written unquoted."""
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", text)) and text.lower() not in _RESERVED


def _omegaconf_literal(text: str) -> str:
    r"""`text` with `${` made literal: OmegaConf resolves `${...}` in any string value, and reads `\${` as a
    literal one (a run of backslashes before it halves, so it is doubled first)."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)


def hydra_value(value: Any) -> str:
    """An override value for Hydra's grammar (verl, Megatron-Bridge's run_recipe.py) that reads back as `value`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    return text if _bare(text) else hydra_quoted(text)


def hydra_quoted(text: str) -> str:
    r"""`text` as a quoted Hydra override value that Hydra (1.1+ grammar), then OmegaConf, read back as `text`.

    Inside quotes Hydra keeps a backslash as it is, except a run of backslashes that ends at a quote (an
    escaped one or the closing one): that run is halved. So only those runs are doubled here; doubling
    every backslash, as a Python literal would, hands the framework `C:\\dir` for `C:\dir`.
    """
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", _omegaconf_literal(text))
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text) + "'"


def dotlist_value(value: Any) -> str:
    """An override value for `OmegaConf.from_cli` (SkyRL), which reads each right-hand side as a YAML scalar.

    YAML's single quotes take no backslash escapes, so Hydra's quoting does not carry over; a JSON string
    is a YAML scalar, and SkyRL serialises its own overrides that way (config.py, overrides_dict_to_dotlist).
    """
    if value is None or isinstance(value, (bool, int, float)):
        return hydra_value(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dotlist_value(v) for v in value) + "]"
    text = str(value)
    return text if _bare(text) else json.dumps(_omegaconf_literal(text), ensure_ascii=False)


def toml_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))


def yaml_value(value: Any) -> str:
    """A YAML flow value that reads back as `value` (JSON's scalars and lists are YAML's; null for None)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    return json.dumps(value)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("meshplan.adapters", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters.update(q=lambda v: shlex.quote(str(v)), comment=_comment, hydra=hydra_value, dotlist=dotlist_value,
                       py=repr, toml=toml_value, yaml=yaml_value, json=lambda v: json.dumps(v, indent=2))
    return env


# --------------------------------------------------------------------------- dispatch


# Each renderable framework's builder and its default variant for a job and plan (the card-reading layer's,
# knowledge/adapter_knobs.py, which rule AD001 asks too).
BUILDERS: dict[str, tuple[Builder, Callable[[Job, Plan], str]]] = {
    "megatron-core": (megatron.build_core, DEFAULT_VARIANTS["megatron-core"]),
    "megatron-bridge": (megatron.build_bridge, DEFAULT_VARIANTS["megatron-bridge"]),
    "deepspeed": (megatron.build_deepspeed, DEFAULT_VARIANTS["deepspeed"]),
    "verl": (rl.build_verl, DEFAULT_VARIANTS["verl"]),
    "skyrl": (rl.build_skyrl, DEFAULT_VARIANTS["skyrl"]),
    "torchtitan": (torchnative.build_torchtitan, DEFAULT_VARIANTS["torchtitan"]),
    "kempnerforge": (torchnative.build_kempnerforge, DEFAULT_VARIANTS["kempnerforge"]),
    "nemo-automodel": (automodel.build_automodel, DEFAULT_VARIANTS["nemo-automodel"]),
}


# The frameworks whose card has an `adapter` section, in the order of schema.FRAMEWORKS: the card decides
# what renders (tests/test_adapters.py checks that each has a builder above, and each builder a card).
TARGETS: tuple[str, ...] = renderable_frameworks()


def require_target(framework: str) -> None:
    """Refuse a framework no adapter renders, naming the closest one and only those that render."""
    if framework in TARGETS:
        return
    if framework in FRAMEWORKS:
        reason, near = " (it is a memory convention only: meshplan estimates it but writes no config)", []
    else:
        reason, near = "", closest(framework, TARGETS, n=1)
    raise MeshplanError(
        f"No adapter renders {framework!r}{reason}.",
        fix=(f"Did you mean {near[0]!r}? " if near else "") + f"meshplan renders: {', '.join(TARGETS)}.",
    )


# --------------------------------------------------------------------------- the rules before rendering


def peak_words(memory: MemorySummary) -> str:
    """The peak that decides the fit, labelled reserved (the caching allocator's reserve included) or, with
    expandable segments, allocated (then it decides, and the reserved one is named beside it)."""
    where = f"per GPU (stage {memory.peak_stage}"
    if memory.fit_basis == "allocated":
        return (f"an allocated peak of {gib(memory.fit_bytes)} {where}; {gib(memory.peak_bytes)} reserved, but with "
                "expandable segments the allocated peak decides the fit)")
    return f"a reserved peak of {gib(memory.peak_bytes)} {where}, which decides the fit)"


class RefusedLayout(MeshplanError):
    """A layout that breaks a rule of its framework: `render` writes it only when forced."""

    def __init__(self, job: Job, plan: Plan, report: CheckReport):
        self.report = report
        self.findings = [f for f in report.findings if f.severity == "error"]
        ids = [f.id for f in self.findings]
        why = []
        if set(ids) - memory_rules() - unwritable_rules():
            why.append(f"{job.framework} would reject it")
        if set(ids) & unwritable_rules():
            why.append(f"the {job.framework} config meshplan writes has no key for a setting it uses")
        memory = report.memory
        if memory is not None and not memory.fits:
            why.append(f"it does not fit: {peak_words(memory)} against {gib(memory.capacity_bytes)} of memory")
        else:  # a memory rule of its own where the step fits (RL006: the rollout engine cannot start): its title
            why += [f.title for f in self.findings if f.id in memory_rules() and f.title]
        headline = (f"Not rendered: {job.model.name} {layout_text(report)} on {job_gpus_words(job, plan)} x "
                    f"{job.gpu.name} breaks "
                    f"{len(ids)} rule{'s' if len(ids) > 1 else ''} ({', '.join(ids)}): {' and '.join(why)}.")
        fix = ("Apply the fixes above, or take a layout from `meshplan recommend`, which passes every rule; to write "
               "this one anyway, pass --force (MCP: force=true).")
        super().__init__("\n".join([headline, *("  " + finding_line(f) for f in self.findings)]), fix=fix)
        self.args = (f"{self.reason}\nFix: {fix}",)  # the fix on a line of its own, after the findings' own


def vet_layout(job: Job, plan: Plan, report: CheckReport, *, force: bool = False) -> tuple[list[str], list[str]]:
    """(notes, warnings) from the framework's rules over the plan; a rule error refuses it unless `force`.

    Warnings (low memory headroom, a slow layout) never block: they are handed on with the snippet.
    """
    errors = [f for f in report.findings if f.severity == "error"]
    if errors and not force:
        raise RefusedLayout(job, plan, report)
    warnings = [finding_line(f) for f in report.findings if f.severity != "info"]
    if errors:
        broken = ", ".join(f.id for f in errors)
        warnings.insert(0, f"Rendered because force was given, although the layout breaks {broken}: expect the "
                           "framework to reject it or run out of memory.")
    return [finding_line(f) for f in report.findings if f.severity == "info"], warnings


def refuse_other_engine(framework: str, version: str, variant: str, job: Job, plan: Plan) -> None:
    """A variant that runs another engine than the one the plan's ZeRO stage selects (verl's and SkyRL's zero_stage 3
    is their FSDP engine) is refused: check and the estimates took the plan on that engine, so the config would run
    one meshplan never checked (verl's variant megatron at zero_stage 3 wrote Megatron-FSDP for an FSDP2 estimate)."""
    card = framework_card(framework)
    engine, planned = variant_engine(framework, variant), card.engine_at(plan.zero_stage)
    if engine is None or engine == planned:
        return
    table = knob_table(card, version, variant)
    stages = [z for z in range(4) if card.engine_at(z) == engine and table[f"zero_{z}"].key]
    raise MeshplanError(
        f"Variant {variant} runs {card.display_name}'s {engine} engine, but zero_stage {plan.zero_stage} selects its "
        f"{planned} engine, which meshplan checked and estimated this plan on.",
        fix=f"Use variant {engine_variant(card, job, plan)} (or leave variant out) for zero_stage "
            f"{plan.zero_stage}, or zero_stage {either_or(stages)} with variant {variant}.")


def job_gpus_words(job: Job, plan: Plan) -> str:
    """The GPU count a rendered file's header names: the job's, which for an RL job placed apart is more than the
    trainer's (Job.num_gpus): the policy's, PPO's critic's where it runs on its own, and the rollout engine's
    (arithmetic/mesh.rl_job_gpus). SkyRL PPO on 24 GPUs read '# Qwen3-8B on 8 x NVIDIA H100'."""
    if job.rl is None or plan.placement != "separate":
        return str(job.num_gpus)
    apart = critic_apart(job, plan)
    total = rl_job_gpus(job.num_gpus, apart, plan.placement, plan.rollout_gpus)
    critic = f", PPO's critic {job.num_gpus}" if apart else ""
    return f"{total} (the trainer's {job.num_gpus}{critic}, the rollout engine's {plan.rollout_gpus})"


def render(framework: str, job: Job, plan: Plan, *, variant: str | None = None,
           version: str | None = None) -> RenderResult:
    """The plan as `framework`'s config snippet; a knob the framework lacks is a MeshplanError."""
    require_target(framework)
    builder, default_variant = BUILDERS[framework]
    card = framework_card(framework)
    section = adapter_section(card)
    if version is None and job.framework_version in section.versions:  # the release the request named
        version = job.framework_version
    version = resolve_version(framework, version)
    variant = require_variant(framework, variant or default_variant(card, job, plan))
    refuse_other_engine(framework, version, variant, job, plan)
    refuse_missing(framework, version, variant, job, plan)
    built = builder(job, plan, variant, version)
    env, note = allocator_setting(framework, job, plan, built.format == "shell" or built.exports_env)
    context = {"job": job, "plan": plan, "version": release_written(job, version), "variant": variant,
               "allocator_env": env, "job_gpus": job_gpus_words(job, plan), **built.context}
    text = environment().get_template(built.template).render(**context)
    return RenderResult(
        framework=framework, variant=variant, version=version, format=built.format, text=text,
        filename=built.filename, plan=plan,
        notes=[*job.notes, *built.notes, *note, *release_check_note(job, version)], warnings=built.warnings,
    )


def release_written(job: Job, version: str) -> str:
    """The release a config's header names: the one the request asked where its facts stood in for it (a request for
    Megatron-LM 0.15 is written in 0.19.2's keys, yet PR009 let te through as 0.15 takes it: a header saying only
    0.19.2 named a release that refuses the file)."""
    asked = job.framework_version_asked
    return version if asked is None else f"{asked} in {version}'s keys"


def release_check_note(job: Job, version: str) -> list[str]:
    """How to check the file for the release asked: no config names its framework release, so check reads an imported
    file as the newest release's unless framework_version is given beside it."""
    asked = job.framework_version_asked
    if asked is None:
        return []
    return [f"The file names no release: check it with framework_version {asked} beside it (without it, check reads "
            f"it as {job.card.display_name} {version}'s)."]


def require_variant(framework: str, variant: str | None) -> str | None:
    """The variant, refused unless the framework's adapter writes it (None: the default, chosen per plan); api's
    render_config asks first, so a misspelt variant is named before the layout's rules run."""
    variants = adapter_section(framework_card(framework)).variants
    if variant is not None and variant not in variants:
        raise MeshplanError(
            f"{framework} has no variant {variant!r}.",
            fix="Variants: " + "; ".join(f"{k} ({v})" for k, v in variants.items()) + ".",
        )
    return variant


ALLOCATOR_ENV = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def allocator_setting(framework: str, job: Job, plan: Plan, shell: bool) -> tuple[str | None, list[str]]:
    """(env line for a shell snippet, notes): Plan.expandable_segments where the job's launcher takes it (its card's
    allocator for an RL or a training job: verl's SFT trainer sets none, its RL workers do). A shell snippet exports
    it; elsewhere a note says where it goes (the framework's launcher or workers, its card's allocator)."""
    facts = framework_card(framework).allocator_for(job.rl is not None)
    sets_it = facts is not None and facts.expandable_segments
    if not plan.expandable_segments:
        return None, ([f"expandable_segments=false, but {framework} launches with it ({facts.how}): unset it there "
                       "for the memory this estimate assumes."] if sets_it else [])
    if shell:
        return ALLOCATOR_ENV, []
    if sets_it and not facts.launch_script:  # its workers set it, no key: the resolver's note says so
        return None, []  # (request/resolve._expandable_segments), once
    where = facts.how if sets_it else f"export {ALLOCATOR_ENV} before the launch (the framework does not set it)"
    return None, [f"expandable_segments=true: {where}; the fit is decided by the allocated peak."]


def request_at_version(framework: str, req: Request, version: str | None) -> Request:
    """The request at the version the config is written for: its facts (memory convention, knobs) vet the layout,
    so a torchtitan 0.2 config is not passed on 0.3's chunked loss. A framework_version naming another release is
    an error, not a silent choice between them."""
    if version is None or req.framework_version == version:
        return req
    if req.framework_version is None:
        return parse_request({**req.model_dump(exclude_unset=True), "framework_version": version})
    card = framework_card(framework)
    asked, given = resolve_release(card, version).release, resolve_release(card, req.framework_version).release
    if asked != given:
        raise MeshplanError(
            f"Two different {card.display_name} versions given: framework_version {req.framework_version!r} "
            f"(release {given}) and the render version {version!r} (release {asked}).",
            fix="Give the version once: the config is written for the release the estimate and the rules read.")
    return req
