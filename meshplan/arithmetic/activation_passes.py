"""The FFN activation's memory-bound passes, per the code that runs it and the model's activation.

Each framework runs a model's activation its own way: Megatron-Core as compiled functions (but gpt-oss's clamps
eagerly, before its fused quick-GEGLU), torch.compile'd blocks as one kernel, eager PyTorch and transformers' code
as a kernel per op. cards/calibration.yaml activation_passes counts each from the source; the layer's FFN term is
its code's base constant (counted or fitted with SwiGLU inside) plus the difference from SwiGLU's count, so a
SwiGLU model's time is what the base constants give and the others move by their own kernels' bytes.
"""

from __future__ import annotations

from functools import cache

from meshplan.knowledge.calibration import Calibration, calibration_card
from meshplan.schema.model import Architecture

CLAMPED_GLU = "clamped_glu"


def activation_key(arch: Architecture) -> str:
    """The card's name for the model's FFN activation: clamped_glu for gpt-oss's clamped GLU (swiglu_limit),
    glu_<hidden_act> for a gated MLP, the hidden_act of a plain one."""
    if arch.swiglu_limit is not None:
        return CLAMPED_GLU
    return f"glu_{arch.activation}" if arch.gated_mlp else arch.activation


@cache
def activation_passes(code: str, key: str) -> tuple[float, float]:
    """(forward, backward) bf16 passes over the activation's output width of activation `key` under `code`; an
    activation the code does not list counts as the card's reference (SwiGLU): not counted, no difference."""
    card = calibration_card().activation_passes
    table = card.codes[code].passes
    return table.get(key, table[card.reference])


def ffn_passes(cal: Calibration, code: str, key: str) -> float:
    """Forward + backward bf16 passes over the FFN activation's output width: the code's base constant (with
    SwiGLU's passes inside it) less SwiGLU's count, plus this activation's."""
    base, difference = _from_reference(code, key)
    return getattr(cal, base) + difference


@cache
def _from_reference(code: str, key: str) -> tuple[str, float]:
    """(the code's base constant's name, this activation's passes less the reference's), once per pair: the layer
    model asks per layer."""
    card = calibration_card().activation_passes
    entry = card.codes[code]
    return entry.base, sum(activation_passes(code, key)) - sum(entry.passes[card.reference])


def forward_passes(code: str, key: str) -> float:
    """The activation's forward passes alone (what a recompute of it runs again)."""
    return activation_passes(code, key)[0]


@cache
def expert_bias_passes(code: str) -> tuple[float, float]:
    """(forward, backward) bf16 passes over the routed copies x hidden of the code's per-expert fc2 bias loop
    (Megatron-Core's TEGroupedMLP._apply_bias), (0, 0) where the card counts none."""
    return calibration_card().activation_passes.codes[code].expert_bias
