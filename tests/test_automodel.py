"""NeMo AutoModel as a framework (cards/frameworks/nemo-automodel.yaml): what its renderer writes, what its reader
reads back from a recipe YAML, its rules' numbers, and the flex dispatcher its FSDP2 engine runs. The pinned package
itself reads the rendered YAML in tests/test_adapters_frameworks.py (slow)."""

from __future__ import annotations

import re

import pytest
import yaml

from meshplan import api
from meshplan.adapters.read import detect_format, import_config
from meshplan.adapters.render import render
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def _render(**fields):
    job, plan = resolve(Request(framework="nemo-automodel", **fields))
    return job, plan, render("nemo-automodel", job, plan)


def test_pipeline_batch_is_one_pass_of_every_micro_batch():
    """With PP the local batch holds the step's micro-batches (gradient accumulation 1), without PP it is one."""
    _, plan, result = _render(model="llama-3.1-70b", num_gpus=64, tp=2, pp=4, vpp=2, global_batch_size=128)
    doc = yaml.safe_load(result.text)
    assert doc["step_scheduler"] == {"global_batch_size": 128, "local_batch_size": 128 // (1 * plan.dp)}
    assert doc["distributed"]["pipeline"] == {"pp_schedule": "interleaved1f1b", "pp_microbatch_size": 1,
                                              "layers_per_stage": 80 // 8}
    _, plan, result = _render(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, micro_batch_size=2)
    assert yaml.safe_load(result.text)["step_scheduler"]["local_batch_size"] == 2


def test_uneven_split_is_written_as_module_names_per_stage():
    _, _, result = _render(model="llama-3.1-405b", num_gpus=1024, tp=8, pp=16, global_batch_size=2048,
                                first_stage_layers=7, last_stage_layers=7)
    parts = yaml.safe_load(result.text)["distributed"]["pipeline"]["module_fqns_per_model_part"]
    layers = [sum(n.startswith("model.layers.") for n in stage) for stage in parts]
    assert layers == [7] + [8] * 14 + [7] and parts[0][0] == "model.embed_tokens" and parts[-1][-2:] == [
        "lm_head", "model.rotary_emb"]
    with pytest.raises(MeshplanError, match="do not divide into"):
        _render(model="deepseek-v3", num_gpus=256, pp=4, vpp=2, ep=64, global_batch_size=256)


def test_zero_stages_dispatcher_and_lora_keys():
    _, _, ddp = _render(model="llama-3.1-8b", num_gpus=8, zero_stage=0, global_batch_size=64)
    assert yaml.safe_load(ddp.text)["distributed"]["strategy"] == "ddp"
    _, _, zero2 = _render(model="qwen3-30b-a3b", num_gpus=16, ep=8, zero_stage=2, global_batch_size=64,
                          moe_token_dispatcher="flex")
    d = yaml.safe_load(zero2.text)
    assert d["distributed"]["reshard_after_forward"] is False and d["distributed"]["moe"] == {
        "reshard_after_forward": False}
    assert d["model"]["backend"]["dispatcher"] == "deepep"
    _, _, torch_dispatch = _render(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=64)
    assert yaml.safe_load(torch_dispatch.text)["model"]["backend"]["dispatcher"] == "torch"
    assert any("AM005" in w for w in torch_dispatch.warnings)
    _, _, lora = _render(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, lora_rank=16,
                         lora_targets=["linear_qkv"])
    assert yaml.safe_load(lora.text)["peft"]["target_modules"] == ["*.q_proj", "*.k_proj", "*.v_proj"]


def _automodel_matches(pattern: str, name: str) -> bool:
    """nemo-automodel 0.7.0 components/_peft/module_matcher.py ModuleMatcher.match for a pattern whose wildcards are
    '*': the pattern equal to the module's full dotted name, or its regex (each '*' any text) matching all of it."""
    return name == pattern or re.fullmatch(pattern.replace("*", "(.*)"), name) is not None


@pytest.mark.parametrize(("model", "modules"), [
    ("llama-3.1-8b", ["model.layers.0.self_attn.q_proj", "model.layers.31.self_attn.o_proj",
                      "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"]),
    ("qwen3-30b-a3b", ["model.layers.0.self_attn.k_proj", "model.layers.47.mlp.experts"]),
])
def test_lora_targets_match_automodels_module_paths(model, modules):
    """AutoModel matches peft.target_modules against each module's full dotted name (named_modules), so the bare
    'q_proj' render wrote matched no module: apply_lora_to_linear_modules patched 0 linears and the LoRA job trained
    no adapter. A routed expert block is one GroupedExperts module, 'experts', adapted whole."""
    _, _, result = _render(model=model, num_gpus=16, global_batch_size=64, job="lora")
    patterns = yaml.safe_load(result.text)["peft"]["target_modules"]
    for name in modules:
        assert any(_automodel_matches(p, name) for p in patterns), (name, patterns)
    assert not any(_automodel_matches(p, "lm_head") or _automodel_matches(p, "model.layers.0.mlp.gate")
                   for p in patterns)
    back = import_config(result.text, "recipe.yaml", framework="nemo-automodel", config_format="yaml")
    assert back.request["lora_targets"] == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def test_lora_on_one_expert_linear_has_no_automodel_config():
    """GroupedExpertsLoRA adapts an expert's gate/up and down together: linear_fc1 alone on a MoE model is refused,
    not written as a config that adapts more or fewer weights than the estimate counts."""
    with pytest.raises(MeshplanError, match="adapts an expert's gate/up and down projections together"):
        _render(model="qwen3-30b-a3b", num_gpus=16, global_batch_size=64, lora_rank=16,
                lora_targets=["linear_qkv", "linear_fc1"])
    _, _, dense = _render(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, lora_rank=16,
                          lora_targets=["linear_fc1"])
    assert yaml.safe_load(dense.text)["peft"]["target_modules"] == ["*.gate_proj", "*.up_proj"]


def test_flex_dispatcher_runs_on_automodels_fsdp_engine_only_where_the_card_says():
    """EP007: AutoModel's FSDP2 engine runs Megatron-Core's flex dispatcher (its card's flex_dispatcher engines);
    verl's FSDP engine and torchtitan still do not."""
    def ep007(framework, **extra):
        job, plan = resolve(Request(model="qwen3-30b-a3b", num_gpus=16, ep=8, moe_token_dispatcher="flex",
                                    framework=framework, **extra))
        return "EP007" in {f.id for f in check_config(job, plan, include_memory=False).findings}

    assert not ep007("nemo-automodel")
    assert ep007("torchtitan") and ep007("verl", zero_stage=3)


def test_rule_numbers_name_automodels_own_limits():
    job, plan = resolve(Request(model="mixtral-8x7b", framework="nemo-automodel", num_gpus=12, tp=2, ep=8))
    (f,) = [f for f in check_config(job, plan, include_memory=False).findings if f.id == "AM002"]
    assert "dp*cp*tp = 6*1*2 = 12" in f.message and "ep in" in f.fix
    # non_pp_size = dp_size*cp*tp counts dp_replicate_size's replicas too (mesh_utils.py): ep 8 divides 16 ranks, not
    # one replica's 4 (torchtitan's WS005 reads its rendered shard degree instead)
    job, plan = resolve(Request(model="qwen3-30b-a3b", framework="nemo-automodel", num_gpus=16, ep=8, dp_replicate=4,
                                zero_stage=3))
    assert "AM002" not in {f.id for f in check_config(job, plan, include_memory=False).findings}
    job, plan = resolve(Request(model="llama-3.1-8b", framework="nemo-automodel", num_gpus=8, tp=2, pp=2,
                                zero_stage=0))
    (f,) = [f for f in check_config(job, plan, include_memory=False).findings if f.id == "AM004"]
    assert "tp=2, pp=2" in f.message and "tp=1, pp=1" in f.fix


AUTOMODEL_RECIPE = """
step_scheduler:
  global_batch_size: 64
  local_batch_size: 8
distributed:
  strategy: fsdp2
  dp_size: none
  tp_size: 2
  pp_size: 2
  ep_size: 1
  sequence_parallel: true
  activation_checkpointing: selective
  enable_async_tensor_parallel: true
  pipeline:
    pp_schedule: interleaved1f1b
    pp_microbatch_size: 2
    layers_per_stage: 8
model:
  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B
  backend:
    _target_: nemo_automodel.components.models.common.BackendConfig
    attn: sdpa
dataset:
  seq_len: 8192
optimizer:
  _target_: torch.optim.Adam
  lr: 1.0e-5
"""


def test_recipe_yaml_reads_into_the_request():
    assert detect_format(AUTOMODEL_RECIPE) == "yaml"
    result = import_config(AUTOMODEL_RECIPE)
    assert result.framework == "nemo-automodel"
    r = result.request
    assert (r["tp"], r["pp"], r["vpp"], r["micro_batch_size"], r["seq_length"]) == (2, 2, 2, 2, 8192)  # 32 / (8 x 2)
    assert r["recompute"] == "selective" and r["attention_backend"] == "flash" and r["zero_stage"] == 3
    assert r["tp_comm_overlap"] is False  # async TP without compile is no Inductor pass: read as off, with a note
    assert any("Inductor pass" in n for n in result.notes)
    assert "dp" not in r  # dp_size: none is AutoModel's "the GPUs left over"
    assert not any("optimizer" in u for u in result.unsupported)  # sections without layout settings are not read
    request = api.request_from_config(result, {"num_gpus": 16})
    assert request.model == "meta-llama/Llama-3.1-8B" and request.framework == "nemo-automodel"


def test_recipe_yaml_strategies_and_errors():
    ddp = import_config("distributed:\n  strategy: ddp\nstep_scheduler:\n  local_batch_size: 2\n")
    assert ddp.request["zero_stage"] == 0 and ddp.request["micro_batch_size"] == 2
    zero2 = import_config("distributed:\n  reshard_after_forward: false\n")
    assert zero2.request["zero_stage"] == 2
    megatron_fsdp = import_config("distributed:\n  strategy: megatron_fsdp\n")
    assert any("megatron_fsdp" in u for u in megatron_fsdp.unsupported)
    with pytest.raises(MeshplanError, match=r"<config_text>:\d+: not valid YAML"):
        import_config("distributed:\n  tp_size: [1\n", config_format="yaml")
    unknown = import_config("distributed:\n  tp_size: 2\nmodel:\n  pretrained_model_name_or_path: org/unknown\n")
    assert "model" not in unknown.request and any("org/unknown" in u for u in unknown.unresolved)


def test_render_then_import_round_trips_moe_and_lora():
    for fields in (dict(model="deepseek-v3", num_gpus=256, ep=64, global_batch_size=256, recompute="full",
                        moe_token_dispatcher="flex"),
                   dict(model="llama-3.1-70b", num_gpus=16, tp=8, global_batch_size=32, lora_rank=16,
                        lora_targets=["linear_qkv", "linear_fc2"])):
        req = parse_request({**fields, "framework": "nemo-automodel"})
        text = api.render_config("nemo-automodel", req).text
        back = api.request_from_config(import_config(text), {"num_gpus": fields["num_gpus"]})
        for name, value in fields.items():
            if name != "model":
                assert getattr(back, name) == value, name


def test_automodels_published_rows_map_to_its_card():
    """bench/data/nemo_automodel (its docs/performance-summary.mdx rows, in the production schema): every row maps to
    nemo-automodel, breaks no rule of its own and gets a tokens/s prediction (the figures are the bench's)."""
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench"
    sys.path.insert(0, str(bench))
    import production_scoring as pscore

    rows, scores, summary = pscore.run(bench / "data" / "nemo_automodel")
    assert summary.mapped == len(rows) == len(scores) > 0
    for score in scores:
        assert score.mapping.request.framework == "nemo-automodel", score.mapping.row_id
        assert not score.rule_errors and score.refused is None, score.mapping.row_id
        assert score.predicted_tps and score.measured_tps, score.mapping.row_id


def test_torch_dispatcher_is_timed_as_gather_and_all_reduce():
    """AutoModel's non-flex dispatcher (its card's moe_dispatch.alltoall_as: allgather): two ring passes and two
    all-reduces of the EP group's tokens per MoE layer and micro-batch; torchtitan's plain all-to-all on the same
    plan stays four dispatch all-to-alls."""
    from meshplan.arithmetic.comm import allreduce_time, dispatch_time, links, ring_time
    from meshplan.estimate.layer_records import BF16
    from meshplan.estimate.moe_time import EP_ALL_TO_ALLS_PER_LAYER, exposed_ep
    from meshplan.estimate.perf import _peaks, layer_context
    from meshplan.knowledge.calibration import calibration

    def ep_seconds(framework):
        job, plan = resolve(Request(model="qwen3-30b-a3b", framework=framework, num_gpus=16, ep=8,
                                    global_batch_size=64))
        cal = calibration()
        lk = links(job.gpu, job.gpus_per_node, cal)
        ctx = layer_context(job, plan, cal, lk, _peaks(job, cal), 4, None)
        local = ctx.shard.tokens * job.model.hidden_size * BF16
        return exposed_ep(ctx, 0.0, 0.0), local, lk, job

    auto, local, lk, job = ep_seconds("nemo-automodel")
    assert auto == pytest.approx(2 * ring_time(8 * local, 8, 1, lk) + 2 * allreduce_time(8 * local, 8, 1, lk))
    titan, local, lk, job = ep_seconds("torchtitan")
    assert titan == pytest.approx(EP_ALL_TO_ALLS_PER_LAYER * dispatch_time(local, job.model.moe.top_k, 8, 1, lk,
                                                                           dedup=False, experts=128))
    assert auto > titan


def test_am003_counts_one_run_of_the_schedule():
    """AutoModel runs its schedule per accumulation step (its card's pipeline.runs_per_accumulation_step): AM003
    reads the micro-batches of one run (Plan.pipeline_microbatches), not the step's."""
    def am003(**extra):
        job, plan = resolve(Request(model="llama-3.1-70b", framework="nemo-automodel", num_gpus=32, pp=4,
                                    global_batch_size=128, **extra))
        return "AM003" in {f.id for f in check_config(job, plan, include_memory=False).findings}

    assert not am003() and not am003(pipeline_microbatches=4)
    assert am003(pipeline_microbatches=2)  # 16 micro-batches per step, but runs of 2 over 4 stages


def test_automodel_keeps_parameters_grads_and_adam_moments_in_bf16():
    """AutoModel's resident parameters are model.torch_dtype, bf16 unless the recipe asks for float32, and torch Adam's
    moments follow them (cards/memory.yaml fsdp2_automodel): 2 + 2 + 4 B per parameter at ZeRO-3, half of
    torchtitan's fp32 4 + 4 + 8 on the same plan; its optimizer step is torch's foreach (one moment-dtype copy)."""
    from meshplan.arithmetic.memory_states import bytes_per_param, convention, optimizer_implementation

    name, _, tensors = convention(framework_card("nemo-automodel"), 3)
    assert name == "fsdp2_automodel"
    assert bytes_per_param(tensors, 8) == pytest.approx((2 + 2 + 4) / 8)
    assert bytes_per_param(convention(framework_card("torchtitan"), 3, "0.2.2")[2], 8) == pytest.approx(16 / 8)
    fields = dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=32, micro_batch_size=1)
    auto = api.estimate_memory(Request(framework="nemo-automodel", **fields)).stages[0]
    titan = api.estimate_memory(Request(framework="torchtitan", framework_version="0.2.2", **fields)).stages[0]
    assert auto.weights_bytes == pytest.approx(titan.weights_bytes / 2, rel=1e-6)
    assert auto.optimizer_bytes == pytest.approx(titan.optimizer_bytes / 2, rel=1e-6)
    job, plan = resolve(Request(framework="nemo-automodel", **fields))
    assert optimizer_implementation(job, plan) == "foreach"


def test_automodel_loss_is_the_fp32_cross_entropy_without_the_bf16_logits():
    """MaskedCrossEntropy's default fp32 upcast over the whole sequence, train_ft.py dropping the bf16 logits before
    the backward: 4 + 4 + 4 B per logit, one chunk."""
    from meshplan.arithmetic.memory_states import convention

    conv = convention(framework_card("nemo-automodel"), 3)[1]
    assert (conv.logits_bytes_per_element, conv.loss_chunks) == (12, 1)
    assert (conv.qkv_projections, conv.rope_saves) == ("separate", "shared_tables")


def test_automodels_routed_experts_activation_is_fused_in_eager_blocks():
    """AutoModel's grouped experts run their activation and routing-weight multiply as one fused kernel
    (compile.experts_fused): without compile its blocks' hidden-sized work gets the eager pass count and the routed
    experts' activations the fused one; torchtitan's eager experts keep the eager count."""
    from dataclasses import replace

    from meshplan.arithmetic.comm import links
    from meshplan.estimate.layer_records import BF16
    from meshplan.estimate.layer_time import elementwise_load, elementwise_seconds
    from meshplan.estimate.perf import _peaks, layer_context
    from meshplan.knowledge.calibration import calibration

    job, plan = resolve(Request(model="qwen3-30b-a3b", framework="nemo-automodel", num_gpus=8, ep=8,
                                global_batch_size=64))
    cal = calibration("nemo-automodel")
    ctx = layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), _peaks(job, cal), 4, None)
    assert ctx.eager and ctx.experts_fused
    load = elementwise_load(ctx, True)
    eager = elementwise_seconds(replace(ctx, experts_fused=False), load)
    assert eager - elementwise_seconds(ctx, load) == pytest.approx(
        (cal.eager_elementwise_passes - cal.elementwise_passes) * BF16 * load.routed_ffn / ctx.hbm)
    titan, titan_plan = resolve(Request(model="qwen3-30b-a3b", framework="torchtitan", num_gpus=8, ep=8,
                                        global_batch_size=64))
    tcal = calibration("torchtitan")
    tctx = layer_context(titan, titan_plan, tcal, links(titan.gpu, titan.gpus_per_node, tcal), _peaks(titan, tcal),
                         4, None)
    assert tctx.eager and not tctx.experts_fused


