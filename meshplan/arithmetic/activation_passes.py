"""The FFN activation's memory-bound passes, per the code that runs it and the model's activation.

Each framework runs a model's activation its own way: Megatron-Core as compiled functions (but gpt-oss's clamps
eagerly, before its fused quick-GEGLU), torch.compile'd blocks as one kernel, eager PyTorch and transformers' code
as a kernel per op. cards/calibration.yaml activation_passes counts each from the source; the layer's FFN term is
its code's base constant (counted or fitted with SwiGLU inside) plus the difference from SwiGLU's count, so a
SwiGLU model's time is what the base constants give and the others move by their own kernels' bytes. Megatron-Core's
unfused functions share the fused ones' base constant (base_holds), so their difference is from the fused SwiGLU.
"""

from __future__ import annotations

from functools import cache

from meshplan.knowledge.calibration import Calibration, calibration_card
from meshplan.knowledge.defaults_card import FrameworkDefaults
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
    """(the code's base constant's name, this activation's passes less the reference's as the base constant holds
    it: this code's, or the code named by its base_holds), once per pair: the layer model asks per layer."""
    card = calibration_card().activation_passes
    entry = card.codes[code]
    held = card.codes[entry.base_holds or code]
    return entry.base, sum(activation_passes(code, key)) - sum(held.passes[card.reference])


def forward_passes(code: str, key: str) -> float:
    """The activation's forward passes alone (what a recompute of it runs again)."""
    return activation_passes(code, key)[0]


@cache
def expert_bias_passes(code: str) -> tuple[float, float]:
    """(forward, backward) bf16 passes over the routed copies x hidden of the code's per-expert fc2 bias loop
    (Megatron-Core's TEGroupedMLP._apply_bias), (0, 0) where the card counts none."""
    return calibration_card().activation_passes.codes[code].expert_bias


@cache
def routed_weighting_passes(code: str) -> tuple[float, float]:
    """(forward, backward) bf16 passes over the routed copies x expert width of the routing-probability multiply the
    code runs apart from the activation's kernel (Megatron-Core's unfused bias_act_func), (0, 0) where the kernel
    applies it."""
    return calibration_card().activation_passes.codes[code].routed_weighting


def activation_fusable(arch: Architecture) -> bool:
    """Whether Megatron-Core's bias_activation_fusion takes the model's activation (cards/calibration.yaml
    activation_passes.fusable: SwiGLU, GeGLU, gpt-oss's quick-GEGLU and GELU; TransformerConfig refuses it for the
    others, which run the same functions either way)."""
    return activation_key(arch) in calibration_card().activation_passes.fusable


def default_activation_fusion(defaults: FrameworkDefaults, arch: Architecture,
                              release: str | None = None) -> bool | None:
    """bias_activation_fusion as the framework runs the model when the request leaves it out (its card's default for
    the model's type in `release`: Megatron-LM's flags, Megatron-Bridge's provider, verl's Megatron engine), off where
    Megatron-Core cannot fuse the activation (Megatron-LM's arguments.py and those providers leave it off there);
    None: the framework has no switch."""
    default = defaults.activation_fusion(arch.model_type, release)
    return None if default is None else default and activation_fusable(arch)
