"""meshplan's per-layer activation bytes against Hugging Face transformers' model code, counted under FakeTensorMode.

Ground truth without a GPU for verl's and SkyRL's FSDP engines (issue 14, item 3): `bench/fake_tensor_hf_harness.py`
runs transformers 5.9.0's own Llama-3.1-8B (LlamaForCausalLM, dense GQA), Qwen3-30B-A3B (Qwen3MoeForCausalLM, MoE
128/top-8 with per-head Q/K norms) and DeepSeek-V3 (DeepseekV3ForCausalLM, MLA + MoE 256/top-8 with a shared
expert), built from the catalog cards' config.json fields with a few decoder layers, on fake CPU tensors inside a
throwaway venv (torch 2.13.0 CPU wheel + transformers 5.9.0, tests/framework_packages.py HF_VENV, cached), as those
engines run them: bf16, flash-attention-2 (a CPU stand-in that saves what flash_attn saves), padding removed (one
packed row), no recompute or gradient checkpointing on every layer (gradient_checkpointing_enable, use_reentrant
False). MemTracker counts what each decoder layer adds to the live set of a stack of layers: from its pre-forward
to the next module's pre-forward (saved for backward, plus its output, less its input where nothing saved it: HF's
RMSNorm saves an fp32 copy, not the bf16 input). Layer 0 is left out (the model's forward holds the embedding output
too). The harness also reports the torchtitan harness's convention (post- minus pre-forward, the output counted
and the input not released), `framework_bytes_with_output`.

meshplan's side is `estimate_memory` for verl at zero_stage 3 (its FSDP engine; cards/frameworks/verl.yaml
zero3_memory_convention fsdp2_hf, SkyRL's the same) on a one-layer copy of the catalog model, dense or MoE, pp=1:
its `layer_activations` detail.

    python bench/fake_tensor_hf.py [--json bench/data/fake_tensor_hf.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from meshplan.arithmetic.activations import Layout, attention_saves, layer_activations, shape_of
from meshplan.arithmetic.memory_states import activation_saves, memory_card
from meshplan.estimate.memory import estimate_memory, stage_allocated
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards, resolve
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from fake_tensor_memory import cut, pct  # noqa: E402
from framework_packages import HF_VENV, served_answer, venv_python  # noqa: E402

HARNESS = ROOT / "bench" / "fake_tensor_hf_harness.py"
DEFAULT_JSON = ROOT / "bench" / "data" / "fake_tensor_hf.json"
MIB = 1 << 20
GIB_ = 1 << 30
WORLD = 8
MLP_TOKENS = 2048  # tokens of the MLP cases (fake tensors: the count is linear in them)
FRAMEWORK = "verl"

# catalog model -> decoder layers run, packed tokens per micro-batch, config.json fields the catalog card leaves out
MODELS = {
    "llama-3.1-8b": {"layers": 3, "tokens": 8192, "override": {}, "what": "Llama-3.1-8B (dense, GQA 32/8)"},
    # Qwen/Qwen3-30B-A3B config.json sets norm_topk_prob true (transformers' Qwen3MoeConfig default is false)
    "qwen3-30b-a3b": {"layers": 3, "tokens": 8192, "override": {"norm_topk_prob": True},
                      "what": "Qwen3-30B-A3B (MoE 128/top-8, Q/K head norms)"},
    # two dense layers, then MoE (the model has three dense layers first: first_k_dense_replace 3)
    "deepseek-v3": {"layers": 4, "tokens": 4096, "override": {"first_k_dense_replace": 2},
                    "what": "DeepSeek-V3 (MLA + MoE 256/top-8, shared expert)"},
}
# the MLP module alone (fake_tensor_hf_harness.mlp_saves), per activation the catalog's models run in transformers:
# catalog model -> config.json fields the run sets (GPT-2's MLP ends in a dropout of resid_pdrop, 0.1 by default,
# whose mask is no activation's: the fsdp2_hf preset counts no dropout, so it is set to 0)
MLP_MODELS = {
    "gpt-neox-20b": {"override": {}, "what": "GPTNeoXMLP, gelu_fast (FastGELUActivation)"},
    "gpt3-175b": {"override": {"resid_pdrop": 0.0}, "what": "GPT2MLP, gelu_new (NewGELUActivation)"},
    "nemotron-4-340b": {"override": {}, "what": "NemotronMLP, relu2 (ReLUSquaredActivation)"},
    "llama-3.1-8b": {"override": {}, "what": "LlamaMLP, gated silu"},
    "gemma-2-27b": {"override": {}, "what": "Gemma2MLP, gated gelu_pytorch_tanh"},
}
POLICIES = {"none": "none", "full": "full"}  # HF gradient checkpointing off / on (every decoder layer)
# one training step as verl's FSDP engine runs it (fake_tensor_hf_harness.step_peak): catalog model -> decoder
# layers, packed tokens; the step's peak (rank 0 of WORLD) against estimate_memory's allocated figure
STEP_MODELS = {
    "llama-3.1-8b": {"layers": 4, "tokens": 8192, "override": {}},
    "llama-3.1-8b@2k": {"model": "llama-3.1-8b", "layers": 8, "tokens": 2048, "override": {}},
    "qwen3-30b-a3b": {"layers": 4, "tokens": 8192, "override": {"norm_topk_prob": True}},
}
# the same step with FSDP2 reducing in fp32 (verl's default) and in bf16 (fsdp_config.mixed_precision.reduce_dtype=bf16,
# meshplan's grad_reduce_in_fp32=false): the 8k cut above, where the loss's moment decides either way, and cuts of
# 2k tokens, whose activations are small beside a unit's unsharded gradients and reduce-scatter input, so a
# reduce-scatter's moment decides (the output unit's at the end of the backward, an MoE layer's)
REDUCE_STEP_MODELS = {
    "llama-3.1-8b": STEP_MODELS["llama-3.1-8b"],
    "llama-3.1-8b@2k4": {"model": "llama-3.1-8b", "layers": 4, "tokens": 2048, "override": {}},
    "qwen3-30b-a3b@2k": {"model": "qwen3-30b-a3b", "layers": 4, "tokens": 2048, "override": {"norm_topk_prob": True}},
}
REDUCES = ("fp32", "bf16")
# the same step on one GPU (world 1: nothing sharded), where the optimizer step's own moment decides: every fp32
# gradient allocated beside the params, both moments and the foreach step's temporaries
SINGLE_GPU_STEP_MODELS = {
    "llama-3.1-8b@1gpu": {"model": "llama-3.1-8b", "layers": 4, "tokens": 4096, "override": {}},
    "qwen3-30b-a3b@1gpu": {"model": "qwen3-30b-a3b", "layers": 4, "tokens": 4096, "override": {"norm_topk_prob": True}},
}
# AdamW's foreach argument in the harness: verl and SkyRL build AdamW with neither foreach nor fused, which torch runs
# as the foreach step on CUDA (cards/memory.yaml optimizer_steps.foreach) but as the per-tensor loop on the CPU, so the
# harness forces the CUDA path
FOREACH = True


def card_config(model: str) -> dict:
    """The catalog card's config.json fields (cards/models/<model>.yaml), the harness's input."""
    return yaml.safe_load((ROOT / "cards" / "models" / f"{model}.yaml").read_text())["config"]


def cases(models: dict | None = None, policies: list[str] | None = None) -> list[dict]:
    models = models or MODELS
    return [{"model": model, "config": card_config(model), "num_layers": spec["layers"], "tokens": spec["tokens"],
             "override": spec["override"], "policy": policy}
            for model, spec in models.items() for policy in (policies or list(POLICIES))]


def step_cases(models: dict | None = None, world: int = WORLD, foreach: bool | None = FOREACH,
               reduces: tuple[str, ...] = ("fp32",)) -> list[dict]:
    return [{"kind": "step", "case": name, "model": spec.get("model", name),
             "config": card_config(spec.get("model", name)), "num_layers": spec["layers"],
             "tokens": spec["tokens"], "override": spec["override"], "policy": policy, "world": world,
             "foreach": foreach, "reduce": reduce}
            for name, spec in (models or STEP_MODELS).items() for policy in POLICIES for reduce in reduces]


def mlp_cases(tokens: int) -> list[dict]:
    """One `mlp` case per MLP_MODELS model, and the `activations` case (every ACT2FN class)."""
    return [{"kind": "mlp", "model": model, "config": card_config(model), "tokens": tokens, "policy": "none",
             "override": spec["override"]} for model, spec in MLP_MODELS.items()] + [
        {"kind": "activations", "model": "ACT2FN", "policy": "none"}]


def meshplan_mlp(model: str, tokens: int) -> float:
    """layer_activations' `mlp` of the catalog model's dense layer (its fc1 input, what its activation keeps, fc2's
    input) as the estimate lays out verl's FSDP engine: the fsdp2_hf preset, one packed micro-batch, tp 1."""
    conv = memory_card().conventions["fsdp2_hf"]
    arch = catalog(model)
    lay = Layout(tokens=tokens, seq_kv=tokens, tp=1, sp=False, etp=1, flash=True, dropout=False,
                 swiglu_unfused=conv.swiglu_unfused, fp8=False, attn=attention_saves(conv),
                 act=activation_saves(conv, arch.activation))
    return layer_activations(shape_of(arch), lay, False, "none")["mlp"]


