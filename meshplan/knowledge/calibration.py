"""The throughput model's few calibration constants, read from cards/calibration.yaml.

Constants are data with a source and a note on how they were fitted, never literals in the cost
model. `Calibration` is the flat, frozen view the cost model reads (fast attribute access in the
hot path); a framework may override a handful of entries where its runtime differs (e.g. which
attention kernel it uses). The benchmark refits the constants by passing overrides.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache
from itertools import pairwise
from statistics import median

from pydantic import BaseModel, ConfigDict, Field, field_validator

from meshplan.knowledge.cards import CardError, checked_once, load_card
from meshplan.knowledge.hardware import get_gpu

# Flash attention's backward recomputes the scores: five matmuls (S, dV, dP, dQ, dK) to the forward's two, 2.5x
# the forward FLOPs, so forward + backward = 3.5x (Dao-AILab/flash-attention benchmark_flash_attention.py flops()).
FLASH_ATTENTION_PASSES_PER_FORWARD = 3.5


class Constant(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: float
    unit: str = ""
    meaning: str
    source: str
    fitted: str | None = Field(None, description="What data it was fitted on; None = taken from the source")


class FrameworkOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    values: dict[str, float]
    summary: str = Field(description="What the constants were fitted on, as a throughput report states it")
    source: str


class MeasuredAttention(BaseModel):
    """A kernel's published forward and backward rates on one GPU, shape by shape (the same shapes in both lists),
    FLOPs counted the flash way (causal halved; the backward 2.5x the forward): what its fraction of BF16 peak on
    that GPU's generation is derived from (measured_fraction)."""

    model_config = ConfigDict(extra="forbid")

    gpu: str = Field(description="The catalog GPU (cards/hardware.yaml key) the rates were measured on")
    forward_tflops: list[float] = Field(min_length=1)
    backward_tflops: list[float] = Field(min_length=1)
    cited: str = Field(description="The measurement in a few words, as the throughput report names it")
    source: str

    @field_validator("forward_tflops", "backward_tflops")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(x <= 0 for x in v):
            raise ValueError("every rate must be positive")
        return v


class AttentionKernel(BaseModel):
    """One attention kernel's fraction of BF16 peak per GPU generation (forward + backward, FLOPs counted the flash
    way); a generation it does not list takes the shared attention_peak_fraction."""

    model_config = ConfigDict(extra="forbid")

    by_arch: dict[str, float] = Field(default_factory=dict, description="GPU arch (cards/hardware.yaml) -> fraction")
    local_tiles: dict[int, tuple[int, int]] = Field(
        default_factory=dict, description="Head dim (the kernel's rounded-up size) -> (block_m, block_n) of the "
                                          "forward tiles it runs a sliding window with: it computes whole tiles, "
                                          "so a window attends the key blocks its query block overlaps "
                                          "(flops.tiled_window_keys); empty: the keys the window leaves, exactly")
    local_tiles_source: str = ""
    runs_on: list[str] = Field(
        default_factory=list, description="The GPU archs its library runs on (empty: every one): an attention_backend "
                                          "whose kernel does not run on the job's GPU is refused (rule AT003)")
    assumed_on: list[str] = Field(
        default_factory=list, description="GPU archs on which no published measured figure for the kernel was found: "
                                          "it takes the shared attention_peak_fraction there (or assumed_from's "
                                          "fraction) as an assumption, and the throughput report says so "
                                          "(attention_fraction_assumed)")
    assumed_from: str | None = Field(
        None, description="The kernel whose fraction this one takes where it is assumed_on (a bound the sources give: "
                          "AOTriton measured no faster than CK on MI300X); None: the shared attention_peak_fraction")
    measured: dict[str, MeasuredAttention] = Field(
        default_factory=dict, description="GPU arch -> the kernel's published forward and backward rates there, "
                                          "its fraction on that arch derived from them (measured_fraction); the "
                                          "throughput report cites them")
    meaning: str
    source: str
    fitted: str | None = None

    def tiles_for(self, head_dim: int) -> tuple[int, int] | None:
        """The (block_m, block_n) the kernel runs a `head_dim` window with: the smallest listed head dim at least
        as wide (the kernel rounds the head size up to its instantiations), or None."""
        wide = [d for d in self.local_tiles if d >= head_dim]
        return self.local_tiles[min(wide)] if wide else None


