"""A model no catalog card has, built from a Megatron-LM (or Megatron-DeepSpeed) launch script's own architecture flags
exactly as that framework builds it (every flag left out at its default), so a user's own model can be planned with.

A request names such a model by its flags, `megatron-core flags: --num-layers 40 --hidden-size 5120 ...` (what
`meshplan import` states for the script): a plain string every face can carry, resolved here again on every request,
with nothing kept beside it. The reader (adapters/read/) and the resolver (knowledge/catalog.resolve_model) both build
it here. Which flag sets which field, Megatron-LM's defaults, the values meshplan can express and the flags whose model
it cannot come from the framework card's `read` section (model_shape, model_flags, model_defaults, model_build*).
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from functools import lru_cache
from typing import Any, NamedTuple

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.model_config import shapes_card
from meshplan.knowledge.read_card import NO_READ, SHAPE_FIELDS, ReadSection
from meshplan.schema.model import Architecture, DSASpec, MLASpec, MoESpec, RopeSpec

BUILDERS = ("megatron-core", "deepspeed")  # the frameworks whose launch scripts' models are built from their flags
NAME = re.compile(r"^\s*([a-z][a-z0-9-]*) flags:(.*)$", re.S)
FALSE_WORDS = ("false", "0", "no", "off")
PATTERN_MAX = 1 << 16  # the longest --moe-layer-freq list read: far above any depth (model_shapes.yaml: 1,024 layers)
FIX = "Pass --model (the tool's model argument) with the model's config.json, or a catalog key."
# the flags whose fields are integers meshplan bounds (cards/model_shapes.yaml), by bound
BOUNDS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
          "num_attention_heads": "num_attention_heads", "num_kv_heads": "num_attention_heads",
          "vocab_size": "vocab_size", "head_dim": "head_dim", "num_experts": "num_experts",
          "expert_ffn_hidden_size": "intermediate_size", "shared_expert_ffn_hidden_size": "intermediate_size",
          "max_position_embeddings": "max_position_embeddings", "num_mtp_layers": "num_nextn_predict_layers",
          "q_lora_rank": "lora_rank", "kv_lora_rank": "lora_rank", "qk_nope_head_dim": "head_dim",
          "qk_rope_head_dim": "head_dim", "v_head_dim": "head_dim", "index_n_heads": "num_attention_heads",
          "index_head_dim": "head_dim", "index_topk": "max_position_embeddings"}

# The Gated DeltaNet shapes a script may state (read.model_flags): matched against the catalog, never built from
GDN_FLAGS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "linear_conv_kernel_dim")


class FlagField(NamedTuple):
    """One field of the built model: its value, the flag that sets it, and whether the script gives that flag."""

    name: str
    value: Any
    flag: str
    given: bool


class FlagModel(NamedTuple):
    """The architecture a script's flags build, and each field with where it came from."""

    arch: Architecture
    fields: list[FlagField]


def _read(framework: str) -> ReadSection:
    return framework_card(framework).read or NO_READ


def model_flags(framework: str) -> dict[str, str]:
    """Every flag that decides the model Megatron-LM builds, and the field it sets."""
    read = _read(framework)
    shape = {k.split("|")[0]: f for f, k in zip(SHAPE_FIELDS, read.model_shape, strict=False)}
    return {**shape, **read.model_flags, **read.model_build}


def read_flags(framework: str) -> set[str]:
    """The flags the builder reads from a script: those of the model and those whose model it refuses."""
    return set(model_flags(framework)) | set(_read(framework).model_build_refused)


def flags_name(framework: str, given: dict[str, Any]) -> str:
    """The request's name of the model the flags `given` build: the model's flags in the card's order (a switch
    alone), so one architecture stated the same way is one name."""
    words = []
    for flag in model_flags(framework):
        if flag in given:
            value = given[flag]
            words.append(flag if value is True else f"{flag} {shlex.quote(str(value))}")
    return f"{framework} flags: {' '.join(words)}"


