"""Every row of the decision tables that names a model, a GPU count and a layout is valid and fits,
according to check_config and estimate_memory: the documents never recommend what the tools reject.
Also `strategies.suggest`, the decision-table answer the search compares itself with."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.mesh import job_domain, mesh_groups
from meshplan.arithmetic.schedule import pipeline_split
from meshplan.check.config import check_config
from meshplan.estimate.memory import estimate_memory
from meshplan.faces.docs import checked_rows, job_and_plan, row_numbers
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search.strategies import suggest

ROWS = checked_rows()


@pytest.mark.parametrize("row", [r for _, r in ROWS], ids=[i for i, _ in ROWS])
def test_checked_row_is_valid_and_fits(row):
    job, plan = job_and_plan(row)
    report = check_config(job, plan)
    errors = [f"{f.id}: {f.message}" for f in report.findings if f.severity == "error"]
    assert report.ok, errors
    memory = estimate_memory(job, plan)
    assert memory.fits, f"peak {memory.peak_bytes / 2**30:.1f} GiB on stage {memory.peak_stage}"
    numbers = row_numbers(row)
    assert numbers.peak_bytes == memory.peak_bytes and numbers.ok and numbers.tokens_per_s_per_gpu > 0


def test_rows_cover_the_seed_recipes():
    ids = {i for i, _ in ROWS}
    assert {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b", "example-4d-70b", "example-moe-dsv3"} <= ids


def test_kempnerforge_example_runs_on_its_4_gpu_nodes():
    """KempnerForge's 70B recipe runs on 8 nodes of 4 H200 (its 70b_32gpu_tp4.toml), so its FSDP8 crosses nodes: the
    row must say so, not fall back to the H200's usual 8-GPU node, where two TP4 groups' FSDP pairs share NVLink."""
    row = dict(ROWS)["example-fsdp-70b-kempnerforge"]
    assert row.request_fields()["gpus_per_node"] == 4
    job, plan = job_and_plan(row)
    assert job.gpus_per_node == 4 and plan.tp * plan.dp == 32
    assert mesh_groups(plan, law=job.card.world_size_law).dp_cp.crosses(job_domain(job))


def test_dsv3_recipe_needs_1024_gpus():
    """The seed guide's 'DeepSeek-V3 on 256 GPUs' is not buildable; the card's 1,024 is the minimum."""
    row = dict(ROWS)["deepseek-v3"]
    lay = row.layout
    assert row.num_gpus == lay.pp * lay.ep * lay.etp == 1024
    job, plan = job_and_plan(row.model_copy(update={"num_gpus": 512}))
    assert "WS002" in {f.id for f in check_config(job, plan, include_memory=False).findings}


def _suggest(**kw):
    job, _ = resolve(Request(**kw))
    return suggest(job)


def test_suggest_dense_row_by_size():
    s = _suggest(model="llama-3.1-70b", num_gpus=64)
    assert (s.table, s.row_id) == ("dense_by_size", "dense-70b-175b")
    assert (s.plan.tp, s.plan.pp, s.plan.dp) == (8, 4, 2) and s.plan.sequence_parallel
    assert s.source and s.adjustments == []


def test_suggest_named_moe_recipe_with_uneven_split():
    s = _suggest(model="deepseek-v3", num_gpus=1024)
    assert (s.table, s.row_id) == ("moe_by_model", "deepseek-v3")
    p = s.plan
    assert (p.tp, p.pp, p.ep, p.etp, p.dp) == (2, 16, 64, 1, 32)
    assert (p.first_stage_layers, p.last_stage_layers) == (3, 2)


def test_suggest_shrinks_to_the_gpus_and_resplits_layers():
    s = _suggest(model="deepseek-v3", num_gpus=256)
    p = s.plan
    assert 256 % (p.pp * p.ep * p.etp) == 0 and 256 % (p.tp * p.pp * p.cp) == 0
    assert p.pp < 16 and any("256 GPUs" in a for a in s.adjustments)
    if p.pp > 1:
        middle = (61 - p.first_stage_layers - p.last_stage_layers)
        assert (p.pp == 2 and middle == 0) or middle % (p.pp - 2) == 0


def test_suggest_names_each_shrunk_degree_once():
    """Shrinking a row to a small GPU count takes several halvings; the note gives each degree's first and last
    value once (PP 16 -> 1, not four PP notes)."""
    s = _suggest(model="deepseek-v3", num_gpus=8)
    world = [a for a in s.adjustments if "8 GPUs do not hold" in a]
    assert world == ["PP 16 -> 1, EP 64 -> 8: 8 GPUs do not hold the row's layout."]
    assert (s.plan.pp, s.plan.ep) == (1, 8)


def test_suggest_sequence_length_sets_cp():
    s = _suggest(model="llama-3.1-8b", num_gpus=64, seq_length=65536)
    assert s.plan.cp == 4 and s.sequence_row == "seq-32k-128k"
    assert 65536 % (2 * s.plan.cp) == 0


def test_suggest_keeps_cp_off_where_the_framework_runs_none():
    """KempnerForge runs no context parallelism: the table's CP4 at 32K was suggested, then refused by AD001 in the
    answer's own comparison ("no variant that passes the rules"); it is now said and not applied."""
    s = _suggest(model="qwen2.5-7b", num_gpus=16, seq_length=32768, framework="kempnerforge")
    assert s.plan.cp == 1 and any("runs no context parallelism" in a for a in s.adjustments)
    assert _suggest(model="qwen2.5-7b", num_gpus=16, seq_length=32768, framework="torchtitan").plan.cp == 4


