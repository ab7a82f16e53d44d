"""One home for a render target's refusal: the MCP tool words a framework no adapter renders as the CLI does
(adapters/render.require_target), where it answered its schema's list of values."""

from __future__ import annotations

import pytest
from mcp_calls import call_tool

from meshplan.faces import cli


@pytest.mark.parametrize(("target", "said"), [
    ("nanotron", "No adapter renders 'nanotron' (it is a memory convention only"),
    ("banana", "No adapter renders 'banana'. Fix: meshplan renders:"),
    ("megatron", "No adapter renders 'megatron'. Fix: Did you mean 'megatron-core'?"),
])
def test_a_target_no_adapter_renders_is_refused_alike_on_cli_and_mcp(capsys, target, said):
    """The MCP tool answered its schema's 'Input should be ...' list where the CLI named why and the close one."""
    assert cli.main(["render", target, "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8"]) == cli.EXIT_USAGE
    cli_said = capsys.readouterr().err.strip().removeprefix("meshplan: ")
    result = call_tool("render_config", {"framework": target, "model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8})
    assert result.is_error
    assert result.content[0].text.removeprefix("Error executing tool render_config: ") == cli_said
    assert cli_said.startswith(said)