@pytest.mark.parametrize(("peft", "said"), [
    ("  target_modules: '*_proj'\n", True),  # the recipes' own pattern: the experts' GroupedExperts is no *_proj
    ("", True),  # left out: PeftConfig's ModuleMatcher takes '*_proj'
    ("  target_modules: ['*_proj', '*.experts']\n", False),
])
def test_a_moe_recipes_lora_that_leaves_the_routed_experts_out_is_said(peft, said):
    """AutoModel's '*_proj' (given or its default) adapts no routed expert, while the four targets it is read as
    count their adapters: import says so. Left out, the note said PeftConfig 'matches every linear layer'."""
    text = ("distributed:\n  strategy: fsdp2\n  ep_size: 8\n"
            "model:\n  pretrained_model_name_or_path: Qwen/Qwen3-30B-A3B\n"
            "peft:\n  _target_: nemo_automodel.components._peft.lora.PeftConfig\n  dim: 16\n" + peft)
    got = import_config(text, "recipe.yaml", framework="nemo-automodel", config_format="yaml")
    assert got.request["lora_rank"] == 16
    assert any("adapts none of them" in n for n in got.notes) is said, got.notes
    assert not any("every linear layer" in n for n in got.notes)


def test_lora_targets_over_module_names_meshplan_does_not_know_are_said():
    """DeepSeek-V4's LoRA (Automodel 36044ad examples/llm_finetune/deepseek_v4/deepseek_v4_flash_hellaswag_lora.yaml)
    targets its own modules ('*wq_a', '*wq_b', '*wkv', '*wo_b'): the reader dropped every name and the request refused
    the empty list with pydantic's "List should have at least 1 item". Now the refusal names the patterns and what is
    read; beside a projection read, an unknown pattern is a note; a bare-wildcard projection ('*q_proj') is read."""
    head = ("distributed:\n  strategy: fsdp2\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B\n"
            "peft:\n  _target_: nemo_automodel.components._peft.lora.PeftConfig\n  dim: 16\n")
    with pytest.raises(MeshplanError) as exc:
        import_config(head + "  target_modules: ['*wq_a', '*wq_b', '*wkv', '*wo_b']\n", "v4.yaml",
                      framework="nemo-automodel", config_format="yaml")
    said = str(exc.value)
    assert "match no linear meshplan knows" in said and "*wq_a, *wq_b, *wkv, *wo_b" in said, said
    assert "q_proj and k_proj and v_proj (linear_qkv)" in said and "at least 1 item" not in said, said
    got = import_config(head + "  target_modules: ['*q_proj', '*k_proj', '*v_proj', '*wo_b']\n", "v4.yaml",
                        framework="nemo-automodel", config_format="yaml")
    assert got.request["lora_targets"] == ["linear_qkv"]
    assert any("*wo_b name no projection meshplan knows" in n for n in got.notes), got.notes


