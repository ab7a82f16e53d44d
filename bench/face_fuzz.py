"""Fuzzing every face at once: requests drawn from the schema go through the api, the CLI (in-process `main`, its
`--json` flags and its `--batch` lines), the MCP tools in process and a few over stdio, and each answer is held to
what a user relies on:

- no traceback: no face shows Python's own words (a traceback, an exception's class, pydantic's links);
- an error says what was wrong and what is allowed (a `Fix:`, or pydantic's 'Input should ...' worded per field);
- every call ends within a generous CPU bound (a guard against a hang, not a speed test);
- no impossible number: a NaN or infinity, a negative byte count or time, an MFU over 1, more active parameters than
  parameters;
- the faces agree: the same verdict (answer or refusal), the same numbers and rule ids, the same reason.

The draws mix valid values with edge values (a bound, one past it), wrong JSON types, absurd sizes, unknown names
(fields, models, GPUs, choices), framework/knob mixes, RL and LoRA jobs, pasted config.json text (a catalog card's,
whole, cut short or with a field made absurd) and the framework configs of tests/configs as config_text / --config.

    python bench/face_fuzz.py SEED N [--stdio K] [--rows]   # N draws; the first K eligible ones over stdio too

tests/test_face_fuzz.py runs a small seeded slice of the same draws and checks in CI.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
from annotated_types import Ge, Gt, Le, Lt  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from meshplan import api  # noqa: E402
from meshplan.core.errors import MeshplanError  # noqa: E402
from meshplan.faces import cli, report  # noqa: E402
from meshplan.faces.mcp.compare_tool import CompareOptions  # noqa: E402
from meshplan.faces.mcp.server import app  # noqa: E402
from meshplan.knowledge.cards import model_card  # noqa: E402
from meshplan.knowledge.model_config import is_model_config_json  # noqa: E402
from meshplan.request.parse import parse_request, request_error, unknown_field_error  # noqa: E402
from meshplan.schema.options import MinimumGpusOptions, RecommendOptions, ReportOptions  # noqa: E402
from meshplan.schema.request import Request  # noqa: E402

CONFIGS = (ROOT / "tests" / "configs", ROOT / "tests" / "data" / "real_configs")
# The request fields with a default other than none: sent beside a config at that default, they must still override it
# (the MCP tools once read such an argument as left out)
DEFAULTED_FIELDS = tuple(name for name, spec in Request.model_fields.items()
                         if not spec.is_required() and spec.default is not None)
# tool -> the CLI subcommand that answers it
COMMANDS = {"estimate_memory": "memory", "estimate_throughput": "throughput", "check_config": "check",
            "recommend_parallelism": "recommend", "render_config": "render", "minimum_gpus": "min-gpus",
            "describe_model": "describe", "list_models": "models", "compare_run": "compare",
            "render_report": "report"}
BATCH_TOOLS = ("estimate_memory", "estimate_throughput", "check_config", "recommend_parallelism",  # --batch's
               "minimum_gpus")
# how often each tool is drawn: the searches cost a hundred times an estimate
TOOL_WEIGHTS = {"estimate_memory": 30, "estimate_throughput": 25, "check_config": 25, "render_config": 10,
                "describe_model": 6, "recommend_parallelism": 2, "minimum_gpus": 2, "list_models": 0.5,
                "compare_run": 5, "render_report": 3}
LOGS = ROOT / "tests" / "logs"
WORDS = ("summary", "next_steps")  # what the MCP tools add to the api's report
CPU_SECONDS_PER_CALL = 120.0  # a hang guard only: the slowest search answers in a few CPU seconds
PYTHON_WORDS = re.compile(r"Traceback \(most recent|File \"[^\"]+\", line \d|errors\.pydantic\.dev|internal error"
                          r"|\b(?:KeyError|TypeError|AttributeError|IndexError|ZeroDivisionError|OverflowError"
                          r"|RecursionError|UnboundLocalError|NameError|AssertionError)\b|object has no attribute"
                          r"|<built-in|\bNoneType\b")
EXPLAINED = re.compile(r"Fix: \S|^Invalid request: [\w.]+: |Valid fields: ")
RULE_ID = re.compile(r"\b[A-Z]{2,5}\d{3}\b")

GPUS = ["h100", "h200", "b200", "a100-80gb", "a100-40gb", "h20", "mi300x", "gb200", "l40s"]
ODD_GPUS = ["H100", "h100 ", "tpu-v5", "", "a100", "h100-sxm", "x" * 70, "h100\n"]
SIZES = ["70B", "7e9", "0.5B", "1T", "8b", "405B", "0B", "-5B", "1e30", "nan", "inf", "3.5M"]
ODD_MODELS = ["", " ", "nope", "/etc/passwd", "../../config.json", "/nonexistent/config.json", "x; rm -rf ~",
              "$(reboot)", "llama-3.1-8B-Instruct ", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-30B-A3B",
              "llama_3.1_8b", "llama-3.1-8b\x00", "~nobody/config.json", "lama-3.1-8b", "deepseek-v3-base",
              "x" * 300, "llama-" * 2000]
FLAGS_13B = ("megatron-core flags: --num-layers 40 --hidden-size 5120 --ffn-hidden-size 13824 --num-attention-heads 40 "
             "--vocab-size 32000 --swiglu --untie-embeddings-and-output-weights --normalization RMSNorm "
             "--disable-bias-linear --position-embedding-type rope --max-position-embeddings 4096")
UNKNOWN_FIELDS = ["tensor_parallel_size", "TP", "num-gpus", "gpus", "bogus", "micro_batch", "seq_len", "model_name",
                  "pipeline_model_parallel_size", "Model", "lora_alpha"]
LAYOUTS = ["Et*4|(t*4|)*14t,mL", "Et|t|tL", "E|t*2|L", "", "(t|)*2", "x", "Et*100|L"]
RL_BUNDLE = {"framework": ["verl", "skyrl"], "job": ["rl"], "algorithm": ["grpo", "ppo", "dapo"],
             "prompts_per_step": [32, 64, 128], "samples_per_prompt": [4, 8], "response_length": [1024, 4096],
             "prompt_length": [512, 2048], "rollout_tp": [1, 2, 4], "prompts_per_mini_batch": [8, 16, 32],
             "rollout_engine": ["vllm", "sglang"], "placement": ["colocated", "separate"], "rollout_gpus": [8, 16],
             "mean_response_length": [512, 5000]}
LORA_BUNDLE = {"framework": ["megatron-bridge", "verl", "skyrl", "nemo-automodel", "torchtitan"],
               "job": ["lora", "sft"], "lora_rank": [8, 16, 64], "lora_targets": [["linear_qkv"], ["linear_fc1"]],
               "lora_vision": [True, False]}
RENDER_TARGETS = ("megatron-core", "megatron-bridge", "torchtitan", "deepspeed", "verl", "skyrl", "kempnerforge",
                  "nemo-automodel")
MODEL_POOL = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "qwen3-8b", "deepseek-v2-lite", "mixtral-8x7b",
              "gpt-oss-20b", "gemma-2-27b", "qwen2.5-7b", "moonlight-16b-a3b", "deepseek-v3", "qwen3-next-80b-a3b"]


# --------------------------------------------------------------------------- draws


@dataclass(frozen=True)
class Case:
    """One draw: a tool and its arguments as an MCP client sends them (config_text among them where drawn)."""

    tool: str
    args: dict[str, Any]


def _bounds(name: str) -> tuple[float | None, float | None]:
    low = high = None
    for meta in Request.model_fields[name].metadata:
        if isinstance(meta, Ge | Gt):
            low = meta.ge if isinstance(meta, Ge) else meta.gt
        if isinstance(meta, Le | Lt):
            high = meta.le if isinstance(meta, Le) else meta.lt
    return low, high


def _inner(annotation: Any) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if get_origin(annotation) is not Literal and len(args) == 1 else annotation


def field_value(rng: random.Random, name: str, clean: bool = False) -> Any:
    """A value for one request field: mostly valid, else an edge, a wrong JSON type, an absurd size or an unknown
    choice, read from the field's annotation and bounds (`clean`: a valid one)."""
    kind = _inner(Request.model_fields[name].annotation)
    roll = rng.random() * (0.7 if clean else 1.0)
    if name == "model":
        return model_value(rng, clean)
    if name == "gpu":
        return rng.choice(GPUS) if roll < 0.85 else rng.choice(ODD_GPUS)
    if name == "pipeline_layout":
        return rng.choice(LAYOUTS)
    if name == "selective_ac_option":
        return rng.choice(["op", "2", "1", "0", "10000", "OP", 2])
    if name == "framework_version":
        return rng.choice(["0.2", "0.2.1", "main", "main@2026-01-01", "0.19.2", "latest", "v0.2", "9" * 40, 2])
    if get_origin(kind) is Literal:
        choices = list(get_args(kind))
        if roll < 0.85:
            return rng.choice(choices)
        return rng.choice([choices[0].upper(), choices[0] + " ", choices[0].replace("-", "_"), "bogus", 1, None, ""])
    if get_origin(kind) is list:
        members = list(get_args(get_args(kind)[0]))
        if roll < 0.8:
            return rng.sample(members, rng.randint(1, min(3, len(members))))
        return rng.choice([[], members[0], [members[0], members[0]], ["bogus"], members * 2, [1]])
    if kind is bool:
        return rng.choice([True, False]) if roll < 0.9 else rng.choice(["true", 1, 0, "yes"])
    low, high = _bounds(name)
    if kind is float:
        low, high = low or 0.0, high if high is not None else 1e6
        if roll < 0.8:
            return round(rng.uniform(low, min(high, low + 4)), 3) or 0.5
        # a bound, one past it, a ratio given as a percent or bytes where GiB are asked, not a number
        return rng.choice([low, high, low - 0.5, high + 1, float("nan"), float("inf"), str(low), 1, True, 10, 50.0,
                           2e12, "10%"])
    if kind is int:
        low = 0 if low is None else int(low)
        if roll < 0.75:
            valid = [v for v in (1, 2, 4, 8, 16, 3, 64, 256) if v >= low and (high is None or v <= high)]
            return rng.choice(valid or [low])
        if roll < 0.87:
            return rng.choice([low, low - 1, *([int(high), int(high) + 1] if high is not None else [1 << 40])])
        return rng.choice(["8", 8.0, 2.5, True, [8], {"v": 8}, 1 << 63, -(1 << 40), 10 ** 30, "4k", "8K", "80GB"])
    return rng.choice(["x", "", 1])


