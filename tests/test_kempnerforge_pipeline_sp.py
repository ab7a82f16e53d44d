"""KempnerForge's pipeline stages run TP without sequence parallelism (kempnerforge/distributed/tensor_parallel.py
apply_tensor_parallel: seq_parallel = not is_pp_stage and ...; cards/frameworks/kempnerforge.yaml
sequence_parallel_off_for: pipeline): with pp > 1 a request that leaves sequence_parallel out gets it off, the search
builds its pp > 1 plans without it, and an imported TOML with pp > 1 states it off."""

from __future__ import annotations

from pathlib import Path

from meshplan import api
from meshplan.adapters.read import import_file
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

ROW = dict(model="llama-3-70b", gpu="h200", num_gpus=32, gpus_per_node=4, seq_length=4096, global_batch_size=8,
           micro_batch_size=1, framework="kempnerforge", tp=4, dp=2, recompute="full")


def test_pipeline_stages_run_tp_without_sequence_parallel():
    defaults = framework_card("kempnerforge").defaults
    assert not defaults.sequence_parallel_in_pipeline(4) and defaults.sequence_parallel_in_pipeline(1)
    assert framework_card("torchtitan").defaults.sequence_parallel_in_pipeline(4)
    assert not resolve(Request(**ROW, pp=4))[1].sequence_parallel
    assert resolve(Request(**{**ROW, "dp": 8}, pp=1))[1].sequence_parallel
    assert resolve(Request(**ROW, pp=4, sequence_parallel=True))[1].sequence_parallel  # stated: kept


def test_the_validation_row_holds_whole_layer_inputs():
    """70b_32gpu_tp4_pp4 (full recompute): stage 0 holds 4 micro-batches x 20 layer inputs, whole over TP (no
    sequence parallelism): 4 x 20 x 4096 x 8192 x 2 B = 5 GiB."""
    stage = api.estimate_memory(Request(**ROW, pp=4)).stages[0]
    assert stage.detail["layer_activations"] == 4 * 20 * 4096 * 8192 * 2


def test_search_plans_with_pp_leave_it_off():
    rec = api.recommend(Request(**{k: v for k, v in ROW.items() if k not in ("tp", "dp", "recompute")}), top_k=5)
    assert any(c.plan.tp > 1 and c.plan.pp > 1 for c in rec.candidates), "no TP + PP candidate to check"
    for c in rec.candidates:
        assert c.plan.sequence_parallel == (c.plan.tp > 1 and c.plan.pp == 1)


def test_imported_toml_with_pp_states_it_off():
    result = import_file(str(Path(__file__).parent / "configs" / "kempnerforge_70b_32gpu_tp4_pp4.toml"))
    assert result.defaults["sequence_parallel"] is False and "sequence_parallel" not in result.request
