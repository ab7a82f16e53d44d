"""The kernel-setting rules of cards/rules.yaml (AT*, CH001, CO001): an attention backend, dropout or torch.compile
the framework can run and write, and one that cannot run the model's chunked attention.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.knowledge.calibration import attention_kernel_runs
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.releases import job_attention_kernel
from meshplan.rules.context import cp_padding_of, rank_tokens
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
    qk, v = mla.qk_head_dim, mla.v_head_dim
    if qk == v:
        return None
    return {"model": ctx.job.model.name, "qk": qk, "v": v}



@rule("AT003", reads=("zero_stage", "attention_backend"))
def backend_kernel_not_on_the_gpu(ctx: Context) -> Values:
    """attention_backend flash or fused whose kernel (releases.job_attention_kernel, read through the card's
    attention.on_arch) does not run on the job's GPU (cards/calibration.yaml attention_kernels runs_on): KempnerForge's
    sdpa_backend cudnn on an MI300X, where torch SDPA has no cuDNN backend."""
    p, job = ctx.plan, ctx.job
    if p.attention_backend not in ("flash", "fused"):
        return None
    kernel = job_attention_kernel(job, p.attention_backend, p.zero_stage)
    if attention_kernel_runs(kernel, job.gpu.arch):
        return None
    return {"backend": p.attention_backend, "framework": ctx.card.display_name, "kernel": kernel,
            "gpu": job.gpu.name, "arch": job.gpu.arch}


@rule("CH001", reads=("zero_stage", "attention_backend", "micro_batch_size", "tp", "cp"))
def flash_refuses_chunks(ctx: Context) -> Values:
    """A chunked model (Llama 4) on an FSDP engine that loads transformers with flash_attention_2 under this
    attention_backend (the card's attention.chunk_refused_backends), where the row the model is handed holds more
    keys than its chunk (row_keys: the packed micro-batch's share of a rank where the engine packs):
    create_chunked_causal_mask raises in the model's first forward."""
    arch, card, p = ctx.arch, ctx.card.attention, ctx.plan
    if card is None or ctx.backend != "fsdp" or p.attention_backend not in card.chunk_refused_backends:
        return None
    chunk = arch.attention_chunk_size or 0
    keys = row_keys(ctx)
    if not arch.chunked_layers or keys <= chunk:
        return None
    knob = card_knob(ctx, "attention_backend")
    eager = ("unfused" not in card.chunk_refused_backends and knob is not None and knob.values is not None
             and knob.values.get("unfused") is not None)
    packed = cp_padding_of(ctx.card, p.zero_stage) == "packed"
    seq, mbs = ctx.job.seq_length, p.micro_batch_size
    if packed:
        row = (f"micro_batch_size {mbs} x seq_length {seq:,}" + (f" over cp {p.cp}" if p.cp > 1 else "")
               + f": {ctx.card.display_name}'s FSDP engine packs a micro-batch into one row"
               + (" and Ulysses hands each rank its share" if p.cp > 1 else ""))
        fits = chunk * p.cp // seq  # sequences a packed row of at most `chunk` keys per rank holds
        fixes = [f"micro_batch_size={fits}"] if 1 <= fits < mbs else []
        fixes.append(f"seq_length={chunk * p.cp // mbs} (at most)")
    else:
        row, fixes = f"seq_length {seq:,}", [f"seq_length={chunk} (the chunk, at most)"]
    return {"model": arch.name, "keys": keys, "row": row, "chunk": chunk, "layers": arch.chunked_layers,
            "framework": ctx.card.display_name, "backend": p.attention_backend, "fixes": " or ".join(fixes),
            "other": (", or attention_backend=unfused (transformers' eager attention, which holds the whole score "
                      "matrix)") if eager else ""}


def row_keys(ctx: Context) -> int:
    """The keys of one row of the input the model is handed on a rank, what transformers' mask builders read as
    kv_length (inputs_embeds.shape[1]): where the engine packs a micro-batch's sequences into one row (the card's
    engine.cp_padding 'packed': verl's use_remove_padding, SkyRL's sample packing) the micro-batch's tokens, over cp
    as Ulysses pads and slices them before the forward (rank_tokens); else one sequence."""
    p = ctx.plan
    if cp_padding_of(ctx.card, p.zero_stage) != "packed":
        return ctx.job.seq_length
    return rank_tokens(ctx.job, p.micro_batch_size, p.tp, p.cp, p.zero_stage)


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
