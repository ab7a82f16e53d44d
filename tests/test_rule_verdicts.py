"""The structural rules' kept verdicts (rules/engine.py Verdicts, issue 23): each rule declares the plan fields it
reads (`@rule(reads=...)`), and a job's verdicts are kept per their values. The findings must be exactly the plain
run's, on every plan: the same ids, order, messages and fixes, the same first blocking rule. Jobs come from the search
oracle's sampler (every framework, dense, MoE and MLA models), plus RL, LoRA and fp8 jobs; plans are fuzzed over every
field, so rules fire, pass and raise."""

import functools
import random
import typing

import pytest
from test_search_oracle import sampled_request

from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.core.once import once
from meshplan.knowledge.cards import CardError
from meshplan.request.resolve import resolve
from meshplan.rules import engine
from meshplan.rules.engine import (
    Context,
    Verdicts,
    backend_of,
    first_blocking,
    keyed_reads,
    load_rules,
    rule_specs,
    structural_findings,
    verdicts,
)
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request

FIELDS = tuple(Plan.model_fields)
DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch_size", "dp_replicate")
EXTRA_JOBS = [
    dict(model="kimi-k2", num_gpus=256, gpu="h100"),
    dict(model="deepseek-v3", num_gpus=2048, gpu="h100"),
    dict(model="llama-3.1-70b", num_gpus=64, gpu="h100", precision="fp8"),
    dict(model="qwen3-30b-a3b", num_gpus=16, gpu="h100", framework="verl", job="rl"),
    dict(model="qwen3-8b", num_gpus=8, gpu="h100", framework="skyrl", job="rl"),
    dict(model="llama-3.1-8b", num_gpus=8, gpu="h100", job="lora"),
    dict(model="qwen3-30b-a3b", num_gpus=16, gpu="h100", framework="nemo-automodel"),
    dict(model="deepseek-v2-lite", num_gpus=16, gpu="h100", framework="megatron-bridge"),
]


def _choices(name: str) -> list:
    """Values a plan field takes in the fuzz: its Literal choices, None, both booleans, a few sizes and strings."""
    annotation = Plan.model_fields[name].annotation
    out: list = []
    if typing.get_origin(annotation) is tuple:  # cuda_graph_modules
        return [(), ("attn",), ("moe_router", "moe_preprocess"), ("moe",), ("mlp",)]
    args = (annotation,) if typing.get_origin(annotation) is typing.Literal else typing.get_args(annotation)
    for arg in args or (annotation,):
        if typing.get_origin(arg) is typing.Literal:
            out += list(typing.get_args(arg))
        elif arg is type(None):
            out.append(None)
        elif arg is bool:
            out += [True, False]
        elif arg is int:
            out += [0, 1, 2, 3, 4, 8, 16]
        elif arg is float:
            out += [0.0, 0.5, 1.0]
        elif arg is str:
            out += ["op", "2", "Et|tt|tL", "E|t*4|L"]
        elif typing.get_origin(arg) is list:
            out += [["core_attn"], ["moe", "mlp"], ["shared_experts", "mla_up_proj"]]
    return [value for value in out if _valid(name, value)]


def _valid(name: str, value) -> bool:
    try:
        Plan(**{name: value})
    except ValueError:
        return False
    return True


CHOICES = {name: _choices(name) for name in FIELDS}
assert all(CHOICES.values())


def _plan(rng: random.Random, base: Plan, fields: typing.Iterable[str]) -> Plan | None:
    values = dict(base.__dict__)
    for name in fields:
        values[name] = rng.choice(CHOICES[name])
    try:
        return Plan(**values)
    except ValueError:  # a value the schema refuses: not a plan
        return None


def fuzzed_plans(rng: random.Random, base: Plan, count: int) -> list[Plan]:
    """Plans near `base`: a few fields changed, the degrees more often (most plans the search asks differ there)."""
    out = []
    while len(out) < count:
        fields = rng.sample(FIELDS, rng.randint(0, 5)) + [d for d in DEGREES if rng.random() < 0.3]
        plan = _plan(rng, base, fields)
        if plan is not None:
            out.append(plan)
    return out


def sampled_jobs():
    reqs = [sampled_request(seed)[0] for seed in range(40)] + [Request(**fields) for fields in EXTRA_JOBS]
    out = []
    for req in reqs:
        try:
            out.append(resolve(req))
        except MeshplanError:
            continue
    return out


