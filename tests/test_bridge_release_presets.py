"""What a Megatron-Bridge release's performance configs set for the runs of its published table whose rows state it
not (published_runs.BRIDGE_PERF_PRESET_SPLIT, BRIDGE_PERF_PRESET_DISPATCH, BRIDGE_PERF_PRESET_OFFLOAD), as the bench
reads them (bench/bridge_published.preset_split_fields; bench/production_sources.release_preset_split /
release_preset_dispatch / release_preset_offload)
and as a user asking for the same layout gets it answered.

A test of the bench too: it imports the bench's modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.arithmetic.schedule import layout_problem, parse_layout
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import catalog_architecture
from meshplan.knowledge.published_runs import (
    BRIDGE_PERF_PRESET_RECOMPUTE,
    BRIDGE_PERF_PRESET_SPLIT,
    bridge_perf_preset_dispatch,
    bridge_perf_preset_offload,
    bridge_perf_preset_split,
    bridge_precision,
)
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bridge_published as bp
import production_mapping as pmap
import production_sources as psrc

DSV3_2511 = "Et*3|(t*4|)*14ttL"  # gaod/r0.2.0_test deepseek_v3_gb200_config / deepseek_v3_gb300_config


def _dsv3(**fields) -> Request:
    return Request(**{"model": "deepseek-v3", "gpu": "gb200", "num_gpus": 256, "framework": "megatron-bridge",
                      "tp": 1, "ep": 32, "seq_length": 4096, "global_batch_size": 4096, "micro_batch_size": 1,
                      "precision": "fp8", "fp8_recipe": "mxfp8", **fields})


def test_the_2511_deepseek_configs_pass_a_16_stage_layout_without_mtp():
    """Both 25.11 configs pass the same layout with MTP off; its 16 stages hold all 61 decoder layers, the embedding
    first and the loss last, and it passes Megatron-Core's validation at every pp it divides (vpp = 16 / pp)."""
    assert {k: (v.layout, v.mtp_num_layers) for k, v in BRIDGE_PERF_PRESET_SPLIT.items()} == {
        ("25.11", "gb200", "deepseek-v3"): (DSV3_2511, 0), ("25.11", "gb300", "deepseek-v3"): (DSV3_2511, 0)}
    stages = parse_layout(DSV3_2511)
    assert len(stages) == 16 and [s.count("t") for s in stages] == [3] + [4] * 14 + [2]
    assert stages[0].startswith("E") and stages[-1].endswith("L") and "m" not in "".join(stages)
    layers = catalog_architecture("deepseek-v3").num_layers
    for pp, vpp in ((4, 4), (8, 2), (2, 8)):
        assert not layout_problem(stages, pp, vpp, layers, 0), (pp, vpp)
    assert layout_problem(stages, 8, 4, layers, 0)  # 32 virtual stages: not this layout
    assert bridge_perf_preset_split("25.11", "gb200", "deepseek-v3").fields() == {
        "pipeline_layout": DSV3_2511, "mtp_num_layers": 0}
    assert bridge_perf_preset_split("26.02", "gb200", "deepseek-v3") is None
    assert bridge_perf_preset_split("25.11", "b200", "deepseek-v3") is None


def test_a_user_asking_for_that_layout_gets_its_virtual_stages():
    """pp=8 with the release's layout: vpp is the layout's (2), as Megatron-Core derives it, and the estimate runs;
    vpp=4 beside it is refused naming the degrees the layout holds (Megatron-Core's TransformerConfig refuses it)."""
    job, plan = resolve(_dsv3(pp=8, mtp_num_layers=0, pipeline_layout=DSV3_2511))
    assert (plan.pp, plan.vpp, job.model.num_mtp_layers) == (8, 2, 0)
    assert api.estimate_throughput(_dsv3(pp=8, mtp_num_layers=0, pipeline_layout=DSV3_2511)).tokens_per_s_per_gpu > 0
    with pytest.raises(MeshplanError, match=r"pp=8 vpp=2") as refused:
        resolve(_dsv3(pp=8, vpp=4, mtp_num_layers=0, pipeline_layout=DSV3_2511))
    assert "16 stages" in str(refused.value)


def test_the_deepseek_pp8_vp4_fix_names_a_layout():
    """61 layers split evenly over no pp but 1, so PP001's rule words name pp=1; check's fix also names the split
    recommend ranks first at pp=8 vpp=4, a pipeline layout (32 virtual stages of 61 layers: only a layout says it)."""
    report = api.check_config(_dsv3(pp=8, vpp=4, mtp_num_layers=0))
    pp001 = next(f for f in report.findings if f.id == "PP001")
    assert "pp in {1}" in pp001.fix and 'pipeline_layout="' in pp001.fix
    layout = pp001.fix.split('pipeline_layout="')[1].split('"')[0]
    assert len(parse_layout(layout)) == 32 and "m" not in layout


@pytest.mark.parametrize(("system", "precision", "vp", "pp"), [
    ("gb200", "mxfp8", "4", "8"), ("gb300", "bf16", "4", "2"), ("gb200", "bf16", "4", "4")])
