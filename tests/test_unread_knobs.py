"""Settings a plan has nothing for: refused where the framework refuses them, else accepted with a warning naming them
(the rules card's no_effect rules EP006, EP010, EP014, SP001, RC009, PP019, CP008), the estimates those without
them, in the same words on every face (the API, the CLI's check and estimates, the MCP tools in process)."""

from __future__ import annotations

import json

import pytest
from mcp_calls import call_tool

from meshplan import api
from meshplan.faces import cli
from meshplan.schema.request import Request

DENSE = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 16, "global_batch_size": 64}
BLOCK = {"recompute": "full", "recompute_method": "block"}
UNIFORM = {"recompute": "full", "recompute_method": "uniform"}

# (rule, the request with the setting, the request it reads as: the same figures, no finding)
CASES = [
    ("EP010", {"tp": 2, "etp": 2}, {"tp": 2}),
    ("EP010", {"tp": 2, "etp": 2, "framework": "megatron-bridge"}, {"tp": 2, "framework": "megatron-bridge"}),
    ("EP010", {"tp": 2, "etp": 4, "framework": "verl", "zero_stage": 1}, {"tp": 2, "framework": "verl",
                                                                          "zero_stage": 1}),
    ("RC009", {**UNIFORM, "recompute_layers": 100}, {**UNIFORM, "recompute_layers": 32}),
    ("RC009", {**BLOCK, "recompute_layers": 33}, {**BLOCK, "recompute_layers": 32}),
    ("RC009", {**UNIFORM, "pp": 2, "recompute_layers": 20}, {**UNIFORM, "pp": 2, "recompute_layers": 16}),
    ("RC009", {**UNIFORM, "pp": 2, "vpp": 2, "recompute_layers": 9}, {**UNIFORM, "pp": 2, "vpp": 2,
                                                                     "recompute_layers": 8}),
    ("RC009", {**BLOCK, "pp": 2, "vpp": 2, "recompute_layers": 9}, {**BLOCK, "pp": 2, "vpp": 2,
                                                                   "recompute_layers": 8}),
    ("PP019", {"framework": "torchtitan", "pipeline_microbatches": 4}, {"framework": "torchtitan"}),
    ("PP019", {"framework": "nemo-automodel", "pipeline_microbatches": 2}, {"framework": "nemo-automodel"}),
    ("PP019", {"pipeline_schedule": "1f1b"}, {}),
    ("PP019", {"framework": "torchtitan", "pipeline_schedule": "gpipe", "account_for_loss": True},
     {"framework": "torchtitan"}),
    ("PP019", {"account_for_embedding": True}, {}),
    ("EP006", {"moe_token_dispatcher": "flex"}, {}),  # memory and throughput said nothing (check warned)
    ("EP006", {"framework": "megatron-bridge", "moe_token_dispatcher": "flex"}, {"framework": "megatron-bridge"}),
    ("SP001", {"sequence_parallel": True}, {}),  # Megatron-LM's validate_args turns it off at tp 1
    ("SP001", {"framework": "torchtitan", "sequence_parallel": True}, {"framework": "torchtitan"}),
    ("EP014", {"moe_shared_expert_overlap": True}, {}),
    ("EP014", {"framework": "megatron-bridge", "moe_shared_expert_overlap": True}, {"framework": "megatron-bridge"}),
    ("CP008", {"cp_comm_type": "a2a"}, {}),
    ("CP008", {"framework": "torchtitan", "cp_comm_type": "allgather"}, {"framework": "torchtitan"}),
]


def figures(fields: dict) -> tuple:
    req = Request(**{**DENSE, **fields})
    memory, step = api.estimate_memory(req), api.estimate_throughput(req)
    return memory.peak_bytes, memory.fit_bytes, step.step_time_s, step.tokens_per_s_per_gpu


def found(rule: str, fields: dict) -> list:
    return [f for f in api.check_config(Request(**{**DENSE, **fields})).findings if f.id == rule]


@pytest.mark.parametrize(("rule", "given", "reads_as"), CASES)
def test_a_setting_with_no_effect_is_warned_and_priced_as_without_it(rule, given, reads_as):
    """The rule fires on the setting, is silent on what the run does (its fix), and the estimates are equal."""
    [finding] = found(rule, given)
    assert finding.severity == "warning"
    assert not found(rule, reads_as)
    assert figures(given) == figures(reads_as)
    line = f"{rule} (warning): {finding.message} Fix: {finding.fix}"  # the estimates say it too, not check alone
    req = Request(**{**DENSE, **given})
    assert line in api.estimate_memory(req).warnings
    assert line in api.estimate_throughput(req).warnings


