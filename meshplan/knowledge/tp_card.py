"""The framework card's facts about its tensor parallelism (cards/frameworks/*.yaml `tp_overlap`, `moe_tp`): which
TP collectives it runs beside a GEMM, and how TP cuts an MoE block. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshplan.knowledge.release_lines import in_any_line


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


TpOverlapMode = Literal["fraction", "none", "wgrad", "local_shard", "userbuffers", "async_tp"]


class MoeTensorParallel(_Card):
    """How tensor parallelism cuts an MoE block, where the framework does not do it Megatron-Core's way (shared experts
    over TP, routed experts over ETP, the TP ranks' sequence shards pooled into the EP group)."""

    whole_over_tp: bool = Field(description="True: TP leaves the MoE block whole (router, routed and shared experts "
                                            "replicated over the TP ranks) and every TP rank runs it on the whole "
                                            "micro-batch (no sequence parallelism into it)")
    source: str


class SpLayoutCopies(_Card):
    """The copies torch's functional collectives make around each sequence-parallel collective of a TP plan that
    shards the activations on the sequence dim of [batch, seq, hidden] (DTensor's ParallelStyles with Shard(1)), where
    the collective runs unfused (no TP overlap switch). NCCL gathers and scatters along dim 0, so all_gather_tensor
    re-lays the gathered result out by torch.cat of its chunks along the sequence dim, and reduce_scatter_tensor cats
    the input's sequence chunks along dim 0 before it: one copy of the whole activation each, read and written on the
    compute stream (estimate/tp_overlap.sp_copies). Async TP's fused ops move the sequence dim to the front instead
    (a view) and copy nothing."""

    releases: list[str] = Field(description="The framework's releases whose TP plan shards activations that way")
    gather_copy_at_batch_one_releases: list[str] = Field(
        [], description="Those whose all-gather copies even at micro-batch 1 (torch before it returned a view when "
                        "every dim before the sequence dim is 1); the others' all-gather at micro-batch 1 is a view")
    source: str

    def copies(self, release: str | None, micro_batch_size: int) -> tuple[float, float]:
        """(copies per all-gather, per reduce-scatter) of `release` at `micro_batch_size`: (0, 0) for a release the
        card does not list (an unread one: none counted)."""
        if not in_any_line(release, self.releases):
            return 0.0, 0.0
        gather = micro_batch_size > 1 or in_any_line(release, self.gather_copy_at_batch_one_releases)
        return (1.0 if gather else 0.0), 1.0


class AsyncTpInputGrads(_Card):
    """Which TP pairs' backward reduce-scatter async TP leaves unfused: Inductor's micro-pipeline pass
    (torch/_inductor/fx_passes/micro_pipeline_tp.py fuse_matmul_reduce_scatter, _find_producer_matmul) fuses a
    reduce-scatter only of one matmul's output, and a pair's input gradient is the sum of the data gradients of the
    column-parallel linears reading that input: attention's where Q, K and V are separate linears (the memory
    convention's qkv_projections), a gated MLP's where gate and up are (`gate_up_separate`). That reduce-scatter runs
    as without the switch, after its GEMMs (estimate/tp_overlap.exposed_tp)."""

    gate_up_separate: bool = Field(description="The model code runs a gated MLP's gate and up as two linears")
    source: str


class TpOverlapFacts(_Card):
    """Which TP/SP collectives the framework runs beside a GEMM, without and with its TP overlap switch
    (Plan.tp_comm_overlap); meshplan/estimate/tp_overlap.py tp_hidden turns each mode into the time hidden, at most that
    GEMM's."""

    base: TpOverlapMode = Field(description="Without the switch: none; wgrad (the column-parallel backward's "
                                           "reduce-scatter beside the weight-gradient GEMM); local_shard (the "
                                           "column-parallel linear's forward all-gather beside its local shard's "
                                           "GEMM, the row-parallel backward's gradient gather beside its local "
                                           "shard's data-gradient GEMM, the column-parallel backward's input "
                                           "re-gather beside its data-gradient GEMM and its reduce-scatter beside "
                                           "its weight-gradient GEMM; the forward reduce-scatter exposed); fraction "
                                           "(the calibration's tp_overlap, where the framework's own TP is unread)")
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
    sp_layout_copies: SpLayoutCopies | None = Field(
        None, description="Without the switch, the copies DTensor makes around each sequence-parallel collective "
                          "(SpLayoutCopies); None: none")
    async_tp_input_grads: AsyncTpInputGrads | None = Field(
        None, description="With the async_tp switch, the pairs whose input-gradient reduce-scatter stays unfused "
                          "(AsyncTpInputGrads); None: every one fused")
    backward_input_gather: bool = Field(
        False, description="Under sequence parallelism the column-parallel linear saves its input's sequence shard and "
                           "all-gathers the input again in the backward for its weight gradient: one more all-gather "
                           "per TP pair backward (estimate/tp_overlap.tp_ring_passes)")
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
