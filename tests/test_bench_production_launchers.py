"""bench/production_configs.py: what the launcher a row cites sets for every run it makes reaches the request and the
estimate: Megatron-Bridge's performance tables reduce gradients in bf16 (perf_table_fields), verl's example scripts
pack micro-batches to a token budget of one row seq_length (dynamic_batch_fields), and a row that does not fit says
which terms of its worst stage put it over (over_note); a row gets the EP overlap and the full-iteration CUDA graph
its cited Megatron-Bridge perf recipe sets (recipe_moe: by the function it names, or by its recipe file plus GPU
count, system and precision), and nothing from a recipe it does not cite, but a run of Bridge's published table the
EP overlap its own release's launcher set (release_launcher_moe); a row's date and cited recipe give its
framework release, allocator setting and attention kernel (the facts: meshplan/knowledge/published_runs.py).

A test of the bench itself: it imports the bench's modules (production_rows, production_sources,
production_mapping, production_scoring)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.core.units import GIB
from meshplan.knowledge.adapter_knobs import shared_expert_overlap
from meshplan.knowledge.published_runs import bridge_perf_tp_overlap
from meshplan.request.resolve import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_rows as prow
import production_scoring as pscore
import production_sources as psrc

DATA = prow.DEFAULT_VALIDATION / prow.DATA_NAME
pytestmark = pytest.mark.shared_data(DATA)  # ../shared beside the checkout (conftest.py: fails without it)


def test_perf_table_rows_reduce_gradients_in_bf16(tmp_path, production_rows):
    perf = pmap.map_row(production_rows["mbridge_b200_gpt_oss_120b_64_bf16"], tmp_path)
    assert perf.request.grad_reduce_in_fp32 is False
    # a hardware recipe: bf16_mixed, fp32 grads
    recipe = pmap.map_row(production_rows["mbridge_recipe_glm45_air_32"], tmp_path)
    assert recipe.request.grad_reduce_in_fp32 is None
    table = {"source": {"citation": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md"}, "model": {}}
    assert psrc.perf_table_fields(table, "megatron-bridge") == {"grad_reduce_in_fp32": False,
                                                                 "cross_entropy_loss_fusion": True,
                                                                 "cross_entropy_fusion_impl": "te"}
    # the bf16 grad buffer is half the fp32 one on every stage (Megatron's main grads: 2 B/param, not 4)
    bf16 = api.estimate_memory(perf.request).stages[0].gradients_bytes
    fp32 = api.estimate_memory(perf.request.model_copy(update={"grad_reduce_in_fp32": None})).stages[0].gradients_bytes
    assert bf16 * 2 == fp32


def test_the_perf_tables_and_their_studies_fuse_the_qwen_activation(tmp_path, production_rows):
    """Bridge's perf recipes turn bias_activation_fusion on for Qwen3, whose provider leaves it off
    (published_runs.BRIDGE_PERF_ACTIVATION_FUSION); a study naming perf_recipes/qwen/h100/qwen3_moe.py ran it too
    (STUDY_RECIPES); a Bridge recipe row keeps its provider's off; Llama's provider fuses without being told."""
    assert pmap.map_row(production_rows["mbridge_h100_qwen3_30b_16_fp8_ep16"], tmp_path).request \
        .bias_activation_fusion is True
    assert pmap.map_row(production_rows["mbridge_card_qwen3_30b_16_h100_hybridep"], tmp_path).request \
        .bias_activation_fusion is True
    assert pmap.map_row(production_rows["mbridge_recipe_qwen3_235b_256"], tmp_path).request \
        .bias_activation_fusion is None
    assert pmap.map_row(production_rows["mbridge_h100_llama3_70b_64_fp8"], tmp_path).request \
        .bias_activation_fusion is None
    table = {"source": {"citation": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md"},
             "model": {"family": "qwen3_moe"}}
    assert psrc.perf_table_fields(table, "megatron-bridge")["bias_activation_fusion"] is True
    assert "bias_activation_fusion" not in psrc.perf_table_fields(table, "torchtitan")


def test_the_perf_tables_and_their_studies_run_transformer_engines_loss(tmp_path, production_rows):
    """Bridge's performance launchers set cross_entropy_fusion_impl te on every run beside the provider's fusion
    (published_runs.BRIDGE_PERF_CROSS_ENTROPY), as does the perf recipe a study names; scored on Megatron-Core (whose
    0.19 pretrain_gpt.py refuses te, rule PR009) the row keeps that framework's default loss; a hardware recipe row
    keeps its provider's."""
    for rid in ("mbridge_h100_llama3_70b_64_fp8", "mbridge_card_qwen3_30b_16_h100_hybridep"):
        request = pmap.map_row(production_rows[rid], tmp_path).request
        assert (request.cross_entropy_loss_fusion, request.cross_entropy_fusion_impl) == (True, "te")
    core = pmap.map_row(production_rows["mbridge_card_qwen3_30b_32_h100_deepep"], tmp_path).request
    assert core.framework == "megatron-core" and core.cross_entropy_fusion_impl is None
    recipe = pmap.map_row(production_rows["mbridge_recipe_glm45_air_32"], tmp_path).request
    assert recipe.cross_entropy_fusion_impl is None
    table = {"source": {"citation": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md"}, "model": {}}
    assert "cross_entropy_fusion_impl" not in psrc.perf_table_fields(table, "megatron-core")


def test_verl_dynamic_batch_is_one_budget_of_tokens(tmp_path, production_rows):
    for rid in ("verl_qwen3_235b_h20_32", "verl_dsv3_h20_96", "verl_qwen3_30b_h20_8"):
        row = production_rows[rid]
        m = pmap.map_row(row, tmp_path)
        assert row["workload"]["micro_batch_size"] == 2  # the script's ppo_micro_batch_size_per_gpu, unused
        assert m.request.micro_batch_size == 1 and m.request.seq_length == row["workload"]["seq_length"], rid
        assert "dynamic_batch" not in m.knobs, rid
    # a verl row that cites no dynamic-batch script, and a non-verl row, keep their micro-batch
    row = production_rows["verl_qwen3_235b_h20_32"]
    other = {**row, "source": {**row["source"], "citation": "volcengine/verl docs"}}
    assert psrc.dynamic_batch_fields(other, "verl") == {}
    assert psrc.dynamic_batch_fields(row, "megatron-core") == {}


def test_a_row_that_does_not_fit_says_why(tmp_path, production_rows):
    m = pmap.map_row(production_rows["mbridge_recipe_glm45_air_32"], tmp_path)
    score = pscore.score_row(production_rows["mbridge_recipe_glm45_air_32"], m)
    assert score.fits is False
    report = api.estimate_memory(m.request)
    stage = report.stages[report.peak_stage]
    over = (report.fit_bytes - m.capacity_bytes) / GIB  # the figure that decided (expandable segments: allocated)
    assert score.over.startswith(f"over by {over:.1f} GiB on stage {stage.stage} ({stage.layers} layers): ")
    assert f"optimizer {stage.optimizer_bytes / GIB:.1f}" in score.over
    row = production_rows["mbridge_b200_gpt_oss_120b_64_bf16"]
    fits = pscore.score_row(row, pmap.map_row(row, tmp_path))
    assert fits.fits and fits.over is None


def test_nemo_2407_rows_run_the_launchers_tp_overlap(tmp_path, production_rows):
    """NeMo 24.07's pretraining rows ran NeMo-Framework-Launcher's configs: userbuffers TP overlap where the config at
    that line sets ub_tp_comm_overlap (gpt3/20b, llama2_70b, ...), not for gpt3/175b, TP-1 configs or SFT/LoRA."""
    assert pmap.map_row(production_rows["nemo2407_h100_gpt3_20b_64gpu"], tmp_path).request.tp_comm_overlap is True
    assert pmap.map_row(production_rows["nemo2407_h100_llama3_70b_64gpu"], tmp_path).request.tp_comm_overlap is True
    assert not pmap.map_row(production_rows["nemo2407_h100_gpt3_175b_128gpu"], tmp_path).request.tp_comm_overlap
    assert not pmap.map_row(production_rows["nemo2407_h100_sft_llama2_70b_16gpu"], tmp_path).request.tp_comm_overlap
    assert psrc.nemo_2407_tp_overlap(production_rows["nemo2407_h100_gpt3_5b_64gpu"]) is None


def test_bridge_perf_table_llama_rows_run_the_perf_recipes_tp_overlap(tmp_path, production_rows):
    """Megatron-Bridge's performance tables ran its perf recipes: userbuffers TP overlap for the Llama 3 family at
    TP > 1 (published_runs.bridge_perf_tp_overlap, by the row's model family), not at TP 1, not for Qwen3-235B
    (its H100 recipe sets it False) or DeepSeek-V3, and not for a row citing another source."""
    assert pmap.map_row(production_rows["mbridge_h100_llama3_70b_64_fp8"], tmp_path).request.tp_comm_overlap is True
    assert not pmap.map_row(production_rows["mbridge_h100_llama3_8b_8_fp8_fsdp"], tmp_path).request.tp_comm_overlap
    assert not pmap.map_row(production_rows["mbridge_h100_qwen3_235b_256_fp8"], tmp_path).request.tp_comm_overlap
    table = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md"
    assert "perf_recipes/llama" in bridge_perf_tp_overlap(table, "llama3", 4)
    assert bridge_perf_tp_overlap(table, "llama3", 1) is None
    assert bridge_perf_tp_overlap(table, "deepseek_v3", 2) is None
    assert bridge_perf_tp_overlap("NVIDIA-NeMo/Megatron-Bridge recipes/llama", "llama3", 4) is None


def test_compile_counts_the_loss_only_from_the_card_s_loss_since():
    """A torchtitan row that states compile is scored compiled (blocks and loss) only when dated from its compile
    card's loss_since (pytorch/torchtitan bbb1b616e, 2025-04-02); before it, or dated by month only, the knob stays
    (blocks only, which the bool torch_compile cannot say); a framework whose compile card has no such date is
    scored compiled whatever the date."""
    from meshplan.knowledge.cards import framework_card

    assert framework_card("torchtitan").compile.loss_since == "2025-04-02"
    row = {"name": "some run", "outcome": {"other": None}, "source": {"version_or_date": "2025-06-13"}}
    knobs = {"torch_compile": "compile on"}
    assert psrc.compile_field(row, "torchtitan", dict(knobs)) == {"torch_compile": True}
    for when in ("2024-12-26", "2025-04"):
        older = {**row, "source": {"version_or_date": when}}
        kept = dict(knobs)
        assert psrc.compile_field(older, "torchtitan", kept) == {} and "torch_compile" in kept, when
    others = [n for n in ("kempnerforge", "nemo-automodel") if (c := framework_card(n).compile) and not c.loss_since]
    assert others
    for name in others:
        assert psrc.compile_field({**row, "source": {"version_or_date": "2024-12"}}, name, dict(knobs)) == {
            "torch_compile": True}, name


def test_a_measured_study_gets_the_optimizer_precision_of_the_recipe_it_ran(tmp_path, production_rows):
    # Bridge's Moonlight recompute study ran moonlight_16b_pretrain_8gpu_h100_bf16_config: bf16 Adam moments and
    # bf16 main grads (STUDY_RECIPES); the 8-GPU recipe row itself states no optimizer and keeps the defaults.
    study = pmap.map_row(production_rows["mbridge_card_moonlight_8_norecompute"], tmp_path)
    assert (study.request.optimizer_state_dtype, study.request.grad_reduce_in_fp32) == ("bf16", False)
    # and its shared experts overlapped with the dispatch (cfg.model.moe_shared_expert_overlap = True): every MoE
    # layer keeps the layer input its shared experts gather over SP (26 MoE layers x 4,096 tokens x 2,048 x 2 B)
    assert study.request.moe_shared_expert_overlap is True
    unlapped = study.request.model_copy(update={"moe_shared_expert_overlap": False})  # (left out: on, by default)
    added = (api.estimate_memory(study.request).stages[0].detail["layer_activations"]
             - api.estimate_memory(unlapped).stages[0].detail["layer_activations"])
    assert added == 26 * 4096 * 2048 * 2
    assert psrc.study_recipe_fields({"source": {"citation": "some other card", "location": "Moonlight"}},
                                    "megatron-bridge") == {}
    default = study.request.model_copy(update={"optimizer_state_dtype": None, "grad_reduce_in_fp32": None})
    low, high = api.estimate_memory(study.request), api.estimate_memory(default)
    # expert-dp is 1 (EP8 on 8 GPUs): every expert's moments and grads sit whole on each GPU, so the recipe's bf16
    # moments (8 -> 4 B) take a third off the optimizer; its fp32 master stays 4 B, Megatron's own shard: Bridge hands
    # the mixed-precision config's "tensorwise" to the OptimizerConfig (cards/frameworks/megatron-bridge.yaml
    # fp8_recipe_reaches_optimizer), not FusedAdam's 16-bit remainders
    assert low.stages[0].optimizer_bytes * 3 == pytest.approx(high.stages[0].optimizer_bytes * 2, rel=1e-9)
    assert low.stages[0].gradients_bytes * 2 == high.stages[0].gradients_bytes


def test_named_recipe_sets_the_overlap(production_rows, tmp_path):
    row = production_rows["mbridge_b200_dsv3_256_mxfp8"]  # cites deepseek_v3_pretrain_256gpu_b200_fp8mx_config
    knobs, notes = psrc.recipe_moe(row)
    assert set(knobs) == {"moe_a2a_overlap"} and notes
    mapping = pmap.map_row(row, tmp_path)
    assert mapping.request.moe_a2a_overlap is True
    assert "moe_a2a_overlap" not in mapping.knobs  # a plan knob, passed, not recorded as inexpressible


def test_recipe_file_and_row_name_the_function(production_rows):
    row = production_rows["mbridge_gb200_qwen3_30b_8_mxfp8"]  # cites perf_recipes/qwen/gb200/qwen3_moe.py only
    knobs, _ = psrc.recipe_moe(row)
    assert set(knobs) == {"moe_a2a_overlap", "cuda_graphs"}
    assert "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config" in knobs["cuda_graphs"]


def test_uncited_or_unset_recipe_sets_nothing(production_rows):
    assert psrc.recipe_moe(production_rows["mbridge_b200_qwen3_235b_256_mxfp8"]) == ({}, [])  # names no function
    assert psrc.recipe_moe(production_rows["mbridge_h100_dsv3_1024_fp8"]) == ({}, [])  # its recipe leaves overlap off
    other = dict(production_rows["mbridge_b200_dsv3_256_mxfp8"], source={"citation": "some other source"})
    assert psrc.recipe_moe(other) == ({}, [])


def test_a_published_table_run_gets_the_overlap_its_release_launched(production_rows, tmp_path):
    # The 25.09 H100 DeepSeek-V3 run is a row of Bridge's published table, whose release's launcher (v0.1.0rc4
    # scripts/performance/run_script.py: A2A_1F1B on H100) overlapped the EP all-to-all; the perf recipe the row
    # cites for its layout (Bridge 067f987) leaves it off, and is not the code that ran.
    row = production_rows["mbridge_h100_dsv3_1024_fp8"]
    table = psrc.bridge_table_row(row, "deepseek-v3")
    assert table is not None and (table["release"], table["system"], table["moe_a2a_overlap"]) == ("25.09", "h100", "1")
    assert set(psrc.release_launcher_moe(row, "deepseek-v3", {})) == {"moe_a2a_overlap"}
    assert pmap.map_row(row, tmp_path).request.moe_a2a_overlap is True
    # a table run whose release left it off drops what a newer recipe sets; a release the table does not print
    # (26.02.01 is not 26.02), another layout or a row from elsewhere is not a table run and keeps its knobs
    off = production_rows["mbridge_gb200_qwen3_235b_256_bf16"]
    assert psrc.bridge_table_row(off, "qwen3-235b-a22b")["moe_a2a_overlap"] == "0"
    assert psrc.release_launcher_moe(off, "qwen3-235b-a22b", {"moe_a2a_overlap": "recipe"}) == {}
    later = production_rows["mbridge_h100_qwen3_30b_16_fp8_pp2vp12"]
    assert psrc.bridge_table_row(later, "qwen3-30b-a3b") is None
    relaid = dict(row, parallelism={**row["parallelism"], "vpp": 2})
    assert psrc.bridge_table_row(relaid, "deepseek-v3") is None
    elsewhere = dict(row, source={"citation": "elsewhere"})
    assert psrc.release_launcher_moe(elsewhere, "deepseek-v3", {"x": "y"}) == {"x": "y"}


def test_verl_rows_before_the_workers_set_expandable_segments():
    row = {"source": {"version_or_date": "2025-08"}}
    assert psrc.allocator_field(row, "verl") == {"expandable_segments": False}
    assert psrc.allocator_field({"source": {"version_or_date": None}}, "verl") == {"expandable_segments": False}
    assert psrc.allocator_field({"source": {"version_or_date": "2025-09"}}, "verl") == {}
    assert psrc.allocator_field({**row, "source": {**row["source"], "citation": "x", "location": "y"}},
                                "megatron-bridge") == {}
    fsdp = {"source": {"version_or_date": "NeMo container 26.04.01", "location": "",
                       "citation": "perf_recipes/llama/gb200/llama3.py (llama3_70b_pretrain_64gpu_gb200_fp8cs_config)"}}
    assert psrc.allocator_field(fsdp, "megatron-bridge") == {"expandable_segments": False}


@pytest.mark.parametrize("when,version", [("2025-08", "0.5.0"), ("2025-09-23", "0.5.0"), ("2025-09-24", None),
                                          ("2025-10", None), (None, None)])
def test_each_verl_row_gets_its_release(when, version):
    assert psrc.framework_version_for({"source": {"version_or_date": when}}, "verl") == version


def test_llm_foundry_benchmark_rows_ran_triton():
    foundry = {"source": {"citation": "mosaicml/llm-foundry scripts/train/benchmarking/README.md"}}
    titan = {"source": {"citation": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"}}
    assert psrc.run_attention_kernel(foundry) == "triton_flash_attn"
    assert psrc.run_attention_kernel(titan) is None


@pytest.mark.parametrize(("container", "fields", "knob"), [
    ("25.02", {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "native"}, False),
    ("25.04", {}, True),
    ("25.07", {}, True),
])
def test_nemo2_performance_rows_run_their_releases_loss(container, fields, knob):
    """NeMo 2.0's GPTConfig turns the fusion on, and from 25.04 its performance scripts set Transformer Engine's
    implementation, on Megatron-Core 0.12 / 0.13: no request can name those (older than the card's oldest_release),
    and the card's own 0.19.2 refuses te (PR009), so those rows record te_cross_entropy and keep the default loss."""
    row = {"framework": f"NeMo {container} (NeMo 2.0, Megatron-Core)",
           "source": {"citation": "NVIDIA NeMo Framework user guide, performance/performance_summary.html",
                      "version_or_date": f"NeMo {container}"}}
    got, knobs = psrc.nemo2_loss_fields(row, "megatron-core")
    assert got == fields and ("te_cross_entropy" in knobs) is knob
    assert "te_cross_entropy" in prow.KNOBS
    mlperf = row | {"source": {"citation": "mlcommons/training_results_v5.0", "version_or_date": f"NeMo {container}"}}
    assert psrc.nemo2_loss_fields(mlperf, "megatron-core") == ({}, {})
    assert psrc.nemo2_loss_fields(row, "megatron-bridge") == ({}, {})
    hyphen = row | {"source": row["source"] | {"citation": "performance/performance-summary.html"}}
    assert psrc.nemo2_loss_fields(hyphen, "megatron-core") == (got, knobs)


@pytest.mark.parametrize("rid", ["mbridge_gb300_kimi_k2_256_mxfp8", "mbridge_b300_dsv3_256_mxfp8"])
def test_a_table_row_stating_no_dispatcher_runs_its_releases_preset(tmp_path, production_rows, rid):
    """Megatron-Bridge's 26.06 table rows of Kimi-K2 on GB300 and DeepSeek-V3 on B300 state no dispatcher; the
    release's presets (v0.5.0 scripts/performance/configs/{kimi,deepseek}/*_workload_base_configs.py) set flex HybridEP
    with moe_a2a_overlap False, and Bridge's flex setup turns the shared-expert overlap off, so the plan runs neither
    overlap (before: the alltoall dispatcher with the provider's shared-expert overlap)."""
    m = pmap.map_row(production_rows[rid], tmp_path)
    req = m.request
    assert (req.moe_token_dispatcher, req.moe_flex_backend, req.moe_a2a_overlap) == ("flex", "hybridep", None)
    job, plan = resolve(req)
    assert not shared_expert_overlap(job, plan) and not plan.moe_a2a_overlap
    assert any("its release's preset" in note for note in m.notes)
    row = production_rows[rid]
    stated = dict(row, parallelism={**row["parallelism"], "moe_dispatcher": "alltoall"})
    assert psrc.release_preset_dispatch(stated, "kimi-k2") == ({}, [])  # a row's own dispatcher stands
    elsewhere = dict(row, source={**row["source"], "version_or_date": "NeMo 26.08"})
    assert psrc.release_preset_dispatch(elsewhere, "kimi-k2") == ({}, [])  # no preset recorded for that release
