"""RL jobs (issue 16): meshplan's memory per phase, host memory and step-time parts against verl's published runs.

Data: the RL rows (category rl) of ../shared/validation/production_configs_dev.yaml, whatever their ids (measured
peak GPU memory, step seconds and actor MFU from their fields; host memory per node, rollout seconds and mean
response length from their notes, read by one rule for every row), and verl docs/advance/one_step_off.md (colocated
vs one-step-off DAPO step seconds). The rows state the trainer layout, and where they state them its pipeline split
(production_sources.stage_layers) and offloads (production_mapping.offload_fields); the RL workload of each
(prompts, samples, lengths, rollout TP and memory fraction, offloads) is what the script the row cites sets:
bench/data/rl_workloads.yaml, keyed by the script, each with its source. A row citing no script there is listed with
that reason. A row's mean response length (its notes) is passed as mean_response_length beside the script's
maximum. Nothing here is fitted: every figure is meshplan.api on a Request, as a user would ask.

The rows' MFU is verl's own (perf/mfu/actor: volcengine/verl f6f910069 verl/workers/megatron_workers.py update_actor,
its flops_counter's FLOPs of the step's sequences x ppo_epochs over update_policy's seconds, the world size and its
device table's peak, H20 148 TFLOPS), so each row is scored by the update's MFU as verl counts it: its count
(arithmetic/flops.verl_flops: non-causal attention, the embedding counted as a matmul) of the step's tokens and
squared lengths (rl/step_time.step_token_moments) over meshplan's actor update seconds, the GPUs and the card's peak
(rl/step_time.logged_update_mfu, the verl card's rl.logged_mfu_flops); meshplan's own MFU (Megatron-LM's count)
beside it.

The CPU optimizer the verl rows step every mini-batch (Megatron-Core's HybridDeviceOptimizer at
optimizer_offload_fraction 1.0) is checked apart on the one dev row that measures it at several shares with every
rank of a node stepping at once: a row whose notes give 'optimizer CPU offload A/B/..%: Xx/Yx/.. step time' (the
Megatron-Bridge offload study, 16 H100 at 8 a node), scored as meshplan's CPU step (estimate/memory.step_offload_time:
the card's rate x the rank's optimizer shard x the share) against the row's step x (multiplier - 1).

Run: python bench/rl_jobs.py [--validation DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import yaml
from production_mapping import map_row, offload_fields
from production_sources import stage_layers

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import stage_allocated, step_offload_time
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.step_time import logged_update_mfu

GB = 10**9
DEFAULT_VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
WORKLOADS = Path(__file__).resolve().parent / "data" / "rl_workloads.yaml"


def workloads() -> dict:
    return yaml.safe_load(WORKLOADS.read_text(encoding="utf-8"))


def rl_rows(validation: Path) -> list[dict]:
    """The RL rows of the file (category rl), whatever their ids."""
    data = yaml.safe_load((validation / "production_configs_dev.yaml").read_text(encoding="utf-8"))
    items = data if isinstance(data, list) else []
    return [r for r in items if isinstance(r, dict) and r.get("category") == "rl"]


def noted(row: dict, words: str, unit: str) -> float | None:
    """A figure the row's notes give as '<words> <number> <unit>' ("CPU memory 1,500 GB/node", "rollout 1050 s")."""
    m = re.search(rf"{words}\s+([\d,.]+)\s*{unit}", str((row.get("outcome") or {}).get("other") or ""), re.I)
    return float(m.group(1).replace(",", "")) if m else None


def workload_of(row: dict, scripts: list[dict]) -> dict | None:
    """The workload of the script the row's citation names, else None."""
    cited = str((row.get("source") or {}).get("citation") or "")
    return next((w for w in scripts if w["script"] in cited), None)


def err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+.0%}"


