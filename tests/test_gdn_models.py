"""Gated DeltaNet hybrids (model_type qwen3_next: Qwen3-Next): their config.json read as transformers' Qwen3NextConfig
reads it, written as Megatron-Core's hybrid pattern (G Gated DeltaNet, * attention, E MoE, - MLP), their exact
parameter counts against transformers' own model and the published ones, and what a GDN layer saves, costs and
which frameworks run it."""

from __future__ import annotations

import json
import re

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import published_mismatches
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.knowledge.model_counts import gdn_params, layer_params
from meshplan.request.parse import parse_request

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json (its fields; transformers_version 4.57.0.dev0)
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512,
    "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000000, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936}


def test_qwen3_next_reads_as_megatron_cores_hybrid_pattern():
    """Qwen3NextConfig.layer_types: every 4th decoder layer full attention; each decoder layer its mixer then its
    sparse MoE block (decoder_sparse_step 1, no mlp_only_layers)."""
    arch = architecture_from_config(QWEN3_NEXT_80B)
    assert arch.layer_pattern == "GEGEGE*E" * 12 and arch.num_layers == 96
    g = arch.gdn
    assert (g.num_key_heads, g.num_value_heads, g.key_head_dim, g.value_head_dim, g.conv_kernel, g.chunk_size) == \
        (16, 32, 128, 128, 4, 64)
    assert (g.key_dim, g.value_dim, g.conv_dim, g.in_proj_width) == (2048, 4096, 8192, 12352)
    assert arch.attention_output_gate and arch.qk_norm == "head" and arch.norms_per_layer == 1
    assert arch.rope is not None and arch.rope.fraction == 0.25 and arch.mamba is None
    assert arch.moe.moe_layers == list(range(1, 96, 2)) and arch.moe.shared_expert_gate


def test_layer_types_and_mlp_only_layers_follow_qwen3nextconfig():
    cfg = {**QWEN3_NEXT_80B, "num_hidden_layers": 4, "mlp_only_layers": [1],
           "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"]}
    assert architecture_from_config(cfg).layer_pattern == "*EG-GE*E"


def test_a_gdn_layer_counts_what_qwen3nextgateddeltanet_builds():
    """Worked by hand from Qwen3NextGatedDeltaNet: in_proj_qkvz 2048 x (2 x 2048 + 2 x 4096), in_proj_ba 2048 x 64,
    conv1d 8192 x 4 (no bias), dt_bias and A_log 32 each, the gated norm over one value head (128), out_proj
    4096 x 2048; and the layer's input RMSNorm. The gated attention's q_proj is 2048 x 16 x 256 x 2."""
    arch = architecture_from_config(QWEN3_NEXT_80B)
    mixer = 2048 * 12288 + 2048 * 64 + 8192 * 4 + 2 * 32 + 128 + 4096 * 2048
    assert gdn_params(arch) == mixer
    assert layer_params(arch, 0) == {"attention": 0, "norms": 2048, "dense_mlp": 0, "routed_experts": 0,
                                     "shared_experts": 0, "router": 0, "latent_proj": 0, "gdn": mixer}
    q, kv, o, qk_norms = 2048 * 8192, 2 * 2048 * 512, 4096 * 2048, 2 * 256
    assert layer_params(arch, 6)["attention"] == q + kv + o + qk_norms


def test_qwen3_next_80b_counts_transformers_model_exactly_and_the_published_figures():
    """79,674,391,296: sum(p.numel()) of Qwen3NextForCausalLM built by transformers 5.9.0 from this config.json on
    the meta device. Published (Qwen/Qwen3-Next-80B-A3B-Instruct model card): 80B total, 79B non-embedding, 3B
    activated (the non-embedding active count, 3.253B)."""
    report = api.describe_model("qwen3-next-80b-a3b")
    assert report.total_params == 79_674_391_296
    assert report.active_params == 3_874_929_408
    assert report.active_params_non_embedding == 3_252_599_552
    assert report.non_embedding_params == 79_052_061_440
    assert published_mismatches(report) == []
    assert architecture_from_config(QWEN3_NEXT_80B).model_dump(exclude={"key", "name", "hf_id", "origin"}) == \
        report.architecture.model_dump(exclude={"key", "name", "hf_id", "origin"})


@pytest.mark.parametrize("change, words", [
    ({"linear_num_value_heads": 24}, "multiple of linear_num_key_heads"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types must list 48"),
])
def test_a_wrong_gdn_config_is_refused_naming_the_field(change, words):
    with pytest.raises(MeshplanError, match=words):
        architecture_from_config({**QWEN3_NEXT_80B, **change})


def test_describe_names_the_decoder_layers_beside_the_pattern_layers(capsys):
    """`meshplan describe` said 'layers 96' for Qwen3-Next, whose config.json and model card say 48: the 96 are the
    hybrid pattern's (two per decoder layer); it says both now, and a model of one pattern layer per layer one."""
    from meshplan.faces.cli import main

    assert main(["describe", "qwen3-next-80b-a3b"]) == 0
    assert "layers 96 (48 decoder layers, each a mixer and an MoE/MLP layer of the pattern), hidden 2048" in \
        capsys.readouterr().out
    assert main(["describe", "nemotron-h-8b"]) == 0
    assert "layers 52, hidden 4096" in capsys.readouterr().out


def test_describe_reads_a_qwen3_next_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_NEXT_80B))
    assert api.describe_model(str(path)).total_params == 79_674_391_296


# --------------------------------------------------------------------------- memory


def _gdn_layout(tokens: int, tp: int = 1, sp: bool = False):
    from meshplan.arithmetic.activations import MOE_BYTES, Layout, attention_saves
    from meshplan.arithmetic.memory_states import memory_card

    conv = memory_card().conventions["megatron"]
    return Layout(tokens=tokens, seq_kv=tokens, tp=tp, sp=sp, etp=1, flash=True, dropout=False,
                  swiglu_unfused=conv.swiglu_unfused, fp8=False, moe=MOE_BYTES[conv.moe_activations],
                  attn=attention_saves(conv), gdn=memory_card().gdn_layer.terms())


