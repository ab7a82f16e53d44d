"""Which request field a framework key sets: derived from the framework card, never a second table.

The card's `adapter` knobs give the framework's key for each knob meshplan renders (`--tensor-model-parallel-size`
for tp); its `read.keys` section gives the keys that are no knob (the sequence length, the node count, the
model path). A `Reading` collects what one file states, field by field, with the line that states it.
"""

from __future__ import annotations

import difflib
import math
import re
import types
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Union, get_args, get_origin

from pydantic import ValidationError

from meshplan.adapters.lora import ALL_LINEAR, HF_PROJECTIONS, projection_targets
from meshplan.adapters.read.bridge_lora import is_pattern, other_places, pattern_places
from meshplan.adapters.read.settings import Setting
from meshplan.arithmetic.lora import DEFAULT_TARGETS, TARGETS
from meshplan.arithmetic.pipeline_timeline import SCHEDULE_OF_ORDER
from meshplan.arithmetic.schedule import layers_per_rank
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import adapter_section, knob_table
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.read_card import NO_READ, QuantizedBase, ReadSection, TargetParameterKeys
from meshplan.schema.choices import FlexBackend, MoeDispatcher, Recompute
from meshplan.schema.imported import LeftToRequest
from meshplan.schema.request import Request

# Knobs whose value is the request field's value as it stands (the knob is named after the field).
VALUE_KNOBS = frozenset({"tp", "pp", "cp", "ep", "etp", "cp_comm_type", "micro_batch_size", "global_batch_size",
                         "recompute_layers", "recompute_method", "recompute_modules", "optimizer_offload_fraction",
                         "lora_rank", "lora_targets", "optimizer", "selective_ac_option", "dp_replicate"})
# Knobs that are on/off switches: a flag given alone, or a true/false value.
SWITCH_KNOBS = frozenset({"sequence_parallel", "activation_offload", "param_offload", "optimizer_offload",
                          "tp_comm_overlap", "torch_compile", "fp8_param_gather", "account_for_embedding",
                          "account_for_loss", "moe_a2a_overlap", "defer_fsdp_grad_sync", "grad_reduce_overlap",
                          "fp8_activation_input_store", "fp8_dot_product_attention", "moe_shared_expert_overlap",
                          "bias_activation_fusion", "cross_entropy_loss_fusion"})
# Settings that say nothing about memory or speed: never reported as "cannot express".
IRRELEVANT = re.compile(
    r"(^|[._-])(lr|min_lr|dataset|datasets|train_files|val_files|train_data|val_data|log\w*|save|save[-_]\w+|"
    r"tokenizer\w*|eval\w*|wandb\w*|seed|(?<!activation_)checkpoint|ckpt\w*|profil\w*|project\w*|experiment\w*|run_name|"
    r"\w*_dir|\w*_path|path|\w*interval|\w*iters|max_steps|total_training_steps|epochs|total_epochs|warmup\w*|\w*decay\w*|"
    r"beta\d?|adam_beta\d|eps|clip\w*|grad_clip_norm|weight_decay|logger|tensorboard\w*|"
    r"vocab_size|"
    r"master[-_](addr|port)|node_rank|rdzv\w*|dump_folder|description|resume\w*|async_mode|keep_last_n|"
    r"num_workers|pin_memory|prefetch_factor|file_pattern|enable_wandb|enable_tensorboard|"
    r"mock[-_]data|distributed_backend|init_method_std|exit\w*|manual_gc|timeout\w*|\w*timeout\w*|"
    r"trust_remote_code|env_class|temperature|top_p|top_k|kl\w*|(?<!cross[-_])entropy\w*|reward\w*|use_kl\w*|critic_warmup|"
    # the gradient clip, LR schedule, chat columns, loss mask and loss formula (SkyRL's OptimizerConfig, SFTConfig,
    # AlgorithmConfig) and LoRA's output scale (alpha / rank): no step's memory or time
    r"max_grad_norm|scheduler|messages_key|tools_key|system_key|train_on_what|policy_loss_type|loss_agg_mode|loss_mode|lora_alpha|alpha|"
    r"val\w*|test\w*|return_raw_chat|filter_overlong_prompts|truncation|max_norm|export_dtype|"
    r"config[-_]path|config[-_]name|step_func|node[-_]rank|standalone|train[-_]samples|distributed[-_]backend|"
    r"deepspeed[-_]config|steps_per_print|use[-_]mcore[-_]models|"
    # the model's architecture: part of the model the file is matched to, not a layout setting
    r"kv[-_]channels|max[-_]position[-_]embeddings|position[-_]embedding[-_]type|rotary[-_]\w+|swiglu|"
    r"normalization|untie[-_]embeddings[-_]and[-_]output[-_]weights|disable[-_]bias[-_]linear|"
    r"group[-_]query[-_]attention|apply[-_]layernorm[-_]1p|no[-_]query[-_]key[-_]layer[-_]scaling|"
    r"use[-_]rotary[-_]position[-_]embeddings|hidden[-_]dropout|norm[-_]epsilon|vocab[-_]size|rope_theta|"
    r"max_seq_len|ffn_dim_multiplier|norm_type|tie_embeddings|hf_assets_path|flavor)($|[._-])"
    # a checkpoint's load (Megatron-LM's --load, --no-load-optim/-rng, --load-main-params-from-ckpt; verl's Megatron
    # actor's load_weight) and the rollout's startup weights (rollout.load_format: synced from the actor each step):
    # the whole key, so a key with a `load` part that does touch a step (--moe-router-load-balancing-type, a
    # quantized base's load_in_4bit) is reported, not dropped; likewise a section's `name` (a run's, a scheduler's)
    # and Megatron-Bridge's --recipe, not every `*_name` or `recipe_*` (torchtitan's [float8] recipe_name is the FP8
    # recipe), and a model's `activation`, not torchtitan's activation_checkpoint section (its memory_budget)
    r"|(^|\.)(load|no[-_]load[-_](optim|rng)|load[-_](optim|rng|main[-_]params[-_]from[-_]ckpt|format|weight)|name|recipe|activation)$"
    # likewise words common inside keys that do touch a step, irrelevant only as a whole key or its last part: a
    # run's mode, step count, save frequency or data split (not Megatron-Core's --muon-tp-mode, --muon-num-ns-steps,
    # --muon-no-split-qkv, --linear-attention-freq), verl's data section (not DeepSpeed's communication_data_type or
    # data_types.grad_accum_dtype, Megatron's --data-parallel-sharding-strategy), the bf16 switch meshplan's default
    # precision is (not DeepSpeed's bf16.bf16_master_weights_and_grads, nor amp.enabled, verl's tiled_mlp.enabled)
    r"|(^|\.)(mode|steps|freq|split)$|^data(\.|$)|^(deepspeed|bf16|(bf16|bfloat16)\.enabled)$")


