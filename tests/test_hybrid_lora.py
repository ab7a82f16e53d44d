"""LoRA on a hybrid Mamba-2 model (model_type nemotron_h) on Megatron-Bridge: the adapters per layer kind (a Mamba-2
layer's in_proj and out_proj, attention's linear_qkv and linear_proj, an MLP's and an MoE layer's linear_fc1 and
linear_fc2), the frozen base's states, the refusals on the frameworks that cannot run it."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.lora import adapter_params, layer_adapters, total_adapter_params
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

NANO = dict(model="nemotron-3-nano-30b-a3b", framework="megatron-bridge", num_gpus=8, global_batch_size=64)
SIX = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "in_proj", "out_proj"]


def test_nano_adapters_by_hand_from_its_config():
    """Nemotron 3 Nano 30B-A3B config.json: hidden 2688; Mamba-2 64 heads x 64, 8 groups, state 128 (d_inner 4096);
    attention 32 heads + 2 x 2 KV heads of 128; 128 routed experts of 1856 and a shared expert of 3712, squared-ReLU
    (not gated). Rank 16, Megatron-Bridge's recipe targets: one shared adapter per routed-expert linear."""
    job, _ = resolve(Request(**NANO, lora_rank=16))
    assert job.lora is not None and job.lora.targets == SIX
    assert any("Nemotron-H and Nemotron 3 recipes' target_modules" in n for n in job.notes)  # the card's hybrid_targets
    r, h, d_inner = 16, 2688, 64 * 64
    mamba = r * (h + (2 * d_inner + 2 * 8 * 128 + 64)) + r * (d_inner + h)
    attention = r * (h + (32 + 2 * 2) * 128) + r * (32 * 128 + h)
    moe = r * (h + 1856) + r * (1856 + h) + r * (h + 3712) + r * (3712 + h)
    pattern = job.model.layer_pattern
    assert (pattern.count("M"), pattern.count("*"), pattern.count("E")) == (23, 6, 23)
    assert total_adapter_params(job.model, job.lora) == 23 * mamba + 6 * attention + 23 * moe == 16_684_032
    kinds = {pattern[i]: {a.target for a in layer_adapters(job.model, i, job.lora, None)} for i in range(3)}
    kinds["*"] = {a.target for a in layer_adapters(job.model, pattern.index("*"), job.lora, None)}
    assert kinds == {"M": {"in_proj", "out_proj"}, "E": {"linear_fc1", "linear_fc2"},
                     "*": {"linear_qkv", "linear_proj"}}


def test_super_latent_experts_and_mtp_block_by_hand():
    """Nemotron 3 Super: hidden 4096; Mamba-2 128 heads x 64, 8 groups, state 128; 512 routed experts of 2688 at the
    latent width 1024, a shared expert of 5376; one MTP block of '*E' layers, which Bridge's LoRA adapts too."""
    job, _ = resolve(Request(model="nemotron-3-super-120b-a12b", framework="megatron-bridge", num_gpus=64,
                             lora_rank=8))
    r, h, d_inner, latent = 8, 4096, 128 * 64, 1024
    mamba = r * (h + (2 * d_inner + 2 * 8 * 128 + 128)) + r * (d_inner + h)
    attention = r * (h + (32 + 2 * 2) * 128) + r * (32 * 128 + h)
    moe = r * (latent + 2688) + r * (2688 + latent) + r * (h + 5376) + r * (5376 + h)
    p = job.model.layer_pattern
    whole = p.count("M") * mamba + p.count("*") * attention + p.count("E") * moe + (attention + moe)
    assert total_adapter_params(job.model, job.lora) == whole


def test_tp_splits_a_mamba_layers_adapters():
    job, _ = resolve(Request(**NANO, lora_rank=16))
    one = adapter_params(job.model, [0], job.lora, None, tp=1, ep=1, etp=1)
    assert one[1] == 0.0 and one[0] > 0
    assert adapter_params(job.model, [0], job.lora, None, tp=4, ep=1, etp=1) == (one[0] / 4, 0.0)


def test_frozen_base_keeps_weights_only_and_adapters_their_states():
    """The LoRA job's model states: the base's bf16 weights only, beside the adapters' full states, far below the
    sft job's weights + grads + optimizer states."""
    job, plan = resolve(Request(**NANO, ep=8, lora_rank=16))
    lora = estimate_memory(job, plan)
    sft = estimate_memory(*resolve(Request(**NANO, ep=8, job="sft")))
    dense, experts = adapter_params(job.model, list(range(job.model.num_layers)), job.lora, None, tp=1, ep=8, etp=1)
    assert lora.stages[0].detail["lora_adapter_params"] == int(dense + experts)
    assert lora.peak_bytes < sft.peak_bytes


