"""How meshplan does on published production configurations, used as a user would use it.

Data: ../shared/validation/production_configs_dev.yaml (124 published production or expert-tuned
configurations, each with its model, hardware, workload, parallelism, memory settings and, where the source
gives them, measured throughput and peak memory). Every item really ran or is an official recipe.

Method (no per-row constants, nothing fitted):
- Each row becomes one `meshplan.schema.contract.Request`, the object every face of meshplan takes, and is scored
  through `meshplan.api` (check_config, estimate_memory, estimate_throughput), as a user would call them.
  - model: the catalog key whose architecture agrees with every model field the row states (layers, hidden,
    FFN, heads, KV heads, vocabulary, experts, top-k, expert FFN, shared experts, dense layers, MLA); among
    equal architectures the one the row's model id names. Otherwise a config.json built from the row's
    model fields (HF model_type from the row's family, FAMILY_MODEL_TYPE) in a temporary folder; a field the
    row leaves out comes from the catalog card of that model_type with the nearest hidden size (a note).
  - gpu: the catalog GPU the row's gpu_type names, when its memory is the row's gpu_memory_gb (within 3%);
  - framework: the meshplan framework the row's framework string names (FRAMEWORK_WORDS, first match);
  - tp/pp/vpp/cp/ep/etp/dp, micro/global batch, sequence, precision, recompute, ZeRO/FSDP, sequence
    parallelism, dispatcher and first/last stage layers as the row states them; what it leaves unstated is
    left to meshplan's defaults (and `resolve` notes them).
- Megatron's recompute modules and uniform/block method, torchtitan's per-op SAC, a pipeline layout string the
  row gives and account_for_embedding/loss are passed to the Request as the row states them (recompute_for,
  stage_layers). A row that states no split of its own gets the one the sources it names set for its model, pp,
  vpp and MTP layers (RECIPE_SPLITS: Megatron-Bridge's layout helpers and perf recipes, its base recipes'
  account_for_*, Megatron-MoE-ModelZoo's scripts), each entry citing its path.
- What the launcher a row cites sets for every run it makes is passed too: Megatron-Bridge's performance-table runs
  reduce gradients in bf16 (perf_table_fields), verl's example scripts pack each micro-batch to a token budget of
  the row's seq_length (dynamic_batch_fields), and a measured study's recipe sets its optimizer precision
  (study_recipe_fields: Bridge's Moonlight recompute study ran the 8-H100 recipe's bf16 moments and main grads).
- A setting the row uses that meshplan cannot express yet (KNOBS: a layout named but not given, offload,
  precision-aware optimizer, FP8 recipes, RL phases, a GPU or model type outside the catalog...) is recorded
  as "not expressible: <knob>", and the row is still scored with the nearest expressible settings: those rows
  are counted apart from the fully expressible ones.
- A row that cannot be scored at all (no model dimensions, no sequence length, no GPU of its kind) is
  counted with its reason: every row either maps or says why not.

Compared:
- fit: of the rows with stated memory settings (`stated_memory_settings`: the row states its recompute;
  every row that offloads states it too, an unstated offload is none), how many meshplan predicts to fit:
  its peak within the GPU's memory (meshplan's own `fits`; for a GPU outside the catalog, the row's own
  gpu_memory_gb in GiB). Rows whose estimate a rule error blocks are counted as refused.
- rule errors: error findings of check_config other than the memory ones (MEM*), with their ids; the
  memory verdict is the fit count above.
- peak memory: the row's peak_memory_gb_per_gpu is in GB (1e9 bytes: the two rows that also give GiB
  agree only so). What it measured is read from the row (`peak_convention`): "allocated" when the row says
  so, torchtitan rows "reserved" (torchtitan logs max_reserved_gib, torchtitan/components/metrics.py
  DeviceMemoryMonitor), else "not stated". meshplan's peak (the worst stage) is compared as
  bench/memory_accuracy.py does: reserved = peak - CUDA context; allocated = peak - context - allocator
  reserve; not stated = the device total meshplan reports.
- throughput: tokens/s per GPU where the row gives it, else its TFLOP/s per GPU turned into tokens/s with
  meshplan's model FLOPs per token (Megatron's causal formula; a source that counted otherwise shows up as
  error). RL rows (their step includes the rollout) and runs the source marks as not absolute throughput
  are left out, with the reason.

Run: python bench/production_configs.py [--rows] [--issue] [--validation DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml

from meshplan import api
from meshplan.arithmetic.flops import model_flops_per_token
from meshplan.arithmetic.memory_states import memory_card
from meshplan.arithmetic.schedule import format_layout, parse_layout
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.cards import framework_card, model_card, model_card_names
from meshplan.knowledge.hardware import get_gpu, gpu_catalog
from meshplan.knowledge.models import catalog_architecture, resolve_model
from meshplan.request.resolve import resolve
from meshplan.rules.engine import memory_rules
from meshplan.schema.contract import FRAMEWORKS, Architecture, RecomputeModule, Request

GIB = 1 << 30
GB = 10**9
DEFAULT_VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
DATA_NAME = "production_configs_dev.yaml"

# --------------------------------------------------------------------------- vocabulary

# Settings the rows use that meshplan cannot express yet: knob -> (what it changes, the issue-14 field or
# the nearest meshplan setting the row is scored with).
KNOBS: dict[str, tuple[str, str]] = {
    "recompute_modules": ("memory, time", "issue 14 `recompute_modules` (Megatron modules other than core_attn); "
                          "scored as recompute=selective (core_attn)"),
    "selective_ac_option": ("memory, time", "torchtitan selective AC whose `selective_ac_option` the row does not "
                            "state; scored as recompute=selective, meshplan's torchtitan default op-level SAC"),
    "optimizer_state_dtype": ("memory", "bf16 moments on a framework without Megatron's precision-aware optimizer; "
                              "scored with fp32 moments"),
    "pipeline_layout": ("memory, time", "a pipeline layout the row names without its string and no source it "
                        "names gives for its model, pp and vpp (RECIPE_SPLITS); scored with the even split"),
    "account_for_embedding": ("memory, time", "issue 14 `account_for_embedding`; scored without"),
    "account_for_loss": ("memory, time", "issue 14 `account_for_loss`; scored without"),
    "rl_phases": ("memory", "RL job: the GPU also holds a rollout engine between phases; scored as training only"),
    "dynamic_batch": ("memory, time", "verl use_dynamic_bsz (token-budget micro-batches); scored at mbs x seq"),
    "lora": ("memory, time", "LoRA whose rank and targets neither the row nor a recipe it cites states; scored as "
             "job=lora with the framework's default rank and targets (LORA_RECIPES)"),
    "hsdp": ("memory, time", "HSDP (shard inside a group, replicate across); scored as full sharding"),
    "framework": ("memory, time", "a framework meshplan has no card for; scored with the nearest card"),
    "gpu": ("time", "a GPU outside the catalog; scored on the nearest catalog GPU, fit judged against the "
            "row's own memory"),
    "model_type": ("memory, time", "an architecture meshplan cannot describe; scored as the nearest model_type"),
    "cuda_graphs": ("memory, time", "CUDA graphs (static memory pools); scored without"),
    "torch_compile": ("memory, time", "torch.compile of the blocks only (torchtitan before it compiled the loss too, "
                      "TORCHTITAN_LOSS_COMPILED_SINCE), or on a framework without a compile card; scored eager"),
}

# The meshplan framework a row's framework string names: the first of these words it contains.
FRAMEWORK_WORDS = (
    ("verl", "verl"),
    ("megatron-bridge", "megatron-bridge"),
    ("torchtitan", "torchtitan"),
    ("megatron-core", "megatron-core"),
    ("nemo", "megatron-core"),  # NeMo 1.x/2 train with Megatron-Core (the row says so, or its CP/VPP need it)
)
# Frameworks without a card, by the word that names them, and the card they are scored with.
NEAREST_FRAMEWORK = (("fsdp", "torchtitan"),)  # PyTorch FSDP1 (LLM Foundry / Composer, fms-fsdp) -> FSDP2

# HF model_type of each model family of the file; families meshplan cannot describe have a nearest type.
FAMILY_MODEL_TYPE = {
    "llama2": "llama", "llama3": "llama", "gpt3": "gpt2", "nemotron3": "nemotron", "nemotron4": "nemotron",
    "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3", "deepseek_v2": "deepseek_v2",
    "glm4_moe": "glm4_moe", "olmoe": "olmoe", "gpt_oss": "gpt_oss",
}
NEAREST_MODEL_TYPE = {
    "mpt": ("gpt2", "MPT (ALiBi positions, no biases)"),
    "qwen3_next": ("glm4_moe", "Qwen3-Next (gated-DeltaNet hybrid attention)"),
}
# Extra config.json fields of a model_type the row cannot state (its activation).
MODEL_TYPE_EXTRAS = {"nemotron": {"hidden_act": "relu2"}, "gpt2": {"activation_function": "gelu_new"}}

UNSTATED = ("not stated",)


class Unmapped(Exception):
    """A row that cannot become a request at all; the message says why."""


@dataclass
class Mapping:
    """One row as a meshplan request, with what could not be said and what was assumed."""

    row_id: str
    request: Request | None = None
    unmapped: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)  # knob -> what the row says
    notes: list[str] = field(default_factory=list)
    capacity_bytes: int | None = None
    model_source: str = ""
    stated_memory: bool = False

    @property
    def exact(self) -> bool:
        """Mapped with every setting the row states."""
        return self.request is not None and not self.knobs

    def exact_for(self, effect: str) -> bool:
        """Mapped with every setting that changes `effect` ("memory" or "time")."""
        return self.request is not None and not any(effect in KNOBS[k][0] for k in self.knobs)


# --------------------------------------------------------------------------- reading a row


def load_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        rows = yaml.safe_load(fh)
    if not isinstance(rows, list):
        raise SystemExit(f"{path}: expected a list of configurations")
    return rows


def _text(*values: Any) -> str:
    return " ".join(str(v) for v in values if v is not None)


def stated_memory_settings(row: dict[str, Any]) -> bool:
    """The row states its recompute (memory.recompute neither null nor "not stated ..."). Every row that
    offloads states its recompute too, and an unstated offload is none; an unstated micro-batch is meshplan's
    (and Megatron's) default of 1, which only one such row leaves unstated."""
    recompute = row["memory"]["recompute"]
    return recompute is not None and not str(recompute).lower().startswith(UNSTATED)


# --------------------------------------------------------------------------- model


def _catalog_value(arch: Architecture, name: str) -> Any:
    moe = arch.moe
    return {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.ffn_hidden_size if (moe is None or len(moe.moe_layers) < arch.num_layers) else None,
        "num_attention_heads": arch.num_attention_heads,
        "num_kv_heads": arch.num_kv_heads,
        "vocab_size": arch.vocab_size,
        "num_experts": moe.num_experts if moe else None,
        "top_k": moe.top_k if moe else None,
        "moe_ffn_hidden_size": moe.expert_ffn_hidden_size if moe else None,
        "shared_experts": moe.num_shared_experts if moe else None,
        "dense_layers": arch.num_layers - len(moe.moe_layers) if moe else None,
        "mla": arch.mla is not None,
    }[name]


MATCH_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                "vocab_size", "num_experts", "top_k", "moe_ffn_hidden_size", "shared_experts", "dense_layers", "mla")


