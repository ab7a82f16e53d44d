"""The eager rollout's launch cost (calibration.yaml rl.eager_launch_s_per_kernel) against every published eager vs
CUDA-graph decode pair found: in sample (the card's value), and each vLLM source held out (the constant fitted on the
other vLLM source alone). The kernels per step are meshplan's own count (meshplan/rl/launches.py over
cards/rollout_kernels.yaml) for the model and the engine the source ran; nothing here is fitted to a row but the one
constant, seconds per launch = the measured eager-over-graph seconds per step / the kernels per step.

Data: bench/data/eager_launches.yaml, each pair with its source: vllm-omni #7960 (Qwen2.5-Omni-7B thinker, vLLM;
the card's fit), DeepSpeed PR #8352 (GPT-2, vLLM, H200), sglang PR #1401 (Llama-3-8B with two backends and
DeepSeek-Coder-V2-Lite, SGLang 0.3 in 2024: another engine and vintage, counted with the card's SGLang parts, which
are of its 0.4.x source; never fitted).

Run: python bench/eager_launches.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from meshplan.knowledge.calibration import calibration_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.rl.launches import eager_launches
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Plan

DATA = Path(__file__).resolve().parent / "data" / "eager_launches.yaml"


def pairs() -> list[dict]:
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))["pairs"]


def kernels(source: dict) -> int:
    """Kernels per decode step at TP 1 for the source's model and engine (meshplan's count)."""
    model = source["model"]
    arch = Architecture(**model) if isinstance(model, dict) else resolve_model(model)
    plan = Plan(rollout_engine=source["engine"], rollout_tp=1, rollout_dp=1, rollout_ep=1, rollout_enforce_eager=True)
    return eager_launches(arch, plan).kernels


def run() -> dict:
    card = calibration_card().rl.eager_launch_s_per_kernel.value
    rows = [{**s, "model": s["model"] if isinstance(s["model"], str) else s["model"]["name"], "kernels": kernels(s)}
            for s in pairs()]
    fit_pool = [r for r in rows if r["fitted"]]
    for r in rows:
        r["us_per_kernel"] = r["over_ms"] * 1e3 / r["kernels"]
        r["card_ms"] = r["kernels"] * card * 1e3
        r["card_error"] = r["card_ms"] / r["over_ms"] - 1
        others = [o for o in fit_pool if o["id"] != r["id"]]
        # the constant fitted without this source: total measured seconds over total kernels of the others
        held = sum(o["over_ms"] for o in others) / sum(o["kernels"] for o in others) * 1e-3
        r["held_out_us"] = held * 1e6
        r["held_out_ms"] = r["kernels"] * held * 1e3
        r["held_out_error"] = r["held_out_ms"] / r["over_ms"] - 1
    return {"card_us_per_kernel": card * 1e6, "rows": rows}


def report(res: dict) -> None:
    print(f"card: {res['card_us_per_kernel']:.1f} us per launch (fitted on vllm-omni #7960 alone)")
    print(f"{'source':42} {'kernels':>7} {'meas ms':>8} {'us/k':>6} {'card ms':>8} {'err':>6} {'held us':>8} "
          f"{'held ms':>8} {'err':>6}")
    for r in res["rows"]:
        print(f"{r['id']:42} {r['kernels']:>7} {r['over_ms']:>8.2f} {r['us_per_kernel']:>6.1f} "
              f"{r['card_ms']:>8.2f} {r['card_error']:>+6.0%} {r['held_out_us']:>8.1f} {r['held_out_ms']:>8.2f} "
              f"{r['held_out_error']:>+6.0%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run()
    print(json.dumps(res, indent=1)) if args.json else report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
