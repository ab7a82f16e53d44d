"""Sanity bounds on model fields: every field read from a card or a config.json is refused outside its range
with the field, the value and the range; whatever is accepted stays bounded in time and in its counts."""

import json
import re
import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import model_card
from meshplan.knowledge.catalog import describe_architecture, resolve_model
from meshplan.knowledge.model_config import architecture_from_config, shapes_card
from meshplan.schema.request import Request


def config(card: str, **fields) -> dict:
    return {**model_card(card).config, **fields}


def write(path, cfg) -> str:
    path.write_text(json.dumps(cfg))
    return str(path)


# bound in cards/model_shapes.yaml -> (catalog card to start from, field set, other fields the case needs).
BOUND_CASES = {
    "num_hidden_layers": ("llama-3.1-8b", "num_hidden_layers", {}),
    "hidden_size": ("llama-3.1-8b", "hidden_size", {"num_attention_heads": 1, "num_key_value_heads": 1}),
    "intermediate_size": ("qwen3-30b-a3b", "moe_intermediate_size", {}),
    "num_attention_heads": ("llama-3.1-8b", "num_attention_heads", {"hidden_size": 1024 * 1024 // 8,
                                                                    "num_key_value_heads": 1}),
    "head_dim": ("qwen3-8b", "head_dim", {}),
    "vocab_size": ("llama-3.1-8b", "vocab_size", {}),
    "num_experts": ("mixtral-8x7b", "num_local_experts", {"num_experts_per_tok": 1}),
    "num_shared_experts": ("deepseek-v2-lite", "n_shared_experts", {}),
    "lora_rank": ("deepseek-v2-lite", "kv_lora_rank", {}),
    "max_position_embeddings": ("llama-3.1-8b", "max_position_embeddings", {}),
    "num_nextn_predict_layers": ("deepseek-v3", "num_nextn_predict_layers", {}),
}


def test_every_bound_of_the_card_has_a_case():
    assert set(BOUND_CASES) == set(shapes_card().bounds)


@pytest.mark.parametrize("bound", sorted(BOUND_CASES))
def test_each_bound_accepts_its_ends_and_refuses_one_past(bound):
    card, field, extra = BOUND_CASES[bound]
    spec = shapes_card().bounds[bound]
    for value in (spec.min, spec.max):
        architecture_from_config(config(card, **extra, **{field: value}))
    for value in (spec.min - 1, spec.max + 1):
        with pytest.raises(MeshplanError) as exc:
            architecture_from_config(config(card, **extra, **{field: value}))
        assert f"{field} = {value} is out of range: allowed {spec.min:,} to {spec.max:,}." in str(exc.value)


def test_the_layer_bound_message_in_full(tmp_path):
    path = write(tmp_path / "config.json", config("llama-3.1-8b", num_hidden_layers=10**9))
    started = time.monotonic()
    with pytest.raises(MeshplanError) as exc:
        api.describe_model(path)
    assert time.monotonic() - started < 1
    assert str(exc.value).startswith(f"{path}: num_hidden_layers = 1000000000 is out of range: allowed 1 to 1,024. "
                                     "The deepest real models")


def test_a_hidden_size_that_overflows_a_float_is_a_range_error(tmp_path):
    path = write(tmp_path / "config.json", config("llama-3.1-8b", hidden_size=10**400))
    with pytest.raises(MeshplanError, match=r"hidden_size = a 401-digit integer is out of range: allowed 1 to 131,072"):
        api.describe_model(path)
    with pytest.raises(MeshplanError, match="hidden_size = a 401-digit integer"):
        api.estimate_memory(Request(model=path, num_gpus=8))


def test_an_integer_too_long_for_python_json_is_a_clear_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config("llama-3.1-8b")).replace('"hidden_size": 4096', '"hidden_size": ' + "9" * 5000))
    with pytest.raises(MeshplanError, match="is not valid JSON"):
        resolve_model(str(path))


