"""The differs_from_search field on recipe rows: validated, and present where bench/recipes_agreement.py needs it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from meshplan.knowledge.tables import DiffersFromSearch, SizeRow, strategies_card


def test_reason_and_source_must_not_be_empty():
    with pytest.raises(ValidationError, match="reason must not be empty"):
        DiffersFromSearch(reason="  ", source="a paper")
    with pytest.raises(ValidationError, match="source must not be empty"):
        DiffersFromSearch(reason="why", source="")


def test_unknown_keys_are_rejected():
    with pytest.raises(ValidationError):
        DiffersFromSearch(reason="why", source="a paper", note="extra")


def test_size_row_needs_an_example_to_differ():
    row = {"id": "x", "min_params_b": 0, "max_params_b": 1, "gpus": "8", "start": "DP", "layout": {},
           "why": "w", "source": "s", "differs_from_search": {"reason": "r", "source": "s"}}
    with pytest.raises(ValidationError, match="needs an example"):
        SizeRow(**row)


def test_card_rows_with_an_explanation_name_the_cost_model_or_a_source():
    card = strategies_card()
    rows = [*card.moe_by_model, *card.examples, *card.dense_by_size]
    explained = [r for r in rows if r.differs_from_search is not None]
    assert explained, "the card explains at least the recipes the search ranks far below its pick"
    for r in explained:
        assert len(r.differs_from_search.reason.split()) >= 20, r.id
