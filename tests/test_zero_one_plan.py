"""ZeRO stages that are one plan at a layout (search/zero_stages.one_plan_key): at dp x cp 1 (and expert-dp 1 for an
MoE model) Megatron's distributed optimizer and nanotron's ZeRO-1 shard their optimizer states over one rank, so ZeRO
0 and 1 hold the same bytes, run the same step and render the same config but the stage's key. recommend listed both
as clones of one row (nanotron on 4 GPUs: ZeRO 1 with 'also ... zero_stage 0' under it); it now offers one of them,
the framework's default stage where the rules pass it, and says why in the row. Stages whose estimates differ at
the same layout are never folded: a sharded weight (FSDP, ZeRO-3), DeepSpeed's gradient accumulation per stage, the
routed experts' own shard."""

import difflib

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory
from meshplan.estimate.perf import estimate_throughput
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k, recommend, search_job
from meshplan.search.policy import SAME, SAME_STAGE
from meshplan.search.space import zero_ladder
from meshplan.search.zero_stages import offered_before, one_plan_stages

LADDER = (0, 1, 2, 3)


def _job(model: str, framework: str, gpus: int):
    return search_job(Request(model=model, num_gpus=gpus, framework=framework))[0]


def _numbers(job, plan: Plan) -> tuple[int, float]:
    return estimate_memory(job, plan).peak_bytes, estimate_throughput(job, plan).step_time_s


# (model, framework, tp, pp, cp, ep, dp, the stages one plan with ZeRO 0 there)
CASES = [
    ("llama-3.1-8b", "nanotron", 4, 1, 1, 1, 1, (1,)),
    ("llama-3.1-8b", "nanotron", 2, 2, 1, 1, 1, (1,)),
    ("llama-3.1-8b", "nanotron", 2, 1, 1, 1, 2, ()),  # dp 2: ZeRO-1 halves the master weights and moments
    ("llama-3.1-8b", "megatron-core", 4, 1, 1, 1, 1, (1, 2)),  # Megatron's ZeRO-2 is its ZeRO-1 (zero_ladder drops it)
    ("llama-3.1-8b", "megatron-core", 2, 1, 2, 1, 1, ()),  # the distributed optimizer shards over dp x cp = 2
    ("llama-3.1-8b", "megatron-bridge", 2, 2, 1, 1, 1, (1, 2)),
    ("llama-3.1-8b", "verl", 4, 1, 1, 1, 1, (1, 2)),  # its Megatron engine; ZeRO 3 is its FSDP engine
    ("llama-3.1-8b", "deepspeed", 4, 1, 1, 1, 1, ()),  # BF16_Optimizer's fp32 buffer at ZeRO-0, none at ZeRO-1
    # torchtitan 0.3.0's ZeRO-0 is fully_shard over a shard of one with dp replicas (engine.replica_shard): at dp 1
    # it is ZeRO-3 over one rank, the same TOML (data_parallel_replicate_degree 1, data_parallel_shard_degree 1)
    ("llama-3.1-8b", "torchtitan", 4, 1, 1, 1, 1, (3,)),
    ("llama-3.1-8b", "torchtitan", 2, 1, 1, 1, 2, ()),  # dp 2: two replicas of one rank vs one shard of two
    ("qwen3-30b-a3b", "megatron-core", 4, 1, 1, 1, 1, ()),  # the routed experts shard over expert-dp = 4
    ("qwen3-30b-a3b", "megatron-core", 4, 1, 1, 4, 1, (1, 2)),  # expert-dp 1 too
]


@pytest.mark.parametrize("model, framework, tp, pp, cp, ep, dp, same", CASES)
def test_stages_are_one_plan_exactly_where_their_estimates_are_the_same(model, framework, tp, pp, cp, ep, dp, same):
    job = _job(model, framework, tp * pp * cp * dp)
    base = Plan(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, zero_stage=0, sequence_parallel=tp > 1)
    assert one_plan_stages(job, base, LADDER) == same
    numbers = _numbers(job, base)
    for zero in zero_ladder(job.card):
        if zero == 0:
            continue
        plan = base.copied({"zero_stage": zero})
        try:
            other = _numbers(job, plan)
        except MeshplanError:  # a rule refuses the stage at this layout (FS001: verl's FSDP engine has no TP)
            assert zero not in same
            continue
        if zero in same:  # one plan: the same peak and the same step
            assert other[0] == numbers[0] and other[1] == pytest.approx(numbers[1], rel=1e-12)
        else:  # not folded: the estimates tell the stages apart
            assert other != numbers


