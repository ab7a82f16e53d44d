"""The MCP server in process: the tool contract, every tool, resource and prompt, success and failure.

The tools must be thin: each structured result is the `meshplan.api` report for the same request,
plus words (`summary`, `next_steps`). Failures a user can fix come back as `isError` results whose
text carries the reason and the fix; resources and prompts fail with JSON-RPC errors.
"""

from __future__ import annotations

import json
import re

import pytest
from mcp import Client, MCPError

from meshplan import api
from meshplan.faces.mcp.resources import skill_files
from meshplan.faces.mcp.server import INSTRUCTIONS, app
from meshplan.knowledge.cards import card_names, card_text
from meshplan.schema.request import Request

pytestmark = pytest.mark.anyio

TOOLS = {
    "recommend_parallelism", "check_config", "estimate_memory", "estimate_throughput",
    "render_config", "describe_model", "list_models", "minimum_gpus", "render_report", "compare_run",
}
REQUEST_TOOLS = {"recommend_parallelism", "check_config", "estimate_memory", "estimate_throughput", "render_config"}
SMALL = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8, "tp": 2, "seq_length": 4096, "global_batch_size": 64}
WORDS = ("summary", "next_steps")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def client():
    async with Client(app) as c:
        yield c


def report_only(structured: dict) -> dict:
    return {k: v for k, v in structured.items() if k not in WORDS}


def error_text(result) -> str:
    assert result.is_error, result.structured_content
    text = result.content[0].text
    # The SDK's text for an exception it hides is exactly this prefix; ours always says more.
    assert text.startswith("Error executing tool ") and ":" in text[len("Error executing tool "):]
    return text


# --------------------------------------------------------------------------- the contract


async def test_the_eight_tools_are_listed(client):
    assert {t.name for t in (await client.list_tools()).tools} == TOOLS


async def test_every_tool_is_read_only(client):
    for tool in (await client.list_tools()).tools:
        a = tool.annotations
        assert a is not None, tool.name
        hints = (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint)
        assert hints == (True, False, True, False), tool.name


async def test_input_schemas_are_flat_and_documented(client):
    for tool in (await client.list_tools()).tools:
        schema = json.dumps(tool.input_schema)
        assert "$ref" not in schema and "$defs" not in schema, tool.name
        for name, prop in tool.input_schema["properties"].items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
            assert "type" in prop or "anyOf" in prop or "enum" in prop, f"{tool.name}.{name}"


