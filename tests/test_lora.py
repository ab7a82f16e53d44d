"""LoRA fine-tuning (meshplan/arithmetic/lora.py): adapter parameters, frozen-base model states, the 2/3 backward, the
request."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.render import render
from meshplan.arithmetic.flops import Gemm, model_flops_per_token
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_seconds
from meshplan.arithmetic.lora import (
    adapter_params,
    all_linear_targets,
    default_rank,
    lora_engine,
    lora_flops_per_token,
    total_adapter_params,
)
from meshplan.arithmetic.memory_states import state_bytes, with_precision
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.plan import LoraSpec
from meshplan.schema.request import Request

L8B = dict(model="llama-3.1-8b", framework="megatron-bridge", num_gpus=8, global_batch_size=64)
ALL = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
# Llama-3.1-8B: h 4096, 32 heads + 2 x 8 KV heads of 128, SwiGLU ffn 14336, 32 layers
H, QKV, FFN, LAYERS = 4096, (32 + 2 * 8) * 128, 14336, 32


def test_adapter_params_llama_8b_rank_16_all_targets():
    """Fused (Megatron-Bridge): one A per linear_qkv and per gate/up linear_fc1; r(in + out) per adapted linear."""
    job, _ = resolve(Request(**L8B, lora_rank=16))
    per_layer = 16 * ((H + QKV) + (H + H) + (H + 2 * FFN) + (FFN + H))
    assert per_layer == 1_114_112
    assert total_adapter_params(job.model, job.lora) == LAYERS * per_layer == 35_651_584


def test_adapter_params_per_projection_is_hugging_face_peft():
    """verl/SkyRL's FSDP engines run PEFT: q, k, v and gate, up each get their own A. Llama-3-8B r=16 on every
    linear is PEFT's published 41,943,040 trainable parameters."""
    job, plan = resolve(Request(**{**L8B, "framework": "verl"}, zero_stage=3, lora_rank=16))
    engine = lora_engine(framework_card("verl"), plan.zero_stage)
    assert engine.adapters == "per_projection"
    assert total_adapter_params(job.model, job.lora, engine) == 41_943_040


def test_adapters_shard_over_tp_and_experts_share_one_adapter():
    job, _ = resolve(Request(**L8B, lora_rank=16))
    one = adapter_params(job.model, [0], job.lora, None, tp=1, ep=1, etp=1)
    assert adapter_params(job.model, [0], job.lora, None, tp=4, ep=1, etp=1) == (one[0] / 4, 0.0)
    moe, _ = resolve(Request(model="qwen3-30b-a3b", framework="megatron-bridge", num_gpus=8, ep=8, lora_rank=8))
    h, e = 2048, 768  # hidden, expert ffn; 32 heads + 2 x 4 KV heads of 128
    dense, expert = adapter_params(moe.model, [0], moe.lora, lora_engine(framework_card("megatron-bridge"), 1), tp=1,
                                   ep=8, etp=1)
    assert dense == 8 * ((h + 40 * 128) + (32 * 128 + h))
    assert expert == 8 * ((h + 2 * e) + (e + h))  # shared across the 16 local experts, not x 16
    automodel = lora_engine(framework_card("nemo-automodel"), 3)
    assert automodel.experts == "per_expert"
    per_expert = adapter_params(moe.model, [0], moe.lora, automodel, tp=1, ep=8, etp=1)[1]
    assert per_expert == 128 / 8 * 8 * ((2 * h + 2 * e) + (e + h))


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_peft_on_transformers_5_adapts_no_routed_expert(framework):
    """verl's and SkyRL's FSDP engines apply PEFT's target_modules, which match nn.Linear modules; transformers 5 keeps
    a layer's routed experts as two 3D parameters, so all-linear adapts Qwen3-30B-A3B's attention only (it has no
    shared expert): per layer q, k, v, o of r(in + out) each, and the note says why the experts have none."""
    job, plan = resolve(Request(model="qwen3-30b-a3b", framework=framework, num_gpus=8, zero_stage=3, lora_rank=8))
    engine = lora_engine(framework_card(framework), plan.zero_stage)
    assert engine.experts == "none"
    h, q, kv = 2048, 32 * 128, 4 * 128
    assert total_adapter_params(job.model, job.lora, engine) == 48 * 8 * ((h + q) + 2 * (h + kv) + (q + h))
    assert adapter_params(job.model, [0], job.lora, engine, tp=1, ep=1, etp=1)[1] == 0.0
    assert any("routed experts: none" in n and "3D parameters" in n for n in job.notes)


