"""The FakeTensorMode activation harness (bench/fake_tensor_harness.py) counts exactly what a torchtitan
Llama block keeps: its counts under no recompute, full AC and op-level SAC equal the tensors that block's code
saves, written out by hand from torchtitan 0.3.0's Llama3TransformerBlock (fused QKV, complex RoPE, flex
attention, SwiGLU). Runs torchtitan's own model code in the cached torch 2.13.0 CPU venv (slow: built once,
about 4 minutes; then about 10 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from framework_packages import TORCHTITAN_VENV, venv_python, wheel_tree
from tree_under_test import tree_env

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "bench" / "fake_tensor_harness.py"

# Llama-3.1-8B (torchtitan's "8B" flavor) at a sequence and batch other than the bench's, so batch enters
H, A, G, D, F = 4096, 32, 8, 128, 14336
SEQ, BATCH = 2048, 2
T = SEQ * BATCH


def no_recompute_bytes() -> int:
    """What one block adds in its forward with nothing recomputed (bf16 = 2 bytes, fp32 = 4 per element):
    attention-norm output (the QKV input)                       2h
    two RMSNorm rstd, fp32 [b, s, 1] (fused kernel: the input and rstd are saved; the input exists already)  2*4
    RoPE cache rows gathered by position, complex64 [b, s, 1, d/2]                                          4d
    rotated Q, rotated K, V (split with .contiguous(), so the fused QKV buffer is freed)           2h + 2*2gd
    flex-attention output (allocated in Q's layout, so the out-projection's input is the same buffer)     2h
    logsumexp and max_scores, fp32 [b, a, s]                                                            2*4a
    the residual after attention (the FFN norm's input), the FFN-norm output (w1/w3 input)              2h + 2h
    w1 output, silu output, w3 output, their product (the w2 input)                                     4*2f
    the block output (the next block's input)                                                             2h
    per token."""
    return T * (2 * H + 2 * 4 + 4 * D + 2 * H + 2 * 2 * G * D + 2 * H + 2 * 4 * A + 2 * H + 2 * H + 4 * 2 * F
                + 2 * H)


def op_sac_bytes() -> int:
    """torchtitan 0.3.0's SelectiveAC: the outputs of the save-list ops except every second mm (counted in call
    order wqkv, wo, w1, w3, w2: wo and w3 are recomputed), plus the block output:
    wqkv output 2(h + 2gd), flex output 2h with logsumexp and max_scores 2*4a, w1 output 2f, w2 output 2h,
    block output 2h."""
    return T * (2 * (H + 2 * G * D) + 2 * H + 2 * 4 * A + 2 * F + 2 * H + 2 * H)


@pytest.fixture(scope="module")
def counts() -> dict[str, dict]:
    python = venv_python("torchtitan", TORCHTITAN_VENV, python_version="3.11")
    policies = ["none", "full", "selective", "selective-2@0.2.2"]
    request = {"era_a_wheel": str(wheel_tree("torchtitan", "0.2.2")),
               "cases": [{"kind": "layers", "arch": "llama3-8b", "layers": [0, 1, 2, 3], "seq": SEQ,
                          "batch": BATCH, "policy": policy} for policy in policies]}
    proc = subprocess.run([str(python), str(HARNESS)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-4000:]
    results = json.loads(line[len("RESULT "):])["results"]
    for res in results:
        assert res["ok"], res
    return {res["policy"]: res for res in results}


def per_layer(result: dict) -> list[int]:
    return [layer["bytes"] for layer in result["layers"]]


@pytest.mark.slow
def test_no_recompute_counts_every_tensor_the_block_saves(counts):
    expected = no_recompute_bytes()
    assert expected == T * 168712  # 1,382,088,704 bytes per 8,192 tokens
    for measured in per_layer(counts["none"]):
        assert measured == pytest.approx(expected, rel=1e-6)
    # autograd's own record of what it saved (a pack hook) gives the same bytes, to the byte
    assert counts["none"]["saved_hook_bytes"] == [expected] * 4


@pytest.mark.slow
def test_full_ac_keeps_only_the_block_input(counts):
    # each checkpointed block keeps its input; counted as the previous block's output: s*b*h*2
    for measured in per_layer(counts["full"]):
        assert measured == pytest.approx(T * H * 2, rel=1e-6)


@pytest.mark.slow
def test_op_sac_saves_the_policy_ops_except_every_second_mm(counts):
    for measured in per_layer(counts["selective"]):
        assert measured == pytest.approx(op_sac_bytes(), rel=1e-6)
    assert op_sac_bytes() < no_recompute_bytes() / 2


@pytest.mark.slow
def test_torchtitan_0_2_every_second_layer_checkpoints_blocks_two_and_four(counts):
    # 0.2.2's layer SAC counts blocks from 1 and checkpoints block k when k % 2 == 0
    none, full = no_recompute_bytes(), T * H * 2
    for measured, expected in zip(per_layer(counts["selective-2@0.2.2"]), [none, full, none, full], strict=True):
        assert measured == pytest.approx(expected, rel=1e-6)


def test_the_harness_never_enters_meshplan():
    # torch is a bench/test dependency only: meshplan does not import it, the harness does not import meshplan
    source = HARNESS.read_text()
    assert "import meshplan" not in source and "from meshplan" not in source
    proc = subprocess.run([sys.executable, "-c", "import sys, meshplan.estimate.memory, "
                           "meshplan.arithmetic.activations; print('torch' in sys.modules)"],
                          capture_output=True, text=True, check=True, env=tree_env())
    assert proc.stdout.strip() == "False"
