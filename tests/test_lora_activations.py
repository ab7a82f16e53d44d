"""What LoRA adapters keep for their backward (arithmetic/lora.py adapter_activation_bytes), against a hand count of
Megatron-Bridge's ParallelLinearAdapter and Hugging Face PEFT's lora.Linear, and carried into the memory estimate."""

from __future__ import annotations

import pytest
from framework_packages import harness_answer

from meshplan.arithmetic.activations import Layout, frozen_linear_bytes, routed_rows, shape_of
from meshplan.arithmetic.lora import adapter_activation_bytes, adapter_saves, lora_engine
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.resolve import resolve
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.request import Request
from meshplan.search import search_job
from meshplan.search.floors import first_stage_floor
from meshplan.search.space import Fixed, enumerate_layouts, micro_batches, zero_ladder

L8B = dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, seq_length=4096, micro_batch_size=1)
H, R, T, LAYERS = 4096, 16, 4096, 32  # Llama-3.1-8B's hidden size and layers; rank 16; one 4096-token sequence


def layer_acts(req: Request) -> int:
    return estimate_memory(*resolve(req)).stages[0].detail["layer_activations"]


def test_each_adapter_keeps_its_rank_r_output_whole_on_every_tp_rank():
    job, plan = resolve(Request(**L8B, framework="megatron-bridge", lora_rank=R))
    saves = adapter_saves(job.model, 0, job.lora, lora_engine(job.card, plan.zero_stage))
    # linear_qkv, linear_proj, linear_fc1, linear_fc2: B keeps A's t x r output, bf16 (no TP split: gathered)
    for tp in (1, 2, 4):
        got = adapter_activation_bytes(saves, R, "parallel_adapter", tokens=T, routed_rows=0, tp=tp, sp=False,
                                       fp8=False)
        assert got == 4 * 2 * T * R


def test_sequence_parallel_adapters_keep_their_input_gathered():
    job, plan = resolve(Request(**L8B, framework="megatron-bridge", lora_rank=R))
    saves = adapter_saves(job.model, 0, job.lora, lora_engine(job.card, plan.zero_stage))
    got = adapter_activation_bytes(saves, R, "parallel_adapter", tokens=T, routed_rows=0, tp=2, sp=True, fp8=False)
    # + linear_qkv's and linear_fc1's gathered t x h input, beside the base's local t x h / tp shard
    assert got == 4 * 2 * T * R + 2 * 2 * T * H
    peft = adapter_activation_bytes(saves, R, "peft", tokens=T, routed_rows=0, tp=2, sp=True, fp8=False)
    assert peft == 4 * 2 * T * R


def test_peft_keeps_one_rank_r_output_per_projection():
    job, plan = resolve(Request(**L8B, framework="verl", zero_stage=3, lora_rank=R))
    engine = lora_engine(job.card, plan.zero_stage)
    assert engine is not None and engine.adapter_saves == "peft"
    saves = adapter_saves(job.model, 0, job.lora, engine)
    # q, k, v, o, gate, up, down: seven lora_A outputs
    assert adapter_activation_bytes(saves, R, "peft", tokens=T, routed_rows=0, tp=1, sp=False, fp8=False) \
        == 7 * 2 * T * R


@pytest.mark.parametrize("framework, zero, tp, per_layer", [
    ("megatron-bridge", 1, 1, 4 * 2 * T * R),
    ("megatron-bridge", 1, 2, 4 * 2 * T * R + 2 * 2 * T * H),
    ("verl", 3, 1, 7 * 2 * T * R - 2 * 2 * T * H),  # less the frozen norms' normalised copies (test below)
])
def test_the_estimate_adds_the_adapters_activations_to_full_trainings(framework, zero, tp, per_layer):
    plan = dict(framework=framework, zero_stage=zero, tp=tp, sequence_parallel=tp > 1)
    full = layer_acts(Request(**L8B, **plan, job="sft"))
    assert layer_acts(Request(**L8B, **plan, lora_rank=R)) - full == LAYERS * per_layer


def test_recompute_drops_the_adapters_it_re_runs():
    plan = dict(framework="megatron-bridge", tp=2, sequence_parallel=True)
    full = layer_acts(Request(**L8B, **plan, job="sft", recompute="full"))
    assert layer_acts(Request(**L8B, **plan, lora_rank=R, recompute="full")) == full
    sel = dict(recompute="selective", recompute_modules=["core_attn", "mlp"])
    base = layer_acts(Request(**L8B, **plan, **sel, job="sft"))
    # linear_qkv and linear_proj stay (and qkv's gathered input); the MLP's adapters are re-run with it
    assert layer_acts(Request(**L8B, **plan, **sel, lora_rank=R)) - base == LAYERS * (2 * 2 * T * R + 2 * T * H)