def mlp_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in (r for r in results if r.get("kind") == "mlp"):
        if not res["ok"]:
            rows.append({"model": res["model"], "error": res["error"]})
            continue
        ours = meshplan_mlp(res["model"], res["tokens"])
        rows.append({"model": res["model"], "mlp_class": res["mlp_class"],
                     "activation": catalog(res["model"]).activation, "tokens": res["tokens"],
                     "framework_bytes": res["bytes"], "framework_tensors": res["tensors"],
                     "meshplan_bytes": ours, "diff_pct": pct(ours, res["bytes"])})
    return rows


def run_harness(request_cases: list[dict], timeout: int = 1800, harness: Path = HARNESS) -> dict:
    """Build (or reuse) the HF venv, run a harness of it (this bench's, or another that prints the same RESULT line:
    bench/step_op_census.py's) on the cases, return its parsed result."""
    proc = subprocess.run([str(hf_python()), str(harness)], input=json.dumps({"cases": request_cases}),
                          capture_output=True, text=True, timeout=timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the harness printed no result (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def served_harness(request_cases: list[dict]) -> dict:
    """run_harness's answer for this bench's harness from its server (tests/framework_packages.served_answer,
    bench/harness_serve.py --serve): torch and transformers imported once per process and fake process group, not
    once per ask. A process holds one fake process group (bench/fake_tensor_harness.fake_fsdp_mesh), so there is one
    server for each `world` the cases name (cases that name none, the layer and MLP counts, go to WORLD's)."""
    worlds = {case["world"] for case in request_cases if "world" in case} or {WORLD}
    if len(worlds) > 1:
        raise ValueError(f"one ask, one fake process group: these cases name the worlds {sorted(worlds)}")
    return served_answer(HARNESS, {"cases": request_cases}, hf_python, key=f"world {worlds.pop()}")


def hf_python() -> Path:
    """The HF venv's python (tests/framework_packages.py HF_VENV), built once and cached."""
    return venv_python("transformers", HF_VENV, python_version="3.11")


def catalog(model: str) -> Architecture:
    return resolve(Request(model=model, framework=FRAMEWORK))[0].model


def meshplan_layer(model: str, tokens: int, recompute: str, moe: bool) -> float:
    """estimate_memory's layer_activations of a one-layer copy (dense or MoE) on verl's FSDP engine (zero_stage 3)."""
    job = carry_cards(Job(model=cut(catalog(model), [moe]), gpu=get_gpu("h100"), num_gpus=WORLD, gpus_per_node=8,
                          seq_length=tokens, global_batch_size=WORLD, framework=FRAMEWORK))
    plan = Plan(dp=WORLD, zero_stage=3, micro_batch_size=1, recompute=recompute)
    return estimate_memory(job, plan).stages[0].detail["layer_activations"]


def layer_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in results:
        if not res["ok"]:
            rows.append({"model": res["model"], "policy": res["policy"], "error": res["error"]})
            continue
        tokens = res["tokens"]
        unit = tokens * res["hidden"] * 2  # s*b*h*2: one bf16 hidden-state tensor
        for moe in sorted({layer["moe"] for layer in res["layers"]}):
            kept = [layer for layer in res["layers"] if layer["moe"] is moe and layer["layer"] > 0]
            framework = statistics.fmean(layer["stack_bytes"] for layer in kept)
            ours = meshplan_layer(res["model"], tokens, POLICIES[res["policy"]], moe)
            rows.append({"model": res["model"], "model_class": res["model_class"], "layer": "MoE" if moe else "dense",
                         "policy": res["policy"], "meshplan_recompute": POLICIES[res["policy"]], "tokens": tokens,
                         "layers_counted": [layer["layer"] for layer in kept],
                         "framework_bytes": framework, "framework_per_layer_bytes": [la["stack_bytes"] for la in kept],
                         "framework_bytes_with_output": statistics.fmean(layer["bytes"] for layer in kept),
                         "framework_units": framework / unit, "meshplan_bytes": ours, "meshplan_units": ours / unit,
                         "diff_pct": pct(ours, framework)})
    return rows


def meshplan_step(model: str, layers: int, tokens: int, recompute: str, world: int = WORLD,
                  reduce: str = "fp32") -> int:
    """estimate_memory's allocated peak (at its own moment of the step: memory.stage_allocated) for verl's FSDP engine
    on the cut model as torch's allocator counts it: less the CUDA context and the fixed overhead, which a tracker of
    tensor storages does not see. `reduce` bf16: grad_reduce_in_fp32=false (fp32: left out, verl's default)."""
    arch = catalog(model)
    job = carry_cards(Job(model=cut(arch, [arch.is_moe_layer(i) for i in range(layers)]), gpu=get_gpu("h100"),
                          num_gpus=world, gpus_per_node=8, seq_length=tokens, global_batch_size=world,
                          framework=FRAMEWORK))
    plan = Plan(dp=world, zero_stage=3, micro_batch_size=1, recompute=recompute,
                grad_reduce_in_fp32=False if reduce == "bf16" else None)
    stage = estimate_memory(job, plan).stages[0]
    card = memory_card()
    return stage_allocated(stage) - card.cuda_context_bytes - card.fixed_overhead_bytes


def step_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in (r for r in results if r.get("kind") == "step"):
        if not res["ok"]:
            rows.append({"case": res["case"], "policy": res["policy"], "error": res["error"]})
            continue
        framework = res["peak"]["Total"]
        reduce = res.get("reduce", "fp32")
        ours = meshplan_step(res["model"], res["num_layers"], res["tokens"], POLICIES[res["policy"]], res["world"],
                             reduce)
        rows.append({"case": res["case"], "model": res["model"], "policy": res["policy"], "layers": res["num_layers"],
                     "tokens": res["tokens"], "world": res["world"], "foreach": res.get("foreach"), "reduce": reduce,
                     "framework_peak_bytes": framework,
                     "framework_peak_by_kind": res["peak"], "meshplan_allocated_bytes": ours,
                     "diff_pct": pct(ours, framework)})
    return rows


def reduce_rows() -> list[dict]:
    """The REDUCE_STEP_MODELS steps with each of REDUCES, named `<case> reduce`: one harness run of their own (a fake
    process group per run)."""
    rows = step_rows(run_harness(step_cases(REDUCE_STEP_MODELS, reduces=REDUCES))["results"])
    return [{**r, "case": f"{r['case']} reduce"} for r in rows]


def print_table(rows: list[dict]) -> None:
    print("Per decoder layer in a stack (saved for backward + output - released input), Hugging Face transformers "
          "model code, bf16, flash-attention-2 saves, padding removed; meshplan: verl zero_stage 3 (fsdp2_hf); "
          "unit = s*h*2")
    print(f"{'model':15} {'layer':5} {'policy':6} {'framework':>19} {'meshplan':>19} {'diff':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:15} {'':5} {r['policy']:6} ERROR {r['error'][:120]}")
            continue
        print(f"{r['model']:15} {r['layer']:5} {r['policy']:6} {r['framework_bytes'] / MIB:8.1f} MiB "
              f"{r['framework_units']:5.2f}u {r['meshplan_bytes'] / MIB:8.1f} MiB {r['meshplan_units']:5.2f}u "
              f"{r['diff_pct']:+6.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args()
    result = run_harness(cases() + step_cases() + mlp_cases(MLP_TOKENS))
    rows = layer_rows([r for r in result["results"] if r.get("kind") is None])
    print_table(rows)
    mlps = mlp_rows(result["results"])
    print(f"\nThe MLP module alone ({MLP_TOKENS} tokens; saved for backward, parameters left out; meshplan: "
          "layer_activations' mlp under fsdp2_hf)")
    for r in mlps:
        if "error" in r:
            print(f"{r['model']:16} ERROR {r['error'][:120]}")
            continue
        print(f"{r['model']:16} {r['mlp_class']:11} {r['activation']:18} {r['framework_bytes'] / MIB:8.1f} MiB "
              f"{r['meshplan_bytes'] / MIB:8.1f} MiB {r['diff_pct']:+6.1f}%")
    act2fn = next(r["activations"] for r in result["results"] if r.get("kind") == "activations")
    steps = step_rows(result["results"])
    steps += reduce_rows()
    # one fake process group per harness run: the single-GPU steps run in a second one
    steps += step_rows(run_harness(step_cases(SINGLE_GPU_STEP_MODELS, world=1))["results"])
    print(f"\nPeak through one training step (rank 0 of {WORLD}, or of 1 for the @1gpu cases; verl's FSDP2 wrap on a "
          "fake process group, flash cross-entropy log-probs, AdamW's foreach step as on CUDA, zero_grad "
          "set_to_none); meshplan: the allocated peak at its own moment (less context and overhead)")
    for r in steps:
        if "error" in r:
            print(f"{r['case']:18} {r['policy']:6} ERROR {r['error'][:120]}")
            continue
        print(f"{r['case']:18} {r['policy']:6} {r['reduce']:5} {r['framework_peak_bytes'] / GIB_:8.2f} GiB "
              f"{r['meshplan_allocated_bytes'] / GIB_:8.2f} GiB {r['diff_pct']:+6.1f}%")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "measured": datetime.date.today().isoformat(), "torch": result["torch"],
        "transformers": result["transformers"], "framework": FRAMEWORK, "zero_stage": 3,
        "method": __doc__.split("\n\n")[1].replace("\n", " "), "layers": rows, "steps": steps,
        "mlps": mlps, "act2fn_saves": act2fn,
        "harness_seconds": {f"{r.get('kind', 'layers')} {r.get('case', r['model'])} {r['policy']}": r["seconds"]
                            for r in result["results"]},
    }, indent=1) + "\n")
    print(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json}")


if __name__ == "__main__":
    main()
