"""The distributed optimizer's parameter all-gather in fp8 (fp8_param_gather), and the fp8 settings NeMo 2.0's
performance scripts ran the NeMo 25.02 / 25.04 / 25.07 performance-summary rows with (published_runs.
NEMO2_PERF_PRECISION, read by the bench's production_sources.nemo2_perf_fields)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from meshplan.arithmetic.comm import links
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.layer_records import BF16
from meshplan.estimate.perf import dp_traffic, estimate_throughput, step_sync
from meshplan.estimate.sharding_traffic import optimizer_gather_bytes
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.published_runs import NEMO2_PERF_PRECISION, nemo2_perf_precision
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_rows as prow
import production_sources as psrc


def _zero1(gather: bool | None, precision: str = "fp8"):
    # 4 data-parallel ranks, one per node of 8 (tp 8): the parameter all-gather crosses the network
    return resolve(Request(model="llama-3-70b", gpu="b200", num_gpus=32, gpus_per_node=8, framework="megatron-core",
                           tp=8, pp=1, zero_stage=1, precision=precision, fp8_param_gather=gather,
                           seq_length=8192, micro_batch_size=1, global_batch_size=32))


def test_fp8_primary_weights_gather_their_linear_weights_in_one_byte():
    """Megatron-Core's distributed optimizer keeps fp8 parameters in a uint8 buffer and all-gathers them so: the
    decoder's weights at 1 B, the embedding and output layer (`edge`, no Transformer Engine modules) at bf16's 2."""
    job, plan = _zero1(True)
    dense, edge = 1.0e9, 0.25e9
    assert optimizer_gather_bytes(job, plan, dense, 0.0, edge) == (dense - edge + BF16 * edge, 0.0)
    off_job, off_plan = _zero1(False)
    assert optimizer_gather_bytes(off_job, off_plan, dense, 0.0, edge) == (BF16 * dense, 0.0)
    bf16_job, bf16_plan = _zero1(None, precision="bf16")
    assert optimizer_gather_bytes(bf16_job, bf16_plan, dense, 0.0, edge) == (BF16 * dense, 0.0)


def test_the_step_s_parameter_gather_shrinks_with_fp8_param_gather():
    """The ZeRO-1 step's all-gather after the optimizer moves the fp8 bytes (was bf16 whatever fp8_param_gather
    said), so the exposed DP time of an fp8 run with fp8 primary weights is lower; the gradient reduction is not."""
    job, on = _zero1(True)
    _, off = _zero1(False)
    cal = calibration("megatron-core")
    lk = links(job.gpu, job.gpus_per_node, cal)
    traffic = dp_traffic(job, on, lk, mesh_groups(on, law=job.card.world_size_law), cal)
    dense = 1.0e9
    sync_on = step_sync(job, on, cal, lk, traffic, dense, 0.0, False)
    sync_off = step_sync(job, off, cal, lk, traffic, dense, 0.0, False)
    assert sync_on.reduce == sync_off.reduce
    assert 0 < sync_on.gather < sync_off.gather
    assert sync_on.gather == pytest.approx(traffic(dense, 0.0, 1.0))  # no edge given: every weight in fp8, a floor
    assert estimate_throughput(job, on).breakdown.dp_comm_s < estimate_throughput(job, off).breakdown.dp_comm_s


PERF_SUMMARY = "NVIDIA NeMo Framework user guide, performance/performance_summary.html"


def _row(framework: str, when: str, category: str = "pretrain", citation: str = PERF_SUMMARY) -> dict:
    return {"framework": framework, "category": category, "source": {"version_or_date": when, "citation": citation}}


@pytest.mark.parametrize(("release", "recipe", "gather", "gather_fsdp"), [
    ("NeMo 25.02", "delayed", True, True), ("NeMo 25.04", "tensorwise", True, False),
    ("NeMo 25.07", "tensorwise", True, True)])
def test_nemo2_performance_scripts_set_the_recipe_and_fp8_primary_weights(release, recipe, gather, gather_fsdp):
    """25.02's scripts ran bf16_with_fp8_mixed (delayed scaling, fp8_params); 25.04's and 25.07's the tables'
    current scaling (tensorwise) with fp8_param_gather, which 25.04's turned off under Megatron-FSDP."""
    row = _row(f"{release} (NeMo 2.0, Megatron-Core)", release)
    assert psrc.nemo2_perf_fields(row, "fp8", {}, 1) == {"fp8_recipe": recipe, "fp8_param_gather": gather}
    assert psrc.nemo2_perf_fields(row, "fp8", {}, 3) == {"fp8_recipe": recipe, "fp8_param_gather": gather_fsdp}
    facts = nemo2_perf_precision(release)
    assert facts is NEMO2_PERF_PRECISION[release[-5:]] and "NVIDIA/NeMo v2." in facts.source