@pytest.mark.parametrize("tp, sp", [(1, False), (2, True), (4, False)])
def test_a_gdn_layer_saves_what_megatron_cores_gated_delta_net_and_fla_keep(tp, sp):
    """Per token, Qwen3-Next's widths (hidden 2048, in_proj 12352, q and k 2 x 2048 and 2 x 32 x 128 at the value
    heads, value 4096, 32 value heads, chunk 64): the norm input and in_proj's input (2 + 2 over hidden, over TP
    under SP only), in_proj's output (2 x 12352, the conv's saved view), l2norm's output (2 x 4096), the kernel's q and
    k (2 x 8192), v (2 x 4096), g, beta and softplus' input (10 per head), A (2 x 32 x 64), the gated norm's input
    (2 x 4096), its rstd (4 per head), its output and fp32 gate (10 x 4096) and out_proj's input (2 x 4096). With
    gdn_norm_out the norm's rstd, output, fp32 gate and out_proj's input go and its checkpoint keeps the bf16 gate."""
    from meshplan.arithmetic.activations import shape_of
    from meshplan.arithmetic.mamba import hybrid_layer_activations

    arch = architecture_from_config(QWEN3_NEXT_80B)
    shape, t = shape_of(arch), 4096
    lay = _gdn_layout(t, tp, sp)
    hidden = (2 + 2) * 2048 / (tp if sp else 1)
    mixer = (2 * 12352 + 2 * 4096 + 2 * 8192 + 2 * 4096 + 10 * 32 + 2 * 32 * 64 + 2 * 4096) / tp
    norm = (4 * 32 + 10 * 4096 + 2 * 4096) / tp
    assert hybrid_layer_activations(shape, lay, "G", "none") == {"gdn": pytest.approx(t * (hidden + mixer + norm))}
    kept = hybrid_layer_activations(shape, lay, "G", "selective", ("gdn_norm_out",))
    assert kept == {"gdn": pytest.approx(t * (hidden + mixer + 2 * 4096 / tp))}
    assert hybrid_layer_activations(shape, lay, "G", "full") == {"layer_input": pytest.approx(2 * t * 2048 /
                                                                                              (tp if sp else 1))}


def test_gated_attention_keeps_its_gate_and_the_output_it_scales():
    """Megatron-Core's Attention._apply_output_gate keeps the gate and the core output beside out_proj's input: two
    query-wide bf16 tensors more than the same attention without the gate."""
    from meshplan.arithmetic.activations import shape_of
    from meshplan.arithmetic.mamba import hybrid_layer_activations

    arch = architecture_from_config(QWEN3_NEXT_80B)
    plain = arch.model_copy(update={"attention_output_gate": False})
    lay, t = _gdn_layout(4096), 4096
    gated = hybrid_layer_activations(shape_of(arch), lay, "*", "none")["attention"]
    assert gated - hybrid_layer_activations(shape_of(plain), lay, "*", "none")["attention"] == \
        pytest.approx(2 * 2 * t * 16 * 256)


def test_memory_holds_the_gdn_weights_split_over_tp():
    """Every parameter is on some GPU once (tp 2, pp 4, ep 8: the stages' params times tp for the TP-split part); the
    Gated DeltaNet mixers are among the TP-split weights, not left out."""
    from meshplan.estimate.memory_terms import param_table

    arch = api.describe_model("qwen3-next-80b-a3b").architecture
    table = param_table(arch)
    gdn = sum(layer_params(arch, i).get("gdn", 0) for i in range(arch.num_layers))
    assert gdn == 36 * gdn_params(arch)
    split = sum(p["attention"] + p["shared_experts"] + p.get("gdn", 0)
                for p in (layer_params(arch, i) for i in range(arch.num_layers)))
    assert sum(table.tp_sharded) == split
    report = api.estimate_memory(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64,
                                                "tp": 2, "pp": 4, "ep": 8, "framework": "megatron-core"}))
    assert len(report.stages) == 4 and all(s.weights_bytes > 0 for s in report.stages)
    assert any("Gated DeltaNet" in a for a in report.assumptions)


# --------------------------------------------------------------------------- FLOPs and time


def test_model_flops_are_megatron_lms_gdn_layer_flops_and_gated_attention():
    """megatron/training/training.py (core_v0.19.0): gdn_layer_flops 2 x (h (2 qk + 2 v + 2 heads_v) + kernel (2 qk +
    v) + 4 heads_v d_v^2 + h v) per G layer; transformer_flops' attention with the gate's projection (q-sized) beside
    q, k and v; MoE 4 h (f_e top-k + f_shared) x 1.5 (SwiGLU); logits 2 h V; all x3."""
    from meshplan.arithmetic.flops import gdn_layer_flops, model_flops_per_token

    arch = architecture_from_config(QWEN3_NEXT_80B)
    h, s, q = 2048, 4096, 16 * 256
    gdn = 2 * (h * (2 * 2048 + 2 * 4096 + 64) + 4 * (2 * 2048 + 4096) + 4 * 32 * 128 ** 2 + h * 4096)
    assert gdn_layer_flops(arch) == gdn
    p = q / h
    attention = 4 * h * p * (h + h * 2 / 16) + 2 * s * h * p + 2 * h * p * h
    moe = 4 * (h * 512 * 10 + h * 512) * 1.5
    expected = 3 * (36 * gdn + 12 * attention + 48 * moe + 2 * h * 151936)
    assert model_flops_per_token(arch, s) == pytest.approx(expected, rel=1e-12)


def test_the_chunked_rule_is_flas_per_chunk_matmuls():
    """fla/ops/gated_delta_rule/chunk.py at chunk 64, d_k = d_v = 128, per value head and token: K K^T 2 C d_k, the
    triangular inverse 2 C^2 / 3, w and u 2 C (d_k + d_v), the state 4 d_k d_v, the output 2 d_k d_v + 2 C (d_k + d_v);
    the conv 2 x 4 taps over 8192 channels; the backward runs w, u and h again."""
    from meshplan.arithmetic.flops import Shard
    from meshplan.arithmetic.gdn import gdn_rule_flops

    arch = architecture_from_config(QWEN3_NEXT_80B)
    c, d = 64, 128
    per_head = 2 * c * d + 2 * c * c / 3 + 2 * c * 2 * d + 4 * d * d + 2 * d * d + 2 * c * 2 * d
    for tp in (1, 2):
        forward, again = gdn_rule_flops(arch, Shard(tokens=1000, tp=tp, ep=1, etp=1, sp=False))
        assert forward == pytest.approx(1000 * (32 / tp * per_head + 2 * 4 * 8192 / tp))
        assert again == pytest.approx(1000 * 32 / tp * (2 * c * 2 * d + 4 * d * d))


