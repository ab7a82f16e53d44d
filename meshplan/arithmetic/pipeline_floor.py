"""A lower bound of a replayed pipeline step (pipeline_timeline.simulate) from its ranks' chunk times alone, with no
replay: what lets the search skip the replay of a plan that cannot be fast enough (estimate/perf.StepTerms.floor).

Why it holds, on the replay's own arithmetic (pipeline_timeline._ends): every op ends at max(its rank's previous
end, its input's end + its hop) + its seconds (a fused pair: both ops' seconds), so an op ends at least its seconds
after its rank's previous op and at least hop + its seconds after its input.
- Rank r's first op is a forward of its lowest stage r (any other op of the rank waits, through the rank's own
  stages, for one of those), and that forward waits for the same micro-batch's forwards of stages 0..r-1, each on its
  own rank one hop apart (the looped and the V placements alike put stage u < p on rank u): it starts at least
  A_r = sum_{u<r} (fwd[u] + hop) in.
- The rank then runs its m v forwards and m v backwards one at a time (a split backward's I and W add up to bwd[r]),
  so its last op ends at least A_r + m v (fwd[r] + bwd[r]) in.
- In the orders that do not split the backward (GPipe, 1F1B, interleaved and combined 1F1B) that last op is the
  backward of stage r (chunk 0: the last entry of a rank's table is its last chunk, whose backward is chunk 0) of the
  order's last micro-batch, whose input gradient stages r-1..0 then pass down, each on its own rank one hop later:
  D_r = sum_{u<r} (bwd[u] + hop) more (a fused pair there takes at least its backward's seconds). The split and the
  V orders end on other ops: D_r = 0 there.
So the replay is at least max_r (A_r + m v (fwd[r] + bwd[r]) + D_r), at any stage times and hop; with balanced
stages that is m x the stage plus the classic (p - 1)/v bubble, where m x the slowest stage alone has none.

Only where simulate replays all m micro-batches (pipeline_timeline.replays_whole). Past EXACT_MICROBATCHES and
two periods it replays base and base - P micro-batches and extends by k (near - before): the bound holds for `near`,
but near - before is at least P x the slowest stage only empirically (the steady state). Two provable lower bounds of
it were tried (each op of the shorter replay aligned with the longer's P micro-batches later, which gains what the
longer takes to reach stage 0's forward of micro-batch P; aligned with the same op, which gains rank 0's ops after
the shorter's last): 64-96% of P x the slowest stage on Llama-3.1-70B's shapes, and k (15-23) times the shortfall is
far over the bubble, so extended shapes keep the caller's floor (m x the slowest stage).

The sums reorder the replay's own non-negative terms: FLOOR_MARGIN (relative) covers their rounding.
tests/test_pipeline_floor.py replays random heterogeneous shapes of every order against it."""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.arithmetic.pipeline_timeline import SPLIT_ORDERS, V_ORDERS, Shape

# Relative: what the bound gives up for rounding (a replay adds up to ~10^5 terms; the bound ~10 per rank).
FLOOR_MARGIN = 1e-9

# The orders whose ops are neither split nor fused: chain_floor's cuts.
_CUT_ORDERS = frozenset({"gpipe", "1f1b", "interleaved_1f1b"})


def chain_floor(shape: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float,
                last: tuple[float, float] | None = None) -> float:
    """At most simulate(shape, fwd, bwd, hop, any wgrad, last).seconds where replays_whole(shape): the module's chain
    through each rank, max_r (A_r + busy_r + D_r), and in the unfused plain orders its cuts at the rank's first
    backward and last forward, less FLOOR_MARGIN.

    The cuts (GPipe, 1F1B, interleaved 1F1B: ops neither split nor fused, each rank's order from its warm-up count w):
    the rank's first backward x1 (chunk v - 1 of micro-batch 0, stage s = (v - 1)p + r; after min(w + 1, n) of its
    n = m v forwards) waits for micro-batch 0's forwards through every stage and the backwards of the stages after s,
    one hop between stages: E_r. Its last forward y1 (chunk v - 1 of the last micro-batch, stage s) is followed by
    that micro-batch's forwards and backwards of the stages after s (2 (p - 1 - r) hops), then the rank's backward of
    it and the backwards after that one (the last group's (v - 1) g + 1), or at least the min(w + 1, n) backwards
    the rank runs after y1; then D_r. The step is at least start(x) + the rank's ops from x to y + what follows y,
    for x its first op or x1 and y its last op or y1, x not after y.

    `last`: simulate's (forward, backward) seconds of the last virtual stage's chunk, at least its rank's own fwd / bwd
    (the output layer's chunk). The terms take its excess where they count that stage's ops: the rank's chain its m
    forwards and backwards; in the cuts micro-batch 0's forward through every stage and the backward of the stages after
    s (the ranks before it), the last micro-batch's (the same), x1 onwards all m of its backwards and at least m - (the
    forwards up to x1) of its forwards, up to y1 all m of its forwards. Every other term keeps the rank's own seconds,
    which the excess only lengthens."""
    order = shape.order
    tails = order not in SPLIT_ORDERS and order not in V_ORDERS
    p, m, v = shape.pp, shape.microbatches, shape.vpp
    n = m * v
    cuts = order in _CUT_ORDERS
    owner = shape.rank_of(shape.stages - 1)
    extra_f, extra_b = (last[0] - fwd[owner], last[1] - bwd[owner]) if last is not None else (0.0, 0.0)
    if cuts:
        later_f, later_b = sum(fwd), sum(bwd)  # of the ranks after r (r's own taken off at its turn)
        fill = v * later_f + extra_f + (p * v - 1) * hop  # micro-batch 0's forwards through every stage
        g = shape.group if order == "interleaved_1f1b" else 1
        own = (m - g * ((m - 1) // g)) * (v - 1) + 1  # the rank's backwards from y1's own to its last
        lead = (v - 1) * g  # interleaved warm-up: 2 (p - r - 1) + (v - 1) g
    best = before = after = 0.0
    for r, (f, b) in enumerate(zip(fwd, bwd, strict=True)):
        mine = r == owner
        chain = before + n * (f + b) + after + (m * (extra_f + extra_b) if mine else 0.0)
        if cuts:
            later_f -= f
            later_b -= b
            rest = p - 1 - r
            w = n if order == "gpipe" else min(rest, m) if order == "1f1b" else min(2 * rest + lead, n)
            ahead = w + 1 if w < n else n  # forwards up to x1; backwards after y1
            later = r < owner  # the last stage is among the stages after s
            first_b = fill + later_b + (extra_b if later else 0.0) + rest * hop  # E_r
            drain = later_f + later_b + (extra_f + extra_b if later else 0.0) + 2 * rest * hop + own * b
            if ahead * b > drain:
                drain = ahead * b
            drain += after
            x1_on = m * extra_b + max(0, m - ahead) * extra_f if mine else 0.0  # its ops from x1 on
            cut = first_b + (n - ahead) * f + n * b + after + x1_on  # (x1, last op)
            to_y1 = m * extra_f if mine else 0.0  # its forwards up to y1
            if before + n * f + (n - ahead) * b + drain + to_y1 > cut:  # (first op, y1)
                cut = before + n * f + (n - ahead) * b + drain + to_y1
            if 2 * w + 3 <= 2 * n and first_b + (n - w - 1) * (f + b) + drain > cut:  # (x1, y1): x1 before y1
                cut = first_b + (n - w - 1) * (f + b) + drain
            if cut > chain:
                chain = cut
        if chain > best:
            best = chain
        before += f + hop
        if tails:
            after += b + hop
    return best * (1.0 - FLOOR_MARGIN)
