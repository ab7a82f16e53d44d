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
Also printed: each case's memory-bound seconds by group at meshplan's HBM bandwidth (H200 x hbm_efficiency), and
three checks of what meshplan times against the census (`checks`):
- FSDP2's copies (memory_states.fsdp_copy_bytes, cards/memory.yaml fsdp2 compute_stream_copies): at one rank every
  byte fully_shard issues is the compute stream's two gathers and one reduce plus the reduce-scatter stream's copy
  (2 x the reduce input's bytes); at two ranks (a small Llama cut, its own run: one fake process group a process)
  the compute stream's copy-out (split_with_sizes_copy) and chunk_cat;
- the model code outside the decoder layers (each case less its layers, Llama and Qwen3: DeepSeek-V2-Lite's first
  layer is dense, its others MoE) against layer_time.eager_edge_seconds (final norm, embedding) and the autograd
  part of verl's loss (cards/memory.yaml fsdp2_hf loss_hbm_bytes_per_logit less its division and flash_attn's
  kernels);
- the GPU harness's chunked cross-entropy per logit as CUDA runs it (its logsumexp at LOGSUMEXP_PASSES), which
  bench/gpu_steps.py counts for the measured runs in place of flash_attn's kernels.

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
from gpu_steps import FLASH_CROSS_ENTROPY_BYTES_PER_LOGIT, cases, job_and_plan  # noqa: E402

from meshplan.arithmetic.memory_states import fsdp_copy_bytes, with_precision  # noqa: E402
from meshplan.estimate.layer_time import eager_edge_seconds  # noqa: E402
from meshplan.estimate.perf import step_terms  # noqa: E402
from meshplan.knowledge.calibration import calibration  # noqa: E402
from meshplan.knowledge.hardware import get_gpu  # noqa: E402

HARNESS = ROOT / "bench" / "step_op_census_harness.py"
DEFAULT_JSON = ROOT / "bench" / "data" / "step_op_census.json"
GROUPS = ("model", "fsdp", "loss", "optimizer")
BASES = ("llama-3.1-8b-none", "qwen3-30b-a3b-none", "deepseek-v2-lite-none")  # the GPU bench's no-recompute cases
# aten/src/ATen/native/ReduceOps.cpp logsumexp_out_impl, which CUDA runs as amax (a read), self - maxes (a read and a
# write), exp_ (a read and a write) and sum (a read) of its fp32 input: six passes where the census counts the
# composite op's one read
LOGSUMEXP_PASSES = 6
TWO_RANK_LAYERS, TWO_RANK_TOKENS = 2, 1024  # the two-rank FSDP2 check's Llama cut (FakeTensorMode: sizes cost nothing)


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


def two_rank_case() -> dict:
    base = next(c for c in cases() if c["case"] == "llama-3.1-8b-none")
    return base | {"case": "llama-3.1-8b-none-two-ranks", "num_layers": TWO_RANK_LAYERS, "tokens": TWO_RANK_TOKENS,
                   "world": 2}


def vocab_of(result: dict) -> int:
    """A result's vocabulary (the harness's results leave the config out)."""
    return next(c["config"]["vocab_size"] for c in cases() if c["model"] == result["model"])


def op_bytes(result: dict, group: str, op: str) -> int:
    return sum(o["bytes"] for o in result["memory_ops"] if o["group"] == group and o["op"] == op)


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


def _verl(res: dict):
    """meshplan's verl job and plan of a census case (one GPU, as the GPU bench's), its step's LayerContext and its
    convention and tensors (with_precision)."""
    job, plan = job_and_plan(res, False)
    return step_terms(job, plan).ctx, with_precision(job, plan)


