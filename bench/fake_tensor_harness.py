"""Activation memory of a framework's own model code, counted on a CPU under FakeTensorMode (no GPU, no memory).

Runs INSIDE the throwaway torch venv that `bench/fake_tensor_memory.py` and `tests/test_fake_tensor_memory.py`
build (torch 2.13.0 CPU wheel + torchtitan 0.3.0); meshplan never imports it, and it never imports meshplan.

What it counts, per decoder layer: the bytes still alive after the block's forward that were not alive before
it, read from `torch.distributed._tools.mem_tracker.MemTracker` (a TorchDispatchMode that tracks every tensor
storage created under it, by weak reference, exactly: a fake CPU tensor's storage is size x element size, no
allocator rounding). That is the block's saved-for-backward tensors (minus its input, which the previous block
made) plus its output (the next block's input), i.e. what each layer adds to the live set in a stack of
layers: meshplan's per-layer convention, where each layer owns its input. Under no recompute the same number is
cross-checked with a `saved_tensors_hooks` pack hook (unique storages autograd saved, minus the input, plus the
output); under activation checkpointing only the tracker can see what the checkpoint keeps (its own hooks and
the SAC cache sit below any outer hook). The peak through a training step (forward, backward, AdamW) is the
tracker's peak, measured with FSDP2 on a fake process group the way torchtitan's own memory estimator did.

CPU stand-ins for GPU kernels (each keeps what the GPU path saves; none changes the framework's code):
- FlexAttention: torchtitan compiles `flex_attention` (torch.compile) and builds its BlockMask compiled; on a
  CPU fake tensor both run eagerly instead (the same higher-order op and autograd Function, which saves q, k,
  v, out, logsumexp and max_scores as the compiled kernel does), with its CPU-backward guard lifted and no
  dynamo wrapping.
- RMSNorm: `aten::rms_norm` calls `aten::_fused_rms_norm`, which has a CUDA kernel whose autograd saves the
  bf16 input and the fp32 rstd; a CPU build only has its composite, whose autograd saves fp32 copies of the
  input and of the normalised output (7 extra s*b*h*2 units per Llama block). Registering a CPU kernel for
  the op (never run: fake tensors only reach meta functions) makes the CPU use the CUDA autograd formula.
- MemTracker does not pass higher-order operators (flex attention) through; a subclass lets them through.
- FSDPMemTracker's post_backward wrapper keeps one unsharded gradient referenced (its marking loop's variable)
  while FSDP2 frees it; the subclass marks the gradients without keeping one, so the peak counts what a run holds
  (_post_backward_without_stray_reference; torchtitan 0.3.0's Llama-3.1-8B cut: the lm_head's bf16 gradient,
  0.98 GiB, at its reduce in the chunked loss's last chunk).
- Its module tracker's multi-gradient hook on a module's inputs keeps a leaf input alive through a reference cycle
  (the chunked loss's detached chunks of the final norm's output, every step's kept to the end of the run); the
  harness registers it without that cycle (_multi_grad_hook_without_leaf_cycle).
- fp32 autocast: torchtitan's MoE router runs its gate under `torch.autocast(device_type, dtype=float32)`
  (models/common/moe.py TokenChoiceTopKRouter.forward). CUDA autocast accepts float32 and casts the gate's
  bf16 input and weight to fp32 copies, which the linear saves, and the scores, the sigmoid output and the
  routing probabilities that follow are fp32 (pytorch/torchtitan issue #4273); CPU autocast refuses float32
  and runs the gate in bf16 (torch/amp/autocast_mode.py: CPU supports bf16 and fp16 only). The stand-in lets
  a CPU autocast to float32 go ahead as CUDA's does (CPU autocast casts linear inputs alike).

    python fake_tensor_harness.py < cases.json   # prints one line: RESULT {...}
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

warnings.filterwarnings("ignore")

BF16 = torch.bfloat16


# --------------------------------------------------------------------------- CPU stand-ins for the GPU kernels


def cpu_stand_ins() -> None:
    """Make torchtitan's GPU code paths run on fake CPU tensors while saving what they save on a GPU."""
    import torch.nn.attention.flex_attention as flex
    import torchtitan.models.common.attention as titan_attention

    titan_attention.FlexAttention._compiled_flex_attn = staticmethod(flex.flex_attention)
    titan_attention._compiled_create_block_mask = flex.create_block_mask
    flex._validate_device = lambda *args, **kwargs: None
    flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True  # call the higher-order op directly, no dynamo
    global _RMS_LIBRARY
    _RMS_LIBRARY = torch.library.Library("aten", "IMPL")
    _RMS_LIBRARY.impl("_fused_rms_norm", _never_run_rms_norm, "CPU")
    torch.autocast = _Fp32Autocast


