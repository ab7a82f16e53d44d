"""Every face gives the same answer: the same requests through `meshplan.api`, the CLI's `--json`, and the MCP
tools over stdio (the SDK's client talking to a `meshplan serve` process) must give identical structured results,
and identical reasons when they refuse.

The MCP answers are the api reports plus words (`summary`, `next_steps`); those are dropped before comparing.
A field the caller leaves out must stay open on every face: the MCP schema has no defaults that pretend to be
choices (the blocker of issue 12: MCP ranked micro-batch 1 / no recompute only, the CLI searched them).
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from tree_under_test import tree_env

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.request.parse import parse_request, unknown_field_error
from meshplan.schema.request import Request

pytestmark = pytest.mark.anyio

WORDS = ("summary", "next_steps")
# Tool -> (CLI subcommand, api function). render and recommend take extra arguments, handled below.
TOOLS = {
    "estimate_memory": ("memory", api.estimate_memory),
    "estimate_throughput": ("throughput", api.estimate_throughput),
    "check_config": ("check", api.check_config),
    "recommend_parallelism": ("recommend", None),
    "render_config": ("render", None),
    "describe_model": ("describe", None),
    "list_models": ("models", None),
    "minimum_gpus": ("min-gpus", None),
}

L8 = {"model": "llama-3.1-8b", "gpu": "h100"}
FLAGS_13B = ("megatron-core flags: --num-layers 40 --hidden-size 5120 --ffn-hidden-size 13824 --num-attention-heads 40 "
             "--vocab-size 32000 --swiglu --untie-embeddings-and-output-weights --normalization RMSNorm "
             "--disable-bias-linear --position-embedding-type rope --max-position-embeddings 4096")
L70 = {"model": "llama-3.1-70b", "gpu": "h100"}
Q30 = {"model": "qwen3-30b-a3b", "gpu": "h100"}
DSV3 = {"model": "deepseek-v3", "gpu": "h100"}

# a model's config.json sent as its text (what a caller over HTTP sends, where a path names the server's file)
CONFIG_JSON = json.dumps({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                          "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 8,
                          "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False})

# (tool, arguments): at least 30, every tool, the examples, some refusals.
RL = {"framework": "verl", "num_gpus": 16, "ep": 8, "job": "rl", "samples_per_prompt": 8, "prompts_per_step": 64,
      "response_length": 4096}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("estimate_memory", {**L8, "num_gpus": 8, "tp": 2}),
    ("estimate_memory", {**L70, "num_gpus": 64, "tp": 8, "pp": 2}),
    ("estimate_memory", {**L70, "num_gpus": 64, "tp": 4, "pp": 4, "vpp": 5, "micro_batch_size": 2,
                         "recompute": "selective", "global_batch_size": 512}),
    ("estimate_memory", {**Q30, "num_gpus": 16, "ep": 16, "etp": 1, "framework": "megatron-bridge"}),
    ("estimate_memory", {**DSV3, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 64, "etp": 1, "recompute": "full"}),
    ("estimate_memory", {**L8, "num_gpus": 8, "framework": "torchtitan", "seq_length": 8192}),
    ("estimate_memory", {**L8, "num_gpus": 16, "framework": "deepspeed", "zero_stage": 3, "gpu": "a100-80gb"}),
    ("estimate_memory", {**DSV3, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 64, "etp": 1, "recompute": "selective",
                         "recompute_modules": ["core_attn", "mla_up_proj", "moe_act"]}),
    ("estimate_memory", {**L70, "num_gpus": 64, "tp": 8, "pp": 4, "recompute": "full", "recompute_method": "uniform",
                         "recompute_layers": 4}),
    ("estimate_memory", {**L8, "num_gpus": 8, "framework": "torchtitan", "seq_length": 8192, "recompute": "selective",
                         "selective_ac_option": "2"}),
    ("estimate_memory", {"model": "70B", "num_gpus": 8, "tp": 8}),
    ("estimate_memory", {**L70, "num_gpus": 64, "tp": 8, "pp": 2, "precision": "fp8", "fp8_recipe": "tensorwise",
                         "fp8_param_gather": True, "optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False}),
    ("estimate_memory", {**L70, "num_gpus": 64, "tp": 8, "pp": 2, "zero_stage": 1, "optimizer": "muon"}),
    ("check_config", {**L8, "num_gpus": 8, "precision": "fp8", "fp8_recipe": "mxfp8"}),
    # the SwiGLU input's fp8 store and FP8 attention (cards/memory.yaml fp8_saves), and PR007 refusing the latter
    ("estimate_memory", {**L70, "num_gpus": 64, "tp": 8, "pp": 2, "framework": "megatron-bridge", "precision": "fp8",
                         "fp8_activation_input_store": True, "fp8_dot_product_attention": True}),
    ("check_config", {**L8, "num_gpus": 8, "framework": "megatron-bridge", "precision": "fp8",
                      "fp8_recipe": "blockwise", "fp8_dot_product_attention": True}),
    # RL jobs (meshplan/rl/): memory per phase, the RL step's parts, the rollout rules, the RL command
    ("estimate_memory", {**Q30, **RL, "param_offload": True, "optimizer_offload": True}),
    ("estimate_throughput", {**Q30, **RL, "rollout_enforce_eager": True}),
    ("estimate_throughput", {**Q30, **RL, "mean_response_length": 1024}),  # the passes at the mean, a drain to 4096
    ("estimate_throughput", {**Q30, **RL, "mean_response_length": 5000}),  # over response_length: refused
    ("check_config", {**Q30, **RL, "rollout_tp": 2, "rollout_ep": 4}),
    ("render_config", {"framework": "verl", **Q30, **RL, "rollout_tp": 4, "param_offload": True}),
    ("recommend_parallelism", {**Q30, **RL}),
    ("estimate_memory", {**Q30, "num_gpus": 16, "ep": 8, "rollout_tp": 2}),  # RL fields on megatron-core: refused
    # LoRA (meshplan/arithmetic/lora.py): frozen base, adapters' states and time, the Bridge peft config, a refusal
    ("estimate_memory", {**L70, "num_gpus": 8, "tp": 2, "pp": 4, "framework": "megatron-bridge", "lora_rank": 16,
                         "lora_targets": ["linear_qkv"]}),
    ("estimate_throughput", {**L8, "num_gpus": 8, "framework": "megatron-bridge", "job": "lora"}),
    ("render_config", {"framework": "megatron-bridge", **L8, "num_gpus": 8, "lora_rank": 8}),
    ("estimate_memory", {**L8, "num_gpus": 8, "lora_rank": 8}),  # megatron-core has no LoRA: LORA001
    ("recommend_parallelism", {**L70, "num_gpus": 8, "lora_rank": 16}),  # refused up front: LORA001 on every plan
    ("recommend_parallelism", {**L8, "num_gpus": 8, "optimizer_offload_fraction": 1.0,
                               "cpu_memory_per_node": 1}),  # refused up front: MEM003's host floor
    ("recommend_parallelism", {**Q30, "framework": "skyrl", "num_gpus": 16, "job": "rl", "algorithm": "grpo",
                               "cpu_memory_per_node": 113.7}),  # refused up front: SkyRL's colocated offload floor
    ("recommend_parallelism", {**L8, "num_gpus": 8, "seq_length": 2048, "cp": 2,
                               "micro_batch_size": 3}),  # an empty space: each rule's count, the change that opens it
    ("estimate_memory", {**DSV3, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 64, "etp": 1, "recompute": "full",
                         "framework": "megatron-bridge", "pipeline_layout": "Et*4|(t*4|)*14t,mL"}),
    ("check_config", {**DSV3, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 64, "etp": 1,
                      "framework": "megatron-bridge", "pipeline_layout": "Et*4|(t*4|)*14t,xL"}),
    ("estimate_throughput", {**L8, "num_gpus": 8, "tp": 2}),
    ("estimate_throughput", {**L70, "num_gpus": 64, "tp": 8, "pp": 2, "global_batch_size": 256}),
    ("estimate_throughput", {**Q30, "num_gpus": 16, "ep": 8, "etp": 1, "moe_token_dispatcher": "alltoall"}),
    ("estimate_throughput", {**Q30, "num_gpus": 16, "ep": 16, "moe_a2a_overlap": True}),
    ("estimate_throughput", {**L70, "num_gpus": 64, "tp": 8, "pp": 2, "global_batch_size": 256,
                             "tp_comm_overlap": True}),
    ("check_config", {**L8, "num_gpus": 8, "tp": 2, "sequence_parallel": False, "tp_comm_overlap": True}),  # TP005
    ("estimate_throughput", {**Q30, "num_gpus": 16, "ep": 8, "etp": 1, "moe_routing_imbalance": 1.3}),
    ("estimate_memory", {**Q30, "num_gpus": 16, "ep": 8, "etp": 1, "moe_routing_imbalance": 1.3}),
    ("estimate_memory", {**L8, "num_gpus": 8, "moe_routing_imbalance": 1.3}),  # dense: refused, naming the field
    ("estimate_throughput", {**DSV3, "num_gpus": 1024, "tp": 2, "pp": 16, "ep": 64, "etp": 1,
                             "recompute": "full", "moe_token_dispatcher": "flex"}),
    ("estimate_throughput", {**L8, "num_gpus": 32, "cp": 4, "seq_length": 65536, "global_batch_size": 64}),
    ("estimate_throughput", {**L8, "num_gpus": 8, "precision": "fp8", "framework": "torchtitan"}),
    ("check_config", {**L8, "num_gpus": 8, "tp": 3}),
    ("check_config", {**L70, "num_gpus": 64, "tp": 8, "pp": 2}),
    ("check_config", {**L70, "num_gpus": 8, "framework": "torchtitan"}),
    ("check_config", {**Q30, "num_gpus": 16, "ep": 16, "framework": "megatron-bridge"}),
    ("check_config", {**L8, "num_gpus": 8, "tp": 2, "framework": "verl", "zero_stage": 3}),
    ("check_config", {"model": "70B", "num_gpus": 8, "tp": 8}),
    ("recommend_parallelism", {**L70, "num_gpus": 16}),
    ("recommend_parallelism", {**L8, "num_gpus": 8}),
    ("recommend_parallelism", {**Q30, "num_gpus": 16}),
    ("recommend_parallelism", {"model": "qwen3-235b-a22b", "gpu": "h100", "num_gpus": 64}),
    ("recommend_parallelism", {**L70, "num_gpus": 64, "micro_batch_size": 1, "recompute": "none"}),
    ("recommend_parallelism", {"model": "mixtral-8x7b", "gpu": "h100", "num_gpus": 32, "top_k": 3}),
    ("render_config", {"framework": "megatron-core", **L70, "num_gpus": 64, "tp": 8, "pp": 2}),
    ("render_config", {"framework": "torchtitan", **L8, "num_gpus": 8}),
    ("render_config", {"framework": "deepspeed", **L8, "num_gpus": 16, "zero_stage": 3}),
    ("render_config", {"framework": "verl", **Q30, "num_gpus": 16, "tp": 2, "ep": 8, "etp": 1}),
    ("describe_model", {"model": "deepseek-v3"}),
    ("describe_model", {"model": "70B"}),
    ("describe_model", {"model": "Qwen/Qwen3-30B-A3B"}),
    # a model no catalog card has, named by the Megatron-LM flags that build it (knowledge/flag_models.py)
    ("describe_model", {"model": FLAGS_13B}),
    ("estimate_memory", {"model": FLAGS_13B, "gpu": "h100", "num_gpus": 16, "tp": 4, "pp": 2}),
    ("check_config", {"model": FLAGS_13B + " --hidden-sise 5120", "gpu": "h100", "num_gpus": 16}),
    ("list_models", {}),
    ("minimum_gpus", {"model": "llama-3.1-405b", "gpu": "h100"}),
    ("minimum_gpus", {"model": "deepseek-v3", "gpu": "h20", "headroom": 0.05}),
    ("minimum_gpus", {**L70, "tp": 8, "max_gpus": 8}),
    # an RL job with a fixed layout: it used to end in `KeyError: None` (issue 23)
    ("minimum_gpus", {"model": "qwen3-30b-a3b", "gpu": "h100", "framework": "verl", "job": "rl", "algorithm": "grpo",
                      "tp": 2, "ep": 8}),
    # no GPU count can fit (one micro-batch's logits alone): the count-free floor's proof, the same on every face
    ("minimum_gpus", {"model": "qwen2.5-7b", "gpu": "h100", "framework": "kempnerforge", "seq_length": 131072}),
    ("recommend_parallelism", {"model": "llama-3.1-405b", "gpu": "h100", "num_gpus": 1}),
    ("recommend_parallelism", {**L70, "num_gpus": 16, "headroom": 0.001}),
    # refusals: the same reason on every face
    ("estimate_memory", {**L8, "num_gpus": 64, "tensor_parallel_size": 8, "pipeline_parallel": 2}),
    ("check_config", {**L8, "num_gpus": 8, "tp": 0}),
    ("describe_model", {"model": "no-such-model-xyz"}),
    ("estimate_throughput", {**L8, "num_gpus": 8, "precision": "fp4"}),
    # Megatron-Core's sequence-parallel scatter of 4097 tokens over TP2 (SP004): every face said the layout ran
    ("estimate_memory", {**L8, "num_gpus": 8, "tp": 2, "seq_length": 4097}),
    # the flex dispatcher on a dense model (EP006, no effect): said by the estimates on every face, not check alone
    ("estimate_throughput", {**L8, "num_gpus": 8, "moe_token_dispatcher": "flex"}),
    # describe of a blank model: the words every other ask gives
    ("describe_model", {"model": " "}),
    # attention_backend and dropout (Megatron-LM's functional tests: --attention-backend unfused, dropout 0.1)
    ("estimate_memory", {**L8, "num_gpus": 8, "tp": 2, "attention_backend": "unfused", "dropout": True}),
    ("estimate_throughput", {**L8, "num_gpus": 8, "attention_backend": "flash", "dropout": True}),
    ("render_config", {**L8, "num_gpus": 8, "framework": "kempnerforge", "attention_backend": "unfused"}),
    ("check_config", {**L8, "num_gpus": 8, "framework": "torchtitan", "attention_backend": "fused"}),
    ("estimate_memory", {**L8, "num_gpus": 8, "attention_backend": "triton"}),
    # recompute_layers where the framework has no key for it: RC005 with the card's instead; recommend refuses up front
    ("check_config", {**L8, "num_gpus": 8, "framework": "torchtitan", "recompute": "full", "recompute_layers": 2}),
    ("recommend_parallelism", {**L8, "num_gpus": 8, "framework": "nanotron", "recompute_layers": 2}),
    # nanotron runs no cp or ep as modelled: NT001 with its card's cannot_run; recommend refuses a fixed one up front
    ("check_config", {**L8, "num_gpus": 8, "framework": "nanotron", "cp": 2}),
    ("recommend_parallelism", {**L8, "num_gpus": 8, "framework": "nanotron", "cp": 2}),
    # a count that fills no whole node runs with fewer processes per node (request/resolve.launch_gpus_per_node), at
    # the default batch recommend compares at (default_global_batch); a prime count over one node is refused
    ("recommend_parallelism", {**L70, "num_gpus": 20, "seq_length": 8192, "top_k": 2}),
    ("check_config", {**L70, "num_gpus": 20, "seq_length": 8192, "tp": 4, "pp": 5, "vpp": 4, "micro_batch_size": 2,
                      "zero_stage": 1, "recompute": "full"}),
    ("render_config", {"framework": "torchtitan", **L8, "num_gpus": 12, "tp": 2}),
    ("check_config", {**L8, "num_gpus": 13}),
    ("estimate_memory", {"model": CONFIG_JSON, "gpu": "h100", "num_gpus": 8, "tp": 2}),
    ("describe_model", {"model": CONFIG_JSON[:-1]}),  # bad JSON: the words a config.json file's gets
    # the cluster's own inter-node network (request/resolve.cluster_gpu): timed on it, searched on it, refused out of
    # its bounds alike
    ("estimate_throughput", {**L70, "num_gpus": 64, "tp": 8, "pp": 2, "global_batch_size": 256,
                             "network_gbps_per_node": 400.0}),
    ("recommend_parallelism", {**L8, "num_gpus": 16, "network_gbps_per_node": 400.0, "top_k": 2}),
    ("minimum_gpus", {**L70, "tp": 8, "max_gpus": 16, "network_gbps_per_node": 400.0}),
    ("check_config", {**L8, "num_gpus": 16, "network_gbps_per_node": 0.5}),
]


def _argv(tool: str, args: dict[str, Any]) -> list[str]:
    command = TOOLS[tool][0]
    args = dict(args)
    argv = [command]
    if tool == "render_config":
        argv.append(args.pop("framework"))
    if tool == "recommend_parallelism" and "top_k" in args:
        argv += ["--top-k", str(args.pop("top_k"))]
    if tool == "minimum_gpus" and "max_gpus" in args:
        argv += ["--max-gpus", str(args.pop("max_gpus"))]
    for name, value in args.items():
        if isinstance(value, list):  # a list field (recompute_modules): one flag, several values
            argv += ["--" + name.replace("_", "-"), *map(str, value)]
            continue
        argv += ["--" + name.replace("_", "-"), str(value).lower() if isinstance(value, bool) else str(value)]
    return [*argv, "--json"]


def via_cli(tool: str, args: dict[str, Any]) -> tuple[str, Any]:
    """('ok', the --json result) or ('error', the message) from the command line, in process."""
    unknown = [name for name in args if name not in Request.model_fields
               and name not in ("framework", "top_k", "max_gpus")]
    if unknown:  # a misspelt flag is argparse's to refuse; the CLI's JSON face for loose fields is --batch
        return via_batch(tool, args)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(_argv(tool, args))
        except SystemExit:  # argparse refuses a value outside a flag's choices before meshplan sees it
            return "error", err.getvalue()
    if code == cli.EXIT_USAGE or not out.getvalue():
        return "error", err.getvalue().removeprefix("meshplan: ").strip()
    result = json.loads(out.getvalue())
    return "ok", without_words(result) if isinstance(result, dict) else result


def via_batch(tool: str, args: dict[str, Any]) -> tuple[str, Any]:
    """The CLI's batch face: one JSON line in, one out."""
    command = TOOLS[tool][0]
    stdin, out, err = io.StringIO(json.dumps(args) + "\n"), io.StringIO(), io.StringIO()
    old = sys.stdin
    sys.stdin = stdin
    try:
        with redirect_stdout(out), redirect_stderr(err):
            cli.main([command, "--batch", "-"])
    finally:
        sys.stdin = old
    line = json.loads(out.getvalue().splitlines()[0])
    line.pop("line", None)  # the batch face numbers its output lines
    return ("error", line["error"]) if "error" in line else ("ok", without_words(line))


