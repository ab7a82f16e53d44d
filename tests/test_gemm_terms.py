"""One layer's GEMM seconds computed once and summed per subset (arithmetic/gemm.py gemm_terms, summed): a module's
or a TP pair's subset sums to the same float as gemm_seconds of that subset, and layer_time's recompute and TP terms
are the same with the terms passed as without."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.gemm import gemm_seconds, gemm_terms, summed
from meshplan.estimate.layer_time import layer_gemms
from meshplan.estimate.recompute import MODULE_GEMMS, module_forwards
from meshplan.estimate.tp_overlap import exposed_tp, tp_pairs
from tests.test_layer_memo import CASES, contexts


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"])
def test_subset_sums_are_gemm_seconds_of_the_subset(case):
    _, _, ctx = contexts(case)
    for moe in ((False, True) if ctx.arch.moe is not None else (False,)):
        gemms = layer_gemms(ctx, moe)
        terms = gemm_terms(gemms, ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
        assert summed(terms) == gemm_seconds(gemms, ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
        for prefixes in MODULE_GEMMS.values():
            picked = [k for k, g in enumerate(gemms) if g.name.startswith(prefixes)]
            assert summed([terms[k] for k in picked]) == gemm_seconds(
                [gemms[k] for k in picked], ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
        assert module_forwards(gemms, ctx.cal, ctx, terms) == module_forwards(gemms, ctx.cal, ctx)
        assert tp_pairs(gemms, ctx.cal, ctx, moe, terms) == tp_pairs(gemms, ctx.cal, ctx, moe)
        assert exposed_tp(ctx, gemms, moe, terms) == exposed_tp(ctx, gemms, moe)