async def test_request_tools_take_the_request_fields_with_their_descriptions(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    for name in REQUEST_TOOLS:
        props = tools[name].input_schema["properties"]
        for field, info in Request.model_fields.items():
            assert field in props, f"{name} lacks {field}"
            if field != "framework" or name != "render_config":
                assert info.description.startswith(props[field]["description"])
    assert tools["render_config"].input_schema["properties"]["framework"]["enum"] == [  # card files, sorted
        "deepspeed", "kempnerforge", "megatron-bridge", "megatron-core", "nemo-automodel", "skyrl", "torchtitan",
        "verl"]
    # model and num_gpus may come from config_text (as `meshplan recommend --config` reads them from the file)
    assert not tools["recommend_parallelism"].input_schema.get("required")
    assert tools["estimate_memory"].input_schema["properties"]["precision"]["enum"] == ["bf16", "fp8"]


async def test_descriptions_fit_claude_codes_limit_and_lead_with_when_to_use(client):
    for tool in (await client.list_tools()).tools:
        assert 100 < len(tool.description) < 2048, tool.name
        assert tool.description.startswith("Use "), tool.name
        assert tool.output_schema is not None, f"{tool.name} has no structured output"
        assert {"summary", "next_steps"} <= set(tool.output_schema["properties"]), tool.name
    assert len(INSTRUCTIONS) < 2048


async def test_instructions_name_every_tool():
    for name in TOOLS:
        assert name in INSTRUCTIONS


async def test_server_reports_its_name_and_version(client):
    info = client.server_info
    assert info.name == "meshplan" and info.version
    assert client.instructions == INSTRUCTIONS


# --------------------------------------------------------------------------- describe_model, list_models


async def test_describe_model_is_the_api_report(client):
    result = await client.call_tool("describe_model", {"model": "meta-llama/Llama-3.1-8B"})
    assert not result.is_error
    data = result.structured_content
    assert data["total_params"] == 8030261248
    assert report_only(data) == api.describe_model("llama-3.1-8b").model_dump(mode="json")
    assert "8,030,261,248" in data["summary"] and data["next_steps"]


async def test_an_edited_config_json_is_read_again_by_the_server(client, tmp_path):
    """The server lives for hours: a config.json edited between two calls must give the new model (issue 13)."""
    from meshplan.knowledge.cards import model_card

    path = tmp_path / "config.json"
    cfg = dict(model_card("llama-3.1-8b").config)
    path.write_text(json.dumps({**cfg, "num_hidden_layers": 32}))
    first = await client.call_tool("describe_model", {"model": str(path)})
    path.write_text(json.dumps({**cfg, "num_hidden_layers": 16}))
    second = await client.call_tool("describe_model", {"model": str(path)})
    assert first.structured_content["architecture"]["num_layers"] == 32
    assert second.structured_content["architecture"]["num_layers"] == 16


async def test_describe_model_moe_summary_states_active_params(client):
    data = (await client.call_tool("describe_model", {"model": "deepseek-v3"})).structured_content
    assert data["active_params"] < data["total_params"]
    assert "active per token" in data["summary"] and "Multi-token-prediction" in data["summary"]


async def test_describe_model_generic_size_says_so(client):
    data = (await client.call_tool("describe_model", {"model": "70B"})).structured_content
    assert data["generic"] is True and "generic" in data["summary"]


async def test_describe_unknown_model_is_a_tool_error_with_suggestions(client):
    text = error_text(await client.call_tool("describe_model", {"model": "llama-3.1-8"}))
    assert "Unknown model 'llama-3.1-8'" in text and "llama-3.1-8b" in text


async def test_describe_model_argument_errors(client):
    assert "model" in error_text(await client.call_tool("describe_model", {}))
    assert "valid string" in error_text(await client.call_tool("describe_model", {"model": 7}))


async def test_list_models_matches_the_catalog(client):
    data = (await client.call_tool("list_models", {})).structured_content
    summaries = [m.model_dump(mode="json") for m in api.list_models()]
    assert data["models"] == summaries and data["count"] == len(summaries) >= 29
    assert str(len(summaries)) in data["summary"]


# --------------------------------------------------------------------------- estimate_memory


async def test_estimate_memory_is_the_api_report(client):
    result = await client.call_tool("estimate_memory", SMALL)
    assert not result.is_error
    data = result.structured_content
    assert report_only(data) == api.estimate_memory(Request(**SMALL)).model_dump(mode="json")
    assert data["plan"]["tp"] == 2 and data["plan"]["dp"] == 4
    assert f"{data['peak_bytes'] / 2**30:.1f} GiB" in data["summary"]
    assert ("fits" in data["summary"]) and "check_config" in " ".join(data["next_steps"])


async def test_estimate_memory_out_of_memory_is_an_answer_not_an_error(client):
    result = await client.call_tool("estimate_memory", {"model": "llama-3.1-70b", "num_gpus": 8})
    assert not result.is_error
    data = result.structured_content
    assert data["fits"] is False and "does NOT fit" in data["summary"]
    assert "recommend_parallelism" in " ".join(data["next_steps"])


async def test_estimate_memory_argument_errors(client):
    assert "greater than or equal to 1" in error_text(await client.call_tool("estimate_memory", {**SMALL, "tp": 0}))
    assert "'bf16' or 'fp8'" in error_text(await client.call_tool("estimate_memory", {**SMALL, "precision": "fp4"}))
    assert "valid integer" in error_text(await client.call_tool("estimate_memory", {**SMALL, "pp": "two"}))
    assert "less than or equal" in error_text(await client.call_tool("estimate_memory", {**SMALL, "num_gpus": 10**30}))
    assert "model" in error_text(await client.call_tool("estimate_memory", {"num_gpus": 8}))


async def test_estimate_memory_tool_errors_name_the_fix(client):
    text = error_text(await client.call_tool("estimate_memory", {**SMALL, "gpu": "h1000"}))
    assert "Unknown GPU 'h1000'" in text and "h100" in text
    text = error_text(await client.call_tool("estimate_memory", {**SMALL, "tp": 64}))
    assert "WS001: num_gpus=8 is not divisible by tp*pp*cp = 64*1*1" in text and "Fix:" in text  # the rule's words


async def test_the_tp_fix_without_num_gpus_follows_the_layout(client):
    """num_gpus left out is the degrees' product: TP001's fix names the tps the heads take, the count following."""
    args = {"model": "llama-3.1-70b", "gpu": "h100", "tp": 3}
    assert "Fix: tp in {1, 2, 4, 8} works." in error_text(await client.call_tool("estimate_memory", args))
    result = await client.call_tool("check_config", args)
    fixes = {f["id"]: f["fix"] for f in result.structured_content["findings"]}
    assert fixes["TP001"] == "tp in {1, 2, 4, 8} works."


async def test_a_value_of_another_json_type_is_refused_as_on_every_face(client):
    """One strict type policy (schema/request.py Request): "2" or true is not the integer the schema declares."""
    text = error_text(await client.call_tool("estimate_memory", {**SMALL, "tp": "2"}))
    assert "tp: Input should be a valid integer (got '2')" in text
    text = error_text(await client.call_tool("estimate_memory", {**SMALL, "num_gpus": True}))
    assert "num_gpus: Input should be a valid integer (got True)" in text
    text = error_text(await client.call_tool("recommend_parallelism", {**SMALL, "top_k": "3"}))
    assert "top_k" in text and "valid integer" in text


# --------------------------------------------------------------------------- estimate_throughput


async def test_estimate_throughput_is_the_api_report(client):
    result = await client.call_tool("estimate_throughput", SMALL)
    assert not result.is_error
    data = result.structured_content
    assert report_only(data) == api.estimate_throughput(Request(**SMALL)).model_dump(mode="json")
    assert 0 < data["mfu"] < 1 and data["step_time_s"] > 0
    assert f"MFU {data['mfu']:.1%}" in data["summary"]


async def test_estimate_throughput_errors(client):
    assert "Unknown model" in error_text(await client.call_tool("estimate_throughput", {**SMALL, "model": "nope"}))
    assert "'none', 'selective' or 'full'" in error_text(
        await client.call_tool("estimate_throughput", {**SMALL, "recompute": "some"}))


# --------------------------------------------------------------------------- check_config


async def test_check_config_valid_layout(client):
    result = await client.call_tool("check_config", SMALL)
    assert not result.is_error
    data = result.structured_content
    assert data["ok"] is True and data["summary"].startswith("Valid")
    assert report_only(data) | {"next_steps": None} == (
        api.check_config(Request(**SMALL)).model_dump(mode="json") | {"next_steps": None})


async def test_check_config_invalid_layout_is_a_report_not_a_tool_error(client):
    result = await client.call_tool("check_config", {**SMALL, "tp": 3})
    assert not result.is_error
    data = result.structured_content
    assert data["ok"] is False and data["summary"].startswith("INVALID")
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    assert errors and all(f["id"] in data["summary"] and f["fix"] for f in errors)


async def test_check_config_errors(client):
    assert "Unknown model" in error_text(await client.call_tool("check_config", {**SMALL, "model": "gpt-9"}))
    assert "less than or equal to 3" in error_text(await client.call_tool("check_config", {**SMALL, "zero_stage": 4}))


async def test_a_deepspeed_json_config_text_is_read_through_the_server(client):
    """Through the SDK, a config_text holding JSON was parsed into a dict (its pre-parse of every field not typed
    exactly `str`) and refused as not a string; check_config then read it with the framework argument's default,
    megatron-core, which reads no JSON. Both tools now answer as the api does for the same text."""
    text = '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}'
    args = {"model": "llama-3.1-8b", "num_gpus": 8, "config_text": text}
    expected = api.estimate_memory(api.request_from_config(api.import_config(text), {"num_gpus": 8,
                                                                                      "model": "llama-3.1-8b"}))
    memory = await client.call_tool("estimate_memory", args)
    assert not memory.is_error and memory.structured_content["peak_bytes"] == expected.peak_bytes
    check = await client.call_tool("check_config", args)
    assert not check.is_error and check.structured_content["framework"] == "deepspeed"
    assert check.structured_content["plan"]["zero_stage"] == 3


async def test_a_config_text_naming_the_model_needs_no_model_argument(client):
    """The schema required `model`, so a torchtitan TOML that names Llama-3-8B could not be checked without
    repeating it, where the CLI's `check --config FILE` reads it from the file; without either, the error says so."""
    from pathlib import Path

    text = (Path(__file__).parent / "configs" / "torchtitan_llama3_8b.toml").read_text()
    result = await client.call_tool("check_config", {"config_text": text, "num_gpus": 8})
    assert not result.is_error and result.structured_content["framework"] == "torchtitan"
    assert result.structured_content["model"] == "Llama-3.1-8B"
    assert "A model is required" in error_text(await client.call_tool("estimate_memory", {"num_gpus": 8}))


async def test_recommend_takes_the_gpu_count_from_config_text(client):
    """recommend_parallelism required num_gpus in its schema, so a verl script stating trainer.nnodes and
    n_gpus_per_node was refused ("num_gpus: Field required") where the CLI's `recommend --config FILE` reads the count
    from the file; without either, the api's own error says what to pass."""
    text = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B trainer.nnodes=1 "
            "trainer.n_gpus_per_node=8 actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.ppo_micro_batch_"
            "size_per_gpu=1 data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=64\n")
    result = await client.call_tool("recommend_parallelism", {"config_text": text, "top_k": 1})
    assert not result.is_error, error_text(result)
    assert result.structured_content["num_gpus"] == 8
    missing = error_text(await client.call_tool("recommend_parallelism", {"model": "llama-3.1-8b"}))
    assert "needs the GPU count" in missing and "num_gpus" in missing