class FlexBackend(BaseModel):
    """One flex dispatcher backend's achieved bandwidth inside an NVLink domain per GPU generation: the bytes a rank
    receives per second (its own rank's included), at the SMs Megatron runs it on; one figure, or, where the backend's
    own tables measure it at several rank counts of one domain, a figure per rank count (HybridEP on GB200 NVL72, whose
    copies slow as the ranks grow), read between them by `at_ranks`. A generation it does not list runs at NVLink's
    (cards/calibration.yaml flex_dispatch)."""

    model_config = ConfigDict(extra="forbid")

    by_arch: dict[str, float | dict[int, float]] = Field(
        description="GPU arch (cards/hardware.yaml) -> bytes/s, or -> {ranks in the domain: bytes/s}")
    permute_passes: float = Field(
        ge=0, description="bf16 passes over the routed copies, forward + backward, that Megatron-Core's flex "
                          "dispatcher runs on this backend outside its dispatch and combine kernels (its permute and "
                          "unpermute); what the alltoall dispatcher's moe_dispatch_passes counts for it")
    permute_source: str = Field(description="Where permute_passes is counted from")
    sms: int = Field(ge=1, description="SMs the backend's dispatch and combine kernels run on (Megatron's setting), "
                                       "which compute beside them under moe_a2a_overlap cannot use "
                                       "(arithmetic/comm.alltoall_sm_share)")
    sms_source: str = Field(description="Where sms is read from")
    meaning: str
    source: str

    @field_validator("by_arch")
    @classmethod
    def _positive(cls, v: dict[str, float | dict[int, float]]) -> dict[str, float | dict[int, float]]:
        for bw in v.values():
            table = bw if isinstance(bw, dict) else {1: bw}
            if not table or any(r < 1 or b <= 0 for r, b in table.items()):
                raise ValueError(f"a flex dispatch bandwidth must be positive bytes/s at one or more ranks: {v}")
        return v

    def points(self, arch: str | None) -> tuple[tuple[int, float], ...]:
        """(ranks, bytes/s) of `arch`, in rank order: one point (at 1 rank) for a single figure; () unlisted."""
        bw = self.by_arch.get(arch) if arch is not None else None
        if bw is None:
            return ()
        return tuple(sorted(bw.items())) if isinstance(bw, dict) else ((1, bw),)


def at_ranks(points: tuple[tuple[int, float], ...], ranks: float) -> float:
    """The bandwidth of `points` (FlexBackend.points) at `ranks` in one domain: linear between the two listed rank
    counts around it; below the first, the first's; past the last, the last's (no published figure beyond it). 0.0
    where there are no points (the dispatch then runs at NVLink's)."""
    if not points:
        return 0.0
    if ranks <= points[0][0]:
        return points[0][1]
    for (lo, lo_bw), (hi, hi_bw) in pairwise(points):
        if ranks <= hi:
            return lo_bw + (hi_bw - lo_bw) * (ranks - lo) / (hi - lo)
    return points[-1][1]


class GdnKernel(BaseModel):
    """FLA's chunked gated delta rule as Gated DeltaNet layers run it (cards/calibration.yaml gdn_kernel): the chunk
    length its matrices, states and matmuls are counted at, which no config.json states."""

    model_config = ConfigDict(extra="forbid")

    chunk_size: int = Field(ge=1)
    meaning: str
    source: str