class _Fp32Autocast(torch.autocast):
    """torch.autocast that, like CUDA's, goes ahead with dtype=float32 on a CPU (which refuses it)."""

    def __init__(self, device_type: str, dtype=None, enabled: bool = True, cache_enabled=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        if device_type == "cpu" and dtype == torch.float32 and enabled:
            self._enabled = True


_RMS_LIBRARY = None


def _never_run_rms_norm(*args, **kwargs):
    raise NotImplementedError("the CPU stand-in for _fused_rms_norm is for fake tensors only")


def tracker_class(fsdp: bool):
    from torch.distributed._tools import mod_tracker
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    base = FSDPMemTracker if fsdp else MemTracker
    mod_tracker.register_multi_grad_hook = _multi_grad_hook_without_leaf_cycle
    attrs = {"supports_higher_order_operators": True}
    if fsdp:
        attrs["_fsdp_param_group_post_backward"] = _post_backward_without_stray_reference
    return type(f"HigherOrder{base.__name__}", (base,), attrs)


def _multi_grad_hook_without_leaf_cycle(tensors, fn, *, mode: str = "all"):
    """torch.autograd.graph.register_multi_grad_hook as the trackers' ModTracker calls it on every module's inputs
    (torch 2.13 torch/distributed/_tools/mod_tracker.py `_fw_pre_hook`, mode "all"), without the reference cycle it
    makes through a leaf input: its hooks, registered on each tensor, close over the tensors' grad_fns, and a leaf's is
    its AccumulateGrad node, which holds the leaf (torch/autograd/graph.py: `grad_fns = list(map(
    _get_grad_fn_or_grad_acc, tensors))`), a cycle through C++ that Python's collector cannot free, so the leaf
    outlives every reference a run holds: torchtitan 0.3.0's chunked loss feeds lm_head detached leaf chunks of the
    final norm's output (components/loss.py `h_chunks`), kept to the end of the run, one set per step. Here a leaf's
    AccumulateGrad is looked up from a weak reference when its first gradient arrives; the rest is torch's."""
    import weakref

    from torch.autograd.graph import _get_grad_fn_or_grad_acc, _MultiHandle, register_multi_grad_hook

    if mode != "all" or not any(t.is_leaf for t in tensors):
        return register_multi_grad_hook(tensors, fn, mode=mode)
    nodes = [weakref.ref(t) if t.is_leaf else t.grad_fn for t in tensors]
    tasks: dict[int, list] = {}  # graph task id -> [gradients arrived, gradients awaited, the gradients]

    def node(entry):
        if isinstance(entry, weakref.ref):
            tensor = entry()
            return None if tensor is None else _get_grad_fn_or_grad_acc(tensor)
        return entry

    def hook_of(index: int):
        def hook(grad) -> None:
            task = torch._C._current_graph_task_id()
            state = tasks.get(task)
            if state is None:
                awaited = sum(torch._C._will_engine_execute_node(n) for n in map(node, nodes) if n is not None)
                state = tasks[task] = [0, awaited, [None] * len(nodes)]
            state[2][index] = grad
            state[0] += 1
            if state[0] == state[1]:
                del tasks[task]
                fn(state[2])

        return hook

    return _MultiHandle(tuple(t.register_hook(hook_of(i)) for i, t in enumerate(tensors)))


def _post_backward_without_stray_reference(self, fsdp_mod, orig_post_backward):
    """FSDPMemTracker's wrapper of FSDPParamGroup.post_backward (torch 2.13 torch/distributed/_tools/
    fsdp2_mem_tracker.py `_fsdp_param_group_post_backward`): the same snapshots and categories, without its stray
    reference. torch's wrapper marks the unsharded gradients in a loop in its own frame (line 339, `unsharded_grad =
    fsdp_param._unsharded_param.grad`), so the loop variable keeps the group's last gradient alive through the
    post_backward it wraps (line 352), where FSDP2 frees it: accumulate_unsharded_grad_if_needed and
    to_accumulated_grad_if_needed drop `.grad` into the reduce_dtype accumulator (_fsdp_param.py:820-821, a unit
    not reducing this backward or reducing an accumulated gradient: the chunked loss's lm_head), and foreach_reduce
    clears its list after the copy-in (_fsdp_collectives.py:606; with one rank per shard its loop at line 580, whose
    variable keeps the last gradient to the end of the call in a real run too, does not run). A run holds no such
    reference; here the marking loop runs in a function of its own, so no gradient outlives it."""
    import functools

    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPModState, _FSDPRefType, _FSDPState

    def mark_grads(attr: str, reftype, **kwargs) -> None:
        group = fsdp_mod._get_fsdp_state()._fsdp_param_group
        for fsdp_param in group.fsdp_params if group else ():
            grad = getattr(fsdp_param, attr).grad
            if grad is not None:
                self._update_and_maybe_create_winfos(grad, reftype, **kwargs)

    @functools.wraps(orig_post_backward)
    def inner(*args, **kwargs) -> None:
        mark_grads("_unsharded_param", _FSDPRefType.UNSHARDED_GRAD, update_existing=True)
        mod_stat = self.memory_tracking[fsdp_mod]
        mod_stat.snapshots.setdefault(_FSDPModState.BEF_POST_BW, []).append(self.get_tracker_snapshot())
        self._fsdp_state = _FSDPState.POST_BW
        orig_post_backward(*args, **kwargs)
        mark_grads("sharded_param", _FSDPRefType.SHARDED_GRAD)
        mod_stat.snapshots.setdefault(_FSDPModState.AFT_POST_BW, []).append(self.get_tracker_snapshot())

    return inner


# --------------------------------------------------------------------------- models


def model_config(arch: str, layers: list[int], seq: int):
    """The torchtitan 0.3.0 registry config of the architecture, cut to the given decoder layers, with the RoPE
    cache sized to the sequence as the trainer does (Decoder.Config.update_from_config)."""
    if arch == "llama3-8b":
        from torchtitan.models.llama3 import model_registry

        spec = model_registry("8B", attn_backend="flex")
    elif arch == "deepseek-v3-671b":
        from torchtitan.models.deepseek_v3 import model_registry

        spec = model_registry("671B", attn_backend="flex")
    else:
        raise ValueError(f"unknown architecture {arch!r}: llama3-8b or deepseek-v3-671b")
    cfg = spec.model
    cfg.layers = [cfg.layers[i] for i in layers]
    for layer in cfg.layers:
        layer.attention.rope = dataclasses.replace(layer.attention.rope, max_seq_len=seq)
    return cfg


def trainer_loss(arch: str):
    """The loss the registry's trainer config uses (ChunkedLossWrapper of CrossEntropyLoss for both)."""
    if arch == "llama3-8b":
        from torchtitan.models.llama3.config_registry import llama3_8b as trainer
    else:
        from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_671b as trainer
    return trainer().loss.build()


# --------------------------------------------------------------------------- activation checkpointing policies


@dataclass
class EraAConfig:
    """torchtitan 0.2.2's `ActivationCheckpoint` fields that its AC functions read (job_config.py defaults)."""

    mode: str = "selective"
    selective_ac_option: str = "2"
    per_op_sac_force_recompute_mm_shapes_by_fqns: list[str] = field(default_factory=lambda: ["moe.router.gate"])
    early_stop: bool = False
    preserve_rng_state: bool = True
    determinism_check: str = "default"
    debug: bool = False


def era_a_module(wheel: Path):
    """torchtitan 0.2.2's distributed/activation_checkpoint.py, loaded from its wheel beside 0.3.0: its two
    torchtitan imports (the config class, used only in annotations, and the logger) are replaced."""
    import logging
    import types

    source = (wheel / "torchtitan" / "distributed" / "activation_checkpoint.py").read_text()
    source = source.replace("from torchtitan.config.job_config import ActivationCheckpoint as ACConfig\n", "")
    source = source.replace("from torchtitan.tools.logging import logger\n", "")
    module = types.ModuleType("torchtitan_0_2_2_activation_checkpoint")
    module.ACConfig = EraAConfig
    module.logger = logging.getLogger("torchtitan-0.2.2")
    exec(compile(source, "torchtitan-0.2.2/distributed/activation_checkpoint.py", "exec"), module.__dict__)
    return module


def era_a_save_list(wheel: Path, arch: str) -> set:
    """The model's `_op_sac_save_list` in torchtitan 0.2.2 (models/<model>/infra/parallelize.py), element by
    element; ops this torch build does not register are skipped, as torchtitan 0.3.0 skips them."""
    folder = {"llama3-8b": "llama3", "deepseek-v3-671b": "deepseek_v3"}[arch]
    tree = ast.parse((wheel / "torchtitan" / "models" / folder / "infra" / "parallelize.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_op_sac_save_list" for t in node.targets):
            ops = set()
            for element in node.value.elts:
                try:
                    ops.add(eval(compile(ast.Expression(element), "save-list", "eval"), {"torch": torch}))
                except (AttributeError, RuntimeError):
                    pass
            return ops
    raise RuntimeError(f"no _op_sac_save_list in torchtitan 0.2.2's {folder} parallelize.py")


def apply_policy(model, policy: str, arch: str, wheel: Path | None) -> None:
    """none | full | selective (torchtitan 0.3.0, op-level SAC) | selective-op@0.2.2 | selective-N@0.2.2."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if policy == "none":
        return
    if policy == "full":
        FullAC(FullAC.Config()).apply(model)
        return
    if policy == "selective":
        SelectiveAC(SelectiveAC.Config()).apply(model)
        return
    if policy.endswith("@0.2.2") and policy.startswith("selective-"):
        if wheel is None:
            raise ValueError("the torchtitan 0.2.2 policies need the unpacked 0.2.2 wheel (era_a_wheel)")
        era_a = era_a_module(wheel)
        option = policy[len("selective-"):-len("@0.2.2")]
        era_a.apply_ac(model, EraAConfig(selective_ac_option=option),
                       op_sac_save_list=era_a_save_list(wheel, arch) if option == "op" else None)
        return
    raise ValueError(f"unknown policy {policy!r}")


# --------------------------------------------------------------------------- per-layer counts


def _inputs(seq: int, batch: int):
    tokens = torch.randint(0, 1000, (batch, seq))
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    return tokens, positions


def layer_bytes(case: dict, wheel: Path | None) -> dict:
    """Bytes each decoder layer adds to the live set in its forward (saved for backward + its output)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    arch, seq, batch = case["arch"], case["seq"], case["batch"]
    cfg = model_config(arch, case["layers"], seq)
    with FakeTensorMode():
        # FSDP2's MixedPrecisionPolicy(param_dtype=bf16) computes with bf16 parameters: build them in bf16.
        torch.set_default_dtype(BF16)
        try:
            model = cfg.build()
        finally:
            torch.set_default_dtype(torch.float32)
        model.train()
        apply_policy(model, case["policy"], arch, wheel)
        tokens, positions = _inputs(seq, batch)
        masks = model.get_attention_masks(positions)
        tracker = tracker_class(fsdp=False)()
        tracker.track_external(model, tokens, positions)
        with tracker:
            h = model.tok_embeddings(tokens)
            for layer in model.layers.values():
                h = layer(h, masks, positions)
            h.float().sum().backward()
        out = []
        for name, layer in model.layers.items():
            stats = tracker.memory_tracking[layer]
            pre, post = stats.snapshots["Pre-Forward"][0], stats.snapshots["Post-Forward"][0]
            device = next(iter(post))
            moe = bool(getattr(layer, "moe_enabled", False) or getattr(
                getattr(layer, "_checkpoint_wrapped_module", None), "moe_enabled", False))
            out.append({"layer": int(name), "moe": moe,
                        "bytes": int(post[device]["Total"] - pre[device].get("Total", 0))})
        result = {"layers": out, "hidden": int(model.config.dim)}
        if case["policy"] == "none":
            result["saved_hook_bytes"] = saved_hook_bytes(model, masks, positions, seq, batch)
    return result


def saved_hook_bytes(model, masks, positions, seq: int, batch: int) -> list[int]:
    """Per layer (no recompute): unique storages autograd saves, minus the layer input, plus its output."""
    out = []
    for layer in model.layers.values():
        x = torch.empty(batch, seq, model.config.dim, dtype=BF16, requires_grad=True)
        outside = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers(), x, *_tensors(masks)]}
        kept: dict[int, torch.Tensor] = {}  # holds the storages, so an address is never reused and miscounted
        with torch.autograd.graph.saved_tensors_hooks(_packer(outside, kept), lambda t: t):
            y = layer(x, masks, positions)
        out.append(sum(t.untyped_storage().nbytes() for t in kept.values()) + y.untyped_storage().nbytes())
    return out


