"""The validation benches are generic (issue 24): fed a file of the dev set's schema with ids, frameworks and free text
they have never seen, bench/production_configs.py and bench/pairwise_comparisons.py run without an exception and
report every row mapped or with its reason, and bench/ holds no per-comparison table, row id, recipe or date table.
A test of the bench itself: it imports the bench's modules."""

from __future__ import annotations

import ast
import copy
import re
import sys
from pathlib import Path

import pytest
import yaml

from meshplan.estimate.memory import step_offload_time
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import pairwise_comparisons as pw
import production_configs as pconf
import production_rows as prow
import production_scoring as pscore

BENCH = Path(__file__).resolve().parent.parent / "bench"
DATA = prow.DEFAULT_VALIDATION / prow.DATA_NAME
pytestmark = pytest.mark.shared_data(DATA)  # ../shared beside the checkout (conftest.py: fails without it)


def _synthetic(production_rows: dict) -> list[dict]:
    """Rows of the dev schema nobody has seen: new ids, framework strings, a text vpp, free text, a null framework."""
    dense = production_rows["mbridge_h100_llama3_70b_64_fp8"]
    titan = production_rows["torchtitan_llama31_8b_8gpu_fsdp"]
    out = []
    for i, (framework, template) in enumerate((
            ("Megatron-LM v0.4 (PTD-P)", dense), ("DeepSpeed 0.14 ZeRO-3", titan), ("NeMo AutoModel 25.09", titan),
            (None, dense), ("Quokka-Trainer 2.0", dense), ("GPT-NeoX 2.0", dense), ("Megatron-DeepSpeed", dense))):
        row = copy.deepcopy(template)
        row["id"] = f"synthetic_{i}_zz"
        row["framework"] = framework
        row["name"] = f"an unseen run {i}"
        row["source"]["citation"] = f"example-org/example-repo docs/run_{i}.md"
        row["outcome"]["other"] = "measured on a cluster nobody here has seen; overlap of everything"
        out.append(row)
    text_vpp = copy.deepcopy(dense)
    text_vpp |= {"id": "synthetic_vpp_text", "framework": "Megatron-LM"}
    text_vpp["parallelism"] = dict(text_vpp["parallelism"], pp=4, vpp="5 (interleaved 1F1B)")
    unreadable = copy.deepcopy(dense)
    unreadable |= {"id": "synthetic_vpp_word", "framework": "Megatron-Core"}
    unreadable["parallelism"] = dict(unreadable["parallelism"], vpp="interleaved", tp="eight")
    return [*out, text_vpp, unreadable]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, production_rows):
    root = tmp_path_factory.mktemp("unseen")
    rows = _synthetic(production_rows)
    (root / prow.DATA_NAME).write_text(yaml.safe_dump(rows), encoding="utf-8")
    comparisons = [{
        "id": "CMP-UNSEEN", "title": "An unseen layout A/B", "metric": "TFLOP/s per GPU",
        "configs": ["TP8 PP4: 400", "TP4 PP8: 380", "TP2 PP8 (32 GPUs): 350"],
        "entry_ids": ["synthetic_0_zz", "synthetic_vpp_text"]}, {
        "id": "CMP-UNSEEN-FEASIBLE", "title": "Recommended layouts", "metric": "recommended layout (feasibility)",
        "configs": ["64 GPUs: TP8"], "entry_ids": ["synthetic_3_zz", "not_a_row"]}, {
        "id": "CMP-UNSEEN-SWITCH", "title": "A switch nobody names", "metric": "TFLOP/s",
        "configs": ["frobnicator off: 100", "frobnicator on: 120"], "entry_ids": ["synthetic_0_zz"]}]
    (root / pw.DATA_NAME).write_text(yaml.safe_dump(comparisons), encoding="utf-8")
    return root