def test_top_k_above_the_experts_is_refused_and_equal_is_all_active():
    with pytest.raises(MeshplanError, match=r"num_experts_per_tok = 16 is out of range: allowed 1 to 8\. A token "
                                            r"cannot use more than the num_local_experts = 8 experts"):
        architecture_from_config(config("mixtral-8x7b", num_experts_per_tok=16))
    with pytest.raises(MeshplanError, match="num_experts_per_tok = 0 is out of range: allowed 1 to 8"):
        architecture_from_config(config("mixtral-8x7b", num_experts_per_tok=0))
    report = describe_architecture(architecture_from_config(config("mixtral-8x7b", num_experts_per_tok=8)))
    assert report.active_params == report.total_params
    for card, field in (("qwen3-30b-a3b", "num_experts"), ("deepseek-v3", "n_routed_experts")):
        experts = model_card(card).config[field]
        with pytest.raises(MeshplanError, match=f"allowed 1 to {experts}"):
            architecture_from_config(config(card, num_experts_per_tok=experts + 1))


@pytest.mark.parametrize("kv,message", [
    (0, "num_key_value_heads = 0 is out of range: allowed 1 to 32. At most num_attention_heads = 32"),
    (64, "num_key_value_heads = 64 is out of range: allowed 1 to 32"),
    (3, "num_key_value_heads = 3 does not divide num_attention_heads = 32: allowed 1, 2, 4, 8, 16, 32."),
    (-8, "num_key_value_heads = -8 is out of range"),
])
def test_kv_heads_must_divide_the_heads(kv, message):
    with pytest.raises(MeshplanError) as exc:
        architecture_from_config(config("llama-3.1-8b", num_key_value_heads=kv))
    assert message in str(exc.value)


@pytest.mark.parametrize("kv", [1, 2, 4, 8, 16, 32])
def test_kv_heads_that_divide_the_heads_are_accepted(kv):
    assert architecture_from_config(config("llama-3.1-8b", num_key_value_heads=kv)).num_kv_heads == kv


def test_kv_heads_absent_means_one_per_head():
    cfg = config("llama-3.1-8b")
    del cfg["num_key_value_heads"]
    assert architecture_from_config(cfg).num_kv_heads == 32


def test_hidden_size_the_heads_do_not_divide_needs_a_head_dim():
    with pytest.raises(MeshplanError, match="hidden_size = 4100 is not divisible by num_attention_heads = 32, and "
                                            "no head_dim is given"):
        architecture_from_config(config("llama-3.1-8b", hidden_size=4100))
    arch = architecture_from_config(config("llama-3.1-8b", hidden_size=4100, head_dim=128))
    assert arch.head_dim == 128  # as gemma-2 and gpt-oss: the head width is its own field


@pytest.mark.parametrize("value,kind", [(4096.0, "(float)"), (4096.5, "(float)"), (True, "(a boolean)"),
                                        ("4096", "(str)"), ([4096], "(list)")])
def test_integer_fields_refuse_other_types(value, kind):
    with pytest.raises(MeshplanError) as exc:
        architecture_from_config(config("llama-3.1-8b", hidden_size=value))
    assert f"hidden_size must be an integer, got {json.dumps(value)} {kind}." in str(exc.value)


def test_flag_and_text_fields_refuse_other_types():
    with pytest.raises(MeshplanError, match='tie_word_embeddings must be true or false, got "no"'):
        architecture_from_config(config("llama-3.1-8b", tie_word_embeddings="no"))
    with pytest.raises(MeshplanError, match="hidden_act must be a string, got 3"):
        architecture_from_config(config("llama-3.1-8b", hidden_act=3))


@pytest.mark.parametrize("value", [["llama"], {"name": "llama"}, 3])
def test_a_model_type_that_is_not_a_string_is_refused(value):
    """A list or object as model_type was looked up in the unmodelled-layer table and raised TypeError (unhashable
    type: 'list'): a traceback on the CLI and the HTTP page's 500."""
    with pytest.raises(MeshplanError, match=r"model_type must be a string, got " + re.escape(json.dumps(value))):
        architecture_from_config(config("llama-3.1-8b", model_type=value))