def _config_json(rng: random.Random) -> str:
    """A pasted config.json: a catalog card's, whole, cut short, with one field made absurd or of a wrong type."""
    config = dict(model_card(rng.choice(MODEL_POOL)).config)
    roll = rng.random()
    if roll < 0.5:
        return json.dumps(config)
    if roll < 0.6:
        return json.dumps(config)[:-rng.randint(1, 30)]
    key = rng.choice([k for k in config if isinstance(config[k], int | float) and not isinstance(config[k], bool)]
                     or ["hidden_size"])
    config[key] = rng.choice([0, -1, 1 << 40, 1e308, "4096", None, 2.5, True, [1]])
    if rng.random() < 0.2:
        config.pop("model_type", None)
    return json.dumps(config)


def model_value(rng: random.Random, clean: bool = False) -> Any:
    roll = rng.random() * (0.9 if clean else 1.0)
    if roll < 0.7:
        return rng.choice(MODEL_POOL)
    if roll < 0.78:
        return rng.choice(SIZES)
    if roll < 0.88:
        return _config_json(rng)
    if roll < 0.9:
        return rng.choice([FLAGS_13B, FLAGS_13B + " --hidden-sise 5120", FLAGS_13B.replace("40 ", "-3 ", 1),
                           "megatron-core flags: " + "--x " * 3000])
    if roll < 0.92:
        return rng.choice(["x" * (1 << 20), "{" + "x" * 2000, "llama" * 3000, "a" * 5000])
    if roll < 0.98:
        return rng.choice(ODD_MODELS)
    return rng.choice([8, None, ["llama-3.1-8b"], {"name": "llama-3.1-8b"}, True])


