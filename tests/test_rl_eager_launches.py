"""An eager rollout engine's decode step pays the host's kernel launches: per decoder layer the kernels of the parts
the layer has (cards/rollout_kernels.yaml, counted from vLLM's model code), each at calibration.yaml
rl.eager_launch_s_per_kernel (meshplan/rl/launches.py)."""

import pytest

from meshplan.knowledge.calibration import calibration_card
from meshplan.knowledge.rollout_kernels_card import rollout_kernels
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.launches import eager_launches, layer_kernels, layer_parts

PARTS = rollout_kernels().engines["vllm"].parts


def rl_job(model: str, **fields):
    return resolve(parse_request({"model": model, "framework": "verl", "num_gpus": 8, "job": "rl",
                                  "rollout_enforce_eager": True, "rollout_tp": 1, **fields}))


def test_each_part_counts_its_named_kernels():
    """A part's count is the number of kernels the card names for it (the source's launches, one each)."""
    assert PARTS.norms.count == 2  # fused_add_rms_norm before attention and before the MLP
    assert PARTS.gqa_attention.count == 5  # qkv GEMM, cache write, attention, split-KV combine, o_proj GEMM
    assert PARTS.dense_mlp.count == 3  # gate_up GEMM, silu_and_mul, down GEMM
    assert PARTS.mla_q_lora.count == PARTS.mla_q_direct.count + 1  # q's norm between its two GEMMs
    assert PARTS.tp_collectives.count == 2 and PARTS.ep_dispatch.count == 2


def test_a_dense_7b_layer_is_eleven_kernels_and_the_fit_gives_back_the_measured_9_ms():
    """The source of the constant: Qwen2.5-Omni-7B's thinker (28 Qwen2 layers, one GPU) ran about 9 ms a token
    slower eager than with CUDA graphs (vllm-omni #7960); its layer launches 11 kernels."""
    job, plan = rl_job("qwen2.5-7b")
    arch = job.model
    assert layer_parts(arch, 0, plan) == ["norms", "gqa_attention", "rotary", "dense_mlp"]
    assert layer_kernels(arch, 0, plan, PARTS) == 2 + 5 + 1 + 3
    eager = eager_launches(arch, plan)
    assert eager.kernels == 28 * 11
    assert eager.seconds == pytest.approx(9e-3, rel=0.01)
    assert eager.seconds == pytest.approx(308 * calibration_card().rl.eager_launch_s_per_kernel.value)


def test_tensor_parallel_adds_the_two_all_reduces_per_layer():
    job, plan = rl_job("qwen2.5-7b", rollout_tp=4)
    assert layer_kernels(job.model, 5, plan, PARTS) == 11 + 2
    assert eager_launches(job.model, plan).kernels == 28 * 13


def test_deepseek_v3_layers_count_mla_the_moe_block_and_the_first_dense_layers():
    """DeepSeek-V3 (MLA with q_lora_rank, 3 dense layers, then MoE with a shared expert) at rollout TP 32: a dense
    layer 2 + 13 + 3 + 2, an MoE layer 2 + 13 + 7 + 4 + 2 kernels."""
    job, plan = rl_job("deepseek-v3", gpu="h20", num_gpus=96, tp=8, pp=12, ep=8, rollout_tp=32)
    arch = job.model
    mla = PARTS.mla_attention.count + PARTS.mla_q_lora.count
    assert mla == 13
    assert layer_kernels(arch, 0, plan, PARTS) == 2 + mla + 3 + 2
    moe = 2 + mla + PARTS.routed_experts.count + PARTS.shared_experts.count + 2
    assert layer_kernels(arch, 3, plan, PARTS) == moe == 28
    assert eager_launches(arch, plan).kernels == 3 * 20 + 58 * 28
    # one layer of each kind counted stands for every layer: the same as the sum over all of them
    assert eager_launches(arch, plan).kernels == sum(layer_kernels(arch, i, plan, PARTS) for i in range(61))


def test_mla_without_q_lora_and_expert_parallel_dispatch():
    """DeepSeek-V2-Lite's q has no low-rank path; with rollout EP the MoE layer's all-reduce becomes the dispatch's
    all-gather and the combine's reduce-scatter, attention's all-reduce stays."""
    job, plan = rl_job("deepseek-v2-lite", rollout_tp=2, rollout_dp=4, rollout_ep=8)
    arch = job.model
    assert "mla_q_direct" in layer_parts(arch, 1, plan)
    no_ep = plan.model_copy(update={"rollout_ep": 1})
    assert layer_kernels(arch, 1, plan, PARTS) == layer_kernels(arch, 1, no_ep, PARTS) + 1
    assert layer_kernels(arch, 0, plan, PARTS) == layer_kernels(arch, 0, no_ep, PARTS)  # layer 0 is dense
    every = sum(layer_kernels(arch, i, plan, PARTS) for i in range(arch.num_layers))
    assert eager_launches(arch, plan).kernels == every


def test_graphs_launch_nothing():
    job, plan = rl_job("qwen2.5-7b")
    graphed = plan.model_copy(update={"rollout_enforce_eager": False})
    assert eager_launches(job.model, graphed) == (0, 0.0, "")


def test_every_kernel_is_one_whole_name():
    """A comma inside a flow list's item splits it in two and adds a launch: every named kernel closes what it
    opens."""
    for engine in rollout_kernels().engines.values():
        for name in type(engine.parts).model_fields:
            for kernel in getattr(engine.parts, name).kernels:
                assert kernel.count("(") == kernel.count(")"), (name, kernel)


def test_an_sglang_rollout_reads_sglangs_own_counts():
    """SGLang's decode (verl's FA3 backend) writes K and V with two index copies and copies the strided q: a Qwen2
    layer launches 13 kernels there, 11 in vLLM."""
    job, plan = rl_job("qwen2.5-7b", rollout_engine="sglang")
    assert plan.rollout_engine == "sglang"
    assert eager_launches(job.model, plan).kernels == 28 * (2 + 7 + 1 + 3)


def test_the_bench_scores_the_fit_in_and_out_of_sample():
    """bench/eager_launches.py: the card's constant gives back its own source, and each vLLM source held out is
    scored with the constant the other gives (one fitted figure, in and out of sample)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import eager_launches as bench

    rows = {r["id"]: r for r in bench.run()["rows"]}
    fitted = [r for r in rows.values() if r["fitted"]]
    assert len(fitted) == 2 and {r["engine"] for r in fitted} == {"vllm"}
    omni = next(r for r in fitted if r["model"] == "qwen2.5-7b")
    assert omni["kernels"] == 308 and omni["card_error"] == pytest.approx(0, abs=0.01)
    gpt2 = next(r for r in fitted if r["model"] == "gpt2")
    assert gpt2["kernels"] == 12 * (2 + 2 + 5 + 3)  # LayerNorm's residual adds, no rotary
    assert omni["held_out_us"] == pytest.approx(gpt2["us_per_kernel"])  # held out: the other source's fit
    assert gpt2["held_out_us"] == pytest.approx(omni["us_per_kernel"])
