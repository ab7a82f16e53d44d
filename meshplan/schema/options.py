"""The arguments a search or report takes beside the request, one model each: the MCP tools publish them as their
input schema and the CLI checks its --top-k / --max-gpus against the same models, so both faces allow the same values
and refuse the rest in the same words (the CLI ran `recommend --top-k 1000` where recommend_parallelism refused it,
and worded top_k 0 and max_gpus 0 otherwise)."""

from __future__ import annotations

from pydantic import Field

from meshplan.schema.choices import StrictModel
from meshplan.schema.request import MAX_GPUS

MAX_TOP_K = 50  # ranked layouts one answer lists: more is a table no reader compares


class RecommendOptions(StrictModel):
    """recommend_parallelism's argument beside the request (`meshplan recommend --top-k`)."""

    top_k: int = Field(5, ge=1, le=MAX_TOP_K, description="How many ranked layouts to return")


class MinimumGpusOptions(StrictModel):
    """minimum_gpus' argument beside the request (`meshplan min-gpus --max-gpus`)."""

    max_gpus: int | None = Field(None, ge=1, le=MAX_GPUS, description="Largest GPU count to try (default: the search "
                                                                       "card's limit)")


class ReportOptions(StrictModel):
    """render_report's arguments beside the request (`meshplan report --recommend --top-k`)."""

    recommend: bool = Field(False, description="Search first (as recommend_parallelism) and draw the best layout and "
                                               "the candidates")
    top_k: int = Field(5, ge=1, le=MAX_TOP_K, description="With recommend: how many ranked layouts to compare")
