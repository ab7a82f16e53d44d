"""What the sources a production row cites set for its run beyond what the row states: the launcher's settings for
every run it makes, the recipe's pipeline split and MoE overlap, the framework release the row's date falls in, the
allocator and LoRA settings of the recipe it names. The facts themselves (with their sources) are the package's,
meshplan/knowledge/published_runs.py; this module matches a row to them. The method: bench/production_configs.py.
"""

from __future__ import annotations

import csv
import functools
import json
import re
from pathlib import Path
from typing import Any

from production_rows import row_text, stated_lora

from meshplan.arithmetic.lora import lora_engines
from meshplan.arithmetic.schedule import format_layout, parse_layout
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.published_runs import (
    BRIDGE,
    BRIDGE_PERF_CROSS_ENTROPY,
    BRIDGE_PERF_TABLE,
    LORA_RECIPES,
    RECIPE_MOE,
    RECIPE_MTP,
    RECIPE_PRECISION,
    RECIPE_SPLITS,
    STUDY_RECIPES,
    VERL_DYNAMIC_BSZ_SCRIPTS,
    RecipeSplit,
    attention_kernel_of_run,
    bridge_perf_activation_fusion,
    bridge_perf_preset_dispatch,
    bridge_perf_preset_offload,
    bridge_perf_preset_split,
    bridge_precision,
    main_snapshot,
    nemo2_perf_expandable_segments,
    nemo2_perf_loss,
    nemo2_perf_precision,
    nemo_launcher_tp_overlap,
    ran_without_expandable_segments,
    release_ran,
)
from meshplan.knowledge.releases import resolve_release, snapshot_day

# --------------------------------------------------------------------------- what a cited launcher sets for every run


