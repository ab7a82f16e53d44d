"""The sequence rules of cards/rules.yaml (CP*, TT002, SP004, UL001, SQ*): context-parallel, sequence-parallel and
Ulysses splits of the sequence (and a model whose attention takes none), and a sequence longer than the positions the
model knows.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import BATCH_READS, LISTED, divisors, fmt_set, layout_words, lcm, neighbours
from meshplan.rules.world import tiling


@rule("CP001", reads=("tp", "pp", "cp", "ep", "etp"))
def cp_sequence_divisible(ctx: Context) -> Values:
    cp, seq = ctx.plan.cp, ctx.job.seq_length
    if cp == 1 or seq % (2 * cp) == 0:
        return None
    good = tiling(ctx, "cp", [c for c in divisors(seq // 2) if c > 1])[:LISTED] if seq % 2 == 0 else []
    return {"cp": cp, "seq": seq, "unit": 2 * cp, "seqs": neighbours(seq, 2 * cp),
            "cps": fmt_set(good) if good else "none (odd length)"}



@rule("CP003", reads=("tp", "cp", "cp_comm_type"))
def cp_a2a_heads(ctx: Context) -> Values:
    p = ctx.plan
    if p.cp == 1 or p.cp_comm_type not in ("a2a", "a2a+p2p"):
        return None
    if p.cp_comm_type == "a2a+p2p":
        return None  # the a2a level is a sub-group whose size meshplan does not model (hierarchical sizes)
    local_heads = ctx.arch.num_attention_heads // p.tp
    local_kv = max(1, ctx.arch.num_kv_heads // p.tp)
    if local_heads % p.cp == 0 and local_kv % p.cp == 0:
        return None
    return {"cp": p.cp, "heads": local_heads, "kv": local_kv, "tp": p.tp}



@rule("CP006", reads=("cp", "cp_comm_type"))
def cp_window_comm(ctx: Context) -> Values:
    """A sliding-window model's context parallelism on a comm type TE's CP refuses a window on (the card's
    attention.windowed_cp_comm_types)."""
    p, arch, card = ctx.plan, ctx.arch, ctx.card.attention
    if p.cp == 1 or not arch.windowed_layers or card is None or not card.builds_window(arch.model_type):
        return None
    kinds = card.windowed_cp_comm_types
    if not kinds or p.cp_comm_type in kinds:
        return None
    return {"cp": p.cp, "comm": p.cp_comm_type, "layers": arch.windowed_layers, "window": arch.sliding_window,
            "kinds": fmt_set(kinds)}


@rule("CP008", reads=("cp",))
def cp_comm_type_without_cp(ctx: Context) -> Values:
    """cp_comm_type given at cp 1 (Job.given_unread: the plan cannot tell a given type from the default): the
    frameworks run without it, so a warning, the estimates those without it."""
    given = [knob for knob in ctx.job.given_unread if knob.startswith("cp_comm_type=")]
    if ctx.plan.cp != 1 or not given:
        return None
    return {"knob": given[0], "framework": ctx.card.display_name}


@rule("CP007", reads=("cp", "dp"), words=BATCH_READS)
def cp_model_code_refuses(ctx: Context) -> Values:
    """Context parallelism on a model whose core attention the framework builds itself and refuses CP at
    construction (the card's attention.no_cp_model_types: Megatron-Bridge's Gemma 2). Its cp=1 moves dp: the batch
    change the batch rules pass there is named beside it (fix_values.layout_words; 'cp=1' at a stated batch of 4 on
    8 GPUs left dp 8, BS001)."""
    p, card = ctx.plan, ctx.card.attention
    if p.cp == 1 or card is None or ctx.arch.model_type not in card.no_cp_model_types:
        return None
    follows = layout_words(ctx, {"cp": 1})
    return {"cp": p.cp, "type": ctx.arch.model_type, "model": ctx.arch.name, "framework": ctx.card.display_name,
            "dp": p.dp * p.cp, "follows": f" with {follows}" if follows else ""}


@rule("CP004", reads=("cp",))
def cp_within_sequence(ctx: Context) -> Values:
    cp, seq = ctx.plan.cp, ctx.job.seq_length
    if cp <= seq:
        return None
    return {"cp": cp, "seq": seq, "cps": fmt_set(divisors(seq)[-LISTED:])}



@rule("TT002", reads=("tp", "cp", "sequence_parallel"))
def torchtitan_sequence_divisible(ctx: Context) -> Values:
    p, seq = ctx.plan, ctx.job.seq_length
    unit = (p.tp if p.sequence_parallel else 1) * (2 * p.cp if p.cp > 1 else 1)
    if seq % unit == 0:
        return None
    return {"seq": seq, "unit": unit, "seqs": neighbours(seq, unit)}



@rule("SP004", reads=("tp", "cp", "sequence_parallel", "tp_comm_overlap"))
def megatron_sequence_parallel_divisible(ctx: Context) -> Values:
    """Megatron-Core's sequence parallelism scatters each CP rank's [s/cp, b, h] embeddings over tp along s, and its
    split asserts the length divides (Megatron-LM's start-up checks s against 2*cp alone: CP001). The fix's lengths
    are multiples of both splits; sequence parallelism off is named only where the TP overlap does not need it
    (TP005)."""
    p, seq = ctx.plan, ctx.job.seq_length
    if not p.sequence_parallel or p.tp == 1 or seq % (p.cp * p.tp) == 0:
        return None
    unit = lcm(2 * p.cp if p.cp > 1 else 1, p.cp * p.tp)
    return {"seq": seq, "cp": p.cp, "tp": p.tp, "split": p.cp * p.tp, "seqs": neighbours(seq, unit),
            "or_off": "" if p.tp_comm_overlap else ", or sequence_parallel=false"}


@rule("UL001", reads=("tp", "pp", "cp", "ep", "etp"))
def ulysses_heads(ctx: Context) -> Values:
    u = ctx.plan.cp
    heads, kv = ctx.arch.num_attention_heads, ctx.arch.num_kv_heads
    if u == 1 or (heads % u == 0 and (kv % u == 0 or u % kv == 0)):
        return None
    good = tiling(ctx, "cp", [d for d in divisors(heads) if kv % d == 0 or d % kv == 0])
    return {"u": u, "heads": heads, "kv": kv, "working": fmt_set(good)}



@rule("SQ001", reads=())
def learned_positions(ctx: Context) -> Values:
    table = ctx.arch.learned_position_embeddings
    if not table or ctx.job.seq_length <= table:
        return None
    return {"seq": ctx.job.seq_length, "table": table}



@rule("SQ002", reads=())
def beyond_trained_context(ctx: Context) -> Values:
    limit = ctx.arch.max_position_embeddings
    if ctx.arch.learned_position_embeddings or limit is None or ctx.job.seq_length <= limit:
        return None
    return {"seq": ctx.job.seq_length, "limit": limit, "model": ctx.arch.name}


def _mamba_cp_splits(heads: int, groups: int, cp: int) -> bool:
    """Megatron-Core's MambaContextParallel: a TP rank's heads divisible by cp, and its groups by cp or cp by them."""
    return heads % cp == 0 and (groups % cp == 0 if groups >= cp else cp % groups == 0)


@rule("CP005", reads=("tp", "pp", "cp", "ep", "etp"))
def mamba_cp_heads(ctx: Context) -> Values:
    """A hybrid model's Mamba-2 mixer under context parallelism: the all-to-all before the scan hands each CP rank
    whole heads (and whole groups, or one group replicated). Where tp does not divide them TP006 refuses."""
    m, tp, cp = ctx.arch.mamba, ctx.plan.tp, ctx.plan.cp
    if m is None or cp == 1 or m.num_heads % tp or m.n_groups % tp:
        return None
    heads, groups = m.num_heads // tp, m.n_groups // tp
    if _mamba_cp_splits(heads, groups, cp):
        return None
    good = tiling(ctx, "cp", [c for c in divisors(heads) if _mamba_cp_splits(heads, groups, c)])[:LISTED]
    return {"cp": cp, "tp": tp, "heads": heads, "groups": groups, "working": fmt_set(good)}
