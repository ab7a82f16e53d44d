"""Python's cyclic collector around recommend searches in the MCP server, whose start-up objects are frozen.

    python bench/mcp_collector.py [--variant as-is|refreeze|reclaim] [--calls 32] [--jobs 4]

The server freezes what its start-up built (faces/mcp start_up), so search/ranking._promote_survivors skips the
freeze-and-unfreeze that moves a search's survivors to the oldest generation elsewhere (an unfreeze would give the
start-up's objects back to the collector). This measures, in one process built as `meshplan serve` builds it and
asked through the SDK's in-memory client, what the collector costs over `--calls` recommend_parallelism calls cycling
over `--jobs` distinct requests, and what two ways of promoting inside the server would change:
  as-is     the package as it is (the promotion skipped while objects are frozen);
  refreeze  gc.freeze() after each search: the survivors join the permanent generation, and so does everything else
            alive at that moment, the in-flight request's own objects among them;
  reclaim   refreeze, and a full unfreeze + collect + freeze whenever the permanent generation has grown by a quarter
            since the last one (CPython's own rule for a full collection: Modules/gcmodule.c, long_lived_pending >
            long_lived_total / 4), so what died in a cycle while frozen is freed.
Printed: the collector's pauses (timed by gc.callbacks, explicit collections included) and how many of each
generation, the calls' wall time (noisy on a shared machine: read the pauses), the permanent generation's growth, and
the cyclic garbage left frozen (what an unfreeze and a full collection free at the end after a full collection of the
rest: a re-freeze's leak). Figures: bench/HISTORY.md.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import anyio

MODELS = ("llama-3.1-70b", "qwen3-32b", "llama-3.1-8b", "mixtral-8x7b")
COUNTS = (32, 64, 128, 256)


def refreeze() -> None:
    """Freeze after the search, also where the process keeps objects frozen."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
    else:
        gc.freeze()


class Reclaim:
    """refreeze, with a full collection of the frozen objects each time the permanent generation grows by a quarter."""

    def __init__(self) -> None:
        self.base = 0
        self.reclaims = 0

    def __call__(self) -> None:
        frozen = gc.get_freeze_count()
        if frozen == 0:
            gc.freeze()
            gc.unfreeze()
            return
        self.base = self.base or frozen
        gc.freeze()
        if gc.get_freeze_count() - self.base > self.base // 4:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.base = gc.get_freeze_count()
            self.reclaims += 1


async def run(calls: int, jobs: int) -> dict[str, float]:
    from mcp import Client

    from meshplan.faces.mcp.server import app

    requests = [{"model": m, "gpu": "h100", "num_gpus": n} for m in MODELS for n in COUNTS][:jobs]
    pauses = {"s": 0.0, "start": 0.0, "n": [0, 0, 0]}

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            pauses["start"] = time.perf_counter()
        else:
            pauses["s"] += time.perf_counter() - pauses["start"]
            pauses["n"][info["generation"]] += 1

    async with Client(app) as client:
        warm = await client.call_tool("recommend_parallelism", {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8})
        assert not warm.is_error, warm.content
        frozen = gc.get_freeze_count()
        gc.callbacks.append(timed)
        start = time.perf_counter()
        for i in range(calls):
            answer = await client.call_tool("recommend_parallelism", requests[i % len(requests)])
            assert not answer.is_error, answer.content
        wall = time.perf_counter() - start
        gc.callbacks.remove(timed)
        grown = gc.get_freeze_count() - frozen
    gc.collect()
    gc.unfreeze()
    leaked = gc.collect()
    return {"wall_s": wall, "pause_ms": 1e3 * pauses["s"], "collections": pauses["n"], "frozen_growth": grown,
            "frozen_cyclic_garbage": leaked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("as-is", "refreeze", "reclaim"), default="as-is")
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=4, help=f"distinct requests cycled over (at most "
                                                            f"{len(MODELS) * len(COUNTS)})")
    args = parser.parse_args()
    from meshplan.faces.mcp import start_up
    from meshplan.search import ranking

    with start_up():  # as `meshplan serve` builds the server: its start-up frozen
        import meshplan.faces.mcp.server  # noqa: F401
    promote: Callable[[], None] | None = {"refreeze": refreeze, "reclaim": Reclaim()}.get(args.variant)
    if promote is not None:
        ranking._promote_survivors = promote
    out = anyio.run(run, args.calls, args.jobs)
    extra = f", {promote.reclaims} reclaims" if isinstance(promote, Reclaim) else ""
    print(f"{args.variant}: {args.calls} calls over {args.jobs} jobs: collector pauses {out['pause_ms']:.0f} ms in "
          f"{out['collections']} collections (gen 0/1/2){extra}; wall {out['wall_s']:.1f} s; permanent generation "
          f"+{out['frozen_growth']:,} objects, of which cyclic garbage at the end {out['frozen_cyclic_garbage']:,}")


if __name__ == "__main__":
    main()
