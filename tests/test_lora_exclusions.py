"""Hugging Face PEFT's exclude_modules against the modules transformers builds (adapters/hf_modules.py,
adapters/read/lora_keys.py peft_exclusion): all-linear less some modules on a model whose other linears all-linear
adapts too (MLA's q/kv projections, DeepSeek-V2's router, Qwen2-MoE's shared_expert_gate) is planned as the targets
left, counted exactly as PEFT counts it, rendered as the list of what is left and read back; what cannot be counted
(a target left in some of its modules only) is said and refused."""

from __future__ import annotations

import pytest

from meshplan.adapters.hf_modules import hf_linears
from meshplan.adapters.lora import hf_projections
from meshplan.adapters.read import request_values
from meshplan.adapters.read.keys import LORA_NOT_MODELLED
from meshplan.adapters.read.lora_keys import peft_exclusion
from meshplan.adapters.render import render
from meshplan.api import import_config
from meshplan.arithmetic.lora import DEFAULT_TARGETS, all_linear_targets, lora_engine, total_adapter_params
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.request.resolve import resolve
from meshplan.schema.plan import LoraSpec
from meshplan.schema.request import Request

SFT = ("torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer model.path=deepseek-ai/DeepSeek-V2-Lite "
       "data.train_batch_size=64 model.lora_rank=16 model.target_modules=all-linear {}\n")
MLA = ["linear_q_proj", "linear_kv_down_proj", "linear_kv_up_proj"]


@pytest.mark.parametrize(("exclude", "targets"), [
    ("model.exclude_modules=[down_proj]", ["linear_proj", "linear_fc1", *MLA, "router"]),
    ("model.exclude_modules=[gate]", ["linear_proj", "linear_fc1", "linear_fc2", *MLA]),  # the router alone
    ("'model.exclude_modules=.*self_attn[.](q_proj|kv_b_proj)'",
     ["linear_proj", "linear_fc1", "linear_fc2", "linear_kv_down_proj", "router"]),
])
def test_all_linear_less_some_modules_on_deepseek_v2_lite_is_planned(exclude, targets):
    """DeepSeek-V2-Lite under all-linear adapts its MLA projections and its router (DeepseekV2Moe.gate, an nn.Linear)
    beside the four: less exclude_modules it is the targets left, router and MLA names among them, which resolve,
    check clean, render on verl's FSDP SFT trainer as the list of what is left (not all-linear, which would adapt what
    was excluded) and read back as the same targets (fails before: 'still adapts DeepSeek-V2-Lite's other linears',
    no estimate)."""
    imported = import_config(SFT.format(exclude), path="sft.sh")
    assert imported.request["lora_targets"] == targets, imported.unsupported
    assert not [u for u in imported.unsupported if "exclude_modules" in u]
    job, plan = resolve(Request(**request_values(imported, {"gpu": "h100", "seq_length": 2048})))
    assert job.lora is not None and job.lora.targets == targets
    assert not [f for f in check_config(job, plan).findings if f.id.startswith("LORA")]
    text = render("verl", job, plan, variant="sft-fsdp").text
    assert "all-linear" not in text and ",".join(hf_projections(targets)) in text
    back = import_config(text, path="sft.sh")
    assert back.request["lora_targets"] == targets


def test_a_router_target_on_an_engine_that_is_not_peft_is_refused():
    """router / shared_expert_gate are transformers' nn.Linear names only PEFT adapts by name: on Megatron-Bridge
    (whose LoRA would put a LoRATopKRouter on its router, which meshplan does not count) LORA003 refuses them and
    names the engines that take them (fails before: no such rule, the name was not a target)."""
    job, plan = resolve(Request(model="deepseek-v2-lite", framework="megatron-bridge", job="lora", num_gpus=8,
                                global_batch_size=64, lora_targets=["linear_proj", "router"]))
    found = [f for f in check_config(job, plan).findings if f.id == "LORA003"]
    assert found and "router" in found[0].message and "verl (fsdp engine)" in found[0].fix
    job, plan = resolve(Request(model="llama-3.1-8b", framework="verl", job="lora", num_gpus=8, zero_stage=3,
                                global_batch_size=64, lora_targets=["linear_proj", "router"]))
    assert [f for f in check_config(job, plan).findings if f.id == "LORA002"]  # Llama has no router


