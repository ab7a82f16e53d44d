"""The test set-up itself.

- The test cache (tests/framework_packages.py) when two test runs share a machine: each entry is built once,
  under its lock, and a reader sees it whole or not at all (never half-unpacked, never a half-built venv).
- The dataset tests' guard (tests/conftest.py): without ../shared they fail saying where it must be; they skip
  only under MESHPLAN_NO_SHARED=1, and never under CI=true.
- The processes a test starts import meshplan from the tree under test (tests/tree_under_test.py), not from wherever
  the package is installed.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from framework_packages import cached_dir, venv_python
from tree_under_test import TREE, tree_env

from meshplan.knowledge.cards import card_names

TESTS = Path(__file__).resolve().parent

# A builder that takes a second between its two halves, and logs each time it runs.
FAKE_BUILDER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from framework_packages import cached_dir

entry, log, go = map(Path, sys.argv[1:4])
while not go.exists():
    time.sleep(0.01)

def fill(staging):
    with open(log, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    (staging / "a").write_text("first half")
    time.sleep(1.0)
    (staging / "sub").mkdir()
    (staging / "sub" / "b").write_text("second half")
    return "fake"

got = cached_dir(entry, fill)
assert (got / "a").read_text() == "first half" and (got / "sub" / "b").read_text() == "second half"
print(got)
"""

VENV_BUILDER = """
import subprocess, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from framework_packages import venv_python

go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.01)
python = venv_python("concurrent", [], python_version="{version}")
print(python)
print(subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, text=True, check=True).stdout)
"""


def run_both(code: str, args: list[str], go: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """Starts two copies of `code`, releases them together, and waits for both."""
    procs = [subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    time.sleep(0.5)  # both are importing, then waiting for the go file
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err)
            for p, (out, err) in zip(procs, outs, strict=True)]


def test_two_builders_of_one_entry_build_it_once_and_both_see_it_whole(tmp_path):
    entry, log, go = tmp_path / "cache" / "entry", tmp_path / "log", tmp_path / "go"
    results = run_both(FAKE_BUILDER.format(tests=str(TESTS)), [str(entry), str(log), str(go)], go, dict(os.environ))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert {r.stdout.strip() for r in results} == {str(entry)}
    assert len(log.read_text().splitlines()) == 1  # the second waited on the lock, then found it complete
    assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*")) == [".complete", "a", "sub", "sub/b"]
    assert sorted(p.name for p in entry.parent.iterdir()) == ["entry", "entry.lock"]  # no staging folder left


def test_a_builder_that_fails_leaves_nothing_half_built(tmp_path):
    entry = tmp_path / "entry"

    def broken(staging: Path) -> str:
        (staging / "a").write_text("first half")
        raise RuntimeError("download failed")

    with pytest.raises(RuntimeError, match="download failed"):
        cached_dir(entry, broken)
    assert not entry.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["entry.lock"]
    assert (cached_dir(entry, lambda staging: "ok") / ".complete").read_text() == "ok"


def test_two_runs_building_one_venv_both_get_a_working_venv(tmp_path, monkeypatch):
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    go = tmp_path / "go"
    env = {**os.environ, "MESHPLAN_TEST_CACHE": str(tmp_path / "cache")}
    results = run_both(VENV_BUILDER.format(tests=str(TESTS), version=version), [str(go)], go, env)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    pythons = {r.stdout.splitlines()[0] for r in results}
    assert len(pythons) == 1 and all(r.stdout.splitlines()[1].startswith("pip ") for r in results)
    venv = Path(pythons.pop()).parent.parent
    assert (venv / ".complete").exists() and (venv.parent / f"{venv.name}.lock").exists()
    monkeypatch.setenv("MESHPLAN_TEST_CACHE", str(tmp_path / "cache"))  # a later call finds it complete
    assert venv_python("concurrent", [], python_version=version) == venv / "bin" / "python"


DATASET_TEST = """
from pathlib import Path
import pytest

pytestmark = pytest.mark.shared_data(Path({missing!r}))

def test_reads_the_dev_set():
    pass

def test_uses_the_rows(production_rows):
    pass
"""


