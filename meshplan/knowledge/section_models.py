"""A model no catalog card has, built from a config file's section that states the whole architecture, exactly as its
framework's model code builds it: KempnerForge's [model] (its ModelConfig), every field the file leaves out at the
dataclass default, so a configs/train/*.toml's own model (a Llama-3-style 13B) can be planned with.

A request names such a model by its fields, `kempnerforge model section: dim=5120 n_layers=40 ...` (what
`meshplan import` states for the file): a plain string every face carries, built again here on every request. The
section, the defaults, the values meshplan builds and the FFN widths' rounding come from the framework card's
`read.model_section` (knowledge/read_card.py ModelConfigBuild), whose source names the model code followed.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any, NamedTuple

from meshplan.core.card_files import framework_names
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.model_config import shapes_card
from meshplan.knowledge.read_card import ModelConfigBuild
from meshplan.schema.model import Architecture, MoESpec, RopeSpec

NAME = re.compile(r"^\s*([a-z][a-z0-9-]*) (\w+) section:(.*)$", re.S)  # not [model]: rich reads brackets as markup
FIX = "Pass --model (the tool's model argument) with the model's config.json, or a catalog key."
# the fields whose whole numbers meshplan bounds (cards/model_shapes.yaml), by bound
BOUNDS = {"n_layers": "num_hidden_layers", "dim": "hidden_size", "n_heads": "num_attention_heads",
          "n_kv_heads": "num_attention_heads", "vocab_size": "vocab_size", "ffn_hidden_dim": "intermediate_size",
          "num_experts": "num_experts", "max_seq_len": "max_position_embeddings"}


class SectionField(NamedTuple):
    """One field of the built model: its name in the file, its value, and whether the file gives it."""

    name: str
    value: Any
    given: bool


class SectionModel(NamedTuple):
    arch: Architecture
    fields: list[SectionField]


def model_section(framework: str) -> ModelConfigBuild | None:
    read = framework_card(framework).read
    return read.model_section if read is not None else None


def section_name(framework: str, given: dict[str, Any]) -> str:
    """The request's name of the model `given` (the section's architecture fields the file sets) builds: the fields in
    the card's order, so one architecture written the same way is one name."""
    spec = model_section(framework)
    assert spec is not None
    words = [f"{k}={_word(given[k])}" for k in spec.defaults if k in given]
    return f"{framework} {spec.section} section: {' '.join(words)}"


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip("'\"")


def parse_section_name(name: str) -> tuple[str, dict[str, Any]] | None:
    """The framework and fields of a section name; None where `name` is none."""
    match = NAME.match(name)
    if match is None:
        return None
    framework, section, text = match.groups()
    spec = model_section(framework) if framework in framework_names() else None
    if spec is None or spec.section != section:
        raise MeshplanError(f"model {name[:80]!r}: meshplan builds no model from {framework}'s [{section}] section.",
                            fix=FIX)
    given: dict[str, Any] = {}
    for word in text.split():
        key, eq, value = word.partition("=")
        if not eq or key not in spec.defaults:
            raise MeshplanError(f"model {name[:80]!r}: {word[:40]!r} is no {framework} [{section}] field meshplan "
                                "builds from.", fix=f"Write fields as key=value; allowed: {', '.join(spec.defaults)}.")
        given[key] = value
    return framework, given


@lru_cache(maxsize=256)
def section_architecture(name: str) -> Architecture:
    """The model a section name builds; one object per name, so per-architecture caches hit."""
    parsed = parse_section_name(name)
    assert parsed is not None
    return build_from_section(*parsed).arch


def section_report(arch: Architecture) -> list[str]:
    """How describe_model says where a section model's fields came from (empty for any other model)."""
    parsed = parse_section_name(arch.origin)
    if parsed is None:
        return []
    built = build_from_section(*parsed)
    spec = model_section(parsed[0])
    assert spec is not None
    display = framework_card(parsed[0]).display_name
    given = "; ".join(f"{f.name} {f.value}" for f in built.fields if f.given)
    left = "; ".join(f"{f.name} {f.value}" for f in built.fields if not f.given)
    return [f"Built from a {display} [{spec.section}] section as {display}'s model code builds it: {given}. Left to "
            f"its defaults: {left}."]


class _Fields:
    """The section's fields as the framework reads them: a given value, else the card's default (noted)."""

    def __init__(self, framework: str, spec: ModelConfigBuild, given: dict[str, Any]):
        self.framework, self.spec, self.given = framework, spec, given
        self.fields: list[SectionField] = []
        self.bounds = shapes_card().bounds
        for key, allowed in spec.values.items():
            value = _word(given.get(key, spec.defaults.get(key)))
            if value not in allowed.allowed:
                raise MeshplanError(f"[{spec.section}] {key} = {value[:40]!r}: meshplan builds {key} "
                                    f"{' or '.join(allowed.allowed)} only ({allowed.why}).", fix=FIX)

    def raw(self, key: str) -> tuple[Any, bool]:
        if key in self.given:
            return self.given[key], True
        return self.spec.defaults.get(key), False

    def _note(self, key: str, value: Any, given: bool) -> Any:
        self.fields.append(SectionField(key, value, given))
        return value

    def int(self, key: str, *, default: Any = None) -> Any:
        value, given = self.raw(key)
        if value is None:
            value = default
        if value is None:
            return self._note(key, None, given)
        text = _word(value)
        if not re.fullmatch(r"[0-9]{1,18}", text):
            raise MeshplanError(f"[{self.spec.section}] {key} = {text[:40]!r} is not a whole number.", fix=FIX)
        number = int(text)
        spec = self.bounds.get(BOUNDS.get(key, ""))
        low, high = (spec.min, spec.max) if spec else (0, 1 << 20)
        if not (low <= number <= high or (number == 0 and self.spec.defaults.get(key) == 0)):
            raise MeshplanError(f"[{self.spec.section}] {key} = {number} is out of range: allowed {low:,} to "
                                f"{high:,}.", fix=FIX)
        return self._note(key, number, given)

    def number(self, key: str) -> float:
        value, given = self.raw(key)
        try:
            number = float(_word(value))
        except ValueError:
            raise MeshplanError(f"[{self.spec.section}] {key} = {_word(value)[:40]!r} is not a number.",
                                fix=FIX) from None
        if not math.isfinite(number) or number <= 0:
            raise MeshplanError(f"[{self.spec.section}] {key} = {number:g}: allowed a number above 0.", fix=FIX)
        return self._note(key, number, given)

    def switch(self, key: str) -> bool:
        value, given = self.raw(key)
        text = _word(value).lower()
        if text not in ("true", "false"):
            raise MeshplanError(f"[{self.spec.section}] {key} = {text[:40]!r} is not true or false.", fix=FIX)
        return self._note(key, text == "true", given)

    def text(self, key: str) -> str:
        value, given = self.raw(key)
        return self._note(key, _word(value), given)


