"""Two prompts for people driving an agent from an IDE: plan a layout, and debug an out-of-memory run.

A prompt only writes the request; the agent then calls the tools, so the numbers come from
meshplan, not from the prompt. Arguments arrive as strings (MCP prompt arguments are strings);
they are checked here so a typo fails at once with the allowed values, not three tool calls later.
A bad value is raised as `MCPError(INVALID_PARAMS)`: the SDK replaces any other exception's text
with "Internal server error".
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp import MCPError
from mcp.types import INVALID_PARAMS
from pydantic import Field

from meshplan.schema import FRAMEWORKS, Request

_FRAMEWORKS = ", ".join(FRAMEWORKS)

Model = Annotated[str, Field(description=Request.model_fields["model"].description)]
Gpus = Annotated[str, Field(description="Total number of GPUs, e.g. 64")]
Gpu = Annotated[str, Field(description=Request.model_fields["gpu"].description)]
FrameworkName = Annotated[str, Field(description=f"Training framework: {_FRAMEWORKS}")]


def _gpus(text: str) -> int:
    try:
        count = int(str(text).strip())
    except ValueError:
        count = 0
    if count < 1:
        raise MCPError(INVALID_PARAMS, f"gpus must be a whole number of GPUs >= 1 (got {text!r}), e.g. '64'.")
    return count


def _framework(text: str) -> str:
    name = str(text).strip().lower()
    if name not in FRAMEWORKS:
        raise MCPError(INVALID_PARAMS, f"Unknown framework {text!r}; use one of: {_FRAMEWORKS}.")
    return name


def plan_parallelism(model: Model, gpus: Gpus, framework: FrameworkName = "megatron-bridge", gpu: Gpu = "h100") -> str:
    count, framework = _gpus(gpus), _framework(framework)
    return (
        f"Plan the parallel layout for training {model} on {count} {gpu} GPUs with {framework}.\n\n"
        f"1. Call describe_model(model={model!r}) to see the exact parameter counts.\n"
        f"2. Call recommend_parallelism(model={model!r}, gpu={gpu!r}, num_gpus={count}, framework={framework!r}); "
        "add seq_length and global_batch_size if I gave them.\n"
        "3. For the top candidate, call check_config with its plan fields and report every warning.\n"
        f"4. Call render_config(framework={framework!r}, ...) with the same fields and show the snippet.\n\n"
        "Answer with the layout (TP, PP, VPP, CP, EP, ETP, DP, ZeRO stage, micro-batch, recompute), peak "
        "memory per GPU against capacity, step time, tokens/s per GPU and MFU, why it beat the runner-up, and "
        "where it differs from the decision table the tool quotes. Quote the tools' numbers; do not estimate."
    )


def debug_oom(
    model: Model,
    gpus: Gpus,
    framework: FrameworkName = "megatron-core",
    layout: Annotated[str, Field(description="The settings that failed, e.g. 'tp=8 pp=1 mbs=2 seq=8192'")] = "",
    error: Annotated[str, Field(description="The out-of-memory message, if any (it states what was allocated)")] = "",
    gpu: Gpu = "h100",
) -> str:
    count, framework = _gpus(gpus), _framework(framework)
    given = f"\nThe layout and settings that ran out of memory: {layout}" if layout.strip() else ""
    message = f"\nThe error it printed:\n{error.strip()}" if error.strip() else ""
    return (
        f"My {framework} job training {model} on {count} {gpu} GPUs ran out of GPU memory.{given}{message}\n\n"
        "1. Translate the layout into tool arguments (tp, pp, vpp, cp, ep, etp, dp, micro_batch_size, "
        "seq_length, global_batch_size, zero_stage, recompute, sequence_parallel); ask me for anything missing.\n"
        "2. Call estimate_memory with them and find the stage and term (weights, gradients, optimizer, "
        "activations, other) that dominates; compare the peak with the memory the error reports.\n"
        "3. Call check_config with the same arguments: its MEM findings and their fixes name layouts that fit.\n"
        f"4. Call recommend_parallelism(model={model!r}, gpu={gpu!r}, num_gpus={count}, framework={framework!r}) "
        "for the fastest layout that fits, and confirm it with estimate_memory.\n"
        f"5. {_reading()}\n\n"
        "Answer with the cause in one sentence, the smallest change that fits (with its peak memory and "
        "headroom) and the fastest layout that fits, each with the tools' numbers."
    )


def _reading() -> str:
    """Point at the OOM skill and the memory reference when this installation ships them."""
    from .resources import skill_files

    files = skill_files()
    docs = [f"skill://{path}" for path in ("debug-training-oom/SKILL.md", "parallelism-strategies/references/memory.md")
            if path in files]
    return f"If a term is unclear, read {' and '.join(docs)}." if docs else "Explain each term you rely on."


PROMPTS = [
    (plan_parallelism, "Plan a parallel layout",
     "Plan TP/PP/CP/EP/DP for a model on a number of GPUs, with memory, speed and a config to paste"),
    (debug_oom, "Debug an out-of-memory run",
     "Find why a training layout ran out of GPU memory and the smallest change that fits"),
]


def register_prompts(server: Any) -> None:
    for fn, title, description in PROMPTS:
        server.prompt(name=fn.__name__, title=title, description=description)(fn)
