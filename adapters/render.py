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
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jinja2
from meshplan.adapters.capabilities import adapter_section, refuse_missing, resolve_version

from meshplan.errors import MeshplanError
from meshplan.schema import Job, Plan, RenderFormat, RenderResult

Format = RenderFormat


@dataclass
class Built:
    """What a target builder hands the template (and the result)."""

    template: str
    context: dict[str, Any]
    format: Format
    filename: str
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


Builder = Callable[[Job, Plan, str, str], Built]


# --------------------------------------------------------------------------- value formatting (filters)


def _comment(value: Any) -> str:
    """One line of comment text: control characters (newlines) would end the comment in every format."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", str(value))


def hydra_value(value: Any) -> str:
    """An OmegaConf/Hydra override literal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))


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
    env.filters.update(q=lambda v: shlex.quote(str(v)), comment=_comment, hydra=hydra_value, py=repr,
                       toml=toml_value, json=lambda v: json.dumps(v, indent=2))
    return env


# --------------------------------------------------------------------------- dispatch


def _targets() -> dict[str, tuple[Builder, Callable[[Job, Plan], str]]]:
    from meshplan.adapters import megatron, rl, torchnative

    return {
        "megatron-core": (megatron.build_core, lambda job, plan: "pretrain_gpt"),
        "megatron-bridge": (megatron.build_bridge, lambda job, plan: "python"),
        "deepspeed": (megatron.build_deepspeed, megatron.deepspeed_default_variant),
        "verl": (rl.build_verl, lambda job, plan: "fsdp" if plan.zero_stage == 3 else "megatron"),
        "skyrl": (rl.build_skyrl, lambda job, plan: "fsdp" if plan.zero_stage == 3 else "rl"),
        "torchtitan": (torchnative.build_torchtitan, lambda job, plan: "cli"),
        "kempnerforge": (torchnative.build_kempnerforge, lambda job, plan: "toml"),
    }


TARGETS: tuple[str, ...] = (
    "megatron-bridge", "megatron-core", "verl", "skyrl", "torchtitan", "kempnerforge", "deepspeed",
)


def render(framework: str, job: Job, plan: Plan, *, variant: str | None = None,
           version: str | None = None) -> RenderResult:
    """The plan as `framework`'s config snippet; a knob the framework lacks is a MeshplanError."""
    if framework not in TARGETS:
        raise MeshplanError(
            f"No adapter renders {framework!r}.",
            fix=f"Render one of: {', '.join(TARGETS)} (nanotron is a memory convention only).",
        )
    builder, default_variant = _targets()[framework]
    section = adapter_section(framework)
    version = resolve_version(framework, version)
    variant = variant or default_variant(job, plan)
    if variant not in section.variants:
        raise MeshplanError(
            f"{framework} has no variant {variant!r}.",
            fix="Variants: " + "; ".join(f"{k} ({v})" for k, v in section.variants.items()) + ".",
        )
    refuse_missing(framework, version, variant, job, plan)
    built = builder(job, plan, variant, version)
    context = {"job": job, "plan": plan, "version": version, "variant": variant, **built.context}
    text = environment().get_template(built.template).render(**context)
    return RenderResult(
        framework=framework, variant=variant, version=version, format=built.format, text=text,
        filename=built.filename, plan=plan, notes=[*job.notes, *built.notes], warnings=built.warnings,
    )
