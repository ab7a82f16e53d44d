"""bench/production_configs.py: every published configuration either becomes a request or is counted with
its reason (no silent drops), the mapping rules read the rows as documented, and the summary adds up.

A test of the bench itself: it imports the bench's modules (production_rows, production_sources,
production_mapping, production_scoring)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.arithmetic.flops import model_flops_per_token, noncausal_flops_per_token
from meshplan.arithmetic.memory_states import memory_card
from meshplan.arithmetic.schedule import layout_problem, parse_layout
from meshplan.core.units import GIB
from meshplan.knowledge.catalog import catalog_architecture, resolve_model
from meshplan.knowledge.published_runs import RECIPE_SPLITS
from meshplan.request.resolve import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_configs as pconf
import production_mapping as pmap
import production_rows as prow
import production_scoring as pscore
import production_sources as psrc

DATA = prow.DEFAULT_VALIDATION / prow.DATA_NAME
pytestmark = pytest.mark.shared_data(DATA)  # ../shared beside the checkout (conftest.py: fails without it)


@pytest.fixture(scope="module")
def run():
    return pscore.run(prow.DEFAULT_VALIDATION)


def test_every_row_maps_or_says_why(run):
    rows, scores, summary = run
    assert [s.mapping.row_id for s in scores] == [r["id"] for r in rows]
    for s in scores:
        m = s.mapping
        assert (m.request is None) == (m.unmapped is not None), m.row_id
        if m.request is None:
            assert m.unmapped.strip(), m.row_id
        else:
            assert m.capacity_bytes and m.capacity_bytes > 0, m.row_id
            assert set(m.knobs) <= set(prow.KNOBS), m.row_id
            assert all(v for v in m.knobs.values()), m.row_id
    assert summary.mapped + len(summary.unmapped) == summary.total == len(rows)
    assert summary.mapped >= 0.9 * summary.total  # the file is built for this: only a handful may not map


def test_summary_adds_up(run):
    rows, scores, s = run
    mapped = [x for x in scores if x.mapping.request is not None]
    assert 0 <= s.exact <= s.mapped
    # fit verdicts: every stated, mapped row is exactly one of fits / does not fit / refused
    for v in s.fit.values():
        assert v.fit + v.not_fit + v.refused == v.rows
    assert s.fit["exact"].rows + s.fit["nearest"].rows == s.fit["all"].rows
    assert s.fit["all"].rows == sum(x.mapping.stated_memory for x in mapped) <= s.stated
    assert s.stated == sum(map(prow.stated_memory_settings, rows))
    # rows that ran: the stated rows less the recipes that publish no measurement, each named
    assert s.fit["ran"].rows + len(s.recommendations) == s.fit["all"].rows
    by_id = {r["id"]: prow.read_row(r)[0] for r in rows}
    assert all(not prow.ran(by_id[i]) for i in s.recommendations)
    figures = pconf.figures(s)
    assert figures["fit_ran"] == {"n": s.fit["ran"].fit, "N": s.fit["ran"].rows, "left_out": s.recommendations}
    assert figures["fit"] == {"n": s.fit["all"].fit, "N": s.fit["all"].rows}  # the existing key, unchanged
    # a row predicted not to fit says which peak decided, and on the reserved basis where the allocated one stands
    for x in mapped:
        if x.fits is False:
            assert "allocated peak decides" in x.over or "reserved peak decides" in x.over, x.mapping.row_id
            assert "reserved peak decides" not in x.over or "the allocated " in x.over, x.mapping.row_id
    # rule errors: each id is counted once per row that has it
    assert s.rule_error_rows["exact"] <= s.rule_error_rows["all"] <= s.mapped
    assert all(0 < n <= s.rule_error_rows["all"] for n in s.rule_error_ids.values())
    assert sum(s.rule_error_ids.values()) >= s.rule_error_rows["all"]
    assert not any(i.startswith("MEM") for i in s.rule_error_ids)
    # peaks: compared rows are mapped rows with a measured peak and an estimate
    assert s.peaks["exact"].rows <= s.peaks["all"].rows <= s.measured_peaks
    assert s.peaks["all"].rows == sum(x.measured_peak_bytes is not None and x.peak_bytes is not None for x in mapped)
    # throughput: the three groups partition the compared rows; skipped rows carry a reason
    t = s.throughput
    assert t["dense"].rows + t["MoE"].rows + t["FSDP"].rows == t["all"].rows
    assert t["exact"].rows <= t["all"].rows
    assert all(x.tps_error is None for x in mapped if x.mapping.row_id in s.throughput_skipped)
    # knobs: a mapped row's knobs are counted in both columns
    assert all(s.knob_rows_mapped.get(k, 0) <= n for k, n in s.knob_rows.items())
    assert sum(s.knob_rows_mapped.values()) == sum(len(x.mapping.knobs) for x in mapped)
    assert s.exact == sum(not x.mapping.knobs for x in mapped)


def test_a_recipe_without_a_measurement_is_not_a_row_that_ran(tmp_path, production_rows):
    """production_rows.ran reads the row's own outcome and source kind, whatever the row: a recipe that reports
    nothing measured is a recommendation; any measured figure, or a source that is no recipe, makes it a run."""
    template = copy.deepcopy(next(iter(production_rows.values())))
    template["source"]["kind"] = "some_vendor_recipe"
    template["outcome"] = {k: None for k in prow.MEASURES["outcome"]} | {"other": "recommended; 11 layers each"}
    assert not prow.ran(prow.read_row(template)[0])
    for key in prow.MEASURES["outcome"]:  # any one measured figure
        measured = copy.deepcopy(template)
        measured["outcome"][key] = "42 (as text)"
        assert prow.ran(prow.read_row(measured)[0]), key
    for kind in ("blog_post", None):  # a source that is no recipe (or states no kind) is taken as a run
        other = copy.deepcopy(template)
        other["source"]["kind"] = kind
        assert prow.ran(prow.read_row(other)[0]), kind
    del template["source"]["kind"]
    assert prow.ran(prow.read_row(template)[0])
    with_mapping = pmap.map_row(copy.deepcopy(template) | {"source": dict(template["source"], kind="recipe")},
                                tmp_path)
    assert with_mapping.ran is False


def test_catalog_match_by_architecture(production_rows):
    # Llama 3 and 3.1 8B have one architecture: the row's model id tells them apart
    assert prow.catalog_match(production_rows["nemo2407_h100_llama3_8b_8gpu"]["model"]) == "llama-3-8b"
    # no name resolves for meta-llama/Llama-2-7b; the architecture does
    assert prow.catalog_match(production_rows["nemo2407_h100_llama2_7b_8gpu"]["model"]) == "llama-2-7b"
    # GPT-3 175B with an unstated vocabulary is the catalog's; with Megatron's 131072 vocabulary it is not
    assert prow.catalog_match(production_rows["nemo2407_h100_gpt3_175b_128gpu"]["model"]) == "gpt3-175b"
    assert prow.catalog_match(production_rows["mcore_h100_weak_177b"]["model"]) is None
    assert prow.catalog_match(production_rows["mbridge_recipe_kimi_k2_512"]["model"]) == "kimi-k2"


def test_the_qwen3_next_row_is_scored_as_the_catalog_model_at_its_layout(production_rows, tmp_path):
    """Megatron-Bridge's MoE perf card's Qwen3-Next row (48 decoder layers, 512 experts, TP1 PP2 VPP4 EP32) was scored
    as a glm4_moe stand-in (a nearest model_type, knob model_type): the row counts decoder layers, the catalog's pattern
    two layers each, so it matched nothing. It is the catalog's qwen3-next-80b-a3b now, at vpp 4, with no knob, and
    checks clean on megatron-core's GPTModel path."""
    row = production_rows["mbridge_card_qwen3_next_80b_gb200_64"]
    assert prow.catalog_match(row["model"]) == "qwen3-next-80b-a3b"
    mapping = pmap.map_row(row, tmp_path)
    req = mapping.request
    assert mapping.knobs == {} and (req.model, req.framework, req.pp, req.vpp, req.ep) == (
        "qwen3-next-80b-a3b", "megatron-core", 2, 4, 32)
    assert not [f for f in api.check_config(req).findings if f.severity == "error"]


