"""bench/production_configs.py recipe_moe: a row gets the EP overlap and the full-iteration CUDA graph its cited
Megatron-Bridge perf recipe sets (by the function it names, or by its recipe file plus GPU count, system and
precision), and nothing from a recipe it does not cite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_configs as pc

DATA = pc.DEFAULT_VALIDATION / pc.DATA_NAME
pytestmark = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} (the shared validation set) is not here")


def test_named_recipe_sets_the_overlap(production_rows, tmp_path):
    row = production_rows["mbridge_b200_dsv3_256_mxfp8"]  # cites deepseek_v3_pretrain_256gpu_b200_fp8mx_config
    knobs, notes = pc.recipe_moe(row)
    assert set(knobs) == {"moe_a2a_overlap"} and notes
    mapping = pc.map_row(row, tmp_path)
    assert mapping.request.moe_a2a_overlap is True
    assert "moe_a2a_overlap" not in mapping.knobs  # a plan knob, passed, not recorded as inexpressible


def test_recipe_file_and_row_name_the_function(production_rows):
    row = production_rows["mbridge_gb200_qwen3_30b_8_mxfp8"]  # cites perf_recipes/qwen/gb200/qwen3_moe.py only
    knobs, _ = pc.recipe_moe(row)
    assert set(knobs) == {"moe_a2a_overlap", "cuda_graphs"}
    assert "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config" in knobs["cuda_graphs"]


def test_uncited_or_unset_recipe_sets_nothing(production_rows):
    assert pc.recipe_moe(production_rows["mbridge_b200_qwen3_235b_256_mxfp8"]) == ({}, [])  # names no function
    assert pc.recipe_moe(production_rows["mbridge_h100_dsv3_1024_fp8"]) == ({}, [])  # its recipe leaves the overlap off
    other = dict(production_rows["mbridge_b200_dsv3_256_mxfp8"], source={"citation": "some other source"})
    assert pc.recipe_moe(other) == ({}, [])
