"""The distribution installs as one top-level package, `meshplan`, with its cards, skills and templates.

Three proofs: the editable install that the README sets up (the test session itself runs on it); a wheel built
from the source tree holds every package under meshplan/ and every card, skill and template, and no module the
tree no longer has; and that wheel, installed (not editable) into a fresh virtual environment, answers every
subcommand and the MCP server's tools/list from a directory outside the repo, with the same numbers as the source.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from framework_packages import python_executable, venv_python
from test_mcp_transports import RawServer

from meshplan.faces.cli import main

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RUNTIME_DEPS = PYPROJECT["project"]["dependencies"]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"  # the fresh venv's: this session's Python
DATA = {"cards": "meshplan/cards_data", "skills": "meshplan/skills", "meshplan/adapters/templates":
        "meshplan/adapters/templates"}
# Build outputs and caches a checkout may hold; the wheel is built from a copy without them.
NOT_SOURCE = {".git", "build", "dist", ".venv", ".pytest_cache", ".ruff_cache", ".hypothesis", "__pycache__"}
RENDERABLE = {"deepspeed", "kempnerforge", "megatron-bridge", "megatron-core", "nemo-automodel", "skyrl", "torchtitan",
              "verl"}
MCP_TOOLS = {"recommend_parallelism", "check_config", "estimate_memory", "estimate_throughput", "render_config",
             "describe_model", "list_models", "minimum_gpus", "render_report", "compare_run"}
L8B = ["llama-3.1-8b", "--num-gpus", "8", "--tp", "2"]


def test_editable_install_finds_package_data_from_outside_the_repo(tmp_path):
    code = (
        "import json, meshplan.knowledge.cards as c, meshplan.knowledge.catalog as m;"
        "print(json.dumps([len(c.card_names()), m.describe_model('llama-3.1-8b').total_params]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    n_cards, total = json.loads(proc.stdout)
    assert n_cards >= 30 and total == 8030261248


# --------------------------------------------------------------------------- the wheel


def source_copy(dest: Path) -> Path:
    """The checkout without its build outputs, plus a stale module in build/lib as an earlier build of a tree
    that has since moved it would leave there (setup.py must start from an empty build/lib/meshplan)."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in NOT_SOURCE or n.endswith(".egg-info") or (n == "out" and folder.endswith(
            "bench"))}

    shutil.copytree(REPO, dest, ignore=ignore)
    stale = dest / "build" / "lib" / "meshplan" / "moved_away.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("raise ImportError('a module the source tree no longer has')\n")
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = source_copy(tmp_path_factory.mktemp("source") / "meshplan")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("meshplan-*.whl")
    return path


def source_files(folder: str) -> set[str]:
    """Every file under `folder` of the repo, relative to it (caches left out)."""
    root = REPO / folder
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def test_wheel_holds_every_package_and_its_data_and_nothing_stale(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"meshplan"}
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "meshplan").rglob("__init__.py")
                if "__pycache__" not in p.parts}
    assert len(packages) >= 13
    assert {f"{p}/__init__.py" for p in packages} <= names, "a package under meshplan/ is missing from the wheel"
    modules = {n for n in names if n.endswith(".py") and not n.startswith(tuple(DATA.values()))}
    assert modules == {f"meshplan/{f}" for f in source_files("meshplan") if f.endswith(".py")}  # none stale
    for folder, installed in DATA.items():  # the files meshplan reads (the cards' READMEs are for readers)
        files = {f for f in source_files(folder) if f != "__init__.py"
                 and not (folder == "cards" and f.endswith(".md"))}
        assert files and {f"{installed}/{f}" for f in files} <= names, f"{folder}/ is not all in the wheel"
    assert "meshplan/cards_data/models/llama-3.1-8b.yaml" in names


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The bin folder of a fresh venv with the wheel installed (not editable). Its runtime dependencies come from
    a cached venv (framework_packages.venv_python) through a .pth file; meshplan itself is installed fresh."""
    deps = venv_python("meshplan-runtime-deps", RUNTIME_DEPS, python_version=PYTHON)
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([python_executable(PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(deps), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (venv / "lib" / f"python{PYTHON}" / "site-packages" / "runtime_deps.pth").write_text(site + "\n")
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                              str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    return venv / "bin"


def run_installed(bin_dir: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """A console script of the installed wheel, run from `cwd` with an environment as bare as a host's."""
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)}, timeout=600)


def run_source(cwd: Path, *argv: str) -> str:
    """The same command's stdout on the source tree (the editable install this session runs on), run from `cwd` in
    this process: the tree under test is the code this process imports (tree_under_test), so a subprocess per
    command only paid another interpreter start and card load (about 2 s of CPU each, 15 of them)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    assert code == 0, (argv, err.getvalue()[-3000:])
    return out.getvalue()


def test_wheel_in_fresh_venv_runs_describe_outside_the_repo(installed, tmp_path):
    proc = run_installed(installed, tmp_path, "meshplan", "describe", "llama-3.1-8b", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["total_params"] == 8030261248
    where = subprocess.run([str(installed / "python"), "-c", "import meshplan; print(meshplan.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert str(REPO) not in where.stdout and str(installed.parent) in where.stdout and "site-packages" in where.stdout


def answers(installed: Path, outside: Path, *argv: str) -> dict | list:
    """The JSON answer of the installed `meshplan argv --json`, checked equal to the source tree's."""
    proc = run_installed(installed, outside, "meshplan", *argv, "--json")
    assert proc.returncode == 0, (argv, proc.stderr[-3000:])
    answer = json.loads(proc.stdout)
    assert answer == json.loads(run_source(outside, *argv, "--json")), argv
    return answer