@pytest.mark.parametrize(("row_id", "backend"), [
    ("mbridge_card_qwen3_30b_16_h100_hybridep", "hybridep"),  # 'flex/HybridEP (32 SMs)' on H100, not the machine's
    ("mbridge_b200_qwen3_30b_8_mxfp8", "hybridep"),  # 'flex/HybridEP' on B200
    ("mbridge_card_qwen3_30b_32_h100_deepep", "deepep"),  # 'flex/DeepEP'
    ("mbridge_h100_qwen3_235b_256_fp8", None),  # an alltoall row: no backend read
])
def test_a_row_that_states_its_flex_backend_runs_it(production_rows, tmp_path, row_id, backend):
    """A row's moe_dispatcher text names the backend its run chose (flex57): it is the request's moe_flex_backend,
    which the estimate times (before, every flex row took the machine's backend: DeepEP on H100 and B200)."""
    row = production_rows[row_id]
    assert prow.flex_backend_for(row) == backend
    assert pmap.map_row(row, tmp_path).request.moe_flex_backend == backend


def test_built_config_and_mtp(tmp_path, production_rows):
    model, source, notes, knobs = prow.model_for(production_rows["nemo2407_h100_gpt3_5b_64gpu"], tmp_path)
    assert source == "config.json (gpt2)" and Path(model).is_file()
    assert notes == ["vocab_size not stated: 50257 from catalog gpt3-175b"] and knobs == {}
    model, source, _, knobs = prow.model_for(production_rows["llmfoundry_mpt_7b_8_h100_2k"], tmp_path)
    assert "model_type" in knobs
    # verl's DeepSeek-V3 RL rows run without the MTP block: the catalog config with it off
    model, source, _, _ = prow.model_for(production_rows["verl_dsv3_h20_96"], tmp_path)
    assert source == "catalog deepseek-v3 config, MTP off"
    assert resolve_model(model).num_mtp_layers == 0


