"""The world-size rules of cards/rules.yaml (WS*): the degrees tile the GPU count as each framework's law says.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from meshplan.arithmetic import mesh
from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import (
    BATCH_READS,
    LISTED,
    at_layout,
    batch_words,
    divisors,
    fmt_set,
    kept_counts,
    neighbours,
)

PRODUCT_REACH = 4  # WS001 lists tp*pp*cp products up to 4x the requested one: two doublings of a degree away



def _product_divisors(ctx: Context) -> str:
    """tp*pp*cp products that divide the GPU count, near the requested one, for a fix."""
    near = [d for d in divisors(ctx.world) if d <= PRODUCT_REACH * ctx.model_parallel]
    return fmt_set(near[-LISTED:])



def tiling(ctx: Context, degree: Literal["tp", "pp", "cp", "ep"], values: Iterable[int]) -> list[int]:
    """Of `values` for one degree, those that keep this GPU count tiled as WS001 (the dense replica) and WS002 (the
    expert grid) test it, so a fix never names a value the world-size rules then refuse; all of them when none does
    (then the GPU count is what to change, and WS001/WS002 say so). A rule calling it reads tp, pp, cp, ep, etp."""
    pool = list(values)
    return tiled(ctx, degree, pool) or pool



def tiled(ctx: Context, degree: Literal["tp", "pp", "cp", "ep"], values: Iterable[int]) -> list[int]:
    """Of `values` for one degree, those that keep this GPU count tiled (tiling's test), none when none does: for a
    fix that names the degree only as an alternative to a change that always works. Where the request left num_gpus
    out (Job.world_follows_layout), the count is the one the changed degrees imply, as resolve derives it
    (mesh.smallest_world), which they tile. Reads tp, pp, cp, ep, etp."""
    p = ctx.plan
    degrees = {"tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep}

    def tiles(v: int) -> bool:
        d = {**degrees, degree: v}
        etp = v if degree == "tp" and ctx.job.etp_follows_tp else p.etp  # an etp left out follows tp (at_layout)
        replica = mesh.replica_size(ctx.law, d["tp"], d["pp"], d["cp"], d["ep"])
        world = mesh.smallest_world(ctx.law, d["tp"], d["pp"], d["cp"], p.dp, d["ep"], etp) \
            if ctx.job.world_follows_layout else ctx.world
        if world % replica:
            return False
        return mesh.expert_grid_fits(ctx.law, world, d["tp"], d["pp"], d["cp"], world // replica, d["ep"], etp)

    return [v for v in values if tiles(v)]



def counts_fix(ctx: Context, unit: int) -> str:
    """The GPU counts WS001's fix names (Context.gpus_fix), those at which the batch rules pass at the dp each
    derives, else the first with the batch change beside it (fix_values.kept_counts). Reads BATCH_READS."""
    counts, beside = kept_counts(ctx, ctx.gpu_counts(unit))
    return ctx.gpus_fix(unit, counts=counts) + beside


@rule("WS001", reads=("tp", "pp", "cp", "ep", "etp", "placement", "rollout_gpus"), words=BATCH_READS)
def dense_grid_divides_world(ctx: Context) -> Values:
    """The counts are the request's num_gpus (Context.request_gpus): an RL job placed apart said 'num_gpus=30' of a
    request for 32 and offered the trainer's counts, which the request's count then splits again. They are multiples
    of the fewest GPUs that hold the expert grid too (mesh.smallest_world, WS002's): 'num_gpus = 126' at tp=3, ep=16
    tiled tp*pp*cp and left the experts untiled (WS002); and those at which the batch divides (counts_fix)."""
    p, mp = ctx.plan, ctx.model_parallel
    if ctx.world % mp == 0:
        return None
    unit = mesh.smallest_world(ctx.law, p.tp, p.pp, p.cp, 1, p.ep, p.etp)
    return {"world": ctx.world, "count": ctx.world_words(), "mp": mp, "tp": p.tp, "pp": p.pp,
            "cp": p.cp, "gpus": counts_fix(ctx, unit), "products": _product_divisors(ctx)}



def working_ep(ctx: Context, room: int) -> list[int]:
    """EP values that divide the expert count and `room` (the GPUs the expert grid may use per pipeline stage)."""
    if not ctx.num_experts or room < 1:
        return []
    return [e for e in divisors(ctx.num_experts) if room % e == 0]



def _etp_one_fix(ctx: Context) -> str:
    """The first thing WS002's fix says when experts kept whole (etp=1) make the expert grid tile this GPU count:
    an unset etp is tp on Megatron-Core, and etp=1 is what the published MoE recipes set (the framework cards'
    defaults.etp_why). Empty when etp is already 1 or etp=1 does not fit either."""
    p = ctx.plan
    if p.etp == 1 or not mesh.expert_grid_fits(ctx.law, ctx.world, p.tp, p.pp, p.cp, p.dp, p.ep, 1):
        return ""
    return (f"Set etp=1 (experts whole: etp*ep*pp = 1*{p.ep}*{p.pp} = {p.ep * p.pp} divides {ctx.world}), "
            f"or keep etp={p.etp} and change the GPU count or ep. ")



def eps_beside_overlap(ctx: Context, eps: list[int]) -> list[int]:
    """Of the eps a fix names, those the plan's moe_a2a_overlap keeps: over 1 where it is on, as EP009 refuses the
    overlap at ep=1 (no expert all-to-all to hide); empty where 1 is the only one (the fix then names it with the
    overlap off). Reads moe_a2a_overlap."""
    return [e for e in eps if e > 1] if ctx.plan.moe_a2a_overlap else eps


@rule("WS002", reads=("tp", "pp", "cp", "ep", "etp", "dp", "placement", "rollout_gpus"), words=BATCH_READS)
def expert_grid_divides_world(ctx: Context) -> Values:
    """The eps it names leave 1 out beside moe_a2a_overlap, which EP009 then refuses (no all-to-all to hide: 'ep in
    {1, 2, 4}' applied as ep=1, bench/random_requests.py fixes 4 and 7); where 1 is the only one, with the overlap
    off. The counts it names are those at which the batch rules pass at the dp each derives, else the first with the
    batch change beside it (fix_values.kept_counts, as WS001's): 'num_gpus = 16' for a 1-sequence global batch on
    verl left dp 16, which VL003 refused (bench/random_requests.py fixes 1)."""
    p = ctx.plan
    grid = ctx.expert_grid
    if ctx.world % grid == 0:
        return None
    minimum = mesh.smallest_world(ctx.law, p.tp, p.pp, p.cp, 1, p.ep, p.etp)
    room = ctx.world // (p.pp * p.etp) if ctx.world % (p.pp * p.etp) == 0 else 0
    eps = working_ep(ctx, room)
    wider = eps_beside_overlap(ctx, eps)
    said = fmt_set(wider) if wider else f"{fmt_set(eps)} with moe_a2a_overlap=false"
    return {"world": ctx.world, "count": ctx.world_words(), "grid": grid, "etp": p.etp, "ep": p.ep, "pp": p.pp,
            "minimum": minimum, "etp_one": _etp_one_fix(ctx),
            "gpus": _grid_counts_fix(ctx, minimum),
            "eps": f", or ep in {said} at this GPU count" if eps
            else f"; no ep tiles {ctx.world} GPUs at pp={p.pp}, etp={p.etp}"}



def _grid_counts_fix(ctx: Context, minimum: int) -> str:
    """WS002's GPU counts (multiples of `minimum`, listed without the word), with the batch change beside the first
    where the batch rules refuse every one (kept_counts). Reads BATCH_READS."""
    counts, beside = kept_counts(ctx, ctx.gpu_counts(minimum))
    return ctx.gpus_fix(minimum, multiples=False, counts=counts) + beside


@rule("WS003", reads=("tp", "pp", "cp", "dp", "placement", "rollout_gpus"), words=BATCH_READS)
def dp_matches_law(ctx: Context) -> Values:
    """Dropping dp takes the derived one, at which the stated batch may no longer divide: the fix names the batch
    change beside it there (a ds_config's train_batch_size, whose dp the file states through its accumulation). The
    message says how the framework sets dp (its card's limits.data_parallel): on DeepSpeed it said 'Megatron derives
    dp', Megatron-DeepSpeed's arguments and DeepSpeed's batch assertion being what refuse it."""
    mp = ctx.model_parallel
    if ctx.world % mp or ctx.plan.dp == ctx.world // mp:
        return None
    needed = ctx.request_gpus(ctx.plan.dp * mp)
    batch = derived_dp_batch(ctx)
    return {"dp": ctx.plan.dp, "world": ctx.world, "mp": mp, "derived": ctx.world // mp,
            "how": ctx.card.limits.data_parallel,
            "batch": f" with {batch}" if batch else "",
            "needed": needed if needed == ctx.plan.dp * mp else f"{needed} (the trainer's {ctx.plan.dp * mp})"}


def derived_dp_batch(ctx: Context) -> str:
    """The batch change a fix that drops a stated dp names beside it: the batch rules at the dp the law derives
    (fix_values.batch_words); empty where they pass there. Reads BATCH_READS."""
    return batch_words(at_layout(ctx, {}))



def product_fix(ctx: Context, unit: int, formula: str, derive: str) -> dict[str, str]:
    """The fix of a mesh whose dp*`unit` is not the GPU count (WS004, WS006, AM001), naming only what works here.
    With dp as the law derives it (left out, or given as that), only the GPU count can change: the multiples of
    `unit`, each with its dp (what leaving dp out derives there; a dp given as this count's must follow). With another
    dp given: the count its degrees need (dp*unit), and dropping dp only where the derived dp tiles the count
    (`derive`: how the framework's config leaves dp to be derived); a count off the multiples of `unit` no dp fixes.
    Reads tp, pp, cp, dp (and ep, where `unit` holds it: WS006)."""
    p = ctx.plan
    derived = max(1, ctx.world // unit)  # the rule's own replica (its framework's law): reads what the rule reads
    if p.dp == derived:
        return {"gpus": f"{neighbours(ctx.world, unit)} (multiples of {formula} = {unit}; dp = num_gpus/{unit})",
                "derive": ""}
    batch = "" if ctx.world % unit else derived_dp_batch(ctx)
    return {"gpus": f"dp*{formula} = {p.dp}*{unit} = {p.dp * unit}",
            "derive": "" if ctx.world % unit else
            f", or drop dp ({derive} derives {ctx.world}/({formula}) = {ctx.world}/{unit} = {derived})"
            + (f" with {batch}" if batch else "")}



@rule("WS004", reads=("tp", "pp", "cp", "dp"), words=BATCH_READS)
def torchtitan_product(ctx: Context) -> Values:
    return mesh_product(ctx, "data_parallel_shard_degree=-1")


def mesh_product(ctx: Context, derive: str) -> Values:
    """torchtitan's test (and NeMo AutoModel's: AM001), dp*cp*tp*pp == world, with its fix (product_fix; `derive`:
    how the framework's config leaves dp to be derived)."""
    p = ctx.plan
    product = p.dp * p.cp * p.tp * p.pp
    if product == ctx.world:
        return None
    mp = p.cp * p.tp * p.pp
    return {"dp": p.dp, "cp": p.cp, "tp": p.tp, "pp": p.pp, "product": product, "world": ctx.world, "mp": mp,
            **product_fix(ctx, mp, "cp*tp*pp", derive)}



@rule("WS005", reads=("tp", "cp", "dp", "dp_replicate", "ep", "zero_stage"))
def torchtitan_ep_divides(ctx: Context) -> Values:
    return ep_borrows(ctx, mesh.torch_dp_degrees(ctx.plan)[1])  # data_parallel_shard_degree as rendered: 1 at ZeRO-0


def ep_borrows(ctx: Context, dp: int) -> Values:
    """EP reshapes the ranks of `dp` x cp x tp (a framework's own dp factor: torchtitan's shard degree, NeMo
    AutoModel's whole dp_size): a finding where ep does not divide them, with the ep values that do."""
    p = ctx.plan
    room = dp * p.cp * p.tp
    if p.ep == 1 or room % p.ep == 0:
        return None
    eps = working_ep(ctx, room)
    return {"ep": p.ep, "room": room, "dp": dp, "cp": p.cp, "tp": p.tp, "eps": fmt_set(eps) if eps else "none"}



@rule("WS006", reads=("tp", "pp", "cp", "ep", "dp"), words=BATCH_READS)
def kempnerforge_product(ctx: Context) -> Values:
    p = ctx.plan
    product = p.dp * p.tp * p.pp * p.cp * p.ep
    if product == ctx.world:
        return None
    unit = p.tp * p.pp * p.cp * p.ep
    return {"dp": p.dp, "tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep, "product": product,
            "world": ctx.world, "unit": unit, **product_fix(ctx, unit, "tp*pp*cp*ep", "dp_shard=-1")}


@rule("DP001", reads=("tp", "pp", "ep", "etp", "dp", "dp_replicate"))  # tp: KempnerForge's expert_dp
def dp_replicate_divides_dp(ctx: Context) -> Values:
    """Hybrid sharding: the replicas split dp (and, for a MoE model, the expert-data-parallel ranks) evenly
    (Megatron parallel_state: dp*cp and expert-dp % num_distributed_optimizer_instances; torchtitan: dp_replicate *
    dp_shard = dp)."""
    p = ctx.plan
    n = p.dp_replicate
    edp = mesh.expert_dp(ctx.world, p, ctx.law) if ctx.num_experts else float(p.dp)  # a dense model: dp alone
    if n == 1 or (p.dp % n == 0 and edp % n == 0):
        return None
    common = [d for d in divisors(p.dp) if edp % d == 0]
    return {"n": n, "dp": p.dp, "edp": f"{edp:g}", "fits": fmt_set(common[-LISTED:])}


@rule("DP002", reads=("zero_stage", "dp_replicate"))
def dp_replicate_needs_sharding(ctx: Context) -> Values:
    """dp_replicate > 1 replicates sharded states; at zero_stage 0 nothing is sharded."""
    p = ctx.plan
    if p.dp_replicate == 1 or p.zero_stage > 0:
        return None
    return {"n": p.dp_replicate}
