"""The ZeRO stages a search takes (search/zero_stages.search_ladder): a stage is left out only where no recompute the
search runs makes it estimable with the request's carried fields, and its plans are then counted under the rule that
refuses them, so recommend still says why that stage ranks nothing."""

from meshplan import api
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.space import Fixed
from meshplan.search.zero_stages import LeftOut

SKYRL_MOE = dict(model="qwen3-30b-a3b", framework="skyrl", gpu="h100", num_gpus=24, seq_length=1536,
                 global_batch_size=5120)


def ladder(req: Request) -> BestFirstSearch:
    job, _ = search_job(req)
    return BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 1)


def test_a_carried_field_given_keeps_skyrls_fsdp_stage_in_the_search():
    """estimable_zeros probed each stage at recompute none only; SkyRL's main_sft at ZeRO 3 runs full recompute only
    (RC006 at none), so any carried field given (here the allocator) dropped ZeRO 3 from the search: no FSDP layout
    considered (fails before: ZeRO 3 not in the ladder, no FS001 counted with the field given)."""
    given = Request(**SKYRL_MOE, expandable_segments=True)
    assert 3 in ladder(given).zeros and not [s for s in ladder(given).refused if s.zero == 3]
    plain, asked = api.recommend(Request(**SKYRL_MOE)), api.recommend(given)
    assert "FS001" in plain.rejected and "FS001" in asked.rejected  # ZeRO 3's FSDP rule: that stage was searched


def test_an_rl_actor_search_with_a_carried_field_keeps_skyrls_fsdp_stage():
    """The RL actor's training request carries the RL launcher's allocator (rl/job.trainer_request), so the same probe
    dropped ZeRO 3 from a SkyRL RL job given a carried field: on 24 H100 with 64 GiB of host per node no actor layout
    was found at all (fails before: no candidate)."""
    rl = api.recommend(Request(model="qwen3-30b-a3b", framework="skyrl", gpu="h100", num_gpus=24, job="rl",
                               algorithm="grpo", cpu_memory_per_node=64, expandable_segments=True))
    assert rl.candidates and rl.candidates[0].plan.zero_stage == 3


def test_a_stage_no_recompute_makes_estimable_is_left_out_and_counted_under_its_rule():
    """verl's FSDP backend (ZeRO 3) has no recompute_method key (RC003 at every recompute): the stage is left out of
    the ladder, and each of its plans is counted under RC003, as the search counts a stage it searches (fails before:
    the probe at none refused every stage, so the ladder stayed whole and its bounds took ZeRO 3 as the lightest)."""
    req = Request(model="llama-3.1-8b", num_gpus=8, framework="verl", recompute="full", recompute_method="uniform")
    search = ladder(req)
    assert 3 not in search.zeros and LeftOut(3, ("RC003",)) in search.refused
    rec = api.recommend(req, top_k=5)
    assert rec.candidates and all(c.plan.zero_stage != 3 for c in rec.candidates)
    assert rec.rejected["RC003"] > 0 and rec.considered == len(rec.candidates) + sum(rec.rejected.values())
