"""Llama 4's vision tower (Architecture.vision): read from config.json's vision_config, counted exactly
(knowledge/model_counts.py vision_params), and held, with its attention's adapters under LoRA, by the engines that
build Llama4ForConditionalGeneration (verl's and SkyRL's FSDP: the cards' vision_tower); the others stay text-only."""

from __future__ import annotations

import pytest

from meshplan.adapters.lora import hf_projections
from meshplan.arithmetic.lora import DEFAULT_TARGETS, lora_engine, total_adapter_params, vision_adapters
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.catalog import describe_model, resolve_model
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.knowledge.model_counts import vision_params
from meshplan.request.resolve import resolve
from meshplan.schema.plan import LoraSpec
from meshplan.schema.request import Request

# Llama-4-Scout's and Maverick's vision_config (ai-dynamo/aiconfigurator model_configs/*Llama-4-*_config.json)
VISION = {"hidden_size": 1408, "num_hidden_layers": 34, "num_attention_heads": 16, "intermediate_size": 5632,
          "image_size": 336, "patch_size": 14, "num_channels": 3, "projector_input_dim": 4096,
          "projector_output_dim": 4096, "vision_output_dim": 4096, "pixel_shuffle_ratio": 0.5,
          "model_type": "llama4_vision_model"}
# the tensors transformers 5.9.0 builds for it, as its module table lists them (patch linear 3 x 14^2 x 1408; class
# embedding; 577 positions; two LayerNorms; per layer q/k/v/o 1408^2 + bias, fc1 / fc2 1408 x 5632 + biases, two
# LayerNorms; the pixel-shuffle MLP 5632 x 4096 and 4096^2; the projector 4096 x 5120)
LAYER = 4 * (1408 * 1408 + 1408) + 2 * 1408 * 5632 + 5632 + 1408 + 4 * 1408
SCOUT_VISION = 827_904 + 1408 + 812_416 + 4 * 1408 + 34 * LAYER + 23_068_672 + 16_777_216 + 20_971_520


def _scout_config() -> dict:
    card = resolve_model("llama-4-scout")
    assert card.vision is not None
    text = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "vocab_size": 202048,
            "tie_word_embeddings": False}
    return {"model_type": "llama4", "text_config": text, "vision_config": VISION}


def test_the_catalog_and_a_config_json_carry_the_vision_tower_counted_exactly():
    """Scout and Maverick share the vision_config; vision_params counts what transformers builds (0.87B), which
    with the text model makes Scout's 108.64B against the published 109B (fails before: no vision field)."""
    for key in ("llama-4-scout", "llama-4-maverick"):
        report = describe_model(key)
        assert report.vision_params == SCOUT_VISION == 871_932_416
        assert report.total_params == sum(c.params for c in report.components)  # the total stays the text model's
    arch = architecture_from_config(_scout_config())
    assert arch.vision is not None and vision_params(arch) == SCOUT_VISION
    assert architecture_from_config({**_scout_config(), "model_type": "llama4"}).vision == arch.vision
    text_only = {**_scout_config()}
    del text_only["vision_config"]
    assert architecture_from_config(text_only).vision is None


@pytest.mark.parametrize(("field", "value", "said"), [("hidden_size", "big", "must be an integer"),
                                                      ("patch_size", 500, "patch_size = 500 is out of range"),
                                                      ("num_hidden_layers", None, "'num_hidden_layers' is missing")])
def test_a_bad_vision_config_field_is_refused_by_name(field, value, said):
    config = _scout_config()
    config["vision_config"] = {**VISION, field: value}
    with pytest.raises(MeshplanError, match=said) as error:
        architecture_from_config(config)
    assert "vision_config" in str(error.value)


def _job(framework: str, job: str, **fields):
    return resolve(Request(model="llama-4-scout", framework=framework, job=job, num_gpus=64, global_batch_size=64,
                           seq_length=4096, **fields))


def test_the_fsdp_engines_that_build_the_tower_hold_its_weights_and_adapters():
    """verl's and SkyRL's FSDP engines build Llama4ForConditionalGeneration: the first stage holds the tower and
    projector and, under LoRA with the projections meshplan writes (q/k/v/o_proj ...), the adapters PEFT puts on the
    vision attention, 34 x 4 x r(1408 + 1408). On text-only data the tower never runs, so they hold weights only: the
    weight bytes grow by their sharded weights, gradients and optimizer states do not. Megatron-Bridge (no Llama 4
    bridge) stays text-only (fails before: no vision_params, the weights the text model's alone)."""
    for framework in ("verl", "skyrl"):
        for kind, rank in (("sft", None), ("lora", 32)):
            job, plan = _job(framework, kind, zero_stage=3, **({"lora_rank": rank} if rank else {}))
            text = job.model_copy(update={"model": job.model.model_copy(update={"vision": None})})
            stage, text_stage = estimate_memory(job, plan).stages[0], estimate_memory(text, plan).stages[0]
            assert stage.detail["vision_params"] == SCOUT_VISION
            adapters = 34 * 4 * rank * (1408 + 1408) if rank else 0
            assert stage.detail.get("vision_adapter_params", 0) == adapters
            # the FSDP engines' fp32 weights (cards/memory.yaml), sharded over the 64 ranks
            assert stage.weights_bytes - text_stage.weights_bytes == (SCOUT_VISION + adapters) * 4 // plan.dp
            assert (stage.gradients_bytes, stage.optimizer_bytes) == (text_stage.gradients_bytes,
                                                                     text_stage.optimizer_bytes)
            if rank:
                assert sum(a.params(rank) for a in vision_adapters(job.model, job.lora)) == adapters
                engine = lora_engine(job.card, plan.zero_stage)
                assert stage.detail["lora_adapter_params"] == total_adapter_params(job.model, job.lora, engine)
    bridge, bridge_plan = _job("megatron-bridge", "lora", ep=8)
    assert "vision_params" not in estimate_memory(bridge, bridge_plan).stages[0].detail


def _peft(ask: dict) -> dict:
    from framework_packages import peft_lora_count

    return peft_lora_count(ask)


@pytest.mark.slow
def test_transformers_builds_and_peft_adapts_the_tower_meshplan_counts():
    """Ground truth on the meta device, transformers 5.9.0 and PEFT 0.18.1: Scout built as verl's and SkyRL's FSDP
    engines build it (AutoModelForImageTextToText) holds vision_params in vision_model and multi_modal_projector, and
    the projections meshplan writes adapt vision_adapters' count in the tower and the text count beside it."""
    arch = architecture_from_config(_scout_config())
    spec = LoraSpec(rank=32, targets=list(DEFAULT_TARGETS))
    ran = _peft({"config": _scout_config(), "rank": 32, "target_modules": hf_projections(spec.targets),
                 "auto_class": "image_text_to_text"})
    assert ran["vision_base"] == vision_params(arch)
    assert ran["vision"] == sum(a.params(32) for a in vision_adapters(arch, spec))
    engine = lora_engine(resolve(Request(model="llama-4-scout", framework="verl", job="lora", num_gpus=64,
                                         zero_stage=3))[0].card, 3)
    assert ran["trainable"] - ran["vision"] == total_adapter_params(arch, spec, engine)
