"""meshplan's prediction beside what a run measured (`meshplan compare`): the peak memory allocated and reserved,
the step time, tokens/s per GPU and MFU, each with meshplan's published error band for the regime the request
falls in (cards/accuracy.yaml via the reports' error_band) and whether the measurement falls inside it.

Each side is put in the other's terms, never fitted: torch's counters leave out the CUDA context, so the predicted
peaks drop it; the allocated peak is the estimate's own (memory.stage_allocated, as bench/accuracy_card.py compares
with Megatron's mem-max-allocated); a log that states only one of step time and throughput gives the other through the
job's tokens per step and GPU count. The run's MFU is its measured rate through the estimate's own model FLOPs
per token and peak (never a second FLOP count), beside the MFU the framework logs with its own count. A stored
cluster factor (meshplan compare --calibrate) is shown beside the
model's own prediction, never in place of it.
"""

from __future__ import annotations

from meshplan.arithmetic.memory_states import memory_card
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB, TERA, plural
from meshplan.estimate.memory import stage_allocated
from meshplan.rl.step_time import actor_update_seconds, logged_update_mfu
from meshplan.schema.measured import RATE_FIGURES, ComparedFigure, MeasuredRun, RunComparison
from meshplan.schema.plan import Job
from meshplan.schema.reports import ClusterFactor, ErrorBand, MemoryReport, ThroughputReport


def predicted_peaks(memory: MemoryReport) -> tuple[int | None, int, str]:
    """(allocated, reserved, basis): the predicted peaks in torch's counters' terms (no CUDA context). An RL job's
    trainer reports its peak in the actor update (verl's perf/max_memory_*), so that phase is compared."""
    context = memory_card().cuda_context_bytes
    if memory.phases:
        phase = next((p for p in memory.phases if p.phase == "actor_update"), None) or max(
            memory.phases, key=lambda p: p.peak_bytes)
        reserve = phase.detail.get("allocator_reserve")
        reserved = phase.peak_bytes - context
        return (reserved - reserve if reserve is not None else None), reserved, f"the {phase.phase} phase's peak"
    stage = memory.stages[memory.peak_stage]
    allocated = max(stage_allocated(s) for s in memory.stages)  # at its own moment of the step (memory.py)
    return allocated - context, stage.total_bytes - context, f"pipeline stage {memory.peak_stage}"


def _figure(name: str, label: str, predicted: float | None, measured: float | None, band: ErrorBand | None,
            basis: str, calibrated: float | None = None, missing: str | None = None,
            compared: bool = True) -> ComparedFigure:
    """One figure side by side. The throughput band is the step time's median |predicted / measured - 1|; a rate
    (RATE_FIGURES) is judged on that scale, measured / predicted - 1, so one run's step time and rate are inside or
    outside together (a run 0.99 band faster had its step time inside, its tokens/s outside). Not `compared`: both
    shown, no error or verdict (a step of another batch than the prediction's)."""
    error = predicted / measured - 1 if predicted is not None and measured and compared else None
    median = band.median_error if band is not None else None
    scaled = error
    if name in RATE_FIGURES and error is not None:
        scaled = 1 / (1 + error) - 1 if error > -1 else float("inf")
    inside = abs(scaled) <= median if scaled is not None and median is not None else None
    return ComparedFigure(figure=name, label=label, predicted=predicted, measured=measured, error=error, band=median,
                          inside=inside, calibrated=calibrated, basis=basis, missing=missing)


