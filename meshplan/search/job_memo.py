"""What a search works out that is a pure function of its job, its fixed fields and its estimators, kept across
requests: a second ask of the same job (a user's repeated recommend, an MCP client asking again) reads the floors,
the DP and pipeline references, the grid plans, the space, the reference estimates and step terms and the exact
bounds the first one worked out, instead of working them out again (DeepSeek-V3 on 2,048 H100: a warm ask makes
59% fewer Python calls, bench/instruction_counts.py for its instructions).

Only values its key alone decides are kept, never the order a search met them in nor what it counted: each search
still counts its own estimates (Caches.memory, throughput, terms, token_time: what the answer reports as
`evaluated`) where it first asks them, and where a kept value stands for work that counts or notes (bounds.token_bound,
pipeline_bound and seed_keys: their rates' references, the layouts' last ranks), the search asks that work's counted
part again (a memo hit for a search that already has it), so the counts, the queue's order and every answer are a
fresh search's (tests/test_search_job_memo.py asks twice, and at another budget after, against fresh answers). What a
search accumulates as it goes (bounds.note_rank0's least first ranks, the seed groups and their DP bounds,
group_syncs, shard_rate's rates) stays its own; a memory floor's verdict at a budget is kept with the budget in its
key.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from dataclasses import fields
from typing import TypeVar

from meshplan.core.errors import MeshplanError
from meshplan.rules.engine import job_key
from meshplan.schema.plan import Job
from meshplan.search.estimators import Engine
from meshplan.search.space import Fixed

T = TypeVar("T")

KEPT_JOBS = 4
"""Jobs whose memos are kept at once (the most recently asked last): a recommend asks one job, a min-gpus scan one per
count, so a handful covers a user asking again; each memo holds up to some 10^5 figures on DeepSeek-V3 over 2,048
GPUs."""

# Engine fields the kept memos never read (the answer's check and summary, the ideal time's peak): left out of the key,
# so the default engine built again for each request (a new check object, a new peak closure) finds its job's memo
_UNREAD = frozenset({"check", "full_check", "summary", "peak_flops"})
_ENGINE_FIELDS = tuple(f.name for f in fields(Engine) if f.name not in _UNREAD)

_kept: dict[tuple, tuple[Job, Engine, dict]] = {}
_passed: dict[tuple, Job] = {}  # refuse_impossible's passes, per request_key (the job held: its ids stay its own)


def engine_key(engine: Engine) -> tuple:
    """The Engine's fields the memos read: its estimators by identity (module functions: the same in every request's
    default engine), its figures by value."""
    return tuple(id(v) if callable(v) else v for v in (getattr(engine, name) for name in _ENGINE_FIELDS))


def request_key(job: Job, fixed: Fixed) -> tuple | None:
    """What a job and its fixed fields decide: the job's values (rules.engine.job_key, its nested records by identity,
    and the global batch) and the fixed fields; None where a value cannot be hashed (nothing kept)."""
    key = (job_key(job), job.global_batch_size, tuple(fixed.values.items()), tuple(fixed.carried.items()),
           fixed.given)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def job_memo(job: Job, fixed: Fixed, engine: Engine) -> dict:
    """The memo of searches of this job, fixed fields and estimators (request_key and engine_key; empty the first
    time, KEPT_JOBS kept): a dict of named dicts (`memo_part`). The entry holds the job and engine, so the identities
    in its key stay theirs."""
    request = request_key(job, fixed)
    if request is None:
        return {}
    key = (request, engine_key(engine))
    hit = _kept.pop(key, None)
    if hit is None:
        hit = (job, engine, {})
        if len(_kept) >= KEPT_JOBS:
            _kept.pop(next(iter(_kept), None), None)
    _kept[key] = hit
    return hit[2]


def passed_before(job: Job, fixed: Fixed) -> bool:
    """Whether refusal.refuse_impossible already passed this job and these fixed fields (note_passed): its verdict
    reads nothing else (the rules and the space of the job's card and model, kept by identity in the key)."""
    key = request_key(job, fixed)
    return key is not None and key in _passed


def note_passed(job: Job, fixed: Fixed) -> None:
    """Keep that refuse_impossible passed this job and these fixed fields (KEPT_JOBS kept; the job held, as above)."""
    key = request_key(job, fixed)
    if key is None:
        return
    if key not in _passed and len(_passed) >= KEPT_JOBS:
        _passed.pop(next(iter(_passed), None), None)
    _passed[key] = job


def memo_part(memo: dict, name: str) -> dict:
    """The job memo's dict `name` (made on first use)."""
    part = memo.get(name)
    if part is None:
        part = memo[name] = {}
    return part


def kept_or_refused(memo: dict, name: str, key: object, work: Callable[[], T]) -> T:
    """`work()` once per key in the memo's part `name`, its refusal (a MeshplanError) kept and raised again like its
    value is returned: the one way a search keeps an estimate across requests (the search counts it itself)."""
    part = memo_part(memo, name)
    hit = part.get(key)
    if hit is None:
        try:
            hit = part[key] = work()
        except MeshplanError as refused:
            part[key] = refused
            raise
    if isinstance(hit, MeshplanError):
        raise hit.with_traceback(None)
    return hit


def forget_jobs() -> None:
    """Drop every kept memo and pass (tests that change a card in place, then search the same job again; the
    interpreter's exit, below)."""
    _kept.clear()
    _passed.clear()


# At exit the kept memos are dropped before the interpreter's shutdown collections: those run the cyclic collector
# over every object still reachable from a module (four full passes on CPython 3.11), and a memo holds some 10^4
# tracked objects per job (Llama-3.1-70B on 64 H100: 24k at its search's end). Freed here by reference counting, they
# cost a CLI call their freeing alone (bench/instruction_counts.py: the Llama first ask 1.003 -> 0.991 G).
atexit.register(forget_jobs)
