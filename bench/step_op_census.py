"""The memory-bound passes of Hugging Face transformers' modeling code, counted op by op on a CPU: the source of
cards/calibration.yaml hf_eager_hidden_passes, hf_eager_ffn_passes and hf_eager_dispatch_passes.

`bench/step_op_census_harness.py` runs one verl FSDP2 training step of the GPU bench's cut models
(bench/gpu_steps.py cases) under FakeTensorMode inside the HF venv (torch 2.13.0 CPU + transformers 5.9.0,
tests/framework_packages.py HF_VENV) and logs every aten op's tensor reads and writes by where it was issued (the
model, FSDP2, the loss, the optimizer). The counts come from differences, so nothing outside one decoder layer
enters them:
- one Llama-3.1-8B layer: (8 layers - 4 layers) / 4 of the model's memory-bound bytes;
- its FFN, query and key-value passes: the 4-layer model with intermediate_size, the query heads (head_dim kept) or
  the KV heads doubled, less it, per layer, over 2 B x tokens x the elements added;
- its hidden passes: the rest of the layer over 2 B x tokens x hidden;
- the Q/K norm's passes: Qwen3-30B-A3B's query-head variant over its added query elements, less Llama's query
  passes (its KV-head variant gives the same over the keys: printed beside it);
- the MoE block's passes over the routed token copies: one Qwen3-30B-A3B layer (4 - 2 layers, halved) less the
  other counts and the router's bytes (moe_router_bytes_per_logit), over 2 B x tokens x top_k x hidden;
- out of sample: DeepSeek-V2-Lite's MoE layer (MLA: its per-head keys and values, its latent norm) against what the
  counts give.
Also printed: each case's memory-bound seconds by group at meshplan's HBM bandwidth (H200 x hbm_efficiency), the
FSDP2 casts and copies and the loss's passes, which meshplan does not time at one rank.

    python bench/step_op_census.py [--json bench/data/step_op_census.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from fake_tensor_hf import run_harness  # noqa: E402
from gpu_steps import cases  # noqa: E402

from meshplan.knowledge.calibration import calibration  # noqa: E402
from meshplan.knowledge.hardware import get_gpu  # noqa: E402

HARNESS = ROOT / "bench" / "step_op_census_harness.py"
DEFAULT_JSON = ROOT / "bench" / "data" / "step_op_census.json"
GROUPS = ("model", "fsdp", "loss", "optimizer")


def census_cases() -> list[dict]:
    """The GPU bench's no-recompute cases, each also at half its layers; at half its layers, Llama's with
    intermediate_size doubled, with twice the query heads (head_dim kept) and with twice the KV heads, and Qwen3's
    with twice its query heads and twice its KV heads."""
    out = []
    for c in cases():
        if c["policy"] != "none" or "@" in c["case"]:
            continue
        half = c | {"case": f"{c['case']}-half", "num_layers": c["num_layers"] // 2}
        out += [c, half]
        cfg, over = c["config"], c["override"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        more_heads = {"num_attention_heads": 2 * cfg["num_attention_heads"], "head_dim": head_dim}
        more_kv = {"num_key_value_heads": 2 * cfg["num_key_value_heads"]}
        if c["model"] == "llama-3.1-8b":
            out.append(half | {"case": f"{c['case']}-half-ffn2",
                               "override": {**over, "intermediate_size": 2 * cfg["intermediate_size"]}})
        if c["model"] in ("llama-3.1-8b", "qwen3-30b-a3b"):
            out += [half | {"case": f"{c['case']}-half-heads2", "override": {**over, **more_heads}},
                    half | {"case": f"{c['case']}-half-kv2", "override": {**over, **more_kv}}]
    return out


def memory_bytes(result: dict, group: str = "model") -> int:
    return sum(r["read"] + r["written"] for r in result["rows"] if r["group"] == group and r["kind"] == "memory")


def per_layer(res: dict, name: str) -> float:
    full, half = res[name], res[f"{name}-half"]
    return (memory_bytes(full) - memory_bytes(half)) / (full["num_layers"] - half["num_layers"])


def _variant(res: dict, name: str, kind: str) -> float:
    """Bytes per decoder layer a half-depth variant adds to the half-depth case."""
    half = res[f"{name}-half"]
    return (memory_bytes(res[f"{name}-half-{kind}"]) - memory_bytes(half)) / half["num_layers"]


def passes(res: dict) -> dict:
    """hf_eager_* from the census (module docstring), with the out-of-sample DeepSeek-V2-Lite check."""
    cal = calibration("verl")
    cfg = {c["model"]: c["config"] for c in cases()}
    llama, qwen, ds = cfg["llama-3.1-8b"], cfg["qwen3-30b-a3b"], cfg["deepseek-v2-lite"]
    tokens = res["llama-3.1-8b-none"]["tokens"]
    pass_of = 2 * tokens  # bytes of one bf16 pass over one element per token
    lname, qname = "llama-3.1-8b-none", "qwen3-30b-a3b-none"
    ld = llama["hidden_size"] // llama["num_attention_heads"]
    ffn = _variant(res, lname, "ffn2") / (pass_of * llama["intermediate_size"])
    query = _variant(res, lname, "heads2") / (pass_of * llama["num_attention_heads"] * ld)
    key_value = _variant(res, lname, "kv2") / (pass_of * 2 * llama["num_key_value_heads"] * ld)
    qd = qwen["head_dim"]
    qk_norm = _variant(res, qname, "heads2") / (pass_of * qwen["num_attention_heads"] * qd) - query
    qk_norm_from_keys = (_variant(res, qname, "kv2") / (pass_of * 2 * qwen["num_key_value_heads"] * qd)
                         - key_value) * 2  # the norm runs on the keys, half of the key and value elements
    layer = per_layer(res, lname)
    others = (ffn * llama["intermediate_size"] + query * llama["num_attention_heads"] * ld
              + key_value * 2 * llama["num_key_value_heads"] * ld)
    hidden = (layer / pass_of - others) / llama["hidden_size"]

    def moe_layer(c: dict, dispatch: float) -> tuple[float, float]:
        """Bytes of one MoE layer of config `c` by the counts (the MoE block's copies at `dispatch`), and one pass
        over its routed copies."""
        if c.get("kv_lora_rank"):  # MLA: per-head keys and values, the latent norms
            qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
            q, kv = c["num_attention_heads"] * qk, c["num_attention_heads"] * (qk + c["v_head_dim"])
            normed = c["kv_lora_rank"] + (c.get("q_lora_rank") or 0)
        else:
            d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
            q, kv = c["num_attention_heads"] * d, 2 * c["num_key_value_heads"] * d
            normed = q + kv / 2
        routed = c["num_experts_per_tok"] * c["moe_intermediate_size"]
        shared = c["moe_intermediate_size"] * (c.get("n_shared_experts") or 0)
        router = cal.moe_router_bytes_per_logit * tokens * (c.get("num_experts") or c["n_routed_experts"])
        copies = pass_of * c["num_experts_per_tok"] * c["hidden_size"]
        known = pass_of * (hidden * c["hidden_size"] + query * q + key_value * kv + qk_norm * normed
                           + ffn * (routed + shared)) + router
        return known + dispatch * copies, copies

    qwen_layer = per_layer(res, qname)
    known, copies = moe_layer(qwen, 0.0)
    dispatch = (qwen_layer - known) / copies
    ds_layer = per_layer(res, "deepseek-v2-lite-none")
    ds_pred, _ = moe_layer(ds, dispatch)
    return {"hf_eager_hidden_passes": hidden, "hf_eager_query_passes": query, "hf_eager_key_value_passes": key_value,
            "hf_eager_qk_norm_passes": qk_norm, "qk_norm_passes_from_the_keys": qk_norm_from_keys,
            "hf_eager_ffn_passes": ffn, "hf_eager_dispatch_passes": dispatch,
            "llama_layer_bytes": layer, "qwen3_moe_layer_bytes": qwen_layer,
            "deepseek_v2_lite_moe_layer_bytes": ds_layer, "deepseek_v2_lite_predicted_bytes": ds_pred,
            "deepseek_v2_lite_err_pct": 100 * (ds_pred / ds_layer - 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    data = run_harness(census_cases(), timeout=3600, harness=HARNESS)
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