def via_api(tool: str, args: dict[str, Any]) -> tuple[str, Any]:
    args = dict(args)
    try:
        if tool == "describe_model":
            result: Any = api.describe_model(model_argument(args))
        elif tool == "list_models":
            return "ok", [m.model_dump(mode="json") for m in api.list_models()]
        elif tool == "recommend_parallelism":
            top_k = args.pop("top_k", 5)
            result = api.recommend(parse_request(args), top_k=top_k)
        elif tool == "minimum_gpus":
            max_gpus = args.pop("max_gpus", None)
            result = api.minimum_gpus(parse_request(args), max_gpus=max_gpus)
        elif tool == "render_config":
            framework = args.pop("framework")
            result = api.render_config(framework, parse_request(args))
        else:
            result = TOOLS[tool][1](parse_request(args))
    except MeshplanError as exc:
        return "error", str(exc)
    return "ok", without_words(result.model_dump(mode="json"))


def without_words(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in WORDS}


def model_argument(args: dict[str, Any]) -> str:
    """describe_model's one argument, refusing others as the MCP tool does."""
    for name in args:
        if name != "model":
            raise unknown_field_error(name, ["model"])
    return args["model"]


async def via_mcp(client: Client, tool: str, args: dict[str, Any]) -> tuple[str, Any]:
    result = await client.call_tool(tool, args)
    if result.is_error:
        text = result.content[0].text
        return "error", text.removeprefix(f"Error executing tool {tool}: ")
    data = without_words(result.structured_content)
    if tool == "list_models":
        return "ok", data["models"]
    return "ok", data


