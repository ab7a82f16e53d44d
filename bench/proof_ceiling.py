"""What a perfect cannot-beat-the-stop proof could save on one recommend_speed.py case: the ceiling of the two proofs
issue 23's DeepSeek-V3 target was asked of (lane speed47), measured by replaying the ranked search with what its first
ask learnt, so the ceiling is an oracle's, not a buildable bound's; and what two buildable levers save (lane speed48):
the count-only work a search does on layouts it never pops (lazy), and the job's budget-free caches kept from one ask
to the next (kept).

The case is asked once (recording), then again per mode, interleaved over `--rounds`, CPU seconds per ask:
  none   the search as it is;
  shard  a SHARD pop the first ask saw end over the stop (every ZeRO stage's key past it) pushes one RULES node at
         +inf for its stages instead (the counts drain gives are the same): no pipeline bound, reference or DP keys;
  group  a seed group the first ask opened whose nodes never reached SHARD is re-queued at +inf at its first pop:
         none of its seed keys, DP raise, dead checks or FLOOR pops (counts move: its members are never found dead);
  both   the two together;
  lazy   no layout's death (is_dead, group_dead) is asked when its group opens, only at its first FLOOR pop, which
         then rejects it with the seeds it held under the memory rule: a real proof, not an oracle's; the dead
         layouts never popped are counted SEARCH-SLOWER, not MEM001, and a group none of whose layouts fits is raised
         and pushed like any other (what the group-level death check saves on a job that barely fits: Kimi-K2);
  kept   the ranked search shares (and the probe through it) the budget-free caches (estimates, floors, bounds,
         seeds: plans.Caches and the bounds' memos, engine.shared_search) of the recording ask's ranked search: a
         memo kept across requests, which recommend does not keep (one request is one set of cards: shared_layers);
         `evaluated` counts the estimates computed, so it moves.
Each mode's answer is compared with the search's: the fields that moved are named (byte-identical answers are what a
speed change must keep: bench/answer_snapshot.py).

    python bench/proof_ceiling.py [--only NAME] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recommend_speed import CASES, WARM_UP

from meshplan import api
from meshplan.search import engine, ranking
from meshplan.search.levels import GROUP, RULES
from meshplan.search.seed_groups import SeedGroup

MODES = ("none", "shard", "group", "both", "lazy", "kept")


class Oracle:
    """The ranked search's SHARD pops and group openings, recorded on one ask and skipped on the next by mode. Only the
    ranked search is touched (the one that records for the thinner-headroom probe: `below` set)."""

    def __init__(self) -> None:
        self.mode = "record"
        self.over: set[tuple] = set()  # (layout, micro-batch, floor) of SHARD pops ending over the stop
        self.shard_keys: list[tuple[tuple, float, engine.BestFirstSearch]] = []
        self.opened: set[int] = set()  # group.first of the groups the ranked search opened
        self.reached: set[int] = set()  # ... of those with a node popped at SHARD
        self.skip_groups: set[int] = set()
        self._shard = engine.BestFirstSearch.refine_shard
        self._open = engine.BestFirstSearch.open_group
        self._firsts: dict[tuple, int] = {}  # a group's degrees -> its first node's index (groups are per degrees)
        self.opening = False  # (lazy) inside open_group: no death asked
        self.searches: dict[tuple, engine.BestFirstSearch] = {}  # (kept) the recording ask's, per job and budget

    def install(self) -> None:
        oracle = self

        def refine_shard(search: engine.BestFirstSearch, key: float, lay, mbs: int, floor: int) -> None:
            if search.below is not None and oracle.mode in ("shard", "both") and (lay, mbs, floor) in oracle.over:
                search.push(math.inf, RULES, (lay, mbs, floor, search.zeros))
                return
            oracle._shard(search, key, lay, mbs, floor)
            if oracle.mode == "record" and search.below is not None:
                pipe = search.pipeline_bound(lay, mbs, search.recomputes[floor], interleave=True)
                least = min(max(key, k) for k in search.grid_stage_keys(lay, mbs, pipe))
                oracle.shard_keys.append(((lay, mbs, floor), least, search))
                first = oracle._firsts.get((lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp))
                if first is not None:
                    oracle.reached.add(first)

        def open_group(search: engine.BestFirstSearch, key: float, group, base: int, ideal: float,
                       pending: list | None = None, live: bool = False) -> None:
            if search.below is not None and type(group) is SeedGroup and pending is None:
                lay = group.members[0][0]
                if oracle.mode == "record":
                    oracle.opened.add(group.first)
                    oracle._firsts[(lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp)] = group.first
                elif oracle.mode in ("group", "both") and group.first in oracle.skip_groups:
                    search.heap.append((math.inf, GROUP, base + group.first + 1, (group, base, ideal)))
                    return  # (+inf is the heap's largest key: appended, the heap stays one)
            oracle._open(search, key, group, base, ideal, pending, live)

        is_dead, group_dead, refine_bound = (engine.BestFirstSearch.is_dead, engine.BestFirstSearch.group_dead,
                                             engine.BestFirstSearch.refine_bound)

        def lazy_open(search: engine.BestFirstSearch, *args) -> None:
            oracle.opening = oracle.mode == "lazy"
            try:
                open_group(search, *args)
            finally:
                oracle.opening = False

        def lazy_is_dead(search: engine.BestFirstSearch, lay) -> bool:
            return False if oracle.opening else is_dead(search, lay)

        def lazy_group_dead(search: engine.BestFirstSearch, lays: list) -> list[bool]:
            return [False] * len(lays) if oracle.opening else group_dead(search, lays)

        def lazy_refine_bound(search: engine.BestFirstSearch, key: float, lay, mbs: int, held: tuple = (),
                              floor: int = -1) -> None:
            if oracle.mode == "lazy" and search.is_dead(lay):  # every seed of it rejected here, as release would
                if search.below is not None:
                    search.below.nodes += [(key, lay, mbs), *((seed_key, lay, size) for seed_key, _, size in held)]
                search.beyond_cutoff -= search.variants() * len(held)
                search.rejected[search.engine.memory_rule] += search.variants() * (1 + len(held))
                return
            refine_bound(search, key, lay, mbs, held, floor)

        def kept_search(job, fixed, engine_, top_k, warnings, budget_bytes=0, share=None, **kw):
            key = (job.framework, job.num_gpus, id(job.model), budget_bytes, kw.get("recorded", False))
            if oracle.mode == "kept" and share is None:
                share = oracle.searches.get(key)
            search, considered = run_search(job, fixed, engine_, top_k, warnings, budget_bytes, share, **kw)
            if oracle.mode == "record":
                oracle.searches[key] = search
            return search, considered

        run_search = engine.run_search
        engine.BestFirstSearch.refine_shard = refine_shard  # type: ignore[method-assign]
        engine.BestFirstSearch.open_group = lazy_open  # type: ignore[method-assign]
        engine.BestFirstSearch.is_dead = lazy_is_dead  # type: ignore[method-assign]
        engine.BestFirstSearch.group_dead = lazy_group_dead  # type: ignore[method-assign]
        engine.BestFirstSearch.refine_bound = lazy_refine_bound  # type: ignore[method-assign]
        ranking.run_search = kept_search  # type: ignore[assignment]

    def settle(self) -> None:
        """After the recording ask: the SHARD pops over the final stop (the ranked search's wants() at its end) and
        the opened groups none of whose nodes reached SHARD."""
        self.over = {node for node, least, search in self.shard_keys if not search.wants(least)}
        self.skip_groups = self.opened - self.reached
        self.shard_keys.clear()


def moved(before: dict, after: dict, path: str = "") -> list[str]:
    """The answer's fields that differ, as paths with both values (long texts cut)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [line for k in sorted(set(before) | set(after))
                for line in moved(before.get(k), after.get(k), f"{path}/{k}")]  # type: ignore[arg-type]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [line for i, (x, y) in enumerate(zip(before, after, strict=True))
                for line in moved(x, y, f"{path}[{i}]")]
    return [] if before == after else [f"{path}: {str(before)[:80]} -> {str(after)[:80]}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="DeepSeek-V3, 2,048", help="the recommend_speed.py case (name contains)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved asks per mode")
    args = parser.parse_args()
    picked = [call for name, call, _ in CASES if args.only in name and name.startswith("recommend")]
    if not picked:
        raise SystemExit(f"no recommend case of recommend_speed.py matches {args.only!r}")
    call = picked[0]
    api.recommend(WARM_UP)
    oracle = Oracle()
    oracle.install()
    base = json.loads(call().model_dump_json())
    oracle.settle()
    print(f"recorded: {len(oracle.over)} SHARD pops over the stop; {len(oracle.skip_groups)} of "
          f"{len(oracle.opened)} opened groups never reach SHARD")
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    answers: dict[str, dict] = {}
    for _ in range(args.rounds):
        for mode in MODES:
            oracle.mode = mode
            start = time.process_time()
            answers[mode] = json.loads(call().model_dump_json())
            seconds[mode].append(time.process_time() - start)
    plain = statistics.median(seconds["none"])
    for mode in MODES:
        median = statistics.median(seconds[mode])
        print(f"{mode:5s} CPU median {median:.3f} s ({median / plain - 1.0:+.1%}), min {min(seconds[mode]):.3f} s")
        for line in moved(base, answers[mode]):
            if not line.startswith("/rationale"):
                print(f"      moved {line}")


if __name__ == "__main__":
    main()
