"""One accelerator and the node it usually sits in (the catalog: cards/hardware.yaml, knowledge/hardware.py)."""

# ruff: noqa: RUF012 (pydantic copies a mutable default per instance; ruff cannot see across files that StrictModel is a pydantic model)

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshplan.schema.choices import Fp8Recipe, StrictModel


class NcclRingCtas(StrictModel):
    """The CTAs (one per channel, each on an SM of its own) an NCCL ring all-gather, reduce-scatter or all-reduce of a
    large message holds on this GPU in its usual node, as NCCL's topology search sets its channels (cards/hardware.yaml
    header): inside one NVLink domain, and across nodes per GPU of a node in the group, up to a most."""

    nvlink: int = Field(ge=1, description="CTAs of a ring inside one NVLink domain")
    network_per_node_gpu: int = Field(ge=1, description="CTAs of a ring across nodes per GPU of a node in the group")
    network: int = Field(ge=1, description="The most CTAs of a ring across nodes")


class GpuSpec(StrictModel):
    """One accelerator and the node it usually sits in."""

    key: str
    name: str
    arch: Literal["ampere", "hopper", "blackwell", "cdna3"] | None = Field(
        None, description="GPU generation: which attention kernel a framework runs there and its fraction of peak "
                          "(cards/calibration.yaml attention_kernels); None: the shared attention_peak_fraction")
    memory_bytes: int = Field(gt=0)
    sm_count: int | None = Field(
        None, ge=1, description="Streaming multiprocessors (AMD: compute units); a GEMM beside a communication kernel "
                                "that holds some runs on the rest (perf.tp_hidden); None: that contention not modelled")
    bf16_flops: float = Field(gt=0, description="Dense BF16 peak, FLOP/s")
    fp8_flops: float | None = Field(None, description="Dense FP8 peak, FLOP/s (None: no FP8 tensor cores)")
    fp32_flops: float | None = Field(None, description="Dense FP32 peak without TF32, FLOP/s: a matmul at torch's "
                                                       "default fp32 precision (KempnerForge's Muon iterations)")
    hbm_bandwidth: float = Field(gt=0, description="bytes/s")
    intra_node_bandwidth: float = Field(gt=0, description="NVLink/xGMI bytes/s per GPU, one direction")
    nvlink_domain: int = Field(ge=1, description="GPUs in one NVLink/xGMI domain")
    point_to_point_node: int | None = Field(
        None, ge=2, description="The most GPUs of a node that NVLink joins point to point, with no NVSwitch (HGX "
                                "H100/H200 4-GPU baseboards: each GPU's links split evenly over the node's other "
                                "GPUs): a group of k of a node of n such GPUs reaches only the links to its own "
                                "members, (k - 1) / (n - 1) of intra_node_bandwidth (mesh.wired_node); None: every "
                                "node size switched")
    gpus_per_node: int = Field(ge=1)
    network_bandwidth: float = Field(gt=0, description="Scale-out bytes/s per GPU, one direction")
    host_bandwidth: float = Field(gt=0, description="GPU-host link (PCIe / NVLink-C2C) bytes/s per GPU, one direction")
    aliases: list[str] = []
    sources: list[str] = []
    notes: list[str] = []
    fp8_recipes: list[Fp8Recipe] = Field(
        default_factory=list, description="FP8 recipes its tensor cores run (Transformer Engine's support checks)"
    )
    nccl_ring_ctas: NcclRingCtas | None = Field(
        None, description="SMs an NCCL ring collective holds while it runs (arithmetic/comm.ring_sm_share); None: "
                          "the compute beside an overlapped collective is timed at the GPU's full speed")
    fp8_any_layout: bool = Field(False, description="FP8 GEMMs in any layout (Blackwell), so no fp8 transpose copy")
    power_limit_w: int | None = Field(
        None, gt=0, description="Board power (W) the peaks are rated at; the same board run under a lower "
                                "nvidia-smi power limit is a catalog part of its own (b200-750w), whose peaks the "
                                "card derives from the vendor's ratings; None: not stated")

