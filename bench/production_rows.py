"""Reading one row of the dev set's production configurations: what the row itself states, in meshplan's terms.

Each reader takes one part of a row (its model, GPU, framework, recompute, precision, sharding, offload, dispatcher
and notes) and returns the Request fields it states, with the settings meshplan cannot express yet as knobs (KNOBS).
What the sources a row cites set beyond what it states is bench/production_sources.py's; the Request they make
together is bench/production_mapping.py's. The method: bench/production_configs.py.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml

from meshplan.adapters.common import absent_defaults
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.knowledge.cards import MemoryReportFacts, framework_card, model_card, model_card_names
from meshplan.knowledge.catalog import catalog_architecture, families_card, family_type, resolve_model
from meshplan.knowledge.gdn_config import decoder_flags
from meshplan.knowledge.hardware import get_gpu, gpu_catalog
from meshplan.knowledge.published_runs import TITAN_OP_TOMLS
from meshplan.schema.choices import FRAMEWORKS, LoraTarget, RecomputeModule
from meshplan.schema.hardware import GpuSpec
from meshplan.schema.model import Architecture
from meshplan.schema.request import Request

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
    "lora": ("memory, time", "LoRA whose rank or targets neither the row's lora section nor a recipe it cites "
             "(LORA_RECIPES) states; scored as job=lora with the framework's default for what is unstated"),
    "parameter_transpose_cache": ("memory", "Megatron-Core's disable_parameter_transpose_cache under Transformer "
                                  "Engine 1.x with fp8 primary weights: TE 1.6 makes the weight's transpose in each "
                                  "backward and keeps none (float8_tensor.py transpose_2d(cache=False)), 1 B per "
                                  "element on Hopper; TE 2.x keeps it on the parameter whatever the switch "
                                  "(Float8Tensor.update_usage), meshplan's 2 B; scored with it kept"),
    "fp8_activation_input_store": ("memory", "Megatron-Core's activation_func_fp8_input_store on a framework "
                                   "meshplan writes no key for: the fused SwiGLU saves its input (fc1's output) in "
                                   "fp8 for the backward, half its bf16 bytes; scored in bf16"),
    "fp8_dot_product_attention": ("memory, time", "FP8 dot-product attention on a framework meshplan writes no key "
                                  "for: Q, K, V and the output kept in fp8; scored as bf16 attention"),
    "hsdp": ("memory, time", "HSDP (shard inside a group, replicate across); scored as full sharding"),
    "framework": ("memory, time", "a framework meshplan has no card for; scored with the nearest card"),
    "gpu": ("time", "a GPU outside the catalog; scored on the nearest catalog GPU, fit judged against the "
            "row's own memory"),
    "gpu_power_limit": ("time", "a board power limit the catalog has no part for (power_limited); scored at the "
                        "part's own rating"),
    "model_type": ("memory, time", "an architecture meshplan cannot describe; scored as the nearest model_type"),
    "te_cross_entropy": ("memory, time", "Transformer Engine's fused cross-entropy (cross_entropy_fusion_impl te) "
                         "on a Megatron-Core release no request can name (NeMo 25.04/25.07's 0.12/0.13, older than "
                         "the card's oldest_release; its own 0.19.2 refuses te, PR009); scored with the framework's "
                         "default loss, Megatron-LM's unfused one"),
    "cuda_graphs": ("memory, time", "CUDA graphs meshplan cannot express: a full-iteration graph of an MoE model "
                    "(its static expert capacity), or per-layer graphs of an MoE model whose modules neither the row "
                    "nor its recipe states (production_sources.graph_fields); scored without"),
    "row_field": ("memory, time", "a setting the row gives as text that is not a value (a count, a measure, yes/no); "
                  "scored as unstated"),
    "torch_compile": ("memory, time", "torch.compile of the blocks only (torchtitan before it compiled the loss too, "
                      "its compile card's loss_since), or on a framework without a compile card; scored eager"),
    "cpu_offloading": ("memory, time", "Megatron-Core's layer-level activation offload (cpu_offloading) named "
                       "without its cpu_offloading_num_layers count, which meshplan's activation_offload_layers needs "
                       "(a row stating the count is read as that, a Megatron-Bridge table run the count its "
                       "release's preset set); scored as activation_offload, the fine-grained offloading of every "
                       "layer's module inputs"),
}

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
    network: str = ""  # network_for's reading of the row's inter_node text: NETWORK_READ, else why the card's stays
    ran: bool = True  # not a recommendation: the row measured something or its source is no recipe (ran)

    @property
    def exact(self) -> bool:
        """Mapped with every setting the row states."""
        return self.request is not None and not self.knobs

    def exact_for(self, effect: str) -> bool:
        """Mapped with every setting that changes `effect` ("memory" or "time")."""
        return self.request is not None and not any(effect in KNOBS[k][0] for k in self.knobs)



# --------------------------------------------------------------------------- reading a row

# The fields of the schema the bench reads, by section; a count is an int, a measure a float, a switch a bool. A row
# that leaves one out reads it as null; one given as text is read by its leading number (a note) or, without one, as
# unstated with the knob "row_field" (a setting the row states that the bench cannot read as a value).
COUNTS = {
    "model": ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size",
              "num_experts", "top_k", "moe_ffn_hidden_size", "shared_experts", "dense_layers"),
    "hardware": ("num_gpus", "gpus_per_node"),
    "workload": ("seq_length", "global_batch_size", "micro_batch_size"),
    "parallelism": ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "fsdp"),
}
MEASURES = {
    "model": ("total_params_b",), "hardware": ("gpu_memory_gb",),
    "outcome": ("tflops_per_gpu", "mfu", "tokens_per_sec_per_gpu", "step_time_s", "peak_memory_gb_per_gpu"),
}
SWITCHES = {"parallelism": ("sequence_parallel",)}
TEXTS = {
    "": ("id", "name", "category", "framework", "precision"),
    "source": ("citation", "location", "url", "version_or_date", "kind"),
    "model": ("id", "family", "arch_type", "attention", "mla"),
    "hardware": ("gpu_type",),
    "parallelism": ("zero_or_distributed_optimizer", "pp_layout", "moe_dispatcher"),
    "memory": ("recompute", "offload"),
    "outcome": ("other",),
    "flags": ("caveats", "memory_note"),
}
NUMBER = re.compile(r"\s*[~≈]?\s*(\d+(?:\.\d+)?)")


def _value(kind: str, value: Any) -> tuple[Any, bool]:
    """(the value as `kind` reads it, whether it was read); text by its leading number or its yes/no word."""
    if value is None:
        return None, True
    if kind == "switch":
        if isinstance(value, bool):
            return value, True
        word = str(value).strip().lower().split(" ")[0].strip(",;")
        truth = {"true": True, "yes": True, "on": True, "enabled": True, "false": False, "no": False, "off": False}
        return truth.get(word), word in truth
    if isinstance(value, bool):
        return None, False
    if isinstance(value, int | float):
        return (int(value) if kind == "count" and float(value).is_integer() else value), True
    m = NUMBER.match(str(value))
    if not m:
        return None, False
    number = float(m.group(1))
    return (int(number) if kind == "count" and number.is_integer() else number), True


def read_row(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """(the row with every field the bench reads present and of its type, notes, knobs): see COUNTS."""
    row = copy.deepcopy(raw) if isinstance(raw, dict) else {}
    notes: list[str] = []
    knobs: dict[str, str] = {}
    for section, keys in TEXTS.items():
        part = row if not section else row.setdefault(section, {})
        if not isinstance(part, dict):
            part = row[section] = {}
        for key in keys:
            part.setdefault(key, None)
    row["id"] = str(row["id"] or f"row-{id(raw)}")
    for kind, table in (("count", COUNTS), ("measure", MEASURES), ("switch", SWITCHES)):
        for section, keys in table.items():
            part = row.setdefault(section, {})
            for key in keys:
                given = part.get(key)
                value, read = _value(kind, given)
                part[key] = value
                if not read:
                    knobs["row_field"] = "; ".join(filter(None, [knobs.get("row_field"),
                                                                 f"{section}.{key} {given!r} is not a {kind}"]))
                elif isinstance(given, str):
                    notes.append(f"{section}.{key} given as text {given!r}: read as {value}")
    return row, notes, knobs




def load_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        rows = yaml.safe_load(fh)
    if not isinstance(rows, list):
        raise SystemExit(f"{path}: expected a list of configurations")
    return rows


def row_text(*values: Any) -> str:
    """The row's fields that are set, as one string to search."""
    return " ".join(str(v) for v in values if v is not None)


