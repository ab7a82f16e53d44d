"""The memory-bound bytes each framework's FFN activation (and Megatron-Core's routed-expert bias) moves, forward
and backward, counted op by op on a CPU: the source of cards/calibration.yaml activation_passes.

Runs INSIDE the HF venv of bench/fake_tensor_hf.py (torch 2.13.0 CPU + transformers 5.9.0); meshplan never imports
it. Each implementation runs on real bf16 tensors of `ROWS` rows and an activation width of `WIDTH` under a
TorchDispatchMode that logs every aten op's tensor reads and writes (views and allocations left out, as
bench/step_op_census_harness.py does; a boolean mask at its 1 byte). A function Megatron-Core compiles
(megatron/core/jit.py jit_fuser = torch.compile on torch >= 2.2) or a block torch.compile fuses is one kernel: a
stand-in reads each input once and writes each output once, forward and backward. The backward is driven by a
gradient of ones on the output; the leaf's own gradient buffer is not counted (that is the caller's GEMM's).

Implementations (the code each framework runs; Megatron-Core and torchtitan are not in this venv, so their few eager
lines are copied here verbatim, with the file and commit):
- `fused_functions` (Megatron-Core core_r0.15 0d8e0714 / core_r0.16 b0cc2706, what Megatron-Bridge v0.2.0 / v0.3.0
  pin): megatron/core/transformer/mlp.py MLP.forward and moe/experts.py TEGroupedMLP.forward's bias_act_func.
- `unfused_functions`: the same Megatron-Core release with bias_activation_fusion off (TransformerConfig's default;
  Megatron-Bridge v0.2.0 / v0.3.0's Qwen, Mistral, OLMoE, Nemotron and Gemma providers leave it there): MLP.forward's
  and bias_act_func's glu(), the activation function eager (F.silu, F.gelu) or compiled (quick_gelu, fast_gelu,
  squared_relu: @jit_fuser), then the routed experts' `* permuted_probs` and `.to(original_dtype)` apart
  (`routed_weighting`).
- `compiled`: a torch.compile'd block or activation (torchtitan and KempnerForge with compile on, NeMo AutoModel's
  @torch.compile'd experts' activation): one kernel, gated (gpt-oss's clamped GLU as torchtitan writes it) or not.
- `eager`: the same math as separate PyTorch kernels (torchtitan/KempnerForge with compile off): torchtitan's
  FeedForward (w2(F.silu(w1(x)) * w3(x))) and models/gpt_oss/model/moe.py swiglu (v0.2.2).
- `rotary`: Megatron-Core's unfused RoPE (rope_utils.py _apply_rotary_pos_emb_bshd, core_v0.16.0 3bec9aa9) per
  rotated query or key element, which gpt-oss's YaRN runs (cards/calibration.yaml unfused_rope_passes).
- `hf_eager`: transformers 5.9.0's own code: ACT2FN[hidden_act](gate) * up (LlamaMLP) or ACT2FN[hidden_act](x)
  (GPT2MLP, NemotronMLP), and GptOssExperts._apply_gate.

    python activation_census_harness.py       # prints one line: RESULT {...}
"""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers.activations import ACT2FN
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

ROWS = 64
WIDTH = 1024
HIDDEN = 1024
QUIET = [False]  # set while a compiled stand-in's math runs: Fused charges its one kernel instead
NO_KERNEL = {"detach", "alias", "_unsafe_view", "lift_fresh", "empty", "empty_strided", "new_empty",
             "new_empty_strided", "set_", "_to_copy_scalar"}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class Census(TorchDispatchMode):
    """Bytes read and written by every kernel-launching aten op while on."""

    def __init__(self):
        super().__init__()
        self.read = self.written = 0
        self.ops: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if QUIET[0] or func.is_view or name in NO_KERNEL or func.namespace == "prim":
            return out
        ins, _ = tree_flatten((args, kwargs))
        outs, _ = tree_flatten(out)
        if name == "_local_scalar_dense":
            return out
        read, written = _bytes(ins), _bytes(outs)
        if name in ("copy_", "fill_", "zero_"):  # the destination is written, not read
            dst, _ = tree_flatten(args[0])
            read -= _bytes(dst)
        self.read += read
        self.written += written
        self.ops.append((name, read, written))
        return out


