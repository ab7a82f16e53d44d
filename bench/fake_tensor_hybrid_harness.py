"""What each layer of transformers' NemotronH (model_type nemotron_h) saves for the backward, counted on a CPU under
FakeTensorMode: one NemotronHBlock per character of the case's pattern (a model cut to a few layers), bf16, its
tensors caught by torch.autograd.graph.saved_tensors_hooks and counted once per storage (parameters and the layer's
input left out). Runs INSIDE the transformers venv (tests/framework_packages.py HF_VENV; meshplan never imports it).

On a CPU the Mamba-2 mixer runs its torch path (NemotronHMamba2Mixer.torch_forward: no mamba_ssm kernels), which
keeps the conv output, the chunked scan's decay matrices, segment sums and states as autograd tensors; Megatron-Core
trains with mamba_split_conv1d_scan_combined, which keeps zxBCdt and out_x and recomputes the rest. meshplan's card
(cards/memory.yaml mamba2_layer) follows the kernel, so the Mamba-2 rows here bound it from above; the attention
(sdpa on CPU: q, k, v, output and the fp32 log-sum-exp, as flash keeps them) and MLP rows are counted alike.

    python fake_tensor_hybrid_harness.py < case.json   # {"seq": N, "config": {NemotronHConfig fields}}
                                                       # prints one line: RESULT {"<index><kind>": bytes per token}
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import NemotronHConfig
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHBlock

warnings.filterwarnings("ignore")


def layer_bytes(cfg: NemotronHConfig, idx: int, kind: str, seq: int) -> float:
    """Bytes per token layer `idx` keeps for its backward (its input and parameters not counted)."""
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 under the fake mode (a .to() cannot swap fake params)
    block = NemotronHBlock(cfg, layer_idx=idx).train()
    torch.set_default_dtype(torch.float32)
    x = torch.randn(1, seq, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[id(t.untyped_storage())] = t.untyped_storage().nbytes()
        return t

    skip = {id(p.untyped_storage()) for p in block.parameters()} | {id(x.untyped_storage())}
    kwargs = {"attention_mask": None, "position_ids": torch.arange(seq)[None]} if kind == "*" else {}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, **kwargs)
    return sum(n for k, n in seen.items() if k not in skip) / seq


def main() -> None:
    case = json.loads(sys.stdin.read())
    cfg = NemotronHConfig(**case["config"])
    cfg._attn_implementation = "sdpa"
    with FakeTensorMode():
        out = {f"{i}{k}": layer_bytes(cfg, i, k, case["seq"]) for i, k in enumerate(cfg.hybrid_override_pattern)}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