class ActivationCode(BaseModel):
    """One code's FFN activation passes (cards/calibration.yaml activation_passes.codes): the constant its FFN term
    was counted or fitted with SwiGLU inside (`base`), and each activation's (forward, backward) bf16 passes over
    the activation's output width."""

    model_config = ConfigDict(extra="forbid")

    base: str = Field(description="The Calibration constant this code's FFN term starts from")
    base_holds: str | None = Field(
        None, description="The code whose reference activation the base constant holds, where another code's (the "
                          "unfused functions' elementwise_passes holds the fused SwiGLU); None: this code's own")
    passes: dict[str, tuple[float, float]] = Field(description="activation key -> (forward, backward) passes")
    expert_bias: tuple[float, float] = Field((0.0, 0.0), description="(forward, backward) passes over the routed "
                                                                     "copies x hidden of a per-expert fc2 bias loop")
    routed_weighting: tuple[float, float] = Field(
        (0.0, 0.0), description="(forward, backward) passes over the routed copies x expert width of the routing-"
                                "probability multiply where the code runs it apart from the activation's kernel")
    source: str

    @field_validator("passes")
    @classmethod
    def _non_negative(cls, v: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        if any(f < 0 or b < 0 for f, b in v.values()):
            raise ValueError(f"activation passes must be non-negative: {v}")
        return v


class ActivationPasses(BaseModel):
    """The FFN activation's memory-bound passes per code and activation (cards/calibration.yaml activation_passes),
    read by arithmetic/activation_passes.py."""

    model_config = ConfigDict(extra="forbid")

    meaning: str
    reference: str = Field(description="The activation every code's base constant holds")
    fusable: list[str] = Field(description="The activations Megatron-Core's bias_activation_fusion takes (its "
                                           "TransformerConfig refuses the switch for any other)")
    fusable_source: str
    codes: dict[str, ActivationCode]


class RLConstants(BaseModel):
    """The constants of RL jobs' rollout engines (meshplan/rl/engine.py, step_time.py), apart from the training cost
    model's: each named, so a card missing one is refused at load."""

    model_config = ConfigDict(extra="forbid")

    cuda_graph_bytes: Constant
    eager_launch_s_per_kernel: Constant
    response_drain_segments: Constant


class CalibrationCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str
    summary: str = Field(description="What the shared constants were fitted on, as a throughput report states it")
    constants: dict[str, Constant]
    frameworks: dict[str, FrameworkOverride] = {}
    attention_kernels: dict[str, AttentionKernel] = Field(
        default_factory=dict, description="Attention kernels a framework card can name (its attention section)")
    flex_dispatch: dict[str, FlexBackend] = Field(
        default_factory=dict, description="Megatron-Core's flex dispatcher backends (deepep, hybridep) in one NVLink "
                                          "domain: what their SM-run copies reach")
    gdn_kernel: GdnKernel = Field(description="FLA's chunked gated delta rule (Gated DeltaNet layers)")
    activation_passes: ActivationPasses = Field(description="The FFN activation's passes per code and activation")
    rl: RLConstants = Field(description="RL jobs' rollout-engine constants, apart from the training cost model's")
    fit_report: list[str] = []


@dataclass(frozen=True)
class Calibration:
    """Every constant of the cost model; names match the keys of cards/calibration.yaml."""

    gemm_peak_fraction: float
    gemm_half_dim: float
    fp8_gemm_relative_efficiency: float
    attention_peak_fraction: float
    softmax_bytes_per_score_fwd: float
    softmax_bytes_per_score_bwd: float
    dropout_bytes_per_score_fwd: float
    dropout_bytes_per_score_bwd: float
    hbm_efficiency: float
    elementwise_passes: float
    hybrid_layer_hidden_share: float
    mamba_inner_passes: float
    mamba_conv_passes: float
    mamba_state_passes: float
    mamba_group_passes: float
    mamba_scan_passes: float
    gdn_key_passes: float
    gdn_value_passes: float
    gdn_conv_passes: float
    gdn_chunk_passes: float
    gdn_state_passes: float
    gdn_norm_passes: float
    unfused_rope_passes: float
    eager_elementwise_passes: float
    hf_eager_hidden_passes: float
    hf_eager_query_passes: float
    hf_eager_key_value_passes: float
    hf_eager_qk_norm_passes: float
    hf_eager_ffn_passes: float
    hf_eager_dispatch_passes: float
    optimizer_bytes_per_param: float
    muon_bytes_per_param: float
    grad_accum_bytes_per_param: float
    cross_entropy_bytes_per_logit: float
    layer_overhead_s: float
    forward_share_of_layer_overhead: float
    moe_dispatch_passes: float
    moe_router_bytes_per_logit: float
    moe_gemm_half_ridges: float
    moe_host_sync_s: float
    grouped_gemm_launch_s: float
    host_time_per_layer_s: float
    nvlink_efficiency: float
    network_efficiency: float
    latency_intra_s: float
    latency_inter_s: float
    pp_latency_inter_s: float
    ring_nic_scaling: float
    tp_overlap: float
    dp_overlap: float
    param_gather_overlap: float
    zero_grad_allreduce: float
    zero_grad_overlap: float
    pp_overlap: float
    pp_host_sync: float
    pp_cross_sync_per_layer_s: float
    cp_overlap: float
    grad_reduce_bytes: float
    fsdp_hybrid_allreduce_last_microbatch: float

    def with_overrides(self, **values: float) -> Calibration:
        return replace(self, **values)


CALIBRATION_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Calibration))


def calibration_card() -> CalibrationCard:
    """cards/calibration.yaml, checked to hold exactly the cost model's constants (once per loaded card:
    checked_once)."""
    return checked_once(load_card("calibration", CalibrationCard), _matches)