FORMATS = {".sh": "shell", ".slurm": "shell", ".toml": "toml", ".json": "json", ".yaml": "yaml"}


def config_text(rng: random.Random) -> tuple[str, str | None]:
    """A framework config of tests/configs or tests/data/real_configs as config_text, with the format named or left
    to detection; one in six cut short, a number in it made absurd, emptied, or past the reader's 1 MiB."""
    files = sorted(p for folder in CONFIGS for p in folder.iterdir() if p.is_file() and p.suffix in FORMATS)
    path = rng.choice(files)
    text = path.read_text(encoding="utf-8")
    roll = rng.random()
    if roll < 0.05:
        text = text[:rng.randint(0, len(text))]
    elif roll < 0.1:
        text = re.sub(r"\b\d+\b", lambda m: rng.choice([m.group(0), "0", "-1", str(1 << 62), "1e400"]), text)
    elif roll < 0.13:
        text = rng.choice(["", " \n", "\x00\xff", "[", "{}", "x" * ((1 << 20) + 1)])
    return text, (FORMATS[path.suffix] if rng.random() < 0.5 else None)


# the framework each log of tests/logs comes from, by its name's start (the longest first)
LOG_FRAMEWORKS = (("megatron_deepspeed", "deepspeed"), ("deepspeed", "deepspeed"), ("kempnerforge", "kempnerforge"),
                  ("megatron", "megatron-core"), ("torchtitan", "torchtitan"), ("verl", "verl"))


def log_text(rng: random.Random) -> tuple[Any, str | None]:
    """A run's log of tests/logs as compare_run's log_text (whole, cut short, blank, noise or of a wrong type), with
    the framework it comes from."""
    path = rng.choice(sorted(LOGS.glob("*.log")))
    text = path.read_text(encoding="utf-8", errors="replace")
    framework = next((f for start, f in LOG_FRAMEWORKS if path.name.startswith(start)), None)
    roll = rng.random()
    if roll < 0.8:
        return text, framework
    if roll < 0.9:
        return text[:rng.randint(0, len(text))], framework
    return rng.choice(["", "  \n", "step 1 loss nan", None, 8]), framework