# --------------------------------------------------------------------------- recommend_parallelism


async def test_recommend_parallelism_ranks_layouts_that_fit(client):
    args = {"model": "llama-3.1-70b", "num_gpus": 64, "top_k": 3}
    result = await client.call_tool("recommend_parallelism", args)
    assert not result.is_error
    data = result.structured_content
    assert 1 <= len(data["candidates"]) <= 3
    best = data["candidates"][0]
    assert best["memory"]["fits"] is True
    assert best["plan"]["tp"] * best["plan"]["pp"] * best["plan"]["cp"] * best["plan"]["dp"] == 64
    assert best["rationale"] and "render_config" in " ".join(data["next_steps"])
    assert f"{best['throughput']['tokens_per_s_per_gpu']:,.0f}" in data["summary"]


async def test_recommend_parallelism_impossible_job_is_answered_with_what_fits(client):
    """Nothing ranked is an answer, as on the CLI: empty candidates, the nearest misses, the smallest count."""
    result = await client.call_tool("recommend_parallelism", {"model": "llama-3.1-405b", "num_gpus": 1})
    assert not result.is_error
    data = result.structured_content
    # 104: TP8 PP13 DP1 at ZeRO-1 (the scan used to try only the most sharded stage and said 112)
    assert data["candidates"] == [] and data["closest"] and data["min_gpus"] == 104
    assert "smallest GPU count that keeps the headroom is 104" in data["summary"]
    assert any("num_gpus=104" in step for step in data["next_steps"])


