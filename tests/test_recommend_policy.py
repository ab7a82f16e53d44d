"""recommend's policies, one per answer it can contradict itself on (issue 12, items 8 and 9):

- one headroom threshold, stated and settable, used alike by the ranking, the answer when nothing keeps it, the
  warning about a much faster layout it excludes, and the smallest-GPU-count scan;
- the smallest GPU count as a question of its own, found by scanning counts in increasing order (fit is not
  monotone in the count), bounded by counts of work (never by a clock);
- a top K of distinct layouts (clones with the same predicted numbers fold into one row);
- one meaning of "X% slower", and a default-batch note that states the real tokens.
"""

import json
import re

import pytest

from meshplan import api
from meshplan.arithmetic import mesh
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main
from meshplan.request.resolve import default_global_batch, resolve
from meshplan.schema.request import Request
from meshplan.search import gpu_count, minimum_gpus, recommend, search_job, slower_by
from meshplan.search.answer import candidate, rows
from meshplan.search.engine import Found
from meshplan.search.estimators import default_engine
from meshplan.search.policy import SAME
from meshplan.search.space import search_card

SMALL = dict(model="llama-3.1-8b", num_gpus=8, seq_length=8192)


@pytest.fixture(scope="module")
def small():
    return recommend(Request(**SMALL), top_k=5)


def _free_share(candidate) -> float:
    return 1 - candidate.memory.peak_bytes / candidate.memory.capacity_bytes


# --------------------------------------------------------------------------- one headroom, stated and settable


def test_the_headroom_is_stated_in_the_assumptions_and_the_summary(small):
    assert small.headroom == pytest.approx(0.1)  # MEM002's min_headroom_fraction, cards/rules.yaml
    assert any(a.startswith("Headroom:") and "(1 - 0.1)" in a and "MEM002" in a for a in small.assumptions)
    assert "keep 10% of GPU memory free (headroom 0.1: MEM002" in small.rationale
    assert all(_free_share(c) >= 0.1 for c in small.candidates)


def test_a_requested_headroom_is_the_threshold_everywhere():
    rec = recommend(Request(**SMALL, headroom=0.45), top_k=3)
    assert rec.headroom == 0.45 and "keep 45% of GPU memory free (headroom 0.45, from the request)" in rec.rationale
    assert rec.candidates and all(_free_share(c) >= 0.45 for c in rec.candidates)
    assert any("(1 - 0.45)" in a for a in rec.assumptions)
    # The same threshold decides the smallest count: at 45% free an 8B model needs more than one GPU.
    assert minimum_gpus(Request(model="llama-3.1-8b", seq_length=8192, headroom=0.45)).headroom == 0.45


def test_nothing_keeps_the_headroom_names_the_best_thinner_layout_and_the_headroom_that_ranks_it():
    """Llama-3.1-405B on 96 H100 fits only with under 1% free: it used to be ranked silently (0-0.3% headroom counted
    as fitting); now nothing is ranked, the thin layout is named with its headroom and speed, and the smallest count
    that keeps 10% is the one `minimum_gpus` finds."""
    rec = recommend(Request(model="llama-3.1-405b", num_gpus=96), top_k=3)
    assert rec.candidates == []
    thin = rec.best_below_headroom
    assert thin is not None and 0 < _free_share(thin) < 0.1
    match = re.search(r"headroom=([0-9.]+) \(--headroom ", rec.rationale)
    assert match and "No layout keeps 10%" in rec.rationale
    assert f"{thin.throughput.tokens_per_s_per_gpu:,.0f} tokens/s/GPU" in rec.rationale
    would_rank = float(match.group(1))
    assert would_rank <= _free_share(thin)
    ranked = recommend(Request(model="llama-3.1-405b", num_gpus=96, headroom=would_rank), top_k=1)
    assert ranked.candidates[0].plan == thin.plan
    smallest = minimum_gpus(Request(model="llama-3.1-405b"))
    assert rec.min_gpus == smallest.num_gpus and smallest.num_gpus > 96
    assert f"--num-gpus {smallest.num_gpus}" in rec.rationale
    assert _free_share(smallest.candidate) >= 0.1