def parse_flags_name(name: str) -> tuple[str, dict[str, Any]] | None:
    """The framework and flags of a flags name; None where `name` is none."""
    match = NAME.match(name)
    if match is None:
        return None
    framework, text = match.group(1), match.group(2)
    if framework not in BUILDERS:
        raise MeshplanError(f"model {name[:80]!r}: {framework!r} launch scripts' models are not built from their "
                            f"flags (those of {', '.join(BUILDERS)} are).", fix=FIX)
    try:  # --flag=value as --flag value, as argparse reads it
        words = [part for word in shlex.split(text) for part in (word.split("=", 1) if word.startswith("--") else
                                                                  [word])]
    except ValueError as exc:
        raise MeshplanError(f"model {name[:80]!r}: its flags cannot be split into words ({exc}).", fix=FIX) from None
    known = model_flags(framework)
    given: dict[str, Any] = {}
    for k, word in enumerate(words):
        if not word.startswith("--"):
            if k == 0 or not words[k - 1].startswith("--"):
                raise MeshplanError(f"model {name[:80]!r}: {word!r} follows no flag.",
                                    fix=f"Write it as '{framework} flags: --flag value --switch ...'.")
            continue
        if word not in known:
            raise MeshplanError(f"model {name[:80]!r}: {word} is no architecture flag meshplan reads.",
                                fix=f"Allowed: {', '.join(known)}.")
        has_value = k + 1 < len(words) and not words[k + 1].startswith("--")
        given[word] = words[k + 1] if has_value else True
    return framework, given


@lru_cache(maxsize=256)
def flags_architecture(name: str) -> Architecture:
    """The model a flags name builds; one object per name, so per-architecture caches hit."""
    parsed = parse_flags_name(name)
    assert parsed is not None
    return build_from_flags(*parsed).arch


def flags_report(arch: Architecture) -> list[str]:
    """How describe_model says where a flags model's fields came from (empty for any other model)."""
    parsed = parse_flags_name(arch.origin)
    if parsed is None:
        return []
    built = build_from_flags(*parsed)
    given = [f"{f.name} {_show(f.value)} ({f.flag})" for f in built.fields if f.given]
    left = [f"{f.name} {_show(f.value)} ({f.flag} not given)" for f in built.fields
            if not f.given and f.value is not False]
    name = framework_card(parsed[0]).display_name
    out = [f"Built from a {name} launch script's flags as {name} builds the model: {'; '.join(given)}. Left to its "
           f"defaults: {'; '.join(left)}."]
    out.append(f"The vocabulary is the tokenizer's, {arch.vocab_size:,}, as a checkpoint counts it; {name} pads it "
               "at run time to a multiple of --make-vocab-size-divisible-by (128) x tp, which the memory and time "
               "estimates do for the plan's tp.")
    return out


def _said(value: Any) -> str:
    """A value as an error echoes it, short whatever the script wrote."""
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return f"{len(value)} MoE layers"
    return str(value)


# --------------------------------------------------------------------------- building