def test_recompute_reading(tmp_path, production_rows):
    # Megatron's "full, uniform, 1 layer" is recompute_method=uniform with 1 layer per chunk: every layer
    req = pmap.map_row(production_rows["verl_dsv3_h20_256"], tmp_path).request
    assert (req.recompute, req.recompute_method, req.recompute_layers) == ("full", "uniform", 1)
    assert prow.recompute_for(production_rows["mbridge_recipe_olmoe_7b_8"], "megatron-bridge") == ("selective", {}, {})
    # the modules the row lists are recompute_modules (its default core_attn left out, as Megatron does)
    assert prow.recompute_for(production_rows["mbridge_h100_dsv3_1024_fp8"], "megatron-bridge") == (
        "selective", {"recompute_modules": ["mla_up_proj", "mlp"]}, {})
    # "(recipe)" and "(smallest passing)" trail the module list; the row's figures are the first setting's
    nano = production_rows["mbridge_card_nemotron3_nano_16_moe_recompute"]
    assert prow.recompute_for(nano, "megatron-bridge")[1] == {"recompute_modules": ["moe"]}
    assert prow.recompute_for(production_rows["mbridge_card_dsv3_b200_256_mxfp8"], "megatron-core")[1] == {
        "recompute_modules": ["mla_up_proj", "mlp"]}
    # torchtitan: per-op SAC and llama3_8b.toml's default are selective_ac_option "op" (the 2024-12 benchmarks ran that
    # file too); an unstated option on a model whose train config sets full AC stays a knob
    assert prow.recompute_for(production_rows["torchtitan_asynctp_8b_64_bf16"], "torchtitan") == (
        "selective", {"selective_ac_option": "op"}, {})
    assert prow.recompute_for(production_rows["torchtitan_trainy_llama31_8b_h200_32"], "torchtitan")[1] == {
        "selective_ac_option": "op"}
    assert prow.recompute_for(production_rows["torchtitan_llama31_8b_8gpu_fsdp"], "torchtitan") == (
        "selective", {"selective_ac_option": "op"}, {})
    row = production_rows["torchtitan_llama31_8b_8gpu_fsdp"]
    rec, fields, knobs = prow.recompute_for({**row, "model": {**row["model"], "total_params_b": 70.0}}, "torchtitan")
    assert rec == "selective" and fields == {} and set(knobs) == {"selective_ac_option"}
    assert prow.recompute_for(production_rows["mcore_h100_weak_1p7b"], "megatron-core") == (None, {}, {})
    # which frameworks' selective is op-level SAC is their card's recompute.selective (what RC002 reads), not a name:
    # NeMo AutoModel's is too, so its per-op row is selective_ac_option "op"; Megatron's card says core_attention
    asynctp = production_rows["torchtitan_asynctp_8b_64_bf16"]
    assert prow.recompute_for(asynctp, "nemo-automodel") == ("selective", {"selective_ac_option": "op"}, {})
    assert "selective_ac_option" in prow.recompute_for(asynctp, "megatron-core")[2]
    # a module Megatron does not have stays a knob
    row = {"memory": {"recompute": "selective: core_attn, attention_output"}}
    assert prow.recompute_for(row, "megatron-core") == (
        "selective", {}, {"recompute_modules": "attention_output, core_attn"})


