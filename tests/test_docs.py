"""meshplan docs: the skill tables are rendered from the cards, and --check catches drift."""

from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.faces import docs
from meshplan.faces.cli import main
from meshplan.knowledge.tables import strategies_card


def test_skills_are_in_sync_with_the_cards():
    drift = docs.render_all(check=True)
    assert drift == [], f"run 'meshplan docs' to regenerate: {drift}"


def test_cli_check_exits_zero_when_in_sync(capsys):
    assert main(["docs", "--check"]) == 0


def test_check_reports_a_hand_edited_block(tmp_path, monkeypatch):
    skill = tmp_path / "skills" / "x"
    skill.mkdir(parents=True)
    page = skill / "page.md"
    page.write_text("intro\n<!-- meshplan:begin topology -->\nhand-edited\n<!-- meshplan:end topology -->\noutro\n")
    monkeypatch.setattr(docs, "skills_root", lambda: tmp_path / "skills")
    assert docs.render_all(check=True) == ["skills/x/page.md"]
    assert "hand-edited" in page.read_text(), "check mode must not write"
    assert main(["docs", "--check"]) == 1
    assert docs.render_all(check=False) == ["skills/x/page.md"]
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n"), "prose outside the markers is kept"
    assert strategies_card().topology[0].advice.split()[0] in text
    assert docs.render_all(check=True) == []


def test_rendering_is_deterministic():
    text = "<!-- meshplan:begin moe-by-model -->\n<!-- meshplan:end moe-by-model -->\n"
    assert docs.render_text(text) == docs.render_text(text)


def test_unknown_block_and_unclosed_marker_are_errors():
    with pytest.raises(MeshplanError, match="unknown meshplan block"):
        docs.render_text("<!-- meshplan:begin no-such-table -->\n<!-- meshplan:end no-such-table -->\n")
    with pytest.raises(MeshplanError, match="no matching"):
        docs.render_text("<!-- meshplan:begin topology -->\nno end\n")


def test_every_card_row_reaches_the_documents():
    """Each decision-table row id, example and correction appears in some rendered skill file."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in docs.skills_root().rglob("*.md"))
    card = strategies_card()
    for row in card.dense_by_size:
        assert row.start in text, row.id
    for row in card.moe_by_model:
        assert f"| {row.recipe.model} |" in text, row.id
    for ex in card.examples:
        assert ex.title in text, ex.id
    for c in card.corrections:
        assert f"**{c.id}**" in text, c.id


def test_framework_pages_show_the_adapter_keys():
    text = (docs.skills_root() / "parallelism-strategies" / "references" / "megatron-core.md").read_text()
    assert "--tensor-model-parallel-size" in text
    assert "`PP001`" in text  # the rules that apply to Megatron-Core


def test_rate_rounding():
    assert docs._rate(123456.7) == "123,000"
    assert docs._rate(1234.5) == "1,230"
    assert docs._rate(45.67) == "45.7"
    assert docs._rate(0) == "0"