def score_row(row: dict, work: dict) -> dict:
    """meshplan's memory per phase, host memory, step and its parts, and the actor update's MFU for the row, beside
    what the row measured (peak GB, host from its notes, step and rollout seconds, MFU), each where it has one."""
    hw, out = row["hardware"], row.get("outcome") or {}
    fields = {**work["request"], "num_gpus": hw["num_gpus"], "gpu": str(hw["gpu_type"]).split("-")[0].lower()}
    layout = {k: v for k, v in (row.get("parallelism") or {}).items() if k in ("tp", "pp", "ep", "etp", "cp") and v}
    own_pp = layout.get("pp", fields.get("pp")) == fields.get("pp")
    if not own_pp:  # the script's split (and its MTP variant) is for its own pp: the row's own split then
        fields.pop("pipeline_layout", None)
        first, last, split, _, _ = stage_layers(row, fields["model"])
        fields |= {k: v for k, v in (("first_stage_layers", first), ("last_stage_layers", last)) if v} | split
    fields |= layout  # the row states its trainer layout
    fields |= offload_fields(row)[0]  # and its offloads, where it states them (the table's per-scale settings)
    mean = noted(row, "mean response", "tokens")
    # the row's mean response (its notes) beside the script's maximum: the passes cost the mean, the rollout drains
    # to the maximum, verl's dynamic batches pack micro-batches past their budget at it (rl/packing.py); a row with
    # no mean decodes every response at the maximum
    asked = {**fields, **({"mean_response_length": int(mean)} if mean else {})}
    mem = api.estimate_memory(parse_request(asked))
    step = api.estimate_throughput(parse_request(asked))
    job, _ = resolve(parse_request(asked))
    logged = logged_update_mfu(job, step.rl)  # as verl counts it (the card's rl.logged_mfu_flops)
    res = {"script": work["script"], "num_gpus": hw["num_gpus"],
           "phases_gb": {p.phase: round(p.peak_bytes / GB, 1) for p in mem.phases}, "peak_phase": mem.peak_phase,
           "peak_gb": round(mem.peak_bytes / GB, 1), "peak_measured_gb": out.get("peak_memory_gb_per_gpu"),
           "fits": mem.fits, "fit_basis": mem.fit_basis,
           "update_allocated_gb": round(max(stage_allocated(st) for st in mem.stages) / GB, 1),
           "host_tb_per_node": round(mem.host_bytes_per_node / 1e12, 2),
           "host_measured_tb": (lambda x: x and x / 1e3)(noted(row, "CPU memory", "GB")),
           "mean_response": mean, "step_s": round(step.step_time_s), "step_measured_s": out.get("step_time_s"),
           "generation_s": round(step.rl.generation_s), "generation_measured_s": noted(row, "rollout", "s"),
           "parts_s": {k: round(getattr(step.rl, k), 1) for k in ("prefill_s", "decode_s", "log_prob_s", "update_s",
                                                                   "reshard_s", "offload_s")},
           "update_mfu": round(step.rl.update_mfu, 3), "update_mfu_verl": round(logged, 3),
           "mfu_measured": out.get("mfu")}
    if mean:  # beside it, every response at the script's maximum (what a request stating no mean is answered)
        top = api.estimate_throughput(parse_request(fields)).rl
        res["at_max_s"] = {"step": round(top.step_s), "generation": round(top.generation_s),
                           "log_prob": round(top.log_prob_s), "update": round(top.update_s)}
    return res


def one_step_off(data: dict) -> dict:
    """The one-step-off runs of the workload file: each placement's step and parts against the measured ones."""
    out: dict = {}
    for placement, run_ in data["runs"].items():
        t = api.estimate_throughput(parse_request({**data["request"], **run_["request"]}))
        m = run_["measured"]
        out[placement] = {"step_s": round(t.step_time_s), "step_measured_s": m["step"],
                          "generation_s": round(t.rl.generation_s), "generation_measured_s": m["generation"],
                          "log_prob_s": round(t.rl.log_prob_s), "log_prob_measured_s": m["log_prob"],
                          "update_s": round(t.rl.update_s), "update_measured_s": m["update"]}
    first, second = list(out)[:2]
    out["ratio"] = round(out[first]["step_s"] / out[second]["step_s"], 2)
    out["ratio_measured"] = round(out[first]["step_measured_s"] / out[second]["step_measured_s"], 2)
    return out


def offload_study(validation: Path) -> dict:
    """Each dev row whose notes give 'optimizer CPU offload A/B/..%: Xx/Yx/.. step time': per share, meshplan's CPU
    optimizer seconds at the row's layout (step_offload_time) against the row's step_time_s x (multiplier - 1). The
    row is mapped as every scored row is (production_mapping.map_row), needing no workload field: the CPU step is per
    parameter shard, whatever the sequence length the row leaves to meshplan's default."""
    data = yaml.safe_load((validation / "production_configs_dev.yaml").read_text(encoding="utf-8"))
    out: dict = {}
    for row in data if isinstance(data, list) else []:
        other = str(((row or {}).get("outcome") or {}).get("other") or "")
        m = re.search(r"optimizer CPU offload ([\d/]+)%:\s*((?:[\d.]+x/?)+) step time", other)
        step = ((row or {}).get("outcome") or {}).get("step_time_s")
        if not m or not step:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            mapping = map_row(row, Path(tmp), needs=())
        if mapping.request is None:
            out[row["id"]] = {"not_scored": mapping.unmapped}
            continue
        shares = [int(x) / 100 for x in m.group(1).split("/")]
        factors = [float(x.rstrip("x")) for x in m.group(2).split("/")]
        res = []
        for share, factor in zip(shares, factors, strict=True):
            job, plan = resolve(parse_request({**mapping.request.model_dump(exclude_unset=True),
                                                "optimizer_offload_fraction": share}))
            seconds, _ = step_offload_time(job, plan, compute_s=0.0)
            res.append({"share": share, "cpu_step_s": round(seconds, 2), "measured_s": round(step * (factor - 1), 2)})
        out[row["id"]] = {"gpus_per_node": row["hardware"].get("gpus_per_node"), "shares": res}
    return out