def test_modules_reach_the_memory_estimate(tmp_path, production_rows):
    # the mapped modules change the estimate: dropping them (Megatron's default core_attn) keeps more activations
    req = pmap.map_row(production_rows["mbridge_h100_gpt_oss_120b_64_bf16"], tmp_path).request
    assert req.recompute_modules == ["layernorm", "moe_act"]
    mapped = api.estimate_memory(req).stages[0].activations_bytes
    default = api.estimate_memory(req.model_copy(update={"recompute_modules": None})).stages[0].activations_bytes
    assert mapped < default


def test_pipeline_reading(tmp_path, production_rows):
    # a quoted custom layout is passed as it stands: 40 stages for pp=8 x vpp=5, 80 layers
    req = pmap.map_row(production_rows["mbridge_h100_llama3_70b_64_fp8"], tmp_path).request
    assert req.pipeline_layout == "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
    assert len(parse_layout(req.pipeline_layout)) == 40
    # the card's layout where the row sets it against the ModelZoo script's
    req = pmap.map_row(production_rows["mbridge_card_dsv3_1024_h100_fp8block"], tmp_path).request
    assert req.pipeline_layout == "Et*3|(tt|)*29m|L"
    # a layout named by its recipe function: Megatron-Bridge's DeepSeek-V3 helper at (16, 1) with one MTP layer
    req = pmap.map_row(production_rows["mbridge_recipe_dsv3_1024"], tmp_path).request
    stages = parse_layout(req.pipeline_layout)
    assert len(stages) == 16 and stages[0] == "Etttt" and stages[-1] == "tmL"
    assert "".join(stages).count("t") == 61
    # Kimi-K2's helper at (16, 1): no MTP, the loss alone after the last decoder layer
    m = pmap.map_row(production_rows["mbridge_recipe_kimi_k2_512"], tmp_path)
    assert m.request.pipeline_layout == "Et*4|(t*4|)*14tL" and "pipeline_layout" not in m.knobs
    # account_for_embedding/loss_in_pipeline_split as the row states it
    m = pmap.map_row(production_rows["mbridge_recipe_qwen3_235b_256"], tmp_path)
    assert (m.request.account_for_embedding, m.request.account_for_loss) == (True, True)
    assert not {"account_for_embedding", "account_for_loss"} & set(m.knobs)
    # with a last-stage size too, which Megatron-Core refuses with the accounting: the script's accounting is kept
    first, last, fields, notes, knobs = psrc.stage_layers(production_rows["verl_qwen3_235b_h20_32"])
    assert (first, last, fields, knobs) == (None, None, {"account_for_embedding": True, "account_for_loss": True}, {})
    assert notes and notes[0].startswith("last_stage_layers=6 dropped")


def _split_of(row: dict, **parallelism) -> dict:
    """The split recipe_split sets for the row with its parallelism changed."""
    row = {**row, "parallelism": {**row["parallelism"], **parallelism}}
    key = prow.catalog_match(row["model"])
    return psrc.recipe_split(row, key, catalog_architecture(key).num_mtp_layers)[0]


