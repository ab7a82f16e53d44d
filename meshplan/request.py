"""Turns a flat `Request` into the `Job` and `Plan` every estimator takes, filling defaults openly.

Each default that is filled in is written to `Job.notes`, so a report can say what it assumed.
"""

from __future__ import annotations

from meshplan.cards import framework_card
from meshplan.hardware import get_gpu
from meshplan.models import resolve_model
from meshplan.schema import MEGATRON_FAMILY, Job, Plan, Request

DEFAULT_BATCH_TOKENS = 1 << 22  # ~4M tokens per step, the Llama 3 pre-training starting batch


def default_global_batch(seq_length: int, micro_batch_size: int, dp: int) -> int:
    """About 4M tokens per step, rounded up to a whole number of micro-batches on every DP rank."""
    unit = micro_batch_size * dp
    sequences = max(1, DEFAULT_BATCH_TOKENS // seq_length)
    return max(unit, -(-sequences // unit) * unit)


def uses_fsdp(framework: str, zero_stage: int) -> bool:
    """FSDP-style sharding: torchtitan/KempnerForge always; verl/SkyRL/DeepSpeed at zero_stage 3."""
    return framework_card(framework).memory_convention == "fsdp2" or zero_stage == 3


def resolve(req: Request) -> tuple[Job, Plan]:
    """Fill the plan's and job's defaults from the framework card and the GPU count."""
    arch = resolve_model(req.model)
    gpu = get_gpu(req.gpu)
    card = framework_card(req.framework)
    notes: list[str] = []
    tp, pp, cp = req.tp or 1, req.pp or 1, req.cp or 1
    ep = req.ep or 1
    etp = req.etp
    if etp is None:
        # Megatron-Core's ModelParallelConfig sets an unset expert_tensor_parallel_size to TP; verl and SkyRL
        # pass None through to it. Elsewhere experts are not tensor-sharded unless asked.
        etp = tp if arch.is_moe and card.world_size_law == "megatron" and req.framework in MEGATRON_FAMILY else 1
        if arch.is_moe and etp > 1:
            notes.append(f"etp not given: {etp} = tp, as Megatron-Core defaults it (pass etp=1 to keep experts whole).")
    # KempnerForge gives expert parallelism ranks of its own; elsewhere EP folds into the DP x CP x TP ranks.
    own_ep = ep if card.world_size_law == "kempnerforge" else 1
    if req.num_gpus is None:
        dp = req.dp or 1
        num_gpus = tp * pp * cp * dp * own_ep
        notes.append(f"num_gpus not given: {num_gpus} = the product of the parallel degrees.")
    else:
        num_gpus = req.num_gpus
        dp = req.dp or max(1, num_gpus // (tp * pp * cp * own_ep))
        if req.dp is None:
            notes.append(f"dp not given: {dp} = num_gpus / (tp*pp*cp{'*ep' if own_ep > 1 else ''}).")
    zero = card.defaults.zero_stage if req.zero_stage is None else req.zero_stage
    if req.zero_stage is None:
        notes.append(f"zero_stage not given: {zero}, the {card.display_name} default meshplan assumes.")
    sp = req.sequence_parallel
    if sp is None:
        sp = tp > 1 and card.defaults.sequence_parallel_when_tp
    gbs = req.global_batch_size
    if gbs is None:
        gbs = default_global_batch(req.seq_length, req.micro_batch_size, dp)
        notes.append(f"global_batch_size not given: {gbs} sequences (~4M tokens, a whole number of micro-batches).")
    gpn = req.gpus_per_node or gpu.gpus_per_node
    plan = Plan(
        tp=tp, pp=pp, vpp=req.vpp or 1, cp=cp, ep=ep, etp=etp, dp=dp,
        sequence_parallel=sp, zero_stage=zero, micro_batch_size=req.micro_batch_size,
        recompute=req.recompute, recompute_layers=req.recompute_layers,
        cp_comm_type=req.cp_comm_type or "p2p", moe_token_dispatcher=req.moe_token_dispatcher or "alltoall",
        first_stage_layers=req.first_stage_layers, last_stage_layers=req.last_stage_layers,
    )
    job = Job(
        model=arch, gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpn, seq_length=req.seq_length,
        global_batch_size=gbs, precision=req.precision, framework=req.framework, notes=notes,
    )
    return job, plan


def is_megatron_family(framework: str) -> bool:
    return framework in MEGATRON_FAMILY
