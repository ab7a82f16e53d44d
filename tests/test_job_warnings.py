"""The warnings that hold whatever the layout (the `no_effect` rules that read no plan field: rules/engine
job_no_effect_findings) on every answer of recommend and min-gpus, through one function, search/answer.job_warnings.
Before, the training recommend never said them (EP014, moe_shared_expert_overlap for a model without shared experts;
EP011, a token dispatcher given for a dense model, since retired) though check and the estimates did, and min-gpus,
which copies recommend's warnings, did not either."""

from __future__ import annotations

from meshplan import api
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rules.context import BACKENDS
from meshplan.rules.engine import load_rules, reads_of, rule_specs
from meshplan.schema.reports import finding_line
from meshplan.search.answer import job_warnings
from meshplan.search.ranking import recommend

DENSE = {"model": "llama-3.1-8b", "gpu": "h100"}
BOTH = {**DENSE, "moe_shared_expert_overlap": True}  # EP014


def _check_lines(fields: dict) -> list[str]:
    """The findings check gives the request of the rules that read no plan field, in its words."""
    conditions = load_rules()
    return [finding_line(f) for f in api.check_config(parse_request(fields)).findings
            if reads_of(conditions[f.id]) == ()]


def test_the_rules_that_read_no_plan_field_apply_on_every_engine():
    """job_warnings asks them on the default Plan: true only while none of them is an engine's alone (the plan's ZeRO
    stage picks the engine, Context.backend), so the answer is every plan's of the job."""
    conditions = load_rules()
    job_wide = [spec for spec in rule_specs().values() if spec.no_effect and reads_of(conditions[spec.id]) == ()]
    assert job_wide
    for spec in job_wide:
        assert set(spec.backends) == set(BACKENDS), spec.id


def test_job_warnings_are_checks_words_on_any_plan():
    """The job's warnings are the lines check gives of those rules, whatever the layout and ZeRO stage asked."""
    layouts = ({"num_gpus": 8}, {"num_gpus": 8, "tp": 8, "zero_stage": 0}, {"num_gpus": 16, "pp": 2, "zero_stage": 3})
    for layout in layouts:
        fields = {**BOTH, **layout}
        job, _ = resolve(parse_request(fields))
        assert job_warnings(job) == _check_lines(fields)
        assert [w[:6] for w in job_warnings(job)] == ["EP014 "]


def test_recommend_says_them_on_every_answer_path():
    """Candidates found, rows_only (min-gpus' scan), and nothing fits (70B on one H100): the job's warnings last, once,
    at every GPU count, and not again in a row's rationale."""
    lines = _check_lines({**BOTH, "num_gpus": 8})
    found = api.recommend(parse_request({**BOTH, "num_gpus": 8}), top_k=3)
    assert found.candidates and found.warnings[-1:] == lines and len(set(found.warnings)) == len(found.warnings)
    for line in lines:
        message = line.split(": ", 1)[1].split(" Fix: ")[0]
        assert not any(message in c.rationale for c in found.candidates)
    rows = recommend(parse_request({**BOTH, "num_gpus": 8}), top_k=1, rows_only=True)
    assert rows.warnings[-1:] == lines
    big = {**BOTH, "model": "llama-3.1-70b", "num_gpus": 1}
    none = api.recommend(parse_request(big), top_k=1)
    assert not none.candidates and none.warnings[-1:] == _check_lines(big)


def test_a_request_without_them_warns_as_before():
    """No such setting given: the answer carries none of those rules' lines (the answers without one are unchanged,
    bench/answer_snapshot.py)."""
    rec = api.recommend(parse_request({**DENSE, "num_gpus": 8}), top_k=1)
    assert not any(w[:6] in ("EP011 ", "EP014 ") for w in rec.warnings)


def test_min_gpus_says_them_where_a_rule_refuses_every_count():
    """A fixed tp no count runs (Llama-3.1-8B's 32 heads over 3): no count settled, the job's own warnings."""
    fields = {**BOTH, "tp": 3}
    found = api.minimum_gpus(parse_request(fields))
    assert found.stopped_by == "rules" and found.num_gpus is None
    assert found.warnings == _check_lines({**fields, "num_gpus": 3})


def test_the_rl_recommend_says_each_once():
    """The RL recommend's actor search ends its warnings with the trainer job's, which the RL job's hold in the same
    words: each once. Its job-wide rule here is RL008 (GRPO over one response), the RL job's own; the trainer's were
    EP011 (retired) and EP014, which verl's Megatron engine refuses (EP012, no key), so RL008 alone, once."""
    rl = {**DENSE, "num_gpus": 8, "framework": "verl", "job": "rl", "algorithm": "grpo", "samples_per_prompt": 1}
    rec = api.recommend(parse_request(rl), top_k=1)
    assert [w[:6] for w in rec.warnings] == ["RL008 "]
