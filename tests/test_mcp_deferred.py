"""The MCP tools listed from the published file (tool_schemas.json) and each built on its first call (deferred.py).

The file is derived from the tools' functions the SDK's way (tool_list.py): a stale one fails here and in
`meshplan docs --check`. The server answers tools/list without importing the report models or the tools' module,
and a tool built by two first calls at once is built once.
"""

from __future__ import annotations

import sys
import threading

import anyio
import pytest
from mcp import Client, StdioServerParameters
from tree_under_test import tree_env

from meshplan.faces import docs
from meshplan.faces.cli import main
from meshplan.faces.mcp import deferred, tool_list
from meshplan.faces.mcp.results import MemoryAnswer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_the_published_file_is_what_the_sdk_builds_from_the_functions():
    assert deferred.published() == tool_list.published_tools()
    assert docs.tool_schemas_path().read_text(encoding="utf-8") == tool_list.published_text()


def test_docs_check_names_a_stale_tool_list_and_docs_rewrites_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "skills").mkdir()  # no skill page: only the tool list is generated here
    monkeypatch.setattr(docs, "skills_root", lambda: tmp_path / "skills")
    copy = tmp_path / deferred.SCHEMA_FILE
    copy.write_text(docs.tool_schemas_path().read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(docs, "tool_schemas_path", lambda: copy)
    assert docs.render_all(check=True) == []

    (fn, title, description), *rest = tool_list.SPECS  # a tool's description edited, its file not regenerated
    monkeypatch.setattr(tool_list, "SPECS", [(fn, title, description + " Changed."), *rest])
    assert docs.render_all(check=True) == [deferred.SCHEMA_FILE]
    assert main(["docs", "--check"]) == 1
    assert f"out of date with its sources: {deferred.SCHEMA_FILE}" in capsys.readouterr().err
    assert "Changed." not in copy.read_text(encoding="utf-8"), "check mode must not write"
    assert docs.render_all(check=False) == [deferred.SCHEMA_FILE]
    assert "Changed." in copy.read_text(encoding="utf-8")
    assert docs.render_all(check=True) == []


def test_a_deferred_tool_builds_the_sdks_tool_once_for_concurrent_first_calls():
    tools = {tool.name: tool for tool in deferred.deferred_tools()}
    assert list(tools) == [fn.__name__ for fn, _, _ in tool_list.SPECS]
    tool = tools["estimate_memory"]
    start, built = threading.Barrier(8), []

    def first_call() -> None:
        start.wait()
        built.append(tool.real())

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 8 and all(real is built[0] for real in built)
    real = built[0]
    assert (real.parameters, real.output_schema) == (tool.parameters, tool.output_schema)
    assert real.fn_metadata.output_model is MemoryAnswer  # the result checked against its model, as before


LAZY = ("meshplan.schema.reports", "meshplan.faces.mcp.tools", "meshplan.api")  # what the first tool call loads
# The server with one more tool (built by the SDK at start-up, not deferred) that reports which modules are loaded.
LOADED_SERVER = f"""
import sys
from meshplan.faces.mcp import server

@server.app.tool(name="loaded")
def loaded() -> dict[str, bool]:
    return {{name: name in sys.modules for name in {LAZY!r}}}

server.run()
"""


async def test_the_server_lists_its_tools_before_importing_the_report_models(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-c", LOADED_SERVER], cwd=str(tmp_path),
                                   env=tree_env({}))
    async with Client(params) as client:
        with anyio.fail_after(60):
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert names == [fn.__name__ for fn, _, _ in tool_list.SPECS] + ["loaded"]
            assert (await client.call_tool("loaded", {})).structured_content == dict.fromkeys(LAZY, False)
            answer = await client.call_tool("describe_model", {"model": "llama-3.1-8b"})
            assert not answer.is_error and answer.structured_content["total_params"] > 8e9
            assert (await client.call_tool("loaded", {})).structured_content == dict.fromkeys(LAZY, True)
