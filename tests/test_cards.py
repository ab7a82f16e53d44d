"""Cards load through their schemas, and a malformed card names the file, the key and the problem."""

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import CardError, ModelCard, card_names, framework_card, validate_card
from meshplan.knowledge.hardware import get_gpu, gpu_catalog


def test_every_model_and_framework_card_loads():
    from meshplan.knowledge.catalog import catalog_architecture, catalog_keys

    for key in catalog_keys():
        catalog_architecture(key)
    for name in [n.split("/")[1] for n in card_names() if n.startswith("frameworks/")]:
        framework_card(name)


def test_malformed_card_error_names_file_and_key():
    with pytest.raises(CardError) as exc:
        validate_card("models/broken", {"key": "x", "name": "x", "family": "dense", "config": {},
                                         "published": {"text": "t", "source": "s", "total": "lots"},
                                         "sources": []}, ModelCard)
    message = str(exc.value)
    assert "cards/models/broken.yaml" in message and "published.total" in message


def test_hardware_catalog_covers_the_required_parts():
    keys = set(gpu_catalog())
    assert {"a100-40gb", "a100-80gb", "h100", "h100-pcie", "h200", "h800", "h20", "b200", "gb200", "mi300x"} <= keys
    h100 = get_gpu("H100")
    assert h100.name.startswith("NVIDIA H100 SXM") and h100.nvlink_domain == 8
    assert get_gpu("gb200").nvlink_domain == 72
    for gpu in gpu_catalog().values():
        assert gpu.sources, gpu.key


def test_unknown_gpu_suggests():
    with pytest.raises(MeshplanError, match="h100"):
        get_gpu("h1000")


# --------------------------------------------------------------------------- framework cards: one home per fact


def test_the_framework_list_is_the_card_files():
    from typing import get_args

    from meshplan.adapters.capabilities import renderable_frameworks
    from meshplan.core.card_files import card_root, frameworks_with_section, has_section
    from meshplan.schema.choices import FRAMEWORKS, Framework

    files = sorted(p.name.removesuffix(".yaml") for p in card_root().joinpath("frameworks").iterdir()
                   if p.name.endswith(".yaml"))
    assert FRAMEWORKS == tuple(files) == get_args(Framework)
    assert not framework_card("nanotron").renderable and framework_card("verl").renderable
    # The MCP server names the renderable frameworks from the files' text, before any card is parsed.
    assert frameworks_with_section("adapter") == renderable_frameworks() == tuple(
        name for name in FRAMEWORKS if framework_card(name).adapter is not None)
    assert [has_section(text, "adapter") for text in ("adapter:\n  v: 1\n", "adapter:  # c\n\n  # x\n  v: 1",
            "adapter:\nrl: 1\n", "adapter: null\n", "x:\n  adapter:\n    v: 1\n", "# adapter:\n  v: 1\n")] == [
        True, True, False, False, False, False]
    with pytest.raises(CardError, match=r"No framework card 'megatron'.*Known: deepspeed"):
        framework_card("megatron")


def _patched(framework: str, **sections):
    """`framework`'s card with some sections replaced (the code must read the card it is given)."""
    card = framework_card(framework)
    return card.model_copy(update={k: getattr(card, k).model_copy(update=v) for k, v in sections.items()})


def test_engine_and_zero3_bytes_per_zero_stage_come_from_the_card():
    from meshplan.arithmetic.memory_states import convention_name
    from meshplan.rules.engine import backend_of

    assert [backend_of(framework_card("verl"), z) for z in range(4)] == ["megatron", "megatron", "megatron", "fsdp"]
    assert {backend_of(framework_card("megatron-core"), z) for z in range(4)} == {"megatron"}
    assert [convention_name(framework_card("megatron-bridge"), z) for z in range(4)] == ["megatron"] * 3 + [
        "megatron_fsdp"]
    assert convention_name(framework_card("skyrl"), 3) == "fsdp2_hf"
    assert convention_name(framework_card("deepspeed"), 3) == "deepspeed"
    engines = _patched("megatron-core", engine={"by_zero_stage": {0: "megatron", 1: "megatron", 2: "megatron",
                                                                    3: "fsdp"}})
    assert backend_of(engines, 3) == "fsdp"
    assert convention_name(_patched("megatron-core", engine={"zero3_memory_convention": "fsdp2"}), 3) == "fsdp2"