def test_suggest_keeps_tp_in_nvlink_and_dividing_heads():
    s = _suggest(model="llama-3.1-70b", num_gpus=64, gpu="h100-pcie")
    assert s.plan.tp == 2 and any("NVLink" in a for a in s.adjustments)
    s = _suggest(model="gemma-2-27b", num_gpus=32)  # 32 heads, 16 KV heads
    assert 32 % s.plan.tp == 0


def test_suggest_framework_limits():
    s = _suggest(model="qwen3-30b-a3b", num_gpus=16, framework="kempnerforge")
    assert s.plan.pp == 1 and any("KempnerForge" in a for a in s.adjustments)
    s = _suggest(model="mixtral-8x22b", num_gpus=256, framework="torchtitan")
    assert s.plan.etp == 1


def test_suggest_moe_by_size_for_unlisted_model():
    s = _suggest(model="gpt-oss-120b", num_gpus=64)
    assert (s.table, s.row_id) == ("moe_by_size", "moe-100b-500b")
    assert 128 % s.plan.ep == 0


def test_uneven_split():
    """The decision tables' splits are the schedule's (the one `check` suggests and `recommend` enumerates)."""
    assert pipeline_split(61, 16) == (3, 2)
    assert pipeline_split(94, 16) == (5, 5)
    assert pipeline_split(126, 8) == (15, 15)
    assert pipeline_split(80, 4) == (None, None)  # even
    assert pipeline_split(5, 4) == (2, 1)  # 2 + 1 + 1 + 1: the heaviest stage holds ceil(5/4) layers
    assert pipeline_split(3, 4) is None  # fewer layers than stages


def test_a_fixed_degree_is_the_one_every_suggestion_names():
    """recommend qwen3-30b-a3b --num-gpus 16 --ep 2 said the decision table 'suggests TP4 PP2 EP4 DP2' and timed
    that EP4 layout: a layout the request excludes. The request's degrees replace the row's, and no fitting step
    (world, experts, framework) moves them."""
    from meshplan import api
    from meshplan.search.space import Fixed

    rec = api.recommend(Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, ep=2))
    assert "suggests TP4 PP2 EP2 DP2" in rec.decision_table and "EP 4 -> 2: the request fixes it" in \
        rec.decision_table and "EP4" not in rec.decision_table.split(" suggests ")[1]
    req = Request(model="deepseek-v3", num_gpus=256, ep=8, tp=2, pp=4, vpp=2, dp=32)
    job, _ = resolve(req)
    plan = suggest(job, Fixed.from_request(req, job).values).plan
    assert (plan.tp, plan.pp, plan.vpp, plan.ep, plan.dp) == (2, 4, 2, 8, 32)
    assert suggest(job).plan.ep != 8  # the row's own EP differs: the test checks the request's wins
