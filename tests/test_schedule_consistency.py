"""One pipeline shape everywhere (meshplan/arithmetic/schedule.py): memory and throughput put the same decoder layers on
every
stage, the uneven split `check` suggests is one `recommend` enumerates, and every split `recommend` enumerates
passes `check`, for every catalog model x framework x pp (and vpp where the framework interleaves)."""

from __future__ import annotations

import math
import re

import pytest

import meshplan.estimate.perf as perf
from meshplan.arithmetic.schedule import (
    accounted_counts,
    compose_layout,
    megatron_stages,
    model_uneven_split,
    parse_layout,
    pipeline_split,
    split_problem,
    uneven_split,
)
from meshplan.check.config import check_structure
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.cards import framework_card, model_card_names
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.resolve import carry_cards, resolve
from meshplan.rules.engine import EstimateBlocked, backend_of, rule_specs
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search.space import Fixed, enumerate_layouts, megatron_uneven, model_pipeline_options, writes_layouts

MAX_PP = 32
# a split at the plan's own vpp (PP004 names one at vpp=1 where none works at the plan's: another layout)
SPLIT = re.compile(r"(?<!vpp=1, )first_stage_layers=(\d+), last_stage_layers=(\d+)")


def _names() -> list[tuple[str, str]]:
    """(catalog model, framework): every pair, in catalog order."""
    return [(name, framework) for name in model_card_names() for framework in FRAMEWORKS]


def _jobs(part: int = 0, parts: int = 1):
    """(architecture, framework, job template) for every catalog model x framework; with `parts`, every parts-th pair
    from the part-th: the long tests below run in parts (each a test of its own, which pytest-xdist's workers share),
    each part a mix of models and frameworks (`parts` prime to the framework count: each part takes every framework)."""
    assert math.gcd(parts, len(FRAMEWORKS)) == 1, parts
    base, _ = resolve(Request(model="llama-3.1-8b", num_gpus=8))
    for name, framework in _names()[part::parts]:
        arch = resolve_model(name)
        yield arch, framework, carry_cards(base.model_copy(update={"model": arch, "framework": framework}))


def _share(part: int, parts: int) -> float:
    """The part's share of every catalog model x framework pair (_jobs)."""
    names = _names()
    return len(names[part::parts]) / len(names)


def _plans(arch, framework):
    """Per pp: the plan without a split (remainder on the first stages; also interleaved by 2 where the framework
    interleaves) and every (vpp, first, last) the search enumerates for it."""
    kn = framework_card(framework).search
    zero = 1 if framework == "skyrl" else 0  # SkyRL's config has no ZeRO-0 (its card's adapter; rule AD001)
    for pp in range(2, min(arch.num_layers, MAX_PP) + 1):
        yield Plan(pp=pp, zero_stage=zero)
        if kn.vpp and 2 * pp <= arch.num_layers:
            yield Plan(pp=pp, vpp=2, zero_stage=zero)
        for vpp, first, last, split in model_pipeline_options(arch, pp, kn.vpp, megatron_uneven(framework),
                                                              layouts=writes_layouts(framework_card(framework))):
            if (vpp, first, last, split) != (1, None, None, None):
                yield Plan(pp=pp, vpp=vpp, zero_stage=zero, first_stage_layers=first, last_stage_layers=last,
                           **(split.fields() if split is not None else {}))


# --------------------------------------------------------------------------- memory and throughput


@pytest.mark.parametrize("part", range(5))
def test_memory_and_throughput_see_the_same_layers_per_stage(part):
    compared, blocked, shapes = 0, 0, set()
    for arch, framework, template in _jobs(part, 5):
        for plan in _plans(arch, framework):
            job = template.model_copy(update={"num_gpus": plan.pp})
            try:
                report = estimate_memory(job, plan)
            except EstimateBlocked:
                blocked += 1
                continue
            timed = perf.stage_layers(job, plan)
            assert [s.layers for s in report.stages] == list(timed.counts), (arch.name, framework, plan)
            assert sum(timed.counts) == arch.num_layers
            # the output layer and loss sit where throughput times the head
            assert [s.stage for s in report.stages if "logits_and_loss" in s.detail] == [timed.head_rank]
            shapes.add((framework, timed.counts))
            compared += 1
    # a split check refuses (PP001: layers not divisible by pp, no first/last given) is refused by the estimates too.
    # The whole catalog's bound (more than 8,000 plans compared, fewer blocked than twice those), held by each part on
    # its share of the pairs, so the parts together hold it too
    assert compared > 8_000 * _share(part, 5) and blocked < 2 * compared
    # nanotron's balancing puts more layers on the first stages: the two conventions did differ here (in every part)
    assert any(fw == "nanotron" and counts[0] > counts[-1] + 1 for fw, counts in shapes)