def test_a_gdn_layer_is_its_gemms_its_passes_and_its_rule():
    """The G layer: in_proj and out_proj through the GEMM model; beside them the card's bf16 passes at HBM speed and
    the chunked rule's FLOPs x 3 plus what the backward recomputes at the GEMMs' asymptote; under CP two all-to-alls
    (in_proj's output and the norm's output) each way."""
    from meshplan.arithmetic.gdn import gdn_gemms, gdn_rule_flops
    from meshplan.arithmetic.gemm import gemm_seconds
    from meshplan.estimate.perf import step_terms
    from meshplan.request.resolve import resolve

    job, plan = resolve(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "tp": 2,
                                       "pp": 4, "ep": 8, "framework": "megatron-core"}))
    t = step_terms(job, plan)
    ctx, cal = t.ctx, t.ctx.cal
    lt = t.inputs.hybrid["G"]
    assert set(t.inputs.hybrid) == {"G", "*", "E"}
    assert lt.gemm == pytest.approx(gemm_seconds(gdn_gemms(ctx.arch, ctx.shard), cal, ctx.bf16_peak, None))
    tokens = ctx.shard.tokens
    passes = (32 * 32 * 128 + 37 * 4096 + 7 * 8192 + 8 * 32 * 64 + 6 * 32 * 128 * 128 / 64) * 2
    forward, again = gdn_rule_flops(ctx.arch, ctx.shard)
    mixer = tokens * passes / 2 / ctx.hbm + (3 * forward + again) / (ctx.bf16_peak * cal.gemm_peak_fraction)
    hidden = cal.elementwise_passes * 2 * tokens * 2048 * 0.5 / (2 if ctx.plan.sequence_parallel else 1) / ctx.hbm
    assert lt.elementwise == pytest.approx(mixer + hidden, rel=1e-12)
    assert lt.attention == 0 and lt.cp == 0 and lt.ep == 0
    # gdn_norm_out runs the gated norm's forward again: reads o and z, writes its output (3 bf16 passes, value width)
    assert lt.module_fwd["gdn_norm_out"] == pytest.approx(3 * 2 * tokens * 4096 / 2 / ctx.hbm, rel=1e-12)
    cp_terms = step_terms(*resolve(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64,
                                                  "tp": 2, "cp": 2, "pp": 4, "ep": 8,
                                                  "framework": "megatron-core"})))
    assert cp_terms.inputs.hybrid["G"].cp > 0



@pytest.mark.parametrize("name", ["gdn_key_passes", "gdn_value_passes", "gdn_conv_passes", "gdn_chunk_passes",
                                  "gdn_state_passes"])
def test_each_gdn_pass_count_is_the_sum_its_source_itemises(name):
    """cards/calibration.yaml counts each Gated DeltaNet constant kernel by kernel, one pass per tensor read or written,
    each item's count in brackets ("(2)", "(q, k: 2)", "(3; ...)"): the value is their sum, so a kernel added to or
    dropped from the source without the value moving (or the reverse) is caught."""
    import re

    from meshplan.knowledge.calibration import calibration_card

    constant = calibration_card().constants[name]
    items = [int(n) for n in re.findall(r"(?:\(|: )(\d+)(?:\)|;)", constant.source)]
    assert len(items) >= 4 and sum(items) == constant.value, (items, constant.value)


def test_the_chunk_size_and_the_gated_norm_passes_are_the_cards_read_through_the_job():
    """FLA's chunk length (64) was a default of the schema's GatedDeltaNetSpec and the gated norm's recomputed passes
    (3) a literal of estimate/hybrid_time.py: both now cards/calibration.yaml's (gdn_kernel.chunk_size with FLA's
    source, constant gdn_norm_passes with Megatron-Core's), the first written into the resolved model by the config
    reader, the second read from the job's calibration; another value in either moves the estimate."""
    from meshplan.estimate.perf import step_terms
    from meshplan.knowledge.calibration import calibration, calibration_card
    from meshplan.request.resolve import resolve

    card = calibration_card()
    assert card.gdn_kernel.chunk_size == 64 and "chunk_size: int = 64" in card.gdn_kernel.source
    assert card.constants["gdn_norm_passes"].value == 3 and "_apply_gated_norm" in card.constants[
        "gdn_norm_passes"].source
    job, plan = resolve(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "tp": 2,
                                       "pp": 4, "ep": 8, "framework": "megatron-core"}))
    assert job.model.gdn.chunk_size == card.gdn_kernel.chunk_size
    cal = calibration(job.framework)
    norm = step_terms(job, plan).inputs.hybrid["G"].module_fwd["gdn_norm_out"]
    doubled = step_terms(job, plan, cal.with_overrides(gdn_norm_passes=2 * cal.gdn_norm_passes))
    assert doubled.inputs.hybrid["G"].module_fwd["gdn_norm_out"] == pytest.approx(2 * norm, rel=1e-12)
    wider = job.model_copy(update={"model": job.model.model_copy(update={
        "gdn": job.model.gdn.model_copy(update={"chunk_size": 128})})})
    g_time = step_terms(job, plan).inputs.hybrid["G"]
    assert step_terms(wider, plan).inputs.hybrid["G"].elementwise != g_time.elementwise


# --------------------------------------------------------------------------- rules and search


def test_gdn_norm_out_is_a_recompute_module_of_gdn_models_only():
    """Megatron-Core's TransformerConfig: gdn_norm_out only with experimental_attention_variant gated_delta_net."""
    ok = api.check_config(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "ep": 8,
                                         "pp": 4, "recompute": "selective",
                                         "recompute_modules": ["gdn_norm_out", "moe_act"]}))
    assert "RC004" not in {f.id for f in ok.findings}
    bad = api.check_config(parse_request({"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8,
                                          "recompute": "selective", "recompute_modules": ["gdn_norm_out"]}))
    assert "RC004" in {f.id for f in bad.findings}


def test_tp_times_cp_must_divide_the_gdn_heads():
    """16 key heads: tp 2 x cp 16 = 32 does not divide them (TP007), tp 2 x cp 8 does."""
    bad = api.check_config(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 32, "tp": 2,
                                          "cp": 16}))
    finding = next(f for f in bad.findings if f.id == "TP007")
    assert "16 key heads" in finding.message and "32 value heads" in finding.message
    ok = api.check_config(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 16, "tp": 2,
                                         "cp": 8}))
    assert "TP007" not in {f.id for f in ok.findings}


@pytest.mark.parametrize("framework, rule_id", [("torchtitan", "HY003"), ("deepspeed", "HY003"),
                                                ("verl", "HY004"), ("nemo-automodel", "HY004")])
