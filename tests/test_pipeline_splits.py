"""The pipeline splits the search enumerates beyond Megatron's first/last stage sizes (embedding/loss counted, explicit
layouts; meshplan/check/split.py, schedule.end_light_splits), and one split named by check and recommend (issue 23)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.schedule import end_light_splits, megatron_stages, parse_layout, stages_from_counts
from meshplan.check.alternatives import _deeper_pipeline
from meshplan.check.split import fastest_split, pipeline_options, split_choice, split_words, writes_layouts
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.published_runs import BRIDGE, RECIPE_SPLITS
from meshplan.request.resolve import resolve
from meshplan.rules.engine import Context, EstimateBlocked
from meshplan.schema.request import Request


def test_end_light_splits_keep_the_middle_at_the_least_heaviest_stage():
    assert end_light_splits(61, 16) == ((4, 4, 1), (3, 4, 2), (2, 4, 3), (1, 4, 4))
    assert end_light_splits(61, 32) == ((1, 2, 0), (0, 2, 1))
    assert end_light_splits(94, 8) == ((12, 12, 10), (11, 12, 11), (10, 12, 12))
    assert end_light_splits(40, 32) == ()  # 30 middle stages of 2 layers need 60
    for layers, stages in ((61, 4), (94, 24), (126, 16), (7, 2)):
        for first, middle, last in end_light_splits(layers, stages):
            assert first + last + (stages - 2) * middle == layers
            assert max(first, last) <= middle == -(-layers // stages)


def _shapes(layers: int, pp: int, mtp: int) -> set[tuple[int, tuple[int, ...]]]:
    """(vpp, decoder layers per virtual stage) of every option the search enumerates for Megatron-Bridge."""
    out = set()
    layouts = writes_layouts(framework_card("megatron-bridge"))
    for option in pipeline_options(layers, pp, True, True, layouts=layouts, mtp_layers=mtp):
        if option.split is not None:
            out.add((option.vpp, option.split.counts))
        else:
            stages = megatron_stages(layers, pp, option.vpp, option.first, option.last)
            counts = [len(stages.chunks[r][c]) for c in range(option.vpp) for r in range(pp)]
            out.add((option.vpp, tuple(counts)))
    return out


def test_the_search_reaches_every_published_bridge_split():
    """Every pipeline split a Megatron-Bridge recipe sets for DeepSeek-V3, Kimi-K2 (layout tables and strings) and
    Qwen3-235B-A22B (embedding and loss counted) is among the options the search enumerates at its pp and vpp."""
    checked = 0
    for split in RECIPE_SPLITS:
        if split.repo != BRIDGE or split.section:
            continue
        arch = resolve_model(split.model)
        layers = arch.num_layers
        if split.account_for:
            for pp in (2, 4, 8, 16):
                shapes = _shapes(layers, pp, arch.num_mtp_layers)
                per_rank = (layers + 2) // pp
                for vpp in [v for v in range(1, per_rank + 1) if (layers + 2) % pp == 0 and per_rank % v == 0]:
                    counts = [per_rank // vpp] * (pp * vpp)
                    counts[0] -= 1
                    counts[-1] -= 1
                    assert (vpp, tuple(counts)) in shapes, (split.model, pp, vpp)
                    checked += 1
            continue
        counts = split.counts or tuple(stage.count("t") for stage in parse_layout(split.layout))
        assert (split.vpp, tuple(counts)) in _shapes(layers, split.pp, arch.num_mtp_layers), split
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("framework", ["verl", "skyrl", "torchtitan", "deepspeed", "kempnerforge"])
def test_frameworks_without_a_layout_key_get_no_layout(framework):
    """Only a framework whose adapter writes pipeline_model_parallel_layout and account_for_* is searched with them
    (verl and SkyRL write first/last stage sizes only; the others none)."""
    assert not writes_layouts(framework_card(framework))
    assert writes_layouts(framework_card("megatron-core")) and writes_layouts(framework_card("megatron-bridge"))


def test_a_virtual_split_is_the_same_stages_as_its_fields():
    """What the plan is told (account_for_* or a layout string, MTP with the loss) gives the counts the search ranks."""
    for option in pipeline_options(61, 8, True, True, layouts=True, mtp_layers=1):
        if option.split is None:
            continue
        if option.split.layout is not None:
            stages = parse_layout(option.split.layout)
            assert tuple(s.count("t") for s in stages) == option.split.counts
            assert stages[-1].endswith("mL")
        assert stages_from_counts(option.split.counts, 8).counts == option.split.rank_counts(8)


QWEN_PP8 = dict(model="qwen3-235b-a22b", num_gpus=256, framework="megatron-bridge", gpu="h100", seq_length=4096,
                global_batch_size=4096, tp=2, pp=8, ep=32, etp=1, cp=1, dp=16, micro_batch_size=1, zero_stage=1,
                recompute="none", bias_activation_fusion=True)  # fused, as Bridge's Qwen3 perf recipes run it


def test_check_names_the_split_recommend_ranks_first():
    """Issue 23: Qwen3-235B-A22B at PP8 (94 layers): check's PP001 fix said 11/11 while recommend, for the same fixed
    layout, picked 12/10. Both now come from the same options and estimates."""
    fix = next(f.fix for f in api.check_config(Request(**QWEN_PP8)).findings if f.id == "PP001")
    top = api.recommend(Request(**QWEN_PP8, vpp=1), top_k=1).candidates[0].plan
    assert f"the split recommend ranks first for this layout: {split_words(top)}." in fix
    assert (top.first_stage_layers, top.last_stage_layers) == (12, 10)


@pytest.mark.parametrize("estimate", [api.estimate_memory, api.estimate_throughput])
def test_the_estimates_refuse_with_checks_pp001_fix(estimate):
    """memory, throughput and report (which estimate through api) refused PP001 with the rule's arithmetic fix alone
    ("pp in {1, 2} with vpp=1 splits evenly") where check, for the same layout, named the split recommend ranks first
    (account_for_embedding/loss at pp 8 vpp 4): every face now gives check's finding."""
    req = Request(**{**QWEN_PP8, "vpp": 4, "dp": None})
    fix = next(f.fix for f in api.check_config(req).findings if f.id == "PP001")
    assert "or keep pp=8 with the split recommend ranks first" in fix
    with pytest.raises(EstimateBlocked) as refused:
        estimate(req)
    assert refused.value.rule_id == "PP001" and refused.value.fix == fix


