"""The job the search compares layouts on: the request resolved with every degree open, and one global batch for
every layout (the request's, else request.default_global_batch for the GPU count, the batch check and render of
the same request take)."""

from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.resolve import (
    batch_unit_text,
    cluster_gpu,
    default_batch_note,
    default_global_batch,
    launch_gpus_per_node,
    resolve,
)
from meshplan.schema.plan import Job
from meshplan.schema.request import Request

OPEN_FOR_SEARCH = ("tp", "pp", "cp", "ep", "etp", "dp", "vpp", "first_stage_layers", "last_stage_layers",
                   "pipeline_layout", "account_for_embedding", "account_for_loss")
"""Fields cleared before the request is resolved: the search chooses them (what the request fixes stays in Fixed)."""


def search_job(req: Request) -> tuple[Job, list[str]]:
    """The job the search compares layouts on, and the note saying which default batch was taken (if one was)."""
    if req.num_gpus is None:
        fixed = [req.tp, req.pp, req.cp, req.dp]
        if all(v is not None for v in fixed):
            req = req.model_copy(update={"num_gpus": req.tp * req.pp * req.cp * req.dp})  # type: ignore[operator]
        else:
            resolve_model(req.model)  # a misspelt model is named first: the count alone fixed, it was refused next
            raise MeshplanError(
                "recommend needs the GPU count to search over.",
                fix="Pass num_gpus (e.g. --num-gpus 64), or fix every degree (tp, pp, cp, dp).",
            )
    if req.recompute_modules is not None:
        # The search's memory floor assumes Megatron's default module (core_attn) under selective recompute.
        raise MeshplanError(
            "recommend does not search with recompute_modules yet.",
            fix="Drop them (recommend weighs Megatron's selective as its default, core_attn), or estimate the layout "
                "with recompute_modules through `meshplan memory` / `meshplan check` at fixed degrees.",
        )
    if req.selective_ac_option not in (None, "op"):
        # The search times and floors torchtitan's selective as op-level SAC; every-N would be dropped silently.
        raise MeshplanError(
            f"recommend does not search with selective_ac_option={req.selective_ac_option} (every N-th block) yet.",
            fix="Drop it (recommend weighs torchtitan's selective as op-level SAC), or estimate that layout with "
                "`meshplan memory` / `meshplan throughput` at fixed degrees.",
        )
    job, _ = resolve(req.model_copy(update=dict.fromkeys(OPEN_FOR_SEARCH)))
    notes: list[str] = []
    launch_gpus_per_node(job.num_gpus, job.gpu, req.gpus_per_node, notes)  # its note, where the nodes are part-filled
    notes += cluster_gpu(req)[1]  # the request's network, where it states one (every layout is timed on it)
    # the search holds every estimate to its own budget (policy.memory_budget, the same headroom): its memory reports
    # stay against the whole GPU, so a near miss is measured from capacity
    job = job.model_copy(update={"headroom": None})
    if req.global_batch_size is None:
        job = job_at(job, job.num_gpus, user_gbs=False)
        notes.append(default_batch_note(job.global_batch_size, job.seq_length, batch_unit_text(job.num_gpus, 1, 1)))
    else:
        job = job.model_copy(update={"notes": []})
    return job, notes


def job_at(job: Job, world: int, user_gbs: bool) -> Job:
    """The job on `world` GPUs; a default batch is re-derived for that count."""
    gbs = job.global_batch_size if user_gbs else default_global_batch(job.seq_length, world)
    return job.model_copy(update={"num_gpus": world, "global_batch_size": gbs, "notes": []})
