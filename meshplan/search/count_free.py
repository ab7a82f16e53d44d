"""The count-free memory floor: the least per-GPU memory any layout of a job can need at ANY GPU count, so that where
it is over the budget `meshplan min-gpus` (and recommend's nothing-fits answer) proves that no count fits instead of
scanning to its bound. Two terms no degree of the mesh removes, each read from the memory model's own functions at
the degrees that shrink it most (meshplan/search/floors.least_layer_bytes, arithmetic/memory_states
output_activations and built_vocab: no second copy of the arithmetic):

- a decoder layer's activations: every rank that holds a layer holds at least one micro-batch of its saved
  activations (with full recompute, the layer rebuilt in its backward); PP and DP change only how many layers and
  micro-batches a rank holds, EP none of a layer's bytes; TP, CP (the tokens per rank), sequence parallelism, expert
  TP, the recompute and the ZeRO stage's activation switches are taken at each value the framework and model allow
  and the least kept, a shape only where the framework's rules admit it at some count (the error rules that read
  its degrees alone, asked through their own conditions: AdmittedShapes), so the shape a proof names is a real one;
- one micro-batch's output layer and loss on the last stage (the logits: whole on every TP rank where the loss
  gathers them, cards/memory.yaml logits_over_tp).

Each is put on a rank with the allocator reserve on it and the fixed overhead and CUDA context (what the estimate
adds to every stage); model states are counted as none (dp can shard them away on some engines), so the floor stays
under every estimate (tests/test_count_free.py holds it to sampled layouts' estimates)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from itertools import product

from meshplan.arithmetic import mesh
from meshplan.arithmetic.activations import least_rank_tokens
from meshplan.arithmetic.memory_states import built_vocab, memory_card, output_activations
from meshplan.core.card_files import framework_names
from meshplan.core.units import GIB
from meshplan.estimate.memory import budget_bytes
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.compute_card import cp_comm_type_default
from meshplan.knowledge.hardware import gpu_catalog
from meshplan.rules.context import pads_every_cp_split
from meshplan.rules.engine import Context, backend_of, load_rules, reads_of, rule_specs
from meshplan.schema.plan import Job
from meshplan.schema.reports import CountFreeFloorProof
from meshplan.search.floors import least_layer_bytes
from meshplan.search.policy import memory_budget
from meshplan.search.space import (
    RECOMPUTE_ORDER,
    Fixed,
    Layout,
    divisors,
    request_zeros,
    state_preset,
    tp_splits_heads,
)

SHAPE_FIELDS = ("tp", "cp", "sequence_parallel", "etp", "recompute", "micro_batch_size", "zero_stage")
"""The fixed fields the floor reads: where the request fixes one, the floor takes only its value."""

SHAPE_READS = frozenset({"tp", "pp", "cp", "ep", "etp", "sequence_parallel", "zero_stage", "recompute",
                         "tp_comm_overlap"})
"""The plan fields a rule may read (`@rule(reads=...)`, beside the request's carried fields) to be asked whether it
refuses a floor's shape at every GPU count: the shape's own degrees and switches, pp and ep, which the probes
vary, and TP communication overlap, which no count changes (the request's switch, else the framework's default, as
the search sets it: engine.BestFirstSearch.for_job). A rule that reads a field the count or the batch sets (dp,
the micro-batch, the global batch, the pipeline split, the rollout's share), or declares no reads, is never asked: it
could pass the shape at another count."""

PROBES = ((1, 1), (2, 1), (1, 2), (2, 2))
"""(pp, ep) at which a rule must fire on a shape for the floor to leave the shape out, each at CP 1 and at the
shape's CP: a rule whose verdict turns on pp, ep or CP passes at one of them (ep 2 only where the model has experts
that two ranks split). The floor takes one CP, the most that leaves a rank the fewest tokens, so a rule that refuses
that CP alone (UL001's heads over verl's Ulysses) leaves the TP shape in, at a CP the floor does not range over."""


@dataclass(frozen=True)
class CountFreeFloor:
    """The least per-GPU bytes any layout of a job needs whatever the GPU count, and the shape that needs it."""

    floor: float  # bytes: the larger term on a rank of its own, with the reserve and the fixed overheads
    layer: float  # the least decoder layer's activations for one micro-batch (floors.least_layer_bytes)
    output: float  # one micro-batch's output layer and loss on the last stage (output_activations)
    fixed_bytes: float  # the memory card's fixed overhead and CUDA context
    reserve: float  # the allocator reserve's fraction on the activations (0 with expandable segments)
    tp: int
    cp: int
    sp: bool
    etp: int
    zero: int
    recompute: str
    mbs: int
    tokens: int  # per rank of one micro-batch
    vocab: int  # padded
    whole_logits: bool  # the loss holds the whole vocabulary on every TP rank
    capped: bool  # a degree was held to the GPU-count limit: the proof holds up to it only
    one_stage: bool = False  # one pipeline stage holds every layer and the output (pp fixed to 1, or the only pp)

    @property
    def term(self) -> str:
        """The term that alone puts the floor over: 'output' or 'layer' (with one stage both sit on one rank)."""
        return "output" if self.output >= self.layer else "layer"


def count_free_floor(job: Job, fixed: Fixed, limit: int, *, cps: tuple[int, ...] | None = None,
                     likeliest: bool = False, rules: bool = True) -> CountFreeFloor:
    """The least CountFreeFloor over every shape the framework, the model and the request's fixed fields allow at any
    GPU count up to `limit` (`cps`: the CP degrees to take instead of the framework's, for the nearest-change
    sentence). TP: every divisor of the attention heads the KV groups allow (space.tp_splits_heads, the search's
    prefilter);
    CP: the largest the framework runs (none where its card searches no CP) that the sequence length allows (the
    tokens per rank only fall with it); the framework's recomputes; every ZeRO stage's convention; SP on and off;
    expert TP at every divisor of TP where the card searches it. With one pipeline stage (pp fixed to 1, or a
    framework that runs the model at pp 1 only: KempnerForge's MoE, its card's limits.moe_with_pipeline) both terms
    sit on one rank, the layer term with every decoder layer's saved rows (floors.least_layer_bytes every_layer).
    `likeliest`: only the last of each (the most TP, SP, expert TP, recompute and ZeRO stage), one shape whose floor
    is at least the least: where it fits, no proof can be made (floor_proof asks it first: one shape, not hundreds).
    `rules`: every shape is kept only where the framework's rules admit it at some count (AdmittedShapes: TP003's KV
    heads on KempnerForge, FS001's TP on an FSDP engine, KF003's fp8 without TP), so the floor and the shape its proof
    names are a valid layout's; a floor over no admitted shape is taken over every shape (rules=False)."""
    card = job.card
    kn = card.search
    values = fixed.values
    zeros = request_zeros(card, fixed)
    recomputes = (str(values["recompute"]),) if "recompute" in values else \
        tuple(r for r in RECOMPUTE_ORDER if r in kn.recompute)
    if "tp" in values:
        tps = (int(values["tp"]),)  # type: ignore[call-overload]
    else:
        heads = divisors(job.model.num_attention_heads)
        tps = tuple(t for t in heads if tp_splits_heads(job, t) and t <= limit) or (1,)
    mbs = int(values.get("micro_batch_size", 1))  # type: ignore[call-overload]
    if cps is None:
        cps, capped = _cp_choices(job, fixed, limit, mbs)
    else:
        capped = False
    capped = capped or ("tp" not in values and any(tp_splits_heads(job, t) and t > limit
                                                   for t in divisors(job.model.num_attention_heads)))
    sps = (bool(values["sequence_parallel"]),) if "sequence_parallel" in values else (False, True)
    offload = bool(fixed.carried.get("activation_offload")) or bool(job.activation_offload_layers)  # none counted
    mem = memory_card()
    reserve = 0.0 if fixed.carried.get("expandable_segments") else getattr(mem, "allocator_reserve_fraction", 0.0)
    fixed_bytes = mem.fixed_overhead_bytes + mem.cuda_context_bytes
    # one pipeline stage: pp fixed to 1, or a framework that runs this model at pp 1 only (KempnerForge's MoE, KF001)
    one_rank = int(values.get("pp", 0)) == 1 or (job.model.is_moe and not card.limits.moe_with_pipeline)  # type: ignore[call-overload]
    arch = job.model
    best: CountFreeFloor | None = None
    memo: dict = {}
    admits = AdmittedShapes(job, fixed, mbs) if rules else None
    if likeliest:
        zeros, recomputes, sps = zeros[-1:], recomputes[-1:], sps[-1:]
        tps = tuple(reversed(tps))  # the most TP the rules admit with the rest of the likeliest shape
    for zero in reversed(zeros):  # ties keep the first: the most saving stage and recompute named
        conv = state_preset(job, zero, fixed.carried)[0]
        for tp in tps:
            vocab = built_vocab(arch.vocab_size, conv, tp)
            etps = (int(values["etp"]),) if "etp" in values else \
                divisors(tp)[-1 if likeliest else 0:] if arch.moe is not None and kn.etp else (1,)  # type: ignore[call-overload]
            for cp in cps:
                tokens = least_rank_tokens(job.seq_length, mbs, cp)
                for sp in sps:
                    output = output_activations(conv, tokens, vocab, tp, arch.hidden_size, tp if sp else 1, mbs)
                    for etp in etps:
                        for recompute in reversed(recomputes):
                            layer = least_layer_bytes(job, conv, tokens, tp, sp, etp, recompute,
                                                      activation_offload=offload, memo=memo, every_layer=one_rank)
                            held = layer + output if one_rank else max(layer, output)
                            floor = held + reserve * held + fixed_bytes
                            if (best is None or floor < best.floor) and \
                                    (admits is None or admits(zero, tp, cp, sp, etp, recompute)):
                                best = CountFreeFloor(floor, layer, output, fixed_bytes, reserve, tp, cp, sp, etp,
                                                      zero, recompute, mbs, tokens, vocab,
                                                      conv.logits_over_tp != "vocab_parallel", capped, one_rank)
            if likeliest and best is not None:
                return best
    if best is None:  # the rules refuse every shape (a rule refusal says why first): the floor of every shape
        return count_free_floor(job, fixed, limit, cps=cps, likeliest=likeliest, rules=False)
    return best


