"""The framework cards' `read` sections load as typed records (knowledge/read_card.py): a misspelt key or a value
out of its vocabulary fails when the card loads, naming the card and the key, instead of a reader finding nothing."""

import re

import pytest

from meshplan.knowledge.cards import CardError, FrameworkCard, card_names, framework_card, read_card, validate_card
from meshplan.knowledge.read_card import ReadSection


def _with_read(name: str, **change) -> dict:
    data = read_card(f"frameworks/{name}")
    return {**data, "read": {**data["read"], **change}}


def _same(a, b) -> bool:
    """Equal and of the same types all the way down (a default read as 1.0 where the card says 1 would differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_every_read_section_loads_typed_as_the_card_writes_it():
    for name in [n.split("/")[1] for n in card_names() if n.startswith("frameworks/")]:
        raw, card = read_card(f"frameworks/{name}").get("read"), framework_card(name)
        assert "read" not in (card.model_extra or {}), name
        if raw is None:
            assert card.read is None, name
            continue
        assert isinstance(card.read, ReadSection)
        assert _same(card.read.model_dump(exclude_unset=True), raw), name


@pytest.mark.parametrize("name,change,key", [
    ("megatron-core", {"model_flag": {"--kv-channels": "head_dim"}}, "read.model_flag"),  # misspelt section key
    ("megatron-core", {"launchers": ["pretrain_gpt.py"]}, "read.launchers"),
    ("megatron-core", {"model_flags": {"--num-experts": "num_expert"}}, "read.model_flags.--num-experts"),
    ("deepspeed", {"model_build_position_table": "by_typ"}, "read.model_build_position_table"),
    ("deepspeed", {"model_build_values": {"--normalization": {"allowed": ["rmsnorm"], "whyy": "w"}}},
     "read.model_build_values.--normalization.whyy"),
    ("deepspeed", {"model_defaults": {"top_k": "1"}}, "read.model_defaults.top_k"),  # never coerced
    ("megatron-bridge", {"recipe_names": {"jobs": {"pretrain": "pretrian"}, "precisions": {}, "source": "s"}},
     "read.recipe_names.jobs.pretrain"),
])
def test_a_misspelt_read_key_fails_at_load_naming_the_card_and_key(name, change, key):
    with pytest.raises(CardError) as exc:
        validate_card(f"frameworks/{name}", _with_read(name, **change), FrameworkCard)
    message = str(exc.value)
    assert f"cards/frameworks/{name}.yaml" in message and re.search(rf"key {re.escape(key)}[:.]", message), message


@pytest.mark.parametrize("change,complaint", [
    ({"model_shape": ["--num-layers", "--hidden-size"]}, "model_shape names 2 flags"),
    ({"model_defaults": {"num_groups": 1}}, r"model_defaults names \['num_groups'\], which no model_flags"),
    ({"model_build_values": {"--mlp-typ": {"allowed": ["standard"], "why": "w"}}}, "no model_build flags"),
    ({"model_build_refused": {"--swiglu": "w"}}, "which the model is built with"),
    ({"absent": {"sequence_paralel": False}}, "no request fields"),
])
def test_read_entries_that_disagree_are_refused(change, complaint):
    with pytest.raises(CardError, match=complaint) as exc:
        validate_card("frameworks/deepspeed", _with_read("deepspeed", **change), FrameworkCard)
    assert "cards/frameworks/deepspeed.yaml" in str(exc.value)


def test_a_misspelt_registry_entry_fails_at_load_naming_the_card_and_key():
    data = read_card("frameworks/torchtitan")
    assert framework_card("torchtitan").registry["llama-3.1-8b"].config == "llama3_8b"
    broken = {**data, "registry": {**data["registry"], "llama-3.1-8b": {"modul": "llama3", "config": "llama3_8b"}}}
    with pytest.raises(CardError) as exc:
        validate_card("frameworks/torchtitan", broken, FrameworkCard)
    message = str(exc.value)
    assert "cards/frameworks/torchtitan.yaml" in message and "key registry.llama-3.1-8b.modul:" in message, message