QLORA = """\
step_scheduler:
  global_batch_size: 32
  local_batch_size: 4
model:
  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained
  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B
peft:
  _target_: nemo_automodel.components._peft.lora.PeftConfig
  target_modules: '*_proj'
  dim: 16
distributed:
  strategy: fsdp2
  tp_size: 1
quantization:
  load_in_4bit: {four}
  load_in_8bit: false
  bnb_4bit_quant_type: nf4
"""


def test_a_qlora_recipe_is_said_and_refused_an_estimate_not_planned_as_a_bf16_base():
    """AutoModel's QLoRA recipes (examples/llm_finetune/*_qlora.yaml: quantization.load_in_4bit, read by train_ft.py
    into a bitsandbytes NF4 base) were read with the quantization section dropped unsaid, so check and recommend
    estimated the frozen base at 2 bytes a weight where the run keeps about half a byte."""
    imported = import_config(QLORA.format(four="true"), "qlora.yaml")
    assert any(u.startswith("qlora.yaml:15 quantization.load_in_4bit = True: the frozen base weights loaded through "
                            "bitsandbytes") for u in imported.unsupported)
    with pytest.raises(MeshplanError, match=r"qlora\.yaml:15 quantization\.load_in_4bit = True: .*no estimate of a "
                                            r"job from this file would be right\. Fix: Drop the quantization section"):
        api.request_from_config(imported, {"num_gpus": 8})
    plain = import_config(QLORA.format(four="false"), "lora.yaml")
    assert any(n.startswith("lora.yaml:15 quantization.load_in_4bit = False: off") for n in plain.notes)
    assert api.request_from_config(plain, {"num_gpus": 8}).lora_rank == 16