# Small models of the MoE families whose other nn.Linear modules PEFT's all-linear adapts (transformers 5.9.0): h 256,
# 4 heads; Qwen2-MoE's shared_expert_gate; DeepSeek-V2's router (an nn.Linear) and MLA, with and without q_lora_rank;
# DeepSeek-V3's MLA (its router a bare weight)
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
             "shared_expert_intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000,
             "tie_word_embeddings": False}
MLA_MOE = {"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2,
           "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 64,
           "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
           "n_shared_experts": 1, "num_experts_per_tok": 2, "vocab_size": 1000, "tie_word_embeddings": False}
PEFT_CONFIGS = {"qwen2_moe": QWEN2_MOE,
                "deepseek_v2": {**MLA_MOE, "model_type": "deepseek_v2", "q_lora_rank": 96},
                "deepseek_v2_no_q_lora": {**MLA_MOE, "model_type": "deepseek_v2", "q_lora_rank": None},
                "deepseek_v3": {**MLA_MOE, "model_type": "deepseek_v3", "q_lora_rank": 96}}


def _pair(i: int, o: int, r: int = 8) -> int:
    return r * (i + o)


def _mla(q_lora: int | None) -> int:
    """A layer's MLA projections (h 256, 4 heads, nope 32, rope 16, v 32, kv_lora 64) and o_proj, rank 8."""
    q = _pair(256, q_lora) + _pair(q_lora, 4 * 48) if q_lora else _pair(256, 4 * 48)
    return q + _pair(256, 64 + 16) + _pair(64, 4 * (32 + 32)) + _pair(4 * 32, 256)


# PEFT 0.18.1 get_peft_model(all-linear) on transformers 5.9.0, meta device: 63504, 56640, 53568, 54528
PEFT_EXPECTED = {
    # 2 MoE layers: q, k, v, o; the shared expert's gate, up, down; shared_expert_gate Linear(h, 1)
    "qwen2_moe": 2 * (_pair(256, 256) + 2 * _pair(256, 128) + _pair(256, 256) + 2 * _pair(256, 384)
                      + _pair(384, 256) + _pair(256, 1)),
    # a dense layer (gate, up, down of 512) and an MoE layer (the shared expert of 128 and the router Linear(h, 8))
    "deepseek_v2": 2 * _mla(96) + 2 * _pair(256, 512) + _pair(512, 256) + 2 * _pair(256, 128) + _pair(128, 256)
    + _pair(256, 8),
    "deepseek_v2_no_q_lora": 2 * _mla(None) + 2 * _pair(256, 512) + _pair(512, 256) + 2 * _pair(256, 128)
    + _pair(128, 256) + _pair(256, 8),
    "deepseek_v3": 2 * _mla(96) + 2 * _pair(256, 512) + _pair(512, 256) + 2 * _pair(256, 128) + _pair(128, 256)}


@pytest.mark.parametrize("name", sorted(PEFT_CONFIGS))
@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_all_linear_adapts_the_models_other_linears(name, framework):
    """PEFT's all-linear (verl's and SkyRL's FSDP default) adapts every nn.Linear but the output head: MLA's q/kv
    projections (q_a/q_b or q_proj, kv_a_proj_with_mqa, kv_b_proj), Qwen2-MoE's shared_expert_gate (r(h + 1) a
    layer) and DeepSeek-V2's router (an nn.Linear in transformers 5.9.0). meshplan counted the four targets' linears
    only (fails before: DeepSeek-V2 33,792 of 56,640, Qwen2-MoE 59,392 of 63,504). Megatron-Bridge's LoRA default
    target_modules name no MLA projection (linear_qkv matches nothing there): its count keeps linear_proj and the
    MLPs."""
    from meshplan.knowledge.model_config import architecture_from_config

    arch = architecture_from_config(PEFT_CONFIGS[name])
    spec = LoraSpec(rank=8, targets=all_linear_targets(arch))  # the PEFT engines' default and all-linear resolve to it
    assert total_adapter_params(arch, spec, lora_engine(framework_card(framework), 3)) == PEFT_EXPECTED[name]
    bridge = LoraSpec(rank=8, targets=[t for t in ALL if t != "linear_qkv" or arch.mla is None])  # its default
    fused = total_adapter_params(arch, bridge, lora_engine(framework_card("megatron-bridge"), 1))
    if arch.mla is not None:  # no MLA projection, no router; the routed experts shared (one adapter a layer)
        assert fused == 2 * _pair(128, 256) + _pair(256, 2 * 512) + _pair(512, 256) + 2 * (
            _pair(256, 2 * 128) + _pair(128, 256))  # o_proj; the dense MLP; the shared expert, the routed experts