@cache
def _shape_rules(allowed: frozenset[str]) -> tuple:
    """The error rules (spec, condition) whose declared reads are all in `allowed`, in card order."""
    specs = rule_specs()
    return tuple((specs[i], cond) for i, cond in load_rules().items()
                 if specs[i].severity == "error" and reads_of(cond) is not None
                 and set(reads_of(cond) or ()) <= allowed)


class AdmittedShapes:
    """Whether the framework's rules admit a floor's shape at some GPU count: no error rule that reads only the
    shape's fields (SHAPE_READS and the request's carried fields) fires on it at every probe of PROBES, each a plan of
    the shape at the fewest GPUs its degrees need (mesh.smallest_world), asked through the rules' own conditions
    (rules.engine.load_rules), as check does. A shape a rule refuses at every count is no layout's, so the floor's
    minimum over the rest stays under every valid layout's estimate (tests/test_count_free.py)."""

    def __init__(self, job: Job, fixed: Fixed, mbs: int) -> None:
        self.job, self.fixed, self.mbs = job, fixed, mbs
        self.rules = _shape_rules(SHAPE_READS | frozenset(fixed.carried))
        moe = job.model.moe
        split = moe is not None and job.card.search.ep and moe.num_experts % 2 == 0
        self.probes = [(pp, ep) for pp, ep in PROBES if ep == 1 or split]
        self.seen: dict[tuple, bool] = {}

    def __call__(self, zero: int, tp: int, cp: int, sp: bool, etp: int, recompute: str) -> bool:
        key = (zero, tp, cp, sp, etp, recompute)
        if key not in self.seen:
            backend = backend_of(self.job.card, zero)
            probes = _Probes(self, key)
            self.seen[key] = not any(all(cond(ctx) is not None for ctx in probes)
                                     for spec, cond in self.rules if spec.applies_to(self.job.framework, backend))
        return self.seen[key]

    def context(self, key: tuple, pp: int, ep: int, cp: int) -> Context:
        """The rules' Context of the shape's plan at (pp, ep, cp) on the fewest GPUs that hold it."""
        zero, tp, _, sp, etp, recompute = key
        job, fixed = self.job, self.fixed
        extra = {k: fixed.values[k] for k in ("moe_token_dispatcher", "cp_comm_type") if k in fixed.values}
        extra.setdefault("cp_comm_type", cp_comm_type_default(job.model, job.card.attention))
        if "tp_comm_overlap" not in fixed.carried:
            extra["tp_comm_overlap"] = bool(fixed.values.get("tp_comm_overlap", job.card.tp_overlap.default))
        world = mesh.smallest_world(job.card.world_size_law, tp, pp, cp, 1, ep, etp)
        plan = Layout(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, dp=1).plan(
            zero_stage=zero, recompute=recompute, micro_batch_size=self.mbs,  # type: ignore[arg-type]
            sequence_parallel=sp and tp > 1, **extra, **fixed.carried)  # type: ignore[arg-type]
        return Context(job.model_copy(update={"num_gpus": world}), plan)


