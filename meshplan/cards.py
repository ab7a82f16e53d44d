"""Loads the YAML cards (the repo's cards/ folder, installed as `meshplan.cards_data`) and validates them.

Cards are the single source of truth for the knowledge meshplan uses; a malformed card must fail
loudly, naming the file, the key and what is wrong, instead of producing a wrong number later.
Each card is parsed once per process (cached).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from meshplan.card_files import card_names, card_root, framework_names
from meshplan.errors import MeshplanError
from meshplan.schema import GpuSpec

T = TypeVar("T", bound=BaseModel)

# libyaml's parser when PyYAML was built with it: the same safe loader (same resolvers, same values), ~10x
# faster, which is most of what the first estimate of a process pays to read the rules card.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class CardError(MeshplanError):
    """A card file that does not match its schema."""


def card_text(name: str) -> str:
    """Raw YAML of one card (what MCP resources serve)."""
    if name not in card_names():
        raise CardError(f"No card named {name!r}.", fix=f"Known cards: {', '.join(card_names())}.")
    return card_root().joinpath(*f"{name}.yaml".split("/")).read_text(encoding="utf-8")


@cache
def read_card(name: str) -> Any:
    """Parsed YAML of one card, cached."""
    text = card_text(name)
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise CardError(f"cards/{name}.yaml is not valid YAML: {exc}") from None


def _format_validation(name: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors()[:10]:
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  key {where}: {err['msg']} (got {err.get('input')!r:.80})")
    return f"cards/{name}.yaml does not match its schema:\n" + "\n".join(lines)


def validate_card(name: str, data: Any, schema: type[T]) -> T:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise CardError(_format_validation(name, exc)) from None


_cache: dict[tuple[str, type], Any] = {}


def load_card(name: str, schema: type[T]) -> T:
    """One card, validated against `schema`, cached per (card, schema)."""
    key = (name, schema)
    if key not in _cache:
        _cache[key] = validate_card(name, read_card(name), schema)
    return _cache[key]


# --------------------------------------------------------------------------- card schemas owned here


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishedCounts(_Card):
    total: int | None = Field(None, description="Published total, as rounded by its authors")
    total_rounding: int | None = Field(None, description="Half a unit of the last published digit")
    non_embedding: int | None = Field(None, description="Published total without embedding and head")
    non_embedding_rounding: int | None = None
    active: int | None = None
    active_rounding: int | None = None
    active_convention: (
        Literal["active", "active_excl_input_embedding", "active_non_embedding"] | None
    ) = None
    tolerance_note: str | None = Field(
        None, description="Why the exact count sits outside the rounding (e.g. a vision tower in the total)"
    )
    extra_tolerance: int = Field(0, ge=0, description="Params the published total counts that we do not")
    active_tolerance_note: str | None = None
    active_extra_tolerance: int = Field(0, ge=0)
    text: str
    source: str


class ModelCard(_Card):
    key: str
    name: str
    hf_id: str | None = None
    aliases: list[str] = []
    family: str
    config: dict[str, Any] = Field(description="Hugging Face config.json fields (the text part for multimodal)")
    published: PublishedCounts
    sources: list[str]
    notes: list[str] = []


class HardwareCard(_Card):
    description: str
    gpus: list[GpuSpec]


def model_card_names() -> list[str]:
    return [n.split("/", 1)[1] for n in card_names() if n.startswith("models/")]


def model_card(key: str) -> ModelCard:
    card = load_card(f"models/{key}", ModelCard)
    if card.key != key:
        raise CardError(f"cards/models/{key}.yaml: key {card.key!r} does not match its file name {key!r}.")
    return card


class FrameworkDefaults(_Card):
    zero_stage: int = Field(ge=0, le=3)
    sequence_parallel_when_tp: bool = True


class FrameworkCard(_Card):
    """What meshplan assumes about one training framework; the adapters' knob tables extend it."""

    model_config = ConfigDict(extra="allow")  # adapter-specific sections (keys, capabilities) live here too

    name: str
    display_name: str
    version: str
    world_size_law: Literal["megatron", "torchtitan", "kempnerforge"]
    memory_convention: Literal["megatron", "deepspeed", "fsdp2", "nanotron"]
    defaults: FrameworkDefaults
    sources: list[str]
    notes: list[str] = []


def framework_card(name: str) -> FrameworkCard:
    if name not in framework_names():
        raise CardError(f"No framework card {name!r}.", fix=f"Known: {', '.join(framework_names())}.")
    card = load_card(f"frameworks/{name}", FrameworkCard)
    if card.name != name:
        raise CardError(f"cards/frameworks/{name}.yaml: name {card.name!r} does not match its file name.")
    return card
