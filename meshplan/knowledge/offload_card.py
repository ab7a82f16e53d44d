"""The framework card's offload facts (cards/frameworks/*.yaml `offload`, keyed by the engine of a ZeRO stage): what
each offload knob moves to the host and when. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


OffloadWhen = Literal["in_step", "phase", "none"]
StateClass = Literal["weights", "gradients", "optimizer"]


class OffloadKnob(_Card):
    """What one offload knob does on an engine: `in_step` moves the classes to host for the training step (GPU peak
    falls, host holds them, transfers cost time); `phase` moves them only between the phases of an RL job (the
    training step's peak is unchanged, host holds them while the rollout runs); `none`: the engine lacks it."""

    when: OffloadWhen = "none"
    moves: list[StateClass] = Field(default_factory=list)
    frees: list[StateClass] = Field(
        default_factory=list, description="Classes a `phase` knob releases from the GPU between phases without a host "
                                          "copy (Megatron's gradient buffer, its storage resized to 0): on neither")

    @model_validator(mode="after")
    def _moves_something(self) -> OffloadKnob:
        if self.when != "none" and not self.moves:
            raise ValueError("an offload that happens must say which state classes it moves")
        if self.frees and self.when != "phase":
            raise ValueError("only a phase offload frees state classes (between the phases of an RL job)")
        return self


class EngineOffload(_Card):
    """Offload semantics of one engine (cards/frameworks/*.yaml `offload`, keyed by the engine of a ZeRO stage)."""

    activation: Literal["in_step", "none"] = "none"
    param: OffloadKnob = OffloadKnob()
    grad: OffloadKnob = OffloadKnob()
    optimizer: OffloadKnob = OffloadKnob()
    optimizer_fraction: Literal["in_step", "none"] = Field(
        "none", description="Whether optimizer_offload_fraction (a share of the optimizer stepped on the CPU) exists"
    )
    activation_requires: list[Literal["none", "selective", "full"]] = Field(
        default_factory=list, description="The recompute settings activation offload works with (empty: any)"
    )
    requires_zero_stage: dict[str, int] = Field(
        default_factory=dict, description="Lowest zero_stage each offload knob needs (e.g. DeepSpeed offload_param: 3)"
    )
    on_by_default: list[Literal["param", "grad", "optimizer"]] = Field(
        default_factory=list, description="Knobs the framework turns on unless told otherwise (SkyRL "
                                          "offload_after_step)"
    )
    phase_offloads_when: Literal["always", "rl"] = Field(
        "always", description="rl: the `phase` knobs act in an RL job only, so on_by_default holds there alone and "
                              "rule OF001 refuses them on another job (SkyRL: a training job runs its SFT trainer, "
                              "which runs the policy alone and never offloads it)"
    )
    source: str