def _same_reason(a: str, b: str) -> bool:
    """Refusals agree when they give the same reason (the CLI's argparse words a bad choice its own way)."""
    return a.strip() == b.strip()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.parametrize("part", range(6))
async def test_cli_mcp_and_api_give_identical_results(tmp_path, part):
    """In six parts (each a test of its own, with its own MCP server, which pytest-xdist's workers share): every
    sixth case, from the part-th (six puts the five recommend / min-gpus cases that take a second or more apart)."""
    assert len(CASES) >= 30 and {tool for tool, _ in CASES} == set(TOOLS)
    params = StdioServerParameters(command=sys.executable, args=["-m", "meshplan.faces.mcp"], cwd=str(tmp_path),
                                    env=tree_env({}))
    disagreements = []
    with anyio.fail_after(600):
        async with Client(params) as client:
            for tool, args in CASES[part::6]:
                mcp_kind, mcp_value = await via_mcp(client, tool, args)
                api_kind, api_value = via_api(tool, args)
                cli_kind, cli_value = via_cli(tool, args)
                label = f"{tool} {json.dumps(args)}"
                if not (mcp_kind == api_kind == cli_kind):
                    disagreements.append(f"{label}: mcp {mcp_kind}, api {api_kind}, cli {cli_kind}: "
                                         f"{str(mcp_value)[:200]} | {str(api_value)[:200]} | {str(cli_value)[:200]}")
                elif mcp_kind == "ok" and not (mcp_value == api_value == cli_value):
                    keys = [k for k in api_value if not (mcp_value.get(k) == api_value.get(k) == cli_value.get(k))] \
                        if isinstance(api_value, dict) else ["(list)"]
                    disagreements.append(f"{label}: results differ in {keys}")
                elif mcp_kind == "error" and not _same_reason(mcp_value, api_value):
                    disagreements.append(f"{label}: reasons differ: mcp {mcp_value!r} vs api {api_value!r}")
                elif mcp_kind == "error" and "--" not in cli_value and not _same_reason(cli_value, api_value):
                    disagreements.append(f"{label}: reasons differ: cli {cli_value!r} vs api {api_value!r}")
    assert not disagreements, "\n".join(disagreements)