def test_a_hybrids_mamba_in_proj_adapter_keeps_its_gathered_input():
    job, plan = resolve(Request(model="nemotron-3-nano-30b-a3b", framework="megatron-bridge", num_gpus=8, tp=2,
                                sequence_parallel=True, ep=4, global_batch_size=64, lora_rank=R))
    engine = lora_engine(job.card, plan.zero_stage)
    mamba = job.model.layer_pattern.index("M")
    saves = adapter_saves(job.model, mamba, job.lora, engine)
    h = job.model.hidden_size
    assert [s.gathers for s in saves] == [True, False]  # in_proj, out_proj
    assert adapter_activation_bytes(saves, R, "parallel_adapter", tokens=T, routed_rows=0, tp=2, sp=True,
                                    fp8=False) == 2 * 2 * T * R + 2 * T * h
    assert framework_card("megatron-bridge").lora["megatron"].adapter_saves == "parallel_adapter"


def test_peft_frozen_norms_keep_less_than_the_adapters_add():
    # verl's FSDP engine: seven rank-r outputs, less the two HF RMSNorms' bf16 normalised tensors, which their frozen
    # weights' multiply no longer keeps (activations.frozen_norm_bytes)
    plan = dict(framework="verl", zero_stage=3)
    full = layer_acts(Request(**L8B, **plan, job="sft"))
    assert layer_acts(Request(**L8B, **plan, lora_rank=R)) - full == LAYERS * (7 * 2 * T * R - 2 * 2 * T * H)


def peft_saved_per_layer(ask: dict) -> int:
    """One decoder layer's saved bytes under PEFT's LoRA less in full training, as bench/peft_lora_saved_harness.py
    counts them (three layers less two) in the PEFT venv for the config, tokens, rank and targets asked."""
    got = harness_answer("peft_lora_saved_harness.py", ask)
    return (got["lora"][1] - got["lora"][0]) - (got["full"][1] - got["full"][0])


def test_peft_lora_saves_what_the_hand_count_says():
    """The hand count above, held to what PEFT on transformers' Llama keeps (bench/peft_lora_saved_harness.py)."""
    h, t, r = 64, 32, 8
    ask = {"config": {"model_type": "llama", "hidden_size": h, "intermediate_size": 160, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 128}, "tokens": t, "rank": r}
    per_layer = peft_saved_per_layer(ask)
    assert per_layer == 7 * 2 * t * r - 2 * 2 * t * h


F = 14336  # Llama-3.1-8B's ffn width


@pytest.mark.parametrize("targets, per_layer", [
    # q, k, v adapted: the MLP's frozen gate/up and down keep neither the post-attention norm's output nor the SwiGLU
    # product; o_proj's input stays, flash's own output
    (["linear_qkv"], 3 * 2 * T * R - 2 * 2 * T * H - 2 * T * H - 2 * T * F),
    (["linear_qkv", "linear_proj"], 4 * 2 * T * R - 2 * 2 * T * H - 2 * T * H - 2 * T * F),
    # the MLP adapted: the frozen q/k/v keep no norm output
    (["linear_fc1", "linear_fc2"], 3 * 2 * T * R - 2 * 2 * T * H - 2 * T * H),
    (["linear_proj", "linear_fc2"], 2 * 2 * T * R - 2 * 2 * T * H - 2 * T * H - 2 * T * H),
])
def test_peft_linears_without_an_adapter_keep_no_input(targets, per_layer):
    """activations.frozen_linear_bytes in verl's FSDP estimate: only an adapted linear keeps its input."""
    plan = dict(framework="verl", zero_stage=3)
    full = layer_acts(Request(**L8B, **plan, job="sft"))
    assert layer_acts(Request(**L8B, **plan, lora_rank=R, lora_targets=targets)) - full == LAYERS * per_layer


@pytest.mark.parametrize("tp, per_layer", [
    (1, 2 * 2 * T * R - 2 * T * H - 2 * T * F),
    (2, 2 * 2 * T * R + 2 * T * H - 2 * T * H / 2 - 2 * T * F / 2),  # linear_qkv's adapter keeps its gathered input
])
def test_megatron_bridge_attention_only_lora_drops_the_mlp_inputs(tp, per_layer):
    """Transformer Engine's frozen linear_fc2 keeps no input and the frozen layernorm-fused linear_fc1 frees its ln_out
    (no adapter turned return_layernorm_output on); linear_proj's input is flash's own output."""
    plan = dict(framework="megatron-bridge", tp=tp, sequence_parallel=tp > 1)
    full = layer_acts(Request(**L8B, **plan, job="sft"))
    lora = layer_acts(Request(**L8B, **plan, lora_rank=R, lora_targets=["linear_qkv", "linear_proj"]))
    assert lora - full == LAYERS * per_layer


