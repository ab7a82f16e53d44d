"""The multi-token-prediction depth as a training knob (request mtp_num_layers, mtp_use_repeated_layer): Megatron-Core
trains mtp_num_layers depths, one MultiTokenPredictionLayer's weights at all of them under mtp_use_repeated_layer
(megatron/core/transformer/multi_token_prediction.py), as Megatron-Bridge's Nemotron 3 Super recipes do (depth 2 of
the checkpoint's one block). Every test here fails before the knob (the Request refuses the unknown fields)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.flops import model_flops_per_token
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.model_counts import mtp_params
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

SUPER = "nemotron-3-super-120b-a12b"
SUPER_BLOCK = 2_942_325_248  # its one MTP block (the card's notes; Megatron-Bridge's verified round trip)


def _req(model: str = SUPER, **fields):
    return parse_request({"model": model, "gpu": "gb200", "num_gpus": 64, "seq_length": 8192,
                          "global_batch_size": 512, "micro_batch_size": 1, "tp": 2, "ep": 64, "etp": 1,
                          "framework": "megatron-bridge", **fields})


def test_the_depth_defaults_to_the_models_own_blocks():
    job, _ = resolve(_req())
    assert (job.model.num_mtp_layers, job.model.mtp_repeated_layer, job.mtp_asked) == (1, False, False)
    job, _ = resolve(_req("deepseek-v3", tp=1, ep=64, num_gpus=256))
    assert job.model.num_mtp_layers == 1


def test_a_repeated_layer_holds_one_blocks_weights_and_computes_at_every_depth():
    """Super at two depths: repeated, the parameters are its one block's and the FLOPs two depths' (Megatron-Bridge's
    perf table: 600 TFLOP/s at 7,040 tok/s is 85.2 GFLOP per token); without it, two blocks of weights."""
    one, _ = resolve(_req())
    repeated, _ = resolve(_req(mtp_num_layers=2, mtp_use_repeated_layer=True))
    separate, _ = resolve(_req(mtp_num_layers=2))
    assert mtp_params(one.model) == mtp_params(repeated.model) == SUPER_BLOCK
    assert mtp_params(separate.model) == 2 * SUPER_BLOCK
    f1, f2 = (model_flops_per_token(j.model, 8192) for j in (one, repeated))
    assert f2 == model_flops_per_token(separate.model, 8192) > f1
    assert 84e9 < f2 < 85.2e9 < f1 + 6e9
    off, _ = resolve(_req(mtp_num_layers=0))
    assert mtp_params(off.model) == 0 and model_flops_per_token(off.model, 8192) < f1


def test_memory_holds_the_repeated_blocks_weights_once():
    """The stage holding the MTP block: two separate blocks hold more weights (and their states) than one repeated."""
    repeated = api.estimate_memory(_req(mtp_num_layers=2, mtp_use_repeated_layer=True))
    separate = api.estimate_memory(_req(mtp_num_layers=2))
    assert repeated.peak_bytes < separate.peak_bytes


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_render_writes_the_depth_and_the_repeated_layer(framework):
    text = api.render_config(framework, _req(mtp_num_layers=2, mtp_use_repeated_layer=True), force=True).text
    if framework == "megatron-core":
        assert "--mtp-num-layers 2" in text and "--mtp-use-repeated-layer" in text
    else:
        assert "cfg.model.mtp_num_layers = 2" in text and "cfg.model.mtp_use_repeated_layer = True" in text
    plain = api.render_config(framework, _req(), force=True).text
    assert "mtp_use_repeated_layer" not in plain and "--mtp-use-repeated-layer" not in plain


def test_a_framework_without_the_knob_refuses_it():
    req = parse_request({"model": "deepseek-v3", "gpu": "h100", "num_gpus": 256, "ep": 64, "framework": "torchtitan",
                         "mtp_num_layers": 2})
    with pytest.raises(MeshplanError, match=r"torchtitan cannot set the multi-token-prediction depth "
                                            r"\(mtp_num_layers=2\)") as err:
        resolve(req)
    assert "megatron-bridge" in str(err.value)


def test_a_repeated_layer_needs_a_depth():
    with pytest.raises(MeshplanError, match="mtp_use_repeated_layer applies one MTP block"):
        resolve(_req(mtp_num_layers=0, mtp_use_repeated_layer=True))
    with pytest.raises(MeshplanError, match="mtp_use_repeated_layer applies one MTP block"):
        resolve(_req("nemotron-3-nano-30b-a3b", ep=8, num_gpus=16, mtp_use_repeated_layer=True))


def _dsv3(framework: str, **fields):
    return parse_request({"model": "deepseek-v3", "gpu": "h100", "num_gpus": 256, "ep": 64, "framework": framework,
                          **fields})


@pytest.mark.parametrize(("framework", "zero_stage", "depth"), [
    ("megatron-core", 1, 1), ("megatron-bridge", 1, 1),
    ("verl", 1, 0), ("verl", 3, 0),  # its Megatron and FSDP workers zero num_nextn_predict_layers
    ("skyrl", 1, 1), ("skyrl", 3, 0),  # 0.4.0: AutoBridge's provider keeps them; transformers' model builds none
    ("torchtitan", 1, 0),  # model_registry(num_mtp_layers=0)
])
def test_a_request_that_does_not_ask_trains_what_the_engine_builds(framework, zero_stage, depth):
    """The default depth is the engine's (its card's engine.builds_model_mtp): fails before it (every framework
    trained DeepSeek-V3's one MTP block)."""
    job, _ = resolve(_dsv3(framework, zero_stage=zero_stage))
    assert (job.model.num_mtp_layers, job.mtp_asked) == (depth, False)
    said = [note for note in job.notes if note.startswith("mtp_num_layers not given")]
    assert len(said) == 1 and f"given: {depth}," in said[0] and "engine.builds_model_mtp" in said[0]
    assert ("builds none" in said[0]) is (depth == 0)


def test_an_engine_without_mtp_still_refuses_an_asked_depth():
    with pytest.raises(MeshplanError, match=r"verl cannot set the multi-token-prediction depth"):
        resolve(_dsv3("verl", mtp_num_layers=1))


def test_a_card_must_say_it_for_every_engine_it_runs():
    from pydantic import ValidationError

    from meshplan.knowledge.engine_card import EngineFacts
    with pytest.raises(ValidationError, match="builds_model_mtp needs every engine of by_zero_stage"):
        EngineFacts(by_zero_stage={0: "megatron", 1: "megatron", 2: "megatron", 3: "fsdp"},
                    builds_model_mtp={"megatron": True}, builds_model_mtp_source="x", why="x")