def test_a_much_faster_layout_below_the_headroom_is_warned_about_with_its_numbers():
    """Qwen3-30B-A3B on 8 H100: the fastest layout leaves under 10% free and is dropped by the 10% headroom; the
    ranked best is far slower, so the answer names it, its speed, its free memory and the headroom that would rank it.
    (Kimi-K2 on 256 H100 was the example until ZeRO-3's per-layer gathers were timed: its thin FSDP pick no longer
    beats the ranked best.)"""
    rec = recommend(Request(model="qwen3-30b-a3b", num_gpus=8), top_k=2)
    thin, best = rec.best_below_headroom, rec.candidates[0]
    assert thin is not None and _free_share(thin) < 0.1
    gap = slower_by(best.throughput.tokens_per_s_per_gpu, thin.throughput.tokens_per_s_per_gpu)
    assert gap >= search_card().comparison.below_headroom_gain
    warning = next(w for w in rec.warnings if thin.plan.short() in w)
    assert f"{thin.throughput.tokens_per_s_per_gpu:,.0f} tokens/s/GPU" in warning and f"{gap:.1%} slower" in warning
    would_rank = float(re.search(r"headroom=([0-9.]+)", warning).group(1))
    again = recommend(Request(model="qwen3-30b-a3b", num_gpus=8, headroom=would_rank), top_k=1)
    assert again.candidates[0].plan == thin.plan and again.best_below_headroom is None


def test_no_warning_when_the_headroom_costs_little(small):
    assert small.best_below_headroom is None
    assert not any("headroom=" in w for w in small.warnings)


# --------------------------------------------------------------------------- the smallest GPU count


def test_the_scan_checks_every_count_in_increasing_order(monkeypatch):
    """Fit is not monotone in the count: a fake job that fits at 24 and 40 but not at 16, 32 or 64 (what doubling
    would probe) must get 24, from a scan that checked the counts below it in order."""
    seen = []

    def fits(job, *args):
        seen.append(job.num_gpus)
        return job.num_gpus in (24, 40)

    monkeypatch.setattr(gpu_count, "fits_somewhere", fits)
    result = minimum_gpus(Request(model="llama-3.1-8b"))
    assert result.num_gpus == 24 and result.stopped_by == "found"
    assert seen == sorted(seen) and seen[-3:] == [8, 16, 24] and result.counts_checked == len(seen)
    assert result.candidate is not None and mesh.world_size("megatron", result.candidate.plan) == 24
    assert "every multiple of 8" in result.stepping


def test_deepseek_v3_on_h20_has_a_smallest_count_and_recommend_uses_the_same_scan():
    """It used to say "no GPU count up to 1,048,576 fits" (doubling, then bisection) while recommend itself ranked
    layouts at 144-384 GPUs."""
    result = api.minimum_gpus(Request(model="deepseek-v3", gpu="h20"))
    assert result.num_gpus is not None and 128 < result.num_gpus <= 384 and result.num_gpus % 8 == 0
    assert _free_share(result.candidate) >= 0.1
    assert result.stopped_by == "found" and result.searched_to == result.num_gpus
    impossible = recommend(Request(model="deepseek-v3", gpu="h20", num_gpus=64), top_k=1)
    assert impossible.candidates == [] and impossible.min_gpus == result.num_gpus


def test_fixed_degrees_step_the_counts_by_their_smallest_world_size():
    result = minimum_gpus(Request(model="llama-3.1-70b", tp=8, pp=3))
    assert result.num_gpus is not None and result.num_gpus % 24 == 0
    assert "every multiple of 24" in result.stepping
    assert result.candidate.plan.tp == 8 and result.candidate.plan.pp == 3


def test_the_scan_is_bounded_and_says_which_bound_stopped_it(monkeypatch):
    bounded = minimum_gpus(Request(model="llama-3.1-405b"), max_gpus=64)
    assert bounded.num_gpus is None and bounded.stopped_by == "max_gpus" and "up to 64" in bounded.rationale
    card = search_card()
    tiny = card.limits.model_copy(update={"min_gpus_max_counts": 1})
    monkeypatch.setattr(gpu_count, "search_limits", lambda: tiny)
    cut = minimum_gpus(Request(model="llama-3.1-405b"))
    assert cut.num_gpus is None and cut.stopped_by == "counts" and cut.counts_checked == 1
    assert "stopped at its bound of 1 GPU counts" in cut.rationale and "not proof" in cut.rationale


