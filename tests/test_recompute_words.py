"""The memory answer's recompute line names the layers the figure recomputes: recompute_layers with the block
method (given, or left out, the method taken when recompute_layers is set) recomputes only each stage's first
layers, so the text must not speak of chunks of every layer (the uniform method), as it did for both."""
from __future__ import annotations

import pytest

from meshplan import api
from meshplan.schema.request import Request

BASE = {"model": "llama-3.1-8b", "gpu": "H100", "num_gpus": 8, "recompute": "full", "recompute_layers": 4}


def _recompute_line(**extra) -> tuple[str, float]:
    report = api.estimate_memory(Request(**{**BASE, **extra}))
    line = next(a for a in report.assumptions if a.startswith("Recompute full"))
    return line, report.peak_bytes / 2**30


@pytest.mark.parametrize("method", [None, "block"])
def test_block_recompute_says_first_layers_only(method):
    line, peak = _recompute_line(**({"recompute_method": method} if method else {}))
    assert "only the first 4 layers of each stage" in line and "chunks" not in line
    uniform_line, uniform_peak = _recompute_line(recompute_method="uniform")
    assert "every layer, in chunks of 4" in uniform_line
    assert peak > uniform_peak + 5  # 28 of 32 layers store every tensor under block: the words follow the figure
