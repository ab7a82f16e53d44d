"""A Gated DeltaNet layer (Qwen3-Next's linear attention; a G of a hybrid pattern) as activation bytes: what one layer
keeps for the backward as Megatron-Core's GatedDeltaNet trains it (megatron/core/ssm/gated_delta_net, core_v0.19.0)
and FLA's chunk_gated_delta_rule and causal_conv1d save (cards/memory.yaml gdn_layer, each tensor with its source);
and as work on one rank: its two GEMMs (in_proj, out_proj), the chunked gated delta rule's matmuls as FLA runs them
in chunks of the model's chunk_size tokens (fla/ops/gated_delta_rule/chunk.py; cards/calibration.yaml gdn_kernel),
timed by estimate/hybrid_time.py.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from meshplan.arithmetic.activations import Layout, Shape, saved_rows_bytes
from meshplan.arithmetic.flops import Gemm, Shard
from meshplan.schema.model import Architecture

# The widths a row may name, in Shape.gdn's order (activations.gdn_widths)
GdnWidth = Literal["hidden", "in_proj", "qk", "qk_heads", "value", "heads", "chunk"]
GDN_WIDTHS: tuple[str, ...] = get_args(GdnWidth)


class GdnSave(BaseModel):
    """One tensor a Gated DeltaNet layer saves for the backward, per token (cards/memory.yaml gdn_layer.saves)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    width: GdnWidth
    bytes: float | Literal["linear"]  # linear: a linear layer's input, 1 byte under fp8, else 2
    sp: bool = False  # sharded over TP only under sequence parallelism (else over TP always)
    dropped_by: str | None = None  # the recompute_modules entry that recomputes it
    kept_by: str | None = None  # kept only where this recompute_modules entry recomputes (its checkpoint's input)
    dropout: bool = False  # kept only where dropout is on
    source: str


class GdnLayer(BaseModel):
    """cards/memory.yaml gdn_layer: what Megatron-Core's Gated DeltaNet layer saves."""

    model_config = ConfigDict(extra="forbid")
    saves: list[GdnSave] = Field(min_length=1)
    source: str

    def terms(self) -> tuple[tuple[str, float | str, bool, str | None, str | None, bool], ...]:
        """The saves as hashable rows for a Layout (width, bytes, sp, dropped_by, kept_by, dropout)."""
        return tuple((s.width, s.bytes, s.sp, s.dropped_by, s.kept_by, s.dropout) for s in self.saves)


def gdn_activations(shape: Shape, lay: Layout, sel: set[str]) -> float:
    """A Gated DeltaNet mixer's saved bytes for one micro-batch on one GPU (the layer's own norm input included), from
    the card's rows in lay.gdn: per token, each row's width over TP (over TP under SP for the hidden-wide rows).
    Context parallelism trades tokens for heads (its all-to-alls), so the bytes per rank are the same."""
    assert shape.gdn is not None
    return saved_rows_bytes(lay.gdn, dict(zip(GDN_WIDTHS, shape.gdn, strict=True)), lay, sel)


# --------------------------------------------------------------------------- work


def gdn_gemms(arch: Architecture, sh: Shard) -> list[Gemm]:
    """A Gated DeltaNet layer's two GEMMs on one rank: in_proj (column-parallel: q, k, v, z, beta, alpha of the
    rank's heads) and out_proj (row-parallel over the rank's value width), over the tokens the rank's mixer sees
    (gathered under SP). Context parallelism hands each rank all tokens of its heads instead: the same product."""
    g = arch.gdn
    assert g is not None
    return [Gemm("gdn_in_proj", sh.tokens, g.in_proj_width / sh.tp, arch.hidden_size),
            Gemm("gdn_out_proj", sh.tokens, arch.hidden_size, g.value_dim / sh.tp)]


def gdn_rule_flops(arch: Architecture, sh: Shard) -> tuple[float, float]:
    """(forward, what the backward runs again) FLOPs of the conv1d and the chunked gated delta rule on one rank, as
    FLA's chunk_gated_delta_rule_fwd runs them per value head in chunks of C = chunk_size tokens (d_k, d_v a key's
    and a value's head width), per token: chunk_scaled_dot_kkt beta K K^T (2 C d_k), solve_tril's triangular inverse
    (2 C^2 / 3), recompute_w_u_fwd w = A K and u = A V (2 C (d_k + d_v)), chunk_gated_delta_rule_fwd_h the state's
    v_new = u - w h and h += K^T v_new (4 d_k d_v), chunk_fwd_o Q h and the masked (Q K^T) v_new (2 d_k d_v +
    2 C (d_k + d_v)); and the depthwise conv's taps (2 x kernel over q, k, v). The backward
    (chunk_gated_delta_rule_bwd) runs recompute_w_u_fwd and chunk_gated_delta_rule_fwd_h again before the
    gradients: the second figure."""
    g = arch.gdn
    assert g is not None
    c, dk, dv = g.chunk_size, g.key_head_dim, g.value_head_dim
    heads = g.num_value_heads / sh.tp
    w_u, state = 2 * c * (dk + dv), 4 * dk * dv
    forward = 2 * c * dk + 2 * c * c / 3 + w_u + state + 2 * dk * dv + 2 * c * (dk + dv)
    conv = 2 * g.conv_kernel * g.conv_dim / sh.tp
    return sh.tokens * (heads * forward + conv), sh.tokens * heads * (w_u + state)
