"""The framework card's facts about its MoE layer's own code (cards/frameworks/*.yaml `moe_host_syncs`): how many
times its dispatch stops the host to read routing counts back, how its experts reach their weights, what runs for
the all-to-all dispatcher and which engines run the flex one. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshplan.schema.choices import Engine, FlexBackend, Fp8Recipe
from meshplan.schema.hardware import GpuSpec


class MoeHostSyncs(BaseModel):
    """Device-to-host reads per MoE layer forward (each a `.tolist()` / `.item()` of counts the GPU computed, which the
    host waits for before it can issue the kernels that follow), where the framework's dispatcher is not
    Megatron-Core's one."""

    model_config = ConfigDict(extra="forbid")

    without_ep: int = Field(ge=0, description="With the experts all on the rank (ep 1)")
    with_ep: int = Field(ge=0, description="With expert parallelism (ep > 1)")
    source: str


class GroupedGemmLaunches(BaseModel):
    """How many kernels the framework's grouped GEMM launches per local expert, where it is not one kernel for all the
    experts: one GEMM per expert and pass, and under FP8 each expert's input and gradient quantized on their own. The
    estimate puts a floor of these launches under the routed experts' GEMM time (moe_time.expert_launch_floor)."""

    model_config = ConfigDict(extra="forbid")

    forward_gemms: int = Field(ge=0, description="GEMM launches per local expert in the forward (fc1, fc2)")
    backward_gemms: int = Field(ge=0, description="... in the backward (each linear's data and weight gradients)")
    forward_quantized: int = Field(ge=0, description="Tensors quantized per local expert in the forward (FP8)")
    backward_quantized: int = Field(ge=0, description="... in the backward (the output gradients, FP8)")
    quantize_kernels: dict[Fp8Recipe, int] = Field(
        description="Kernel launches per quantized tensor per FP8 recipe (0: one fused kernel for every expert)")
    engines: list[Engine] | None = Field(
        None, description="The card's engines that run this grouped GEMM (verl's and SkyRL's Megatron engine, not "
                          "their FSDP one, which trains transformers' MoE block); None: every engine of the card")
    source: str


class MoeExpertWeights(BaseModel):
    """How the framework's grouped GEMM reaches its local routed experts' weights, where it does not read them in
    place: stacked into new (experts, in, out) tensors on every MoE layer forward (a copy of the local experts'
    weights, read and written once per forward, and kept by the grouped GEMM for its backward)."""

    model_config = ConfigDict(extra="forbid")

    stacked_per_forward: bool
    source: str


def stacks_experts(facts: MoeExpertWeights | None) -> bool:
    """Whether the framework's MoE layers stack their local experts' weights into new tensors on every forward (the
    card's moe_expert_weights)."""
    return facts is not None and facts.stacked_per_forward


class MoeDispatch(BaseModel):
    """What runs where a plan asks for the all-to-all token dispatcher, where the framework has none of its own."""

    model_config = ConfigDict(extra="forbid")

    alltoall_as: Literal["alltoall", "allgather"] = Field(
        description="allgather: the EP group's tokens are all-gathered, every local expert runs on them, the output "
                    "is all-reduced (estimate/moe_time.gather_ep)")
    source: str


class FlexDispatcherEngines(BaseModel):
    """The framework's engines besides Megatron-Core's that run Megatron-Core's flex dispatcher (DeepEP / HybridEP),
    vendored into their own MoE layer (rule EP007)."""

    model_config = ConfigDict(extra="forbid")

    engines: list[Engine]
    source: str


class FlexBackendGpus(BaseModel):
    """The GPUs a flex dispatcher backend runs on for a framework: its generations, and beside them the parts the
    framework names (Megatron-Bridge matches torch's device name: 'NVIDIA B200', 'NVIDIA B300', which the catalog's
    part names begin with, GB200's 'NVIDIA GB200' not)."""

    model_config = ConfigDict(extra="forbid")

    arches: list[str] = Field(description="GPU generations (cards/hardware.yaml arch) it runs on")
    parts: list[str] = Field(default_factory=list, description="Beside them, parts whose name begins with one of these")

    def takes(self, gpu: GpuSpec) -> bool:
        return gpu.arch in self.arches or any(gpu.name.startswith(part) for part in self.parts)

    def words(self) -> str:
        return ", ".join([*self.arches, *(p.removeprefix("NVIDIA ") for p in self.parts)])


class FlexBackends(BaseModel):
    """The flex dispatcher backends the framework's release (the card's) takes and the GPUs each runs on, from its
    validator (rule EP013)."""

    model_config = ConfigDict(extra="forbid")

    backends: dict[FlexBackend, FlexBackendGpus]
    source: str

    def runs(self, backend: str) -> FlexBackendGpus | None:
        """Where `backend` runs (None: the release has no such backend)."""
        return self.backends.get(backend)  # type: ignore[call-overload]


class MoeRoutingFacts(BaseModel):
    """How the framework says 'balanced routing' (Job.moe_routing_imbalance 1.0), and why meshplan does not write it:
    the rendered config's note on routing imbalance."""

    model_config = ConfigDict(extra="forbid")

    force_balance_key: str = Field(description="The framework's switch that forces balanced routing")
    note: str = Field(description="What a rendered MoE config says about routing; {imbalance} is the estimate's")
    source: str