class _Flags:
    """The script's flags read as Megatron-LM reads them: a given flag's value, else the card's default."""

    def __init__(self, framework: str, given: dict[str, Any]):
        read = _read(framework)
        self.framework, self.given = framework, given
        self.flag_of = {field: flag for flag, field in model_flags(framework).items()}
        self.defaults: dict[str, Any] = {**read.model_defaults, **read.model_build_defaults}
        self.values = read.model_build_values
        self.bounds = shapes_card().bounds
        self.table = read.model_build_position_table
        self.fields: list[FlagField] = []
        for flag, why in read.model_build_refused.items():
            if flag in given:
                raise MeshplanError(f"{flag}: {why}, which meshplan's parameter counts cannot express, so the model "
                                    "is not built from the script's flags.", fix=FIX)
        for flag, spec in self.values.items():
            value = str(given.get(flag, "")).strip("'\"")
            if flag in given and given[flag] is not True and value not in spec.allowed:
                allowed = " or ".join(spec.allowed)
                raise MeshplanError(f"{flag} {_said(value)}: meshplan builds models with {allowed} only "
                                    f"({spec.why}), so the model is not built from the script's flags.", fix=FIX)

    def raw(self, name: str, switch: bool = False) -> tuple[Any, bool]:
        flag = self.flag_of.get(name, f"--{name.replace('_', '-')}")
        if flag in self.given:
            if self.given[flag] is True and not switch:
                raise MeshplanError(f"{flag} is given without a value.", fix=FIX)
            return self.given[flag], True
        return self.defaults.get(name), False

    def _note(self, name: str, value: Any, given: bool, flag: str | None = None) -> Any:
        """Records a field the framework has a flag for (not rotary_base where no flag sets it)."""
        if flag or name in self.flag_of:
            self.fields.append(FlagField(name, value, flag or self.flag_of[name], given))
        return value

    def switch(self, name: str, shown: str | None = None) -> bool:
        """A switch given (and no false-like word after it) is on; noted as `shown`, its meaning inverted where the
        flag turns something off (--disable-bias-linear: linear_biases)."""
        value, given = self.raw(name, switch=True)
        on = bool(value) and str(value).strip("'\"").lower() not in FALSE_WORDS
        if shown is None:
            return self._note(name, on, given)
        self._note(shown, not on, given, self.flag_of.get(name))
        return on

    def text(self, name: str) -> str:
        value, given = self.raw(name)
        return self._note(name, str(value).strip("'\""), given)

    def number(self, name: str) -> float:
        value, given = self.raw(name)
        try:
            number = float(str(value).strip("'\""))
        except ValueError:
            raise MeshplanError(f"{self.flag_of[name]} {_said(value)} is not a number.", fix=FIX) from None
        if not math.isfinite(number) or number <= 0:
            raise MeshplanError(f"{self.flag_of[name]} {_said(value)}: allowed a number above 0.", fix=FIX)
        return self._note(name, number, given)

    def int(self, name: str, *, need: str | None = None, default: Any = None, note: bool = True) -> Any:
        """The whole number a flag gives (None where neither it nor a default does: an error saying `need` when
        given); within the field's bound in cards/model_shapes.yaml."""
        value, given = self.raw(name)
        if value is None:
            value = default
        if value is None or str(value).strip("'\"") in ("None", "null"):
            if need:
                raise MeshplanError(f"{self.flag_of.get(name, name)} is not given: {need}", fix=FIX)
            return None
        text = str(value).strip("'\"")
        if not re.fullmatch(r"-?[0-9]{1,18}", text):
            raise MeshplanError(f"{self.flag_of.get(name, name)} {_said(value)} is not a whole number.", fix=FIX)
        number = int(text)
        if number == 0 and self.defaults.get(name) == 0:  # none: no experts, no shared experts, no MTP
            return self._note(name, 0, given) if note else 0
        spec = self.bounds.get(BOUNDS.get(name, ""))
        low, high = (spec.min, spec.max) if spec else (1, 1 << 20)
        if not low <= number <= high:
            raise MeshplanError(f"{self.flag_of.get(name, name)} {number} is out of range: allowed {low:,} to "
                                f"{high:,}." + (f" {spec.why[0].upper()}{spec.why[1:]}." if spec else ""), fix=FIX)
        return self._note(name, number, given) if note else number


def moe_pattern(text: str) -> list[int]:
    """Megatron-LM's --moe-layer-freq list expression ('[0]*3+[1]*58', '([1]*3+[0])*2') read without running it:
    lists of integers, + and * by an integer only (megatron/training/arguments.py moe_freq_type evaluates it)."""
    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list) and len(
                    left) + len(right) <= PATTERN_MAX:
                return left + right
            if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int) and 0 <= len(
                    left) * right <= PATTERN_MAX:
                return left * right
        raise ValueError(text)
    out = value(ast.parse(text.strip().strip("'\""), mode="eval").body)
    if not isinstance(out, list) or any(not isinstance(v, int) for v in out):
        raise ValueError(text)
    return out


def moe_layers(freq: Any, interval: Any, layers: int) -> tuple[int, ...]:
    """The MoE layers (0-based): Megatron-LM's --moe-layer-freq (k: every layer i with i % k == 0; a list: 1 marks
    an MoE layer, megatron/core/models/gpt/gpt_layer_specs.py) or Megatron-DeepSpeed's --expert-interval (layer
    n, 1-based, when n % interval == 0: megatron/model/transformer.py get_num_experts_per_layer)."""
    if interval is not None:
        return tuple(i for i in range(layers) if (i + 1) % int(interval) == 0)
    text = str(freq).strip().strip("'\"")
    if "[" not in text:
        return tuple(i for i in range(layers) if i % int(text) == 0)
    pattern = moe_pattern(text)
    if len(pattern) != layers:
        raise ValueError(f"its pattern has {len(pattern)} entries for {layers} layers")
    return tuple(i for i, v in enumerate(pattern) if v)