def test_frameworks_without_megatron_cores_gdn_refuse_it_naming_the_ones_that_run_it(framework, rule_id):
    report = api.check_config(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64,
                                             "framework": framework}))
    finding = next(f for f in report.findings if f.id == rule_id)
    assert "megatron-bridge or megatron-core" in finding.fix
    assert "HY001" not in {f.id for f in report.findings}  # the Mamba-2 rules stay Mamba-2's


def test_recommend_ranks_qwen3_next_on_64_h100():
    """`meshplan recommend qwen3-next-80b-a3b --gpu h100 --num-gpus 64` through the api: a ranked answer whose every
    layout passes the Gated DeltaNet rule (tp x cp divides 16) and fits."""
    report = api.recommend(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64}))
    assert len(report.candidates) >= 3
    speeds = [c.throughput.tokens_per_s_per_gpu for c in report.candidates]
    assert speeds == sorted(speeds, reverse=True)
    for c in report.candidates:
        assert 16 % (c.plan.tp * c.plan.cp) == 0
        assert c.memory.fits


@pytest.mark.parametrize("framework", ["megatron-bridge", "megatron-core"])
def test_both_megatron_faces_interleave_a_gdn_hybrid_in_whole_decoder_layers(framework):
    """Megatron-Core's GPTModel path (pretrain_gpt.py --experimental-attention-variant gated_delta_net) and Megatron-
    Bridge's Qwen3NextBridge build one TransformerLayer per decoder layer and interleave, so the measured layout
    (Megatron-Bridge's MoE perf card: 64 GB200, TP1 PP2 VPP4 EP32, 6 decoder layers per virtual chunk) is estimated
    on both. Before: megatron-core rendered HybridModel (pretrain_mamba.py) and PP018 refused any vpp there. A chunk
    of an odd number of pattern layers cuts a decoder layer (PP017) on both."""
    fields = {"model": "qwen3-next-80b-a3b", "gpu": "gb200", "num_gpus": 64, "pp": 2, "vpp": 4, "ep": 32,
              "micro_batch_size": 2, "framework": framework}
    report = api.check_config(parse_request(fields))
    assert not [f for f in report.findings if f.severity == "error"], report.findings
    assert api.estimate_throughput(parse_request(fields)).step_time_s > 0
    odd = api.check_config(parse_request({**fields, "vpp": 16}))
    assert "PP017" in {f.id for f in odd.findings}  # 48 pattern layers per rank, 3 per chunk: a decoder layer cut


def test_recommend_searches_virtual_stages_of_a_gdn_hybrid_on_megatron_core():
    """With pp fixed at 2 on 64 GB200, megatron-core's search ranks interleaved layouts of whole decoder layers (it
    found none before: PP018 refused every vpp > 1), the embedding / loss accounting in decoder layers among them
    (check/split.model_pipeline_options: the search's splits in decoder layers; it enumerated pattern-layer splits,
    PP017 refused those that cut a decoder layer and every layout); no candidate breaks a rule and every chunk holds
    whole decoder layers."""
    from meshplan.arithmetic.schedule import plan_stages
    from meshplan.check.config import check_structure
    from meshplan.knowledge.gdn_config import cuts_a_decoder_layer
    from meshplan.request.resolve import resolve

    req = parse_request({"model": "qwen3-next-80b-a3b", "gpu": "gb200", "num_gpus": 64, "pp": 2, "ep": 32,
                         "framework": "megatron-core"})
    report = api.recommend(req)
    assert any(c.plan.vpp > 1 for c in report.candidates), [c.plan.short for c in report.candidates]
    job, _ = resolve(req)
    for c in report.candidates:
        assert not [f.id for f in check_structure(job, c.plan) if f.severity == "error"], c.plan.short
        chunks = plan_stages(job, c.plan).chunks
        assert not any(cuts_a_decoder_layer(len(chunk)) for rank in chunks for chunk in rank), c.plan.short


@pytest.mark.parametrize("fields", [
    dict(gpu="h200", num_gpus=16, seq_length=4096, global_batch_size=64, ep=16, framework="megatron-bridge"),
    dict(gpu="h200", num_gpus=16, seq_length=4096, global_batch_size=64, ep=8, framework="megatron-core"),
    # long sequences, where CP is ranked: its share of a rank's CP traffic counts the G layers' all-to-alls
    dict(gpu="b200", num_gpus=16, seq_length=16384, global_batch_size=32, ep=16, framework="megatron-bridge"),
])
def test_the_search_finds_the_oracles_top_k_on_qwen3_next(fields):
    """The hybrid bounds (a stage's least layer of each kind) hold with Gated DeltaNet layers: the search's top 3 are
    the exhaustive oracle's (search/oracle.py)."""
    from meshplan.schema.request import Request
    from meshplan.search import exhaustive_top_k, recommend

    req = Request(model="qwen3-next-80b-a3b", **fields)
    rec = recommend(req, top_k=3)
    oracle = exhaustive_top_k(req, 100)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle[:3]], rel=1e-12)
    assert len(rec.candidates) == 3
    if fields["framework"] == "megatron-bridge":  # PP017: Bridge counts a hybrid's layout in decoder layers
        assert all(c.plan.pipeline_layout is None for c in rec.candidates)


def test_an_mtp_block_asked_of_qwen3_next_is_a_full_attention_decoder_layer():
    """config.json states no MTP depth (the total leaves the checkpoint's mtp.* out); asked (Megatron-Bridge's
    qwen3_next recipes set mtp_num_layers 1) the block is one gated-attention layer and one MoE layer ('*E'), with
    its enorm, hnorm, final norm and eh_proj (2h -> h), trained on the last stage."""
    from meshplan.knowledge.model_counts import mtp_params
    from meshplan.request.resolve import resolve

    arch = architecture_from_config(QWEN3_NEXT_80B)
    assert arch.num_mtp_layers == 0 and arch.mtp_layer_pattern == "*E" and mtp_params(arch) == 0
    job, _ = resolve(parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "pp": 4,
                                    "ep": 8, "framework": "megatron-bridge", "mtp_num_layers": 1}))
    h = 2048
    attention, moe = sum(layer_params(arch, 6).values()), sum(layer_params(arch, 7).values())
    assert job.model.num_mtp_layers == 1
    assert mtp_params(job.model) == 3 * h + 2 * h * h + attention + moe


