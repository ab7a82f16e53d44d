"""The flex dispatcher's backend as a request field (flex57): Megatron-Core's moe_flex_dispatcher_backend (core_v0.16.0
on: deepep or hybridep), which real runs choose (Megatron-Bridge v0.4.1's H100 Qwen3-30B preset runs HybridEP on
H100), resolved once into Job.moe_flex_backend (the request's, else mesh.flex_backend's for the machine), timed by
its links and permute passes, held to its GPU and framework (rule EP013), rendered and read back."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.comm import job_links
from meshplan.arithmetic.mesh import flex_backend
from meshplan.core.errors import MeshplanError
from meshplan.estimate.layer_records import DispatchPasses
from meshplan.estimate.moe_time import dispatcher_passes
from meshplan.knowledge.calibration import calibration, flex_dispatch_points
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import resolve
from meshplan.rules.experts import flex_backend_refusal
from meshplan.schema.request import Request

QWEN = dict(model="qwen3-30b-a3b", framework="megatron-bridge", num_gpus=16, ep=16, seq_length=4096,
            micro_batch_size=1, global_batch_size=512, moe_token_dispatcher="flex")


@pytest.mark.parametrize("gpu", ["h100", "b200", "gb200", "gb300"])
def test_left_out_it_is_the_machines_and_the_notes_say_so(gpu):
    job, _ = resolve(Request(gpu=gpu, **QWEN))
    assert job.moe_flex_backend == flex_backend(get_gpu(gpu), job.gpus_per_node)
    assert any(n.startswith(f"moe_flex_backend not given: {job.moe_flex_backend}") for n in job.notes)


def test_given_it_is_the_jobs_whatever_the_machine():
    job, _ = resolve(Request(gpu="h100", moe_flex_backend="hybridep", **QWEN))
    assert job.moe_flex_backend == "hybridep"
    assert not any(n.startswith("moe_flex_backend not given") for n in job.notes)


def test_beside_the_alltoall_dispatcher_it_is_refused_naming_both_fields():
    with pytest.raises(MeshplanError) as refused:
        resolve(Request(gpu="h100", moe_flex_backend="hybridep", **{**QWEN, "moe_token_dispatcher": "alltoall"}))
    assert set(refused.value.fields) == {"moe_flex_backend", "moe_token_dispatcher"}
    assert "moe_token_dispatcher=flex" in refused.value.fix


def test_with_the_dispatcher_left_out_recommend_times_flex_on_it():
    """The search picks flex for cross-node EP when the request leaves the dispatcher out, so the backend a request
    gives beside it is the one its flex candidates run (refused before: 'leaves moe_token_dispatcher out
    (alltoall)'); the estimate's plan, alltoall, says it has no effect there."""
    ask = {**QWEN, "moe_token_dispatcher": None}
    job, plan = resolve(Request(gpu="h100", moe_flex_backend="hybridep", **ask))
    assert plan.moe_token_dispatcher == "alltoall" and job.moe_flex_backend == "hybridep"
    assert any(n.startswith("moe_flex_backend=hybridep: no effect") for n in job.notes)
    searched = api.recommend(Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=32, moe_flex_backend="hybridep"),
                             top_k=1)
    best = searched.candidates[0]
    assert best.plan.moe_token_dispatcher == "flex"
    assert any("hybridep's dispatch and combine kernels" in a for a in best.throughput.assumptions)


def test_the_estimate_times_the_jobs_backend_not_the_machines():
    # H100 under HybridEP: no permute passes outside its kernels (flex_dispatch permute_passes 0, DeepEP's 8), and
    # no measured HybridEP bandwidth on Hopper, so its copies inside a node run at NVLink's (Links.flex_bw empty)
    cal = calibration("megatron-bridge")
    deep = resolve(Request(gpu="h100", moe_flex_backend="deepep", **QWEN))
    hybrid = resolve(Request(gpu="h100", moe_flex_backend="hybridep", **QWEN))
    assert dispatcher_passes(*deep, cal) == DispatchPasses(0.0, 8.0)
    assert dispatcher_passes(*hybrid, cal) == DispatchPasses(0.0, 0.0)
    assert job_links(deep[0], cal).flex_bw == flex_dispatch_points("deepep", "hopper") != ()
    assert job_links(hybrid[0], cal).flex_bw == flex_dispatch_points("hybridep", "hopper") == ()
    slow = api.estimate_throughput(Request(gpu="h100", moe_flex_backend="deepep", **QWEN))
    fast = api.estimate_throughput(Request(gpu="h100", moe_flex_backend="hybridep", **QWEN))
    assert fast.breakdown.compute_s < slow.breakdown.compute_s
    assert any("hybridep's dispatch and combine kernels" in a for a in fast.assumptions)


@pytest.mark.parametrize(("gpu", "framework", "backend", "refused"), [
    ("gb200", "megatron-core", "deepep", "spans several"),  # only HybridEP covers a multi-node NVLink domain
    ("gb200", "megatron-bridge", "hybridep", None),
    ("h100", "megatron-bridge", "hybridep", None),  # v0.3.0 on: HybridEP on Ampere, Hopper and Blackwell
    ("b200", "megatron-bridge", "deepep", None),  # 'NVIDIA B200' by name
    ("mi300x", "megatron-bridge", "deepep", "runs deepep on ampere, hopper, B200, B300 only"),
    ("mi300x", "megatron-core", "hybridep", "runs hybridep on ampere, hopper, blackwell only"),
])
def test_rule_ep013_holds_the_backend_to_the_gpu_and_framework(gpu, framework, backend, refused):
    job, _ = resolve(Request(gpu=gpu, moe_flex_backend=backend, **{**QWEN, "framework": framework}))
    why = flex_backend_refusal(job)
    assert (why is None) == (refused is None)
    if refused is not None:
        assert refused in why["why"]
    findings = api.check_config(Request(gpu=gpu, moe_flex_backend=backend, **{**QWEN, "framework": framework}))
    assert any(f.id == "EP013" for f in findings.findings) == (refused is not None)


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100", "h200", "h800", "h20", "b200", "gb200", "b300", "gb300"])
def test_the_machines_own_backend_runs_wherever_the_framework_has_the_flex_dispatcher(gpu):
    # the default never trips EP013 on an NVIDIA part, so the search's flex choice (engine.run_search) is unchanged
    for framework in ("megatron-core", "megatron-bridge"):
        job, _ = resolve(Request(gpu=gpu, **{**QWEN, "framework": framework}))
        assert flex_backend_refusal(job) is None, (gpu, framework)


@pytest.mark.parametrize(("framework", "line"), [
    ("megatron-core", "--moe-flex-dispatcher-backend hybridep"),
    ("megatron-bridge", "cfg.model.moe_flex_dispatcher_backend = 'hybridep'"),
])
def test_render_writes_the_jobs_backend(framework, line):
    out = api.render_config(framework, Request(gpu="h100", moe_flex_backend="hybridep",
                                               **{**QWEN, "framework": framework}))
    assert line in out.text
    assert any("as the request sets it (moe_flex_backend" in n for n in out.notes)


def test_torchtitan_refuses_hybridep_it_has_no_key_for():
    # 0.2.2's expert_parallel_comm_backend takes standard or deepep (its card's moe_flex_backend values)
    with pytest.raises(MeshplanError, match="moe_flex_backend=hybridep"):
        api.render_config("torchtitan", Request(gpu="h100", moe_flex_backend="hybridep", framework_version="0.2.2",
                                                **{**QWEN, "framework": "torchtitan"}), force=True)