def _moe(f: _Flags, layers: int, ffn: int, bias: bool) -> MoESpec | None:
    """Routed and shared experts (Megatron-LM's validate_args: the experts' width is --ffn-hidden-size when
    --moe-ffn-hidden-size is not given); the router has no bias (its expert bias is a buffer, no parameter)."""
    experts = f.int("num_experts", note=False)
    if not experts or experts == f.defaults.get("num_experts"):  # Megatron-DeepSpeed: one expert is a dense MLP
        f._note("num_experts", 0, f.raw("num_experts")[1])
        return None
    f._note("num_experts", experts, True)
    top_k = f.int("top_k")
    if top_k < 1 or top_k > experts:
        raise MeshplanError(f"{f.flag_of['top_k']} {top_k}: allowed 1 to the {experts} experts.", fix=FIX)
    width = f.int("expert_ffn_hidden_size", default=ffn)
    shared = f.int("shared_expert_ffn_hidden_size", default=0) or 0
    if shared and bias:
        raise MeshplanError(f"{f.flag_of['shared_expert_ffn_hidden_size']} without --disable-bias-linear: "
                            "meshplan counts shared experts without biases, so the model is not built from the "
                            "script's flags.", fix=FIX)
    name = "expert_interval" if "expert_interval" in f.flag_of else "moe_layer_freq"
    value, given = f.raw(name)
    try:
        layer_list = moe_layers(*((None, value) if name == "expert_interval" else (value, None)), layers)
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as exc:
        raise MeshplanError(f"{f.flag_of[name]} {_said(value)}: not a MoE layer pattern meshplan can read "
                            f"({_said(exc)}).", fix=FIX) from None
    f._note("moe_layers", layer_list, given, f.flag_of[name])
    groups = f.int("num_groups", default=1) or 1
    group_topk = f.int("group_topk", default=1) or 1
    if experts % groups or group_topk > groups or top_k > group_topk * (experts // groups):
        raise MeshplanError(f"{f.flag_of['num_groups']} {groups} and {f.flag_of['group_topk']} {group_topk}: the "
                            f"{experts} experts must split into equal groups and a token's {top_k} experts fit in "
                            "the groups it may use (Megatron-Core's TransformerConfig checks).", fix=FIX)
    # --moe-shared-expert-gate: a hidden x 1 sigmoid gate on the shared experts' output (TransformerConfig
    # moe_shared_expert_gate), counted as Qwen2-MoE's shared_expert_gate
    gate = f.switch("shared_expert_gate") and shared > 0
    return MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=width, num_shared_experts=int(shared > 0),
                   shared_expert_ffn_hidden_size=shared, moe_layers=list(layer_list), expert_bias=bias,
                   num_groups=groups, group_topk=group_topk, shared_expert_gate=gate)


def _dsa(f: _Flags, mla: MLASpec | None) -> DSASpec | None:
    """DSA's indexer where the script shapes one (--dsa-indexer-n-heads, -head-dim, -topk; Megatron-Core's DSAttention
    runs on MLA, and its DSAIndexer reads the q latent, hidden_size without one); None without."""
    heads = f.int("index_n_heads")
    if heads is None:
        return None
    if mla is None:
        raise MeshplanError(f"{f.flag_of['index_n_heads']} {heads} without --multi-latent-attention: Megatron-Core's "
                            "DSA attention runs on MLA (AbsorbedMLASelfAttention).", fix=FIX)
    need = "DSA's indexer needs it beside --dsa-indexer-n-heads."
    return DSASpec(index_n_heads=heads, index_head_dim=f.int("index_head_dim", need=need),
                   index_topk=f.int("index_topk", need=need))


def _mla(f: _Flags, bias: bool) -> MLASpec | None:
    if not f.switch("mla"):
        return None
    if bias:
        raise MeshplanError("--multi-latent-attention without --disable-bias-linear: meshplan counts MLA's "
                            "projections without biases, so the model is not built from the script's flags.", fix=FIX)
    return MLASpec(q_lora_rank=f.int("q_lora_rank") or None, kv_lora_rank=f.int("kv_lora_rank"),
                   qk_nope_head_dim=f.int("qk_nope_head_dim"), qk_rope_head_dim=f.int("qk_rope_head_dim"),
                   v_head_dim=f.int("v_head_dim"))


