"""The `adapter` section of a framework card: variants, versions and the knobs each version has.

Knobs a framework lacks carry `key: null` and an `instead` saying what to do; `refuse_missing`
turns a plan that uses such a knob into a MeshplanError, so the card (not the code) decides what
a framework can express.
"""

from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_card import ADAPTER_KNOBS
from meshplan.knowledge.adapter_knobs import adapter_section, missing_knob
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.releases import resolve_release
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Job, Plan

KNOBS: tuple[str, ...] = ADAPTER_KNOBS


def renderable_frameworks() -> tuple[str, ...]:
    """The frameworks whose card has an `adapter` section: the ones `render` writes a config for."""
    return tuple(name for name in FRAMEWORKS if framework_card(name).renderable)


def resolve_version(framework: str, version: str | None) -> str:
    """The adapter version that renders `version`: the known release whose facts apply to it (the card's resolver,
    knowledge/releases.py: 0.2 or 0.2.0+cu128 -> 0.2.2), which must be one the adapter writes."""
    section = adapter_section(framework_card(framework))
    if version is None:
        return section.default_version
    if version in section.versions:
        return version
    release = resolve_release(framework_card(framework), version).release
    if release in section.versions:
        return release
    raise MeshplanError(
        f"{framework} version {version!r} stands for release {release}, which meshplan estimates but writes no "
        "config for.", fix=f"Render one of: {', '.join(section.versions)} (or leave the version out).",
    )


def refuse_missing(framework: str, version: str, variant: str, job: Job, plan: Plan) -> None:
    """Raise for the first knob the plan uses that this framework version and variant cannot express (the same
    function rule AD001 asks, knowledge/adapter_knobs.py missing_knob)."""
    card = framework_card(framework)
    missing = missing_knob(card, version, variant, job, plan)
    if missing is not None:
        display = card.display_name
        raise MeshplanError(
            f"{display} {version} ({variant}) cannot express {missing.setting}: {missing.reason}.", fix=missing.instead,
        )