def test_unseen_rows_map_or_say_why(folder):
    rows, scores, summary = pscore.run(folder)
    by_id = {s.mapping.row_id: s.mapping for s in scores}
    assert summary.mapped + len(summary.unmapped) == summary.total == len(rows)
    for m in by_id.values():
        assert (m.request is None) == bool(m.unmapped), m.row_id
        assert set(m.knobs) <= set(prow.KNOBS), m.row_id
        assert "cannot be read" not in (m.unmapped or ""), m  # each case below is a reason the readers state
    assert by_id["synthetic_0_zz"].request.framework == "megatron-core"  # Megatron-LM: the card's display name
    assert by_id["synthetic_1_zz"].request.framework == "deepspeed"
    assert by_id["synthetic_6_zz"].request.framework == "deepspeed"  # Megatron-DeepSpeed: the card's alias
    assert by_id["synthetic_2_zz"].request.framework == "nemo-automodel"  # its own card, not Megatron-Core
    assert "framework not stated" in by_id["synthetic_3_zz"].unmapped
    assert "names no meshplan framework" in by_id["synthetic_4_zz"].unmapped
    assert by_id["synthetic_5_zz"].knobs["framework"].startswith("GPT-NeoX")  # nearest card, named
    text = by_id["synthetic_vpp_text"]
    assert text.request.vpp == 5 and any("vpp given as text" in n for n in text.notes)
    word = by_id["synthetic_vpp_word"]
    assert "parallelism.vpp 'interleaved'" in word.knobs["row_field"] and "parallelism.tp" in word.knobs["row_field"]
    # every score is a verdict or a stated refusal, and the headline figures come out as numbers or None
    figures = pconf.figures(summary)
    assert figures["rows"] == len(rows) and set(figures["tokens_per_s"]) == {"all", "dense", "MoE", "FSDP"}


def test_unseen_comparisons_are_scored_from_the_rows_fields(folder):
    result = pw.run(folder)
    pairs = [p for p in result.pairs if p.comparison == "CMP-UNSEEN"]
    assert len(pairs) == 2 and all(p.status in ("scored", "nearest", "not expressible") for p in pairs)
    assert all(p.predicted is not None or p.why_apart for p in pairs)
    assert "CMP-UNSEEN-FEASIBLE" in result.not_measured
    assert {f[1] for f in result.feasibility} == {"synthetic_3_zz", "not_a_row"}
    (switch,) = [p for p in result.pairs if p.comparison == "CMP-UNSEEN-SWITCH"]
    assert switch.status == "not expressible" and "names no knob" in switch.why_apart


# --------------------------------------------------------------------------- no tables keyed to the dev rows


HARNESS = ("production_configs.py", "production_rows.py", "production_sources.py", "production_mapping.py",
           "production_scoring.py", "pairwise_comparisons.py", "pairwise_sides.py", "rl_jobs.py", "moe_fit.py",
           "pipeline_schedules.py", "fitted_constants.py", "fp8_fit.py")
RECIPE = re.compile(r"_(pretrain|peft|sft|finetune)_\w*_config|\.toml$")
DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")


