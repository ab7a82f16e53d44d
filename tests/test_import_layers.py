"""Imports go one way: every module of `meshplan/` imports only from its own layer folder or the folders below it,
never inside a function (except the lazy imports listed here, each with its reason), and no two modules import
each other, directly or around a loop.

The layers, bottom up, are the folders ARCHITECTURE.md names; the order below is the one it gives. The test walks
every `import` and `from ... import` with `ast`, including those inside functions and `if TYPE_CHECKING:` blocks; an
import against the order is allowed only inside `if TYPE_CHECKING:` and only where TYPING_ONLY lists it (never run,
so no load-time dependency and no cycle: it names a type for a reader and a type checker).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "meshplan"

# Bottom up. A module may import from its own layer and any layer before it in this list.
LAYERS = ("core", "schema", "knowledge", "arithmetic", "rules", "estimate", "rl", "check", "request", "search",
          "adapters", "api", "faces")

# Imports allowed inside a function, each (importing module, imported module) with why. Start-up speed only: the
# MCP server and the CLI answer `tools/list` and `--help` without loading the estimators, the search or jinja2
# (tests/test_mcp_transports.py::test_start_up_imports_nothing_heavy holds the server to it).
LAZY = {
    ("meshplan.api", "meshplan.search"): "the search loads on the first recommend, not at server start-up",
    ("meshplan.api", "meshplan.search.rl"): "the RL search loads on the first RL recommend",
    ("meshplan.api", "meshplan.adapters.render"): "jinja2 and the builders load on the first render",
    ("meshplan.api", "meshplan.estimate.accuracy"): "the error bands load with the first estimate",
    ("meshplan.api", "meshplan.knowledge.catalog"): "the catalog loads on the first model question",
    ("meshplan.api", "meshplan.request.resolve"): "the resolver (and the models it reads) loads on the first request",
    ("meshplan.api", "meshplan.rl.job"): "the RL job loads with the first estimate",
    ("meshplan.api", "meshplan.rl.memory"): "the RL phases' memory loads with the first estimate",
    ("meshplan.api", "meshplan.rl.step_time"): "the RL step time loads with the first estimate",
    ("meshplan.api", "meshplan.check.config"): "the rules load on the first check",
    ("meshplan.api", "meshplan.adapters.read"): "the config readers (and the catalog they match shapes in) load on "
                                                "the first import",
    ("meshplan.api", "meshplan.knowledge.cluster_calibration"): "the user's calibration file is read with the first "
                                                                  "throughput estimate",
    ("meshplan.api", "meshplan.adapters.logs"): "the log readers load on the first compare",
    ("meshplan.api", "meshplan.adapters.read.fixes"): "the file-key fixes load on the first check of a config",
    ("meshplan.api", "meshplan.check.measured"): "the comparison loads on the first compare",
    ("meshplan.api", "meshplan.rules.engine"): "the no-effect rules load with the first memory or throughput "
                                               "estimate",
    ("meshplan.faces.cli", "meshplan.faces.display"): "rich loads only when a table is printed",
    ("meshplan.faces.cli", "meshplan.faces.docs"): "the docs generator loads only for `meshplan docs`",
    ("meshplan.faces.cli", "meshplan.faces.mcp.server"): "the MCP SDK loads only for `meshplan serve`",
    ("meshplan.faces.cli", "meshplan.adapters.render"): "jinja2 loads only for `meshplan render`",
    ("meshplan.faces.cli", "meshplan.faces.report"): "the report (jinja2, the estimators) loads only for `meshplan "
                                                     "report`",
    ("meshplan.faces.mcp.server", "meshplan.faces.report.page"): "the web page loads only for `serve --transport http`",
    ("meshplan.faces.mcp.report_tool", "meshplan.faces.report"): "the report loads on the first render_report call, "
                                                                  "not at server start-up",
    ("meshplan.faces.mcp.__main__", "meshplan.faces.mcp.server"): "the entry point reports a bad flag first",
    ("meshplan.faces.mcp.deferred", "meshplan.faces.mcp.tool_list"): "the tools' functions, argument and result "
                                                                       "models load on a tool's first call: the server "
                                                                       "lists them from tool_schemas.json",
    ("meshplan.faces.mcp.tools", "meshplan.search"): "recommend's next steps name the headroom that would rank a "
                                                      "layout: the search is loaded then, not with another tool's "
                                                      "first call",
    ("meshplan.faces.mcp.tools", "meshplan.adapters.render"): "render_config's target is refused in the CLI's words: "
                                                               "jinja2 and the builders load on its first call",
    ("meshplan.faces.mcp.tools", "meshplan.check.headline"): "the framework cards load on the first check_config, "
                                                              "not with another tool's first call",
    ("meshplan.faces.mcp.tools", "meshplan.check.split"): "a nothing-fits recommend names its closest misses as the "
                                                           "CLI's table does: loaded with the search that found them",
    ("meshplan.faces.mcp.resources", "meshplan.api"): "the model catalog loads on the first read of catalog://models",
    ("meshplan.faces.mcp.resources", "meshplan.knowledge.cards"): "the card loader (yaml, the card schemas) loads on "
                                                                   "the first card read",
    ("meshplan.faces.mcp.resources", "meshplan.knowledge.hardware"): "the hardware card loads on the first read of "
                                                                      "catalog://hardware",
}


# Imports against the order allowed inside `if TYPE_CHECKING:` (never run), each (importing module, imported module)
# with why.
TYPING_ONLY = {
    ("meshplan.schema.plan", "meshplan.knowledge.cards"): "Job.card's type: the resolver attaches the job's framework "
                                                          "card (request/resolve.carry_cards); schema never loads one",
    ("meshplan.schema.plan", "meshplan.knowledge.rl_card"): "Job.rl_card's type, likewise",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "meshplan"


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported meshplan module, line, inside a function) for every import in the file."""
    return [(target, line, in_function) for target, line, in_function, _ in typed_imports(path)]