JOBS = sampled_jobs()


def _outcome(fn, *args):
    """What a call gives: its value dumped, or the exception's type and words."""
    try:
        value = fn(*args)
    except Exception as exc:  # the kept verdicts must raise as the plain run does
        return ("raised", type(exc).__name__, str(exc))
    if isinstance(value, list):
        return [f.model_dump() for f in value]
    return value.model_dump() if hasattr(value, "model_dump") else value


def test_kept_verdicts_give_the_plain_runs_findings_and_first_blocking_rule():
    """Over many plans of each job, and of copies of it at other global batch sizes (which share its Verdicts)."""
    rng = random.Random(23)
    compared = fired = 0
    for first, base in JOBS:
        kept = Verdicts(first)
        for plan in fuzzed_plans(rng, base, 60):
            job = first if rng.random() < 0.7 else first.model_copy(
                update={"global_batch_size": rng.choice((1, 7, 64, 1024, first.global_batch_size * 2))})
            plain = _outcome(structural_findings, job, plan)
            assert _outcome(kept.findings, job, plan) == plain, (job.model.name, job.framework, plan)
            assert _outcome(kept.first_error, job, plan) == _outcome(first_blocking, job, plan), (job.model.name, plan)
            if isinstance(plain, list):  # check_config's structural report holds the same findings
                report = check_config(job, plan, include_memory=False)
                assert [f.model_dump() for f in report.findings] == plain
                fired += bool(plain)
            compared += 1
    assert compared > 2000 and fired > 500  # the fuzz stays meaningful: many plans, many of them break rules


def test_a_rules_verdict_depends_only_on_the_fields_it_reads():
    """The memo's premise, rule by rule: a twin plan with every field the rule does not read drawn anew gets the
    same verdict (the same finding, or None, or the same exception)."""
    rng = random.Random(7)
    specs = rule_specs()
    structural = [(rid, cond) for rid, cond in load_rules().items() if not specs[rid].memory]
    assert all(keyed_reads(cond) is not None for _, cond in structural)
    twins = 0
    for job, base in JOBS[::2]:
        for plan in fuzzed_plans(rng, base, 25):
            for rid, cond in structural:
                others = [f for f in FIELDS if f not in keyed_reads(cond)]
                twin = _plan(rng, plan, others)
                if twin is None:
                    continue
                twins += 1
                twin_job = job if "global_batch_size" in keyed_reads(cond) else job.model_copy(
                    update={"global_batch_size": rng.choice((1, 3, 64, 4096))})
                assert _outcome(_values, cond, job, plan) == _outcome(_values, cond, twin_job, twin), (rid, plan, twin)
    assert twins > 0.8 * len(structural) * 25 * len(JOBS[::2])  # most twins are plans the schema takes


def _values(cond, job, plan):
    values = cond(Context(job, plan))
    return None if values is None else {k: str(v) for k, v in values.items()}


class _Recording(Plan):
    """A plan that notes each field read (through Context, and whatever a condition calls)."""

    def __getattribute__(self, name):
        if name in FIELDS:
            READ.add(name)
        return super().__getattribute__(name)


class _RecordingJob(Job):
    """A job that notes each read of a field a rule may declare (engine.JOB_READS)."""

    def __getattribute__(self, name):
        if name in engine.JOB_READS:
            READ.add(name)
        return super().__getattribute__(name)


READ: set[str] = set()
# AD001 asks knowledge/adapter_knobs.missing_layout_knob, which keeps its own answer per the fields AD001 declares and
# reads the plan's other knobs only to build it: the twin test above holds it to its declaration.
OWN_MEMO = {"AD001"}


def test_each_rule_reads_no_field_beyond_its_declared_ones():
    rng = random.Random(11)
    specs = rule_specs()
    for job, base in JOBS[1::3]:
        for plan in fuzzed_plans(rng, base, 25):
            recording = _Recording.model_construct(**plan.__dict__)
            recording_job = _RecordingJob.model_construct(**job.__dict__).attach_cards(job.card)
            for rid, cond in load_rules().items():
                if specs[rid].memory or rid in OWN_MEMO:
                    continue
                READ.clear()
                try:
                    cond(Context(recording_job, recording))
                except Exception:  # what it read before raising still counts
                    pass
                assert READ <= set(keyed_reads(cond)), (rid, sorted(READ - set(keyed_reads(cond))))