def source_key(row: dict[str, Any]) -> str:
    """The publication a row comes from: its citation's repository and document (its first two words), else its
    url; rows of one publication are held out together (leave one source out)."""
    src = row.get("source") or {}
    words = str(src.get("citation") or "").replace(";", " ").replace(",", " ").split()
    return " ".join(words[:2]) if words else str(src.get("url") or row.get("id"))


def stated_memory_settings(row: dict[str, Any]) -> bool:
    """The row states its recompute (memory.recompute neither null nor "not stated ..."). Every row that
    offloads states its recompute too, and an unstated offload is none; an unstated micro-batch is meshplan's
    (and Megatron's) default of 1, which only one such row leaves unstated."""
    recompute = row["memory"]["recompute"]
    return recompute is not None and not str(recompute).lower().startswith(UNSTATED)


def measured_outcome(row: dict[str, Any]) -> bool:
    """The row's outcome reports something measured: tokens/s, step time, MFU, TFLOP/s or a peak
    (MEASURES["outcome"]); `other` is free text and measures nothing the bench can read."""
    return any(row["outcome"][key] is not None for key in MEASURES["outcome"])


def ran(row: dict[str, Any]) -> bool:
    """The row is evidence of a run: it reports a measured outcome, or its source is not a recipe (source.kind
    does not name one: a benchmark table, a measured experiment, an issue report states a run that ran). A recipe
    that publishes no measurement is a recommended starting point, not evidence that the job ran (or fit)."""
    return measured_outcome(row) or "recipe" not in str(row["source"]["kind"] or "").lower()