def test_recipe_splits_follow_the_sources_tables(production_rows):
    """A row that states no split gets what the sources it names set for its model at its pp/vpp: Bridge's
    DeepSeek-V3 helper (MTP with the loss) where (pp, vp) is in its table, the perf recipes' strings outside it,
    the base recipes' account_for_* at any pp; nothing where no table has the pair."""
    gb200 = production_rows["mbridge_gb200_dsv3_256_bf16"]  # pp4 vpp4, a Bridge perf row
    assert _split_of(gb200) == {"pipeline_layout": "Et*4|(t*4|)*14tmL"}
    assert _split_of(gb200, pp=8, vpp=None) == {"pipeline_layout": "Et*8|(t*8|)*6t*5mL"}
    assert _split_of(gb200, pp=4, vpp=None) == {"pipeline_layout": "Et*16|(t*16|)*2t*13mL"}
    assert _split_of(gb200, pp=8, vpp=4) == {"pipeline_layout": "Et|(tt|)*30mL"}  # perf_recipes/deepseek/h100
    assert _split_of(gb200, pp=2, vpp=8) == {"pipeline_layout": "Et*4|(t*4|)*14tmL"}  # perf_recipes/deepseek/gb300
    assert _split_of(gb200, pp=16, vpp=2) == {}  # in no table: Megatron-Core would refuse 61 layers unsplit
    assert _split_of(gb200, pp=1, vpp=None) == {}
    # every layout a table sets passes Megatron-Core's validation as meshplan checks it (PP009)
    for entry in RECIPE_SPLITS:
        if entry.pp is None:
            continue
        arch = catalog_architecture(entry.model)
        fields = psrc.split_fields(entry, arch.num_mtp_layers)
        if fields:
            stages = parse_layout(fields["pipeline_layout"])
            assert not layout_problem(stages, entry.pp, entry.vpp, arch.num_layers, arch.num_mtp_layers), entry
    qwen = production_rows["mbridge_gb200_qwen3_235b_256_bf16"]
    assert _split_of(qwen) == _split_of(qwen, pp=4, vpp=12) == {"account_for_embedding": True, "account_for_loss": True}
    # a source applies only to rows naming its repository: a torchtitan row of the same model gets nothing
    titan = {**qwen, "framework": "torchtitan", "source": {**qwen["source"], "citation": "x", "location": "y"}}
    assert _split_of(titan) == {}
    # a part of a source applies where the row's citation names it: the ModelZoo script's long-context runs
    long_ctx = production_rows["mbridge_card_dsv3_h100_256_longctx_128k"]
    assert _split_of(long_ctx) == {"pipeline_layout": "Et*2|(tt|)*22t|(tt|)*7mL"}
    short = {**long_ctx, "source": {**long_ctx["source"], "citation": "NVIDIA-NeMo/Megatron-Bridge; "
                                    "yanring/Megatron-MoE-ModelZoo best_practice/deepseek-v3/run_deepseek_v3_h100.sh",
                                    "location": "4k"}}
    assert _split_of(short) == {"pipeline_layout": "Et|(tt|)*30mL"}


def test_gpu_reading():
    exact = prow.gpu_for({"gpu_type": "GB200-186GB (NVL72)", "gpu_memory_gb": 186})
    assert exact[0] == "gb200" and exact[2] == {}
    grand_teton = prow.gpu_for({"gpu_type": "H100-96GB-HBM2e (500W, Grand Teton)", "gpu_memory_gb": 96})
    assert grand_teton == ("h100-96gb-hbm2e", 96 * GIB, {})  # its own catalog part (cards/hardware.yaml)
    key, capacity, knobs = prow.gpu_for({"gpu_type": "H100-NVL-94GB", "gpu_memory_gb": 94})
    assert key == "h100" and capacity == 94 * GIB and "gpu" in knobs
    # the whole name, capacity included, is a catalog alias (gb300-288gb): that part, against nvidia-smi's 284208 MiB
    assert prow.gpu_for({"gpu_type": "GB300-288GB (NVL72)", "gpu_memory_gb": 288}) == ("gb300", 284208 * 2**20, {})
    assert prow.gpu_for({"gpu_type": "B300-192GB", "gpu_memory_gb": 192})[:2] == ("b300", 192 * GIB)
    with pytest.raises(prow.Unmapped, match="RTX-3090"):
        prow.gpu_for({"gpu_type": "RTX-3090-24GB", "gpu_memory_gb": 24})


def test_peaks_are_gigabytes_in_the_rows_convention(run):
    _, scores, _ = run
    score = next(s for s in scores if s.mapping.row_id == "mbridge_card_qwen3_30b_16_h100_hybridep")
    # the row gives 66.75 GB and, in its notes, "rank-0 peak allocated 62.166 GiB": the same bytes
    assert score.measured_peak_bytes / GIB == pytest.approx(62.166, abs=0.01)
    assert score.convention == "allocated"
    titan = next(s for s in scores if s.mapping.row_id == "torchtitan_llama31_8b_8gpu_cp1_32k")
    assert titan.convention == "reserved"
    context = memory_card().cuda_context_bytes
    assert titan.compared_peak_bytes == titan.peak_bytes - context


