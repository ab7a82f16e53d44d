"""One production row -> one meshplan Request: what the row states (bench/production_rows.py) and what the sources
it cites set (bench/production_sources.py), with the settings meshplan cannot express kept as knobs. The method:
bench/production_configs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from production_rows import (
    Mapping,
    Unmapped,
    activation_fusion_field,
    catalog_match,
    dispatcher_for,
    flex_backend_for,
    fp8_setting_fields,
    framework_for,
    gpu_for,
    hsdp_fields,
    model_for,
    network_for,
    offload_fields,
    optimizer_for,
    precision_for,
    ran,
    read_row,
    recompute_for,
    row_text,
    run_knobs,
    script_defaults,
    stated_memory_settings,
    zero_for,
)
from production_sources import (
    allocator_field,
    compile_field,
    defer_field,
    dynamic_batch_fields,
    fake_gate_field,
    framework_version_for,
    graph_fields,
    lora_for,
    nemo2_loss_fields,
    nemo2_perf_fields,
    nemo_2407_tp_overlap,
    perf_table_fields,
    recipe_moe,
    recipe_mtp,
    release_launcher_moe,
    release_preset_dispatch,
    release_preset_offload,
    release_preset_split,
    stage_layers,
    study_recipe_fields,
    upcast_field,
)

from meshplan.adapters.common import torchtitan_batch
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.hardware import get_gpu, with_node_network
from meshplan.knowledge.published_runs import bridge_perf_tp_overlap, torchtitan_pipeline_microbatches
from meshplan.schema.request import Request

ESTIMATE_NEEDS = ("seq_length",)  # a row's memory and step time are per sequence: a row stating none is not scored


def map_row(raw: dict[str, Any], workdir: Path, needs: tuple[str, ...] = ESTIMATE_NEEDS) -> Mapping:
    """The row as a Request, or the reason it cannot be one; never an exception (a field the readers cannot take
    is a reason too). `needs`: the workload fields the caller's figure reads, a row stating none of one unmapped;
    a figure that reads none of them (the CPU optimizer step, per parameter: bench/rl_jobs.offload_study) passes
    (), and a field the row leaves is meshplan's default, which resolve writes to the Job's notes."""
    row, read_notes, read_knobs = read_row(raw)
    out = Mapping(row_id=row["id"], stated_memory=stated_memory_settings(row), ran=ran(row))
    try:
        req, knobs, notes, capacity, source, network = _request(row, workdir, needs)
    except Unmapped as exc:
        out.unmapped = str(exc)
        return out
    except MeshplanError as exc:  # the request itself is refused (a model file, a field bound)
        out.unmapped = f"meshplan refuses the request: {exc}"
        return out
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # a field no reader takes
        out.unmapped = f"the row's fields cannot be read as a request ({type(exc).__name__}: {exc})"
        return out
    out.request, out.knobs, out.notes, out.capacity_bytes, out.model_source, out.network = (
        req, read_knobs | knobs, read_notes + notes, capacity, source, network)
    return out


def _request(row: dict[str, Any], workdir: Path,
             needs: tuple[str, ...]) -> tuple[Request, dict[str, str], list[str], int, str, str]:
    """(Request, knobs, notes, capacity, model source, network_for's reading) of a row read by read_row; Unmapped with
    the reason else (a workload field in `needs` the row does not state: map_row)."""
    w, p = row["workload"], row["parallelism"]
    if missing := [k for k in needs if w.get(k) is None]:
        raise Unmapped(f"{' and '.join(missing)} not stated")
    if not row["hardware"]["num_gpus"] or row["hardware"]["gpu_memory_gb"] is None:
        raise Unmapped("GPU count or GPU memory not stated")
    framework, knobs = framework_for(row["framework"])
    gpu, capacity, k = gpu_for(row["hardware"])
    knobs |= k
    model, source, notes, k = model_for(row, workdir)
    knobs |= k
    network, network_read = network_for(row["hardware"], gpu)  # the row's inter-node network; None: the card's
    if network is not None and (note := network_note(gpu, network, row["hardware"]["gpus_per_node"])):
        notes.append(note)
    recompute, fields, k = recompute_for(row, framework)
    knobs |= k
    precision, f, k = precision_for(row, framework)
    fields |= f
    knobs |= k
    zero, k = zero_for(row)
    knobs |= k
    fields |= nemo2_perf_fields(row, precision, fields, zero)  # what NeMo 2.0's performance scripts set under fp8
    if "hsdp" in knobs and (f := hsdp_fields(row, framework)):  # a plan field since issue 24 (dp_replicate)
        fields |= f
        knobs.pop("hsdp")
    fields |= optimizer_for(row)
    offload, k = offload_fields(row)
    fields |= offload
    knobs |= k
    fields |= perf_table_fields(row, framework)
    loss, k = nemo2_loss_fields(row, framework)  # NeMo 2.0's GPTConfig fusion and its scripts' implementation
    fields |= loss
    knobs |= k
    fields |= study_recipe_fields(row, framework)
    key = catalog_match(row["model"])
    offload, n = release_preset_offload(row, key if model == key else None, {
        **fields, "precision": precision, "zero_stage": zero, "tp": p["tp"]})  # its release's preset's count
    if offload:  # Megatron-Core's layer-wise offload (OF003: not beside the fine-grained one)
        fields = {k: v for k, v in fields.items() if k != "activation_offload"} | offload
        knobs.pop("cpu_offloading", None)
        notes += n
    preset_split, n = release_preset_split(row, key if model == key else None)  # its release's config's layout
    notes += n
    if preset_split:  # the layout and MTP depth that config passed, over the recipes' (RECIPE_MTP, RECIPE_SPLITS)
        fields |= preset_split
        first = last = None
    else:
        mtp, n = recipe_mtp(row, key if model == key else None)  # a config path: the row's own model (MTP off)
        fields |= mtp
        notes += n
        first, last, f, n, k = stage_layers(row, key, mtp.get("mtp_num_layers", resolve_model(model).num_mtp_layers))
        fields |= f
        notes += n
        knobs |= k
    dispatcher, k = dispatcher_for(row)
    knobs |= k
    if (backend := flex_backend_for(row)) is not None:  # the backend the run chose, not the machine's
        fields["moe_flex_backend"] = backend
    preset, n = release_preset_dispatch(row, key)  # a table row stating none: its release's preset's dispatcher
    if preset:
        dispatcher, fields["moe_flex_backend"] = preset["moe_token_dispatcher"], preset["moe_flex_backend"]
        notes += n
    knobs |= run_knobs(row)
    k, n = recipe_moe(row)
    if (launched := release_launcher_moe(row, key, k)) != k:  # the overlap its own release's launcher set
        n = [*n, f"EP all-to-all overlap {'on' if 'moe_a2a_overlap' in launched else 'off'} from the launcher of "
                 "its release (Megatron-Bridge's published table)"]
        k = launched
    if preset and not preset["moe_a2a_overlap"]:  # the preset's own overlap over the recipe's
        k.pop("moe_a2a_overlap", None)
    elif preset:
        k["moe_a2a_overlap"] = "its release's preset (published_runs.BRIDGE_PERF_PRESET_DISPATCH)"
    recipe_graphs = k.get("cuda_graphs")
    knobs = {**k, **knobs}  # what the row states over what the recipe it cites sets (its CUDA graphs)
    notes += n
    tp_facts = framework_card(framework).tp_overlap
    if framework == "megatron-bridge" and (perf := bridge_perf_tp_overlap(
            row_text(row["source"]["citation"]), row["model"].get("family"), p["tp"])):
        knobs.setdefault("tp_comm_overlap", perf)
    launcher = nemo_2407_tp_overlap(row)
    if launcher:
        knobs.setdefault("tp_comm_overlap", f"NeMo-Framework-Launcher 1ab2c781 {launcher}.yaml ub_tp_comm_overlap")
    if "tp_comm_overlap" in knobs and tp_facts.needs_compile:  # async TP is a torch.compile pass: the run compiled
        knobs.setdefault("torch_compile", "async TP (a torch.compile pass)")
    fields |= compile_field(row, framework, knobs)
    fields |= defer_field(row, framework)
    fields |= fake_gate_field(row)
    fields |= upcast_field(row)
    if knobs.pop("tp_comm_overlap", None):  # a plan knob since issue 15 item 4; at tp 1 there is nothing to hide
        fields["tp_comm_overlap"] = (p["tp"] or 1) > 1 and tp_facts.switch is not None
        if (p["tp"] or 1) <= 1:
            notes.append("TP comm overlap stated at tp 1: no TP communication, scored without")
    fields |= allocator_field(row, framework)
    f, n = script_defaults(row, framework)  # Megatron-DeepSpeed's own attention and dropout, where the row states none
    fields |= f
    notes += n
    if "lora" in knobs:  # LoRA rows: job=lora, rank and targets from the row's lora section, else its cited recipe
        framework, f, k = lora_for(row, framework, knobs.pop("lora"))
        fields |= f
        knobs |= k
    f, k = fp8_setting_fields(row, framework)  # where the framework it is scored on has the keys
    fields |= f
    knobs |= k
    f, k = activation_fusion_field(row, framework)  # a row stating Megatron-Core's bias_activation_fusion
    fields |= f
    knobs |= k
    moe = bool(row["model"]["num_experts"]) or row["model"]["arch_type"] != "dense"
    if not moe:  # no MoE layer reads a dispatcher
        fields.pop("moe_flex_backend", None)
    if moe and knobs.pop("moe_a2a_overlap", None):  # a plan knob since issue 15 item 1
        fields["moe_a2a_overlap"] = True
    if "cuda_graphs" in knobs and (graphs := graph_fields(knobs["cuda_graphs"], moe)
                                   or (recipe_graphs and graph_fields(recipe_graphs, moe))) is not None:
        fields |= graphs  # a plan knob since lane graphs42 (timed as eager: rule CG002 keeps the experts eager)
        knobs.pop("cuda_graphs")
    if batch := dynamic_batch_fields(row, framework):  # verl's token-budget micro-batch: the knob is expressed
        w = {**w, **batch}
        knobs.pop("dynamic_batch", None)
    w, f = pipeline_batch(row, framework, w)
    fields |= f
    req = Request(
        model=model, gpu=gpu, num_gpus=row["hardware"]["num_gpus"], gpus_per_node=row["hardware"]["gpus_per_node"],
        network_gbps_per_node=network,
        **({"seq_length": w["seq_length"]} if w["seq_length"] is not None else {}),  # none: needs allowed it
        global_batch_size=w["global_batch_size"],
        micro_batch_size=w["micro_batch_size"],
        precision=precision, framework=framework, tp=p["tp"], pp=p["pp"], vpp=p["vpp"], cp=p["cp"],
        ep=p["ep"], etp=p["etp"], dp=p["dp"], sequence_parallel=p["sequence_parallel"], zero_stage=zero,
        recompute=recompute, moe_token_dispatcher=dispatcher if moe else None,
        first_stage_layers=first, last_stage_layers=last, framework_version=framework_version_for(row, framework),
        **fields,
    )
    return req, knobs, notes, capacity, source, network_read


def network_note(gpu: str, gbps_per_node: float, node_gpus: int | None) -> str | None:
    """The row's note where the network its inter_node text states is not its GPU card's (per GPU, as resolve shares
    it: knowledge/hardware.with_node_network); None where they agree."""
    card = get_gpu(gpu)
    ours = with_node_network(card, gbps_per_node, node_gpus or card.gpus_per_node).network_bandwidth
    if ours == card.network_bandwidth:
        return None
    return (f"network {gbps_per_node:,g} Gb/s per node: {ours / 1e9:,.4g} GB/s per GPU, where the {card.key} card has "
            f"{card.network_bandwidth / 1e9:,.4g}")


def pipeline_batch(row: dict[str, Any], framework: str, w: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(workload, Request fields) of a row on a framework that runs its pipeline schedule once per local batch (its
    card's pipeline section: torchtitan): the row's micro-batch is that framework's local batch, cut as the import
    and render cut it (adapters/common.torchtitan_batch), by the release the row's date falls in
    (published_runs.torchtitan_pipeline_microbatches); unchanged otherwise."""
    p = row["parallelism"]
    pp, local = p["pp"] or 1, w["micro_batch_size"]
    if pp == 1 or not local or not framework_card(framework).pipeline.runs_per_accumulation_step:
        return w, {}
    count = torchtitan_pipeline_microbatches(row["source"].get("version_or_date"), pp, p["vpp"] or 1)
    try:
        batch = torchtitan_batch(int(local), None, pp, microbatches=count, dp=p["dp"],
                                 global_batch_size=w["global_batch_size"])
    except MeshplanError:
        return w, {}
    return {**w, "micro_batch_size": batch.pop("micro_batch_size")}, batch


def all_knobs(raw: dict[str, Any]) -> dict[str, str]:
    """The knobs of a row that does not map, read by every reader that can still run on it."""
    row, _, knobs = read_row(raw)
    readers = (lambda: framework_for(row["framework"])[1], lambda: recompute_for(row, "")[-1],
               lambda: precision_for(row, framework_for(row["framework"])[0])[-1],
               lambda: zero_for(row)[1], lambda: offload_fields(row)[1],
               lambda: stage_layers(row, catalog_match(row["model"]))[-1], lambda: dispatcher_for(row)[1],
               lambda: run_knobs(row))
    for read in readers:
        try:
            knobs |= read()
        except (Unmapped, KeyError, TypeError, ValueError, AttributeError, IndexError):
            continue
    return knobs
