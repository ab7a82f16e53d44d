"""Framework facts live in the framework cards: no estimator, rule helper or search module tests a framework's name.

A string constant equal to a framework name (schema.FRAMEWORKS, i.e. a file in cards/frameworks/) in these modules
is a fact that belongs in that card (an engine, a default, a limit, a knob the search opens); the code reads the
card field instead. Adding a framework is then a card plus, where it renders, an adapter builder
(cards/frameworks/README.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

from meshplan.schema.choices import FRAMEWORKS

MESHPLAN = Path(__file__).resolve().parent.parent / "meshplan"
# The layers below the adapters and faces: the estimators, the rules, the resolver and the search.
LAYERS = ("arithmetic", "rules", "estimate", "check", "request", "search")

# (module, name): the only string constants allowed to equal a framework name, each with why.
ALLOWED = {
    # World-size laws (cards.WorldSizeLaw) are named after the framework whose mesh defined each; a card names
    # its law (world_size_law), any card may adopt one, and mesh.py is the one module that implements them.
    ("mesh.py", "torchtitan"),
    ("mesh.py", "kempnerforge"),
}


# Engine names (cards' `engine` field) that coincide with framework names key the error-band regimes there.
SKIPPED = {"accuracy.py"}


def _modules() -> list[Path]:
    return [path for layer in LAYERS for path in sorted((MESHPLAN / layer).rglob("*.py")) if path.name not in SKIPPED]


def _framework_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FRAMEWORKS]


def test_the_checked_modules_exist():
    missing = [p.name for p in _modules() if not p.exists()]
    assert not missing, f"rename the module list: {missing}"
    assert any(p.parent.name == "search" for p in _modules())  # the search package's modules


def test_no_framework_name_is_tested_outside_the_cards():
    found = [f"{path.name}:{line}: {name!r}" for path in _modules() for line, name in _framework_constants(path)
             if (path.name, name) not in ALLOWED]
    assert not found, ("framework names in code (put the fact in cards/frameworks/<name>.yaml and read the "
                       "card field):\n" + "\n".join(found))


def test_every_allowed_name_is_still_used():
    used = {(path.name, name) for path in _modules() for _, name in _framework_constants(path)}
    assert ALLOWED <= used, f"drop from ALLOWED: {sorted(ALLOWED - used)}"


def test_the_check_catches_a_framework_test(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(job):\n    """nanotron\'s way"""\n    return job.framework in ("verl", "skyrl")\n')
    assert [name for _, name in _framework_constants(probe)] == ["verl", "skyrl"]