def test_the_bench_reads_the_2511_rows_with_their_releases_layout(system, precision, vp, pp):
    """The table's 25.11 GB200 / GB300 DeepSeek-V3 rows (MTP column 0) take the release's layout and MTP depth, vpp
    left to the layout; a row of another release, or with MTP, takes none."""
    row = {"release": "25.11", "system": system, "model": "deepseek-v3", "mtp": "0", "precision": precision,
           "pp": pp, "vp": vp}
    assert bp.preset_split_fields(row) == {"pipeline_layout": DSV3_2511, "mtp_num_layers": 0, "vpp": None}
    assert bp.preset_split_fields({**row, "release": "26.02"}) == {}
    assert bp.preset_split_fields({**row, "mtp": "1"}) == {}
    scored = {(r["system"], r["precision"], r["pp"]): plan for r, _, plan in bp.cases()
              if r["release"] == "25.11" and r["model"] == "deepseek-v3"}
    plan = scored[(system, precision, pp)]
    assert (plan.pipeline_layout, plan.pp * plan.vpp) == (DSV3_2511, 16)


def test_the_dev_row_of_that_run_takes_the_same_layout(tmp_path, production_rows):
    """The dev set's 25.11 GB200 BF16 DeepSeek-V3 row (the table's 'w/o MTP' run) maps to the release's layout with
    MTP off, not the recipes' MTP depth and helper row; a row that states its own layout keeps it."""
    row = production_rows["mbridge_gb200_dsv3_256_bf16"]
    m = pmap.map_row(row, tmp_path)
    assert (m.request.pipeline_layout, m.request.mtp_num_layers) == (DSV3_2511, 0)
    assert any("gaod/r0.2.0_test" in note for note in m.notes)
    stated = dict(row, parallelism={**row["parallelism"], "pp_layout": "Et*4|(t*4|)*14tL"})
    assert psrc.release_preset_split(stated, "deepseek-v3") == ({}, [])
    later = dict(row, source={**row["source"], "version_or_date": "NeMo container 26.08"})
    assert psrc.release_preset_split(later, "deepseek-v3") == ({}, [])


def test_qwen3_235b_table_rows_stating_no_dispatcher_run_their_releases_preset(tmp_path, production_rows):
    """26.08's GB300 row: v0.6.0's perf recipe sets flex HybridEP with the EP all-to-all overlap; 26.04.01's B200 row:
    v0.4.2's preset sets no backend and its config builder the alltoall dispatcher, overlap off."""
    gb300 = pmap.map_row(production_rows["mbridge_gb300_qwen3_235b_256_mxfp8"], tmp_path).request
    assert (gb300.moe_token_dispatcher, gb300.moe_flex_backend, gb300.moe_a2a_overlap) == ("flex", "hybridep", True)
    b200 = pmap.map_row(production_rows["mbridge_b200_qwen3_235b_256_mxfp8"], tmp_path)
    assert (b200.request.moe_token_dispatcher, b200.request.moe_flex_backend) == ("alltoall", None)
    assert not b200.request.moe_a2a_overlap and any("alltoall dispatcher" in n for n in b200.notes)
    assert bridge_perf_preset_dispatch("26.04.01", "b200", "qwen3-235b-a22b").dispatcher == "alltoall"
    assert bridge_perf_preset_dispatch("26.04", "b200", "qwen3-235b-a22b") is None  # 26.04.01 is its own release


def test_the_2511_b200_gpt_oss_row_is_read_at_its_releases_ep():
    """25.11 B200 GPT-OSS-120B prints EP 8; its release's preset sets 64 (v0.2.0 GPT_OSS_120B_B200_BF16_BASE_CONFIG)
    and the later tables' EP 8 runs of the same system go 1.6-1.7x its rate (bench/bridge_published.py): the bench
    scores it at EP 64, so each rank holds 2 of the 128 experts and no expert gradient crosses a node. The printed GA
    (GBS / (MBS x DP) = 2) holds at either EP, which is why the row's own columns cannot tell."""
    found = [(r, job, plan) for r, job, plan in bp.cases()
             if (r["release"], r["system"], r["model"]) == ("25.11", "b200", "gpt-oss-120b")]
    assert len(found) == 1
    row, job, plan = found[0]
    assert (plan.ep, plan.dp) == (64, 64)
    assert job.model.moe.num_experts // plan.ep == 2
    assert int(row["gbs"]) // (plan.micro_batch_size * plan.dp) == 2