def test_a_condition_that_raises_runs_the_plain_loop(monkeypatch):
    job, plan = JOBS[0]
    kept = Verdicts(job)

    def broken(rules, ctx):
        raise RuntimeError("a condition raised")

    monkeypatch.setattr(engine, "_fire", broken)
    assert kept.findings(job, plan) == structural_findings(job, plan)
    assert kept.first_error(job, plan) == first_blocking(job, plan)


def test_a_copy_of_the_job_or_another_batch_finds_its_verdicts_and_another_gpu_count_does_not():
    job, _ = JOBS[0]
    assert verdicts(job.model_copy()) is verdicts(job)
    assert verdicts(job.model_copy(update={"global_batch_size": job.global_batch_size * 2})) is verdicts(job)
    assert verdicts(job.model_copy(update={"num_gpus": job.num_gpus * 2})) is not verdicts(job)


def test_a_rule_reading_an_unknown_field_is_a_card_error(monkeypatch):
    cond = load_rules()["TP001"]
    monkeypatch.setattr(cond, "reads", ("tp", "tensor_parallel"))
    engine.load_rules.cache_clear()
    try:
        with pytest.raises(CardError, match="TP001: tensor_parallel"):
            engine.load_rules()
    finally:
        monkeypatch.undo()
        engine.load_rules.cache_clear()
        engine.load_rules()


@pytest.mark.parametrize("fields", [(), ("tp",), ("recompute_modules",), ("tp", "recompute_modules")])
def test_a_groups_key_holds_a_list_field_as_a_tuple(fields):
    group = engine.RuleGroup(fields, (), {})
    plan = Plan(recompute="selective", recompute_modules=["core_attn"], tp=2)
    key = group.key(plan.__dict__)
    hash(key)  # hashable, so the memo can keep it
    if fields == ("recompute_modules",):
        assert key == (("core_attn",),)


def test_a_contexts_derived_values_are_kept_in_its_dict_without_a_lock():
    # Context works out backend, law, expert_grid, fast_domain, microbatches and per_mini_batch on their first read and
    # keeps them in its own dict (core/once.py: functools.cached_property without Python 3.11's lock), the values the
    # plain expressions give
    job, plan = JOBS[0]
    ctx = Context(job, plan)
    derived = {name for name, value in vars(Context).items() if isinstance(value, once)}
    assert derived == {"backend", "law", "expert_grid", "fast_domain", "microbatches", "per_mini_batch"}
    assert not any(isinstance(value, functools.cached_property) for value in vars(Context).values())
    assert not derived & ctx.__dict__.keys()  # none before its first read
    for name in derived:
        value = getattr(ctx, name)
        assert ctx.__dict__[name] == value == getattr(ctx, name)
    gbs = job.global_batch_size
    assert ctx.microbatches == gbs // (plan.micro_batch_size * plan.dp) // plan.schedule_runs(gbs)
    assert ctx.expert_grid == plan.pp * plan.ep * plan.etp and ctx.law == job.card.world_size_law