def run(validation: Path) -> dict:
    """Every RL row of the file: scored where the script it cites has a workload in bench/data/rl_workloads.yaml,
    else listed with that reason; then the one-step-off runs."""
    data = workloads()
    rows: dict = {}
    for row in rl_rows(validation):
        work = workload_of(row, data["scripts"])
        if work is None:
            rows[row["id"]] = {"not_scored": "the script it cites has no workload in rl_workloads.yaml"}
            continue
        try:
            rows[row["id"]] = score_row(row, work)
        except MeshplanError as exc:
            rows[row["id"]] = {"not_scored": f"meshplan refuses the request: {str(exc).splitlines()[0]}"}
    return {"rows": rows, "one_step_off": one_step_off(data["one_step_off"]),
            "cpu_optimizer": offload_study(validation)}


def report(res: dict) -> None:
    for rid, d in res["rows"].items():
        if "not_scored" in d:
            print(f"{rid}: not scored: {d['not_scored']}")
            continue
        line = f"{rid} ({d['script']}, {d['num_gpus']} GPUs): peak {d['peak_gb']} GB in {d['peak_phase']}"
        if d["peak_measured_gb"]:
            line += f" vs {d['peak_measured_gb']} measured ({err(d['peak_gb'], d['peak_measured_gb'])})"
        line += (f", fits {d['fits']} ({d['fit_basis']} basis; the update's allocated peak "
                 f"{d['update_allocated_gb']} GB); update MFU {d['update_mfu_verl']} as verl counts it "
                 f"({d['update_mfu']} meshplan's)")
        if d["mfu_measured"]:
            scored = d["update_mfu_verl"] or d["update_mfu"]
            line += f" vs {d['mfu_measured']} ({err(scored, d['mfu_measured'])})"
        print(line)
        if d["host_measured_tb"]:
            print(f"  host per node {d['host_tb_per_node']} TB vs {d['host_measured_tb']} TB "
                  f"({err(d['host_tb_per_node'], d['host_measured_tb'])})")
        mean = (f"mean response {d['mean_response']:,.0f} tokens" if d["mean_response"] else
                "no mean: every response at the maximum")
        print(f"  step {d['step_s']} s" + (f" vs {d['step_measured_s']} ({err(d['step_s'], d['step_measured_s'])})"
                                          if d["step_measured_s"] else "")
              + f"; rollout {d['generation_s']} s" + (f" vs {d['generation_measured_s']} "
                                                      f"({err(d['generation_s'], d['generation_measured_s'])})"
                                                      if d["generation_measured_s"] else "") + f" ({mean})")
        print(f"  phases (GB) {d['phases_gb']}; parts {d['parts_s']}")
        if "at_max_s" in d:
            print(f"  every response at the maximum instead (s): {d['at_max_s']}")
    o = res["one_step_off"]
    print("One-step-off DAPO, Qwen2.5-Math-7B, 16 H20 (colocated vs 4 rollout + 12 training GPUs)")
    for placement, p in o.items():
        if not isinstance(p, dict):
            continue
        e = err(p["step_s"], p["step_measured_s"])
        print(f"  {placement:>9}: step {p['step_s']} s vs {p['step_measured_s']} ({e}), generation "
              f"{p['generation_s']} vs {p['generation_measured_s']}, log-prob {p['log_prob_s']} vs "
              f"{p['log_prob_measured_s']}, update {p['update_s']} vs {p['update_measured_s']}")
    print(f"  ratio: {o['ratio']} vs {o['ratio_measured']} measured")
    for rid, d in res["cpu_optimizer"].items():
        if "not_scored" in d:
            print(f"CPU optimizer step, {rid}: not scored: {d['not_scored']}")
            continue
        print(f"CPU optimizer step, {rid} ({d['gpus_per_node']} ranks a node stepping at once): "
              + ", ".join(f"{x['share']:.0%} {x['cpu_step_s']} s vs {x['measured_s']} "
                          f"({err(x['cpu_step_s'], x['measured_s'])})" for x in d["shares"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(args.validation)
    print(json.dumps(res, indent=1)) if args.json else report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
