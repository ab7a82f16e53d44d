"""bench/data/held_out_probe: the published runs kept out of the dev set (bench/README.md, "held out") are scored
only if every row becomes a request the rules accept, and their transcription is checked against itself: where a
source gives both model TFLOP/s and tokens/s, the FLOPs per token they imply is meshplan's count, within what the
source's own formula adds (NeMo 2.0 counts attention without the causal halving: +12.5% for an 8B model at 8K).

A test of the bench itself: it imports the bench's modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.api import estimate_memory
from meshplan.arithmetic.flops import model_flops_per_token
from meshplan.request.resolve import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_rows as prow
import production_scoring as pscore

FOLDER = Path(__file__).resolve().parent.parent / "bench" / "data" / "held_out_probe"


@pytest.fixture(scope="module")
def run():
    return pscore.run(FOLDER)


def test_every_held_out_row_maps_without_rule_errors(run):
    rows, scores, summary = run
    assert len(rows) >= 20 and summary.mapped == summary.total == len(rows)
    assert not [s.mapping.row_id for s in scores if s.rule_errors or s.refused]


def test_published_tflops_and_tokens_agree_with_the_model(run):
    rows, scores, _ = run
    both = [(r, s) for r, s in zip(rows, scores, strict=True)
            if r["outcome"]["tflops_per_gpu"] and r["outcome"]["tokens_per_sec_per_gpu"]]
    assert len(both) >= 10
    for row, score in both:
        job, _ = resolve(score.mapping.request)
        implied = row["outcome"]["tflops_per_gpu"] * 1e12 / row["outcome"]["tokens_per_sec_per_gpu"]
        assert 0.97 < implied / model_flops_per_token(job.model, job.seq_length) < 1.13, row["id"]
    assert prow.DATA_NAME == "production_configs_dev.yaml"


def test_torchtitan_mxfp8_rows_read_as_their_originals_state(run):
    """torchtitan's components/quantization/mxfp8.md copies torchao's README tables; where the copy says less or
    differs, the row follows torchao's original: the dense table's B200s limited to 750 W (scored on b200-750w), its
    float8 row's float8 all-gather (tensorwise), and the Scout run's local batch 1 (the copy says 10: 48 layers of
    10 x 8192 tokens without activation checkpointing hold far more than a 186 GB GPU)."""
    _, scores, _ = run
    by_id = {s.mapping.row_id: s for s in scores}
    for name in ("bf16", "float8"):
        req = by_id[f"torchtitan_mxfp8doc_llama3_8b_8_b200_{name}"].mapping.request
        assert req.gpu == "b200-750w" and req.micro_batch_size == 1 and req.seq_length == 8192
    req = by_id["torchtitan_mxfp8doc_llama3_8b_8_b200_float8"].mapping.request
    assert req.precision == "fp8" and req.fp8_recipe == "tensorwise" and req.fp8_param_gather
    scout = by_id["torchtitan_mxfp8doc_llama4_scout_256_gb200_bf16"]
    req = scout.mapping.request
    assert (req.micro_batch_size, req.global_batch_size, req.ep, req.recompute) == (1, 256, 16, "none")
    assert req.framework_version == "0.2"  # published 2025-11; the 6fc499f pin is the dense table's
    assert scout.fits and scout.peak_bytes < scout.mapping.capacity_bytes


def test_llama3_paper_rows_read_as_its_section_3_3_2_states(run):
    """The Llama 3 paper (arXiv 2407.21783) Sec 3.3.2: the 8K-token stage ran without activation checkpointing (the
    128K stage says nothing); one Transformer layer fewer on the first and last stages 'means that the first model chunk
    on the first stage has only the embedding, and the last model chunk on the last stage has only output projection
    and loss', under an interleaved schedule: chunks of one layer, Megatron-Core's layout E|(t|)*126L at pp 16 x vpp 8.
    Table 4 gives sequences per DP group, not a micro-batch size: left to meshplan's default."""
    _, scores, _ = run
    by_id = {s.mapping.row_id: s for s in scores}
    for row_id, recompute in (("llama3paper_405b_8192_h100", "none"), ("llama3paper_405b_16384_h100", "none"),
                              ("llama3paper_405b_16384_h100_cp16_128k", None)):
        req = by_id[row_id].mapping.request
        assert (req.tp, req.pp, req.vpp, req.recompute, req.micro_batch_size) == (8, 16, 8, recompute, None), row_id
        assert req.pipeline_layout == "E|(t|)*126L" and req.first_stage_layers is None, row_id
    req = by_id["llama3paper_405b_16384_h100"].mapping.request
    assert [stage.layers for stage in estimate_memory(req).stages] == [7] + [8] * 14 + [7]


def test_mlperf_lora_rows_are_scored_with_the_lora_their_runs_set(run):
    """The MLPerf Llama 2 70B LoRA rows state their rank and targets in their lora section (rank 16 on linear_qkv and
    linear_proj: NeMo's target_modules ['attention'] in v4.0, Megatron-Core's names in v5.0), and are scored with them,
    not with the framework's default LoRA (no "lora" knob)."""
    rows, scores, _ = run
    lora = [(r, s) for r, s in zip(rows, scores, strict=True) if r["category"] == "lora"]
    assert len(lora) >= 9
    for row, score in lora:
        req = score.mapping.request
        assert req.lora_rank == row["lora"]["rank"] == 16, row["id"]
        assert req.lora_targets == row["lora"]["targets"] == ["linear_qkv", "linear_proj"], row["id"]
        assert "lora" not in score.mapping.knobs, row["id"]
        # v4.0's NeMo yaml turns Megatron-Core's parameter transpose cache off (TE 1.6: no fp8 weight transpose kept),
        # which meshplan cannot express: counted as not expressible for memory
        assert ("parameter_transpose_cache" in score.mapping.knobs) == row["id"].startswith("mlperf40"), row["id"]
        # v5.0's 8-GPU runs store the SwiGLU input in fp8 (FP8_ACT=1) and every row runs FP8 attention (FP8_DPA=1):
        # read from the row's own precision and notes into the Request's fields (production_rows.fp8_setting_fields)
        stores = "activation_func_fp8_input_store" in row["outcome"]["other"]
        assert bool(req.fp8_activation_input_store) is stores, row["id"]
        assert bool(req.fp8_dot_product_attention) is ("FP8_DPA=1" in row["precision"]), row["id"]
        assert not {"fp8_activation_input_store", "fp8_dot_product_attention"} & set(score.mapping.knobs), row["id"]
    assert sum(bool(s.mapping.request.fp8_activation_input_store) for _, s in lora) == 2
    assert all(s.mapping.request.fp8_dot_product_attention for _, s in lora)


@pytest.mark.parametrize(("words", "on"), [("FP8_DPA=1", True), ("fp8_dot_product_attention: true", True),
                                           ("fp8_dot_product_attention: false", False),
                                           ("fp8_dot_product_attention=0", False), ("bf16", False)])
def test_a_row_that_names_fp8_attention_off_is_not_read_as_on(words, on):
    """production_rows.fp8_setting_fields reads a row's fp8 settings from its words: a key named with an off value
    after it states the setting off (the pattern matched the bare key, so `: false` read as on)."""
    row = {"precision": f"fp8 hybrid, {words}", "outcome": {"other": ""}}
    fields, knobs = prow.fp8_setting_fields(row, "megatron-bridge")
    assert fields.get("fp8_dot_product_attention", False) is on and not knobs