@pytest.mark.parametrize("mixers, freq", [("GGG*" * 12, 4), ("*" * 4, 1), ("G*G*", 2), ("G*GG", [1, 0, 1, 1]),
                                           ("GGGG", [1, 1, 1, 1])])
def test_linear_attention_freq_is_megatron_cores_int_or_its_per_layer_list(mixers, freq):
    """Megatron-Core's get_linear_attention_pattern: an int N makes every N-th decoder layer full attention (0) and
    the rest Gated DeltaNet (1); a list gives each layer's flag. A pattern no N reproduces (layer_types of the
    user's own) is written as the list, which expands back to the mixers either way."""
    from meshplan.adapters.architecture import linear_attention_freq

    pattern = "".join(m + "E" for m in mixers)
    got = linear_attention_freq(pattern)
    assert got == freq
    flags = got if isinstance(got, list) else [0 if (i + 1) % got == 0 else 1 for i in range(len(mixers))]
    assert "".join("G" if f else "*" for f in flags) == mixers


def test_render_writes_megatron_cores_gpt_model_path_and_bridges_same_fields():
    """Megatron-Core: pretrain_gpt.py with --num-layers in decoder layers, --experimental-attention-variant
    gated_delta_net (megatron-core 0.19.2's only spelling), --linear-attention-freq, the --linear-* shapes and
    --attention-output-gate (Megatron-LM's gpt3_mcore_te_tp2_pp1_gdn test names them), its split in decoder layers;
    Megatron-Bridge: Qwen3NextBridge's GPTModel fields. Neither writes a hybrid pattern. Before: pretrain_mamba.py
    with --hybrid-layer-pattern, which took no virtual stages."""
    req = parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "pp": 4, "ep": 8,
                         "first_stage_layers": 22, "last_stage_layers": 26, "mtp_num_layers": 1})
    core = api.render_config("megatron-core", req, force=True).text
    assert "pretrain_gpt.py" in core and "pretrain_mamba.py" not in core and "hybrid" not in core
    for flag in ("--num-layers 48", "--experimental-attention-variant gated_delta_net", "--linear-attention-freq 4",
                 "--linear-num-key-heads 16", "--linear-num-value-heads 32", "--linear-key-head-dim 128",
                 "--linear-value-head-dim 128", "--linear-conv-kernel-dim 4", "--attention-output-gate",
                 "--rotary-percent 0.25", "--apply-layernorm-1p", "--moe-shared-expert-gate", "--mtp-num-layers 1",
                 "--decoder-first-pipeline-num-layers 11", "--decoder-last-pipeline-num-layers 13"):
        assert flag in core, flag
    assert "--moe-layer-freq" not in core  # every decoder layer MoE: Megatron's default 1
    bridge = api.render_config("megatron-bridge", req, force=True).text
    for line in ("cfg.model.experimental_attention_variant = 'gated_delta_net'", "cfg.model.linear_attention_freq = 4",
                 "cfg.model.attention_output_gate = True", "cfg.model.num_layers_in_first_pipeline_stage = 11",
                 "cfg.model.num_layers_in_last_pipeline_stage = 13"):
        assert line in bridge, line
    assert "hybrid_layer_pattern" not in bridge
    even = req.model_copy(update={"first_stage_layers": None, "last_stage_layers": None, "vpp": 2})
    vpp = api.render_config("megatron-core", even, force=True).text
    assert "--num-layers-per-virtual-pipeline-stage 6" in vpp  # 48 decoder layers over pp 4 x vpp 2
    for framework in ("megatron-bridge", "megatron-core"):
        with pytest.raises(MeshplanError, match="a stage of 23 pattern layers cuts a decoder layer in two"):
            api.render_config(framework, req.model_copy(update={"first_stage_layers": 23, "last_stage_layers": 25}),
                              force=True)


@pytest.mark.parametrize("layer_types, moe", [(None, None), (["full_attention"] + ["linear_attention"] * 47, None),
                                              (None, [0, 5])])
def test_the_gpt_model_script_imports_back_as_the_same_model_and_split(tmp_path, layer_types, moe):
    """render megatron-core then import: the GPTModel flags (--num-layers 48, --linear-attention-freq, --moe-layer-freq
    over decoder layers) read back as the model's 96-layer pattern, and the decoder-layer stage sizes as pattern
    layers; also for a config of the user's own with another mixer order (a per-layer list) or dense decoder layers
    (mlp_only_layers). A Bridge file's sizes double once the model is given beside it."""
    import json

    cfg = dict(QWEN3_NEXT_80B)
    if layer_types:
        cfg["layer_types"] = layer_types
    if moe:
        cfg["mlp_only_layers"] = moe
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    fields = {"model": str(path) if layer_types or moe else "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64,
              "pp": 4, "ep": 8, "micro_batch_size": 1, "global_batch_size": 256, "first_stage_layers": 22,
              "last_stage_layers": 26}
    text = api.render_config("megatron-core", parse_request({**fields, "framework": "megatron-core"}), force=True).text
    if layer_types:
        assert "--linear-attention-freq '[0,1,1,1" in text
    if moe:
        assert "--moe-layer-freq '[0,1,1,1,1,0,1" in text
    read = api.import_config(text)
    if layer_types or moe:  # no catalog model: the pattern is compared, and the nearest named
        assert "model" not in read.request
        assert any("differs in" in u and "--linear-attention-freq" in u for u in read.unresolved), read.unresolved
        back = api.request_from_config(read, {"model": str(path)})
    else:
        assert read.request["model"] == "qwen3-next-80b-a3b" and read.unsupported == [] and read.unresolved == []
        back = api.request_from_config(read, {"gpu": "h100"})
    assert (back.first_stage_layers, back.last_stage_layers) == (22, 26)
    assert api.check_config(back).plan.pp == 4
    bridge = api.render_config("megatron-bridge", parse_request({**fields, "framework": "megatron-bridge"}),
                               force=True).text
    read = api.import_config(bridge, framework="megatron-bridge")
    assert read.request["first_stage_layers"] == 11 and read.stage_sizes_in_decoder_layers
    back = api.request_from_config(read, {"model": fields["model"], "num_gpus": 64, "gpu": "h100"})
    assert (back.first_stage_layers, back.last_stage_layers) == (22, 26)