def test_all_linear_on_an_mla_model_renders_reads_and_checks_as_every_linear(tmp_path, capsys):
    """verl's FSDP engine: an MLA model's default LoRA is written as all-linear (it was the projections' list, which
    left MLA's q/kv projections out), and a script with model.target_modules=all-linear (verl's default) read back
    as the four targets is every linear the model has, not LORA002 'lora_targets linear_qkv ... has no such linear'
    (fails before)."""
    from meshplan.faces.cli import main

    job, plan = resolve(Request(model="deepseek-v2-lite", framework="verl", num_gpus=8, zero_stage=3, job="lora",
                                global_batch_size=64))
    assert "target_modules=all-linear" in render("verl", job, plan, variant="sft-fsdp").text
    assert any("other linears too: linear_q_proj, linear_kv_down_proj, linear_kv_up_proj, router" in n
               for n in job.notes)
    path = tmp_path / "sft.sh"
    path.write_text("torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer model.path=deepseek-ai/DeepSeek-V2-Lite "
                    "data.train_batch_size=64 model.lora_rank=16 model.target_modules=all-linear\n")
    assert main(["check", "--config", str(path), "--gpu", "h100"]) in (0, 1)
    out = capsys.readouterr().out
    assert "LORA002" not in out and "Traceback" not in out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PEFT_CONFIGS))
def test_peft_counts_the_other_linears_as_meshplan_does(name):
    """The ground truth of test_all_linear_adapts_the_models_other_linears: PEFT's own count, where its venv is."""

    from framework_packages import peft_lora_count

    from meshplan.knowledge.model_config import architecture_from_config

    peft = peft_lora_count({"config": PEFT_CONFIGS[name], "rank": 8, "target_modules": "all-linear"})
    arch = architecture_from_config(PEFT_CONFIGS[name])
    spec = LoraSpec(rank=8, targets=all_linear_targets(arch))
    assert peft["experts"] == 0
    assert total_adapter_params(arch, spec, lora_engine(framework_card("verl"), 3)) == peft["trainable"] \
        == PEFT_EXPECTED[name]


@pytest.mark.slow
def test_peft_counts_what_meshplan_counts_on_a_moe_model_with_a_shared_expert():
    """Ground truth from the packages the engines run: PEFT 0.18.1's get_peft_model(all-linear) on transformers
    5.9.0's GLM-4.5 MoE code (a dense first layer; routed experts as 3D parameters, a shared expert as an MLP of
    linears, the router a parameter), built on the meta device: its trainable parameters equal meshplan's adapter
    count on verl's FSDP engine, none under `.experts.`."""
    from framework_packages import peft_lora_count

    from meshplan.knowledge.model_config import architecture_from_config
    from meshplan.schema.plan import LoraSpec

    config = {"model_type": "glm4_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
              "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
              "vocab_size": 1000, "tie_word_embeddings": False}
    peft = peft_lora_count({"config": config, "rank": 8, "target_modules": "all-linear"})
    arch = architecture_from_config(config)
    spec = LoraSpec(rank=8, targets=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])
    engine = lora_engine(framework_card("verl"), 3)
    assert peft["experts"] == 0
    assert total_adapter_params(arch, spec, engine) == peft["trainable"]


def test_frozen_base_keeps_weights_and_adapters_carry_the_states():
    full = Request(**L8B, tp=2)
    lora = Request(**L8B, tp=2, lora_rank=16)
    job, plan = resolve(lora)
    m_full, m_lora = estimate_memory(*resolve(full)), estimate_memory(job, plan)
    _, _, tensors = with_precision(job, plan)
    adapters = total_adapter_params(job.model, job.lora) / 2  # tp=2, one stage
    states = state_bytes(tensors, adapters, plan.dp)
    s_full, s_lora = m_full.stages[0], m_lora.stages[0]
    assert s_lora.weights_bytes == int(s_full.weights_bytes + states["weights"])
    assert s_lora.gradients_bytes == int(states["gradients"]) and s_lora.optimizer_bytes == int(states["optimizer"])
    assert s_lora.detail["lora_adapter_params"] == int(adapters)
    assert s_lora.activations_bytes > s_full.activations_bytes  # plus the adapters' (tests/test_lora_activations.py)
    assert any(a.startswith("LoRA rank 16") for a in m_lora.assumptions)