def test_pp001_names_a_split_the_rules_pass_where_none_fits():
    """DeepSeek-V3 (61 layers) at pp=16 vpp=2 on 1,024 H100 with Megatron-Bridge: no split fits at the layout's other
    settings, and PP001's fix named only "pp in {1} splits evenly". It now names the fastest split the rules pass
    (split.split_choice), says it does not fit and by how much; with it set PP001 is gone and MEM001
    names what clears the memory."""
    fields = dict(model="deepseek-v3", num_gpus=1024, gpu="h100", framework="megatron-bridge", tp=2, etp=1, pp=16,
                  vpp=2, ep=64)
    job, plan = resolve(Request(**fields))
    assert fastest_split(job, plan) is None
    choice = split_choice(job, plan)
    passing = choice.plan if choice is not None and not choice.fits else None
    assert passing is not None and passing.pipeline_layout is not None
    fix = next(f.fix for f in api.check_config(Request(**fields)).findings if f.id == "PP001")
    assert f"or keep pp=16 with a split the rules pass, the fastest: {split_words(passing)}." in fix
    assert "No split fits this layout's memory" in fix and "of 79.6 GiB" in fix
    applied = api.check_config(Request(**fields, pipeline_layout=passing.pipeline_layout))
    errors = {f.id for f in applied.findings if f.severity == "error"}
    assert errors == {"MEM001"} and not applied.memory.fits