def _packer(outside: set[int], kept: dict[int, torch.Tensor]):
    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in outside and key not in kept:
            kept[key] = t
        return t

    return pack


def _tensors(masks):
    if isinstance(masks, torch.Tensor):
        return [masks]
    if hasattr(masks, "as_tuple"):
        return [t for t in masks.as_tuple() if isinstance(t, torch.Tensor)]
    return []


# --------------------------------------------------------------------------- peak through a step


_PG_WORLD: int | None = None


def fake_fsdp_mesh(world: int, shard: int | None = None):
    """A one-dimensional "fsdp" device mesh over a fake process group of `world` ranks, this process rank 0; a
    process holds one such group, so every step case of a run keeps the same `world`. With `shard` under `world`, the
    (dp_replicate, fsdp) mesh of world / shard replicas of `shard` ranks, which fully_shard runs as HSDP (torchtitan
    0.3.0 passes it at data_parallel_shard_degree 1 too: models/llama3/parallelize.py)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    global _PG_WORLD
    if _PG_WORLD is None:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        _PG_WORLD = world
    if _PG_WORLD != world:
        raise ValueError("one fake process group per run: keep `world` the same in every step case")
    if shard is not None and shard != world:
        return init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("dp_replicate", "fsdp"))
    return init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))


def peak_by_category(tracker) -> dict[str, int]:
    """The tracker's peak snapshot on its one device, bytes by category (parameters, gradients, activations...)."""
    peak = tracker.get_tracker_snapshot("peak")
    device = next(iter(peak))
    return {str(getattr(k, "value", k)): int(v) for k, v in peak[device].items()}