def perf_table_fields(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """grad_reduce_in_fp32=False for a row from Megatron-Bridge's performance tables (BRIDGE_PERF_TABLE), and, scored
    on Megatron-Bridge, bias_activation_fusion=True where its perf recipe turns it on for the row's model family
    (published_runs.bridge_perf_activation_fusion) and Transformer Engine's fused cross-entropy, which its launchers
    set on every run (published_runs.BRIDGE_PERF_CROSS_ENTROPY)."""
    citation = row_text(row["source"]["citation"])
    if BRIDGE_PERF_TABLE not in citation.lower():
        return {}
    bridge = framework == "megatron-bridge"
    fused = bridge and bridge_perf_activation_fusion(citation, row["model"].get("family"))
    return ({"grad_reduce_in_fp32": False} | ({"bias_activation_fusion": True} if fused else {})
            | (BRIDGE_PERF_CROSS_ENTROPY if bridge else {}))


# Megatron-Bridge's published performance tables, one row per run with what its release's launcher set
# (bench/bridge_published.py reads and documents it, column by column, with the launcher each column cites)
BRIDGE_TABLE_CSV = Path(__file__).resolve().parent / "data" / "megatron_bridge_published.csv"


@functools.cache
def bridge_table_rows() -> tuple[dict[str, str], ...]:
    """BRIDGE_TABLE_CSV's rows, read once."""
    with open(BRIDGE_TABLE_CSV, encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


def bridge_table_row(row: dict[str, Any], model_key: str | None) -> dict[str, str] | None:
    """The published-table row (BRIDGE_TABLE_CSV) that is this dev row's run: a row from Megatron-Bridge's
    performance tables (BRIDGE_PERF_TABLE in its citation) whose release ('NeMo container 25.09'; 26.02.01 is not
    26.02), system, catalog model, GPU count, batch and layout (tp, pp, vp, ep) are the table row's; None where none
    or more than one is."""
    if model_key is None or BRIDGE_PERF_TABLE not in row_text(row["source"]["citation"]).lower():
        return None
    found = re.search(r"\b(\d\d\.\d\d(?:\.\d\d)?)\b", str(row["source"].get("version_or_date") or ""))
    if not found:
        return None
    p, w = row["parallelism"], row["workload"]
    wanted = {"release": found.group(1), "system": str(row["hardware"]["gpu_type"]).split("-")[0].lower(),
              "model": model_key, "gpus": str(row["hardware"]["num_gpus"]), "gbs": str(w["global_batch_size"]),
              "mbs": str(w["micro_batch_size"]), "tp": str(p["tp"] or 1), "pp": str(p["pp"] or 1),
              "vp": str(p["vpp"] or 1), "ep": str(p["ep"] or 1)}
    hits = [r for r in bridge_table_rows() if all(r[k] == v for k, v in wanted.items())]
    return hits[0] if len(hits) == 1 else None


def release_launcher_moe(row: dict[str, Any], model_key: str | None, knobs: dict[str, str]) -> dict[str, str]:
    """`knobs` with the EP all-to-all overlap (the knob moe_a2a_overlap) the launcher of the row's own release set,
    where the row is a run of Megatron-Bridge's published tables (bridge_table_row): its moe_a2a_overlap column,
    read from that release's scripts/performance (25.09: v0.1.0rc4 run_script.py's A2A_1F1B, on for DeepSeek-V3 on
    H100), over what today's perf recipe the row cites for its layout sets (recipe_moe, Bridge 067f987), which is
    not the code that ran. Unchanged where the row is no table run."""
    table = bridge_table_row(row, model_key)
    if table is None:
        return knobs
    out = {k: v for k, v in knobs.items() if k != "moe_a2a_overlap"}
    if table["moe_a2a_overlap"] == "1":
        out["moe_a2a_overlap"] = (f"{BRIDGE} performance table {table['release']}: its release's launcher "
                                  f"(bench/data/megatron_bridge_published.csv moe_a2a_overlap)")
    return out


def release_preset_dispatch(row: dict[str, Any], model_key: str | None) -> tuple[dict[str, Any], list[str]]:
    """(Request fields, notes): the dispatcher (flex with its backend, or alltoall where the preset sets no backend)
    the performance preset of the row's release set (published_runs.bridge_perf_preset_dispatch: its release, system
    and catalog model), for a row of Megatron-Bridge's performance tables that states no dispatcher; ({}, []) where it
    states one or no preset is recorded. The preset's moe_a2a_overlap is the row's too: map_row drops the knob where
    the preset turned it off and sets it where the preset turned it on."""
    key = table_run_key(row)
    if row["parallelism"]["moe_dispatcher"] or key is None:
        return {}, []
    preset = bridge_perf_preset_dispatch(*key, model_key)
    if preset is None:
        return {}, []
    named = f"flex dispatcher ({preset.backend})" if preset.backend else "alltoall dispatcher"
    return ({"moe_token_dispatcher": preset.dispatcher, "moe_flex_backend": preset.backend,
             "moe_a2a_overlap": preset.a2a_overlap},
            [f"{named}, EP all-to-all overlap {'on' if preset.a2a_overlap else 'off'}, from its release's preset: "
             f"{preset.source}"])


def table_run_key(row: dict[str, Any]) -> tuple[str, str] | None:
    """(container release, system) of a row from Megatron-Bridge's performance tables (BRIDGE_PERF_TABLE in its
    citation; 'NeMo container 25.11' -> '25.11', 26.04.01 kept whole; 'GB200-186GB (NVL72)' -> 'gb200'), the key its
    release's presets are recorded by (published_runs.BRIDGE_PERF_PRESET_*); None for any other row."""
    if BRIDGE_PERF_TABLE not in row_text(row["source"]["citation"]).lower():
        return None
    found = re.search(r"\b(\d\d\.\d\d(?:\.\d\d)?)\b", str(row["source"].get("version_or_date") or ""))
    return (found.group(1), str(row["hardware"]["gpu_type"]).split("-")[0].lower()) if found else None


def release_preset_split(row: dict[str, Any], model_key: str | None) -> tuple[dict[str, Any], list[str]]:
    """(Request fields, notes): the pipeline layout and MTP depth the performance config of the row's release passed
    for its system and model (published_runs.bridge_perf_preset_split), for a Megatron-Bridge table row that states no
    layout of its own; ({}, []) otherwise. The layout sets vpp (Megatron-Core derives it from the layout's stages)."""
    key = table_run_key(row)
    if key is None or row["parallelism"]["pp_layout"]:
        return {}, []
    preset = bridge_perf_preset_split(*key, model_key)
    if preset is None:
        return {}, []
    return preset.fields(), [f"pipeline layout {preset.layout} and MTP depth {preset.mtp_num_layers} from its "
                             f"release's config: {preset.source}"]


def release_preset_offload(row: dict[str, Any], model_key: str | None, request: dict[str, Any]
                           ) -> tuple[dict[str, Any], list[str]]:
    """(Request fields, notes): the layer-wise activation offload the performance preset of the row's release set
    (published_runs.bridge_perf_preset_offload: its release, system, catalog model, Bridge precision and tp) for a
    Megatron-FSDP run of Megatron-Bridge's published tables whose row states no count of its own (`request`: the
    fields read so far, with precision, fp8_recipe, tp and zero_stage); ({}, []) otherwise. The preset's
    cpu_offloading is Megatron-Core's layer-wise offload, not the fine-grained one: the caller drops the
    activation_offload a row's words 'cpu_offloading' read as (the knob cpu_offloading)."""
    key = table_run_key(row)
    if key is None or request.get("zero_stage") != 3 or request.get("activation_offload_layers"):
        return {}, []
    precision = bridge_precision(request["precision"], request.get("fp8_recipe"))
    preset = bridge_perf_preset_offload(*key, model_key, precision, request.get("tp") or 1)
    if preset is None:
        return {}, []
    return ({"activation_offload_layers": preset.layers},
            [f"cpu_offloading_num_layers {preset.layers} from its release's preset: {preset.source}"])


def study_recipe_fields(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """The fields (optimizer, activation fusion, loss) the recipe a measured study ran sets (STUDY_RECIPES), for a row
    citing that study; its Transformer Engine cross-entropy (BRIDGE_PERF_CROSS_ENTROPY) only where the row is scored on
    Megatron-Bridge, as perf_table_fields: Megatron-LM 0.19's pretrain_gpt.py refuses it (rule PR009), so a row scored
    on Megatron-Core runs that framework's default loss."""
    cited = row_text(row["source"]["citation"], row["source"].get("location")).lower()
    for words, (_, fields) in STUDY_RECIPES.items():
        if all(w in cited for w in words):
            return {k: v for k, v in fields.items()
                    if framework == "megatron-bridge" or k not in BRIDGE_PERF_CROSS_ENTROPY}
    return {}


def dynamic_batch_fields(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """micro_batch_size=1 for a verl row whose cited script packs micro-batches to a token budget equal to the row's
    seq_length (VERL_DYNAMIC_BSZ_SCRIPTS); {} otherwise."""
    cited = row_text(row["source"]["citation"])
    if framework != "verl" or not any(script in cited for script in VERL_DYNAMIC_BSZ_SCRIPTS):
        return {}
    return {"micro_batch_size": 1}

def recipe_mtp(row: dict[str, Any], model_key: str | None) -> tuple[dict[str, Any], list[str]]:
    """(Request fields, notes): the MTP depth the recipes of the source the row names (its framework or citation
    naming the repository) train its catalog model at (RECIPE_MTP); ({}, []) where none is listed."""
    if model_key is None:
        return {}, []
    text = row_text(row["framework"], row["source"]["citation"], row["source"]["location"]).lower()
    for entry in RECIPE_MTP:
        if entry.model == model_key and entry.repo.lower() in text:
            return entry.fields(), [f"MTP depth from {entry.repo} {entry.source}"]
    return {}, []

# --------------------------------------------------------------------------- the pipeline split a recipe sets


def split_fields(split: RecipeSplit, mtp: int) -> dict[str, Any] | None:
    """The Request fields a recipe's split (RECIPE_SPLITS) sets for a model with `mtp` MTP layers; None where it
    does not place them (Megatron-Core's validate_layer_layout: the layout's m count is mtp_num_layers)."""
    if split.account_for:
        return {"account_for_embedding": True, "account_for_loss": True}
    if split.layout is not None:
        return {"pipeline_layout": split.layout} if "".join(parse_layout(split.layout)).count("m") == mtp else None
    if mtp and not split.mtp_before_loss:
        return None
    stages = ["t" * n for n in split.counts]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * mtp + "L"
    return {"pipeline_layout": format_layout(stages)}


def recipe_split(row: dict[str, Any], model_key: str | None, mtp: int) -> tuple[dict[str, Any], str]:
    """(Request fields, where they come from) for the split the sources the row names (its framework or citation
    naming the repository) set for its model at its pp/vpp; ({}, why not) where none does. An entry of a part of a
    source (`section`) applies where the row's citation names that part, and then before the source's others;
    entries that disagree set nothing."""
    p = row["parallelism"]
    pp, vpp = p["pp"] or 1, p["vpp"] or 1
    if pp == 1 or model_key is None:
        return {}, "no pipeline to split" if pp == 1 else "not a catalog model"
    text = row_text(row["framework"], row["source"]["citation"], row["source"]["location"]).lower()
    words = re.sub(r"[-_/]", " ", text)
    found = [(s, f) for s in RECIPE_SPLITS
             if s.model == model_key and s.repo.lower() in text and s.pp in (None, pp) and s.vpp in (None, vpp)
             and (not s.section or s.section in words) and (f := split_fields(s, mtp)) is not None]
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
    text = row_text(p["pp_layout"], row["outcome"]["other"])
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



# --------------------------------------------------------------------------- MoE recipes, releases, LoRA


def nemo_2407_tp_overlap(row: dict[str, Any]) -> str | None:
    """The NeMo launcher config a NeMo pretraining row ran with ub_tp_comm_overlap True (the release its framework or
    date names, its model family and size: published_runs.nemo_launcher_tp_overlap), else None."""
    if "nemo" not in row_text(row.get("framework")).lower():
        return None
    release = row_text(row.get("framework"), row.get("source", {}).get("version_or_date"))
    model = row.get("model", {})
    return nemo_launcher_tp_overlap(release, row.get("category") == "pretrain", model.get("family"),
                                    model.get("total_params_b"))


NEMO_PERF_SUMMARY = re.compile(r"performance[_-]summary")  # the NeMo user guide's performance page, either spelling


def nemo2_perf_fields(row: dict[str, Any], precision: str, stated: dict[str, Any], zero: int | None) -> dict[str, Any]:
    """The fp8 recipe and fp8_param_gather the NeMo 2.0 performance scripts of the release a NeMo pretraining row
    names set for every fp8 run (published_runs.nemo2_perf_precision; under Megatron-FSDP, `zero` 3, its own
    fp8_param_gather), each where the row states none (`stated`: precision_for's fields), for a row of the NeMo user
    guide's performance summary, the runs those scripts made; {} otherwise. A run of the same container by other
    code (an MLPerf submission's NeMo 2.0 implementation, 'NeMo 25.04 (MLPerf Training v5.0 ...)') ran its own
    settings, not the performance scripts': the container names no launcher."""
    if precision != "fp8" or row.get("category") != "pretrain" or "nemo" not in row_text(row.get("framework")).lower():
        return {}
    if not NEMO_PERF_SUMMARY.search(row_text(row["source"].get("citation")).lower()):
        return {}
    facts = nemo2_perf_precision(row_text(row.get("framework"), row.get("source", {}).get("version_or_date")))
    if facts is None:
        return {}
    out: dict[str, Any] = {}
    if "fp8_recipe" not in stated:
        out["fp8_recipe"] = facts.fp8_recipe
    if "fp8_param_gather" not in stated:
        out["fp8_param_gather"] = facts.fp8_param_gather_fsdp if zero == 3 else facts.fp8_param_gather
    return out


def nemo2_loss_fields(row: dict[str, Any], framework: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(Request fields, knobs): the cross-entropy a NeMo 2.0 performance-summary row's release ran
    (published_runs.nemo2_perf_loss), scored on Megatron-Core: the native fused loss as it is; Transformer Engine's
    only where a request can name the container's Megatron-Core release (releases.resolve_release), since the card's
    own, 0.19.2, refuses it (rule PR009). The releases that ran it (0.12, 0.13) are older than any the card stands for
    (its oldest_release), so those rows record the knob te_cross_entropy and keep the framework's default loss.
    ({}, {}) for any other row."""
    cited = row_text(row["source"].get("citation")).lower()
    if framework != "megatron-core" or not NEMO_PERF_SUMMARY.search(cited):
        return {}, {}
    facts = nemo2_perf_loss(row_text(row.get("framework"), row["source"].get("version_or_date")))
    if facts is None:
        return {}, {}
    if facts.fusion_impl == "te":
        try:
            resolve_release(framework_card(framework), facts.megatron_core)
        except MeshplanError:
            return {}, {"te_cross_entropy": f"Transformer Engine's cross-entropy on Megatron-Core "
                                            f"{facts.megatron_core} ({facts.source})"}
    return {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": facts.fusion_impl}, {}


def recipe_moe(row: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """(knobs, notes) from the Megatron-Bridge perf recipe a row cites (RECIPE_MOE): the function it names, or, where
    it names only the recipe file, that file's function for its GPU count, system and precision (the recipes'
    <model>_pretrain_<n>gpu_<system>_<precision>_config naming). moe_a2a_overlap becomes the plan knob (map_row); its
    CUDA graphs the knob cuda_graphs, which graph_fields reads (a full-iteration graph with its static expert capacity
    stays one meshplan cannot express: the host syncs it removes are still timed)."""
    cited = row_text(row["source"]["citation"])
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
    elif r.graphs is not None:
        impl, modules = r.graphs
        knobs["cuda_graphs"] = f"{impl} CUDA graphs ({', '.join(modules)}) ({BRIDGE} {r.source} {name})"
    return knobs, [f"MoE overlap and graphs from {BRIDGE} {name}"] if knobs else []


GRAPH_MODULES = ("attn", "mlp", "moe_router", "moe_preprocess", "moe", "mamba")


def graph_fields(text: str, moe: bool) -> dict[str, Any] | None:
    """cuda_graph_impl and cuda_graph_modules from the words of a row or of the recipe it cites (the knob
    cuda_graphs): the modules it names ('TE CUDA graphs (attn, moe_router, moe_preprocess)', 'moe_router+
    moe_preprocess'); local where it says so ('CUDA graphs (local)'), else Transformer Engine's, the only per-layer
    implementation Megatron-Bridge's performance scripts take module scopes with (scripts/performance/
    argument_parser.py: 'local is reserved for full_iteration'); no module named: the whole layer, Megatron-Core's
    default. None where meshplan cannot express it: a full-iteration graph of an MoE model (its static expert
    capacity), or the whole layer of an MoE model (which the row did not run: the modules are not stated, rule
    CG002)."""
    low = text.lower()
    modules = [m for m in GRAPH_MODULES if re.search(rf"(?<![a-z_]){m}(?![a-z_])", low)]
    if re.search(r"full[- ]iteration", low):
        return None if moe else {"cuda_graph_impl": "full_iteration"}
    if not modules and moe:
        return None
    impl = "local" if re.search(r"\blocal\b", low) else "transformer_engine"
    return {"cuda_graph_impl": impl, "cuda_graph_modules": modules or None}


# A row stating it ran eager, where its framework compiles by default (KempnerForge's train.compile_model)
NOT_COMPILED = re.compile(r"without torch\.compile|compile_model\s*=\s*false")


def compile_field(row: dict[str, Any], framework: str, knobs: dict[str, str]) -> dict[str, Any]:
    """torch_compile=True for a row that states compile on a framework whose card compiles what it ran (a row dated
    from its compile card's loss_since, where it has one: torchtitan's runs once the loss was compiled too), False
    for one that states it ran without (NOT_COMPILED) on a framework that compiles by default; the knob stays
    recorded otherwise."""
    when = str(row["source"].get("version_or_date") or "")
    scope = framework_card(framework).compile
    if scope is not None and NOT_COMPILED.search(row_text(row["name"], row["outcome"]["other"]).lower()):
        knobs.pop("torch_compile", None)
        return {"torch_compile": False}
    if "torch_compile" not in knobs or scope is None:
        return {}
    if scope.loss_since and not (re.match(r"\d{4}-\d{2}", when) and when >= scope.loss_since):
        return {}
    knobs.pop("torch_compile")
    return {"torch_compile": True}


def stated_switch(row: dict[str, Any], setting: str) -> bool | None:
    """The true/false a row's outcome notes give the config setting `setting` (its dotted name, e.g.
    loss_fn.fp32_upcast, as the notes write it: "<setting> true|false"), None where they name none."""
    found = re.search(rf"{re.escape(setting)}\s+(true|false)", row_text(row["outcome"]["other"]), re.IGNORECASE)
    return None if found is None else found.group(1).lower() == "true"


def defer_field(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """defer_fsdp_grad_sync as the config a row cites sets it (its outcome notes name the setting), on a framework
    that has the setting (its card's grad_accumulation.knob); left out, the framework's default, or what the release
    the row ran did (framework_version_for: a NeMo AutoModel main snapshot before its outer model was sharded reduced
    every micro-batch, request.resolve)."""
    facts = framework_card(framework).grad_accumulation
    found = stated_switch(row, "defer_fsdp_grad_sync")
    if facts is None or facts.knob is None or found is None:
        return {}
    return {"defer_fsdp_grad_sync": found}


def fake_gate_field(row: dict[str, Any]) -> dict[str, Any]:
    """moe_fake_balanced_gate as the config a row cites sets it (its outcome notes name the setting: NeMo AutoModel's
    model.backend.fake_balanced_gate); left out, learned routing."""
    found = stated_switch(row, "fake_balanced_gate")
    return {} if found is None else {"moe_fake_balanced_gate": found}


def upcast_field(row: dict[str, Any]) -> dict[str, Any]:
    """loss_fp32_upcast as the config a row cites sets it (its outcome notes name NeMo AutoModel's
    loss_fn.fp32_upcast); left out, the framework's default."""
    found = stated_switch(row, "loss_fn.fp32_upcast")
    return {} if found is None else {"loss_fp32_upcast": found}


def run_attention_kernel(row: dict[str, Any]) -> str | None:
    """The attention kernel the row's run used where its framework card would pick another, else None."""
    return attention_kernel_of_run(row_text(row["source"]["citation"]))


def framework_version_for(row: dict[str, Any], framework: str) -> str | None:
    """The framework release a row ran, where meshplan's estimate depends on it (torchtitan's loss and attention
    kernel, verl's attention kernel), or the main-branch snapshot it ran (main@YYYY-MM-DD) on a framework whose card
    dates the changes its estimate reads (oldest_snapshot: NeMo AutoModel), else None. A snapshot before the card's
    oldest one, which meshplan would refuse, is scored with the card's own release, as it was before snapshots."""
    when = row["source"].get("version_or_date")
    oldest = framework_card(framework).oldest_snapshot
    snapshot = main_snapshot(when) if oldest else None
    if snapshot is not None and str(snapshot_day(snapshot)) < oldest:
        snapshot = None
    return release_ran(framework, when) or snapshot


def allocator_field(row: dict[str, Any], framework: str) -> dict[str, Any]:
    """expandable_segments=False for a verl row that ran before its workers set it (a month-only date counts as
    before) and for a Bridge row whose cited recipe leaves it out; a NeMo 2.0 performance-summary row takes what its
    release's performance executor set on its system (published_runs.nemo2_perf_expandable_segments); other rows
    keep their framework card's default (how its launcher sets it)."""
    cited = row_text(row["source"].get("citation"), row["source"].get("location"))
    if ran_without_expandable_segments(framework, row["source"].get("version_or_date"), cited):
        return {"expandable_segments": False}
    if NEMO_PERF_SUMMARY.search(row_text(row["source"].get("citation")).lower()):
        system = str(row["hardware"]["gpu_type"]).split("-")[0]
        release = row_text(row.get("framework"), row["source"].get("version_or_date"))
        expandable = nemo2_perf_expandable_segments(release, system)
        if expandable is not None:
            return {"expandable_segments": expandable}
    return {}


def lora_for(row: dict[str, Any], framework: str, what: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(framework, Request LoRA fields, knobs) of a LoRA row: the rank and targets its own `lora` section states
    (production_rows.stated_lora), what it leaves out from the recipe it cites (LORA_RECIPES), else job=lora with the
    framework's default for it (knob "lora", naming what was not stated). A framework whose card runs no LoRA but
    names the framework that trains the same model with it (its lora_rank knob's runs_on: Megatron-LM's pretrain_gpt
    -> Megatron-Bridge, whose LoRA is NeMo's ParallelLinearAdapter carried over) has the row scored there; one that
    names none keeps it (rule LORA001 says so)."""
    knobs: dict[str, str] = {}
    card = framework_card(framework)
    elsewhere = None if lora_engines(card) or card.adapter is None else \
        card.adapter.versions[card.adapter.default_version].knobs["lora_rank"].runs_on
    if elsewhere is not None:
        knobs["framework"] = (f"{row['framework']} LoRA: scored with {elsewhere}, which trains the same model with "
                              "LoRA")
        framework = elsewhere
    fields = stated_lora(row).request_fields()
    cited = row_text(row["source"]["citation"])
    recipe = next(({"lora_rank": rank, "lora_targets": targets} for name, (rank, targets, _) in LORA_RECIPES.items()
                   if name in cited), {})
    fields = recipe | fields
    unstated = [word for key, word in (("lora_rank", "rank"), ("lora_targets", "targets")) if key not in fields]
    if unstated:
        knobs["lora"] = f"{what}: {' and '.join(unstated)} not stated"
    return framework, fields if "lora_rank" in fields else {"job": "lora"} | fields, knobs