def normalize(key: str) -> str:
    """A key as the readers compare it: Hydra's +, ++ and ~ dropped; a `--flag` with hyphens (argparse accepts the
    spelling it was declared with, and Megatron declares hyphens); a dotted `--a.b` flag as `a.b`."""
    key = key.strip().lstrip("+~")
    if key.startswith("--"):
        return key[2:] if "." in key else "--" + key[2:].replace("_", "-")
    return key


# A dtype as the frameworks' configs name it (torch's, their short names), as meshplan names it: read here and by
# adapters/parse.py (precision-aware optimizer states, a reduce dtype)
DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "fp8",
               "fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "float32": "fp32", "bfloat16": "bf16",
               "float16": "fp16"}


@dataclass(frozen=True)
class Meaning:
    target: str  # an adapter knob, a request field, or a name of the card's read.keys (nodes, dp_shard, ...)
    word: str | None = None  # the value the key must have for this knob ("selective" for recompute_selective)


def key_table(framework: str, version: str | None = None, variant: str | None = None,
              read_keys: dict[str, str] | None = None) -> dict[str, list[Meaning]]:
    """Every key the card names for `framework` (its adapter knobs of every version, the given or default one first,
    and read.keys, or `read_keys` in their place: another entry point's, verl's SFT trainer), normalized, with its
    meanings."""
    section = adapter_section(framework_card(framework))
    variant = variant if variant in section.variants else next(iter(section.variants))
    table: dict[str, list[Meaning]] = {}
    versions = [version or section.default_version, *(v for v in section.versions if v != version)]
    for v in dict.fromkeys(versions):
        for key, meanings in _knob_keys(framework, v, variant).items():
            table.setdefault(key, meanings)
    for key, target in (read_section(framework).keys if read_keys is None else read_keys).items():
        table.setdefault(normalize(key), []).append(Meaning(target))
    return table


@cache
def beside_keys(framework: str) -> dict[str, str]:
    """The keys the framework's card writes beside a knob's own (AdapterKnob.beside, of every version and variant),
    normalized, each with the card's spelling: what a reader keeps of the file (ImportedConfig.beside_stated) so a fix
    writes none the file already states."""
    section = adapter_section(framework_card(framework))
    tables = [spec.knobs for spec in section.versions.values()] + list(section.variant_knobs.values())
    return {normalize(key): key for table in tables for knob in table.values() for key in knob.beside or {}}


def _knob_keys(framework: str, version: str, variant: str) -> dict[str, list[Meaning]]:
    table: dict[str, list[Meaning]] = {}
    for knob, spec in knob_table(framework_card(framework), version, variant).items():
        if not spec.key or spec.key.startswith("("):
            continue
        for part in spec.key.split(" + ")[:1]:
            part = re.sub(r"^\[([^\]]+)\]\s+", r"\1.", part.strip())  # '[activation_checkpoint] mode'
            part = re.sub(r"\s*\(with [^)]*\)$", "", part)  # '--mtp-num-layers (with ...)': read.keys reads that key
            tokens = part.split()
            if knob == "dropout":  # the knob names every dropout key it sets (attention, hidden): each is read
                for key in tokens:
                    table.setdefault(normalize(key), []).append(Meaning(knob))
                continue
            key, word = tokens[0], tokens[1] if len(tokens) > 1 and not tokens[1].startswith("-") else None
            if "=" in key and not key.startswith("-"):
                key, word = key.split("=", 1)
            if "|" in (word or ""):
                word = None
            table.setdefault(normalize(key), []).append(Meaning(knob, word))
    return table


def read_section(framework: str) -> ReadSection:
    """The card's `read` section (cards/frameworks/<name>.yaml): the keys that are no adapter knob."""
    return framework_card(framework).read or NO_READ


def lookup(table: dict[str, list[Meaning]], key: str) -> list[Meaning]:
    """The meanings of a file's key: exact, or by its dotted tail (a card's `tensor_parallel_degree` is the TOML's
    `parallelism.tensor_parallel_degree`, verl's `override_transformer_config.x` its full Hydra path)."""
    key = normalize(key)
    if key in table:
        return table[key]
    parts = key.split(".")
    for k in range(1, len(parts)):
        tail = ".".join(parts[k:])
        if (tail in table and "." in tail) or (tail in table and "_" in tail and k == len(parts) - 1):
            return table[tail]
    return []


def misspelt_hint(key: str, table: dict[str, list[Meaning]]) -> str:
    """' (did you mean K?)' when a key no table entry reads is one spelling slip from one it reads (its last dotted
    part against theirs: `tensor_paralel_degree`), so a typo in a file is said where the key is, not dropped."""
    last = normalize(key).split(".")[-1]
    known = {k.split(".")[-1] for k in table}
    hits = difflib.get_close_matches(last, known, n=1, cutoff=0.9) if last not in known else []
    return f" (did you mean {hits[0]}? meshplan reads that one; this one it leaves out)" if hits else ""


def _field_type(name: str) -> Any:
    annotation = Request.model_fields[name].annotation
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        annotation = inner[0] if len(inner) == 1 else annotation
    return annotation


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().strip("'\"").lower()
    return {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
            "off": False}.get(text)


def _whole(value: Any) -> int:
    """A whole number as a file writes it (8, "8", 8.0, "8.0"); 2.5, inf, '1e3' (argparse's type=int refuses it) or a
    list is an error in these words, never truncated to 2 nor worded as int()'s own message."""
    try:
        if isinstance(value, float) or (isinstance(value, str) and "." in value):
            number = float(value)
            if number.is_integer():
                return int(number)
        elif isinstance(value, (int, str)):
            return int(value)
    except ValueError:
        pass
    raise ValueError(f"expected a whole number, got {value!r}")


