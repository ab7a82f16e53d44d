"""enumerate_layouts once per request scope (space.space_key) and its layouts built by copying a template's fields
(space.variants): the same layouts, equal and hashing equal to those Layout(...) builds."""

from dataclasses import fields

from meshplan.estimate.layer_records import shared_layers
from meshplan.schema.request import Request
from meshplan.search import search_job
from meshplan.search.job import job_at
from meshplan.search.space import SPACES_KEPT, Fixed, Layout, enumerate_layouts, variants


def job_for(model: str, num_gpus: int, **extra):
    return search_job(Request(model=model, num_gpus=num_gpus, gpu="h100", **extra))[0]


def rebuilt(lay: Layout) -> Layout:
    return Layout(**{f.name: getattr(lay, f.name) for f in fields(Layout)})


def test_variants_equal_the_layouts_the_constructor_builds():
    template = Layout(tp=2, pp=4, cp=1, ep=1, etp=1, dp=8, vpp=2, first=3, last=2)
    made = variants(template, [(1, 1), (4, 2)], ("", "zero_bubble"))
    assert [(lay.ep, lay.etp, lay.schedule) for lay in made] == [(1, 1, ""), (1, 1, "zero_bubble"), (4, 2, ""),
                                                                 (4, 2, "zero_bubble")]
    for lay in made:
        ref = rebuilt(lay)
        assert lay == ref and hash(lay) == hash(ref) and lay.base() == ref.base()
        assert (lay.tp, lay.pp, lay.vpp, lay.first, lay.last, lay.dp) == (2, 4, 2, 3, 2, 8)
    assert len({id(lay.__dict__) for lay in made}) == len(made)  # each its own fields
    assert template.ep == 1 and template.schedule == ""  # the template untouched


def test_enumerated_layouts_match_the_constructor_on_moe_and_schedules():
    cases = ((job_for("deepseek-v3", 256), Fixed()),
             (job_for("mixtral-8x7b", 64), Fixed({"pipeline_schedule": "1f1b"})))
    for job, fixed in cases:
        layouts, _ = enumerate_layouts(job, fixed)
        assert any(lay.ep > 1 and lay.etp > 1 for lay in layouts)
        assert all(lay.schedule == fixed.values.get("pipeline_schedule", "") for lay in layouts)
        for lay in layouts:
            assert set(lay.__dict__) == {f.name for f in fields(Layout)}  # no cached hash or base copied
            ref = rebuilt(lay)
            assert lay == ref and hash(lay) == hash(ref)


def test_one_enumeration_per_scope_and_what_it_reads():
    req = Request(model="kimi-k2", num_gpus=256, gpu="h100")
    job = search_job(req)[0]
    fixed = Fixed.from_request(req, job)
    outside = enumerate_layouts(job, fixed)
    assert enumerate_layouts(job, fixed)[0][0] is not outside[0][0]  # no scope: enumerated afresh
    with shared_layers():
        first, dropped = enumerate_layouts(job, fixed)
        again, dropped_again = enumerate_layouts(job_at(job, 256, user_gbs=True), Fixed.from_request(req, job))
        assert again == first == outside[0] and dropped_again == dropped
        assert again is not first and all(a is b for a, b in zip(again, first, strict=True))  # the same layouts
        again.clear()  # a caller's own list
        assert enumerate_layouts(job, fixed)[0] == first
        other, _ = enumerate_layouts(job_at(job, 128, user_gbs=False), fixed)  # another count: its own space
        assert other == enumerate_layouts(job_at(job, 128, user_gbs=False), Fixed())[0] != first
        pinned, _ = enumerate_layouts(job, Fixed({"tp": 8}))  # other fixed fields: their own space
        assert pinned and all(lay.tp == 8 for lay in pinned) and len(pinned) < len(first)
        for world in range(8, 8 * (SPACES_KEPT + 2), 8):  # bounded: the oldest dropped, the answers unchanged
            enumerate_layouts(job_at(job, world, user_gbs=False), fixed)
        assert enumerate_layouts(job, fixed)[0] == first
