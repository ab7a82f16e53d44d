"""The framework card's `allocator` section: how each of the framework's launchers sets PyTorch's caching allocator
(Plan.expandable_segments when the request leaves it out). Apart from cards.py, which holds the card.

One fact per launcher, because a framework's launchers differ: verl's RL workers turn expandable segments on for the
training phases, while its SFT trainer (verl.trainer.sft_trainer, what a training job renders) leaves PyTorch's
default, so a verl SFT job's reserved memory is estimated on the allocator it really runs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AllocatorSetting(_Card):
    """How one launcher sets the allocator, and where a rendered config says so."""

    expandable_segments: bool = Field(description="Whether the launcher or the workers it starts enable it")
    how: str = Field(description="Where the framework takes it, as the rendered config's note says it (an env "
                                 "line, a config key, or set by the framework itself)")
    source: str


class AllocatorFacts(AllocatorSetting):
    """The framework's launcher's setting, for every job unless `training_job` names another for a training job."""

    training_job: AllocatorSetting | None = Field(
        None, description="The setting of the launcher a training job (sft, LoRA) runs, where the framework's SFT "
                          "trainer differs from its RL launcher (verl); absent: the same as the RL launcher's")

    def for_job(self, rl: bool) -> AllocatorSetting:
        """The setting of the launcher that runs an RL job (`rl`) or a training job."""
        return self if rl or self.training_job is None else self.training_job