async def test_recommend_parallelism_thin_headroom_names_the_layout_and_the_headroom(client):
    from meshplan.schema.reports import MemorySummary
    from meshplan.search import headroom_that_ranks

    result = await client.call_tool("recommend_parallelism", {"model": "llama-3.1-70b", "num_gpus": 16})
    data = result.structured_content
    assert not result.is_error and data["candidates"] == []
    thin = data["best_below_headroom"]
    assert (thin["plan"]["tp"], thin["plan"]["pp"], thin["plan"]["dp"], thin["plan"]["recompute"]) == (4, 4, 1, "full")
    ranks = headroom_that_ranks(MemorySummary(**thin["memory"]))  # rounded down, so passing it really ranks it
    assert "TP4 PP4 VPP10 DP1" in data["summary"] and any(f"headroom={ranks:g}." in s for s in data["next_steps"])


async def test_minimum_gpus_tool(client):
    result = await client.call_tool("minimum_gpus", {"model": "llama-3.1-405b", "gpu": "h100"})
    assert not result.is_error
    data = result.structured_content
    assert data["num_gpus"] == 104 and data["stopped_by"] == "found" and data["candidate"]["memory"]["fits"]
    assert "at least 104 GPUs" in data["summary"]
    assert api.minimum_gpus(Request(model="llama-3.1-405b", gpu="h100")).num_gpus == 104