async def test_a_field_left_out_is_open_on_every_face(tmp_path):
    """The blocker: MCP's schema must not default micro_batch_size/recompute, and null must mean 'open'."""
    from meshplan.faces.mcp.server import app

    async with Client(app) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        props = tools["recommend_parallelism"].input_schema["properties"]
        for name in ("micro_batch_size", "recompute", "tp", "pp", "zero_stage", "headroom"):
            assert props[name].get("default") is None, name
        args = {**L70, "num_gpus": 16, "headroom": 0.001}
        left_out = await client.call_tool("recommend_parallelism", args)
        nulls = await client.call_tool("recommend_parallelism", {**args, "micro_batch_size": None, "recompute": None})
    assert not left_out.is_error and not nulls.is_error
    best = left_out.structured_content["candidates"][0]
    assert best == nulls.structured_content["candidates"][0]
    cli_best = api.recommend(parse_request(args)).candidates[0]
    assert best["plan"] == cli_best.plan.model_dump(mode="json")
    # 70B on 16 H100 only fits with full recompute: the face that fixed recompute=none had nothing to rank.
    assert (best["plan"]["tp"], best["plan"]["pp"], best["plan"]["dp"], best["plan"]["recompute"]) == (4, 4, 1, "full")


LAYOUT_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "zero_stage", "micro_batch_size", "recompute")