def test_frozen_linears_backward_is_two_thirds_plus_the_adapters():
    job, plan = resolve(Request(**L8B, lora_rank=16))
    full_job, full_plan = resolve(Request(**L8B))
    full, lora = [_layer(j, p) for j, p in ((full_job, full_plan), (job, plan))]
    cal = calibration("megatron-bridge")
    t = plan.micro_batch_size * job.seq_length  # tokens of one micro-batch, tp=1
    adapters = [Gemm("a", t, 16, H), Gemm("b", t, QKV, 16), Gemm("a", t, 16, H), Gemm("b", t, H, 16),
                Gemm("a", t, 16, H), Gemm("b", t, 2 * FFN, 16), Gemm("a", t, 16, FFN), Gemm("b", t, H, 16)]
    adapter = gemm_seconds(adapters, cal, job.gpu.bf16_flops, None)
    assert lora.gemm == pytest.approx(full.gemm * 2 / 3 + adapter, rel=1e-12)
    assert lora.fwd_compute - full.fwd_compute == pytest.approx(adapter / TRAINING_PASSES_PER_FORWARD, rel=1e-9)


def _layer(job, plan):
    """One dense layer's times, as estimate_throughput builds them."""
    import meshplan.estimate.perf as perf

    seen = {}
    original = perf.layer_time

    def spy(ctx, moe):
        seen[moe] = original(ctx, moe)
        return seen[moe]

    perf.layer_time = spy
    try:
        estimate_throughput(job, plan)
    finally:
        perf.layer_time = original
    return seen[False]


def test_mfu_counts_the_lora_step_flops():
    job, plan = resolve(Request(**L8B, lora_rank=16))
    spec = LoraSpec(rank=16, targets=ALL)
    s = job.seq_length
    expected = model_flops_per_token(job.model, s) - model_flops_per_token(job.model, 0) / 3 + 6 * 35_651_584
    assert lora_flops_per_token(job.model, s, spec) == pytest.approx(expected, rel=1e-12)
    report = estimate_throughput(job, plan)
    assert report.model_flops_per_step == pytest.approx(expected * s * job.global_batch_size, rel=1e-12)
    assert report.model_flops_per_step < estimate_throughput(*resolve(Request(**L8B))).model_flops_per_step


def test_lora_steps_and_reduces_only_the_adapters():
    full = estimate_throughput(*resolve(Request(**L8B)))
    lora = estimate_throughput(*resolve(Request(**L8B, lora_rank=16)))
    assert lora.breakdown.compute_s < full.breakdown.compute_s
    assert lora.breakdown.other_s < full.breakdown.other_s / 50  # the optimizer steps 0.4% of the parameters
    assert lora.breakdown.dp_comm_s <= full.breakdown.dp_comm_s


@pytest.mark.parametrize(("framework", "zero_stage", "home", "engine", "whose"), [
    ("megatron-bridge", None, "megatron-bridge", "megatron", "Megatron-Bridge's default on its megatron engine"),
    ("verl", 3, "verl", "fsdp", "verl's default on its fsdp engine"),
    ("nemo-automodel", None, "nemo-automodel", "fsdp", "NeMo AutoModel's default on its fsdp engine"),
    ("torchtitan", None, "megatron-bridge", "megatron",
     "Megatron-Bridge's default, as torchtitan has no LoRA on its fsdp engine"),
])
def test_default_rank_note_names_the_default_its_card_entry_and_source(framework, zero_stage, home, engine, whose):
    """A LoRA job that leaves lora_rank out is told which default it got, the card entry it is read from and that
    entry's source, in one sentence every face prints as it is (Job.notes)."""
    card = framework_card(framework)
    entry = framework_card(home).lora[engine]
    rank, said = default_rank(card, zero_stage or 0)
    assert rank == entry.default_rank
    assert said == (f"{rank}, {whose} (cards/frameworks/{home}.yaml lora.{engine}.default_rank; "
                    f"source: {entry.default_rank_why}).")
    if framework != "torchtitan":  # torchtitan's LoRA job is refused (LORA001), its rank still the one said here
        job, _ = resolve(Request(model="llama-3.1-8b", framework=framework, num_gpus=8, job="lora",
                                 zero_stage=zero_stage))
        assert f"lora_rank not given: {said}" in job.notes and job.lora.rank == rank


