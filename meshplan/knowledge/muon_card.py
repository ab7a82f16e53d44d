"""The framework card's facts about how it runs Muon (cards/frameworks/*.yaml `muon`): which weights take it, how
their Newton-Schulz iterations are shared out and on what, and at which ZeRO stages it runs. meshplan/arithmetic/
muon.py times and sizes it, rule PR005 refuses what the card does not run. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MuonFacts(_Card):
    """How the framework runs Muon's Newton-Schulz orthogonalization (meshplan/arithmetic/muon.py times it)."""

    tp_mode: Literal["blockwise", "duplicated", "distributed"] = Field(
        description="A tensor-parallel matrix: blockwise (each rank orthogonalizes its own shard), duplicated (each "
                    "rank all-gathers it and orthogonalizes the whole matrix), distributed (the iteration split "
                    "over the TP ranks)")
    ns_steps: int = Field(ge=1, description="Newton-Schulz iterations per matrix per step")
    split_qkv: bool = Field(description="The fused QKV weight orthogonalized as separate Q, K and V blocks per "
                                        "query group")
    matrices: Literal["fused", "per_module"] = Field(
        "fused", description="fused: the weights as Megatron-Core fuses them (QKV, the gated MLP's fc1), split_qkv "
                             "applying; per_module: each nn.Linear a matrix of its own (q, k, v, o, gate, up, down, "
                             "the router, every expert's)")
    assignment: Literal["layer_wise", "local_shard"] = Field(
        "layer_wise", description="layer_wise: whole matrices dealt out over the data-parallel ranks, each rank "
                                  "orthogonalizing about 1/dp of them (Megatron-Core's layer-wise distributed "
                                  "optimizer); local_shard: every rank orthogonalizes its own FSDP2 shard (rows / "
                                  "the shard group) of every matrix")
    ns_side: Literal["smaller", "rows"] = Field(
        "smaller", description="The side X X^T runs over: the matrix's smaller one (transposed first), or its rows "
                               "as stored (m x m with m the rows, whatever the columns)")
    ns_dtype: Literal["bf16", "fp32"] = Field(
        "bf16", description="The iterations' matmuls: BF16 tensor cores, or FP32 at torch's default precision "
                            "(timed at the GPU's fp32_flops)")
    max_aspect_ratio: float | None = Field(
        None, gt=1, description="None: the decoder's linear weights take Muon, the embedding and output layer Adam; "
                                "else every 2-D weight whose longer side is at most this many times its shorter, "
                                "embedding and output layer included, the rest Adam")
    step: str = Field("emerging_optimizers", description="The cards/memory.yaml muon_step entry of its step's "
                                                         "allocations")
    zero_stages: list[int] = Field(description="The ZeRO stages its Muon runs at (PR005 refuses the others)")
    zero_why: str = Field(description="Why the other ZeRO stages do not run it, in PR005's words")
    source: str