def _real(value: Any) -> float:
    """A number as a file writes it (0.5, "0.5", 1, "1e-3"); anything else an error in these words."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {value!r}")


def convert(name: str, value: Any) -> Any:
    """A file's value as the request field `name` takes it; raises ValueError when it cannot be one."""
    kind = _field_type(name)
    if isinstance(value, str):
        value = value.strip().strip("'\"")
    if kind is bool:
        out = as_bool(value)
        if out is None:
            raise ValueError(f"expected true or false, got {value!r}")
        return out
    if kind is int:
        if isinstance(value, bool):
            raise ValueError(f"expected a whole number, got {value!r}")
        return _whole(value)
    if kind is float:
        return _real(value)
    if get_origin(kind) is list:
        items = value if isinstance(value, list) else re.split(r"[,\s]+", str(value).strip("[]"))
        return [str(i).strip().strip("'\"") for i in items if str(i).strip()]
    return str(value)


@dataclass
class Reading:
    """What one file states: request fields with their source line, the other values the framework code combines
    (nodes, dp_shard ...), what is left to the framework's default, what meshplan cannot express."""

    framework: str
    path: str
    variant: str | None = None
    request: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    extra: dict[str, tuple[Any, Setting]] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    misspelt: list[str] = field(default_factory=list)  # ImportedConfig.misspelt
    unresolved: list[str] = field(default_factory=list)
    left_to_request: list[LeftToRequest] = field(default_factory=list)  # ImportedConfig.left_to_request (leave)
    notes: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)  # ImportedConfig.assumed
    unread: set[str] = field(default_factory=set)  # targets a key names with no value (`--nnodes=$NODES`, unset)
    batch_per_dp: int | None = None  # ImportedConfig.batch_per_dp
    allocator_env: list[Setting] = field(default_factory=list)  # PYTORCH_(CUDA_)ALLOC_CONF the launch sets (launch.py)
    launch_line: str | None = None  # `path:line launcher` of the training command a launch script runs (launch.py)
    config_variable: str | None = None  # ImportedConfig.config_variable
    beside: dict[str, Setting] = field(default_factory=dict)  # ImportedConfig.beside_stated, by the card's key

    def leave(self, fields: tuple[str, ...], said: str) -> None:
        """An unresolved line that these request fields, given beside the file, settle."""
        self.unresolved.append(said)
        self.left_to_request.append(LeftToRequest(fields=list(fields), said=said))

    def state(self, name: str, value: Any, source: Setting | str) -> None:
        """Sets request field `name` from the file; a value the field cannot take is an error naming the line."""
        where = source.where(self.path) if isinstance(source, Setting) else source
        if value is True and isinstance(source, Setting) and source.alone and _field_type(name) is not bool:
            # `--micro-batch-size $MBS` with MBS unset (set at launch): the flag stands alone, as `--flag=$MBS` gives ""
            self.unresolved.append(f"{where}: no value (an unset variable?)")
            return
        try:
            value = convert(name, value)
            Request.model_validate({"model": "x", name: value})
        except ValidationError as exc:
            detail = exc.errors(include_url=False)[0]["msg"]
            raise MeshplanError(f"{where}: {value!r} is not a valid {name} ({detail}).",
                                fix=f"meshplan's {name}: {Request.model_fields[name].description}") from None
        except (ValueError, TypeError) as exc:
            detail = str(exc)
            raise MeshplanError(f"{where}: {value!r} is not a valid {name} ({detail}).",
                                fix=f"meshplan's {name}: {Request.model_fields[name].description}") from None
        self.request[name] = value
        self.sources[name] = where

    def default(self, name: str, value: Any, why: str) -> None:
        if name not in self.request and name not in self.defaults:
            self.defaults[name] = value
            self.notes.append(f"{name} = {value}: left to the framework's default ({why})")

    def value(self, name: str) -> Any:
        return self.extra[name][0] if name in self.extra else None

    def whole(self, name: str, least: int = 1) -> int | None:
        """The extra `name` as a whole number of at least `least` (None: the file does not set it); anything else
        ('abc', 2.5, 1e400, a list, 0 layers per stage) is the file's error, named with its line."""
        if name not in self.extra:
            return None
        return whole_value(self, *self.extra[name], least=least)


def lora_rank(reading: Reading, s: Setting) -> int | None:
    """A LoRA rank as verl takes it (model.lora_rank, model.lora.rank): 0, its default, is no LoRA ('rank 0 to
    disable', trainer/config/model/hf_model.yaml; fsdp_workers.py: _is_lora = lora_rank > 0), said and None; a
    positive rank stated (0 was refused as no valid rank, so verl's own configs at their default were refused)."""
    rank = whole_value(reading, s.value, s, least=0)
    if rank == 0:
        reading.notes.append(f"{s.where(reading.path)} = 0: no LoRA (verl's default), the whole model trained")
        return None
    reading.state("lora_rank", rank, s)
    return rank


def whole_value(reading: Reading, value: Any, source: Setting | str, least: int = 1) -> int:
    """`value` (a setting of the file) as a whole number of at least `least`, or a MeshplanError naming its line."""
    try:
        number = None if isinstance(value, bool) else _whole(str(value).strip("'\"") if isinstance(value, str)
                                                             else value)
    except (ValueError, TypeError, OverflowError):
        number = None
    if number is None or number < least:
        where = source.where(reading.path) if isinstance(source, Setting) else source
        raise MeshplanError(f"{where}: {value!r} is not a whole number of at least {least}.",
                            fix="Fix the value in the file.")
    return number


