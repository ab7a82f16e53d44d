"""Megatron-Core's bias_activation_fusion as a request field, end to end: the default each framework runs (Megatron-LM's
flags on; Megatron-Bridge's model provider, off for Qwen and the other providers that leave TransformerConfig's
False), the unfused glu()'s memory-bound passes from the census (cards/calibration.yaml activation_passes
unfused_functions: 7 + 13 against the fused kernel's 3 + 5, and the routed experts' separate routing-weight multiply),
what it keeps beyond the fused kernel (cards/memory.yaml unfused_glu), rule PR008 and PR006's unfused case, a framework
without the switch refused on every face, and the Megatron-Core flag and Bridge field rendered and read back."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from meshplan import api
from meshplan.arithmetic.activation_passes import activation_passes, ffn_passes, routed_weighting_passes
from meshplan.arithmetic.activations import BF16, layer_activations, shape_of
from meshplan.arithmetic.memory_states import convention, memory_card, unfused_glu_bytes
from meshplan.core.errors import MeshplanError
from meshplan.estimate.layer_records import activation_code
from meshplan.estimate.layer_time import elementwise_load, elementwise_seconds
from meshplan.estimate.memory import _layer_layout
from meshplan.estimate.perf import step_terms
from meshplan.estimate.recompute import module_memory_bound
from meshplan.faces import cli
from meshplan.faces.mcp import tools
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k, recommend

ROOT = Path(__file__).resolve().parents[1]
CENSUS = json.loads((ROOT / "bench" / "data" / "activation_census.json").read_text())
DENSE = dict(model="qwen3-8b", gpu="h100", num_gpus=8, framework="megatron-bridge", seq_length=4096,
             global_batch_size=64, micro_batch_size=1, tp=2, recompute="none")
MOE = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, framework="megatron-bridge", seq_length=4096,
           global_batch_size=256, micro_batch_size=1, tp=1, ep=8, recompute="none")


def _job(base: dict, **change):
    return resolve(Request(**base | change))


def test_the_unfused_counts_are_the_censuses():
    """The card's unfused glu() and routing-weight multiply are what bench/activation_census.py counted from
    Megatron-Core's mlp.py and experts.py, and a SwiGLU's FFN term moves by the difference from the fused kernel."""
    counted = CENSUS["activations"]["unfused_functions"]
    assert activation_passes("unfused_functions", "glu_silu") == pytest.approx(tuple(counted["glu_silu"]), abs=0.05)
    assert routed_weighting_passes("unfused_functions") == pytest.approx(
        tuple(CENSUS["routed_weighting"]["unfused_functions"]), abs=0.05)
    assert routed_weighting_passes("fused_functions") == (0.0, 0.0)
    job, _ = _job(DENSE)
    cal = step_terms(*_job(DENSE)).ctx.cal
    assert job.bias_activation_fusion is False
    fused, unfused = (sum(activation_passes(code, "glu_silu")) for code in ("fused_functions", "unfused_functions"))
    assert (fused, unfused) == (8, 20)
    assert ffn_passes(cal, "unfused_functions", "glu_silu") - ffn_passes(cal, "fused_functions", "glu_silu") == 12


def test_the_unfused_dense_mlp_moves_by_twelve_passes_over_its_width():
    on, off = (step_terms(*_job(DENSE, bias_activation_fusion=f)).ctx for f in (True, False))
    assert (activation_code(on, routed=False), activation_code(off, routed=False)) == (
        "fused_functions", "unfused_functions")
    load = elementwise_load(off, moe=False)
    assert load == elementwise_load(on, moe=False)
    extra = elementwise_seconds(off, load) - elementwise_seconds(on, load)
    assert extra == pytest.approx(12 * BF16 * load.dense_ffn / off.hbm)
    assert extra > 0


def test_the_routed_experts_add_their_routing_weight_multiply():
    on, off = (step_terms(*_job(MOE, bias_activation_fusion=f)).ctx for f in (True, False))
    load = elementwise_load(off, moe=True)
    weighting = sum(routed_weighting_passes("unfused_functions"))
    extra = elementwise_seconds(off, load) - elementwise_seconds(on, load)
    assert extra == pytest.approx(BF16 * (12 * (load.shared_ffn + load.dense_ffn) + (12 + weighting)
                                          * load.routed_ffn) / off.hbm)
    # moe_act recomputes the routed activation's forward, the multiply's included
    forward = activation_passes("unfused_functions", "glu_silu")[0] - activation_passes("fused_functions",
                                                                                        "glu_silu")[0]
    moved = module_memory_bound(off, load)["moe_act"] - module_memory_bound(on, load)["moe_act"]
    assert moved == pytest.approx((forward + routed_weighting_passes("unfused_functions")[0]) * BF16
                                  * load.routed_ffn / off.hbm)


def test_the_unfused_glu_keeps_its_intermediates():
    """Dense MLP: the activation's output and the offset copy of x_linear (4 B per element of the width); routed
    experts: the routing-weight multiply's input too (6 B)."""
    card = memory_card().unfused_glu
    for base, moe_layer in ((DENSE, False), (MOE, True)):
        job_on, plan = _job(base, bias_activation_fusion=True)
        job_off, _ = _job(base, bias_activation_fusion=False)
        assert unfused_glu_bytes(job_on) == (0.0, 0.0)
        assert unfused_glu_bytes(job_off) == (card.mlp_bytes, card.routed_bytes)
        tokens = job_on.seq_length * plan.micro_batch_size
        layouts = [_layer_layout(j, plan, convention(j.card, plan.zero_stage)[1], tokens) for j in (job_on, job_off)]
        shape = shape_of(job_on.model)
        on, off = (sum(layer_activations(shape, lay, moe_layer, "none").values()) for lay in layouts)
        if not moe_layer:
            assert off - on == pytest.approx(card.mlp_bytes * tokens * job_on.model.ffn_hidden_size / plan.tp)
        else:
            assert off - on > 0
    peaks = [api.estimate_memory(Request(**DENSE, bias_activation_fusion=f)).peak_bytes for f in (True, False)]
    assert peaks[1] > peaks[0]