def test_deepspeed_zero_1_and_2_at_dp_1_are_two_plans_by_their_gradient_accumulation():
    """Their states are alike at dp 1 (ZeRO-2's gradient shard over one rank), but DeepSpeed's ZeRO-1 adds each
    micro-batch's gradient in place (the card's grad_accumulation_pass) and its ZeRO-2 does not, and ZeRO-1's
    reduction copies the gradients into a partition buffer of its own beside them (ZeRO-2's gradients are that
    buffer: cards/memory.yaml optimizer_steps.deepspeed_zero.segments): not one plan."""
    job = _job("llama-3.1-8b", "deepspeed", 4)
    one, two = (Plan(tp=4, dp=1, zero_stage=zero, sequence_parallel=False) for zero in (1, 2))
    peak_one, peak_two = (estimate_memory(job, p) for p in (one, two))
    gradients = peak_one.stages[0].gradients_bytes
    assert gradients == peak_two.stages[0].gradients_bytes
    assert (peak_one.stages[0].detail["optimizer_step_segments"]
            - peak_two.stages[0].detail["optimizer_step_segments"]) == pytest.approx(gradients, rel=1e-3)
    assert estimate_throughput(job, one).step_time_s != estimate_throughput(job, two).step_time_s
    assert one_plan_stages(job, one, LADDER) == ()


def test_the_default_stage_is_offered_first_else_the_lowest():
    nanotron = _job("llama-3.1-8b", "nanotron", 4)  # default ZeRO 0
    megatron = _job("llama-3.1-8b", "megatron-core", 4)  # default ZeRO 1
    at = {zero: Plan(tp=4, dp=1, zero_stage=zero, sequence_parallel=True) for zero in LADDER}
    assert [offered_before(nanotron, at[zero], (0, 1)) for zero in (0, 1)] == [(), (0,)]
    assert [offered_before(megatron, at[zero], (0, 1, 3)) for zero in (0, 1, 3)] == [(1,), (), ()]


def test_the_rendered_configs_differ_only_in_the_stage_keys():
    for framework in ("megatron-core", "verl"):
        texts = [api.render_config(framework, Request(model="llama-3.1-8b", num_gpus=4, tp=4, pp=1, dp=1,
                                                      zero_stage=zero)).text.splitlines() for zero in (0, 1)]
        changed = [line for line in difflib.unified_diff(*texts, lineterm="", n=0)
                   if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert changed and all("distributed_optimizer" in line or "distributed-optimizer" in line
                               or "param-gather" in line for line in changed), (framework, changed)


NANOTRON_DP1 = Request(model="llama-3.1-8b", num_gpus=4, framework="nanotron")


def test_recommend_offers_one_stage_per_plan_and_says_why():
    rec = recommend(NANOTRON_DP1, top_k=5)
    job, _ = search_job(NANOTRON_DP1)
    dp1 = [c for c in rec.candidates if c.plan.dp == 1]
    assert dp1  # the job's fastest layouts are DP1
    for c in rec.candidates:
        assert all(p.zero_stage == c.plan.zero_stage or one_plan_stages(job, c.plan, (p.zero_stage,)) == ()
                   for p in c.equivalents)  # no equivalent is the row itself at another stage
    for c in dp1:  # nanotron's default, ZeRO 0, stands for ZeRO 1 with the reason in its row
        assert c.plan.zero_stage == 0 and not c.equivalents
        assert ("ZeRO 1 is the same plan at this layout: ZeRO 1 shards its fp32 master weights and Adam moments "
                "(fp32 m, v) over dp x cp = 1 rank" in c.rationale)
        assert "listed once, as ZeRO 0 (nanotron's default)" in c.rationale
    for c in rec.candidates:
        if c.plan.dp > 1:
            assert "the same plan at this layout" not in c.rationale
    assert rec.rejected[SAME_STAGE] > 0 and SAME not in rec.rejected
    assert rec.considered == len(rec.candidates) + sum(rec.rejected.values())


def test_the_oracle_drops_the_same_stages_as_the_search():
    """The same plans, not only the same numbers: the oracle offers the stage the search offers (megatron-core's
    ZeRO 1 at TP4 DP1, ZeRO 0 left out; its ZeRO 3 ties it in step time, another row by its peak: the top K takes
    both of each tie, whose order among themselves neither fixes)."""
    for req in (NANOTRON_DP1, Request(model="llama-3.1-8b", num_gpus=4, framework="megatron-core", pp=1, cp=1, dp=1)):
        rec = recommend(req, top_k=4)  # megatron-core's third and fourth tie in step time: both ranked
        oracle = exhaustive_top_k(req, 4)
        ranked = {(c.plan.short(), c.plan.micro_batch_size, c.plan.zero_stage, c.plan.recompute)
                  for c in rec.candidates}
        assert ranked == {(r.plan.short(), r.plan.micro_batch_size, r.plan.zero_stage, r.plan.recompute)
                          for r in oracle}
        assert len(ranked) == 4 and any(zero == (0 if req.framework == "nanotron" else 1) for *_, zero, _ in ranked)
