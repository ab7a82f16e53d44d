"""Evidence for two torchtitan memory facts in cards/memory.yaml (fsdp2 conventions), run on the CPU.

1. `sac`: what torchtitan's op-level SAC policy sees and keeps for a SwiGLU FFN of torchao Float8Linear layers,
   under the save lists of the 2024-12 tree (9dec370: mm, SDPA, reduce_scatter, abs, max), the 2025-06 tree
   (e7c0cae: the same without abs) and 0.3.0 (torch's compute_intensive_ops, which name _scaled_mm, + max). The
   matmul reaches the policy as aten.mm on Float8TrainingTensor arguments (the subclass runs _scaled_mm below the
   SAC mode), so the kept mm outputs are bf16's; the 2024-12 list also keeps |x| of every fp8 cast in eager.
   `sac tensorwise compile`: the same FFN under torch.compile (fullgraph, the aot_eager backend: AOTAutograd's
   tracing, where the policy runs, without inductor's C++ build), as torchtitan compiles each checkpointed block:
   the policy still sees aten.mm on Float8TrainingTensor, so under compile too every second fp8 mm is recomputed
   (the step time's recompute.op_sac_recomputed; torch 2.13 + torchao 0.18 on the CPU).
2. `loss`: the peak bytes per logit of torchtitan <= 0.2's whole-sequence loss (train.py: pred = model(...);
   loss = cross_entropy(pred.flatten(0, 1).float(), labels); del pred; loss.backward()), counted with
   torch.distributed._tools.mem_tracker.MemTracker: 12 (saved fp32 log-softmax 4 + two fp32 gradients 4 + 4).

Needs the torch venv of bench/fake_tensor_harness.py and, for `sac`, a torchao source tree (e.g.
`git -C <pytorch/ao clone> archive <rev> torchao | tar -x -C DIR`); meshplan never imports this.

Run: <venv>/bin/python bench/torchao_fp8_probe.py loss
     PYTHONPATH=DIR <venv>/bin/python bench/torchao_fp8_probe.py sac [tensorwise|rowwise] [compile]
"""

from __future__ import annotations

import sys
from collections import defaultdict


def sac(recipe: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    aten = torch.ops.aten
    sdpa = {aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention.default}
    lists = {
        "2024-12": {aten.mm.default, *sdpa, torch.ops._c10d_functional.reduce_scatter_tensor.default,
                    aten.abs.default, aten.max.default},
        "2025-06": {aten.mm.default, *sdpa, torch.ops._c10d_functional.reduce_scatter_tensor.default,
                    aten.max.default},
        "0.3.0": {getattr(op, "default", op) for op in get_default_op_list().compute_intensive_ops}
        | {aten.max.default},
    }

    class FeedForward(nn.Module):  # torchtitan's: w2(silu(w1(x)) * w3(x))
        def __init__(self, h: int, f: int) -> None:
            super().__init__()
            self.w1, self.w2, self.w3 = (nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False),
                                         nn.Linear(h, f, bias=False))

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def run(save: set, fp8: bool) -> list[tuple[str, str, tuple]]:
        torch.manual_seed(0)
        model = FeedForward(64, 128).to(torch.bfloat16)
        if fp8:
            base = Float8LinearConfig() if recipe == "tensorwise" else Float8LinearConfig.from_recipe_name(recipe)
            convert_to_float8_training(model, config=Float8LinearConfig(**{**base.__dict__, "emulate": True}))
        kept, count = [], defaultdict(int)

        def policy(ctx, func, *args, **kwargs):  # torchtitan's: every second mm per block recomputed
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == aten.mm.default:
                count[mode] += 1
            keep = func in save and not (func == aten.mm.default and count[mode] % 2 == 0)
            if keep and not ctx.is_recompute:
                out = ctx.op_output
                kept.append((str(func), type(args[0]).__name__, tuple(out.shape)))
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
        y = checkpoint(model, x, use_reentrant=False,
                       context_fn=lambda: create_selective_checkpoint_contexts(policy))
        y.sum().backward()
        return kept

    for name, save in lists.items():
        for fp8 in (False, True):
            print(f"{name:8s} {'fp8 ' + recipe if fp8 else 'bf16':15s} kept: {run(save, fp8)}")


def sac_compiled(recipe: str) -> None:
    """What torchtitan's 2025-06 / 0.1.x policy (aten.mm and aten.max saved, every second mm recomputed) sees for
    the Float8Linear FFN inside a torch.compile'd block: each mm/_scaled_mm call, its first argument's type and
    whether the policy keeps it (each forward trace counts from 1 again)."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    aten = torch.ops.aten
    save = {aten.mm.default, aten.max.default}
    seen: list[tuple[str, str, str, bool]] = []

    def context():  # torchtitan's selective_checkpointing_context_fn: a fresh count per block call
        count: defaultdict[str, int] = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if func == aten.mm.default:
                count[mode] += 1
            keep = func in save and not (func == aten.mm.default and count[mode] % 2 == 0)
            if func in (aten.mm.default, aten._scaled_mm.default):
                seen.append((mode, str(func), type(args[0]).__name__, keep))
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    class Block(nn.Module):  # torchtitan's FeedForward inside the checkpoint wrapper
        def __init__(self, h: int, f: int) -> None:
            super().__init__()
            self.w1, self.w2, self.w3 = (nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False),
                                         nn.Linear(h, f, bias=False))

        def ffn(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

        def forward(self, x):
            return checkpoint(self.ffn, x, use_reentrant=False, context_fn=context)

    torch.manual_seed(0)
    block = Block(64, 128).to(torch.bfloat16)
    base = Float8LinearConfig() if recipe == "tensorwise" else Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(block, config=Float8LinearConfig(**{**base.__dict__, "emulate": True}))
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    torch.compile(block, backend="aot_eager", fullgraph=True)(x).sum().backward()
    for row in seen:
        print(row)


def loss() -> None:
    import torch
    import torch.nn.functional as F
    from torch.distributed._tools.mem_tracker import MemTracker

    n, h, v = 2048, 256, 8192
    torch.manual_seed(0)
    hidden = torch.randn(n, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(v, h, dtype=torch.bfloat16))
    labels = torch.randint(0, v, (n,))
    tracker = MemTracker()
    tracker.track_external(hidden, weight, labels)
    with tracker:
        pred = hidden @ weight.t()
        out = F.cross_entropy(pred.float(), labels, reduction="sum")
        del pred
        out.backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    per = {str(k).split(".")[-1].split(":")[0]: b / (n * v) for k, b in peak.items() if b}
    print("peak bytes per logit by kind (Other: the inputs):", {k: round(b, 3) for k, b in per.items()})


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "loss"
    recipe_arg = sys.argv[2] if len(sys.argv) > 2 else "tensorwise"
    if what != "sac":
        loss()
    elif sys.argv[3:4] == ["compile"]:
        sac_compiled(recipe_arg)
    else:
        sac(recipe_arg)
