"""The framework card's dated changes (cards/frameworks/*.yaml `release_changes`): a behaviour the estimate depends on
that a commit of the framework changed, with the commit, its date and the first release that has it, so a job on an
older release, or on the development branch as it was on a day (framework_version main@YYYY-MM-DD:
knowledge/releases.py), runs what that code did. One home for each such fact; read by request.resolve and the
estimate through `releases.predates`. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DATE = r"^\d{4}-\d{2}-\d{2}$"

# What each change is, as its reader takes it:
# - moe_outer_model_sharded: the MoE parallelizer fully_shards the outer ...ForCausalLM too. Before it the trainer's
#   gradient-sync switch (set_requires_gradient_sync on the model it is given) found no FSDP module, so a run of one of
#   `model_types` without PP reduce-scattered every micro-batch's gradients (request.resolve: defer_fsdp_grad_sync
#   false, the same schedule); under PP the pipeline stage held them as it does now.
# - model_te_attention: the model code of `model_types` takes the attention backend it is told (TE's fused attention by
#   default). Before it that code built `kernel_before` whatever the backend (AutoModel's gpt-oss: FlexAttention, its
#   only kernel), which estimate/attention_time.attention_efficiency times it at.
# - rank_share_sorted: verl's trainer sorts each data-parallel rank's balanced share of the step by workload before
#   the actor splits it into mini-batches, so every rank's mini-batch holds the same band of lengths. Before it the
#   share kept the rollout's order and each mini-batch waited for its slowest rank (rl/step_time.slowest_rank).
ChangeName = Literal["moe_outer_model_sharded", "model_te_attention", "rank_share_sorted"]


class ReleaseChange(BaseModel):
    """A change of the framework's code that the estimate reads, and when it came."""

    model_config = ConfigDict(extra="forbid")

    change: ChangeName
    commit: str = Field(pattern=r"^[0-9a-f]{7,40}$", description="The framework's commit that made it")
    date: str = Field(pattern=DATE, description="That commit's date: a main snapshot dated before it runs without it")
    release: str = Field(description="The first release that has it: an older release runs without it")
    model_types: list[str] = Field(default_factory=list, description="The model types (config.json model_type) it "
                                                                     "acts on; empty: every model")
    kernel_before: str | None = Field(None, description="model_te_attention: the kernel (cards/calibration.yaml "
                                                        "attention_kernels) the model types' attention ran before it")
    source: str

    def acts_on(self, model_type: str) -> bool:
        return not self.model_types or model_type in self.model_types
