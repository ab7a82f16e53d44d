"""The MCP tool functions called from Python with only the arguments a call needs: each takes the defaults the server
fills from its published schema, from the one model that holds them (the tool's options model beside `Request`).
render_config, minimum_gpus and recommend_parallelism raised KeyError ('variant', 'max_gpus', 'top_k') where the
server had filled every argument."""

from __future__ import annotations

import pytest
from mcp.server.mcpserver.exceptions import ToolError
from mcp_calls import call_tool

from meshplan.faces.mcp import tools
from meshplan.faces.mcp.compare_tool import compare_run
from meshplan.faces.mcp.report_tool import render_report

JOB = dict(model="llama-3.1-8b", gpu="h100")


@pytest.mark.parametrize("name, args", [
    ("render_config", dict(framework="megatron-core", num_gpus=8, recompute="full", **JOB)),
    ("minimum_gpus", dict(JOB)),
    ("recommend_parallelism", dict(num_gpus=8, seq_length=1024, global_batch_size=64, **JOB)),
])
def test_a_direct_call_answers_as_the_server_does(name, args):
    """Called directly with the options left out, the tool answers what the server answers for the same call."""
    direct = getattr(tools, name)(**args).model_dump(mode="json")
    served = call_tool(name, args)
    assert not served.is_error, served.content[0].text
    assert direct == served.structured_content


def test_the_report_tool_takes_its_defaults_directly():
    result = render_report(num_gpus=8, recompute="full", **JOB)
    assert result.structured_content["plan"]["tp"] == 1 and "memory" in result.structured_content["figures"]


@pytest.mark.parametrize("call, field", [
    (lambda: tools.render_config(num_gpus=8, **JOB), "framework"),
    (lambda: compare_run(num_gpus=8, **JOB), "log_text"),
    (lambda: tools.minimum_gpus(max_gpus=0, **JOB), "max_gpus"),
    (lambda: tools.recommend_parallelism(num_gpus=8, top_k="3", **JOB), "top_k"),
])
def test_a_required_or_bad_option_is_named(call, field):
    """A required option left out, or one out of its bounds or of the wrong type, is the tool's own error naming it
    (strict, as the server's argument check), not a KeyError."""
    with pytest.raises(ToolError, match=field):
        call()
