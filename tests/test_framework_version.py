"""framework_version: a release whose loss kept other tensors has its own byte convention, and render writes it."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import memory_card
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

LLAMA_32K = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, seq_length=32768, micro_batch_size=1,
                 recompute="full")


def loss_bytes(version):
    report = api.estimate_memory(parse_request(dict(LLAMA_32K, framework_version=version)))
    return report.stages[0].detail["logits_and_loss"], report


def test_torchtitan_before_its_chunked_loss_keeps_every_logit_at_ten_bytes():
    card = framework_card("torchtitan")
    assert card.convention_for("0.2.2") == "fsdp2" and card.convention_for("0.3.0") == "fsdp2_chunked_loss"
    old, report = loss_bytes("0.2")
    new, _ = loss_bytes(None)
    vocab = 128256  # Llama 3 vocabulary, unpadded by torchtitan (tp 1)
    conv = memory_card().conventions["fsdp2"]
    hidden = conv.output_hidden_bytes * 32768 * 4096
    assert old == int(conv.logits_bytes_per_element * 32768 * vocab + hidden)
    assert old > 3 * new  # the chunked loss holds one of 8 pieces at a time
    assert any("memory convention fsdp2" in a for a in report.assumptions)


def test_an_unknown_release_names_the_known_ones_and_a_prefix_picks_the_newest():
    with pytest.raises(MeshplanError, match=r"0\.2\.2, 0\.3\.0"):
        resolve(parse_request(dict(LLAMA_32K, framework_version="0.9")))
    job, _ = resolve(parse_request(dict(LLAMA_32K, framework_version="0.2")))
    assert job.framework_version == "0.2.2"
    with pytest.raises(MeshplanError, match="framework_version"):
        parse_request(dict(LLAMA_32K, framework_version="latest; rm -rf /"))


def test_render_writes_the_release_the_request_names():
    fields = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, global_batch_size=64)
    old = api.render_config("torchtitan", parse_request(dict(fields, framework_version="0.2")))
    new = api.render_config("torchtitan", parse_request(fields))
    assert (old.version, old.format) == ("0.2.2", "toml") and (new.version, new.format) == ("0.3.0", "shell")