def test_tflops_rows_divide_by_their_own_releases_formula(run):
    """A TFLOP/s row becomes tokens/s through the formula its run logged it with: NeMo 24.03.01's counted the causal
    core full (published_runs.tflops_causal_full), the 2026 DeepSeek-V3 long-context card's is Megatron-LM's
    current one (causal halved, MLA, MTP), as meshplan's MFU counts."""
    rows, scores, _ = run
    by_id = {s.mapping.row_id: s for s in scores}
    raw = {r["id"]: r for r in rows}
    for row_id, formula, basis in [
        ("nemo_longseq_llama2_7b_h100_256k", noncausal_flops_per_token, "TFLOP/s (causal counted full)"),
        ("mbridge_card_dsv3_h100_256_longctx_128k", model_flops_per_token, "TFLOP/s"),
    ]:
        score, row = by_id[row_id], raw[row_id]
        job, _ = resolve(score.mapping.request)
        assert score.tps_basis == basis
        per_token = formula(job.model, row["workload"]["seq_length"])
        assert score.measured_tps == pytest.approx(row["outcome"]["tflops_per_gpu"] * 1e12 / per_token, rel=1e-12)
    # at 256K the full count nearly doubles the work a token is credited with: the measured tokens/s about halves
    nemo = by_id["nemo_longseq_llama2_7b_h100_256k"]
    halved = raw["nemo_longseq_llama2_7b_h100_256k"]["outcome"]["tflops_per_gpu"] * 1e12 / model_flops_per_token(
        resolve(nemo.mapping.request)[0].model, 262144)
    assert 0.5 < nemo.measured_tps / halved < 0.6


@pytest.mark.parametrize("row_id,impl,modules", [
    ("mbridge_gb200_dsv3_256_mxfp8", "transformer_engine", ["attn", "moe_router", "moe_preprocess"]),  # the row's own
    ("mbridge_card_qwen3_30b_16_h100_hybridep", "transformer_engine", ["moe_router", "moe_preprocess"]),
    ("mbridge_h100_qwen3_30b_16_fp8_ep16", "transformer_engine", ["attn", "moe_router", "moe_preprocess"]),  # recipe
    ("mbridge_b200_llama3_8b_8_fp8", "local", None),  # dense, no module named: the whole layer
    ("mbridge_gb200_qwen3_30b_8_mxfp8", None, None),  # the recipe's full-iteration graph: static expert capacity
])
def test_rows_state_their_cuda_graphs(production_rows, tmp_path, row_id, impl, modules):
    """A row's CUDA graphs as it states them, else as the recipe it cites sets them; what meshplan cannot express (a
    full-iteration graph of an MoE model with its static expert capacity) stays the knob, and the rules pass."""
    m = pmap.map_row(production_rows[row_id], tmp_path)
    assert (m.request.cuda_graph_impl, m.request.cuda_graph_modules) == (impl, modules)
    assert ("cuda_graphs" in m.knobs) == (impl is None)
    if impl is not None:
        found = api.check_config(m.request).findings
        assert not [f.id for f in found if f.id.startswith("CG")]