def fsdp_check(res: dict, two: dict) -> dict:
    """Bytes per parameter fully_shard issues, (counted, by fsdp_copy_bytes) under verl's convention (the census's
    MixedPrecisionPolicy): at one rank every fsdp byte (two gathers, one reduce, the reduce-scatter stream's copy);
    at two ranks the compute stream's copy-out and chunk_cat (the copy-in runs on the all-gather copy-in stream)."""
    _, (_, conv, tensors) = _verl(res[BASES[0]])
    b = fsdp_copy_bytes(conv, tensors)
    one_rank = 2 * b.gather_one_rank + b.reduce + 2 * conv.retained_reduce_bytes
    out = {f"{name}, one rank": (memory_bytes(res[name], "fsdp") / res[name]["params"], one_rank) for name in BASES}
    out["two ranks, copy-out"] = (op_bytes(two, "fsdp", "split_with_sizes_copy") / two["params"], 2 * b.gather)
    out["two ranks, chunk_cat"] = (op_bytes(two, "fsdp", "chunk_cat") / two["params"], b.reduce)
    return out


def harness_loss_bytes(r: dict) -> float:
    """The GPU harness's chunked cross-entropy per logit as CUDA runs it: the loss group's bytes (its policy loss's
    few included) with its logsumexp at LOGSUMEXP_PASSES, less verl's temperature division (the div_)."""
    logits = r["tokens"] * vocab_of(r)
    counted = (memory_bytes(r, "loss") + (LOGSUMEXP_PASSES - 1) * op_bytes(r, "loss", "logsumexp")
               - op_bytes(r, "loss", "div_"))
    return counted / logits


def edges_check(res: dict) -> dict:
    """Bytes of the model group outside the decoder layers (a case less its layers), (counted, by meshplan):
    layer_time.eager_edge_seconds at the case's bandwidth and the autograd part of verl's loss (the convention's
    loss_hbm_bytes_per_logit less the division counted in the loss group and flash_attn's kernels)."""
    out = {}
    for name in BASES[:2]:
        r = res[name]
        rest = memory_bytes(r) - r["num_layers"] * per_layer(res, name)
        ctx, (_, conv, _) = _verl(r)
        vocab = vocab_of(r)
        logits = r["tokens"] * vocab
        autograd = (conv.loss_hbm_bytes_per_logit - op_bytes(r, "loss", "div_") / logits
                    - FLASH_CROSS_ENTROPY_BYTES_PER_LOGIT)
        out[name] = (rest, eager_edge_seconds(ctx, vocab) * ctx.hbm + autograd * logits)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    data = run_harness(census_cases(), timeout=3600, harness=HARNESS)
    two = run_harness([two_rank_case()], timeout=1800, harness=HARNESS)["results"][0]
    res = {r["case"]: r for r in data["results"]}
    bad = [r for r in data["results"] + [two] if not r.get("ok")]
    if bad:
        raise SystemExit(f"failed: {bad[0]['case']}: {bad[0]['error'][:2000]}")
    cal = calibration("verl")
    hbm = get_gpu("h200").hbm_bandwidth * cal.hbm_efficiency
    print(f"{'case':34} {'layers':>6} " + " ".join(f"{g + ' ms':>13}" for g in GROUPS) + "  (memory-bound, H200)")
    for r in data["results"]:
        print(f"{r['case']:34} {r['num_layers']:6} " + " ".join(
            f"{memory_bytes(r, g) / hbm * 1e3:13.2f}" for g in GROUPS))
    counted = passes(res)
    losses = {name: harness_loss_bytes(res[name]) for name in BASES}
    counted["harness_cross_entropy_bytes_per_logit"] = losses[BASES[0]]  # the three agree (checks)
    for key, value in counted.items():
        print(f"{key:36} {value:,.2f}" + (f"   (card {getattr(cal, key):g})" if hasattr(cal, key) else ""))
    checks = {"fsdp_bytes_per_param": fsdp_check(res, two), "outside_layers_bytes": edges_check(res),
              "harness_cross_entropy_bytes_per_logit": losses}
    for check, values in checks.items():
        for case, value in values.items():
            if isinstance(value, tuple):
                print(f"{check:30} {case:32} counted {value[0]:,.1f}  meshplan {value[1]:,.1f} "
                      f"({100 * (value[1] / value[0] - 1):+.1f}%)")
            else:
                print(f"{check:30} {case:32} {value:,.2f}")
    args.json.write_text(json.dumps({"torch": data["torch"], "transformers": data["transformers"],
                                     "hbm_bytes_per_s": hbm, "counted": counted, "checks": checks,
                                     "results": data["results"] + [two]}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