def test_targets_the_model_lacks_are_named():
    out = check_config(*resolve(Request(model="llama-3.1-8b", framework="megatron-bridge", num_gpus=8,
                                        lora_targets=["in_proj"])))
    assert any(f.id == "LORA002" and "Mamba-2" in f.message for f in out.findings)
    h8 = check_config(*resolve(Request(model="nemotron-h-8b", framework="megatron-bridge", num_gpus=8,
                                       lora_targets=SIX)))
    assert not [f for f in h8.findings if f.id == "LORA002"]


@pytest.mark.parametrize(("framework", "rule"), [("verl", "HY002"), ("torchtitan", "HY001"),
                                                 ("megatron-core", "LORA001")])
def test_other_frameworks_refuse_a_hybrid_lora_by_rule(framework, rule):
    out = check_config(*resolve(Request(**{**NANO, "framework": framework}, lora_rank=16)))
    finding = next(f for f in out.findings if f.id == rule and f.severity == "error")
    assert "megatron-bridge" in finding.fix and "megatron-core" not in finding.fix.split("(")[0]


def test_rl_on_a_hybrid_is_still_refused():
    with pytest.raises(MeshplanError, match="RL job"):
        resolve(Request(**NANO, job="rl"))


def test_recommend_answers_a_hybrid_lora_job():
    answer = api.recommend(Request(model="nemotron-3-nano-30b-a3b", framework="megatron-bridge", num_gpus=8,
                                   lora_rank=16))
    assert answer.candidates
    assert "LoRA rank 16" in " ".join(answer.candidates[0].throughput.assumptions)


def _bridge_recipe(targets: list[str]) -> str:
    return ("from megatron.bridge.peft.lora import LoRA\n"
            "def nemotron_3_nano_peft_config() -> ConfigContainer:\n    cfg = _peft_common()\n"
            f"    cfg.peft = LoRA(dim=8, target_modules={targets!r})\n    return cfg\n")


def test_render_writes_bridges_peft_and_import_reads_it_back():
    """render writes cfg.peft.dim and cfg.peft.target_modules (the dense LoRA's keys) with the Mamba-2 targets; import
    reads them back to the same job."""
    job, plan = resolve(Request(**NANO, ep=8, lora_rank=16))
    text = api.render_config("megatron-bridge", Request(**NANO, ep=8, lora_rank=16)).text
    assert "cfg.peft.dim = 16" in text and f"cfg.peft.target_modules = {SIX!r}" in text
    read = api.import_config(text, path="r.py", framework="megatron-bridge")
    assert read.request["lora_rank"] == 16 and read.request["lora_targets"] == SIX
    back, back_plan = resolve(api.request_from_config(read, {"model": "nemotron-3-nano-30b-a3b", "num_gpus": 8}))
    assert back.lora == job.lora and back_plan.ep == plan.ep


@pytest.mark.parametrize(("targets", "read"), [
    (["*.mixer.in_proj", "*.out_proj", "*.linear_qkv"], ["linear_qkv", "in_proj", "out_proj"]),
    (["decoder.layers.*.mixer.in_proj", "linear_fc1"], ["linear_fc1", "in_proj"]),
])
def test_bridge_wildcards_over_the_mamba_mixer_read_back(targets, read):
    """Bridge's wildcard_match over the hybrid's paths (decoder.layers.<i>.mixer.in_proj): read as the targets they
    adapt (before: 'no projection meshplan knows')."""
    got = api.import_config(_bridge_recipe(targets), path="r.py", framework="megatron-bridge")
    assert sorted(got.request["lora_targets"]) == sorted(read)


def test_frozen_flops_discount_the_linears_not_the_mamba_scan():
    """Megatron-LM's hybrid_flops, per token: the sequence-free part is the linears and logits, whose weight gradient
    (a third) a frozen base skips, and each Mamba-2 layer's scan 7 x 2h x N, which has no weight and keeps it."""
    from meshplan.arithmetic.flops import model_flops_per_token
    from meshplan.arithmetic.lora import frozen_flops_per_token
    job, _ = resolve(Request(**NANO, lora_rank=16))
    arch = job.model
    scan = 3 * 7 * 2 * 2688 * 128 * arch.layer_pattern.count("M")
    linear = model_flops_per_token(arch, 0) - scan
    assert frozen_flops_per_token(arch, 4096) == pytest.approx(model_flops_per_token(arch, 4096) - linear / 3)