# --------------------------------------------------------------------------- model


def _catalog_value(arch: Architecture, name: str) -> Any:
    """A catalog model's field as a row states it: a Gated DeltaNet hybrid's layers as its decoder layers (a row
    counts Qwen3NextDecoderLayers, meshplan's pattern two layers each: mixer, MLP), its dense layers those whose MLP
    is no MoE (knowledge/gdn_config.decoder_flags)."""
    moe = arch.moe
    if arch.gdn is not None and arch.layer_pattern is not None:
        flags = decoder_flags(arch.layer_pattern, 1, "E")
        layers, dense = len(flags), len(flags) - sum(flags)
    else:
        layers, dense = arch.num_layers, arch.num_layers - len(moe.moe_layers) if moe else 0
    return {
        "num_layers": layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.ffn_hidden_size if (moe is None or dense) else None,
        "num_attention_heads": arch.num_attention_heads,
        "num_kv_heads": arch.num_kv_heads,
        "vocab_size": arch.vocab_size,
        "num_experts": moe.num_experts if moe else None,
        "top_k": moe.top_k if moe else None,
        "moe_ffn_hidden_size": moe.expert_ffn_hidden_size if moe else None,
        "shared_experts": moe.num_shared_experts if moe else None,
        "dense_layers": dense if moe else None,
        "mla": arch.mla is not None,
    }[name]


MATCH_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                "vocab_size", "num_experts", "top_k", "moe_ffn_hidden_size", "shared_experts", "dense_layers", "mla")


def catalog_match(model: dict[str, Any]) -> str | None:
    """The catalog key whose architecture agrees with every model field the row states; None if none does.
    Equal architectures (Llama 3 and 3.1) are told apart by the row's model id, as a user would name it."""
    if model["num_layers"] is None or model["hidden_size"] is None or model["num_attention_heads"] is None:
        return hybrid_by_name(model)
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


SCORE_HYBRIDS = False
"""Whether the hybrid Mamba-2 rows are mapped (production_configs.py --hybrids). Off by default: a Mamba-2 layer's step
time (estimate/hybrid_time.py) is new and its rows are its only measurements; mapping them moves the MoE regime's
error band that every MoE report prints (cards/accuracy.yaml), so turning it on by default is a separate change that
regenerates the card."""


def hybrid_by_name(model: dict[str, Any]) -> str | None:
    """A hybrid Mamba-2 row (arch_type hybrid*) that records no dimensions, named by its model id (with SCORE_HYBRIDS):
    the catalog hybrid whose name is the id's repository name (NVIDIA-Nemotron-3-Nano-30B-A3B: the checkpoints' -BF16
    / -FP8 suffixes dropped; a size the row writes in parentheses, 'NVIDIA-Nemotron-3-Super (~120B-A12B)', read as the
    name's suffix) with the row's layer count; None otherwise (every other row without dimensions stays unmapped)."""
    if not SCORE_HYBRIDS or not str(model.get("arch_type") or "").startswith("hybrid"):
        return None
    name = re.sub(r"\s*\(~?([^)]*)\)$", r"-\1", str(model["id"]).rsplit("/", 1)[-1]).lower()
    for key in model_card_names():
        arch = catalog_architecture(key)
        if arch.layer_pattern is not None and arch.name.lower() == name and model["num_layers"] in (
                None, arch.num_layers):
            return key
    return None


def _nearest_card(model_type: str, hidden: int) -> Architecture | None:
    """The catalog architecture of this model_type with the nearest hidden size."""
    archs = [a for a in map(catalog_architecture, model_card_names()) if a.model_type == model_type]
    return min(archs, key=lambda a: abs(a.hidden_size - hidden), default=None)


