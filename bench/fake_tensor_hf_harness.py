"""Activation memory of Hugging Face transformers' own model code, counted on a CPU under FakeTensorMode.

Runs INSIDE the throwaway venv that `bench/fake_tensor_hf.py` and `tests/test_fake_tensor_hf.py` build (torch
2.13.0 CPU wheel + transformers 5.9.0, tests/framework_packages.py HF_VENV); meshplan never imports it, and it
never imports meshplan. It is what verl's and SkyRL's FSDP engines (strategy fsdp2) train: the HF model class of
the checkpoint's config.json, bf16 compute (FSDP2 MixedPrecisionPolicy param_dtype bf16), attn_implementation
flash_attention_2, padding removed (one packed row of tokens, position ids per token), and with gradient
checkpointing on, HF's `gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})`
(verl/workers/engine/fsdp/transformer_impl.py _build_module).

What it counts, per decoder layer, with torch.distributed._tools.mem_tracker.MemTracker (as
bench/fake_tensor_harness.py does for torchtitan): `bytes`, what the layer adds to the live set in its forward
(post-forward minus pre-forward: saved for backward, minus its input, plus its output), and `stack_bytes`, what
it adds to the live set of a stack of layers (this layer's pre-forward to the next module's pre-forward: the same,
less its input where nothing saved it, which HF's composite RMSNorm does not: it saves an fp32 copy instead).

CPU stand-in (the only one): flash-attention-2 has no CPU kernel. An attention implementation registered through
transformers' AttentionInterface ("fa2_cpu_stand_in", with flash_attention_2's mask function: no mask) computes
with aten._scaled_dot_product_flash_attention_for_cpu and saves what flash_attn's FlashAttnFunc saves: q, k, v
(unrepeated GQA heads), the output in [b, s, heads, d] (the o_proj input, the same buffer) and the fp32
logsumexp [b, heads, s]. HF's own flash path reads q, k, v as [b, s, heads, d] transposes (flash_attn keeps
them as given when the last dim is contiguous), so the saved bytes are the same. verl runs the forward under
torch.autocast(bf16); with bf16 parameters every autocast-listed op of these blocks already gets its listed
dtype (linears bf16, pow/rsqrt/softmax fp32 inputs), so the harness runs without it.

    python fake_tensor_hf_harness.py < cases.json   # prints one line: RESULT {...}
    python fake_tensor_hf_harness.py --serve        # one {"cases": [...]} a line, one RESULT (or ERROR) line each

One process holds one fake process group, so the step, head and accumulate cases of one process share their `world`
(bench/fake_tensor_hf.served_harness keeps one server per world).
"""

from __future__ import annotations

import time
import warnings

import torch

# torchtitan's harness (this folder, on sys.path as the script's own): the tracker subclass, the fake process group
# and the peak read-out, shared; it imports only torch at module level
from fake_tensor_harness import fake_fsdp_mesh, peak_by_category, reset_peak, tracker_class
from harness_serve import serve  # one ask, or with --serve one per line: the tests keep one server

warnings.filterwarnings("ignore")

BF16 = torch.bfloat16
STAND_IN = "fa2_cpu_stand_in"  # no "flash" in the name: transformers would look for a flash_attn package


