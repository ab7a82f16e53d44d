"""The search's job memo (meshplan/search/job_memo.py): a second ask of a job reads what the first worked out and
gives the same answer, counts included; an ask at another budget after it gives what it gives fresh."""

import subprocess
import sys
from dataclasses import replace

from tree_under_test import tree_env

from meshplan.estimate.perf import stage_work
from meshplan.schema.request import Request
from meshplan.search.estimators import default_engine
from meshplan.search.job_memo import KEPT_JOBS, forget_jobs, job_memo
from meshplan.search.ranking import recommend
from meshplan.search.space import Fixed


def counting_engine(framework: str):
    """The default engine with its stage_work counted (one engine object for every ask, so its memo is found)."""
    calls = []

    def counted(job, plan):
        calls.append(plan)
        return stage_work(job, plan)

    return replace(default_engine(framework), stage_work=counted), calls


def test_a_second_ask_reads_the_memo_and_answers_the_same():
    forget_jobs()
    req = Request(model="mixtral-8x7b", num_gpus=32, gpu="h100")
    engine, calls = counting_engine("megatron-core")
    first = recommend(req, engine=engine)
    asked = len(calls)
    assert asked > 0  # its per-token references
    again = recommend(req, engine=engine)
    assert len(calls) == asked  # every reference read from the memo
    assert again.model_dump_json() == first.model_dump_json()  # the same rows, counts and evaluated
    assert again.evaluated == first.evaluated > 0


def test_another_budget_after_the_memo_answers_as_fresh():
    req = Request(model="mixtral-8x7b", num_gpus=32, gpu="h100")
    thin = req.model_copy(update={"headroom": 0.02})
    engine, _ = counting_engine("megatron-core")
    forget_jobs()
    fresh = recommend(thin, engine=engine).model_dump_json()
    forget_jobs()
    recommend(req, engine=engine)  # the memo filled at the default headroom's budget
    assert recommend(thin, engine=engine).model_dump_json() == fresh


def test_the_memo_is_kept_per_job_fixed_fields_and_estimators():
    forget_jobs()
    req = Request(model="llama-3.1-8b", num_gpus=16, gpu="h100")
    from meshplan.search import search_job

    job = search_job(req)[0]
    engine = default_engine(job.framework)
    memo = job_memo(job, Fixed(), engine)
    memo["mark"] = True
    assert job_memo(search_job(req)[0], Fixed(), default_engine(job.framework)) is memo  # the same values
    assert job_memo(job, Fixed({"tp": 2}), engine) is not memo  # other fixed fields
    assert job_memo(job, Fixed(), replace(engine, stage_work=lambda j, p: stage_work(j, p))) is not memo
    for world in (32, 64, 128, 256)[:KEPT_JOBS]:  # bounded: the oldest dropped
        job_memo(search_job(req.model_copy(update={"num_gpus": world}))[0], Fixed(), engine)
    assert "mark" not in job_memo(job, Fixed(), engine)
    forget_jobs()


def test_the_kept_memos_are_dropped_before_the_shutdown_collections():
    """At exit the memos go before the interpreter's collections pass over what modules still reach (job_memo.py's
    atexit): an exit handler registered before meshplan's runs after its own, and finds none kept."""
    code = """
import atexit, sys
atexit.register(lambda: print("kept at exit:", len(sys.modules["meshplan.search.job_memo"]._kept)))
from meshplan.schema.request import Request
from meshplan.search import search_job
from meshplan.search.estimators import default_engine
from meshplan.search.job_memo import job_memo
from meshplan.search.space import Fixed
job = search_job(Request(model="llama-3.1-8b", num_gpus=16, gpu="h100"))[0]
job_memo(job, Fixed(), default_engine(job.framework))["mark"] = True
print("kept:", len(sys.modules["meshplan.search.job_memo"]._kept))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=tree_env())
    assert out.stdout.split("\n")[:2] == ["kept: 1", "kept at exit: 0"]