def draw(rng: random.Random) -> Case:
    tool = rng.choices(list(TOOL_WEIGHTS), weights=list(TOOL_WEIGHTS.values()))[0]
    if tool == "list_models":
        return Case(tool, {} if rng.random() < 0.9 else {rng.choice(UNKNOWN_FIELDS): 1})
    if tool == "describe_model":
        return Case(tool, {"model": model_value(rng, rng.random() < 0.5)})
    args: dict[str, Any] = {}
    clean = rng.random() < 0.5  # half the draws valid field by field, so the answers are judged as often as refusals
    if rng.random() < 0.95:
        args["model"] = model_value(rng, clean)
    args["gpu"] = field_value(rng, "gpu", clean)
    if tool != "minimum_gpus":
        args["num_gpus"] = rng.choice([1, 2, 4, 8, 8, 16, 16, 32, 64, 12, 24, 7]) if rng.random() < 0.9 \
            else field_value(rng, "num_gpus")
    roll = rng.random()
    bundle = RL_BUNDLE if roll < 0.12 else LORA_BUNDLE if roll < 0.22 else {}
    for name in rng.sample(sorted(bundle), min(len(bundle), rng.randint(2, 6))) if bundle else []:
        args[name] = rng.choice(bundle[name])
    skip = {"model", "gpu", "num_gpus"}
    for name in rng.sample(sorted(set(Request.model_fields) - skip), rng.randint(0, 5)):
        args[name] = field_value(rng, name, clean)
    if tool in ("recommend_parallelism", "minimum_gpus"):  # keep the searches to their everyday size
        if isinstance(args.get("num_gpus"), int) and args["num_gpus"] > 64:
            args["num_gpus"] = 64
        args.setdefault("seq_length", 4096)
        if rng.random() < 0.3:
            args["top_k" if tool == "recommend_parallelism" else "max_gpus"] = rng.choice([1, 3, 0, 51, 64, "5"])
    if tool == "compare_run":  # mostly with the log's own framework, which the reader looks for
        args["log_text"], framework = log_text(rng)
        if framework and rng.random() < 0.8:
            args["framework"] = framework
    if tool == "render_report" and rng.random() < 0.3:
        args["recommend"] = rng.choice([True, False, "yes"])
        if args["recommend"] is True and isinstance(args.get("num_gpus"), int) and args["num_gpus"] > 64:
            args["num_gpus"] = 64
    if tool == "render_config":
        args["framework"] = rng.choice([*RENDER_TARGETS, *RENDER_TARGETS, "nanotron", "Megatron", "bogus"])
        if rng.random() < 0.2:
            args[rng.choice(["variant", "version"])] = rng.choice(["fsdp", "megatron", "rl", "sft", "0.2", "x"])
    if rng.random() < 0.06:
        args[rng.choice(UNKNOWN_FIELDS)] = rng.choice([8, "x", None])
    if rng.random() < 0.08 and tool not in ("recommend_parallelism",):
        args["config_text"], fmt = config_text(rng)
        if fmt:
            args["config_format"] = fmt
        if rng.random() < 0.5:
            args.pop("model", None)
        if rng.random() < 0.4:  # a field sent at its default overrides the file as any value does, on every face
            name = rng.choice([n for n in DEFAULTED_FIELDS if n != "framework" or tool != "render_config"])
            args[name] = Request.model_fields[name].default
    return Case(tool, args)


# --------------------------------------------------------------------------- faces


@dataclass
class Outcome:
    """One face's answer: ('ok', the result as JSON without the MCP words) or ('error', the reason); the texts it
    printed or returned (searched for Python's words); the CPU seconds it took."""

    kind: str
    value: Any
    texts: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Hung(Exception):
    pass


def _guarded(call: Callable[[], Outcome]) -> Outcome:
    """The call under a CPU-time alarm (SIGXCPU-free: a wall alarm at 3x the CPU bound, then the CPU check)."""
    def alarm(*_: Any) -> None:
        raise Hung()

    started = time.process_time()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(int(CPU_SECONDS_PER_CALL * 3))
    try:
        outcome = call()
    except Hung:
        outcome = Outcome("hang", None)
    except Exception as exc:  # what a face let escape: the defect this bench hunts
        outcome = Outcome("bug", f"{type(exc).__name__}: {exc}"[:300])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    outcome.seconds = time.process_time() - started
    return outcome


def without_words(result: Any) -> Any:
    return {k: v for k, v in result.items() if k not in WORDS} if isinstance(result, dict) else result


def _split_config(args: dict[str, Any]) -> tuple[dict[str, Any], str | None, str | None]:
    args = dict(args)
    return args, args.pop("config_text", None), args.pop("config_format", None)