def test_request_defaults_and_job_kinds():
    job, _ = resolve(Request(**L8B, job="lora"))
    assert job.lora == LoraSpec(rank=32, targets=ALL)  # Megatron-Bridge's LoRA dim, all four targets
    assert any(n.startswith("lora_rank not given: 32") for n in job.notes)
    assert resolve(Request(**L8B, lora_rank=8))[0].lora.rank == 8  # a rank alone makes it a LoRA job
    assert resolve(Request(**L8B))[0].lora is None
    with pytest.raises(MeshplanError, match="not for job=sft"):
        resolve(Request(**L8B, job="sft", lora_rank=8))
    rl, _ = resolve(Request(model="qwen3-8b", framework="verl", num_gpus=8, job="rl", lora_rank=16))
    assert rl.rl is not None and rl.lora.rank == 16  # LoRA RL (verl actor_rollout_ref.model.lora_rank)
    mla, _ = resolve(Request(model="deepseek-v2-lite", framework="megatron-bridge", num_gpus=8, ep=8, job="lora"))
    assert mla.lora.targets == ["linear_proj", "linear_fc1", "linear_fc2"]  # no fused linear_qkv under MLA


def test_lora_on_a_framework_without_it_is_refused_with_the_nearest():
    job, plan = resolve(Request(**{**L8B, "framework": "megatron-core"}, lora_rank=16))
    finding = next(f for f in check_config(job, plan).findings if f.id == "LORA001")
    assert finding.severity == "error" and "megatron-bridge" in finding.fix
    with pytest.raises(MeshplanError, match="LORA001"):
        api.estimate_memory(Request(**{**L8B, "framework": "megatron-core"}, lora_rank=16))
    with pytest.raises(MeshplanError):
        render("megatron-core", job, plan)


def test_validation_rows_fit_once_lora_is_expressed():
    """Megatron-Bridge's Llama-3-70B LoRA perf recipe (8 H100, TP2 PP4 VP20, fp8 current scaling, rank 16 on
    linear_qkv): it ran, so it fits; as full fine-tuning it would need ~198 GiB."""
    row = dict(model="llama-3-70b", framework="megatron-bridge", num_gpus=8, tp=2, pp=4, vpp=20, seq_length=4096,
               global_batch_size=32, micro_batch_size=1, precision="fp8", fp8_recipe="tensorwise", recompute="none")
    assert not api.estimate_memory(Request(**row)).fits
    assert api.estimate_memory(Request(**row, lora_rank=16, lora_targets=["linear_qkv"])).fits


def test_search_floors_stay_floors_and_recommend_finds_lora_layouts():
    """The search prunes on memory floors (search/floors.py, gpu_count.py): for a LoRA job they count the frozen base's
    weights only, so they stay below the estimate, and recommend finds layouts full fine-tuning has none of."""
    from meshplan.search.floors import first_stage_floor
    from meshplan.search.gpu_count import states_floor
    from meshplan.search.space import Fixed, enumerate_layouts, params_split, states_lower_bound

    request = dict(model="llama-3.1-70b", framework="megatron-bridge", num_gpus=8, seq_length=4096,
                   global_batch_size=32)
    job, _ = resolve(Request(**request, lora_rank=16))
    layouts, _ = enumerate_layouts(job, Fixed())
    for lay in layouts[:12]:
        plan = lay.plan(zero_stage=1, recompute="full", micro_batch_size=1, sequence_parallel=lay.tp > 1,
                        cp_comm_type="p2p")
        peak = estimate_memory(job, plan).peak_bytes
        assert first_stage_floor(job, lay, 1, "full", 1, lay.tp > 1) <= peak
        assert states_lower_bound(job, lay, 1, params_split(job)) <= peak
    full_job, _ = resolve(Request(**request))
    assert states_floor(job, (1,), 80 << 30) < states_floor(full_job, (1,), 80 << 30)
    assert not api.recommend(Request(**request)).candidates
    best = api.recommend(Request(**request, lora_rank=16)).candidates[0]
    assert best.memory.fits
    assert estimate_memory(job, best.plan).stages[0].detail["lora_adapter_params"] > 0


