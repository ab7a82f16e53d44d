"""Which parameters a rank holds is one function (estimate/memory_terms.py RankParts, from the framework card's
facts), read by the memory's stage states and by the time's optimizer step, DP term and FSDP units. KempnerForge keeps
its embedding whole over TP (the convention's embedding_over_tp), its output head whole without sequence parallelism
(output_head_tp) and its MoE block's shared experts whole (moe_whole_over_tp): its FSDP traffic and optimizer step
used to divide all three by tp while its memory kept them whole."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.estimate.perf import step_terms
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CASES = [
    dict(framework="kempnerforge", model="deepseek-v2-lite", tp=2, pp=1, sequence_parallel=False),  # shared experts
    dict(framework="kempnerforge", model="llama-3-70b", tp=4, pp=4, gpus_per_node=4),  # PP: no SP, the head whole
    dict(framework="torchtitan", model="llama-3.1-8b", tp=2, pp=2),
    dict(framework="megatron-core", model="deepseek-v2-lite", tp=2, pp=2, ep=2, first_stage_layers=14),
]


@pytest.mark.parametrize("fields", CASES, ids=lambda f: f"{f['framework']}-{f['model']}")
def test_time_and_memory_hold_the_same_parameters(fields):
    req = Request(gpu="h200", num_gpus=32, seq_length=2048, global_batch_size=32, micro_batch_size=1,
                  recompute="full", **fields)
    rows = step_terms(*resolve(req)).rows
    stages = api.estimate_memory(req).stages
    assert len(rows) == len(stages)
    for row, stage in zip(rows, stages, strict=True):
        # both read the vocabulary the framework builds (memory_states.built_vocab: Megatron's padded)
        assert int(row.dense_params + row.expert_params) == pytest.approx(stage.detail["params_on_gpu"], rel=1e-6)


def test_kempnerforge_moves_its_whole_embedding_head_and_shared_experts():
    """TP2 without SP: the first stage's embedding, the head and the shared experts are whole on each TP rank, so
    the time's rank holds more than the TP half of them."""
    job, plan = resolve(Request(framework="kempnerforge", model="deepseek-v2-lite", gpu="h200", num_gpus=8, tp=2,
                                sequence_parallel=False, seq_length=2048, global_batch_size=8, micro_batch_size=1))
    parts = step_terms(job, plan).inputs.parts
    arch = job.model
    assert parts.embedding == arch.vocab_size * arch.hidden_size  # whole over TP
    assert parts.head == arch.vocab_size * arch.hidden_size  # whole without SP
    moe = next(i for i in range(arch.num_layers) if arch.is_moe_layer(i))
    titan_job, titan_plan = resolve(Request(framework="torchtitan", model="deepseek-v2-lite", gpu="h200", num_gpus=8,
                                            tp=2, seq_length=2048, global_batch_size=8, micro_batch_size=1))
    titan = step_terms(titan_job, titan_plan).inputs.parts
    assert parts.layer(moe)[0] > titan.layer(moe)[0]  # the shared experts whole, not / tp