class _Fa2StandIn(torch.autograd.Function):
    """flash_attn FlashAttnFunc's saves (q, k, v, out, fp32 logsumexp) around the CPU flash kernel."""

    @staticmethod
    def forward(ctx, q, k, v, scale):  # q [b, a, s, d], k/v [b, g, s, d]
        v_dim = v.shape[-1]
        groups = q.shape[1] // k.shape[1]
        with torch.no_grad():
            if v.shape[-1] < q.shape[-1]:  # MLA: HF pads V to the QK head dim for flash (kept padded by flash)
                v = torch.nn.functional.pad(v, [0, q.shape[-1] - v.shape[-1]])
            kk = k.repeat_interleave(groups, dim=1) if groups > 1 else k
            vv = v.repeat_interleave(groups, dim=1) if groups > 1 else v
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kk, vv, 0.0, True, scale=scale)
            out = out.transpose(1, 2).contiguous()  # flash_attn returns [b, s, heads, d]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.groups, ctx.v_dim = scale, groups, v_dim
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        g = ctx.groups
        kk = k.repeat_interleave(g, dim=1) if g > 1 else k
        vv = v.repeat_interleave(g, dim=1) if g > 1 else v
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad.transpose(1, 2), q, kk, vv, out.transpose(1, 2), lse, 0.0, True, scale=ctx.scale)
        dv = dv[..., :ctx.v_dim]
        if g > 1:
            b, a, s, d = dk.shape
            dk = dk.view(b, a // g, g, s, d).sum(2)
            b, a, s, d = dv.shape
            dv = dv.view(b, a // g, g, s, d).sum(2)
        return dq, dk, dv, None


def fa2_stand_in(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """An AttentionInterface function: inputs [b, heads, s, d], output [b, s, heads, d] as flash_attention_2's; with
    a V head narrower than Q's (MLA), the view of its first V-dim columns, as the model slices flash's output."""
    out = _Fa2StandIn.apply(query, key, value, scaling)
    return (out[..., :value.shape[-1]] if value.shape[-1] < query.shape[-1] else out), None


def register_stand_in() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(STAND_IN, fa2_stand_in)
    ALL_MASK_ATTENTION_FUNCTIONS.register(STAND_IN, flash_attention_mask)


def build(case: dict, dtype=BF16, attention: str = STAND_IN):
    """The HF causal-LM class of the config.json fields, cut to `num_layers` decoder layers, on fake tensors (bf16,
    or fp32 for a training step: verl's FSDP engine loads the actor in fp32 and computes in bf16 by FSDP2's
    MixedPrecisionPolicy)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(case["config"])
    model_type = fields.pop("model_type")
    fields.pop("architectures", None)
    fields.update(case.get("override", {}))
    fields["num_hidden_layers"] = case["num_layers"]
    config = AutoConfig.for_model(model_type, **fields)
    config._attn_implementation = attention
    torch.set_default_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=dtype)
    finally:
        torch.set_default_dtype(torch.float32)
    model.train()
    if case["policy"] == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif case["policy"] != "none":
        raise ValueError(f"unknown policy {case['policy']!r}: none or full")
    return model


def layer_bytes(case: dict) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    tokens = case["tokens"]
    with FakeTensorMode():
        model = build(case)
        base = model.model
        ids = torch.randint(0, 1000, (1, tokens))
        positions = torch.arange(tokens).unsqueeze(0)
        tracker = tracker_class(fsdp=False)()
        tracker.track_external(model, ids, positions)
        with tracker:
            out = base(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
            out.float().sum().backward()
        layers = list(base.layers)
        after = [*layers[1:], base.norm]
        rows = []
        for i, (layer, nxt) in enumerate(zip(layers, after, strict=True)):
            stats, nstats = tracker.memory_tracking[layer], tracker.memory_tracking[nxt]
            pre, post = stats.snapshots["Pre-Forward"][0], stats.snapshots["Post-Forward"][0]
            npre = nstats.snapshots["Pre-Forward"][0]
            device = next(iter(post))
            mlp = getattr(layer, "mlp", None)
            moe = mlp is not None and hasattr(mlp, "experts")
            rows.append({"layer": i, "moe": moe, "bytes": int(post[device]["Total"] - pre[device].get("Total", 0)),
                         "stack_bytes": int(npre[device]["Total"] - pre[device].get("Total", 0))})
    return {"layers": rows, "hidden": int(model.config.hidden_size), "model_class": type(model).__name__}


class _FlashCrossEntropyStandIn(torch.autograd.Function):
    """flash_attn's Triton CrossEntropyLoss (flash_attn/ops/triton/cross_entropy.py), which verl's and SkyRL's
    logprobs_from_logits call when flash_attn is installed: the forward allocates the fp32 losses and logsumexp per
    row and saves the logits as given (bf16), the lse and the labels; the backward writes the gradient into the
    saved logits when inplace_backward (verl without entropy, SkyRL always) and returns that buffer. The kernels
    have no CPU build; they allocate nothing per logit, so the stand-in allocates only what they do."""

    @staticmethod
    def forward(ctx, logits, labels):
        losses = torch.empty(logits.shape[0], dtype=torch.float32)
        lse = torch.empty(logits.shape[0], dtype=torch.float32)
        ctx.save_for_backward(logits, lse, labels)
        return losses

    @staticmethod
    def backward(ctx, grad_losses):
        logits, _, _ = ctx.saved_tensors
        return logits, None


REDUCE_DTYPES = {"fp32": torch.float32, "bf16": BF16}  # fsdp_config.mixed_precision.reduce_dtype (verl: fp32)


def verl_fsdp2_wrap(model, mesh, reduce_dtype: torch.dtype = torch.float32) -> None:
    """fully_shard as verl/utils/fsdp_utils.py apply_fsdp2: each `_no_split_modules` layer, the embedding when untied,
    then the root; MixedPrecisionPolicy bf16 params / `reduce_dtype` reduce (verl's engine: its
    fsdp_config.mixed_precision.reduce_dtype, fp32 by default)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs = {"mesh": mesh, "reshard_after_forward": True,
              "mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=reduce_dtype, cast_forward_inputs=True)}
    names = set(model._no_split_modules)
    for module in [m for m in model.modules() if type(m).__name__ in names or (
            isinstance(m, torch.nn.Embedding) and not model.config.tie_word_embeddings)]:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)


def verl_loss(model, ids, positions, labels, case: dict, cross_entropy):
    """verl's actor loss on one packed row: the logits divided in place by the temperature, the log-probs of the next
    tokens from `cross_entropy` (an autograd Function with flash_attn's memory), a per-token policy loss."""
    logits = model(input_ids=ids, attention_mask=None, position_ids=positions, use_cache=False).logits
    logits = logits.squeeze(0)
    logits.div_(case.get("temperature", 1.0))
    log_probs = -cross_entropy.apply(logits, labels)
    del logits
    return -(log_probs.exp() * torch.ones_like(log_probs)).mean()


def token_row(tokens: int):
    """One packed row of `tokens` ids (inside the caller's FakeTensorMode), its positions and its next-token labels:
    what every step case feeds the model."""
    ids = torch.randint(0, 1000, (1, tokens))
    return ids, torch.arange(tokens).unsqueeze(0), torch.roll(ids, shifts=-1, dims=1).squeeze(0)


def fsdp_tracker(model, optimizer):
    """FSDPMemTracker over the wrapped model and its optimizer (their states counted from the start)."""
    tracker = tracker_class(fsdp=True)(model, optimizer)
    tracker.track_external(model, optimizer)
    return tracker


def step_peak(case: dict) -> dict:
    """One training step as verl's FSDP engine runs it, the peak of rank 0 of a fake process group of `world`
    ranks by category (FSDPMemTracker, over the second step: the first creates the optimizer state). fully_shard
    as verl/utils/fsdp_utils.py apply_fsdp2 (each `_no_split_modules` layer, the embedding when untied, then the
    root, MixedPrecisionPolicy bf16 params / the case's `reduce` dtype, fp32 by default), the packed row's logits
    divided in place by the
    temperature and fed to the flash cross-entropy (log-probs of the next tokens), a per-token policy loss, AdamW,
    and zero_grad() (set_to_none, torch's default) after the step. `foreach`: AdamW's foreach argument (None: torch's
    default, the per-tensor loop on the CPU; True: the foreach step torch runs on CUDA)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    world = case["world"]
    mesh = fake_fsdp_mesh(world)
    tokens = case["tokens"]
    with FakeTensorMode():
        model = build(case, dtype=torch.float32)
        verl_fsdp2_wrap(model, mesh, REDUCE_DTYPES[case.get("reduce", "fp32")])
        # verl builds AdamW with neither foreach nor fused, which torch runs as the foreach step on CUDA and as the
        # per-tensor loop on the CPU (torch/optim/adam.py _default_to_fused_or_foreach); `foreach: true` forces the
        # CUDA path here (its fp32 temporaries: cards/memory.yaml optimizer_steps)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=case.get("foreach"))
        ids, positions, labels = token_row(tokens)
        tracker = fsdp_tracker(model, optimizer)
        with tracker:
            for step in range(2):
                verl_loss(model, ids, positions, labels, case, _FlashCrossEntropyStandIn).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=case.get("set_to_none", True))
                if step == 0:
                    tracker.reset_mod_stats()
                    reset_peak(tracker)
        by_kind = peak_by_category(tracker)
    return {"peak": by_kind, "world": world, "set_to_none": case.get("set_to_none", True),
            "reduce": case.get("reduce", "fp32"),
            "foreach": case.get("foreach"),
            "hidden": int(model.config.hidden_size), "vocab": int(model.config.vocab_size),
            "tied": bool(model.config.tie_word_embeddings)}



def kempnerforge_fsdp2_wrap(model, mesh) -> None:
    """fully_shard as KempnerForge's apply_fsdp2 (kempnerforge/distributed/parallel.py, 5666d0d): each decoder block,
    then the whole model, whose root unit holds the embedding, the final norm and the output head, all
    reshard_after_forward=True; the model cast to bf16 before (model.to(dtype=param_dtype)), fp32 reduce."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs = {"mesh": mesh, "reshard_after_forward": True,
              "mp_policy": MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32)}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def _live(tracker, kind: str | None = None) -> dict[str, int]:
    snap = tracker.get_tracker_snapshot(kind) if kind else tracker.get_tracker_snapshot()
    device = next(iter(snap))
    return {str(getattr(k, "value", k)): int(v) for k, v in snap[device].items()}


def head_probe(case: dict) -> dict:
    """What is alive when the root output unit, resharded after its forward, is gathered again for the head's
    backward at pp=1 (fsdp_walk.head_moments), by category from FSDPMemTracker over the second step: `forward_end`
    (the forward and loss done), `at_hook` (the root's pre_backward hook passed: a tensor hook registered on the
    logits after FSDP's runs after it, the root unsharded and the unit before it prefetched), `head_peak` (the peak
    from the start of the backward to the head's input gradient: the loss's peak, the root's copy-out and the head's
    matmul). `wrap`: "verl" (verl_fsdp2_wrap and verl_loss: the logits divided in place, flash cross-entropy) or
    "kempnerforge" (kempnerforge_fsdp2_wrap, and its training/loss.py cross_entropy_loss, F.cross_entropy on the
    bf16 logits, which train.py's `logits` holds through the backward)."""
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    world, tokens, verl = case["world"], case["tokens"], case["wrap"] == "verl"
    mesh = fake_fsdp_mesh(world)
    with FakeTensorMode():
        model = build(case, dtype=torch.float32 if verl else BF16)
        (verl_fsdp2_wrap if verl else kempnerforge_fsdp2_wrap)(model, mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
        ids, positions, labels = token_row(tokens)
        tracker = fsdp_tracker(model, optimizer)
        seen: dict = {}

        def note(name: str, kind: str | None = None):
            def hook(_grad):
                seen.setdefault(name, _live(tracker, kind))
            return hook

        def head_input(_module, args):
            args[0].register_hook(note("head_peak", "peak"))

        model.lm_head.register_forward_pre_hook(head_input)
        with tracker:
            for step in range(2):
                seen.clear()
                logits = model(input_ids=ids, attention_mask=None, position_ids=positions, use_cache=False).logits
                logits.register_hook(note("at_hook"))
                if verl:
                    row = logits.squeeze(0)
                    row.div_(case.get("temperature", 1.0))
                    log_probs = -_FlashCrossEntropyStandIn.apply(row, labels)
                    del logits, row
                    loss = -(log_probs.exp() * torch.ones_like(log_probs)).mean()
                else:
                    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels)
                seen["forward_end"] = _live(tracker)
                reset_peak(tracker)
                loss.backward()
                del loss
                logits = None
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step == 0:
                    tracker.reset_mod_stats()
                    reset_peak(tracker)
        root = sum(p.numel() for p in model.parameters()) - sum(
            p.numel() for layer in model.model.layers for p in layer.parameters())
        if verl:  # verl's root unit is [norm, lm_head]: the embedding is a unit of its own
            root -= model.model.embed_tokens.weight.numel()
    return {**seen, "world": world, "root_params": int(root), "layer_params":
            int(sum(p.numel() for p in model.model.layers[-1].parameters())),
            "head_params": int(model.lm_head.weight.numel()),
            "hidden": int(model.config.hidden_size), "vocab": int(model.config.vocab_size)}


def accumulation_probe(case: dict) -> dict:
    """What one micro-batch with gradient sync off leaves held (FSDP2 set_requires_gradient_sync(False), as NeMo
    AutoModel's and KempnerForge's trainers run every micro-batch but the last): verl's wrap with the case's `reduce`
    dtype, one forward, loss and backward after a full step (its optimizer state built), the live bytes by category
    before it (`before`) and after it (`after`): the held unsharded gradients are FSDPParam's accumulated gradient in
    reduce_dtype (to_accumulated_grad_if_needed), or, with reduce_dtype equal to param_dtype, the bf16 gradient
    autograd wrote."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    world, tokens = case["world"], case["tokens"]
    mesh = fake_fsdp_mesh(world)
    with FakeTensorMode():
        model = build(case, dtype=torch.float32)
        verl_fsdp2_wrap(model, mesh, REDUCE_DTYPES[case.get("reduce", "fp32")])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
        ids, positions, labels = token_row(tokens)
        tracker = fsdp_tracker(model, optimizer)
        with tracker:
            verl_loss(model, ids, positions, labels, case, _FlashCrossEntropyStandIn).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tracker.reset_mod_stats()
            before = _live(tracker)
            model.set_requires_gradient_sync(False)
            verl_loss(model, ids, positions, labels, case, _FlashCrossEntropyStandIn).backward()
            after = _live(tracker)
    return {"before": before, "after": after, "world": world, "reduce": case.get("reduce", "fp32"),
            "params": int(sum(p.numel() for p in model.parameters()))}


def _saved_storages(exclude: set[int]) -> tuple[dict[int, tuple[int, tuple]], object]:
    """A saved_tensors_hooks context that records each storage autograd saves (its bytes and the saved tensor's shape),
    but those in `exclude`."""
    saved: dict[int, tuple[int, tuple]] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in exclude:
            saved[storage._cdata] = (storage.nbytes(), tuple(tensor.shape))
        return tensor

    return saved, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)


def mlp_saves(case: dict) -> dict:
    """What the model's own MLP module (the first module whose class name ends in MLP: LlamaMLP, GPTNeoXMLP, GPT2MLP,
    NemotronMLP ...) saves for its backward on `tokens` tokens of a bf16 input that needs a gradient (the norm's
    output), under FakeTensorMode: the bytes of each storage saved once, its parameters left out."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tokens = case["tokens"]
    with FakeTensorMode():
        # the MLP reads no attention: eager, which every model class takes (NemotronForCausalLM no registered one)
        model = build({**case, "num_layers": 1}, attention="eager")
        mlp = next(m for m in model.modules() if type(m).__name__.endswith("MLP"))
        x = torch.randn(1, tokens, model.config.hidden_size, dtype=BF16, requires_grad=True)
        saved, hooks = _saved_storages({p.untyped_storage()._cdata for p in mlp.parameters()})
        with hooks:
            mlp(x)
    return {"bytes": int(sum(nbytes for nbytes, _ in saved.values())), "tensors": len(saved),
            "mlp_class": type(mlp).__name__, "hidden": int(model.config.hidden_size)}


def expert_gate_saves(case: dict) -> dict:
    """What the model's routed experts module (the first module whose class name ends in Experts: GptOssExperts ...)
    saves for its backward on `tokens` tokens routed to `top_k` experts each, under FakeTensorMode, run with its own
    _apply_gate and again with transformers' _default_apply_gate (act_fn(gate) * up, ACT2FN silu) in its place: the
    bytes of each storage saved once, its parameters left out. Their difference is the model's gate over the default
    one; routed copies and the expert width are given beside it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.activations import ACT2FN
    from transformers.integrations.moe import _default_apply_gate

    tokens, top_k = case["tokens"], case["top_k"]
    out = {}
    with FakeTensorMode():
        model = build({**case, "num_layers": 1}, attention="eager")
        experts = next(m for m in model.modules() if type(m).__name__.endswith("Experts"))
        hidden, width = model.config.hidden_size, experts.intermediate_size
        for name, gate in (("own", None), ("default", _default_apply_gate)):
            if gate is not None:
                experts.act_fn = ACT2FN["silu"]
                experts._apply_gate = gate.__get__(experts)
            x = torch.randn(tokens, hidden, dtype=BF16, requires_grad=True)
            index = (torch.arange(tokens * top_k) % experts.num_experts).view(tokens, top_k)
            weights = torch.full((tokens, top_k), 1.0 / top_k, dtype=BF16, requires_grad=True)
            saved, hooks = _saved_storages({p.untyped_storage()._cdata for p in experts.parameters()})
            with hooks:
                experts(x, index, weights)
            out[name] = int(sum(nbytes for nbytes, _ in saved.values()))
    return {"bytes": out, "experts_class": type(experts).__name__, "copies": tokens * top_k, "width": int(width)}


def activation_saves(case: dict) -> dict:
    """Per ACT2FN activation (transformers.activations.ACT2CLS), what it keeps for its backward besides its output, run
    on a bf16 matmul output of side x side elements: whether it keeps its input, and the bytes per element of the
    rest of the input's shape (a parameter of prelu or xielu, and xielu's one-element constants, are left out)."""
    from transformers.activations import ACT2CLS, ACT2FN

    side = case.get("side", 64)
    out = {}
    for name in ACT2CLS:
        act = ACT2FN[name].to(BF16)
        a, w = torch.randn(side, side, dtype=BF16), torch.randn(side, side, dtype=BF16, requires_grad=True)
        x = a @ w
        saved, hooks = _saved_storages({a.untyped_storage()._cdata, w.untyped_storage()._cdata})
        with hooks:
            y = act(x)
        keeps_input = saved.pop(x.untyped_storage()._cdata, None) is not None
        saved.pop(y.untyped_storage()._cdata, None)
        inner = sum(nbytes for nbytes, shape in saved.values() if shape == tuple(x.shape))
        out[name] = {"input": keeps_input, "inner_bytes": inner / x.numel()}
    return {"activations": out}


def answer(request: dict) -> dict:
    """The results of one ask ({"cases": [...]}), with the torch and transformers versions that gave them."""
    import transformers

    results = []
    for case in request["cases"]:
        start = time.perf_counter()
        try:
            kind = case.get("kind")
            out = (step_peak(case) if kind == "step" else head_probe(case) if kind == "head"
                   else accumulation_probe(case) if kind == "accumulate" else mlp_saves(case) if kind == "mlp"
                   else expert_gate_saves(case) if kind == "expert_gate"
                   else activation_saves(case) if kind == "activations" else layer_bytes(case))
            out["ok"] = True
        except Exception as exc:  # reported per case, so one failing model does not hide the others
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        out["seconds"] = round(time.perf_counter() - start, 2)
        results.append({**{k: v for k, v in case.items() if k != "config"}, **out})
    return {"torch": torch.__version__, "transformers": transformers.__version__, "results": results}


if __name__ == "__main__":
    register_stand_in()
    serve(answer)