def test_graph_words():
    assert psrc.graph_fields("TE CUDA graphs (attn, moe_router, moe_preprocess)", True) == {
        "cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}
    assert psrc.graph_fields("TE CUDA graphs", True) is None  # an MoE model's whole layer: not what it ran
    assert psrc.graph_fields("full-iteration CUDA graph", False) == {"cuda_graph_impl": "full_iteration"}


def test_a_lora_row_moves_only_where_the_card_names_the_framework_that_runs_it(production_rows, monkeypatch):
    """A LoRA row of a framework without LoRA is scored on the framework its card's lora_rank knob names (runs_on:
    Megatron-LM's pretrain_gpt -> Megatron-Bridge, which trains the same Megatron-Core model); where the card names
    none it stays (rule LORA001 then says so), whatever the framework is called."""
    import production_sources as psrc

    from meshplan.knowledge.cards import framework_card

    row = production_rows["nemo2407_h100_lora_llama2_70b_8gpu"]
    framework, fields, knobs = psrc.lora_for(row, "megatron-core", "LoRA")
    assert framework == "megatron-bridge" and fields == {"job": "lora"} and "megatron-bridge" in knobs["framework"]
    assert psrc.lora_for(row, "deepspeed", "LoRA")[0] == "deepspeed"  # its card names no runs_on
    assert psrc.lora_for(row, "verl", "LoRA")[0] == "verl"  # it runs LoRA itself

    core = framework_card("megatron-core")
    adapter = core.adapter
    version = adapter.versions[adapter.default_version]
    knobs_without = {**version.knobs, "lora_rank": version.knobs["lora_rank"].model_copy(update={"runs_on": None})}
    unnamed = core.model_copy(update={"adapter": adapter.model_copy(update={"versions": {
        **adapter.versions, adapter.default_version: version.model_copy(update={"knobs": knobs_without})}})})
    monkeypatch.setattr(psrc, "framework_card", lambda f: unnamed if f == "megatron-core" else framework_card(f))
    assert psrc.lora_for(row, "megatron-core", "LoRA")[0] == "megatron-core"


def test_a_lora_row_reads_its_own_lora_section_before_a_cited_recipe(production_rows):
    """A row's `lora` section (production_rows.stated_lora) gives the Request's rank and targets, read the same way
    for every row; what it leaves out the recipe it cites fills (LORA_RECIPES), else the framework's default with the
    knob "lora" naming what was not stated. A value the section cannot hold is refused with the field and what it
    takes."""
    recipe_row = copy.deepcopy(production_rows["mbridge_h100_llama3_70b_lora_8_fp8"])  # cites a LORA_RECIPES recipe
    assert psrc.lora_for(recipe_row, "megatron-bridge", "LoRA")[1:] == (
        {"lora_rank": 16, "lora_targets": ["linear_qkv"]}, {})
    recipe_row["lora"] = {"rank": 8, "alpha": 16, "targets": ["linear_fc1", "linear_fc2"]}
    assert psrc.lora_for(recipe_row, "megatron-bridge", "LoRA")[1:] == (
        {"lora_rank": 8, "lora_targets": ["linear_fc1", "linear_fc2"]}, {})
    recipe_row["lora"] = {"rank": 32}  # the recipe's targets fill the rest
    assert psrc.lora_for(recipe_row, "megatron-bridge", "LoRA")[1] == {"lora_rank": 32, "lora_targets": ["linear_qkv"]}

    bare = copy.deepcopy(production_rows["nemo2407_h100_lora_llama2_70b_8gpu"])  # states none, cites no recipe
    _, fields, knobs = psrc.lora_for(bare, "megatron-bridge", "LoRA")
    assert fields == {"job": "lora"} and knobs["lora"] == "LoRA: rank and targets not stated"
    bare["lora"] = {"targets": ["linear_qkv", "linear_proj"], "rank": None}
    _, fields, knobs = psrc.lora_for(bare, "megatron-bridge", "LoRA")
    assert fields == {"job": "lora", "lora_targets": ["linear_qkv", "linear_proj"]}
    assert knobs["lora"] == "LoRA: rank not stated"
    bare["lora"] = {"rank": 16, "targets": ["linear_qkv", "linear_proj"]}
    _, fields, knobs = psrc.lora_for(bare, "megatron-bridge", "LoRA")
    assert fields == {"lora_rank": 16, "lora_targets": ["linear_qkv", "linear_proj"]} and "lora" not in knobs

    for section, words in (({"rank": 0}, "lora.rank 0: expected a whole number of at least 1"),
                           ({"rank": "16"}, "lora.rank '16'"), ({"alpha": "x"}, "lora.alpha 'x': expected a number"),
                           ({"targets": ["attention"]}, "lora.targets 'attention': not a linear meshplan adapts"),
                           ({"targets": ["linear_qkv", "linear_qkv"]}, "given more than once"),
                           ({"dim": 16}, "lora.dim: not a field of the lora section"), ([16], "expected a section")):
        bare["lora"] = section
        with pytest.raises(prow.Unmapped, match=words.replace("(", r"\(")):
            prow.stated_lora(bare)
    row = copy.deepcopy(production_rows["nemo2407_h100_lora_llama2_70b_8gpu"])
    row["lora"] = {"rank": -1}
    assert "lora.rank -1" in pmap.map_row(row, Path("/nonexistent")).unmapped  # counted with its reason, no traceback