def catalog_match(model: dict[str, Any]) -> str | None:
    """The catalog key whose architecture agrees with every model field the row states; None if none does.
    Equal architectures (Llama 3 and 3.1) are told apart by the row's model id, as a user would name it."""
    if model["num_layers"] is None or model["hidden_size"] is None or model["num_attention_heads"] is None:
        return None
    dense_row = model["arch_type"] == "dense"
    hits = []
    for key in model_card_names():
        arch = catalog_architecture(key)
        if (arch.moe is None) != dense_row:
            continue
        if all(model[f] is None or model[f] == _catalog_value(arch, f) for f in MATCH_FIELDS):
            hits.append(key)
    if len(hits) > 1:
        try:
            named = resolve_model(str(model["id"])).key
        except MeshplanError:
            named = None
        if named in hits:
            return named
    return hits[0] if hits else None


def _nearest_card(model_type: str, hidden: int) -> Architecture | None:
    """The catalog architecture of this model_type with the nearest hidden size."""
    archs = [a for a in map(catalog_architecture, model_card_names()) if a.model_type == model_type]
    return min(archs, key=lambda a: abs(a.hidden_size - hidden), default=None)


def build_config(row: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """A config.json dict from the row's model fields: (config, notes, knobs)."""
    m = row["model"]
    knobs: dict[str, str] = {}
    family = m["family"]
    if family in FAMILY_MODEL_TYPE:
        model_type = FAMILY_MODEL_TYPE[family]
    elif family in NEAREST_MODEL_TYPE:
        model_type, what = NEAREST_MODEL_TYPE[family]
        knobs["model_type"] = f"{what}: scored as model_type {model_type}"
    else:
        raise Unmapped(f"model family {family!r} ({m['attention']}) has no meshplan model_type and the row "
                       "records no dimensions to build one")
    missing = [f for f in ("num_layers", "hidden_size", "num_attention_heads") if m[f] is None]
    if missing:
        raise Unmapped(f"model dimensions not recorded ({', '.join(missing)}): {m['id']}")
    h = m["hidden_size"]
    cfg: dict[str, Any] = {
        "model_type": model_type, "num_hidden_layers": m["num_layers"], "hidden_size": h,
        "num_attention_heads": m["num_attention_heads"], "num_key_value_heads": m["num_kv_heads"],
        "intermediate_size": m["ffn_hidden_size"], "vocab_size": m["vocab_size"],
        **MODEL_TYPE_EXTRAS.get(model_type, {}),
    }
    if model_type == "gpt2":
        cfg.update(n_embd=h, n_layer=m["num_layers"], n_head=m["num_attention_heads"], n_inner=m["ffn_hidden_size"],
                   n_positions=row["workload"]["seq_length"])
    if m["num_experts"]:
        experts = {"qwen3_moe": {"num_experts": m["num_experts"], "moe_intermediate_size": m["moe_ffn_hidden_size"]},
                   "glm4_moe": {"n_routed_experts": m["num_experts"], "moe_intermediate_size": m["moe_ffn_hidden_size"],
                                "n_shared_experts": m["shared_experts"] or 0,
                                "first_k_dense_replace": m["dense_layers"] or 0}}
        if model_type not in experts:
            raise Unmapped(f"MoE model of type {model_type} not in the catalog and not buildable from the row")
        cfg.update(num_experts_per_tok=m["top_k"], **experts[model_type])
    notes = []
    near = _nearest_card(model_type, h)
    for key, attr in (("num_key_value_heads", "num_kv_heads"), ("intermediate_size", "ffn_hidden_size"),
                      ("vocab_size", "vocab_size")):
        if cfg[key] is None:
            if near is None:
                raise Unmapped(f"model field {key} not stated and no catalog {model_type} model to take it from")
            cfg[key] = getattr(near, attr)
            notes.append(f"{key} not stated: {cfg[key]} from catalog {near.key}")
    return {k: v for k, v in cfg.items() if v is not None}, notes, knobs


def mtp_disabled(row: dict[str, Any]) -> bool:
    return bool(re.search(r"\bMTP\b[^;]*\bdisabled", _text(row["precision"], row["outcome"]["other"]), re.I))


def model_for(row: dict[str, Any], workdir: Path) -> tuple[str, str, list[str], dict[str, str]]:
    """(Request.model, where it came from, notes, knobs)."""
    key = catalog_match(row["model"])
    folder = workdir / row["id"]
    if key is not None and not (mtp_disabled(row) and catalog_architecture(key).num_mtp_layers):
        return key, f"catalog {key}", [], {}
    if key is not None:  # the catalog config with the MTP block off, as the row ran it
        cfg, source, notes, knobs = dict(model_card(key).config), f"catalog {key} config, MTP off", [], {}
        cfg["num_nextn_predict_layers"] = 0
    else:
        cfg, notes, knobs = build_config(row)
        source = f"config.json ({cfg['model_type']})"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return str(path), source, notes, knobs


# --------------------------------------------------------------------------- hardware and framework


def gpu_for(hardware: dict[str, Any]) -> tuple[str, int, dict[str, str]]:
    """(catalog GPU, the memory the fit is judged against, knobs). The catalog GPU whose name the row's
    gpu_type starts with and whose memory is the row's; else the nearest catalog GPU of the same family
    (same letters, closest number), with the fit judged against the row's own memory."""
    name = str(hardware["gpu_type"]).split()[0]
    row_bytes = int(hardware["gpu_memory_gb"] * GIB)
    parts = name.split("-")
    for n in range(len(parts), 0, -1):
        try:
            gpu = get_gpu("-".join(parts[:n]))
        except MeshplanError:
            continue
        if abs(gpu.memory_bytes / GIB - hardware["gpu_memory_gb"]) <= 0.03 * hardware["gpu_memory_gb"]:
            return gpu.key, gpu.memory_bytes, {}
        return gpu.key, row_bytes, {"gpu": f"{hardware['gpu_type']}: scored as {gpu.key} ({gpu.memory_bytes / GIB:.0f} "
                                           f"GiB), fit against {hardware['gpu_memory_gb']} GiB"}
    head = re.match(r"([A-Za-z]+)(\d+)", parts[0])
    if head:
        letters, number = head.group(1).lower(), int(head.group(2))
        family = [(k, int(m.group(2))) for k in gpu_catalog()
                  if (m := re.match(r"([a-z]+)(\d+)", k)) and m.group(1) == letters]
        if family:
            key = min(family, key=lambda kn: abs(kn[1] - number))[0]
            return key, row_bytes, {"gpu": f"{hardware['gpu_type']}: scored as {key}, fit against "
                                           f"{hardware['gpu_memory_gb']} GiB"}
    raise Unmapped(f"GPU {hardware['gpu_type']} is not in the catalog and has no catalog GPU of its family")


def framework_for(text: str) -> tuple[str, dict[str, str]]:
    low = text.lower()
    for word, name in FRAMEWORK_WORDS:
        if word in low:
            return name, {}
    for word, name in NEAREST_FRAMEWORK:
        if word in low:
            return name, {"framework": f"{text}: scored as {name}"}
    raise Unmapped(f"framework {text!r} names no meshplan framework ({', '.join(FRAMEWORKS)})")


# --------------------------------------------------------------------------- memory and precision settings


# torchtitan's llama3_8b.toml sets [activation_checkpoint] mode = "selective", selective_ac_option = "op"
# (torchtitan/models/llama3/train_configs/llama3_8b.toml): a row that runs that file's default is op-level SAC.
TITAN_OP_WORDS = ("per-op", "op-level", "llama3_8b.toml default")
# Only llama3_8b.toml sets mode = "selective" with selective_ac_option = "op": at 9dec370 (2024-12-26, the 2024-12
# benchmarks' pin; train_configs/llama3_8b.toml) and e7c0cae (2025-06-13, the Trainy pin;
# torchtitan/models/llama3/train_configs/llama3_8b.toml); the 70B and 405B files set mode = "full", so selective there
# would take the JobConfig default option "2". A torchtitan Llama 3 8B row with selective AC and no option ran the
# file's "op": (model family, total parameters in billions) of the train configs that set it.
TITAN_OP_TOMLS = {("llama3", 8.0)}


def recompute_for(row: dict[str, Any], framework: str) -> tuple[str | None, dict[str, Any], dict[str, str]]:
    """(Request.recompute, the other Request recompute fields, knobs). Megatron's selective modules the row lists
    are recompute_modules (its default core_attn left out); Megatron's "full, uniform, N layer" is
    recompute_method=uniform with recompute_layers=N; torchtitan's per-op SAC is selective_ac_option="op". A
    selective AC that does not say which option stays a knob (meshplan's torchtitan selective is op-level)."""
    text = row["memory"]["recompute"]
    if text is None or str(text).lower().startswith(UNSTATED):
        return None, {}, {}
    low = str(text).lower()
    knobs: dict[str, str] = {}
    fields: dict[str, Any] = {}
    if "offload" in low:
        fields["activation_offload"] = True
    if low.startswith("none"):
        return "none", fields, knobs
    if low.startswith("full"):
        if m := re.match(r"full, (uniform|block), (\d+) layers?$", low):
            fields |= {"recompute_method": m.group(1), "recompute_layers": int(m.group(2))}
        return "full", fields, knobs
    if "selective" in low or "sac" in low:
        modules = re.search(r"selective[^:]*:\s*([a-z_, ]+)", low)
        names = {m.strip() for m in modules.group(1).split(",")} - {""} if modules else set()
        if "default modules" in low or names == {"core_attn"}:
            return "selective", fields, knobs
        if names and names <= set(get_args(RecomputeModule)):
            fields["recompute_modules"] = sorted(names)
        elif names:
            knobs["recompute_modules"] = ", ".join(sorted(names))
        elif framework == "torchtitan" and (any(w in low for w in TITAN_OP_WORDS) or (
                row["model"]["family"], row["model"]["total_params_b"]) in TITAN_OP_TOMLS):
            fields["selective_ac_option"] = "op"
        elif framework == "torchtitan" or "per-op" in low or "selective ac" in low:
            knobs["selective_ac_option"] = f"{text} (option not stated; scored as op-level SAC)"
        else:
            knobs["recompute_modules"] = str(text)
        return "selective", fields, knobs
    raise Unmapped(f"recompute setting {text!r} not understood")


def precision_for(row: dict[str, Any], framework: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(Request.precision, the precision fields, knobs): the fp8 recipe the row names (mxfp8, blockwise, current
    scaling = tensorwise; torchtitan's float8 of the 0.2 line = tensorwise, its Float8Linear default; a bare "fp8"
    leaves the card's default), fp8 parameter all-gather, and Megatron's precision-aware optimizer (bf16 moments;
    "bf16 grads/moments" also bf16 gradient reduction). A setting the row's framework has no knob for stays a knob."""
    text = str(row["precision"])
    low = text.lower()
    knobs: dict[str, str] = {}
    fields: dict[str, Any] = {}
    megatron = framework in ("megatron-core", "megatron-bridge", "verl", "skyrl")
    sharding = str(row["parallelism"]["zero_or_distributed_optimizer"]).lower()
    words = _text(low, row["outcome"]["other"]).lower()
    if re.search(r"bf16 optimizer states|precision-aware optimizer|bf16 grads/moments", words):
        if megatron:
            fields["optimizer_state_dtype"] = "bf16"
            if "bf16 grads/moments" in words:
                fields["grad_reduce_in_fp32"] = False
        else:
            knobs["optimizer_state_dtype"] = "precision-aware optimizer (bf16 moments)"
    fp8 = re.sub(r"\bfp8 disabled|and fp8 disabled", "", low)
    if not re.search(r"fp8|float8", fp8):
        return "bf16", fields, knobs
    if re.search(r"fp8 param gather|float8 all-gather", f"{low} {sharding}"):
        fields["fp8_param_gather"] = True
    main = fp8.split("(")[0]
    for word, recipe in (("mxfp8", "mxfp8"), ("blockwise", "blockwise"), ("current", "tensorwise"),
                         ("tensorwise", "tensorwise"), ("float8", "tensorwise")):
        if word in main:
            fields["fp8_recipe"] = recipe
            break
    return "fp8", fields, knobs


def optimizer_for(row: dict[str, Any]) -> dict[str, Any]:
    """Request.optimizer: muon where the row's optimizer or notes name Muon (left out: adam)."""
    text = _text(row["parallelism"]["zero_or_distributed_optimizer"], row["outcome"]["other"]).lower()
    return {"optimizer": "muon"} if "muon" in text else {}


def zero_for(row: dict[str, Any]) -> tuple[int | None, dict[str, str]]:
    p = row["parallelism"]
    text = str(p["zero_or_distributed_optimizer"] or "")
    low = text.lower()
    knobs: dict[str, str] = {}
    if "hsdp" in low or (p["fsdp"] and p["fsdp"] < p["dp"]):
        knobs["hsdp"] = f"shard group {p['fsdp']} of dp {p['dp']}"
    if re.search(r"fsdp|zero-3|hsdp", low) or p["fsdp"]:
        return 3, knobs
    if "no distributed optimizer for muon" in low:
        # Bridge's Muon recipes turn use_distributed_optimizer off but name optimizer="dist_muon"
        # (recipes/utils/optimizer_utils.py distributed_muon_with_cosine_annealing), which training/optim.py passes
        # as layer_wise_distributed_optimizer: Megatron-Core's layer-wise distributed optimizer shards the
        # optimizer states over DP (optimizer/layer_wise_optimizer.py), meshplan's zero_stage=1 with optimizer=muon
        return 1, knobs
    if "no distributed optimizer" in low:
        return 0, knobs
    if "distributed optimizer" in low:
        return 1, knobs
    return None, knobs


def offload_fields(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(Request offload fields, knobs) from the row's offload text: verl's phase offloads (param/grad, OFFLOAD_OPTIM
    or ALL_OFFLOAD for the optimizer) and Megatron-Core's in-step CPU optimizer (optimizer_offload_fraction, or
    "optimizer CPU offload" = all of it); every offload a row names is expressible now (issue 14)."""
    text = _text(row["memory"]["offload"], row["parallelism"]["zero_or_distributed_optimizer"]).lower()
    fields: dict[str, Any] = {}
    if not text or "offload" not in text:
        return fields, {}
    everything = "all_offload" in text or "full param/grad/optimizer" in text
    if everything or "param/grad offload" in text:
        fields["param_offload"] = True  # verl 0.9.1's param_offload releases the gradient buffers too (its card)
    if everything or "offload_optim=true" in text:
        fields["optimizer_offload"] = True
    fraction = re.search(r"optimizer_offload_fraction=([\d.]+)|fraction ([\d.]+)", text)
    if fraction:
        fields["optimizer_offload_fraction"] = float(fraction.group(1) or fraction.group(2))
    elif "optimizer cpu offload" in text:
        fields["optimizer_offload"] = True  # Megatron-Core: the whole optimizer on the CPU
    return fields, {}


# --------------------------------------------------------------------------- what a cited launcher sets for every run

# Megatron-Bridge's performance tables (docs/performance-summary.md and its archive) were measured with its
# performance launchers, which reduce gradients in bf16 for every model: scripts/performance/configs/*/*.yaml
# `grad_reduce_in_fp32: false` (2025-09), each model's set_<model>_common_configs in
# scripts/performance/configs/<model>/*_llm_pretrain.py (2025-11 to 2026-04, e.g. c4fc11d2e), and since then every
# flat perf recipe through perf_recipes/_common.py _benchmark_common and _perf_precision (cfg.ddp.grad_reduce_in_fp32
# = False; of the perf recipes only GLM-5's and WAN's set it back, no row here). The bf16 grad buffer is 2 B/param,
# not the 4 of the hardware recipes' bf16_mixed.
BRIDGE_PERF_TABLE = "megatron-bridge docs/performance-summary"


def perf_table_fields(row: dict[str, Any]) -> dict[str, Any]:
    """grad_reduce_in_fp32=False for a row from Megatron-Bridge's performance tables (BRIDGE_PERF_TABLE)."""
    return {"grad_reduce_in_fp32": False} if BRIDGE_PERF_TABLE in _text(row["source"]["citation"]).lower() else {}


# Measured studies whose rows cite the study, not the recipe it ran, where the study's text names the recipe:
# (words the row's citation and location both hold) -> (recipe, the optimizer fields that recipe sets, source).
# NVIDIA-NeMo/Megatron-Bridge a67b5735d skills/nemo-mbridge-perf-activation-recompute/SKILL.md "Matched H100 Evidence:
# Moonlight 16B": "The Moonlight 16B BF16 pretraining recipe ran on 8 H100 80GB GPUs ... TP=2, PP=1, CP=1, EP=8" at
# Bridge 600d069; the one such recipe there is recipes/moonlight/h100/moonlight_16b.py
# moonlight_16b_pretrain_8gpu_h100_bf16_config, which sets use_precision_aware_optimizer=True with bf16 exp_avg /
# exp_avg_sq and bf16 main grads, and MixedPrecisionConfig(grad_reduce_in_fp32=False). The same text says a native
# 8-H100 layout "failed during FP32 optimizer-state initialization".
STUDY_RECIPES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("nemo-mbridge-perf-activation-recompute", "moonlight"): (
        "moonlight_16b_pretrain_8gpu_h100_bf16_config",
        {"optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False}),
}


def study_recipe_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The optimizer fields of the recipe a measured study ran (STUDY_RECIPES), for a row citing that study."""
    cited = _text(row["source"]["citation"], row["source"].get("location")).lower()
    for words, (_, fields) in STUDY_RECIPES.items():
        if all(w in cited for w in words):
            return dict(fields)
    return {}


# verl example scripts the RL rows cite that train with actor.use_dynamic_bsz=True and ppo_max_token_len_per_gpu =
# max_prompt_length + max_response_length (the row's seq_length): verl packs whole sequences into micro-batches of at
# most that many tokens (times cp) and ignores ppo_micro_batch_size_per_gpu (volcengine/verl
# workers/actor/megatron_actor.py forward_backward_batch: rearrange_micro_batches(max_token_len=...)). The largest
# micro-batch is one budget of tokens: micro_batch_size 1 at the row's seq_length, not the script's 2 x seq_length.
VERL_DYNAMIC_BSZ_SCRIPTS = (
    "run_qwen3-235b_megatron_96gb.sh",  # examples/grpo_trainer/, f6f910069 (2025-08-22): (2048 + 1204*8) * 10 / 10
    "run_deepseek671b_math_megatron_96gb.sh",  # bd756c15c (2025-08-14): the same budget
    "run_qwen3moe-30b_megatron_96gb.sh",  # c281ea779 (2025-11-11): 2048 + 1024*8
)


def dynamic_batch_fields(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """micro_batch_size=1 for a verl row whose cited script packs micro-batches to a token budget equal to the row's
    seq_length (VERL_DYNAMIC_BSZ_SCRIPTS); {} otherwise."""
    cited = _text(row["source"]["citation"])
    if framework != "verl" or not any(script in cited for script in VERL_DYNAMIC_BSZ_SCRIPTS):
        return {}
    return {"micro_batch_size": 1}


# --------------------------------------------------------------------------- the pipeline split a recipe sets


@dataclass(frozen=True)
class RecipeSplit:
    """What a framework source sets for a catalog model's pipeline split: a layout for one (pp, vpp), or the
    embedding and the loss counted in the split (account_for_embedding/loss_in_pipeline_split) at any pp/vpp.
    A layout is either a string the source passes (its MTP layers m as written) or a helper's table row
    (decoder layers per virtual stage; E on the first, the model's MTP layers, where the helper places them,
    and L on the last)."""

    repo: str  # the repository a row's framework or citation must name for the entry to apply to it
    source: str  # the path (and function) in that repository
    model: str  # catalog key
    pp: int | None = None  # None: any pp and vpp
    vpp: int | None = None
    layout: str | None = None
    counts: tuple[int, ...] = ()
    mtp_before_loss: bool = False  # the helper puts the model's MTP layers before the loss
    account_for: bool = False
    section: str = ""  # the part of the source it comes from, where the source sets several for one (pp, vpp)

    def fields(self, mtp: int) -> dict[str, Any] | None:
        """The Request fields this entry sets for a model with `mtp` MTP layers; None where it does not place
        them (Megatron-Core's validate_layer_layout: the layout's m count is mtp_num_layers)."""
        if self.account_for:
            return {"account_for_embedding": True, "account_for_loss": True}
        if self.layout is not None:
            return {"pipeline_layout": self.layout} if "".join(parse_layout(self.layout)).count("m") == mtp else None
        if mtp and not self.mtp_before_loss:
            return None
        stages = ["t" * n for n in self.counts]
        stages[0] = "E" + stages[0]
        stages[-1] += "m" * mtp + "L"
        return {"pipeline_layout": format_layout(stages)}


BRIDGE = "Megatron-Bridge"
MODELZOO = "Megatron-MoE-ModelZoo"
# NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout
# (set_deepseek_v3_pipeline_model_parallel_layout, which every DeepSeek-V3 recipe and perf recipe calls, and
# scripts/performance/utils/overrides.py when pp or vp is overridden): (pp, vp) -> decoder layers per virtual stage,
# the last stage also ["mtp"] * mtp_num_layers + ["loss"] (MTP colocated with the loss, its default).
DSV3_HELPER = {(4, 1): (16, 16, 16, 13), (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
               (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,)}
# NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/kimi/h100/kimi_k2.py _get_kimi_k2_pipeline_layout (the
# Kimi-K2 recipes and perf recipes, and overrides.py): the same rows, the last stage [decoder..., "loss"] (no MTP),
# and (2, 8).
KIMI_HELPER = {**DSV3_HELPER, (2, 8): (4,) * 15 + (1,)}
RECIPE_SPLITS: tuple[RecipeSplit, ...] = (
    *(RecipeSplit(BRIDGE, "recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout", "deepseek-v3",
                  pp, vp, counts=c, mtp_before_loss=True) for (pp, vp), c in DSV3_HELPER.items()),
    *(RecipeSplit(BRIDGE, "recipes/kimi/h100/kimi_k2.py _get_kimi_k2_pipeline_layout", "kimi-k2", pp, vp, counts=c)
      for (pp, vp), c in KIMI_HELPER.items()),
    # (pp, vp) outside the helper's table: the perf recipes pass the string (set_deepseek_v3_..._layout(cfg.model, s))
    RecipeSplit(BRIDGE, "perf_recipes/deepseek/h100/deepseek_v3.py deepseek_v3_pretrain_1024gpu_h100_*_config",
                "deepseek-v3", 8, 4, layout="Et|(tt|)*30mL"),
    RecipeSplit(BRIDGE, "perf_recipes/deepseek/gb300/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb300_*_config",
                "deepseek-v3", 2, 8, layout="Et*4|(t*4|)*14tmL"),
    # the base recipe every Qwen3-235B-A22B / Llama-3.1-405B perf recipe starts from (perf_recipes/qwen/common.py,
    # perf_recipes/llama/common.py) sets both flags; the perf recipes change only pp and vpp
    RecipeSplit(BRIDGE, "recipes/qwen/h100/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config",
                "qwen3-235b-a22b", account_for=True),
    RecipeSplit(BRIDGE, "recipes/llama/h100/llama3.py llama31_405b_pretrain_256gpu_h100_bf16_config",
                "llama-3.1-405b", account_for=True),
    # yanring/Megatron-MoE-ModelZoo best_practice/deepseek-v3/run_deepseek_v3_*.sh (--pipeline-model-parallel-layout;
    # pp from PP=, vpp from the layout's stages) and model_configs/benchmarking/Qwen3-235B-A22B.yaml
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_h100.sh (1024 H100; 256 B200)", "deepseek-v3",
                8, 4, layout="Et|(tt|)*30mL"),
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_h100.sh '# Long Context' (256/512 H100)",
                "deepseek-v3", 8, 4, layout="Et*2|(tt|)*22t|(tt|)*7mL", section="long context"),
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_b200.sh", "deepseek-v3", 8, 2,
                layout="Et*4|(tttt|)*14tmL"),
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_gb200.sh, run_deepseek_v3_gb300.sh",
                "deepseek-v3", 4, 4, layout="Et*4|(tttt|)*14tmL"),
    RecipeSplit(MODELZOO, "model_configs/benchmarking/Qwen3-235B-A22B.yaml", "qwen3-235b-a22b", account_for=True),
)


def recipe_split(row: dict[str, Any], model_key: str | None, mtp: int) -> tuple[dict[str, Any], str]:
    """(Request fields, where they come from) for the split the sources the row names (its framework or citation
    naming the repository) set for its model at its pp/vpp; ({}, why not) where none does. An entry of a part of a
    source (`section`) applies where the row's citation names that part, and then before the source's others;
    entries that disagree set nothing."""
    p = row["parallelism"]
    pp, vpp = p["pp"] or 1, p["vpp"] or 1
    if pp == 1 or model_key is None:
        return {}, "no pipeline to split" if pp == 1 else "not a catalog model"
    text = _text(row["framework"], row["source"]["citation"], row["source"]["location"]).lower()
    words = re.sub(r"[-_/]", " ", text)
    found = [(s, f) for s in RECIPE_SPLITS
             if s.model == model_key and s.repo.lower() in text and s.pp in (None, pp) and s.vpp in (None, vpp)
             and (not s.section or s.section in words) and (f := s.fields(mtp)) is not None]
    found = [x for x in found if x[0].section] or found
    if not found:
        return {}, f"no source table the row names sets {model_key}'s split at pp={pp}, vpp={vpp}"
    if len({json.dumps({k: parse_layout(v) if k == "pipeline_layout" else v for k, v in f.items()}, sort_keys=True)
            for _, f in found}) > 1:  # the same stages however spelt ("t*4" or "tttt") agree
        return {}, "the sources the row names set different splits: " + "; ".join(f"{s.source}: {f}" for s, f in found)
    return found[0][1], "pipeline split from " + "; ".join(f"{s.repo} {s.source}" for s, _ in found)


def stage_layers(row: dict[str, Any], model_key: str | None = None, mtp: int = 0
                 ) -> tuple[int | None, int | None, dict[str, Any], list[str], dict[str, str]]:
    """(first_stage_layers, last_stage_layers, the other Request pipeline fields, notes, knobs) from the row's
    pipeline layout and notes. A layout string is passed as pipeline_layout when the row gives exactly one (a quoted
    one in the notes, the card's where the row sets a card's against a script's) and it parses. A row that states no
    split of its own gets the one its sources set for its model, pp, vpp and MTP layers (recipe_split): a layout it
    names but does not give, or an uneven model it runs without saying how; a named layout no source gives stays a
    knob. Stage sizes given with account_for_embedding/loss are dropped with a note: Megatron-Core's TransformerConfig
    refuses the pair, so a run that ran set one of them, and the script verl's rows cite
    (examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh, since verl#3174) passes only the accounting, its
    LAST_LAYER read but not passed."""
    p = row["parallelism"]
    text = _text(p["pp_layout"], row["outcome"]["other"])
    low = text.lower()
    first = last = None
    fields: dict[str, Any] = {}
    notes: list[str] = []
    knobs: dict[str, str] = {}
    if m := re.search(r"first/last pp stage (\d+) layers each", low):
        first = last = int(m.group(1))
    if m := re.search(r"num_layers_in_first_pipeline_stage=(\d+)|first stage (\d+) layers?", low):
        first = int(m.group(1) or m.group(2))
    if m := re.search(r"num_layers_in_last_pipeline_stage=(\d+)|last stage (\d+) layers?", low):
        last = int(m.group(1) or m.group(2))
    if "account_for_embedding" in low:
        fields["account_for_embedding"] = True
    if re.search(r"account_for_(embedding/)?loss", low):
        fields["account_for_loss"] = True
    if fields and (first is not None or last is not None):
        sizes = ", ".join(f"{k}_stage_layers={v}" for k, v in (("first", first), ("last", last)) if v is not None)
        notes.append(f"{sizes} dropped: Megatron-Core refuses stage sizes with account_for_embedding/loss; the "
                     "script passes only the accounting")
        first = last = None
    named = bool(re.search(r"\|", text) or re.search(r"pp layout", low))
    if named and (layout := layout_string(row, text)):
        fields["pipeline_layout"] = layout
    if not fields and first is None and last is None:
        recipe, why = recipe_split(row, model_key, mtp)
        if recipe:
            fields |= recipe
            notes.append(why)
        elif named:
            knobs["pipeline_layout"] = f"{text} ({why})"
    return first, last, fields, notes, knobs


def layout_string(row: dict[str, Any], text: str) -> str | None:
    """The one Megatron layout string the row states (see stage_layers), or None."""
    p = row["parallelism"]
    quoted = re.search(r'layout "([^"]+)"', text)
    card = re.match(r"\s*(\S+) \(card\) / \S+ \(modelzoo script\)", str(p["pp_layout"] or "").lower())
    if quoted:
        layout = quoted.group(1)
    elif card:
        layout = str(p["pp_layout"]).split(" (card)")[0].strip()
    else:
        return None
    try:
        parse_layout(layout)
    except MeshplanError:
        return None
    return layout


def dispatcher_for(row: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    text = str(row["parallelism"]["moe_dispatcher"] or "")
    low = text.lower()
    knobs: dict[str, str] = {}
    if "overlap" in low or "wgrad" in low:
        knobs["moe_a2a_overlap"] = text
    if not text:
        return None, knobs
    if "flex" in low or re.match(r"(deepep|hybridep)", low) or re.search(r"/(deepep|hybridep)", low):
        return "flex", knobs
    return "alltoall", knobs


@dataclass(frozen=True)
class RecipeMoe:
    """What a Megatron-Bridge perf recipe sets for its MoE run that a row citing it may not state: the EP all-to-all
    overlap (comm_overlap.overlap_moe_expert_parallel_comm with delay_wgrad_compute, the plan's moe_a2a_overlap) and
    a full-iteration CUDA graph (cuda_graph_impl "full_iteration" with moe_expert_rank_capacity_factor and the paged
    stash: a static per-rank expert capacity, so the dispatcher reads no routing counts on the host)."""

    source: str  # path under src/megatron/bridge/ (NVIDIA-NeMo/Megatron-Bridge 067f987, 2026-08-22)
    a2a_overlap: bool
    full_iteration_graph: bool = False


HYBRIDEP_FULL = "perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8"
DSV3_FULL = "perf_recipes/deepseek/common.py _enable_deepseek_full_iteration_mxfp8"
RECIPE_MOE: dict[str, RecipeMoe] = {
    "deepseek_v3_pretrain_256gpu_b200_fp8mx_config": RecipeMoe("perf_recipes/deepseek/b200/deepseek_v3.py", True),
    # partial (TE-scoped) CUDA graph there: "B200's 180 GB cannot hold the full-iteration graph for this model"
    "qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config": RecipeMoe("perf_recipes/qwen/b200/qwen3_moe.py", True),
    "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config": RecipeMoe(
        f"perf_recipes/qwen/gb200/qwen3_moe.py, {HYBRIDEP_FULL}", True, True),
    "qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config": RecipeMoe(
        f"perf_recipes/qwen/gb200/qwen3_moe.py, {HYBRIDEP_FULL}", True, True),
    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config": RecipeMoe(
        f"perf_recipes/deepseek/gb200/deepseek_v3.py, {DSV3_FULL}", True, True),
    "deepseek_v3_pretrain_1024gpu_h100_fp8cs_config": RecipeMoe("perf_recipes/deepseek/h100/deepseek_v3.py", False),
    "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config": RecipeMoe("perf_recipes/qwen/h100/qwen3_moe.py", False),
}
RECIPE_PRECISION = {"mxfp8": "fp8mx", "bf16": "bf16", "fp8": "fp8cs"}


# Megatron-Bridge's published Llama runs with TP > 1 use its perf recipes' userbuffers (the same fact as
# bench/data/megatron_bridge_published.csv's tp_comm_overlap column).
LLAMA_PERF_TP_OVERLAP = (f"{BRIDGE} perf_recipes/llama/*: tp_comm_overlap_cfg userbuffers on the base recipes' "
                         "tp_comm_overlap=True (recipes/llama/h100/llama3.py) wherever TP > 1")


# NeMo 24.07's pretraining table (NVIDIA/NeMo docs/source/performance/performance_summary.md) ran the NeMo Framework
# Launcher's default training configs; those that set userbuffers TP overlap at the 24.07 line (NVIDIA/
# NeMo-Framework-Launcher 1ab2c781, 2024-08-13, launcher_scripts/conf/training/<config>.yaml ub_tp_comm_overlap:
# True; the row's TP, PP and SP match each config). gpt3/175b and nemotron/nemotron_340b set it False, the TP-1
# configs have nothing to overlap; the SFT / LoRA rows ran other configs, not read.
NEMO_2407_TP_OVERLAP = {"gpt3_20b": "gpt3/20b", "llama2_70b": "llama/llama2_70b", "llama3_70b": "llama/llama3_70b",
                        "nemotron_8b": "nemotron/nemotron_8b", "nemotron_22b": "nemotron/nemotron_22b"}


def nemo_2407_tp_overlap(row: dict[str, Any]) -> str | None:
    """The launcher config a NeMo 24.07 pretraining row ran with ub_tp_comm_overlap True, else None."""
    rid = row["id"]
    if not rid.startswith("nemo2407_") or "_sft_" in rid or "_lora_" in rid:
        return None
    return next((cfg for part, cfg in NEMO_2407_TP_OVERLAP.items() if f"_{part}_" in rid), None)


def recipe_moe(row: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(knobs, notes) from the Megatron-Bridge perf recipe a row cites (RECIPE_MOE): the function it names, or, where
    it names only the recipe file, that file's function for its GPU count, system and precision (the recipes'
    <model>_pretrain_<n>gpu_<system>_<precision>_config naming). moe_a2a_overlap becomes the plan knob (map_row); a
    full-iteration graph stays a knob meshplan cannot express (the host syncs it removes are still timed)."""
    cited = _text(row["source"]["citation"])
    if BRIDGE.lower() not in cited.lower():
        return {}, []
    system = str(row["hardware"]["gpu_type"]).split("-")[0].lower()
    tail = f"_{row['hardware']['num_gpus']}gpu_{system}_{RECIPE_PRECISION.get(str(row['precision']), '?')}_config"
    found = [(name, r) for name, r in RECIPE_MOE.items()
             if name in cited or (name.endswith(tail) and r.source.split(" ")[0].rstrip(",") in cited)]
    if len(found) != 1:
        return {}, []
    name, r = found[0]
    knobs: dict[str, str] = {}
    if r.a2a_overlap:
        knobs["moe_a2a_overlap"] = f"{BRIDGE} {r.source} {name}"
    if r.full_iteration_graph:
        knobs["cuda_graphs"] = f"full-iteration CUDA graph, static expert capacity ({BRIDGE} {r.source} {name})"
    return knobs, [f"MoE overlap and graphs from {BRIDGE} {name}"] if knobs else []


def run_knobs(row: dict[str, Any]) -> dict[str, str]:
    """Settings from the row's notes and category: RL phases, LoRA, CUDA graphs, overlaps, compile."""
    other = _text(row["outcome"]["other"], row["source"]["location"])
    low = other.lower()
    knobs: dict[str, str] = {}
    if row["category"] == "rl":
        knobs["rl_phases"] = "actor training colocated with the rollout engine"
    if "dynamic batch" in _text(row["flags"]["caveats"]).lower():
        knobs["dynamic_batch"] = "token-budget micro-batches"
    if row["category"] == "lora":
        knobs["lora"] = "LoRA fine-tuning"
    if "cuda graph" in low:
        knobs["cuda_graphs"] = row["outcome"]["other"]
    if re.search(r"ep overlap|a2a overlap|1f1b overlap", low):
        knobs["moe_a2a_overlap"] = row["outcome"]["other"]
    if re.search(r"tp comm overlap|asynctp", _text(row["name"], other).lower()):  # the row's name states AsyncTP
        knobs["tp_comm_overlap"] = _text(row["name"], other)
    if re.search(r"\bcompile\b", _text(row["name"], other).lower()):  # the row's name states it too
        knobs["torch_compile"] = _text(row["name"], other)
    return knobs


# torchtitan compiles the loss with the blocks when compile is on since pytorch/torchtitan bbb1b616e (2025-04-02,
# build_loss_fn); its 2024-12 benchmarks compiled the blocks only, which the bool torch_compile cannot say.
TORCHTITAN_LOSS_COMPILED_SINCE = "2025-04-02"


def compile_field(row: dict[str, Any], framework: str, knobs: dict[str, str]) -> dict[str, Any]:
    """torch_compile=True for a row that states compile on a framework whose card compiles what it ran (torchtitan
    rows measured once the loss was compiled too); the knob stays recorded otherwise."""
    when = str(row["source"].get("version_or_date") or "")
    if "torch_compile" not in knobs or framework_card(framework).compile is None:
        return {}
    if framework == "torchtitan" and not (re.match(r"\d{4}-\d{2}", when) and when >= TORCHTITAN_LOSS_COMPILED_SINCE):
        return {}
    knobs.pop("torch_compile")
    return {"torch_compile": True}


# --------------------------------------------------------------------------- one row -> one request


# torchtitan's loss became chunked with ChunkedCELoss (pytorch/torchtitan PR #2937, merged 2026-04-27; the card's
# memory_convention_why): a torchtitan row measured before that ran the whole-sequence loss of the 0.2 line.
TORCHTITAN_CHUNKED_LOSS_SINCE = "2026-04-27"
# torchtitan's SDPA has run cuDNN attention first since v0.2.0 (2025-10-17; pytorch/torchtitan 6a3a9da95, the card's
# attention section): a torchtitan row measured before ran FlashAttention-2 on Hopper, as the 0.1 line did. Rows of
# other FSDP trainers scored with the torchtitan card (LLM Foundry 2023, fms-fsdp) keep the card's release: their
# loss's bytes are not torchtitan 0.1's either (knob "framework"); the kernel a run used is RUN_ATTENTION_KERNELS'.
TORCHTITAN_CUDNN_SDPA_SINCE = "2025-10-17"

# The attention kernel of a published run whose trainer meshplan scores with another framework's card, by the words
# its citation holds. LLM Foundry's benchmark tables: their launcher (mosaicml/llm-foundry
# scripts/train/benchmarking/submit_benchmarks.py, every version from 300cc5c to 5e85bd6, incl. b2a43a1 that wrote
# the H100 tables) sets the model's attn_impl from --attn_impl, default 'triton', which sweep.sh never passes:
# MPT's Triton FlashAttention (llmfoundry/models/layers/flash_attn_triton.py), cards/calibration.yaml
# attention_kernels.triton_flash_attn.
RUN_ATTENTION_KERNELS: tuple[tuple[str, str], ...] = (
    ("mosaicml/llm-foundry scripts/train/benchmarking", "triton_flash_attn"),
)


def run_attention_kernel(row: dict[str, Any]) -> str | None:
    """The attention kernel the row's run used where its framework card would pick another, else None."""
    cited = _text(row["source"]["citation"]).lower()
    return next((kernel for words, kernel in RUN_ATTENTION_KERNELS if words in cited), None)


# verl's Megatron engine forces attention_backend flash since volcengine/verl f1d212c6e (PR #3578, 2025-09-24, first
# in v0.6.0; cards/frameworks/verl.yaml attention); rows published before (a month-only date counts as before) ran
# Megatron-Core's auto, which the card gives as "0.5" (its estimated release 0.5.0).
VERL_FLASH_SINCE = "2025-09-24"
VERL_BEFORE_FLASH = "0.5.0"


def framework_version_for(row: dict[str, Any], framework: str) -> str | None:
    """The framework release a row ran, where meshplan's estimate depends on it (torchtitan's loss and attention
    kernel, verl's attention kernel), else None."""
    when = str(row["source"].get("version_or_date") or "")
    if framework not in ("torchtitan", "verl") or not re.match(r"\d{4}-\d{2}", when):
        return None
    if framework == "verl":
        return VERL_BEFORE_FLASH if when < VERL_FLASH_SINCE else None
    if when < TORCHTITAN_CUDNN_SDPA_SINCE:
        return "0.1"
    if when < TORCHTITAN_CHUNKED_LOSS_SINCE:
        return "0.2"
    return None


# verl's workers turn on expandable segments for the training phases since volcengine/verl bf56a2aa2 (PR #3181,
# 2025-08-23; Megatron workers, cards/frameworks/verl.yaml allocator); rows published before or dated by month only
# (a month-only date counts as before) trained without it: docs/perf/dpsk.md's 96-H20 DeepSeek-V3 run (measured by
# 2025-08-14, e2e4c35ec) and its 32/256-H20 Qwen3-235B rows, whose stated settings first appear in f6f910069
# (2025-08-22).
VERL_EXPANDABLE_SINCE = "2025-08-23"


# Megatron-Bridge performance recipes the rows cite whose cfg.env_vars leave expandable segments out (every other
# Bridge recipe sets it, cards/frameworks/megatron-bridge.yaml allocator): recipe function -> why.
BRIDGE_RECIPES_WITHOUT_EXPANDABLE = {
    "llama3_70b_pretrain_64gpu_gb200_fp8cs_config": "perf_recipes/llama/gb200/llama3.py: Megatron-FSDP with "
    "fsdp_double_buffer and NCCL user buffers, which Megatron-Core refuses with expandable segments before torch 2.11 "
    "(megatron/core/distributed/distributed_data_parallel_config.py, nccl_ub)",
}


def allocator_field(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """expandable_segments=False for a verl row that ran before its workers set it (a month-only date counts as
    before) and for a Bridge row whose cited recipe leaves it out; other rows keep their framework card's default
    (how its launcher sets it)."""
    when = str(row["source"].get("version_or_date") or "")
    if framework == "verl" and not when >= VERL_EXPANDABLE_SINCE:
        return {"expandable_segments": False}
    cited = _text(row["source"].get("citation"), row["source"].get("location"))
    if framework == "megatron-bridge" and any(name in cited for name in BRIDGE_RECIPES_WITHOUT_EXPANDABLE):
        return {"expandable_segments": False}
    return {}


# LoRA settings of the recipes LoRA rows cite (the rows state none): recipe function -> (rank, targets, source).
LORA_RECIPES: dict[str, tuple[int, list[str], str]] = {
    "llama3_70b_peft_8gpu_h100_fp8cs_config": (16, ["linear_qkv"], "Megatron-Bridge perf_recipes/llama/h100/llama3.py "
                                               "(cfg.peft.target_modules = ['linear_qkv']) on recipes/llama llama3_70b "
                                               "peft (dim 16, alpha 32)"),
}


def lora_for(row: dict[str, Any], framework: str, what: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(framework, Request LoRA fields, knobs) of a LoRA row: the cited recipe's rank and targets, else job=lora with
    the framework's defaults (knob "lora"); a NeMo row is scored with megatron-bridge, whose LoRA is NeMo's
    ParallelLinearAdapter carried over (megatron-core's pretrain_gpt has none, rule LORA001)."""
    knobs: dict[str, str] = {}
    if framework == "megatron-core":
        knobs["framework"] = f"{row['framework']} LoRA: scored with megatron-bridge, whose LoRA is NeMo's"
        framework = "megatron-bridge"
    cited = _text(row["source"]["citation"])
    for recipe, (rank, targets, _) in LORA_RECIPES.items():
        if recipe in cited:
            return framework, {"lora_rank": rank, "lora_targets": targets}, knobs
    return framework, {"job": "lora"}, knobs | {"lora": f"{what}: rank and targets not stated"}


def map_row(row: dict[str, Any], workdir: Path) -> Mapping:
    """The row as a Request, or the reason it cannot be one."""
    out = Mapping(row_id=row["id"], stated_memory=stated_memory_settings(row))
    try:
        w, p = row["workload"], row["parallelism"]
        if w["seq_length"] is None:
            raise Unmapped("sequence length not stated")
        framework, knobs = framework_for(row["framework"])
        gpu, capacity, k = gpu_for(row["hardware"])
        knobs |= k
        model, source, notes, k = model_for(row, workdir)
        knobs |= k
        recompute, fields, k = recompute_for(row, framework)
        knobs |= k
        precision, f, k = precision_for(row, framework)
        fields |= f
        knobs |= k
        zero, k = zero_for(row)
        knobs |= k
        fields |= optimizer_for(row)
        offload, k = offload_fields(row)
        fields |= offload
        knobs |= k
        fields |= perf_table_fields(row)
        fields |= study_recipe_fields(row)
        key = catalog_match(row["model"])
        first, last, f, n, k = stage_layers(row, key, resolve_model(model).num_mtp_layers)
        fields |= f
        notes += n
        knobs |= k
        dispatcher, k = dispatcher_for(row)
        knobs |= k
        knobs |= run_knobs(row)
        k, n = recipe_moe(row)
        knobs |= k
        notes += n
        tp_facts = framework_card(framework).tp_overlap
        if (framework == "megatron-bridge" and "performance-summary" in _text(row["source"]["citation"])
                and str(key).startswith("llama") and p["tp"] > 1):
            knobs.setdefault("tp_comm_overlap", LLAMA_PERF_TP_OVERLAP)
        launcher = nemo_2407_tp_overlap(row)
        if launcher:
            knobs.setdefault("tp_comm_overlap", f"NeMo-Framework-Launcher 1ab2c781 {launcher}.yaml ub_tp_comm_overlap")
        if "tp_comm_overlap" in knobs and tp_facts.needs_compile:  # async TP is a torch.compile pass: the run compiled
            knobs.setdefault("torch_compile", "async TP (a torch.compile pass)")
        fields |= compile_field(row, framework, knobs)
        if knobs.pop("tp_comm_overlap", None):  # a plan knob since issue 15 item 4; at tp 1 there is nothing to hide
            fields["tp_comm_overlap"] = p["tp"] > 1 and tp_facts.switch is not None
            if p["tp"] <= 1:
                notes.append("TP comm overlap stated at tp 1: no TP communication, scored without")
        fields |= allocator_field(row, framework)
        if "lora" in knobs:  # LoRA rows: job=lora, rank and targets from the recipe the row cites (issue 16 item 5)
            framework, f, k = lora_for(row, framework, knobs.pop("lora"))
            fields |= f
            knobs |= k
        moe = bool(row["model"]["num_experts"]) or row["model"]["arch_type"] != "dense"
        if moe and knobs.pop("moe_a2a_overlap", None):  # a plan knob since issue 15 item 1
            fields["moe_a2a_overlap"] = True
        if batch := dynamic_batch_fields(row, framework):  # verl's token-budget micro-batch: the knob is expressed
            w = {**w, **batch}
            knobs.pop("dynamic_batch", None)
        req = Request(
            model=model, gpu=gpu, num_gpus=row["hardware"]["num_gpus"], gpus_per_node=row["hardware"]["gpus_per_node"],
            seq_length=w["seq_length"], global_batch_size=w["global_batch_size"],
            micro_batch_size=w["micro_batch_size"],
            precision=precision, framework=framework, tp=p["tp"], pp=p["pp"], vpp=p["vpp"], cp=p["cp"],
            ep=p["ep"], etp=p["etp"], dp=p["dp"], sequence_parallel=p["sequence_parallel"], zero_stage=zero,
            recompute=recompute, moe_token_dispatcher=dispatcher if moe else None,
            first_stage_layers=first, last_stage_layers=last, framework_version=framework_version_for(row, framework),
            **fields,
        )
    except Unmapped as exc:
        out.unmapped = str(exc)
        return out
    except MeshplanError as exc:  # the request itself is refused (a model file, a field bound)
        out.unmapped = f"meshplan refuses the request: {exc}"
        return out
    out.request, out.knobs, out.notes, out.capacity_bytes, out.model_source = req, knobs, notes, capacity, source
    return out


# --------------------------------------------------------------------------- scoring


def peak_convention(row: dict[str, Any]) -> str:
    """What the row's measured peak is: allocated, reserved or not stated, from the row itself."""
    words = _text(row["outcome"]["other"], row["flags"]["memory_note"], row["source"]["location"]).lower()
    if "allocated" in words:
        return "allocated"
    if "torchtitan" in row["framework"].lower():
        return "reserved"  # torchtitan's logged memory is max_reserved_gib (components/metrics.py)
    return "not stated"


@dataclass
class Score:
    mapping: Mapping
    group: str = ""  # dense | MoE | FSDP
    rule_errors: list[str] = field(default_factory=list)  # non-memory error ids of check_config
    memory_errors: list[str] = field(default_factory=list)
    refused: str | None = None  # an estimate a rule blocks (id: message)
    peak_bytes: int | None = None
    fits: bool | None = None
    measured_peak_bytes: float | None = None
    convention: str | None = None
    compared_peak_bytes: float | None = None
    measured_tps: float | None = None
    tps_basis: str | None = None
    predicted_tps: float | None = None
    throughput_skipped: str | None = None
    over: str | None = None  # a row that does not fit: its worst stage's terms (over_note)

    @property
    def peak_error(self) -> float | None:
        if self.measured_peak_bytes is None or self.compared_peak_bytes is None:
            return None
        return self.compared_peak_bytes / self.measured_peak_bytes - 1

    @property
    def tps_error(self) -> float | None:
        if self.measured_tps is None or self.predicted_tps is None:
            return None
        return self.predicted_tps / self.measured_tps - 1


def score_row(row: dict[str, Any], mapping: Mapping) -> Score:
    score = Score(mapping)
    req = mapping.request
    if req is None:
        return score
    job, plan = resolve(req)
    score.group = "MoE" if job.model.moe is not None else ("FSDP" if plan.zero_stage == 3 else "dense")
    mem_ids = memory_rules()
    try:
        report = api.check_config(req)
    except MeshplanError as exc:
        score.refused = f"check refused: {exc}"
        return score
    for f in report.findings:
        if f.severity == "error":
            (score.memory_errors if f.id in mem_ids else score.rule_errors).append(f.id)
    try:
        memory = api.estimate_memory(req)
    except MeshplanError as exc:
        score.refused = str(exc).split("\n")[0]
        return score
    score.peak_bytes = memory.peak_bytes
    score.fits = memory.fit_bytes <= mapping.capacity_bytes  # the figure meshplan's own fit takes (memory.fit_figure)
    if not score.fits:
        score.over = over_note(memory.stages[memory.peak_stage], memory.fit_bytes - mapping.capacity_bytes)
        if memory.fit_basis == "allocated":
            score.over += "; allocated peak decides (expandable segments)"
    measured = row["outcome"]["peak_memory_gb_per_gpu"]
    if measured is not None:
        score.measured_peak_bytes = measured * GB
        score.convention = peak_convention(row)
        stage = memory.stages[memory.peak_stage]
        context = memory_card().cuda_context_bytes
        compared = float(memory.peak_bytes)
        if score.convention in ("reserved", "allocated"):
            compared -= context
        if score.convention == "allocated":
            compared -= stage.detail.get("allocator_reserve", 0)
        score.compared_peak_bytes = compared
    _score_throughput(row, req, job, score)
    return score


def over_note(stage, over: int) -> str:
    """Why a row does not fit, in the estimate's own terms: its worst stage's model states, activations and the
    rest (the caching allocator's reserve apart), and by how much it is over."""
    g = lambda n: f"{n / GIB:.1f}"  # noqa: E731
    reserve = stage.detail.get("allocator_reserve", 0)
    return (f"over by {g(over)} GiB on stage {stage.stage} ({stage.layers} layers): weights {g(stage.weights_bytes)} + "
            f"grads {g(stage.gradients_bytes)} + optimizer {g(stage.optimizer_bytes)} + activations "
            f"{g(stage.activations_bytes)} + other {g(stage.other_bytes)} (allocator reserve {g(reserve)})")


def _score_throughput(row: dict[str, Any], req: Request, job, score: Score) -> None:
    out = row["outcome"]
    if row["category"] == "rl":
        score.throughput_skipped = "RL job: the step includes the rollout"
        return
    if "not absolute throughput" in _text(row["flags"]["caveats"]).lower():
        score.throughput_skipped = "the source says: not absolute throughput"
        return
    if out["tokens_per_sec_per_gpu"] is not None:
        score.measured_tps, score.tps_basis = float(out["tokens_per_sec_per_gpu"]), "tokens/s"
    elif out["tflops_per_gpu"] is not None:
        per_token = model_flops_per_token(job.model, job.seq_length)
        score.measured_tps, score.tps_basis = float(out["tflops_per_gpu"]) * 1e12 / per_token, "TFLOP/s"
    else:
        score.throughput_skipped = "no throughput measured"
        return
    try:
        if kernel := run_attention_kernel(row):  # the run's own kernel, not the card's (RUN_ATTENTION_KERNELS)
            score.predicted_tps = estimate_throughput(*resolve(req), attention_kernel=kernel).tokens_per_s_per_gpu
        else:
            score.predicted_tps = api.estimate_throughput(req).tokens_per_s_per_gpu
    except MeshplanError as exc:
        score.throughput_skipped = f"estimate refused: {str(exc).splitlines()[0]}"


# --------------------------------------------------------------------------- summary


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class Verdicts:
    """Fit verdicts of a set of rows: fits + does not fit + refused (a rule error blocks the estimate) = rows."""

    rows: int = 0
    fit: int = 0
    not_fit: int = 0
    refused: int = 0

    def add(self, score: Score) -> None:
        self.rows += 1
        if score.fits is None:
            self.refused += 1
        elif score.fits:
            self.fit += 1
        else:
            self.not_fit += 1


@dataclass
class Errors:
    """Median |error| over the rows that have one."""

    values: list[float] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float | None:
        return median([abs(v) for v in self.values])

    @property
    def signed(self) -> float | None:
        """Median signed error: a bias (a whole group predicted too slow or too fast) the |error| hides."""
        return median(self.values)


@dataclass
class Summary:
    total: int
    mapped: int
    exact: int  # mapped with every stated setting
    unmapped: dict[str, str]  # row id -> why
    stated: int  # rows with stated memory settings, mapped or not
    fit: dict[str, Verdicts]  # "all", "exact" (every memory setting expressible), "nearest"
    rule_error_rows: dict[str, int]  # "all", "exact"
    rule_error_ids: dict[str, int]  # id -> rows
    memory_error_rows: int
    peaks: dict[str, Errors]  # "all", "exact"
    measured_peaks: int  # rows with a measured peak, mapped or not
    throughput: dict[str, Errors]  # "all", "dense", "MoE", "FSDP", "exact"
    throughput_skipped: dict[str, str]
    knob_rows: dict[str, int]  # knob -> rows that use it (mapped or not)
    knob_rows_mapped: dict[str, int]


def summarise(rows: list[dict[str, Any]], scores: list[Score]) -> Summary:
    mapped = [s for s in scores if s.mapping.request is not None]
    fit = {"all": Verdicts(), "exact": Verdicts(), "nearest": Verdicts()}
    peaks = {"all": Errors(), "exact": Errors()}
    tps = {k: Errors() for k in ("all", "dense", "MoE", "FSDP", "exact")}
    ids: Counter[str] = Counter()
    for s in mapped:
        m = s.mapping
        if m.stated_memory:
            fit["all"].add(s)
            fit["exact" if m.exact_for("memory") else "nearest"].add(s)
        if s.peak_error is not None:
            peaks["all"].values.append(s.peak_error)
            if m.exact_for("memory"):
                peaks["exact"].values.append(s.peak_error)
        if s.tps_error is not None:
            for key in ("all", s.group) + (("exact",) if m.exact_for("time") else ()):
                tps[key].values.append(s.tps_error)
        ids.update(set(s.rule_errors))
    knob_rows: Counter[str] = Counter()
    knob_rows_mapped: Counter[str] = Counter()
    for row, s in zip(rows, scores, strict=True):
        if s.mapping.request is not None:
            knob_rows.update(list(s.mapping.knobs))
            knob_rows_mapped.update(list(s.mapping.knobs))
        else:
            knob_rows.update(list(all_knobs(row)))
    return Summary(
        total=len(rows), mapped=len(mapped), exact=sum(s.mapping.exact for s in mapped),
        unmapped={s.mapping.row_id: str(s.mapping.unmapped) for s in scores if s.mapping.request is None},
        stated=sum(map(stated_memory_settings, rows)), fit=fit,
        rule_error_rows={"all": sum(bool(s.rule_errors) for s in mapped),
                         "exact": sum(bool(s.rule_errors) and s.mapping.exact for s in mapped)},
        rule_error_ids=dict(ids.most_common()),
        memory_error_rows=sum(bool(s.memory_errors) for s in mapped),
        peaks=peaks, measured_peaks=sum(r["outcome"]["peak_memory_gb_per_gpu"] is not None for r in rows),
        throughput=tps,
        throughput_skipped={s.mapping.row_id: s.throughput_skipped for s in mapped if s.throughput_skipped},
        knob_rows=dict(knob_rows.most_common()), knob_rows_mapped=dict(knob_rows_mapped),
    )


def all_knobs(row: dict[str, Any]) -> dict[str, str]:
    """The knobs of a row that does not map, read by every reader that can still run on it."""
    knobs: dict[str, str] = {}
    readers = (lambda: framework_for(row["framework"])[1], lambda: recompute_for(row, "")[-1],
               lambda: precision_for(row, framework_for(row["framework"])[0])[-1],
               lambda: zero_for(row)[1], lambda: offload_fields(row)[1],
               lambda: stage_layers(row, catalog_match(row["model"]))[-1], lambda: dispatcher_for(row)[1],
               lambda: run_knobs(row))
    for read in readers:
        try:
            knobs |= read()
        except Unmapped:
            continue
    return knobs


def run(validation: Path) -> tuple[list[dict[str, Any]], list[Score], Summary]:
    rows = load_rows(validation / DATA_NAME)
    with tempfile.TemporaryDirectory(prefix="meshplan-prodcfg-") as tmp:
        scores = [score_row(row, map_row(row, Path(tmp))) for row in rows]
    return rows, scores, summarise(rows, scores)


# --------------------------------------------------------------------------- the issue's reading


def issue_reading(rows: list[dict[str, Any]], validation: Path) -> dict[str, Any]:
    """The figures read the way issue 14's baseline read them, to show where they come from: Megatron's
    "full, uniform, 1 layer" taken as recompute_layers=1 (one layer per stage recomputed; uniform with 1
    layer per chunk recomputes every layer), fit judged against the catalog GPU meshplan was given (80 GB
    for the 96 GB H100), and the measured peak read as GiB against meshplan's full reported peak."""
    out: dict[str, Any] = {"stated": 0, "not_fit": 0, "peaks": []}
    with tempfile.TemporaryDirectory(prefix="meshplan-prodcfg-") as tmp:
        for row in rows:
            m = map_row(row, Path(tmp))
            if m.request is None:
                continue
            req = m.request
            if "uniform, 1 layer" in str(row["memory"]["recompute"]):
                req = req.model_copy(update={"recompute_method": "block", "recompute_layers": 1})
            try:
                report = api.estimate_memory(req)
            except MeshplanError:
                report = None
            if m.stated_memory:
                out["stated"] += 1
                out["not_fit"] += report is None or not report.fits
            measured = row["outcome"]["peak_memory_gb_per_gpu"]
            if measured is not None and report is not None:
                out["peaks"].append(abs(report.peak_bytes / (measured * GIB) - 1))
    out["peak_median"] = median(out["peaks"])
    return out


# --------------------------------------------------------------------------- report


def _pct(x: float | None, sign: bool = True) -> str:
    return "-" if x is None else (f"{x:+.0%}" if sign else f"{x:.1%}")


def print_rows(rows: list[dict[str, Any]], scores: list[Score]) -> None:
    for s in scores:
        m = s.mapping
        if m.request is None:
            print(f"{m.row_id:46s} NOT MAPPED: {m.unmapped}")
            continue
        verdict = "refused" if s.fits is None else ("fits" if s.fits else "OOM")
        peak = "-" if s.peak_bytes is None else f"{s.peak_bytes / GIB:6.1f} GiB"
        extra = []
        if s.rule_errors:
            extra.append("errors " + ",".join(s.rule_errors))
        if s.peak_error is not None:
            extra.append(f"peak {s.measured_peak_bytes / GB:.1f} GB {s.convention}: {_pct(s.peak_error)}")
        if s.tps_error is not None:
            extra.append(f"{s.tps_basis} {_pct(s.tps_error)}")
        if s.refused:
            extra.append(f"[{s.refused[:90]}]")
        if s.over:
            extra.append(s.over)
        knobs = ("not expressible: " + ", ".join(m.knobs)) if m.knobs else "exact"
        notes = f" | {'; '.join(m.notes)}" if m.notes else ""
        print(f"{m.row_id:46s} {'S' if m.stated_memory else '-'} {s.group:5s} {verdict:7s} {peak:>10s} "
              f"{'; '.join(extra)} | {m.model_source} | {knobs}{notes}")


def print_summary(s: Summary, issue: dict[str, Any] | None) -> None:
    print(f"rows {s.total}: mapped {s.mapped} ({s.exact} with every stated setting, {s.mapped - s.exact} with the "
          f"nearest expressible ones), not mapped {len(s.unmapped)}")
    for rid, why in s.unmapped.items():
        print(f"  not mapped: {rid}: {why}")
    print(f"stated memory settings: {s.stated} rows, {s.fit['all'].rows} mapped")
    for key, v in s.fit.items():
        print(f"  {key:8s} {v.rows:3d}: predicted to fit {v.fit}, not to fit {v.not_fit}, estimate refused {v.refused}")
    print(f"rule errors (not MEM*): {s.rule_error_rows['all']} of {s.mapped} mapped rows ({s.rule_error_rows['exact']} "
          f"of the {s.exact} exact ones); rows per id {s.rule_error_ids}; MEM* errors on {s.memory_error_rows} rows")
    print(f"peaks: {s.measured_peaks} measured, {s.peaks['all'].rows} compared: median |error| "
          f"{_pct(s.peaks['all'].median, False)} (memory-exact rows {s.peaks['exact'].rows}: "
          f"{_pct(s.peaks['exact'].median, False)})")
    print("throughput, median |error| of tokens/s per GPU (median signed): " + ", ".join(
        f"{k} {_pct(e.median, False)} ({e.rows}; {'-' if e.signed is None else f'{e.signed:+.1%}'})"
        for k, e in s.throughput.items()))
    print("not expressible (rows, of which mapped, what it changes):")
    for knob, n in s.knob_rows.items():
        print(f"  {knob:28s} {n:3d} {s.knob_rows_mapped.get(knob, 0):3d}  {KNOBS[knob][0]}")
    if issue:
        print(f"issue 14's reading: {issue['not_fit']} of {issue['stated']} stated rows not fitting; "
              f"{len(issue['peaks'])} peaks, median |error| {_pct(issue['peak_median'], False)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    parser.add_argument("--rows", action="store_true", help="print every row's verdict")
    parser.add_argument("--issue", action="store_true", help="also read the rows the way issue 14's baseline did")
    args = parser.parse_args()
    rows, scores, summary = run(args.validation)
    if args.rows:
        print_rows(rows, scores)
    print_summary(summary, issue_reading(rows, args.validation) if args.issue else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