def test_pp001_names_a_split_where_another_rule_refuses_every_split():
    """Kimi-K2 (61 layers) at pp=16 vpp=2 etp=2 on 256 GPUs: WS002 refuses every split (etp*ep*pp = 512), so none can
    be estimated, and PP001's fix named only "pp in {1} splits evenly". It now also names a split the pipeline rules
    pass; with WS002 fixed (etp=1) and that split set, no PP rule is left."""
    fields = dict(model="kimi-k2", num_gpus=256, gpu="h100", framework="megatron-bridge", tp=2, pp=16, vpp=2, ep=16)
    job, plan = resolve(Request(**fields, etp=2))
    assert split_choice(job, plan) is None
    found = {f.id: f for f in api.check_config(Request(**fields, etp=2)).findings}
    assert "WS002" in found
    fix = found["PP001"].fix
    assert "or keep pp=16 with a split the pipeline rules pass: pipeline_layout=" in fix
    layout = fix.split('pipeline_layout="', 1)[1].split('"', 1)[0]
    applied = api.check_config(Request(**fields, etp=1, pipeline_layout=layout))
    assert not [f.id for f in applied.findings if f.severity == "error" and f.id.startswith(("PP", "WS"))]


def test_mem001_deeper_pipelines_name_the_fastest_split():
    """MEM001's pp neighbours carry the split fastest_split ranks first there, the function PP001's fix uses."""
    job, plan = resolve(Request(**{**QWEN_PP8, "pp": 4, "dp": 32}))
    label, change = _deeper_pipeline(Context(job, plan), 8)
    neighbour = plan.model_copy(update={**change, "dp": 16})
    fastest = fastest_split(job, neighbour)
    assert fastest is not None
    assert label == f"pp=8 ({split_words(fastest)})"
    assert fastest.vpp == 1 and (fastest.first_stage_layers, fastest.last_stage_layers) == (12, 10)


def test_mem001_deeper_pipelines_name_the_split_and_vpp_they_clear():
    """Llama-3.1-8B PP2 on 8 H100 with first_stage_layers=31 is over memory; the fix named "pp=4", whose peak was
    estimated at the even split, but pp=4 with first_stage_layers=31 kept leaves 1 layer for 3 stages (PP004, PP007):
    the label says the split it drops, and so does a vpp it resets."""
    fields = dict(model="llama-3.1-8b", num_gpus=8, pp=2, first_stage_layers=31)
    report = api.check_config(Request(**fields))
    fix = next(f.fix for f in report.findings if f.id == "MEM001")
    assert "pp=4 (drop first_stage_layers) (" in fix
    kept = api.check_config(Request(**{**fields, "pp": 4}))
    assert {"PP004", "PP007"} <= {f.id for f in kept.findings if f.severity == "error"}
    dropped = api.check_config(Request(**{**fields, "pp": 4, "first_stage_layers": None}))
    assert dropped.ok and dropped.memory.fits
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=8, pp=2, vpp=2))
    label, change = _deeper_pipeline(Context(job, plan), 4)
    assert label.startswith("pp=4, vpp=1") and change["vpp"] == 1


@pytest.mark.parametrize(("framework", "refused"), [("torchtitan", (1,)), ("kempnerforge", (1,)), ("skyrl", (0,)),
                                                   ("megatron-core", ())])
def test_zero_stages_the_adapter_cannot_write_are_not_searched(framework, refused):
    """A ZeRO stage rule AD001 refuses on every layout is left out of the search and its plans counted under AD001:
    the same answer, fewer rule checks."""
    from meshplan.search.engine import BestFirstSearch
    from meshplan.search.estimators import default_engine
    from meshplan.search.job import search_job
    from meshplan.search.space import Fixed

    req = Request(model="llama-3.1-8b", num_gpus=16, framework=framework, gpu="h100")
    job, _ = search_job(req)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 1)
    left_out = tuple(stage.zero for stage in search.refused)  # each left-out stage counted under AD001
    assert left_out == refused and all(set(stage.rules) == {"AD001"} for stage in search.refused)
    assert not set(refused) & set(search.zeros)
    rec = api.recommend(req, top_k=2)
    assert bool(rec.rejected.get("AD001")) == bool(refused)
    assert all(c.plan.zero_stage not in refused for c in rec.candidates)
