"""The skill folders follow the Agent Skills format and hold together: validator, frontmatter, links, sizes, cards."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshplan.knowledge.cards import CardError, validate_card
from meshplan.knowledge.tables import PitfallsCard, StrategiesCard, pitfalls_card, strategies_card

ROOT = Path(__file__).resolve().parents[1]
SKILLS = sorted(p.parent for p in (ROOT / "skills").glob("*/SKILL.md"))
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"  # skills-ref runs on any Python 3; no 3.12 needed
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def frontmatter(skill: Path) -> tuple[dict, str]:
    text = (skill / "SKILL.md").read_text(encoding="utf-8")
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.DOTALL)
    assert match, f"{skill.name}/SKILL.md has no frontmatter"
    return yaml.safe_load(match.group(1)), match.group(2)


def test_expected_skills_exist():
    names = {s.name for s in SKILLS}
    assert {"parallelism-strategies", "debug-training-oom"} <= names
    refs = {p.stem for p in (ROOT / "skills" / "parallelism-strategies" / "references").glob("*.md")}
    required = {"memory", "moe", "long-context", "topology", "pitfalls", "megatron-bridge", "megatron-core", "verl",
                "skyrl", "torchtitan", "kempnerforge", "deepspeed"}
    assert required <= refs, f"missing references: {sorted(required - refs)}"


@pytest.mark.parametrize("skill", SKILLS, ids=lambda p: p.name)
def test_frontmatter_follows_the_spec(skill):
    meta, body = frontmatter(skill)
    assert set(meta) <= ALLOWED_KEYS, f"keys outside the spec: {sorted(set(meta) - ALLOWED_KEYS)}"
    assert meta["name"] == skill.name
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", meta["name"]) and len(meta["name"]) <= 64
    desc = meta["description"]
    assert 1 <= len(desc) <= 1024, len(desc)
    assert "<" not in desc and ">" not in desc, "Anthropic's validator rejects angle brackets"
    assert "Use when" in desc, "the description must say when to use the skill"
    assert all(isinstance(v, str) for v in meta.get("metadata", {}).values()), "metadata is a string map"
    assert len(body.splitlines()) < 500


def test_descriptions_are_distinct():
    descriptions = [frontmatter(s)[0]["description"] for s in SKILLS]
    assert len(descriptions) == len(set(descriptions))


@pytest.mark.parametrize("md", sorted((ROOT / "skills").rglob("*.md")), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
    text = md.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        assert (md.parent / target).resolve().exists(), f"{md.name}: broken link {target}"


def test_reference_files_are_linked_from_skill():
    skill = ROOT / "skills" / "parallelism-strategies"
    linked = set(LINK.findall((skill / "SKILL.md").read_text(encoding="utf-8")))
    for ref in (skill / "references").glob("*.md"):
        assert f"references/{ref.name}" in linked, f"{ref.name} is not reachable from SKILL.md"


def test_skills_ref_validator_accepts_every_skill():
    """The agentskills.io reference validator (skills-ref from PyPI, in a cached throwaway venv)."""
    from framework_packages import venv_python

    python = venv_python("skills-ref", ["skills-ref==0.1.1"], python_version=PYTHON)
    for skill in SKILLS:
        proc = subprocess.run([str(python.parent / "agentskills"), "validate", str(skill)], capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_skills_ref_validator_rejects_a_bad_skill(tmp_path):
    """The validator run above can fail: a folder/name mismatch and an extra key are caught."""
    from framework_packages import venv_python

    python = venv_python("skills-ref", ["skills-ref==0.1.1"], python_version=PYTHON)
    bad = tmp_path / "bad-skill"
    bad.mkdir()
    (bad / "SKILL.md").write_text("---\nname: other-name\ndescription: x\nwhen_to_use: y\n---\nbody\n")
    proc = subprocess.run([str(python.parent / "agentskills"), "validate", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1


def test_knowledge_cards_load():
    card = strategies_card()
    assert card.dense_by_size and card.moe_by_model and card.topology and card.sequence_length
    assert card.examples and card.tradeoffs and card.workflow and card.corrections
    assert {e.kind for e in card.examples} >= {"3d", "4d", "moe"}
    assert pitfalls_card().pitfalls and pitfalls_card().oom_ladder


def test_pitfall_rule_ids_exist_in_the_rules_card():
    from meshplan.rules.engine import rule_specs

    known = set(rule_specs())
    for p in pitfalls_card().pitfalls:
        assert set(p.rule_ids) <= known, f"{p.id}: unknown rule ids {sorted(set(p.rule_ids) - known)}"


def test_every_correction_names_its_seed_and_source():
    for c in strategies_card().corrections:
        assert re.match(r"^\d{3}_[0-9a-f]{16}\.txt", c.seed), c.id
        assert c.source.strip() and c.correct.strip() and c.why.strip()


def _strategies_data() -> dict:
    return yaml.safe_load((ROOT / "cards" / "strategies.yaml").read_text(encoding="utf-8"))


def test_strategies_schema_rejects_bad_cards():
    data = _strategies_data()
    data["dense_by_size"][1]["min_params_b"] = 2  # leaves a gap between 1B and 2B
    with pytest.raises(CardError, match="gap"):
        validate_card("strategies", data, StrategiesCard)
    data = _strategies_data()
    data["moe_by_model"][0]["source"] = " "
    with pytest.raises(CardError, match="source"):
        validate_card("strategies", data, StrategiesCard)
    data = _strategies_data()
    data["topology"][0]["unexpected"] = 1
    with pytest.raises(CardError, match=r"topology\.0\.unexpected"):
        validate_card("strategies", data, StrategiesCard)


def test_pitfalls_schema_rejects_bad_cards():
    data = yaml.safe_load((ROOT / "cards" / "pitfalls.yaml").read_text(encoding="utf-8"))
    data["pitfalls"].append(dict(data["pitfalls"][0]))
    with pytest.raises(CardError, match="duplicate pitfall ids"):
        validate_card("pitfalls", data, PitfallsCard)
    data = yaml.safe_load((ROOT / "cards" / "pitfalls.yaml").read_text(encoding="utf-8"))
    data["pitfalls"][0]["frameworks"] = ["megatron-lm"]
    with pytest.raises(CardError, match="unknown frameworks"):
        validate_card("pitfalls", data, PitfallsCard)


PRINTED_COMMAND = re.compile(r"^meshplan (check|memory|throughput|recommend|render|describe|min-gpus) (.+)$", re.M)


def printed_commands() -> list[str]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "skills").rglob("*.md"))
    return sorted({m.group(0) for m in PRINTED_COMMAND.finditer(text)})


@pytest.mark.parametrize("command", printed_commands())
def test_every_printed_command_runs_as_printed(command, capsys):
    """A command a reader copies from a skill must run and pass: the DeepSeek-V3 example once dropped
    --etp 1, which the recipe sets and an unset etp (= tp on a Megatron MoE) breaks (WS002)."""
    import shlex

    from meshplan.faces.cli import main

    assert main([*shlex.split(command)[1:], "--json"]) == 0, capsys.readouterr()


def test_the_tool_table_names_every_mcp_tool():
    """An agent reading parallelism-strategies learns every tool the server lists: minimum_gpus, render_report and
    compare_run were missing, though the description sends 'how many GPUs' and 'minimum GPUs' questions here."""
    import json

    tools = [t["name"] for t in json.loads((ROOT / "meshplan/faces/mcp/tool_schemas.json").read_text())]
    _, body = frontmatter(ROOT / "skills" / "parallelism-strategies")
    table = body.split("## Which tool answers which question", 1)[1].split("\n## ", 1)[0]
    assert [t for t in tools if f"`{t}`" not in table] == []
