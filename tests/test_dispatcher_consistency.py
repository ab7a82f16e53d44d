"""The flex MoE dispatcher: the search, the rules and the adapters agree on which frameworks have it (the framework
card's adapter section is its one home: FrameworkCard.flex_dispatcher)."""

from __future__ import annotations

import pytest

from meshplan.adapters.render import TARGETS, render
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def _case(framework: str, dispatcher: str):
    # DeepSpeed's config cannot carry EP at all, so its MoE case keeps ep=1 and only names the dispatcher.
    ep = 1 if framework == "deepspeed" else 8
    return resolve(Request(model="mixtral-8x7b", num_gpus=16, ep=ep, etp=1, framework=framework,
                           global_batch_size=64, moe_token_dispatcher=dispatcher))


@pytest.mark.parametrize("framework", sorted(TARGETS))
def test_card_flex_flag_matches_the_rules_and_what_the_adapter_renders(framework):
    render(framework, *_case(framework, "alltoall"))  # the same plan with the plain all-to-all renders
    job, plan = _case(framework, "flex")
    flagged = "EP007" in {f.id for f in check_config(job, plan, include_memory=False).findings}
    try:
        render(framework, job, plan)
        rendered, why = True, ""
    except MeshplanError as exc:
        rendered, why = False, str(exc)
    if framework_card(framework).flex_dispatcher:
        assert not flagged and rendered, framework
    else:
        assert flagged and not rendered, framework
        assert "moe_token_dispatcher=flex" in why, why