def test_fixed_fields_no_count_can_help_stop_at_once():
    """A fixed degree that breaks a shape rule fails at every count: the scan names the rule instead of running
    to its time bound; degrees that fix the world size leave one count to check."""
    heads = minimum_gpus(Request(model="llama-3.1-8b", tp=3))
    assert heads.num_gpus is None and heads.stopped_by == "rules" and "TP001" in heads.rationale
    experts = minimum_gpus(Request(model="mixtral-8x7b", ep=3))
    assert experts.stopped_by == "rules" and "EP002" in experts.rationale
    pinned = minimum_gpus(Request(model="llama-3.1-8b", tp=2, pp=2, cp=1, dp=2))
    assert pinned.num_gpus == 8 and pinned.counts_checked == 1 and pinned.stepping.startswith("only 8")


def test_minimum_gpus_rejects_a_gpu_count_and_a_bad_bound():
    with pytest.raises(MeshplanError, match="num_gpus cannot be given"):
        minimum_gpus(Request(model="llama-3.1-8b", num_gpus=8))
    with pytest.raises(MeshplanError, match="max_gpus must be between 1 and"):
        minimum_gpus(Request(model="llama-3.1-8b"), max_gpus=0)


def test_cli_min_gpus(capsys):
    assert main(["min-gpus", "llama-3.1-70b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_gpus"] == 24 and data["headroom"] == pytest.approx(0.1) and data["candidate"]["rank"] == 1
    assert main(["min-gpus", "llama-3.1-70b"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("smallest GPU count: 24 x ") and "assumptions:" in out
    assert main(["min-gpus", "llama-3.1-405b", "--max-gpus", "16"]) == 1  # none within the bound
    assert main(["min-gpus", "llama-3.1-8b", "--num-gpus", "8"]) == 2
    assert "num_gpus cannot be given" in capsys.readouterr().err


# --------------------------------------------------------------------------- distinct rows


def test_layouts_with_the_same_numbers_fold_into_one_row(small):
    """Layouts the cost model cannot tell apart are one row that lists the others, not several rows padding the top
    K. The search itself meets none now: its one source of clones, a ZeRO stage that shards nothing at its layout
    (nanotron's ZeRO 0 and 1 at DP1), is one plan it offers once (tests/test_zero_one_plan.py), and a CP split and
    its micro-batch twin differ since TE's ring passes are priced. So the answer's folding is held on plans that are
    equal for a real reason, each estimated: the MoE dispatcher on a dense model, which has no experts to dispatch
    to."""
    ranked = [(round(c.throughput.step_time_s, 9), c.memory.peak_bytes) for c in small.candidates]
    assert len(ranked) == len(set(ranked)) == 5
    assert SAME not in small.rejected and not any(c.equivalents for c in small.candidates)
    assert small.considered == len(small.candidates) + sum(small.rejected.values())
    job, _ = search_job(Request(**SMALL))
    engine = default_engine(job.framework)
    first, second = (c.plan for c in small.candidates[:2])
    twin = first.model_copy(update={"moe_token_dispatcher": "flex"})  # inert: Llama-3.1-8B is dense

    def found(plan):
        report = engine.throughput(job, plan)
        return Found(report.step_time_s, plan, engine.memory(job, plan), report)

    grouped = rows([found(second), found(twin), found(first)])
    assert [[f.plan for f in group] for group in grouped] == [[twin, first], [second]]  # fastest row first
    row = candidate(job, engine, grouped[0][0], 1, None, grouped[0][1:])
    assert row.plan == twin and row.equivalents == [first]
    assert (f"Same predicted step time and peak memory, folded into this row: also {first.short()}, micro-batch "
            f"{first.micro_batch_size}, moe_token_dispatcher alltoall." in row.rationale)
    assert candidate(job, engine, grouped[1][0], 2, grouped[0][0]).equivalents == []


# --------------------------------------------------------------------------- "% slower" and the default batch


def test_percent_slower_is_the_share_of_throughput_lost():
    # The cases: 7.7% was printed as 8.3%, 42.6% as 74.4%, and a 21x gap as "2027.0% slower".
    assert slower_by(923.0, 1000.0) == pytest.approx(0.077)
    assert slower_by(574.0, 1000.0) == pytest.approx(0.426)
    assert slower_by(1000.0 / 21.27, 1000.0) == pytest.approx(0.953, abs=1e-3)
    assert slower_by(1000.0, 1000.0) == 0.0


def test_every_printed_percent_uses_that_definition(small):
    best = small.candidates[0].throughput.tokens_per_s_per_gpu
    for c in small.candidates[1:]:
        assert c.rationale.startswith(f"{1 - c.throughput.tokens_per_s_per_gpu / best:.1%} slower than #1")
    table = re.search(r"predicted at ([0-9,]+) tokens/s/GPU against the pick's ([0-9,]+), ([0-9.]+)% slower",
                      small.decision_table)
    theirs, mine, printed = (float(g.replace(",", "")) for g in table.groups())
    assert mine == pytest.approx(best, abs=0.5)
    assert printed == pytest.approx(100 * (1 - theirs / mine), abs=0.06)


def test_the_default_batch_note_states_the_real_tokens():
    # 4M tokens / 1M-token sequences = 4 sequences, rounded up to one per data-parallel rank: 64M tokens, not "~4M".
    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=64, seq_length=1 << 20))
    assert job.global_batch_size == default_global_batch(1 << 20, 64) == 64
    note = next(n for n in job.notes if n.startswith("global_batch_size not given"))
    assert "64 sequences x 1,048,576 tokens = 67.1M tokens per step" in note
    assert "4 sequences rounded up to 64, a multiple of the 64 GPUs, so that every data-parallel size" in note
    assert "~4M" not in note
    _, notes = search_job(Request(model="llama-3.1-8b", num_gpus=16, seq_length=8 << 20))
    assert "16 sequences x 8,388,608 tokens = 134.2M tokens per step" in notes[0]
    assert "one sequence of 8,388,608 tokens is already longer than that" in notes[0]
    assert "1 sequence rounded up to 16, a multiple of the 16 GPUs" in notes[0]
    _, exact = search_job(Request(model="llama-3.1-8b", num_gpus=16, seq_length=8192))
    assert exact[0].startswith("global_batch_size not given: 512 sequences x 8,192 tokens = 4.2M tokens per step")
    assert "rounded up" not in exact[0]


def test_a_table_suggestion_the_rules_refuse_says_so_when_nothing_fits():
    """EP5 of Qwen3-30B-A3B's 128 experts on 24 GPUs: the table's fitted row broke WS002, yet its line stood as a plain
    suggestion because no layout fitted (hunt29); it must carry the rules that remove it."""
    answer = recommend(Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=24, ep=5))
    assert not answer.candidates
    assert "suggests TP1 PP1 EP5 DP24" in answer.decision_table
    assert "has no variant that passes the rules and fits this job (WS002 x" in answer.decision_table