def measured_throughput(measured: MeasuredRun, job: Job) -> tuple[float | None, float | None, str]:
    """(step seconds, tokens/s per GPU, how): as logged, or one from the other through the job's tokens per step
    (global batch x sequence length, the config's) and GPU count; a global samples/s or tokens/s is spread over
    the GPUs."""
    tokens = (measured.global_batch_size or job.global_batch_size) * job.seq_length
    step, per_gpu, how = measured.step_time_s, measured.tokens_per_s_per_gpu, []
    if per_gpu is None and measured.tokens_per_s is not None:
        per_gpu, _ = measured.tokens_per_s / job.num_gpus, how.append("tokens/s per GPU = the job's tokens/s / GPUs")
    if per_gpu is None and measured.samples_per_s is not None:
        per_gpu = measured.samples_per_s * job.seq_length / job.num_gpus
        how.append("tokens/s per GPU = samples/s x sequence length / GPUs")
    if step is None and per_gpu:
        step = tokens / (per_gpu * job.num_gpus)
        how.append(f"step time = {tokens:,} tokens per step / (tokens/s per GPU x {plural(job.num_gpus, 'GPU')})")
    if per_gpu is None and step:
        per_gpu = tokens / (step * job.num_gpus)
        how.append(f"tokens/s per GPU = {tokens:,} tokens per step / (step time x {plural(job.num_gpus, 'GPU')})")
    return step, per_gpu, "; ".join(how) or "as logged"


def _basis(how: str, figure: str) -> str:
    """How one measured figure was taken, of measured_throughput's `how` (its derivations, each naming the figure it
    gives: 'tokens/s per GPU = ...'): the derivations of that figure, else 'as logged'. The step time row read
    'tokens/s per GPU = 4,194,304 tokens per step / (step time x 64 GPUs)' for a step time the log gave itself."""
    own = [part for part in how.split("; ") if part.startswith(f"{figure} = ")]
    return "; ".join(own) or "as logged"


def compare_run(job: Job, memory: MemoryReport, throughput: ThroughputReport, measured: MeasuredRun,
                factor: ClusterFactor | None = None) -> RunComparison:
    """The figures side by side; `throughput` is the model's own (uncalibrated) estimate. A log of RL steps is
    compared with an RL job's prediction only: a training job's step is not what it measured."""
    if measured.rl_fields is not None and job.rl is None:
        stated = "".join(f", {name}={value}" for name, value in measured.rl_fields.items())
        raise MeshplanError(
            f"{measured.path} logs RL steps (rollout, log-probs and update: {measured.framework}'s RL trainer), but "
            "the request is a training job, whose one training step is not what the log measured.",
            fix=f"Plan it as the RL job it is: pass job=rl with the run's prompts_per_step and samples_per_prompt"
                f"{' and what the log states' if stated else ''}{stated}.")
    allocated, reserved, where = predicted_peaks(memory)
    mband, tband = memory.error_band, throughput.error_band
    step, per_gpu, how = measured_throughput(measured, job)
    logged = measured.global_batch_size
    other_batch = logged is not None and logged != job.global_batch_size  # the log timed a step of other work
    step_basis, rate_basis = _basis(how, "step time"), _basis(how, "tokens/s per GPU")
    step_how = (f"not compared: the log's step runs {logged:,} sequences, the prediction's {job.global_batch_size:,} "
                f"(tokens/s per GPU is compared); {step_basis}") if other_batch else step_basis
    f = factor.step_time_factor if factor is not None else None
    # an RL job's actor update's, counted as the framework's log counts it (rl.logged_mfu_flops: verl's flops_counter)
    mfu = logged_update_mfu(job, throughput.rl) if throughput.rl is not None else throughput.mfu
    by_counter = throughput.rl is not None and job.rl_card.logged_mfu_flops == "flops_counter"
    counted_as = ("predicted: verl's own FLOP count (flops_counter: non-causal attention, the embedding as a matmul) "
                  "over the predicted actor update; measured: the log's" if by_counter else "the framework's own MFU "
                  "(its FLOP count and peak may differ from meshplan's)")
    figures = [
        _figure("peak_allocated", "peak allocated, GiB", allocated / GIB if allocated is not None else None,
                _gib(measured.peak_allocated_bytes), mband, "predicted: the largest stage's allocated peak at its "
                "own moment of the step, less CUDA context; measured: max_memory_allocated"),
        _figure("peak_reserved", "peak reserved, GiB", reserved / GIB, _gib(measured.peak_reserved_bytes), mband,
                f"predicted: {where} less CUDA context; measured: max_memory_reserved"),
        _figure("step_time", "step time, s", throughput.step_time_s, step, tband, step_how,
                throughput.step_time_s * f if f else None, compared=not other_batch),
        _figure("tokens_per_s_per_gpu", "tokens/s per GPU", throughput.tokens_per_s_per_gpu, per_gpu, tband,
                rate_basis,
                throughput.tokens_per_s_per_gpu / f if f else None),
        measured_mfu(job, throughput, measured, per_gpu, how, tband, f),
        _figure("logged_mfu", "MFU as the framework logs it" + (" (actor update)" if throughput.rl else ""), mfu,
                measured.mfu, tband, counted_as,
                mfu / f if f else None,
                missing=None if measured.mfu is not None else "an MFU of the framework's own (one over 1 is no "
                "measurement and left out: the log's notes say why)"),
        logged_tflops(job, throughput, measured, tband, f),
    ]
    notes = []
    if measured.global_batch_size is not None and measured.global_batch_size != job.global_batch_size:
        notes.append(f"the log's global batch size {measured.global_batch_size:,} is not the request's "
                     f"{job.global_batch_size:,}: is the log this config's run? (its tokens per step are the log's)")
    notes += shape_mismatch(job, throughput, measured, step, per_gpu)
    return RunComparison(model=throughput.model, framework=throughput.framework, num_gpus=job.num_gpus,
                         plan=throughput.plan, measured=measured, figures=figures, memory_band=mband,
                         throughput_band=tband, calibration=factor, notes=notes, summary=summary_line(figures))