def test_what_the_row_states_wins_and_other_rows_get_nothing():
    row = _row("NeMo 25.04 (NeMo 2.0, Megatron-Core)", "NeMo 25.04")
    stated = {"fp8_recipe": "mxfp8", "fp8_param_gather": False}
    assert psrc.nemo2_perf_fields(row, "fp8", stated, 1) == {}
    assert psrc.nemo2_perf_fields(row, "bf16", {}, 1) == {}
    assert psrc.nemo2_perf_fields(_row("NeMo 25.04 (NeMo 2.0, Megatron-Core)", "NeMo 25.04", "sft"), "fp8", {}, 1) == {}
    assert psrc.nemo2_perf_fields(_row("NeMo 24.07", "NeMo 24.07"), "fp8", {}, 1) == {}  # the launcher's line
    assert psrc.nemo2_perf_fields(_row("Megatron-Core 0.12", "2025-04"), "fp8", {}, 1) == {}
    assert nemo2_perf_precision(None) is None and nemo2_perf_precision("NeMo 24.12") is None


def test_a_run_of_the_container_by_other_code_takes_none_of_the_performance_scripts_settings():
    """MLPerf Training v5.0's GB200 Llama 3.1 405B rows ran NVIDIA's submission code in the NeMo 25.04 container
    (mlcommons/training_results_v5.0 .../implementations/tyche_ngpu256_ngc25.04_nemo: its config_*.sh, pretrain.py),
    not NeMo's performance scripts: the container names no launcher, so their fp8 recipe stays the row's own (none
    stated: Megatron-Core's delayed, which the submission's conf/custom.yaml defaults FP8_RECIPE to and no file of
    its tree sets), where it took the scripts' tensorwise before. The hyphenated page name is the same page."""
    mlperf = _row("NeMo 25.04 (MLPerf Training v5.0 NVIDIA implementation: NeMo 2.0 LlamaModel on Megatron-Core)",
                  "2025-04/05 (MLPerf Training v5.0, NGC 25.04)",
                  citation="mlcommons/training_results_v5.0 NVIDIA/results/tyche_ngpu256_ngc25.04_nemo/llama31_405b")
    assert psrc.nemo2_perf_fields(mlperf, "fp8", {}, 1) == {}
    hyphen = _row("NeMo 25.04 (NeMo 2.0, Megatron-Core)", "NeMo 25.04", citation="performance/performance-summary.html")
    assert psrc.nemo2_perf_fields(hyphen, "fp8", {}, 1) == {"fp8_recipe": "tensorwise", "fp8_param_gather": True}


@pytest.mark.shared_data(prow.DEFAULT_VALIDATION / prow.DATA_NAME)
def test_map_row_passes_them_to_the_request(tmp_path, production_rows):
    """A NeMo 2.0 pretraining row that says only 'fp8' maps to the Request its release's scripts ran."""
    row = copy.deepcopy(production_rows["nemo2407_h100_llama3_70b_64gpu"])
    row["framework"], row["source"]["version_or_date"], row["precision"] = "NeMo 25.02 (NeMo 2.0)", "NeMo 25.02", "fp8"
    req = pmap.map_row(row, tmp_path).request
    assert (req.fp8_recipe, req.fp8_param_gather) == ("delayed", True)
    row["precision"] = "fp8 current-scaling"  # the row's own recipe wins
    assert pmap.map_row(row, tmp_path).request.fp8_recipe == "tensorwise"


def test_megatron_layer_level_cpu_offloading_is_not_the_fine_grained_offload():
    """Megatron-Core's cpu_offloading (cpu_offloading_num_layers layers' activations to the host: Megatron-Bridge
    perf_recipes/llama/gb200/llama3.py sets 40 of Llama-3-70B's 80) is not meshplan's activation_offload (its
    fine-grained offloading of every layer): the row is scored with it, and counted apart as not exactly expressed."""
    row = {"memory": {"recompute": "none; recipe enables activation CPU offloading (cpu_offloading=True)"}}
    recompute, fields, knobs = prow.recompute_for(row, "megatron-bridge")
    assert (recompute, fields) == ("none", {"activation_offload": True}) and "cpu_offloading" in knobs
    assert "memory" in prow.KNOBS["cpu_offloading"][0]
    fine = {"memory": {"recompute": "none; fine-grained activation offloading"}}
    assert prow.recompute_for(fine, "megatron-bridge") == ("none", {"activation_offload": True}, {})