async def test_recommends_first_checks_and_renders_with_the_same_flags_on_every_face(tmp_path):
    """recommend on 20 H100 (not whole 8-GPU nodes) compares at 520 sequences and 5 nodes x 4; its #1 given back with
    the same flags and no global_batch_size passes check and renders on every face at that batch and those nodes.
    Before: check and render took 512 sequences (micro-batch 2 x dp 1) and refused it with PP005, and render refused
    20 GPUs of 8-GPU nodes."""
    ask = {**L70, "num_gpus": 20, "seq_length": 8192}
    rec = api.recommend(parse_request(ask), top_k=1)
    assert rec.global_batch_size == 520 and rec.gpus_per_node == 4
    assert any("5 nodes x 4" in note and "4 GPUs of each node sit idle" in note for note in rec.assumptions)
    best = rec.candidates[0].plan.model_dump()
    layout = {**ask, **{name: best[name] for name in LAYOUT_FIELDS}}
    rendered = {"framework": "megatron-core", **layout}
    params = StdioServerParameters(command=sys.executable, args=["-m", "meshplan.faces.mcp"], cwd=str(tmp_path),
                                    env=tree_env({}))
    with anyio.fail_after(300):
        async with Client(params) as client:
            checks = [await via_mcp(client, "check_config", layout), via_api("check_config", layout),
                      via_cli("check_config", layout)]
            renders = [await via_mcp(client, "render_config", rendered), via_api("render_config", rendered),
                       via_cli("render_config", rendered)]
    for kind, check in checks:
        assert kind == "ok" and check["ok"] and not [f for f in check["findings"] if f["severity"] == "error"], check
    for kind, render in renders:
        assert kind == "ok", render
        assert "--nnodes 5 --nproc-per-node 4" in render["text"] and "--global-batch-size 520" in render["text"]