class _Probes:
    """A shape's probe Contexts (PROBES, at CP 1 and the shape's), each built when a rule first asks it: a rule that
    passes on the first is never asked the rest, so an admitted shape builds one plan."""

    def __init__(self, admitted: AdmittedShapes, key: tuple) -> None:
        self.admitted, self.key = admitted, key
        self.where = list(product(admitted.probes, sorted({1, key[2]})))
        self.built: list[Context] = []

    def __iter__(self) -> Iterator[Context]:
        for i, ((pp, ep), cp) in enumerate(self.where):
            if i == len(self.built):
                self.built.append(self.admitted.context(self.key, pp, ep, cp))
            yield self.built[i]


def _cp_choices(job: Job, fixed: Fixed, limit: int, mbs: int) -> tuple[tuple[int, ...], bool]:
    """The CP degree that leaves a rank the fewest tokens (the request's, else the largest the framework runs and the
    sequence length allows: the search's cp-seq prefilter, 2 x cp divides it unless every engine pads), and whether
    the GPU-count limit held it down."""
    if "cp" in fixed.values:
        return (int(fixed.values["cp"]),), False  # type: ignore[call-overload]
    if not job.card.search.cp:
        return (1,), False
    if pads_every_cp_split(job.card):
        most = job.seq_length * mbs  # one token per rank
    else:
        half = job.seq_length // 2 if job.seq_length % 2 == 0 else 0
        most = max((d for d in divisors(half) if d <= limit), default=1) if half else 1
        capped = half and any(d > limit for d in divisors(half))
        return (most,), bool(capped)
    return (min(most, limit),), most > limit


