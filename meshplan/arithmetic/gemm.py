"""A GEMM's time on one GPU: the fraction of peak its shape reaches, and its seconds forward and backward.

The step-time model (meshplan/estimate/) and Muon's optimizer step (muon.py) time their GEMMs with the same
calibrated curve, so it lives here, below both.
"""

from __future__ import annotations

from meshplan.arithmetic.flops import Gemm
from meshplan.knowledge.calibration import Calibration

# A GEMM's backward computes the input and the weight gradient, each as many FLOPs as its forward: forward +
# backward = 3x the forward, the forward a third (Narayanan et al. 2021). Memory-bound work splits the same way
# (one pass forward, two backward: elementwise_passes in the card), and so does the logits head.
TRAINING_PASSES_PER_FORWARD = 3.0


def gemm_efficiency(g: Gemm, cal: Calibration, ridge_rows: float = 0.0) -> float:
    """Achievable fraction of peak: a saturation curve in each matrix dimension (small shards run slow); a routed
    expert's grouped GEMM saturates later in its rows (the tokens each local expert gets), since each expert reads its
    whole weight for few rows and its tile grid is small: the curve's half point is moe_gemm_half_ridges times the
    GPU's ridge rows (expert_ridge_rows), so a GPU with less compute per byte of memory needs fewer rows."""
    x0 = cal.gemm_half_dim
    eff = cal.gemm_peak_fraction * (g.m / (g.m + x0)) * (g.n / (g.n + x0)) * (g.k / (g.k + x0))
    if g.name.startswith("expert_"):
        eff *= g.m / (g.m + cal.moe_gemm_half_ridges * ridge_rows)
    return eff


def expert_ridge_rows(bf16_peak: float, hbm: float) -> float:
    """Rows per expert below which a GEMM that reads its whole weight once is memory-bound: 2*m*k*n FLOPs over
    2*k*n weight bytes (BF16; FP8 halves both the bytes and the time per FLOP) = m FLOPs per byte against the GPU's
    bf16_peak / hbm (H100 SXM 295, H20 37, B200 281)."""
    return bf16_peak / hbm


def gemm_seconds(gemms: list[Gemm], cal: Calibration, bf16_peak: float, fp8_peak: float | None,
                 ridge_rows: float = 0.0) -> float:
    """Forward + weight-gradient + data-gradient of each GEMM (3x the forward FLOPs). ridge_rows: the GPU's
    expert_ridge_rows, needed when the list holds routed experts' GEMMs."""
    return summed(gemm_terms(gemms, cal, bf16_peak, fp8_peak, ridge_rows))


def gemm_terms(gemms: list[Gemm], cal: Calibration, bf16_peak: float, fp8_peak: float | None,
               ridge_rows: float = 0.0) -> list[float]:
    """gemm_seconds of each GEMM alone, in order: what a caller that sums several subsets of one list reads once."""
    return [TRAINING_PASSES_PER_FORWARD * g.flops / ((fp8_peak if (fp8_peak and g.fp8) else bf16_peak)
                                                     * gemm_efficiency(g, cal, ridge_rows)) for g in gemms]


def summed(terms: list[float]) -> float:
    """gemm_terms (or a subset of them, in order) added up as gemm_seconds adds them: left to right from 0.0."""
    total = 0.0
    for t in terms:
        total += t
    return total