def apply(reading: Reading, settings: list[Setting], table: dict[str, list[Meaning]],
          special: frozenset[str] = frozenset()) -> list[tuple[Setting, Meaning]]:
    """States every setting whose meaning is direct (a value or switch knob, a request field of read.keys); returns
    the settings left for the framework's own reader (`special` knobs, composed values, zero stage ...)."""
    left: list[tuple[Setting, Meaning]] = []
    section = read_section(reading.framework)
    beside = beside_keys(reading.framework)
    for s in settings:
        if old := section.old_names.get(normalize(s.key)):  # an older release's name: read as the key it became
            reading.notes.append(f"{s.where(reading.path)} = {s.value}: {old.said}")
            s = replace(s, key=old.key, written=s.written or s.key)
        if (card_key := beside.get(normalize(s.key))) is not None:  # a key a fix writes beside a field's own
            reading.beside[card_key] = s
        meanings = lookup(table, s.key)
        if not meanings:
            if section.quantized_base is not None and normalize(s.key) in section.quantized_base.keys:
                quantized_base(reading, s, section.quantized_base)
            elif (section.lora_target_parameters is not None
                  and normalize(s.key) in section.lora_target_parameters.keys):
                target_parameters_kept(reading, s, section.lora_target_parameters)
            elif said := section.said.get(normalize(s.key)):
                reading.notes.append(f"{s.where(reading.path)} = {s.value}: {said}")
            elif not IRRELEVANT.search(normalize(s.key).lstrip("-")):
                hint = misspelt_hint(s.key, table)
                said = f"{s.where(reading.path)} = {s.value}: no meshplan field{hint}"
                reading.unsupported.append(said)
                if hint:  # the key is one slip from one meshplan reads
                    reading.misspelt.append(said)
            continue
        if s.value == "" or s.value is None:
            reading.unresolved.append(f"{s.where(reading.path)}: no value (an unset variable?)")
            reading.unread.update(m.target for m in meanings)
            continue
        for m in meanings:
            try:
                if _direct(reading, s, m, special):
                    continue
            except MeshplanError:
                raise
            except (ValueError, TypeError) as exc:  # a special conversion (dropout's float ...): the file's error
                raise MeshplanError(f"{s.where(reading.path)}: {s.value!r} is not a value meshplan reads for "
                                    f"{m.target} ({exc}).", fix="Fix the value in the file, or drop the key and "
                                                                "pass the field beside the file.") from None
            left.append((s, m))
    return left


# Request fields whose key, set to null, states a value rather than leaving the framework's default: Megatron-Core's
# TransformerConfig.mtp_num_layers None builds no MTP block (megatron/core/transformer/transformer_config.py; the
# provider of Megatron-Bridge and SkyRL's transformer_config_kwargs set it over the checkpoint's depth)
NULL_STATES = {"mtp_num_layers": (0, "None: Megatron-Core builds no MTP block")}


def _direct(reading: Reading, s: Setting, m: Meaning, special: frozenset[str]) -> bool:
    value = s.value
    if m.target in special:
        return False
    null = str(value).strip("'\"") in ("null", "None", "~")
    if null and m.target in NULL_STATES:
        stated, why = NULL_STATES[m.target]
        reading.state(m.target, stated, f"{s.where(reading.path)} ({why})")
        return True
    if null and (m.target in VALUE_KNOBS or m.target in
                                                              Request.model_fields):
        reading.notes.append(f"{s.where(reading.path)} = null: the framework's default")
        return True
    if m.target == "dp_replicate" and s.key.endswith("fsdp_size"):  # verl: the shard group's size, not replicas
        if int(str(value).strip("'\"")) > 0:
            reading.notes.append(f"{s.where(reading.path)} = {value}: states sharded over {value} ranks; set "
                                 f"dp_replicate = dp*cp / {value} (hybrid sharding, not read from the group size)")
        return True
    if m.target == LORA_EXCLUDE:  # what it leaves out is settled once the targets and model are read
        reading.extra[LORA_EXCLUDE] = (value, s)
    elif m.target == "lora_targets":
        targets = lora_targets(reading, s)
        if targets:
            reading.state("lora_targets", targets, s)
    elif m.target in VALUE_KNOBS:
        reading.state(m.target, list_value(m.target, s), s)
    elif m.target in SWITCH_KNOBS:
        on = True if value is True else as_bool(value)
        if m.word is not None:
            on = str(value) == m.word
        elif on is not None and normalize(s.key).startswith("--no-"):  # Megatron-LM's store_false flags
            on = not on
        # a value no switch takes goes on as written, so the error names it ('maybe'), not None
        reading.state(m.target, str(value).strip().strip("'\"") if on is None else on, s)
    elif m.target.startswith("recompute_") and m.target[len("recompute_"):] in ("selective", "full"):
        text = str(value).strip("'\"").lower()
        if as_bool(value) is not None and m.word is None:  # a switch (--checkpoint-activations, a true/false key)
            reading.state("recompute", m.target[len("recompute_"):] if as_bool(value) else "none", s)
        elif m.word is None or text == m.word:
            value = "none" if text in ("null", "none", "false") else text
            if value in get_args(Recompute):
                reading.state("recompute", value, s)
            else:  # torchtitan's memory_budget (the partitioner picks what to save): said once, not refused
                said = (f"{s.where(reading.path)} = {text}: a recompute mode meshplan does not model "
                        f"({', '.join(get_args(Recompute))}); pass --recompute")
                if said not in reading.unsupported:  # the key means both recompute knobs
                    reading.unsupported.append(said)
                reading.unread.add("recompute")
    elif m.target.startswith("fp8_") and m.word is not None:
        if str(value).strip("'\"") == m.word:
            reading.state("fp8_recipe", m.word, s)
    elif m.target in ("grad_reduce_bf16", "grad_reduce_fp32"):
        # a dtype named: torchtitan's mixed_precision_reduce, an FSDP2 reduce_dtype (verl's, SkyRL's, AutoModel's)
        dtype = DTYPE_NAMES.get(str(value).strip("'\"").lower().removeprefix("torch."))
        if dtype in ("fp32", "bf16"):
            reading.state("grad_reduce_in_fp32", dtype == "fp32", s)
        elif m.word is not None:  # one key for both knobs, each with the value it takes (Bridge's grad_reduce_in_fp32)
            if as_bool(value) == as_bool(m.word):
                reading.state("grad_reduce_in_fp32", m.target == "grad_reduce_fp32", s)
        else:
            on = True if value is True else as_bool(value)
            reading.state("grad_reduce_in_fp32", (m.target == "grad_reduce_fp32") == bool(on), s)
    elif m.target == "dropout":
        # on where any of the file's dropout keys (attention, hidden) is above 0
        reading.state("dropout", dropout_probability(reading, s) > 0 or reading.request.get("dropout") is True, s)
    elif m.target == "gpus_per_node" and str(value).strip("'\"").lower() in LOCAL_WORLD_WORDS:
        # torchrun's --nproc_per_node gpu/auto/cpu/xpu: the node's device count at launch, not in the file; world()
        # then says num_gpus is unresolved (or reads the request's gpus_per_node given beside the file)
        reading.extra.setdefault("gpus_per_node", (value, s))
        word = LOCAL_WORLD_WORDS[str(value).strip("'\"").lower()]
        reading.notes.append(f"{s.where(reading.path)} = {value}: {word} (torch/distributed/run.py "
                             "determine_local_world_size), a count the file does not say")
    elif m.target == "attention_backend":
        values = {v: k for k, v in (knob_value_map(reading.framework, reading.variant) or {}).items() if v}
        # a bare switch (Megatron-DeepSpeed's store_true --use-flash-attn-v2) is read as 'true', as its card names it
        text = str(value).lower() if isinstance(value, bool) else str(value).strip("'\"").removeprefix("AttnBackend.")
        if text in values:
            reading.state("attention_backend", values[text], s)
        elif text == "auto":
            reading.state("attention_backend", "auto", s)
        else:
            reading.unsupported.append(f"{s.where(reading.path)} = {text}: no meshplan attention_backend")
    elif m.target == "pipeline_schedule":
        _schedule(reading, s)
    elif m.target == "moe_flex_dispatcher":  # Megatron-Core's moe_token_dispatcher_type: the dispatcher by its name
        _dispatcher(reading, s)
    elif m.target == "moe_flex_backend":  # read once the dispatcher is known (flex_backend_setting)
        reading.extra["moe_flex_backend"] = (value, s)
    elif m.target == "activation_offload_layers":  # read beside its switch, where it has one (layer_offload_setting)
        reading.extra["activation_offload_layers"] = (value, s)
    elif m.target in CUDA_GRAPH_TARGETS:
        cuda_graph_setting(reading, s, m.target)
    elif m.target == "optimizer_state_dtype":  # the key is the precision-aware switch (precision_aware_optimizer)
        reading.extra["precision_aware_optimizer"] = (value, s)
    elif m.target in Request.model_fields:
        reading.state(m.target, value, s)
    elif null:  # a value the framework's reader combines (verl's ppo_micro_batch_size: null, OmegaConf's None): unset,
        reading.notes.append(f"{s.where(reading.path)} = null: the framework's default")  # was read as 'null' and
        return True  # refused as no whole number, so verl's own trainer YAMLs were refused
    else:
        reading.extra.setdefault(m.target, (value, s))
        return True
    return True