@dataclass(frozen=True)
class FloorProof:
    """A count-free floor over the budget, with its words: the term that alone does not fit and what opens it."""

    floor: CountFreeFloor
    budget: int
    limit: int
    changes: tuple[str, ...]
    allowed: str = "the framework and model"  # what bounds the degrees, in words (with the request's fixed fields)

    def shape_words(self) -> str:
        """The most memory-saving shape, in words."""
        f = self.floor
        parts = [f"TP{f.tp}" + (" with sequence parallelism" if f.sp and f.tp > 1 else "")]
        parts.append(f"CP{f.cp}" if f.cp > 1 else "no context parallelism")
        if f.etp > 1:
            parts.append(f"expert TP{f.etp}")
        parts += [f"{f.recompute} recompute", f"micro-batch {f.mbs}", f"ZeRO stage {f.zero}",
                  "one pipeline stage, any DP and EP" if f.one_stage else "any PP, DP and EP"]
        return ", ".join(parts)

    def term_words(self) -> str:
        """What the term that does not fit holds, with its bytes."""
        f = self.floor
        if f.one_stage:
            return (f"every decoder layer's saved activations for one micro-batch on the one pipeline stage "
                    f"({f.tokens:,} tokens per GPU, {f.recompute} recompute), {f.layer / GIB:.1f} GiB, and its "
                    f"output layer's and loss's {f.output / GIB:.1f} GiB")
        if f.term == "output":
            where = "whole on every TP rank, as this framework's loss gathers them" if f.whole_logits else \
                f"split over TP{f.tp}" if f.tp > 1 else "on one GPU"
            return (f"one micro-batch's logits and loss on the last pipeline stage ({f.tokens:,} tokens x "
                    f"{f.vocab:,} vocabulary entries, {where}): {f.output / GIB:.1f} GiB")
        return (f"one decoder layer's activations for one micro-batch ({f.tokens:,} tokens per GPU, {f.recompute} "
                f"recompute): {f.layer / GIB:.1f} GiB")

    def report(self) -> CountFreeFloorProof:
        """The proof as the MinimumGpus report carries it."""
        f = self.floor
        return CountFreeFloorProof(floor_bytes=math.ceil(f.floor), budget_bytes=self.budget, term=f.term,  # type: ignore[arg-type]
                                   term_bytes=math.ceil(f.output if f.term == "output" else f.layer),
                                   shape=self.shape_words(), up_to_gpus=self.limit if f.capped else None,
                                   changes=list(self.changes))

    def assumption(self) -> str:
        """How the count-free floor is taken, for the answer's assumptions."""
        return ("Count-free memory floor (meshplan/search/count_free.py): every rank that holds a decoder layer holds "
                "at least one micro-batch of its saved activations (with full recompute, the layer rebuilt in its "
                "backward), and the last stage one micro-batch's logits and loss; each taken at the degrees that "
                "shrink it most (every TP the heads allow, the most CP the framework runs and the sequence allows, "
                "SP, expert TP, every recompute and ZeRO stage, each shape only where no error rule of the framework "
                "that reads its degrees alone refuses it at every count; PP, DP and EP change neither), with the "
                "allocator reserve and the fixed overheads and no model states: a lower bound of every layout's "
                "estimate, so over the budget it proves that no count fits.")

    def sentence(self) -> str:
        """The proof in words, with the nearest changes that open it."""
        f = self.floor
        counts = f"any GPU count up to {self.limit:,}" if f.capped else "any GPU count"
        text = (f"No GPU count can fit: at {counts}, the least memory any layout needs on its busiest GPU is "
                f"{f.floor / GIB:.1f} GiB, over the {self.budget / GIB:.1f} GiB budget, at the most memory-saving "
                f"shape ({self.shape_words()}): {self.term_words()}{'' if f.one_stage else ' alone'}, with the "
                f"allocator reserve and {f.fixed_bytes / GIB:.2f} GiB of fixed overheads, does not fit, and no further "
                f"TP, CP, PP, DP or EP degree {self.allowed} allow shrinks it (a proof from the memory model's own "
                "terms, meshplan/search/count_free.py).")
        if self.changes:
            text += (" Changes under which this floor fits (necessary, not sufficient: min-gpus then scans the "
                     "counts): " + "; ".join(self.changes) + ".")
        return text


