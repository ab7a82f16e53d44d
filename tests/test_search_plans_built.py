"""The search builds its plans without validating each again (search/plans.SearchPlans.plan: a layout's first plan
validated, the others copies of it with the knobs that change) and answers its rule checks from the first error alone
(check/config.StructuralCheck.first_error_of): on every plan of several searches, each is the plan and the error the
validated build and the full report give, and a search whose check has no first_error_of answers the same."""

from dataclasses import replace

import pytest
from pydantic import ValidationError

from meshplan.arithmetic.mesh import crosses_domains
from meshplan.arithmetic.schedule import VirtualSplit
from meshplan.check.config import check_config
from meshplan.knowledge.cards import framework_card
from meshplan.rules.engine import Context, backend_of, blocking_rules, load_rules
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.request import Request
from meshplan.search import recommend
from meshplan.search.estimators import default_engine
from meshplan.search.plans import OVERLAP_READS, OVERLAP_RULES, SearchPlans
from meshplan.search.space import CARRIED_FIELDS, DEFAULT_PLAN, enumerate_layouts

REQUESTS = [
    Request(model="qwen3-30b-a3b", num_gpus=64, gpu="h100"),  # MoE across nodes: flex dispatcher, EP overlap
    Request(model="mixtral-8x7b", num_gpus=32, gpu="h100", framework="megatron-bridge", precision="fp8"),
    Request(model="llama-3.1-8b", num_gpus=16, gpu="h100", optimizer="muon", expandable_segments=True,
            account_for_embedding=True, account_for_loss=True),  # carried fields, a virtual split's fields
    Request(model="qwen3-30b-a3b", num_gpus=16, gpu="a100-80gb", framework="torchtitan"),
    Request(model="deepseek-v2-lite", num_gpus=8, gpu="h100", framework="deepspeed", micro_batch_size=2),
]


def _overlap(search: SearchPlans, lay, zero, recompute) -> bool:
    """moe_a2a_overlap as the search chooses it, probed per layout, ZeRO stage and recompute: on where neither EP009
    nor PP015 refuses it."""
    if "moe_a2a_overlap" in search.fixed:
        return bool(search.fixed.values["moe_a2a_overlap"])
    if lay.schedule == "combined_1f1b":
        return True
    if not search.a2a_open or lay.ep <= 1:
        return False
    probe = _validated(search, lay, zero, recompute, 1, overlap=True)
    return all(load_rules()[rule](Context(search.job, probe)) is None for rule in ("EP009", "PP015"))


def _validated(search: SearchPlans, lay, zero, recompute, mbs, overlap=None):
    """The plan as the search built it before (every plan validated)."""
    if overlap is None:
        overlap = _overlap(search, lay, zero, recompute)
    fixed = search.fixed.values.get("moe_token_dispatcher")
    dispatcher = str(fixed) if fixed is not None else "flex" if (
        search.flex and lay.ep > 1 and crosses_domains(lay.ep, lay.etp, search.domain)
        and backend_of(search.job.card, zero) == "megatron") else "alltoall"
    return lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs,
                    sequence_parallel=search.sequence_parallel(lay), cp_comm_type=search.cp_comm,
                    moe_token_dispatcher=dispatcher, moe_a2a_overlap=overlap,
                    tp_comm_overlap=search.tp_overlap and lay.tp > 1, **search.fixed.carried)


@pytest.fixture(scope="module")
def built():
    """Every (search, arguments, plan) SearchPlans.plan built for REQUESTS."""
    calls = []
    plan = SearchPlans.plan

    def recording(self, *args, **kwargs):
        out = plan(self, *args, **kwargs)
        calls.append((self, args, kwargs, out))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SearchPlans, "plan", recording)
        for req in REQUESTS:
            recommend(req)
    return calls


def test_every_plan_is_the_validated_plan(built):
    assert len(built) > 1000
    assert len({id(search) for search, *_ in built}) >= len(REQUESTS)
    assert any(out.moe_token_dispatcher == "flex" for *_, out in built)
    assert any(out.moe_a2a_overlap for *_, out in built)
    assert any(out.account_for_embedding and out.optimizer == "muon" for *_, out in built)
    for search, args, kwargs, out in built:
        want = _validated(search, *args, **kwargs)
        assert type(out) is type(want)
        assert out == want
        assert out.model_dump() == want.model_dump()
        assert out.model_fields_set == want.model_fields_set
        assert list(out.__dict__) == list(want.__dict__)


def test_every_overlap_is_its_rules_on_the_layouts_own_probe(built):
    """a2a_overlap's memo (per what its rules read) answers each layout of the space as a probe of that layout does."""
    searches = {id(search): search for search, *_ in built if search.a2a_open}.values()
    assert searches
    answers = set()
    for search in searches:
        for lay in enumerate_layouts(search.job, search.fixed)[0]:
            for zero in search.zeros:
                for recompute in search.recomputes:
                    answer = search.a2a_overlap(lay, zero, recompute)
                    assert answer == _overlap(search, lay, zero, recompute), (lay, zero, recompute)
                    answers.add((lay.pp > 1, lay.vpp > 1, answer))
    assert {(True, True, True), (True, False, False)} <= answers