def test_at_the_same_step_time_the_plan_that_holds_less_ranks_first():
    """Llama-3.1-8B on 7 H100: the rows run fastest first and, at the same step time, the lower peak first; the oracle
    orders its rows the same way."""
    from meshplan.search.oracle import exhaustive_top_k

    req = Request(model="llama-3.1-8b", num_gpus=7, gpu="h100")
    rec = api.recommend(req)
    rows = [(c.throughput.step_time_s, c.memory.peak_bytes) for c in rec.candidates]
    assert rows == sorted(rows)
    assert [(r.step_time_s, r.peak_bytes) for r in exhaustive_top_k(req, len(rows))] == rows


def test_a_zero_stage_timed_the_same_with_a_higher_peak_is_left_out_and_named():
    """Llama-3.1-8B on 7 H100: PP7 DP1 at ZeRO 3 (Megatron-FSDP, byte preset megatron_fsdp, sharding nothing at
    dp x cp 1 and holding its own buffers) is timed as the same layout at ZeRO 1 (the distributed optimizer) with
    4.6 GiB more: a user gains nothing by it, so it is no row of its own (it was #2, beside #1), counted
    SEARCH-HEAVIER-STAGE and named in #1's words; the oracle leaves it out the same way."""
    from meshplan.search.oracle import exhaustive_top_k
    from meshplan.search.policy import HEAVIER_STAGE

    req = Request(model="llama-3.1-8b", num_gpus=7, gpu="h100")
    rec = api.recommend(req)
    first = rec.candidates[0]
    assert (first.plan.pp, first.plan.dp, first.plan.zero_stage) == (7, 1, 1)
    same_layout = [c for c in rec.candidates if c.plan.model_copy(update={"zero_stage": 1}) == first.plan]
    assert same_layout == [first]
    assert rec.rejected[HEAVIER_STAGE] >= 1
    assert "ZeRO 3 (byte preset megatron_fsdp" in first.rationale
    assert "at dp x cp = 1 it shards nothing, so it is not listed (SEARCH-HEAVIER-STAGE)" in first.rationale
    oracle = exhaustive_top_k(req, len(rec.candidates))
    assert [(r.step_time_s, r.peak_bytes) for r in oracle] == [
        (c.throughput.step_time_s, c.memory.peak_bytes) for c in rec.candidates]
    assert not any(r.plan.pp == 7 and r.plan.dp == 1 and r.plan.zero_stage == 3 for r in oracle)