def ffn_width(dim: int, multiplier: float, stated: int | None, multiple: int) -> int:
    """KempnerForge's ModelConfig.computed_ffn_hidden_dim: the stated ffn_hidden_dim, else Llama's rule, 4 x dim x
    2/3 x ffn_dim_multiplier truncated, rounded up to a multiple of `multiple` (the card's ffn_multiple, 256)."""
    if stated is not None:
        return stated
    return multiple * math.ceil(int(4 * dim * (2 / 3) * multiplier) / multiple)


def expert_width(ffn: int, multiplier: float, multiple: int) -> int:
    """ModelConfig.computed_expert_ffn_hidden_dim: the dense width x moe_expert_ffn_multiplier truncated, rounded to
    the nearest multiple of `multiple` (16), at least one multiple."""
    return max(multiple, multiple * round(int(ffn * multiplier) / multiple))


def build_from_section(framework: str, given: dict[str, Any]) -> SectionModel:
    """The model the framework's code builds from the section's fields (kempnerforge/model/transformer.py); a clear
    error naming the field where its value cannot be built or is one ModelConfig itself refuses."""
    spec = model_section(framework)
    if spec is None:
        raise MeshplanError(f"{framework}'s config files state no architecture meshplan builds a model from.", fix=FIX)
    f = _Fields(framework, spec, given)
    where = f"[{spec.section}]"
    f.text("model_type")
    layers, dim, heads = f.int("n_layers"), f.int("dim"), f.int("n_heads")
    kv_heads = f.int("n_kv_heads", default=heads)
    if dim % heads:  # ModelConfig.__post_init__'s own checks
        raise MeshplanError(f"{where} dim {dim} is not divisible by n_heads {heads} (ModelConfig refuses it).", fix=FIX)
    if heads % kv_heads:
        raise MeshplanError(f"{where} n_heads {heads} is not divisible by n_kv_heads {kv_heads} (ModelConfig "
                            "refuses it).", fix=FIX)
    vocab = f.int("vocab_size")
    stated = f.int("ffn_hidden_dim")
    ffn = ffn_width(dim, f.number("ffn_dim_multiplier"), stated, spec.ffn_multiple)
    if stated is None:  # said as the width the framework computes, not as None
        k = next(i for i, field in enumerate(f.fields) if field.name == "ffn_hidden_dim")
        f.fields[k] = SectionField("ffn_hidden_dim", f"{ffn} (computed from dim and ffn_dim_multiplier)", False)
    activation = f.text("activation")
    norm = f.text("norm_type")
    eps = f.number("norm_eps")
    if eps >= 0.1:
        raise MeshplanError(f"{where} norm_eps {eps:g}: allowed above 0 and below 0.1.", fix=FIX)
    max_positions = f.int("max_seq_len")
    theta = f.number("rope_theta")
    tied, qk_norm = f.switch("tie_embeddings"), f.switch("qk_norm")
    moe = None
    experts = f.int("num_experts")
    if experts:
        top_k, frequency = f.int("moe_top_k"), f.int("moe_frequency")
        if not 1 <= top_k <= experts:
            raise MeshplanError(f"{where} moe_top_k {top_k}: allowed 1 to the {experts} experts (ModelConfig refuses "
                                "it).", fix=FIX)
        if frequency < 1:
            raise MeshplanError(f"{where} moe_frequency {frequency}: allowed 1 or more.", fix=FIX)
        width = expert_width(ffn, f.number("moe_expert_ffn_multiplier"), spec.expert_ffn_multiple)
        shared = f.int("moe_shared_experts")
        router = f.text("moe_router")
        moe = MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=width,
                      num_shared_experts=int(shared > 0), shared_expert_ffn_hidden_size=width if shared else 0,
                      moe_layers=[i for i in range(layers) if (i + 1) % frequency == 0],
                      score_correction_bias=router == "sigmoid_topk")
    arch = Architecture(
        name=f"{framework} model ({layers} layers, dim {dim}"
             + (f", {moe.num_experts} experts top-{moe.top_k}" if moe else "") + f"; its {spec.section} section)",
        model_type=framework, num_layers=layers, hidden_size=dim, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=dim // heads, vocab_size=vocab, max_position_embeddings=max_positions,
        tie_word_embeddings=tied, gated_mlp=activation == "silu", activation=activation,
        qk_norm="head" if qk_norm else "none", norm_type=norm, rope=RopeSpec(theta=theta), norm_eps=eps, moe=moe,
        origin=section_name(framework, given))
    return SectionModel(arch, f.fields)