def via_api(case: Case) -> Outcome:
    """The Python face, as a user of meshplan.api writes it (a config's text read by import_config and the arguments
    laid over it by request_from_config, as the MCP tools do)."""
    args, text, fmt = _split_config(case.args)
    options = {name: args.pop(name) for name in ("top_k", "max_gpus", "variant", "version", "log_text", "recommend")
               if name in args}
    try:
        if case.tool == "list_models":
            if args:
                raise unknown_field_error(next(iter(args)), [])
            return Outcome("ok", [m.model_dump(mode="json") for m in api.list_models()])
        if case.tool == "describe_model":
            return Outcome("ok", without_words(api.describe_model(args["model"]).model_dump(mode="json")))
        framework = args.pop("framework") if case.tool == "render_config" else None
        for name in args:  # every face names an unknown field before it reads anything
            if name not in Request.model_fields:
                raise unknown_field_error(name, Request.model_fields)
        config = None
        if text is not None and fmt in (None, "json") and is_model_config_json(text):
            req = parse_request({**args, "model": args.get("model") or text})
        elif text is not None:  # every argument sent overrides the file, whatever its value
            config = api.import_config(text, framework=args.get("framework"), config_format=fmt)
            req = api.request_from_config(config, args, scan_gpus=case.tool == "minimum_gpus")
        else:
            req = parse_request(args)
        if case.tool == "recommend_parallelism":
            top_k = RecommendOptions.model_validate({"top_k": options.get("top_k", 5)}, strict=True).top_k
            result = api.recommend(req, top_k=top_k)
        elif case.tool == "minimum_gpus":
            limit = MinimumGpusOptions.model_validate({"max_gpus": options.get("max_gpus")}, strict=True).max_gpus
            result = api.minimum_gpus(req, max_gpus=limit)
        elif case.tool == "render_config":
            result = api.render_config(framework, req, **options)
        elif case.tool == "compare_run":
            log = CompareOptions.model_validate({"log_text": options.get("log_text")}, strict=True).log_text
            result = api.compare_run(req, log)
        elif case.tool == "render_report":
            chosen = ReportOptions.model_validate({k: options[k] for k in ("recommend", "top_k") if k in options},
                                                  strict=True)
            found = report.gather(req, recommend=chosen.recommend, top_k=chosen.top_k)
            return Outcome("ok", {"plan": found.plan and found.plan.model_dump(mode="json"), "drawn": found.drawn_as})
        else:
            result = getattr(api, case.tool)(req, config=config) if config is not None \
                else getattr(api, case.tool)(req)
    except ValidationError as exc:  # an option's bounds, worded as every face words them
        return Outcome("error", str(request_error(exc)), [str(request_error(exc))])
    except MeshplanError as exc:
        return Outcome("error", str(exc), [str(exc)])
    return Outcome("ok", without_words(result.model_dump(mode="json")))


def _flag_text(kind: Any, value: Any) -> list[str] | None:
    """A value as the CLI's flag text, or None where no flag can say it (a JSON type the flag would read otherwise:
    "8" for an integer is 8 on the command line, where JSON refuses it)."""
    kind = _inner(kind)
    if get_origin(kind) is list:
        ok = isinstance(value, list) and value and all(isinstance(v, str) and not v.startswith("-") for v in value)
        return list(value) if ok else None
    if kind is bool:
        return [str(value).lower()] if isinstance(value, bool) else None
    if kind is int:
        return [str(value)] if isinstance(value, int) and not isinstance(value, bool) else None
    if kind is float:  # an integer is no flag's: the flag reads '10' as 10.0, which a refusal echoes so
        return [repr(value)] if isinstance(value, float) and math.isfinite(value) else None
    return [value] if isinstance(value, str) and "\x00" not in value else None


OPTION_KINDS = {"top_k": int, "max_gpus": int, "variant": str, "version": str, "recommend": bool}


def cli_argv(case: Case, config_path: str | None, folder: Path | None = None) -> list[str] | None:
    """The command line that asks what `case` asks, or None where flags cannot say it (an unknown field is argparse's
    to refuse, a wrong JSON type is no flag text): the batch line is then the CLI's face for it."""
    args, text, _ = _split_config(case.args)  # the format: the file name's suffix, _config_file
    argv = [COMMANDS[case.tool]]
    if case.tool == "list_models":
        return [*argv, "--json"] if not args else None
    if case.tool == "render_config":
        target = args.pop("framework", None)
        if not isinstance(target, str) or not target or target.startswith("-"):
            return None
        argv.append(target)
    if case.tool == "compare_run":  # the log as a file, its name read back as <log_text>
        log = args.pop("log_text", None)
        if not isinstance(log, str) or folder is None:
            return None
        (folder / "run.log").write_text(log, encoding="utf-8")
        argv.append(f"--log={folder / 'run.log'}")
    if case.tool == "render_report":
        if folder is None:
            return None
        argv.append(f"--html={folder / 'plan.html'}")
        if args.get("recommend") is True:
            argv.append("--recommend")
        if args.pop("recommend", False) not in (True, False):
            return None
    for name, value in args.items():
        if name == "top_k" and case.tool == "render_report" and args.get("recommend") is not True:
            return None  # --top-k without --recommend: the CLI's report takes it only with the search
        kind = Request.model_fields[name].annotation if name in Request.model_fields else OPTION_KINDS.get(name)
        if kind is None or (case.tool == "describe_model" and name != "model"):
            return None
        if value is None:
            continue
        words = _flag_text(kind, value)
        if words is None:
            return None
        flag = "--" + name.replace("_", "-")
        argv += [f"{flag}={words[0]}"] if len(words) == 1 else [flag, *words]
    if text is not None:
        if config_path is None:
            return None
        argv += [f"--config={config_path}"]
    return argv if case.tool == "render_report" else [*argv, "--json"]