# Megatron-Core's CUDA-graph keys (the card's cuda_graphs knob key, cuda_graph_impl, and its read.keys): 0.19's
# cuda_graph_modules, the cuda_graph_scope it replaced, and the enable_cuda_graph / external_cuda_graph switches before
CUDA_GRAPH_TARGETS = frozenset({"cuda_graphs", "cuda_graph_modules", "cuda_graph_scope", "enable_cuda_graph",
                                "external_cuda_graph"})
LEGACY_GRAPH_SWITCHES = {"enable_cuda_graph": "local", "external_cuda_graph": "transformer_engine"}


def cuda_graph_setting(reading: Reading, s: Setting, target: str) -> None:
    """A CUDA-graph key as Megatron-Core 0.19's TransformerConfig.__post_init__ reads it: cuda_graph_impl; the modules
    ('full', deprecated, is the whole layer: no module); the older cuda_graph_scope, whose 'full_iteration' is the
    full-iteration implementation (get_deprecated_cuda_graph_modules_migration) and whose other values are modules;
    enable_cuda_graph (local) and external_cuda_graph (transformer_engine). Modules under no implementation have no
    effect there and are not read."""
    if target in LEGACY_GRAPH_SWITCHES:
        if as_bool(s.value):
            reading.state("cuda_graph_impl", LEGACY_GRAPH_SWITCHES[target], s)
        return
    if target == "cuda_graphs":
        impl = str(s.value).strip().strip("'\"")
        if reading.request.get("cuda_graph_impl") == "full_iteration" and impl == "local":
            return  # the older API's full iteration: --cuda-graph-impl local with --cuda-graph-scope full_iteration
        reading.state("cuda_graph_impl", impl, s)
        if impl == "none" and reading.request.pop("cuda_graph_modules", None) is not None:
            reading.notes.append(f"{s.where(reading.path)} = none: the CUDA-graph modules have no effect")
        return
    modules = [m for m in convert("cuda_graph_modules", list_value("cuda_graph_modules", s)) if m != "full"]
    if target == "cuda_graph_scope" and "full_iteration" in modules:
        reading.state("cuda_graph_impl", "full_iteration", s)
        modules = [m for m in modules if m != "full_iteration"]
    if reading.request.get("cuda_graph_impl") == "none":
        reading.notes.append(f"{s.where(reading.path)} = {s.value}: no effect under cuda_graph_impl none")
    elif modules:
        reading.state("cuda_graph_modules", modules, s)


def list_value(name: str, s: Setting) -> Any:
    """A setting's value as the field `name` takes it: a list field's with the words after it (settings.Setting.more:
    `--recompute-modules mla_up_proj moe_act`), any other field's as it stands."""
    if s.more and get_origin(_field_type(name)) is list:
        return [s.value, *s.more]
    return s.value


def _dispatcher(reading: Reading, s: Setting) -> None:
    """A moe_token_dispatcher_type as meshplan's moe_token_dispatcher (the two it estimates, alltoall and flex, keep
    their names); Megatron-Core's allgather (its TransformerConfig default) meshplan does not time, so it is said,
    never read as one of the two. Read by no branch, a flex dispatcher was dropped and the job estimated as
    alltoall."""
    text = str(s.value).strip("'\"")
    if text in get_args(MoeDispatcher):
        reading.state("moe_token_dispatcher", text, s)
    else:
        reading.unsupported.append(f"{s.where(reading.path)} = {text}: meshplan estimates the "
                                   f"{' and '.join(get_args(MoeDispatcher))} dispatchers only")


def lora_targets(reading: Reading, s: Setting) -> list[str]:
    """A target_modules value as Megatron target names: Megatron-Bridge's own names as they are, all-linear (verl's
    and SkyRL's PEFT default, what render writes for all four) as the four, Hugging Face projection names as the
    linears they make up (verl's and SkyRL's FSDP engines run PEFT); a projection that is no whole linear (q_proj
    without k_proj and v_proj) is said, not dropped; Bridge's path patterns as the targets they adapt (read_patterns).
    Read as the field itself, every PEFT value was refused."""
    names = read_patterns(reading, s, convert("lora_targets", s.value))
    if names == [ALL_LINEAR]:
        reading.extra[PEFT_ALL_LINEAR] = (ALL_LINEAR, s)
        return list(DEFAULT_TARGETS)
    projections = {name for name in names if name not in TARGETS}
    made = projection_targets(projections)
    whole = [t for t in TARGETS if t in names or t in made]
    left = sorted(projections - {p for t in made for p in HF_PROJECTIONS[t]})
    if left:
        linears = ", ".join(f"{t} = {' + '.join(HF_PROJECTIONS[t])}" for t in TARGETS)
        reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: {', '.join(left)} adapt part of a fused "
                                   "linear (or no projection meshplan knows); meshplan adapts whole linears: "
                                   + linears)
    return whole