class Fused(torch.autograd.Function):
    """A compiled function as one kernel: forward reads its inputs once and writes its output once; backward reads
    the output's gradient and the saved inputs once and writes the inputs' gradients once. The math runs with the
    census off; the census is charged the bytes of one kernel."""

    census: Census | None = None

    @staticmethod
    def forward(ctx, fn, *inputs):
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        QUIET[0] = True
        try:
            with torch.no_grad():
                out = fn(*inputs)
        finally:
            QUIET[0] = False
        Fused.charge(inputs, (out,))
        return out

    @staticmethod
    def backward(ctx, grad):
        inputs = ctx.saved_tensors
        QUIET[0] = True
        try:
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
                out = ctx.fn(*leaves)
                grads = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], grad, allow_unused=True)
        finally:
            QUIET[0] = False
        grads = list(grads)
        full = [grads.pop(0) if t.requires_grad else None for t in leaves]
        Fused.charge((grad, *inputs), [g for g in full if g is not None])
        return (None, *full)

    @staticmethod
    def charge(ins, outs) -> None:
        census = Fused.census
        if census is not None:
            census.read += _bytes(ins)
            census.written += _bytes(outs)
            census.ops.append(("fused", _bytes(ins), _bytes(outs)))


def fused(fn, *inputs):
    """`fn` run as one compiled kernel (see Fused)."""
    return Fused.apply(fn, *inputs)


# -- Megatron-Core (core_r0.15 0d8e0714, core_r0.16 b0cc2706) -------------------------------------------------

def quick_geglu(y, linear_offset):  # megatron/core/fusions/fused_bias_geglu.py quick_geglu, @jit_fuser
    y_1, y_2 = torch.chunk(y, 2, dim=-1)
    return y_1 * torch.sigmoid(1.702 * y_1) * (y_2 + linear_offset)


def weighted_quick_geglu(y, weights, linear_offset):  # fused_bias_geglu.py weighted_quick_geglu, @jit_fuser
    return (quick_geglu(y, linear_offset) * weights).to(y.dtype)


def megatron_clamped_glu(x, probs):
    """fused_bias_geglu.py weighted_bias_quick_geglu_impl with clamp_value 7.0 and linear_offset 1.0 (what
    TEGroupedMLP.bias_act_func runs for gpt-oss under bias_activation_fusion; fc1's bias is added by TE's
    GroupedLinear, skip_bias_add=False, so bias is None): the clamps and the cat are eager, outside the compiled
    WeightedQuickGeGLUFunction, which saves the cat's output."""
    clamp_value = 7.0
    x_glu, x_linear = x.chunk(2, -1)
    x = torch.cat((x_glu.clamp(min=None, max=clamp_value), x_linear.clamp(min=-clamp_value, max=clamp_value)), -1)
    x = x.view(-1, x.shape[-1])
    offset = 1.0
    return fused(lambda y, w: weighted_quick_geglu(y, w, offset), x, probs)


def megatron_swiglu(x, probs):
    """fusions/fused_bias_swiglu.py weighted_bias_swiglu_impl (MoE) / bias_swiglu_impl (MLP): one compiled kernel."""
    def swiglu(y, w):
        a, b = torch.chunk(y, 2, -1)
        return (F.silu(a) * b * w).to(y.dtype)
    return fused(swiglu, x, probs)


def megatron_geglu(x):
    """fusions/fused_bias_geglu.py bias_geglu_impl (GeGLUFunction: geglu / geglu_back, @jit_fuser)."""
    def geglu(y):
        a, b = torch.chunk(y, 2, -1)
        return F.gelu(a, approximate="tanh") * b
    return fused(geglu, x)


def compiled_glu(x):
    """A torch.compile'd block's gated activation, the clamped one included: one kernel each way."""
    return fused(torchtitan_swiglu, x)


def compiled_plain(x):
    """A torch.compile'd block's plain activation: one kernel each way."""
    return fused(lambda y: F.gelu(y, approximate="tanh"), x)


def megatron_gelu(x):
    """fusions/fused_bias_gelu.py bias_gelu_impl (GeLUFunction: bias_gelu / bias_gelu_back, @jit_fuser)."""
    return fused(lambda y: F.gelu(y, approximate="tanh"), x)


def megatron_squared_relu(x):
    """megatron/core/activations.py squared_relu (@jit_fuser: torch.pow(F.relu(x), 2)), MLP.forward's plain path."""
    return fused(lambda y: torch.pow(F.relu(y), 2), x)


def megatron_gated_unfused(x):
    """MLP.forward's glu() when bias_activation_fusion cannot take the activation (Megatron-Bridge's Gemma 2:
    activation_func fast_gelu, megatron/core/activations.py @jit_fuser): chunk, the compiled activation on the gate,
    the eager `x_linear + glu_linear_offset` (0.0 by default, still a kernel) and the eager product."""
    x_glu, x_linear = torch.chunk(x, 2, dim=-1)
    act = fused(lambda y: 0.5 * y * (1.0 + torch.tanh(y * 0.7978845608 * (1.0 + 0.044715 * y * y))), x_glu)
    return act * (x_linear + 0.0)


