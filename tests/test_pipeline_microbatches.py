"""torchtitan's batch semantics under pipeline parallelism (issue 24 item 4): training.local_batch_size is one run of
the schedule, cut into micro-batches of parallelism.pipeline_parallel_microbatch_size, and gradient accumulation runs
the schedule again (torchtitan 0.3.0 trainer.py train_step). Request.pipeline_microbatches carries it; resolve,
the estimate, the rules, render, the round-trip parser and the importer read it the same way."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.common import torchtitan_batch
from meshplan.adapters.parse import parse_plan
from meshplan.adapters.read import import_config
from meshplan.core.errors import MeshplanError
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

BASE = dict(model="llama-3-70b", gpu="h100", num_gpus=256, framework="torchtitan", tp=8, pp=4, seq_length=8192,
            micro_batch_size=1, recompute="full", zero_stage=3)


def test_the_schedule_runs_once_per_accumulation_step():
    """Four runs of 8 micro-batches: four fills and drains and four gradient syncs, against one run of 8."""
    one = api.estimate_throughput(Request(**BASE, global_batch_size=64, pipeline_microbatches=8))
    four = api.estimate_throughput(Request(**BASE, global_batch_size=256, pipeline_microbatches=8))
    whole = api.estimate_throughput(Request(**BASE, global_batch_size=256))
    assert four.breakdown.bubble_s == pytest.approx(4 * one.breakdown.bubble_s, rel=1e-6)
    assert four.breakdown.dp_comm_s == pytest.approx(4 * one.breakdown.dp_comm_s, rel=1e-6)
    assert four.breakdown.compute_s == pytest.approx(whole.breakdown.compute_s)
    assert four.step_time_s > whole.step_time_s  # one run of 32 fills the pipeline once
    assert any("run 4 times per step" in a for a in four.assumptions)


def test_one_run_is_the_whole_step_and_the_default_global_batch_is_one_run():
    job, plan = resolve(Request(**BASE, global_batch_size=64, pipeline_microbatches=8))
    assert plan.pipeline_microbatches is None and plan.schedule_runs(job.global_batch_size) == 1
    job, plan = resolve(Request(**BASE, pipeline_microbatches=8))  # torchtitan's global -1: local x dp
    assert job.global_batch_size == 1 * 8 * plan.dp and plan.schedule_runs(job.global_batch_size) == 1


def test_refused_where_it_does_not_divide_the_step_or_the_framework_runs_one_schedule():
    with pytest.raises(MeshplanError, match="does not divide"):
        resolve(Request(**BASE, global_batch_size=96, pipeline_microbatches=5))
    with pytest.raises(MeshplanError, match="one pipeline schedule"):
        resolve(Request(**(BASE | {"framework": "megatron-core"}), global_batch_size=256, pipeline_microbatches=8))


def test_the_refusal_names_the_requests_framework():
    """NeMo AutoModel's refusal said "torchtitan needs global_batch_size to be a multiple of ...": a user importing an
    AutoModel recipe (llama3_1_8b_hellaswag_pp.yaml on more GPUs than it was written for) read another framework."""
    with pytest.raises(MeshplanError, match="NeMo AutoModel needs global_batch_size") as refused:
        resolve(Request(**(BASE | {"framework": "nemo-automodel"}), global_batch_size=96, pipeline_microbatches=5))
    assert "torchtitan" not in str(refused.value)


def test_torch_1f1b_counts_the_micro_batches_of_one_run():
    """torch's Schedule1F1B needs n_microbatches >= stages per run (rule PP010), whatever the step's total."""
    report = api.check_config(Request(**BASE, global_batch_size=256, pipeline_microbatches=2))
    assert "PP010" in {f.id for f in report.findings if f.severity == "error"}


def test_render_writes_one_run_as_the_local_batch_and_parses_back():
    req = Request(**BASE, global_batch_size=256, pipeline_microbatches=8)
    for version in ("0.3.0", "0.2.2"):
        out = api.render_config("torchtitan", req.model_copy(update={"framework_version": version}))
        parsed = parse_plan("torchtitan", out.variant, out.text, 80)
        assert parsed["micro_batch_size"] == 1 and parsed["pipeline_microbatches"] == 8, version
    whole = api.render_config("torchtitan", Request(**BASE, global_batch_size=256))
    parsed = parse_plan("torchtitan", whole.variant, whole.text, 80)
    assert parsed["micro_batch_size"] == 1 and "pipeline_microbatches" not in parsed  # one run: local = 32


def test_the_batch_keys_as_request_fields():
    assert torchtitan_batch(32, None, 8) == {"micro_batch_size": 1, "pipeline_microbatches": 32}
    assert torchtitan_batch(32, 4, 8) == {"micro_batch_size": 4, "pipeline_microbatches": 8}
    assert torchtitan_batch(32, None, 8, microbatches=8) == {"micro_batch_size": 4, "pipeline_microbatches": 8}
    assert torchtitan_batch(32, 4, 8, dp=8, global_batch_size=256) == {"micro_batch_size": 4}
    assert torchtitan_batch(6, None, 1) == {"micro_batch_size": 6}
    with pytest.raises(MeshplanError, match="local_batch_size 6"):
        torchtitan_batch(6, 4, 8)


def test_import_reads_local_batch_over_the_pipeline_micro_batch():
    text = ("[model]\nname = \"llama3\"\nflavor = \"70B\"\n[training]\nlocal_batch_size = 32\nglobal_batch_size = 512\n"
            "seq_len = 8192\n[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 8\n"
            "pipeline_parallel_degree = 4\npipeline_parallel_microbatch_size = 4\n")
    got = import_config(text, "job.toml", framework="torchtitan").request
    assert got["micro_batch_size"] == 4 and got["pipeline_microbatches"] == 8 and got["global_batch_size"] == 512


def test_gpipe_holds_the_micro_batches_of_one_run():
    """GPipe keeps every micro-batch of a run in flight: a step of 4 runs of 8 holds what one run of 8 holds, not 32."""
    gpipe = BASE | {"pipeline_schedule": "gpipe", "recompute": "none"}
    runs = api.estimate_memory(Request(**gpipe, global_batch_size=256, pipeline_microbatches=8))
    one = api.estimate_memory(Request(**gpipe, global_batch_size=64, pipeline_microbatches=8))
    whole = api.estimate_memory(Request(**gpipe, global_batch_size=256))
    assert runs.stages[0].activations_bytes == one.stages[0].activations_bytes < whole.stages[0].activations_bytes