@pytest.mark.slow
def test_installed_wheel_answers_every_subcommand_outside_the_repo(installed, tmp_path):
    """Every subcommand of the installed wheel, run outside the repo, prints real answers (the source tree's)."""
    help_text = run_installed(installed, tmp_path, "meshplan", "--help").stdout
    for command in ("describe", "models", "memory", "throughput", "check", "recommend", "min-gpus", "render",
                    "serve", "docs"):
        assert f"    {command}" in help_text, command
    assert run_installed(installed, tmp_path, "meshplan", "--version").stdout.strip() == "meshplan 0.1.0"

    models = answers(installed, tmp_path, "models")
    assert len(models) >= 30 and {"llama-3.1-8b", "deepseek-v3"} <= {m["key"] for m in models}
    assert answers(installed, tmp_path, "describe", "llama-3.1-8b")["total_params"] == 8030261248
    memory = answers(installed, tmp_path, "memory", *L8B)
    assert memory["fits"] and 0 < memory["peak_bytes"] < memory["capacity_bytes"] and memory["stages"]
    speed = answers(installed, tmp_path, "throughput", *L8B)
    assert speed["step_time_s"] > 0 and speed["tokens_per_s_per_gpu"] > 0 and 0 < speed["mfu"] < 1
    check = answers(installed, tmp_path, "check", *L8B)
    assert check["ok"] and check["plan"]["tp"] == 2 and check["plan"]["dp"] == 4
    best = answers(installed, tmp_path, "recommend", "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8")
    plan = best["candidates"][0]["plan"]
    assert best["num_gpus"] == 8 and plan["tp"] * plan["pp"] * plan["cp"] * plan["dp"] == 8
    fewest = answers(installed, tmp_path, "min-gpus", "llama-3.1-8b")
    assert 1 <= fewest["num_gpus"] <= 8 and fewest["candidate"]["plan"]

    render_help = " ".join(run_installed(installed, tmp_path, "meshplan", "render", "--help").stdout.split())
    listed = render_help.split("Framework to write the config for: ", 1)[1].split(" MODEL ", 1)[0]
    assert set(listed.split(", ")) == RENDERABLE
    for framework in sorted(RENDERABLE):
        rendered = answers(installed, tmp_path, "render", framework, *L8B)
        assert rendered["framework"] == framework and "TP2 PP1 DP4" in rendered["text"], framework
        assert "rendered by meshplan" in rendered["text"]

    docs = run_installed(installed, tmp_path, "meshplan", "docs", "--check")  # the installed skills vs cards
    assert docs.returncode == 0 and not docs.stderr, docs.stderr[-3000:]

    batch = tmp_path / "requests.jsonl"
    batch.write_text("".join(json.dumps({"model": "llama-3.1-8b", "num_gpus": 8, "tp": tp}) + "\n" for tp in (2, 3)))
    proc = run_installed(installed, tmp_path, "meshplan", "memory", "--batch", str(batch))
    first, second = (json.loads(line) for line in proc.stdout.splitlines())
    assert first["line"] == 1 and first["peak_bytes"] == memory["peak_bytes"]
    assert second["line"] == 2 and "WS001" in second["error"]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["meshplan-mcp"], ["meshplan", "serve"]])
def test_installed_mcp_server_lists_its_tools_and_answers_outside_the_repo(installed, tmp_path, argv):
    server = RawServer([str(installed / argv[0]), *argv[1:]], tmp_path, env={"PATH": "/usr/bin:/bin",
                                                                             "HOME": str(tmp_path)})
    try:
        assert server.initialize()["result"]["serverInfo"]["name"]
        tools = server.ask({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})["result"]["tools"]
        assert {t["name"] for t in tools} == MCP_TOOLS
        assert all(t["description"] and t["inputSchema"]["properties"] for t in tools if t["name"] != "list_models")
        reply = server.ask({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "describe_model", "arguments": {"model": "llama-3.1-8b"}}})["result"]
        assert not reply.get("isError") and reply["structuredContent"]["total_params"] == 8030261248
    finally:
        assert server.close() == 0


def test_ci_runs_exactly_the_readme_commands():
    """.ci/run must run the README's install-and-run command and its test command, nothing else (besides installing
    Debian's chromium for the browser tests)."""
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:3]]
    browser = "command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)"
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert browser in lines
    ci_commands = [line for line in lines if line.strip() and line != browser
                   and not line.startswith(("#", "set ", "cd "))]
    assert ci_commands == blocks
    assert blocks[0].startswith("python -m pip install -e") and blocks[1] == "python -m pytest -q"