def megatron_expert_bias(t, bias, probs, splits):
    """moe/experts.py TEGroupedMLP._apply_bias (fc2's bias, skip_bias_add=True): per local expert t + b * p, cat,
    cast; over the routed copies x hidden."""
    shape = t.shape
    return (torch.cat([a + b * p for a, b, p in zip(torch.split(t.view(-1, shape[-1]), splits), bias,
                                                     torch.split(probs, splits), strict=True)])
            .view(shape).to(t.dtype))


def megatron_glu_unfused(act, clamp_value=None, linear_offset=0.0):
    """MLP.forward's glu() (and TEGroupedMLP bias_act_func's) with bias_activation_fusion off, Megatron-Core
    core_v0.16.0 3bec9aa9 megatron/core/transformer/mlp.py: chunk, gpt-oss's two clamps where a clamp value is set,
    the activation function on the gate, the eager `x_linear + glu_linear_offset` (0.0 by default, still a kernel)
    and the eager product."""
    def run(x):
        x_glu, x_linear = torch.chunk(x, 2, dim=-1)
        if clamp_value is not None:
            x_glu = x_glu.clamp(min=None, max=clamp_value)
            x_linear = x_linear.clamp(min=-clamp_value, max=clamp_value)
        return act(x_glu) * (x_linear + linear_offset)
    return run


def compiled_act(fn):
    """An activation function Megatron-Core decorates with @jit_fuser: one kernel."""
    return lambda y: fused(fn, y)


def megatron_routed_weighting(x, probs):
    """moe/experts.py TEGroupedMLP bias_act_func's unfused tail (core_v0.16.0): the activation's output times the
    permuted routing probabilities, cast back to its dtype (bf16 probs: a no-op cast)."""
    original_dtype = x.dtype
    return (x * probs).to(original_dtype)


def megatron_rotate_half(x):  # megatron/core/models/common/embeddings/rope_utils.py _rotate_half, not interleaved
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def megatron_rope_unfused(t, freqs, mscale):
    """rope_utils.py _apply_rotary_pos_emb_bshd (core_v0.16.0 3bec9aa9), what apply_rotary_pos_emb runs where it
    does not take TE's fused kernel (apply_rope_fusion off, or a YaRN concentration factor mscale != 1), not MLA."""
    rot_dim = freqs.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos_ = (torch.cos(freqs) * mscale).to(t.dtype)
    sin_ = (torch.sin(freqs) * mscale).to(t.dtype)
    t = (t * cos_) + (megatron_rotate_half(t) * sin_)
    return torch.cat((t, t_pass), dim=-1)


def rope_count(seq: int = 64, batch: int = 4, heads: int = 64, head_dim: int = 64) -> dict:
    """Bytes per rotated element (seq x batch x heads x head_dim) of Megatron-Core's unfused RoPE on bf16 queries,
    forward and backward; its cos / sin of the [seq, 1, 1, head_dim] frequencies (1 / (batch x heads) of a pass
    each) left in, a few thousandths of a pass."""
    torch.manual_seed(0)
    t = torch.randn(seq, batch, heads, head_dim).to(torch.bfloat16).requires_grad_()
    freqs = torch.randn(seq, 1, 1, head_dim)
    mscale = 0.1 * math.log(32.0) + 1.0  # gpt-oss's YaRN factor 32, no mscale given: _yarn_get_mscale(32)
    return forward_and_backward(Census(), lambda: megatron_rope_unfused(t, freqs, mscale),
                                seq * batch * heads * head_dim)


# -- torchtitan (v0.2.2) ------------------------------------------------------------------------------------------

def torchtitan_swiglu(x, alpha: float = 1.702, limit: float = 7.0):  # models/gpt_oss/model/moe.py swiglu
    x_glu, x_linear = x[..., ::2], x[..., 1::2]
    x_glu = x_glu.clamp(min=None, max=limit)
    x_linear = x_linear.clamp(min=-limit, max=limit)
    out_glu = x_glu * torch.sigmoid(alpha * x_glu)
    return out_glu * (x_linear + 1)


def eager_glu(act):
    def run(x):
        gate, up = torch.chunk(x, 2, dim=-1)  # torchtitan's w1 and w3 outputs: two GEMM outputs
        return act(gate) * up
    return run