def test_a_gdn_variant_without_its_frequency_is_said_not_read():
    """megatron-core's TransformerConfig asserts linear_attention_freq with gated_delta_net: a script without it
    names no model meshplan can read, and says why."""
    req = parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "pp": 4, "ep": 8,
                         "framework": "megatron-core"})
    text = api.render_config("megatron-core", req).text.replace("--linear-attention-freq 4", "")
    read = api.import_config(text)
    assert "model" not in read.request
    assert any("without a linear attention frequency" in u for u in read.unresolved), read.unresolved


@pytest.mark.parametrize("model_type, total, pattern", [
    ("qwen3_5_moe_text", 34_660_610_688, "GEGEGE*E" * 10),
    ("qwen3_5_text", 8_953_803_264, "G-G-G-*-" * 8),
])
def test_qwen3_5s_language_models_count_what_transformers_builds(model_type, total, pattern):
    """Qwen3.5's language models (transformers 5.9.0 Qwen3_5MoeTextConfig / Qwen3_5TextConfig at their defaults,
    built as Qwen3_5MoeForCausalLM / Qwen3_5ForCausalLM on the meta device: sum(p.numel())): the same Gated DeltaNet,
    gated attention and MoE layers as Qwen3-Next (in_proj split into qkv, z, b, a: the same widths), every layer MoE
    or every layer a dense SwiGLU MLP."""
    from meshplan.knowledge.model_counts import total_params

    arch = architecture_from_config({"model_type": model_type})
    assert total_params(arch) == total
    assert arch.layer_pattern == pattern and arch.attention_output_gate


def test_qwen3_5s_vision_language_config_is_refused_naming_its_text_config():
    with pytest.raises(MeshplanError, match=r"vision tower.*qwen3_5_moe_text"):
        architecture_from_config({"model_type": "qwen3_5_moe", "text_config": {}, "vision_config": {}})


def test_pp017_names_the_chunk_that_cuts_a_decoder_layer():
    """At pp=2, vpp=16 each stage holds 48 pattern layers (even) in chunks of 3 (odd): PP017 said 'a stage (or virtual
    chunk) of 48 pattern layers cuts a decoder layer', naming the even count; it names the chunk now."""
    from meshplan import api
    from meshplan.schema.request import Request

    found = {f.id: f for f in api.check_config(Request(model="qwen3-next-80b-a3b", framework="megatron-bridge",
                                                       gpu="h100", num_gpus=64, pp=2, vpp=16, ep=8)).findings}
    assert found["PP017"].message.startswith("pp=2: a virtual chunk of 3 pattern layers (a stage of 48 over vpp=16)")


@pytest.mark.parametrize("fields, what", [
    # stages of 22 and 26 pattern layers (even) in chunks of 11 and 13 (odd)
    ({"vpp": 2, "first_stage_layers": 22, "last_stage_layers": 22},
     "a virtual chunk of 11 pattern layers (a stage of 22 over vpp=2) cuts a decoder layer in two"),
    ({"first_stage_layers": 23, "last_stage_layers": 25}, "a stage of 23 pattern layers cuts a decoder layer in two"),
])
def test_render_and_pp017_refuse_the_same_split_in_the_same_words(fields, what):
    """PP017 and render's decoder_split tested a Gated DeltaNet hybrid's split each with its own arithmetic: render
    looked at the first / last stage sizes and the middle stage's count, never at an uneven split's chunks, nor at
    embedding / loss accounting, so a forced render wrote what the rule refused. One function
    (arithmetic/schedule.decoder_layer_cut) answers both, in the same words."""
    req = parse_request({"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "pp": 4, "ep": 8,
                         "framework": "megatron-bridge", **fields})
    found = {f.id: f for f in api.check_config(req).findings}
    assert found["PP017"].message.startswith(f"pp=4: {what}."), found["PP017"].message
    with pytest.raises(MeshplanError, match=re.escape(f"(two layers of meshplan's pattern): {what}.")):
        api.render_config("megatron-bridge", req, force=True)
    even = req.model_copy(update={"vpp": 1, "first_stage_layers": None, "last_stage_layers": None,
                                  "account_for_embedding": None})
    assert "PP017" not in {f.id for f in api.check_config(even).findings}
    assert "cfg.model.pipeline_model_parallel_size = 4" in api.render_config("megatron-bridge", even).text


GDN_LAYOUTS = [  # (fields, accepted): the GPTModel path interleaves whole decoder layers
    ({"pp": 2, "vpp": 4, "ep": 32, "gpu": "gb200"}, True),  # Megatron-Bridge's perf card layout: 6 per chunk
    ({"pp": 4, "ep": 8, "first_stage_layers": 22, "last_stage_layers": 26}, True),
    ({"pp": 4, "vpp": 3, "ep": 8}, True),  # 4 decoder layers per chunk
    ({"pp": 2, "tp": 2, "cp": 2, "ep": 8, "vpp": 2}, True),
    ({"pp": 2, "tp": 2, "cp": 16, "ep": 8}, False),  # TP007: tp x cp = 32 splits no 16 key heads
    # a layout's t and the embedding / loss accounting count decoder layers (before: PP017 refused them all)
    ({"pp": 4, "ep": 8, "pipeline_layout": "Et*11|t*12|t*12|t*13L"}, True),
    ({"pp": 4, "vpp": 2, "ep": 8, "pipeline_layout": "Et*5|(t*6|)*6t*7L"}, True),
    ({"pp": 2, "ep": 8, "account_for_embedding": True, "account_for_loss": True}, True),  # 50 over 2: 24 and 24
    ({"pp": 2, "vpp": 5, "ep": 8, "account_for_embedding": True, "account_for_loss": True}, True),  # chunks of 5
    ({"pp": 3, "ep": 8, "account_for_loss": True}, False),  # PP009: 49 do not split over 3
    ({"pp": 4, "ep": 8, "pipeline_layout": "Et*23|t*24|t*24|t*25L"}, False),  # PP009: 96 t, the model 48
    ({"pp": 4, "vpp": 5, "ep": 8}, False),  # PP002: 12 decoder layers a rank in 5 chunks (it passed check before)
]


