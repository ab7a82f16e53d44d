"""Bad input gets the same first error on every face: an unknown name before any value, with the name it most likely
means (the CLI's flags, the api's and MCP's fields), and never a traceback."""

from __future__ import annotations

import pytest
from mcp_calls import call_tool

from meshplan.faces import cli

BASE = ["recommend", "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8"]


def cli_error(capsys, *flags: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([*BASE, *flags])
    assert exc.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[0]


@pytest.mark.parametrize(("flags", "said"), [
    (["--tpp", "2"], "unknown flag '--tpp' (did you mean '--tp'?)"),
    (["--tensor-model-parallel-size", "2"], "unknown flag '--tensor-model-parallel-size' (did you mean '--tp'?)"),
    (["--gpu_type", "h100"], "unknown flag '--gpu_type' (did you mean '--gpu'?)"),
    (["--jsn"], "unknown flag '--jsn' (did you mean '--json'?)"),
    (["--zzzz"], "unknown flag '--zzzz'"),
    # A bad value of a known flag given before the unknown flag: the unknown name is still the first error.
    (["--tp", "x", "--tpp", "2"], "unknown flag '--tpp' (did you mean '--tp'?)"),
    (["--tp=x", "--tpp=2"], "unknown flag '--tpp' (did you mean '--tp'?)"),
])
def test_cli_names_an_unknown_flag_first_with_the_subcommand_and_a_hint(capsys, flags, said):
    assert cli_error(capsys, *flags) == f"meshplan recommend: error: {said}"


def test_cli_abbreviations_and_values_after_double_dash_are_not_unknown_flags(capsys):
    assert cli_error(capsys, "--num-gpu", "8", "--tp", "x").startswith("meshplan recommend: error: argument --tp:")


def test_unknown_field_before_a_bad_value_on_cli_and_mcp_alike(capsys):
    """The same request with a misspelt field and a bad value: both faces name the misspelt field and its guess."""
    said = call_tool("recommend_parallelism", {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8, "tp": "x",
                                               "tpp": 2})
    assert said.is_error and "Unknown field 'tpp'. Fix: Did you mean 'tp'?" in said.content[0].text
    assert "'--tpp' (did you mean '--tp'?)" in cli_error(capsys, "--tp", "x", "--tpp", "2")
