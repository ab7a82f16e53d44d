"""Every aten op of one verl FSDP2 training step of Hugging Face model code, with the bytes it reads and writes,
counted on a CPU under FakeTensorMode (no compute): what bench/gpu_step_harness.py's step runs on the GPU.

Runs INSIDE the throwaway venv of bench/fake_tensor_hf.py (torch 2.13.0 CPU + transformers 5.9.0); meshplan never
imports it. The same build, wrap and loss as bench/gpu_step_harness.py (fake_tensor_hf_harness.build,
verl_fsdp2_wrap over a fake one-rank process group, verl_loss with the GPU harness's ChunkedCrossEntropy or flash_attn's
fused cross-entropy's traffic), AdamW foreach, zero_grad(set_to_none=True), the second step counted (the first builds
the optimizer state). Attention is a stand-in that launches nothing (flash attention is timed apart, by its FLOPs).

Each op is put in a group by where it was issued (the Python frames above it): `fsdp` (torch/distributed/fsdp: the
casts and copies of FSDP2's all-gather and reduce-scatter), `optimizer` (torch/optim), `loss` (the cross-entropy and
the policy loss), `model` (the model's forward, its autograd backward and its recompute), and by kind: `gemm` (mm,
addmm, bmm, _grouped_mm), `collective`, `view` (no kernel: aliases), `memory` (every other op: memory-bound). The
bytes of an op are its tensor inputs' and outputs' (an in-place op's output read once and written once). A
composite kernel counts as one op (logsumexp: its input read once), and the fake process group's collectives
dispatch no aten op (at one rank NCCL's copies are left out).

    python step_op_census_harness.py < cases.json     # prints one line: RESULT {...}
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import torch
from fake_tensor_hf_harness import build, token_row, verl_fsdp2_wrap, verl_loss
from gpu_step_harness import ChunkedCrossEntropy  # the GPU step's own loss, so the census counts what ran
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_scaled_grouped_mm"}
QUIET = False  # set while the attention stand-in runs: nothing it does is a kernel of the real step


def _group(frame) -> str:
    """Where the op was issued, from the Python frames above it."""
    while frame is not None:
        name = frame.f_code.co_filename
        if "torch/distributed/fsdp" in name:
            return "fsdp"
        if "torch/optim" in name:
            return "optimizer"
        if "CrossEntropy" in frame.f_code.co_qualname:
            return "loss"
        if "transformers/" in name:
            return "model"
        if frame.f_code.co_name == "verl_loss":
            return "loss"
        frame = frame.f_back
    return "model"


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


INDEXED = {"gather", "index_select", "embedding", "index"}  # read what they pick (their output), and the index
SCATTERED = {"scatter_add_", "scatter_", "scatter_add", "index_put_", "index_add_"}  # read and write what they touch
OVERWRITTEN = {"copy_", "fill_", "zero_", "_foreach_copy_", "_foreach_zero_"}  # the destination is written, not read


def _traffic(name: str, args, ins, outs) -> tuple[int, int]:
    """(bytes read, bytes written) of one op: its tensor inputs and outputs, but what an indexed op picks or
    touches, and a destination only written."""
    written = _bytes(outs)
    if name in INDEXED:
        index = sum(_bytes([t]) for t in ins[1:] if isinstance(t, torch.Tensor) and not t.is_floating_point())
        return written + index, written
    if name in SCATTERED:
        touched = sum(_bytes([t]) for t in ins[1:] if isinstance(t, torch.Tensor))
        return touched + touched, touched
    if name in OVERWRITTEN:
        dst, _ = tree_flatten(args[0])
        return _bytes(ins) - _bytes(dst), written
    if name.startswith("_foreach_") and name.endswith("_"):  # in place, returns nothing: its first list written
        dst, _ = tree_flatten(args[0])
        return _bytes(ins), _bytes(dst)
    return _bytes(ins), written


class Census(TorchDispatchMode):
    """Counts each op by (group, kind): launches, bytes read, bytes written; and the op names by bytes."""

    def __init__(self):
        super().__init__()
        self.on = False
        self.rows: dict = defaultdict(lambda: [0, 0, 0])
        self.ops: dict = defaultdict(lambda: [0, 0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.on or QUIET:
            return out
        name = func.overloadpacket.__name__
        group = _group(sys._getframe(1))
        ins, _ = tree_flatten((args, kwargs))
        outs, _ = tree_flatten(out)
        if func.namespace == "prim":  # prim::device and the like: no kernel
            return out
        if func.is_view or name in ("detach", "alias", "_unsafe_view", "lift_fresh", "empty", "empty_strided",
                                    "new_empty", "new_empty_strided", "set_"):
            kind = "view"
        elif name in GEMMS:
            kind = "gemm"
        elif "c10d" in str(func.namespace) or func.namespace in ("_c10d_functional", "c10d"):
            kind = "collective"
        else:
            kind = "memory"
        read, written = _traffic(name, args, ins, outs)
        row = self.rows[(group, kind)]
        row[0] += 1
        row[1] += read
        row[2] += written
        if kind == "memory":
            op = self.ops[(group, name)]
            op[0] += 1
            op[1] += read + written
        return out


class _AttentionStandIn(torch.autograd.Function):
    """flash attention's shapes, no kernel counted (its time is meshplan's attention term)."""

    @staticmethod
    def forward(ctx, q, k, v):
        global QUIET
        QUIET = True
        try:
            out = q.new_empty(q.shape[0], q.shape[2], q.shape[1], v.shape[-1])
        finally:
            QUIET = False
        ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(ctx, grad):
        global QUIET
        q, k, v = ctx.saved_tensors
        QUIET = True
        try:
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        finally:
            QUIET = False


def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    return _AttentionStandIn.apply(query, key, value), None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register("census_attention", attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register("census_attention", flash_attention_mask)


def census(case: dict) -> dict:
    from fake_tensor_harness import fake_fsdp_mesh
    from torch._subclasses.fake_tensor import FakeTensorMode

    mesh = fake_fsdp_mesh(case.get("world", 1))  # one world per process (fake_fsdp_mesh): one run per world
    with FakeTensorMode():
        model = build(case, dtype=torch.float32, attention="census_attention")
        verl_fsdp2_wrap(model, mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
        ids, positions, labels = token_row(case["tokens"])
        mode = Census()
        with mode:
            for step in range(2):
                mode.on = step == 1
                verl_loss(model, ids, positions, labels, case, ChunkedCrossEntropy).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    top = sorted(mode.ops.items(), key=lambda kv: -kv[1][1])
    return {"rows": [{"group": g, "kind": k, "launches": v[0], "read": v[1], "written": v[2]}
                     for (g, k), v in sorted(mode.rows.items())],
            "memory_ops": [{"group": g, "op": n, "launches": v[0], "bytes": v[1]} for (g, n), v in top],
            "params": int(sum(p.numel() for p in model.parameters())),
            "layer_params": int(sum(p.numel() for p in model.model.layers[-1].parameters()))}


def main() -> None:
    import transformers

    request = json.loads(sys.stdin.read())
    register()
    results = []
    for case in request["cases"]:
        try:
            out = census(case) | {"ok": True}
        except Exception as exc:  # reported per case
            import traceback
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000] + traceback.format_exc()[-3000:]}
        results.append({**{k: v for k, v in case.items() if k != "config"}, **out})
    print("RESULT " + json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                                  "results": results}))


if __name__ == "__main__":
    main()