@pytest.mark.slow
def test_megatron_core_builds_the_rendered_gpt_model_as_meshplan_plans_it():
    """Every rendered pretrain_gpt.py command line of Qwen3-Next run through megatron-core 0.19.2's own parse_args,
    validate_args and TransformerConfig (in the validators venv, tests/framework_probes/megatron_gdn_probe.py):
    accepted exactly where check passes, and what it builds is the plan: each decoder layer's mixer and MLP
    (get_linear_attention_pattern, get_moe_layer_pattern) are the model's pattern, and every pipeline rank's virtual
    stages hold, in decoder layers, half the pattern layers meshplan places there (get_transformer_layer_offset,
    get_num_layers_to_build)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from meshplan.arithmetic.schedule import plan_stages
    from meshplan.knowledge.gdn_config import decoder_pattern_from_flags
    from meshplan.request.resolve import resolve

    here = Path(__file__).parent / "framework_probes"
    sys.path.insert(0, str(here))
    import harness

    from meshplan.adapters.parse import shell_tokens

    cases, plans = [], []
    for i, (extra, _) in enumerate(GDN_LAYOUTS):
        fields = {"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "micro_batch_size": 1,
                  "global_batch_size": 512, "framework": "megatron-core", **extra}
        req = parse_request(fields)
        tokens = shell_tokens(api.render_config("megatron-core", req, force=True).text)
        cases.append({"id": i, "argv": tokens[tokens.index("pretrain_gpt.py") + 1:], "num_gpus": 64})
        plans.append((req, resolve(req)))
    spec = harness.FRAMEWORKS["megatron-core"]
    proc = subprocess.run([str(harness.validators_python()), str(here / "megatron_gdn_probe.py")],
                          input=json.dumps(cases), capture_output=True, text=True, env=harness.probe_env(spec),
                          timeout=1200, cwd=str(here))
    assert proc.returncode == 0, proc.stderr[-4000:]
    for verdict, (extra, _), (req, (job, plan)) in zip(json.loads(proc.stdout), GDN_LAYOUTS, plans, strict=True):
        errors = [f.id for f in api.check_config(req).findings if f.severity == "error" and f.id != "MEM001"]
        assert verdict["accept"] is (not errors), (extra, verdict["stage"], verdict["message"], errors)
        if not verdict["accept"]:
            continue
        assert decoder_pattern_from_flags(verdict["linear"], verdict["moe"]) == job.model.layer_pattern
        ours = [[(c[0] // 2, len(c) // 2) for c in chunks] for chunks in plan_stages(job, plan).chunks]
        assert [[tuple(c) for c in chunks] for chunks in verdict["chunks"]] == ours, (extra, verdict["chunks"])


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
@pytest.mark.parametrize("split, decoder_counts", [
    ({"pp": 4, "pipeline_layout": "Et*11|t*12|t*12|t*13L"}, [11, 12, 12, 13]),
    ({"pp": 4, "vpp": 2, "pipeline_layout": "Et*5|(t*6|)*6t*7L"}, [5, 6, 6, 6, 6, 6, 6, 7]),
    # (48 + 2) / 2 = 25 decoder layers a rank, 5 a chunk, the first chunk and the last one decoder layer lighter
    ({"pp": 2, "vpp": 5, "account_for_embedding": True, "account_for_loss": True}, [4, 5, 5, 5, 5, 5, 5, 5, 5, 4]),
    ({"pp": 7, "num_gpus": 56, "account_for_embedding": True}, [6, 7, 7, 7, 7, 7, 7]),  # 49 over 7
])
def test_a_layout_and_the_accounting_count_decoder_layers_as_the_gpt_model_does(framework, split, decoder_counts):
    """A pipeline_model_parallel_layout's t is one of the GPTModel's TransformerLayers, a decoder layer, and
    account_for_embedding / account_for_loss_in_pipeline_split weigh the embedding and the loss as one each
    (get_num_layers_to_build, get_layer_id_list; the slow probe runs megatron-core's own): the estimate places twice
    those counts of pattern layers, render writes the split as it is and import reads it back to the same plan.
    Before: PP017 refused every layout and accounting of a Gated DeltaNet hybrid ('counts meshplan's pattern
    layers'), and render refused them."""
    from meshplan.arithmetic.schedule import plan_stages
    from meshplan.request.resolve import resolve

    fields = {"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "ep": 8, "micro_batch_size": 1,
              "global_batch_size": 448, "framework": framework, **split}
    req = parse_request(fields)
    errors = [f.id for f in api.check_config(req).findings if f.severity == "error" and f.id != "MEM001"]
    assert errors == [], [(f.id, f.message) for f in api.check_config(req).findings if f.id in errors]
    job, plan = resolve(req)
    stages = plan_stages(job, plan)
    pp = split["pp"]
    assert [len(stages.chunks[k % pp][k // pp]) for k in range(len(decoder_counts))] == [2 * n for n in
                                                                                          decoder_counts]
    text = api.render_config(framework, req, force=True).text  # (PP2 VPP5 needs more than an H100: MEM001)
    if "pipeline_layout" in split:
        assert split["pipeline_layout"] in text
    read = api.import_config(text, framework=framework)
    back = api.request_from_config(read, {"model": "qwen3-next-80b-a3b", "num_gpus": fields["num_gpus"], "gpu": "h100"})
    _, again = resolve(back)
    assert (again.pp, again.vpp, again.pipeline_layout, again.account_for_embedding, again.account_for_loss) == (
        pp, split.get("vpp", 1), split.get("pipeline_layout"), bool(split.get("account_for_embedding")),
        bool(split.get("account_for_loss")))
    assert plan_stages(job, again).chunks == stages.chunks


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_recompute_layers_are_rendered_in_decoder_layers(framework):
    """recompute_num_layers counts the GPTModel's TransformerLayers (decoder layers, two pattern layers each): render
    wrote meshplan's pattern-layer count, so a block recompute of 4 pattern layers recomputed 4 decoder layers, 8
    pattern layers. It writes 2 now and import reads 4 back; an odd count is refused by RC007 with an even fix."""
    fields = {"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "pp": 4, "ep": 8,
              "framework": framework, "recompute": "full", "recompute_method": "block"}
    req = parse_request({**fields, "recompute_layers": 4})
    text = api.render_config(framework, req).text
    assert ("--recompute-num-layers 2" if framework == "megatron-core" else "recompute_num_layers = 2") in text
    read = api.import_config(text, framework=framework)
    back = api.request_from_config(read, {"model": "qwen3-next-80b-a3b", "num_gpus": 64, "gpu": "h100"})
    assert (back.recompute, back.recompute_layers, back.recompute_method) == ("full", 4, "block")
    odd = parse_request({**fields, "recompute_layers": 3})
    found = {f.id: f for f in api.check_config(odd).findings}
    assert found["RC007"].fix.startswith("Use recompute_layers=2 (1 decoder layer)")
    fixed = parse_request({**fields, "recompute_layers": 2})
    assert "RC007" not in {f.id for f in api.check_config(fixed).findings}
    with pytest.raises(MeshplanError, match="RC007"):
        api.estimate_memory(odd)


def test_full_recompute_of_every_layer_keeps_each_decoder_layers_input_as_the_gpt_model_checkpoints():
    """Full recompute of every layer is Megatron's uniform method with one TransformerLayer a chunk (render writes
    recompute_num_layers 1): on the GPTModel path a Gated DeltaNet hybrid's decoder layer, its mixer and its MoE,
    is one checkpoint, which keeps the decoder layer's input alone (transformer_block.py _checkpointed_forward), and
    its backward rebuilds both pattern layers. The estimate kept each pattern layer's input, the MoE layer's too (twice
    the bytes: 1.61 GB on stage 0 here where Megatron keeps 0.81 GB), and rebuilt one pattern layer. It is now the
    estimate of the same rendered config, uniform chunks of 2 pattern layers; block recompute of the first N pattern
    layers keeps the input of N / 2 decoder layers."""
    from meshplan.adapters.megatron import decoder_recompute
    from meshplan.estimate.memory import memory_terms
    from meshplan.request.resolve import resolve

    base = {"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "pp": 4, "ep": 8, "seq_length": 4096,
            "micro_batch_size": 1, "global_batch_size": 256, "framework": "megatron-core", "recompute": "full"}
    every = parse_request(base)
    pairs = parse_request({**base, "recompute_method": "uniform", "recompute_layers": 2})
    assert decoder_recompute(*resolve(every)) == decoder_recompute(*resolve(pairs))  # the same config rendered
    got, same = api.estimate_memory(every).stages[0].detail, api.estimate_memory(pairs).stages[0].detail
    assert got == same
    held, decoder, h = 4, 12, 2048  # 1F1B's first stage holds pp micro-batches; 24 pattern layers, 12 decoder layers
    assert got["layer_activations"] == held * decoder * 2 * 4096 * h  # one bf16 input per decoder layer
    job, plan = resolve(every)
    terms = memory_terms(job, plan, [])
    pattern = job.model.layer_pattern
    assert got["recompute_working_layer"] == max(
        terms.per_kind[(pattern[i], "none")] + terms.per_kind[(pattern[i + 1], "none")] for i in range(0, 24, 2))
    block = api.estimate_memory(parse_request({**base, "recompute_method": "block", "recompute_layers": 4}))
    kept = api.estimate_memory(parse_request({**base, "recompute": "none"})).stages[0].detail["layer_activations"]
    first_four = held * sum(terms.per_kind[(pattern[i], "none")] for i in range(4))
    assert block.stages[0].detail["layer_activations"] == pytest.approx(
        kept - first_four + held * 2 * 2 * 4096 * h, rel=1e-12)  # two decoder layers' inputs in their place


# Qwen3-Next as a user's pretrain_mamba.py builds it: Megatron-Core's HybridModel of the 96-layer pattern (what
# meshplan rendered for megatron-core before it wrote the GPTModel path)
HYBRID_MODEL_SCRIPT = """torchrun --nnodes 8 --nproc-per-node 8 pretrain_mamba.py \\
  --hidden-size 2048 --ffn-hidden-size 5120 --num-attention-heads 16 --group-query-attention --num-query-groups 2 \\
  --kv-channels 256 --seq-length 4096 --max-position-embeddings 262144 --normalization RMSNorm --norm-epsilon 1e-06 \\
  --apply-layernorm-1p --swiglu --position-embedding-type rope --rotary-base 10000000 --rotary-percent 0.25 \\
  --hybrid-layer-pattern '""" + "GEGEGE*E" * 12 + """' \\
  --linear-conv-kernel-dim 4 --linear-key-head-dim 128 --linear-value-head-dim 128 --linear-num-key-heads 16 \\
  --linear-num-value-heads 32 --attention-output-gate --qk-layernorm --untie-embeddings-and-output-weights \\
  --disable-bias-linear --num-experts 512 --moe-router-topk 10 --moe-ffn-hidden-size 512 --moe-grouped-gemm \\
  --moe-shared-expert-intermediate-size 512 --moe-shared-expert-gate \\
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 SPLIT --expert-model-parallel-size 8 \\
  --micro-batch-size 1 --global-batch-size 1024 --bf16
"""


@pytest.mark.parametrize("split, refused", [
    ("--num-virtual-stages-per-pipeline-rank 4", "vpp=4"),
    ("--account-for-embedding-in-pipeline-split", "account_for_embedding / account_for_loss is set"),
    ("", None),
])
def test_a_pretrain_mamba_script_of_a_gdn_hybrid_is_held_to_hybrid_models_split(split, refused):
    """pretrain_mamba.py builds the hybrid as Megatron-Core's HybridModel, whose select_pipeline_segment refuses
    virtual pipeline stages without '|' separators in --hybrid-layer-pattern (ValueError, megatron-core 0.19.2
    hybrid_layer_allocation.py) and whose split no layout or embedding / loss accounting reaches: the import refuses
    that script's split, as rule PP016 refuses it for a Mamba-2 hybrid. Before: since meshplan plans the model as the
    GPTModel pretrain_gpt.py builds (PP018 retired), the vpp=4 script passed check."""
    read = api.import_config(HYBRID_MODEL_SCRIPT.replace("SPLIT", split))
    assert read.request["model"] == "qwen3-next-80b-a3b" and read.builds_hybrid_model
    if refused is None:  # what meshplan plans otherwise than HybridModel runs is said (check's config_assumed)
        req = api.request_from_config(read, {"gpu": "h100"})
        assert "PP017" not in {f.id for f in api.check_config(req).findings}
        assert [line for line in read.assumed if "HybridModel builds the model layer by layer" in line and
                "(PP017)" in line and "each decoder layer's input" in line]
        return
    with pytest.raises(MeshplanError, match=re.escape(refused) + ".*HybridModel.*select_pipeline_segment"):
        api.request_from_config(read, {"gpu": "h100"})
    gpt = api.import_config(api.render_config("megatron-core", parse_request(
        {"model": "qwen3-next-80b-a3b", "gpu": "h100", "num_gpus": 64, "pp": 2, "vpp": 4, "ep": 8}),
        force=True).text)
    assert not gpt.builds_hybrid_model  # pretrain_gpt.py's GPTModel interleaves: the same vpp is read and checked
    assert api.request_from_config(gpt, {"gpu": "h100"}).vpp == 4