def test_each_framework_runs_its_own_default():
    """Megatron-LM's flags fuse (store_false); Bridge's Qwen provider leaves TransformerConfig's False (said in a
    note), its Llama one turns it on; an activation Megatron-Core cannot fuse runs unfused on both; frameworks
    without the switch keep the fused count."""
    job, _ = _job(DENSE)
    assert job.bias_activation_fusion is False
    assert any("bias_activation_fusion not given: off" in n for n in job.notes)
    assert _job(DENSE, model="llama-3.1-8b")[0].bias_activation_fusion is True
    assert _job(DENSE, framework="megatron-core")[0].bias_activation_fusion is True
    assert _job(DENSE, model="gemma-2-27b", framework="megatron-core", num_gpus=16)[0].bias_activation_fusion is False
    assert _job(DENSE, framework="torchtitan", tp=1)[0].bias_activation_fusion is True


def test_a_framework_without_the_switch_is_refused_on_every_face():
    req = DENSE | dict(framework="torchtitan", tp=1, bias_activation_fusion=False)
    with pytest.raises(MeshplanError, match="bias_activation_fusion=false: torchtitan has no switch") as caught:
        api.estimate_throughput(Request(**req))
    assert caught.value.fields == ("bias_activation_fusion",)
    argv = ["throughput", "--json"] + [a for k, v in req.items() for a in
                                     (f"--{k.replace('_', '-')}", str(v).lower() if isinstance(v, bool) else str(v))]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(argv)
    assert code == 2 and "has no switch" in err.getvalue() + out.getvalue()
    assert "Traceback" not in err.getvalue()
    with pytest.raises(ToolError, match="has no switch"):
        tools.estimate_throughput(**req)


def test_megatrons_validators_refuse_what_it_cannot_run():
    """TransformerConfig refuses the fusion on an activation its kernels do not take (a clear error naming the field,
    resolve); the fp8 input store under the unfused glu(), which never reads it, is rule PR006's error."""
    with pytest.raises(MeshplanError, match="glu_gelu_pytorch_tanh") as caught:
        resolve(Request(**DENSE | dict(model="gemma-2-27b", num_gpus=16, bias_activation_fusion=True)))
    assert caught.value.fields == ("bias_activation_fusion",)
    findings = [f for f in api.check_config(Request(**DENSE | dict(
        model="llama-3.1-8b", bias_activation_fusion=False, fp8_activation_input_store=True))).findings
        if f.id == "PR006"]
    assert findings and findings[0].severity == "error" and "unfused glu()" in findings[0].message
    assert not [f for f in api.check_config(Request(**DENSE | {"bias_activation_fusion": True})).findings
                if f.id == "PR006"]


