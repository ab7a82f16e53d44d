"""What Hugging Face PEFT's LoRA on the routed experts' 3D weights costs (verl's model.target_parameters).

transformers 5 keeps a MoE layer's routed experts as two nn.Parameter tensors, gate_up_proj (E x 2I x H, gated) and
down_proj (E x H x I) (models/qwen3_moe Qwen3MoeExperts and the other MoE families). PEFT 0.18.1 wraps each one that
target_parameters names in a ParamWrapper (tuners/lora/layer.py): lora_A an nn.Linear(in, r * E) and lora_B an
nn.Linear(r * E, out), r x E x (in + out) parameters, the count of one rank-r adapter per expert. Its forward never
applies them to the tokens: _activate_lora computes the delta of every expert, einsum('o r e, e r i -> e i o'), a
tensor the size of the weight, and parametrizes the weight as W + delta for the experts' own forward. So each
micro-batch runs that einsum and its two gradients (6 E r in out FLOPs per weight) and, the weight now needing a
gradient, the experts' weight-gradient GEMMs a frozen base skips (2 FLOPs per weight element per routed token).
Measured on a tiny Qwen3-MoE with torch's FlopCounterMode (tests/test_lora_targets.py,
bench/peft_lora_count_harness.py). A LoRA job's LoraSpec.target_parameters (the request's lora_target_parameters)
names the wrapped weights; arithmetic/lora.py counts their adapters, estimate/lora_gemms.py times them, and
arithmetic/activations.py holds each forward's W + delta until the backward.
"""

from __future__ import annotations

from typing import NamedTuple, get_args

from meshplan.arithmetic.activations import BF16
from meshplan.schema.choices import ExpertWeight
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job


class WrappedWeight(NamedTuple):
    """One routed-expert 3D weight of a layer, per expert: `name` as target_parameters ends with it, in -> out."""

    name: str
    inputs: int
    outputs: int

    def params(self, rank: int, experts: int) -> int:
        """lora_A nn.Linear(in, r x E) and lora_B nn.Linear(r x E, out): r x E x (in + out)."""
        return rank * experts * (self.inputs + self.outputs)


def expert_weights(arch: Architecture, index: int) -> list[WrappedWeight]:
    """The routed-expert weights of layer `index` PEFT's ParamWrapper can wrap, per expert (none in a dense layer):
    gate_up_proj H -> (2 if gated) x I (the fused weight is one parameter, so one A) and down_proj I -> H."""
    if not arch.is_moe_layer(index):
        return []
    assert arch.moe is not None
    h, ffn = arch.hidden_size, arch.moe.expert_ffn_hidden_size
    return [WrappedWeight("gate_up_proj", h, (2 if arch.gated_mlp else 1) * ffn), WrappedWeight("down_proj", ffn, h)]


def wrapped(arch: Architecture, index: int, weights: list[str] | tuple[str, ...]) -> list[WrappedWeight]:
    """The weights of layer `index` that `weights` (LoraSpec.target_parameters) wrap."""
    return [w for w in expert_weights(arch, index) if w.name in weights]


WEIGHTS: tuple[str, ...] = get_args(ExpertWeight)
"""The routed experts' two 3D weights, as transformers 5 names them (the names target_parameters ends with)."""


def layer_delta_elements(arch: Architecture, index: int, weights: list[str] | tuple[str, ...]) -> int:
    """Elements of the deltas (and of the W + delta tensors) layer `index`'s ParamWrappers build each forward: every
    expert's wrapped weight whole, E x in x out each."""
    experts = arch.moe.num_experts if arch.moe is not None else 0
    return sum(experts * w.inputs * w.outputs for w in wrapped(arch, index, weights))


def param_wrapper_params(arch: Architecture, rank: int, weights: tuple[str, ...] = WEIGHTS) -> int:
    """Adapter parameters of rank-r ParamWrappers on every MoE layer's expert `weights`: r x E x (in + out) each."""
    experts = arch.moe.num_experts if arch.moe is not None else 0
    return sum(w.params(rank, experts) for i in range(arch.num_layers) for w in wrapped(arch, i, weights))


def param_wrapper_flops(arch: Architecture, rank: int, weights: tuple[str, ...] = WEIGHTS) -> tuple[float, float]:
    """(FLOPs per token, FLOPs per micro-batch) the ParamWrappers on `weights` add to a LoRA step: the experts' weight
    gradients (2 x in x out per routed token of each of its top-k experts) and the delta's einsum with its two
    gradients (6 x E x r x in x out per weight, whatever the micro-batch's tokens)."""
    per_token = per_batch = 0.0
    for i in range(arch.num_layers):
        for w in wrapped(arch, i, weights):
            assert arch.moe is not None
            per_token += 2.0 * arch.moe.top_k * w.inputs * w.outputs
            per_batch += 6.0 * arch.moe.num_experts * rank * w.inputs * w.outputs
    return per_token, per_batch


def param_wrapper_step_flops(job: Job, micro_batch_size: int, cp: int) -> float:
    """The step's FLOPs of the job's ParamWrapper deltas (LoraSpec.target_parameters): their einsum and its two
    gradients once per micro-batch on every rank that runs one (each of a micro-batch's cp ranks builds the whole
    delta), global_batch_size / micro_batch_size micro-batches in all."""
    if job.lora is None or not job.lora.target_parameters:
        return 0.0
    per_batch = param_wrapper_flops(job.model, job.lora.rank, tuple(job.lora.target_parameters))[1]
    return per_batch * job.global_batch_size / micro_batch_size * cp


DELTA_PASSES = 7
"""Weight-sized bf16 passes over memory of one wrapped weight per micro-batch beside the einsum (peft tuners/lora/
layer.py ParamWrapper): get_delta_weight scales the einsum's output (read + write: 2), the parametrization's forward
writes W + delta (reads both, writes one: 3), and the backward scales the delta's gradient (read + write: 2); the
gradient through the sum reaches the delta as it is."""


def delta_pass_bytes(arch: Architecture, index: int, weights: list[str] | tuple[str, ...], ep: int, etp: int) -> float:
    """Bytes layer `index`'s ParamWrappers pass over memory per micro-batch beside their einsum (DELTA_PASSES), the
    local experts' weights over etp."""
    return DELTA_PASSES * BF16 * layer_delta_elements(arch, index, weights) / ep / etp
