"""The sequence padding verl's and SkyRL's engines add to reach their context-parallel split (the card's
engine.cp_padding): no length is refused there (CP001 is Megatron-Core's and Megatron-Bridge's rule), the search
keeps every cp, and the padded tokens are held like real ones (arithmetic/activations.cp_rank_tokens)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.activations import cp_rank_tokens
from meshplan.estimate.memory import layout_terms, micro_batch_terms
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def test_each_engine_pads_as_its_source_does():
    """Ulysses packs a micro-batch and pads its total to the sp size (verl ulysses_pad); the Megatron engines pad
    each sequence to tp*2*cp (preprocess_packed_seqs, get_packed_seq_align_size; tp at cp 1); Megatron-Core pads
    nothing (CP001 asks 2*cp to divide the length)."""
    assert cp_rank_tokens(4099, 2, 1, 2, "packed") == 4099  # 8198 tokens, even: no pad
    assert cp_rank_tokens(4099, 1, 1, 4, "packed") == 1025  # 4099 -> 4100 over 4
    assert cp_rank_tokens(4100, 1, 2, 2, "per_sequence") == 2052  # 4100 -> 4104 (a multiple of 8), over 2
    assert cp_rank_tokens(4100, 3, 2, 2, "per_sequence") == 3 * 2052
    assert cp_rank_tokens(4097, 1, 2, 1, "per_sequence") == 4098  # cp 1: to a multiple of tp
    assert cp_rank_tokens(4096, 2, 1, 4, None) == 2048
    assert cp_rank_tokens(4097, 1, 1, 2, None) == 2049


ODD = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, seq_length=4100, global_batch_size=64, job="sft")


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
@pytest.mark.parametrize("zero_stage", [1, 3])
def test_a_length_2cp_does_not_divide_is_searched_and_passes_check(framework, zero_stage):
    """4100 tokens at cp 4: 8 does not divide it, which verl's and SkyRL's engines pad away. Before, the search's
    space dropped every such cp ('cp-seq', CP001's law) though check_config passed the plan: recommend refused a
    layout its own check accepts."""
    fields = dict(ODD, framework=framework, cp=4, zero_stage=zero_stage, tp=1 if zero_stage == 3 else 2)
    report = api.check_config(Request(**fields))
    assert not [f for f in report.findings if f.severity == "error"], report.findings
    answer = api.recommend(Request(**fields), top_k=1)
    assert answer.candidates and answer.candidates[0].plan.cp == 4


def test_megatron_core_still_refuses_the_length():
    fields = dict(ODD, framework="megatron-core", cp=4)
    ids = {f.id for f in api.check_config(Request(**fields)).findings}
    assert "CP001" in ids
    assert not api.recommend(Request(**fields), top_k=1).candidates


@pytest.mark.parametrize("zero_stage, tokens", [(3, 1025), (1, 1026)])
def test_the_memory_holds_the_padded_tokens(zero_stage, tokens):
    """verl at cp 4, 4099 tokens: Ulysses pads the packed micro-batch to 4100 (1025 a rank), the Megatron engine
    each sequence to 4104 at tp 1 (1026 a rank); before, both held ceil(4099 / 4) = 1025."""
    job, plan = resolve(Request(**dict(ODD, seq_length=4099), framework="verl", cp=4, tp=1, zero_stage=zero_stage,
                                micro_batch_size=1))
    assert micro_batch_terms(job, plan, layout_terms(job, plan))[0] == tokens