def test_gemma_2_runs_the_unfused_glu_on_megatron_whatever_the_switch():
    """Megatron-Core never fuses Gemma 2's fast_gelu: its glu() keeps the intermediates on a framework with the switch,
    not on one without it (transformers' own code there)."""
    gemma = dict(model="gemma-2-27b", num_gpus=16, tp=4)
    job, _ = _job(DENSE, **gemma)
    assert job.bias_activation_fusion is False and unfused_glu_bytes(job) == (4.0, 6.0)
    copied = job.model_copy(update={"bias_activation_fusion": True})  # a job not built by resolve
    assert unfused_glu_bytes(copied.attach_cards(job.card)) == (4.0, 6.0)
    assert unfused_glu_bytes(_job(DENSE, **gemma | dict(framework="torchtitan", tp=1))[0]) == (0.0, 0.0)


@pytest.mark.parametrize(("framework", "model", "value", "written"), [
    ("megatron-core", "llama-3.1-8b", False, "--no-bias-swiglu-fusion"),
    ("megatron-bridge", "qwen3-8b", True, "bias_activation_fusion = True"),
    ("megatron-bridge", "llama-3.1-8b", False, "bias_activation_fusion = False"),
])
def test_render_writes_the_switch_and_import_reads_it_back(framework, model, value, written):
    req = Request(**DENSE | dict(framework=framework, model=model, seq_length=2048, bias_activation_fusion=value))
    text = api.render_config(framework, req).text
    assert written in text
    assert api.import_config(text, framework=framework).request["bias_activation_fusion"] is value
    default = Request(**DENSE | dict(framework=framework, model=model, seq_length=2048))
    assert "bias_activation_fusion" not in api.import_config(api.render_config(framework, default).text,
                                                             framework=framework).request


def test_a_user_script_that_turns_it_off_is_read_off():
    path = ROOT / "tests" / "configs" / "megatron_qwen3_30b_a3b_excerpt.sh"
    assert api.import_config(path.read_text(), path=str(path)).request["bias_activation_fusion"] is False
    assert api.import_config("torchrun pretrain_gpt.py --no-bias-gelu-fusion --tensor-model-parallel-size 2",
                             framework="megatron-core").request["bias_activation_fusion"] is False
    # Megatron-LM reads the switch of the script's own activation: the other one is noted, not read
    other = api.import_config("torchrun pretrain_gpt.py --swiglu --no-bias-gelu-fusion --tensor-model-parallel-size 2",
                              framework="megatron-core")
    assert "bias_activation_fusion" not in other.request
    assert any("no effect" in note for note in other.notes)


def test_the_search_finds_the_oracles_top_k_unfused():
    """The search's floors pass the job's unfused_glu bytes (a floor counting the fused kernel's would sit below the
    estimate and a cut could drop a plan the oracle ranks; Bridge's Qwen3 default is unfused)."""
    req = Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, seq_length=4096, framework="megatron-bridge")
    rec = recommend(req, top_k=3)
    oracle = exhaustive_top_k(req, 100)
    assert oracle
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle[:3]], rel=1e-12)


VERL = DENSE | dict(framework="verl", zero_stage=1)  # verl 0.9.1's Megatron engine (zero_stage 0-2)


