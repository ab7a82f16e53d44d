"""optimizer=muon: one fp32 momentum instead of Adam's two moments on the decoder's 2-D matrices (4 + 4 B/param
with the fp32 master, not 4 + 8); the embedding, output layer and norms stay on Adam (cards/memory.yaml optimizers)."""

import pytest

from meshplan.estimate.memory import estimate_memory
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

# Llama-3.1-8B's decoder matrices, by hand: per layer q, o (h*h each), k, v (h*kv_heads*head_dim each) and
# gate, up, down (h*ffn each); 32 layers, no biases.
H, KV, FFN, LAYERS = 4096, 8 * 128, 14336, 32
MATRICES = LAYERS * (2 * H * H + 2 * H * KV + 3 * H * FFN)


def _optimizer_bytes(**fields) -> float:
    job, plan = resolve(Request(model="llama-3.1-8b", framework="megatron-core", global_batch_size=64, **fields))
    return estimate_memory(job, plan).stages[0].optimizer_bytes


@pytest.mark.parametrize("fields,shard", [
    (dict(num_gpus=8, zero_stage=0), 1),   # every rank keeps every matrix's moments
    (dict(num_gpus=8, zero_stage=1), 8),   # the layer-wise distributed optimizer: sharded over dp=8
    (dict(num_gpus=8, tp=2, zero_stage=1), 2 * 4),  # tp=2 halves each matrix, dp=4 shards the rest
])
def test_muon_drops_one_fp32_moment_on_the_decoder_matrices(fields, shard):
    adam = _optimizer_bytes(**fields)
    muon = _optimizer_bytes(optimizer="muon", **fields)
    assert adam - muon == pytest.approx(4 * MATRICES / shard, rel=1e-9)


def test_embedding_output_layer_and_norms_stay_on_adam():
    """With one stage and no sharding, Adam keeps 12 B on every parameter and Muon 8 B on the matrices only: the
    untied embedding and output layer (2 * vocab * h) and the norms (2 per layer + the final one) keep 12 B."""
    others = 2 * 128256 * H + (2 * LAYERS + 1) * H
    assert _optimizer_bytes(num_gpus=8, zero_stage=0) == pytest.approx(12 * (MATRICES + others), rel=1e-9)
    assert _optimizer_bytes(num_gpus=8, zero_stage=0, optimizer="muon") == pytest.approx(
        8 * MATRICES + 12 * others, rel=1e-9)


def test_adam_left_out_is_adam():
    assert _optimizer_bytes(num_gpus=8, zero_stage=0) == _optimizer_bytes(num_gpus=8, zero_stage=0,
                                                                          optimizer="adam")