@pytest.mark.parametrize(("env", "rc", "outcome", "says"), [
    ({}, 1, "2 errors", "Put it there, or set MESHPLAN_NO_SHARED=1"),
    ({"MESHPLAN_NO_SHARED": "1"}, 0, "2 skipped", "MESHPLAN_NO_SHARED=1: "),
    ({"MESHPLAN_NO_SHARED": "1", "CI": "true"}, 1, "2 errors", "Put it there, or set MESHPLAN_NO_SHARED=1"),
])
def test_dataset_tests_fail_without_shared_unless_told_to_skip(tmp_path, env, rc, outcome, says):
    tests = tmp_path / "checkout" / "tests"
    tests.mkdir(parents=True)
    (tests / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    missing = tmp_path / "shared" / "validation" / "dev.yaml"
    (tests / "test_dataset.py").write_text(DATASET_TEST.format(missing=str(missing)))
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "MESHPLAN_NO_SHARED")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(tests)],
                          cwd=tmp_path, capture_output=True, text=True, env={**clean, **env})
    assert proc.returncode == rc, proc.stdout[-3000:]
    assert outcome in proc.stdout and says in proc.stdout and str(missing) in proc.stdout


def test_ci_fails_when_a_dataset_test_skipped_for_any_reason(tmp_path):
    tests = tmp_path / "checkout" / "tests"
    tests.mkdir(parents=True)
    (tests / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tests / "test_dataset.py").write_text(
        f"import pytest\npytestmark = pytest.mark.shared_data({str(tmp_path)!r})\n\n"
        "def test_skips():\n    pytest.skip('some other reason')\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "MESHPLAN_NO_SHARED")}
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tests)]
    assert subprocess.run(run, cwd=tmp_path, capture_output=True, env=clean).returncode == 0
    proc = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, env={**clean, "CI": "true"})
    assert proc.returncode == 1 and "CI=true: 1 dataset tests skipped" in proc.stdout


# --------------------------------------------------------------------------- the tree a started process imports

# Calls that start the MCP server or the CLI (or code importing meshplan) in a process of their own; test_packaging
# runs the installed wheel on purpose.
STARTERS = ("StdioServerParameters", "RawServer", "run", "Popen")
INSTALLED_ON_PURPOSE = ("test_packaging.py",)


def test_a_started_process_imports_meshplan_from_the_tree_under_test(tmp_path):
    """From elsewhere, with a host's near-empty environment plus tree_env's, a process imports the meshplan this one
    does, its cards included: the MCP server of tests/test_faces_agree.py imported the installed package (another
    clone's, from a lane) while the api it was compared with ran the lane's."""
    code = ("import meshplan, meshplan.knowledge.cards as c, pathlib; "
            "print(pathlib.Path(meshplan.__file__).resolve()); print(len(c.card_names()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=tree_env({}), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == [str(Path(TREE) / "meshplan" / "__init__.py"), str(len(card_names()))]


def _starts_meshplan(call: ast.Call, source: str) -> bool:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name not in STARTERS:
        return False
    if name in ("StdioServerParameters", "RawServer"):
        return True
    argv = ast.get_source_segment(source, call.args[0]) if call.args else ""
    return "meshplan" in (argv or "")


def test_every_process_a_test_starts_gets_the_tree_under_test():
    """Each call that starts the server or the CLI passes env=tree_env(...): without it the SDK's allow-list, an empty
    env or an inherited PYTHONPATH-less one imports the installed package."""
    missing = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name in INSTALLED_ON_PURPOSE:
            continue
        source = path.read_text()
        for call in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)):
            if not _starts_meshplan(call, source):
                continue
            env = next((k.value for k in call.keywords if k.arg == "env"), None)
            given = ast.get_source_segment(source, env) or "" if env is not None else ""
            if "tree_env(" not in given and not (isinstance(env, ast.Name) and f"{env.id} = tree_env(" in source):
                missing.append(f"{path.name}:{call.lineno}")
    assert not missing, f"started without env=tree_env(...): {missing}"
