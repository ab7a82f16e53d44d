"""Each framework's FFN activation counted op by op, against cards/calibration.yaml activation_passes.

`bench/activation_census_harness.py` runs each implementation (Megatron-Core's fused functions and gpt-oss's eager
clamps, eager PyTorch as torchtitan runs it, transformers 5.9.0's ACT2FN and GptOssExperts._apply_gate, Megatron-Core's
per-expert bias loop) on bf16 tensors in the HF venv (torch 2.13.0 CPU + transformers 5.9.0, tests/framework_packages.py
HF_VENV) and logs every aten op's bytes; a compiled function counts as one kernel. This prints the passes (bytes over
2 B per element of the activation's output width; per routed copy and hidden element for the bias loop; per routed
copy and expert-width element for the unfused routing-weight multiply; per rotated query or key element for
Megatron-Core's unfused RoPE), forward and backward, beside the card's, and writes them to
bench/data/activation_census.json (tests/test_activation_passes.py holds the card to that file).

    python bench/activation_census.py [--json bench/data/activation_census.json]
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

from meshplan.knowledge.calibration import calibration, calibration_card  # noqa: E402

HARNESS = ROOT / "bench" / "activation_census_harness.py"
DEFAULT_JSON = ROOT / "bench" / "data" / "activation_census.json"


def counted() -> dict:
    """{code: {activation: [forward, backward]}} and the bias loop's, in bf16 passes, from the harness."""
    raw = run_harness([], harness=HARNESS)
    out: dict = {"activations": {}, "expert_bias": {}, "routed_weighting": {}, "rotary": {}}
    for code, table in raw.items():
        if code in ("expert_bias", "routed_weighting", "rotary"):
            out[code] = {c: [v["forward"] / 2, v["backward"] / 2] for c, v in table.items()}
        else:
            out["activations"][code] = {k: [v["forward"] / 2, v["backward"] / 2] for k, v in table.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help=f"write the counts (e.g. {DEFAULT_JSON})")
    args = parser.parse_args()
    result = counted()
    codes = calibration_card().activation_passes.codes
    print(f"{'code':16s} {'activation':24s} {'counted fwd / bwd':>20s} {'card fwd / bwd':>16s}")
    for code, table in result["activations"].items():
        for key, (fwd, bwd) in table.items():
            card = codes[code].passes.get(key) if code in codes else None
            shown = f"{card[0]:g} / {card[1]:g}" if card else "-"
            print(f"{code:16s} {key:24s} {fwd:9.2f} / {bwd:7.2f} {shown:>16s}")
    for code, (fwd, bwd) in result["expert_bias"].items():
        card = codes[code].expert_bias
        print(f"{code:16s} {'expert_bias':24s} {fwd:9.2f} / {bwd:7.2f} {card[0]:g} / {card[1]:g}".rjust(0))
    for code, (fwd, bwd) in result["routed_weighting"].items():
        card = codes[code].routed_weighting if code in codes else (0, 0)
        print(f"{code:16s} {'routed_weighting':24s} {fwd:9.2f} / {bwd:7.2f} {card[0]:g} / {card[1]:g}")
    for code, (fwd, bwd) in result["rotary"].items():
        cal = calibration(None)
        print(f"{code:16s} {'rotary (unfused)':24s} {fwd:9.2f} / {bwd:7.2f} "
              f"card {cal.unfused_rope_passes:g} more than TE's fused kernel (2 / 2)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"written: {args.json}")


if __name__ == "__main__":
    main()
