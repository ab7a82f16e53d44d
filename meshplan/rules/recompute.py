"""The recompute rules of cards/rules.yaml (RC*): each recompute knob with the recompute mode and framework that
read it.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.arithmetic.schedule import plan_stages
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import default_render, unwritable
from meshplan.knowledge.gdn_config import PATTERN_LAYERS_PER_DECODER_LAYER, cuts_a_decoder_layer, decoder_layers
from meshplan.knowledge.releases import numbers
from meshplan.rules.engine import Context, Values, rule
from meshplan.schema.plan import Job


@rule("RC002", reads=("recompute", "selective_ac_option"))
def selective_ac_option_needs_torchtitans_selective(ctx: Context) -> Values:
    p = ctx.plan
    if p.selective_ac_option is None:
        return None
    card = ctx.card
    if card.recompute.selective != "op_sac":
        layers = card.adapter is not None and card.adapter.renders("recompute_layers")
        return {"option": p.selective_ac_option, "recompute": p.recompute, "framework": card.display_name,
                "why": f"{card.display_name} has no every-N-blocks selective recompute",
                "fix": "Drop selective_ac_option; the nearest is recompute=full"
                       + (" with recompute_layers (layers per stage recomputed in full)." if layers else ".")}
    if p.recompute == "selective":
        return None
    return {"option": p.selective_ac_option, "recompute": p.recompute, "framework": card.display_name,
            "why": "the option is read only with selective activation checkpointing",
            "fix": "Use recompute=selective with it, or drop selective_ac_option."}



def _method_given(values: dict, job: Job) -> tuple | None:
    """RC003's screen: it passes wherever no recompute_method is given, and is decided by every field it reads
    elsewhere."""
    if values["recompute_method"] is None:
        return None
    return tuple(values[name] for name in ("tp", "pp", "ep", "zero_stage", "recompute", "recompute_layers",
                                           "recompute_method"))


@rule("RC003", reads=("tp", "pp", "ep", "zero_stage", "recompute", "recompute_layers", "recompute_method"),
      screen=_method_given)
def recompute_method_needs_full(ctx: Context) -> Values:
    """recompute_method where the config `render` writes for the plan by default has a key for it (verl's and
    SkyRL's FSDP backends at ZeRO 3 have none, their Megatron backends do: _no_key), with full recompute."""
    p = ctx.plan
    if p.recompute_method is None:
        return None
    card = ctx.card
    values = {"method": p.recompute_method, "recompute": p.recompute, "layers": p.recompute_layers,
              "framework": card.display_name}
    if (instead := _no_key(ctx, "recompute_method")) is not None:
        return {**values, "why": f"{card.display_name}{_where(ctx)} checkpoints each layer on its own (no "
                                 "recompute_method)",
                "fix": instead or "Drop recompute_method (recompute=full recomputes every layer)."}
    if p.recompute != "full":
        return {**values, "why": "recompute_method applies to full recompute only",
                "fix": "Use recompute=full with it, or drop recompute_method."}
    if p.recompute_method == "block" and p.recompute_layers is None:
        return {**values, "why": "the block method needs the number of layers per stage it recomputes",
                "fix": "Give recompute_layers (e.g. 1), or use recompute_method=uniform."}
    if p.recompute_method == "uniform" and p.recompute_layers == 0:  # _checkpointed_forward: layer_idx += 0
        return {**values, "why": "the uniform method steps through a stage recompute_layers layers at a time, so "
                                 "0 never advances (Megatron-Core's _checkpointed_forward loops: the run hangs)",
                "fix": "Use recompute_layers=1 (every layer recomputed on its own) or more, or "
                       "recompute_method=block (recompute_layers=0: no layer recomputed)."}
    return None



def _modules_given(values: dict, job: Job) -> tuple | None:
    """RC004's screen: it passes wherever no recompute_modules are given, and is decided by every field it reads
    elsewhere."""
    modules = values["recompute_modules"]
    if modules is None:
        return None
    return values["tp"], values["pp"], values["ep"], values["zero_stage"], values["recompute"], tuple(modules)


@rule("RC004", reads=("tp", "pp", "ep", "zero_stage", "recompute", "recompute_modules"), screen=_modules_given)
def recompute_modules_need_megatron_selective(ctx: Context) -> Values:
    """recompute_modules where the config `render` writes for the plan by default has a key for them (_no_key), with
    selective recompute, naming only modules the model has."""
    p, arch = ctx.plan, ctx.arch
    if p.recompute_modules is None:
        return None
    card = ctx.card
    values = {"modules": ",".join(p.recompute_modules), "recompute": p.recompute, "framework": card.display_name}
    if (instead := _no_key(ctx, "recompute_modules")) is not None:
        return {**values, "why": f"{card.display_name}{_where(ctx)} has no per-module recompute",
                "fix": instead or "Drop recompute_modules; use recompute=selective or full."}
    if p.recompute != "selective":
        return {**values, "why": "recompute_modules apply to selective recompute only",
                "fix": "Use recompute=selective with them, or drop recompute_modules."}
    wrong = [m for m in p.recompute_modules if (m == "mla_up_proj" and arch.mla is None)
             or (m == "gdn_norm_out" and arch.gdn is None)
             or (m in ("moe", "moe_act", "shared_experts") and arch.moe is None)
             or (m == "shared_experts" and arch.moe is not None and not arch.moe.shared_expert_ffn_hidden_size)]
    if wrong:
        keep = [m for m in p.recompute_modules if m not in wrong] or ["core_attn"]
        return {**values, "why": f"{', '.join(wrong)} need{'s' if len(wrong) == 1 else ''} a layer this model lacks "
                                 "(MLA, MoE, shared experts or Gated DeltaNet)",
                "fix": f"Use recompute_modules={','.join(keep)}."}
    return None



@rule("RC001", reads=("recompute", "recompute_layers"))
def recompute_layers_need_full(ctx: Context) -> Values:
    p = ctx.plan
    if p.recompute_layers is None or p.recompute == "full":
        return None
    return {"layers": p.recompute_layers, "recompute": p.recompute}



def _no_key(ctx: Context, name: str) -> str | None:
    """Where the config `render` writes for this plan by default (its version and variant: verl's and SkyRL's
    zero_stage 3 is their FSDP backend) has no key for the knob, what the card says to do instead (unwritable; a
    key null always has one); a card without an adapter has no key for any knob (its cannot_run entry, or "").
    None where there is a key."""
    instead = unwritable(ctx.card, ctx.job, ctx.plan, name)
    if instead is None and default_render(ctx.card, ctx.job, ctx.plan) is None:
        return ""
    return instead


def _where(ctx: Context) -> str:
    """' <version> (<variant>)' of the config `render` writes for the plan by default, or ''."""
    target = default_render(ctx.card, ctx.job, ctx.plan)
    return f" {target[0]} ({target[1]})" if target else ""



@rule("RC005", reads=("tp", "pp", "ep", "zero_stage", "recompute_layers"))
def recompute_layers_need_a_key(ctx: Context) -> Values:
    """recompute_layers where the config `render` writes by default has no key for it (or, on a card without an
    adapter, where the card says the framework cannot run it): the framework recomputes every layer, so the estimate
    would price a recompute it does not run."""
    p = ctx.plan
    if p.recompute_layers is None:
        return None
    instead = unwritable(ctx.card, ctx.job, p, "recompute_layers")
    if instead is None:
        return None
    return {"layers": p.recompute_layers, "framework": ctx.card.display_name,
            "where": _where(ctx), "fix": instead}



@rule("RC006", reads=("tp", "pp", "ep", "zero_stage", "recompute"))
def recompute_mode_needs_a_key(ctx: Context) -> Values:
    """A recompute mode the config `render` writes for the plan by default cannot set (its recompute_<mode> knob has
    key null: SkyRL's main_sft always checkpoints every layer with the FSDP strategy, verl's and SkyRL's FSDP backends
    have no selective), so the estimate would price a recompute the run does not do and render refuses it."""
    p = ctx.plan
    instead = unwritable(ctx.card, ctx.job, p, f"recompute_{p.recompute}")
    if instead is None:
        return None
    return {"recompute": p.recompute, "framework": ctx.card.display_name, "where": _where(ctx), "fix": instead}



@rule("RC007", reads=("recompute", "recompute_layers", "recompute_method"))
def recompute_layers_cut_a_decoder_layer(ctx: Context) -> Values:
    """A Gated DeltaNet hybrid's recompute_layers, counted in meshplan's pattern layers, that no count of the
    GPTModel's decoder layers makes: an odd block, or uniform chunks of an odd count over one (one is a decoder
    layer a chunk, Megatron's own uniform default)."""
    p, arch = ctx.plan, ctx.arch
    if arch.gdn is None or arch.layer_pattern is None or p.recompute != "full" or p.recompute_layers is None:
        return None
    n, method = p.recompute_layers, p.recompute_method or "block"
    if not cuts_a_decoder_layer(n) or (method == "uniform" and n == 1):
        return None
    even = n + 1 if method == "uniform" else max(PATTERN_LAYERS_PER_DECODER_LAYER, n - 1)
    return {"layers": n, "method": method, "model": arch.name, "even": even,
            "decoder": decoder_layers(even),
            "plural": "" if even == PATTERN_LAYERS_PER_DECODER_LAYER else "s"}


def _layers_given(values: dict, job: Job) -> tuple | None:
    """RC009's screen: it passes wherever no recompute_layers are given or the recompute is not full."""
    if values["recompute_layers"] is None or values["recompute"] != "full":
        return None
    return tuple(values[name] for name in RC009_READS)


RC009_READS = ("tp", "pp", "vpp", "zero_stage", "recompute", "recompute_layers", "recompute_method",
               "first_stage_layers", "last_stage_layers", "pipeline_layout", "account_for_embedding",
               "account_for_loss", "pipeline_schedule")


@rule("RC009", reads=RC009_READS, screen=_layers_given)
def recompute_layers_above_a_chunk(ctx: Context) -> Values:
    """Full recompute of more layers than the largest pipeline chunk holds (Megatron-Core's num_layers_per_pipeline_
    rank, a virtual chunk's TransformerBlock): both methods recompute at most the chunk's layers (uniform: one chunk
    of all of them, block: every layer), so a warning naming the count it reads as. A layout the stages cannot be
    built for is the pipeline rules' (PP004, PP009)."""
    p = ctx.plan
    if p.recompute != "full" or p.recompute_layers is None:
        return None
    try:
        chunks = plan_stages(ctx.job, p).chunks
    except MeshplanError:
        return None
    most = max(len(chunk) for rank in chunks for chunk in rank)
    if p.recompute_layers <= most:
        return None
    chunk = ("pipeline rank's virtual chunk" if p.vpp > 1 else "pipeline stage") if p.pp > 1 else "stage (pp=1)"
    method = p.recompute_method or "block"
    words = "one chunk of all its layers" if method == "uniform" else "every layer"
    return {"layers": p.recompute_layers, "most": most, "chunk": chunk, "method": f"{method}: {words}"}


@rule("RC008", reads=("recompute", "selective_ac_option"))
def selective_refused_by_model_code(ctx: Context) -> Values:
    """Selective recompute on a model whose model code in this release refuses it (the card's
    attention.no_selective_releases: torchtitan 0.1.x's Llama 4 through FlexAttention); the fix names the newest known
    release whose model code takes it, and full / none with the request's selective_ac_option dropped (RC002 refuses
    it beside them)."""
    att, arch = ctx.card.attention, ctx.arch
    if ctx.plan.recompute != "selective" or att is None:
        return None
    release = ctx.job.framework_version or ctx.card.version
    if not att.refuses_selective(arch.model_type, release):
        return None
    chunked = arch.model_type in att.chunked_model_types
    takes = sorted((v for v in ctx.card.known_versions()
                    if not att.refuses_selective(arch.model_type, v) and (not chunked or att.ships_chunked(v))),
                   key=lambda v: numbers(v) or ())
    newer = (f", or framework_version={takes[-1]}, whose model code takes selective recompute with FlexAttention"
             if takes else "")
    # the file's selective_ac_option goes with selective (RC002 refuses it beside full or none): each of those says so
    drop = " (drop selective_ac_option)" if ctx.plan.selective_ac_option is not None else ""
    return {"model": arch.name, "type": arch.model_type, "framework": ctx.card.display_name, "release": release,
            "newer": newer, "drop": drop}