def test_throughput_times_the_stages_it_exposes(record_calls):
    calls = record_calls(perf, "stage_layers")
    job, plan = resolve(Request(model="qwen3-8b", num_gpus=8, pp=4, framework="nanotron"))
    perf.estimate_throughput(job, plan)
    assert [asked.pp for _, asked in calls] == [4]


def test_nanotron_balances_with_one_cost_function():
    """nanotron's get_block_compute_costs prices attention with h // heads, not the model's head_dim: Gemma-2-27B
    (head_dim 128, h/heads = 4608/32 = 144) over 2 stages is 24/22, where head_dim would give 25/21 (what
    throughput used to time while memory weighed 24/22)."""
    job, plan = resolve(Request(model="gemma-2-27b", num_gpus=8, pp=2, framework="nanotron"))
    assert perf.stage_layers(job, plan).counts == (24, 22)
    assert [s.layers for s in estimate_memory(job, plan).stages] == [24, 22]
    arch, h = job.model, job.model.hidden_size
    layer = 4 * arch.num_attention_heads * (h // arch.num_attention_heads) * h + 3 * arch.ffn_hidden_size * h
    total = arch.num_layers * layer + arch.vocab_size * h
    assert 24 == total // (2 * layer) + 1  # rank 0 takes layers until their cost passes total/2
    by_head_dim = 4 * arch.num_attention_heads * arch.head_dim * h + 3 * arch.ffn_hidden_size * h
    assert (arch.num_layers * by_head_dim + arch.vocab_size * h) // (2 * by_head_dim) + 1 == 25


# --------------------------------------------------------------------------- check's fix and the search


def _suggested(findings) -> tuple[int, int] | None:
    for f in findings:
        if f.id in ("PP001", "PP004"):
            match = SPLIT.search(f.fix)
            return (int(match[1]), int(match[2])) if match else None
    raise AssertionError("neither PP001 nor PP004 fired")


def _normal(layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> tuple[int, ...]:
    """Layers per rank, so an explicit split with every stage equal reads as the even split."""
    return megatron_stages(layers, pp, vpp, first, last).counts


@pytest.mark.parametrize("part", range(4))
def test_check_suggests_a_split_recommend_enumerates_and_recommend_enumerates_what_check_accepts(part):
    checked = suggested = 0
    for arch, framework, template in _jobs(part, 4):
        pp004 = rule_specs()["PP004"]
        if not pp004.applies_to(framework, backend_of(framework_card(framework), 0)):
            continue
        L = arch.num_layers
        vpps = [1, 2, 3, 4] if framework_card(framework).search.vpp else [1]
        for pp in range(2, min(L, MAX_PP) + 1):
            job = template.model_copy(update={"num_gpus": pp})
            for vpp in vpps:
                if pp * vpp > L:
                    continue
                fixed = Fixed({"tp": 1, "pp": pp, "cp": 1, "ep": 1, "etp": 1, "vpp": vpp})
                layouts, _ = enumerate_layouts(job, fixed)
                enumerated = {(lay.first, lay.last) for lay in layouts if lay.split is None}
                splits = {lay.split for lay in layouts if lay.split is not None}  # embedding/loss counted, layouts
                for first, last, split in [(f, la, None) for f, la in enumerated] + [(None, None, x) for x in splits]:
                    # recommend only enumerates splits check accepts
                    plan = Plan(pp=pp, vpp=vpp, zero_stage=0, first_stage_layers=first, last_stage_layers=last,
                                **(split.fields() if split is not None else {}))
                    ids = {f.id for f in check_structure(job, plan)}
                    if ids & {"PP005", "SQ001", "PP016"}:  # the template's micro-batch count (no multiple of pp),
                        # sequence (past the model's learned positions) or a Mamba-2 hybrid's pattern, which takes no
                        # layout or accounting (PP016): refused by check and the estimates alike
                        continue
                    # (a Gated DeltaNet hybrid's splits are enumerated in whole decoder layers: PP017 refuses none)
                    assert not ids & {"PP001", "PP002", "PP004", "PP009", "PP017"}, (arch.name, framework, pp, vpp,
                                                                                     first, last, split)
                # a split given wrong (PP004), or none where pp does not divide the layers (PP001)
                plans = [Plan(pp=pp, vpp=vpp, zero_stage=0, first_stage_layers=0)]
                if L % pp:
                    plans.append(Plan(pp=pp, vpp=vpp, zero_stage=0))
                for plan in plans:
                    split = _suggested(check_structure(job, plan))
                    checked += 1
                    if split is None:
                        assert model_uneven_split(arch, pp, vpp) is None
                        continue
                    suggested += 1
                    assert not split_problem(L, pp, vpp, *split)
                    shapes = {_normal(L, pp, vpp, f, la) for f, la in enumerated}
                    assert _normal(L, pp, vpp, *split) in shapes, (arch.name, framework, pp, vpp, split, enumerated)
    # the whole catalog's bound (more than 15,000 plans checked, 5,000 splits suggested), each part on its share
    assert checked > 15_000 * _share(part, 4) and suggested > 5_000 * _share(part, 4), (checked, suggested)


# --------------------------------------------------------------------------- the split itself


def _brute_force(layers: int, pp: int, vpp: int) -> tuple[int, int, int] | None:
    """The documented choice by exhaustion: lightest heaviest stage, then the lightest first+last, then first and
    last as equal as possible, then the lighter last; none when the heaviest stage exceeds ceil(layers/pp)."""
    best = None
    for per in range(vpp, layers + 1, vpp) if pp > 2 else (0,):
        for first in range(vpp, layers + 1, vpp):
            last = layers - (pp - 2) * per - first
            if last < vpp or last % vpp:
                continue
            score = (max(first, per, last), first + last, abs(first - last), last)
            if score[0] <= -(-layers // pp) and (best is None or score < best[0]):
                best = (score, (first, per, last))
    return best[1] if best else None


def test_uneven_split_is_the_documented_choice():
    for layers in range(1, 130):
        for pp in range(2, MAX_PP + 1):
            for vpp in (1, 2, 3, 4):
                assert uneven_split(layers, pp, vpp) == _brute_force(layers, pp, vpp), (layers, pp, vpp)


@pytest.mark.parametrize(("layers", "pp", "vpp", "split"), [
    (61, 16, 1, (3, 4, 2)),     # DeepSeek-V3 (cards/strategies.yaml's 3/2)
    (126, 8, 1, (15, 16, 15)),  # Llama-3.1-405B (15/15)
    (92, 8, 1, (10, 12, 10)),   # GLM-4.5 (10/10)
    (46, 4, 1, (11, 12, 11)),   # GLM-4.5-Air (11/11)
    (11, 3, 1, (4, 4, 3)),      # ends no heavier than the middle: not 4/3/4
    (17, 16, 1, (2, 1, 1)),     # the heaviest stage is 2 whatever: the first stage takes it
    (94, 16, 2, (6, 6, 4)),     # Qwen3-235B interleaved: every part even
    (46, 8, 2, (6, 6, 4)),      # GLM-4.5-Air interleaved: 6 = ceil(46/8), no heavier than without vpp
    (61, 8, 2, None),           # every part even cannot add up to 61
    (80, 32, 1, None),          # only 10 + 30x2 + 10 adds up: a heaviest stage of 10, not ceil(80/32) = 3
    (80, 4, 8, None),           # 16 + 24 + 24 + 16: interleaving by 8 would cost balance (24 > 20)
    (46, 2, 2, None),           # 24/22: heavier than 23
    (4, 8, 1, None),            # deeper than the model
])
def test_uneven_split_cases(layers, pp, vpp, split):
    assert uneven_split(layers, pp, vpp) == split


def test_pipeline_split_is_even_where_megatron_needs_no_sizes():
    assert pipeline_split(80, 8, 1) == (None, None)
    assert pipeline_split(80, 8, 2) == (None, None)  # 10 per rank, 5 per virtual stage
    assert pipeline_split(80, 8, 4) is None  # 10 per rank does not split in 4; 4 + 6x12 + 4 is heavier than 10
    assert pipeline_split(80, 16, 1) == (None, None)
    assert pipeline_split(61, 16, 1) == (3, 2)
    assert pipeline_split(61, 1, 1) == (None, None)


# --------------------------------------------------------------------------- explicit layouts


def test_layouts_give_memory_and_throughput_the_same_stages():
    """Every catalog model on megatron-core, pp 2..32 with vpp 1 and 2: the layout check's fix composes
    (schedule.compose_layout) passes check, and memory weighs and throughput times the decoder layers its stages hold
    (each rank's t over its virtual stages), with the loss on the last rank; likewise the embedding/loss-accounted
    split where it divides. A Gated DeltaNet hybrid's layout and accounting count its decoder layers (two pattern
    layers each: gdn_config.split_layers, pipeline_unit), as its GPTModel does."""
    from meshplan.knowledge.gdn_config import pipeline_unit, split_layers

    compared = 0
    for arch, framework, template in _jobs():
        if framework != "megatron-core":
            continue
        layers, unit = split_layers(arch), pipeline_unit(arch)
        for pp in range(2, MAX_PP + 1):
            for vpp in (1, 2):
                layout = compose_layout(layers, pp, vpp, arch.num_mtp_layers)
                plans = [Plan(pp=pp, vpp=vpp, zero_stage=0, pipeline_layout=layout)] if layout else []
                if not accounted_counts(layers, pp, vpp, True, True)[1]:
                    plans.append(Plan(pp=pp, vpp=vpp, zero_stage=0, account_for_embedding=True, account_for_loss=True))
                for plan in plans:
                    job = template.model_copy(update={"num_gpus": pp})
                    ids = {f.id for f in check_structure(job, plan)}
                    if ids & {"PP005", "SQ001", "PP016"}:  # the template's micro-batch count (no multiple of
                        # pp), sequence (past the model's learned positions) or a Mamba-2 hybrid's pattern, which takes
                        # no layout or accounting (PP016): refused by check and the estimates alike
                        continue
                    assert not ids & {"PP001", "PP002", "PP004", "PP007", "PP009", "PP017"}, (arch.name, plan, ids)
                    if layout and plan.pipeline_layout:
                        stages = parse_layout(layout)
                        expected = tuple(unit * sum(stages[c * pp + r].count("t") for c in range(vpp))
                                         for r in range(pp))
                    else:
                        counts = accounted_counts(layers, pp, vpp, True, True)[0]
                        expected = tuple(unit * sum(counts[c * pp + r] for c in range(vpp)) for r in range(pp))
                    report = estimate_memory(job, plan)
                    timed = perf.stage_layers(job, plan)
                    assert [s.layers for s in report.stages] == list(timed.counts) == list(expected), (arch.name, plan)
                    assert [s.stage for s in report.stages if "logits_and_loss" in s.detail] == [pp - 1]
                    compared += 1
    assert compared > 1_000


def test_deepseek_v3_bridge_layouts_per_stage():
    """Megatron-Bridge's DeepSeek-V3 recipes (recipes/deepseek/h100/deepseek_v3.py layout_map): PP16 puts 4 layers
    on each stage but the last, which holds 1 with the MTP block and the loss; PP8 x VPP4 'Et|(tt|)*30mL' (the H100
    perf recipe) gives rank 0 1+2+2+2 = 7, rank 7 2+2+2+0 = 6 and the others 8."""
    for pp, layout, counts in ((16, "Et*4|(t*4|)*14t,mL", [4] * 15 + [1]),
                               (8, "Et|(tt|)*30mL", [7] + [8] * 6 + [6])):
        job, plan = resolve(Request(model="deepseek-v3", num_gpus=1024, tp=2, pp=pp, ep=64, etp=1,
                                    global_batch_size=8192, recompute="full", framework="megatron-bridge",
                                    pipeline_layout=layout))
        assert plan.vpp == 32 // pp if pp == 8 else plan.vpp == 1
        assert [s.layers for s in estimate_memory(job, plan).stages] == counts
        assert list(perf.stage_layers(job, plan).counts) == counts


def test_mtp_sits_where_the_layout_puts_it():
    """The Megatron doc's PP16 x VPP2 layout 'Et*3|(tt|)*29,m|L' puts the MTP block alone on flat stage 30 (rank 14,
    its last virtual stage) and the loss on rank 15: memory weighs the MTP weights and activations on rank 14 and
    throughput times the block there; a layout without m trains no MTP block."""
    fields = dict(model="deepseek-v3", num_gpus=2048, tp=2, pp=16, ep=64, etp=1, global_batch_size=8192,
                  recompute="full", framework="megatron-core")
    job, plan = resolve(Request(**fields, pipeline_layout="Et*3|(tt|)*29,m|L"))
    stages = estimate_memory(job, plan).stages
    assert [s.stage for s in stages if "mtp_params" in s.detail] == [14]
    assert "mtp_activations" in stages[14].detail and "mtp_params" not in stages[15].detail
    assert perf.stage_layers(job, plan).mtp_at == 14
    with_head = estimate_memory(*resolve(Request(**fields, pipeline_layout="Et*3|(tt|)*29,|mL"))).stages
    assert [s.stage for s in with_head if "mtp_params" in s.detail] == [15]
    job, plan = resolve(Request(**fields, pipeline_layout="Et*3|(tt|)*29,|L"))
    report = estimate_memory(job, plan)
    assert not [s for s in report.stages if "mtp_params" in s.detail]
    assert any("places no MTP layer m" in w for w in report.warnings)
