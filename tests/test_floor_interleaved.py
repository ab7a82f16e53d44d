"""The first rank's memory floor of an interleaved layout reads the layers that rank holds in the estimate's stages
(floors.first_stage_spans: schedule.plan_stages' chunks 0, pp, 2 pp, ...), and the search reads a non-interleaved
base's floors for it only where each rank holds layers of the same kinds in the same order (floors.own_memory). Both
read the first layers before: on Llama-4-Maverick, whose layers alternate dense and MoE, TP2 PP4 VPP12's rank 0 holds
dense layers only, and the base's floor (six layers of each kind) was 75.7 GB against the estimate's 11.2 GB, so the
search dropped plans that fit (issue 23: bounds must never over-count memory)."""

from __future__ import annotations

import random

import pytest

from meshplan.arithmetic.pipeline_timeline import V_ORDERS, schedule_order
from meshplan.arithmetic.schedule import plan_stages
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.cards import framework_card
from meshplan.schema.request import Request
from meshplan.search import recommend, search_job
from meshplan.search.floors import _chunks_held, first_stage_floor, first_stage_spans, layout_floor, own_memory
from meshplan.search.space import Fixed, Layout, enumerate_layouts, micro_batches, zero_ladder

# torchtitan ships Llama 4 in its 0.2.x releases, not in 0.3.0 (rule TT003): its Llama 4 jobs name 0.2.2
RELEASE_WITH_LLAMA4 = {"torchtitan": "0.2.2"}


def llama4_version(model: str, framework: str) -> str | None:
    return RELEASE_WITH_LLAMA4.get(framework) if model.startswith("llama-4") else None


def model_refuses_cp(job) -> bool:
    """Whether the job's framework builds the model's attention so that it refuses cp > 1 (rule CP007)."""
    return job.card.attention is not None and job.model.model_type in job.card.attention.no_cp_model_types


def maverick(gpus: int = 256, framework: str = "megatron-core", seq: int = 8192):
    return search_job(Request(model="llama-4-maverick", num_gpus=gpus, framework=framework, seq_length=seq,
                              global_batch_size=2 * gpus,
                              framework_version=llama4_version("llama-4-maverick", framework)))[0]


def test_an_interleaved_first_rank_holds_its_chunks_not_the_first_layers():
    job = maverick()
    lay = Layout(tp=1, pp=4, cp=64, ep=4, etp=1, dp=1, vpp=12)
    spans = first_stage_spans(job, lay, 1)
    assert spans == [(k, k + 1) for k in range(0, 48, 4)]  # one layer per chunk: 0, 4, 8, ..., 44
    assert not any(job.model.is_moe_layer(a) for a, _ in spans)  # Maverick's MoE layers are the odd ones
    plan = lay.plan(zero_stage=1, recompute="full", micro_batch_size=1, sequence_parallel=False, cp_comm_type="p2p")
    assert [layer for a, b in spans for layer in range(a, b)] == list(plan_stages(job, plan).layers(0))


def test_the_base_stands_for_an_interleaved_layout_only_where_the_ranks_hold_the_same_kinds():
    job, zeros = maverick(), (1,)
    twelve = Layout(tp=1, pp=4, cp=64, ep=4, etp=1, dp=1, vpp=12)
    assert own_memory(job, twelve, zeros, {}) is twelve  # rank 0: 12 dense layers; its base's: 6 of each
    two = Layout(tp=1, pp=4, cp=64, ep=4, etp=1, dp=1, vpp=2)  # chunks of 6: d M d M d M, as the base's ranks
    assert own_memory(job, two, zeros, {}) == two.base()
    llama, _ = search_job(Request(model="llama-3.1-70b", num_gpus=64))
    lay = Layout(tp=8, pp=4, cp=1, ep=1, etp=1, dp=2, vpp=5)  # layers all alike: the base's floors are its own
    assert own_memory(llama, lay, (1,), {}) == lay.base()


@pytest.mark.parametrize(("model", "gpus", "framework", "seq"), [
    ("llama-4-maverick", 256, "megatron-core", 8192),
    ("llama-4-maverick", 128, "megatron-bridge", 4096),
    ("llama-4-maverick", 128, "torchtitan", 8192),
    ("llama-4-scout", 64, "megatron-core", 8192),
    ("gemma-2-27b", 64, "megatron-core", 8192),
    ("gpt-oss-120b", 64, "torchtitan", 8192),
])
def test_interleaved_floors_stay_under_the_first_stages_estimate(model, gpus, framework, seq):
    """The floors the search reads for an interleaved layout (its own_memory's) under the estimate's first stage, on
    models whose layers are not alike (dense and MoE, sliding windows); V placements left out (their first rank holds
    fewer micro-batches of its last chunk than min(m, pp): test_v_order_floors_stay_under_the_first_stages_estimate)."""
    rng = random.Random(3)
    job = search_job(Request(model=model, num_gpus=gpus, framework=framework, seq_length=seq,
                             global_batch_size=2 * gpus, framework_version=llama4_version(model, framework)))[0]
    zeros, memo = tuple(zero_ladder(framework_card(framework))), {}
    no_cp = model_refuses_cp(job)  # torchtitan 0.2.2's Llama 4 (CP007): the estimate refuses its cp > 1
    lays = [lay for lay in enumerate_layouts(job, Fixed())[0] if lay.vpp > 1
            and not (lay.schedule and schedule_order(lay.schedule, lay.vpp) in V_ORDERS) and not (no_cp and lay.cp > 1)]
    checked = 0
    for lay in rng.sample(lays, min(40, len(lays))):
        own, sizes = own_memory(job, lay, zeros, memo), micro_batches(job, lay, Fixed())
        for zero in zeros:
            for recompute in ("none", "selective", "full"):
                mbs, sp = rng.choice(sizes[:3]), lay.tp > 1
                plan = lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs, sequence_parallel=sp,
                                cp_comm_type="p2p")
                try:
                    first = estimate_memory(job, plan).stages[0].total_bytes
                except MeshplanError:
                    continue
                assert first_stage_floor(job, own, zero, recompute, mbs, sp) <= first * (1 + 1e-9), plan
                assert layout_floor(job, own, zero) <= first * (1 + 1e-9), plan
                checked += 1
    assert checked > 100



