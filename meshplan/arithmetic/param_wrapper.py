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
bench/peft_lora_count_harness.py). meshplan plans no such job (verl's card, read.lora_unmodelled); these say what a
file asking for one would cost.
"""

from __future__ import annotations

from meshplan.arithmetic.lora import Adapted
from meshplan.schema.model import Architecture


def expert_weights(arch: Architecture, index: int) -> list[Adapted]:
    """The routed-expert weights of layer `index` PEFT's ParamWrapper wraps, per expert (none in a dense layer):
    gate_up_proj H -> (2 if gated) x I, whose A is one (the fused weight is one parameter), and down_proj I -> H."""
    if not arch.is_moe_layer(index):
        return []
    assert arch.moe is not None
    h, ffn = arch.hidden_size, arch.moe.expert_ffn_hidden_size
    return [Adapted(target="gate_up_proj", inputs=h, outputs=(2 if arch.gated_mlp else 1) * ffn, expert=True),
            Adapted(target="down_proj", inputs=ffn, outputs=h, expert=True)]


WEIGHTS = ("gate_up_proj", "down_proj")
"""The routed experts' two 3D weights, as transformers 5 names them (the names target_parameters ends with)."""


def param_wrapper_params(arch: Architecture, rank: int, weights: tuple[str, ...] = WEIGHTS) -> int:
    """Adapter parameters of rank-r ParamWrappers on every MoE layer's expert `weights`: r x E x (in + out) each."""
    experts = arch.moe.num_experts if arch.moe is not None else 0
    return sum(experts * w.params(rank) for i in range(arch.num_layers) for w in expert_weights(arch, i)
               if w.target in weights)


def param_wrapper_flops(arch: Architecture, rank: int, weights: tuple[str, ...] = WEIGHTS) -> tuple[float, float]:
    """(FLOPs per token, FLOPs per micro-batch) the ParamWrappers on `weights` add to a LoRA step: the experts' weight
    gradients (2 x in x out per routed token of each of its top-k experts) and the delta's einsum with its two
    gradients (6 x E x r x in x out per weight, whatever the micro-batch's tokens)."""
    per_token = per_batch = 0.0
    for i in range(arch.num_layers):
        for w in expert_weights(arch, i):
            if w.target not in weights:
                continue
            assert arch.moe is not None
            per_token += 2.0 * arch.moe.top_k * w.inputs * w.outputs
            per_batch += 6.0 * arch.moe.num_experts * rank * w.inputs * w.outputs
    return per_token, per_batch