def floor_proof(job: Job, fixed: Fixed, headroom: float, limit: int) -> FloorProof | None:
    """The proof that no GPU count up to `limit` fits (None where the count-free floor is within the budget)."""
    budget = memory_budget(job, headroom)
    if count_free_floor(job, fixed, limit, likeliest=True).floor <= budget:
        return None  # the least floor is under this one's
    floor = count_free_floor(job, fixed, limit)
    if floor.floor <= budget:
        return None
    allowed = "the request's fixed fields, the framework and the model" \
        if any(name in fixed.values for name in SHAPE_FIELDS) else "the framework and the model"
    return FloorProof(floor, budget, limit, tuple(_opening_changes(job, fixed, floor, headroom, limit, budget)),
                      allowed)


def _opening_changes(job: Job, fixed: Fixed, floor: CountFreeFloor, headroom: float, limit: int,
                     budget: int) -> list[str]:
    """The nearest changes under which the count-free floor fits (each necessary for a fit, not a promise of one):
    the request's fixed shape fields left open, the longest sequence, context parallelism (on this framework where
    the request leaves it out, else on the frameworks that run it), a GPU with more memory, a thinner headroom."""
    out = []
    given = [name for name in SHAPE_FIELDS if name in fixed.values]
    if given:
        open_fixed = replace(fixed, values={k: v for k, v in fixed.values.items() if k not in SHAPE_FIELDS})
        opened = count_free_floor(job, open_fixed, limit)
        if opened.floor <= budget:
            out.append(f"{', '.join(given)} left open (the floor is then {opened.floor / GIB:.1f} GiB)")
    longest = _longest_sequence(job, fixed, limit, budget)
    if longest:
        out.append(f"a sequence length of at most {longest:,} tokens (seq_length={longest}, --seq-length {longest}), "
                   "where this floor fits")
    # the framework's own CP is already in the floor where the request leaves it open
    cp = _least_cp(job, fixed, limit, budget) if "cp" in fixed.values or not job.card.search.cp else 0
    if cp and "cp" in fixed.values and job.card.search.cp:
        out.append(f"cp={cp} or more (the request fixes cp={fixed.values['cp']})")
    elif cp:
        names = [name for name in framework_names() if name != job.framework and framework_card(name).search.cp]
        out.append(f"a framework that runs context parallelism ({', '.join(names)}; {job.framework} runs none): "
                   f"CP{cp} or more splits the sequence enough for this floor")
    bigger = sorted((g for g in gpu_catalog().values()
                     if g.memory_bytes > job.gpu.memory_bytes
                     and budget_bytes(g.memory_bytes, headroom) >= floor.floor),
                    key=lambda g: g.memory_bytes)
    if bigger:
        out.append("a GPU with more memory: " + ", ".join(f"{g.name} ({g.memory_bytes / GIB:.0f} GiB)"
                                                          for g in bigger[:3]))
    if floor.floor <= job.gpu.memory_bytes:
        thinner = math.floor((job.gpu.memory_bytes - floor.floor) / job.gpu.memory_bytes * 1000) / 1000
        out.append(f"a headroom of at most {thinner:g} (--headroom {thinner:g}; MEM002 warns under its default)")
    return out


def _longest_sequence(job: Job, fixed: Fixed, limit: int, budget: int, step: int = 1024) -> int:
    """The longest sequence length, a multiple of `step` below the job's, at which the count-free floor fits (0 where
    none does): bisected, the floor rising with the tokens."""
    low, high = 0, (job.seq_length - 1) // step  # in steps: low fits (0: none), high + 1 does not
    while low < high:
        mid = (low + high + 1) // 2
        there = job.model_copy(update={"seq_length": mid * step})
        if count_free_floor(there, fixed, limit).floor <= budget:
            low = mid
        else:
            high = mid - 1
    return low * step


def _least_cp(job: Job, fixed: Fixed, limit: int, budget: int) -> int:
    """The least power-of-two CP degree (up to `limit`) at which the count-free floor fits (0 where none does)."""
    cp = 2
    while cp <= min(limit, job.seq_length):
        if count_free_floor(job, fixed, limit, cps=(cp,)).floor <= budget:
            return cp
        cp *= 2
    return 0