def two_outputs(x):
    """A gated FFN's gate and up as two separate tensors (two GEMMs' outputs), not a view of one."""
    gate, up = torch.chunk(x.detach(), 2, dim=-1)
    return gate.contiguous().requires_grad_(), up.contiguous().requires_grad_()


def forward_and_backward(census: Census, forward, per: int) -> dict:
    """Bytes per element (`per` elements) of `forward()` under `census`, then of its backward from a gradient of ones
    (made outside the census), with each pass's aten ops."""
    with census:
        out = forward()
    fwd, fwd_ops = census.read + census.written, list(census.ops)
    census.read = census.written = 0
    census.ops = []
    grad = torch.ones_like(out)
    with census:
        out.backward(grad)
    return {"forward": fwd / per, "backward": (census.read + census.written) / per, "forward_ops": fwd_ops,
            "backward_ops": list(census.ops)}


def count(run, gated: bool, width: int = WIDTH, probs: bool = False) -> dict:
    """Bytes per row per activation-output element of one forward and one backward of `run`."""
    torch.manual_seed(0)
    cols = 2 * width if gated else width
    x = (torch.randn(ROWS, cols) * 4).to(torch.bfloat16).requires_grad_()
    extra = [torch.rand(ROWS, 1).to(torch.bfloat16).requires_grad_()] if probs else []
    census = Census()
    Fused.census = census
    counted = forward_and_backward(census, lambda: run(x, *extra), ROWS * width)
    Fused.census = None
    return counted


def count_split(act, width: int = WIDTH) -> dict:
    """An HF/torchtitan gated MLP: act(gate) * up with gate and up two GEMM outputs."""
    torch.manual_seed(0)
    gate = (torch.randn(ROWS, width) * 4).to(torch.bfloat16).requires_grad_()
    up = (torch.randn(ROWS, width) * 4).to(torch.bfloat16).requires_grad_()
    return forward_and_backward(Census(), lambda: act(gate) * up, ROWS * width)


def expert_bias_count(experts: int = 4) -> dict:
    """Megatron-Core's _apply_bias per routed copy and hidden element."""
    torch.manual_seed(0)
    t = torch.randn(ROWS, HIDDEN).to(torch.bfloat16).requires_grad_()
    bias = [torch.randn(HIDDEN).to(torch.bfloat16).requires_grad_() for _ in range(experts)]
    probs = torch.rand(ROWS, 1).to(torch.bfloat16).requires_grad_()
    splits = [ROWS // experts] * experts
    return forward_and_backward(Census(), lambda: megatron_expert_bias(t, bias, probs, splits), ROWS * HIDDEN)


def main() -> None:
    gpt_oss = GptOssExperts.__new__(GptOssExperts)
    gpt_oss.alpha, gpt_oss.limit = 1.702, 7.0
    result = {
        "fused_functions": {
            "glu_silu": count(megatron_swiglu, True, probs=True),
            "clamped_glu": count(megatron_clamped_glu, True, probs=True),
            "glu_gelu": count(megatron_geglu, True),
            "glu_gelu_pytorch_tanh": count(megatron_gated_unfused, True),
            "gelu": count(megatron_gelu, False),
            "relu2": count(megatron_squared_relu, False),
        },
        "unfused_functions": {
            "glu_silu": count(megatron_glu_unfused(F.silu), True),
            "glu_gelu": count(megatron_glu_unfused(F.gelu), True),
            "glu_gelu_pytorch_tanh": count(megatron_gated_unfused, True),
            "clamped_glu": count(megatron_glu_unfused(compiled_act(lambda y: y * torch.sigmoid(1.702 * y)), 7.0, 1.0),
                                 True),
            "gelu": count(F.gelu, False),
            "relu2": count(megatron_squared_relu, False),
        },
        "routed_weighting": {"unfused_functions": count(megatron_routed_weighting, False, probs=True)},
        "compiled": {
            "clamped_glu": count(compiled_glu, True),
            "gelu": count(compiled_plain, False),
        },
        "eager": {
            "glu_silu": count_split(F.silu),
            "clamped_glu": count(torchtitan_swiglu, True),
        },
        "hf_eager": {
            "glu_silu": count_split(ACT2FN["silu"]),
            "glu_gelu_pytorch_tanh": count_split(ACT2FN["gelu_pytorch_tanh"]),
            "clamped_glu": count(gpt_oss._apply_gate, True),
            **{name: count(ACT2FN[name], False) for name in ("gelu", "gelu_new", "gelu_fast", "relu2")},
        },
        "expert_bias": {"fused_functions": expert_bias_count()},
        "rotary": {"unfused_functions": rope_count()},
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