@pytest.mark.parametrize("pipeline_microbatches", [None, 1, 3, 4, 64])
def test_schedule_runs_reads_a_whole_step_in_one_run_first(pipeline_microbatches):
    # Plan.schedule_runs: 1 where pipeline_microbatches is None (every micro-batch of the step in one run), read before
    # the micro-batch counts; the runs of the counts otherwise, as before
    for gbs, mbs, dp in [(1, 1, 1), (7, 2, 3), (512, 1, 8), (1024, 4, 2)]:
        plan = Plan(micro_batch_size=mbs, dp=dp, pipeline_microbatches=pipeline_microbatches)
        m = plan.num_microbatches(gbs)
        assert plan.schedule_runs(gbs) == max(1, m // min(m, pipeline_microbatches or m))
        if pipeline_microbatches is None:
            assert plan.schedule_runs(gbs) == 1


def _kept_over_fuzzed_plans() -> tuple[Job, list[Plan], Verdicts]:
    """The first job, 200 fuzzed plans of it and its kept verdicts after answering each as the plain run answers it."""
    rng = random.Random(5)
    first, base = JOBS[0]
    kept = Verdicts(first)
    plans = list(fuzzed_plans(rng, base, 200))
    for plan in plans:
        assert _outcome(kept.findings, first, plan) == _outcome(structural_findings, first, plan)
    return first, plans, kept


def test_a_rule_reading_fewer_fields_than_its_group_keeps_its_own_verdicts():
    """RuleGroup.runs: where a group's verdicts miss, each of its rules that reads fewer fields than the group is
    answered from its own verdicts, kept per the values of its own reads, so it runs once per those values (the
    findings stay the plain run's: test_kept_verdicts_give_the_plain_runs_findings_and_first_blocking_rule)."""
    *_, kept = _kept_over_fuzzed_plans()
    narrower = 0
    for groups in kept._groups.values():
        for group in groups:
            for *_, cond, own in group.runs:
                if group.screen is not None:  # its own verdicts per screen (test_a_screened_rule_runs_once_per_...)
                    assert own[0] is cond.screen and frozenset(keyed_reads(cond)) == frozenset(group.fields)
                    continue
                if own is None:
                    assert frozenset(keyed_reads(cond)) == frozenset(group.fields)
                    continue
                if own[3] is not None:  # a rule with words: test_a_rule_with_words_runs_once_per_its_reads_where_...
                    continue
                assert frozenset(keyed_reads(cond)) < frozenset(group.fields)
                assert len(own[2]) <= len(group.memo)
                narrower += len(own[2]) < len(group.memo)
    assert narrower > 0


def test_a_rule_with_words_runs_once_per_its_reads_where_it_passes():
    """RuleGroup.runs: a rule whose words read fields its verdict does not (@rule(words=...)) keeps where it passes
    per the values of its reads alone, so a plan that differs only in the words' fields (TP004 reads tp and
    tp_comm_overlap, its fix names the batch) does not run it again; it keeps no finding there (its words differ)."""
    first, plans, kept = _kept_over_fuzzed_plans()
    worded = fewer = 0
    for groups in kept._groups.values():
        for group in groups:
            if group.screen is not None:
                continue
            for *_, cond, own in group.runs:
                if own is None or own[3] is None:
                    continue
                reads = engine.reads_of(cond)
                assert frozenset(reads) < frozenset(keyed_reads(cond)) <= frozenset(group.fields)
                assert all(verdict is None for verdict in own[2].values())  # passes only
                key = engine.RuleGroup(tuple(sorted(reads)), (), {}).key
                asked = {key(plan.__dict__, first) if any(n in engine.JOB_READS for n in reads) else key(plan.__dict__)
                         for plan in plans}
                assert len(own[2]) <= len(asked)
                worded += 1
                fewer += len(own[2]) < len(group.memo)
    assert worded > 0 and fewer > 0


SCREENED = sorted(rid for rid, cond in load_rules().items() if cond.screen is not None)


def _fires(cond, job, plan):
    """Whether the condition fires on the plan (True/False), or the exception's type where it raises."""
    try:
        return cond(Context(job, plan)) is not None
    except Exception as exc:  # a raise is an outcome too: twins with one screen raise alike
        return type(exc).__name__


@pytest.mark.parametrize("rid", SCREENED)
def test_a_screen_decides_whether_its_rule_fires(rid):
    """`@rule(screen=...)`'s premise: two plans of one job (at any global batch size) with the same screen both pass or
    both fire. Plans are grouped by screen over the fuzz, with twins that keep a plan's screen but draw other values of
    the fields it reads (most twins share a screen with some plan); each group has one outcome."""
    rng = random.Random(31)
    cond = load_rules()[rid]
    shared = 0
    for job, base in JOBS:
        seen: dict = {}
        plans = fuzzed_plans(rng, base, 40)
        fields = [name for name in cond.reads if name in CHOICES]
        plans += [twin for plan in plans for _ in range(3)
                  if (twin := _plan(rng, plan, rng.sample(fields, min(2, len(fields)))))]
        for plan in plans:
            asked = job if rng.random() < 0.5 else job.model_copy(update={"global_batch_size": rng.choice((1, 7, 64))})
            screen = cond.screen(plan.__dict__, asked)
            outcome = _fires(cond, asked, plan)
            first = seen.setdefault(screen, (outcome, plan))
            shared += first[1] is not plan
            assert first[0] == outcome, (rid, job.model.name, job.framework, screen, first[1], plan)
    assert shared > 1000


def test_a_screened_rule_runs_once_per_screen_where_it_passes(monkeypatch):
    """Verdicts keeps a screened rule's passes per screen (engine.RuleGroup.screen): over plans whose reads all differ,
    AD001, PP003 and PP013 run once per screen they pass on and on each plan they fire on (without the screen: once
    per distinct value of their reads, every plan here)."""
    calls: dict[str, int] = {}
    conditions = load_rules()
    for rid in ("AD001", "PP003", "PP013"):
        def counted(ctx, cond=conditions[rid], rid=rid):
            calls[rid] = calls.get(rid, 0) + 1
            return cond(ctx)
        counted.reads, counted.screen = conditions[rid].reads, conditions[rid].screen
        monkeypatch.setitem(conditions, rid, counted)
    engine.rules_for.cache_clear()
    try:
        job, base = resolve(Request(model="llama-3.1-70b", num_gpus=64, gpu="h100"))
        kept = Verdicts(job)
        plans = [base.model_copy(update={"tp": tp, "pp": pp, "vpp": vpp, "dp": 64 // (tp * pp), "zero_stage": zero})
                 for tp in (1, 2, 4, 8) for pp in (1, 2, 4) for vpp in (1, 2, 5) for zero in (0, 1, 2, 3)]
        for plan in plans:
            assert kept.findings(job, plan) == structural_findings(job, plan)
        calls.clear()
        for plan in plans:  # a fresh Verdicts: each condition's calls counted
            Verdicts(job).findings(job, plan)
        plain = dict(calls)
        calls.clear()
        kept = Verdicts(job)
        for plan in plans:
            kept.findings(job, plan)
    finally:
        monkeypatch.undo()
        engine.rules_for.cache_clear()
    for rid in ("AD001", "PP003", "PP013"):
        cond = conditions[rid]
        fired = [p for p in plans if cond(Context(job, p)) is not None]
        passed = {cond.screen(p.__dict__, job) for p in plans if cond(Context(job, p)) is None}
        assert plain[rid] == len(plans)
        assert calls.get(rid, 0) == len(passed) + len(fired) < len(plans), rid


def _applies_and_fires(job: Job, plan: Plan, rule_id: str) -> bool:
    """A rule's plain verdict, kept nowhere: it applies to the plan's framework and engine, and its condition fires."""
    return (rule_specs()[rule_id].applies_to(job.framework, backend_of(job.card, plan.zero_stage))
            and load_rules()[rule_id](Context(job, plan)) is not None)


def test_a_blocking_rules_kept_verdict_is_its_plain_verdict_and_passes_reads_the_same():
    """Verdicts.fires (what the search's refusal and its EP overlap probe ask) is, on every plan, whether the rule
    applies to the plan's framework and engine and its condition fires (or raises as it does); passes is whether none
    of them fires. Both read one memo per rule, filled in any order: each plan is asked by one of them first, and a
    copy of the job at another global batch size shares them (a rule reading the batch is keyed by it too)."""
    rng = random.Random(60)
    ids = [rid for rid, spec in rule_specs().items() if spec.severity == "error" and not spec.memory]
    asked = fired = 0
    for first, base in JOBS:
        kept = Verdicts(first)
        for plan in fuzzed_plans(rng, base, 20):
            job = first if rng.random() < 0.7 else first.model_copy(
                update={"global_batch_size": rng.choice((1, 7, 64, first.global_batch_size * 2))})
            passes_first = rng.random() < 0.5
            if passes_first:
                passed = _outcome(kept.passes, job, plan)
            verdicts_of = {}
            for rid in ids:
                plain = _outcome(_applies_and_fires, job, plan, rid)
                assert _outcome(kept.fires, job, plan, rid) == plain, (rid, job.model.name, job.framework, plan)
                verdicts_of[rid] = plain
                asked += 1
            if not passes_first:
                passed = _outcome(kept.passes, job, plan)
            if all(v in (True, False) for v in verdicts_of.values()):
                assert passed == (not any(verdicts_of.values()))
                assert passed == (first_blocking(job, plan) is None)
                fired += not passed
    assert asked > 10_000 and fired > 200