def test_verl_megatron_engine_runs_its_bridge_providers_default():
    """verl 0.9.1 builds the Megatron engine's model from Megatron-Bridge's provider and sets no bias_activation_fusion
    over it (cards/frameworks/verl.yaml defaults.bias_activation_fusion_why): off for Qwen2/3 and Mistral (said in a
    note), on for the Llama, DeepSeek, GLM, Kimi and gpt-oss bridges; the request's field is taken."""
    job, _ = _job(VERL)
    assert job.bias_activation_fusion is False
    assert any("bias_activation_fusion not given: off" in n and "verl" in n for n in job.notes)
    assert _job(VERL, model="mistral-7b")[0].bias_activation_fusion is False
    assert _job(VERL, model="llama-3.1-8b")[0].bias_activation_fusion is True
    assert _job(VERL, model="qwen3-30b-a3b", num_gpus=16, tp=1, ep=8)[0].bias_activation_fusion is False
    assert _job(VERL, bias_activation_fusion=True)[0].bias_activation_fusion is True
    # verl 0.5's own config converter (use_mbridge False): its MoE converters fuse, hf_to_mcore_config_dense does not
    old = dict(framework_version="0.5.0")
    assert _job(VERL, model="qwen3-30b-a3b", num_gpus=16, tp=1, ep=8, **old)[0].bias_activation_fusion is True
    assert _job(VERL, model="llama-3.1-8b", **old)[0].bias_activation_fusion is False
    assert _job(VERL, **old)[0].bias_activation_fusion is False


def test_a_verl_qwen3_job_saves_the_unfused_activation_and_its_passes():
    """The Megatron engine's unfused glu() keeps 4 B per element of the FFN width beyond the fused kernel and moves
    twelve more bytes-wide passes (the Megatron-Bridge Qwen3 row's figures, now on verl's engine)."""
    card = memory_card().unfused_glu
    job_off, plan = _job(VERL)
    job_on, _ = _job(VERL, bias_activation_fusion=True)
    assert unfused_glu_bytes(job_off) == (card.mlp_bytes, card.routed_bytes) and unfused_glu_bytes(job_on) == (0, 0)
    tokens = job_on.seq_length * plan.micro_batch_size
    layouts = [_layer_layout(j, plan, convention(j.card, plan.zero_stage)[1], tokens) for j in (job_on, job_off)]
    shape = shape_of(job_on.model)
    on, off = (sum(layer_activations(shape, lay, False, "none").values()) for lay in layouts)
    assert off - on == pytest.approx(card.mlp_bytes * tokens * job_on.model.ffn_hidden_size / plan.tp)
    ctx_off, ctx_on = step_terms(job_off, plan).ctx, step_terms(job_on, plan).ctx
    assert (activation_code(ctx_on, routed=False), activation_code(ctx_off, routed=False)) == (
        "fused_functions", "unfused_functions")
    load = elementwise_load(ctx_off, moe=False)
    assert elementwise_seconds(ctx_off, load) - elementwise_seconds(ctx_on, load) == pytest.approx(
        12 * BF16 * load.dense_ffn / ctx_off.hbm)
    peaks = [api.estimate_memory(Request(**VERL, bias_activation_fusion=f)).peak_bytes for f in (True, False)]
    assert peaks[1] > peaks[0]


def test_verls_fsdp_engine_runs_transformers_mlp_whatever_the_switch():
    """zero_stage 3 is verl's FSDP engine (transformers' own MLP): the switch moves neither its memory nor its step."""
    fsdp = VERL | dict(zero_stage=3, tp=1)
    on, off = (Request(**fsdp, bias_activation_fusion=f) for f in (True, False))
    assert api.estimate_memory(on).peak_bytes == api.estimate_memory(off).peak_bytes
    assert api.estimate_throughput(on).step_time_s == api.estimate_throughput(off).step_time_s


@pytest.mark.parametrize(("rl", "key"), [
    (False, "++engine.override_transformer_config.bias_activation_fusion=true"),
    (True, "++actor_rollout_ref.actor.megatron.override_transformer_config.bias_activation_fusion=true"),
])
def test_verl_render_writes_it_over_the_provider_and_import_reads_it(rl, key):
    fields = VERL | dict(seq_length=2048, recompute="full", bias_activation_fusion=True)
    if rl:
        fields = {k: v for k, v in fields.items() if k not in ("seq_length", "global_batch_size")} | dict(
            prompts_per_step=32, samples_per_prompt=8, prompt_length=512, response_length=1024)
    text = api.render_config("verl", Request(**fields), force=True).text
    assert key in text
    assert api.import_config(text, framework="verl").request["bias_activation_fusion"] is True
    default = api.render_config("verl", Request(**fields | dict(bias_activation_fusion=None)), force=True).text
    assert "bias_activation_fusion" not in default