PEFT_VARIANTS = ("fsdp", "sft-fsdp")
"""The adapter variants whose target_modules Hugging Face PEFT reads (verl's and SkyRL's FSDP engines), not Bridge."""
BRIDGE_PATTERNS = "lora_bridge_patterns"
"""The Reading.extra entry of a target_modules with Bridge path patterns: ({target: places} of the targets only
patterns name, the setting), which patterns_on_model compares with the model's places once the model is known."""


def read_patterns(reading: Reading, s: Setting, names: list[str]) -> list[str]:
    """The targets a Bridge engine's target_modules with path patterns adapts somewhere (the rest of `names` is
    returned as it is, for keys.lora_targets); a pattern naming layers is said and refused an estimate."""
    if reading.variant in PEFT_VARIANTS or not any(is_pattern(n) for n in names):
        return names
    patterns = [n for n in names if is_pattern(n)]
    every, some = pattern_places(patterns)
    bridge = patterns + [n for n in names if n in TARGETS]
    reading.extra[BRIDGE_PATTERNS] = ({t: p for t, p in every.items() if t not in names}, s)  # a bare name: as ever
    if some:
        reading.unsupported.append(
            f"{s.where(reading.path)} = {s.value}: {', '.join(some)} adapt(s) some decoder layers only (Bridge matches "
            "a path with the layer's index within its pipeline stage); meshplan adapts a target on every layer; "
            + LORA_NOT_MODELLED)
    if others := other_places(patterns):
        reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: adapts the {' and '.join(others)} too, "
                                   "which meshplan counts no adapter on")
    return [t for t in TARGETS if every.get(t) or t in names] + [n for n in names if n not in bridge]


PEFT_ALL_LINEAR = "lora_all_linear"
"""The Reading.extra entry of a target_modules that is PEFT's all-linear, which all_linear_that_fails looks at once the
file's model is known."""


LORA_NOT_MODELLED = "meshplan estimates no LoRA job from this file"
"""What the `unsupported` line of a LoRA key meshplan does not count ends with (a Bridge target pattern on some layers
only, an exclude_modules it cannot place); request_values refuses a LoRA request from the file, whose estimate would
leave it out."""


def target_parameters_kept(reading: Reading, s: Setting, facts: TargetParameterKeys) -> None:
    """PEFT's target_parameters: on an engine that passes it to PEFT, kept for lora_keys.target_parameters_read (read
    once the file's LoRA rank is known); on another engine, said as not read there."""
    if reading.variant in facts.variants:
        reading.extra[TARGET_PARAMETERS] = s
    else:
        reading.notes.append(f"{s.where(reading.path)} = {s.value}: not read by the engine the file runs "
                             f"({reading.variant}); only {', '.join(facts.variants)} read it")


LORA_EXCLUDE = "lora_exclude"
"""The Reading.extra entry, and the cards' read.keys name, of a LoRA exclude_modules (PEFT's LoraConfig,
Megatron-Bridge's LoRA): (the value, the setting), which lora_keys.exclusions_applied takes out of the targets."""


BASE_NOT_MODELLED = "meshplan estimates no job from this file"
"""What the `unsupported` line of a quantized base (read.quantized_base: AutoModel's QLoRA) ends with; request_values
refuses every request from the file, whose estimate would hold the base in bf16."""


def quantized_base(reading: Reading, s: Setting, facts: QuantizedBase) -> None:
    """A switch loading the base weights quantized: on, said as not modelled (the file's estimates refused); off, the
    bf16 base meshplan estimates. The framework tests the switch's truth (create_bnb_config: `if config.load_in_4bit`),
    so a value neither true nor false nor null is on."""
    on = as_bool(s.value)
    if on is True or (on is None and str(s.value) not in ("null", "")):
        reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: {facts.what}; {BASE_NOT_MODELLED}")
    else:
        reading.notes.append(f"{s.where(reading.path)} = {s.value}: off, the base weights in bf16 as meshplan "
                             "estimates them")


TARGET_PARAMETERS = "lora_target_parameters"
"""The Reading.extra entry of PEFT's target_parameters (read.lora_target_parameters), for
lora_keys.target_parameters_read."""


SPLIT_NOT_READ = "pass --first-stage-layers/--last-stage-layers"
"""What an unread pipeline split's line in `unresolved` ends with (request_values refuses a request from the file that
gives neither first nor last stage layers: estimating an even split in place of the file's would be wrong)."""


def state_stage_split(reading: Reading, counts: list[int], source: Setting | str) -> str | None:
    """The decoder layers of each pipeline stage (vpp 1) stated as first/last stage layers, each where it differs from
    the middle stages (the split meshplan estimates: the middle stages share the rest evenly, schedule.layers_per_rank);
    None, or why the split is none meshplan states (then nothing is stated): a stage without a decoder layer among
    them (meshplan's stages each hold one at least)."""
    pp = int(reading.request.get("pp", 1))
    if len(counts) != pp:
        return f"{len(counts)} model parts for pp={pp} (virtual stages of an uneven split)"
    empty = [index for index, count in enumerate(counts) if count < 1]
    if empty:
        return (f"stage {empty[0]} of {pp} holds no decoder layer (the split {counts}); meshplan's pipeline stages "
                "hold one at least")
    if pp > 1 and layers_per_rank(sum(counts), pp, counts[0], counts[-1])[0] != counts:
        return f"the middle stages' layers {counts[1:-1]} are not an even share of the rest"
    middle = counts[1] if pp > 2 else None
    for name, count in (("first_stage_layers", counts[0]), ("last_stage_layers", counts[-1])):
        if pp > 1 and count != middle:
            reading.state(name, count, source)
    return None


LOCAL_WORLD_WORDS = {
    "gpu": "torchrun starts one process per GPU of the node",
    "auto": "torchrun starts one process per GPU of the node (per CPU without CUDA)",
    "cpu": "torchrun starts one process per CPU core of the node",
    "xpu": "torchrun starts one process per XPU of the node",
}
"""What torchrun's --nproc_per_node takes beside a number (torch/distributed/run.py determine_local_world_size)."""


