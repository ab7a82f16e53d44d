"""meshplan's rules are the frameworks' rules: the real validators and check_config agree on generated layouts.

Megatron-Core, verl, SkyRL and torchtitan run their own validation code (pinned PyPI wheels, in a cached
Python 3.11 venv with CPU torch; see tests/framework_probes/harness.py). Megatron-Bridge is compared with
the Megatron-Core checks its ConfigContainer.validate() runs; KempnerForge, which is not on PyPI, is
checked against its documented rules. Every disagreement must be explained in
cards/validator_agreement.yaml. Bigger samples and the agreement rates: bench/validator_agreement.py.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "framework_probes"))

import harness

CASES_PER_FRAMEWORK = 60  # moderate in CI (the venv build dominates); the bench runs hundreds


def _ids(entries: list[str]) -> set[str]:
    return {re.match(r"[A-Z]+\d+", e).group(0) for e in entries}


def test_card_names_the_rules_the_harness_compares():
    card = harness.load_card()
    for name, spec in harness.FRAMEWORKS.items():
        assert _ids(card.frameworks[name].compared_rules) == spec.compared | spec.warning_compared, name
    from meshplan.rules.engine import rule_specs

    known = set(rule_specs())
    for name, evidence in card.frameworks.items():
        assert _ids(evidence.compared_rules) <= known, name
        for expl in evidence.explained:
            assert expl.rule in known | {"none"}, (name, expl.rule)


def test_generators_cover_valid_and_invalid_layouts():
    for name in harness.FRAMEWORKS:
        cases = harness.generate(name, CASES_PER_FRAMEWORK)
        assert len({c["id"] for c in cases}) == len(cases)
        assert cases == harness.generate(name, CASES_PER_FRAMEWORK)  # seeded: the same sample every run
    mc = harness.generate("megatron-core", 200)
    assert any(c["model"]["num_experts"] for c in mc) and any(c["vpp"] > 1 for c in mc)
    assert any(c["first_stage_layers"] for c in mc) and any(c["num_gpus"] % (c["tp"] * c["pp"] * c["cp"]) for c in mc)


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(harness.FRAMEWORKS))
def test_real_validator_agrees_with_check_config(framework):
    cases = harness.generate(framework, CASES_PER_FRAMEWORK)
    verdicts = harness.framework_verdicts(framework, cases)
    rows = harness.compare(framework, cases, verdicts)
    crashed = [r for r in rows if r.framework_accept is None]
    assert not crashed, "the framework's validator crashed (a harness defect):\n" + crashed[0].describe() + \
        "\n" + crashed[0].framework_message
    ours = [r for r in rows if r.meshplan_crash]
    assert not ours, f"check_config raised on {len(ours)} layouts, e.g.\n" + ours[0].describe()
    both = {r.framework_accept for r in rows}
    assert both == {True, False}, f"{framework}: the sample must hold accepted and rejected layouts"
    unexplained = [r for r in rows if not r.agree and not r.explained_by]
    assert not unexplained, f"{len(unexplained)} unexplained disagreements, e.g.\n" + "\n".join(
        r.describe() for r in unexplained[:3])
    if harness.FRAMEWORKS[framework].warning_compared:
        sp = harness.sp_warning_rows(rows)
        assert not sp, "SP001 differs from the framework's SP-off warning:\n" + sp[0].describe()


# --------------------------------------------------------------------------- KempnerForge: documented rules


def _kempnerforge_documented(case: dict) -> set[str]:
    """KempnerForge JobConfig.validate as documented (docs/configuration/validation-rules.md)."""
    m, errors = case["model"], set()
    if case["dp"] * case["tp"] * case["pp"] * case["cp"] * case["ep"] != case["num_gpus"]:
        errors.add("WS006")
    if case["tp"] > 1 and m["num_attention_heads"] % case["tp"]:
        errors.add("TP001")
    if case["tp"] > 1 and m["num_kv_heads"] % case["tp"]:
        errors.add("TP003")
    if m["num_experts"] and case["pp"] > 1:
        errors.add("KF001")
    if case["ep"] > 1 and not m["num_experts"]:
        errors.add("EP001")
    if case["ep"] > 1 and m["num_experts"] and m["num_experts"] % case["ep"]:
        errors.add("EP002")
    return errors


def test_kempnerforge_documented_rules_match_check_config():
    rng = random.Random("kempnerforge")
    compared = harness.FRAMEWORKS_DOCUMENTED["kempnerforge"]
    seen: set[str] = set()
    for i in range(300):
        case = harness.megatron_case(rng, i)
        case.update(etp=1, first_stage_layers=None, last_stage_layers=None, vpp=1)
        case["dp"] = rng.choice([1, 2, 4, 8])
        expected = _kempnerforge_documented(case)
        findings = harness.meshplan_findings(case, "kempnerforge")
        got = {f.id for f in findings if f.severity == "error"} & compared
        assert got == expected, f"{case}\n documented: {sorted(expected)}  meshplan: {sorted(got)}"
        seen |= expected
    assert seen == compared  # every documented rule was exercised
