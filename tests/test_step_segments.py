"""DeepSpeed ZeRO-1/2's reduction and step tensors in segments of their own (cards/memory.yaml
optimizer_steps.deepspeed_zero.segments): the reduce bucket, ZeRO-1's contiguous gradient partition and the step's
flat 16-bit and fp32 copies each served from a cached block at least its size or a new segment
(memory_states.step_segment_bytes), and the step moment's reserved peak the backward's plus those
(memory_stage.with_backward_cache)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import memory_card, step_segment_bytes
from meshplan.estimate.memory import memory_terms
from meshplan.estimate.memory_stage import STEP_MOMENT, reserved_bytes, stage_peak
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def segments():
    return memory_card().optimizer_steps["deepspeed_zero"].segments


def bucket() -> float:
    seg = segments()
    return seg.reduce_bucket_elements * seg.reduce_bucket_bytes


def test_the_card_reads_deepspeeds_defaults():
    """reduce_bucket_size 5e8 elements of the 16-bit dtype; ZeRO-1 keeps a 16-bit gradient partition of its own;
    the step's copies are the flat 16-bit partition and its fp32 copy (the deepspeed_zero step's 6 bytes)."""
    seg = segments()
    assert (seg.reduce_bucket_elements, seg.reduce_bucket_bytes) == (500_000_000, 2)
    assert seg.zero_stages == [1, 2] and seg.partition_grad_bytes == {1: 2}
    assert sum(seg.step_copies) == memory_card().optimizer_steps["deepspeed_zero"].bytes


def test_a_partition_larger_than_every_cached_block_takes_a_segment_per_tensor():
    """Stepped 1e9 parameters, largest tensor 1e8 elements: bucket 1e9 B new; ZeRO-1's partition 2e9 B, larger than
    the freed gradient block (2e8 B), new; the flat copy 2e9 and the fp32 copy 4e9 larger than the released bucket,
    new."""
    step = memory_card().optimizer_steps["deepspeed_zero"]
    one = step_segment_bytes(step, stepped=1e9, largest_tensor=1e8, zero_stage=1)
    assert one == pytest.approx(bucket() + 2e9 + 2e9 + 4e9)
    two = step_segment_bytes(step, stepped=1e9, largest_tensor=1e8, zero_stage=2)
    assert one - two == pytest.approx(2e9)  # ZeRO-2's gradients are its partition buffer, counted already


def test_small_copies_are_served_from_the_released_bucket_and_the_freed_gradient():
    """Stepped 1e8: ZeRO-1's partition (2e8 B) fits the freed gradient block of a 2e8-element tensor (4e8 B), the flat
    copy (2e8) the released bucket (1e9), the fp32 copy (4e8) no block left: only the bucket and the fp32 copy are
    new."""
    step = memory_card().optimizer_steps["deepspeed_zero"]
    assert step_segment_bytes(step, stepped=1e8, largest_tensor=2e8, zero_stage=1) == pytest.approx(bucket() + 4e8)


def test_no_segments_at_zero_0_and_3_nor_for_an_in_place_step():
    steps = memory_card().optimizer_steps
    for zero in (0, 3):
        assert step_segment_bytes(steps["deepspeed_zero"], stepped=1e9, largest_tensor=1e8, zero_stage=zero) == 0
    assert step_segment_bytes(steps["fused"], stepped=1e9, largest_tensor=1e8, zero_stage=1) == 0


BLOOM_LIKE = dict(model="bloom-176b", gpu="a100-80gb", framework="deepspeed", num_gpus=384, tp=8, pp=12,
                  global_batch_size=2048, seq_length=2048, recompute="full")


def test_the_step_reserves_the_backward_cache_and_its_own_segments():
    """The reserved peak at ZeRO-1's step is the backward's reserved peak plus the step's own segments, to the byte
    (int rounding apart), and the answer says so."""
    job, plan = resolve(Request(**BLOOM_LIKE, zero_stage=1))
    terms = memory_terms(job, plan, [])
    peak = stage_peak(terms, 0, terms.pipeline.chunks[0])
    backward = max(reserved_bytes(terms, peak.states, o) for o in peak.moments if o.moment != STEP_MOMENT)
    step = peak.moments[-1]
    assert step.moment == STEP_MOMENT and step.segments > bucket()
    assert reserved_bytes(terms, peak.states, step) == pytest.approx(backward + step.segments, abs=4)
    report = api.estimate_memory(Request(**BLOOM_LIKE, zero_stage=1))
    assert report.stages[0].total_bytes == pytest.approx(backward + step.segments, abs=4)
    assert any("segments of their own" in a for a in report.assumptions)


def test_zero_1_peaks_at_its_step_and_zero_0_has_no_segments():
    """ZeRO-1's peak stage peaks at the step (activations freed, their blocks in the reserve); ZeRO-0 (DeepSpeed's
    BF16_Optimizer, no whole-partition step tensors here) has none."""
    one = api.estimate_memory(Request(**BLOOM_LIKE, zero_stage=1)).stages[0]
    assert one.activations_bytes == 0 and one.detail["backward_reserve_at_step"] > 0
    zero = api.estimate_memory(Request(**BLOOM_LIKE, zero_stage=0)).stages[0]
    assert "optimizer_step_segments" not in zero.detail and "backward_reserve_at_step" not in zero.detail
