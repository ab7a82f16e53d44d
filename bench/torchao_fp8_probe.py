"""Evidence for two torchtitan memory facts in cards/memory.yaml (fsdp2 conventions), run on the CPU.

1. `sac`: what torchtitan's op-level SAC policy sees and keeps for a SwiGLU FFN of torchao Float8Linear layers,
   under the save lists of the 2024-12 tree (9dec370: mm, SDPA, reduce_scatter, abs, max), the 2025-06 tree
   (e7c0cae: the same without abs) and 0.3.0 (torch's compute_intensive_ops, which name _scaled_mm, + max). The
   matmul reaches the policy as aten.mm on Float8TrainingTensor arguments (the subclass runs _scaled_mm below the
   SAC mode), so the kept mm outputs are bf16's; the 2024-12 list also keeps |x| of every fp8 cast in eager.
2. `loss`: the peak bytes per logit of torchtitan <= 0.2's whole-sequence loss (train.py: pred = model(...);
   loss = cross_entropy(pred.flatten(0, 1).float(), labels); del pred; loss.backward()), counted with
   torch.distributed._tools.mem_tracker.MemTracker: 12 (saved fp32 log-softmax 4 + two fp32 gradients 4 + 4).

Needs the torch venv of bench/fake_tensor_harness.py and, for `sac`, a torchao source tree (e.g.
`git -C <pytorch/ao clone> archive <rev> torchao | tar -x -C DIR`); meshplan never imports this.

Run: <venv>/bin/python bench/torchao_fp8_probe.py loss
     PYTHONPATH=DIR <venv>/bin/python bench/torchao_fp8_probe.py sac [tensorwise|rowwise]
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
    sac(sys.argv[2] if len(sys.argv) > 2 else "tensorwise") if what == "sac" else loss()
