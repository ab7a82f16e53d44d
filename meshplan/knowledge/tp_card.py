"""The framework card's facts about its tensor parallelism (cards/frameworks/*.yaml `tp_overlap`, `moe_tp`): which
TP collectives it runs beside a GEMM, and how TP cuts an MoE block. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


TpOverlapMode = Literal["fraction", "none", "wgrad", "userbuffers", "async_tp"]


class MoeTensorParallel(_Card):
    """How tensor parallelism cuts an MoE block, where the framework does not do it Megatron-Core's way (shared experts
    over TP, routed experts over ETP, the TP ranks' sequence shards pooled into the EP group)."""

    whole_over_tp: bool = Field(description="True: TP leaves the MoE block whole (router, routed and shared experts "
                                            "replicated over the TP ranks) and every TP rank runs it on the whole "
                                            "micro-batch (no sequence parallelism into it)")
    source: str


class TpOverlapFacts(_Card):
    """Which TP/SP collectives the framework runs beside a GEMM, without and with its TP overlap switch
    (Plan.tp_comm_overlap); meshplan/estimate/tp_overlap.py tp_hidden turns each mode into the time hidden, at most that
    GEMM's."""

    base: TpOverlapMode = Field(description="Without the switch: none; wgrad (the column-parallel backward's "
                                           "reduce-scatter beside the weight-gradient GEMM); fraction (the "
                                           "calibration's tp_overlap, where the framework's own TP is unread)")
    switch: Literal["userbuffers", "async_tp"] | None = Field(
        None, description="With the switch: userbuffers (Transformer Engine: every all-gather and reduce-scatter "
                          "pipelined with, or in bulk beside, its GEMM), async_tp (torch's micro-pipelined "
                          "all-gather-matmul / matmul-reduce-scatter); None: no switch")
    default: bool = False  # the framework's own default (a request that leaves tp_comm_overlap out gets it)
    rs_splits: int = Field(0, ge=0, description="Chunks a pipelined forward reduce-scatter is split into (0: tp)")
    fprop_rs_sms: tuple[int, int] = Field(
        (0, 0), description="With the switch: SMs the pipelined forward reduce-scatter kernel holds beside attention's "
                            "and the MLP's output GEMM, which are launched on the GPU's other SMs (perf.tp_hidden)")
    fp8_fprop_rs_sms: tuple[int, int] | None = Field(
        None, description="The same where the GEMMs run in FP8, if the framework's FP8 configs set other ones; None: "
                          "fprop_rs_sms")
    wgrad_rs_sms: tuple[int, int] = Field(
        (0, 0), description="With the switch: SMs the bulk dgrad reduce-scatter kernel holds beside attention's and "
                            "the MLP's input-side weight-gradient GEMM")
    wgrad_rs_sm_margin: bool = Field(
        False, description="That weight-gradient GEMM launched on the other SMs for its whole time (Transformer "
                           "Engine's set_sm_margin); False: it shares them only while the kernel runs")
    comm_sms_source: str = ""
    needs_sequence_parallel: bool = False
    needs_compile: bool = False
    source: str


class TpInputLinears(_Card):
    """Where the framework's TP plan turns a TP pair's input into what its column-parallel linears read: once per pair
    (Megatron-Core's fused QKV and FC1, torchtitan's PrepareModuleInput on the attention and feed-forward modules), or,
    here, once per column-parallel linear, each through its own DTensor redistribution. Each such linear then
    gathers the input in the forward and reduces its own share of the input's gradient in the backward (a
    reduce-scatter under sequence parallelism, else an all-reduce); the forward's repeated gathers of one tensor are
    one where torch.compile traces the block (AOTAutograd's common-subexpression pass), the backward's reductions
    of different gradients stay one per linear."""

    attention: int = Field(ge=1, description="Column-parallel linears reading the attention input (q, k, v: 3)")
    gated_mlp: int = Field(ge=1, description="Column-parallel linears reading a gated MLP's input (gate, up: 2)")
    mlp: int = Field(ge=1, description="Column-parallel linears reading a plain MLP's input")
    compile_merges_gathers: bool = Field(description="Under torch.compile the forward gathers of one input are one")
    source: str


class OutputHeadTp(_Card):
    """How the framework's TP cuts the output head where it is not Megatron-Core's vocabulary-parallel linear always."""

    whole_without_sp: bool = Field(description="Without sequence parallelism the head is not parallelized: every TP "
                                               "rank holds the whole vocabulary's weight and computes all its logits")
    source: str


def head_tp(facts: OutputHeadTp | None, tp: int, sequence_parallel: bool) -> int:
    """The TP ways the output head's vocabulary is split: tp, or 1 where the card leaves it whole without sequence
    parallelism."""
    return 1 if facts is not None and facts.whole_without_sp and not sequence_parallel else tp