def build_config(row: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """A config.json dict from the row's model fields: (config, notes, knobs)."""
    m = row["model"]
    knobs: dict[str, str] = {}
    family = m["family"]
    built_as = family_type(family)  # the package's family vocabulary, cards/model_families.yaml
    if built_as is None:
        raise Unmapped(f"model family {family!r} ({m['attention']}) has no meshplan model_type and the row "
                       "records no dimensions to build one")
    model_type = built_as.model_type
    if built_as.leaves_out:
        knobs["model_type"] = f"{built_as.leaves_out}: scored as model_type {model_type}"
    missing = [f for f in ("num_layers", "hidden_size", "num_attention_heads") if m[f] is None]
    if missing:
        raise Unmapped(f"model dimensions not recorded ({', '.join(missing)}): {m['id']}")
    h = m["hidden_size"]
    cfg: dict[str, Any] = {
        "model_type": model_type, "num_hidden_layers": m["num_layers"], "hidden_size": h,
        "num_attention_heads": m["num_attention_heads"], "num_key_value_heads": m["num_kv_heads"],
        "intermediate_size": m["ffn_hidden_size"], "vocab_size": m["vocab_size"],
        **families_card().config_defaults.get(model_type, {}),
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
    return bool(re.search(r"\bMTP\b[^;]*\bdisabled", row_text(row["precision"], row["outcome"]["other"]), re.I))


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
    gpu_type starts with and whose memory is the row's, or whose name is the row's whole gpu_type name, capacity
    included (a catalog alias such as gb300-288gb: the row names that part as its vendor does, and vendors state
    the HBM's full size, 288 GB, where nvidia-smi reports what is left after ECC and the driver's reservation,
    284208 MiB, which the fit is judged against); else the nearest catalog GPU of the same family (same letters,
    closest number), with the fit judged against the row's own memory."""
    name = str(hardware["gpu_type"]).split()[0]
    row_bytes = int(hardware["gpu_memory_gb"] * GIB)
    parts = name.split("-")
    for n in range(len(parts), 0, -1):
        try:
            gpu = get_gpu("-".join(parts[:n]))
        except MeshplanError:
            continue
        named = n == len(parts) and len(parts) > 1  # the whole name, capacity included, is the catalog part's
        if named or abs(gpu.memory_bytes / GIB - hardware["gpu_memory_gb"]) <= 0.03 * hardware["gpu_memory_gb"]:
            return power_limited(gpu, hardware), gpu.memory_bytes, power_knob(gpu, hardware)
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


def stated_power_limit(hardware: dict[str, Any]) -> int | None:
    """The board power limit the row's gpu_type states ("limited to 750 W", "500W"), in W; None where it states none."""
    m = re.search(r"(\d{3,4})\s*W\b", str(hardware["gpu_type"]))
    return int(m.group(1)) if m else None


def _same_board_at(gpu: GpuSpec, watts: int) -> GpuSpec | None:
    """The catalog part that is `gpu`'s board (arch, SMs, memory) rated or limited at `watts`; None where none is."""
    for other in gpu_catalog().values():
        if (other.power_limit_w == watts and other.arch == gpu.arch and other.sm_count == gpu.sm_count
                and other.memory_bytes == gpu.memory_bytes):
            return other
    return None


def power_limited(gpu: GpuSpec, hardware: dict[str, Any]) -> str:
    """The catalog key of `gpu` under the power limit the row states, where the catalog has that board at that limit
    (a B200 limited to 750 W: b200-750w); the GPU's own key else. A part whose rating the card does not state
    (power_limit_w None) is taken as named."""
    watts = stated_power_limit(hardware)
    if watts is None or gpu.power_limit_w in (None, watts):
        return gpu.key
    other = _same_board_at(gpu, watts)
    return other.key if other else gpu.key


def power_knob(gpu: GpuSpec, hardware: dict[str, Any]) -> dict[str, str]:
    """A knob where the row states a power limit the catalog has no part for (scored at the part's own rating)."""
    watts = stated_power_limit(hardware)
    if watts is None or gpu.power_limit_w in (None, watts) or _same_board_at(gpu, watts):
        return {}
    return {"gpu_power_limit": f"{hardware['gpu_type']}: no catalog part at {watts} W, scored as {gpu.key} at its "
                               f"{gpu.power_limit_w} W rating"}


# A row's inter_node text, read once by network_for: a rate in bits (Gb/s, Gbps, Tb/s) or bytes (GB/s); the NICs
# that carry it, 'Nx' before the rate; and what it is a rate of, 'per node' (host, server) or 'per GPU'.
NETWORK_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([GT])(b|B)(?:/s|ps)\b")
NETWORK_NICS = re.compile(r"\b(\d+)\s*[x×]\s")
NETWORK_SCOPE = re.compile(r"\bper\s+(node|host|server|gpu)\b", re.IGNORECASE)
NETWORK_READ = "read"  # network_for's word for a text it read; any other is why it left the card's network


def network_for(hardware: dict[str, Any], gpu: str) -> tuple[float | None, str]:
    """(network_gbps_per_node, NETWORK_READ) of the row's inter_node text, or (None, why it cannot be read): the GPU
    card's network then stays. A rate per node is the node's ('8x 400 Gb/s per node (DGX B200)': 3200, '4x Omni-Path
    100 Gb/s per node': 400); a rate per GPU is that times the node's GPUs (the row's gpus_per_node, else the catalog
    part's `gpu`: what resolve shares it over again); a text with no rate ('NDR InfiniBand', 'not stated') or with a
    rate but no 'per node' or 'per GPU' ('InfiniBand NDR 400 Gb/s': a port's rate, the node's NICs not said) is not
    read."""
    text = str(hardware.get("inter_node") or "")
    rate = NETWORK_RATE.search(text)
    if rate is None:
        return None, "states no rate"
    scope = NETWORK_SCOPE.search(text, rate.end()) or NETWORK_SCOPE.search(text)
    if scope is None:
        return None, "a rate without 'per node' or 'per GPU'"
    gbps = float(rate.group(1)) * (1000 if rate.group(2) == "T" else 1) * (8 if rate.group(3) == "B" else 1)
    nics = NETWORK_NICS.search(text, 0, rate.start())
    gbps *= int(nics.group(1)) if nics else 1
    if scope.group(1).lower() == "gpu":
        gbps *= hardware.get("gpus_per_node") or get_gpu(gpu).gpus_per_node
    return gbps, NETWORK_READ


NO_CARD_FILE = Path(__file__).resolve().parent / "data" / "frameworks_without_card.yaml"


def _words(text: str) -> str:
    """A framework name as matched: lower case, every run of characters other than letters, digits and '.' as one
    space, so that a name matches whole words only."""
    return " " + re.sub(r"[^a-z0-9.]+", " ", text.lower()).strip() + " "


@dataclass(frozen=True)
class FrameworkName:
    """One name a row may call a framework by: the card it names (None: no card), or the card it is scored with
    instead (`nearest`, recorded as the knob "framework"), or why it is not scored (`why`)."""

    words: str
    card: str | None
    nearest: str | None = None
    why: str = ""


@functools.lru_cache(maxsize=1)
def framework_names() -> tuple[FrameworkName, ...]:
    """Every name a row may use: each framework card's name, display name (its parts around '/', parentheses
    dropped) and `aliases` words, then the frameworks without a card (bench/data/frameworks_without_card.yaml)."""
    names = []
    for key in FRAMEWORKS:
        card = framework_card(key)
        aliases = card.aliases.words if card.aliases else []
        display = re.sub(r"\([^)]*\)", "", card.display_name).split("/")
        for word in (key, *display, *aliases):
            if word.strip():
                names.append(FrameworkName(_words(word), key))
    for entry in yaml.safe_load(NO_CARD_FILE.read_text(encoding="utf-8")):
        names += [FrameworkName(_words(w), None, entry["nearest"], " ".join(entry["why"].split()))
                  for w in entry["words"]]
    return names


def framework_for(text: str | None) -> tuple[str, dict[str, str]]:
    """(meshplan framework, knobs) the row's framework string names: the name that starts first in it, the longest
    there, a card's before a framework without one (framework_names). A framework without a card is scored with its
    nearest card (knob "framework") or not mapped, with its reason."""
    if text is None or not str(text).strip():
        raise Unmapped("framework not stated: no framework card's rules and conventions to score it with")
    low = _words(str(text))
    hits = [(low.find(n.words), -len(n.words), n.card is None, i, n) for i, n in enumerate(framework_names())
            if n.words in low]
    if not hits:
        raise Unmapped(f"framework {text!r} names no meshplan framework ({', '.join(FRAMEWORKS)}) and none of "
                       f"{NO_CARD_FILE.name}")
    name = min(hits)[-1]
    if name.card is not None:
        return name.card, {}
    if name.nearest is None:
        raise Unmapped(f"framework {text!r}: {name.why}")
    return name.nearest, {"framework": f"{text}: {name.why}"}


# The Request fields a framework's own script sets by itself unless a flag says otherwise that a row is read for
# (its card's read.absent_by_variant), with the word that says the row stated the setting itself
SCRIPT_DEFAULT_WORDS = {"attention_backend": "flash", "dropout": "dropout"}


def script_defaults(row: dict[str, Any], framework: str) -> tuple[dict[str, Any], list[str]]:
    """(Request fields, notes): the attention and dropout of a row whose framework names a variant of its card whose
    scripts run their own unless a flag says otherwise (the card's read.absent_by_variant: Megatron-DeepSpeed's
    pretrain_gpt.py, CoreAttention and dropout 0.1) and whose text states neither: the row is read as `meshplan
    import` reads such a script (adapters/common.absent_defaults). A row that names flash attention or dropout keeps
    the Request's own (left out: the memory convention's)."""
    card = framework_card(framework)
    if card.read is None:
        return {}, []
    named = _words(str(row["framework"]))
    text = row_text(row["name"], row["framework"], row["outcome"]["other"], row["flags"]["caveats"],
                    row["source"]["location"]).lower()
    for variant in card.read.absent_by_variant:
        if _words(variant) not in named:
            continue
        stated = [name for name, word in SCRIPT_DEFAULT_WORDS.items() if word in text]
        fields = {name: value for name, value in absent_defaults(framework, variant, (), stated).items()
                  if name in SCRIPT_DEFAULT_WORDS}
        if fields:
            return fields, [f"{', '.join(f'{k}={v}' for k, v in fields.items())}: what a {variant} script runs "
                            f"where no flag says otherwise, and the row states none (cards/frameworks/{framework}.yaml "
                            "read.absent_by_variant)"]
    return {}, []


# --------------------------------------------------------------------------- memory and precision settings


# Words that say a selective AC is op-level: torchtitan's llama3_8b.toml sets [activation_checkpoint] mode =
# "selective", selective_ac_option = "op" (torchtitan/models/llama3/train_configs/llama3_8b.toml), so a row that runs
# that file's default is op-level SAC.
OP_SAC_WORDS = ("per-op", "op-level", "llama3_8b.toml default")


def _op_sac(framework: str) -> bool:
    """Whether the framework's selective recompute is op-level SAC with an option (its card's recompute.selective,
    what rule RC002 reads); "" (no framework yet) is not."""
    return bool(framework) and framework_card(framework).recompute.selective == "op_sac"


def recompute_for(row: dict[str, Any], framework: str) -> tuple[str | None, dict[str, Any], dict[str, str]]:
    """(Request.recompute, the other Request recompute fields, knobs). Megatron's selective modules the row lists
    are recompute_modules (its default core_attn left out); Megatron's "full, uniform, N layer" is
    recompute_method=uniform with recompute_layers=N; per-op SAC on a framework whose selective is op-level SAC
    (torchtitan's) is selective_ac_option="op". A selective AC there that does not say which option stays a knob
    (scored as op-level). An activation offload is activation_offload; Megatron's layer-level cpu_offloading without
    its layer count also stays a knob (scored as the fine-grained offload; with the count: offload_fields; a
    Megatron-Bridge table run's count from its release's preset: production_sources.release_preset_offload)."""
    text = row["memory"]["recompute"]
    if text is None or str(text).lower().startswith(UNSTATED):
        return None, {}, {}
    low = str(text).lower()
    knobs: dict[str, str] = {}
    fields: dict[str, Any] = {}
    if "offload" in low:
        fields["activation_offload"] = True
        if re.search(r"\bcpu_offloading\b", low):  # Megatron's layer-level offload, not fine-grained (KNOBS)
            knobs["cpu_offloading"] = str(text)
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
        elif _op_sac(framework) and (any(w in low for w in OP_SAC_WORDS) or (
                row["model"]["family"], row["model"]["total_params_b"]) in TITAN_OP_TOMLS):
            fields["selective_ac_option"] = "op"
        elif _op_sac(framework) or "per-op" in low or "selective ac" in low:
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
    words = row_text(low, row["outcome"]["other"]).lower()
    if megatron and re.search(r"grad_reduce_in_fp32\s*=\s*false|bf16 grad(?:ient)? reduc", words):
        fields["grad_reduce_in_fp32"] = False  # the row states bf16 main grads (Megatron's grad_reduce_in_fp32)
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


# a key named with an off value after it (`fp8_dot_product_attention: false`, `=0`) states the setting off
SWITCHED_OFF = r"(?!\s*[=:]\s*(?:false|0|off|no)\b)"
# The Megatron-Core / Transformer Engine fp8 settings a row states in its precision or notes, by the Request field
# that expresses each: the TransformerConfig key, or the MLPerf launch scripts' switch (config_common.sh FP8_ACT and
# FP8_DPA, which train.py turns into activation_func_fp8_input_store and fp8_dot_product_attention)
FP8_SETTING_WORDS = {
    "fp8_activation_input_store": rf"activation_func_fp8_input_store{SWITCHED_OFF}|\bfp8_act=1",
    "fp8_dot_product_attention": rf"fp8 dot-product attention|fp8_dot_product_attention{SWITCHED_OFF}|\bfp8_dpa=1",
}


def fp8_setting_fields(row: dict[str, Any], framework: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(Request fields, knobs): the fp8 settings the row states (FP8_SETTING_WORDS) as the Request's fields where the
    framework it is scored on has a key for them (its card's adapter knob), else as knobs it cannot express."""
    words = row_text(row["precision"], row["outcome"]["other"]).lower()
    adapter = framework_card(framework).adapter
    knobs_of = adapter.versions[adapter.default_version].knobs if adapter is not None else {}
    fields: dict[str, Any] = {}
    knobs: dict[str, str] = {}
    for name, pattern in FP8_SETTING_WORDS.items():
        if re.search(pattern, words):
            if name in knobs_of and knobs_of[name].key is not None:
                fields[name] = True
            else:
                knobs[name] = f"{framework} has no key for {name}"
    return fields, knobs


# Megatron-Core's bias_activation_fusion as a row states it: Megatron-LM's store_false flags or the TransformerConfig
# key with an off value (off), the key alone or with an on value (on)
ACTIVATION_FUSION_OFF = r"--no-bias-(?:swiglu|gelu)-fusion|bias_activation_fusion\s*[=:]\s*(?:false|0|off|no)\b"
ACTIVATION_FUSION_ON = rf"bias_activation_fusion{SWITCHED_OFF}"


def activation_fusion_field(row: dict[str, Any], framework: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(Request fields, knobs): bias_activation_fusion where the row's precision or notes state it, as the field
    where the framework it is scored on has the switch (its card's adapter knob), else as a knob it cannot express."""
    words = row_text(row["precision"], row["outcome"]["other"]).lower()
    stated = (False if re.search(ACTIVATION_FUSION_OFF, words)
              else True if re.search(ACTIVATION_FUSION_ON, words) else None)
    if stated is None:
        return {}, {}
    adapter = framework_card(framework).adapter
    knob = adapter.versions[adapter.default_version].knobs.get("bias_activation_fusion") if adapter else None
    if knob is None or knob.key is None:
        return {}, {"bias_activation_fusion": f"{framework} has no switch for Megatron-Core's bias_activation_fusion"}
    return {"bias_activation_fusion": stated}, {}


def optimizer_for(row: dict[str, Any]) -> dict[str, Any]:
    """Request.optimizer: muon where the row's optimizer or notes name Muon (left out: adam)."""
    text = row_text(row["parallelism"]["zero_or_distributed_optimizer"], row["outcome"]["other"]).lower()
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
    ds_stage = re.search(r"ds[_ ]config zero stage (\d)", low)
    if ds_stage:
        # a DeepSpeed row that states its ds_config's zero_optimization.stage: what meshplan's zero_stage is on the
        # deepspeed card (its zero_N knobs write that key), whatever the row calls the optimizer's own sharding
        # (BLOOM-176B's BF16_Optimizer: "its own ZeRO-1" at ds_config stage 0)
        return int(ds_stage.group(1)), knobs
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


def hsdp_fields(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """Request.dp_replicate (hybrid sharding) where the row states its shard group (parallelism.fsdp below dp and
    dividing it) and the framework's adapter writes hybrid sharding (its card's dp_replicate key); else nothing (the
    row keeps its "hsdp" knob: not expressible)."""
    p = row["parallelism"]
    dp, shard = p["dp"], p["fsdp"]
    section = framework_card(framework).adapter
    if not dp or not shard or shard >= dp or dp % shard or section is None or not section.renders("dp_replicate"):
        return {}
    return {"dp_replicate": dp // shard}


def offload_fields(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(Request offload fields, knobs) from the row's offload text: verl's phase offloads (param/grad, OFFLOAD_OPTIM
    or ALL_OFFLOAD for the optimizer), Megatron-Core's in-step CPU optimizer (optimizer_offload_fraction, or
    "optimizer CPU offload" = all of it) and its layer-wise activation offload with its count
    (cpu_offloading_num_layers N: activation_offload_layers); every offload a row names is expressible now
    (issue 14)."""
    text = row_text(row["memory"]["offload"], row["parallelism"]["zero_or_distributed_optimizer"]).lower()
    fields: dict[str, Any] = {}
    if not text or "offload" not in text:
        return fields, {}
    everything = "all_offload" in text or "full param/grad/optimizer" in text
    if everything or "param/grad offload" in text:
        fields["param_offload"] = True  # verl 0.9.1's param_offload releases the gradient buffers too (its card)
    if everything or "offload_optim=true" in text:
        fields["optimizer_offload"] = True
    layers = re.search(r"cpu_offloading_num_layers[ =:]+(\d+)", text)
    if layers:  # Megatron-Core's layer-wise activation offload (cpu_offloading with its count)
        fields["activation_offload_layers"] = int(layers.group(1))
    fraction = re.search(r"optimizer_offload_fraction=([\d.]+)|fraction ([\d.]+)", text)
    if fraction:
        fields["optimizer_offload_fraction"] = float(fraction.group(1) or fraction.group(2))
    elif "optimizer cpu offload" in text:
        fields["optimizer_offload"] = True  # Megatron-Core: the whole optimizer on the CPU
    return fields, {}


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


def flex_backend_for(row: dict[str, Any]) -> str | None:
    """The flex dispatcher's backend the row states beside it (its moe_dispatcher text: 'flex/HybridEP (32 SMs)',
    'flex/DeepEP', 'DeepEP'), which the run chose (Megatron-Bridge's presets set moe_flex_dispatcher_backend whatever
    the machine: HybridEP on H100 and B200); None where the row runs another dispatcher or names no backend (the
    machine's then, mesh.flex_backend)."""
    if dispatcher_for(row)[0] != "flex":
        return None
    low = str(row["parallelism"]["moe_dispatcher"] or "").lower()
    named = [backend for backend in ("hybridep", "deepep") if backend in low]
    return named[0] if len(named) == 1 else None


def run_knobs(row: dict[str, Any]) -> dict[str, str]:
    """Settings from the row's notes and category: RL phases, LoRA, CUDA graphs, overlaps, compile."""
    other = row_text(row["outcome"]["other"], row["source"]["location"])
    low = other.lower()
    knobs: dict[str, str] = {}
    if row["category"] == "rl":
        knobs["rl_phases"] = "actor training colocated with the rollout engine"
    if "dynamic batch" in row_text(row["flags"]["caveats"]).lower():
        knobs["dynamic_batch"] = "token-budget micro-batches"
    if row["category"] == "lora" or row.get("lora"):  # a row with a lora section is a LoRA run, whatever its category
        knobs["lora"] = "LoRA fine-tuning"
    if "cuda graph" in low:
        knobs["cuda_graphs"] = row["outcome"]["other"]
    if re.search(r"disable_parameter_transpose_cache:? true", low):
        knobs["parameter_transpose_cache"] = "disable_parameter_transpose_cache true"
    if re.search(r"ep overlap|a2a overlap|1f1b overlap", low):
        knobs["moe_a2a_overlap"] = row["outcome"]["other"]
    if re.search(r"tp comm overlap|asynctp", row_text(row["name"], other).lower()):  # the row's name states AsyncTP
        knobs["tp_comm_overlap"] = row_text(row["name"], other)
    if re.search(r"\bcompile\b", row_text(row["name"], other).lower()):  # the row's name states it too
        knobs["torch_compile"] = row_text(row["name"], other)
    return knobs


# --------------------------------------------------------------------------- LoRA

# A LoRA row's own settings, its `lora` section (null or left out: the row states none): the adapters' rank, their
# alpha (kept for the record: it scales the adapters' output and moves neither memory nor time) and the linears
# adapted, in Megatron-Core's names (the Request's lora_targets); `targets_source` says how the source's own names map
# to them. Read the same way for every row; what the section leaves out the cited recipe or the framework's default
# fills (production_sources.lora_for).
LORA_SECTION = ("rank", "alpha", "targets", "targets_source")
LORA_TARGETS = get_args(LoraTarget)


@dataclass(frozen=True)
class StatedLora:
    """The LoRA settings a row states in its `lora` section (None: not stated)."""

    rank: int | None = None
    alpha: float | None = None
    targets: tuple[str, ...] | None = None

    def request_fields(self) -> dict[str, Any]:
        """The Request's LoRA fields for what the row states (alpha has none: it changes no estimate)."""
        fields: dict[str, Any] = {}
        if self.rank is not None:
            fields["lora_rank"] = self.rank
        if self.targets is not None:
            fields["lora_targets"] = list(self.targets)
        return fields


def stated_lora(row: dict[str, Any]) -> StatedLora:
    """The row's `lora` section read as StatedLora; Unmapped, naming the field and what it takes, where a value is
    not one (a rank that is no positive whole number, an alpha that is no number, a target that is no Megatron-Core
    linear meshplan adapts, a key the section does not have)."""
    section = row.get("lora")
    if section is None:
        return StatedLora()
    if not isinstance(section, dict):
        raise Unmapped(f"lora {section!r}: expected a section with {', '.join(LORA_SECTION)}")
    unknown = sorted(set(section) - set(LORA_SECTION))
    if unknown:
        raise Unmapped(f"lora.{unknown[0]}: not a field of the lora section (allowed: {', '.join(LORA_SECTION)})")
    rank, alpha, targets = section.get("rank"), section.get("alpha"), section.get("targets")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise Unmapped(f"lora.rank {rank!r}: expected a whole number of at least 1")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)):
        raise Unmapped(f"lora.alpha {alpha!r}: expected a number")
    if targets is not None:
        if not isinstance(targets, list) or not targets:
            raise Unmapped(f"lora.targets {targets!r}: expected a list of Megatron-Core linear names")
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown:
            raise Unmapped(f"lora.targets {unknown[0]!r}: not a linear meshplan adapts (allowed: "
                           f"{', '.join(LORA_TARGETS)})")
        twice = sorted({t for t in targets if targets.count(t) > 1})
        if twice:
            raise Unmapped(f"lora.targets {twice[0]!r}: given more than once")
        targets = tuple(targets)
    return StatedLora(rank=rank, alpha=alpha, targets=targets)


def peak_convention(row: dict[str, Any], framework: str | None = None) -> str:
    """What the row's measured peak is: allocated, reserved or not stated, from the row itself, else the basis of
    the memory report its framework's harness reads when the row's source is that harness (harness_report), else
    the peak the training log of the row's own framework reports (its card's memory_log)."""
    words = row_text(row["outcome"]["other"], row["flags"]["memory_note"], row["source"]["location"]).lower()
    if "allocated" in words:
        return "allocated"
    if framework is not None and (report := harness_report(row, framework)) is not None:
        return report.basis
    if (own := own_framework(row)) is not None and (log := framework_card(own).memory_log) is not None:
        return log.basis
    return "not stated"


def own_framework(row: dict[str, Any]) -> str | None:
    """The framework card the row's own framework names; None where it names none, or a framework without a card
    that is scored with its nearest (that card's training log is not the one the row quotes)."""
    try:
        name, knobs = framework_for(row["framework"])
    except Unmapped:
        return None
    return None if "framework" in knobs else name


def harness_report(row: dict[str, Any], framework: str) -> MemoryReportFacts | None:
    """The memory report of the framework's own benchmark harness (its card's memory_report) when the row's source
    (citation or location) names that harness's path; None otherwise."""
    report = framework_card(framework).memory_report
    cited = row_text(row["source"]["citation"], row["source"]["location"]).lower()
    return report if report is not None and report.harness.lower() in cited else None


def peak_moment(row: dict[str, Any], framework: str) -> str:
    """When the row's measured peak was read: the iteration the row's own words state ("after iteration 1":
    first_iteration; a later one: steady), else the moment of its framework harness's memory report when the row's
    source is that harness (harness_report), else steady (a peak over a run's later iterations)."""
    words = row_text(row["outcome"]["other"], row["flags"]["memory_note"], row["source"]["location"]).lower()
    if stated := re.search(r"after (?:iteration|step) (\d+)|\b(first|1st) (?:iteration|step)\b", words):
        return "first_iteration" if stated.group(2) or int(stated.group(1)) == 1 else "steady"
    report = harness_report(row, framework)
    return report.moment if report is not None else "steady"