def _matches(card: CalibrationCard) -> None:
    missing = set(CALIBRATION_KEYS) - set(card.constants)
    unknown = set(card.constants) - set(CALIBRATION_KEYS)
    bad_fw = {k for fw in card.frameworks.values() for k in fw.values} - set(CALIBRATION_KEYS)
    act = card.activation_passes
    bad_base = {c.base for c in act.codes.values()} - set(CALIBRATION_KEYS)
    no_reference = [name for name, c in act.codes.items() if act.reference not in c.passes]
    if bad_base or no_reference:
        raise CardError(
            "cards/calibration.yaml activation_passes: "
            f"unknown base constants {sorted(bad_base)}, codes without the reference {act.reference!r}: "
            f"{no_reference}.",
            fix=f"Each code's base is one of the constants, and each lists {act.reference!r}.")
    for name, kernel in card.attention_kernels.items():
        both = (set(kernel.measured) & (set(kernel.by_arch) | set(kernel.assumed_on))) | \
            (set(kernel.by_arch) & set(kernel.assumed_on))
        unequal = [arch for arch, m in kernel.measured.items() if len(m.forward_tflops) != len(m.backward_tflops)]
        if both or unequal or (kernel.assumed_from is not None and kernel.assumed_from not in card.attention_kernels):
            raise CardError(
                f"cards/calibration.yaml attention_kernels {name}: archs with more than one of measured, by_arch and "
                f"assumed_on {sorted(both)}, measured rates of unequal lengths on {unequal}, or an unknown "
                f"assumed_from {kernel.assumed_from!r}.",
                fix="Give each arch one basis; pair every forward rate with its shape's backward rate.")
    if missing or unknown or bad_fw:
        raise CardError(
            "cards/calibration.yaml does not match the cost model: "
            f"missing {sorted(missing)}, unknown {sorted(unknown | bad_fw)}.",
            fix=f"Keys must be exactly: {', '.join(CALIBRATION_KEYS)}.",
        )


@cache
def calibration(framework: str | None = None) -> Calibration:
    """The calibrated constants, with `framework`'s overrides applied (cached)."""
    card = calibration_card()
    values = {k: c.value for k, c in card.constants.items()}
    if framework and framework in card.frameworks:
        values.update(card.frameworks[framework].values)
    return Calibration(**values)


def attention_fraction(cal: Calibration, kernel: str | None, arch: str | None) -> float:
    """Fraction of BF16 peak `kernel` reaches on a GPU of generation `arch`: its attention_kernels entry (a figure,
    or one derived from its measured rates there, measured_fraction), where it is assumed the fraction of the kernel
    it is assumed_from, else the shared attention_peak_fraction (the fused cuDNN / FlashAttention-3 class the
    Megatron data were fitted with)."""
    kernels = calibration_card().attention_kernels
    if kernel is not None and kernel not in kernels:
        raise CardError(f"No attention kernel {kernel!r} in cards/calibration.yaml attention_kernels.",
                        fix=f"A framework card's attention section names one of: {', '.join(sorted(kernels))}.")
    entry = kernels.get(kernel) if kernel else None
    if entry is None or arch is None:
        return cal.attention_peak_fraction
    if arch in entry.measured:
        return _measured_on(kernel, arch)
    if arch in entry.by_arch:
        return entry.by_arch[arch]
    if arch in entry.assumed_on and entry.assumed_from is not None:
        return attention_fraction(cal, entry.assumed_from, arch)
    return cal.attention_peak_fraction


@cache
def _measured_on(kernel: str, arch: str) -> float:
    """measured_fraction of `kernel`'s rates on `arch`, worked out once (the search asks it per plan)."""
    return measured_fraction(calibration_card().attention_kernels[kernel].measured[arch])


def measured_fraction(measured: MeasuredAttention) -> float:
    """A training step's fraction of BF16 peak from a kernel's measured forward and backward rates: per shape, the
    forward's FLOPs F at the forward rate and the backward's (FLASH_ATTENTION_PASSES_PER_FORWARD - 1) x F at the
    backward rate take F / f + 2.5 F / b, the time the step's 3.5 F take at the fraction
    3.5 / (peak / f + 2.5 peak / b); the median over the measured shapes."""
    peak = get_gpu(measured.gpu).bf16_flops / 1e12
    backward = FLASH_ATTENTION_PASSES_PER_FORWARD - 1.0
    return median(FLASH_ATTENTION_PASSES_PER_FORWARD / (peak / f + backward * peak / b)
                  for f, b in zip(measured.forward_tflops, measured.backward_tflops, strict=True))