def test_a_partial_exclusion_names_what_and_where():
    """A target left in some of its modules only cannot be counted (meshplan adapts a target in every place): the
    refusal names the target, the module and the place (fails before: 'still adapts ... other linears', which named
    neither)."""
    imported = import_config(SFT.format("'model.exclude_modules=.*shared_experts.*'"), path="sft.sh")
    said = [u for u in imported.unsupported if "exclude_modules" in u]
    assert said and "excludes linear_fc1" in said[0] and "shared experts" in said[0]
    assert said[0].endswith(LORA_NOT_MODELLED)
    with pytest.raises(MeshplanError, match="no estimate of this LoRA job"):
        request_values(imported, {"gpu": "h100", "seq_length": 2048})


def _peft(ask: dict) -> dict:
    from framework_packages import peft_lora_count

    return peft_lora_count(ask)


DEEPSEEK_V2 = {"model_type": "deepseek_v2", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
               "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
               "n_routed_experts": 4, "n_shared_experts": 2, "num_experts_per_tok": 2, "q_lora_rank": None,
               "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
               "vocab_size": 100, "tie_word_embeddings": False}
DEEPSEEK_V3 = {**DEEPSEEK_V2, "model_type": "deepseek_v3", "q_lora_rank": 24, "n_group": 1, "topk_group": 1}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
             "shared_expert_intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 100,
             "mlp_only_layers": [1], "tie_word_embeddings": False}
LLAMA4 = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 100},
    "vision_config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
                      "image_size": 28, "patch_size": 14, "num_channels": 3, "projector_input_dim": 48,
                      "projector_output_dim": 48, "vision_output_dim": 40, "pixel_shuffle_ratio": 0.5,
                      "model_type": "llama4_vision_model"}}


@pytest.mark.slow
@pytest.mark.parametrize(("config", "auto"), [(DEEPSEEK_V2, None), (DEEPSEEK_V3, None), (QWEN2_MOE, None),
                                              ({**DEEPSEEK_V2, "model_type": "glm4_moe"}, None),
                                              (LLAMA4, "image_text_to_text")])
def test_the_module_names_are_the_ones_transformers_builds(config, auto):
    """hf_linears lists exactly the nn.Linear modules transformers 5.9.0 builds (meta device), the output head left
    out, in the same order: what exclude_modules is matched against."""
    if config["model_type"] == "glm4_moe":
        config = {k: v for k, v in config.items() if k not in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                                "qk_rope_head_dim", "v_head_dim")}
        config = {**config, "head_dim": 16, "num_key_value_heads": 2}
    arch = architecture_from_config(config)
    built = _peft({"config": config, "rank": 1, "target_modules": ["o_proj"],
                   **({"auto_class": auto} if auto else {})})["linears"]
    assert [m.path for m in hf_linears(arch, vision_built=auto is not None)] == built


@pytest.mark.slow
@pytest.mark.parametrize(("config", "exclude"), [
    (DEEPSEEK_V2, ["down_proj"]), (DEEPSEEK_V2, ["gate"]), (DEEPSEEK_V2, ".*(q_proj|kv_b_proj)"),
    (DEEPSEEK_V3, ["q_a_proj", "q_b_proj"]), (DEEPSEEK_V3, ["o_proj", "kv_a_proj_with_mqa"]),
    (QWEN2_MOE, ["shared_expert_gate"]), (QWEN2_MOE, ["o_proj", "down_proj"]),
])
def test_peft_trains_what_meshplan_counts_for_all_linear_less_some(config, exclude):
    """PEFT 0.18.1 on transformers 5.9.0 (meta device): all-linear with exclude_modules trains exactly meshplan's
    count of the targets peft_exclusion leaves on verl's FSDP engine, and the target_modules render writes for them
    (the list of what is left) trains the same (fails before: refused, no count)."""
    arch = architecture_from_config(config)
    targets, _, why = peft_exclusion(arch, all_linear_targets(arch), True, exclude, vision_built=False)
    assert not why
    spec = LoraSpec(rank=4, targets=targets)
    counted = total_adapter_params(arch, spec, lora_engine(framework_card("verl"), 3))
    assert _peft({"config": config, "rank": 4, "target_modules": "all-linear", "exclude_modules": exclude})[
        "trainable"] == counted
    assert _peft({"config": config, "rank": 4, "target_modules": hf_projections(targets)})["trainable"] == counted


