"""The precision rules of cards/rules.yaml (FP001, PR*): FP8 on a GPU and framework that run it, low-precision
optimizer states, gradient reduction dtype, Muon where Megatron-Core runs it.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.arithmetic.memory_states import fp8_recipe, megatron_loss_name
from meshplan.arithmetic.offload import optimizer_share
from meshplan.knowledge.adapter_card import AdapterKnob
from meshplan.knowledge.adapter_knobs import rendered_knob
from meshplan.knowledge.cards import FrameworkCard
from meshplan.knowledge.hardware import gpu_catalog
from meshplan.knowledge.releases import numbers
from meshplan.rules.engine import Context, Values, rule


@rule("FP001", reads=())
def fp8_needs_hardware(ctx: Context) -> Values:
    """The fix names the catalog's GPUs that state FP8 throughput (cards/hardware.yaml fp8_flops), not a list of
    its own that a GPU added to the catalog would miss."""
    if ctx.job.precision != "fp8" or ctx.job.gpu.fp8_flops is not None:
        return None
    return {"gpu": ctx.job.gpu.name,
            "fp8_gpus": ", ".join(key for key, spec in gpu_catalog().items() if spec.fp8_flops is not None)}



def default_version_knob(card: FrameworkCard, name: str) -> AdapterKnob:
    """The knob as the framework's default version writes it (render refuses another version's own way)."""
    return card.adapter.versions[card.adapter.default_version].knobs[name]  # type: ignore[union-attr]


def lacks_key(card: FrameworkCard, name: str) -> str | None:
    """Why no version of the framework can set this knob (the default version's `instead`), or None when one can
    (render refuses a version that lacks it with that version's `instead`)."""
    if card.adapter is None:
        return f"meshplan models no such knob for {card.display_name}; leave it out."
    if any(v.knobs[name].key is not None for v in card.adapter.versions.values()):
        return None
    return default_version_knob(card, name).instead


def keyless_refusal(card: FrameworkCard, name: str, values: dict, why: str | None = None) -> Values:
    """A rule's refusal of a setting no version of the framework has a key for (lacks_key), with the card's way out:
    `why` (default: the config meshplan writes for the framework has no key for it, which verl's
    override_transformer_config could still take) beside the rule's own values; None where a version has the key."""
    instead = lacks_key(card, name)
    if instead is None:
        return None
    return {**values, "why": why or f"the {card.display_name} config meshplan writes has no key for it", "fix": instead}



def _takes(card: FrameworkCard, name: str) -> list[str] | None:
    """The values of a knob with a vocabulary that the framework's default version writes (AdapterKnob.values), or
    None where the knob takes any value meshplan has."""
    values = default_version_knob(card, name).values if card.adapter is not None else None
    return None if values is None else [k for k, v in values.items() if v is not None]



@rule("PR001", reads=("zero_stage", "optimizer_state_dtype"))
def optimizer_state_dtype_needs_precision_aware_adam(ctx: Context) -> Values:
    p = ctx.plan
    if p.optimizer_state_dtype in (None, "fp32"):
        return None
    card = ctx.card
    values = {"dtype": p.optimizer_state_dtype, "framework": card.display_name, "zero": p.zero_stage}
    refused = keyless_refusal(card, "optimizer_state_dtype", values,
                              f"{card.display_name} has no low-precision Adam moments")
    if refused:
        return refused
    takes = _takes(ctx.card, "optimizer_state_dtype")
    if takes is not None and p.optimizer_state_dtype not in takes:
        return {**values, "why": f"{card.display_name}'s optimizer takes {' or '.join(takes)} Adam moments",
                "fix": default_version_knob(ctx.card, "optimizer_state_dtype").instead}
    if p.zero_stage != 1:
        return {**values, "why": "Megatron's precision-aware optimizer runs inside the distributed optimizer only",
                "fix": "Use zero_stage=1 (the distributed optimizer), or leave optimizer_state_dtype out (fp32)."}
    return None



def _offloads_optimizer(plan) -> bool:
    """Whether any share of the optimizer is offloaded (offload.optimizer_share, the one reading of the two knobs)."""
    return optimizer_share(plan) > 0



@rule("PR002", reads=("zero_stage", "fp8_param_gather", "fp8_recipe", "optimizer_offload",
      "optimizer_offload_fraction"))
def fp8_param_gather_needs_fp8(ctx: Context) -> Values:
    p, job = ctx.plan, ctx.job
    if not p.fp8_param_gather:
        return None
    card = ctx.card
    values = {"precision": job.precision, "zero": p.zero_stage, "framework": card.display_name}
    if job.precision != "fp8":
        return {**values, "why": "fp8 primary weights exist only in an fp8 run",
                "fix": "Use precision=fp8 with it, or drop fp8_param_gather."}
    refused = keyless_refusal(card, "fp8_param_gather", values, f"{card.display_name} keeps bf16 weights")
    if refused:
        return refused
    if ctx.backend == "megatron" and p.zero_stage == 0:
        return {**values, "why": "Megatron gathers fp8 parameters in the distributed optimizer or FSDP only",
                "fix": "Use zero_stage=1 (the distributed optimizer) or 3 (Megatron-FSDP)."}
    recipe = fp8_recipe(job, p)
    if card.memory_convention.startswith("fsdp2") and recipe != "tensorwise":
        return {**values, "why": f"torchao casts FSDP2's all-gather to fp8 with tensorwise scaling only (fp8_recipe "
                                 f"is {recipe})",
                "fix": "Use fp8_recipe=tensorwise with it, or drop fp8_param_gather."}
    if ctx.backend == "megatron" and _offloads_optimizer(p) and recipe != "delayed":
        return {**values, "why": f"with the optimizer offloaded to the CPU, fp8 parameters need delayed scaling "
                                 f"(fp8_recipe is {recipe})",
                "fix": "Use fp8_recipe=delayed, drop fp8_param_gather, or keep the optimizer on the GPU."}
    return None


# Scaling granularity from coarsest to finest: per-tensor with a delayed amax history, per-tensor current
# scaling, per row, 1x128 / 128x128 blocks, 1x32 blocks. The nearest recipe to one a GPU or framework lacks is
# the closest in this order (ties go to the finer one).
RECIPE_GRANULARITY = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8")



def nearest_recipe(recipe: str, allowed: list[str]) -> str | None:
    at = RECIPE_GRANULARITY.index(recipe)
    ranked = sorted(allowed, key=lambda r: (abs(RECIPE_GRANULARITY.index(r) - at), -RECIPE_GRANULARITY.index(r)))
    return ranked[0] if ranked else None



def runnable_recipes(card: FrameworkCard, gpu) -> list[str]:
    """The recipes both the GPU (hardware.yaml fp8_recipes) and the framework (its fp8_<recipe> knobs) run."""
    return [r for r in RECIPE_GRANULARITY if r in gpu.fp8_recipes and lacks_key(card, f"fp8_{r}") is None]



@rule("PR003", reads=("fp8_recipe",))
def fp8_recipe_needs_gpu_and_framework(ctx: Context) -> Values:
    p, job = ctx.plan, ctx.job
    if p.fp8_recipe is None:
        return None
    card = ctx.card
    values = {"recipe": p.fp8_recipe, "precision": job.precision, "gpu": job.gpu.name,
              "framework": card.display_name}
    if job.precision != "fp8":  # precision=fp8 offered only where the recipe then runs (the checks below)
        runs = job.gpu.fp8_flops is not None and p.fp8_recipe in runnable_recipes(ctx.card, job.gpu)
        return {**values, "why": "the recipe scales fp8 tensors, and this run has none",
                "fix": "Use precision=fp8 with it, or drop fp8_recipe." if runs else
                       f"Drop fp8_recipe ({p.fp8_recipe} does not run on {job.gpu.name} with {card.display_name})."}
    if job.gpu.fp8_flops is None:
        return None  # FP001 says it
    both = runnable_recipes(ctx.card, job.gpu)
    nearest = nearest_recipe(p.fp8_recipe, both)
    instead = lacks_key(ctx.card, f"fp8_{p.fp8_recipe}")
    fix = (f"Use fp8_recipe={nearest} (what {job.gpu.name} and {card.display_name} both run: {', '.join(both)})."
           if nearest else (instead or f"{card.display_name} runs none of {job.gpu.name}'s FP8 recipes; use "
                                       "precision=bf16.") + " Drop fp8_recipe with fp8.")
    if p.fp8_recipe not in job.gpu.fp8_recipes:
        return {**values, "why": f"{job.gpu.name}'s tensor cores do not run it (it runs "
                                 f"{', '.join(job.gpu.fp8_recipes)})", "fix": fix}
    if instead:
        return {**values, "why": instead.removesuffix("."), "fix": fix}  # the card's sentence
    return None



@rule("PR004", reads=("zero_stage", "tp", "pp", "ep", "grad_reduce_in_fp32"))  # tp, pp, ep: the variant render writes
def grad_reduce_dtype_needs_the_framework(ctx: Context) -> Values:
    """A gradient reduce dtype the framework cannot set: no version of it has the knob, or the engine the plan runs
    (the default render's version and variant: verl's and SkyRL's FSDP engines set it under their own key) has none,
    or sets it at other ZeRO stages only. The engine-without-the-knob branch is reached by no card today (every
    version and variant of a framework that has the knob somewhere has a key for it): it guards a card that adds one."""
    p = ctx.plan
    if p.grad_reduce_in_fp32 is None:
        return None
    knob = "grad_reduce_fp32" if p.grad_reduce_in_fp32 else "grad_reduce_bf16"
    card, dtype = ctx.card, "fp32" if p.grad_reduce_in_fp32 else "bf16"
    value = str(p.grad_reduce_in_fp32).lower()
    instead = lacks_key(card, knob)
    if instead is None:  # (so the card has an adapter section)
        spec = rendered_knob(card, ctx.job, p, knob) or default_version_knob(card, knob)
        at_stage = f"{card.display_name} (zero_stage={p.zero_stage})"
        if spec.key is None:
            return {"value": value, "framework": at_stage, "why": f"{card.display_name} cannot reduce gradients in "
                    f"{dtype} on the engine zero_stage {p.zero_stage} runs", "fix": spec.instead}
        if spec.zero_stages is None or p.zero_stage in spec.zero_stages:
            return None
        return {"value": value, "framework": at_stage, "why": f"{card.display_name} sets a {dtype} gradient buffer at "
                f"zero_stage {' or '.join(map(str, spec.zero_stages))} only", "fix": spec.instead}
    return {"value": value, "framework": card.display_name,
            "why": f"{card.display_name} cannot reduce gradients in {dtype}", "fix": instead}



@rule("PR005", reads=("zero_stage", "optimizer", "optimizer_state_dtype", "optimizer_offload",
      "optimizer_offload_fraction"))
def muon_the_framework_cannot_run(ctx: Context) -> Values:
    """Muon where the framework's card runs it (its muon section): at its ZeRO stages only (Megatron-Core's
    emerging-optimizer path: no FSDP, and no precision-aware or CPU optimizer beside its layer-wise one)."""
    p = ctx.plan
    if p.optimizer != "muon":
        return None
    card = ctx.card
    values = {"framework": card.display_name, "zero": p.zero_stage}
    refused = keyless_refusal(card, "optimizer", values, f"{card.display_name} has no Muon meshplan can write")
    if refused:
        return refused
    muon = card.muon
    if muon is None:
        return {**values, "why": f"meshplan models no Muon step for {card.display_name}",
                "fix": "Leave optimizer out (adam)."}
    layer_wise = muon.assignment == "layer_wise"
    if p.zero_stage not in muon.zero_stages:  # the fix also names what the branch below would refuse there
        also = "".join(f" and {c}" for c, on in (("optimizer_state_dtype=fp32", p.optimizer_state_dtype not in
                                                  (None, "fp32")), ("optimizer_offload=false", _offloads_optimizer(p)))
                       if on) if layer_wise else ""
        first, *rest = sorted(muon.zero_stages, reverse=True)
        what = " (Muon's layer-wise distributed optimizer)" if layer_wise else ""
        others = "".join(f" or {z}" for z in rest)
        return {**values, "why": muon.zero_why,
                "fix": f"Use zero_stage={first}{also}{what}{others}, or leave optimizer out."}
    if layer_wise and (p.optimizer_state_dtype not in (None, "fp32") or _offloads_optimizer(p)):
        return {**values, "why": "the precision-aware and CPU-offloaded optimizers need Megatron's distributed "
                                 "optimizer, which Muon replaces by its layer-wise one",
                "fix": "Leave optimizer_state_dtype and the optimizer offload out (fp32 momentum on the GPU), or "
                       "use optimizer=adam."}
    return None



# The GPU generations whose attention runs Transformer Engine's FP8 fused attention (cuDNN's FP8 kernel: sm90+)
FP8_ATTENTION_ARCHES = ("hopper", "blackwell")


@rule("PR006", reads=())
def fp8_activation_input_store_needs_swiglu(ctx: Context) -> Values:
    """activation_func_fp8_input_store where the framework and model run it: a framework with the key (Megatron-
    Bridge's model field; Megatron-LM's pretrain_gpt.py has no flag for it), a SwiGLU MLP (Megatron-Core's
    TransformerConfig refuses it otherwise) run by the fused kernel (mlp.py's unfused glu() never reads the switch).
    It needs no fp8 recipe: the fused SwiGLU casts its saved input to float8_e4m3fn itself."""
    job, card = ctx.job, ctx.card
    if not job.fp8_activation_input_store:
        return None
    values = {"framework": card.display_name, "model": job.model.name}
    refused = keyless_refusal(card, "fp8_activation_input_store", values)
    if refused:
        return refused
    if not job.model.is_swiglu:  # TransformerConfig: activation_func F.silu with gated_linear_unit, else ValueError
        kind = ("gpt-oss's clamped GLU (quick_gelu gated in Megatron-Core)" if job.model.swiglu_limit is not None
                else f"a {'gated ' if job.model.gated_mlp else ''}{job.model.activation} MLP")
        return {**values, "why": f"Megatron-Core stores the activation's input in fp8 for SwiGLU only, and the model "
                                 f"has {kind}",
                "fix": "Drop fp8_activation_input_store (the model's MLP keeps its bf16 input)."}
    if not job.bias_activation_fusion:  # mlp.py's unfused glu() never reads activation_func_fp8_input_store
        return {**values, "why": "Megatron-Core's unfused glu() (bias_activation_fusion off) keeps its bf16 input: "
                                 "only the fused SwiGLU kernel casts it to fp8",
                "fix": "Turn bias_activation_fusion on with it, or drop fp8_activation_input_store."}
    return None


@rule("PR007", reads=("fp8_recipe", "attention_backend"))
def fp8_dot_product_attention_needs_fp8(ctx: Context) -> Values:
    """FP8 dot-product attention where it runs: a framework with the key, an fp8 run (fp8_dpa is a field of the fp8
    recipe, read inside fp8_autocast only) whose recipe Megatron-Core builds with fp8_dpa (delayed, tensorwise, mxfp8;
    its blockwise recipe without it), a GPU whose cuDNN runs FP8 fused attention, and Transformer Engine's fused
    attention backend (its FlashAttention and unfused backends are disabled for FP8 training)."""
    job, card, p = ctx.job, ctx.card, ctx.plan
    if not job.fp8_dot_product_attention:
        return None
    recipe = fp8_recipe(job, p)
    values = {"framework": card.display_name, "precision": job.precision, "recipe": recipe or "none",
              "gpu": job.gpu.name}
    refused = keyless_refusal(card, "fp8_dot_product_attention", values)
    if refused:
        return refused
    if job.precision != "fp8":
        return {**values, "why": "fp8_dpa is a field of the fp8 recipe, read only inside fp8_autocast",
                "fix": "Use precision=fp8 with it, or drop fp8_dot_product_attention."}
    if job.gpu.fp8_flops is None:
        return None  # FP001 says it
    if job.gpu.arch not in FP8_ATTENTION_ARCHES:
        return {**values, "why": f"cuDNN's FP8 fused attention runs on Hopper and Blackwell only ({job.gpu.name} is "
                                 f"{job.gpu.arch or 'neither'})",
                "fix": "Drop fp8_dot_product_attention (bf16 attention), or use a Hopper or Blackwell GPU."}
    if recipe == "blockwise":
        return {**values, "why": "Megatron-Core builds its blockwise recipe (Float8BlockScaling) without fp8_dpa",
                "fix": "Use fp8_recipe=delayed, tensorwise or mxfp8 with it, or drop fp8_dot_product_attention."}
    if p.attention_backend in ("flash", "unfused"):
        return {**values, "why": f"Transformer Engine runs FP8 attention in its fused (cuDNN) backend only, and "
                                 f"attention_backend is {p.attention_backend}",
                "fix": "Use attention_backend=fused (or auto) with it, or drop fp8_dot_product_attention."}
    return None


@rule("PR009", reads=("zero_stage",))
def te_cross_entropy_the_release_refuses(ctx: Context) -> Values:
    """cross_entropy_fusion_impl te with cross_entropy_loss_fusion on a framework release whose argument validation
    refuses it (the card's defaults.cross_entropy_te_refused_from: Megatron-LM's validate_args from 0.19 on). The
    release is the one the request named (Job.framework_version_asked: 0.14 to 0.18 take te, though 0.19.2's facts
    stand for them), else the known one its framework_version resolved to, else the card's own; a version that names
    no release numbers (main) is the newest, the card's."""
    job, card = ctx.job, ctx.card
    since = card.defaults.cross_entropy_te_refused_from
    if megatron_loss_name(job, ctx.plan) != "te" or since is None:
        return None
    named = numbers(job.framework_version_asked or "") or numbers(job.framework_version or "")
    release, floor = named or numbers(card.version), numbers(since)
    if release is None or floor is None or release < floor:
        return None
    return {"framework": card.display_name, "release": ".".join(map(str, release)), "since": since}
