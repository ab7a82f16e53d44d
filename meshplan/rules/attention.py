"""The kernel-setting rules of cards/rules.yaml (AT*, CH001, CO001): an attention backend, dropout or torch.compile
the framework can run and write, and one that cannot run the model's chunked attention.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.knowledge.cards import framework_card
from meshplan.rules.engine import Context, Values, rule
from meshplan.schema.choices import FRAMEWORKS


@rule("AT001", reads=("zero_stage", "attention_backend", "dropout"))
def attention_setting_without_a_key(ctx: Context) -> Values:
    """attention_backend (other than auto) or dropout on where the framework's adapter knob has no key, or no value
    for that backend, on the engine the plan's ZeRO stage selects (the card's variant_knobs of that engine)."""
    p, card = ctx.plan, ctx.card
    if card.adapter is None:
        return None
    section = card.adapter
    table = {**section.versions[section.default_version].knobs, **section.variant_knobs.get(ctx.backend, {})}
    asked = [("attention_backend", f"attention_backend={p.attention_backend}")] if p.attention_backend != "auto" else []
    asked += [("dropout", "dropout=true")] if p.dropout else []
    for name, setting in asked:
        knob = table[name]
        theirs = knob.key if knob.values is None or knob.key is None else (knob.values or {}).get(p.attention_backend)
        if theirs is None:
            key = "no key" if knob.key is None else f"{knob.key} takes " + ", ".join(
                k for k, v in knob.values.items() if v is not None)
            return {"setting": setting, "framework": card.display_name, "key": key, "fix": knob.instead or ""}
    return None



@rule("AT002", reads=("zero_stage", "attention_backend"))
def flash_on_unequal_head_widths(ctx: Context) -> Values:
    """attention_backend=flash through Megatron-Core on a model whose Q/K and V heads differ in width (MLA): only
    Transformer Engine 2.17 and later pad V for FlashAttention-2."""
    mla = ctx.job.model.mla
    if ctx.plan.attention_backend != "flash" or ctx.backend != "megatron" or mla is None:
        return None
    qk, v = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
    if qk == v:
        return None
    return {"model": ctx.job.model.name, "qk": qk, "v": v}



@rule("CH001", reads=("zero_stage", "attention_backend"))
def flash_refuses_chunks(ctx: Context) -> Values:
    """A chunked model (Llama 4) longer than its chunk on an FSDP engine that loads transformers with
    flash_attention_2 under this attention_backend (the card's attention.chunk_refused_backends):
    create_chunked_causal_mask raises in the model's first forward."""
    arch, card, p = ctx.arch, ctx.card.attention, ctx.plan
    if card is None or ctx.backend != "fsdp" or p.attention_backend not in card.chunk_refused_backends:
        return None
    if not arch.chunked_layers or ctx.job.seq_length <= (arch.attention_chunk_size or 0):
        return None
    knob = card_knob(ctx, "attention_backend")
    eager = ("unfused" not in card.chunk_refused_backends and knob is not None and knob.values is not None
             and knob.values.get("unfused") is not None)
    return {"model": arch.name, "seq": ctx.job.seq_length, "chunk": arch.attention_chunk_size,
            "layers": arch.chunked_layers, "framework": ctx.card.display_name, "backend": p.attention_backend,
            "other": (", or attention_backend=unfused (transformers' eager attention, which holds the whole score "
                      "matrix)") if eager else ""}


def card_knob(ctx: Context, name: str):
    """The adapter knob `name` on the engine the plan's ZeRO stage selects (the card's variant_knobs over its
    release's knobs), or None."""
    section = ctx.card.adapter
    if section is None:
        return None
    table = {**section.versions[section.default_version].knobs, **section.variant_knobs.get(ctx.backend, {})}
    return table.get(name)


@rule("CO001", reads=("torch_compile",))
def compile_needs_a_switch(ctx: Context) -> Values:
    """torch_compile on a framework whose card has no compile section (nothing renders or models it)."""
    if not ctx.plan.torch_compile:
        return None
    card = ctx.card
    if card.compile is not None and card.adapter is not None and card.adapter.renders("torch_compile"):
        return None
    supported = [n for n in FRAMEWORKS if framework_card(n).compile is not None]
    knob = card.adapter.versions[card.adapter.default_version].knobs.get("torch_compile") if card.adapter else None
    return {"framework": ctx.job.framework, "supported": ", ".join(supported),
            "instead": knob.instead if knob is not None and knob.instead else "no compile section in its card"}