def test_megatron_fsdp_unsharded_grad_buckets_take_the_main_grads_dtype():
    """Megatron-FSDP allocates a unit's unsharded main-grad bucket in fp32 only with grad_reduce_in_fp32 (else the
    param dtype): of the running unit's 6 B and its neighbour's 6 B per parameter, the 4 B buckets become 2 B."""
    from meshplan.api import estimate_memory
    from meshplan.arithmetic.memory_states import with_precision

    req = Request(model="llama-3-70b", gpu="gb200", num_gpus=64, gpus_per_node=4, framework="megatron-core",
                  tp=1, pp=1, zero_stage=3, seq_length=8192, micro_batch_size=1, global_batch_size=128)
    fp32 = with_precision(*resolve(req))[1]
    bf16 = with_precision(*resolve(req.model_copy(update={"grad_reduce_in_fp32": False})))[1]
    assert (fp32.gathered_bytes, fp32.prefetched_bytes, fp32.main_grad_bucket_bytes) == (6, 6, 4)
    assert (bf16.gathered_bytes, bf16.prefetched_bytes) == (4, 4)
    held = [estimate_memory(r).stages[0].detail["gathered_layers"]
            for r in (req, req.model_copy(update={"grad_reduce_in_fp32": False}))]
    assert held[1] == pytest.approx(held[0] * 4 / 6, rel=1e-6)


def _fsdp_fp8(gather: bool, gpu: str = "gb200", **extra):
    return Request(model="llama-3-70b", gpu=gpu, num_gpus=64, gpus_per_node=4 if gpu == "gb200" else 8,
                   framework="megatron-core", tp=1, pp=1, zero_stage=3, precision="fp8", fp8_recipe="tensorwise",
                   fp8_param_gather=gather, seq_length=8192, micro_batch_size=1, global_batch_size=128, **extra)


@pytest.mark.parametrize("gpu, shard_bytes, gathered", [("gb200", 1, 1), ("h100", 1, 2)])
def test_megatron_fsdp_fp8_primary_weights_are_the_sharded_parameters(gpu, shard_bytes, gathered):
    """Under Megatron-FSDP, fp8_param_gather makes each rank keep its shard of the fp8 parameter (row-wise data,
    1 B, in place of the bf16 shard's 2) and no unsharded fp8 copy: Transformer Engine caches no workspace of a
    quantized weight and Megatron-FSDP drops a unit's transpose with it. The gathered and prefetched units hold the
    GPU's fp8 weight (1 B on Blackwell, 2 with Hopper's transpose) in place of bf16's 2."""
    from meshplan.api import estimate_memory
    from meshplan.arithmetic.memory_states import with_precision

    conv = with_precision(*resolve(_fsdp_fp8(True, gpu)))[1]
    bf16_conv = with_precision(*resolve(_fsdp_fp8(False, gpu)))[1]
    assert conv.fp8_weights_sharded and not bf16_conv.fp8_weights_sharded
    assert conv.fp8_weight_bytes == shard_bytes - 2
    assert conv.gathered_bytes == bf16_conv.gathered_bytes - (2 - gathered)
    on, off = (estimate_memory(_fsdp_fp8(g, gpu)).stages[0] for g in (True, False))
    linear = off.detail["fp8_weight_copies"] / bf16_conv.fp8_weight_bytes  # every linear parameter, unsharded
    assert on.detail["fp8_weight_copies"] == pytest.approx((shard_bytes - 2) * linear / 64, abs=64)
    assert on.weights_bytes < off.weights_bytes - 0.9 * linear * bf16_conv.fp8_weight_bytes


def test_megatron_fsdp_bf16_weights_keep_transformer_engines_whole_fp8_cache():
    """Without fp8 primary weights the bf16 parameters stay and Transformer Engine caches each linear's fp8 weight
    whole (get_weight_workspace with cache_name 'weight'): one unsharded copy per linear parameter, as before."""
    from meshplan.arithmetic.memory_states import with_precision

    conv = with_precision(*resolve(_fsdp_fp8(False)))[1]
    assert (conv.fp8_weight_bytes, conv.fp8_weights_sharded) == (1, False)


def _summary_row(release: str, gpu_type: str) -> dict:
    return {"framework": f"{release} (NeMo 2.0, Megatron-Core)", "category": "pretrain",
            "hardware": {"gpu_type": gpu_type},
            "source": {"version_or_date": release, "citation": "NVIDIA NeMo Framework user guide, performance/"
                                                             "performance-summary.html"}}


@pytest.mark.parametrize(("release", "gpu_type", "fields"), [
    ("NeMo 25.07", "GB200-186GB (NVL72)", {"expandable_segments": True}),
    ("NeMo 25.07", "H100-80GB", {"expandable_segments": True}),
    ("NeMo 25.07", "B200-180GB", {"expandable_segments": False}),
    ("NeMo 25.04", "GB200-186GB (NVL72)", {})])
def test_nemo2507_performance_executor_sets_expandable_segments_but_on_b200(release, gpu_type, fields):
    """NeMo v2.4.0's performance executor (the 25.07 container's) sets expandable_segments:True on every GPU but
    B200; 25.04's sets none, so its rows keep the framework card's default. A row citing no performance summary
    gets nothing."""
    row = _summary_row(release, gpu_type)
    assert psrc.allocator_field(row, "megatron-core") == fields
    row["source"]["citation"] = "a blog post"
    assert psrc.allocator_field(row, "megatron-core") == {}