@pytest.mark.parametrize(("model", "gpus", "seq"), [
    ("mixtral-8x7b", 128, 4096),
    ("llama-3.1-8b", 64, 8192),
    ("llama-4-maverick", 128, 8192),
])
def test_v_order_floors_stay_under_the_first_stages_estimate(model, gpus, seq):
    """A V order's first rank (torchtitan's ZBVZeroBubble at VPP2, DualPipeV) holds stage 0 and the last stage, and
    fewer micro-batches of the last than min(m, pp) (pipeline_counts.in_flight: ZBV holds one), so the floor that
    counted min(m, pp) on all its layers exceeded the estimate's first stage, by 53% on Mixtral TP2 PP8 VPP2 DP8, also
    where the layers are all alike (issue 23): the floor reads each chunk's count from the estimate's in_flight."""
    rng = random.Random(3)
    job = search_job(Request(model=model, num_gpus=gpus, framework="torchtitan", seq_length=seq,
                             global_batch_size=2 * gpus, framework_version=llama4_version(model, "torchtitan")))[0]
    zeros, memo = tuple(zero_ladder(framework_card("torchtitan"))), {}
    no_cp = model_refuses_cp(job)
    lays = [lay for lay in enumerate_layouts(job, Fixed())[0] if lay.schedule and lay.pp > 1
            and schedule_order(lay.schedule, lay.vpp) in V_ORDERS and not (no_cp and lay.cp > 1)]
    checked = 0
    # 36 layouts: at data_parallel_shard_degree 1 (ZeRO 0 and 1) torchtitan's EP borrows from cp x tp alone (rule
    # WS005, parallel_dims.py efsdp), which refuses most of Maverick's ZeRO-0 V layouts: 30 left 38 estimates
    for lay in rng.sample(lays, min(36, len(lays))):
        own, sizes = own_memory(job, lay, zeros, memo), micro_batches(job, lay, Fixed())
        for zero in zeros:
            recompute, mbs = rng.choice(("none", "selective", "full")), rng.choice(sizes[:3])
            plan = lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs, sequence_parallel=lay.tp > 1,
                            cp_comm_type="p2p")
            try:
                first = estimate_memory(job, plan).stages[0].total_bytes
            except MeshplanError:
                continue
            assert first_stage_floor(job, own, zero, recompute, mbs, lay.tp > 1) <= first * (1 + 1e-9), plan
            checked += 1
    assert checked > 40


def test_a_zbv_first_rank_holds_one_micro_batch_of_its_last_chunk():
    """The counts the floor reads are the estimate's (schedule.in_flight): ZBV's rank 0 at PP8 holds 8 of stage 0 and
    1 of stage 15 with 8 micro-batches, 15 and 1 with 32; 1F1B's layouts keep min(m, pp) on every layer."""
    job = search_job(Request(model="mixtral-8x7b", num_gpus=128, framework="torchtitan", seq_length=4096,
                             global_batch_size=256))[0]
    zbv = Layout(tp=2, pp=8, cp=1, ep=1, etp=1, dp=8, vpp=2, schedule="zero_bubble")
    assert _chunks_held(job, zbv, (4, 1), {}) == ((8, 1), (15, 1))  # m = 256 / (4 x 8) = 8, then 32
    assert _chunks_held(job, zbv.base(), (4, 1), {}) is None


@pytest.mark.parametrize(("framework", "gpus", "rule"), [("megatron-core", 3, "PP012"), ("nanotron", 12, "PP012")])
def test_a_v_order_at_one_chunk_per_rank_is_left_to_the_rules(framework, gpus, rule):
    """A request's fixed dualpipev reaches the search's layouts at vpp=1 (and uneven first/last splits) too; the
    floors placed their single chunk in a V (schedule.v_placed reads two per rank) and recommend raised a bare
    IndexError. Now no estimate takes those stages (floors.estimate_stages: None, the floors of no split), and the
    search answers with the rules that refuse them."""
    req = Request(model="mistral-7b", num_gpus=gpus, gpu="b200", framework=framework, seq_length=4096,
                  global_batch_size=gpus, headroom=0.05, pipeline_schedule="dualpipev")
    job = search_job(req)[0]
    lay = Layout(tp=1, pp=3, cp=1, ep=1, etp=1, dp=1, vpp=1, first=11, last=10, schedule="dualpipev")
    assert first_stage_spans(job, lay, 0) == [(0, 11)]  # stages_for's first stage
    rec = recommend(req, top_k=3)
    assert not rec.candidates and rec.rejected[rule] > 0
