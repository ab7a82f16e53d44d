"""Every section of a framework card loads typed (FrameworkCard forbids what it does not know): the LoRA engines, the
mixed-precision presets, the MoE dispatch facts and the RL section. A misspelt key or a value out of its vocabulary
fails when the card loads, as a CardError naming the card and the key, not as a reader finding nothing later (a
pydantic error from deep in an estimate, or a silently wrong default)."""

import re

import pytest

from meshplan.arithmetic.memory_states import fp8_param_gather
from meshplan.knowledge.cards import CardError, FrameworkCard, framework_card, read_card, rl_card, validate_card
from meshplan.knowledge.lora_card import LoraEngine
from meshplan.knowledge.precision_card import MixedPrecisionPresets
from meshplan.knowledge.rl_card import RLCard
from meshplan.schema.plan import Plan


def _changed(name: str, section: str, value) -> dict:
    return {**read_card(f"frameworks/{name}"), section: value}


def _fails_naming(name: str, data: dict, key: str) -> None:
    with pytest.raises(CardError) as exc:
        validate_card(f"frameworks/{name}", data, FrameworkCard)
    message = str(exc.value)
    assert f"cards/frameworks/{name}.yaml" in message and re.search(rf"key {re.escape(key)}[:. ]", message), message


def test_the_sections_load_typed_as_the_cards_write_them():
    bridge, automodel = framework_card("megatron-bridge"), framework_card("nemo-automodel")
    verl = framework_card("verl")
    assert isinstance(bridge.mixed_precision_presets, MixedPrecisionPresets)
    raw = read_card("frameworks/megatron-bridge")["mixed_precision_presets"]
    assert {f"{p.recipe}/{str(p.fp8_param_gather).lower()}": p.name
            for p in bridge.mixed_precision_presets.presets} == raw
    assert all(isinstance(e, LoraEngine) for card in (bridge, automodel, verl) for e in card.lora.values())
    assert set(verl.lora) == {"megatron", "fsdp"} and not framework_card("torchtitan").lora
    assert automodel.moe_dispatch.alltoall_as == "allgather" and automodel.flex_dispatcher_engines.engines == ["fsdp"]
    assert framework_card("megatron-core").moe_dispatch is None
    assert isinstance(rl_card("verl"), RLCard) and rl_card("verl") is verl.rl and rl_card("torchtitan") is None
    for name in ("megatron-bridge", "nemo-automodel", "verl", "skyrl", "deepspeed"):
        assert framework_card(name).model_extra is None, name  # nothing left untyped


def test_the_presets_answer_what_the_mapping_did():
    presets = framework_card("megatron-bridge").mixed_precision_presets
    assert presets.keeps_fp8_params("delayed") and presets.keeps_fp8_params("mxfp8")
    assert not presets.keeps_fp8_params("blockwise") and not presets.keeps_fp8_params("rowwise")
    assert [p.name for p in presets.of_recipe("blockwise", False)] == ["bf16_with_fp8_subchannel_scaling_mixed"]
    assert presets.named("bf16_mixed").recipe == "bf16" and presets.named("no_such_preset") is None


def test_fp8_param_gather_defaults_from_the_typed_presets():
    from meshplan.request.resolve import resolve
    from meshplan.schema.request import Request

    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-bridge", precision="fp8"))
    assert fp8_param_gather(job, Plan(fp8_recipe="delayed")) is True
    assert fp8_param_gather(job, Plan(fp8_recipe="blockwise")) is False
    core, _ = resolve(Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-core", precision="fp8"))
    assert fp8_param_gather(core, Plan(fp8_recipe="delayed")) is False  # no presets: Megatron-Core's own default


@pytest.mark.parametrize("name,section,value,key", [
    ("megatron-bridge", "lora", {"megatron": {"default_rank": 32, "default_rank_why": "w", "adapters": "fusd",
                                              "experts": "shared", "source": "s"}}, "lora.megatron.adapters"),
    ("verl", "lora", {"fspd": {"default_rank": 8, "default_rank_why": "w", "adapters": "per_projection",
                               "experts": "per_expert", "source": "s"}}, "lora.fspd"),
    ("megatron-bridge", "mixed_precision_presets", {"delayed/yes": "p"}, "mixed_precision_presets"),
    ("megatron-bridge", "mixed_precision_presets", {"mxfp9/true": "p"}, "mixed_precision_presets.presets.0.recipe"),
    ("nemo-automodel", "moe_dispatch", {"alltoall_as": "all_gather", "source": "s"}, "moe_dispatch.alltoall_as"),
    ("nemo-automodel", "flex_dispatcher_engines", {"engines": ["fsdp2"], "source": "s"},
     "flex_dispatcher_engines.engines.0"),
    ("nemo-automodel", "flex_dispatcher", {"engines": ["fsdp"], "source": "s"}, "flex_dispatcher"),  # the old name
    ("verl", "rl", {**read_card("frameworks/verl")["rl"], "rollout_ppp": True}, "rl.rollout_ppp"),
])
def test_a_misspelt_section_fails_at_load_naming_the_card_and_key(name, section, value, key):
    _fails_naming(name, _changed(name, section, value), key)


def test_an_rl_offload_that_misses_an_engine_is_refused_at_load():
    data = read_card("frameworks/verl")
    rl = {**data["rl"], "colocated_offload": True, "colocated_offload_states": {"fsdp": {"moves": ["weights"]}}}
    with pytest.raises(CardError, match=r"colocated_offload_states lacks the engines \['megatron'\]"):
        validate_card("frameworks/verl", {**data, "rl": rl}, FrameworkCard)