def attention_fraction_assumed(kernel: str | None, arch: str | None) -> bool:
    """Whether `kernel`'s fraction on `arch` is an assumption (its attention_kernels entry's assumed_on: ROCm's
    AOTriton attention on MI300X, for want of a published measured fraction of peak)."""
    entry = calibration_card().attention_kernels.get(kernel) if kernel else None
    return entry is not None and arch is not None and arch in entry.assumed_on


def attention_fraction_measured(kernel: str | None, arch: str | None) -> MeasuredAttention | None:
    """The published rates `kernel`'s fraction on `arch` is derived from (its entry's measured: CK's attention on
    MI300X, from AMD's aiter table), or None."""
    entry = calibration_card().attention_kernels.get(kernel) if kernel else None
    return entry.measured.get(arch) if entry is not None and arch is not None else None


def attention_kernel_runs(kernel: str | None, arch: str | None) -> bool:
    """Whether `kernel` runs on a GPU of generation `arch` (its attention_kernels entry's runs_on; a kernel or arch
    the card does not pin: yes). cuDNN's does not on AMD GPUs."""
    entry = calibration_card().attention_kernels.get(kernel) if kernel else None
    return entry is None or arch is None or not entry.runs_on or arch in entry.runs_on


def flex_dispatch_points(backend: str, arch: str | None) -> tuple[tuple[int, float], ...]:
    """(ranks in one NVLink domain, bytes/s a rank receives) of `backend`'s flex dispatch or combine on a GPU of
    generation `arch` (cards/calibration.yaml flex_dispatch; FlexBackend.points), () where the card has no figure
    for it (the dispatch then runs at NVLink's bandwidth)."""
    backends = calibration_card().flex_dispatch
    if backend not in backends:
        raise CardError(f"No flex dispatcher backend {backend!r} in cards/calibration.yaml flex_dispatch.",
                        fix=f"The backends are: {', '.join(sorted(backends))}.")
    return backends[backend].points(arch)


def flex_permute_passes(backend: str) -> float:
    """bf16 passes over the routed copies, forward + backward, that the flex dispatcher on `backend` runs beside its
    communication kernels (cards/calibration.yaml flex_dispatch permute_passes): DeepEP's permute after the dispatch
    and unpermute before the combine, none on HybridEP, whose kernels permute as they copy."""
    backends = calibration_card().flex_dispatch
    if backend not in backends:
        raise CardError(f"No flex dispatcher backend {backend!r} in cards/calibration.yaml flex_dispatch.",
                        fix=f"The backends are: {', '.join(sorted(backends))}.")
    return backends[backend].permute_passes


def flex_sms(backend: str) -> int:
    """SMs the flex dispatcher's `backend` runs its dispatch and combine kernels on (cards/calibration.yaml
    flex_dispatch sms: DeepEP at Megatron-Core's 20, HybridEP at Megatron-Bridge's 32)."""
    backends = calibration_card().flex_dispatch
    if backend not in backends:
        raise CardError(f"No flex dispatcher backend {backend!r} in cards/calibration.yaml flex_dispatch.",
                        fix=f"The backends are: {', '.join(sorted(backends))}.")
    return backends[backend].sms


def flex_dispatch_bandwidth(backend: str, arch: str | None, ranks: int = 8) -> float | None:
    """Bytes/s a rank receives in `backend`'s flex dispatch or combine over `ranks` ranks of one NVLink domain on a
    GPU of generation `arch` (flex_dispatch_points read by at_ranks), or None where the card has no figure for it."""
    return at_ranks(points, ranks) if (points := flex_dispatch_points(backend, arch)) else None


def attention_tiles(kernel: str | None, head_dim: int) -> tuple[int, int] | None:
    """(block_m, block_n) of the forward tiles `kernel` runs a sliding window of `head_dim` heads with (its
    attention_kernels entry's local_tiles), or None where the card counts none (the window's keys exactly)."""
    entry = calibration_card().attention_kernels.get(kernel) if kernel else None
    return entry.tiles_for(head_dim) if entry is not None else None


def calibration_summary(framework: str | None = None) -> str:
    """What the constants `framework` runs with were fitted on: its override's summary, else the card's."""
    card = calibration_card()
    override = card.frameworks.get(framework) if framework else None
    return override.summary if override is not None else card.summary
