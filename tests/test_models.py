"""Model catalog, config.json ingestion and exact parameter counts."""

import json

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import model_card
from meshplan.knowledge.catalog import (
    catalog_architecture,
    catalog_keys,
    describe_architecture,
    describe_model,
    published_mismatches,
    resolve_model,
)
from meshplan.knowledge.model_config import architecture_from_config, read_config_file


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


def test_a_component_count_of_one_reads_in_the_singular():
    """DeepSeek-V2-Lite's one dense layer (first_k_dense_replace 1) read '1 dense FFN layers'."""
    notes = {c.name: c.note for c in describe_model("deepseek-v2-lite").components}
    assert notes["dense_mlp"] == "1 dense FFN layer" and notes["routed_experts"].startswith("26 MoE layers x 64")


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


def test_a_folder_in_the_working_directory_is_read_as_its_config_json(tmp_path, monkeypatch):
    """`meshplan describe my-model` beside a clone of a Hugging Face repository said 'Unknown model' (only './my-model'
    or a name with a slash was read as a path); a catalog name or size still wins over a folder of that name, and a
    folder without a config.json or a file is still no model."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**model_card("llama-3.1-8b").config, "num_hidden_layers": 4}))
    (tmp_path / "70B").mkdir()
    (tmp_path / "llama-3.1-8b").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model("my-model").num_layers == 4
    assert resolve_model("llama-3.1-8b").key == "llama-3.1-8b" and resolve_model("70B").generic
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").write_text("not a model")
    for name in ("empty", "notes"):  # a folder without a config.json, a file: no model, as before
        with pytest.raises(MeshplanError, match=f"Unknown model '{name}'"):
            resolve_model(name)
    with pytest.raises(MeshplanError, match="Unknown model 'my-modle'"):
        resolve_model("my-modle")


@pytest.mark.parametrize("size,expected", [("70B", 70e9), ("7e9", 7e9), ("1.5T", 1.5e12), ("350M", 350e6)])
def test_size_alone_gives_a_generic_model_of_about_that_size(size, expected):
    r = describe_model(size)
    assert r.generic and r.architecture.generic
    assert abs(r.total_params - expected) / expected < 0.02
    assert any("Generic model" in a for a in r.assumptions)



def test_a_vision_language_wrapper_names_its_text_config():
    """llava's config wraps a text model meshplan plans (text_config); 'Unsupported model_type' with the whole list
    gave no hint that the text model alone can be planned."""
    text = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 11008, "vocab_size": 32064}
    with pytest.raises(MeshplanError, match="is a vision-language model") as caught:
        architecture_from_config({"model_type": "llava", "text_config": text,
                                  "vision_config": {"model_type": "clip_vision_model"}})
    assert "pass its text_config as the config.json (its model_type 'llama')" in str(caught.value)
    with pytest.raises(MeshplanError, match="Unsupported model_type 'llava'"):  # a text model it does not know
        architecture_from_config({"model_type": "llava", "text_config": {"model_type": "bert"}})


def test_a_file_too_large_to_be_a_config_is_refused_with_a_fix(tmp_path):
    big = tmp_path / "config.json"
    big.write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(MeshplanError, match=r"is more than 1,048,576 bytes; a config\.json is a few KB\. Fix: "):
        read_config_file(big)


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(MeshplanError, match="Unsupported model_type 'bert'"):
        architecture_from_config({"model_type": "bert"})
    # a hand-written config without model_type said "Unsupported model_type None"
    with pytest.raises(MeshplanError, match="states no model_type") as missing:
        architecture_from_config({"hidden_size": 4096, "num_hidden_layers": 32})
    assert "llama" in missing.value.fix and "None" not in str(missing.value)


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
    from meshplan.knowledge.model_counts import per_architecture

    calls = []
    build = per_architecture(lambda arch: calls.append(arch.name) or len(calls))
    arch = catalog_architecture("llama-3.1-8b")
    assert build(arch) == build(arch) == 1
    twin = arch.model_copy()  # equal, but another object: built again, never confused with the first
    assert build(twin) == 2 and calls == ["Llama-3.1-8B", "Llama-3.1-8B"]


# --------------------------------------------------------------------------- generic models by size


@pytest.mark.parametrize("size", ["7B", "70B", "405B", "1.5T", "7e9"])
def test_generic_models_have_the_attention_real_models_of_that_size_use(size):
    """Heads in whole groups of 8 of width 128 over 8 KV heads (Llama 3), so TP 1/2/4/8 divide both."""
    from meshplan import api
    from meshplan.schema.request import Request

    arch = resolve_model(size)
    assert arch.generic and arch.head_dim == 128 and arch.num_kv_heads == 8
    assert arch.num_attention_heads % 8 == 0 and arch.hidden_size == arch.num_attention_heads * 128
    assert arch.ffn_hidden_size % 256 == 0
    for tp in (1, 2, 4, 8):
        findings = api.check_config(Request(model=size, num_gpus=8, tp=tp)).findings
        assert not [f.id for f in findings if f.id.startswith("TP")], (size, tp)


def test_generic_70b_and_8b_are_llama_3_shaped_exactly():
    """At 70B and 8B the nearest Llama-3 shape is Llama 3 itself: same layers, widths and exact count."""
    g70, g8 = resolve_model("70B"), resolve_model("8B")
    assert (g70.num_layers, g70.hidden_size, g70.num_attention_heads, g70.ffn_hidden_size) == (80, 8192, 64, 28672)
    assert (g8.num_layers, g8.hidden_size, g8.num_attention_heads, g8.ffn_hidden_size) == (32, 4096, 32, 14336)
    assert describe_model("70B").total_params == describe_model("llama-3.1-70b").total_params == 70_553_706_496
    assert describe_model("8B").total_params == 8_030_261_248


def test_generic_405b_and_7b_shapes():
    """Hidden/layers nearest 110 within 2% of the size, depth with the most factors of two in that band."""
    g405, g7 = resolve_model("405B"), resolve_model("7B")
    shape = (g405.num_layers, g405.hidden_size, g405.num_attention_heads, g405.ffn_hidden_size)
    assert shape == (136, 15360, 120, 53760)
    assert (g7.num_layers, g7.hidden_size, g7.num_attention_heads) == (27, 4096, 32)  # 28 layers would be 7.16B
    report = describe_model("405B")
    assert report.generic and "120 heads of 128 over 8 KV heads" in " ".join(report.assumptions)


@pytest.mark.parametrize("size", ["10M", "1e999", "500T"])
def test_generic_sizes_outside_the_shapeable_range_are_a_clear_error(size):
    with pytest.raises(MeshplanError, match=f"A generic model of {size.upper()} parameters is outside the range "
                                            "meshplan can shape: 293M to 220T"):
        resolve_model(size)


# --------------------------------------------------------------------------- variants and Llama 3


@pytest.mark.parametrize("name,key", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("Qwen/Qwen3-30B-A3B-Base", "qwen3-30b-a3b"),
    ("llama-3.1-70b-instruct", "llama-3.1-70b"),
    ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
    ("google/gemma-2-27b-it", "gemma-2-27b"),
    ("Meta-Llama-3-70B-Instruct", "llama-3-70b"),
    ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b"),
])
def test_instruct_base_and_chat_variants_resolve_to_their_architecture(name, key):
    arch = resolve_model(name)
    base = catalog_architecture(key)
    assert arch.key == key and arch.name == f"{name} (architecture of {base.name})"
    assert arch.model_dump(exclude={"name", "origin"}) == base.model_dump(exclude={"name", "origin"})
    report = describe_model(name)
    assert report.total_params == describe_model(key).total_params and published_mismatches(report) == []
    assert any(f"{name} is not in the catalog under that name" in a and f"catalog card {key}" in a
               for a in report.assumptions)
    assert resolve_model(name) is arch  # one object per name, for the per-architecture caches


@pytest.mark.parametrize("name,key", [("meta-llama/Meta-Llama-3-8B", "llama-3-8b"), ("llama-3-70b", "llama-3-70b"),
                                      ("Meta-Llama-3-8B", "llama-3-8b"), ("llama3-70b", "llama-3-70b")])
def test_llama_3_ids_are_llama_3_not_3_1(name, key):
    arch = resolve_model(name)
    assert arch.key == key and arch.name.startswith("Llama-3-") and arch.max_position_embeddings == 8192
    twin = catalog_architecture(key.replace("llama-3-", "llama-3.1-"))
    assert twin.max_position_embeddings == 131072
    assert arch.rope.scaling is None and twin.rope.scaling == "llama3"  # rope scaling came with 3.1
    assert arch.rope.theta == twin.rope.theta == 500000
    differ = {"key", "name", "hf_id", "max_position_embeddings", "rope"}
    assert arch.model_dump(exclude=differ) == twin.model_dump(exclude=differ)


@pytest.mark.parametrize("name,hint", [("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b"),
                                       ("llama-3.1-7b-instruct", "llama-3.1-70b")])
def test_unknown_variants_still_suggest_close_names(name, hint):
    with pytest.raises(MeshplanError, match=f"Unknown model '{name}'.*Did you mean: .*{hint}"):
        resolve_model(name)


# --------------------------------------------------------------------------- config.json cache


def test_an_edited_config_json_is_read_again(tmp_path):
    """The same path with new content (same size, same second) gives the new architecture."""
    path = tmp_path / "config.json"
    cfg = dict(model_card("llama-3.1-8b").config)
    path.write_text(json.dumps({**cfg, "num_hidden_layers": 32}))
    first = resolve_model(str(path))
    assert first.num_layers == 32 and resolve_model(str(path)) is first  # unchanged: the cached object
    path.write_text(json.dumps({**cfg, "num_hidden_layers": 16}))
    assert resolve_model(str(path)).num_layers == 16
    assert describe_model(str(path)).architecture.num_layers == 16


def test_classic_families_alibi_and_parallel_attention():
    """BLOOM (ALiBi, an embedding LayerNorm), GPT-NeoX (parallel residual, partial rotary) and GPT-J (one LayerNorm
    feeding attention and MLP, a biased lm_head) read from their own config.json names, each count by hand."""
    from meshplan.knowledge.model_config import architecture_from_config
    from meshplan.knowledge.model_counts import total_params

    bloom = architecture_from_config({"model_type": "bloom", "n_layer": 2, "n_head": 4, "hidden_size": 64,
                                      "vocab_size": 100})
    assert bloom.alibi and bloom.rope is None and bloom.learned_position_embeddings == 0 and bloom.embedding_norm
    assert (bloom.ffn_hidden_size, bloom.activation, bloom.gated_mlp, bloom.tie_word_embeddings) == (256, "gelu",
                                                                                                   False, True)
    h = 64
    per_layer = 4 * h * h + 4 * h + 2 * (4 * h * h) + 4 * h + h + 2 * 2 * h  # qkv+o with biases, MLP, two LayerNorms
    assert total_params(bloom) == 2 * per_layer + 100 * h + 2 * h + 2 * h  # tied embedding, its norm, final norm
    neox = architecture_from_config({"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 64,
                                     "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 100,
                                     "rotary_pct": 0.25, "max_position_embeddings": 128})
    assert neox.parallel_attention and neox.rope.fraction == 0.25 and not neox.tie_word_embeddings
    assert total_params(neox) == 2 * per_layer + 100 * h + 2 * h + 100 * h
    gptj = architecture_from_config({"model_type": "gptj", "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8,
                                     "vocab_size": 100, "n_positions": 128})
    assert gptj.parallel_attention and gptj.norms_per_layer == 1 and not gptj.qkv_bias and gptj.output_bias
    assert gptj.rope.fraction == 0.5  # rotary_dim 8 of a 16-wide head
    assert total_params(gptj) == 2 * (4 * h * h + 2 * (4 * h * h) + 5 * h + 2 * h) + 100 * h + 2 * h + 100 * h + 100


def test_mla_query_key_head_width_is_its_two_parts():
    """MLASpec.qk_head_dim, the one count of MLA's Q/K head width: DeepSeek-V3's 128 position-free + 64 rotary, the
    head_dim the reader gives the model."""
    arch = resolve_model("deepseek-v3")
    assert arch.mla.qk_head_dim == 192 == arch.mla.qk_nope_head_dim + arch.mla.qk_rope_head_dim == arch.head_dim
