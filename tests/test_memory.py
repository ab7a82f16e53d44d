"""Memory estimator: exact formula cases (ZeRO Figure 1, Korthikanti Table 2, the 1F1B schedule) and behaviour."""

import json

import pytest

from meshplan.arithmetic.activations import MOE_BYTES, Layout, attention_saves, layer_activations, shape_of
from meshplan.arithmetic.memory_states import (
    bytes_per_param,
    convention,
    gathered_transient,
    memory_card,
    optimizer_sharded,
    state_bytes,
)
from meshplan.arithmetic.schedule import compute_balanced_counts, in_flight, megatron_stages
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory, memory_summary
from meshplan.faces.cli import main
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.hardware import get_gpu
from meshplan.knowledge.model_counts import layer_params
from meshplan.request.resolve import carry_cards
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan

GIB = 1 << 30


def job_for(model: str | Architecture, num_gpus: int, framework: str = "megatron-core", seq: int = 4096,
            gbs: int = 256, precision: str = "bf16") -> Job:
    arch = resolve_model(model) if isinstance(model, str) else model
    return carry_cards(Job(model=arch, gpu=get_gpu("h100"), num_gpus=num_gpus, gpus_per_node=8, seq_length=seq,
                           global_batch_size=gbs, precision=precision, framework=framework))


# --------------------------------------------------------------------------- model states


@pytest.mark.parametrize(("stage", "exact", "figure"), [
    (1, 31.40625e9, 31.4), (2, 16.640625e9, 16.6), (3, 1.875e9, 1.9),
])
def test_zero_paper_figure_1(stage, exact, figure):
    """Rajbhandari et al. 2019, Figure 1: 7.5B parameters, 64 data-parallel GPUs, K = 12 (its baseline, 120 GB
    unsharded, is fp16 mixed precision without ZeRO: DeepSpeed's bf16 ZeRO-0 is BF16_Optimizer, below)."""
    _, _, tensors = convention(framework_card("deepspeed"), stage)
    total = sum(state_bytes(tensors, 7.5e9, 64).values())
    assert total == pytest.approx(exact, rel=1e-12)
    assert round(total / 1e9, 1) == figure


def test_deepspeed_bf16_zero0_is_bf16_optimizer():
    """DeepSpeed's bf16 without ZeRO wraps the optimizer in BF16_Optimizer (runtime/engine.py get_data_types: an fp32
    grad_accum_dtype): bf16 weights and grads 2 + 2, an fp32 gradient buffer over every parameter 4, and the fp32
    master and Adam moments over this rank's dp partition, 12 / dp (runtime/bf16_optimizer.py __init__)."""
    _, _, tensors = convention(framework_card("deepspeed"), 0)
    assert bytes_per_param(tensors, 8) == 2 + 2 + 4 + 12 / 8
    assert bytes_per_param(tensors, 1) == 20  # one rank: the same 20 B as nanotron's fp32 accumulation
    by_class = state_bytes(tensors, 1e9, 4)
    assert by_class["gradients"] == 6e9 and by_class["optimizer"] == 3e9
    # so its step updates the dp shard and all-gathers the weights, as ZeRO-1 does (estimate/perf.step_sync)
    assert optimizer_sharded(framework_card("deepspeed"), 0)
    assert not optimizer_sharded(framework_card("megatron-core"), 0) and not optimizer_sharded(
        framework_card("nanotron"), 0)
    assert all(optimizer_sharded(framework_card(name), 1) for name in ("deepspeed", "megatron-core", "nanotron"))


def test_megatron_distributed_optimizer_bytes_per_param():
    """Megatron-LM dist_optimizer.md: bf16 params + fp32 grads = 18 B, or 6 + 12/d distributed."""
    assert bytes_per_param(convention(framework_card("megatron-core"), 0)[2], 8) == 18
    assert bytes_per_param(convention(framework_card("megatron-core"), 1)[2], 8) == 6 + 12 / 8
    assert bytes_per_param(convention(framework_card("nanotron"), 0)[2], 8) == 20  # playbook "BF16 w/ FP32 grad acc"
    assert convention(framework_card("megatron-core"), 3)[0] == "megatron_fsdp"
    assert convention(framework_card("verl"), 3)[0] == "fsdp2_hf"
    with pytest.raises(MeshplanError, match="zero_stage"):
        convention(framework_card("nanotron"), 3)