def test_frozen_units_gather_their_weights_but_reduce_no_gradient():
    """FSDP2 under LoRA: a frozen unit's backward gathers its parameters (unsharded_param_bytes) beside the prefetched
    unit before it, with no unsharded gradient and no fp32 reduce-scatter input (memory_states.
    frozen_gathered_transient); a preset that does not say unsharded_param_bytes keeps gathered_transient."""
    from meshplan.arithmetic.memory_states import convention, frozen_gathered_transient, gathered_transient

    conv = convention(framework_card("torchtitan"), 3, "0.2.2")[1]
    units = [10.0, 4.0, 30.0]
    assert frozen_gathered_transient(conv, units) == pytest.approx(max(
        conv.unsharded_param_bytes * 10.0, conv.unsharded_param_bytes * 4.0 + conv.prefetched_bytes * 10.0,
        conv.unsharded_param_bytes * 30.0 + conv.prefetched_bytes * 4.0))
    assert frozen_gathered_transient(conv, units) < gathered_transient(conv, units)
    ds = convention(framework_card("deepspeed"), 3)[1]
    assert frozen_gathered_transient(ds, units) == gathered_transient(ds, units)


@pytest.mark.parametrize("framework, zero, says, bridge_clause", [
    ("verl", 3, "verl's target_modules all-linear", False),  # the SFT trainer's FSDP engine: Hugging Face PEFT
    ("skyrl", 3, "SkyRL's target_modules all-linear (SkyRLLoraConfig), Hugging Face PEFT", False),
    ("verl", 1, "verl's lora.target_modules default", True),  # the Megatron engine: Megatron-Bridge's LoRA
    ("megatron-bridge", 1, "Megatron-Bridge's LoRA target_modules default", True),
    ("nemo-automodel", 3, "peft.target_modules wildcards (*.q_proj", False),  # said Megatron-Bridge's default
])
def test_default_targets_are_said_as_the_engine_sets_them(framework, zero, says, bridge_clause):
    """lora_targets left out: the note names the engine's own default (its card's lora.<engine>.default_targets_why).
    A verl or SkyRL FSDP LoRA job said 'Megatron-Bridge's LoRA target_modules default' though Hugging Face PEFT's
    all-linear builds its adapters (what render writes: model.target_modules=all-linear)."""
    job, _ = resolve(Request(model="deepseek-v2-lite", gpu="h100", num_gpus=8, framework=framework, job="lora",
                             zero_stage=zero))
    note = next(n for n in job.notes if n.startswith("lora_targets not given"))
    assert says in note and "linear_qkv skipped: DeepSeek-V2-Lite has none" in note
    assert ("Megatron-Bridge only warns" in note) is bridge_clause


@pytest.mark.parametrize(("gpu", "fp8_bytes"), [("h100", 2), ("b200", 1)])
def test_frozen_base_weights_take_the_fp8_primary_weight_bytes(gpu, fp8_bytes):
    """A LoRA job's frozen base linears under fp8 primary weights (memory_states.fp8_param_gather, the one predicate)
    hold the fp8 weight in place of the bf16 one: 1 B per element, plus on Hopper the transpose Transformer Engine 2.x
    keeps on the parameter for the dgrad GEMM (Float8Tensor.update_usage(columnwise_usage=True) in Linear's forward,
    never freed), none on Blackwell, whose FP8 GEMMs take any layout; the adapters stay bf16. Without fp8 primary
    weights an fp8 job keeps the bf16 weight and an fp8 copy beside it. The output layer, Megatron-Core's
    ColumnParallelLinear and no Transformer Engine module, stays bf16 either way (memory_stage.fp8_weight_params)."""
    linear = LAYERS * (H * QKV + H * H + 2 * H * FFN + FFN * H)  # the decoder's linear weights (TP 1), no output layer
    base = dict(L8B, gpu=gpu, seq_length=4096, micro_batch_size=1, tp=1, recompute="full", lora_rank=16)
    bf16 = estimate_memory(*resolve(Request(**base, precision="bf16"))).stages[0].weights_bytes
    primary = estimate_memory(*resolve(Request(**base, precision="fp8", fp8_recipe="delayed",
                                               fp8_param_gather=True))).stages[0].weights_bytes
    copy = estimate_memory(*resolve(Request(**base, precision="fp8", fp8_recipe="delayed",
                                            fp8_param_gather=False))).stages[0].weights_bytes
    assert primary - bf16 == (fp8_bytes - 2) * linear
    assert copy - bf16 == fp8_bytes * linear
