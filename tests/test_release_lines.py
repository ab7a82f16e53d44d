"""A card's per-release fact stated for a release line (knowledge/release_lines.py), the one match every reader of such
a fact uses, and the micro-batches per step every reader counts (schema/plan.step_microbatches)."""

from __future__ import annotations

import pytest

from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.release_lines import in_any_line, in_line, longest_line
from meshplan.schema.plan import Plan, step_microbatches


@pytest.mark.parametrize(("release", "line", "holds"), [
    ("0.2", "0.2", True), ("0.2.1", "0.2", True), ("0.20", "0.2", False), ("0.20.1", "0.2", False),
    ("0.2.1", "0.2.1", True), ("0.2", "0.2.1", False), (None, "0.2", False), ("", "0.2", False),
])
def test_a_line_holds_itself_and_its_dotted_releases(release, line, holds):
    assert in_line(release, line) is holds
    assert in_any_line(release, ["9.9", line]) is holds


def test_the_longest_line_is_the_most_specific():
    lines = {"0.2": "a", "0.2.1": "b", "0.3": "c"}
    assert longest_line("0.2.1", lines) == "0.2.1"
    assert longest_line("0.2.1.post1", lines) == "0.2.1"
    assert longest_line("0.2.0", lines) == "0.2"
    assert longest_line("0.4", lines) is None and longest_line(None, lines) is None


def test_torchtitans_loss_is_its_lines():
    """torchtitan's card states its whole-sequence loss for the 0.1 and 0.2 lines (memory_convention_by_version):
    every release of those lines takes it, 0.3 and a 0.20 the chunked loss of the card's own convention."""
    card = framework_card("torchtitan")
    assert [card.convention_for(v) for v in ("0.1.0", "0.2", "0.2.2", "0.3.0", "0.20.0", None)] == \
        ["fsdp2", "fsdp2", "fsdp2", "fsdp2_chunked_loss", "fsdp2_chunked_loss", "fsdp2_chunked_loss"]


@pytest.mark.parametrize(("gbs", "mbs", "dp", "m"), [(256, 2, 8, 16), (256, 4, 8, 8), (7, 2, 2, 1), (4, 4, 4, 1)])
def test_micro_batches_per_step_are_the_global_batch_over_micro_batch_times_dp(gbs, mbs, dp, m):
    assert step_microbatches(gbs, mbs, dp) == m  # at least one, as every reader takes it
    assert Plan(dp=dp, micro_batch_size=mbs).num_microbatches(gbs) == m
