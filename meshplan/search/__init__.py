"""recommend: search every layout the framework can express, drop what breaks a rule or does not fit, rank by time.

The space (meshplan/search/space.py) is every (tp, pp, vpp, cp, ep, etp, dp) over divisors of the GPU count,
times the ZeRO/FSDP stage, the recompute mode and the micro-batch size. It is searched best-first
(A*) with the real estimators, so the answer is the exact top K of the cost model without timing most
layouts. Each (layout, micro-batch) enters the queue with an optimistic step time and is refined a step
at a time, each step pushing it back with a tighter key at a later level (engine.Level, in this order):

0. GROUP: seeded: the layouts of one degrees tuple as one node, keyed by a lower bound of all their seed keys;
   popped, it pushes its (layout, micro-batch) nodes at FLOOR (most groups of a large job never pop);
1. FLOOR: seeded with the time per token of single-stage reference plans (it only falls as a rank sees more
   tokens), times the tokens each stage handles, stretched by the pipeline bubble (p-1)/(m*v); the memory floor
   of the first stage (model states plus in-flight activations) says which recompute is needed at least: if
   even full recompute is over capacity the node is dropped unestimated;
2. SHARD: the exact bound of this pipeline shard, with the traffic interleaving multiplies, and per ZeRO stage its
   sharding traffic and the once-per-step DP term after it: one node per distinct key, with its stages;
3. RULES: the structural rules (check_config without memory) and the model-state bound per ZeRO stage of the node
   (a node the queue never reaches is counted slower, its rules never asked);
4. NEED: estimated memory: the least recompute that fits at any ZeRO stage (if nothing fits, nothing
   fits at any larger micro-batch either);
5. STAIRCASE: the (stage, recompute) pairs that fit - heavier recompute of a fitting pair is dominated, since
   it only adds time;
6. STEP: the step's floor, every term of the estimate but its pipeline's replay (m x the slowest stage instead);
7. TIME: the predicted step time (the pipeline replayed);
8. RANK: a plan reaching the top of the queue is ranked: nothing left can be faster.

Everything dropped is counted under the rule id that dropped it (or a SEARCH-* bucket), so
considered = ranked + rejected.

The parts, each one job (each imports only the parts above it):
    space.py       the layouts each framework law allows, and their cheap memory bounds
    policy.py      the headroom policy, the cards/search.yaml limits, "X% slower", the SEARCH-* buckets
    estimators.py  the estimators the search calls (Engine, injectable) and the cost model's best step time
    seed_groups.py the seeds per degrees tuple and the lower bound of their keys that seeds the queue
    plans.py       the plans a search compares (SearchPlans): knobs per plan, estimates cached per job, the fit
    bounds.py      the optimistic step times that order the queue (StepTimeBounds)
    engine.py      the best-first search (BestFirstSearch): its queue levels, its loop, run_search
    job.py         the job the search compares layouts on (one global batch: request.default_global_batch)
    answer.py      the answer's wording: rationales, rows, folded equivalents, assumptions
    strategies.py  what the decision tables suggest for a job (suggest)
    decision.py    the pick against the decision tables, in numbers
    count_free.py  the least per-GPU memory any layout needs at any GPU count, and the proof where it is over
    gpu_count.py   the scan for the smallest GPU count (scan_minimum)
    impossible.py  the thinner-headroom probe and the nothing-fits answer
    ranking.py     recommend: the parts above (bounded by counts of work, never by a clock)
    min_gpus.py    minimum_gpus: the scan's count, settled by recommend there (RL jobs by the RL recommend)
    oracle.py      the exhaustive oracle the tests hold the search to
    rl.py          recommend_rl: an RL job's rollout choices over the search's best actor layouts
"""

from meshplan.search.answer import FOLDED_KNOBS
from meshplan.search.engine import BestFirstSearch, Level
from meshplan.search.estimators import Engine, default_engine
from meshplan.search.job import search_job
from meshplan.search.min_gpus import minimum_gpus
from meshplan.search.oracle import exhaustive_top_k
from meshplan.search.policy import (
    SEARCH_BUCKETS,
    headroom_for,
    headroom_that_ranks,
    memory_budget,
    min_headroom_fraction,
    slower_by,
)
from meshplan.search.ranking import recommend

__all__ = ["FOLDED_KNOBS", "SEARCH_BUCKETS", "BestFirstSearch", "Engine", "Level", "default_engine",
           "exhaustive_top_k", "headroom_for", "headroom_that_ranks", "memory_budget", "min_headroom_fraction",
           "minimum_gpus", "recommend", "search_job", "slower_by"]
