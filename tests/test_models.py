"""Model catalog, config.json ingestion and exact parameter counts."""

import json

import pytest

from meshplan.cards import model_card
from meshplan.errors import MeshplanError
from meshplan.models import (
    architecture_from_config,
    catalog_architecture,
    catalog_keys,
    describe_architecture,
    describe_model,
    published_mismatches,
    resolve_model,
)


def test_catalog_has_the_reference_models():
    assert len(catalog_keys()) >= 29


def test_llama_3_1_8b_exact_count():
    assert describe_model("meta-llama/Llama-3.1-8B").total_params == 8_030_261_248


def test_deepseek_v3_total_active_and_mtp():
    r = describe_model("deepseek-ai/DeepSeek-V3")
    assert round(r.total_params / 1e9, 1) == 671.0
    assert round(r.active_params_excl_input_embedding / 1e9, 1) == 36.6  # DeepSeek's own convention
    assert 37.0e9 < r.active_params < 38.0e9
    assert 11.4e9 < r.mtp_params < 11.8e9  # the MTP module, not in the total
    names = {c.name for c in r.components}
    assert {"embedding", "attention", "dense_mlp", "routed_experts", "shared_experts", "router", "lm_head"} <= names
    assert sum(c.params for c in r.components) == r.total_params


@pytest.mark.parametrize("key", catalog_keys())
def test_every_catalog_total_matches_published(key):
    report = describe_model(key)
    assert published_mismatches(report) == []


@pytest.mark.parametrize("key", catalog_keys())
def test_config_json_round_trip_gives_the_catalog_model(key, tmp_path):
    """A config.json written from the card parses to exactly the catalog architecture."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(model_card(key).config))
    from_file = resolve_model(str(path))
    from_catalog = catalog_architecture(key)
    strip = {"key", "name", "hf_id", "origin"}
    assert from_file.model_dump(exclude=strip) == from_catalog.model_dump(exclude=strip)
    assert describe_architecture(from_file).total_params == describe_model(key).total_params


@pytest.mark.parametrize("name", ["LLAMA-3.1-8B", "meta-llama/llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B"])
def test_lookup_by_key_hf_id_and_alias_is_case_insensitive(name):
    assert resolve_model(name).key == "llama-3.1-8b"


def test_unknown_model_suggests_close_names():
    with pytest.raises(MeshplanError) as exc:
        resolve_model("llama-3.1-7b")
    assert "llama-3.1-70b" in str(exc.value) or "llama-3.1-8b" in str(exc.value)


@pytest.mark.parametrize("size,expected", [("70B", 70e9), ("7e9", 7e9), ("1.5T", 1.5e12), ("350M", 350e6)])
def test_size_alone_gives_a_generic_model_of_about_that_size(size, expected):
    r = describe_model(size)
    assert r.generic and r.architecture.generic
    assert abs(r.total_params - expected) / expected < 0.02
    assert any("Generic model" in a for a in r.assumptions)


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(MeshplanError, match="Unsupported model_type 'bert'"):
        architecture_from_config({"model_type": "bert"})


def test_missing_field_is_named():
    cfg = dict(model_card("llama-3.1-8b").config)
    del cfg["hidden_size"], cfg["vocab_size"]
    with pytest.raises(MeshplanError, match="hidden_size, vocab_size"):
        architecture_from_config(cfg)


def test_malformed_config_json_is_a_clear_error(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(MeshplanError, match="not valid JSON"):
        resolve_model(str(bad))
    bad.write_text(json.dumps({**model_card("llama-3.1-8b").config, "num_hidden_layers": "32"}))
    with pytest.raises(MeshplanError, match="num_hidden_layers"):
        resolve_model(str(bad))


def test_hand_counted_small_llama():
    """A tiny llama counted by hand: embeddings, attention with GQA, SwiGLU FFN, norms, untied head."""
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 10}
    r = describe_architecture(architecture_from_config(cfg))
    head_dim = 2
    attention = 8 * 4 * head_dim + 2 * 8 * 2 * head_dim + 4 * head_dim * 8  # q, k+v, o
    mlp = 3 * 8 * 16
    norms = 2 * 8
    expected = 10 * 8 + 2 * (attention + mlp + norms) + 8 + 10 * 8
    assert r.total_params == expected


def test_moe_active_counts_only_top_k_experts():
    r = describe_model("mixtral-8x7b")
    experts = next(c for c in r.components if c.name == "routed_experts")
    assert experts.active_params * 8 == experts.params * 2


def test_per_architecture_cache_is_keyed_by_the_object():
    from meshplan.models import per_architecture

    calls = []
    build = per_architecture(lambda arch: calls.append(arch.name) or len(calls))
    arch = catalog_architecture("llama-3.1-8b")
    assert build(arch) == build(arch) == 1
    twin = arch.model_copy()  # equal, but another object: built again, never confused with the first
    assert build(twin) == 2 and calls == ["Llama-3.1-8B", "Llama-3.1-8B"]
