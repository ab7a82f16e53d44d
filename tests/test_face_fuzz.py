"""A seeded slice of bench/face_fuzz.py: requests drawn from the schema (valid, edge, wrong-typed, absurd and unknown
values, RL and LoRA jobs, pasted config.json text, tests/configs as config_text) sent through the api, the CLI's flags
and batch lines, the MCP tools in process and over stdio, held to no traceback, an error that says what is allowed, a
bounded call, no impossible number and the same answer on every face; and the defects its wide runs found, each held
on every face."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp_calls import call_tool

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import face_fuzz
from face_fuzz import Case, Outcome, judge

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.knowledge.catalog import MAX_MODEL_NAME_CHARS
from meshplan.request.parse import parse_request

# Each face may name the first of several faults it meets; every other kind is a defect.
ALLOWED = {"order"}


@pytest.mark.parametrize("seed", [11, 12])
def test_a_seeded_slice_of_the_face_fuzz_finds_nothing(seed):
    kinds, verdicts, lines = anyio.run(face_fuzz.sweep, seed, 60, 3, False)
    assert verdicts["api ok"] and verdicts["api error"], verdicts  # the slice judges answers and refusals both
    assert verdicts["stdio ok"] + verdicts["stdio error"] == 3, verdicts
    assert set(kinds) <= ALLOWED, "\n".join(lines)


def ok(value: object) -> Outcome:
    return Outcome("ok", value)


def error(text: str) -> Outcome:
    return Outcome("error", text, [text])


def kinds_of(outcomes: dict[str, Outcome], case: Case | None = None) -> list[str]:
    return [kind for kind, _ in judge(case or Case("estimate_memory", {"model": "llama-3.1-8b"}), outcomes)]


def test_the_judge_names_each_kind_of_defect():
    """The fuzzer's judge is what a wide run trusts: each defect it hunts is named, and agreeing faces pass."""
    said = "Invalid request: tp: Input should be greater than or equal to 1 (got 0)."
    assert kinds_of({"api": error(said), "mcp": error(said), "cli": error(said)}) == []
    assert kinds_of({"api": ok({"a": 1}), "mcp": ok({"a": 1})}) == []
    assert kinds_of({"api": ok({"a": 1}), "mcp": ok({"a": 2})}) == ["numbers"]
    assert kinds_of({"api": ok({"a": 1}), "mcp": error(said)}) == ["verdict"]
    assert kinds_of({"api": error(said), "mcp": error("Invalid request: pp: no.")}) == ["reason"]
    assert kinds_of({"api": error("No config.json at 'x'."), "mcp": error("No config.json at 'x'.")}) \
        == ["unexplained", "unexplained"]
    leaked = 'Traceback (most recent call last):\n  File "x.py", line 3\nKeyError: None'
    assert "traceback" in kinds_of({"api": error(f"{said} {leaked}")})
    assert kinds_of({"api": Outcome("bug", "KeyError: None")}) == ["bug"]
    assert kinds_of({"api": Outcome("hang", None)}) == ["hang"]
    assert kinds_of({"api": ok({"peak_bytes": -1, "mfu": 1.5, "step_seconds": float("nan")})}) == ["impossible"]
    assert face_fuzz.impossible_numbers({"headroom_bytes": -5, "active_params": 2, "total_params": 3}) == []
    assert face_fuzz.impossible_numbers({"active_params": 4, "total_params": 3})


def test_two_faults_named_in_another_order_are_no_defect_but_one_is():
    """With two bad arguments each face names the first it meets ('order'); with one, the words must match."""
    two = Case("estimate_memory", {"model": "llama-3.1-8b", "tp": 0, "pp": "2"})
    one = Case("estimate_memory", {"model": "llama-3.1-8b", "tp": 0})
    outcomes = {"api": error("Invalid request: tp: a."), "mcp": error("Invalid request: pp: b.")}
    assert kinds_of(outcomes, two) == ["order"]
    assert kinds_of(outcomes, one) == ["reason"]


def test_the_cli_face_says_what_flags_can_say():
    """A wrong JSON type has no flag text ("8" is 8 on a command line): the batch line asks it instead."""
    assert face_fuzz.cli_argv(Case("estimate_memory", {"model": "-5B", "tp": 2, "dropout": True}), None) == \
        ["memory", "--model=-5B", "--tp=2", "--dropout=true", "--json"]
    assert face_fuzz.cli_argv(Case("estimate_memory", {"model": "x", "tp": "8"}), None) is None
    assert face_fuzz.cli_argv(Case("estimate_memory", {"model": "x", "TP": 8}), None) is None
    render = Case("render_config", {"framework": "verl", "model": "x", "recompute_modules": ["mlp", "moe"]})
    assert face_fuzz.cli_argv(render, None) == ["render", "verl", "--model=x", "--recompute-modules", "mlp", "moe",
                                                "--json"]


LONG_NAME = "x" * (1 << 20)