def test_every_first_error_is_the_reports(built):
    searches = {id(search): search for search, *_ in built}.values()
    errors = 0
    for search in searches:
        for key, error in search.caches.checks.items():
            report = check_config(search.job, _validated(search, *key), include_memory=False)
            want = next((f for f in report.findings if f.severity == "error"), None)
            assert error == want
            errors += error is not None
    assert errors > 0


def test_the_overlap_probe_is_keyed_by_all_its_rules_reads():
    """a2a_overlap keys its probe by pp, vpp, ep, etp, ZeRO stage, recompute and the layout's named schedule: every
    field the rules that refuse the overlap read that varies between a search's plans (recompute_modules is never
    carried, the probe's overlap is on, the dispatcher EP012 reads is one per ep, etp and ZeRO stage); every rule that
    reads the overlap is one of them (EP012 too: moe_shared_expert_overlap beside it is refused)."""
    for rule in OVERLAP_RULES:
        assert set(load_rules()[rule].reads) <= set(OVERLAP_READS)
    reading = {name for name, cond in load_rules().items() if "moe_a2a_overlap" in (cond.reads or ())}
    assert reading == set(OVERLAP_RULES)
    assert "recompute_modules" not in CARRIED_FIELDS


def test_the_rules_that_refuse_the_overlap_are_blocking_rules_wherever_the_search_opens_it():
    """a2a_overlap asks each of OVERLAP_RULES through the job's kept verdicts (Verdicts.fires), which answer False for
    a rule the plan's framework and engine do not run as a blocking rule: on every framework whose adapter renders
    moe_a2a_overlap (where the search opens it), each is one at every engine its ZeRO stages select, so the probe
    asks each rule's own condition."""
    opened = 0
    for name in FRAMEWORKS:
        card = framework_card(name)
        if card.adapter is None or not card.adapter.renders("moe_a2a_overlap"):
            continue
        for backend in set(card.engine.by_zero_stage.values()):
            assert set(OVERLAP_RULES) <= {spec.id for spec, _ in blocking_rules(name, backend)}, (name, backend)
            opened += 1
    assert opened >= 2  # Megatron-Core and Megatron-Bridge


@pytest.mark.parametrize("req", REQUESTS[:2] + REQUESTS[3:4], ids=lambda r: f"{r.model}-{r.num_gpus}")
def test_a_check_without_first_error_of_answers_the_same(req):
    fast = recommend(req)
    engine = default_engine(req.framework)
    plain = recommend(req, engine=replace(engine, check=lambda job, plan: engine.check(job, plan)))
    assert plain.model_dump() == fast.model_dump()


def test_a_layouts_first_plan_copied_from_another_is_its_validated_plan(built):
    """Layout.copied_plan (SearchPlans.first_plan, floors.estimate_stages): every layout of the searches' spaces,
    splits too, copied from one plan without a split is the plan validated afresh, field for field, in its fields
    set and its fields' order; copied from DEFAULT_PLAN, the same values. A value validation would change or refuse
    leaves it None, for plan() to validate (and refuse)."""
    searches = {id(search): search for search, *_ in built}.values()
    splits = 0
    for search in searches:
        layouts = enumerate_layouts(search.job, search.fixed)[0]
        model = next((lay for lay in layouts if lay.split is None), None)
        if model is None:  # every layout split (a request's account_for_embedding): first_plan validates them all
            continue
        for lay in layouts:
            sp, overlap = search.sequence_parallel(lay), search.tp_overlap and lay.tp > 1
            knobs = search.knobs(lay, search.zeros[-1], search.recomputes[-1], 1)
            first = model.plan(**knobs, sequence_parallel=search.sequence_parallel(model), cp_comm_type=search.cp_comm,
                               tp_comm_overlap=search.tp_overlap and model.tp > 1, **search.fixed.carried)
            want = lay.plan(**knobs, sequence_parallel=sp, cp_comm_type=search.cp_comm, tp_comm_overlap=overlap,
                            **search.fixed.carried)
            out = lay.copied_plan(first, knobs, sp, overlap)
            assert out is not None and out == want and out.model_fields_set == want.model_fields_set
            assert list(out.__dict__) == list(want.__dict__)
            plain = {"zero_stage": knobs["zero_stage"], "recompute": "none", "micro_batch_size": 1}
            default = lay.copied_plan(DEFAULT_PLAN, plain, False, False)
            assert default is not None
            assert default.model_dump() == lay.plan(**plain, sequence_parallel=False, cp_comm_type="p2p").model_dump()
            splits += lay.split is not None
    assert splits > 0
    lay = enumerate_layouts(*next((s.job, s.fixed) for s in searches if s.fixed.carried))[0][0]
    knobs = {"zero_stage": 1, "recompute": "none", "micro_batch_size": 1}
    for bad in (replace(lay, schedule="no_such_schedule"), replace(lay, split=VirtualSplit((1,), layout="t" * 5000)),
                replace(lay, first=-1)):
        assert bad.copied_plan(DEFAULT_PLAN, knobs, False, False) is None
        with pytest.raises(ValidationError):
            bad.plan(**knobs, sequence_parallel=False, cp_comm_type="p2p")
    coerced = replace(lay, tp=True)  # validation makes it the int 1
    assert coerced.copied_plan(DEFAULT_PLAN, knobs, False, False) is None
    assert type(coerced.plan(**knobs, sequence_parallel=False, cp_comm_type="p2p").tp) is int
    assert lay.copied_plan(DEFAULT_PLAN, knobs, 1, False) is None  # type: ignore[arg-type]
