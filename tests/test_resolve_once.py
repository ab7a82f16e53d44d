"""Resolve once: the resolver attaches the job's framework card and its RL section (request/resolve.carry_cards), and
the estimators, rules, search, RL and check read them from the job (`job.card`, `job.rl_card`, a rule's `ctx.card`),
never looking a card up by name again. The one lookup by name left in those layers is a loop over every framework,
a fact about the others (a fix naming the frameworks that support a feature), plus the few ALLOWED below; the
knowledge modules they ask with the job's card (CARD_TAKERS) look none up at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("arithmetic", "estimate", "rules", "search", "rl", "check")
# Knowledge modules those layers ask with the job's card: each function takes the card, never a framework's name
# (knowledge/adapter_knobs.py: the rules' AD001/RC005/RC006, the search's refused ZeRO stages, the resolver's
# recompute default; the adapters hand it the card of the framework they write).
CARD_TAKERS = ("meshplan/knowledge/adapter_knobs.py",)
LOOKUPS = ("framework_card", "rl_card")
# The iterables whose loop variable may be looked up: every framework.
ALL_FRAMEWORKS = ("FRAMEWORKS", "framework_names")

# (module, function) that may look a card up by name, each with why.
ALLOWED = {
    ("meshplan/rl/job.py", "resolve_rl"): "turns an RL request into the trainer's request, before any Job exists (the "
                                          "resolver, recommend_rl and min-gpus ask it of a request)",
    ("meshplan/rl/job.py", "_critic_engine"): "resolve_rl's ZeRO default for PPO's critic, on the request likewise",
    ("meshplan/rl/job.py", "trainer_request"): "the RL trainer's training request for the actor search, before any "
                                               "Job: the RL launcher's allocator where the request leaves it out",
    ("meshplan/check/headline.py", "layout_text"): "names a report's layout in a header: a CheckReport, no Job (the "
                                                   "faces and render call it, light for the MCP server's start-up)",
}


def _loop_targets(node: ast.AST) -> set[str]:
    """Names a `for` or a comprehension binds while iterating over every framework."""
    generators = node.generators if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) \
        else [node] if isinstance(node, (ast.For, ast.comprehension)) else []
    out = set()
    for gen in generators:
        it = gen.iter.func if isinstance(gen.iter, ast.Call) else gen.iter
        if isinstance(it, ast.Name) and it.id in ALL_FRAMEWORKS and isinstance(gen.target, ast.Name):
            out.add(gen.target.id)
    return out


def lookups_by_name(source: str) -> list[tuple[str, int, str]]:
    """(enclosing function, line, the call's text) of every framework_card / rl_card call in `source` whose argument
    is not the variable of a loop over every framework."""
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, function: str, loop_vars: frozenset[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            bound = loop_vars | _loop_targets(child)
            if isinstance(child, ast.Call):
                name = child.func.id if isinstance(child.func, ast.Name) else getattr(child.func, "attr", None)
                arg = child.args[0] if child.args else None
                if name in LOOKUPS and not (isinstance(arg, ast.Name) and arg.id in bound):
                    found.append((function, child.lineno, ast.unparse(child)))
            visit(child, inner, bound)

    visit(ast.parse(source), "<module>", frozenset())
    return found


def test_estimators_rules_search_rl_and_check_read_the_job_s_card_not_a_card_by_name():
    wrong, seen = [], set()
    paths = [path for layer in LAYERS for path in sorted((ROOT / "meshplan" / layer).rglob("*.py"))]
    for path in [*paths, *(ROOT / name for name in CARD_TAKERS)]:
        rel = path.relative_to(ROOT).as_posix()
        for function, line, call in lookups_by_name(path.read_text(encoding="utf-8")):
            if (rel, function) in ALLOWED:
                seen.add((rel, function))
            else:
                wrong.append(f"{rel}:{line} {function}: {call} (read job.card / job.rl_card / ctx.card)")
    assert not wrong, "\n".join(wrong)
    assert seen == set(ALLOWED), f"allowed but no longer looking a card up: {sorted(set(ALLOWED) - seen)}"


def test_the_walk_finds_a_lookup_by_name_and_passes_a_loop_over_every_framework():
    source = '''
def by_name(job, ctx):
    a = framework_card(job.framework)
    b = cards.rl_card(ctx.framework)
    return [n for n in FRAMEWORKS if framework_card(n).compile] + [framework_card(n) for n in others]

def looped():
    for name in framework_names():
        framework_card(name)
    return {f: rl_card(f) for f in FRAMEWORKS}
'''
    assert [(f, line) for f, line, _ in lookups_by_name(source)] == [("by_name", 3), ("by_name", 4), ("by_name", 5)]