def dropout_probability(reading: Reading, s: Setting) -> float:
    """A dropout value as a probability from 0 to 1; anything else (nan, inf, -0.1, 1.5) is the file's error: nan
    would otherwise compare as dropout off."""
    text = str(s.value).strip("'\"")
    try:
        p = float(text)
    except ValueError:
        p = math.nan
    if not 0.0 <= p <= 1.0:
        raise MeshplanError(f"{s.where(reading.path)}: {text!r} is not a dropout probability (a number from 0 to 1).",
                            fix="Fix the value in the file (0 turns dropout off), or drop the key and pass dropout "
                                "beside the file.")
    return p


def schedule_named(framework: str, text: str) -> str | None:
    """The pipeline_schedule a framework's schedule name is (its card's pipeline.schedules, any case: torch's
    get_schedule_class ignores case), or None when the card names no such schedule."""
    for order, name in framework_card(framework).pipeline.schedules.items():
        if name.lower() == text.strip("'\"").lower():
            return SCHEDULE_OF_ORDER[order]
    return None


def _schedule(reading: Reading, s: Setting) -> None:
    """A schedule the file names, stated where it is not the framework's default (1F1B, or its interleaved form, which
    vpp says); one meshplan has no value for is reported."""
    named = schedule_named(reading.framework, str(s.value))
    if named is None:
        reading.unsupported.append(f"{s.where(reading.path)} = {s.value}: no meshplan pipeline_schedule")
    elif named not in (framework_card(reading.framework).pipeline.order, "interleaved_1f1b"):
        reading.state("pipeline_schedule", named, s)


def knob_value_map(framework: str, variant: str | None) -> dict[str, str | None] | None:
    card = framework_card(framework)
    section = adapter_section(card)
    table = knob_table(card, section.default_version, variant or next(iter(section.variants)))
    knob = table.get("attention_backend")
    return knob.values if knob else None


# Adam moments' dtypes as Megatron-LM's --exp-avg-dtype and Megatron-Bridge's OptimizerConfig (torch dtypes) name them
MOMENT_DTYPES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
                 "float16": "fp16", "fp8": "fp8", "uint8": "fp8"}


def precision_aware_optimizer(reading: Reading) -> None:
    """optimizer_state_dtype from Megatron-Core's precision-aware optimizer switch (--use-precision-aware-optimizer,
    optimizer.use_precision_aware_optimizer) and the moments' dtype (--exp-avg-dtype, optimizer.exp_avg_dtype): the
    dtype only counts with the switch on (megatron/core/optimizer/__init__.py passes exp_avg_dtype to the optimizer
    only under use_precision_aware_optimizer); the switch on without a dtype is fp32 moments, the default. The second
    moment's own dtype (exp_avg_sq_dtype, which render writes beside the first) is read too: the same, nothing to say
    (it was "no meshplan field"); another, said, since the one field holds both."""
    switch, dtype = reading.extra.get("precision_aware_optimizer"), reading.extra.get("exp_avg_dtype")
    on = switch is not None and (switch[0] is True or bool(as_bool(switch[0])))
    _main_grads(reading, on)
    if (switch is None and dtype is None) or "optimizer_state_dtype" in reading.request:
        return
    second = reading.extra.get("exp_avg_sq_dtype")  # Adam's second moment, its own setting
    if dtype is None:
        if on and second is not None and MOMENT_DTYPES.get(_torch_dtype(second[0])) != "fp32":
            reading.unsupported.append(f"{second[1].where(reading.path)} = {second[0]}: the second moment in another "
                                       "dtype than the first (fp32, exp_avg_dtype's default); meshplan's "
                                       "optimizer_state_dtype holds both in one, and the estimate takes fp32 for both")
        elif on:
            reading.notes.append(f"{switch[1].where(reading.path)}: the precision-aware optimizer with its default "
                                 "fp32 moments")
        return
    if not on:
        reading.notes.append(f"{dtype[1].where(reading.path)} = {dtype[0]}: the moments' dtype applies only with the "
                             "precision-aware optimizer, which the file leaves off")
        return
    name = MOMENT_DTYPES.get(_torch_dtype(dtype[0]))
    if name is None:
        reading.unsupported.append(f"{dtype[1].where(reading.path)} = {dtype[0]}: no meshplan optimizer_state_dtype")
        return
    reading.state("optimizer_state_dtype", name, dtype[1])
    if second is not None and MOMENT_DTYPES.get(_torch_dtype(second[0])) != name:
        reading.unsupported.append(f"{second[1].where(reading.path)} = {second[0]}: the second moment in another "
                                   f"dtype than the first ({dtype[0]}); meshplan's optimizer_state_dtype holds both "
                                   f"in one, and the estimate takes {name} for both")


def _main_grads(reading: Reading, on: bool) -> None:
    """grad_reduce_in_fp32 from verl's optim.main_grads_dtype: the DDP gradient buffer's dtype, and so its reduction's,
    under the precision-aware switch only (verl 0.9.1 workers/engine/megatron/transformer_impl.py
    _resolve_override_ddp_config; utils/megatron/optimizer.py passes it to the optimizer under the same switch)."""
    grads = reading.extra.get("main_grads_dtype")
    if grads is None or "grad_reduce_in_fp32" in reading.request:
        return
    name = MOMENT_DTYPES.get(_torch_dtype(grads[0]))
    if name == "fp32":
        return  # verl's default: nothing to say
    if not on:
        reading.notes.append(f"{grads[1].where(reading.path)} = {grads[0]}: the gradient buffer's dtype applies only "
                             "with the precision-aware optimizer, which the file leaves off (fp32 gradients)")
    elif name == "bf16":
        reading.state("grad_reduce_in_fp32", False, grads[1])
    else:
        reading.unsupported.append(f"{grads[1].where(reading.path)} = {grads[0]}: verl takes fp32 or bf16 gradients "
                                   "(McoreOptimizerConfig); no meshplan grad_reduce_in_fp32")


def _torch_dtype(value: Any) -> str:
    """A dtype as a file writes it ('torch.bfloat16', bf16) without quotes or the torch. prefix."""
    return str(value).strip("'\"").removeprefix("torch.")