def is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) with no else: its body never runs."""
    test = getattr(node, "test", None)
    name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
    return isinstance(node, ast.If) and name == "TYPE_CHECKING" and not node.orelse


def typed_imports(path: Path) -> list[tuple[str, int, bool, bool]]:
    """(imported meshplan module, line, inside a function, inside `if TYPE_CHECKING:`) for every import in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found: list[tuple[str, int, bool, bool]] = []

    def visit(node: ast.AST, in_function: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function, typing_only) for a in child.names
                             if a.name.startswith("meshplan"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join([*base, child.module] if child.module else base)
                else:
                    target = child.module or ""
                if target.startswith("meshplan"):
                    for alias in child.names:  # `from meshplan.x import y` may name a module y
                        sub = f"{target}.{alias.name}"
                        found.append((sub if known(sub) else target, child.lineno, in_function, typing_only))
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                      typing_only or is_type_checking(child))

    visit(ast.parse(path.read_text(encoding="utf-8")), False, False)
    return found


def allowed_typing_only(me: str, target: str, typing_only: bool) -> bool:
    """A TYPING_ONLY import, and inside `if TYPE_CHECKING:` (the same import run at load time is not allowed)."""
    return typing_only and (me, owner(target)) in TYPING_ONLY


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def known(module: str) -> bool:
    return module in MODULES


def owner(module: str) -> str:
    """The module file an import names (a `from pkg import name` of a non-module name is the package)."""
    while module not in MODULES and "." in module:
        module = module.rsplit(".", 1)[0]
    return module


def test_every_folder_is_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert folders | modules == set(LAYERS), "a new folder needs its place in LAYERS and in ARCHITECTURE.md"


def test_the_order_is_the_one_architecture_names():
    doc = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1].strip() for line in doc.split("## Layers", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| ") and not line.startswith(("| layer", "|---"))]
    assert tuple(rows) == LAYERS


def test_imports_go_down_only():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    wrong = []
    for me, path in MODULES.items():
        for target, line, _, typing_only in typed_imports(path):
            target = owner(target)
            if target == "meshplan" or allowed_typing_only(me, target, typing_only):
                continue  # __version__; a listed type named for a reader, never imported at run time
            if rank[layer_of(target)] > rank[layer_of(me)]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} (layer {layer_of(target)} is above "
                             f"{layer_of(me)})")
    assert not wrong, "\n".join(wrong)


def test_no_import_inside_a_function_but_the_listed_lazy_ones():
    inside = []
    for me, path in MODULES.items():
        for target, line, in_function in imports(path):
            if in_function and (me, owner(target)) not in LAZY:
                inside.append(f"{path.relative_to(ROOT)}:{line} imports {owner(target)} inside a function")
    assert not inside, "\n".join(inside)


def test_every_listed_lazy_import_is_still_there():
    seen = {(me, owner(t)) for me, path in MODULES.items() for t, _, inner in imports(path) if inner}
    assert set(LAZY) <= seen, sorted(set(LAZY) - seen)


def test_every_listed_typing_only_import_is_still_there_and_never_run():
    seen = {(me, owner(t)) for me, path in MODULES.items() for t, _, _, typing_only in typed_imports(path)
            if typing_only}
    assert set(TYPING_ONLY) <= seen, sorted(set(TYPING_ONLY) - seen)
    typing_block, with_else = ast.parse("if TYPE_CHECKING:\n    import meshplan.a\n"
                                        "if typing.TYPE_CHECKING:\n    import meshplan.a\nelse:\n    import b\n").body
    assert is_type_checking(typing_block) and not is_type_checking(with_else)  # an else branch runs


def test_no_cycles():
    graph = {me: {owner(t) for t, _, _, typing_only in typed_imports(path)
                  if not allowed_typing_only(me, t, typing_only)} - {me, "meshplan"} for me, path in MODULES.items()}
    # a package's __init__ importing its own modules is how a package is read, not a cycle
    for me in graph:
        graph[me] = {t for t in graph[me] if not (MODULES[me].name == "__init__.py" and t.startswith(me + "."))}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
