"""A hybrid model's layers (model_type nemotron_h: Mamba-2, attention, MLP and MoE layers, one mixer each) as
activation bytes: what one Mamba-2 layer keeps for the backward as Megatron-Core trains it (cards/memory.yaml
mamba2_layer, each saved tensor with its source), and the attention, MLP and MoE layers of the pattern, each one
norm and one mixer, from the transformer layer's own terms (activations.py); and as FLOPs: the model's per token as
Megatron-LM counts them for MFU in flops.hybrid_flops_per_token; here a Mamba-2
layer's GEMMs on one rank and its conv and SSD chunked scan beside them (timed by estimate/hybrid_time.py).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from meshplan.arithmetic.activations import (
    BF16,
    DEFAULT_RECOMPUTE_MODULES,
    Layout,
    Shape,
    _attention,
    _norm,
    layer_activations,
    saved_rows_bytes,
)
from meshplan.arithmetic.flops import Gemm, Shard
from meshplan.arithmetic.gdn import gdn_activations
from meshplan.schema.model import Architecture

# The widths a row may name, in Shape.mamba's order
MambaWidth = Literal["hidden", "in_proj", "inner", "groups"]
MAMBA_WIDTHS: tuple[str, ...] = get_args(MambaWidth)


class MambaSave(BaseModel):
    """One tensor a Mamba-2 layer saves for the backward, per token (cards/memory.yaml mamba2_layer.saves)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    width: MambaWidth
    bytes: float | Literal["linear"]  # linear: a linear layer's input, 1 byte under fp8, else 2
    sp: bool = False  # sharded over TP only under sequence parallelism (else over TP always)
    dropped_by: str | None = None  # the recompute_modules entry that recomputes it
    dropout: bool = False  # kept only where dropout is on
    source: str


class Mamba2Layer(BaseModel):
    """cards/memory.yaml mamba2_layer: what Megatron-Core's Mamba-2 layer saves."""

    model_config = ConfigDict(extra="forbid")
    saves: list[MambaSave] = Field(min_length=1)
    source: str

    def terms(self) -> tuple[tuple[str, float | str, bool, str | None, None, bool], ...]:
        """The saves as hashable rows for a Layout (width, bytes, sp, dropped_by, kept_by: none here, dropout), the
        rows activations.saved_rows_bytes sums."""
        return tuple((s.width, s.bytes, s.sp, s.dropped_by, None, s.dropout) for s in self.saves)


def mamba_activations(shape: Shape, lay: Layout, sel: set[str]) -> float:
    """A Mamba-2 mixer's saved bytes for one micro-batch on one GPU (the layer's own norm input included), from the
    card's rows in lay.mamba: per token, each row's width over TP (over TP under SP for the hidden-wide rows)."""
    assert shape.mamba is not None
    return saved_rows_bytes(lay.mamba, dict(zip(MAMBA_WIDTHS, shape.mamba, strict=True)), lay, sel)


def hybrid_layer_activations(shape: Shape, lay: Layout, kind: str, recompute: str,
                             modules: tuple[str, ...] = ("core_attn",)) -> dict[str, float]:
    """Bytes per micro-batch of one layer of a hybrid model, by component: kind M (Mamba-2), G (Gated DeltaNet,
    arithmetic/gdn.py), * (attention), - (MLP) or E (MoE), each one norm and its mixer (Megatron-Core's MambaLayer and
    TransformerLayer with the other submodule an IdentityOp, as mamba_block.py builds them); a Mamba-2 or Gated
    DeltaNet layer's norm input is its mixer's own row. recompute: none | selective (Megatron's modules: core_attn
    reaches the attention layers, mlp and moe their own, gdn_norm_out the Gated DeltaNet's gated norm, layernorm every
    layer's norm output but a Gated DeltaNet's, whose norm is fused into its in_proj: cards/memory.yaml gdn_layer) |
    full (the layer's input). torchtitan's op-level SAC runs no hybrid model."""
    t, h = lay.tokens, shape.h
    ts = lay.tp if lay.sp else 1
    if recompute == "full":
        return {"layer_input": BF16 * t * h / ts}
    if recompute not in ("none", "selective"):
        raise ValueError(f"recompute {recompute!r}: no framework that trains a hybrid model runs it")
    sel = set(modules) if recompute == "selective" else set()
    if kind == "M":
        return {"mamba": mamba_activations(shape, lay, sel)}
    if kind == "G":
        return {"gdn": gdn_activations(shape, lay, sel)}
    out = {"norm_input": _norm(h, t, lay) / ts}
    if kind == "*":
        out["attention"] = _attention(shape, lay, sel, 1 if lay.fp8 else BF16)
        return out
    whole = layer_activations(shape, lay, kind == "E", recompute, modules)  # its MLP half: mlp or moe, dropout
    out.update({k: v for k, v in whole.items() if k in ("mlp", "moe", "dropout_masks")})
    return out


