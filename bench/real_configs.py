"""meshplan import over the frameworks' own example and config files: how many it reads into a model and layout,
how many it refuses with a clear message, how many end in a traceback, and which read suspiciously.

Data: the repository snapshots under /work/.mirror/<owner+name>/repo (bare git directories, read with `git show
HEAD:path`; the commit is printed). Every .sh/.yaml/.yml/.toml/.json file outside .github/ is a candidate; N of
each repository are drawn with the seed (random.Random(seed).sample over the sorted paths), so a run is repeatable
on the same snapshots. Every drawn file is written to a temporary folder under its own path first (a reader may
read a file's neighbours: the CI recipes a Megatron-LM functional test runs from, where they are drawn too), then
each is read as `meshplan import FILE` reads it (meshplan.api.import_file), then turned into a request as `check
--config FILE` does (meshplan.api.request_from_config, nothing given beside the file).

Classes:
  ok         read, and the request resolves: a model and a layout (the fields it prints)
  read       read, but the request is refused (no model, no GPU count: the refusal's first line)
  refused    import refused the file with a MeshplanError (its first line)
  traceback  any other exception (a defect: fix it)
  suspect    read as a framework that is not the repository's own (a JSON read as DeepSpeed in a verl repo):
             silently wrong until looked at
A file that is no configuration at all (a CI YAML, a pre-commit config) belongs in `refused`: the figure to
watch is traceback and suspect going to zero and ok growing.

Run: python bench/real_configs.py [--repos A,B] [--seed 0] [-n 60] [--verbose] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tree this bench is in, not an installed copy
from meshplan import api
from meshplan.core.errors import MeshplanError

MIRRORS = Path("/work/.mirror")
REPOS = {  # repository -> the frameworks its own files are for
    "NVIDIA+Megatron-LM": {"megatron-core", "deepspeed"},
    "NVIDIA-NeMo+Megatron-Bridge": {"megatron-bridge", "megatron-core"},
    "volcengine+verl": {"verl"},
    "NovaSky-AI+SkyRL": {"skyrl", "verl"},  # skyrl-agent/examples/run_verl/*.sh launch verl's main_ppo
    "KempnerInstitute+KempnerForge": {"kempnerforge"},
    "NVIDIA-NeMo+Automodel": {"nemo-automodel"},
}
SUFFIXES = (".sh", ".yaml", ".yml", ".toml", ".json")
TIMEOUT_S = 60


def _git(repo: str, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={MIRRORS / repo / 'repo'}", *args], capture_output=True,
                          check=True).stdout


def candidates(repo: str) -> list[str]:
    """Every config-looking file of the snapshot (sorted)."""
    names = _git(repo, "ls-tree", "-r", "--name-only", "HEAD").decode().splitlines()
    return sorted(n for n in names if n.endswith(SUFFIXES) and not n.startswith(".github/"))


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def classify(path: Path, own: set[str]) -> tuple[str, str]:
    """(class, what it said) for one file."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    try:
        imported = api.import_file(str(path))
        try:
            req = api.request_from_config(imported)
        except MeshplanError as exc:
            kind = "suspect" if imported.framework not in own else "read"
            return kind, f"[{imported.framework}] " + str(exc).splitlines()[0][:200]
        shown = {k: getattr(req, k) for k in ("model", "framework", "num_gpus", "tp", "pp", "ep")}
        model = str(shown["model"])
        shown["model"] = model[:60] + ("..." if len(model) > 60 else "")
        return ("suspect" if imported.framework not in own else "ok"), str(shown)
    except MeshplanError as exc:
        return "refused", str(exc).splitlines()[0][:200]
    except _Timeout:
        return "traceback", f"timed out after {TIMEOUT_S} s"
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return "traceback", f"{type(exc).__name__}: {exc} ({Path(frame.filename).name}:{frame.lineno})"[:250]
    finally:
        signal.alarm(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repos", default=",".join(REPOS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-n", type=int, default=60, help="files drawn per repository")
    parser.add_argument("--verbose", action="store_true", help="print every file's class and message")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts: collections.Counter = collections.Counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repo in args.repos.split(","):
            head = _git(repo, "rev-parse", "HEAD").decode().strip()
            files = candidates(repo)
            drawn = random.Random(args.seed).sample(files, min(args.n, len(files)))
            for name in sorted(drawn):  # every drawn file first: a file's reader may read its neighbours (the
                dst = Path(tmp) / repo / name  # CI recipe a Megatron-LM functional test runs from)
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(_git(repo, "show", f"HEAD:{name}"))
            for name in sorted(drawn):
                dst = Path(tmp) / repo / name
                kind, said = classify(dst, REPOS[repo])
                counts[kind] += 1
                rows.append({"repo": repo, "commit": head[:12], "file": name, "class": kind, "said": said})
    if args.json:
        print(json.dumps({"counts": dict(counts), "rows": rows}, indent=1))
        return 0
    for row in rows:
        if args.verbose or row["class"] in ("traceback", "suspect", "ok"):
            print(f"{row['class']:9s} {row['repo'][:16]:16s} {row['file']}  {row['said']}")
    by_repo = collections.Counter((r["repo"], r["class"]) for r in rows)
    for repo in args.repos.split(","):
        print(f"{repo}: " + ", ".join(f"{k} {by_repo[(repo, k)]}" for k in
                                      ("ok", "read", "refused", "traceback", "suspect")))
    print("total: " + ", ".join(f"{k} {counts[k]}" for k in ("ok", "read", "refused", "traceback", "suspect"))
          + f" of {sum(counts.values())} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
