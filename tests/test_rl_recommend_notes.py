"""An RL recommend says only what holds for its candidates. Before: its assumptions (and every candidate's throughput
report) said 'rollout_tp not given: 2, the verl default', 'rollout_memory_fraction not given: 0.5', 'dp not given:
16' and 'zero_stage not given: 1' beside a #1 at rollout TP8, fraction 0.85, CP2 DP8; and a candidate's throughput
report carried the plan of another rollout shape (rollout_tp 1 under a candidate at rollout TP8)."""

from __future__ import annotations

from meshplan import api
from meshplan.schema.request import Request
from meshplan.search.rl import SEARCHED

RL = dict(model="qwen3-8b", framework="verl", job="rl", num_gpus=16, prompts_per_step=64, samples_per_prompt=8,
          prompt_length=1024, response_length=4096)


def noted_fields(assumptions: list[str]) -> set[str]:
    return {a.split(" not given:", 1)[0] for a in assumptions if " not given:" in a}


def test_the_rl_recommend_notes_no_default_for_a_field_it_chose():
    rec = api.recommend(Request(**RL), top_k=3)
    assert len(rec.candidates) > 1
    assert not noted_fields(rec.assumptions) & set(SEARCHED)
    assert {"algorithm", "rollout_engine", "placement"} <= noted_fields(rec.assumptions)  # what it did not choose
    shapes = set()
    for cand in rec.candidates:
        assert cand.throughput.plan == cand.plan
        assert not noted_fields(cand.throughput.assumptions)
        shapes.add((cand.plan.rollout_tp, cand.plan.rollout_memory_fraction))
    assert any(tp != 2 or fraction != 0.5 for tp, fraction in shapes)  # the verl defaults the notes named


def test_a_rollout_field_the_request_fixes_is_kept_and_each_report_is_its_candidates():
    rec = api.recommend(Request(**RL, rollout_memory_fraction=0.6), top_k=3)
    assert rec.candidates and any(c.plan.rollout_tp > 1 for c in rec.candidates)  # not the first shape tried, TP1
    for cand in rec.candidates:
        assert cand.plan.rollout_memory_fraction == 0.6 and cand.throughput.plan == cand.plan


def test_an_rl_rows_rationale_names_every_part_beside_the_largest():
    """Qwen2.5-7B on 8 H100: '(update the largest part: generation 4 s, update 10 s)' left out the log-prob passes'
    7 s, longer than the generation it named; the rationale now lists generation, log-prob passes and update."""
    best = api.recommend(Request(model="qwen2.5-7b", framework="verl", job="rl", num_gpus=8), top_k=1).candidates[0]
    rl = best.throughput.rl
    assert (f"its largest part the {rl.limited_by} (generation {rl.generation_s:,.0f} s, log-prob passes "
            f"{rl.log_prob_s:,.0f} s, update {rl.update_s:,.0f} s)") in best.rationale
