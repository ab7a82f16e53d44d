"""The host configuration files point at things that exist: console scripts of this package, its skills."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_project_mcp_json_launches_the_console_script():
    servers = json.loads((ROOT / ".mcp.json").read_text())["mcpServers"]
    assert servers["meshplan"]["command"] == "meshplan-mcp"
    assert SCRIPTS["meshplan-mcp"] == "meshplan.faces.mcp.__main__:main"


def test_claude_plugin_bundles_the_skills_and_the_server():
    plugin = json.loads((ROOT / ".claude-plugin" / "plugin.json").read_text())
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", plugin["name"])
    skills = ROOT / plugin["skills"]
    assert (skills / "parallelism-strategies" / "SKILL.md").is_file()
    server = plugin["mcpServers"]["meshplan"]
    assert server["command"] == "uvx"
    assert server["args"] == ["--from", "${CLAUDE_PLUGIN_ROOT}", "meshplan-mcp"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert plugin["version"] == version