SHAPE_MISMATCH = 2.0
"""How far apart the log's own FLOP rate and the one its step rate implies at the request's tokens per step may be
before the comparison says they describe different jobs: the frameworks' FLOP counts differ from meshplan's by tens
of percent at most (attention counted causal or not, the head, recompute), never by a factor of two."""


def shape_mismatch(job: Job, throughput: ThroughputReport, measured: MeasuredRun, step: float | None,
                   per_gpu: float | None) -> list[str]:
    """A log whose rate the request's job cannot have run at: an MFU over 100% of the GPU's peak, or a step time
    and a logged TFLOP/s that disagree by SHAPE_MISMATCH or more at the request's tokens per step. Both mean the
    request's sequence length, global batch or GPU count are not the run's, so every rate compared is off by that."""
    if throughput.rl is not None or not per_gpu:
        return []
    notes = []
    mfu = throughput.mfu_at(per_gpu)
    tokens = (measured.global_batch_size or job.global_batch_size) * job.seq_length
    if mfu > 1.0:
        notes.append(f"the log's rate is {per_gpu:,.0f} tokens/s per GPU at the request's {tokens:,} tokens per step, "
                     f"{mfu:.0%} of the GPU's peak in meshplan's model FLOPs, which no run reaches: the request's "
                     f"seq_length ({job.seq_length:,}), global batch or GPU count ({job.num_gpus:,}) are not the run's")
    if measured.tflops_per_gpu and step:
        implied = throughput.model_flops_per_step * tokens / (job.global_batch_size * job.seq_length) \
            / (step * job.num_gpus) / TERA
        ratio = implied / measured.tflops_per_gpu
        if ratio >= SHAPE_MISMATCH or ratio <= 1 / SHAPE_MISMATCH:
            notes.append(f"the log's step time implies {implied:,.0f} model TFLOP/s per GPU at the request's "
                         f"{tokens:,} tokens per step, where the log itself states {measured.tflops_per_gpu:,.0f} "
                         f"({ratio:.1f}x): FLOP counts differ by tens of percent, not that much, so the run's sequence "
                         "length or batch is likely not the request's")
    return notes


