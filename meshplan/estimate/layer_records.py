"""The records the per-layer time model passes around: what it needs (LayerContext, computed once per estimate),
what it returns (LayerTime), and the counted constants every part of it shares.

The model itself is in layer_time.py; its parts (attention, context parallelism, TP overlap, MoE, recompute,
LoRA) each have their own module beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from meshplan.arithmetic.comm import Links
from meshplan.arithmetic.flops import Shard
from meshplan.arithmetic.gemm import expert_ridge_rows
from meshplan.arithmetic.lora import LoraEngine
from meshplan.knowledge.calibration import Calibration
from meshplan.schema.model import Architecture
from meshplan.schema.plan import LoraSpec, Plan

BF16 = 2  # bytes per activation element on the wire
# Communication that runs once in the forward runs mirrored once in the backward (activations forward, their
# gradients backward; FSDP gathers the weights for each): a forward is half of it.
FORWARD_AND_BACKWARD = 2.0


@dataclass(frozen=True)
class TpSms:
    """The GPU's SMs and those its framework's TP overlap kernels hold beside each TP pair's GEMMs (attention's,
    the MLP's): the forward reduce-scatter's and the bulk dgrad reduce-scatter's (the card's tp_overlap)."""

    sms: int
    fprop_rs: tuple[int, int] = (0, 0)
    wgrad_rs: tuple[int, int] = (0, 0)
    wgrad_margin: bool = False


@dataclass(frozen=True, kw_only=True)
class LayerContext:
    """Everything the per-layer model needs, computed once per estimate (perf.layer_context builds it)."""

    arch: Architecture
    plan: Plan
    seq: int
    cal: Calibration
    lk: Links
    shard: Shard
    bf16_peak: float
    fp8_peak: float | None
    hbm: float
    flash: bool = True
    dropout: bool = False
    lora: LoraSpec | None = None  # a LoRA job's adapters (meshplan/arithmetic/lora.py); None: every weight trained
    lora_engine: LoraEngine | None = None
    a2a_steady_share: float = 0.0  # moe_a2a_overlap: the share of micro-batch chunks in the 1F1B steady state
    moe_host_syncs: float = 1.0  # device-to-host reads per MoE layer forward (moe_host_syncs: the dispatcher's)
    eager: bool = False  # blocks run as eager PyTorch ops (a compile switch left off): eager_elementwise_passes
    attention_fraction: float = 0.5  # of BF16 peak, the job's attention kernel on its GPU (attention_efficiency)
    attention_kernel: str | None = None  # that kernel's name (None: the shared fused-kernel fraction)
    routed_load: float = 1.0  # routed tokens on the most loaded EP rank over the mean (memory.ep_rank_load)
    tp_overlap_mode: str = "fraction"  # which TP collectives run beside a GEMM (tp_overlap_mode; tp_hidden)
    tp_rs_splits: int = 0  # chunks of a pipelined forward reduce-scatter (the card's tp_overlap.rs_splits; 0: tp)
    tp_sms: TpSms | None = None  # SMs the TP communication kernels hold beside their GEMMs (tp_sms; tp_hidden)

    @property
    def ridge_rows(self) -> float:
        return expert_ridge_rows(self.bf16_peak, self.hbm)


class ElementwiseLoad(NamedTuple):
    """What one layer's memory-bound work reads and writes per micro-batch: elements of its hidden-sized tensors
    (sequence-sharded under SP) and of its FFN activations by kind, and the MoE dispatcher's and router's bytes
    (forward + backward)."""

    hidden: float = 0.0
    routed_ffn: float = 0.0
    shared_ffn: float = 0.0
    dense_ffn: float = 0.0
    dispatch_bytes: float = 0.0
    router_bytes: float = 0.0


@dataclass
class LayerTime:
    """Seconds for one layer, one micro-batch, forward + backward, on one rank."""

    gemm: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0
    overhead: float = 0.0
    tp: float = 0.0
    cp: float = 0.0
    cp_fwd: float = 0.0  # forward share of cp (what full recompute repeats)
    ep: float = 0.0
    recompute: float = 0.0
    fwd_compute: float = 0.0  # forward share of gemm + attention + elementwise (recompute, overlap windows)
    attention_fwd: float = 0.0  # forward of the attention core alone (what selective recompute repeats)
    op_sac_fwd: float = 0.0  # forward of what torchtitan's op-level SAC does not keep (what its recompute repeats)
    module_fwd: dict[str, float] = field(default_factory=dict)  # forward of what each Megatron recompute module repeats

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.elementwise + self.overhead
