"""meshplan's per-layer activation bytes against a framework's own model code, counted under FakeTensorMode.

Ground truth without a GPU (issue 14, item 3): `bench/fake_tensor_harness.py` runs torchtitan 0.3.0's own
Llama-3 8B and DeepSeek-V3 671B model code on fake CPU tensors (real shapes, no memory) inside a throwaway venv
(torch 2.13.0 CPU wheel + torchtitan 0.3.0, the pins in tests/framework_packages.py, cached), under each
activation-checkpointing policy torchtitan has had, and counts with torch.distributed._tools' MemTracker
the bytes each decoder layer adds to the live set in its forward: what it saves for backward (minus its
input, made by the previous layer) plus its output (the next layer's input). That is meshplan's per-layer
convention (each layer owns its input), so the two compare directly. It also measures the peak of one
training step (forward, the trainer's chunked loss, backward, AdamW) with torchtitan's FSDP2 on a fake
process group of 8 ranks, as torchtitan's own memory estimator (removed in 0.3) did.

meshplan's side is `estimate_memory` for the same shapes (a one-layer copy of the catalog model, dense or
MoE, pp=1 so one micro-batch is in flight): its `layer_activations` detail, with torchtitan's byte convention
(fsdp2: flash attention, no dropout, unfused SwiGLU) and the policy mapped onto `Plan.recompute` as it stands
today: none -> none, full -> full, every "selective" -> selective, which on torchtitan is its op-level SAC
(cards/frameworks/torchtitan.yaml recompute.selective; activations.py models it); 0.2.2's every-N-layers option
-> selective with selective_ac_option N, over the layers the harness ran (per layer: their mean). Those rows also
give the nearest policy without the option (full with recompute_layers = layers/N).

Policies (torchtitan 0.3.0 has none | full | selective = op-level SAC | memory-budget, which needs
torch.compile and is not measured; torchtitan <= 0.2.2 had selective with `selective_ac_option` "op" (its
per-model save lists) or an integer N, every N-th block fully checkpointed, default "2"): the 0.2.2 policies
are 0.2.2's own activation_checkpoint.py functions, loaded from its wheel, applied to 0.3.0's model code.

    python bench/fake_tensor_memory.py [--no-step] [--json bench/data/fake_tensor_memory.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

from meshplan.arithmetic.memory_states import memory_card
from meshplan.estimate.memory import estimate_memory, stage_allocated
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards, resolve
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from framework_packages import TORCHTITAN_VENV, venv_python, wheel_tree  # noqa: E402

HARNESS = ROOT / "bench" / "fake_tensor_harness.py"
DEFAULT_JSON = ROOT / "bench" / "data" / "fake_tensor_memory.json"
MIB = 1 << 20
GIB = 1 << 30

# Each architecture at its torchtitan 0.3.0 registry trainer settings (llama3_8b, deepseek_v3_671b): sequence
# and local batch; `layers` are the registry layers the per-layer count runs (DeepSeek-V3: two dense, two
# MoE), `step_layers` those of the step (a 4-layer cut: the full models' steps only add identical layers).
ARCHS = {
    "llama3-8b": {"model": "llama-3.1-8b", "seq": 8192, "batch": 1, "layers": [0, 1, 2, 3],
                  "step_layers": [0, 1, 2, 3], "what": "Llama-3.1-8B (dense, GQA 32/8)"},
    "deepseek-v3-671b": {"model": "deepseek-v3", "seq": 4096, "batch": 4, "layers": [1, 2, 3, 4],
                         "step_layers": [0, 1, 2, 3], "what": "DeepSeek-V3 671B (MLA + MoE 256/top-8)"},
}
# torchtitan policy -> (meshplan recompute, what the policy is); selective-N also sets selective_ac_option N
POLICIES = {
    "none": ("none", "no activation checkpointing"),
    "full": ("full", "0.3.0 FullAC: every block checkpointed"),
    "selective": ("selective", "0.3.0 SelectiveAC (default): op-level SAC, every second mm recomputed"),
    "selective-op@0.2.2": ("selective", "0.2.2 selective, option 'op': op-level SAC with the model's save list"),
    "selective-2@0.2.2": ("selective", "0.2.2 selective, option '2' (its default): every 2nd block full AC"),
}
STEP_POLICIES = ["none", "full", "selective"]
# ... and at data_parallel_shard_degree 1 with 8 replicas (meshplan's zero_stage 0): torchtitan 0.3.0 still applies
# fully_shard there, over a (dp_replicate 8, fsdp 1) mesh (cards/frameworks/torchtitan.yaml engine.replica_shard)
REPLICATE_STEPS = ["llama3-8b"]
# The step runs torchtitan 0.3.0's default trainer's zero_grad(set_to_none=training.disable_cuda_graphs = False):
# the sharded grads stay allocated between steps (cards/memory.yaml fsdp2_chunked_loss grads_set_to_none)
STEP_SET_TO_NONE = False
WORLD = 8


# --------------------------------------------------------------------------- the framework's counts


def run_harness(cases: list[dict]) -> dict:
    """Build (or reuse) the venv, run the harness on the cases, return its parsed result."""
    python = venv_python("torchtitan", TORCHTITAN_VENV, python_version="3.11")
    request = {"era_a_wheel": str(wheel_tree("torchtitan", "0.2.2")), "cases": cases}
    proc = subprocess.run([str(python), str(HARNESS)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=1800)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the harness printed no result (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


# torchtitan builds AdamW with fused=True by default (cards/frameworks/torchtitan.yaml optimizer_step), which torch
# 2.13 also runs on the CPU (the _fused_adamw_ kernel, in place)
STEP_FUSED = True


def cases(step: bool) -> list[dict]:
    out = [{"kind": "layers", "arch": arch, "layers": spec["layers"], "seq": spec["seq"], "batch": spec["batch"],
            "policy": policy} for arch, spec in ARCHS.items() for policy in POLICIES]
    if step:
        out += [{"kind": "step", "arch": arch, "layers": spec["step_layers"], "seq": spec["seq"],
                 "batch": spec["batch"], "policy": policy, "world": WORLD, "set_to_none": STEP_SET_TO_NONE,
                "fused": STEP_FUSED}
                for arch, spec in ARCHS.items() for policy in STEP_POLICIES]
        out += [{"kind": "step", "arch": arch, "layers": ARCHS[arch]["step_layers"], "seq": ARCHS[arch]["seq"],
                 "batch": ARCHS[arch]["batch"], "policy": policy, "world": WORLD, "dp_shard": 1,
                 "set_to_none": STEP_SET_TO_NONE, "fused": STEP_FUSED}
                for arch in REPLICATE_STEPS for policy in STEP_POLICIES]
    return out


# --------------------------------------------------------------------------- meshplan's side


def catalog(model: str) -> Architecture:
    return resolve(Request(model=model, framework="torchtitan"))[0].model


def cut(arch: Architecture, moe_flags: list[bool]) -> Architecture:
    """The catalog architecture with these decoder layers only (dense or MoE each), no MTP block."""
    moe = arch.moe.model_copy(update={"moe_layers": [i for i, m in enumerate(moe_flags) if m]}) if arch.moe else None
    return arch.model_copy(update={"num_layers": len(moe_flags), "moe": moe, "num_mtp_layers": 0})


def meshplan_report(arch: Architecture, spec: dict, recompute: str, moe_flags: list[bool],
                    selective_ac_option: str | None = None, zero_stage: int = 3):
    """estimate_memory of the cut at dp 8: zero_stage 3 (FSDP over the 8 ranks), or 0 (data_parallel_shard_degree 1,
    which torchtitan 0.3.0 runs as fully_shard over a shard of one with 8 replicas)."""
    job = carry_cards(Job(model=cut(arch, moe_flags), gpu=get_gpu("h100"), num_gpus=WORLD, gpus_per_node=8,
                          seq_length=spec["seq"], global_batch_size=WORLD * spec["batch"], framework="torchtitan"))
    plan = Plan(dp=WORLD, zero_stage=zero_stage, micro_batch_size=spec["batch"], recompute=recompute,
                selective_ac_option=selective_ac_option)
    return estimate_memory(job, plan)


def meshplan_layer(arch: Architecture, spec: dict, recompute: str, moe: bool,
                   selective_ac_option: str | None = None, layers: int = 1) -> float:
    """estimate_memory's layer_activations of a model cut to `layers` layers of one kind, per layer: one micro-batch
    in flight (0.2.2's every-N option needs the layers the harness ran, as its blocks differ)."""
    report = meshplan_report(arch, spec, recompute, [moe] * layers, selective_ac_option)
    return report.stages[0].detail["layer_activations"] / layers


def meshplan_allocated_peak(arch: Architecture, spec: dict, recompute: str, moe_flags: list[bool],
                            zero_stage: int = 3) -> int:
    """The estimate's allocated peak (at its own moment: memory.stage_allocated) as torch's allocator would count it:
    less the CUDA context and the calibrated fixed overhead, which a tracker of tensor storages does not see."""
    card = memory_card()
    stage = meshplan_report(arch, spec, recompute, moe_flags, zero_stage=zero_stage).stages[0]
    return stage_allocated(stage) - card.cuda_context_bytes - card.fixed_overhead_bytes


# --------------------------------------------------------------------------- the tables


def pct(ours: float, theirs: float) -> float:
    return 100.0 * (ours - theirs) / theirs


def layer_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in (r for r in results if r["kind"] == "layers"):
        spec, arch = ARCHS[res["arch"]], catalog(ARCHS[res["arch"]]["model"])
        recompute, what = POLICIES[res["policy"]]
        if not res["ok"]:
            rows.append({"arch": res["arch"], "policy": res["policy"], "error": res["error"]})
            continue
        unit = spec["seq"] * spec["batch"] * res["hidden"] * 2  # s*b*h*2: one bf16 hidden-state tensor
        for moe in sorted({layer["moe"] for layer in res["layers"]}):
            counts = [layer["bytes"] for layer in res["layers"] if layer["moe"] is moe]
            framework = statistics.fmean(counts)
            every = res["policy"].split("@")[0][len("selective-"):] if res["policy"].startswith("selective-") else ""
            if every.isdigit():  # 0.2.2's every-N option over the harness's layers of this kind
                ours = meshplan_layer(arch, spec, recompute, moe, every, len(counts))
            else:
                ours = meshplan_layer(arch, spec, recompute, moe)
            row = {"arch": res["arch"], "layer": "MoE" if moe else "dense", "policy": res["policy"], "what": what,
                   "meshplan_recompute": recompute, "seq": spec["seq"], "micro_batch": spec["batch"],
                   "framework_bytes": framework, "framework_per_layer_bytes": counts,
                   "framework_units": framework / unit, "meshplan_bytes": ours, "meshplan_units": ours / unit,
                   "diff_pct": pct(ours, framework)}
            if res.get("saved_hook_bytes"):
                hooks = [b for b, layer in zip(res["saved_hook_bytes"], res["layers"], strict=True)
                         if layer["moe"] is moe]
                row["saved_hook_bytes"] = statistics.fmean(hooks)
            if res["policy"].startswith("selective-") and res["policy"][len("selective-")].isdigit():
                n = int(res["policy"][len("selective-"):].split("@")[0])
                full, none = meshplan_layer(arch, spec, "full", moe), meshplan_layer(arch, spec, "none", moe)
                nearest = (full + (n - 1) * none) / n
                row["nearest_meshplan"] = f"full with recompute_layers = layers/{n}"
                row["nearest_meshplan_bytes"] = nearest
                row["nearest_diff_pct"] = pct(nearest, framework)
            rows.append(row)
    return rows


def step_zero_stage(row: dict) -> int:
    """meshplan's zero_stage of a step row: 0 where the harness ran a shard of one (dp_replicate 8), else 3."""
    return 0 if row.get("dp_shard", row["world"]) == 1 else 3


def step_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in (r for r in results if r["kind"] == "step"):
        spec, arch = ARCHS[res["arch"]], catalog(ARCHS[res["arch"]]["model"])
        if not res["ok"]:
            rows.append({"arch": res["arch"], "policy": res["policy"], "error": res["error"]})
            continue
        moe_flags = [arch.is_moe_layer(i) for i in res["layers"]]
        recompute = POLICIES[res["policy"]][0]
        framework = res["peak"]["Total"]
        zero = step_zero_stage(res)
        ours = meshplan_allocated_peak(arch, spec, recompute, moe_flags, zero_stage=zero)
        rows.append({"arch": res["arch"], "policy": res["policy"], "meshplan_recompute": recompute,
                     "layers": len(moe_flags), "moe_layers": sum(moe_flags), "world": res["world"],
                     "dp_shard": res.get("dp_shard", res["world"]), "meshplan_zero_stage": zero,
                     "seq": spec["seq"], "micro_batch": spec["batch"], "set_to_none": res.get("set_to_none"),
                     "framework_peak_bytes": framework,
                     "framework_peak_by_kind": res["peak"], "meshplan_allocated_bytes": ours,
                     "diff_pct": pct(ours, framework)})
    return rows


def print_tables(layers: list[dict], steps: list[dict]) -> None:
    print("Per decoder layer: bytes a layer adds in its forward (saved for backward + output), torchtitan "
          "0.3.0 model code, bf16, flex attention; unit = s*b*h*2")
    print(f"{'architecture':18} {'layer':5} {'torchtitan policy':19} {'meshplan':9} "
          f"{'framework':>19} {'meshplan':>19} {'diff':>7}")
    for r in layers:
        if "error" in r:
            print(f"{r['arch']:18} {'':5} {r['policy']:19} ERROR {r['error'][:120]}")
            continue
        print(f"{r['arch']:18} {r['layer']:5} {r['policy']:19} {r['meshplan_recompute']:9} "
              f"{r['framework_bytes'] / MIB:8.1f} MiB {r['framework_units']:5.2f}u "
              f"{r['meshplan_bytes'] / MIB:8.1f} MiB {r['meshplan_units']:5.2f}u {r['diff_pct']:+6.1f}%")
        if "nearest_meshplan_bytes" in r:
            print(f"{'':18} {'':5} {'':19} {'(nearest: ' + r['nearest_meshplan'] + ')':>40} "
                  f"{r['nearest_meshplan_bytes'] / MIB:8.1f} MiB {r['nearest_diff_pct']:+16.1f}%")
    if steps:
        print(f"\nPeak through one training step (rank 0 of {WORLD}, torchtitan FSDP2 on a fake process group, "
              "4 decoder layers + embedding + chunked loss + AdamW, zero_grad(set_to_none="
              f"{STEP_SET_TO_NONE})) vs meshplan's estimate as allocated memory")
        print(f"{'architecture':18} {'policy':10} {'dp_shard':>8} {'framework':>11} {'meshplan':>11} {'diff':>7}")
        for r in steps:
            if "error" in r:
                print(f"{r['arch']:18} {r['policy']:10} ERROR {r['error'][:120]}")
                continue
            print(f"{r['arch']:18} {r['policy']:10} {r.get('dp_shard', r['world']):8} "
                  f"{r['framework_peak_bytes'] / GIB:7.2f} GiB "
                  f"{r['meshplan_allocated_bytes'] / GIB:7.2f} GiB {r['diff_pct']:+6.2f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-step", action="store_true", help="per-layer counts only (skip the step peaks)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args()
    result = run_harness(cases(step=not args.no_step))
    layers, steps = layer_rows(result["results"]), step_rows(result["results"])
    print_tables(layers, steps)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "measured": datetime.date.today().isoformat(), "torch": result["torch"],
        "torchtitan": {"model_code_and_policies": "0.3.0", "era_a_policies": "0.2.2"},
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "layers": layers, "steps": steps,
        "harness_seconds": {f"{r['kind']} {r['arch']} {r['policy']}"
                            + (f" dp_shard {r['dp_shard']}" if r.get("dp_shard", WORLD) != WORLD else ""): r["seconds"]
                            for r in result["results"]},
    }, indent=1) + "\n")
    print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