def test_throughput_says_when_the_layout_does_not_fit():
    """A step time alone reads as a plan that runs: Kimi-K2 on 7 H100 at TP1 PP1 got 264 tokens/s/GPU without a word
    that it needs terabytes per GPU. The estimate of a layout over the GPU now says so first, with the figure memory
    gives; a layout that fits gets no such warning."""
    from meshplan import api
    from meshplan.schema.request import Request

    over = Request(model="llama-3.1-70b", gpu="h100", num_gpus=1)
    peak = api.estimate_memory(over)
    assert not peak.fits
    warned = api.estimate_throughput(over).warnings[0]
    gib = peak.fit_bytes / 2**30
    assert warned.startswith(f"This layout does not fit: its memory estimate peaks at {gib:,.1f} GiB")
    fits = Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, micro_batch_size=1, recompute="full", zero_stage=1)
    assert api.estimate_memory(fits).fits
    assert not any("does not fit" in w for w in api.estimate_throughput(fits).warnings)


# GRPO over one sample per prompt (RL008, a warning no layout field decides): min-gpus said nothing of it
ONE_SAMPLE = {"model": "qwen3-8b", "gpu": "h100", "framework": "verl", "job": "rl", "algorithm": "grpo",
              "samples_per_prompt": 1}


@pytest.mark.parametrize("max_gpus", [None, 1])
async def test_min_gpus_gives_recommends_warnings_on_every_face(max_gpus):
    """min-gpus' warnings are recommend's for the same request: at the count it finds, recommend's answer there; where
    it finds none (max_gpus 1), the job's own, which recommend gives at any count. On the api, the CLI's --json and
    text, and the MCP tool alike."""
    from meshplan.faces.mcp.server import app

    args = {**ONE_SAMPLE, **({} if max_gpus is None else {"max_gpus": max_gpus})}
    found = api.minimum_gpus(parse_request(ONE_SAMPLE), max_gpus=max_gpus)
    assert (found.num_gpus is None) == (max_gpus is not None)
    recommended = api.recommend(parse_request({**ONE_SAMPLE, "num_gpus": found.num_gpus or 8}), top_k=1).warnings
    assert found.warnings == recommended and [w[:6] for w in found.warnings] == ["RL008 "]
    assert via_cli("minimum_gpus", args) == via_api("minimum_gpus", args) == ("ok", without_words(found.model_dump(
        mode="json")))
    text = io.StringIO()
    with redirect_stdout(text):
        cli.main([*_argv("minimum_gpus", args)[:-1]])
    assert f"warnings:\n  - {found.warnings[0]}\nassumptions:" in text.getvalue()
    async with Client(app) as client:
        assert await via_mcp(client, "minimum_gpus", args) == via_api("minimum_gpus", args)


