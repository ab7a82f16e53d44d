"""Muon's memory on one stage's GPU: the optimizer bytes it does not keep beside Adam's two moments, on the matrices
that take it, and what its step allocates while it orthogonalizes the largest of them, as the framework card's muon
section runs it (meshplan/arithmetic/muon.py). Apart from memory_stage.py, which adds them to the stage's states and
the step's moment."""

from __future__ import annotations

from meshplan.arithmetic.flops import Shard
from meshplan.arithmetic.memory_states import muon_saved_bytes
from meshplan.arithmetic.muon import matrix_params, step_working_bytes
from meshplan.estimate.memory_terms import MemoryTerms, StageParams


def muon_step_bytes(terms: MemoryTerms, params: StageParams) -> float:
    """What Muon's step allocates while it orthogonalizes the stage's largest matrix (muon.step_working_bytes, as
    the framework card's muon section runs it); 0 under Adam. The Adam-stepped rest (embedding, output layer, norms)
    is stepped in place by the fused Adam beside it."""
    muon = terms.job.card.muon
    if terms.plan.optimizer != "muon" or muon is None or not params.layers:
        return 0.0
    kinds = [bool(terms.table.moe[i]) for i in params.layers]
    groups = (terms.dense_dp, terms.expert_dp) if terms.optimizer_sharded else (1, 1)
    return step_working_bytes(terms.job.model, _muon_shard(terms), kinds, muon, terms.card.muon_step[muon.step],
                              *groups)


def _muon_shard(terms: MemoryTerms) -> Shard:
    """The TP/EP cut Muon's matrices are read at (their token count is never read)."""
    plan = terms.plan
    return Shard(1, plan.tp, plan.ep, plan.etp, plan.sequence_parallel, terms.job.card.moe_whole_over_tp)


def muon_saved(terms: MemoryTerms, params: StageParams) -> float:
    """Optimizer bytes Muon does not keep on this stage's GPU (memory_states.muon_saved_bytes over the matrices that
    take it, each sharded as the moments are): the decoder's (and MTP's) linear weights where the card sets no
    max_aspect_ratio (Megatron-Core: the embedding and output layer on Adam), else the matrices and, small-vocabulary,
    the embedding and output layer that pass it (muon.matrix_params: KempnerForge's _is_muon_eligible)."""
    plan, tensors, muon = terms.plan, terms.tensors, terms.job.card.muon
    experts = params.experts
    if muon is None or muon.max_aspect_ratio is None:
        return (muon_saved_bytes(plan, tensors, params.linear - params.head - experts, terms.dense_dp)
                + muon_saved_bytes(plan, tensors, experts, terms.expert_dp))
    kinds = [bool(terms.table.moe[i]) for i in params.layers]
    vocab = (params.embedding if params.first else 0.0, params.head if params.last else 0.0)
    dense, routed = matrix_params(terms.job.model, _muon_shard(terms), kinds, muon, vocab)
    return muon_saved_bytes(plan, tensors, dense, terms.dense_dp) + muon_saved_bytes(plan, tensors, routed,
                                                                                     terms.expert_dp)