def test_expert_parameters_shard_over_expert_data_parallel():
    """Routed experts / (ep*etp) per GPU; their optimizer states over expert-dp = world/(pp*ep*etp)."""
    arch = resolve_model("mixtral-8x7b")
    plan = Plan(tp=1, pp=1, ep=8, dp=8, zero_stage=1, micro_batch_size=1)
    stage = estimate_memory(job_for(arch, 8), plan).stages[0]
    routed = sum(layer_params(arch, i)["routed_experts"] for i in range(arch.num_layers))
    dense = stage.detail["params_on_gpu"] - routed / 8
    # expert-dp = 8 / (1*8*1) = 1: expert master weights and moments are not sharded; dense ones over dp=8
    assert stage.optimizer_bytes == pytest.approx(12 * dense / 8 + 12 * routed / 8, rel=1e-6)
    half = estimate_memory(job_for(arch, 8), plan.model_copy(update={"ep": 4})).stages[0]
    assert half.detail["params_on_gpu"] - stage.detail["params_on_gpu"] == pytest.approx(routed / 8, rel=1e-6)


# --------------------------------------------------------------------------- activations: Korthikanti et al. 2022


def gpt_22b() -> Architecture:
    """The paper's 22B model: h 6144, 64 heads, 48 layers, GeLU MLP of 4h, learned positions, V 51200."""
    return Architecture(name="gpt 22B", model_type="gpt2", num_layers=48, hidden_size=6144, ffn_hidden_size=4 * 6144,
                        num_attention_heads=64, num_kv_heads=64, head_dim=96, vocab_size=51200, gated_mlp=False,
                        activation="gelu", norm_type="layernorm", learned_position_embeddings=2048)


SBH = 2048 * 4 * 6144  # s 2048, b 4 (Table 5's 22B batch), h 6144


