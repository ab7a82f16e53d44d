"""torch FSDP2's own copies on the compute stream (cards/memory.yaml fsdp2 compute_stream_copies, torch 2.13
_fsdp_param_group.py wait_for_unshard and _fsdp_collectives.py foreach_reduce): over one rank each gather casts
the sharded weight to bf16 and copies it into the unsharded parameter, over more ranks it copies the all-gather
output out; every reduce chunk_cats the bf16 gradients into the reduce_dtype input. Timed unhidden, at the HBM
bandwidth, in other_s (memory_states.fsdp_copy_bytes, sharding_traffic.UnitCopies)."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.memory_states import fsdp_copy_bytes, with_precision
from meshplan.estimate.perf import estimate_throughput, step_terms
from meshplan.knowledge.model_counts import total_params
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

L8B = dict(model="llama-3.1-8b", seq_length=4096, micro_batch_size=1)


def _resolved(framework: str, gpus: int, **extra):
    fields = dict(L8B, num_gpus=gpus, global_batch_size=gpus, **extra)
    if framework in ("verl", "skyrl"):
        fields["zero_stage"] = 3
    return resolve(Request(framework=framework, **fields))


def _copy_bytes(framework: str, gpus: int = 8, **extra):
    job, plan = _resolved(framework, gpus, **extra)
    return fsdp_copy_bytes(*with_precision(job, plan)[1:])


@pytest.mark.parametrize("framework", ["verl", "skyrl", "torchtitan"])
def test_fp32_storage_casts_at_one_rank(framework):
    """fp32 sharded weights: one rank's gather reads 4 and writes 2 (the cast), then copies 2 + 2; more ranks' copy-out
    is 2 + 2; the reduce's chunk_cat reads the bf16 gradient 2 and writes the fp32 input 4."""
    copies = _copy_bytes(framework)
    assert (copies.gather_one_rank, copies.gather, copies.reduce) == (10, 4, 6)


@pytest.mark.parametrize("framework", ["nemo-automodel", "kempnerforge"])
def test_bf16_storage_needs_no_cast(framework):
    """bf16 resident weights: param_dtype equals the storage's and FSDPParam clamps it to None, so no cast."""
    copies = _copy_bytes(framework)
    assert (copies.gather_one_rank, copies.gather, copies.reduce) == (4, 4, 6)


def test_a_bf16_reduce_dtype_copies_into_a_bf16_input():
    assert _copy_bytes("verl", grad_reduce_in_fp32=False).reduce == 4


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge", "deepspeed"])
def test_other_engines_copy_nothing_here(framework):
    extra = {"zero_stage": 3} if framework == "deepspeed" else {}
    assert _copy_bytes(framework, **extra) is None


def test_one_rank_copies_26_bytes_per_parameter_each_step():
    """verl on one GPU: every unit (the root [norm, lm_head] too: output_resharded_at_loss) gathered forward and
    backward at 10 B and reduced at 6 B per parameter, as bench/step_op_census.py counts on the compute stream."""
    job, plan = _resolved("verl", 1)
    t = step_terms(job, plan)
    expected = (2 * 10 + 6) * total_params(job.model) / t.ctx.hbm
    assert t.rows[0].sharding.copies == pytest.approx(expected, rel=1e-9)
    assert t.rows[0].sharding.step_copies == 0.0


def test_more_ranks_copy_out_on_the_compute_stream():
    """torchtitan on 8 GPUs: each resharded unit's copy-out twice (4 B), the output head's once (not resharded), and
    every unit's chunk_cat (6 B); the cast and copy-in run on the all-gather copy-in stream, not counted."""
    job, plan = _resolved("torchtitan", 8)
    t = step_terms(job, plan)
    arch = job.model
    head = arch.vocab_size * arch.hidden_size + arch.hidden_size  # output layer and final norm
    expected = ((2 * 4 + 6) * (total_params(arch) - head) + (4 + 6) * head) / t.ctx.hbm
    assert t.rows[0].sharding.copies == pytest.approx(expected, rel=1e-9)


def test_the_copies_are_in_other_and_in_the_step():
    job, plan = _resolved("verl", 1)
    t = step_terms(job, plan)
    report = estimate_throughput(job, plan)
    assert report.breakdown.other_s == pytest.approx(t.optimizer + t.m * (t.rows[0].launch_bound
                                                                         + t.rows[0].sharding.copies))
    assert t.rows[0].total >= t.rows[0].sharding.copies