def _cli_outcome(case: Case, code: int, out: str, err: str, names: dict[str, str]) -> Outcome:
    """The CLI's answer: its --json output, or its refusal on stderr with the files it was given named as the tools
    name the same text (<config_text>, <log_text>); a report, written to a file, answers by its exit status alone."""
    texts = [out, err]
    said = err.strip().removeprefix("meshplan: ")
    for path, name in names.items():
        said, out = said.replace(path, name), out.replace(path, name)
    if case.tool == "render_report":
        return Outcome("ok", None, texts) if code == cli.EXIT_OK else Outcome("error", said, texts)
    if code == cli.EXIT_USAGE or not out.strip():
        return Outcome("error", said, texts)
    result = json.loads(out)
    return Outcome("ok", without_words(result), texts)


def via_cli(case: Case, config_path: str | None, folder: Path) -> Outcome | None:
    """The command line in process, its --json output; None where flags cannot say the case."""
    argv = cli_argv(case, config_path, folder)
    if argv is None:
        return None
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's refusal (its own words, exit 2)
            code = exc.code if isinstance(exc.code, int) else cli.EXIT_USAGE
    names = {str(folder / "run.log"): "<log_text>", **({config_path: "<config_text>"} if config_path else {})}
    return _cli_outcome(case, code, out.getvalue(), err.getvalue(), names)


def via_batch(case: Case) -> Outcome | None:
    """The CLI's batch face: the arguments as one JSON line on stdin, one JSON line out."""
    line = json.dumps(case.args)
    if case.tool not in BATCH_TOOLS or "config_text" in case.args or "config_format" in case.args \
            or len(line) > cli.MAX_LINE_CHARS:  # a line past the batch reader's limit is refused as a line
        return None
    old, out, err = sys.stdin, io.StringIO(), io.StringIO()
    sys.stdin = io.StringIO(line + "\n")
    try:
        with redirect_stdout(out), redirect_stderr(err):
            cli.main([COMMANDS[case.tool], "--batch", "-"])
    finally:
        sys.stdin = old
    line = json.loads(out.getvalue().splitlines()[0])
    line.pop("line", None)
    texts = [out.getvalue(), err.getvalue()]
    return Outcome("error", line["error"], texts) if "error" in line else Outcome("ok", without_words(line), texts)


def mcp_outcome(case: Case, result: Any) -> Outcome:
    if result.is_error:
        text = result.content[0].text
        return Outcome("error", text.removeprefix(f"Error executing tool {case.tool}: "), [text])
    return _answer(case, result.structured_content)


def _answer(case: Case, structured: dict[str, Any]) -> Outcome:
    """A tool's structured answer as the api's report: its words dropped, the catalog's list, a report's plan."""
    data = without_words(structured)
    if case.tool == "list_models":
        data = data["models"]
    elif case.tool == "render_report":
        data = {"plan": data["plan"], "drawn": data["drawn"]}
    return Outcome("ok", data, [json.dumps(structured)])


# --------------------------------------------------------------------------- judging

SIGNED = {"headroom_bytes"}  # a difference: capacity - peak, negative when over