# moe_shared_expert_overlap for a dense model (EP014, a warning no layout field decides): check and the estimates
# said it, the training recommend and min-gpus (which copies recommend's warnings) did not
DENSE_OVERLAP = {**L8, "moe_shared_expert_overlap": True}


def _ep014_line() -> str:
    """EP014 in check's words (schema/reports.finding_line), for the dense model given shared-expert overlap."""
    from meshplan.schema.reports import finding_line

    found = [f for f in api.check_config(parse_request({**DENSE_OVERLAP, "num_gpus": 8})).findings
             if f.id == "EP014"]
    assert len(found) == 1
    return finding_line(found[0])


async def test_recommend_gives_the_job_warnings_on_every_face():
    """The training recommend says the warnings of the rules that read no plan field (EP014 here) once, in check's
    words, at every GPU count, in the answer's warnings and not again in each row's rationale: on the api, the CLI's
    --json and text, and the MCP tool alike."""
    from meshplan.faces.mcp.server import app

    line = _ep014_line()
    args = {**DENSE_OVERLAP, "num_gpus": 8, "top_k": 2}
    rec = api.recommend(parse_request({k: v for k, v in args.items() if k != "top_k"}), top_k=2)
    assert rec.candidates and rec.warnings.count(line) == 1 and rec.warnings[-1] == line
    message = line.split(": ", 1)[1].split(" Fix: ")[0]
    assert not any(message in c.rationale for c in rec.candidates) and message not in rec.rationale
    sixteen = api.recommend(parse_request({**DENSE_OVERLAP, "num_gpus": 16}), top_k=1)
    assert sixteen.warnings[-1] == line  # the rule reads no GPU count: neither does the warning
    assert via_cli("recommend_parallelism", args) == via_api("recommend_parallelism", args) == ("ok", without_words(
        rec.model_dump(mode="json")))
    text = io.StringIO()
    with redirect_stdout(text):
        cli.main(_argv("recommend_parallelism", args)[:-1])
    assert f"- {line}" in " ".join(text.getvalue().split())
    async with Client(app) as client:
        assert await via_mcp(client, "recommend_parallelism", args) == via_api("recommend_parallelism", args)


@pytest.mark.parametrize("max_gpus", [None, 1])
async def test_min_gpus_gives_a_training_jobs_warnings_on_every_face(max_gpus):
    """min-gpus of a training job says the job's warnings as recommend does: at the count it finds (recommend's answer
    there) and where it finds none (max_gpus 1: a dense 8B's states fit no single H100), on every face."""
    from meshplan.faces.mcp.server import app

    line = _ep014_line()
    args = {**DENSE_OVERLAP, **({} if max_gpus is None else {"max_gpus": max_gpus})}
    found = api.minimum_gpus(parse_request(DENSE_OVERLAP), max_gpus=max_gpus)
    assert (found.num_gpus is None) == (max_gpus is not None)
    assert found.warnings.count(line) == 1
    if found.num_gpus is not None:
        at = api.recommend(parse_request({**DENSE_OVERLAP, "num_gpus": found.num_gpus}), top_k=1)
        assert found.warnings == at.warnings
    assert via_cli("minimum_gpus", args) == via_api("minimum_gpus", args) == ("ok", without_words(found.model_dump(
        mode="json")))
    async with Client(app) as client:
        assert await via_mcp(client, "minimum_gpus", args) == via_api("minimum_gpus", args)
