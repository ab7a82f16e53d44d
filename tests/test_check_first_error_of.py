"""The search's rule checks from the kept verdicts without building the plan (search/plans.SearchPlans.check_error ->
check/config.StructuralCheck.first_error_of -> rules/engine.Verdicts.first_error_of, issue 23): a plan's field values
are its layout's first plan's with the key's knobs, each part of the rules (engine.knob_parts) keeps its first error
per the values of every field its rules read. On every plan several searches check, the answer is the first error of
a plain run of the rules on the plan (structural_findings); a rule that no longer declares a field it reads
(a mutation of its `reads`) makes some answer differ."""

import pytest

from meshplan.check.config import check_structure
from meshplan.core.errors import MeshplanError
from meshplan.rules import engine
from meshplan.rules.engine import Verdicts, knob_parts, load_rules, structural_findings
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search import recommend
from meshplan.search.plans import SearchPlans

# H200: the pipelined layouts whose middle ranks are over an H100 (floors.ranks_floor) fit: their plans reach the rules
KIMI = Request(model="kimi-k2", num_gpus=256, gpu="h200")  # PP015 (ZeRO stage, EP overlap), PP005 (micro-batch)
# flex dispatcher, EP overlap asked for: PP015 (ZeRO-3 over virtual stages), EP009 (full recompute)
QWEN = Request(model="qwen3-30b-a3b", num_gpus=64, gpu="h100", moe_a2a_overlap=True)
# DeepSpeed-MoE: DS004 (ZeRO-3 with ep/tp/pp > 1) reads zero_stage and ep, DS002 the batch; the headroom keeps the
# search checking past its first fits (since DeepSpeed runs EP, deepseek-v2-lite/8 checks too few plans to tell)
DEEPSPEED = Request(model="mixtral-8x7b", num_gpus=16, gpu="h100", framework="deepspeed", micro_batch_size=1,
                    headroom=0.3)
# OF002 reads the recompute: DeepSpeed's activation offload needs full recompute (first_errors_over's varying part)
OFFLOAD = Request(model="llama-3.1-8b", num_gpus=2, gpu="h100", framework="deepspeed", activation_offload=True,
                  seq_length=2048, global_batch_size=8, headroom=0.1)
REQUESTS = [KIMI, QWEN, DEEPSPEED, Request(model="llama-3.1-70b", num_gpus=64, gpu="h100"),
            Request(model="mixtral-8x7b", num_gpus=32, gpu="h100", framework="megatron-bridge", precision="fp8")]
KNOBS = ("zero_stage", "recompute", "micro_batch_size", "moe_token_dispatcher", "moe_a2a_overlap")


def _forget_verdicts():
    engine._kept.clear()
    engine._last.clear()


def _searches(req: Request) -> list[SearchPlans]:
    """The SearchPlans of one recommend, each with the checks it answered (Caches.checks), from fresh verdicts."""
    _forget_verdicts()
    seen: dict[int, SearchPlans] = {}
    check, checks = SearchPlans.check_error, SearchPlans.check_errors

    def recording(self, *key):
        seen[id(self)] = self
        return check(self, *key)

    def recording_all(self, *key):  # a layout's recomputes at once (first_errors_over)
        seen[id(self)] = self
        return checks(self, *key)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SearchPlans, "check_error", recording)
        mp.setattr(SearchPlans, "check_errors", recording_all)
        recommend(req)
    return list(seen.values())


def _mismatches(searches: list[SearchPlans]) -> tuple[int, int, int]:
    """(checks compared, errors among them, answers that are not the plain run's first error)."""
    compared = errors = wrong = 0
    for search in searches:
        for key, error in search.caches.checks.items():
            plan = search.plan(*key)
            want = next((f for f in structural_findings(search.job, plan) if f.severity == "error"), None)
            compared += 1
            errors += want is not None
            wrong += error != want
    return compared, errors, wrong


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.model}-{r.num_gpus}-{r.framework}")
def test_every_check_of_a_search_is_the_plain_runs_first_error(req):
    compared, errors, wrong = _mismatches(_searches(req))
    assert compared > 50 and wrong == 0
    if req in (KIMI, QWEN, DEEPSPEED):
        assert errors > 50