@pytest.mark.parametrize("targets, adapters, kept", [
    # kept: of the QKV input, the fc1 input and the fc2 input (t x f), what an adapted linear keeps
    (["q_proj", "k_proj", "v_proj"], 3, (1, 0, 0)),
    (["q_proj", "k_proj", "v_proj", "o_proj"], 4, (1, 0, 0)),
    (["gate_proj", "up_proj", "down_proj"], 3, (0, 1, 1)),
    (["o_proj", "down_proj"], 2, (0, 0, 1)),
])
def test_peft_target_subsets_save_what_the_hand_count_says(targets, adapters, kept):
    """PEFT on transformers' Llama with target subsets: the frozen linears without an adapter keep no input (o_proj's
    is sdpa's own output, kept either way), bench/peft_lora_saved_harness.py."""
    h, f, t, r = 64, 160, 32, 8
    ask = {"config": {"model_type": "llama", "hidden_size": h, "intermediate_size": f, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 128}, "tokens": t, "rank": r, "targets": targets}
    per_layer = peft_saved_per_layer(ask)
    qkv, fc1, fc2 = kept
    assert per_layer == adapters * 2 * t * r - 2 * 2 * t * h - (1 - qkv) * 2 * t * h - (1 - fc1) * 2 * t * h \
        - (1 - fc2) * 2 * t * f


def test_frozen_routed_experts_keep_no_input():
    """activations.frozen_linear_bytes on an MoE layer: the routed experts' fc1 input (the dispatched copies) and fc2
    input when they have no adapter (the targets or the engine), none when they do; a ParamWrapper'd weight keeps its
    input."""
    shape = shape_of(resolve_model("qwen3-30b-a3b"))
    lay = Layout(tokens=T, seq_kv=T, tp=1, sp=False, etp=1, flash=True, dropout=False, swiglu_unfused=False, fp8=False)
    rows = routed_rows(shape, lay)
    attention = frozenset({"linear_qkv", "linear_proj"})
    every = attention | {"linear_fc1", "linear_fc2"}
    routed = 2 * rows * shape.h + 2 * rows * shape.f_expert
    assert frozen_linear_bytes(shape, lay, every, True, "none") == 0
    assert frozen_linear_bytes(shape, lay, attention, True, "none") == routed
    assert frozen_linear_bytes(shape, lay, every, True, "none", experts_adapted=False) == routed
    wrapped = lay._replace(param_wrapper=("gate_up_proj",))
    assert frozen_linear_bytes(shape, wrapped, attention, True, "none") == 2 * rows * shape.f_expert
    assert frozen_linear_bytes(shape, lay, attention, True, "selective", ("moe",)) == 0


def test_peft_frozen_moe_block_saves_what_the_hand_count_says():
    """PEFT on a small transformers Qwen3-MoE, attention adapted only: the frozen routed experts keep neither their
    gathered input nor the activation product (as frozen_linear_bytes takes off), and the frozen router keeps no
    input either, the one tensor meshplan still counts (t x h bf16)."""
    h, t, r, heads, kv, d, k, fe = 64, 32, 8, 4, 2, 16, 2, 48
    ask = {"config": {"model_type": "qwen3_moe", "hidden_size": h, "intermediate_size": 160,
                      "moe_intermediate_size": fe, "num_experts": 8, "num_experts_per_tok": k,
                      "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d, "vocab_size": 128,
                      "decoder_sparse_step": 1, "mlp_only_layers": []},
           "tokens": t, "rank": r, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    per_layer = peft_saved_per_layer(ask)
    norms = 2 * 2 * t * h + 2 * t * (heads + kv) * d  # the block norms' and Q/K head norms' normalised tensors
    experts = 2 * t * k * h + 2 * t * k * fe  # routed fc1 input (t x top_k copies) and fc2 input
    router = 2 * t * h
    assert per_layer == 4 * 2 * t * r - norms - experts - router


@pytest.mark.parametrize("model, framework, targets", [
    ("llama-3.1-8b", "verl", None), ("llama-3.1-8b", "megatron-bridge", None),
    ("llama-3.1-8b", "verl", ["linear_qkv", "linear_proj"]),
    ("llama-3.1-8b", "megatron-bridge", ["linear_qkv", "linear_proj"]),
    ("qwen3-30b-a3b", "verl", None),  # the FSDP engine adapts no routed expert, its Megatron engine does
    ("qwen3-30b-a3b", "megatron-bridge", ["linear_qkv", "linear_proj"])])
def test_the_searchs_floor_stays_under_a_lora_estimate(model, framework, targets):
    """The frozen norms and the linears without an adapter make a PEFT LoRA layer keep less than full training's: the
    search's floor must follow."""
    job = search_job(Request(model=model, num_gpus=8, framework=framework, lora_rank=R, lora_targets=targets))[0]
    layouts, _ = enumerate_layouts(job, Fixed())
    checked = 0
    for lay in layouts[:40]:
        sizes = micro_batches(job, lay, Fixed())
        for zero in zero_ladder(framework_card(framework)):
            for recompute in ("none", "full"):
                plan = lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=sizes[0],
                                sequence_parallel=lay.tp > 1, cp_comm_type="p2p")
                try:
                    peak = estimate_memory(job, plan).peak_bytes
                except EstimateBlocked:
                    continue
                assert first_stage_floor(job, lay, zero, recompute, sizes[0], lay.tp > 1) <= peak * (1 + 1e-9), plan
                checked += 1
    assert checked > 5