def _literals(path: Path) -> list[str]:
    """The string constants of a module's code (docstrings and comments left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef)
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_the_harness_holds_no_row_comparison_recipe_or_date_table(production_rows):
    comparisons = yaml.safe_load((prow.DEFAULT_VALIDATION / pw.DATA_NAME).read_text(encoding="utf-8"))
    ids = set(production_rows) | {c["id"] for c in comparisons}
    for name in HARNESS:
        path = BENCH / name
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bSPECS\b", text), name
        for value in _literals(path):
            assert not any(i in value for i in ids), (name, value)  # no row or comparison id
            assert not RECIPE.search(value), (name, value)  # recipes live in meshplan/knowledge/published_runs.py
            assert not DATE.match(value), (name, value)  # release dates too


def test_the_model_family_vocabulary_is_the_package_s():
    """A row's model family becomes a model_type through cards/model_families.yaml (knowledge/catalog.family_type), the
    one vocabulary: no harness module keeps a table keyed by family names; a nearest model_type says what it misses."""
    from meshplan.knowledge.catalog import families_card, family_type

    card = families_card()
    names = set(card.families) | set(card.nearest)
    for name in HARNESS:
        for node in ast.walk(ast.parse((BENCH / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and all(isinstance(v, ast.Constant | ast.Tuple) for v in node.values):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                assert len(keys & names) < 2, (name, sorted(keys & names))  # family -> model_type
    assert family_type("gpt3").model_type == "gpt2" and family_type("gpt3").leaves_out is None
    assert family_type("mpt").leaves_out and family_type("bert") is None
    config, _, knobs = prow.build_config({"model": {
        "family": "mpt", "id": "mosaicml/mpt-7b", "attention": "MHA", "num_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_kv_heads": 32, "ffn_hidden_size": 16384, "vocab_size": 50432,
        "num_experts": None}, "workload": {"seq_length": 2048}})
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
    assert knobs["model_type"].startswith(family_type("mpt").leaves_out)


# --------------------------------------------------------------------------- leave one source out, fitted constants


def test_every_fitted_constant_of_the_card_is_held_out_by_the_benches():
    """bench/fitted_constants.py lists each constant the calibration card marks fitted (and nanotron's fitted values);
    a source no fit used keeps the card's values; a framework's own fitted value is not replaced by the shared one."""
    import fitted_constants as fc

    from meshplan.knowledge.calibration import calibration_card

    card = calibration_card()
    listed = {(f.name, f.framework) for f in fc.fitted_constants()}
    assert {(name, None) for name, c in card.constants.items() if c.fitted} <= listed
    assert ("elementwise_passes", "nanotron") in listed
    assert ("fsdp_hybrid_allreduce_last_microbatch", "torchtitan") not in listed
    assert fc.without(prow.DEFAULT_VALIDATION, "example-org/example-repo docs/run_0.md") == fc.card_values()
    assert "gemm_peak_fraction" not in fc.applicable("nanotron", {"gemm_peak_fraction": 0.5})
    assert fc.applicable("megatron-core", {"gemm_peak_fraction": 0.5}) == {"gemm_peak_fraction": 0.5}


def test_the_joint_fit_of_the_gemm_and_moe_constants_is_one_argmin_with_no_start():
    """bench/fitted_constants.py fits gemm_peak_fraction and the MoE pair as one argmin over one error table: on a
    table where fitting one constant under the other (from a start, alternating) settles on a different point from
    each start, the joint point is the brute-force least median |error|, whatever the start; leaving a column out is
    the same argmin over the rest, ties to the lowest index."""
    import statistics

    import fitted_constants as fc

    # points (a, b) of a 2 x 2 grid, index 2a + b; one column: |error| 1 at (0, 0), 0.5 at (1, 1), 2 off the diagonal
    table = [[1.0], [2.0], [-2.0], [0.5]]

    def alternate(a: int, b: int) -> tuple[int, int]:
        for _ in range(8):
            a = min((0, 1), key=lambda x: abs(table[2 * x + b][0]))
            b = min((0, 1), key=lambda y: abs(table[2 * a + y][0]))
        return a, b
    assert {alternate(a, b) for a in (0, 1) for b in (0, 1)} == {(0, 0), (1, 1)}  # the start decides
    assert fc.joint_point(table, [True]) == 3  # (1, 1), from no start

    table = [[0.3, -0.1, None, 0.8, -0.2], [0.1, 0.4, -0.6, None, 0.05], [-0.2, 0.2, 0.3, 0.1, -0.7],
             [0.5, -0.5, 0.1, 0.1, 0.1], [0.05, 0.05, 0.05, 0.05, 0.05], [-0.05, -0.05, -0.05, -0.05, -0.05]]
    for keep in ([True] * 5, [True, True, False, True, True], [False, True, True, True, False], [True] + [False] * 4):
        def loss(i: int, keep: list[bool] = keep) -> float:
            return statistics.median(abs(e) for e, k in zip(table[i], keep, strict=True) if k and e is not None)
        assert fc.joint_point(table, keep) == min(range(len(table)), key=lambda i: (loss(i), i))
    assert fc.joint_point(table, [True] * 5) == 4  # 0.05 at points 4 and 5: the lower index


def test_a_torchtitan_pipeline_row_maps_its_local_batch_as_the_import_does(production_rows):
    """A torchtitan row's micro_batch_size is torchtitan's local batch: under PP it is one run of the schedule, cut
    by the release its date falls in (2024-12: into pp micro-batches), as adapters/common.torchtitan_batch cuts it."""
    import production_mapping as pmap

    row = copy.deepcopy(production_rows["torchtitan_llama31_8b_8gpu_fsdp"])
    row["parallelism"] |= {"tp": 8, "pp": 8, "dp": 8, "fsdp": 8}
    row["workload"] |= {"global_batch_size": 512, "micro_batch_size": 32}
    w, fields = pmap.pipeline_batch(row, "torchtitan", row["workload"])
    assert w["micro_batch_size"] == 4 and fields == {"pipeline_microbatches": 8}  # two runs of 8 per step
    row["source"]["version_or_date"] = "2025-06"  # pipeline_parallel_microbatch_size (default 1) since 5e2033c
    w, fields = pmap.pipeline_batch(row, "torchtitan", row["workload"])
    assert w["micro_batch_size"] == 1 and fields == {"pipeline_microbatches": 32}
    assert pmap.pipeline_batch(row, "megatron-core", row["workload"]) == (row["workload"], {})


def test_a_megatron_deepspeed_row_runs_its_scripts_own_attention_and_dropout(production_rows):
    """A row that names Megatron-DeepSpeed and states no attention or dropout is read as `meshplan import` reads its
    script (the card's read.absent_by_variant: CoreAttention, dropout 0.1); a setting the row states is left to the
    Request, and a row of another framework gets neither."""
    row = copy.deepcopy(production_rows["mbridge_h100_llama3_70b_64_fp8"])
    row["framework"], row["name"] = "Megatron-DeepSpeed (a fork)", "an unseen run"
    row["outcome"]["other"] = row["flags"]["caveats"] = row["source"]["location"] = ""
    fields, notes = prow.script_defaults(row, "deepspeed")
    assert fields == {"attention_backend": "unfused", "dropout": True} and "read.absent_by_variant" in notes[0]
    row["flags"]["caveats"] = "ran with --use-flash-attn-v2"
    assert prow.script_defaults(row, "deepspeed")[0] == {"dropout": True}
    row["framework"] = "DeepSpeed 0.14 ZeRO-3"  # its ds_config alone: the model code's own attention
    assert prow.script_defaults(row, "deepspeed") == ({}, [])
    assert prow.script_defaults(row, "megatron-core") == ({}, [])


def test_an_rl_row_runs_its_own_split_and_offloads(production_rows):
    """bench/rl_jobs.py takes the RL workload from the script a row cites, and the trainer from the row: a row at
    another pp than its script's is scored with the split it states (Megatron's last-stage size alone: the other
    stages share the rest evenly), not refused for the script's split or its MTP variant, and the optimizer share it
    offloads is the row's, not the script's default."""
    import rl_jobs

    scripts = rl_jobs.workloads()["scripts"]
    row = copy.deepcopy(production_rows["verl_dsv3_h20_96"])
    row["id"], row["hardware"]["num_gpus"] = "synthetic_rl_zz", 128
    row["parallelism"].update(pp=16, pp_layout="num_layers_in_last_pipeline_stage=1")
    work = rl_jobs.workload_of(row, scripts)
    assert work is not None and work["request"]["pp"] != 16  # the script's own split is for another pp
    hosts = []
    for share in (0.5, 1.0):
        row["memory"]["offload"] = f"param/grad offload; optimizer_offload_fraction={share}"
        res = rl_jobs.score_row(row, work)
        assert res["num_gpus"] == 128
        hosts.append(res["host_tb_per_node"])
    assert hosts[0] < hosts[1]  # half the optimizer on the host holds less of it there


def test_the_cpu_optimizer_study_maps_its_row_as_every_row(production_rows, tmp_path):
    """bench/rl_jobs.offload_study reads the CPU optimizer step, which needs no sequence length: it maps its row with
    production_mapping.map_row stating so (needs=()), as every scored row is mapped, where an estimate's caller (the
    default) still finds the row unmapped, naming the field the row leaves out. The study's seconds are the
    shared mapping's: the row's own layout, its framework and GPU, at each share the row states."""
    import production_mapping as pmap
    import rl_jobs

    row = production_rows["mbridge_card_qwen3_offload_16_h100"]
    assert row["workload"]["seq_length"] is None
    assert pmap.map_row(row, tmp_path).unmapped == "seq_length not stated"
    req = pmap.map_row(row, tmp_path, needs=()).request
    assert (req.tp, req.pp, req.ep, req.num_gpus) == (2, 2, 4, 16)
    assert req.framework == prow.framework_for(row["framework"])[0]  # the shared reader's, not a hand split
    study = rl_jobs.offload_study(rl_jobs.DEFAULT_VALIDATION)[row["id"]]
    assert [s["share"] for s in study["shares"]] == [0.25, 0.5, 0.75, 1.0]
    for s in study["shares"]:
        job, plan = resolve(parse_request({**req.model_dump(exclude_unset=True),
                                           "optimizer_offload_fraction": s["share"]}))
        assert s["cpu_step_s"] == round(step_offload_time(job, plan, compute_s=0.0)[0], 2)
    seconds = [s["cpu_step_s"] for s in study["shares"]]
    assert seconds == sorted(seconds) and seconds[0] > 0  # more of the optimizer on the host, a longer CPU step


def test_no_fit_reads_the_held_out_bridge_rows():
    """Bridge's GB300 and B300 rows were transcribed after the card's constants were set: bridge_published scores
    them, but fit_cases (what moe_fit.rows and fitted_constants.megatron_pool read) leaves every one out."""
    import bridge_published as bp

    scored = {r["system"] for r, _, _ in bp.cases()}
    fitted = {r["system"] for r, _, _ in bp.fit_cases()}
    assert bp.HELD_OUT_SYSTEMS <= scored and not bp.HELD_OUT_SYSTEMS & fitted
    assert len(bp.fit_cases()) == sum(r["system"] not in bp.HELD_OUT_SYSTEMS for r, _, _ in bp.cases())


def test_the_joint_error_table_is_the_same_built_over_worker_processes(monkeypatch):
    """fitted_constants.error_columns over forked workers (--jobs) gives each row's errors in the pool's order, the
    same as in one process, one value per joint_grid() point (a dense row's repeated over the MoE points)."""
    import fitted_constants as fc
    import moe_fit

    monkeypatch.setattr(fc, "GEMM_GRID", [0.62, 0.66])
    monkeypatch.setattr(moe_fit, "GRID", {"moe_gemm_half_ridges": [3.0], "moe_host_sync_s": [0.0, 3.0e-3]})
    pool = list(fc.megatron_pool())
    rows = [next(r for r in pool if r.job.model.moe is None), next(r for r in pool if r.job.model.moe is not None)]
    rows.append(rows[0])
    serial = fc.error_columns(rows, jobs=1)
    assert fc.error_columns(rows, jobs=2) == serial
    assert all(len(col) == len(fc.joint_grid()) == 4 for col in serial)
    dense, moe = serial[0], serial[1]
    assert dense[0] == dense[1] != dense[2] and moe[0] != moe[1]  # the sync moves only the MoE row


def test_the_launch_profile_holds_the_card_value_among_its_points():
    """bench/moe_fit.py --launch compares fitting grouped_gemm_launch_s with holding it at the card's assumed value:
    that value is a grid point, and every launch value meets every MoE pair once."""
    import moe_fit

    from meshplan.knowledge.calibration import calibration
    assumed = calibration().grouped_gemm_launch_s
    assert any(v == assumed for v in moe_fit.LAUNCH_GRID) and 0.0 in moe_fit.LAUNCH_GRID
    points = moe_fit.launch_points()
    assert len(points) == len(moe_fit.LAUNCH_GRID) * len(moe_fit.LAUNCH_PAIRS)
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)


