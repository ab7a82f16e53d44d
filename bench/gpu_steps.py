"""meshplan's memory and step-time estimates against one real training step on one GPU (CUDA's own counters).

Ground truth with a GPU, when a session is lent one (`bench/gpu_step_harness.py` runs there; it needs torch and
transformers, not meshplan): Hugging Face transformers' model code for catalog models cut to a few decoder layers,
trained one step at a time as verl's FSDP2 engine runs it on one rank (fp32 params, bf16 compute, flash attention,
the flash cross-entropy's memory, AdamW foreach), each case once with PyTorch's default allocator and once with
expandable segments. The same cut models go to meshplan as `bench/fake_tensor_hf.py` gives them (verl, zero_stage
3, one GPU, one packed micro-batch of `tokens`), and each measured figure is set beside meshplan's:
- allocated peak (torch.cuda.max_memory_allocated) against `stage_allocated` less the CUDA context (which torch's
  counter does not see);
- reserved peak (max_memory_reserved) against the stage total less the context, with expandable segments off and on;
- what the device holds outside torch's pool (used memory at the end less the reserved peak) against the context
  and fixed overhead of cards/memory.yaml;
- the step time (median of the timed steps) against `estimate_throughput`'s step_time_s, and against it with the
  loss the harness ran: its chunked torch cross-entropy (bench/step_op_census.py's count per logit as CUDA runs it,
  stored in bench/data/step_op_census.json) in place of flash_attn's Triton kernels, which verl calls and meshplan
  times (FLASH_CROSS_ENTROPY_BYTES_PER_LOGIT of cards/memory.yaml fsdp2_hf loss_hbm_bytes_per_logit).
Nothing here is fitted; the figures are reported, and their errors go to bench/README.md.

    python bench/gpu_steps.py prepare                      # writes bench/data/gpu_cases.json (travels to the GPU)
    python bench/gpu_step_harness.py --cases bench/data/gpu_cases.json --out $OUT --budget 300   # on the GPU
    python bench/gpu_steps.py compare RESULTS.json [--json bench/data/gpu_h200_steps.json]
    python bench/gpu_steps.py prepare-fit                  # writes bench/data/gpu_fit_cases.json
    python bench/gpu_step_harness.py --fit bench/data/gpu_fit_cases.json --out $OUT --budget 540   # on the GPU

The fit cases ask what decides the fit on PyTorch's default allocator (the least capacity each runs on, between its
allocated and reserved peaks): the cases without recompute, whose reserve is the largest, each with every step at
`tokens` and with steps of different packed lengths (FIT_STEP_SHARES of `tokens`), the latter also on one
stream (`one_stream`: bf16, no FSDP2, as Megatron's actor update allocates), as verl's token-budget
micro-batches are (use_dynamic_bsz: verl/utils/seqlen_balancing.py rearrange_micro_batches balances the sequences
into ceil(total / budget) micro-batches, each about the budget and none the same).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from meshplan.arithmetic.memory_states import memory_card
from meshplan.estimate.memory import estimate_memory, stage_allocated
from meshplan.estimate.perf import estimate_throughput, step_terms
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards
from meshplan.schema.plan import Job, Plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from fake_tensor_hf import FRAMEWORK, card_config, catalog  # noqa: E402
from fake_tensor_memory import cut, pct  # noqa: E402

CASES_JSON = ROOT / "bench" / "data" / "gpu_cases.json"
CENSUS_JSON = ROOT / "bench" / "data" / "step_op_census.json"
# flash_attn/ops/triton/cross_entropy.py: cross_entropy_fwd_kernel reads each bf16 logit once, cross_entropy_bwd_kernel
# reads it and writes its gradient in place (verl's inplace_backward): 2 + 4 B of fsdp2_hf's loss_hbm_bytes_per_logit
FLASH_CROSS_ENTROPY_BYTES_PER_LOGIT = 6
DEFAULT_JSON = ROOT / "bench" / "data" / "gpu_h200_steps.json"
GIB = 1 << 30
GPU = "h200"
# catalog model -> decoder layers, packed tokens, config.json fields the catalog card leaves out (as fake_tensor_hf)
MODELS = {
    "llama-3.1-8b": {"layers": 8, "tokens": 8192, "override": {}},
    "qwen3-30b-a3b": {"layers": 4, "tokens": 8192, "override": {"norm_topk_prob": True}},
    "deepseek-v2-lite": {"layers": 4, "tokens": 8192, "override": {}},
    "llama-3.1-8b@16": {"model": "llama-3.1-8b", "layers": 16, "tokens": 4096, "override": {}},
}
POLICIES = ("none", "full")
FIT_JSON = ROOT / "bench" / "data" / "gpu_fit_cases.json"
FIT_STEP_SHARES = (1.0, 0.875, 0.9375)  # each step's packed tokens over `tokens`, taken in turn


def cases() -> list[dict]:
    return [{"case": f"{name}-{policy}", "model": spec.get("model", name),
             "config": card_config(spec.get("model", name)), "num_layers": spec["layers"],
             "tokens": spec["tokens"], "override": spec["override"], "policy": policy}
            for name, spec in MODELS.items() for policy in POLICIES]


def fit_cases() -> list[dict]:
    """The no-recompute cases, the MoE ones first, each with varying packed lengths per step on one stream (no
    FSDP2) and under FSDP2, then with one length under FSDP2."""
    ordered = sorted((c for c in cases() if c["policy"] == "none"), key=lambda c: "llama" in c["model"])
    out = []
    for c in ordered:
        steps = [int(c["tokens"] * share) for share in FIT_STEP_SHARES]
        out += [c | {"case": f"{c['case']}-varying-one-stream", "step_tokens": steps, "one_stream": True},
                c | {"case": f"{c['case']}-varying", "step_tokens": steps}, c | {"case": f"{c['case']}-fixed"}]
    return out


def job_and_plan(res: dict, expandable: bool) -> tuple[Job, Plan]:
    arch = catalog(res["model"])
    layers = res["num_layers"]
    job = carry_cards(Job(model=cut(arch, [arch.is_moe_layer(i) for i in range(layers)]), gpu=get_gpu(GPU),
                          num_gpus=1, gpus_per_node=8, seq_length=res["tokens"], global_batch_size=1,
                          framework=FRAMEWORK))
    return job, Plan(dp=1, zero_stage=3, micro_batch_size=1, recompute=res["policy"], expandable_segments=expandable)


def row(case: dict, measured: dict) -> dict:
    expandable = "expandable_segments:True" in measured.get("allocator", "")
    out = {"case": case["case"], "model": case["model"], "layers": case["num_layers"], "tokens": case["tokens"],
           "policy": case["policy"], "expandable_segments": expandable}
    if not measured.get("ok"):
        return {**out, "error": measured.get("error", "no result")}
    job, plan = job_and_plan(case, expandable)
    stage = estimate_memory(job, plan).stages[0]
    card = memory_card()
    ours_alloc = stage_allocated(stage) - card.cuda_context_bytes
    ours_reserved = stage.total_bytes - card.cuda_context_bytes
    step = estimate_throughput(job, plan).step_time_s
    as_run = step + harness_loss_seconds(job, plan, case)
    outside = measured["used_at_end"] - measured["peak_reserved"]
    return {**out, "params": measured["params"], "model_class": measured["model_class"],
            "experts_implementation": measured.get("experts_implementation"),
            "measured_allocated_gib": measured["peak_allocated"] / GIB,
            "meshplan_allocated_gib": ours_alloc / GIB,
            "allocated_err_pct": pct(ours_alloc, measured["peak_allocated"]),
            "measured_reserved_gib": measured["peak_reserved"] / GIB, "meshplan_reserved_gib": ours_reserved / GIB,
            "reserved_err_pct": pct(ours_reserved, measured["peak_reserved"]),
            "measured_phase_peaks_gib": {k: v / GIB for k, v in measured["phase_peaks"].items()},
            "measured_params_gib": measured["params_bytes"] / GIB, "meshplan_weights_gib": stage.weights_bytes / GIB,
            "measured_outside_pool_gib": outside / GIB,
            "meshplan_context_and_overhead_gib": (card.cuda_context_bytes + card.fixed_overhead_bytes) / GIB,
            "measured_step_s": measured["step_seconds_median"], "meshplan_step_s": step,
            "step_err_pct": pct(step, measured["step_seconds_median"]),
            "meshplan_harness_loss_step_s": as_run, "harness_loss_step_err_pct": pct(as_run,
                                                                                     measured["step_seconds_median"])}


def harness_loss_seconds(job: Job, plan: Plan, case: dict) -> float:
    """What the harness's chunked cross-entropy moves beyond flash_attn's kernels, at meshplan's HBM bandwidth:
    (its bytes per logit as bench/step_op_census.py counts them - FLASH_CROSS_ENTROPY_BYTES_PER_LOGIT) x the
    case's logits."""
    counted = json.loads(CENSUS_JSON.read_text())["counted"]["harness_cross_entropy_bytes_per_logit"]
    logits = case["tokens"] * case["config"]["vocab_size"]
    return (counted - FLASH_CROSS_ENTROPY_BYTES_PER_LOGIT) * logits / step_terms(job, plan).ctx.hbm


