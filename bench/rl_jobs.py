"""RL jobs (issue 16): meshplan's memory per phase, host memory and step-time parts against verl's published runs.

Data: the verl rows of ../shared/validation/production_configs_dev.yaml (measured peak GPU memory, host memory per
node, step and rollout seconds, actor MFU) and verl docs/advance/one_step_off.md (colocated vs one-step-off DAPO
step seconds). The rows state the trainer layout; the RL workload of each (prompts, samples, lengths, rollout TP and
memory fraction, offloads) is what the recipe script the row cites sets, named per case below with its path. Nothing
here is fitted: every figure is meshplan.api on a Request, as a user would ask.

Run: python bench/rl_jobs.py [--validation DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from meshplan import api
from meshplan.request.parse import parse_request

GB = 10**9
DEFAULT_VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"

# DeepSeek-V3 GRPO on 96 H20 (verl examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh): 96 prompts x 8,
# prompt 2,048 + response 9,632 (max_response_length 1204 * 8), rollout TP32 at gpu_memory_utilization 0.6, KL loss
# (a reference model), actor param/grad offload (verl 0.9.1: param_offload releases the gradients too),
# optimizer_offload_fraction 1.0, full uniform recompute of 1 layer, 6 layers on the last stage with MTP disabled
# ("MTP and FP8 disabled for RL", the row's precision): the pipeline layout of 5 layers on each of the first 11
# stages and 6 on the last, no MTP block m (Megatron-Core builds none then),
# dynamic batches of (prompt + response) tokens per GPU (micro-batch 1 at that length),
# rollout enforce_eager=True.
DSV3 = dict(model="deepseek-v3", gpu="h20", num_gpus=96, framework="verl", tp=8, pp=12, ep=8, etp=1, job="rl",
            algorithm="grpo", prompts_per_step=96, samples_per_prompt=8, prompt_length=2048, response_length=9632,
            rollout_tp=32, rollout_memory_fraction=0.6, param_offload=True,
            optimizer_offload_fraction=1.0, recompute="full", recompute_method="uniform", recompute_layers=1,
            pipeline_layout="Et*5|(t*5|)*10t*6L", micro_batch_size=1, rollout_enforce_eager=True,
            expandable_segments=False,  # the doc (2025-08-20) predates verl's (production_sources.allocator_field)
            framework_version="0.5.0")  # and verl's flash attention_backend (production_sources.framework_version_for)
# the same with the catalog's MTP block trained on the last stage (num_layers_in_last_pipeline_stage alone)
DSV3_WITH_MTP = {**{k: v for k, v in DSV3.items() if k != "pipeline_layout"}, "last_stage_layers": 6}
DSV3_MEAN_RESPONSE = 1960  # the row's mean response length: the step-time case decodes this many tokens

# Qwen3-30B-A3B (verl examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh): 512 prompts x 16, prompt 2,048 +
# response 8,192, TP1 PP1 EP8 ETP1, rollout TP4 at 0.7, no KL loss (no reference: meshplan's dapo), param/grad
# offload, optimizer_offload_fraction 1.0, micro-batch 2 (dynamic, (prompt + response) tokens per micro-batch),
# rollout enforce_eager=True.
QWEN30B = dict(model="qwen3-30b-a3b", gpu="h20", framework="verl", tp=1, pp=1, ep=8, etp=1, job="rl",
               algorithm="dapo", prompts_per_step=512, samples_per_prompt=16, prompt_length=2048, response_length=8192,
               rollout_tp=4, rollout_memory_fraction=0.7, param_offload=True,
               optimizer_offload_fraction=1.0, micro_batch_size=1, rollout_enforce_eager=True,
               expandable_segments=False,  # as DSV3: the same doc, before verl's workers set expandable segments
               framework_version="0.5.0")  # and before its flash attention_backend (as DSV3)

# One-step-off DAPO, Qwen2.5-Math-7B (qwen2.5-7b's shapes) on 16 H20, Megatron TP2 PP2, rollout TP2 at 0.8, no KL:
# verl/experimental/one_step_off_policy/shell/dapo_7b_math_megatron_colocate.sh (512 prompts x 16, actor offloads)
# and dapo_7b_math_megatron_4_12.sh (512 x 12, 4 rollout GPUs + 12 training, no actor offload); prompt 2,048 +
# response 8,192 at most (the doc gives no mean response length: the maximum is decoded).
DAPO7B = dict(model="qwen2.5-7b", gpu="h20", framework="verl", tp=2, pp=2, job="rl", algorithm="dapo",
              prompts_per_step=512, prompt_length=2048, response_length=8192, rollout_tp=2,
              rollout_memory_fraction=0.8, micro_batch_size=1,
              framework_version="0.5.0")  # the doc (2025-07-17) predates verl's flash attention_backend (as DSV3)
ONE_STEP_OFF = {  # verl docs/advance/one_step_off.md, Megatron rows: step s, generation s, old_log_prob s, update s
    "colocated": dict(step=699, generation=207, log_prob=119, update=344),
    "separate": dict(step=566, generation=501, log_prob=120, update=347),
}


def rows(validation: Path) -> dict[str, dict]:
    data = yaml.safe_load((validation / "production_configs_dev.yaml").read_text())
    items = data if isinstance(data, list) else data.get("entries") or data.get("configs") or []
    return {r["id"]: r for r in items if r.get("id", "").startswith("verl_")}


def err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+.0%}"


def run(validation: Path) -> dict:
    out: dict = {}
    published = rows(validation)

    # DeepSeek-V3 96 H20: memory per phase, host per node, and the step's parts
    row = published["verl_dsv3_h20_96"]
    mem = api.estimate_memory(parse_request(DSV3))
    mtp = api.estimate_memory(parse_request(DSV3_WITH_MTP))
    step = api.estimate_throughput(parse_request({**DSV3, "response_length": DSV3_MEAN_RESPONSE}))
    host_tb = float(row["outcome"]["other"].split("CPU memory ")[1].split(" GB")[0].replace(",", "")) / 1e3
    rollout_s = float(row["outcome"]["other"].split("rollout ")[1].split(" s")[0].replace(",", ""))
    out["dsv3_96"] = {
        "phases_gb": {p.phase: round(p.peak_bytes / GB, 1) for p in mem.phases},
        "peak_phase": mem.peak_phase,
        "peak_gb": round(mem.peak_bytes / GB, 1), "peak_measured_gb": row["outcome"]["peak_memory_gb_per_gpu"],
        "host_tb_per_node": round(mem.host_bytes_per_node / 1e12, 2), "host_measured_tb": host_tb,
        "with_mtp": {"peak_gb": round(mtp.peak_bytes / GB, 1), "peak_phase": mtp.peak_phase,
                     "host_tb_per_node": round(mtp.host_bytes_per_node / 1e12, 2)},
        "step_s": round(step.step_time_s), "step_measured_s": row["outcome"]["step_time_s"],
        "generation_s": round(step.rl.generation_s), "generation_measured_s": rollout_s,
        "train_side_s": round(step.step_time_s - step.rl.generation_s),
        "train_side_measured_s": row["outcome"]["step_time_s"] - rollout_s,
        "parts_s": {k: round(getattr(step.rl, k), 1) for k in ("prefill_s", "decode_s", "log_prob_s", "update_s",
                                                                "reshard_s", "offload_s")},
        "decode": {"replicas": step.rl.replicas, "sequences_at_once": step.rl.sequences_at_once,
                   "waves": step.rl.decode_waves, "step_ms": round(step.rl.decode_step_s * 1e3, 1)},
        "update_mfu": round(step.rl.update_mfu, 3), "mfu_measured": row["outcome"]["mfu"],
    }

    # Qwen3-30B-A3B: the actor update's MFU at 8, 16, 32 GPUs
    qwen = {}
    for gpus in (8, 16, 32):
        r = published[f"verl_qwen3_30b_h20_{gpus}"]
        t = api.estimate_throughput(parse_request({**QWEN30B, "num_gpus": gpus}))
        m = api.estimate_memory(parse_request({**QWEN30B, "num_gpus": gpus}))
        qwen[gpus] = {"update_mfu": round(t.rl.update_mfu, 3), "mfu_measured": r["outcome"]["mfu"],
                      "step_s": round(t.step_time_s), "peak_gb": round(m.peak_bytes / GB, 1),
                      "peak_phase": m.peak_phase, "fits": m.fits}
    out["qwen3_30b"] = qwen

    # One-step-off DAPO: colocated on 16 GPUs vs 4 rollout + 12 training GPUs
    dapo = {}
    for placement, extra in (("colocated", dict(num_gpus=16, samples_per_prompt=16, param_offload=True,
                                                optimizer_offload=True)),
                             ("separate", dict(num_gpus=16, samples_per_prompt=12, placement="separate",
                                               rollout_gpus=4))):
        t = api.estimate_throughput(parse_request({**DAPO7B, **extra}))
        meas = ONE_STEP_OFF[placement]
        dapo[placement] = {"step_s": round(t.step_time_s), "step_measured_s": meas["step"],
                           "generation_s": round(t.rl.generation_s), "generation_measured_s": meas["generation"],
                           "log_prob_s": round(t.rl.log_prob_s), "log_prob_measured_s": meas["log_prob"],
                           "update_s": round(t.rl.update_s), "update_measured_s": meas["update"]}
    dapo["ratio"] = round(dapo["colocated"]["step_s"] / dapo["separate"]["step_s"], 2)
    dapo["ratio_measured"] = round(699 / 566, 2)
    out["one_step_off"] = dapo
    return out


def report(res: dict) -> None:
    d = res["dsv3_96"]
    print("DeepSeek-V3 GRPO, 96 H20, TP8 PP12 EP8, rollout TP32 at 0.6 (verl_dsv3_h20_96)")
    print(f"  phases (GB): {d['phases_gb']}; peak {d['peak_gb']} GB in {d['peak_phase']} vs {d['peak_measured_gb']} "
          f"measured ({err(d['peak_gb'], d['peak_measured_gb'])})")
    host = err(d["host_tb_per_node"], d["host_measured_tb"])
    print(f"  host per node {d['host_tb_per_node']} TB vs {d['host_measured_tb']} TB ({host}); with the MTP block "
          f"trained: peak {d['with_mtp']['peak_gb']} GB in {d['with_mtp']['peak_phase']}, host "
          f"{d['with_mtp']['host_tb_per_node']} TB")
    e_step, e_gen = err(d["step_s"], d["step_measured_s"]), err(d["generation_s"], d["generation_measured_s"])
    e_rest = err(d["train_side_s"], d["train_side_measured_s"])
    print(f"  step {d['step_s']} s vs {d['step_measured_s']} ({e_step}); rollout {d['generation_s']} s vs "
          f"{d['generation_measured_s']} ({e_gen}); the rest {d['train_side_s']} s vs {d['train_side_measured_s']} "
          f"({e_rest})")
    print(f"  parts {d['parts_s']}; decode {d['decode']}; update MFU {d['update_mfu']} vs {d['mfu_measured']}")
    print("Qwen3-30B-A3B, TP1 EP8, H20: actor-update MFU")
    for gpus, q in res["qwen3_30b"].items():
        e = err(q["update_mfu"], q["mfu_measured"])
        print(f"  {gpus:>2} GPUs: {q['update_mfu']} vs {q['mfu_measured']} ({e}); step {q['step_s']} s; peak "
              f"{q['peak_gb']} GB in {q['peak_phase']}, fits {q['fits']}")
    o = res["one_step_off"]
    print("One-step-off DAPO, Qwen2.5-Math-7B, 16 H20 (colocated vs 4 rollout + 12 training GPUs)")
    for placement in ("colocated", "separate"):
        p = o[placement]
        e = err(p["step_s"], p["step_measured_s"])
        print(f"  {placement:>9}: step {p['step_s']} s vs {p['step_measured_s']} ({e}), generation "
              f"{p['generation_s']} vs {p['generation_measured_s']}, log-prob {p['log_prob_s']} vs "
              f"{p['log_prob_measured_s']}, update {p['update_s']} vs {p['update_measured_s']}")
    print(f"  colocated / separate: {o['ratio']} vs {o['ratio_measured']} measured")


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
