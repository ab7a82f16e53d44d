"""Two prompts for people driving an agent from an IDE: plan a layout, and debug an out-of-memory run.

A prompt only writes the request; the agent then calls the tools, so the numbers come from
meshplan, not from the prompt. Arguments arrive as strings (MCP prompt arguments are strings);
they are checked here so a typo fails at once with the allowed values, not three tool calls later.
A bad value is raised as `MCPError(INVALID_PARAMS)`: the SDK replaces any other exception's text
with "Internal server error".

The SDK answers an unknown prompt name, a missing or an unknown argument with error code 0 and logs each
as a crash, traceback and all. `check_prompt_call` answers them first, as the spec's -32602 Invalid
params naming what is allowed; `prompt_errors` is the server middleware that runs it and gives a real
crash the JSON-RPC code for one (-32603), still logged with its traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from mcp import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS, Prompt
from pydantic import Field, ValidationError

from meshplan.core.errors import closest
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.request import Request

from .resources import skill_files

logger = logging.getLogger(__name__)

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


def _did_you_mean(name: str, known: list[str]) -> str:
    hints = closest(name, known)
    return f" (did you mean {' or '.join(repr(h) for h in hints)}?)" if hints else ""


def check_prompt_call(params: Any, prompts: list[Prompt]) -> None:
    """Raise -32602 for a `prompts/get` naming an unknown prompt, lacking a required argument, or passing an
    unknown argument or one that is not a string, with the names that are allowed (`prompts`: as listed by
    the server). Params that are not even shaped right (a name that is not a string, arguments that are not
    an object) are left to the SDK's own validation, which answers -32602."""
    if not isinstance(params, Mapping) or not isinstance(name := params.get("name"), str):
        return
    known = {prompt.name: prompt for prompt in prompts}
    if name not in known:
        raise MCPError(INVALID_PARAMS, f"Unknown prompt {name!r}{_did_you_mean(name, list(known))}; "
                                       f"the prompts are: {', '.join(known)}.")
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, Mapping):
        return
    names = [arg.name for arg in known[name].arguments or []]
    required = [arg.name for arg in known[name].arguments or [] if arg.required]
    takes = f"{name} takes {', '.join(names) or 'no arguments'}" + (
        f" ({' and '.join(required)} required)." if required else ".")
    for given, value in (arguments or {}).items():
        if given not in names:
            raise MCPError(INVALID_PARAMS, f"Unknown argument {given!r}{_did_you_mean(str(given), names)}: {takes}")
        if not isinstance(value, str):
            wanted, sent = json.dumps(str(value)), json.dumps(value)[:40]
            raise MCPError(INVALID_PARAMS, f"Prompt arguments are strings (MCP): send {given}={wanted}, not {sent}.")
    missing = [n for n in required if n not in (arguments or {})]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        raise MCPError(INVALID_PARAMS, f"Missing required argument{plural} {', '.join(missing)}: {takes}")


def prompt_errors(server: Any) -> Callable[[Any, Callable[[Any], Any]], Any]:
    """Server middleware: every failed `prompts/get` gets a JSON-RPC error code, and only a crash leaves a
    traceback on stderr."""

    async def middleware(ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        if ctx.method != "prompts/get":
            return await call_next(ctx)
        check_prompt_call(ctx.params, await server.list_prompts())
        try:
            return await call_next(ctx)
        except (MCPError, ValidationError):
            raise  # the SDK answers these with their own codes (-32602 for params that fail its schema)
        except Exception:
            name = ctx.params.get("name") if isinstance(ctx.params, Mapping) else None
            logger.exception("prompts/get %r crashed", name)
            raise MCPError(
                INTERNAL_ERROR, "Internal error: the prompt failed to render; the server log has the cause."
            ) from None

    return middleware


def register_prompts(server: Any) -> None:
    for fn, title, description in PROMPTS:
        server.prompt(name=fn.__name__, title=title, description=description)(fn)
    server.middleware.append(prompt_errors(server))