def impossible_numbers(node: Any, where: str = "") -> list[str]:
    """Numbers no answer may hold: NaN or infinity, a negative byte count, time or rate, an MFU over 1, more active
    parameters than parameters."""
    found: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("active_params"), int) and isinstance(node.get("total_params"), int) \
                and node["active_params"] > node["total_params"]:
            found.append(f"{where}: active {node['active_params']} > total {node['total_params']}")
        for key, value in node.items():
            here = f"{where}.{key}"
            if isinstance(value, float) and not math.isfinite(value):
                found.append(f"{here} = {value}")
            elif isinstance(value, int | float) and not isinstance(value, bool):
                if value < 0 and key not in SIGNED and re.search(r"bytes|seconds|_s$|tokens|flops|params", key):
                    found.append(f"{here} = {value}")
                if key == "mfu" and value > 1:
                    found.append(f"{here} = {value}")
            found += impossible_numbers(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += impossible_numbers(value, f"{where}[{i}]")
    return found


def same_reason(face: str, said: str, reference: str) -> bool:
    """Whether a face's refusal says what the api's says: word for word, but an unknown field's list of the fields
    that face takes (a tool's own options among them), and on the CLI the reason alone (argparse's words, and a fix
    naming the command line's own order or flags, are the CLI's)."""
    said, reference = said.strip(), reference.strip()
    if said.startswith("Unknown field "):  # its did-you-mean is among the fields that face takes
        return said.split(" Fix:")[0] == reference.split(" Fix:")[0]
    if face == "cli":
        return _argparse_words(said) or said.split(" Fix: ")[0] == reference.split(" Fix: ")[0]
    return said == reference


def _argparse_words(text: str) -> bool:
    return "error: argument" in text or "unknown flag" in text or "usage:" in text or "error: unrecognized" in text


def schema_faults(case: Case) -> int:
    """How many of the arguments the schema refuses on their own (an unknown name, a value outside its type or
    bounds): with two or more, the faces may name them in another order or only the first, which is no defect."""
    faults = int(case.tool not in ("list_models", "describe_model") and "config_text" not in case.args
                 and not (isinstance(case.args.get("model"), str) and case.args["model"].strip()))  # no model
    options = {"top_k": RecommendOptions, "max_gpus": MinimumGpusOptions}
    for name, value in case.args.items():
        if name in ("config_text", "config_format", "variant", "version"):
            continue
        if name == "framework" and case.tool == "render_config":
            faults += value not in RENDER_TARGETS
            continue
        try:
            if name in options:
                options[name].model_validate({name: value}, strict=True)
            elif name in Request.model_fields:
                if value is not None:
                    Request.model_validate({"model": "x", name: value} if name != "model" else {name: value})
            else:
                faults += 1
        except ValidationError:
            faults += 1
    return faults


def judge(case: Case, outcomes: dict[str, Outcome]) -> list[tuple[str, str]]:
    """(kind, detail) of each thing a user would trip on in these answers to one case: a refusal worded otherwise on
    two faces is 'reason', or 'order' where the request has two or more faults the schema refuses (each face names
    the first it meets)."""
    found: list[tuple[str, str]] = []
    for face, outcome in outcomes.items():
        if outcome.kind in ("bug", "hang"):
            found.append((outcome.kind, f"{face}: {outcome.value}"))
            continue
        if outcome.seconds > CPU_SECONDS_PER_CALL:
            found.append(("hang", f"{face}: {outcome.seconds:.0f} CPU s"))
        for text in outcome.texts:
            if (hit := PYTHON_WORDS.search(text or "")) is not None:
                found.append(("traceback", f"{face}: ...{text[max(0, hit.start() - 80):hit.end() + 80]!r}"))
                break
        if outcome.kind == "error" and not (face == "cli" and _argparse_words(outcome.value)) \
                and not EXPLAINED.search(outcome.value):
            found.append(("unexplained", f"{face}: {outcome.value[:300]!r}"))
        if outcome.kind == "ok" and (bad := impossible_numbers(outcome.value)):
            found.append(("impossible", f"{face}: {bad[:3]}"))
    live = {face: o for face, o in outcomes.items() if o.kind in ("ok", "error")}
    if len({o.kind for o in live.values()}) > 1:
        said = "; ".join(f"{face} {o.kind} {str(o.value)[:160]!r}" for face, o in live.items())
        found.append(("verdict", said))
        return found
    reference = live.get("api")
    for face, outcome in live.items():
        if reference is None or face == "api":
            continue
        if outcome.kind == "ok" and outcome.value is not None and outcome.value != reference.value:
            keys = [k for k in reference.value if outcome.value.get(k) != reference.value.get(k)] \
                if isinstance(reference.value, dict) and isinstance(outcome.value, dict) else ["(whole)"]
            ids = sorted(set(RULE_ID.findall(json.dumps(outcome.value))) ^ set(RULE_ID.findall(
                json.dumps(reference.value))))
            found.append(("numbers", f"{face} vs api differ in {keys[:6]}" + (f", rule ids {ids}" if ids else "")))
        elif outcome.kind == "error" and not same_reason(face, outcome.value, reference.value):
            file_fault = reference.value.startswith("<config_text>") or outcome.value.startswith("<config_text>")
            kind = "order" if schema_faults(case) + file_fault >= 2 else "reason"
            found.append((kind, f"{face} {outcome.value[:200]!r} vs api {reference.value[:200]!r}"))
    return found


# --------------------------------------------------------------------------- the sweep


def _config_file(case: Case, folder: Path) -> str | None:
    text = case.args.get("config_text")
    if not isinstance(text, str):
        return None
    fmt = case.args.get("config_format")
    suffix = {"shell": ".sh", "toml": ".toml", "json": ".json", "yaml": ".yaml", None: ".txt"}.get(fmt, ".txt")
    if fmt is None:  # detected from the text: the file's name must not name a format the text is not
        suffix = ""
    path = folder / f"config{suffix}"
    path.write_text(text, encoding="utf-8")
    return str(path)


async def run_case(case: Case, client: Any, stdio: Any, folder: Path) -> dict[str, Outcome]:
    """Every face's answer to one case (the CLI's flags and batch line where they can say it, stdio where asked)."""
    outcomes = {"api": _guarded(lambda: via_api(case))}
    config_path = _config_file(case, folder)
    cli_outcome = _guarded(lambda: via_cli(case, config_path, folder) or Outcome("skip", None))
    if cli_outcome.kind != "skip":
        outcomes["cli"] = cli_outcome
    batch = _guarded(lambda: via_batch(case) or Outcome("skip", None))
    if batch.kind != "skip":
        outcomes["batch"] = batch
    for face, session in (("mcp", client), ("stdio", stdio)):
        if session is None:
            continue
        if not _json_safe(case) and face == "stdio":
            continue
        started = time.process_time()
        try:
            with anyio.fail_after(CPU_SECONDS_PER_CALL * 3):
                if _json_safe(case):
                    outcome = mcp_outcome(case, await session.call_tool(case.tool, case.args))
                else:  # the SDK's client sends NaN and infinity as null: the server is asked in process
                    outcome = await _server_call(case)
        except TimeoutError:
            outcome = Outcome("hang", None)
        except Exception as exc:  # the client's own refusal to send (a value JSON cannot carry) is no face's
            outcome = Outcome("bug", f"{type(exc).__name__}: {exc}"[:300])
        outcome.seconds = time.process_time() - started if face == "mcp" else 0.0
        outcomes[face] = outcome
    return outcomes


async def _server_call(case: Case) -> Outcome:
    """The tool called on the server object itself, as the SDK's dispatcher calls it (a ToolError is the refusal
    the client would read; an UnexpectedToolError an exception the tool let escape)."""
    try:
        result = await app.call_tool(case.tool, case.args)
    except UnexpectedToolError as exc:
        return Outcome("bug", f"{exc.__cause__!r}"[:300])
    except ToolError as exc:
        text = str(exc)
        return Outcome("error", text.removeprefix(f"Error executing tool {case.tool}: "), [text])
    return _answer(case, result.structured_content)


def _json_safe(case: Case) -> bool:
    """Whether the arguments survive JSON-RPC as they are (a NaN or an integer past 64 bits may not)."""
    try:
        return json.loads(json.dumps(case.args, allow_nan=False)) == case.args
    except ValueError:
        return False


async def sweep(seed: int, n: int, stdio_count: int, rows: bool) -> tuple[Counter, Counter, list[str]]:
    """n draws from `seed`; (findings by kind, answers by face and by tool with their verdict, the findings'
    lines)."""
    rng = random.Random(seed)
    kinds: Counter = Counter()
    verdicts: Counter = Counter()
    tools: Counter = Counter()  # the api's verdict per tool
    lines: list[str] = []
    params = StdioServerParameters(command=sys.executable, args=["-m", "meshplan.faces.mcp"],
                                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                        "MESHPLAN_CALIBRATION_FILE": ""})
    with tempfile.TemporaryDirectory() as tmp:
        async with Client(app) as client, Client(params) as stdio:
            sent = 0
            for number in range(n):
                case = draw(rng)
                over_stdio = stdio if sent < stdio_count and _json_safe(case) else None
                sent += over_stdio is not None
                outcomes = await run_case(case, client, over_stdio, Path(tmp))
                for face, outcome in outcomes.items():
                    verdicts[f"{face} {outcome.kind}"] += 1
                tools[f"{case.tool} {outcomes['api'].kind}"] += 1
                for kind, detail in judge(case, outcomes):
                    kinds[kind] += 1
                    lines.append(f"[{number}] {kind}: {case.tool} {json.dumps(case.args, default=str)[:300]}\n"
                                 f"    {detail}")
                if rows:
                    print(number, case.tool, {f: o.kind for f, o in outcomes.items()}, flush=True)
    return kinds, verdicts + tools, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seed", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("--stdio", type=int, default=20, help="how many draws are also sent over stdio")
    parser.add_argument("--rows", action="store_true", help="print each draw's verdicts as it goes")
    args = parser.parse_args()
    started = time.time()
    kinds, verdicts, lines = anyio.run(sweep, args.seed, args.n, args.stdio, args.rows)
    print("\n".join(lines))
    print(f"seed {args.seed}: {args.n} draws in {time.time() - started:.0f} s")
    print("answers:", dict(sorted(verdicts.items())))
    print("findings:", dict(sorted(kinds.items())) or "none")


if __name__ == "__main__":
    main()
