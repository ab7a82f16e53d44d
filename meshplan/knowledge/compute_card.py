"""The framework card's facts about what its own switches compute (cards/frameworks/*.yaml `recompute`, `compile`,
`attention`): what its selective recompute saves, what torch.compile compiles, which attention kernel it
runs on each GPU generation (Muon: muon_card.py). Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.knowledge.release_lines import in_any_line, in_line, longest_line
from meshplan.schema.choices import AttentionBackend, Engine


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecomputeSemantics(_Card):
    """What the framework's own `selective` recompute saves (activations.py models each): Megatron-Core's
    core-attention recompute, or torchtitan's op-level SAC (outputs of the compute-intensive ops kept except
    every second mm)."""

    selective: Literal["core_attention", "op_sac"] = "core_attention"
    source: str | None = None
    # op_sac: the attention kernels a release's save list does not hold (release prefix -> kernels, as the attention
    # section's kernel names): with one of them, op-level SAC recomputes the attention in the backward and keeps
    # neither its output nor its log-sum-exp
    unsaved_attention: dict[str, list[str]] = {}
    unsaved_attention_source: str | None = None

    def recomputes_attention(self, release: str | None, kernel: str | None) -> bool:
        """Whether op-level SAC of `release` recomputes attention run by `kernel` (unsaved_attention)."""
        if self.selective != "op_sac" or not release or kernel is None:
            return False
        return any(kernel in kernels for line, kernels in self.unsaved_attention.items() if in_line(release, line))


class CompileSemantics(_Card):
    """What the framework's torch.compile switch compiles: its decoder blocks (or the whole model) and its loss
    function (cards/memory.yaml compile: the bytes each changes)."""

    default: bool = False  # the framework's own default (a request that leaves torch_compile out gets it)
    blocks: bool = True
    loss: bool = False
    # the routed experts' activation (and routing-weight multiply) is one fused kernel even in eager blocks
    experts_fused: bool = False
    # the date (YYYY-MM-DD) from which the switch compiled the loss too; a run dated before it, or by month only,
    # compiled the blocks only, which the bool torch_compile cannot say (None: the loss as `loss` says, always)
    loss_since: str | None = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    source: str


class EagerModelCode(_Card):
    """The engines that train Hugging Face transformers' own modeling code as eager PyTorch ops (RMSNorm in fp32,
    rotary, SwiGLU, the MoE block's token gather and scatter each their own kernels): their memory-bound passes are
    cards/calibration.yaml hf_eager_*, counted from that code (bench/step_op_census.py)."""

    engines: list[Engine]
    source: str


class AttentionSemantics(_Card):
    """Which attention kernel the framework runs on each GPU generation (cards/calibration.yaml attention_kernels: the
    fraction of peak each reaches): `kernel` maps an arch (cards/hardware.yaml) or "default" to a kernel name;
    `by_version` gives the same map for releases (a version prefix) that chose differently; `by_engine` the map of an
    engine that runs one kernel in every release; `mla_backend` the backend a multi-latent-attention model runs."""

    kernel: dict[str, str] = Field(default_factory=dict)
    by_version: dict[str, dict[str, str]] = Field(default_factory=dict)
    by_engine: dict[Engine, dict[str, str]] = Field(
        default_factory=dict, description="An engine whose map holds in every release and for every model (verl's "
                                          "FSDP engine: Hugging Face flash_attention_2); the others follow the release")
    mla_backend: Literal["flash", "fused"] | None = Field(
        None, description="The attention_backend a model with multi-latent attention (Q/K and V head dims differ, "
                          "which FlashAttention-2 refuses) runs on the engines by_engine leaves out, in every release "
                          "(its kernel: backends); None: it follows the release's map")
    backends: dict[Literal["flash", "fused"], str] = Field(
        default_factory=dict, description="The kernel (cards/calibration.yaml attention_kernels) each "
                                          "attention_backend the framework can be told to run is; one left out: the "
                                          "shared fraction")
    on_arch: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="GPU arch (cards/hardware.yaml) -> {kernel the maps and backends name: the "
                                          "kernel the same library runs on that arch}: on ROCm (cdna3) Transformer "
                                          "Engine's fused attention and the flash-attn package run Composable "
                                          "Kernel's, torch SDPA AOTriton's, none of them cuDNN. An arch left out: the "
                                          "names hold")
    on_arch_source: str = ""
    windowed_model_types: list[str] | None = Field(
        None, description="The model types (config.json model_type) whose sliding window the framework's model code "
                          "builds; a windowed model of another type trains every layer full (its window ignored). "
                          "None: every type's (Megatron-Core's window_size / window_attn_skip_freq, transformers' "
                          "attention with flash_attention_2 or flex)")
    windowed_cp_comm_types: list[Literal["p2p", "a2a", "allgather", "a2a+p2p"]] | None = Field(
        None, description="The cp_comm_types its context parallelism runs a sliding window with, the default first "
                          "(rule CP006); None: every one")
    windowed_source: str = ""
    chunked_model_types: list[str] = Field(
        default_factory=list, description="The model types whose chunked attention (Llama 4's attention_chunk_size on "
                                          "its RoPE layers) the framework's model code runs; a chunked model of "
                                          "another type trains every layer full causal. Empty: none")
    chunked_releases: list[str] = Field(
        default_factory=list, description="The release series (version prefixes: '0.2' for 0.2.x) whose model code "
                                          "builds the chunked_model_types; a release outside them has no model code "
                                          "for them (rule TT003). Empty: every release")
    chunked_source: str = ""
    chunk_refused_backends: list[AttentionBackend] = Field(
        default_factory=list, description="The attention_backend values under which the FSDP engine loads "
                                          "transformers with flash_attention_2, which refuses a chunked layer once "
                                          "the keys pass its chunk (rule CH001); empty: none")
    no_cp_model_types: list[str] = Field(
        default_factory=list, description="The model types (config.json model_type) whose model code in this "
                                          "framework builds a core attention that refuses context parallelism at "
                                          "construction (rule CP007); empty: none")
    no_cp_source: str = ""
    no_selective_releases: dict[str, list[str]] = Field(
        default_factory=dict, description="Model type (config.json model_type) -> the release series (version "
                                          "prefixes: '0.1' for 0.1.x) whose model code for it refuses selective "
                                          "recompute when the job config is read (rule RC008); empty: none")
    no_selective_source: str = ""
    model_kernels: dict[str, str] = Field(
        default_factory=dict, description="Model type (config.json model_type) -> the kernel (cards/calibration.yaml "
                                          "attention_kernels) its core attention runs whatever the attention_backend "
                                          "and GPU: the framework's model code builds that attention itself "
                                          "(Megatron-Bridge's Gemma 2, torchtitan's Llama 4: FlexAttention). Empty: "
                                          "none")
    model_kernels_source: str = ""
    unfused_with_dropout: list[str] = Field(
        default_factory=list, description="Model types (of model_kernels) whose framework-built core attention leaves "
                                          "its fused kernel for the unfused path (the whole score matrix, softmax and "
                                          "dropout materialised) whenever attention dropout is on in training. Empty: "
                                          "none")
    unfused_with_dropout_source: str = ""
    unfused_softcap: list[str] = Field(
        default_factory=list, description="Model types whose framework-built unfused attention caps the scores as "
                                          "softcap * tanh(scores / softcap), tanh keeping its output (b x heads x s x "
                                          "s) for the backward beside the softmax's. Empty: none")
    unfused_softcap_source: str = ""
    unfused_yarn_rope: Literal["any", "scaled"] | None = Field(
        None, description="Where the framework's attention applies a non-MLA YaRN model's rotary embedding unfused "
                          "(Megatron-Core's _apply_rotary_pos_emb_bshd, cards/calibration.yaml unfused_rope_passes), "
                          "not through Transformer Engine's fused kernel: 'any' every such model, 'scaled' one whose "
                          "YaRN concentration factor (estimate/attention_time.yarn_concentration) is not 1; on the "
                          "framework's Megatron-Core engines only, not one that trains transformers' modeling code "
                          "(eager_model_code). None: the fused kernel, or a model code of its own")
    unfused_yarn_rope_source: str = ""
    source: str

    def builds_window(self, model_type: str) -> bool:
        """Whether the framework's model code runs a `model_type` model's sliding window (windowed_model_types)."""
        return self.windowed_model_types is None or model_type in self.windowed_model_types

    def builds_chunks(self, model_type: str) -> bool:
        """Whether the framework's model code runs a `model_type` model's chunked attention (chunked_model_types)."""
        return model_type in self.chunked_model_types

    def ships_chunked(self, release: str) -> bool:
        """Whether `release` (a known release: releases.resolve_release) has model code for the chunked_model_types
        (chunked_releases: its series among them, or none listed)."""
        return not self.chunked_releases or in_any_line(release, self.chunked_releases)

    def refuses_selective(self, model_type: str, release: str) -> bool:
        """Whether `release`'s model code for `model_type` refuses selective recompute (no_selective_releases)."""
        return in_any_line(release, self.no_selective_releases.get(model_type, ()))

    @model_validator(mode="after")
    def _mla_backend_has_a_kernel(self) -> AttentionSemantics:
        if self.mla_backend is not None and self.mla_backend not in self.backends:
            raise ValueError(f"mla_backend {self.mla_backend!r} needs its kernel in backends")
        return self

    def kernel_for(self, version: str | None, arch: str | None, *, engine: str | None = None,
                   mla: bool = False) -> str | None:
        """The kernel a release runs on `arch`: the engine's own map (by_engine), else mla_backend's kernel for an MLA
        model, else the longest matching version prefix's map, else `kernel`."""
        table = self.kernel
        if engine in self.by_engine:
            table = self.by_engine[engine]  # type: ignore[index]
        elif mla and self.mla_backend is not None:
            return self.backend_kernel(self.mla_backend, arch)
        elif (line := longest_line(version, self.by_version)) is not None:
            table = self.by_version[line]
        return self.on_gpu(table.get(arch or "", table.get("default")), arch)

    def backend_kernel(self, backend: str, arch: str | None) -> str | None:
        """The kernel attention_backend `backend` (flash / fused) runs on `arch` (backends, read through on_arch)."""
        return self.on_gpu(self.backends.get(backend), arch)  # type: ignore[call-overload]

    def on_gpu(self, kernel: str | None, arch: str | None) -> str | None:
        """`kernel` as the library that names it runs on `arch` (on_arch: cuDNN / FlashAttention-2 on ROCm are CK or
        AOTriton); unchanged where the card gives no other."""
        return self.on_arch.get(arch or "", {}).get(kernel or "", kernel)


def cp_comm_type_default(arch, attention: AttentionSemantics | None) -> str:
    """The CP communication a plan that leaves cp_comm_type out gets: the model's own (Architecture
    cp_comm_type_default: all-gather for DSA, else p2p), unless the framework runs the model's sliding window and
    its context parallelism takes a window with some comm types only (windowed_cp_comm_types): then the first."""
    own = arch.cp_comm_type_default
    if arch.dsa is not None or not arch.windowed_layers or attention is None:
        return own
    kinds = attention.windowed_cp_comm_types
    if not kinds or own in kinds or not attention.builds_window(arch.model_type):
        return own
    return kinds[0]
