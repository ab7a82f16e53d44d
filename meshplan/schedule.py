"""Which decoder layers sit on each pipeline stage, and how many micro-batches each stage holds at its peak.

Activation memory is set by the pipeline schedule, not by a constant: under 1F1B stage r runs
p - r - 1 warm-up forwards before its first backward, so it holds min(m, p - r) micro-batches;
Megatron's interleaved schedule warms up (p - r - 1)*2 + (v - 1)*G forwards (G = micro-batch group
per virtual stage, p by default). Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py
(get_pp_rank_microbatches, get_model_chunk_id); Narayanan et al. 2021 for 1F1B.

Which layers a stage holds is a framework convention too: Megatron splits decoder layers evenly (or as
told by first/last stage sizes); nanotron balances estimated compute over its pipeline blocks, the output
layer included, so its first stages carry more decoder layers (compute_balanced_counts).
"""

from __future__ import annotations

from functools import lru_cache

from meshplan.errors import MeshplanError

# stages[r][c] = the layer indices of virtual chunk c on pipeline rank r.
StageLayout = tuple[tuple[tuple[int, ...], ...], ...]


def _split(total: int, parts: int) -> list[int]:
    """Even split; a remainder goes to the earliest parts (reported as a warning by the caller)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def layers_per_rank(num_layers: int, pp: int, first: int | None, last: int | None) -> tuple[list[int], list[str]]:
    """Decoder layers on each pipeline rank, with Megatron's uneven first/last stage option.

    More stages than layers is rule PP007, which stops the estimate before it gets here (the uneven-split
    checks below stay: PP004 covers them on the Megatron engine only)."""
    warnings: list[str] = []
    if first is None and last is None:
        counts = _split(num_layers, pp)
        if num_layers % pp:
            warnings.append(
                f"{num_layers} layers do not divide evenly over pp={pp}; estimated with {counts[0]} layers on the "
                "first stages. Megatron needs num_layers % pp == 0 or explicit first/last stage sizes "
                "(run `meshplan check`)."
            )
        return counts, warnings
    if pp == 1:
        warnings.append("first/last stage layer counts are ignored with pp=1.")
        return [num_layers], warnings
    head = first if first is not None else None
    tail = last if last is not None else None
    fixed = (head or 0) + (tail or 0)
    if fixed > num_layers:
        raise MeshplanError(
            f"first_stage_layers + last_stage_layers = {fixed} exceeds the model's {num_layers} layers.",
            fix="Give first and last stage sizes whose sum leaves layers for the middle stages.",
        )
    free_ranks = pp - (head is not None) - (tail is not None)
    rest = num_layers - fixed
    if free_ranks == 0:
        if rest:
            raise MeshplanError(
                f"With pp={pp}, first_stage_layers={first} and last_stage_layers={last} must add up to "
                f"{num_layers} layers.",
                fix=f"Set last_stage_layers={num_layers - (head or 0)}.",
            )
        middle: list[int] = []
    else:
        middle = _split(rest, free_ranks)
        if rest % free_ranks:
            warnings.append(
                f"The {rest} layers between the first and last stage do not divide evenly over {free_ranks} stages "
                "(run `meshplan check`)."
            )
    counts = ([head] if head is not None else []) + middle + ([tail] if tail is not None else [])
    return counts, warnings


def compute_balanced_counts(num_layers: int, pp: int, layer_cost: int, head_cost: int) -> tuple[int, ...]:
    """Decoder layers per pipeline rank under nanotron's compute balancing.

    huggingface/nanotron src/nanotron/models/base.py build_model: the pipeline blocks (embedding, L decoder
    layers, final norm, lm_head, fp32 cast, loss) get costs from get_block_compute_costs (decoder layer
    4*heads*d_qkv*h + 3*ffn*h, lm_head vocab*h, others 0); a block goes to the current rank, which advances
    once the running cost exceeds total*(rank+1)/pp. The lm_head's cost pushes decoder layers forward, so the
    first stage holds floor(T/c) + 1 layers instead of L/pp. Exact integer arithmetic (no float thresholds).
    More stages than layers is rule PP007, which stops the estimate before it gets here.
    """
    costs = [0] + [layer_cost] * num_layers + [0, head_cost, 0, 0]
    total = sum(costs)
    counts = [0] * pp
    rank, running = 0, 0
    for block, cost in enumerate(costs):
        running += cost
        if 1 <= block <= num_layers:
            counts[rank] += 1
        if running * pp > total * (rank + 1) and rank < pp - 1:
            rank += 1
    return tuple(counts)


@lru_cache(maxsize=4096)
def stage_layout(
    num_layers: int, pp: int, vpp: int, first: int | None, last: int | None,
    counts: tuple[int, ...] | None = None,
) -> tuple[StageLayout, tuple]:
    """Layer indices per (rank, virtual chunk). Virtual stage k = chunk*pp + rank runs layers in order.

    `counts` (decoder layers per rank, e.g. from compute_balanced_counts) overrides the even split."""
    if counts is not None and len(counts) == pp and sum(counts) == num_layers:
        counts, warnings = list(counts), []
    else:
        counts, warnings = layers_per_rank(num_layers, pp, first, last)
    if vpp > 1 and pp == 1:
        warnings.append("vpp > 1 has no effect with pp=1; estimated without interleaving.")
        vpp = 1
    chunk_sizes = []
    for rank, n in enumerate(counts):
        if vpp > 1 and n % vpp:
            warnings.append(
                f"Stage {rank} holds {n} layers, which do not split into vpp={vpp} equal chunks "
                "(run `meshplan check`)."
            )
        chunk_sizes.append(_split(n, vpp))
    if vpp > 1 and min(min(c) for c in chunk_sizes) == 0:
        raise MeshplanError(
            f"vpp={vpp} leaves a virtual pipeline stage with no layer ({num_layers} layers over pp={pp}).",
            fix=f"Use pp*vpp <= {num_layers}.",
        )
    stages: list[list[tuple[int, ...]]] = [[] for _ in counts]
    nxt = 0
    for chunk in range(vpp):
        for rank in range(len(counts)):
            size = chunk_sizes[rank][chunk]
            stages[rank].append(tuple(range(nxt, nxt + size)))
            nxt += size
    return tuple(tuple(s) for s in stages), tuple(warnings)


def in_flight(rank: int, pp: int, vpp: int, microbatches: int, group: int | None = None) -> tuple[int, ...]:
    """Micro-batches whose activations rank `rank` holds at its peak, per virtual chunk.

    1F1B: the first backward starts after p - rank - 1 warm-up forwards, so min(m, p - rank) are held.
    Interleaved: Megatron's warm-up (p - rank - 1)*2 + (v - 1)*G plus the steady-state forward, capped
    at m*v; forward k of the rank runs chunk (k mod G*v) // G.
    """
    m = max(1, microbatches)
    if pp == 1:
        return (1,)
    if vpp == 1:
        return (min(m, pp - rank),)
    g = min(group or pp, m)  # Megatron shrinks the micro-batch group when m is smaller
    total = m * vpp
    held = min((pp - rank - 1) * 2 + (vpp - 1) * g + 1, total)
    counts = [0] * vpp
    for k in range(held):
        counts[(k % (g * vpp)) // g] += 1
    return tuple(counts)
