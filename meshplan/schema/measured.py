"""What a run's own log measured, and `meshplan compare`'s answer: the prediction beside the measurement.

`MeasuredRun` is what a framework's log reader (meshplan/adapters/logs/) finds: the peak memory the framework
reported (allocated and/or reserved, each as the framework measures it), the step time and throughput over the
steps it logged, each figure with the log line it came from. `RunComparison` puts meshplan's prediction for the
same configuration beside it, with the error band meshplan published for that regime (cards/accuracy.yaml).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshplan.schema.choices import Framework, StrictModel
from meshplan.schema.plan import Plan
from meshplan.schema.reports import ClusterFactor, ErrorBand

FigureName = Literal["peak_allocated", "peak_reserved", "step_time", "tokens_per_s_per_gpu", "mfu",
                     "logged_mfu", "logged_tflops"]


class MeasuredRun(StrictModel):
    """The figures a training log states (None: the log does not state it), each with the line it came from."""

    framework: Framework = Field(description="The framework whose log format was read")
    path: str = Field(description="The log read (or '<log_text>' for pasted text)")
    steps: int = Field(0, ge=0, description="Iteration / step lines read")
    peak_allocated_bytes: int | None = Field(
        None, description="The largest max_memory_allocated the log reports (torch's peak of live tensors), bytes")
    peak_reserved_bytes: int | None = Field(
        None, description="The largest max_memory_reserved the log reports (the caching allocator's peak), bytes")
    step_time_s: float | None = Field(None, description="Median step time over the steady steps, seconds")
    tokens_per_s_per_gpu: float | None = Field(None, description="Median tokens per second per GPU, as logged")
    tokens_per_s: float | None = Field(None, description="Median tokens per second of the whole job, as logged")
    samples_per_s: float | None = Field(None, description="Median samples (sequences) per second of the job")
    mfu: float | None = Field(None, description="Median MFU as the framework computes it (0-1)")
    tflops_per_gpu: float | None = Field(None, description="Median TFLOP/s per GPU as the framework counts them")
    actor_update_s: float | None = Field(
        None, description="An RL log: the median seconds of the step's actor update alone (verl's timing_s/"
                          "update_actor, SkyRL's timing/policy_train), what the actor update's MFU is measured over")
    global_batch_size: int | None = Field(None, description="Sequences per step, when the log states it")
    rl_fields: dict[str, int] | None = Field(
        None, description="A log of RL steps (rollout, log-probs, update: verl's, SkyRL's RL trainer): the RL request "
                          "fields it states (prompt_length and response_length its longest, mean_prompt_length, "
                          "mean_response_length), "
                          "{} when none; None: a training log")
    sources: dict[str, str] = Field(default_factory=dict, description="figure -> 'log:line' it was read from")
    notes: list[str] = Field(default_factory=list, description="How the figures were taken (steps kept, units)")


# the step time's reciprocals: judged on its band, inverted
RATE_FIGURES = ("tokens_per_s_per_gpu", "mfu", "logged_mfu", "logged_tflops")


class ComparedFigure(StrictModel):
    """One figure predicted and measured."""

    figure: FigureName
    label: str = Field(description="The figure in words, with its unit")
    predicted: float | None = Field(description="meshplan's prediction, in the unit of `label`")
    measured: float | None = Field(description="What the log states (or what follows from it), same unit")
    error: float | None = Field(description="predicted / measured - 1 (None: one side is missing)")
    band: float | None = Field(description="meshplan's published median |error| in this regime, of the memory or "
                                           "the step time (None: unknown)")
    inside: bool | None = Field(
        description="|error| <= band: the measurement is as close as meshplan's typical run in this regime; a rate "
                    "(tokens/s per GPU, MFU), the step time's reciprocal, on the step time's scale: |measured / "
                    "predicted - 1| <= band")
    calibrated: float | None = Field(
        None, description="The prediction with this cluster's stored factor applied (None: no factor stored)")
    basis: str = Field("", description="How the measured figure was taken or derived")
    missing: str | None = Field(
        None, description="Where `measured` is None for want of something in the log: what it lacks (None: nothing "
                          "is missing, or the figure is one the log simply does not state)")


class RunComparison(StrictModel):
    """meshplan's prediction for a configuration beside what its run's log measured."""

    model: str
    framework: Framework
    num_gpus: int
    plan: Plan
    measured: MeasuredRun
    figures: list[ComparedFigure]
    memory_band: ErrorBand | None = Field(None, description="The memory estimate's regime and error band")
    throughput_band: ErrorBand | None = Field(None, description="The step-time estimate's regime and error band")
    calibration: ClusterFactor | None = Field(
        None, description="The cluster factor stored before this comparison (applied in `calibrated`)")
    stored: ClusterFactor | None = Field(None, description="With --calibrate: the factor written now, and where")
    notes: list[str] = Field(default_factory=list)
    summary: str = Field("", description="The comparison in one line")