@pytest.mark.parametrize(("sp", "recompute", "expected"), [
    (False, "none", SBH * 10 + SBH * 24 // 8 + 5 * 64 * 2048 * 2048 * 4 // 8),  # sbh(10 + 24/t + 5as/(ht))
    (True, "none", SBH * 34 // 8 + 5 * 64 * 2048 * 2048 * 4 // 8),  # sbh(34/t + 5as/(ht))
    (False, "selective", SBH * 10 + SBH * 24 // 8),  # sbh(10 + 24/t)
    (True, "selective", SBH * 34 // 8),  # sbh*34/t
    (False, "full", 2 * SBH),  # layer input only
])
def test_korthikanti_table_2_per_layer(sp, recompute, expected):
    lay = Layout(tokens=2048 * 4, seq_kv=2048, tp=8, sp=sp, etp=1, flash=False, dropout=True,
                 swiglu_unfused=False, fp8=False)
    got = sum(layer_activations(shape_of(gpt_22b()), lay, False, recompute).values())
    assert got == expected


def test_korthikanti_figure_1_totals():
    """Figure 1, 22B on 8 GPUs: 59.25 GiB of activations with TP, 9.56 GiB with SP + selective recompute."""
    shape = shape_of(gpt_22b())
    base = Layout(tokens=8192, seq_kv=2048, tp=8, sp=False, etp=1, flash=False, dropout=True,
                  swiglu_unfused=False, fp8=False)
    tp_only = 48 * sum(layer_activations(shape, base, False, "none").values())
    present = 48 * sum(layer_activations(shape, base._replace(sp=True), False, "selective").values())
    assert round(tp_only / GIB, 2) == 59.25
    assert round(present / GIB, 2) == 9.56


def test_gqa_swiglu_and_flash_change_the_per_layer_terms():
    llama = shape_of(resolve_model("llama-3.1-8b"))  # h 4096, 32 heads, 8 KV heads of 128, f 14336, rope
    lay = Layout(tokens=4096, seq_kv=4096, tp=1, sp=False, etp=1, flash=True, dropout=False,
                 swiglu_unfused=False, fp8=False)
    acts = layer_activations(llama, lay, False, "none")
    t, h, kv = 4096, 4096, 8 * 128
    # QKV input + Q,K,V + rotated Q,K copies + flash lse + attention output
    assert acts["attention"] == 2 * t * h + 2 * t * (h + 2 * kv) + 2 * t * (h + kv) + 4 * t * 32 + 2 * t * h
    assert acts["mlp"] == 2 * t * h + 2 * t * 2 * 14336 + 2 * t * 14336  # fc1 input, gate+up, fc2 input
    assert acts["norm_inputs"] == 2 * 2 * t * h


def test_megatron_recompute_modules_drop_their_saved_tensors():
    """recompute_modules, per module on DeepSeek-V3 (MLA, MoE 256 x top-8 of 2048, one shared expert of 2048) at
    t tokens, tp=1, flash, fused SwiGLU: what each module's recompute drops from the no-recompute layer."""
    ds = shape_of(resolve_model("deepseek-v3"))
    t, h, a = 4096, 7168, 128
    lay = Layout(tokens=t, seq_kv=t, tp=1, sp=False, etp=1, flash=True, dropout=False, swiglu_unfused=False,
                 fp8=False)
    none = {moe: layer_activations(ds, lay, moe, "none") for moe in (False, True)}

    def drop(modules, moe):
        acts = layer_activations(ds, lay, moe, "selective", modules)
        return {k: none[moe][k] - acts[k] for k in none[moe]}

    assert drop(("core_attn",), True) == {"norm_inputs": 0, "attention": 4 * t * a, "moe": 0}  # flash's lse
    assert drop(("mla_up_proj",), True)["attention"] == 2 * t * (2 * a * 192 + a * 128)  # per-head Q, K, V
    assert drop(("layernorm",), True) == {"norm_inputs": 0, "attention": 2 * t * h, "moe": 2 * t * h}
    assert drop(("moe_act",), True)["moe"] == 2 * t * 8 * 2048  # the routed experts' fc2 inputs
    assert drop(("shared_experts",), True)["moe"] == 2 * t * 2 * 2048 + 2 * t * 2048
    assert layer_activations(ds, lay, True, "selective", ("moe",))["moe"] == 2 * t * h  # the layer input only
    assert layer_activations(ds, lay, False, "selective", ("mlp",))["mlp"] == 2 * t * h
    assert drop(("mlp",), True)["moe"] == 0 and drop(("moe",), False)["mlp"] == 0  # each to its own layer kind
    both = drop(("core_attn", "mla_up_proj"), True)["attention"]
    assert both == drop(("core_attn",), True)["attention"] + drop(("mla_up_proj",), True)["attention"]


def _tt_layout(tokens: int, **kw) -> Layout:
    """torchtitan 0.3's convention (fsdp2_chunked_loss): flash attention, no dropout, unfused SwiGLU, its MoE and
    attention saves (complex RoPE rows, MLA's V view, flex's logsumexp and max)."""
    conv = memory_card().conventions["fsdp2_chunked_loss"]
    return Layout(**{"tokens": tokens, "seq_kv": tokens, "tp": 1, "sp": False, "etp": 1, "flash": True,
                     "dropout": False, "swiglu_unfused": True, "fp8": False, "moe": MOE_BYTES[conv.moe_activations],
                     "attn": attention_saves(conv), **kw})


def test_op_sac_llama_keeps_wqkv_attention_w1_w2():
    """torchtitan op-level SAC on a Llama block: mm 1 wqkv kept, 2 wo recomputed, 3 w1 kept, 4 w3 recomputed,
    5 w2 kept; attention output + fp32 lse kept; norms, RoPE and SiLU recomputed; the block input kept."""
    llama = shape_of(resolve_model("llama-3.1-8b"))
    t, h, kv, f = 8192, 4096, 8 * 128, 14336
    acts = layer_activations(llama, _tt_layout(t), False, "op_sac")
    assert acts == {"layer_input": 2 * t * h, "attention": 2 * t * (h + 2 * kv) + 2 * t * h + 4 * t * 32,
                    "mlp": 2 * t * f + 2 * t * h}
    # 8.03u of u = t*h*2, where the fake-tensor count of torchtitan's code is 8.0312u (fake_tensor_memory.json)
    assert sum(acts.values()) == 537919488
    # fp8 (torchao's Float8Linear): the policy sees aten.mm on Float8TrainingTensor arguments, counted and kept as bf16
    assert layer_activations(llama, _tt_layout(t, fp8=True), False, "op_sac") == acts
    # torchtitan <= 0.2 (wq, wk, wv): mm 1 wq kept, 2 wk recomputed, 3 wv kept, 4 wo recomputed, w1, w3, w2 as above
    separate = layer_activations(llama, _tt_layout(t, qkv_fused=False), False, "op_sac")
    assert sum(acts.values()) - sum(separate.values()) == 2 * t * kv  # K no longer kept


def test_op_sac_deepseek_v3_mla_dense_and_moe():
    """MLA call order wq_a, wq_b, wkv_a, wkv_b, wo: q and kv latents and wo kept; the dense MLP after five mms
    keeps w3 only; a MoE layer keeps topk and the shared expert's w3, recomputes the router gate and the routed
    experts (_grouped_mm is in no save list), and keeps both all-to-alls once experts are spread (ep > 1)."""
    ds = shape_of(resolve_model("deepseek-v3"))  # h 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64, v 128
    t, h = 16384, 7168
    attn = 2 * t * 1536 + 2 * t * (512 + 64) + 2 * t * 128 * 128 + 4 * t * 128 + 2 * t * h
    dense = layer_activations(ds, _tt_layout(t), False, "op_sac")
    assert dense == {"layer_input": 2 * t * h, "attention": attn, "mlp": 2 * t * 18432}
    moe = layer_activations(ds, _tt_layout(t), True, "op_sac")
    assert moe == {"layer_input": 2 * t * h, "attention": attn, "moe": t * 8 * 12 + 2 * t * 2048}
    ep8 = layer_activations(ds, _tt_layout(t, ep=8), True, "op_sac")
    assert ep8["moe"] - moe["moe"] == 2 * 2 * t * 8 * h


def test_selective_means_the_frameworks_own_selective():
    """`recompute=selective` is torchtitan's op-level SAC on torchtitan (its card), Megatron's core-attention
    recompute on Megatron-Core; the op-SAC layer in its backward holds again what it rebuilt."""
    job = job_for("llama-3.1-8b", 8, framework="torchtitan", seq=8192, gbs=8)
    plan = Plan(dp=8, zero_stage=3, micro_batch_size=1, recompute="selective")
    stage = estimate_memory(job, plan).stages[0]
    arch = job.model
    lay = _tt_layout(8192)
    per = {mode: sum(layer_activations(shape_of(arch), lay, False, mode).values()) for mode in ("op_sac", "none")}
    assert stage.detail["layer_activations"] == int(arch.num_layers * per["op_sac"])
    assert stage.detail["recompute_working_layer"] == int(per["none"] - per["op_sac"])
    mc = estimate_memory(carry_cards(job.model_copy(update={"framework": "megatron-core"})),
                         Plan(dp=8, recompute="selective"))
    assert "recompute_working_layer" not in mc.stages[0].detail


# --------------------------------------------------------------------------- schedule and stages


def test_1f1b_stage_r_holds_min_m_and_p_minus_r():
    assert [in_flight(r, 4, 1, 8)[0] for r in range(4)] == [4, 3, 2, 1]
    assert [in_flight(r, 4, 1, 2)[0] for r in range(4)] == [2, 2, 2, 1]
    assert in_flight(0, 1, 1, 64) == (1,)


def test_interleaved_warmup_matches_megatron():
    # rank 0, p 4, v 2, m 8: warm-up (4-0-1)*2 + (2-1)*4 = 10 forwards, +1 in steady state = 11 chunks,
    # i.e. L*(1 + (p-1)/(p*v)) layers: Korthikanti's interleaving factor.
    assert in_flight(0, 4, 2, 8) == (7, 4)
    assert sum(in_flight(0, 4, 2, 8)) / 8 == 1 + 3 / 8
    assert in_flight(3, 4, 2, 8) == (4, 1)
    assert in_flight(0, 4, 2, 1) == (1, 1)  # capped at m*v: every forward runs before the first backward


def test_stage_layer_split_even_uneven_and_virtual():
    even = megatron_stages(32, 4, 1, None, None)
    assert [len(s[0]) for s in even.chunks] == [8, 8, 8, 8] and not even.warnings and even.head_rank == 3
    stages = megatron_stages(32, 4, 1, 6, 6).chunks
    assert [len(s[0]) for s in stages] == [6, 10, 10, 6]
    assert stages[1][0][0] == 6 and stages[3][0][-1] == 31
    stages = megatron_stages(16, 2, 2, None, None).chunks
    assert stages[0] == (tuple(range(0, 4)), tuple(range(8, 12)))
    assert stages[1] == (tuple(range(4, 8)), tuple(range(12, 16)))
    assert any("meshplan check" in w for w in megatron_stages(30, 4, 1, None, None).warnings)
    with pytest.raises(EstimateBlocked, match=r"^PP001: 32 layers do not split evenly over pp=64"):
        estimate_memory(job_for("llama-3.1-8b", 64), Plan(pp=64))


def playbook_1b() -> Architecture:
    """The Ultra-Scale Playbook sweep's 1B model: 16 layers, h 2048, 32 heads (MHA), ffn 8192, V 131072, tied."""
    return Architecture(name="playbook 1B", model_type="llama", num_layers=16, hidden_size=2048,
                        ffn_hidden_size=8192, num_attention_heads=32, num_kv_heads=32, head_dim=64,
                        vocab_size=131072, tie_word_embeddings=True)


def test_nanotron_balances_layers_by_compute_with_the_output_layer():
    """nanotron build_model: decoder layer cost c = 4*32*64*2048 + 3*8192*2048, lm_head 131072*2048 = 4c;
    total 20c; a rank takes blocks until its running cost exceeds total*(r+1)/pp."""
    c = 4 * 32 * 64 * 2048 + 3 * 8192 * 2048
    assert 131072 * 2048 == 4 * c
    assert compute_balanced_counts(16, 2, c, 4 * c) == ((11, 5), 1)  # threshold 10c: layer 11 crosses it
    assert compute_balanced_counts(16, 4, c, 4 * c) == ((6, 5, 5, 0), 3)  # the last rank holds only the lm_head
    assert compute_balanced_counts(16, 2, c, 0) == ((9, 7), 1)  # without a head: cost 8c is not > 8c until layer 9
    # a head heavier than the layers takes rank 0's turn: the later ranks get no block, the head stays on rank 0
    assert compute_balanced_counts(4, 4, 1, 100) == ((4, 0, 0, 0), 0)
    plan = Plan(tp=1, pp=2, dp=4, zero_stage=1, micro_batch_size=2)
    nano = estimate_memory(job_for(playbook_1b(), 8, framework="nanotron"), plan)
    assert [s.layers for s in nano.stages] == [11, 5]
    assert "balanced by compute" in " ".join(nano.assumptions)
    even = estimate_memory(job_for(playbook_1b(), 8), plan)
    assert [s.layers for s in even.stages] == [8, 8]  # Megatron splits evenly
    told = estimate_memory(job_for(playbook_1b(), 8, framework="nanotron"),
                           plan.model_copy(update={"first_stage_layers": 7}))
    assert [s.layers for s in told.stages] == [7, 9]  # explicit stage sizes win


def test_allocator_reserve_covers_transient_memory_only():
    """The caching allocator's reserve: allocator_reserve_fraction of what is freed and re-allocated each step."""
    card = memory_card()
    stage = estimate_memory(job_for("llama-3.1-8b", 8), Plan(tp=2, dp=4, sequence_parallel=True)).stages[0]
    reserve = int(card.allocator_reserve_fraction * stage.activations_bytes)
    assert stage.detail["allocator_reserve"] == pytest.approx(reserve, abs=1)
    assert stage.other_bytes == pytest.approx(card.fixed_overhead_bytes + card.cuda_context_bytes + reserve, abs=2)
    fsdp = estimate_memory(job_for("llama-3.1-8b", 8, framework="torchtitan"), Plan(dp=8, zero_stage=3)).stages[0]
    assert fsdp.detail["allocator_reserve"] == pytest.approx(int(
        card.allocator_reserve_fraction * (fsdp.activations_bytes + fsdp.detail["gathered_layers"])), abs=1)


def test_embedding_first_output_last_and_tied_copy():
    untied = estimate_memory(job_for("llama-3.1-70b", 32), Plan(tp=8, pp=4, dp=1, sequence_parallel=True))
    first, middle, last = untied.stages[0], untied.stages[1], untied.stages[-1]
    vocab = 129024  # 128256 padded to a multiple of 128*tp = 1024
    assert first.detail["embedding_params"] == vocab * 8192 // 8
    assert last.detail["output_layer_params"] == vocab * 8192 // 8
    assert "embedding_params" not in middle.detail and "output_layer_params" not in middle.detail
    assert last.detail["logits_and_loss"] > 0 and "logits_and_loss" not in first.detail
    arch = resolve_model("llama-2-7b").model_copy(update={"tie_word_embeddings": True})
    one = estimate_memory(job_for(arch, 8), Plan(tp=1, pp=1, dp=8)).stages[0]
    two = estimate_memory(job_for(arch, 8), Plan(tp=1, pp=2, dp=4)).stages[-1]
    assert one.detail["output_layer_params"] == 0  # tied, one stage: a single copy
    assert two.detail["output_layer_params"] > 0  # tied, pp > 1: the last stage keeps its own copy


def test_mtp_sits_on_the_last_stage():
    report = estimate_memory(job_for("deepseek-v3", 1024), Plan(tp=2, pp=16, ep=64, dp=32, sequence_parallel=True,
                                                                recompute="full", first_stage_layers=3,
                                                                last_stage_layers=2))
    assert "mtp_params" in report.stages[-1].detail
    assert all("mtp_params" not in s.detail for s in report.stages[:-1])
    # 256 sequences / (mbs 1 * dp 32) = 8 micro-batches < pp 16: stage 0 holds all 8, not 16
    assert report.stages[0].detail["microbatches_in_flight"] == 8


# --------------------------------------------------------------------------- behaviour


def test_recompute_and_pipeline_reduce_activations():
    job = job_for("llama-3.1-70b", 64, seq=8192)
    base = Plan(tp=8, pp=4, dp=2, sequence_parallel=True)
    none = estimate_memory(job, base).stages[0].activations_bytes
    full = estimate_memory(job, base.model_copy(update={"recompute": "full"})).stages[0].activations_bytes
    partial = estimate_memory(job, base.model_copy(update={"recompute": "full", "recompute_layers": 10}))
    assert full < partial.stages[0].activations_bytes < none
    # stage r of 1F1B holds fewer micro-batches: activations fall along the pipeline (logits aside)
    stages = estimate_memory(job, base).stages
    assert stages[0].detail["layer_activations"] > stages[1].detail["layer_activations"] > \
        stages[2].detail["layer_activations"]


def test_megatron_uniform_recompute_in_chunks_of_n_layers():
    """recompute_method=uniform with recompute_layers N (Megatron's recompute_num_layers): each chunk of N layers of
    a stage keeps only its input, and its backward rebuilds all N layers at once; N=1 (and no method) is every layer
    on its own; block with N is the first N layers of the stage; uniform and full take the same recompute time."""
    from meshplan.estimate.perf import estimate_throughput

    job = job_for("llama-3.1-70b", 64, seq=8192)  # 80 layers, pp=4: 20 per stage
    full = Plan(tp=8, pp=4, dp=2, sequence_parallel=True, recompute="full")
    uniform4 = full.model_copy(update={"recompute_method": "uniform", "recompute_layers": 4})
    base, chunked = (estimate_memory(job, p).stages[0].detail for p in (full, uniform4))
    layer_input = base["layer_activations"] / (20 * base["microbatches_in_flight"])
    assert chunked["layer_activations"] == int(5 * layer_input * chunked["microbatches_in_flight"])  # 20/4 inputs
    assert chunked["recompute_working_layer"] == 4 * base["recompute_working_layer"]
    one = full.model_copy(update={"recompute_method": "uniform", "recompute_layers": 1})
    assert estimate_memory(job, one).stages[0].total_bytes == estimate_memory(job, full).stages[0].total_bytes
    block = full.model_copy(update={"recompute_method": "block", "recompute_layers": 4})
    assert estimate_memory(job, block).stages[0].total_bytes == \
        estimate_memory(job, full.model_copy(update={"recompute_layers": 4})).stages[0].total_bytes
    timed = [estimate_throughput(job, p).breakdown.recompute_s for p in (uniform4, full)]
    assert timed[0] == timed[1] > 0


def test_fsdp_shards_everything_and_gathers_layers():
    job = job_for("llama-3.1-8b", 8, framework="torchtitan")
    sharded = estimate_memory(job, Plan(dp=8, zero_stage=3)).stages[0]
    job1 = job_for("llama-3.1-8b", 1, framework="torchtitan")
    whole = estimate_memory(job1, Plan(dp=1, zero_stage=3)).stages[0]
    assert sharded.weights_bytes == pytest.approx(whole.weights_bytes / 8, rel=1e-6)
    assert sharded.optimizer_bytes == pytest.approx(whole.optimizer_bytes / 8, rel=1e-6)
    assert sharded.detail["gathered_layers"] > 0


def test_gathered_transient_is_the_worst_unit_at_its_backward_peak():
    """FSDP2 (torch 2.13 fully_shard post_backward + foreach_reduce): a unit's bf16 grads 2 + their fp32
    reduce-scatter copy 4, plus 2 per parameter of the unit prefetched before it; Megatron-FSDP (6) and ZeRO-3 (4)
    count the unit and the prefetched one at the same bytes."""
    card = memory_card()
    units = [10.0, 100.0, 50.0]
    assert gathered_transient(card.conventions["fsdp2"], units) == max(6 * 10, 6 * 100 + 2 * 10, 6 * 50 + 2 * 100)
    # torchtitan 0.3.0: the chunked loss's per-chunk backward clears FSDP's post-forward order, so no backward prefetch
    assert gathered_transient(card.conventions["fsdp2_chunked_loss"], units) == 600
    assert gathered_transient(card.conventions["megatron_fsdp"], units) == 6 * 100 + 6 * 50  # 100 then 50
    assert gathered_transient(card.conventions["deepspeed"], units) == 4 * 100 + 4 * 50
    assert gathered_transient(card.conventions["fsdp2"], []) == 0


def test_fsdp2_gathered_units_include_embedding_and_output_layer():
    """torchtitan, one stage, dp=8 ZeRO-3: units embedding, 32 decoder layers, output layer + final norm; the
    output layer (vocab*h = 525M) is the biggest. 0.2 (fsdp2, walked) peaks in its unchunked loss, the output layer
    gathered in bf16 (2 per parameter) and nothing prefetched yet; in 0.3.0 it reduces in the chunked loss's last
    chunk, gathered, its accumulated fp32 gradient beside the fp32 reduce input and output: 2 + 4 + 4 + 4/8 per
    parameter (tests/test_fsdp_step_peak.py)."""
    arch = resolve_model("llama-3.1-8b")
    job = job_for(arch, 8, framework="torchtitan", seq=8192, gbs=8)
    stage = estimate_memory(job.model_copy(update={"framework_version": "0.2"}), Plan(dp=8, zero_stage=3)).stages[0]
    head = 128256 * 4096 + 4096
    assert stage.detail["gathered_layers"] == int(2 * head)
    assert estimate_memory(job, Plan(dp=8, zero_stage=3)).stages[0].detail["gathered_layers"] == int(10.5 * head)


def test_torchtitan_chunked_loss_and_unchunked_fsdp2_loss():
    """torchtitan 0.3.0 ChunkedLossWrapper: one of 8 sequence chunks at 14 bytes per logit (bf16 logits 2 + saved
    fp32 log-softmax 4 + nll grad 4 + log-softmax grad 4) + final-norm input and output 4 + bf16 chunks and the
    fp32 GradAccumulator 6 per token x h at micro-batch 2 (4 at micro-batch 1, whose chunks are views); the fsdp2
    preset (torchtitan <= 0.2) stays unchunked, at its backward peak 12 (saved fp32 log-softmax 4 + nll grad 4 +
    log-softmax grad 4), and KempnerForge's (fsdp2_kempnerforge: no upcast, the logits held) at 8 (bf16 logits 2 +
    saved log-softmax 2 + nll grad 2 + log-softmax grad 2)."""
    arch = resolve_model("llama-3.1-8b")
    tokens, vocab, h = 8192 * 2, 128256, 4096
    titan = estimate_memory(job_for(arch, 8, framework="torchtitan", seq=8192, gbs=16),
                            Plan(dp=8, zero_stage=3, micro_batch_size=2)).stages[0]
    assert convention(framework_card("torchtitan"), 3)[0] == "fsdp2_chunked_loss"
    assert convention(framework_card("kempnerforge"), 3)[0] == "fsdp2_kempnerforge"
    assert titan.detail["logits_and_loss"] == int(14 * tokens / 8 * vocab + 4 * tokens * h + 6 * tokens * h)
    kempner = estimate_memory(job_for(arch, 8, framework="kempnerforge", seq=8192, gbs=16),
                              Plan(dp=8, zero_stage=3, micro_batch_size=2)).stages[0]
    assert kempner.detail["logits_and_loss"] == int(8 * tokens * vocab + 4 * tokens * h)
    # tp=2 with sequence parallelism, micro-batch 1: logits split by the vocab-parallel loss, the norm tensors by SP,
    # the chunked loss's accumulator of the hidden-state gradient replicated, its chunks views of the norm output
    tp2 = estimate_memory(job_for(arch, 8, framework="torchtitan", seq=8192, gbs=8),
                          Plan(tp=2, dp=4, zero_stage=3, sequence_parallel=True, micro_batch_size=1)).stages[0]
    assert tp2.detail["logits_and_loss"] == int(14 * 8192 / 8 * vocab / 2 + 4 * 8192 * h / 2 + 4 * 8192 * h)


def test_fp8_adds_weight_copies_and_shrinks_linear_inputs():
    plan = Plan(tp=4, pp=1, dp=2, sequence_parallel=True)
    bf16 = estimate_memory(job_for("llama-3.1-8b", 8), plan).stages[0]
    fp8 = estimate_memory(job_for("llama-3.1-8b", 8, precision="fp8"), plan).stages[0]
    assert fp8.weights_bytes > bf16.weights_bytes and fp8.detail["fp8_weight_copies"] > 0
    assert fp8.activations_bytes < bf16.activations_bytes


def test_blocking_rules_stop_the_estimate_and_other_rules_leave_a_note():
    with pytest.raises(EstimateBlocked, match=r"^TP001: tp=128 does not divide 32 attention heads"):
        estimate_memory(job_for("llama-3.1-8b", 128), Plan(tp=128, dp=1))
    with pytest.raises(EstimateBlocked, match=r"^EP002: ep=16 does not divide 8 routed experts"):
        estimate_memory(job_for("mixtral-8x7b", 16), Plan(ep=16, dp=16))
    with pytest.raises(EstimateBlocked, match=r"^WS003: dp=3 was given"):
        estimate_memory(job_for("llama-3.1-8b", 64), Plan(tp=2, dp=3))
    # PP001 (32 layers over pp=3) is an error of `meshplan check`: the estimate refuses it too, with its fix.
    with pytest.raises(EstimateBlocked, match=r"^PP001: 32 layers do not split evenly over pp=3") as info:
        estimate_memory(job_for("llama-3.1-8b", 24), Plan(pp=3, dp=8))
    assert "first_stage_layers=" in info.value.fix


def test_report_fits_peak_and_summary_agree():
    report = estimate_memory(job_for("llama-3.1-70b", 8), Plan(tp=8, dp=1, sequence_parallel=True))
    assert not report.fits and report.headroom_bytes < 0  # 70B on one node without sharding states
    assert report.peak_bytes == max(s.total_bytes for s in report.stages)
    for s in report.stages:
        assert s.total_bytes == (s.weights_bytes + s.gradients_bytes + s.optimizer_bytes + s.activations_bytes
                                 + s.other_bytes)
    summary = memory_summary(report)
    assert summary.peak_bytes == report.peak_bytes and summary.fits is False
    assert len(report.assumptions) >= 8 and any("Korthikanti" in a for a in report.assumptions)


def test_cli_json_and_batch(tmp_path, capsys):
    assert main(["memory", "llama-3.1-8b", "--num-gpus", "8", "--tp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("stages", "peak_bytes", "capacity_bytes", "fits", "headroom_bytes", "assumptions"):
        assert key in out
    for key in ("stage", "layers", "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                "other_bytes", "total_bytes"):
        assert key in out["stages"][0]
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"model": "llama-3.1-8b", "num_gpus": 8}\n{"model": "llama-3.1-8b", "tp": 64}\nnot json\n')
    assert main(["memory", "--batch", str(batch)]) == 2  # a line failed
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["line"] for line in lines] == [1, 2, 3]
    assert "peak_bytes" in lines[0] and "tp=64" in lines[1]["error"] and "error" in lines[2]


def test_readable_table(capsys):
    assert main(["memory", "llama-3.1-70b", "--num-gpus", "64", "--tp", "8", "--pp", "4"]) == 0
    out = capsys.readouterr().out
    assert "stage" in out and "peak" in out and "assumptions" in out


def test_per_layer_activations_agree_with_torchtitans_code():
    """Re-reads the FakeTensorMode counts of torchtitan's own Llama-3.1-8B and DeepSeek-V3 blocks
    (bench/data/fake_tensor_memory.json) and recomputes meshplan's per-layer bytes: op-level SAC (0.3.0's
    default and 0.2.2's "op") and full AC within 5% on every layer kind; no recompute and 0.2.2's every-second-
    layer option within 0.1% (left out: fp32 rstd per norm, MoE expert offsets; test_activations_torchtitan.py)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    from fake_tensor_memory import ARCHS, catalog, meshplan_layer

    data = json.loads((root / "bench" / "data" / "fake_tensor_memory.json").read_text())
    tolerance = {"selective": 5.0, "selective-op@0.2.2": 5.0, "full": 5.0, "none": 0.1}
    checked = 0
    for row in data["layers"]:
        if row["policy"] not in tolerance:
            continue
        spec = ARCHS[row["arch"]]
        ours = meshplan_layer(catalog(spec["model"]), spec, row["meshplan_recompute"], row["layer"] == "MoE")
        diff = 100 * (ours - row["framework_bytes"]) / row["framework_bytes"]
        assert abs(diff) <= tolerance[row["policy"]], (row["arch"], row["layer"], row["policy"], diff)
        checked += 1
    assert checked == 12
    # 0.2.2's every-second-block option, as selective_ac_option="2" over the four layers the harness ran: half no
    # recompute, half full AC (exact)
    for row in (r for r in data["layers"] if r["policy"] == "selective-2@0.2.2"):
        spec = ARCHS[row["arch"]]
        ours = meshplan_layer(catalog(spec["model"]), spec, "selective", row["layer"] == "MoE", "2", 4)
        diff = 100 * (ours - row["framework_bytes"]) / row["framework_bytes"]
        assert abs(diff) <= 0.1, (row["arch"], row["layer"], diff)


def test_every_nth_block_selective_of_torchtitan_0_2():
    """selective_ac_option N: the k-th block built on a rank (k from 1, counted over its virtual chunks) is fully
    checkpointed when k % N == 0, the others keep everything (torchtitan 0.2.2 _apply_layer_sac); N=1 is full AC,
    in bytes and in recompute time; the recomputed block's working set is counted as under full AC."""
    from meshplan.estimate.perf import estimate_throughput

    job = job_for("llama-3.1-8b", 8, framework="torchtitan", seq=8192, gbs=8)
    base = Plan(dp=8, zero_stage=3, micro_batch_size=1, recompute="selective")
    lay = _tt_layout(8192)
    none, full = (sum(layer_activations(shape_of(job.model), lay, False, m).values()) for m in ("none", "full"))
    every2 = estimate_memory(job, base.model_copy(update={"selective_ac_option": "2"})).stages[0].detail
    assert every2["layer_activations"] == int(16 * none + 16 * full)
    assert every2["recompute_working_layer"] == int(none)
    every3 = estimate_memory(job, base.model_copy(update={"selective_ac_option": "3"})).stages[0].detail
    assert every3["layer_activations"] == int(22 * none + 10 * full)  # blocks 3, 6, ..., 30
    one = base.model_copy(update={"selective_ac_option": "1"})
    as_full = Plan(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")
    assert estimate_memory(job, one).stages[0].total_bytes == estimate_memory(job, as_full).stages[0].total_bytes
    timed = [estimate_throughput(job, p).breakdown.recompute_s for p in (one, as_full)]
    assert timed[0] == timed[1] > 0
    assert estimate_memory(job, base.model_copy(update={"selective_ac_option": "op"})).stages[0].total_bytes == \
        estimate_memory(job, base).stages[0].total_bytes


def test_selective_ac_option_outside_torchtitans_selective_is_refused():
    """RC002: the option on a framework whose selective is not op-level SAC names that framework's nearest knob."""
    from meshplan.api import check_config as check
    from meshplan.schema.request import Request

    report = check(Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-core", recompute="selective",
                           selective_ac_option="2"))
    found = [f for f in report.findings if f.id == "RC002"]
    assert found and "recompute_layers" in found[0].fix
    # recommend weighs torchtitan's selective as op-level SAC: it refuses every-N rather than drop it
    from meshplan.api import recommend

    with pytest.raises(MeshplanError, match="selective_ac_option=2") as exc:
        recommend(Request(model="llama-3.1-8b", num_gpus=8, framework="torchtitan", selective_ac_option="2"))
    assert "Drop it" in exc.value.fix