SCOUT = ("torchrun --nproc_per_node=8 --nnodes=4 -m verl.trainer.sft_trainer "
         "model.path=meta-llama/Llama-4-Scout-17B-16E-Instruct data.train_batch_size=256 model.lora_rank=32 "
         "model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj] {}\n")


def test_a_regex_leaving_the_vision_tower_out_is_planned_without_its_adapters():
    """verl's FSDP engine builds Llama4ForConditionalGeneration, whose vision attention's q/k/v/o_proj the projection
    names adapt too; exclude_modules '.*vision_model.*' (PEFT: re.fullmatch on the full name) leaves every one of
    them out and nothing of the text model: read as lora_vision false, the memory holds the tower's weights but no
    adapter on it, and render writes the exclusion, which reads back the same (fails before: 'meshplan cannot tell
    what it leaves out of Llama 4's vision tower', no estimate)."""
    from meshplan.estimate.memory import estimate_memory

    imported = import_config(SCOUT.format("'model.exclude_modules=.*vision_model.*'"), path="sft.sh")
    assert not [u for u in imported.unsupported if "exclude_modules" in u], imported.unsupported
    assert imported.request["lora_vision"] is False
    assert imported.request["lora_targets"] == list(DEFAULT_TARGETS)
    # micro-batch 2: verl's FSDP engine packs a micro-batch into one row, and 8 x 4,096 keys pass Llama 4's
    # 8,192-token chunk, which transformers refuses under flash_attention_2 (CH001)
    job, plan = resolve(Request(**request_values(imported, {"gpu": "h100", "seq_length": 4096, "zero_stage": 3,
                                                            "micro_batch_size": 2})))
    assert job.lora is not None and not job.lora.vision
    stage = estimate_memory(job, plan).stages[0]
    assert stage.detail["vision_params"] > 0 and stage.detail.get("vision_adapter_params", 0) == 0
    text = render("verl", job, plan, variant="sft-fsdp").text
    assert "exclude_modules" in text
    back = import_config(text, path="sft.sh")
    assert back.request["lora_vision"] is False and back.request["lora_targets"] == list(DEFAULT_TARGETS)


@pytest.mark.parametrize(("exclude", "said"), [
    ("'model.exclude_modules=.*vision_model.*o_proj'", "excludes linear_proj (o_proj) in 34 of the 82"),
    ("'model.exclude_modules=.*language_model.*'", "excludes linear_qkv (k_proj, q_proj, v_proj) in 144 of the 246"),
])
def test_a_regex_leaving_part_of_the_tower_or_only_the_text_model_is_refused(exclude, said):
    """The tower's o_proj alone, or the text model and not the tower: a target adapted in some of its modules only,
    said with where, and no estimate."""
    imported = import_config(SCOUT.format(exclude), path="sft.sh")
    lines = [u for u in imported.unsupported if "exclude_modules" in u]
    assert lines and said in lines[0] and lines[0].endswith(LORA_NOT_MODELLED), imported.unsupported


@pytest.mark.slow
def test_peft_leaves_the_tower_out_as_meshplan_counts():
    """PEFT 0.18.1 on transformers 5.9.0 (meta device), a tiny Llama 4 built as verl's FSDP engine builds it: the
    projections with exclude_modules VISION_EXCLUDE (what render writes for lora_vision false) adapt nothing in the
    tower and exactly the text model's count; peft_exclusion reads '.*vision_model.*' so."""
    from meshplan.adapters.lora import VISION_EXCLUDE

    arch = architecture_from_config(LLAMA4)
    spec = LoraSpec(rank=4, targets=list(DEFAULT_TARGETS), vision=False)
    targets, vision, why = peft_exclusion(arch, spec.targets, False, ".*vision_model.*", vision_built=True)
    assert (targets, vision, why) == (spec.targets, False, "")
    ran = _peft({"config": LLAMA4, "rank": 4, "target_modules": hf_projections(spec.targets),
                 "exclude_modules": VISION_EXCLUDE, "auto_class": "image_text_to_text"})
    assert ran["vision"] == 0
    assert ran["trainable"] == total_adapter_params(arch, spec, lora_engine(framework_card("verl"), 3))


