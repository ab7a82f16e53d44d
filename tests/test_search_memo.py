"""The search's memoised arithmetic gives the numbers it would compute afresh (issue 23's speed work): the first stage's
memory floor with its parts kept in a memo across layouts, and a Layout's hash and base kept per object."""

from __future__ import annotations

import pickle

from meshplan.arithmetic.schedule import VirtualSplit
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.space import Fixed, Layout, enumerate_layouts, first_stage_floor, micro_batches


def test_first_stage_floor_with_a_shared_memo_equals_the_floor_computed_afresh():
    req = Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layouts, _ = enumerate_layouts(job, fixed)
    memo: dict = {}
    checked = 0
    for lay in layouts[::3]:
        for zero in search.zeros:
            for recompute in search.recomputes:
                for mbs in micro_batches(job, lay, fixed)[:3]:
                    sp = search.sequence_parallel(lay)
                    fresh = first_stage_floor(job, lay, zero, recompute, mbs, sp, search.presets[zero])
                    kept = first_stage_floor(job, lay, zero, recompute, mbs, sp, search.presets[zero], memo=memo)
                    assert kept == fresh, (lay, zero, recompute, mbs)  # the same float, not just close
                    checked += 1
    assert checked > 100
    assert any(key[0] == "acts" for key in memo) and any(key[0] == "states" for key in memo)


def test_a_layout_hashes_as_its_fields_and_drops_what_it_caches_when_pickled():
    split = VirtualSplit((3, 4, 4, 2), layout="Et|tttt|tttt|ttL")
    lay = Layout(tp=2, pp=2, cp=1, ep=4, etp=1, dp=2, vpp=2, split=split, schedule="zero_bubble")
    fields = (2, 2, 1, 4, 1, 2, 2, None, None, split, "zero_bubble")
    assert hash(lay) == hash(fields)  # the dataclass's own hash: sets and dicts order as before
    assert lay.base() is lay.base() and lay.base() == Layout(2, 2, 1, 4, 1, 2, 1, 7, 6)
    copy = pickle.loads(pickle.dumps(lay))
    assert copy == lay and hash(copy) == hash(lay) and "_hash" not in pickle.loads(pickle.dumps(lay)).__dict__
    assert lay.shape() == (2, 2, 1, 4, 1, 2, 2, 0.0)  # zero-bubble: no bubble for the seed keys to count