# --------------------------------------------------------------------------- the functional tests' further columns


def test_the_functional_tests_settings_come_from_columns_not_case_names():
    """bench/memory_accuracy.py reads dropout, the embedding/loss in the pipeline split and fine-grained offloading from
    columns (the CSV's, and bench/data/megatron_functional_columns.yaml's read from each case's model_config.yaml),
    and bench/throughput_accuracy.py picks its timed rows by their columns: a row renamed keeps its plan and place."""
    import memory_accuracy as ma
    import throughput_accuracy as ta

    rows = {r["case"]: r for r in ma.megatron_rows(prow.DEFAULT_VALIDATION)}
    for row in rows.values():
        if ma.megatron_skip_reason(row):
            continue
        _, plan = ma.megatron_case(row)
        assert plan.dropout is (float(row["attention-dropout"] or 0.1) > 0), row["case"]
        renamed = row | {"case": "unseen/a_renamed_case"}
        assert ma.megatron_skip_reason(renamed) is None
        assert ma.megatron_case(renamed)[1] == plan, row["case"]  # no setting keyed to the case's name
        assert ta.golden_row(renamed) == ta.golden_row(row)
    # the recipe sets dropout 0.0 (model_config.yaml), which a table of case names had left out: scored without masks
    _, plan = ma.megatron_case(rows["moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental"])
    assert plan.dropout is False
    # and its pipeline layout Et*3|(tt|)*6tmL: 8 stages over pp 2, so 4 virtual stages a rank, the last holding 7
    # layers + MTP + loss (a CSV without that column had scored an even 8 + 8 split, one chunk a rank: -31%)
    assert (plan.pipeline_layout, plan.vpp) == ("Et*3|(tt|)*6tmL", 4)
    _, plan = ma.megatron_case(rows["gpt/gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split"])
    assert plan.account_for_embedding and plan.account_for_loss and plan.dropout
    offloading = [r for r in rows.values() if r["fine-grained-activation-offloading"] == "True"]
    assert offloading and all(ma.megatron_case(r)[1].activation_offload for r in offloading)
    some = offloading[0] | {"offload-modules": "[core_attn]"}  # a subset meshplan's activation_offload cannot say
    assert "some modules" in ma.megatron_skip_reason(some)
    one_off = rows["gpt/gpt3_mcore_te_tp2_pp2_cp2"] | {"hidden-dropout": "0.1"}
    assert "one switch" in ma.megatron_skip_reason(one_off)
    assert [c.plan.short() for c in ta.golden_cases(prow.DEFAULT_VALIDATION)] == ["TP1 PP4 VPP8 DP2", "TP4 PP1 DP2"]
