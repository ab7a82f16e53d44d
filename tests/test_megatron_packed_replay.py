"""bench/megatron_packed_replay.py: the single-stream trace of verl's Megatron actor update and its packing.

The trace keeps, per layer, what meshplan's activation arithmetic counts (so its replay speaks for meshplan's
allocated figure); the packing is verl's rearrange_micro_batches, ceil(tokens / budget) balanced micro-batches that
no rule caps at the budget; and on one stream a micro-batch larger than the one before it needs more than the same two
the other way round (the smaller one's requests split the larger blocks, which the allocator cannot hand back), so the
order verl runs them in (heaviest first) matters to the fit, not only the largest.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import megatron_packed_replay as bench
from allocator_replay import MIB

# two layers, wide enough that a micro-batch's tensors take segments of their own size (>= 10 MiB), as the row's do
TINY = bench.Shapes(hidden=2048, q=2048, kv=512, heads=16, kv_heads=4, experts=8, local=4, top_k=2, ffn=512,
                    vocab=8192, layers=2, ranks_reached=1.5)


def _needed(sizes: list[int]) -> tuple[int, int]:
    """(allocated peak, least capacity) of TINY's micro-batches of `sizes` tokens in that order."""
    tr = bench.Trace()
    for t in sizes:
        bench.micro_batch(tr, TINY, t)
    allocator = bench.replay(tr.events)
    return allocator.peak_allocated, bench.least_capacity(tr.events, allocator.peak_allocated,
                                                          allocator.peak_reserved, step=MIB // 2)


def test_trace_keeps_what_meshplan_counts():
    ours, meshplan = bench.check_sum()
    assert abs(ours - meshplan) / meshplan < 0.005


def test_packing_is_verls_uncapped_balanced_partitions():
    rng = random.Random(1)
    sizes = bench.packed(rng, 64, 10240, 8192, None)  # every response at the maximum, prompts below theirs
    total = sum(sizes)
    assert len(sizes) == math.ceil(total / 10240) < 64
    assert max(sizes) > 10240  # fewer micro-batches than sequences: some hold two, past the token budget
    weights = [n * n for n in sizes]
    assert sizes[0] == max(sizes) and weights[0] >= weights[-1]


def test_a_larger_later_micro_batch_needs_more():
    allocated_up, runs_on_up = _needed([3800, 4096])
    allocated_down, runs_on_down = _needed([4096, 3800])
    assert allocated_up == allocated_down
    assert runs_on_up > runs_on_down


def test_loss_path_keeps_what_meshplan_counts():
    """The trace's loss path holds, at its peak, the bytes per logit meshplan's verl Megatron loss keeps
    (arithmetic/memory_states.rl_loss_bytes, the card's engine.rl_loss.megatron), beside the final norm's gradient."""
    from meshplan.arithmetic.memory_states import rl_loss_bytes
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve

    job, plan = resolve(parse_request(bench.REQUEST))
    t = 1024
    tr = bench.Trace()
    bench.loss(tr, TINY, t)
    live, peak, sizes = 0, 0, {}
    for event in tr.events:
        if event[0] == "a":
            sizes[event[1]] = event[2]
            live += event[2]
            peak = max(peak, live)
        else:
            live -= sizes.pop(event[1])
    assert peak == rl_loss_bytes(job, plan)["logits_bytes_per_element"] * t * TINY.vocab
    assert live == bench.BF16 * t * TINY.hidden  # only the returned gradient is left
