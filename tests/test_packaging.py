"""The distribution installs as one top-level package, `meshplan`, with its cards, skills and templates.

Two proofs: the editable install that the README sets up (the test session itself runs on it),
and a wheel built from the repo, installed into a fresh virtual environment and run from a
directory outside the repo.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from framework_packages import venv_python

REPO = Path(__file__).resolve().parent.parent
RUNTIME_DEPS = ["mcp>=2.3,<3", "pydantic>=2.6,<3", "pyyaml>=6", "jinja2>=3.1", "rich>=13"]


def test_editable_install_finds_package_data_from_outside_the_repo(tmp_path):
    code = (
        "import json, meshplan.knowledge.cards as c, meshplan.knowledge.models as m;"
        "print(json.dumps([len(c.card_names()), m.describe_model('llama-3.1-8b').total_params]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    n_cards, total = json.loads(proc.stdout)
    assert n_cards >= 30 and total == 8030261248


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("meshplan-*.whl")
    return path


def test_wheel_has_one_top_level_package_and_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"meshplan"}
    assert "meshplan/cards_data/hardware.yaml" in names
    assert "meshplan/cards_data/models/llama-3.1-8b.yaml" in names
    assert any(n.startswith("meshplan/cards_data/frameworks/") for n in names)


def test_wheel_in_fresh_venv_runs_describe_outside_the_repo(wheel, tmp_path):
    python = venv_python("wheel-runtime", RUNTIME_DEPS, python_version="3.11")
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    script = python.parent / "meshplan"
    proc = subprocess.run([str(script), "describe", "llama-3.1-8b", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["total_params"] == 8030261248
    where = subprocess.run([str(python), "-c", "import meshplan; print(meshplan.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert str(REPO) not in where.stdout and "site-packages" in where.stdout


def test_ci_runs_exactly_the_readme_commands():
    """.ci/run must run the README's install-and-run command and its test command, nothing else."""
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:3]]
    ci_commands = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
                   if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci_commands == blocks
    assert blocks[0].startswith("python -m pip install -e") and blocks[1] == "python -m pytest -q"
