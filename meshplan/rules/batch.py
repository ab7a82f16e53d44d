"""The batch rules of cards/rules.yaml (BS001, VL001, VL003, VL004, SK001): the global batch against micro-batches
and data parallelism, in each framework's own law.

Each condition returns None when its rule passes, else the numbers for the card's message and fix templates;
it states the framework's own test (the source the card names), not a tidier version of it.
"""

from __future__ import annotations

import math

from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import divisors, fmt_set, neighbours, rl_batch_fix

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



@rule("VL001", reads=("dp", "zero_stage", "micro_batch_size"), words=("cp",))  # cp: VL004 at the named step
def verl_batch(ctx: Context) -> Values:
    """verl's validate_config: the whole step's sequences (train_batch_size x rollout.n) in multiples of its minimal
    batch. The step's, also where the job estimated is one mini-batch's update (rl/step_time.mini_batch_update), whose
    global_batch_size holds the mini-batch: VL001 read it there and blamed data.train_batch_size for the mini-batch's
    count, with a prompts_per_step fix under the mini-batch. Each rank's share of a mini-batch is VL004's."""
    p = ctx.plan
    if ctx.job.rl is None:
        return None  # a training job is the SFT trainer's (render's variants sft-fsdp, sft-megatron): VL003
    gbs = ctx.job.rl.step_sequences
    if ctx.backend == "megatron":
        unit, how = p.dp * p.micro_batch_size, f"dp*ppo_micro_batch_size_per_gpu = {p.dp}*{p.micro_batch_size}"
    else:
        unit, how = ctx.world, "n_gpus (the FSDP backend's minimal batch)"
    if gbs % unit == 0:
        return None
    return {"gbs": gbs, "unit": unit, "how": how, "gbss": rl_batch_fix(ctx, gbs, unit)}



@rule("VL004", reads=("dp", "cp", "zero_stage", "micro_batch_size"))
def verl_mini_batch(ctx: Context) -> Values:
    """verl's per-rank PPO mini-batch: the stated mini-batch's sequences floored over the data-parallel ranks (the
    Megatron engine's dp, the FSDP engine's world over the Ulysses size), at least one, and on the FSDP engine whole
    micro-batches of ppo_micro_batch_size_per_gpu (what meshplan renders)."""
    rl, p = ctx.job.rl, ctx.plan
    if rl is None or not rl.splits_step:
        return None
    megatron = ctx.backend == "megatron"
    ranks, how = (p.dp, "dp") if megatron else (ctx.world // p.cp, "n_gpus / ulysses size")
    if ranks < 1:
        return None  # fewer GPUs than one model replica: the world-size rule (WS001) reports it
    mini = rl.prompts_per_mini_batch * rl.samples_per_prompt
    per_rank = mini // ranks
    whole = 1 if megatron else p.micro_batch_size
    if per_rank >= 1 and per_rank % whole == 0:
        return None
    what = "an empty share" if per_rank < 1 else f"not a whole number of micro_batch_size={whole} micro-batches"
    return {"mini": mini, "how": how, "ranks": ranks, "per_rank": per_rank, "what": what,
            "fixes": _mini_batch_fixes(rl.prompts_per_mini_batch, rl.prompts_per_step, rl.samples_per_prompt,
                                       ranks, whole)}


def _mini_batch_fixes(prompts: int, most: int, samples: int, ranks: int, whole: int) -> str:
    """The nearest mini-batch sizes below and above `prompts` (at most `most`) whose floored per-rank share is whole
    micro-batches; the shares repeat every ranks x whole / gcd(ranks x whole, samples) prompts, so a scan that long
    each side finds them."""
    period = ranks * whole // math.gcd(ranks * whole, samples)

    def fits(m: int) -> bool:
        share = m * samples // ranks
        return share >= 1 and share % whole == 0

    below = next((m for m in range(prompts - 1, max(0, prompts - period - 1), -1) if fits(m)), None)
    above = next((m for m in range(prompts + 1, min(most, prompts + period) + 1) if fits(m)), None)
    found = [m for m in (below, above) if m is not None]
    return " or ".join(map(str, found)) if found else f"one over {most} (prompts_per_step): fewer ranks"



@rule("VL003", reads=("dp", "zero_stage", "micro_batch_size", "global_batch_size"))
def verl_sft_batch(ctx: Context) -> Values:
    """verl's SFT trainer (a training job, on the FSDP or the Megatron engine): data.train_batch_size over the
    engine's dp ranks (world / Ulysses, or Megatron's world / (tp x pp x cp)), each rank's share a whole number of
    micro-batches (fsdp_sft_trainer.py _normalize_config_bsz asserts both; 0.9.1's
    sft_trainer.py floors the share and workers/engine/utils.py prepare_micro_batches asserts the micro-batches)."""
    p, gbs = ctx.plan, ctx.job.global_batch_size
    unit = p.dp * p.micro_batch_size
    if ctx.job.rl is not None or gbs % unit == 0:
        return None
    share = f"{gbs // p.dp}" if gbs % p.dp == 0 else f"{gbs}/{p.dp} (not whole)"
    options = _mbs_options(gbs // p.dp if gbs % p.dp == 0 else 0)
    return {"gbs": gbs, "dp": p.dp, "mbs": p.micro_batch_size, "share": share, "gbss": neighbours(gbs, unit),
            "mbss": f", or micro_batch_size in {options}" if options != "none" else ""}



@rule("SK001", reads=("tp", "pp", "cp", "zero_stage", "micro_batch_size", "global_batch_size"))
def skyrl_batch(ctx: Context) -> Values:
    p, gbs, rl = ctx.plan, ctx.job.global_batch_size, ctx.job.rl
    mini = rl.prompts_per_mini_batch if rl is not None else None
    if rl is not None and mini is not None:  # SkyRL divides one mini-batch's sequences
        gbs = mini * rl.samples_per_prompt
    dp = ctx.world // (ctx.model_parallel if ctx.backend == "megatron" else p.cp)
    if dp == 0:
        return None  # fewer GPUs than one model replica: the world-size rule (WS001) reports it
    per_gpu = gbs // dp
    if per_gpu > 0 and per_gpu % p.micro_batch_size == 0:
        return None
    return {"gbs": gbs, "dp": dp, "per_gpu": per_gpu, "mbs": p.micro_batch_size,
            "batch": "prompts_per_mini_batch x samples_per_prompt" if mini is not None else "global_batch_size",
            "gbss": rl_batch_fix(ctx, gbs, dp * p.micro_batch_size, mini_batch=mini is not None)}