def sequence_parallel_default(reading: Reading, tp: int, where: str) -> None:
    """The framework's sequence parallelism beside TP, for the file's model where the card turns it off for some kinds
    (defaults.sequence_parallel_off_for: KempnerForge's MoE and tied-embedding models, and its pipeline stages): from
    the model the file describes and its pp, or, where it names no model, left to the model the request will give
    (resolve decides it then)."""
    defaults = framework_card(reading.framework).defaults
    pp = reading.request.get("pp", 1)
    kinds = [k for k in defaults.sequence_parallel_off_for if k != "pipeline"]
    on = bool(defaults.sequence_parallel_when_tp and tp > 1 and defaults.sequence_parallel_in_pipeline(pp))
    if tp <= 1 or not kinds or not on:
        off = "" if defaults.sequence_parallel_in_pipeline(pp) else f" (off in its pipeline stages: pp {pp})"
        reading.default("sequence_parallel", on, f"{where} defaults.sequence_parallel_when_tp{off}, tp {tp}")
    elif "model" in reading.request:
        on = defaults.sequence_parallel_with_tp(resolve_model(reading.request["model"]), pp)
        reading.default("sequence_parallel", on, f"{where} defaults.sequence_parallel_when_tp, off for "
                                                 f"{' and '.join(kinds)} models; {reading.request['model']}, tp {tp}")
    elif "sequence_parallel" not in reading.request:
        reading.notes.append(f"sequence_parallel: the framework's default depends on the model ({where} "
                             f"defaults.sequence_parallel_off_for: off for {' and '.join(kinds)} models), which the "
                             "file does not name; meshplan sets it from the model you give")


def flex_backend_setting(reading: Reading) -> None:
    """moe_flex_backend from the file's flex dispatcher backend (Megatron-Core's moe_flex_dispatcher_backend, NeMo
    AutoModel's model.backend.dispatcher), beside the flex dispatcher only: Megatron-Core's alltoall dispatcher never
    reads the field (Megatron-Bridge's recipes set it beside alltoall, apply_flex_dispatcher_backend switching to
    flex only on a GPU it allows), so there it is said, not read. A backend meshplan does not time (ncclep, UCCL-EP)
    is said too: the estimate is of the default backend."""
    stated = reading.extra.get("moe_flex_backend")
    if stated is None or "moe_flex_backend" in reading.request:
        return
    value, s = stated
    text = str(value).strip().strip("'\"")
    if text.lower() in ("none", "null", ""):
        return
    if reading.request.get("moe_token_dispatcher") != "flex":
        if text in get_args(FlexBackend):
            reading.notes.append(f"{s.where(reading.path)} = {text}: no effect beside the "
                                 f"{reading.request.get('moe_token_dispatcher', 'default')} dispatcher (only flex "
                                 "reads its backend)")
        return
    if text in get_args(FlexBackend):
        reading.state("moe_flex_backend", text, s)
    else:
        reading.unsupported.append(f"{s.where(reading.path)} = {text}: meshplan times the flex dispatcher on "
                                   f"{' or '.join(get_args(FlexBackend))} only; the estimate takes the default "
                                   "backend")


def layer_offload_setting(reading: Reading) -> None:
    """activation_offload_layers from the file's cpu_offloading_num_layers, where Megatron-Core offloads those
    layers: Megatron-LM's validate_args turns cpu_offloading on from the count (core_v0.19.0 arguments.py), a
    TransformerConfig given whole (Megatron-Bridge's model provider: the card's read.keys name its switch) only with
    cpu_offloading true; cpu_offloading_activations false offloads nothing (Transformer Engine's weight offload does
    nothing, cards/offload.yaml layer_offload_source). A count of 0, or one the switch leaves off, is said."""
    stated = reading.extra.get("activation_offload_layers")
    if stated is None or "activation_offload_layers" in reading.request:
        return
    value, s = stated
    if str(value).strip("'\"") in ("null", "None", "~"):
        return
    layers = whole_value(reading, value, s, least=0)
    has_switch = "cpu_offloading" in read_section(reading.framework).keys.values()
    switch = reading.extra.get("cpu_offloading")
    on = as_bool(switch[0]) if switch is not None else not has_switch
    activations = reading.extra.get("cpu_offloading_activations")
    if activations is not None and as_bool(activations[0]) is False:
        on = False
    if not layers or not on:
        why = "0 layers" if not layers else "cpu_offloading_activations false" if on is False and activations \
            is not None and as_bool(activations[0]) is False else "cpu_offloading not set true beside it"
        reading.notes.append(f"{s.where(reading.path)} = {value}: no layer offloaded ({why})")
        return
    reading.state("activation_offload_layers", layers, s)


def fill_defaults(reading: Reading) -> None:
    """What the file leaves to the framework, with that default as the framework card states it."""
    precision_aware_optimizer(reading)
    flex_backend_setting(reading)
    layer_offload_setting(reading)
    card, where = framework_card(reading.framework), f"cards/frameworks/{reading.framework}.yaml"
    request = reading.request
    for name in ("tp", "pp", "cp", "ep", "vpp"):
        reading.default(name, 1, "every framework's default degree")
    if reading.variant != "fsdp":
        reading.default("zero_stage", card.defaults.zero_stage, f"{where} defaults.zero_stage")
    tp = request.get("tp", 1)
    sequence_parallel_default(reading, tp, where)
    if request.get("ep", 1) > 1:
        reading.default("etp", tp if card.defaults.etp == "tp" else 1, f"{where} defaults.etp")
    if request.get("precision") == "fp8" and card.defaults.fp8_recipe:
        reading.default("fp8_recipe", card.defaults.fp8_recipe, f"{where} defaults.fp8_recipe")
    if "recompute" not in reading.unread:  # (a ds_config's is its own: files.read_deepspeed_json)
        reading.default("recompute", "none", "no recompute unless the file turns it on")
    reading.default("attention_backend", "auto", f"the framework's own pick, {where} attention")
    if request.get("cuda_graph_modules") and request.get("cuda_graph_impl", "none") == "none":
        request.pop("cuda_graph_modules")  # Megatron-Core captures nothing under cuda_graph_impl none (its default)
        reading.notes.append(f"cuda_graph_modules at {reading.sources.pop('cuda_graph_modules')}: no effect without "
                             "cuda_graph_impl (Megatron-Core's default none)")
    if getattr(card, "compile", None) is not None:
        reading.default("torch_compile", card.compile.default, f"{where} compile.default")
    allocator = card.allocator_for(request.get("job") == "rl")  # verl's SFT trainer sets none, its RL workers do
    if allocator is not None:
        launched = f"; the file is taken as launched by {allocator.launch_script}: {allocator.how}" \
            if allocator.launch_script else ""
        reading.default("expandable_segments", allocator.expandable_segments, f"{where} allocator{launched}")
