"""NeMo AutoModel's FSDP2Config.defer_fsdp_grad_sync (default True: components/distributed/config.py) turns FSDP2's
gradient sync off for every micro-batch but the last without PP (recipes/llm/train_ft.py get_sync_ctx), so every unit
holds its unsharded fp32 gradient until the last micro-batch reduces it (cards/frameworks/nemo-automodel.yaml
grad_accumulation). A knob: the plan carries it (default from the card), the memory and the time read it, the
renderer writes it and the reader reads it back; other frameworks have no such setting."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.estimate.sharding_traffic import sharding_schedule
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search import search_job
from meshplan.search.space import carried_fields

# 16 over 8 data ranks at micro-batch 1: two micro-batches per step
DENSE = dict(framework="nemo-automodel", model="mistral-7b", num_gpus=8, gpu="h100", tp=1, pp=1, micro_batch_size=1,
             seq_length=4096, zero_stage=3, recompute="full", global_batch_size=16)
HELD = "unsharded_accumulated_gradients"


def _peak(**kw):
    report = api.estimate_memory(Request(**{**DENSE, **kw}))
    return max(report.stages, key=lambda s: s.total_bytes)


def test_default_holds_every_unsharded_gradient_in_fp32():
    job, plan = resolve(Request(**DENSE))
    assert plan.defer_fsdp_grad_sync is True
    assert any("defer_fsdp_grad_sync=true" in note for note in job.notes)
    params = api.describe_model("mistral-7b").total_params
    assert _peak().detail[HELD] == pytest.approx(4 * params, rel=1e-6)
    assert not sharding_schedule(job, plan).reduce_each_microbatch  # one reduce-scatter per step


def test_off_holds_none_and_reduces_every_micro_batch():
    on, off = _peak(), _peak(defer_fsdp_grad_sync=False)
    assert HELD not in off.detail
    assert on.total_bytes - off.total_bytes > 3 * api.describe_model("mistral-7b").total_params
    job, plan = resolve(Request(**DENSE, defer_fsdp_grad_sync=False))
    assert sharding_schedule(job, plan).reduce_each_microbatch
    slow = api.estimate_throughput(Request(**DENSE, defer_fsdp_grad_sync=False))
    fast = api.estimate_throughput(Request(**DENSE))
    assert slow.breakdown.dp_comm_s > fast.breakdown.dp_comm_s


def test_one_micro_batch_holds_none_and_reduces_in_its_backward():
    """With one micro-batch per step the deferral changes nothing (its only backward reduces): no held gradient, and
    the time reduce-scatters as in any FSDP2 backward, for AutoModel and KempnerForge alike."""
    assert HELD not in _peak(global_batch_size=8).detail
    for name in ("nemo-automodel", "kempnerforge"):
        job, plan = resolve(Request(**{**DENSE, "framework": name, "global_batch_size": 8}))
        assert sharding_schedule(job, plan).reduce_each_microbatch, name


def test_other_frameworks_refuse_the_setting():
    for name in ("kempnerforge", "torchtitan"):
        with pytest.raises(MeshplanError, match="has no such setting"):
            resolve(Request(**{**DENSE, "framework": name}, defer_fsdp_grad_sync=False))
        assert resolve(Request(**{**DENSE, "framework": name}))[1].defer_fsdp_grad_sync is None


def carried(req: Request) -> object:
    """The defer_fsdp_grad_sync the search carries for `req`, from its search job (release and model resolved once)."""
    return carried_fields(req, search_job(req)[0])["defer_fsdp_grad_sync"]


def test_the_search_carries_it():
    assert carried(Request(**DENSE, defer_fsdp_grad_sync=False)) is False
    assert carried(Request(**DENSE)) is True


def test_the_search_carries_an_old_snapshots_schedule_from_the_resolved_release_and_model():
    """A MoE model on a main snapshot from before AutoModel sharded the outer model reduced every micro-batch: the
    search carries it off as resolve sets it, read from the search job's release and model (its framework_version
    and model_type as resolved, not the request's names resolved again), and the request's prefix or alias of them
    reads the same."""
    moe = dict(DENSE, model="qwen3-30b-a3b", num_gpus=16, framework_version="main@2025-10-02")
    for req in (Request(**moe), Request(**{**moe, "model": "Qwen/Qwen3-30B-A3B"})):
        assert carried(req) is False and resolve(req)[1].defer_fsdp_grad_sync is False
    assert carried(Request(**{**moe, "framework_version": "main@2025-11-11"})) is True
    assert carried(Request(**{**moe, "model": "mistral-7b"})) is True  # a dense model: the change does not act on it


@pytest.mark.parametrize("value", [True, False])
def test_render_writes_it_and_the_reader_reads_it(value):
    text = api.render_config("nemo-automodel", Request(**DENSE, defer_fsdp_grad_sync=value)).text
    assert f"defer_fsdp_grad_sync: {str(value).lower()}" in text
    assert api.import_config(text, path="r.yaml", framework="nemo-automodel").request["defer_fsdp_grad_sync"] is value


def test_published_rows_score_with_their_configs_setting():
    """The bench's AutoModel rows whose cited config sets defer_fsdp_grad_sync false are scored with it; its own MoE
    models' runs without PP ran main before 8134b0c03 (framework_version main@2025-10-02: the outer model not yet an
    FSDP module, every micro-batch reduced; the card's release_changes moe_outer_model_sharded), which resolve turns
    into false (under PP too: the trainer's loop turned nothing off, the stage holds the gradients itself,
    memory_states.pipeline_held); the rest (their configs leave it out, a dense model) keep AutoModel's default,
    true."""
    import sys
    from pathlib import Path

    from meshplan.request.resolve import resolve

    bench = Path(__file__).resolve().parent.parent / "bench"
    sys.path.insert(0, str(bench))
    import production_mapping as pmap
    import production_rows as prows

    rows = {r["id"]: r for r in prows.load_rows(bench / "data" / "nemo_automodel" / "production_configs_dev.yaml")}
    for row_id, stated, runs in (("automodel_llama3_70b_64", False, False),
                                 ("automodel_lora_llama3_70b_16", False, False),
                                 ("automodel_qwen3_30b_8", None, False), ("automodel_gptoss_120b_64", None, False),
                                 ("automodel_dsv3_256", None, False), ("automodel_lora_llama3_8b_1", None, True)):
        req = pmap.map_row(rows[row_id], Path("/nonexistent")).request
        assert req.framework_version == "main@2025-10-02", row_id
        assert req.defer_fsdp_grad_sync is stated, row_id
        assert resolve(req)[1].defer_fsdp_grad_sync is runs, row_id
