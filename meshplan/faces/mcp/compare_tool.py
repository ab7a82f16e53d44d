"""The tool `compare_run`: a run's own log (pasted) beside meshplan's prediction for its configuration.

Read-only like every tool: it never stores a calibration factor (that is `meshplan compare --calibrate`, a user's
explicit act on their own machine); it reports a factor already stored and what it would make of the prediction.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from meshplan.schema.choices import StrictModel
from meshplan.schema.measured import RunComparison

from .tools import api, option_parameters, request_parameters, take_options, to_request, tool_errors, with_signature


class CompareAnswer(RunComparison):
    """Predicted vs measured for one run, with the error band of its regime; `summary` says it in one line."""

    next_steps: list[str] = Field(default_factory=list, description="Which tool to call next, and why")


COMPARE_RUN = (
    "Use when the user has run a training job and pastes its log (and ideally its config): compares what the run "
    "measured (peak memory allocated/reserved, step time, tokens/s per GPU, MFU, read from Megatron-LM/Core/Bridge, "
    "Megatron-DeepSpeed, DeepSpeed, torchtitan, verl, SkyRL or KempnerForge log lines) with meshplan's prediction for "
    "the same configuration (config_text, or the request fields), and says for each figure whether the run falls "
    "inside meshplan's published error band for that regime. Nothing is fitted; a cluster factor the user stored "
    "with `meshplan compare --calibrate` is shown beside the model's own prediction."
)


class CompareOptions(StrictModel):
    """compare_run's argument beside the request: the log, required."""

    # empty or too long (over MAX_LOG_CHARS, 64 Mi characters) is read_log's to refuse, in the words `meshplan compare
    # --log` gives a file: this schema's own bounds refused '' in other words and 16 Mi characters the CLI reads
    log_text: str = Field(description="The run's training log (its stdout, or the part with the iteration / step "
                                      "metrics and memory lines)")


@with_signature([*request_parameters(), *option_parameters(CompareOptions)], CompareAnswer)
def compare_run(**args: Any) -> CompareAnswer:
    with tool_errors():
        log_text = take_options(CompareOptions, args).log_text
        result = api.compare_run(to_request(args), log_text)
    outside = [f.label for f in result.figures if f.inside is False]
    steps = ["Call check_config with the same arguments for the rules' findings on this layout."]
    if outside:
        steps.append("Outside the band: check that the log is this config's run (GPU count, batch, sequence), then "
                     "call estimate_memory / estimate_throughput with the same arguments for the breakdown.")
    values = result.model_dump()
    return CompareAnswer.model_construct(_fields_set=set(values) | {"next_steps"},
                                         **{k: getattr(result, k) for k in values}, next_steps=steps)


COMPARE_TOOL = (compare_run, "Compare a run's log with the prediction", COMPARE_RUN)

