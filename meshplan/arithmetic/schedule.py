"""The pipeline's shape: which decoder layers sit on each pipeline stage, how an uneven split is chosen, and how
many micro-batches each stage holds at its peak. Memory, throughput, the rules, the search, the decision tables
and the adapters all take the stage layout and the uneven split from here.

Activation memory is set by the pipeline schedule, not by a constant: under 1F1B stage r runs
p - r - 1 warm-up forwards before its first backward, so it holds min(m, p - r) micro-batches;
Megatron's interleaved schedule warms up (p - r - 1)*2 + (v - 1)*G forwards (G = micro-batch group
per virtual stage, p by default). Source: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py
(get_pp_rank_microbatches, get_model_chunk_id); Narayanan et al. 2021 for 1F1B.

Which layers a stage holds is a framework convention (`pipeline_partition` of the byte preset in
cards/memory.yaml): Megatron splits decoder layers evenly, or as told by first/last stage sizes; nanotron
balances estimated compute over its pipeline blocks, the output layer included, so its first stages carry
more decoder layers (compute_balanced_counts). Every convention comes down to the decoder layers of each
virtual stage (`stages_from_counts`), which is also what an explicit layout (Megatron's
pipeline_model_parallel_layout, e.g. "Et*3|(tt|)*29,m|L") reduces to once parsed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import chain

from meshplan.arithmetic.memory_states import built_vocab, convention
from meshplan.arithmetic.pipeline_counts import in_flight as timeline_in_flight
from meshplan.arithmetic.pipeline_timeline import V_ORDERS, Shape, schedule_order, shape_for
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import FrameworkCard
from meshplan.knowledge.gdn_config import cuts_a_decoder_layer, pipeline_unit, split_layers
from meshplan.knowledge.pipeline_card import InterleaveGroup
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan

# stages[r][c] = the layer indices of virtual chunk c on pipeline rank r.
StageLayout = tuple[tuple[tuple[int, ...], ...], ...]


# --------------------------------------------------------------------------- the uneven split


@lru_cache(maxsize=8192)
def uneven_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int, int] | None:
    """(first, layers on each middle stage, last) of Megatron's uneven split closest to even; None if none exists.

    The split obeys Megatron-Core's TransformerConfig rules (rule PP004, `split_problem`): first and last stage
    sizes positive, the middle stages an equal share, and with vpp > 1 every part a multiple of vpp. Among the
    splits that do, the one chosen has
    1. the lightest heaviest stage (it sets the pace of the whole pipeline);
    2. then the heaviest middle stages that allows, so the first and last stages, which also hold the
       embedding and the output layer and loss, carry no more decoder layers than the middle ones wherever
       possible (what Megatron's account_for_embedding/loss_in_pipeline_split and torchtitan's
       first/last_stage_less_layers do);
    3. then first and last as equal as possible, the lighter one last (it also holds the output layer and loss).
    DeepSeek-V3, 61 layers over 16 stages: first 3, 4 on each of the 14 middle stages, last 2.
    A split whose heaviest stage holds more than ceil(layers/pp), the least any split over pp stages can put on
    its heaviest stage, is not offered (None): it would trade the pipeline's pace for the sizes (80 layers over
    32 stages could only be 10 + 30x2 + 10), and with vpp > 1 the interleaving would cost balance.
    """
    best = closest_uneven_split(num_layers, pp, vpp)
    return None if best is None or max(best[0], best[1]) > -(-num_layers // pp) else best


@lru_cache(maxsize=8192)
def closest_uneven_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int, int] | None:
    """`uneven_split`'s choice among every split Megatron-Core accepts, kept even where its heaviest stage holds more
    than an even pipeline's (80 layers over 32 stages: 10 + 30x2 + 10): a split that works, for a fix to name."""
    if pp < 2 or vpp < 1:
        return None
    middle_stages = pp - 2
    best: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
    for per in range(vpp, num_layers + 1, vpp) if middle_stages else (0,):
        ends = num_layers - middle_stages * per
        if ends < 2 * vpp:
            break
        if ends % vpp:
            continue
        units = ends // vpp  # first and last share the ends in whole virtual-stage units, the larger share first
        first, last = -(-units // 2) * vpp, units // 2 * vpp
        score = (max(first, per), ends, first - last)
        if best is None or score < best[0]:
            best = (score, (first, per, last))
    return None if best is None else best[1]


@lru_cache(maxsize=8192)
def pipeline_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int | None, int | None] | None:
    """The (first, last) stage sizes a layout carries for (layers, pp, vpp): (None, None) when every virtual stage
    holds the same number of layers (Megatron's default split), else `uneven_split`'s; None when neither exists."""
    if pp == 1:
        return None, None
    if num_layers % pp == 0 and (num_layers // pp) % vpp == 0:
        return None, None
    split = uneven_split(num_layers, pp, vpp)
    return (split[0], split[2]) if split else None


def model_uneven_split(arch: Architecture, pp: int, vpp: int = 1, closest: bool = False) -> tuple[int, int, int] | None:
    """uneven_split (closest_uneven_split where `closest`) over the layers Megatron-Core's split counts
    (gdn_config.split_layers), in the model's layers: a Gated DeltaNet hybrid's whole decoder layers, two pattern
    layers each, so a fix never names a split rule PP017 refuses; any other model's as it is."""
    unit = pipeline_unit(arch)
    split = (closest_uneven_split if closest else uneven_split)(arch.num_layers // unit, pp, vpp)
    return None if split is None else (split[0] * unit, split[1] * unit, split[2] * unit)


def model_pipeline_split(arch: Architecture, pp: int, vpp: int = 1) -> tuple[int | None, int | None] | None:
    """pipeline_split in the model's layers, over the layers Megatron-Core's split counts (model_uneven_split)."""
    unit = pipeline_unit(arch)
    split = pipeline_split(arch.num_layers // unit, pp, vpp)
    return None if split is None else (None if split[0] is None else split[0] * unit,
                                       None if split[1] is None else split[1] * unit)


def split_problem(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> str:
    """What is wrong with first/last stage sizes, checked as Megatron-Core's TransformerConfig.__post_init__
    checks them and in its order ('' when nothing is): positive, multiples of vpp, and leaving the middle
    stages an even, vpp-divisible share."""
    v = vpp if vpp > 1 else None
    remaining, stages = num_layers, pp
    for name, value in (("first_stage_layers", first), ("last_stage_layers", last)):
        if value is None:
            continue
        if value <= 0:
            return f"{name}={value} must be larger than 0"
        if v and value % v:
            return f"{name}={value} is not divisible by vpp={v}"
        remaining -= value
        stages -= 1
    if stages < 0:
        return f"pp={pp} has fewer stages than the first and last stages given"
    if remaining < 0:  # Megatron's modulo would speak of a negative count of middle layers
        return (f"the first and last stages given hold {num_layers - remaining} layers, more than the model's "
                f"{num_layers}")
    if bool(remaining) != bool(stages):
        return f"{remaining} middle layers remain for {stages} middle stages"
    if stages and remaining % stages:
        return f"the {remaining} middle layers do not split evenly over {stages} middle stages"
    if stages and v and (remaining // stages) % v:
        return f"{remaining // stages} layers per middle stage are not divisible by vpp={v}"
    return ""


# --------------------------------------------------------------------------- explicit layouts

LAYOUT_GRAMMAR = (
    "stages separated by '|' in virtual-stage order (stage k runs on pp rank k % pp as virtual chunk k // pp); "
    "in a stage E = embedding, t = decoder layer, m = MTP layer, L = loss; 'x*n' repeats one character, "
    "'(...)*n' repeats a group (no nesting); commas are cosmetic. Example: 'Et*3|(tt|)*29,m|L'"
)
LAYOUT_CHARS = "ELtm"
MAX_LAYOUT_CHARS = 100_000  # unrolled; far above any pp*vpp x layer count meshplan accepts


def _layout_error(text: str, pos: int, what: str) -> MeshplanError:
    shown = text if len(text) <= 80 else text[:80] + "..."
    return MeshplanError(f"pipeline_layout {shown!r}: {what} at position {pos + 1}.",
                         fix=f"Write the layout as Megatron-Core parses it: {LAYOUT_GRAMMAR}.")


def _ascii_digit(c: str) -> bool:
    """One of 0-9: str.isdigit() also takes superscripts and other scripts' digits, which int() reads or refuses."""
    return len(c) == 1 and "0" <= c <= "9"


def _refuse_other_digit(text: str, pos: int) -> None:
    """A digit of another script or a superscript where a count may stand: named, with its code point."""
    c = text[pos:pos + 1]
    if c and not _ascii_digit(c) and (c.isdigit() or c.isnumeric()):
        raise _layout_error(text, pos, f"{c!r} (U+{ord(c):04X}), which is not an ASCII digit 0-9")


def _check_layout_syntax(text: str) -> None:
    """Reject, with the position, what Megatron's parse_str_to_list would fail on or silently misread."""
    group_open: int | None = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in LAYOUT_CHARS or c in "|,":
            pass
        elif c == "(":
            if group_open is not None:
                raise _layout_error(text, i, "'(' inside a group (groups do not nest)")
            group_open = i
        elif c == ")":
            if group_open is None:
                raise _layout_error(text, i, "')' without an opening '('")
            if not text[group_open + 1:i].replace(",", ""):
                raise _layout_error(text, group_open, "an empty group '()'")
            if not re.match(r"\*[0-9]", text[i + 1:i + 3]):
                _refuse_other_digit(text, i + 2 if text[i + 1:i + 2] == "*" else i + 1)
                raise _layout_error(text, i, "a group ')' not followed by '*n'")
            group_open = None
        elif c == "*":
            prev = text[:i].replace(",", "")[-1:]
            if not prev or prev not in LAYOUT_CHARS + "|)":
                raise _layout_error(text, i, "'*' that repeats nothing")
            if not _ascii_digit(text[i + 1:i + 2]):
                _refuse_other_digit(text, i + 1)
                raise _layout_error(text, i, "'*' not followed by a count")
            i += 1
            while i + 1 < n and _ascii_digit(text[i + 1]):
                i += 1
        else:
            _refuse_other_digit(text, i)
            what = "a count without '*'" if _ascii_digit(c) else f"{c!r}, which is not a layer character"
            raise _layout_error(text, i, what)
        i += 1
    if group_open is not None:
        raise _layout_error(text, group_open, "a '(' never closed")


def _unroll(text: str, pattern: str) -> str:
    """One of Megatron's unrolling passes, refusing a result too long to be a real layout before building it."""
    matches = list(re.finditer(pattern, text))
    size = len(text) + sum(len(m.group(1)) * int(m.group(2)) - len(m.group(0)) for m in matches)
    if size > MAX_LAYOUT_CHARS:
        raise MeshplanError(f"pipeline_layout unrolls to {size:,} characters (at most {MAX_LAYOUT_CHARS:,}).",
                            fix="Use repeat counts no larger than the model's layers and stages.")
    return re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)


@lru_cache(maxsize=1024)
def parse_layout(text: str) -> tuple[str, ...]:
    """The stages of a pipeline_model_parallel_layout string, each as its layer characters, in the string's
    (virtual-stage) order. Megatron-Core megatron/core/transformer/pipeline_parallel_layer_layout.py
    parse_str_to_list: commas dropped, '(...)*n' then 'x*n' unrolled, split on '|'; the syntax is checked first so
    an error names its position."""
    _check_layout_syntax(text)
    flat = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*([0-9]+)", r"(.)\*([0-9]+)"):
        flat = _unroll(flat, pattern)
    return tuple(flat.split("|"))


def layout_problem(stages: Sequence[str], pp: int, vpp: int, num_layers: int, mtp_layers: int) -> str:
    """What Megatron-Core would refuse in a parsed layout ('' when nothing): PipelineParallelLayerLayout.__init__
    (stages a multiple of pp) and validate_layer_layout, in their order, plus meshplan's vpp matching the layout."""
    if len(stages) % pp:
        return f"its {len(stages)} stages do not fill pp={pp} ranks equally (a multiple of {pp} is needed)"
    if len(stages) != pp * vpp:
        return f"its {len(stages)} stages are pp={pp} x {len(stages) // pp} virtual stages, not vpp={vpp}"
    flat = "".join(stages)
    if not flat.startswith("E"):
        return "the first layer must be the embedding E"
    if not flat.endswith("L"):
        return "the last layer must be the loss L"
    if flat.count("E") != 1 or flat.count("L") != 1:
        return f"E and L must each appear once (E {flat.count('E')}, L {flat.count('L')})"
    if flat.count("t") != num_layers:
        return f"it has {flat.count('t')} decoder layers t, the model {num_layers}"
    mtp = flat.count("m")
    if mtp not in (0, mtp_layers):
        return f"it has {mtp} MTP layers m, the model {mtp_layers}" + (" (or none)" if mtp_layers else "")
    if mtp and "t" in flat[flat.index("m"):]:
        return "decoder layers t must come before the MTP layers m"
    if mtp:
        holders = [k for k, s in enumerate(stages) if "m" in s]
        if len(holders) > 1:
            return "all MTP layers m must be in one stage"
        if holders[0] // pp != vpp - 1:
            return "the MTP layers m must be in a rank's last virtual stage"
    return ""


def accounted_counts(num_layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> tuple[list[int], str]:
    """(decoder layers of each virtual stage in virtual-stage order, problem) when the embedding and/or the loss count
    as a layer in the even split. Megatron-Core transformer_block.get_num_layers_to_build: (layers + e + l) split
    evenly over pp, each rank's share over vpp, then the first virtual stage of rank 0 builds e fewer and the last
    of the last rank l fewer; TransformerConfig.__post_init__ checks the divisions."""
    units = num_layers + embedding + loss
    if units % pp:
        return [], (f"{num_layers} layers + {int(embedding) + int(loss)} (embedding/loss counted) = {units} do not "
                    f"split evenly over pp={pp}")
    per_rank = units // pp
    if per_rank % vpp:
        return [], f"{per_rank} layers per rank (embedding/loss counted) do not split into vpp={vpp} virtual stages"
    counts = [per_rank // vpp] * (pp * vpp)
    counts[0] -= embedding
    counts[-1] -= loss
    if min(counts) < 0:
        return [], "a virtual stage of one layer cannot also hold the embedding or the loss"
    return counts, ""


def compose_layout(num_layers: int, pp: int, vpp: int, mtp_layers: int = 0) -> str | None:
    """A working layout string for pp x vpp stages: the embedding and the loss each weigh as a layer, the decoder
    layers fill the rest as evenly as they go (extra layers to the middle stages first, then the first stage), the
    MTP layers sit with the loss; one stage (pp=1) holds them all, 'Et*32L', which PipelineParallelLayerLayout takes at
    pipeline_model_parallel_size 1. None when there are more stages than layers to fill them."""
    stages = pp * vpp
    units = num_layers + 2
    if units < stages:
        return None
    if stages == 1:
        return format_layout(["E" + "t" * num_layers + "m" * mtp_layers + "L"])
    base, extra = divmod(units, stages)
    sizes = [base] * stages
    for k in [*range(1, stages - 1), 0, stages - 1][:extra]:
        sizes[k] += 1
    sizes[0] -= 1
    sizes[-1] -= 1
    body = ["t" * n for n in sizes]
    body[0] = "E" + body[0]
    body[-1] += "m" * mtp_layers + "L"
    return format_layout(body)


def _short(stage: str) -> str:
    return re.sub(r"(.)\1{2,}", lambda m: f"{m.group(1)}*{len(m.group(0))}", stage)


def format_layout(stages: Sequence[str]) -> str:
    """The shortest usual spelling of a list of stages: runs within a stage as 't*4', runs of equal stages as
    '(t*4|)*14' (the group carries its '|')."""
    out, k = "", 0
    while k < len(stages):
        run = 1
        while k + run < len(stages) - 1 and stages[k + run] == stages[k]:
            run += 1
        last = k + run == len(stages)
        if run > 1:
            out += f"({_short(stages[k])}|)*{run}"
        else:
            out += _short(stages[k]) + ("" if last else "|")
        k += run
    return out


# --------------------------------------------------------------------------- splits with light end stages


@lru_cache(maxsize=8192)
def end_light_splits(num_layers: int, stages: int) -> tuple[tuple[int, int, int], ...]:
    """(first, middle, last) decoder layers of the first virtual stage, of each middle one and of the last, for every
    split of `stages` virtual stages whose middle stages all hold ceil(layers / stages), the fewest any split can put
    on its heaviest stage, and whose two end stages, which also hold the embedding and the output layer and loss,
    share the rest with neither heavier than a middle one (either may hold none). These are the splits Megatron-Core
    reaches with account_for_embedding/loss_in_pipeline_split (an end one layer lighter) and with an explicit
    pipeline_model_parallel_layout, the one every published DeepSeek-V3 / Kimi-K2 recipe sets (16,16,16,13 over 4
    stages; E+t | (tt|)*30 | mL over 32); heaviest first stage first. Empty when the stages cannot all hold a middle
    share (more than ceil(layers / stages) x (stages - 2) layers would be needed) or there is one stage."""
    if stages < 2:
        return ()
    middle = -(-num_layers // stages)
    rest = num_layers - (stages - 2) * middle
    if rest < 0:
        return ()
    return tuple((first, middle, rest - first) for first in range(min(middle, rest), max(0, rest - middle) - 1, -1))


@dataclass(frozen=True, order=True)
class VirtualSplit:
    """A split the per-rank first/last stage sizes cannot say: the decoder layers of each virtual stage (virtual-stage
    order), and how Megatron-Core is told it: the embedding and/or the loss counted as a layer where that gives these
    counts, else an explicit pipeline_model_parallel_layout."""

    counts: tuple[int, ...]
    layout: str | None = None
    embedding: bool = False
    loss: bool = False

    def __hash__(self) -> int:
        """The dataclass's own hash (of the fields in order), computed once per object (virtual_split keeps one per
        split): the search's seeding hashes every layout's split with its pipeline (engine.BestFirstSearch.sized),
        some 13,000 times on DeepSeek-V3 over 2,048 GPUs."""
        try:
            return self.__dict__["_hash"]
        except KeyError:
            value = hash((self.counts, self.layout, self.embedding, self.loss))
            object.__setattr__(self, "_hash", value)
            return value

    def __getstate__(self) -> dict:
        """The fields without the cached hash: a string's hash differs between processes."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def fields(self) -> dict[str, object]:
        """The Plan / Request fields that set this split."""
        return {"pipeline_layout": self.layout, "account_for_embedding": self.embedding, "account_for_loss": self.loss}

    def rank_counts(self, pp: int) -> tuple[int, ...]:
        """Decoder layers per pipeline rank (virtual stage k on rank k % pp)."""
        return tuple(sum(self.counts[r::pp]) for r in range(pp))


@lru_cache(maxsize=8192)
def virtual_split(num_layers: int, pp: int, vpp: int, first: int, last: int, mtp_layers: int) -> VirtualSplit:
    """The end_light_splits entry (first, middle, last) over pp x vpp virtual stages as Megatron-Core is told it: the
    embedding / loss counted as a layer where accounted_counts gives exactly these counts, else a layout string with E
    on the first stage and the MTP layers m before the loss L on the last (where Megatron's recipes colocate them)."""
    stages = pp * vpp
    middle = (num_layers - first - last) // (stages - 2) if stages > 2 else max(first, last)
    counts = (first, *([middle] * (stages - 2)), last)
    embedding, loss = middle - first, middle - last
    if embedding in (0, 1) and loss in (0, 1) and (embedding or loss):
        got, problem = accounted_counts(num_layers, pp, vpp, bool(embedding), bool(loss))
        if not problem and tuple(got) == counts:
            return VirtualSplit(counts, embedding=bool(embedding), loss=bool(loss))
    body = ["t" * n for n in counts]
    body[0] = "E" + body[0]
    body[-1] += "m" * mtp_layers + "L"
    return VirtualSplit(counts, layout=format_layout(body))


def _layout_fix(arch: Architecture, plan: Plan) -> str:
    """A layout that works for the plan's pp and vpp, or what to change when none does."""
    layers = split_layers(arch)  # a layout's t: a Gated DeltaNet hybrid's decoder layer
    working = compose_layout(layers, plan.pp, plan.vpp, arch.num_mtp_layers)
    if working is None:
        return f"Use pp*vpp <= {layers + 2} stages for a layout of {layers} layers."
    return f'Use pipeline_layout="{working}" (pp={plan.pp}, vpp={plan.vpp}), or no layout.'


def plan_layout_problem(arch: Architecture, plan: Plan) -> str:
    """What is wrong with the plan's explicit layout or embedding/loss accounting ('' when nothing), the parse error
    included: rule PP009 reports it, plan_stages refuses it. Both count the layers Megatron-Core's split counts
    (gdn_config.split_layers: a Gated DeltaNet hybrid's decoder layers, as its GPTModel is told them)."""
    accounting = plan.account_for_embedding or plan.account_for_loss
    uneven = plan.first_stage_layers is not None or plan.last_stage_layers is not None
    if plan.pipeline_layout is not None:
        if uneven or accounting:
            return ("pipeline_layout cannot be combined with first/last_stage_layers or account_for_embedding/loss "
                    "(Megatron-Core TransformerConfig refuses it)")
        try:
            stages = parse_layout(plan.pipeline_layout)
        except MeshplanError as err:
            return f"{err.reason.rstrip('.')}; a layout is {LAYOUT_GRAMMAR}"
        return layout_problem(stages, plan.pp, plan.vpp, split_layers(arch), arch.num_mtp_layers)
    if accounting:
        if uneven:
            return ("account_for_embedding/loss cannot be combined with first/last_stage_layers (Megatron-Core "
                    "TransformerConfig refuses it)")
        return accounted_counts(split_layers(arch), plan.pp, plan.vpp, plan.account_for_embedding,
                                plan.account_for_loss)[1]
    return ""


# --------------------------------------------------------------------------- layers per stage


@dataclass(frozen=True)
class Stages:
    """The decoder layers of every pipeline rank and virtual chunk, and the rank that holds the output layer and
    the loss (the last, except where nanotron's balancing leaves later ranks without blocks)."""

    chunks: StageLayout
    head_rank: int
    warnings: tuple[str, ...] = ()
    mtp_rank: int | None = None  # the rank of the MTP blocks; None = with the output layer (head_rank)
    mtp_trained: bool = True  # False where a layout places no MTP layer m: Megatron then builds none

    @property
    def mtp_at(self) -> int:
        """The rank that holds the model's MTP blocks (where a layout's m sits, else the output layer's rank)."""
        return self.head_rank if self.mtp_rank is None else self.mtp_rank

    def layers(self, rank: int) -> tuple[int, ...]:
        """Every decoder layer rank `rank` holds, over all its virtual chunks."""
        return tuple(chain.from_iterable(self.chunks[rank]))

    @property
    def counts(self) -> tuple[int, ...]:
        """Decoder layers per pipeline rank."""
        return tuple(sum(len(c) for c in chunks) for chunks in self.chunks)


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
    fixed = (first or 0) + (last or 0)
    if fixed > num_layers:
        raise MeshplanError(
            f"first_stage_layers + last_stage_layers = {fixed} exceeds the model's {num_layers} layers.",
            fix="Give first and last stage sizes whose sum leaves layers for the middle stages.",
        )
    free_ranks = pp - (first is not None) - (last is not None)
    rest = num_layers - fixed
    if free_ranks == 0:
        if rest:
            raise MeshplanError(
                f"With pp={pp}, first_stage_layers={first} and last_stage_layers={last} must add up to "
                f"{num_layers} layers.",
                fix=f"Set last_stage_layers={num_layers - (first or 0)}.",
            )
        middle: list[int] = []
    else:
        middle = _split(rest, free_ranks)
        if rest % free_ranks:
            warnings.append(
                f"The {rest} layers between the first and last stage do not divide evenly over {free_ranks} stages "
                "(run `meshplan check`)."
            )
    counts = ([first] if first is not None else []) + middle + ([last] if last is not None else [])
    return counts, warnings


def decoder_layer_cut(arch: Architecture, plan: Plan) -> str | None:
    """What in the plan's pipeline split cuts a Gated DeltaNet hybrid's decoder layer (two pattern layers: mixer and
    MLP/MoE) where Megatron-Core's GPTModel (both Megatron faces) builds it of decoder layers, in words; None where
    nothing does (or the model is no such hybrid, or pp is 1). A layout or embedding / loss accounting counts decoder
    layers as Megatron-Core does (a layout's t, the accounting's units: explicit_stages), so it cuts none; else each
    stage's count in pattern layers (schedule.layers_per_rank, Megatron's uneven first / last option), and each of
    its vpp chunks where vpp divides it (PP002 / PP004 say where it does not). The one test rule PP017 and render's
    decoder_split (adapters/megatron.py) both ask."""
    if arch.gdn is None or arch.layer_pattern is None or plan.pp == 1:
        return None
    if plan.pipeline_layout or plan.account_for_embedding or plan.account_for_loss:
        return None
    counts, _ = layers_per_rank(arch.num_layers, plan.pp, plan.first_stage_layers, plan.last_stage_layers)
    for n in counts:
        if cuts_a_decoder_layer(n):
            return f"a stage of {n} pattern layers cuts a decoder layer in two"
        if n % plan.vpp == 0 and cuts_a_decoder_layer(n // plan.vpp):
            return (f"a virtual chunk of {n // plan.vpp} pattern layers (a stage of {n} over vpp={plan.vpp}) cuts a "
                    "decoder layer in two")
    return None


def compute_balanced_counts(num_layers: int, pp: int, layer_cost: int, head_cost: int) -> tuple[tuple[int, ...], int]:
    """(decoder layers per pipeline rank, rank of the output layer) under nanotron's compute balancing.

    huggingface/nanotron src/nanotron/models/base.py build_model: the pipeline blocks (embedding, L decoder
    layers, final norm, lm_head, fp32 cast, loss) get costs from get_block_compute_costs (`block_costs`); a block
    goes to the current rank, which advances once the running cost exceeds total*(rank+1)/pp. The lm_head's cost
    pushes decoder layers forward, so the first stage holds floor(T/c) + 1 layers instead of L/pp. Exact integer
    arithmetic (no float thresholds). More stages than layers is rule PP007, which stops the estimate first.
    """
    costs = [0] + [layer_cost] * num_layers + [0, head_cost, 0, 0]
    head_block = num_layers + 2
    total = sum(costs)
    counts = [0] * pp
    rank, running, head_rank = 0, 0, pp - 1
    for block, cost in enumerate(costs):
        running += cost
        if 1 <= block <= num_layers:
            counts[rank] += 1
        elif block == head_block:
            head_rank = rank
        if running * pp > total * (rank + 1) and rank < pp - 1:
            rank += 1
    return tuple(counts), head_rank


def block_costs(arch: Architecture, vocab: int) -> tuple[int, int]:
    """nanotron's pipeline-balancing costs (get_block_compute_costs): a decoder layer 4*heads*(h // heads)*h for
    attention + 3*ffn*h for the gated MLP (2*ffn*h without a gate, as its Falcon model has), the lm_head vocab*h
    with the vocabulary as the model builds it (padded when the framework pads)."""
    h, heads = arch.hidden_size, arch.num_attention_heads
    layer = 4 * heads * (h // heads) * h + (3 if arch.gated_mlp else 2) * arch.ffn_hidden_size * h
    return layer, vocab * h


def stages_from_counts(counts: Sequence[int], pp: int, head_rank: int | None = None,
                       warnings: Sequence[str] = ()) -> Stages:
    """The stages from the decoder layers of each virtual stage, in virtual-stage order: virtual stage
    k = chunk*pp + rank runs the next counts[k] layers (Megatron's and torchtitan's interleaved order). Any
    convention, and an explicit layout once parsed, is such a list of counts."""
    if len(counts) % pp:
        raise MeshplanError(f"{len(counts)} virtual stages do not fill pp={pp} ranks equally.",
                            fix="Give pp x vpp per-stage layer counts.")
    vpp = len(counts) // pp
    stages: list[list[tuple[int, ...]]] = [[] for _ in range(pp)]
    nxt = 0
    for k, size in enumerate(counts):
        stages[k % pp].append(tuple(range(nxt, nxt + size)))
        nxt += size
    assert all(len(s) == vpp for s in stages)
    return Stages(tuple(tuple(s) for s in stages), pp - 1 if head_rank is None else head_rank, tuple(warnings))


def _over_chunks(rank_counts: Sequence[int], vpp: int, warnings: list[str]) -> list[int]:
    """Each rank's layers over its vpp virtual chunks (a remainder to the earliest chunks), in virtual-stage order."""
    per_rank = []
    for rank, n in enumerate(rank_counts):
        if vpp > 1 and n % vpp:
            warnings.append(
                f"Stage {rank} holds {n} layers, which do not split into vpp={vpp} equal chunks "
                "(run `meshplan check`)."
            )
        per_rank.append(_split(n, vpp))
    return [per_rank[rank][chunk] for chunk in range(vpp) for rank in range(len(rank_counts))]


def _no_empty_chunk(counts: Sequence[int], num_layers: int, pp: int, vpp: int) -> None:
    if vpp > 1 and min(counts) == 0:
        raise MeshplanError(
            f"vpp={vpp} leaves a virtual pipeline stage with no layer ({num_layers} layers over pp={pp}).",
            fix=f"Use pp*vpp <= {num_layers}.",
        )


@lru_cache(maxsize=4096)
def megatron_stages(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> Stages:
    """Megatron's convention: decoder layers split evenly over the ranks (a remainder on the earliest, which
    gives every rank the layers torchtitan's split over pp*vpp virtual stages gives it), or the first/last
    stage sizes with the middle stages even; each rank's layers then split over its virtual chunks
    (get_transformer_layer_offset)."""
    rank_counts, warnings = layers_per_rank(num_layers, pp, first, last)
    if vpp > 1 and pp == 1:
        warnings.append("vpp > 1 has no effect with pp=1; estimated without interleaving.")
        vpp = 1
    counts = _over_chunks(rank_counts, vpp, warnings)
    _no_empty_chunk(counts, num_layers, pp, vpp)
    return stages_from_counts(counts, pp, warnings=warnings)


@lru_cache(maxsize=4096)
def balanced_stages(num_layers: int, pp: int, vpp: int, layer_cost: int, head_cost: int) -> Stages:
    """nanotron's convention (compute_balanced_counts), each rank's layers split over its virtual chunks."""
    warnings: list[str] = []
    rank_counts, head_rank = compute_balanced_counts(num_layers, pp, layer_cost, head_cost)
    counts = _over_chunks(rank_counts, vpp, warnings)
    _no_empty_chunk(counts, num_layers, pp, vpp)
    return stages_from_counts(counts, pp, head_rank, warnings)


@lru_cache(maxsize=4096)
def own_stages(num_layers: int, pp: int, vpp: int) -> Stages:
    """A framework that partitions the layers itself (its card's pipeline.partition remainder_first, DeepSpeed's
    partition_balanced over its transformer layers): floor(L/pp) per rank, one more on each of the first L % pp;
    no warning, since no other split can be told."""
    warnings: list[str] = []
    counts = _over_chunks(_split(num_layers, pp), vpp, warnings)
    _no_empty_chunk(counts, num_layers, pp, vpp)
    return stages_from_counts(counts, pp, warnings=warnings)


def stages_for(arch: Architecture, card: FrameworkCard, zero_stage: int, tp: int, pp: int, vpp: int,
               first: int | None, last: int | None) -> Stages:
    """The stages of a layout under the framework's pipeline convention: explicit first/last stage sizes win;
    then the framework's own partition (its card's pipeline.partition); otherwise the convention of the
    framework's byte preset (cards/memory.yaml pipeline_partition)."""
    if card.pipeline.partition == "remainder_first" and first is None and last is None:
        return own_stages(arch.num_layers, pp, vpp)
    _, conv, _ = convention(card, zero_stage)
    if conv.pipeline_partition == "compute_balanced" and pp > 1 and first is None and last is None:
        layer_cost, head_cost = block_costs(arch, built_vocab(arch.vocab_size, conv, tp))
        return balanced_stages(arch.num_layers, pp, vpp, layer_cost, head_cost)
    return megatron_stages(arch.num_layers, pp, vpp, first, last)


@lru_cache(maxsize=1024)
def explicit_stages(num_layers: int, pp: int, vpp: int, layout: str | None, embedding: bool, loss: bool,
                    unit: int = 1) -> Stages:
    """The stages an explicit layout (its decoder layers t per stage) or the embedding/loss accounting gives
    (plan_layout_problem has found nothing wrong with them): the loss and output layer on the last rank, where a
    valid layout puts L; the MTP blocks on the rank of the layout's m, or not built when the layout has none. Each t
    and each accounted layer is `unit` of the model's `num_layers` (gdn_config.pipeline_unit: a Gated DeltaNet
    hybrid's decoder layer, two pattern layers, get_num_layers_to_build counting its GPTModel's TransformerLayers)."""
    if layout is None:
        counts = accounted_counts(num_layers // unit, pp, vpp, embedding, loss)[0]
        return stages_from_counts([n * unit for n in counts], pp)
    stages = parse_layout(layout)
    base = stages_from_counts([stage.count("t") * unit for stage in stages], pp)
    holders = [k for k, stage in enumerate(stages) if "m" in stage]
    return replace(base, mtp_rank=holders[0] % pp if holders else None, mtp_trained=bool(holders))


def plan_stages(job: Job, plan: Plan) -> Stages:
    """The decoder layers each pipeline stage of the plan holds: memory and throughput both read this."""
    if plan.pipeline_layout is not None or plan.account_for_embedding or plan.account_for_loss:
        problem = plan_layout_problem(job.model, plan)
        if problem:
            raise MeshplanError(f"The pipeline layout cannot be estimated: {problem}.",
                                fix=_layout_fix(job.model, plan))
        stages = explicit_stages(job.model.num_layers, plan.pp, plan.vpp, plan.pipeline_layout,
                                 plan.account_for_embedding, plan.account_for_loss, pipeline_unit(job.model))
        if job.model.num_mtp_layers and not stages.mtp_trained:
            stages = replace(stages, warnings=(*stages.warnings, (
                f"The pipeline layout places no MTP layer m: estimated without the model's {job.model.num_mtp_layers} "
                "MTP block(s), as Megatron-Core builds none without mtp_num_layers (with it, the layout must place "
                "them).")))
        return stages
    stages = stages_for(job.model, job.card, plan.zero_stage, plan.tp, plan.pp, plan.vpp,
                        plan.first_stage_layers, plan.last_stage_layers)
    if plan.runs_schedule is not None and plan.pp > 1 and schedule_order(plan.runs_schedule, plan.vpp) in V_ORDERS:
        return v_placed(stages, plan.pp)
    return stages


def v_placed(stages: Stages, pp: int) -> Stages:
    """The same virtual stages placed in a V (torch's generate_stage_to_rank_mapping style "v", two chunks per rank):
    rank r holds stage r and stage 2p - 1 - r, so rank 0 holds the first stage and the last, with the output layer."""
    flat = [stages.chunks[s % pp][s // pp] for s in range(2 * pp)]
    chunks = tuple((flat[r], flat[2 * pp - 1 - r]) for r in range(pp))
    return replace(stages, chunks=chunks, head_rank=0, mtp_rank=None if stages.mtp_rank is None else 0)


# --------------------------------------------------------------------------- micro-batches in flight


def plan_shape(card: FrameworkCard, pp: int, vpp: int, microbatches: int, schedule: str | None = None) -> Shape:
    """The pipeline schedule a plan runs under its framework (the framework card's pipeline section): its order,
    and with vpp > 1 the interleaved one with the framework's micro-batch group; a named schedule (the plan's
    pipeline_schedule) its own order (pipeline_timeline.schedule_order)."""
    facts = card.pipeline
    order = facts.order if schedule is None else schedule_order(schedule, vpp)
    return shape_for(order, facts.group, pp, vpp, microbatches)


@lru_cache(maxsize=65536)  # a pure function of small ints and names, asked per stage of every memory estimate
def in_flight(rank: int, pp: int, vpp: int, microbatches: int, group: InterleaveGroup = "pp",
              schedule: str | None = None) -> tuple[int, ...]:
    """Micro-batches whose activations rank `rank` holds at its peak, per virtual chunk, read from the schedule's
    order (pipeline_counts.in_flight).

    1F1B: the first backward starts after p - rank - 1 warm-up forwards, so min(m, p - rank) are held.
    Interleaved: the warm-up (p - rank - 1)*2 + (v - 1)*G plus the steady-state forward, capped at m*v; forward k
    of the rank runs chunk (k // G) % v. G is the framework's group: pp for Megatron-Core (shrunk to m when fewer),
    torch's m // max(1, m // pp) for torchtitan.
    """
    if pp == 1:  # no pipeline: each micro-batch runs every chunk forward and backward before the next
        return (1,) * vpp
    order = "1f1b" if schedule is None else schedule_order(schedule, vpp)
    return timeline_in_flight(shape_for(order, group, pp, vpp, microbatches), rank)