def measured_mfu(job: Job, throughput: ThroughputReport, measured: MeasuredRun, per_gpu: float | None, how: str,
                 band: ErrorBand | None, factor: float | None) -> ComparedFigure:
    """The run's MFU in meshplan's terms beside the predicted one: the measured tokens/s per GPU through the
    estimate's own model FLOPs per token and peak (ThroughputReport.mfu_at), so the two differ only by the rate; an
    RL job's, whose predicted MFU is the actor update's, the same update's FLOPs over its logged time (verl's
    timing_s/update_actor, SkyRL's timing/policy_train) for the predicted one's (rl/step_time.actor_update_seconds).
    Where the log lacks what that needs, `missing` says what instead of a number: a rate (step time, tokens/s or
    samples/s), or the actor update's own time, which an RL log's step rate (rollout, log-probs and update together)
    does not give."""
    label = "MFU (meshplan's model FLOPs)"
    predicted = throughput.rl.update_mfu if throughput.rl is not None else throughput.mfu
    calibrated = predicted / factor if factor else None
    if throughput.rl is not None and measured.actor_update_s is None:
        return _figure("mfu", label + " (actor update)", predicted, None, band, "", calibrated,
                       missing="the actor update's own time (verl's timing_s/update_actor, SkyRL's "
                               "timing/policy_train): the log's step time and "
                               "tokens/s cover the whole RL step (rollout, log-probs and update), and the MFU "
                               "predicted is the update's")
    if throughput.rl is not None:
        seconds = actor_update_seconds(job, throughput.rl)
        return _figure("mfu", label + " (actor update)", predicted, predicted * seconds / measured.actor_update_s,
                       band, f"the actor update's model FLOPs (the estimate's, at the mean response) over its logged "
                       f"time, {measured.actor_update_s:.3g} s, for the predicted {seconds:.3g} s, at the GPUs' peak",
                       calibrated)
    if per_gpu is None:
        return _figure("mfu", label, predicted, None, band, "", calibrated,
                       missing="a step time, tokens/s or samples/s: the log states none, and the run's MFU is its "
                               "tokens/s per GPU x the model FLOPs per token / the GPU's peak")
    return _figure("mfu", label, predicted, throughput.mfu_at(per_gpu), band,
                   f"the measured tokens/s per GPU ({how}) x meshplan's model FLOPs per token / the GPU's peak, the "
                   "estimate's own (ThroughputReport.mfu_at)", calibrated)


def logged_tflops(job: Job, throughput: ThroughputReport, measured: MeasuredRun, band: ErrorBand | None,
                  factor: float | None) -> ComparedFigure:
    """The model TFLOP/s per GPU the framework logs (Megatron's 'throughput per GPU (TFLOP/s/GPU)', torchtitan's
    tflops) beside the predicted one in the estimate's own FLOP count: its model FLOPs per step over the predicted
    seconds and the GPUs (what its MFU divides by the peak; an RL job's, the actor update's over the update's
    seconds, as its MFU). Read, it was shown nowhere."""
    seconds = actor_update_seconds(job, throughput.rl) if throughput.rl is not None else throughput.step_time_s
    predicted = throughput.model_flops_per_step / (seconds * job.num_gpus) / TERA
    return _figure("logged_tflops", "model TFLOP/s per GPU as the framework logs it"
                   + (" (actor update)" if throughput.rl else ""), predicted, measured.tflops_per_gpu, band,
                   "predicted: meshplan's model FLOPs per step over the predicted step time and the GPUs (the count "
                   "its MFU reads); measured: the framework's own FLOP count, which may count differently",
                   predicted / factor if factor else None)


def _gib(nbytes: int | None) -> float | None:
    return nbytes / GIB if nbytes is not None else None


def summary_line(figures: list[ComparedFigure]) -> str:
    """Which compared figures fall inside meshplan's band, in one line."""
    shown = [f for f in figures if f.error is not None]
    if not shown:
        return "Nothing to compare: the log states none of the figures meshplan predicts."
    parts = [f"{f.label.split(',')[0]} {f.error:+.0%}"
             + ("" if f.inside is None else " (inside the band)" if f.inside else " (outside the band)")
             for f in shown]
    return "predicted vs measured: " + "; ".join(parts) + "."
