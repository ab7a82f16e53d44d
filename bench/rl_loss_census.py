"""The RL actors' loss paths (cards/frameworks/verl.yaml and skyrl.yaml engine.rl_loss) against a census of their
code's aten ops (bench/rl_loss_census_harness.py in the HF venv: torch 2.13.0 CPU, tests/framework_packages.py
HF_VENV), bytes per logit of each path's forward and backward beside the card's figure for the same ops.

Not counted by the census, so left out of both sides: Megatron-Core's cross-entropy (cards/memory.yaml
megatron_cross_entropy) and flash_attn's Triton kernels (2 forward + 4 backward, from their source), stand-ins there.
Where the census and the card count the same op differently the difference is named (`census_differs`): a
torch.compile'd piece runs eager in the census (verl's mul_reduce: mul 6 + sum 2, against the fused 4), and a
composite op is one read and one write there (log_softmax over an fp32 row: 8, where CUDA's kernel reads the row for
its max, its sum and its output, 16; its backward's sum pass; slice_backward's copy of the chunk), and new_zeros is
counted reading the tensor whose shape it takes. The chunked entropies run 4 chunks of 64 of the 256 tokens.

    python bench/rl_loss_census.py [--json OUT]
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

from meshplan.knowledge.cards import framework_card  # noqa: E402

HARNESS = ROOT / "bench" / "rl_loss_census_harness.py"
FLASH_CROSS_ENTROPY = 2 + 4  # flash_attn's forward and backward kernels (cards/memory.yaml fsdp2_hf)
MUL_REDUCE_EAGER = 8 - 4  # verl's and SkyRL's compiled mul_reduce run eager in the census
LOG_SOFTMAX_PASSES = 8  # CUDA's log_softmax over an fp32 row reads it twice more than the census's one read
LOG_SOFTMAX_BACKWARD_SUM = 4  # and its backward's sum pass over the fp32 gradient, one op in the census
NEW_ZEROS_READ = 2  # the census counts new_zeros reading the bf16 tensor whose shape it takes: no traffic
SLICE_BACKWARD = 2  # slice_backward as one op: the chunk read, the whole written, not the chunk's copy (4 chunks)
TOKENS, VOCAB, CHUNK = 256, 2048, 64
CHUNKS = TOKENS // CHUNK


def card_figures() -> dict[str, tuple[float, float]]:
    """Each censused path's card figure for the ops the census runs, and what the census counts otherwise."""
    verl, skyrl = (framework_card(f).engine.rl_loss for f in ("verl", "skyrl"))
    vm, sf, sm = verl["megatron"], skyrl["fsdp"], skyrl["megatron"]
    sf_chunks, sm_chunks = (p.entropy_chunk_bytes_per_logit * CHUNKS for p in (sf, sm))
    return {
        "verl_megatron_update": (vm.update_hbm_bytes_per_logit, NEW_ZEROS_READ),
        "verl_megatron_entropy_update": (vm.update_hbm_bytes_per_logit + vm.entropy_update_hbm_bytes_per_logit,
                                         MUL_REDUCE_EAGER + NEW_ZEROS_READ),
        "verl_megatron_old_pass": (vm.forward_hbm_bytes_per_logit + vm.old_log_prob_entropy_hbm_bytes_per_logit,
                                   MUL_REDUCE_EAGER),
        "skyrl_fsdp_update": (sf.update_hbm_bytes_per_logit - FLASH_CROSS_ENTROPY, -LOG_SOFTMAX_PASSES),
        "skyrl_fsdp_entropy_update": (sf.update_hbm_bytes_per_logit + sf.entropy_update_hbm_bytes_per_logit
                                      + sf_chunks - FLASH_CROSS_ENTROPY,
                                      -LOG_SOFTMAX_PASSES - LOG_SOFTMAX_BACKWARD_SUM - SLICE_BACKWARD),
        "skyrl_megatron_update": (sm.update_hbm_bytes_per_logit, MUL_REDUCE_EAGER),
        "skyrl_megatron_entropy_update": (sm.update_hbm_bytes_per_logit + sm.entropy_update_hbm_bytes_per_logit
                                          + sm_chunks, MUL_REDUCE_EAGER - SLICE_BACKWARD),
        "skyrl_megatron_forward": (sm.forward_hbm_bytes_per_logit, 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cards = card_figures()
    cases = [{"path": p, "tokens": TOKENS, "vocab": VOCAB, "chunk": CHUNK} for p in cards]
    result = run_harness(cases, harness=HARNESS)
    print(f"torch {result['torch']}; bytes per logit (forward + backward), the census against the card")
    rows = []
    for r in result["results"]:
        if not r["ok"]:
            print(f"{r['path']}: {r['error']}")
            continue
        card, differs = cards[r["path"]]
        census = r["forward"] + r["backward"]
        rows.append({**r, "card": card, "census_differs": differs, "census": census})
        print(f"{r['path']:32s} census {r['forward']:6.1f} + {r['backward']:6.1f} = {census:6.1f}   card {card:6.1f}"
              f"{f' (census differs by {differs:+g})' if differs else ''}   "
              f"{'agrees' if abs(census - card - differs) < 0.5 else 'DIFFERS'}")
        print("    " + ", ".join(f"{n} {b:g}" for n, b in r["ops"]))
    if args.json:
        args.json.write_text(json.dumps({"torch": result["torch"], "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