def compare(results_path: Path, json_path: Path) -> None:
    data = json.loads(results_path.read_text())
    by_name = {c["case"]: c for c in cases()}
    rows = [row(by_name[m["case"]], m) for m in data["results"] if m["case"] in by_name]
    print(f"{'case':26} {'alloc':5} {'allocated GiB meas/ours':>24} {'err':>7} {'reserved GiB meas/ours':>23} "
          f"{'err':>7} {'step s meas/ours':>18} {'err':>7} {'+harness loss':>14} {'err':>7}")
    for r in rows:
        alloc = "exp" if r["expandable_segments"] else "def"
        if "error" in r:
            print(f"{r['case']:26} {alloc:5} ERROR {r['error'][:140]}")
            continue
        print(f"{r['case']:26} {alloc:5} {r['measured_allocated_gib']:11.2f} {r['meshplan_allocated_gib']:11.2f} "
              f"{r['allocated_err_pct']:+6.1f}% {r['measured_reserved_gib']:11.2f} {r['meshplan_reserved_gib']:10.2f} "
              f"{r['reserved_err_pct']:+6.1f}% {r['measured_step_s']:8.3f} {r['meshplan_step_s']:8.3f} "
              f"{r['step_err_pct']:+6.1f}% {r['meshplan_harness_loss_step_s']:14.3f} "
              f"{r['harness_loss_step_err_pct']:+6.1f}%")
    good = [r for r in rows if "error" not in r]
    summary = {key: statistics.median(abs(r[key]) for r in good) for key in
               ("allocated_err_pct", "reserved_err_pct", "step_err_pct", "harness_loss_step_err_pct")} if good else {}
    print("median |error|:", {k: round(v, 1) for k, v in summary.items()})
    first = next((m for m in data["results"] if m.get("ok")), {})
    json_path.write_text(json.dumps({
        "device": data.get("nvidia_smi"), "torch": first.get("torch"), "transformers": first.get("transformers"),
        "framework": FRAMEWORK, "zero_stage": 3, "gpu": GPU, "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "median_abs_error_pct": summary, "rows": rows}, indent=1) + "\n")
    print(f"wrote {json_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="write the cases the GPU harness runs")
    sub.add_parser("prepare-fit", help="write the cases the GPU harness's --fit bisects")
    comp = sub.add_parser("compare", help="set the GPU's figures beside meshplan's")
    comp.add_argument("results", type=Path)
    comp.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    if args.command == "prepare":
        CASES_JSON.write_text(json.dumps(cases(), indent=1) + "\n")
        print(f"wrote {CASES_JSON} ({len(cases())} cases)")
    elif args.command == "prepare-fit":
        FIT_JSON.write_text(json.dumps(fit_cases(), indent=1) + "\n")
        print(f"wrote {FIT_JSON} ({len(fit_cases())} cases)")
    else:
        compare(args.results, args.json)


if __name__ == "__main__":
    main()
