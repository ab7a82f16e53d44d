"""The batch rules of cards/rules.yaml (BS001, VL001, SK001): the global batch against micro-batches and data
parallelism, in each framework's own law.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import divisors, fmt_set, neighbours

MAX_LISTED_MBS = 64  # micro-batch sizes listed up to 64: beyond, a micro-batch alone is a large global batch



def _mbs_options(per_rank: int) -> str:
    return fmt_set(divisors(per_rank, upto=MAX_LISTED_MBS)) if per_rank > 0 else "none"



@rule("BS001", reads=("dp", "micro_batch_size", "global_batch_size"))
def batch_divisible(ctx: Context) -> Values:
    p, gbs = ctx.plan, ctx.job.global_batch_size
    unit = p.micro_batch_size * p.dp
    if gbs % unit == 0:
        return None
    per_rank = gbs // p.dp if gbs % p.dp == 0 else 0
    options = _mbs_options(per_rank)  # "none" when dp does not divide the batch: no micro-batch size helps
    return {"gbs": gbs, "mbs": p.micro_batch_size, "dp": p.dp, "unit": unit, "gbss": neighbours(gbs, unit),
            "mbss": f", or micro_batch_size in {options}" if options != "none" else ""}



@rule("VL001", reads=("dp", "zero_stage", "micro_batch_size", "global_batch_size"))
def verl_batch(ctx: Context) -> Values:
    p, gbs = ctx.plan, ctx.job.global_batch_size
    if ctx.backend == "megatron":
        unit, how = p.dp * p.micro_batch_size, f"dp*ppo_micro_batch_size_per_gpu = {p.dp}*{p.micro_batch_size}"
    else:
        unit, how = ctx.world, f"n_gpus = {ctx.world} (the FSDP backend's minimal batch)"
    if gbs % unit == 0:
        return None
    return {"gbs": gbs, "unit": unit, "how": how, "gbss": neighbours(gbs, unit)}



@rule("SK001", reads=("tp", "pp", "cp", "zero_stage", "micro_batch_size", "global_batch_size"))
def skyrl_batch(ctx: Context) -> Values:
    p, gbs = ctx.plan, ctx.job.global_batch_size
    dp = ctx.world // (ctx.model_parallel if ctx.backend == "megatron" else p.cp)
    if dp == 0:
        return None  # fewer GPUs than one model replica: the world-size rule (WS001) reports it
    per_gpu = gbs // dp
    if per_gpu > 0 and per_gpu % p.micro_batch_size == 0:
        return None
    return {"gbs": gbs, "dp": dp, "per_gpu": per_gpu, "mbs": p.micro_batch_size,
            "gbss": neighbours(gbs, dp * p.micro_batch_size)}
