"""The memory-bound passes of Hugging Face transformers' modeling code, counted op by op on a CPU: the source of
cards/calibration.yaml hf_eager_hidden_passes, hf_eager_ffn_passes and hf_eager_dispatch_passes.

`bench/step_op_census_harness.py` runs one verl FSDP2 training step of the GPU bench's cut models
(bench/gpu_steps.py cases) under FakeTensorMode inside the HF venv (torch 2.13.0 CPU + transformers 5.9.0,
tests/framework_packages.py HF_VENV) and logs every aten op's tensor reads and writes by where it was issued (the
model, FSDP2, the loss, the optimizer). The counts come from differences, so nothing outside one decoder layer
enters them:
- one Llama-3.1-8B layer: (8 layers - 4 layers) / 4 of the model's memory-bound bytes;
- its FFN passes: the same layer with intermediate_size doubled, less it, over 2 B x tokens x 14336;
- its hidden passes: the rest of the layer over 2 B x tokens x hidden;
- the MoE block's passes over the routed token copies: one Qwen3-30B-A3B layer (4 - 2 layers, halved) less the
  hidden and FFN passes and the router's bytes (moe_router_bytes_per_logit), over 2 B x tokens x top_k x hidden;
- out of sample: DeepSeek-V2-Lite's MoE layer against what the three counts give.
Also printed: each case's memory-bound seconds by group at meshplan's HBM bandwidth (H200 x hbm_efficiency), the
FSDP2 casts and copies and the loss's passes, which meshplan does not time at one rank.

    python bench/step_op_census.py [--json bench/data/step_op_census.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from framework_packages import HF_VENV, venv_python  # noqa: E402
from gpu_steps import cases  # noqa: E402

from meshplan.knowledge.calibration import calibration  # noqa: E402
from meshplan.knowledge.hardware import get_gpu  # noqa: E402

HARNESS = ROOT / "bench" / "step_op_census_harness.py"
DEFAULT_JSON = ROOT / "bench" / "data" / "step_op_census.json"
GROUPS = ("model", "fsdp", "loss", "optimizer")


def census_cases() -> list[dict]:
    """The GPU bench's no-recompute cases, each also at half its layers; Llama's at 4 layers with intermediate_size
    doubled."""
    out = []
    for c in cases():
        if c["policy"] != "none" or "@" in c["case"]:
            continue
        out += [c, c | {"case": f"{c['case']}-half", "num_layers": c["num_layers"] // 2}]
        if c["model"] == "llama-3.1-8b":
            out += [c | {"case": f"{c['case']}-half-ffn2", "num_layers": c["num_layers"] // 2,
                         "override": {**c["override"], "intermediate_size": 2 * c["config"]["intermediate_size"]}}]
    return out


def run_census(todo: list[dict]) -> dict:
    python = venv_python("transformers", HF_VENV, python_version="3.11")
    proc = subprocess.run([str(python), str(HARNESS)], input=json.dumps({"cases": todo}), capture_output=True,
                          text=True, cwd=ROOT / "bench", timeout=3600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"harness failed: {proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def memory_bytes(result: dict, group: str = "model") -> int:
    return sum(r["read"] + r["written"] for r in result["rows"] if r["group"] == group and r["kind"] == "memory")


def per_layer(res: dict, name: str) -> float:
    full, half = res[name], res[f"{name}-half"]
    return (memory_bytes(full) - memory_bytes(half)) / (full["num_layers"] - half["num_layers"])


def passes(res: dict) -> dict:
    """hf_eager_* from the census (module docstring), with the out-of-sample DeepSeek-V2-Lite check."""
    cal = calibration("verl")
    cfg = {c["model"]: c["config"] for c in cases()}
    llama, qwen, ds = cfg["llama-3.1-8b"], cfg["qwen3-30b-a3b"], cfg["deepseek-v2-lite"]
    tokens = res["llama-3.1-8b-none"]["tokens"]
    layer = per_layer(res, "llama-3.1-8b-none")
    wider = res["llama-3.1-8b-none-half-ffn2"]
    ffn = (memory_bytes(wider) - memory_bytes(res["llama-3.1-8b-none-half"])) / wider["num_layers"] / (
        2 * tokens * llama["intermediate_size"])
    hidden = (layer - ffn * 2 * tokens * llama["intermediate_size"]) / (2 * tokens * llama["hidden_size"])

    def moe_parts(c: dict, dispatch: float) -> tuple[float, float]:
        routed = tokens * c["num_experts_per_tok"] * c["moe_intermediate_size"]
        shared = tokens * c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0)
        router = cal.moe_router_bytes_per_logit * tokens * (c.get("num_experts") or c["n_routed_experts"])
        copies = 2 * tokens * c["num_experts_per_tok"] * c["hidden_size"]
        known = hidden * 2 * tokens * c["hidden_size"] + ffn * 2 * (routed + shared) + router
        return known + dispatch * copies, copies

    qwen_layer = per_layer(res, "qwen3-30b-a3b-none")
    known, copies = moe_parts(qwen, 0.0)
    dispatch = (qwen_layer - known) / copies
    ds_layer = per_layer(res, "deepseek-v2-lite-none")
    ds_pred, _ = moe_parts(ds, dispatch)
    return {"hf_eager_hidden_passes": hidden, "hf_eager_ffn_passes": ffn, "hf_eager_dispatch_passes": dispatch,
            "llama_layer_bytes": layer, "qwen3_moe_layer_bytes": qwen_layer,
            "deepseek_v2_lite_moe_layer_bytes": ds_layer, "deepseek_v2_lite_predicted_bytes": ds_pred,
            "deepseek_v2_lite_err_pct": 100 * (ds_pred / ds_layer - 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    data = run_census(census_cases())
    res = {r["case"]: r for r in data["results"]}
    bad = [r for r in data["results"] if not r.get("ok")]
    if bad:
        raise SystemExit(f"failed: {bad[0]['case']}: {bad[0]['error'][:2000]}")
    cal = calibration("verl")
    hbm = get_gpu("h200").hbm_bandwidth * cal.hbm_efficiency
    print(f"{'case':34} {'layers':>6} " + " ".join(f"{g + ' ms':>13}" for g in GROUPS) + "  (memory-bound, H200)")
    for r in data["results"]:
        print(f"{r['case']:34} {r['num_layers']:6} " + " ".join(
            f"{memory_bytes(r, g) / hbm * 1e3:13.2f}" for g in GROUPS))
    counted = passes(res)
    for key, value in counted.items():
        print(f"{key:36} {value:,.2f}" + (f"   (card {getattr(cal, key):g})" if hasattr(cal, key) else ""))
    args.json.write_text(json.dumps({"torch": data["torch"], "transformers": data["transformers"],
                                     "hbm_bytes_per_s": hbm, "counted": counted,
                                     "results": data["results"]}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