def test_layer_lists_and_steps_stay_within_the_layers():
    with pytest.raises(MeshplanError, match=r"mlp_only_layers holds 48: allowed layer indices 0 to 47"):
        architecture_from_config(config("qwen3-30b-a3b", mlp_only_layers=[0, 48]))
    assert len(architecture_from_config(config("qwen3-30b-a3b", mlp_only_layers=[0, 47, 47])).moe.moe_layers) == 46
    with pytest.raises(MeshplanError, match="decoder_sparse_step = 0 is out of range: allowed 1 to 48"):
        architecture_from_config(config("qwen3-30b-a3b", decoder_sparse_step=0))
    with pytest.raises(MeshplanError, match="first_k_dense_replace = 62 is out of range: allowed 0 to 61"):
        architecture_from_config(config("deepseek-v3", first_k_dense_replace=62))
    with pytest.raises(MeshplanError, match="moe_layers holds -1"):
        text = model_card("llama-4-scout").config["text_config"]
        architecture_from_config({"model_type": "llama4", "text_config": {**text, "moe_layers": [-1]}})


def test_catalog_card_errors_name_the_card():
    from meshplan.knowledge.model_config import _Fields

    assert _Fields({}, "cards/models/x.yaml").fail("bad").reason == "cards/models/x.yaml: bad"
    with pytest.raises(MeshplanError, match=r"^cards/models/llama-3.1-8b.yaml: num_hidden_layers = 0"):
        architecture_from_config(config("llama-3.1-8b", num_hidden_layers=0), key="llama-3.1-8b", origin="catalog")


def test_the_largest_accepted_model_is_answered_quickly(tmp_path):
    """Every bound at its maximum at once: the counts and the memory estimate stay exact and fast."""
    bounds = {name: spec.max for name, spec in shapes_card().bounds.items()}
    cfg = config("mixtral-8x7b", num_hidden_layers=bounds["num_hidden_layers"], hidden_size=bounds["hidden_size"],
                 num_attention_heads=bounds["num_attention_heads"], num_key_value_heads=1,
                 intermediate_size=bounds["intermediate_size"], vocab_size=bounds["vocab_size"],
                 num_local_experts=bounds["num_experts"], num_experts_per_tok=bounds["num_experts"],
                 max_position_embeddings=bounds["max_position_embeddings"])
    path = write(tmp_path / "config.json", cfg)
    started = time.monotonic()
    report = api.describe_model(path)
    memory = api.estimate_memory(Request(model=path, num_gpus=8))
    assert time.monotonic() - started < 5
    assert report.active_params == report.total_params > 10**17
    assert memory.peak_bytes > 0 and not memory.fits


# --------------------------------------------------------------------------- fuzz

FIELDS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "vocab_size", "head_dim", "max_position_embeddings", "num_local_experts", "num_experts_per_tok",
          "tie_word_embeddings", "n_routed_experts", "moe_intermediate_size", "kv_lora_rank", "first_k_dense_replace"]
VALUES = st.one_of(
    st.integers(min_value=-2, max_value=64),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([0, 1, 8, 128, 1024, 1025, 4096, 131072, 131073, 2**31, 10**9, 10**18, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=6),
    st.booleans(),
)


def _byte_counts(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _byte_counts(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _byte_counts(value, f"{path}[{i}]")
    elif path.endswith("_bytes") and not path.endswith("headroom_bytes") and node is not None:  # headroom < 0: no fit
        yield path, node


@settings(max_examples=100, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-20b"]),
       fields=st.dictionaries(st.sampled_from(FIELDS), VALUES, min_size=1, max_size=4))
def test_fuzzed_config_fields_give_an_answer_or_a_clear_error(tmp_path_factory, base, fields):
    path = write(tmp_path_factory.mktemp("fuzz") / "config.json", config(base, **fields))
    started = time.monotonic()
    try:
        report = api.describe_model(path)
        memory = api.estimate_memory(Request(model=path, num_gpus=8))
    except (MeshplanError, ValidationError) as exc:
        event(f"refused: {type(exc).__name__}")
        assert time.monotonic() - started < 5
        return
    event("accepted")
    assert time.monotonic() - started < 5
    assert 0 <= report.active_params <= report.total_params
    assert all(c.params >= 0 and 0 <= c.active_params <= c.params for c in report.components)
    assert min(report.active_params_non_embedding, report.non_embedding_params, report.mtp_params) >= 0
    negative = [(where, n) for where, n in _byte_counts(memory.model_dump()) if n < 0]
    assert not negative
