"""One verdict on every face (issue 28 item 4): a grid of layouts walked through `check`, `render`, `memory` and
`throughput` via meshplan.api. A layout `check` refuses with a structural error is refused by both estimators
with the same rule id and fix, and by `render` unless forced; a layout with no structural error is priced by
both estimators and rendered (refused only when it does not fit, which the memory estimate shows)."""

from __future__ import annotations

import itertools

import pytest

from meshplan import api
from meshplan.adapters.render import TARGETS, RefusedLayout
from meshplan.core.errors import MeshplanError
from meshplan.rules.engine import EstimateBlocked, memory_rules
from meshplan.schema.request import Request

MODELS = ("llama-3.1-8b", "qwen3-30b-a3b")
FRAMEWORKS = ("megatron-core", "torchtitan", "deepspeed", "kempnerforge")
# (tp, pp, ep, etp, cp, zero_stage, tp_comm_overlap): legal and illegal mixes on 16 GPUs
SHAPES = [
    (tp, pp, ep, etp, cp, zero, overlap)
    for tp, pp, ep, etp, cp, zero, overlap in itertools.product(
        (1, 2, 3, 4), (1, 2), (1, 4), (1, 2), (1, 2), (0, 1, 3), (False, True))
    if not (etp == 2 and ep == 1) and not (overlap and tp == 1)
]
# Every ZeRO stage on every framework, cp and ep on DeepSpeed included: the knobs an adapter cannot write (FSDP2 has
# no zero_stage 1, DeepSpeed's config has no cp or ep) are rule AD001 of `check`, the same card function `render`
# refuses with (knowledge/adapter_knobs.py missing_knob), so they take the structural branch below.
GRID = [(m, f, *s) for m, f, s in itertools.product(MODELS, FRAMEWORKS, SHAPES)]
GRID += [(*layout, "flex") for layout in GRID if layout[0] == "qwen3-30b-a3b" and layout[4] > 1]  # DeepEP: EP007


def _request(model, framework, tp, pp, ep, etp, cp, zero, overlap, dispatcher=None) -> Request:
    return Request(model=model, gpu="h100", framework=framework, num_gpus=16, tp=tp, pp=pp, ep=ep, etp=etp,
                   cp=cp, zero_stage=zero, tp_comm_overlap=overlap, seq_length=4096,
                   moe_token_dispatcher=dispatcher)


def test_the_grid_is_a_few_hundred_layouts():
    assert len(GRID) >= 200


@pytest.mark.parametrize("layout", GRID, ids=lambda v: "-".join(map(str, v)))
def test_faces_give_one_verdict(layout):
    try:
        req = _request(*layout)
        report = api.check_config(req)
    except MeshplanError:  # refused before any rule (an unknown combination): every face refuses the same way
        for face in (api.estimate_memory, api.estimate_throughput):
            with pytest.raises(MeshplanError):
                face(_request(*layout))
        return
    structural = [f for f in report.findings if f.severity == "error" and f.id not in memory_rules()]
    framework = layout[1]
    if structural:
        first = structural[0]
        for face in (api.estimate_memory, api.estimate_throughput):
            with pytest.raises(EstimateBlocked) as info:
                face(req)
            assert info.value.rule_id == first.id and info.value.fix == first.fix, (face.__name__, layout)
        if framework in TARGETS:
            with pytest.raises(RefusedLayout) as refused:
                api.render_config(framework, req)
            assert first.id in {f.id for f in refused.value.findings}
        return
    memory = api.estimate_memory(req)
    assert memory.stages and api.estimate_throughput(req).step_time_s > 0
    if framework in TARGETS:
        if any(f.severity == "error" for f in report.findings):  # only the memory rules: it does not fit
            with pytest.raises(RefusedLayout):
                api.render_config(framework, req)
            assert report.memory is not None and not report.memory.fits
        else:
            assert api.render_config(framework, req).text


@pytest.mark.parametrize("framework, knobs", [
    ("torchtitan", {"zero_stage": 1}), ("kempnerforge", {"zero_stage": 1}),
    ("deepspeed", {"zero_stage": 1, "cp": 2}), ("deepspeed", {"zero_stage": 1, "etp": 2, "tp": 2, "ep": 2}),
])
def test_a_knob_the_adapter_cannot_write_is_one_verdict(framework, knobs):
    """AD001 (check) and render's refusal read one card function: check names the knob and the card's fix, both
    estimators stop on it, render refuses the layout, and forced it still cannot write it."""
    req = Request(model="qwen3-30b-a3b", gpu="h100", framework=framework, num_gpus=16, seq_length=4096, **knobs)
    found = [f for f in api.check_config(req).findings if f.id == "AD001"]
    name, value = next((k, v) for k, v in knobs.items() if k != "zero_stage" or framework != "deepspeed")
    assert found and found[0].message.startswith(f"{name}={value}:"), found
    for face in (api.estimate_memory, api.estimate_throughput):
        with pytest.raises(EstimateBlocked) as info:
            face(req)
        assert info.value.rule_id in {f.id for f in api.check_config(req).findings}
    with pytest.raises(RefusedLayout) as refused:
        api.render_config(framework, req)
    assert "AD001" in {f.id for f in refused.value.findings}
    with pytest.raises(MeshplanError, match="cannot express") as forced:
        api.render_config(framework, req, force=True)
    assert forced.value.fix == found[0].fix


def test_the_layout_knob_kept_per_knobs_in_use_is_missing_knobs_own_answer():
    """Rule AD001 asks missing_layout_knob, which keeps the first layout knob missing per (adapter, version, variant,
    the layout knobs in use, schedule, attention backend): on sampled plans of every renderable framework, its answer
    (the knob, its wording from the plan, the reason and the card's fix) is missing_knob's with only=LAYOUT_KNOBS,
    and the layout knobs it reads are knobs_in_use's, in order."""
    import random

    from meshplan.knowledge.adapter_knobs import (
        DEFAULT_VARIANTS,
        LAYOUT_KNOBS,
        default_render,
        knobs_in_use,
        missing_knob,
        missing_layout_knob,
    )
    from meshplan.request.resolve import resolve
    from meshplan.schema.plan import Plan

    rnd = random.Random(23)
    missing = 0
    for framework in DEFAULT_VARIANTS:
        job = resolve(Request(model="mixtral-8x7b", num_gpus=64, framework=framework, gpu="h100"))[0]
        for _ in range(40):
            plan = Plan(tp=rnd.choice([1, 2]), pp=rnd.choice([1, 2]), vpp=rnd.choice([1, 2]), cp=rnd.choice([1, 2]),
                        ep=rnd.choice([1, 2]), etp=rnd.choice([1, 2]), zero_stage=rnd.choice([0, 1, 2, 3]))
            target = default_render(job.card, job, plan)
            if target is None:
                continue
            expected = missing_knob(job.card, *target, job, plan, LAYOUT_KNOBS)
            for _ in range(2):  # computed, then kept
                assert missing_layout_knob(job.card, *target, job, plan) == expected, (framework, plan)
            used = [name for name in knobs_in_use(job, plan) if name in LAYOUT_KNOBS]
            assert used == [f"zero_{plan.zero_stage}", *(n for n in ("tp", "pp", "vpp", "cp", "ep", "etp")
                                                         if getattr(plan, n) > 1)]
            missing += expected is not None
    assert missing > 20