# zero_stage on QWEN no longer shows: since rule EP012 (moe_shared_expert_overlap) reads the dispatcher and the
# recompute, the parts its Megatron rules share are keyed by fields that tell that search's ZeRO stages apart (with
# EP012 reading either one alone, dropping zero_stage answers 6,816 of its 35,608 checks wrong); DeepSpeed's keeps it
@pytest.mark.parametrize(("dropped", "req"), [("micro_batch_size", KIMI), ("zero_stage", DEEPSPEED), ("ep", DEEPSPEED),
                                              ("recompute", OFFLOAD)])
def test_a_rule_that_drops_a_field_it_reads_gives_another_answer(monkeypatch, dropped, req):
    """Each rule's reads without one knob field: the parts' and groups' keys no longer tell apart plans that differ in
    it, and some check answers another plan's verdict."""
    reading = set()
    for rule_id, cond in load_rules().items():
        if cond.reads is not None and dropped in cond.reads:
            reading.add(rule_id)
            monkeypatch.setattr(cond, "reads", tuple(name for name in cond.reads if name != dropped))
    try:
        _, _, wrong = _mismatches(_searches(req))
    except MeshplanError as refused:  # the refusal's screen, keyed by the same reads, refuses every plan: an answer
        assert str(refused).split(":")[0] in reading, refused  # of another plan too
        wrong = 1
    finally:
        monkeypatch.undo()
        _forget_verdicts()
    assert wrong > 0


def test_kept_verdicts_answer_without_building_the_plan():
    """Once a plan's parts are kept, a plan with the same values is answered from its base's values and knobs alone."""
    _forget_verdicts()
    search = _searches(DEEPSPEED)[0]
    job, kept = search.job, engine.verdicts(search.job)
    asked = 0
    for (lay, zero, recompute, mbs), error in search.caches.checks.items():
        base = search.caches.plans.get(lay)
        if base is None:
            continue

        def unbuilt():
            raise AssertionError("built a plan whose verdicts are kept")

        knobs = search.knobs(lay, zero, recompute, mbs)
        assert kept.first_error_of(job, knobs, base, unbuilt) == error
        asked += 1
    assert asked > 100


def test_a_condition_that_raises_answers_as_first_error(monkeypatch):
    """Where a condition raises, the plan's own findings answer: the first error of the plain structural check."""
    search = _searches(DEEPSPEED)[0]
    job = search.job
    kept = Verdicts(job)

    def broken(rules, ctx):
        raise RuntimeError("a condition raised")

    monkeypatch.setattr(engine, "_fire", broken)
    for key in list(search.caches.checks)[:40]:
        plan = search.plan(*key)
        plain = next((f for f in check_structure(job, plan) if f.severity == "error"), None)
        assert kept.first_error_of(job, search.knobs(*key), None, lambda p=plan: p) == plain


TWINS = {"tp": 4, "pp": 4, "ep": 2, "dp": 2, "micro_batch_size": 2, "zero_stage": 3, "recompute": "selective",
         "moe_a2a_overlap": True, "moe_token_dispatcher": "flex"}


def test_each_group_joins_one_part_whose_key_reads_its_fields():
    """knob_parts: every group that holds an error rule in exactly one part, and no group of warnings alone (a part
    keeps its first error; their fields would only widen its key); the part's key changes with a field iff one of its
    groups reads it (its first error is decided by those fields and no others)."""
    _forget_verdicts()
    job = _searches(QWEN)[0].job
    kept = engine.verdicts(job)
    kept._program(0)
    groups = kept._groups[engine.backend_of(job.card, 0)]
    parts = knob_parts(groups, KNOBS)
    fields_of = {id(g.in_parts[1]): g.fields for g in groups}
    erring = [id(g.in_parts[1]) for g in groups if any(spec.severity == "error" for _, spec, _ in g.rules)]
    assert 0 < len(erring) < len(groups)  # the job's rules hold groups of warnings alone
    assert sorted(id(memo) for *_, members, _ in parts for _, memo, _, _ in members) == sorted(erring)
    plan = Plan(tp=2, pp=2, ep=4, dp=4, recompute="full")
    for key, reads_job, _, members, knobs in parts:
        union = {name for _, memo, _, _ in members for name in fields_of[id(memo)]}
        assert reads_job == ("global_batch_size" in union)
        assert union & set(KNOBS) <= knobs  # the knobs first_errors_over reads a part by
        for name, value in TWINS.items():
            twin = plan.model_copy(update={name: value})
            keys = [key(p.__dict__, job) if reads_job else key(p.__dict__) for p in (plan, twin)]
            assert (keys[0] != keys[1]) == (name in union), (name, sorted(union))
