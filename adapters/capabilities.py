"""The `adapter` section of a framework card: variants, versions and the knobs each version has.

Knobs a framework lacks carry `key: null` and an `instead` saying what to do; `refuse_missing`
turns a plan that uses such a knob into a MeshplanError, so the card (not the code) decides what
a framework can express.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field

from meshplan.cards import CardError, framework_card, validate_card
from meshplan.errors import MeshplanError
from meshplan.schema import FRAMEWORKS, Job, Plan

KNOBS: tuple[str, ...] = (
    "tp", "pp", "vpp", "cp", "cp_comm_type", "ep", "etp", "sequence_parallel", "zero_0", "zero_1",
    "zero_2", "zero_3", "recompute_selective", "recompute_full", "recompute_layers", "uneven_pp",
    "micro_batch_size", "global_batch_size", "fp8", "moe_flex_dispatcher",
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Knob(_Section):
    key: str | None = Field(description="The framework's name for this knob; null when it has none")
    instead: str | None = Field(None, description="What to use when the framework lacks the knob")


class VersionSpec(_Section):
    format: str
    knobs: dict[str, Knob]


class AdapterSection(_Section):
    variants: dict[str, str] = Field(description="Variant name -> what it renders")
    default_version: str
    versions: dict[str, VersionSpec]
    variant_knobs: dict[str, dict[str, Knob]] = Field(
        default_factory=dict, description="Per-variant overrides of the version's knobs (e.g. verl's FSDP backend)"
    )
    sources: list[str]


def renderable_frameworks() -> tuple[str, ...]:
    """The frameworks whose card has an `adapter` section: the ones `render` writes a config for."""
    return tuple(name for name in FRAMEWORKS if "adapter" in (framework_card(name).model_extra or {}))


@cache
def adapter_section(framework: str) -> AdapterSection:
    """The validated `adapter` section of a framework card (cached)."""
    card = framework_card(framework)
    data = (card.model_extra or {}).get("adapter")
    if data is None:
        raise CardError(f"cards/frameworks/{framework}.yaml has no 'adapter' section.")
    section = validate_card(f"frameworks/{framework}", data, AdapterSection)
    for version, spec in section.versions.items():
        unknown = set(spec.knobs) - set(KNOBS)
        missing = set(KNOBS) - set(spec.knobs)
        if unknown or missing:
            raise CardError(
                f"cards/frameworks/{framework}.yaml adapter.versions.{version}.knobs: "
                f"unknown {sorted(unknown)}, missing {sorted(missing)}; knobs are {', '.join(KNOBS)}."
            )
        _check_knobs(framework, f"versions.{version}", spec.knobs)
    for variant, knobs in section.variant_knobs.items():
        if variant not in section.variants or set(knobs) - set(KNOBS):
            raise CardError(f"cards/frameworks/{framework}.yaml adapter.variant_knobs.{variant}: unknown variant "
                            f"or knob ({sorted(set(knobs) - set(KNOBS))}).")
        _check_knobs(framework, f"variant_knobs.{variant}", knobs)
    if section.default_version not in section.versions:
        raise CardError(f"cards/frameworks/{framework}.yaml adapter.default_version is not in versions.")
    return section


def _check_knobs(framework: str, where: str, knobs: dict[str, Knob]) -> None:
    for name, knob in knobs.items():
        if knob.key is None and not knob.instead:
            raise CardError(f"cards/frameworks/{framework}.yaml adapter.{where}.knobs.{name}: "
                            "a missing knob needs 'instead'.")


def knob_table(framework: str, version: str, variant: str) -> dict[str, Knob]:
    """The knobs of one version and variant: the version's table with the variant's overrides."""
    section = adapter_section(framework)
    return {**section.versions[version].knobs, **section.variant_knobs.get(variant, {})}


def resolve_version(framework: str, version: str | None) -> str:
    """The card's version that `version` names: exact, or the one it is a prefix of (0.2 -> 0.2.2)."""
    section = adapter_section(framework)
    if version is None:
        return section.default_version
    if version in section.versions:
        return version
    matches = [v for v in section.versions if v.startswith(version.rstrip(".x") + ".") or v == version]
    if len(matches) == 1:
        return matches[0]
    raise MeshplanError(
        f"{framework} version {version!r} is not one meshplan renders.",
        fix=f"Use one of: {', '.join(section.versions)}.",
    )


def knobs_in_use(job: Job, plan: Plan) -> list[str]:
    """The knobs a plan actually uses (a degree of 1 or an off switch uses nothing)."""
    used = ["micro_batch_size", "global_batch_size", f"zero_{plan.zero_stage}"]
    for name in ("tp", "pp", "vpp", "cp", "ep", "etp"):
        if getattr(plan, name) > 1:
            used.append(name)
    if plan.cp > 1 and plan.cp_comm_type != "p2p":
        used.append("cp_comm_type")
    if plan.sequence_parallel:
        used.append("sequence_parallel")
    if plan.recompute != "none":
        used.append(f"recompute_{plan.recompute}")
    if plan.recompute == "full" and plan.recompute_layers is not None:
        used.append("recompute_layers")
    if plan.first_stage_layers is not None or plan.last_stage_layers is not None:
        used.append("uneven_pp")
    if job.precision == "fp8":
        used.append("fp8")
    if job.model.moe is not None and plan.moe_token_dispatcher == "flex":
        used.append("moe_flex_dispatcher")
    return used


def describe_knob(name: str, plan: Plan, job: Job) -> str:
    value = {
        "zero_0": "zero_stage=0", "zero_1": "zero_stage=1", "zero_2": "zero_stage=2", "zero_3": "zero_stage=3",
        "recompute_selective": "recompute=selective", "recompute_full": "recompute=full",
        "recompute_layers": f"recompute_layers={plan.recompute_layers}",
        "uneven_pp": f"first_stage_layers={plan.first_stage_layers}, last_stage_layers={plan.last_stage_layers}",
        "fp8": "precision=fp8", "cp_comm_type": f"cp_comm_type={plan.cp_comm_type}",
        "sequence_parallel": "sequence_parallel=true", "moe_flex_dispatcher": "moe_token_dispatcher=flex",
    }.get(name)
    return value or f"{name}={getattr(plan, name, '?')}"


def refuse_missing(framework: str, version: str, variant: str, job: Job, plan: Plan) -> None:
    """Raise for the first knob the plan uses that this framework version and variant cannot express."""
    table = knob_table(framework, version, variant)
    display = framework_card(framework).display_name
    for name in knobs_in_use(job, plan):
        knob = table[name]
        if knob.key is None:
            raise MeshplanError(
                f"{display} {version} ({variant}) cannot express {describe_knob(name, plan, job)}: "
                "it has no such knob.",
                fix=knob.instead,
            )