async def test_recommend_and_minimum_gpus_summaries_say_their_warnings(client):
    """render's summary said 'N warning(s): read `warnings` before launching'; recommend's and minimum_gpus' said
    nothing of theirs (EP014 for shared-expert overlap given for a dense model), so an agent
    reading the summary alone launched without them. Each says it (tools.warnings_words), on a ranked answer, on one
    with nothing ranked and on min-gpus' scan; an answer without warnings says none."""
    dense = {"model": "llama-3.1-8b", "gpu": "h100", "moe_shared_expert_overlap": True}
    for tool, args in (("recommend_parallelism", {**dense, "num_gpus": 8, "top_k": 1}),
                       ("recommend_parallelism", {**dense, "model": "llama-3.1-70b", "num_gpus": 1}),
                       ("minimum_gpus", dense)):
        data = (await client.call_tool(tool, args)).structured_content
        assert len(data["warnings"]) >= 1, (tool, data["warnings"])
        assert data["summary"].endswith(f" {len(data['warnings'])} warning(s): read `warnings` before launching."), \
            (tool, data["summary"])
    quiet = (await client.call_tool("recommend_parallelism", {"model": "llama-3.1-8b", "num_gpus": 8,
                                                              "top_k": 1})).structured_content
    assert not quiet["warnings"] and "warning(s)" not in quiet["summary"]


async def test_recommend_parallelism_argument_errors(client):
    assert "num_gpus" in error_text(await client.call_tool("recommend_parallelism", {"model": "llama-3.1-8b"}))
    assert "top_k" in error_text(
        await client.call_tool("recommend_parallelism", {"model": "llama-3.1-8b", "num_gpus": 8, "top_k": 0}))


# --------------------------------------------------------------------------- render_config


async def test_render_config_megatron_core_flags(client):
    result = await client.call_tool("render_config", {**SMALL, "framework": "megatron-core"})
    assert not result.is_error
    data = result.structured_content
    assert "--tensor-model-parallel-size 2" in data["text"]
    assert data["framework"] == "megatron-core" and "megatron-core" in data["summary"]
    expected = api.render_config("megatron-core", Request(**SMALL))
    assert data["text"] == expected.text


def test_render_answer_mirrors_the_adapters_result():
    from meshplan.adapters.render import RenderResult
    from meshplan.faces.mcp.results import RenderAnswer

    assert set(RenderAnswer.model_fields) == set(RenderResult.model_fields) | {"summary", "next_steps"}


async def test_render_config_errors(client):
    assert "framework" in error_text(await client.call_tool("render_config", SMALL))
    assert "nanotron" in error_text(await client.call_tool("render_config", {**SMALL, "framework": "nanotron"}))
    text = error_text(await client.call_tool("render_config", {
        "model": "qwen3-30b-a3b", "num_gpus": 16, "ep": 8, "etp": 2, "framework": "torchtitan"}))
    assert "etp" in text.lower() or "expert tensor" in text.lower()


# --------------------------------------------------------------------------- unknown tool


async def test_unknown_tool_is_an_error(client):
    result = await client.call_tool("recommend", {"model": "llama-3.1-8b"})
    assert result.is_error and "Unknown tool" in result.content[0].text


async def test_unknown_tool_names_the_closest_and_lists_the_tools(client):
    """A misspelt tool is a tool error (isError, the SDK's path: the model reads it and retries) naming the closest
    tool and every tool the server lists, with no traceback."""
    listed = [tool.name for tool in (await client.list_tools()).tools]
    result = await client.call_tool("recomend_parallelism", {"model": "llama-3.1-8b"})
    assert result.is_error
    assert result.content[0].text == (
        "Unknown tool 'recomend_parallelism' (did you mean recommend_parallelism?); "
        f"the tools are: {', '.join(listed)}.")
    far = (await client.call_tool("zzz", {})).content[0].text
    assert far.startswith("Unknown tool 'zzz'; the tools are: recommend_parallelism,")


# --------------------------------------------------------------------------- resources


async def test_every_card_is_a_resource_with_its_text(client):
    listed = {str(r.uri): r for r in (await client.list_resources()).resources}
    for name in card_names():
        uri = f"card://{name}"
        assert uri in listed, uri
        assert listed[uri].mime_type == "application/yaml"
        contents = (await client.read_resource(uri)).contents
        assert contents[0].text == card_text(name)