def _positions(f: _Flags, max_positions: int) -> tuple[int, RopeSpec | None]:
    """The learned position table's rows and the rotary embedding, as the framework reads the flags: Megatron-LM
    keeps the table for --position-embedding-type learned_absolute only, Megatron-DeepSpeed unless
    --no-position-embedding (the card's model_build_position_table)."""
    kind = "rope" if f.switch("rotary") else f.text("position_embedding")
    off = f.switch("no_position_embedding")
    if f.table == "by_type" and off and kind != "rope":
        raise MeshplanError(f"--no-position-embedding with --position-embedding-type {kind}: Megatron-LM refuses it "
                            "(deprecated; use --position-embedding-type).", fix=FIX)
    table = 0 if off else max_positions
    if f.table == "by_type":
        table = max_positions if kind == "learned_absolute" else 0
    if kind in ("learned_absolute", "none"):
        return table, None
    percent = f.number("rotary_percent")
    return table, RopeSpec(theta=f.number("rotary_base"), fraction=min(percent, 1.0))


def _vocab(f: _Flags) -> int:
    """The tokenizer's vocabulary, as a checkpoint counts it: --vocab-size where given, else the card's
    read.tokenizer_vocab for the script's --tokenizer-type (TikTokenizer's default size, GPT-2's BPE); any other
    tokenizer's is its file's, which meshplan does not read. Megatron-LM pads it at run time to a multiple of
    --make-vocab-size-divisible-by x tp (build_tokenizer.py vocab_size_with_padding), which the estimates do per plan
    for every model (cards/memory.yaml vocab_pad_multiple, memory_states.built_vocab), so a model here is the same
    at every tp."""
    kind, named = f.raw("tokenizer_type")
    kind = str(kind).strip("'\"")
    known = _read(f.framework).tokenizer_vocab.get(kind) if named else None
    if known is not None and f.flag_of.get("vocab_size") not in f.given:
        f._note("tokenizer_type", kind, True)
        return f._note("vocab_size", known.vocab_size, False)
    said = (f"--tokenizer-type {_said(kind)}: its vocabulary is its file's" if named else
            "the framework takes the vocabulary from the tokenizer")
    return f.int("vocab_size", need=f"{said} (--tokenizer-type, --vocab-file, --tokenizer-model), which meshplan does "
                                    "not read; add --vocab-size N with the tokenizer's size.")


def tokenizer_vocab_note(framework: str, given: dict[str, Any]) -> tuple[str, bool] | None:
    """Where the flags' vocabulary came from their --tokenizer-type (the card's read.tokenizer_vocab), the words that
    say so (its size, what it takes as so, its source) and whether it takes something the flags cannot confirm;
    None where --vocab-size gives it or no known tokenizer does."""
    read = _read(framework)
    kind = str(given.get("--tokenizer-type", "")).strip("'\"")
    known = read.tokenizer_vocab.get(kind)
    vocab_flag = next((flag for flag, field in model_flags(framework).items() if field == "vocab_size"), None)
    if known is None or vocab_flag in given:
        return None
    assumes = f", taking {known.assumes}" if known.assumes else ""
    return (f"vocab_size {known.vocab_size:,} is --tokenizer-type {kind}'s vocabulary{assumes} "
            f"({' '.join(known.source.split())}); padded per plan to a multiple of --make-vocab-size-divisible-by x "
            "tp (pass --vocab-size N in the script for another tokenizer's)", known.assumes is not None)


def default_tokenizer(framework: str, given: dict[str, Any]) -> str | None:
    """The --tokenizer-type the launcher runs where the script gives --vocab-file, no --tokenizer-type and no
    --vocab-size (the card's read.default_tokenizer: pretrain_gpt.py's GPT2BPETokenizer); None otherwise."""
    read = _read(framework)
    if read.default_tokenizer is None or "--tokenizer-type" in given or "--vocab-file" not in given:
        return None
    vocab_flag = next((flag for flag, field in model_flags(framework).items() if field == "vocab_size"), None)
    return None if vocab_flag in given else read.default_tokenizer


