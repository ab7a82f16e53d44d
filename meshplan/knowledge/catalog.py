"""The model catalog (cards/models/) and the one look-up every face uses: `resolve_model` takes a catalog key, a
Hugging Face id or alias (fine-tuned variants included), a config.json path, a size or a launch script's
architecture flags (knowledge/flag_models.py); `describe_model` reports its
exact parameter counts under each vendor's convention, beside the published ones.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from pathlib import Path

from meshplan.core import server_files
from meshplan.core.errors import MeshplanError, closest
from meshplan.knowledge.cards import ModelCard, model_card, model_card_names
from meshplan.knowledge.families_card import FamilyType, families_card
from meshplan.knowledge.flag_models import NAME, flags_architecture, flags_report
from meshplan.knowledge.generic_models import generic_architecture, parse_size
from meshplan.knowledge.model_config import (
    architecture_from_config,
    architecture_from_file,
    architecture_from_text,
    is_config_text,
)
from meshplan.knowledge.model_counts import count_components, mtp_params, vision_params
from meshplan.knowledge.section_models import NAME as SECTION_NAME
from meshplan.knowledge.section_models import section_architecture, section_report
from meshplan.schema.model import Architecture, ComponentCount, ModelReport, ModelSummary


def family_type(family: str) -> FamilyType | None:
    """The model_type a family name is built as (exact: `leaves_out` None; nearest: what it misses), or None where
    meshplan has none."""
    card = families_card()
    return card.families.get(family) or card.nearest.get(family)


# Fine-tuned variants share their base model's architecture: "-Instruct", "-Base", "-Chat", Gemma's "-it".
_VARIANT_RE = re.compile(r"[-_](instruct|base|chat|it)(?=$|[-_.])", re.IGNORECASE)


def _without_variant(name: str) -> tuple[str, list[str]]:
    """'meta-llama/llama-3.1-8b-instruct' -> ('meta-llama/llama-3.1-8b', ['instruct'])."""
    return _VARIANT_RE.sub("", name), [m.group(1) for m in _VARIANT_RE.finditer(name)]


@cache
def _catalog_index() -> dict[str, str]:
    """Lower-cased key, hf_id and alias, and the repository name of each id without its organisation
    ('meta-llama-3-70b' for meta-llama/Meta-Llama-3-70B) when only one card has it -> catalog key."""
    index: dict[str, str] = {}
    bare: dict[str, set[str]] = {}
    for key in model_card_names():
        card = model_card(key)
        for name in [card.key, card.hf_id, *card.aliases]:
            if name:
                index[name.lower()] = card.key
                if "/" in name:
                    bare.setdefault(name.rsplit("/", 1)[1].lower(), set()).add(card.key)
    for name, keys in bare.items():
        if len(keys) == 1 and name not in index:
            index[name] = next(iter(keys))
    return index


@cache
def _variant_index() -> dict[str, str]:
    """Every catalog name with its variant words removed -> catalog key (names two cards share are left out)."""
    found: dict[str, set[str]] = {}
    for name, key in _catalog_index().items():
        found.setdefault(_without_variant(name)[0], set()).add(key)
    return {name: next(iter(keys)) for name, keys in found.items() if len(keys) == 1}


@cache
def catalog_architecture(key: str) -> Architecture:
    card = model_card(key)
    return architecture_from_config(card.config, name=card.name, key=card.key, hf_id=card.hf_id, origin="catalog")


VARIANT_ORIGIN = "catalog card {key}, read as a fine-tuned variant"


def _variant_architecture(key: str, requested: str) -> Architecture:
    """The catalog architecture under the name asked for, saying which card it comes from: a fine-tune keeps
    its base model's shapes and parameter count, so the card's counts and published figures apply."""
    arch = catalog_architecture(key)
    return arch.model_copy(update={
        "name": f"{requested} (architecture of {arch.name})",
        "origin": VARIANT_ORIGIN.format(key=key),
    })


def catalog_keys() -> list[str]:
    return model_card_names()


# The longest model name or path read as one: Linux's PATH_MAX (limits.h, 4096 bytes), which no catalog key, Hugging
# Face id (96 characters at most) or size comes near. A longer value (Request.model takes 1 MiB, for a config.json's
# text) is refused before the path probes and the did-you-mean, which took a second over a pasted 1 MiB name.
MAX_MODEL_NAME_CHARS = 4096


def _name_too_long(name: str) -> MeshplanError:
    return MeshplanError(
        f"The model {name[:80]!r}... is {len(name):,} characters long: a model's name, Hugging Face id or path is at "
        f"most {MAX_MODEL_NAME_CHARS:,}.",
        fix="Name the model by a catalog key (meshplan models), a Hugging Face id or a size such as '70B', or give "
        "its config.json: the file's path, or its text itself (a JSON object, starting with '{').")


def _looks_like_path(name: str) -> bool:
    if name.endswith(".json") or name.startswith((".", "~")):
        return True
    if "/" not in name:
        return False
    # a remote caller's absolute path is refused by server_path, never probed: whether it exists is the server's
    return (server_files.confined() and name.startswith("/")) or server_files.exists(name)


def resolve_model(name: str) -> Architecture:
    """A catalog key, HF id or alias (case-insensitive, Instruct/Base/Chat variants included), a path to a
    config.json (re-read when the file changes) or a config.json's text (a JSON object), a size such as '70B', or a
    launch script's architecture flags ('megatron-core flags: --num-layers 40 ...', what `meshplan import` states for
    a model no catalog card has), or a config section's ('kempnerforge model section: dim=5120 ...',
    knowledge/section_models.py)."""
    if not isinstance(name, str) or not name.strip():
        raise MeshplanError("model must be a non-empty string.", fix="Try 'meshplan models' for the catalog.")
    name = name.strip()
    key = _catalog_index().get(name.lower())
    if key:
        return catalog_architecture(key)
    if NAME.match(name):
        return flags_architecture(name)
    if SECTION_NAME.match(name):
        return section_architecture(name)
    if is_config_text(name):
        return architecture_from_text(name)
    if len(name) > MAX_MODEL_NAME_CHARS:
        raise _name_too_long(name)
    if _looks_like_path(name):
        try:
            path = server_files.server_path(name, "model").expanduser()
        except RuntimeError as exc:  # '~user' for a user this machine does not know
            raise MeshplanError(f"Cannot expand the home directory in {name[:200]!r}: {exc}",
                                fix="Give the config.json path without '~', or a catalog key.") from exc
        return architecture_from_file(path)
    try:
        return _resolve_name(name)
    except MeshplanError:
        if not _in_working_directory(name):
            raise
    # a folder here holding a config.json, named like no catalog model or size ('my-model', a clone of a Hugging Face
    # repository): read as './my-model' reads it, where 'Unknown model' was the answer
    return architecture_from_file(server_files.server_path(name, "model"))


def _in_working_directory(name: str) -> bool:
    """Whether `name` (no catalog model, variant or size) is a folder in the working directory holding a config.json
    (any other file or folder of that name stays an unknown model: the MCP server's directory is the host's)."""
    if server_files.confined():  # a remote caller's working directory is the operator's folder, if any
        return server_files.is_file(Path(name) / "config.json")
    try:
        return (Path(name) / "config.json").is_file()
    except (OSError, ValueError):
        return False


@lru_cache(maxsize=256)
def _resolve_name(name: str) -> Architecture:
    """A variant of a catalog model or a size; one object per name, so per-architecture caches hit."""
    key = _variant_index().get(_without_variant(name.lower())[0])
    if key:
        return _variant_architecture(key, name)
    size = parse_size(name)
    if size is not None:
        return generic_architecture(size, name.upper().replace(" ", ""))
    hints = closest(name, list(_catalog_index()))
    hint_keys = list(dict.fromkeys(_catalog_index()[h] for h in hints))
    raise MeshplanError(
        f"Unknown model {name[:200]!r}.",
        fix=(f"Did you mean: {', '.join(hint_keys)}? " if hint_keys else "")
        + "Use a catalog key (meshplan models), a Hugging Face id (Instruct/Base/Chat variants of catalog models "
        "included), a path to a config.json, or a size like '70B'.",
        fields=("model",),  # a model read from a config file: the refusal names its line (api.request_from_config)
    )


def _component(comps: list[ComponentCount], name: str) -> ComponentCount | None:
    return next((c for c in comps if c.name == name), None)


def describe_architecture(arch: Architecture, published: dict | None = None) -> ModelReport:
    comps = count_components(arch)
    total = sum(c.params for c in comps)
    active = sum(c.active_params for c in comps)
    emb = sum(c.params for c in comps if c.name in ("embedding", "position_embedding"))
    head = (_component(comps, "lm_head") or ComponentCount(name="lm_head", params=0, active_params=0)).params
    input_emb = _component(comps, "embedding").params  # type: ignore[union-attr]
    assumptions = [
        "Exact element counts from the config: every weight matrix, bias and norm of the checkpoint.",
        "total excludes multi-token-prediction (MTP) blocks; mtp_params reports them separately.",
        "active = total minus the unused routed experts (num_experts - top_k) of every MoE layer.",
        "active_params_excl_input_embedding = active - vocab*hidden (DeepSeek, gpt-oss convention).",
        "active_params_non_embedding = active minus input embedding and untied head (Moonlight, GLM convention).",
    ]
    if arch.vision is not None:
        assumptions.append(f"total excludes the vision tower and projector ({vision_params(arch):,}, vision_params): "
                           "the engines that load the multimodal model (verl's and SkyRL's FSDP) build and hold it.")
    if arch.tie_word_embeddings:
        assumptions.append("Embeddings are tied: the output layer reuses the input embedding, counted once.")
    if arch.generic:
        assumptions.append(
            "Generic model: no real config was given, so a Llama-3-shaped dense model of about this size was "
            f"built ({arch.num_attention_heads} heads of {arch.head_dim} over {arch.num_kv_heads} KV heads, SwiGLU "
            f"FFN {arch.ffn_hidden_size:,}, vocab {arch.vocab_size:,}; the shaping rules are in "
            "cards/model_shapes.yaml). Pass a catalog key or a config.json for exact numbers."
        )
    assumptions += flags_report(arch) + section_report(arch)
    if arch.key and arch.origin == VARIANT_ORIGIN.format(key=arch.key):
        assumptions.append(
            f"{arch.name.split(' (architecture of ')[0]} is not in the catalog under that name: it is read as a "
            f"fine-tuned variant of {arch.hf_id or arch.key} (catalog card {arch.key}), whose architecture and "
            "parameter count a fine-tune keeps."
        )
    return ModelReport(
        name=arch.name,
        key=arch.key,
        hf_id=arch.hf_id,
        model_type=arch.model_type,
        origin=arch.origin,
        generic=arch.generic,
        total_params=total,
        active_params=active,
        active_params_excl_input_embedding=active - input_emb,
        active_params_non_embedding=active - emb - head,
        non_embedding_params=total - emb - head,
        mtp_params=mtp_params(arch),
        vision_params=vision_params(arch),
        components=comps,
        architecture=arch,
        published=published,
        assumptions=assumptions,
    )



def published_for(arch: Architecture) -> dict | None:
    if not arch.key:
        return None
    return model_card(arch.key).published.model_dump(exclude_none=True)


def published_mismatches(report: ModelReport) -> list[str]:
    """Where the exact counts fall outside the rounding of the published ones (empty = all agree)."""
    pub = report.published or {}
    active_by_convention = {
        "active": report.active_params,
        "active_excl_input_embedding": report.active_params_excl_input_embedding,
        "active_non_embedding": report.active_params_non_embedding,
    }
    checks = [
        ("total", report.total_params, pub.get("total"), pub.get("total_rounding", 0) + pub.get("extra_tolerance", 0)),
        ("non_embedding", report.non_embedding_params, pub.get("non_embedding"), pub.get("non_embedding_rounding", 0)),
        (
            pub.get("active_convention", "active"),
            active_by_convention[pub.get("active_convention", "active")],
            pub.get("active"),
            pub.get("active_rounding", 0) + pub.get("active_extra_tolerance", 0),
        ),
    ]
    return [
        f"{what}: exact {exact:,} vs published {published:,} (allowed +-{allowed:,})"
        for what, exact, published, allowed in checks
        if published is not None and abs(exact - published) > allowed
    ]


def describe_model(name: str) -> ModelReport:
    arch = resolve_model(name)
    return describe_architecture(arch, published_for(arch))


def model_summaries() -> list[ModelSummary]:
    out = []
    for key in catalog_keys():
        card: ModelCard = model_card(key)
        report = describe_architecture(catalog_architecture(key))
        out.append(ModelSummary(key=key, name=card.name, hf_id=card.hf_id, model_type=report.model_type,
                                family=card.family, total_params=report.total_params,
                                active_params=report.active_params))
    return out