def reset_peak(tracker) -> None:
    """Start the tracker's peak afresh from what is alive now, so that it covers the steps after this one:
    MemTracker.reset_mod_stats clears the module stats only, and the peak it keeps would hold the first step's, with the
    optimizer state built lazily inside it and the temporaries FakeTensorMode allocates the first time it dispatches
    an op (a cache miss runs the op's decomposition, whose intermediates the CUDA kernel does not allocate: AdamW's
    first foreach step counted three param-sized fp32 copies more than its second, on a fresh process only)."""
    snap = tracker.get_tracker_snapshot()
    tracker._peak_mem_snap = snap
    tracker._peak_mem = {dev: dev_snap["Total"] for dev, dev_snap in snap.items()}


def step_peak(case: dict, wheel: Path | None) -> dict:
    """One training step (forward, the trainer's chunked loss, backward, AdamW step) with torchtitan's FSDP2
    (apply_fsdp_to_decoder: bf16 params, fp32 reduce) over a fake process group of `world` ranks; the peak of
    rank 0 by category, from FSDPMemTracker over the second step (the first one creates the optimizer state)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    world = case["world"]
    shard = case.get("dp_shard", world)  # 1: torchtitan 0.3.0's ZeRO-0, fully_shard over a shard of one (HSDP)
    mesh = fake_fsdp_mesh(world, shard)
    arch, seq, batch = case["arch"], case["seq"], case["batch"]
    cfg = model_config(arch, case["layers"], seq)
    with FakeTensorMode():
        model = cfg.build()
        model.train()
        apply_policy(model, case["policy"], arch, wheel)
        apply_fsdp_to_decoder(model, mesh, param_dtype=BF16, reduce_dtype=torch.float32, pp_enabled=False)
        loss_fn = trainer_loss(arch)
        chunked = isinstance(loss_fn, ChunkedLossWrapper)
        if chunked:
            loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        # torchtitan's default implementation is fused (components/optimizer.py); `fused: true` runs it here too
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=case.get("fused"))
        tokens, positions = _inputs(seq, batch)
        masks = model.get_attention_masks(positions)
        valid_tokens = torch.tensor(float(seq * batch))
        tracker = tracker_class(fsdp=True)(model, optimizer)
        loss_scope = _LossScope(tracker)
        tracker.track_external(model, optimizer)
        with tracker:
            for step in range(2):
                pred = model(tokens, positions, masks)
                with loss_scope:
                    loss = loss_fn(pred, tokens, valid_tokens, positions=positions)[0]
                del pred
                loss.backward()
                optimizer.step()
                # torchtitan 0.3.0 trainer.py train_step: zero_grad(set_to_none=training.disable_cuda_graphs), False by
                # default (the sharded grads are zeroed in place and stay allocated); 0.2.x: zero_grad() frees them
                optimizer.zero_grad(set_to_none=case.get("set_to_none", False))
                if step == 0:
                    tracker.reset_mod_stats()
                    reset_peak(tracker)
        by_kind = peak_by_category(tracker)
    return {"peak": by_kind, "world": world, "dp_shard": shard, "chunked_loss": chunked,
            "set_to_none": case.get("set_to_none", False)}


class _LossScope:
    """torchtitan's chunked loss calls lm_head once per chunk, outside the model, and runs a backward per
    chunk; the tracker's module tracker resets its parent set to {"Global"} after every backward, so the second
    chunk's lm_head call looks like a second training iteration, which the tracker refuses. Inside this scope
    the parent set also names the loss, so those calls read as re-use within the step (what they are). Only
    the tracker's peak is read, never its per-module stats."""

    NAME = "ChunkedLossWrapper"

    def __init__(self, tracker):
        mod_tracker = tracker._mod_tracker
        scope = self

        class ScopedModTracker(type(mod_tracker)):
            @property
            def parents(self):
                return self.__dict__["_scoped_parents"]

            @parents.setter
            def parents(self, value):
                if scope.active:
                    value.add(scope.NAME)
                self.__dict__["_scoped_parents"] = value

        mod_tracker.__dict__["_scoped_parents"] = mod_tracker.__dict__.pop("parents")
        mod_tracker.__class__ = ScopedModTracker
        self.mod_tracker, self.active = mod_tracker, False

    def __enter__(self):
        self.active = True
        self.mod_tracker.parents.add(self.NAME)

    def __exit__(self, *exc):
        self.active = False
        self.mod_tracker.parents.discard(self.NAME)


# --------------------------------------------------------------------------- entry point


def main() -> None:
    request = json.loads(sys.stdin.read())
    wheel = Path(request["era_a_wheel"]) if request.get("era_a_wheel") else None
    cpu_stand_ins()
    results = []
    for case in request["cases"]:
        start = time.perf_counter()
        try:
            if case["kind"] == "layers":
                out = layer_bytes(case, wheel)
            elif case["kind"] == "step":
                out = step_peak(case, wheel)
            else:
                raise ValueError(f"unknown case kind {case['kind']!r}: layers or step")
            out["ok"] = True
        except Exception as exc:  # reported per case, so one failing policy does not hide the others
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        out["seconds"] = round(time.perf_counter() - start, 2)
        results.append({**case, **out})
    print("RESULT " + json.dumps({"torch": torch.__version__, "results": results}))


if __name__ == "__main__":
    main()