def test_the_bench_reads_each_rows_recompute_from_its_releases_preset():
    """Every BRIDGE_PERF_PRESET_RECOMPUTE entry is a run of the table, scored with the preset's recompute: 26.02's
    GB200 / B200 / H100 GPT-OSS-120B presets recompute layernorm and moe_act (v0.3.0's overrides set 'selective'),
    the 25.11 ones set the same modules without the granularity (none ran), GB300 / B300 set none; 25.11's H100
    Llama 3 8B FP8 recomputes 5 whole layers per stage. A recompute the estimate prices takes time."""
    from meshplan.estimate.perf import estimate_throughput

    scored = {(r["release"], r["system"], r["model"], r["precision"]): (job, plan) for r, job, plan in bp.cases()}
    keys = {k[:3] for k in scored}
    assert set(BRIDGE_PERF_PRESET_RECOMPUTE) <= keys
    job, plan = scored[("26.02", "gb200", "gpt-oss-120b", "bf16")]
    assert (plan.recompute, list(plan.recompute_modules)) == ("selective", ["layernorm", "moe_act"])
    for release, system in (("25.11", "gb200"), ("26.02", "gb300"), ("26.02", "b300")):
        assert scored[(release, system, "gpt-oss-120b", "bf16")][1].recompute == "none"
    llama = scored[("25.11", "h100", "llama-3.1-8b", "fp8")][1]
    assert (llama.recompute, llama.recompute_method, llama.recompute_layers) == ("full", "block", 5)
    plain = plan.model_copy(update={"recompute": "none", "recompute_modules": None})
    assert estimate_throughput(job, plan).step_time_s > estimate_throughput(job, plain).step_time_s


def test_the_llama_fsdp_presets_offload_their_stated_layers():
    """Megatron-Bridge's Megatron-FSDP presets for Llama 3 70B set cpu_offloading_num_layers per system and precision
    (v0.2.0 to v0.6.0 alike), Llama 3.1 405B's to v0.5.0; the count is the preset's at its tp only, and a preset with
    no offload (FP8_MX, a TP/PP layout) or a release not read gives none."""
    assert bridge_perf_preset_offload("26.04.01", "gb200", "llama-3-70b", "fp8cs", 1).layers == 40
    assert bridge_perf_preset_offload("25.11", "gb200", "llama-3-70b", "bf16", 1).layers == 20
    assert bridge_perf_preset_offload("26.08", "gb300", "llama-3-70b", "bf16", 1).layers == 30
    assert bridge_perf_preset_offload("26.02", "b200", "llama-3-70b", "fp8cs", 1).layers == 5
    assert bridge_perf_preset_offload("26.06", "gb200", "llama-3.1-405b", "fp8cs", 2).layers == 92
    assert bridge_perf_preset_offload("26.08", "gb200", "llama-3.1-405b", "fp8cs", 2) is None  # v0.6.0 changed it
    assert bridge_perf_preset_offload("26.04.01", "gb200", "llama-3-70b", "fp8mx", 1) is None
    assert bridge_perf_preset_offload("26.04.01", "gb200", "llama-3-70b", "fp8cs", 2) is None
    assert bridge_perf_preset_offload("26.04", "gb200", "llama-3-70b", "fp8cs", 1) is None  # 26.04.01 is its own
    assert bridge_perf_preset_offload("26.04.01", "h100", "llama-3-70b", "fp8cs", 1) is None


@pytest.mark.parametrize(("precision", "recipe", "name"), [
    ("bf16", None, "bf16"), ("fp8", "tensorwise", "fp8cs"), ("fp8", "mxfp8", "fp8mx"), ("fp8", "blockwise", None),
    ("fp8", "delayed", None)])
def test_bridge_names_a_precision_as_its_presets_do(precision, recipe, name):
    """FP8_CS is Transformer Engine's current (tensorwise) scaling; a recipe the presets do not name has no preset."""
    assert bridge_precision(precision, recipe) == name


def test_the_gb200_llama3_70b_fsdp_row_offloads_its_presets_40_layers(tmp_path, production_rows):
    """The dev row states cpu_offloading without its count: it maps to the 26.04.01 preset's (v0.4.2
    LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2) 40 layers of Megatron-Core's layer-wise offload, not the fine-grained
    offload of every layer, and is no longer a row with an inexpressible knob. The estimate keeps 40 of the 80 layers'
    saved tensors on the GPU and sends the other 40 to the host; check holds the plan to OF003 without an error."""
    row = production_rows["mbridge_gb200_llama3_70b_64_fp8_fsdp"]
    m = pmap.map_row(row, tmp_path)
    assert m.request.activation_offload_layers == 40 and not m.request.activation_offload
    assert "cpu_offloading" not in m.knobs and any("cpu_offloading_num_layers 40" in n for n in m.notes)
    assert not [f.id for f in api.check_config(m.request).findings if f.id.startswith("OF")]
    stage = api.estimate_memory(m.request).stages[0]
    layers = stage.detail["layer_activations"]
    assert stage.detail["offloaded_layers"] == 40
    assert stage.detail["host_activations"] == pytest.approx(layers / 2, rel=1e-6)
    stated = dict(row, memory={**row["memory"], "offload": "cpu_offloading_num_layers 20"})
    assert pmap.map_row(stated, tmp_path).request.activation_offload_layers == 20  # the row's own count wins
    other = dict(row, source={**row["source"], "version_or_date": "NeMo container 26.04"})
    assert psrc.release_preset_offload(other, "llama-3-70b", {"precision": "fp8", "fp8_recipe": "tensorwise",
                                                              "zero_stage": 3, "tp": 1}) == ({}, [])
    assert psrc.release_preset_offload(row, "llama-3-70b", {"precision": "fp8", "fp8_recipe": "tensorwise",
                                                            "zero_stage": 1, "tp": 1}) == ({}, [])