def test_an_unset_etp_is_tp_only_where_the_card_says_megatron_core_defaults_it():
    from meshplan.request.resolve import resolve
    from meshplan.schema.choices import FRAMEWORKS
    from meshplan.schema.request import Request

    etp = {fw: resolve(Request(model="mixtral-8x7b", num_gpus=16, tp=2, framework=fw))[1].etp for fw in FRAMEWORKS}
    assert {fw for fw, value in etp.items() if value == 2} == {"megatron-core", "megatron-bridge", "verl", "skyrl"}
    assert set(etp.values()) == {1, 2}
    assert resolve(Request(model="llama-3.1-8b", num_gpus=16, tp=2, framework="verl"))[1].etp == 1  # dense


def test_mem001_raises_zero_as_far_as_the_card_allows():
    import meshplan.check.alternatives as rules
    from meshplan.request.resolve import resolve
    from meshplan.rules.engine import Context
    from meshplan.schema.request import Request

    def zeros(framework: str, pp: int, card=None) -> list[str]:
        job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=8, pp=pp, zero_stage=0, framework=framework))
        if card is not None:
            job.attach_cards(card)
        return [label for label, _ in rules._candidates(Context(job, plan)) if label.startswith("zero_stage")]

    assert zeros("deepspeed", 1) == ["zero_stage=1", "zero_stage=2", "zero_stage=3"]
    assert zeros("deepspeed", 2) == ["zero_stage=1"]  # DS002: ZeRO-2/3 do not combine with its pipeline engine
    assert zeros("megatron-core", 2) == ["zero_stage=1", "zero_stage=2", "zero_stage=3"]
    assert zeros("verl", 1) == [] and zeros("torchtitan", 1) == []
    assert zeros("verl", 1, _patched("verl", memory_fix={"highest_zero_stage": 1})) == ["zero_stage=1"]


def test_flex_dispatcher_support_is_where_the_adapter_renders_it():
    from meshplan.schema.choices import FRAMEWORKS

    assert [fw for fw in FRAMEWORKS if framework_card(fw).flex_dispatcher] == [
        "megatron-bridge", "megatron-core", "nemo-automodel", "skyrl", "verl"]
    assert not framework_card("torchtitan").flex_dispatcher  # 0.2.2 renders it, the default 0.3.0 does not


def test_the_card_limit_is_what_kf001_checks():
    from meshplan.rules.engine import rule_specs
    from meshplan.schema.choices import FRAMEWORKS

    forbidding = [fw for fw in FRAMEWORKS if not framework_card(fw).limits.moe_with_pipeline]
    assert forbidding == ["kempnerforge"] and rule_specs()["KF001"].frameworks == forbidding


MTP_BUILT = {"builds_model_mtp": {"megatron": True, "fsdp": True}, "builds_model_mtp_source": "s"}
"""The engine section's MTP fields, so a case that breaks another engine field is refused for that field."""


@pytest.mark.parametrize("change,complaint", [
    ({"defaults": {"zero_stage": 1, "etp": "tp"}}, "etp_why"),
    ({"defaults": {"zero_stage": 1, "etp": 1, "etp_recipes": "r"}}, "etp_recipes qualifies an etp: tp default"),
    ({"limits": {"moe_with_pipeline": False}}, "a limit needs a why"),
    ({"engine": {"by_zero_stage": {0: "megatron", 1: "megatron"}, "why": "w", **MTP_BUILT}},
     "by_zero_stage needs exactly"),
    ({"engine": {"by_zero_stage": {0: "megatorn", 1: "megatron", 2: "megatron", 3: "fsdp"}, "why": "w", **MTP_BUILT}},
     "engine.by_zero_stage.0"),
    ({"search": {"vpp": True, "cp": True, "ep": True, "etp": True, "recompute": ["none"], "source": "s",
                 "flex_dispatcher": True}}, "search.flex_dispatcher"),
])
def test_a_framework_claim_without_its_source_or_out_of_vocabulary_is_refused(change, complaint):
    from meshplan.knowledge.cards import FrameworkCard, read_card

    data = {**read_card("frameworks/nanotron"), **change}
    with pytest.raises(CardError, match=complaint) as exc:
        validate_card("frameworks/nanotron", data, FrameworkCard)
    assert "cards/frameworks/nanotron.yaml" in str(exc.value)