async def test_every_skill_file_is_a_resource(client):
    listed = {str(r.uri) for r in (await client.list_resources()).resources}
    files = skill_files()
    for path, node in files.items():
        uri = f"skill://{path}"
        assert uri in listed
        assert (await client.read_resource(uri)).contents[0].text == node.read_text(encoding="utf-8")


async def test_the_main_skill_is_served():
    assert "parallelism-strategies/SKILL.md" in skill_files()


async def test_indexes_and_catalogs(client):
    cards = json.loads((await client.read_resource("card://index")).contents[0].text)["cards"]
    assert [c["name"] for c in cards] == card_names()
    skills = json.loads((await client.read_resource("skill://index")).contents[0].text)["files"]
    assert [s["path"] for s in skills] == list(skill_files())
    models = json.loads((await client.read_resource("catalog://models")).contents[0].text)
    assert {m["key"] for m in models} == {m.key for m in api.list_models()}
    gpus = json.loads((await client.read_resource("catalog://hardware")).contents[0].text)
    h100 = next(g for g in gpus if g["key"] == "h100")
    assert h100["memory_bytes"] > 80e9 * 0.99 and h100["bf16_flops"] > 9e14


async def test_resource_templates_cover_cards_and_skills(client):
    templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
    assert templates == {"card://{name}", "card://models/{key}", "card://frameworks/{name}",
                         "skill://{skill}/SKILL.md", "skill://{skill}/references/{file}"}


async def test_missing_resources_are_not_found_errors_with_hints(client):
    with pytest.raises(MCPError) as exc:
        await client.read_resource("card://models/llama-3.1-8")
    assert exc.value.error.code == -32602 and "models/llama-3.1-8b" in exc.value.error.message
    for uri in ("card://nope", "skill://nope/SKILL.md", "card://a/b/c", "card://..%2F..%2Fetc%2Fpasswd"):
        with pytest.raises(MCPError) as exc:
            await client.read_resource(uri)
        assert exc.value.error.code == -32602, uri


# --------------------------------------------------------------------------- prompts


async def test_prompts_are_listed_with_documented_arguments(client):
    prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(prompts) == {"plan_parallelism", "debug_oom"}
    for prompt in prompts.values():
        assert prompt.description
        assert all(a.description for a in prompt.arguments)
        assert {a.name for a in prompt.arguments if a.required} == {"model", "gpus"}


async def test_plan_parallelism_prompt_drives_the_tools(client):
    result = await client.get_prompt("plan_parallelism", {"model": "llama-3.1-70b", "gpus": "64", "framework": "verl"})
    text = result.messages[0].content.text
    assert result.messages[0].role == "user"
    assert "num_gpus=64" in text and "framework='verl'" in text
    for tool in ("describe_model", "recommend_parallelism", "check_config", "render_config"):
        assert tool in text


async def test_debug_oom_prompt_carries_the_layout_and_error(client):
    args = {"model": "llama-3.1-70b", "gpus": "8", "layout": "tp=8 pp=1 mbs=2", "error": "CUDA out of memory."}
    text = (await client.get_prompt("debug_oom", args)).messages[0].content.text
    assert "tp=8 pp=1 mbs=2" in text and "CUDA out of memory." in text
    assert "estimate_memory" in text and "check_config" in text
    for uri in re.findall(r"skill://[\w./-]+\.md", text):
        assert uri.removeprefix("skill://") in skill_files(), uri


async def test_prompt_argument_errors(client):
    with pytest.raises(MCPError) as exc:
        await client.get_prompt("plan_parallelism", {"model": "x", "gpus": "many"})
    assert exc.value.error.code == -32602 and "whole number" in exc.value.error.message
    with pytest.raises(MCPError) as exc:
        await client.get_prompt("debug_oom", {"model": "x", "gpus": "8", "framework": "jax"})
    assert exc.value.error.code == -32602 and "megatron-core" in exc.value.error.message
    with pytest.raises(MCPError) as exc:
        await client.get_prompt("plan_parallelism", {"model": "x"})
    assert exc.value.error.code == -32602 and "Missing required argument gpus" in exc.value.error.message
    with pytest.raises(MCPError) as exc:
        await client.get_prompt("no_such_prompt", {})
    assert exc.value.error.code == -32602 and "plan_parallelism, debug_oom" in exc.value.error.message
