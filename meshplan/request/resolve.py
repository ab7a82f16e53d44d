"""Turns a flat `Request` into the `Job` and `Plan` every estimator takes, filling defaults openly.

Each default that is filled in is written to `Job.notes`, so a report can say what it assumed. (The parser that
builds a `Request` from loose values is request/parse.py.)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from meshplan.arithmetic import mesh
from meshplan.arithmetic.activation_passes import activation_fusable, activation_key, default_activation_fusion
from meshplan.arithmetic.lora import resolve_lora
from meshplan.arithmetic.memory_states import convention_name, memory_card, upcast_switch
from meshplan.arithmetic.mesh import DEFAULT_BATCH_TOKENS, default_global_batch
from meshplan.arithmetic.schedule import parse_layout
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GBIT_BYTES
from meshplan.knowledge.adapter_knobs import unwritable_reason
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.compute_card import cp_comm_type_default
from meshplan.knowledge.hardware import get_gpu, with_node_network
from meshplan.knowledge.release_card import ReleaseChange
from meshplan.knowledge.releases import kernel_before_change, predates, resolve_release
from meshplan.request.mtp_depth import mtp_asked, trained_mtp, writable_mtp
from meshplan.rl.job import is_rl_request, resolve_rl
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.hardware import GpuSpec
from meshplan.schema.model import Architecture, layer_kind_counts
from meshplan.schema.plan import Job, Plan, step_microbatches
from meshplan.schema.request import Request


def default_batch_note(gbs: int, seq_length: int, unit_text: str) -> str:
    """Says which default batch was taken in real tokens (sequences x seq_length), and why it is not ~4M tokens
    when it is not: a sequence longer than the target, or the rounding up to `unit_text`."""
    wanted = max(1, DEFAULT_BATCH_TOKENS // seq_length)
    text = (f"global_batch_size not given: {gbs:,} sequences x {seq_length:,} tokens = {gbs * seq_length / 1e6:,.1f}M "
            f"tokens per step (the default aims at {DEFAULT_BATCH_TOKENS / 1e6:.1f}M tokens, 2^22, the Llama 3 "
            "pre-training starting batch")
    if seq_length > DEFAULT_BATCH_TOKENS:
        text += f"; one sequence of {seq_length:,} tokens is already longer than that"
    if gbs > wanted:
        text += f"; {wanted:,} sequence{'s' if wanted > 1 else ''} rounded up to {gbs:,}, a multiple of {unit_text}"
    return text + ")."


def batch_unit_text(num_gpus: int, micro_batch_size: int, dp: int) -> str:
    """What the default batch was rounded to a multiple of, in words (default_global_batch's unit)."""
    text = f"the {num_gpus:,} GPUs, so that every data-parallel size divides it"
    if num_gpus % (micro_batch_size * dp):
        text += f", and of micro-batch {micro_batch_size} x {dp:,} data-parallel ranks"
    return text


def launch_gpus_per_node(num_gpus: int, gpu: GpuSpec, asked: int | None, notes: list[str],
                         whose: str = "") -> int:
    """The processes launched on each node (the job's gpus_per_node: its nodes, NVLink domain and host share).
    torchrun and Ray start the same number on every node, so a count over one node that is no multiple of the
    GPU's node runs with fewer, the nodes' other GPUs idle: the largest count dividing both the GPU count and the
    node (20 on 8-GPU nodes: 5 nodes x 4), so that every group that fits a node's share lies on one node, as the
    frameworks' power-of-two TP and expert groups then do; where that is 1, the largest divisor of the count not above
    the node (15: 5 nodes x 3); one with no divisor from 2 up is refused with the counts that launch, and so is a
    gpus_per_node the request gives that leaves a node part-filled (13 GPUs on nodes of 4: mesh.whole_nodes, whose
    words render's adapters/common.nodes gives too). `whose`: what the count is where it is not the request's
    num_gpus (an RL job's trainer share)."""
    node = gpu.gpus_per_node
    if asked is not None:
        mesh.whole_nodes(num_gpus, asked, whose)  # refuses a part-filled node, in render's words too
    if asked is not None or num_gpus <= node or num_gpus % node == 0:
        return node if asked is None else asked
    per_node, why = _node_share(num_gpus, node)
    if per_node < 2:
        raise MeshplanError(
            f"{num_gpus} GPUs cannot be launched on {node}-GPU {gpu.name} nodes: launchers (torchrun, Ray) start the "
            f"same number of processes on every node, and no count from 2 to {node} divides {num_gpus}.",
            fix=f"Use {_launchable_words(num_gpus, node)}, or set gpus_per_node=1 (one process on each of "
                f"{num_gpus} nodes).")
    idle = node - per_node
    notes.append(f"gpus_per_node not given: {num_gpus} GPUs do not fill whole {node}-GPU nodes and launchers start the "
                 f"same number of processes on every node, so the job runs as {num_gpus // per_node} nodes x "
                 f"{per_node} ({why}); {idle} GPU{'s' if idle > 1 else ''}"
                 f" of each node sit idle, and the NVLink domain, TP/EP placement and network traffic are those of "
                 f"{per_node} ranks per node{_aligned_split(num_gpus, per_node)}. Pass gpus_per_node to choose another "
                 "split.")
    return per_node


def _node_share(num_gpus: int, node: int) -> tuple[int, str]:
    """The processes per node of a count that fills no whole node (launch_gpus_per_node's rule), and why, in words."""
    share = math.gcd(num_gpus, node)
    if share >= 2:
        return share, f"the largest count dividing both {num_gpus} and the {node}-GPU node"
    share = max(d for d in range(1, node + 1) if num_gpus % d == 0)
    return share, f"the largest divisor of {num_gpus} not above {node}; none from 2 up divides both"


def _aligned_split(num_gpus: int, per_node: int) -> str:
    """The largest power of two dividing the count and not above the split's per-node count, where groups of that
    many ranks (TP or expert groups: powers of two, as heads and experts divide) straddle its nodes, in words."""
    two = num_gpus & -num_gpus  # the largest power of two dividing num_gpus
    while two > per_node:
        two //= 2
    if two < 2 or per_node % two == 0:
        return ""
    return (f" (groups of {two} ranks, TP{two} say, straddle nodes of {per_node}; gpus_per_node={two}, "
            f"{num_gpus // two} nodes x {two}, keeps them whole on a node)")


def _launchable_words(num_gpus: int, node: int) -> str:
    """The nearest GPU counts below and above `num_gpus` that launch over more than one node, and the next count
    of whole nodes, in words."""
    def split(n: int) -> int:
        return _node_share(n, node)[0]

    below = next((n for n in range(num_gpus - 1, node, -1) if split(n) >= 2), None)
    above = next(n for n in range(num_gpus + 1, num_gpus + node + 1) if split(n) >= 2)
    whole = -(-num_gpus // node) * node
    options = [f"{n} ({n // split(n)} nodes x {split(n)})" for n in (below, above) if n is not None and n % node]
    return " or ".join([*options, f"{whole} ({whole // node} whole nodes)"])


def cluster_gpu(req: Request) -> tuple[GpuSpec, list[str]]:
    """The request's GPU as its cluster runs it, and the note that says so where it differs from the catalog's: the
    part with the inter-node network the request states (network_gbps_per_node, shared by the node's GPUs: the
    request's gpus_per_node, else the part's node, whatever the launch split runs of it) in place of its card's
    network_bandwidth. The job carries it (Job.gpu), so every estimate, rule and search reads the cluster's network
    there, and the search's jobs, resolved from the same request, too."""
    gpu = get_gpu(req.gpu)
    if req.network_gbps_per_node is None:
        return gpu, []
    node = req.gpus_per_node or gpu.gpus_per_node
    ours = with_node_network(gpu, req.network_gbps_per_node, node)
    note = (f"network_gbps_per_node={req.network_gbps_per_node:g}: {_rate_words(ours.network_bandwidth * node)} per "
            f"node, shared by its {node} GPU{'s' if node > 1 else ''}: {_rate_words(ours.network_bandwidth)} per GPU "
            f"each direction, where the {gpu.name} card has {_rate_words(gpu.network_bandwidth)}; every inter-node "
            "collective and transfer is timed at it.")
    return ours, [note]


def _rate_words(bytes_per_s: float) -> str:
    """A network rate as its datasheet's Gb/s and as GB/s ('50 Gb/s (6.25 GB/s)')."""
    return f"{bytes_per_s / GBIT_BYTES:,.4g} Gb/s ({bytes_per_s / 1e9:,.4g} GB/s)"


def _estimable(arch: Architecture, req: Request) -> Architecture:
    """The model, unless it is a hybrid (Mamba-2 or Gated DeltaNet, attention, MLP and MoE layers) asked as an RL job,
    which meshplan does not model for one: refused rather than priced as if every layer were attention and an MLP. A
    LoRA job of one is planned as Megatron-Bridge's LoRA adapts it (arithmetic/lora.py kind_targets, mamba_adapters);
    the frameworks that build no hybrid, train it through transformers' code or run no LoRA are the rules' (HY001-HY004,
    LORA001; a Gated DeltaNet hybrid's LoRA LORA006)."""
    if arch.layer_pattern is None or not is_rl_request(req):
        return arch
    raise MeshplanError(f"{arch.name} is a hybrid model ({layer_kind_counts(arch.layer_pattern)} layers): meshplan "
                        "does not model an RL job of one.",
                        fix="Ask for a pretrain or sft job." if arch.gdn is not None  # LoRA: rule LORA006
                        else "Ask for a pretrain, sft or lora job.")


def resolve(req: Request) -> tuple[Job, Plan]:
    """Fill the plan's and job's defaults from the framework card and the GPU count. The steps run in a fixed
    order, so the notes read in that order and the first wrong field is the one an error names."""
    arch = _estimable(resolve_model(req.model), req)
    gpu, network = cluster_gpu(req)  # the catalog part, on the request's network where it states one
    card = framework_card(req.framework)
    notes: list[str] = []
    unread: list[str] = []  # fields given that this layout has nothing for (Job.given_unread)
    asked_gpus = req.num_gpus
    step_stated = tuple(name for name in ("prompts_per_step", "global_batch_size") if getattr(req, name) is not None)
    req, rl = resolve_rl(req, notes)  # an RL job: the trainer's GPUs, sequence and batch; None for a training job
    tp, cp = req.tp or 1, req.cp or 1
    pp, vpp = _pipeline_degrees(req, notes)
    vpp = _schedule_chunks(req, pp, vpp, notes)
    ep = req.ep or 1
    etp = _expert_tp(req, card, tp=tp, moe=arch.is_moe, notes=notes)
    version = _framework_version(req, card, notes)
    num_gpus, dp = _world(req, card.world_size_law, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, notes=notes)
    zero = _zero_stage(req, card, notes)
    arch = trained_mtp(arch, req, card, zero, notes)  # the MTP depth the run trains (request/mtp_depth.py)
    sp = req.sequence_parallel
    if sp is None:
        sp = tp > 1 and card.defaults.sequence_parallel_with_tp(arch, pp)
    mbs = _micro_batch(req, notes)
    recompute = _recompute(req, notes)
    gbs = _global_batch(req, num_gpus=num_gpus, mbs=mbs, dp=dp, notes=notes,
                        runs_per_step=card.pipeline.runs_per_accumulation_step)
    whose = f" (the trainer's share of num_gpus={asked_gpus})" if asked_gpus not in (None, num_gpus) else ""
    gpn = launch_gpus_per_node(num_gpus, gpu, req.gpus_per_node, notes, whose)
    notes += network
    plan = Plan(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=dp,
        sequence_parallel=sp, zero_stage=zero, dp_replicate=req.dp_replicate or 1, micro_batch_size=mbs,
        recompute=recompute, recompute_layers=req.recompute_layers, selective_ac_option=req.selective_ac_option,
        recompute_method=req.recompute_method, recompute_modules=req.recompute_modules,
        cp_comm_type=_cp_comm_type(req, arch, card, cp, unread),
        moe_token_dispatcher=_dispatcher(req),
        moe_a2a_overlap=_a2a_overlap(req, notes), pipeline_schedule=req.pipeline_schedule,
        pipeline_microbatches=_pipeline_microbatches(req, card, pp=pp, m=step_microbatches(gbs, mbs, dp), notes=notes,
                                                     unread=unread),
        torch_compile=_torch_compile(req, card, notes),
        tp_comm_overlap=_tp_comm_overlap(req, card, tp, notes),
        **_cuda_graph_fields(req),
        expandable_segments=_expandable_segments(req, card, notes, rl is not None),
        defer_fsdp_grad_sync=_defer_grad_sync(req, card, notes, version, arch.model_type),
        grad_reduce_overlap=_grad_reduce_overlap(req, card, notes),
        # attention backend, dropout (None: the framework's)
        **_attention_fields(req, card, gpu, version, zero, notes, mla=arch.mla is not None,
                            model_type=arch.model_type),
        **_precision_fields(req, card, notes),  # the precision knobs (None: the framework default)
        first_stage_layers=req.first_stage_layers, last_stage_layers=req.last_stage_layers,
        pipeline_layout=req.pipeline_layout, account_for_embedding=bool(req.account_for_embedding),
        account_for_loss=bool(req.account_for_loss),
        **_offload_fields(req, card.offload_at(zero), notes, rl is not None),  # activation/param/grad/optimizer offload
        **(rl.plan_fields(num_gpus) if rl else {}),  # the rollout engine (meshplan/rl/job.py)
    )
    job = Job(
        model=arch, gpu=gpu, num_gpus=num_gpus, world_follows_layout=req.num_gpus is None, gpus_per_node=gpn,
        dp_stated=req.dp is not None,
        etp_follows_tp=req.etp is None and arch.is_moe and card.defaults.etp == "tp",
        batch_follows_layout=rl is None and req.global_batch_size is None and gbs == default_global_batch(
            req.seq_length, num_gpus, mbs, dp),
        rl_step_stated=step_stated if rl else (),
        node_gpus=req.gpus_per_node,
        seq_length=req.seq_length, global_batch_size=gbs, precision=req.precision, framework=req.framework, notes=notes,
        given_unread=tuple(unread),
        cpu_memory_per_node=None if req.cpu_memory_per_node is None else int(req.cpu_memory_per_node * (1 << 30)),
        framework_version=version,
        framework_version_asked=req.framework_version if req.framework_version not in (None, version) else None,
        moe_routing_imbalance=_routing_imbalance(req, arch, notes),
        moe_fake_balanced_gate=_fake_gate(req, arch),
        fsdp_keep_gathered=_keep_gathered(req, card, arch, zero),
        loss_fp32_upcast=_loss_upcast(req, card, version),
        # what the rules PR006 and PR007 hold to the model, precision, recipe, GPU and framework (left out: off)
        # Megatron-Core's layer-wise CPU offload, which rule OF003 holds to the framework, layers and plan (0: none)
        activation_offload_layers=req.activation_offload_layers or 0,
        fp8_activation_input_store=req.fp8_activation_input_store is True,
        fp8_dot_product_attention=req.fp8_dot_product_attention is True,
        # the request's, which rule EP012 holds to the model, dispatcher and recompute; else the framework's default
        moe_shared_expert_overlap=_shared_overlap(req, card, arch, notes),
        moe_shared_expert_overlap_asked=req.moe_shared_expert_overlap is not None,
        bias_activation_fusion=_activation_fusion(req, card, arch, version, zero, notes),
        **_cross_entropy(req, card, arch.model_type, notes),
        moe_flex_backend=flex_backend(req, gpu, gpn, plan.moe_token_dispatcher == "flex" and arch.is_moe, notes),
        headroom=req.headroom,  # fits, MEM001/MEM002 and recommend keep this one share free (search/policy.py)
        rl=rl.job if rl else None,
        # LoRA adapters (meshplan/arithmetic/lora.py); None: every weight trained
        lora=resolve_lora(req, card, arch, zero, notes),
        mtp_asked=mtp_asked(req),
    )
    job, plan = _runnable_recompute(req, carry_cards(job), plan)
    writable_mtp(job.card, job, plan)
    return job, plan


def _runnable_recompute(req: Request, job: Job, plan: Plan) -> tuple[Job, Plan]:
    """recompute left out is none for an estimate, except where the config `render` writes for the plan cannot turn
    activation checkpointing off (its recompute_none knob has key null, rule RC006: SkyRL's main_sft at ZeRO-3): there
    the run recomputes every layer, so the estimate takes full, the mode it runs, rather than refuse a request that
    asked no recompute."""
    if req.recompute is not None or plan.recompute != "none":
        return job, plan
    reason = unwritable_reason(job.card, job, plan, "recompute_none")
    if reason is None:
        return job, plan
    note = f"recompute not given: full, what the run does: {reason}."
    notes = [note if n.startswith("recompute not given:") else n for n in job.notes]
    return job.model_copy(update={"notes": notes}), plan.model_copy(update={"recompute": "full"})


def carry_cards(job: Job) -> Job:
    """Attach the job's framework card and its RL section, once: every estimator, rule and search reads them from
    the job (`job.card`, `job.rl_card`) and never looks a card up by name. The resolver calls it on every job it
    makes; a job built by hand (tests, the bench) calls it too."""
    return job.attach_cards(framework_card(job.framework))


# Schedules that run two or more virtual chunks per rank (torchtitan's default for them: two stages per rank).
MULTI_CHUNK_SCHEDULES = ("interleaved_1f1b", "zero_bubble", "dualpipev")


def _schedule_chunks(req: Request, pp: int, vpp: int, notes: list[str]) -> int:
    """vpp as resolved, or 2 where a multi-chunk pipeline_schedule leaves it out with a pipeline (torchtitan's
    pipeline_parallel.py: two stages per rank for a multi-stage schedule without layers_per_stage)."""
    if req.vpp is None and req.pipeline_layout is None and pp > 1 and req.pipeline_schedule in MULTI_CHUNK_SCHEDULES:
        notes.append(f"vpp not given: 2 for pipeline_schedule={req.pipeline_schedule} (two virtual stages per rank, "
                     "torchtitan's default for a multi-stage schedule).")
        return 2
    return vpp


def _cuda_graph_fields(req: Request) -> dict[str, object]:
    """cuda_graph_impl and cuda_graph_modules as asked (none: eager, Megatron-Core's default); modules without a
    per-layer implementation are refused: Megatron-Core 0.19 ignores cuda_graph_modules under cuda_graph_impl "none"
    and asserts them empty under "full_iteration" (transformer_config.py __post_init__). What the framework refuses
    of the rest is rules CG001/CG002's (meshplan/rules/cuda_graphs.py)."""
    impl = req.cuda_graph_impl or "none"
    if impl in ("none", "full_iteration") and req.cuda_graph_modules:
        raise MeshplanError(
            f"cuda_graph_modules={req.cuda_graph_modules} with cuda_graph_impl={impl}: Megatron-Core captures modules "
            "only in per-layer graphs (" + ("none captures nothing" if impl == "none" else
                                            "full_iteration asserts cuda_graph_modules empty") + ").",
            fix="Use cuda_graph_impl=transformer_engine or local for per-layer graphs of those modules, or leave "
                "cuda_graph_modules out.")
    return {"cuda_graph_impl": impl, "cuda_graph_modules": tuple(req.cuda_graph_modules or ())}


def _a2a_overlap(req: Request, notes: list[str]) -> bool:
    """moe_a2a_overlap as given; pipeline_schedule=combined_1f1b is that overlap's schedule, so it turns it on (and a
    request that turns it off names both, refused)."""
    if req.pipeline_schedule != "combined_1f1b":
        return bool(req.moe_a2a_overlap)
    if req.moe_a2a_overlap is False:
        raise MeshplanError("pipeline_schedule=combined_1f1b is the schedule of moe_a2a_overlap, which the request "
                            "turns off.", fix="Leave moe_a2a_overlap out (or true), or pick another pipeline_schedule.")
    if req.moe_a2a_overlap is None:
        notes.append("moe_a2a_overlap not given: true, as pipeline_schedule=combined_1f1b runs it (Megatron-Core "
                     "overlap_moe_expert_parallel_comm).")
    return True


def _expert_tp(req: Request, card, *, tp: int, moe: bool, notes: list[str]) -> int:
    """etp as given, else the framework card's defaults.etp: "tp" where Megatron-Core's ModelParallelConfig sets an
    unset expert_tensor_parallel_size to TP (its etp_why); elsewhere experts are not tensor-sharded unless asked."""
    etp = req.etp
    if etp is None:
        etp = tp if moe and card.defaults.etp == "tp" else 1
        if moe and etp > 1:
            recipes = f"; {card.defaults.etp_recipes}" if card.defaults.etp_recipes else ""
            notes.append(f"etp not given: {etp} = tp, as Megatron-Core defaults it{recipes} "
                         "(pass etp=1 to keep experts whole).")
    return etp


class _World(NamedTuple):
    num_gpus: int
    dp: int


def _world(req: Request, law: str, *, tp: int, pp: int, cp: int, ep: int, etp: int, notes: list[str]) -> _World:
    """The GPU count and data-parallel size: left out, the GPU count is the fewest GPUs that hold the degrees
    (mesh.smallest_world: the degrees' product, and where experts fold into those ranks a multiple of ep*etp per
    pipeline stage, the extra ranks data-parallel; rules/world.py tiled follows it for a fix), and dp is derived from
    the GPU count by the framework's world-size law."""
    if req.num_gpus is None:
        num_gpus = mesh.smallest_world(law, tp, pp, cp, req.dp or 1, ep, etp)
        dp = req.dp or mesh.derived_dp(law, num_gpus, tp, pp, cp, ep)
        product = mesh.replica_size(law, tp, pp, cp, ep) * (req.dp or 1)
        held = "the product of the parallel degrees" if num_gpus == product else \
            f"pp*lcm(tp*cp*dp, ep*etp), the fewest GPUs whose data-parallel ranks hold ep*etp = {ep * etp}"
        notes.append(f"num_gpus not given: {num_gpus} = {held}.")
    else:
        num_gpus = req.num_gpus
        dp = req.dp or mesh.derived_dp(law, num_gpus, tp, pp, cp, ep)
        if req.dp is None:
            notes.append(f"dp not given: {dp} = num_gpus / ({mesh.replica_formula(law, ep)}).")
    return _World(num_gpus=num_gpus, dp=dp)


def _zero_stage(req: Request, card, notes: list[str]) -> int:
    """The ZeRO stage as given, else the framework's default as meshplan assumes it."""
    zero = card.defaults.zero_stage if req.zero_stage is None else req.zero_stage
    if req.zero_stage is None:
        notes.append(f"zero_stage not given: {zero}, the {card.display_name} default meshplan assumes.")
    return zero


def _micro_batch(req: Request, notes: list[str]) -> int:
    """The micro-batch as given, else 1 for an estimate (recommend searches it)."""
    mbs = req.micro_batch_size
    if mbs is None:
        mbs = 1
        notes.append("micro_batch_size not given: 1 (recommend searches it).")
    return mbs


def _recompute(req: Request, notes: list[str]) -> str:
    """The recompute mode as given; left out, selective when recompute_modules are given (they are its modules),
    full when recompute_layers or recompute_method are (they choose the layers of full recompute: Megatron takes them
    with recompute_granularity full alone, rule RC001), else none for an estimate (recommend searches it)."""
    recompute = req.recompute
    if recompute is None and req.recompute_modules is not None:
        recompute = "selective"
        notes.append("recompute not given: selective, the recompute that recompute_modules choose the modules of.")
    elif recompute is None and (req.recompute_layers is not None or req.recompute_method is not None):
        recompute = "full"
        given = " and ".join(n for n in ("recompute_layers", "recompute_method") if getattr(req, n) is not None)
        notes.append(f"recompute not given: full, the recompute whose layers {given} choose.")
    elif recompute is None:
        recompute = "none"
        notes.append("recompute not given: none (recommend searches it).")
    return recompute


def _global_batch(req: Request, *, num_gpus: int, mbs: int, dp: int, notes: list[str],
                  runs_per_step: bool = False) -> int:
    """The global batch as given, else `default_global_batch` for this GPU count (recommend's, so that its ranked
    layouts check and render at the batch they were compared at) and this micro-batch and data-parallel size; with
    pipeline_microbatches on a framework that runs its schedule per accumulation step, one such step (torchtitan's
    global_batch_size -1: local_batch_size x the data-parallel degree)."""
    gbs = req.global_batch_size
    if gbs is None and runs_per_step and req.pipeline_microbatches and (req.pp or 1) > 1:
        gbs = mbs * req.pipeline_microbatches * dp
        notes.append(f"global_batch_size not given: {gbs:,} = micro_batch_size {mbs} x pipeline_microbatches "
                     f"{req.pipeline_microbatches} x dp {dp}, one gradient-accumulation step (torchtitan's "
                     "global_batch_size -1: local_batch_size x the data-parallel degree).")
    elif gbs is None:
        gbs = default_global_batch(req.seq_length, num_gpus, mbs, dp)
        notes.append(default_batch_note(gbs, req.seq_length, batch_unit_text(num_gpus, mbs, dp)))
    return gbs


def _pipeline_microbatches(req: Request, card, *, pp: int, m: int, notes: list[str],
                           unread: list[str]) -> int | None:
    """pipeline_microbatches as given, None where it is the whole step (one run) or there is no pipeline; refused on
    a framework that runs every micro-batch of the step in one schedule (its card's pipeline section), at any pp, as
    it has no key for it; where it does not divide the step's m micro-batches (torchtitan and NeMo AutoModel:
    global_batch_size a multiple of local_batch_size x dp; the refusal names the request's framework, not always
    torchtitan's). At pp 1 on those two it is read by no code (their pipeline builders alone read the micro-batch
    size): left out of the plan, named in `unread` for rule PP019."""
    k = req.pipeline_microbatches
    if k is None:
        return None
    if not card.pipeline.runs_per_accumulation_step:
        raise MeshplanError(
            f"{card.display_name} runs every micro-batch of the step ({m} = global_batch_size / (micro_batch_size x "
            "dp)) in one pipeline schedule, so pipeline_microbatches has no meaning there.",
            fix="Leave pipeline_microbatches out (it is torchtitan's local_batch_size / "
                "pipeline_parallel_microbatch_size).")
    if pp == 1:
        unread.append(f"pipeline_microbatches={k}")
        return None
    if m % k:
        fits = [d for d in range(1, m + 1) if m % d == 0]
        raise MeshplanError(
            f"pipeline_microbatches={k} does not divide the step's {m} micro-batches (global_batch_size / "
            f"(micro_batch_size x dp)): {card.display_name} needs global_batch_size to be a multiple of "
            "local_batch_size x dp.",
            fix=f"pipeline_microbatches in {fits[:12]}{' ...' if len(fits) > 12 else ''}, or another "
                "global_batch_size.")
    if k < m:
        notes.append(f"pipeline_microbatches={k}: the schedule runs {m // k} times per step, {k} micro-batches "
                     "each, every run with its own fill and drain and gradient sync.")
    return None if k == m else k


def _dispatcher(req: Request) -> str:
    """moe_token_dispatcher as given, else alltoall. alltoall given for a dense model is not named unread: it is the
    dispatcher every plan meshplan answers with states, a dense model's too, so a plan passed back whole (recommend's,
    an estimate's) gives it; flex there is EP006's refusal. Rule EP011, which warned of it, is retired."""
    return req.moe_token_dispatcher or "alltoall"


def flex_backend(req: Request, gpu, gpus_per_node: int, flex_moe: bool, notes: list[str]) -> str:
    """The flex dispatcher's backend, resolved once for every estimate, rule, render and search candidate of the job:
    the request's, else the machine's (mesh.flex_backend: HybridEP where one NVLink domain spans nodes, DeepEP
    elsewhere, Megatron-Core's default), said in the notes where the plan runs the flex dispatcher on an MoE model.
    Given beside moe_token_dispatcher=alltoall it is refused: only the flex dispatcher reads it (Megatron-Core's
    alltoall dispatcher ignores moe_flex_dispatcher_backend), so it would change nothing the user meant. Given with
    the dispatcher left out it is kept: recommend and min-gpus pick flex for cross-node EP and time it on this
    backend; a plan that runs alltoall (an estimate's default) says it has no effect there."""
    if req.moe_flex_backend is not None:
        if req.moe_token_dispatcher == "alltoall":
            raise MeshplanError(
                f"moe_flex_backend={req.moe_flex_backend} is the flex dispatcher's backend, but the request sets "
                "moe_token_dispatcher=alltoall: no other dispatcher reads it.",
                fix="Set moe_token_dispatcher=flex, or leave moe_flex_backend out.",
                fields=("moe_flex_backend", "moe_token_dispatcher"))
        if not flex_moe:
            notes.append(f"moe_flex_backend={req.moe_flex_backend}: no effect on this plan, which runs the alltoall "
                         "dispatcher (moe_token_dispatcher left out); recommend and min-gpus time flex on it where "
                         "they pick flex. Add moe_token_dispatcher=flex to estimate it.")
        return req.moe_flex_backend
    backend = mesh.flex_backend(gpu, gpus_per_node)
    if flex_moe:
        notes.append(f"moe_flex_backend not given: {backend}, "
                     + ("HybridEP, the backend that spans a multi-node NVLink domain" if backend == "hybridep" else
                        "DeepEP, Megatron-Core's default")
                     + f" ({gpu.name}); set moe_flex_backend to time the other")
    return backend


def _cp_comm_type(req: Request, arch: Architecture, card, cp: int, unread: list[str]) -> str:
    """cp_comm_type as given, else the model's and framework's default; given at cp 1, where no context-parallel
    group exists for it to shape, named in `unread` for rule CP008 (the plan keeps the value: nothing reads it), but
    for the default itself: every plan meshplan answers with states it at cp 1 too, so a plan passed back whole gives
    it, and it is what leaving the field out runs."""
    default = cp_comm_type_default(arch, card.attention)
    if req.cp_comm_type is None:
        return default
    if cp == 1 and req.cp_comm_type != default:
        unread.append(f"cp_comm_type={req.cp_comm_type}")
    return req.cp_comm_type


def _precision_fields(req: Request, card, notes: list[str]) -> dict:
    """The optimizer (left out: adam, every framework's own default, so no note) and the precision knobs as the
    request gives them (None = the framework's default); a note names the FP8 recipe
    an fp8 job runs when the request leaves it out (the framework card's defaults.fp8_recipe)."""
    if req.precision == "fp8" and req.fp8_recipe is None and card.defaults.fp8_recipe is not None:
        notes.append(f"fp8_recipe not given: {card.defaults.fp8_recipe}, the {card.display_name} default.")
    return {"optimizer": req.optimizer or "adam", "optimizer_state_dtype": req.optimizer_state_dtype,
            "fp8_param_gather": req.fp8_param_gather, "grad_reduce_in_fp32": req.grad_reduce_in_fp32,
            "fp8_recipe": req.fp8_recipe}


def _pipeline_degrees(req: Request, notes: list[str]) -> tuple[int, int]:
    """pp and vpp: as given, else 1; a pipeline layout implies them, its stages being pp x vpp (Megatron-Core's
    PipelineParallelLayerLayout: stage k on rank k % pp). Left out, they are filled from it (both left out: one rank
    per stage, vpp 1); given, they must multiply to its stages, or the request is refused naming the mismatch. A
    layout that does not parse leaves them to their defaults: rule PP009 names its error."""
    pp, vpp = req.pp, req.vpp
    try:
        stages = None if req.pipeline_layout is None else len(parse_layout(req.pipeline_layout))
    except MeshplanError:
        stages = None
    if stages is None:
        return pp or 1, vpp or 1
    if pp is None:
        pp = stages // (vpp or 1) if stages % (vpp or 1) == 0 else None
        if pp is not None:
            notes.append(f"pp not given: {pp}, the pipeline layout's {stages} stages"
                         + (f" over vpp={vpp}." if vpp else " (one per rank; pass vpp to interleave them)."))
            vpp = vpp or 1
    elif vpp is None and stages % pp == 0:
        vpp = stages // pp
        notes.append(f"vpp not given: {vpp}, the pipeline layout's {stages} stages over pp={pp}.")
    if pp is None or vpp is None or pp * vpp != stages or (pp == 1 and stages > 1):
        raise _layout_mismatch(req, stages)
    return pp, vpp


def _layout_mismatch(req: Request, stages: int) -> MeshplanError:
    """The layout's stage count against the pp and vpp the request gives, with the degrees that would match."""
    given = ", ".join(f"{k}={v}" for k, v in (("pp", req.pp), ("vpp", req.vpp)) if v is not None)
    pairs = [f"pp={p}" + (f" vpp={stages // p}" if stages // p > 1 else "") for p in range(2, stages + 1)
             if stages % p == 0][:6]
    why = ("interleaving needs pp > 1 (rule PP003)" if req.pp == 1 and stages > 1 else
           "a layout lists pp x vpp stages (Megatron-Core PipelineParallelLayerLayout)")
    return MeshplanError(
        f"pipeline_layout has {stages} stage{'s' if stages != 1 else ''}, which {given} cannot hold: {why}.",
        fix=f"Leave pp and vpp out to take them from the layout (pp={stages}), give matching ones "
            f"({', '.join(pairs) or 'pp=1'}), or a layout of pp x vpp stages.",
    )


def _offload_fields(req: Request, semantics, notes: list[str], rl_job: bool) -> dict[str, Any]:
    """The plan's offload knobs: left out, the framework's own default (SkyRL's offload_after_step is on for its RL
    trainer, `rl_job`; its SFT trainer never offloads); a fraction alone turns the optimizer offload on (Megatron's
    --optimizer-offload-fraction is read with --optimizer-cpu-offload); switching it off while giving a share is a
    contradiction, said as such, except where optimizer_offload is a phase offload of its own (verl's and SkyRL's
    Megatron engines: the share is Megatron-Core's in-step CPU optimizer, the phase offload off beside it)."""
    fraction = req.optimizer_offload_fraction or 0.0
    optimizer = req.optimizer_offload
    defaults = semantics.on_by_default if semantics is not None and (
        semantics.phase_offloads_when == "always" or rl_job) else []
    for knob in defaults:
        if getattr(req, f"{knob}_offload") is None:
            notes.append(f"{knob}_offload not given: on, the {req.framework} default (cards/frameworks/"
                         f"{req.framework}.yaml offload).")
    param = req.param_offload if req.param_offload is not None else "param" in defaults
    grad = req.grad_offload if req.grad_offload is not None else "grad" in defaults
    if optimizer is None and "optimizer" in defaults:
        optimizer = True
    in_step = semantics is not None and semantics.optimizer.when == "in_step"
    phase = semantics is not None and semantics.optimizer.when == "phase"
    # verl/SkyRL: two knobs, the phase one off is no contradiction
    if optimizer is False and fraction > 0 and not phase:
        raise MeshplanError(
            f"optimizer_offload=false contradicts optimizer_offload_fraction={fraction:g}.",
            fix="Drop optimizer_offload (a fraction turns it on), or set optimizer_offload_fraction=0.",
        )
    if optimizer is None and fraction > 0 and in_step:  # verl/SkyRL: the share is in-step, their knob is a phase one
        optimizer = True
        notes.append(f"optimizer_offload not given: on, for optimizer_offload_fraction={fraction:g}.")
    if optimizer and fraction == 0 and in_step and semantics.optimizer_fraction == "in_step":
        fraction = 1.0  # Megatron's --optimizer-offload-fraction default with --optimizer-cpu-offload
        notes.append("optimizer_offload_fraction not given: 1.0, the whole optimizer on the CPU.")
    return {
        "activation_offload": bool(req.activation_offload), "param_offload": bool(param),
        "grad_offload": bool(grad), "optimizer_offload": bool(optimizer),
        "optimizer_offload_fraction": fraction,
    }


def _switch(asked: bool | None, default: bool, note: str, notes: list[str]) -> bool:
    """A switch as the request sets it, else the framework's default, noted when that default turns it on."""
    if asked is not None:
        return asked
    if default:
        notes.append(note)
    return default


def _grad_reduce_overlap(req: Request, card, notes: list[str]) -> bool:
    """The request's data-parallel overlap switch, else on (what meshplan's render writes); off is noted, since the
    step then waits for the whole reduction after the backward, and refused where the framework has no such setting
    (no key of its card's read section sets grad_reduce_overlap: FSDP2's hooks always overlap, and verl's and
    nanotron's calibration already hides nothing)."""
    if req.grad_reduce_overlap is False:
        if not card.keys_setting("grad_reduce_overlap"):
            settings = ", ".join(f"{other.display_name} {key}" for other in map(framework_card, FRAMEWORKS)
                                 for key in other.keys_setting("grad_reduce_overlap"))
            raise MeshplanError(f"grad_reduce_overlap=false: {card.display_name} has no setting that turns the "
                                f"data-parallel overlap off (cards/frameworks/*.yaml read.keys: {settings}).",
                                fix="Leave grad_reduce_overlap out for this framework.")
        notes.append("grad_reduce_overlap=false: the data-parallel gradient reduction (and ZeRO-1/2's gather of the "
                     "updated parameters) runs after the backward, none of it hidden (cards/calibration.yaml "
                     "dp_overlap, zero_grad_overlap, param_gather_overlap apply only with it on); under ZeRO-3 / "
                     "FSDP the layer-by-layer transfers wait whole where the framework then runs them on the "
                     "compute stream, and stay overlapped where it turns its overlap back on (the card's "
                     "sharding_overlap_off: DeepSpeed ZeRO-3 the first, Megatron-FSDP the second; the DP assumption "
                     "says which).")
    return req.grad_reduce_overlap is not False


def _tp_comm_overlap(req: Request, card, tp: int, notes: list[str]) -> bool:
    """The request's TP overlap switch, else the framework card's default (tp_overlap.default; noted when on)."""
    return _switch(req.tp_comm_overlap, card.tp_overlap.default and tp > 1,
                   f"tp_comm_overlap=true: {card.display_name}'s default (cards/frameworks/{req.framework}.yaml "
                   "tp_overlap)", notes)


def _torch_compile(req: Request, card, notes: list[str]) -> bool:
    """torch.compile as asked, else the framework's own default (its card's compile section; eager without one)."""
    return _switch(req.torch_compile, card.compile is not None and card.compile.default,
                   f"torch_compile=true: {card.display_name}'s default (cards/frameworks/{req.framework}.yaml compile)",
                   notes)


def _loss_upcast(req: Request, card, version: str | None) -> bool:
    """loss_fp32_upcast as the job runs it: true (the fp32 cross-entropy every convention prices) when left out;
    false only on a framework whose memory convention prices the bf16 loss, else an error naming the field."""
    if req.loss_fp32_upcast is False and not upcast_switch(card, version):
        raise MeshplanError(f"loss_fp32_upcast=false: {card.name}'s loss has no fp32-upcast switch meshplan prices "
                            "(only NeMo AutoModel's MaskedCrossEntropy loss_fn.fp32_upcast).",
                            fix="Leave loss_fp32_upcast unset for this framework.")
    return req.loss_fp32_upcast is not False


def _cross_entropy(req: Request, card, model_type: str, notes: list[str]) -> dict:
    """cross_entropy_loss_fusion and cross_entropy_fusion_impl as the job runs them: the request's, else the
    framework's default for this model (the card's defaults.cross_entropy: the model provider's on Megatron-Bridge);
    None on a framework without the switch, where a value given is an error naming the field (the loss its engine
    calls itself, the card's engine.megatron_loss, is read per plan: memory_states.megatron_loss). An impl given without
    the fusion is noted as read by nothing (Megatron-Core takes it and runs the unfused loss), a provider's te taken
    where the impl is left out as that provider's; one the release refuses is rule PR009's."""
    default = card.defaults.cross_entropy(model_type)
    given = {f: getattr(req, f) for f in ("cross_entropy_loss_fusion", "cross_entropy_fusion_impl")
             if getattr(req, f) is not None}
    if default is None:
        if given:
            name, value = next(iter(given.items()))
            raise MeshplanError(
                f"{name}={str(value).lower()}: {card.display_name} has no switch for Megatron-Core's cross-entropy "
                "implementation (only megatron-core and megatron-bridge have one); its own loss runs "
                + (f"(its Megatron engine calls Megatron's unfused vocab-parallel cross-entropy itself: "
                   f"cards/frameworks/{req.framework}.yaml engine.megatron_loss)." if card.engine.megatron_loss
                   else "(cards/memory.yaml, its memory convention)."),
                fix="Leave cross_entropy_loss_fusion and cross_entropy_fusion_impl unset for this framework, or use "
                    "framework megatron-core or megatron-bridge.", fields=tuple(given))
        return {}
    fusion = req.cross_entropy_loss_fusion if req.cross_entropy_loss_fusion is not None else default[0]
    impl = req.cross_entropy_fusion_impl or default[1]
    if not fusion and req.cross_entropy_fusion_impl is not None:
        notes.append(f"cross_entropy_fusion_impl={impl}: no effect without cross_entropy_loss_fusion (Megatron-Core "
                     "reads it only with the fusion on); the unfused vocab-parallel cross-entropy runs.")
    elif req.cross_entropy_fusion_impl is None and fusion and impl == "te":
        left_out = "cross_entropy_fusion_impl" if given else \
            "cross_entropy_loss_fusion and cross_entropy_fusion_impl"
        notes.append(f"{left_out} not given: the fusion on with cross_entropy_fusion_impl te, as "
                     f"{card.display_name}'s {model_type} model provider sets it (Transformer Engine's cross-entropy, "
                     "the gradient written in place over the bf16 logits).")
    return {"cross_entropy_loss_fusion": fusion, "cross_entropy_fusion_impl": impl}


def _activation_fusion(req: Request, card, arch, version: str | None, zero: int, notes: list[str]) -> bool:
    """bias_activation_fusion as the job runs it: the request's, else the framework's default for this model
    (activation_passes.default_activation_fusion), noted where that default is off for a gated MLP Megatron-Core
    could fuse; true (the fused count) on a framework without the switch, where a value given is an error naming the
    field, as is true on an activation Megatron-Core's TransformerConfig refuses to fuse (Gemma 2's fast_gelu,
    squared ReLU; activation_passes.activation_fusable). Left out on a stage whose engine trains transformers' own
    model code (verl's FSDP engine: FrameworkCard.eager_model_at), true too: no Megatron-Core MLP runs there (a
    value given is the adapter's to refuse, rule AD001)."""
    default = default_activation_fusion(card.defaults, arch, version)  # the job's release's (verl 0.5: its converter)
    if default is not None and req.bias_activation_fusion is None and card.eager_model_at(zero):
        return True
    if default is None:
        if req.bias_activation_fusion is not None:
            raise MeshplanError(
                f"bias_activation_fusion={str(req.bias_activation_fusion).lower()}: {card.display_name} has no "
                f"switch for Megatron-Core's fused bias + activation kernel (only {', '.join(_fusion_frameworks())} "
                "have one); its own activation code runs.",
                fix=f"Leave bias_activation_fusion unset for this framework, or use framework "
                    f"{' or '.join(_fusion_frameworks())}.", fields=("bias_activation_fusion",))
        return True
    if req.bias_activation_fusion and not activation_fusable(arch):
        raise MeshplanError(
            f"bias_activation_fusion=true: Megatron-Core's fused bias + activation takes GELU, SwiGLU and gpt-oss's "
            f"quick-GEGLU only, and {arch.name}'s activation is {activation_key(arch)} (core_v0.16.0 "
            "transformer_config.py __post_init__ refuses the config: 'activation function should be either gelu, "
            "swiglu, or quick_geglu').",
            fix="Leave bias_activation_fusion unset or false for this model (its activation runs Megatron-Core's "
                "unfused glu()).", fields=("bias_activation_fusion",))
    if req.bias_activation_fusion is not None:
        return req.bias_activation_fusion
    if not default and activation_fusable(arch):
        notes.append(f"bias_activation_fusion not given: off, as {card.display_name}'s {arch.model_type} model "
                     "provider leaves it (Megatron-Core's unfused glu(); cards/frameworks/"
                     f"{card.name}.yaml defaults.bias_activation_fusion_why; pass bias_activation_fusion=true for a "
                     "run that turns it on, as Megatron-Bridge's performance recipes do).")
    return default


def _fusion_frameworks() -> list[str]:
    """The frameworks whose card has a bias_activation_fusion default (Megatron-Core's switch on their engine)."""
    return [name for name in FRAMEWORKS if framework_card(name).defaults.bias_activation_fusion is not None]


def _shared_overlap(req: Request, card, arch, notes: list[str]) -> bool:
    """moe_shared_expert_overlap as the job asks it: the request's, else the framework's default for the model type
    (the card's defaults.moe_shared_expert_overlap: Megatron-Core's TransformerConfig off, Megatron-Bridge's model
    provider; off on a framework without the key or a model without shared experts), noted where that default is on.
    What a plan runs of it (a default yields to flex on Bridge, moe_a2a_overlap, a recomputed shared_experts module)
    is knowledge/adapter_knobs.shared_expert_overlap's."""
    if req.moe_shared_expert_overlap is not None:
        return req.moe_shared_expert_overlap
    if not arch.has_shared_experts or not card.defaults.shared_expert_overlap(arch.model_type):
        return False
    notes.append(f"moe_shared_expert_overlap not given: on, as {card.display_name}'s {arch.model_type} model provider "
                 "sets it (the shared experts' fc1 beside the dispatch all-to-all, their fc2 beside the combine, on a "
                 "stream of their own); off where the plan runs the flex dispatcher, moe_a2a_overlap or a recomputed "
                 "shared_experts module, as Bridge's flex setup and its performance scripts turn it off there (pass "
                 "moe_shared_expert_overlap=false for a run whose recipe sets it off).")
    return True


def _fake_gate(req: Request, arch) -> bool:
    """moe_fake_balanced_gate as the job uses it: false when left out; on a dense model an error naming the field."""
    if req.moe_fake_balanced_gate and not arch.is_moe:
        raise MeshplanError(f"moe_fake_balanced_gate=true: {arch.name} is a dense model, it has no gate to fake.",
                            fix="Leave moe_fake_balanced_gate unset for a dense model.")
    return bool(req.moe_fake_balanced_gate)


def _routing_imbalance(req: Request, arch, notes: list[str]) -> float:
    """moe_routing_imbalance as the job uses it: 1.0 (balanced) when left out; a dense model has no routing to be
    imbalanced, so a value there is an error naming the field rather than a setting silently ignored."""
    value = req.moe_routing_imbalance
    if value is None:
        if arch.is_moe:
            notes.append("moe_routing_imbalance not given: 1.0, every expert-parallel rank routed the mean token "
                         "count (what NVIDIA's benchmark recipes force with moe_router_force_load_balancing).")
        return 1.0
    if not arch.is_moe:
        raise MeshplanError(f"moe_routing_imbalance={value:g}: {arch.name} is a dense model, it routes no tokens to "
                            "experts.", fix="Leave moe_routing_imbalance unset for a dense model.")
    return value


def _expandable_segments(req: Request, card, notes: list[str], rl: bool) -> bool:
    """The allocator setting as asked, else as the framework's launcher for the job sets it (its card's allocator
    section: an RL job's launcher, or a training job's where it differs, verl's SFT trainer), noted either way where
    the framework has a setting, so a job that runs without expandable segments says why; where the framework sets
    it itself with no key (verl's RL workers), this note is the only one: render adds none."""
    facts = card.allocator_for(rl)
    if req.expandable_segments is False and facts is not None and facts.launch_script and facts.expandable_segments:
        notes.append(f"expandable_segments=false: PyTorch's default allocator, as given: {card.display_name} turns "
                     f"expandable segments on only in {facts.launch_script} ({facts.how}), not in its trainer, so a "
                     "launch command of your own runs without them unless its environment sets them "
                     f"(cards/frameworks/{req.framework}.yaml allocator)")
    if req.expandable_segments and facts is not None and facts.expandable_segments and not facts.launch_script:
        notes.append(f"expandable_segments=true, as given: {card.display_name} launches with it ({facts.how}; "
                     f"cards/frameworks/{req.framework}.yaml allocator)")
    if req.expandable_segments is not None or facts is None:
        return bool(req.expandable_segments)
    if not facts.expandable_segments:
        notes.append(f"expandable_segments=false: {facts.how} (cards/frameworks/{req.framework}.yaml allocator)")
        return False
    own = f"; assumed launched by {facts.launch_script}: a launch command of your own that starts the trainer " \
          "without it and sets no PYTORCH_CUDA_ALLOC_CONF runs PyTorch's default, expandable_segments=false" \
        if facts.launch_script else ""
    notes.append(f"expandable_segments=true: {card.display_name} launches with it ({facts.how}{own}; "
                 f"cards/frameworks/{req.framework}.yaml allocator)")
    return True


def _keep_gathered(req: Request, card, arch, zero: int) -> bool:
    """fsdp_keep_gathered as asked (false when left out), where the framework has that switch (its card's
    grad_accumulation.keep_knob) and meshplan models what it does: NeMo AutoModel's enable_fsdp_optimizations acts
    through its MoE model classes (MoEFSDPSyncMixin), on FSDP2 units that reshard after their forward (zero_stage 3),
    with the gradient sync deferred (defer_fsdp_grad_sync, on by default): the units held gathered and unreduced
    between micro-batches, as a pipeline stage holds them (memory_states.keeps_units)."""
    if not req.fsdp_keep_gathered:
        return False
    facts = card.grad_accumulation
    where = f"cards/frameworks/{req.framework}.yaml grad_accumulation"
    if facts is None or facts.keep_knob is None:
        raise MeshplanError(f"fsdp_keep_gathered=true: {card.display_name} has no such setting ({where}).",
                            fix="Leave fsdp_keep_gathered out for this framework.")
    if not arch.is_moe:
        raise MeshplanError(f"fsdp_keep_gathered=true: {arch.name} is a dense model, and {card.display_name}'s "
                            f"switch acts only through its MoE model classes' FSDP hooks ({where}).",
                            fix="Leave fsdp_keep_gathered out for a dense model.")
    if zero != 3 or req.defer_fsdp_grad_sync is False:
        raise MeshplanError(
            f"fsdp_keep_gathered=true with zero_stage={zero}"
            + (" and defer_fsdp_grad_sync=false" if req.defer_fsdp_grad_sync is False else "")
            + ": meshplan models the switch on FSDP2 units resharded after their forward (zero_stage 3) with the "
            f"gradient sync deferred to the last micro-batch ({where}).",
            fix="Use zero_stage=3 with defer_fsdp_grad_sync left on, or leave fsdp_keep_gathered out.")
    return True


def _defer_grad_sync(req: Request, card, notes: list[str], version: str | None, model_type: str) -> bool | None:
    """defer_fsdp_grad_sync as asked where the framework has that setting (its card's grad_accumulation.knob), else
    its default there (grad_accumulation.unsharded), noted; None where it has none, and a value given there refused.
    `version`: the known release the request's framework_version resolved to (_framework_version); `model_type`: the
    resolved model's."""
    facts = card.grad_accumulation
    if facts is None or facts.knob is None:
        if req.defer_fsdp_grad_sync is not None:
            raise MeshplanError(
                f"defer_fsdp_grad_sync={str(req.defer_fsdp_grad_sync).lower()}: {card.display_name} has no such "
                f"setting (when its FSDP units reduce their gradients is fixed: cards/frameworks/{req.framework}.yaml "
                "grad_accumulation).", fix="Leave defer_fsdp_grad_sync out for this framework.")
        return None
    old = _outer_model_unsharded(card, version, model_type)
    if old is not None:  # the release's own schedule, which its code had no setting to change
        where = (f"{card.display_name} {req.framework_version} reduced a {old[1]} model's gradients every "
                 f"micro-batch without PP: its MoE parallelizer left the outer model unsharded until {old[0].commit} "
                 f"({old[0].date}, first in {old[0].release}; cards/frameworks/{req.framework}.yaml release_changes "
                 "moe_outer_model_sharded)")
        if req.defer_fsdp_grad_sync:
            raise MeshplanError(f"defer_fsdp_grad_sync=true: {where}.",
                                fix=f"Leave defer_fsdp_grad_sync out, or ask a framework_version from main@"
                                    f"{old[0].date} on (or leave it out: {card.version}).")
        if req.defer_fsdp_grad_sync is None:
            notes.append(f"defer_fsdp_grad_sync=false: {where}.")
        return False
    return _switch(req.defer_fsdp_grad_sync, facts.unsharded,
                   f"defer_fsdp_grad_sync=true: {card.display_name}'s default; with more than one micro-batch per "
                   "step every FSDP unit holds its unsharded gradient until the last one reduces it "
                   f"(cards/frameworks/{req.framework}.yaml grad_accumulation)", notes)


def _outer_model_unsharded(card, version: str | None, model_type: str) -> tuple[ReleaseChange, str] | None:
    """(the change, the model type) where the job's release (`version`, as resolved) predates the card's
    moe_outer_model_sharded change (knowledge/releases.predates: an older release, or a main snapshot dated before its
    commit) and its model (`model_type`) is one that change acts on; else None. Under PP the stage's own hold applies
    whatever this says (memory_states.pipeline_held)."""
    change = card.release_change("moe_outer_model_sharded")
    if change is None or version is None or not predates(version, change):
        return None
    return (change, model_type) if change.acts_on(model_type) else None


def _attention_fields(req: Request, card, gpu, version: str | None, zero: int,
                      notes: list[str], mla: bool = False, model_type: str = "") -> dict[str, Any]:
    """attention_backend and dropout as asked; left out, what the framework does by itself (auto: the kernel its
    card's attention section names for the GPU; an MLA model on an engine with an mla_backend: that backend, which
    its recipes set and a render must write; dropout: its memory convention, off in every preset), noted. A release
    whose model code built its own kernel whatever the backend (releases.kernel_before_change) says so instead."""
    backend = req.attention_backend or "auto"
    att, engine = card.attention, card.engine_at(zero)
    if (own := kernel_before_change(card, version, model_type)) is not None:
        change = card.release_change("model_te_attention")
        notes.append(f"attention: {own} whatever attention_backend says, as {card.display_name} {version}'s "
                     f"{model_type} model code built it (until {change.commit}, {change.date}; cards/frameworks/"
                     f"{req.framework}.yaml release_changes model_te_attention).")
    elif req.attention_backend is None:
        kernel = att.kernel_for(version, gpu.arch, engine=engine, mla=mla) if att is not None else None
        if mla and att is not None and att.mla_backend is not None and engine not in att.by_engine:
            backend = att.mla_backend
            notes.append(f"attention_backend not given: {backend} ({kernel} on {gpu.arch}), what "
                         f"{card.display_name} runs a multi-latent-attention model with (cards/frameworks/"
                         f"{req.framework}.yaml attention mla_backend: its default finds no kernel for Q/K and V head "
                         "dims that differ).")
        elif (own := _own_default(card, "attention_backend")) is not None:
            name = convention_name(card, zero, version)
            flash = memory_card().conventions[name].flash_attention
            kind = (f"flash attention ({kernel} on {gpu.arch})" if kernel else "flash attention") if flash \
                else "unfused attention"
            notes.append(f"attention_backend not given: auto, {kind} as the "
                         f"{name} memory convention times it (cards/memory.yaml {name} flash_attention); a "
                         f"{own[0]} script runs {own[1]} attention where no flag says otherwise, so render writes the "
                         f"attention estimated (cards/frameworks/{req.framework}.yaml read.absent_by_variant).")
        else:
            notes.append(f"attention_backend not given: auto, what {card.display_name} picks by itself"
                         + (f" ({kernel} on {gpu.arch}; cards/frameworks/{req.framework}.yaml attention)." if kernel
                            else " (a fused flash-class kernel: cards/calibration.yaml attention_peak_fraction)."))
    if req.dropout is None:
        name = convention_name(card, zero, version)
        on = memory_card().conventions[name].dropout
        notes.append(f"dropout not given: {'on' if on else 'off'}, as {card.display_name} recipes run "
                     f"(cards/memory.yaml {name} dropout; dropout=true for a run with attention and hidden dropout, "
                     "such as Megatron-LM's own default 0.1)."
                     + (f" A {own[0]} script runs it {'on' if own[1] == 'True' else 'off'} where no flag says "
                        "otherwise, so render writes the dropout estimated." if (
                            own := _own_default(card, "dropout")) is not None else ""))
    return {"attention_backend": backend, "dropout": req.dropout}


def _own_default(card, field: str) -> tuple[str, str] | None:
    """(variant, value) where a variant's scripts run a `field` of their own unless a flag says otherwise (the card's
    read.absent_by_variant: Megatron-DeepSpeed's CoreAttention and dropout 0.1, Megatron-LM's dropout 0.1); None
    where none does."""
    read = card.read
    return next(((variant, str(absent[field])) for variant, absent in
                 (read.absent_by_variant.items() if read is not None else ()) if field in absent), None)


def _framework_version(req: Request, card, notes: list[str]) -> str | None:
    """The known release whose facts apply to the version asked for (knowledge/releases.py: '0.2' or '0.2.0+cu128'
    -> 0.2.2), said in a note when it is not that release itself; before the card's oldest release: an error."""
    if req.framework_version is None:
        return None
    release = resolve_release(card, req.framework_version)
    if note := release.note(card.display_name):
        notes.append(note)
    version = release.release
    if version in card.estimated_versions:
        notes.append(f"{card.display_name} {version}: estimated only (attention kernel, memory convention); a "
                     f"rendered config uses {card.version}")
    if card.convention_for(version) != card.memory_convention:
        notes.append(f"{card.display_name} {version}: memory convention {card.convention_for(version)} "
                     f"({card.memory_convention_why or 'cards/frameworks/' + req.framework + '.yaml'})")
    return version
