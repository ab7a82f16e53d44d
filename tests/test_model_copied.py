"""StrictModel.copied (the search's plan copies, search/plans.SearchPlans.plan and space.Layout.copied_plan) is
pydantic's model_copy(update=...) part for part: the field values in their order, the fields set, the extra and
private values (a Job's attached card), each a copy of its own, so changing the copy leaves the original as it was."""

import pytest

from meshplan.request.resolve import resolve
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request

UPDATES = [
    {},
    {"zero_stage": 3, "recompute": "full", "micro_batch_size": 2},  # fields set and unset in the original
    {"tp": 8, "moe_a2a_overlap": True, "recompute_modules": ["mlp"]},
]


def _parts(model) -> tuple:
    return (list(model.__dict__.items()), model.__pydantic_fields_set__, model.__pydantic_extra__,
            model.__pydantic_private__)


@pytest.mark.parametrize("update", UPDATES)
def test_plan_copied_is_model_copy(update):
    plan = Plan(tp=2, pp=4, vpp=2, micro_batch_size=1)
    copied, expected = plan.copied(update), plan.model_copy(update=update)
    assert type(copied) is Plan and copied == expected and _parts(copied) == _parts(expected)
    assert copied.model_dump(exclude_unset=True) == expected.model_dump(exclude_unset=True)
    copied.__pydantic_fields_set__.add("cp")
    assert "cp" not in plan.__pydantic_fields_set__  # a set of its own


def test_job_copied_keeps_its_private_card():
    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=8, gpu="h100"))
    copied, expected = job.copied({"global_batch_size": 512}), job.model_copy(update={"global_batch_size": 512})
    assert _parts(copied) == _parts(expected) and copied.card is job.card
    assert copied.__pydantic_private__ is not job.__pydantic_private__  # a dict of its own