@pytest.mark.parametrize(("rule", "given"), [
    ("EP010", {"model": "mixtral-8x7b", "tp": 2, "ep": 8, "etp": 2}),  # an MoE model's experts read etp
    ("RC009", {**BLOCK, "pp": 2, "recompute_layers": 16}),  # a stage's every layer, not above it
    ("RC009", {**BLOCK, "pp": 2, "first_stage_layers": 15, "recompute_layers": 17}),  # the last stage holds 17
    ("PP019", {"pp": 2, "pipeline_schedule": "1f1b"}),
    ("PP019", {"framework": "torchtitan", "pp": 2, "pipeline_microbatches": 2}),
    ("CP008", {"cp": 2, "cp_comm_type": "a2a"}),
    ("CP008", {"cp_comm_type": "p2p"}),  # the default, which every plan meshplan answers with states at cp 1
    ("EP006", {"model": "mixtral-8x7b", "ep": 8, "moe_token_dispatcher": "flex"}),
    ("SP001", {"tp": 2, "sequence_parallel": True}),
])
def test_the_rules_are_silent_where_the_setting_acts(rule, given):
    assert not found(rule, given)


def test_the_fix_of_each_warning_passes_check():
    """Each finding's fix, applied as it says (the knob left out, or set to the count named), leaves no finding of
    its rule."""
    for rule, given, _ in CASES:
        [finding] = found(rule, given)
        if rule == "RC009":
            most = int(finding.fix.split("recompute_layers=")[1].split(" ")[0])
            fixed = {**given, "recompute_layers": most}
        else:
            knobs = {"EP010": ("etp",), "CP008": ("cp_comm_type",),
                     "EP014": ("moe_shared_expert_overlap",),
                     "EP006": ("moe_token_dispatcher",), "SP001": ("sequence_parallel",),
                     "PP019": ("pipeline_microbatches", "pipeline_schedule", "account_for_embedding",
                               "account_for_loss")}[rule]
            assert all(k in finding.fix for k in knobs if k in given)
            fixed = {k: v for k, v in given.items() if k not in knobs}
        assert not found(rule, fixed), (rule, fixed)


def cli_out(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def test_every_face_says_it_in_the_same_words(capsys):
    """check on the API, the CLI and the MCP tool; memory and throughput carry the same line in their warnings."""
    fields = {"tp": 2, "etp": 2}
    [finding] = found("EP010", fields)
    argv = ["llama-3.1-8b", "--gpu", "h100", "--num-gpus", "16", "--global-batch-size", "64", "--tp", "2", "--etp",
            "2", "--json"]
    cli_check = json.loads(cli_out(capsys, ["check", *argv]))
    assert [f["message"] for f in cli_check["findings"] if f["id"] == "EP010"] == [finding.message]
    arguments = {**DENSE, **fields}
    tool = call_tool("check_config", arguments).structured_content
    assert [f["message"] for f in tool["findings"] if f["id"] == "EP010"] == [finding.message]
    line = f"EP010 (warning): {finding.message} Fix: {finding.fix}"
    req = Request(**arguments)
    assert line in api.estimate_memory(req).warnings
    assert line in api.estimate_throughput(req).warnings
    for name in ("estimate_memory", "estimate_throughput"):
        assert line in call_tool(name, arguments).structured_content["warnings"]
    for face in ("memory", "throughput"):
        assert line in json.loads(cli_out(capsys, [face, *argv]))["warnings"]


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_pipeline_microbatches_on_megatron_is_refused_at_any_pp(capsys, framework):
    """Megatron-Core runs the whole step in one schedule and has no key for it: refused at pp 2, and at pp 1, where it
    was once noted as ignored, in the same words on the CLI and the MCP tool."""
    for pp in (1, 2):
        argv = ["memory", "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "16", "--global-batch-size", "64",
                "--framework", framework, "--pp", str(pp), "--pipeline-microbatches", "2"]
        assert cli.main(argv) == cli.EXIT_USAGE
        said = capsys.readouterr().err.strip().removeprefix("meshplan: ")
        result = call_tool("estimate_memory", {**DENSE, "framework": framework, "pp": pp, "pipeline_microbatches": 2})
        assert result.is_error
        assert result.content[0].text.removeprefix("Error executing tool estimate_memory: ") == said
        assert "so pipeline_microbatches has no meaning there" in said


def test_block_recompute_counts_each_virtual_chunks_first_layers_in_time_as_in_memory():
    """Megatron-Core's block method recomputes the first recompute_layers of each virtual chunk (a TransformerBlock
    each): at pp 2 vpp 2 (chunks of 8), 8 is every layer, as full recompute of every layer is; the step time counted
    8 of the rank's 16 where the memory counted 16."""
    block = {**BLOCK, "pp": 2, "vpp": 2}
    assert figures({**block, "recompute_layers": 8}) == figures({"recompute": "full", "pp": 2, "vpp": 2})
    assert figures({**block, "recompute_layers": 4})[2] < figures({**block, "recompute_layers": 8})[2]