@pytest.mark.parametrize("edit, said", [
    (None, None),  # render writes true at zero_stage 3: read, nothing said
    (("  moe:\n    reshard_after_forward: true\n", ""), "not given: AutoModel's default, false"),
    (("reshard_after_forward: true", "reshard_after_forward: false"), "distributed.moe.reshard_after_forward"),
])
def test_the_experts_reshard_policy_is_read_against_the_zero_stage(edit, said):
    """AutoModel's MoEParallelizerConfig.reshard_after_forward (default false, built whenever ep_size > 1) keeps the
    experts gathered from forward to backward whatever the strategy does with the other units. Before, the key render
    writes came back 'no meshplan field', and a recipe without it (the experts gathered) was read as zero_stage 3 with
    nothing said; now an experts policy that differs from the rest is said, one that agrees is read."""

    request = Request(model="qwen3-30b-a3b", num_gpus=16, ep=8, zero_stage=3, framework="nemo-automodel")
    text = api.render_config("nemo-automodel", request, force=True).text
    if edit is not None:
        assert edit[0] in text
        text = text.replace(*edit)
    back = import_config(text, "recipe.yaml")
    moe = [u for u in back.unsupported if "experts" in u or "reshard_after_forward" in u]
    if said is None:
        assert not moe, moe
    else:
        assert len(moe) == 1 and said in moe[0] and "stay gathered from forward to backward" in moe[0], moe
