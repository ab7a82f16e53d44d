"""How meshplan does on published production configurations, used as a user would use it.

Data: ../shared/validation/production_configs_dev.yaml (124 published production or expert-tuned
configurations, each with its model, hardware, workload, parallelism, memory settings and, where the source
gives them, measured throughput and peak memory). Every item really ran or is an official recipe.

Method (no per-row constants, nothing fitted):
- Each row becomes one `meshplan.schema.request.Request`, the object every face of meshplan takes, and is scored
  through `meshplan.api` (check_config, estimate_memory, estimate_throughput), as a user would call them.
  - model: the catalog key whose architecture agrees with every model field the row states (layers, hidden,
    FFN, heads, KV heads, vocabulary, experts, top-k, expert FFN, shared experts, dense layers, MLA); among
    equal architectures the one the row's model id names. Otherwise a config.json built from the row's
    model fields (HF model_type from the row's family, cards/model_families.yaml) in a temporary folder; a field the
    row leaves out comes from the catalog card of that model_type with the nearest hidden size (a note).
  - gpu: the catalog GPU the row's gpu_type names, when its memory is the row's gpu_memory_gb (within 3%);
  - network: the row's hardware.inter_node text, read by one parser (production_rows.network_for) into the request's
    network_gbps_per_node: a rate per node ('8x 400 Gb/s per node', '4x Omni-Path 100 Gb/s per node') as stated, one
    per GPU times the node's GPUs; a text with no rate or no 'per node' / 'per GPU' leaves the GPU card's network,
    counted in the summary by why;
  - framework: the meshplan framework the row's framework string names: the framework cards' names, display names
    and aliases, and bench/data/frameworks_without_card.yaml (the name met first, the longest there); a framework
    without a card is scored with its nearest card (knob "framework") or not mapped, with its reason;
  - tp/pp/vpp/cp/ep/etp/dp, micro/global batch, sequence, precision, recompute, ZeRO/FSDP, sequence
    parallelism, dispatcher and first/last stage layers as the row states them; what it leaves unstated is
    left to meshplan's defaults (and `resolve` notes them).
- Megatron's recompute modules and uniform/block method, torchtitan's per-op SAC, a pipeline layout string the
  row gives and account_for_embedding/loss are passed to the Request as the row states them (recompute_for,
  stage_layers). A row that states no split of its own gets the one the sources it names set for its model, pp,
  vpp and MTP layers (RECIPE_SPLITS: Megatron-Bridge's layout helpers and perf recipes, its base recipes'
  account_for_*, Megatron-MoE-ModelZoo's scripts), each entry citing its path.
- What the launcher a row cites sets for every run it makes is passed too: Megatron-Bridge's performance-table runs
  reduce gradients in bf16 and run Transformer Engine's fused cross-entropy (perf_table_fields), verl's example
  scripts pack each micro-batch to a token budget of the row's seq_length (dynamic_batch_fields), and a measured
  study's recipe sets its optimizer precision
  (study_recipe_fields: Bridge's Moonlight recompute study ran the 8-H100 recipe's bf16 moments and main grads and
  its shared experts overlapped with the dispatch, moe_shared_expert_overlap), and a Megatron-FSDP run of
  Megatron-Bridge's tables the layer-wise activation offload its release's preset set (release_preset_offload:
  cpu_offloading_num_layers, published_runs.BRIDGE_PERF_PRESET_OFFLOAD) where the row states no count.
- A LoRA row's rank and targets from its own `lora` section (rank, alpha, targets in Megatron-Core's linear names,
  production_rows.stated_lora), what it leaves out from the recipe it cites (LORA_RECIPES), else the framework's
  default (knob "lora").
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
  gpu_memory_gb in GiB). Rows whose estimate a rule error blocks are counted as refused. The same count over the
  rows that ran (`production_rows.ran`, read from the row's own fields): a row whose outcome reports nothing
  measured (no tokens/s, step time, MFU, TFLOP/s or peak) and whose source.kind names a recipe is a recommended
  starting point, not evidence that the job ran, and is left out of that count by name (--json "fit_ran").
- rule errors: error findings of check_config other than the memory ones (MEM*), with their ids; the
  memory verdict is the fit count above.
- peak memory: the row's peak_memory_gb_per_gpu is in GB (1e9 bytes: the two rows that also give GiB
  agree only so). What it measured is read from the row (`peak_convention`): "allocated" when the row says
  so, torchtitan rows "reserved" (torchtitan logs max_reserved_gib, torchtitan/components/metrics.py
  DeviceMemoryMonitor), a row whose source names its framework's benchmark harness the basis of the memory report
  that harness reads (the framework card's memory_report), else "not stated". meshplan's peak (the worst stage) is
  compared as bench/memory_accuracy.py does: reserved = peak - CUDA context; allocated = peak - context - allocator
  reserve; not stated = the device total meshplan reports. When it was read (`peak_moment`): the iteration the row
  states, else the moment of that harness's report (Megatron-Bridge's scripts/performance: after iteration 1,
  compared with the stage's first_iteration_allocated_peak, the optimizer state allocated inside that step), else
  a later iteration's (steady). Bridge's published measured peaks: --validation bench/data/megatron_bridge_memory.
- throughput: tokens/s per GPU where the row gives it, else its TFLOP/s per GPU turned into tokens/s with
  meshplan's model FLOPs per token (Megatron's causal formula; a source that counted otherwise shows up as
  error). RL rows (their step includes the rollout) and runs the source marks as not absolute throughput
  are left out, with the reason.

Code: reading a row bench/production_rows.py, what its sources set bench/production_sources.py (the facts
in meshplan/knowledge/published_runs.py), the Request bench/production_mapping.py, scoring and summary
bench/production_scoring.py; this script reports.

Out of sample (--json): every fitted constant refitted without the row's own source (leave one source out,
out_of_sample), reported beside the in-sample figures.

Run: python bench/production_configs.py [--rows] [--issue] [--json] [--validation DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import fitted_constants
import production_rows as prow
from production_mapping import map_row
from production_rows import DEFAULT_VALIDATION, KNOBS
from production_scoring import Score, Summary, median, run, summarise

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GB, GIB

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
            moment = " after iteration 1" if s.moment == "first_iteration" else ""
            extra.append(f"peak {s.measured_peak_bytes / GB:.1f} GB {s.convention}{moment}: {_pct(s.peak_error)}")
        if s.tps_error is not None:
            extra.append(f"{s.tps_basis} {_pct(s.tps_error)}")
        if s.refused:
            extra.append(f"[{s.refused[:90]}]")
        if s.over:
            extra.append(s.over)
        knobs = ("not expressible: " + ", ".join(m.knobs)) if m.knobs else "exact"
        notes = f" | {'; '.join(m.notes)}" if m.notes else ""
        stated = ("S" if m.stated_memory else "-") + ("" if m.ran else "r")  # r: a recipe that measured nothing
        print(f"{m.row_id:46s} {stated:2s} {s.group:5s} {verdict:7s} {peak:>10s} "
              f"{'; '.join(extra)} | {m.model_source} | {knobs}{notes}")


def print_summary(s: Summary, issue: dict[str, Any] | None) -> None:
    print(f"rows {s.total}: mapped {s.mapped} ({s.exact} with every stated setting, {s.mapped - s.exact} with the "
          f"nearest expressible ones), not mapped {len(s.unmapped)}")
    for rid, why in s.unmapped.items():
        print(f"  not mapped: {rid}: {why}")
    print(f"stated memory settings: {s.stated} rows, {s.fit['all'].rows} mapped")
    for key in ("all", "exact", "nearest"):
        v = s.fit[key]
        print(f"  {key:8s} {v.rows:3d}: predicted to fit {v.fit}, not to fit {v.not_fit}, estimate refused {v.refused}")
    v = s.fit["ran"]
    print(f"rows that ran (stated memory settings, and a measured outcome or a source that is no recipe): {v.rows}: "
          f"predicted to fit {v.fit}, not to fit {v.not_fit}, estimate refused {v.refused}")
    print(f"  recipes that publish no measurement, left out: {len(s.recommendations)}: "
          f"{', '.join(s.recommendations) or '-'}")
    print(f"rule errors (not MEM*): {s.rule_error_rows['all']} of {s.mapped} mapped rows ({s.rule_error_rows['exact']} "
          f"of the {s.exact} exact ones); rows per id {s.rule_error_ids}; MEM* errors on {s.memory_error_rows} rows")
    print(f"peaks: {s.measured_peaks} measured, {s.peaks['all'].rows} compared: median |error| "
          f"{_pct(s.peaks['all'].median, False)} (memory-exact rows {s.peaks['exact'].rows}: "
          f"{_pct(s.peaks['exact'].median, False)})")
    print("throughput, median |error| of tokens/s per GPU (median signed): " + ", ".join(
        f"{k} {_pct(e.median, False)} ({e.rows}; {'-' if e.signed is None else f'{e.signed:+.1%}'})"
        for k, e in s.throughput.items()))
    read = s.network_reads.get(prow.NETWORK_READ, 0)
    left = ", ".join(f"{why} {n}" for why, n in s.network_reads.items() if why != prow.NETWORK_READ) or "none"
    print(f"inter-node network (network_gbps_per_node from hardware.inter_node): {read} of {s.mapped} mapped rows "
          f"read; left at the GPU card's: {left}")
    print("not expressible (rows, of which mapped, what it changes):")
    for knob, n in s.knob_rows.items():
        print(f"  {knob:28s} {n:3d} {s.knob_rows_mapped.get(knob, 0):3d}  {KNOBS[knob][0]}")
    if issue:
        print(f"issue 14's reading: {issue['not_fit']} of {issue['stated']} stated rows not fitting; "
              f"{len(issue['peaks'])} peaks, median |error| {_pct(issue['peak_median'], False)}")


# --------------------------------------------------------------------------- in and out of sample


def out_of_sample(validation: Path, rows: list[dict[str, Any]], scores: list[Score]
                  ) -> tuple[Summary, dict[str, dict[str, float]]]:
    """The summary with every fitted constant fitted without the row's own source (leave one source out,
    bench/fitted_constants.py: gemm_peak_fraction, the MoE constants, the eager pass count): each timed row of a
    source some fit used is estimated again under the constants fitted on the other sources; the rows of the other
    sources keep their figure (no fit saw them). Fit, rule errors and peaks read no fitted constant (the memory cards
    hold none) and are the in-sample ones. Also {source: the constants fitted without it}."""
    sources = {prow.source_key(row) for row, s in zip(rows, scores, strict=True) if s.timed is not None}
    held = fitted_constants.held_out(validation, sources)
    oos = []
    for row, s in zip(rows, scores, strict=True):
        s = copy.copy(s)
        constants = held.get(prow.source_key(row))
        if constants and s.timed is not None and s.measured_tps is not None:
            try:
                s.predicted_tps = s.predict_tps(fitted_constants.applicable(s.timed[0].framework, constants))
            except MeshplanError:
                s.predicted_tps = None
        oos.append(s)
    return summarise(rows, oos), held


def figures(s: Summary) -> dict[str, Any]:
    """The headline figures as --json prints them."""
    def pct(x: float | None) -> float | None:
        return None if x is None else round(100 * x, 2)
    return {
        "rows": s.total, "mapped": s.mapped,
        "fit": {"n": s.fit["all"].fit, "N": s.fit["all"].rows},
        "fit_ran": {"n": s.fit["ran"].fit, "N": s.fit["ran"].rows, "left_out": s.recommendations},
        "rule_errors": {"n": s.rule_error_rows["all"], "N": s.mapped},
        "peak": {"median_abs_pct": pct(s.peaks["all"].median), "n": s.peaks["all"].rows},
        "tokens_per_s": {k: {"median_abs_pct": pct(s.throughput[k].median),
                             "median_signed_pct": pct(s.throughput[k].signed), "n": s.throughput[k].rows}
                         for k in ("all", "dense", "MoE", "FSDP")},
    }


def json_report(validation: Path, rows: list[dict[str, Any]], scores: list[Score], summary: Summary
                ) -> dict[str, Any]:
    """The in-sample figures at the top level, the same figures out of sample under "out_of_sample" (with the
    constants each held source was scored under), and each row not mapped with its reason."""
    oos, constants = out_of_sample(validation, rows, scores)
    return {**figures(summary), "out_of_sample": {**figures(oos), "constants_by_held_source": constants},
            "not_mapped": summary.unmapped, "inter_node_network": summary.network_reads,
            "not_expressible": {s.mapping.row_id: sorted(s.mapping.knobs) for s in scores if s.mapping.knobs}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    parser.add_argument("--rows", action="store_true", help="print every row's verdict")
    parser.add_argument("--issue", action="store_true", help="also read the rows the way issue 14's baseline did")
    parser.add_argument("--json", action="store_true", help="the figures in and out of sample, as JSON")
    parser.add_argument("--hybrids", action="store_true",
                        help="also score the hybrid Mamba-2 rows (Nemotron 3 Nano: the catalog model of its name)")
    args = parser.parse_args()
    prow.SCORE_HYBRIDS = args.hybrids
    rows, scores, summary = run(args.validation)
    if args.json:
        print(json.dumps(json_report(args.validation, rows, scores, summary), indent=1))
        return 0
    if args.rows:
        print_rows(rows, scores)
    print_summary(summary, issue_reading(rows, args.validation) if args.issue else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
