"""The FFN activation's memory-bound passes per the code that runs it (cards/calibration.yaml activation_passes,
arithmetic/activation_passes.py): counted from each framework's source (bench/activation_census.py), read by the
model's activation, the same as before for SwiGLU, moved by each other activation's own kernels (gpt-oss's clamps
outside Megatron-Core's fused quick-GEGLU); and the memory those clamps keep."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.adapters.architecture import megatron_architecture
from meshplan.arithmetic.activation_passes import activation_key, activation_passes, expert_bias_passes, ffn_passes
from meshplan.arithmetic.memory_states import expert_gate_bytes, memory_card
from meshplan.core.errors import MeshplanError
from meshplan.estimate.layer_records import BF16, activation_code
from meshplan.estimate.layer_time import elementwise_load, elementwise_seconds
from meshplan.estimate.perf import step_terms
from meshplan.estimate.recompute import module_memory_bound
from meshplan.knowledge.calibration import calibration_card
from meshplan.knowledge.cards import model_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.model_config import architecture_from_text
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CENSUS = Path(__file__).resolve().parents[1] / "bench" / "data" / "activation_census.json"
GPT_OSS = dict(model="gpt-oss-120b", num_gpus=64, seq_length=4096, global_batch_size=1280, micro_batch_size=4,
               ep=64, gpu="gb200", precision="bf16")


def _ctx(framework: str = "megatron-bridge", **fields):
    job, plan = resolve(Request(framework=framework, **(GPT_OSS | fields)))
    return step_terms(job, plan).ctx


def test_the_card_holds_what_the_census_counted():
    """Every count bench/activation_census.py made is the card's, forward and backward (the census's per-row
    probabilities a few thousandths of a pass)."""
    census = json.loads(CENSUS.read_text())
    codes = calibration_card().activation_passes.codes
    pairs = [(code, key, counted) for code, table in census["activations"].items() for key, counted in table.items()]
    assert len(pairs) >= 15
    for code, key, counted in pairs:
        assert codes[code].passes[key] == pytest.approx(tuple(counted), abs=0.05), (code, key)
    for code, counted in census["expert_bias"].items():
        assert codes[code].expert_bias == pytest.approx(tuple(counted), abs=0.2), code
    for code, counted in census["routed_weighting"].items():
        assert codes[code].routed_weighting == pytest.approx(tuple(counted), abs=0.05), code


@pytest.mark.parametrize(("model", "key"), [("gpt-oss-120b", "clamped_glu"), ("llama-3.1-8b", "glu_silu"),
                                            ("qwen3-30b-a3b", "glu_silu"), ("nemotron-4-340b", "relu2"),
                                            ("gpt3-175b", "gelu_new"), ("gemma-2-27b", "glu_gelu_pytorch_tanh"),
                                            ("bloom-176b", "gelu")])
def test_each_catalog_model_names_its_activation(model, key):
    assert activation_key(resolve_model(model)) == key


def test_gpt_oss_reads_its_clamp_from_the_config():
    arch = resolve_model("gpt-oss-120b")
    assert arch.swiglu_limit == 7.0 and resolve_model("llama-3.1-8b").swiglu_limit is None
    config = dict(model_card("gpt-oss-20b").config)
    assert architecture_from_text(json.dumps(config | {"swiglu_limit": 5})).swiglu_limit == 5.0
    del config["swiglu_limit"]
    assert architecture_from_text(json.dumps(config)).swiglu_limit == 7.0  # GptOssConfig's default
    with pytest.raises(MeshplanError, match="swiglu_limit = -1 is out of range"):
        architecture_from_text(json.dumps(config | {"swiglu_limit": -1}))


def test_megatron_renders_the_models_own_clamp():
    config = dict(model_card("gpt-oss-20b").config) | {"swiglu_limit": 5.0}
    settings, _, _ = megatron_architecture(architecture_from_text(json.dumps(config)), 4096)
    clamp = next(s for s in settings if s.field == "activation_func_clamp_value")
    assert clamp.value == 5.0


def test_swiglu_keeps_each_codes_base_and_the_others_move_by_their_difference():
    """The base constants were counted or fitted with SwiGLU inside: a SwiGLU model's FFN passes are exactly them;
    gpt-oss's clamps add Megatron-Core's eager clamp, cat and their backward (31 - 8 = 23 passes)."""
    cal = _ctx().cal
    assert ffn_passes(cal, "fused_functions", "glu_silu") == cal.elementwise_passes
    assert ffn_passes(cal, "compiled", "glu_silu") == cal.elementwise_passes
    assert ffn_passes(cal, "eager", "glu_silu") == cal.eager_elementwise_passes
    assert ffn_passes(cal, "hf_eager", "glu_silu") == cal.hf_eager_ffn_passes == 14
    assert ffn_passes(cal, "fused_functions", "clamped_glu") == cal.elementwise_passes + 31 - 8
    assert ffn_passes(cal, "compiled", "clamped_glu") == cal.elementwise_passes  # the clamp inside the kernel
    assert ffn_passes(cal, "hf_eager", "clamped_glu") == 59  # transformers' _apply_gate, op by op
    assert ffn_passes(cal, "fused_functions", "relu2") == cal.elementwise_passes - 3
    assert activation_passes("eager", "gelu_new") == activation_passes("eager", "glu_silu")  # not listed: as SwiGLU


def test_gpt_oss_on_bridge_pays_the_clamps_and_the_expert_bias_loop():
    """One MoE layer of the GB200 EP64 row: the routed copies (tokens x top_k on the rank) over the expert width at
    the clamped GLU's passes, over hidden at the bias loop's (TEGroupedMLP._apply_bias), and its unfused YaRN rotary
    over the queries and keys (tests/test_unfused_rope.py)."""
    ctx = _ctx()
    assert activation_code(ctx, routed=True) == "fused_functions"
    load = elementwise_load(ctx, True)
    copies = 4 * 4096 * 4 * ctx.routed_load
    assert load.routed_ffn == pytest.approx(copies * 2880) and load.expert_bias == pytest.approx(copies * 2880)
    cal = ctx.cal
    want = BF16 * (cal.elementwise_passes * load.hidden + (cal.elementwise_passes + 23) * load.routed_ffn
                   + 14 * load.expert_bias + cal.unfused_rope_passes * load.rotated) + load.dispatch_bytes \
        + load.router_bytes
    assert load.rotated == 4 * 4096 * (64 + 8) * 64
    assert elementwise_seconds(ctx, load) == pytest.approx(want / ctx.hbm, rel=1e-12)
    assert sum(expert_bias_passes("fused_functions")) == 14 and sum(expert_bias_passes("hf_eager")) == 0


def test_a_swiglu_moe_layer_is_timed_as_before():
    ctx = _ctx(model="qwen3-30b-a3b", ep=8, num_gpus=8, micro_batch_size=1, global_batch_size=64,
               bias_activation_fusion=True)  # Bridge's Qwen3 provider leaves it off: its perf recipes' setting
    load = elementwise_load(ctx, True)
    assert load.expert_bias == 0
    cal = ctx.cal
    want = (BF16 * cal.elementwise_passes * (load.hidden + load.shared_ffn + load.routed_ffn)
            + load.dispatch_bytes + load.router_bytes)
    assert elementwise_seconds(ctx, load) == pytest.approx(want / ctx.hbm, rel=1e-12)


def test_the_routed_activation_runs_over_the_whole_expert_width_of_every_copy_under_etp():
    """Each ETP rank runs its group's copies gathered (etp x the rows) at 1/etp of the width, as the expert GEMMs
    count them: the elements do not fall with etp."""
    one = elementwise_load(_ctx(model="qwen3-30b-a3b", ep=4, tp=2, etp=1, num_gpus=8, micro_batch_size=1,
                                global_batch_size=64), True)
    two = elementwise_load(_ctx(model="qwen3-30b-a3b", ep=4, tp=2, etp=2, num_gpus=8, micro_batch_size=1,
                                global_batch_size=64), True)
    assert two.routed_ffn == pytest.approx(one.routed_ffn) and one.routed_ffn > 0


def test_moe_act_recompute_runs_the_clamps_forward_again():
    ctx = _ctx()
    load = elementwise_load(ctx, True)
    assert module_memory_bound(ctx, load)["moe_act"] == pytest.approx(11 * BF16 * load.routed_ffn / ctx.hbm)
    swiglu = replace(ctx, arch=resolve_model("qwen3-30b-a3b"))
    assert module_memory_bound(swiglu, load)["moe_act"] == pytest.approx(3 * BF16 * load.routed_ffn / ctx.hbm)


@pytest.mark.parametrize(("framework", "code"), [("megatron-core", "fused_functions"),
                                                 ("megatron-bridge", "unfused_functions"),  # its Qwen3 provider's
                                                 ("torchtitan", "eager"), ("nemo-automodel", "compiled")])
def test_each_framework_runs_the_routed_activation_its_own_way(framework, code):
    ctx = _ctx(framework, model="qwen3-30b-a3b", ep=8, num_gpus=8, micro_batch_size=1, global_batch_size=64)
    assert activation_code(ctx, routed=True) == code


def test_torchtitan_compiled_fuses_the_clamps():
    ctx = _ctx("torchtitan", model="qwen3-30b-a3b", ep=8, num_gpus=8, micro_batch_size=1, global_batch_size=64,
               torch_compile=True)
    assert activation_code(ctx, routed=False) == "compiled"


def test_megatron_keeps_the_clamps_inputs_and_the_cat():
    """Megatron-Core's eager clamps keep fc1's output (4 B per expert-width element) and the fused function the
    cat (4 B): the megatron conventions' expert_gates; transformers' _apply_gate keeps 12."""
    conventions = memory_card().conventions
    for name in ("megatron", "megatron_fsdp"):
        assert expert_gate_bytes(conventions[name], "gpt_oss") == 8
        assert expert_gate_bytes(conventions[name], "qwen3_moe") == 0
    assert expert_gate_bytes(conventions["fsdp2_hf"], "gpt_oss") == 12
