"""moe_a2a_overlap at pp > 1 runs Megatron-Core's combined 1F1B schedule, whose fused steps can make the step slower
than the plain interleaved one (meshplan/search/overlap_choice.py): the search ranks the faster of a key's two plans,
and so does the exhaustive oracle."""

from __future__ import annotations

from meshplan import api
from meshplan.faces.report.gather import plan_request
from meshplan.schema.request import Request


def test_a_ranked_plan_is_no_slower_than_its_other_ep_overlap():
    """Mixtral-8x7B on 24 H100: TP2 PP3 VPP11 EP8 DP4 steps in 34.359 s with the EP overlap (its all-to-all is inside
    the node; the combined schedule's bubble 1.13 s against 0.08 s) and 34.266 s without, but the search took the
    overlap as dominant, ranked the overlapped plan #2 and never timed the plain one, which is the fastest plan."""
    req = Request(model="mixtral-8x7b", num_gpus=24, gpu="h100")
    rec = api.recommend(req)
    best = rec.candidates[0]
    assert best.plan.pp > 1 and best.plan.vpp > 1 and not best.plan.moe_a2a_overlap
    flipped = 0
    for c in rec.candidates:
        other = plan_request(req, c.plan.model_copy(update={"moe_a2a_overlap": not c.plan.moe_a2a_overlap}),
                             rec.global_batch_size)
        if any(f.severity == "error" for f in api.check_config(other).findings):
            continue
        assert api.estimate_throughput(other).step_time_s >= c.throughput.step_time_s, c.plan.short()
        flipped += 1
    assert flipped >= 1
    overlapped = plan_request(req, best.plan.model_copy(update={"moe_a2a_overlap": True}), rec.global_batch_size)
    assert api.estimate_throughput(overlapped).step_time_s > best.throughput.step_time_s