def least_kind_activations(shape: Shape, lay: Layout, recompute: str,
                           modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES) -> tuple[float, float, float, float]:
    """A hybrid's floor of one layer's bytes per micro-batch (the search's memory floors, search/floors.py): the least
    of its MoE layers, and of its Mamba-2, Gated DeltaNet, attention and MLP layers, under `recompute` with the
    `modules` the plans recompute (the search's: Megatron's default, as the estimate's for a plan naming none), then
    without recompute (what full recompute rebuilds); 0 for a kind it has none of. `lay` carries the card's Mamba-2 and
    Gated DeltaNet rows (memory_states.mixer_rows). A stage's layers of each kind hold at least count x these. It took
    every module (core_attn, layernorm, mlp, moe, moe_act, ...), which the search's plans never recompute: an MoE
    layer's selective floor left out its routed rows, so Qwen3-Next-80B-A3B's fell to 32 MiB where its plans keep
    about 10x that, and recommend estimated some 6,000 layouts the floor should have refused."""
    def least(mode: str, moe: bool) -> float:
        return min((sum(hybrid_layer_activations(shape, lay, kind, mode, modules).values())
                    for kind in shape.kinds if (kind == "E") == moe), default=0.0)
    return least(recompute, True), least(recompute, False), least("none", True), least("none", False)


# --------------------------------------------------------------------------- FLOPs


def mamba_gemms(arch: Architecture, sh: Shard) -> list[Gemm]:
    """A Mamba-2 layer's two GEMMs on one rank: in_proj (column-parallel: z, x, B, C, dt of the rank's heads and
    groups) and out_proj (row-parallel over the rank's d_inner / tp), over the tokens the rank's mixer sees (gathered
    under SP)."""
    m = arch.mamba
    assert m is not None
    width = 2 * m.d_inner + 2 * m.n_groups * m.state_size + m.num_heads
    return [Gemm("mamba_in_proj", sh.tokens, width / sh.tp, arch.hidden_size),
            Gemm("mamba_out_proj", sh.tokens, arch.hidden_size, m.d_inner / sh.tp)]


def ssd_scan_flops(arch: Architecture, sh: Shard) -> float:
    """Forward FLOPs on one rank of a Mamba-2 layer beside its GEMMs: the causal depthwise conv1d over x, B and C
    (conv_kernel taps each), and the SSD chunked scan as mamba_ssm's mamba_chunk_scan_combined runs it in chunks of
    chunk_size Q tokens (ops/triton/ssd_combined.py): per chunk and group C B^T (Q x Q x N, _bmm_chunk_fwd), per
    chunk and head the intra-chunk output (L o C B^T) X (Q x Q x P, _chunk_scan_fwd), the chunk's state B^T X (N x
    P per token, _chunk_state_fwd) and the output from the carried state C h (N x P per token, _chunk_scan_fwd);
    the state passing between chunks (heads x N x P per chunk) is left out, one chunk_size-th of the last term.
    Context parallelism trades tokens for heads (the all-to-all before the scan), so the product is the same."""
    m = arch.mamba
    assert m is not None
    heads, groups = m.num_heads / sh.tp, m.n_groups / sh.tp
    q, n, p = m.chunk_size, m.state_size, m.head_dim
    conv = 2 * m.conv_kernel * m.conv_dim / sh.tp
    scan = groups * 2 * q * n + heads * (2 * q * p + 4 * n * p)
    return sh.tokens * (conv + scan)