def build_from_flags(framework: str, given: dict[str, Any]) -> FlagModel:
    """The model Megatron-LM (or Megatron-DeepSpeed) builds from these flags; a clear error naming the flag where one
    is missing, has a value meshplan cannot express, or builds something meshplan cannot count."""
    if framework not in BUILDERS:
        raise MeshplanError(f"{framework_card(framework).display_name} launch scripts' models are not built from "
                            f"their flags (those of {', '.join(BUILDERS)} are).", fix=FIX)
    f = _Flags(framework, given)
    need = f"{framework_card(framework).display_name} requires it."
    layers = f.int("num_layers", need=need)
    hidden = f.int("hidden_size", need=need)
    heads = f.int("num_attention_heads", need=need)
    swiglu, quick_geglu, squared_relu = f.switch("swiglu"), f.switch("quick_geglu"), f.switch("squared_relu")
    gated = swiglu or quick_geglu
    ffn = f.int("ffn_hidden_size", default=int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden)
    if "gqa" in f.flag_of:  # Megatron-LM: --num-query-groups only with --group-query-attention, 1 group by default
        kv_heads = f.int("num_kv_heads", default=1) if f.switch("gqa") else f._note("num_kv_heads", heads, False,
                                                                                    f.flag_of["gqa"])
    else:
        kv_heads = f.int("num_kv_heads", default=heads)
    if heads % kv_heads:
        raise MeshplanError(f"{f.flag_of['num_kv_heads']} {kv_heads} does not divide --num-attention-heads {heads}.",
                            fix=FIX)
    vocab = _vocab(f)
    max_positions = f.int("max_position_embeddings", need=need)
    bias = not f.switch("no_bias_linear", shown="linear_biases")
    qkv_bias = f.switch("qkv_bias") or bias  # Megatron-LM: add_qkv_bias follows add_bias_linear
    rms = f.text("normalization").lower() == "rmsnorm"
    mla = _mla(f, bias)
    if mla is None and hidden % heads and f.raw("head_dim")[0] is None:
        raise MeshplanError(f"--hidden-size {hidden} is not divisible by --num-attention-heads {heads}, and "
                            "--kv-channels is not given.", fix=FIX)
    dsa = _dsa(f, mla)
    head_dim = mla.qk_head_dim if mla else f.int("head_dim", default=hidden // heads)
    qk_norm = f.switch("qk_layernorm") and mla is None
    if qk_norm and not rms:
        raise MeshplanError("--qk-layernorm with --normalization LayerNorm: meshplan counts q/k norms of RMSNorm "
                            "only, so the model is not built from the script's flags.", fix=FIX)
    gdn = [f.flag_of[n] for n in GDN_FLAGS if n in f.flag_of and f.raw(n)[1]]
    if gdn:
        raise MeshplanError(f"{', '.join(gdn)}: a Gated DeltaNet hybrid, which meshplan builds from its config.json "
                            "(model_type qwen3_next) or the catalog, not from a launch script's flags.", fix=FIX)
    output_gate = f.switch("attention_output_gate")
    if output_gate and mla is not None:  # was dropped here without a word, so render wrote an ungated model
        raise MeshplanError(
            f"{f.flag_of['attention_output_gate']} with {f.flag_of['mla']}: Megatron-Core refuses an output gate on "
            "multi-latent attention (MLATransformerConfig.__post_init__ raises NotImplementedError 'Output gate is "
            "not supported for MLA yet.', megatron/core/transformer/transformer_config.py, NVIDIA/Megatron-LM "
            "d98e8a6), so the script does not run and its model is not built from its flags.",
            fix="Drop --attention-output-gate (MLA runs ungated), or --multi-latent-attention for gated attention.")
    learned, rope = _positions(f, max_positions)
    moe = _moe(f, layers, ffn, bias)
    mtp = f.int("num_mtp_layers", default=0) or 0
    untied = f.switch("untied")
    eps = f.number("norm_eps")
    if eps >= 0.1:
        raise MeshplanError(f"{f.flag_of['norm_eps']} {eps:g}: allowed above 0 and below 0.1.", fix=FIX)
    arch = Architecture(
        name=f"{framework} launch script model ({layers} layers, hidden {hidden}"
             + (f", {moe.num_experts} experts top-{moe.top_k}" if moe else "") + ")",
        model_type="megatron", num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
        max_position_embeddings=max_positions, tie_word_embeddings=not untied, gated_mlp=gated,
        activation="silu" if swiglu else "quick_gelu" if quick_geglu else "relu2" if squared_relu else "gelu",
        qkv_bias=qkv_bias, o_bias=bias, mlp_bias=bias, qk_norm="head" if qk_norm else "none",
        norm_type="rmsnorm" if rms else "layernorm", learned_position_embeddings=learned, rope=rope,
        norm_eps=eps, moe=moe, mla=mla, dsa=dsa, num_mtp_layers=mtp, attention_output_gate=output_gate,
        origin=flags_name(framework, given))
    return FlagModel(arch, f.fields)
