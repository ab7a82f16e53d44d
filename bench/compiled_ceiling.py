"""What compiling the search's hot modules with Cython saves on one warm ask of a recommend_speed.py case: issue 23's
compiled lever measured with the modules' source unchanged (lane speed53; mypyc, which needs source edits and crashed
on 29 modules, was lane compiled43's). Nothing here is used by meshplan: torch-free pure Python stays its runtime.

The tree's meshplan/, bench/, cards/ and skills/ are copied to a temporary folder; MODULES there are cythonized
(language_level 3; annotations not read as C types, annotation_typing False, so no call is refused for a type its
annotation does not name; binding True, so functions keep their Python signatures) and each is built with the C
compiler Python was built with (-O2). The case is then asked in each tree under valgrind's callgrind, collected only
inside operator.call, which asks it a second time after the warm-up request and a first ask (recommend_speed.py's
WARM_UP): one warm ask's instructions in one run (bench/instruction_counts.py takes the difference of two runs; the
two agree within 0.1%), with each tree's answer hashed, so a compiled tree that answers otherwise is named. Needs
Cython, a C compiler, Python's headers and valgrind on PATH.

    python bench/compiled_ceiling.py [--only NAME] [--modules meshplan/search/bounds.py ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    from Cython.Build import cythonize
except ImportError:  # (reported when run: the bench's other scripts need no Cython)
    cythonize = None

from recommend_speed import CASES

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("meshplan", "bench", "cards", "skills")
SEARCH_MODULES = ("bounds", "floors", "engine", "plans", "space", "rank_chains", "seeding", "seed_groups", "tiers",
                  "grid_syncs")
MODULES = (*(f"meshplan/search/{name}.py" for name in SEARCH_MODULES), "meshplan/estimate/sync_floor.py",
           "meshplan/estimate/sharding_floor.py")
"""The search layer's modules that a warm DeepSeek-V3 ask on 2,048 H100 spends most of its Python in (cProfile,
bench/README.md's speed rows): the default set, the one lane speed53 measured first."""
CHILD = """
import hashlib, operator, sys
sys.path.insert(0, {bench!r})
from recommend_speed import CASES, WARM_UP
from meshplan import api
api.recommend(WARM_UP)
CASES[{index}][1]()
answer = operator.call(CASES[{index}][1])
compiled = sum(str(getattr(m, "__file__", "")).endswith({suffix!r}) for n, m in list(sys.modules.items())
               if n.startswith("meshplan."))
print(hashlib.sha256(answer.model_dump_json().encode()).hexdigest(), compiled)
"""


def copy_tree(into: Path) -> None:
    """The tree's folders a recommend reads, links kept as links (meshplan/cards_data -> ../cards in a worktree),
    without built files."""
    for name in COPIED:
        shutil.copytree(ROOT / name, into / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c", "out"))


def build(tree: Path, modules: tuple[str, ...]) -> None:
    """Cythonize `modules` of the copied tree and build each beside its source (an extension module is imported
    before the .py of the same name)."""
    sources = [str(tree / module) for module in modules]
    cythonize(sources, language_level=3, quiet=True,
              compiler_directives={"annotation_typing": False, "binding": True})
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include, suffix = sysconfig.get_paths()["include"], sysconfig.get_config_var("EXT_SUFFIX")

    def one(source: str) -> None:
        c_file = source[:-3] + ".c"
        subprocess.run([*compiler, "-shared", "-fPIC", "-O2", "-w", f"-I{include}", c_file, "-o",
                        source[:-3] + suffix], check=True)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(one, sources))


def warm_ask(tree: Path, index: int) -> tuple[int, str, int]:
    """Instructions of one warm ask of case `index` in `tree`, its answer's hash and how many meshplan modules ran
    compiled."""
    code = CHILD.format(bench=str(tree / "bench"), index=index, suffix=sysconfig.get_config_var("EXT_SUFFIX"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}
        done = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                               "--toggle-collect=_operator_call", f"--callgrind-out-file={out}", sys.executable,
                               "-c", code], cwd=tmp, env=env, check=True, capture_output=True, text=True)
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"callgrind wrote no total for {CASES[index][0]} in {tree}")
    digest, compiled = done.stdout.split()[-2:]
    return int(found.group(1)), digest, int(compiled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="DeepSeek-V3, 2,048", help="the cases whose name contains this")
    parser.add_argument("--modules", nargs="+", default=list(MODULES), help="the modules to compile (tree paths)")
    parser.add_argument("--keep", type=Path,
                        help="a folder not there yet: build the compiled tree in it and keep it (else a temporary one)")
    args = parser.parse_args()
    if cythonize is None:
        raise SystemExit("Cython is not installed: pip install cython (the bench's only use of it).")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: install it (apt-get install valgrind) to count instructions.")
    missing = [module for module in args.modules if not (ROOT / module).is_file()]
    if missing:
        raise SystemExit(f"not a module of this tree: {', '.join(missing)} (give paths such as {MODULES[0]}).")
    with tempfile.TemporaryDirectory() as tmp:
        pure, compiled = Path(tmp) / "pure", args.keep or Path(tmp) / "compiled"
        copy_tree(pure)
        copy_tree(compiled)
        build(compiled, tuple(args.modules))
        print(f"compiled with Cython: {len(args.modules)} modules")
        print("| case | pure Python | compiled | change | answers | compiled modules imported |")
        print("|---|---|---|---|---|---|")
        for index, (name, _, _) in enumerate(CASES):
            if args.only not in name:
                continue
            base, base_answer, _ = warm_ask(pure, index)
            fast, fast_answer, loaded = warm_ask(compiled, index)
            same = "identical" if fast_answer == base_answer else "DIFFER"
            print(f"| {name} | {base / 1e9:.3f} G | {fast / 1e9:.3f} G | {fast / base - 1:+.1%} | {same} | {loaded} of "
                  f"{len(args.modules)} |")


if __name__ == "__main__":
    main()
