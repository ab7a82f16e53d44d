"""The sequence padding verl's and SkyRL's engines add to reach their context-parallel split (the card's
engine.cp_padding): no length is refused there (CP001 is Megatron-Core's and Megatron-Bridge's rule), the search
keeps every cp, and the padded tokens are held and computed like real ones (arithmetic/activations.cp_rank_tokens,
rules.context.rank_tokens) but are no useful work."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.activations import cp_rank_tokens
from meshplan.arithmetic.flops import model_flops_per_token
from meshplan.estimate.memory import layout_terms, micro_batch_terms
from meshplan.estimate.perf import step_terms, throughput_of
from meshplan.request.resolve import resolve
from meshplan.rules.context import rank_tokens
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k, recommend


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


@pytest.mark.parametrize("zero_stage, tokens", [(3, 1025), (1, 1026)])
def test_the_step_time_runs_the_padded_tokens_and_counts_the_real_ones(zero_stage, tokens):
    """The padded tokens run through every layer, so the step time computes them as the memory holds them (before,
    layer_context's shard ran 4099 / 4 = 1024.75 tokens a rank at either engine); tokens/s and MFU count the job's
    4099-token sequences only: padding is time, not work."""
    job, plan = resolve(Request(**dict(ODD, seq_length=4099), framework="verl", cp=4, tp=1, zero_stage=zero_stage,
                                micro_batch_size=1))
    terms = step_terms(job, plan)
    assert terms.ctx.shard.tokens == tokens == rank_tokens(job, 1, 1, 4, zero_stage)
    report = throughput_of(terms)
    assert report.tokens_per_s == pytest.approx(4099 * job.global_batch_size / report.step_time_s, rel=1e-12)
    assert report.model_flops_per_step == pytest.approx(
        model_flops_per_token(job.model, 4099) * 4099 * job.global_batch_size, rel=1e-12)


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
@pytest.mark.parametrize("model, gpus, seq", [("llama-3.1-8b", 8, 32771), ("qwen3-8b", 16, 12345),
                                              ("qwen3-30b-a3b", 8, 4099)])
def test_the_search_stays_exact_on_padded_lengths(framework, model, gpus, seq):
    """The search's per-token references divide their seconds by the tokens a rank computes (rules.context.rank_tokens,
    padding included), as the estimate runs them, so its bounds stay under every plan's step time where the engines
    pad: its top 4 are the exhaustive oracle's."""
    req = Request(model=model, gpu="h100", num_gpus=gpus, seq_length=seq, global_batch_size=gpus * 4, job="sft",
                  framework=framework)
    oracle = exhaustive_top_k(req, 4)
    assert [c.throughput.step_time_s for c in recommend(req, top_k=4).candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12)


def test_the_search_bounds_count_no_padding_an_engine_may_not_add():
    """Ulysses pads a packed micro-batch's total, so a rank of b sequences of seq tokens may compute fewer than b x
    ceil(seq / cp) (4097 x 2 over cp 4: 2,049, not 2,050). The search's token counts (seed_groups.group_floor,
    bounds.stretch, floors' activation rows) read activations.least_rank_tokens, which no engine's padding goes
    under; before, they counted b x ceil(seq / cp), a lower bound one token over the packed plan's own work."""
    from meshplan.arithmetic.activations import least_rank_tokens
    from meshplan.search.seed_groups import group_floor
    from meshplan.search.space import Layout

    for seq in (4096, 4097, 4099, 6000, 12345):
        for mbs in (1, 2, 3, 5):
            for cp in (1, 2, 3, 4, 8):
                least = least_rank_tokens(seq, mbs, cp)
                assert least * cp >= seq * mbs  # every token on some rank
                assert all(least <= cp_rank_tokens(seq, mbs, tp, cp, padding)
                           for tp in (1, 2, 4) for padding in ("packed", "per_sequence", None))
                assert least == cp_rank_tokens(seq, mbs, 1, cp, "packed")
    lay = Layout(tp=1, pp=1, cp=4, ep=1, etp=1, dp=1)
    per_token = 1e-6
    key = group_floor(4097, 8, lay, (2,), ((1, per_token, 0.0),), 0.0, 0.0)
    packed_work = cp_rank_tokens(4097, 2, 1, 4, "packed") * per_token * (8 // 2)
    assert key <= packed_work