def test_a_files_projection_list_is_those_projections_not_all_linear():
    """target_modules=[o_proj,gate_proj,up_proj,down_proj] on DeepSeek-V2-Lite adapts those modules only (PEFT matches
    the names); read as linear_proj, linear_fc1, linear_fc2 it is counted and rendered as that list (fails before:
    the three were every default target the model has, so they were counted and written as all-linear, MLA's
    projections and the router too)."""
    text = SFT.replace("model.target_modules=all-linear {}",
                       "model.target_modules=[o_proj,gate_proj,up_proj,down_proj]")
    imported = import_config(text, path="sft.sh")
    assert imported.request["lora_targets"] == ["linear_proj", "linear_fc1", "linear_fc2"]
    job, plan = resolve(Request(**request_values(imported, {"gpu": "h100", "seq_length": 2048})))
    rendered = render("verl", job, plan, variant="sft-fsdp").text
    assert "all-linear" not in rendered and "o_proj,gate_proj,up_proj,down_proj" in rendered
    engine = lora_engine(job.card, plan.zero_stage)
    every = total_adapter_params(job.model, LoraSpec(rank=16, targets=all_linear_targets(job.model)), engine)
    assert total_adapter_params(job.model, job.lora, engine) < every


@pytest.mark.parametrize(("framework", "variant"), [("verl", "fsdp"), ("verl", "sft-fsdp"), ("skyrl", "fsdp"),
                                                    ("skyrl", "sft-fsdp")])
def test_every_peft_render_of_lora_vision_false_reads_back(framework, variant):
    """lora_vision false is written as each PEFT engine's exclude_modules key and imported back as lora_vision false
    on the same targets (fails before: no lora_vision field)."""
    job, plan = resolve(Request(model="llama-4-scout", framework=framework, num_gpus=64, zero_stage=3, job="lora",
                                lora_vision=False, global_batch_size=256))
    back = import_config(render(framework, job, plan, variant=variant).text, path="run.sh", framework=framework)
    assert back.request["lora_vision"] is False and back.request["lora_targets"] == list(DEFAULT_TARGETS)
    assert not [u for u in back.unsupported if "exclude_modules" in u]


def test_all_linear_less_llama4s_router_runs_and_is_planned_where_it_is_counted():
    """Llama 4's all-linear fails on its router (Llama4Router returns a tuple); exclude_modules leaving every router
    out makes it run. With the vision tower left out too it adapts the text model's projections only, which is
    planned (lora_vision false); with the tower kept it adapts the tower's MLP, patch embedding and projector, which
    meshplan counts no adapter on: said, no estimate. Neither says that all-linear fails (fails before: both did,
    and the first was refused as matching none of the decoder's projections)."""
    text = SCOUT.replace("model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
                         "model.target_modules=all-linear")
    tower = import_config(text.format("'model.exclude_modules=.*([.]router|vision_model[.].*)'"), path="sft.sh")
    assert "multi_modal_projector.linear_1" in tower.unsupported[0]  # the projector is no part of vision_model
    regex = "(.*[.]router|vision_model[.].*|multi_modal_projector.*)"
    planned = import_config(text.format(f"'model.exclude_modules={regex}'"), path="sft.sh")
    assert not planned.unsupported, planned.unsupported
    assert planned.request["lora_vision"] is False and planned.request["lora_targets"] == list(DEFAULT_TARGETS)
    refused = import_config(text.format("model.exclude_modules=[router]"), path="sft.sh")
    assert [u for u in refused.unsupported if "vision tower" in u and u.endswith(LORA_NOT_MODELLED)]
    assert not [u for u in refused.unsupported if "Llama4Router" in u]


@pytest.mark.slow
def test_peft_all_linear_less_llama4s_router_and_tower_counts_what_meshplan_plans():
    """PEFT 0.18.1 on transformers 5.9.0, a tiny Llama 4 built as verl's FSDP engine builds it (on the CPU, one forward
    and backward): all-linear less the routers, the tower and the projector runs, and trains exactly the count of
    the four targets without the tower that peft_exclusion reads it as."""
    regex = "(.*[.]router|vision_model[.].*|multi_modal_projector.*)"
    arch = architecture_from_config(LLAMA4)
    targets, vision, why = peft_exclusion(arch, all_linear_targets(arch), True, regex, vision_built=True)
    assert (targets, vision, why) == (list(DEFAULT_TARGETS), False, "")
    ran = _peft({"config": LLAMA4, "rank": 4, "target_modules": "all-linear", "exclude_modules": regex,
                 "auto_class": "image_text_to_text"})
    spec = LoraSpec(rank=4, targets=targets, vision=vision)
    assert ran["vision"] == 0
    assert ran["trainable"] == total_adapter_params(arch, spec, lora_engine(framework_card("verl"), 3))