def test_a_model_name_past_any_path_is_refused_before_the_did_you_mean(capsys):
    """A 1 MiB name that is no config.json's text (Request.model takes 1 MiB for one) reached the path probes and the
    did-you-mean's difflib over the catalog: about a second each. It is refused first, saying the limit and what to
    pass instead, on every face, in the same words."""
    started = time.process_time()
    with pytest.raises(MeshplanError) as refused:
        api.describe_model(LONG_NAME)
    assert time.process_time() - started < 0.5  # a guard against the difflib pass coming back, not a speed test
    said = str(refused.value)
    assert f"is {len(LONG_NAME):,} characters long" in said and f"at most {MAX_MODEL_NAME_CHARS:,}" in said
    assert "config.json" in said and "Fix:" in said and len(said) < 600
    assert call_tool("estimate_memory", {"model": LONG_NAME, "num_gpus": 8}).content[0].text \
        == f"Error executing tool estimate_memory: {said}"
    assert cli.main(["memory", "--model", LONG_NAME, "--num-gpus", "8"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip() == f"meshplan: {said}"
    # a path up to the limit is still read as one, and a config.json's text of any size up to 1 MiB as the model
    with pytest.raises(MeshplanError, match=r"^No config\.json at"):
        api.describe_model("/" + "d" * (MAX_MODEL_NAME_CHARS - 20) + "/config.json")


def test_a_missing_config_json_says_what_to_pass():
    """'No config.json at ...' said nothing of what would work, on every face."""
    with pytest.raises(MeshplanError) as refused:
        api.describe_model("/nonexistent/config.json")
    assert "Fix: Give the path of a model's Hugging Face config.json" in str(refused.value)


@pytest.mark.parametrize("arguments", [{}, {"model": None}])
def test_describe_without_a_model_is_refused_alike(capsys, arguments):
    """MCP's describe_model said 'model: Input should be a valid string (got None)' and the api 'model must be a
    non-empty string' where the CLI (and every other ask) says a model is required."""
    mcp = call_tool("describe_model", arguments).content[0].text.removeprefix("Error executing tool describe_model: ")
    with pytest.raises(MeshplanError) as refused:
        api.describe_model(arguments.get("model"))
    assert cli.main(["describe", "--json"]) == cli.EXIT_USAGE
    assert mcp == str(refused.value) == capsys.readouterr().err.strip().removeprefix("meshplan: ")
    assert mcp.startswith("A model is required.")


def test_describe_of_a_model_that_is_no_string_is_refused_in_the_schema_words():
    said = call_tool("describe_model", {"model": 8}).content[0].text
    mcp = said.removeprefix("Error executing tool describe_model: ")
    with pytest.raises(MeshplanError) as refused:
        api.describe_model(8)  # type: ignore[arg-type]
    assert mcp == str(refused.value) == "Invalid request: model: Input should be a valid string (got 8)."


def test_a_draw_is_json_for_the_batch_face_and_the_same_for_a_seed():
    import random

    rng, same = random.Random(5), random.Random(5)
    first = [face_fuzz.draw(rng) for _ in range(20)]
    assert first == [face_fuzz.draw(same) for _ in range(20)]
    assert len({json.dumps(case.args, default=str) for case in first}) > 15
    assert all(json.dumps(case.args, default=str) for case in first)


CONFIG = Path(__file__).resolve().parent / "configs" / "megatron_fsdp_llama3_8b.sh"


@pytest.mark.parametrize(("given", "said"), [
    ({"tp": "4k"}, "Invalid request: tp: Input should be a valid integer (got '4k')."),
    ({"num_gpus": -8}, "Invalid request: num_gpus: Input should be greater than or equal to 1 (got -8)."),
    ({"TP": 2}, "Unknown field 'TP'."),
])
def test_a_field_given_beside_a_config_is_checked_before_the_file_is_laid_under_it(given, said):
    """api.request_from_config used a field given beside the file before checking it: `"tp": "4k"` beside a launch
    script ended in TypeError: '>=' not supported between 'int' and 'str' (arithmetic/mesh.file_data_parallel).
    Now refused as every face refuses it, the MCP tool's config_text the same."""
    text = CONFIG.read_text(encoding="utf-8")
    with pytest.raises(MeshplanError) as refused:
        api.request_from_config(api.import_config(text), given)
    assert str(refused.value).startswith(said)
    mcp = call_tool("check_config", {"config_text": text, **given}).content[0].text
    assert mcp.removeprefix("Error executing tool check_config: ").split(" Valid fields")[0] \
        == str(refused.value).split(" Valid fields")[0]


@pytest.mark.parametrize(("model", "layout"), [("llama-3.1-8b", "Et*100|L"), ("qwen3-next-80b-a3b", "Et*100|L"),
                                               ("deepseek-v2-lite", "E|t*2|L")])
def test_a_layout_of_another_layer_count_is_never_searched(model, layout):
    """recommend and minimum_gpus took a pipeline_layout of more (or fewer) decoder layers than the model as a split to
    search: the floors' spans ran past the model's layers (IndexError on every face) or the search ran for minutes
    (DeepSeek-V2-Lite's 27 layers as 2). search/space.given_options leaves out the layout schedule.layout_problem
    refuses, as check's PP009 does; nothing is ranked, and the answer says which rule removed the plans."""
    asked = {"model": model, "gpu": "h200", "pipeline_layout": layout}
    rec = api.recommend(parse_request({**asked, "num_gpus": 16}))
    assert not rec.candidates and set(rec.rejected) == {"pp-layers"}
    assert api.minimum_gpus(parse_request(asked), max_gpus=8).num_gpus is None
    result = call_tool("recommend_parallelism", {**asked, "num_gpus": 16})
    assert not result.is_error and result.structured_content["rejected"] == {"pp-layers": rec.considered}