def test_a_zero_stage_slower_with_a_higher_peak_is_folded_into_its_twin():
    """Llama-3.1-8B on 8 H100 (Megatron-Core): TP1 PP4 VPP3 DP2 at ZeRO 0 (47.296 s, 62.9 GiB; 46.092 s before the
    joint refit of 2026-12-07) was listed as its own row beside the same layout at ZeRO 1 (47.283 s, 50.2 GiB), which
    is faster and lighter: a user gains nothing by it, so it is folded into the ZeRO 1 row, which names its step and
    peak (policy.heavier_twin); no two rows left are such twins, a twin faster with more memory (a trade) stays a row
    of its own, and the oracle's top K is the same."""
    from meshplan.search.oracle import exhaustive_top_k
    from meshplan.search.policy import HEAVIER_STAGE, heavier_twin

    req = Request(model="llama-3.1-8b", num_gpus=8, gpu="h100", framework="megatron-core")
    rec = api.recommend(req, top_k=8)
    rows = rec.candidates
    for a in rows:
        for b in rows:
            if a is not b and a.plan.model_copy(update={"zero_stage": b.plan.zero_stage}) == b.plan:
                assert not heavier_twin(a.throughput.step_time_s, a.memory.peak_bytes,
                                        b.throughput.step_time_s, b.memory.peak_bytes), (a.plan.short(), b.plan.short())
    pp4 = [c for c in rows if (c.plan.pp, c.plan.vpp, c.plan.cp, c.plan.dp, c.plan.micro_batch_size) == (4, 3, 1, 2, 1)]
    assert [c.plan.zero_stage for c in pp4] == [1]
    assert rec.rejected[HEAVIER_STAGE] >= 1
    assert "ZeRO 0 runs this layout at a slower predicted step, 47.296 s against 47.283 s, with a higher peak, " \
           "62.9 GiB reserved, so it is not listed (SEARCH-HEAVIER-STAGE)" in pp4[0].rationale
    assert [(r.step_time_s, r.peak_bytes) for r in exhaustive_top_k(req, len(rows))] == [
        (c.throughput.step_time_s, c.memory.peak_bytes) for c in rows]
    assert not heavier_twin(1.0, 2, 1.0 + 1e-6, 1)  # faster with more memory: a trade, not folded
    assert heavier_twin(1.0 + 1e-6, 2, 1.0, 1) and heavier_twin(1.0, 2, 1.0, 1) and not heavier_twin(1.0, 1, 1.0, 1)


def test_min_gpus_picks_the_stage_a_user_would_run():
    """Llama-3.1-70B LoRA with Megatron-Bridge: the smallest count, 4 H100, is picked at TP4 DP1 at ZeRO 1; ZeRO 3 at
    the same layout (Megatron-FSDP, 74.9 GiB against 71.9 at the same step) is said as left out, not offered."""
    answer = api.minimum_gpus(Request(model="llama-3.1-70b", framework="megatron-bridge", job="lora", gpu="h100"))
    assert answer.num_gpus == 4
    assert (answer.candidate.plan.tp, answer.candidate.plan.dp, answer.candidate.plan.zero_stage) == (4, 1, 1)
    assert "ZeRO 3 (byte preset megatron_fsdp" in answer.candidate.rationale
    assert "(SEARCH-HEAVIER-STAGE)" in answer.candidate.rationale
