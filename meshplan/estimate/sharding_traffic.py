"""Data-parallel sharding's traffic: when ZeRO-2/3 and FSDP move their bytes (ShardingSchedule), the units they
gather and reduce one at a time (ShardUnit), and what of that traffic the neighbouring units' compute leaves
exposed (exposed_sharding); the ring collectives over the dense and expert data-parallel groups (DpTraffic)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from meshplan.arithmetic.comm import Links, allreduce_time, beside_compute, ring_sm_share, ring_time
from meshplan.arithmetic.flops import Shard, attention_gemms, mlp_gemms, moe_gemms
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD
from meshplan.arithmetic.memory_states import (
    FsdpCopyBytes,
    fp8_param_gather,
    holds_grads,
    keeps_gathered,
    keeps_units,
    replicates_by_sharding,
    uses_fsdp,
)
from meshplan.arithmetic.mesh import Group
from meshplan.estimate.layer_records import BF16
from meshplan.estimate.memory_terms import RankParts
from meshplan.knowledge.calibration import Calibration
from meshplan.knowledge.fsdp_card import ShardingOverlapOff
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan


class ShardUnit(NamedTuple):
    """A run of `count` identical FSDP units in forward order (a decoder layer each, the embedding, the output
    head): FSDP2, Megatron-FSDP and ZeRO-3 gather and reduce one unit at a time, hidden behind its neighbours."""

    count: int
    gather: float  # all-gather of one unit's parameters
    reduce: float  # reduce-scatter of one unit's gradients
    fwd: float  # one unit's forward, the window that hides the next unit's all-gather
    bwd: float  # one unit's backward (with its recompute), the window that hides its neighbours' traffic
    resharded: bool = True  # freed after its forward, so gathered again for its backward
    waits_fwd: float = 0.0  # share of its all-gather no prefetch can start early, forward (unprefetched_shares)
    waits_bwd: float = 0.0  # the same in the backward
    copy_gather: float = 0.0  # seconds of the engine's own copies on the compute stream at each gather (UnitCopies)
    copy_reduce: float = 0.0  # ... and at each reduce
    # False: already gathered when its forward runs, with a unit before it (the output head of a root unit that holds
    # the embedding too: gathered whole before the embedding, edge_units); gathered, if resharded, in the backward only
    gathers_fwd: bool = True

    def moved(self, gathered: bool, reduced: bool, regathered: bool | None = None) -> float:
        """Seconds of all its traffic in one forward and backward, hidden or not: each unit's all-gather forward
        (`gathered`) and, resharded, again backward (`regathered`, as `gathered` where not said), and its
        reduce-scatter (`reduced`)."""
        return in_line_sharding((self,), gathered, gathered if regathered is None else regathered, reduced)


def grad_reduce_bytes(plan: Plan, cal: Calibration) -> float:
    """Bytes per gradient element the data-parallel reduction moves: 4 or 2 as the plan's grad_reduce_in_fp32 says
    (Megatron-Core's grad_reduce_in_fp32, Megatron-FSDP's megatron_fsdp_grad_comm_dtype, torchtitan's
    mixed_precision_reduce), else the framework's default (the calibration's grad_reduce_bytes)."""
    if plan.grad_reduce_in_fp32 is None:
        return cal.grad_reduce_bytes
    return 2.0 * BF16 if plan.grad_reduce_in_fp32 else BF16


def dp_hidden_share(plan: Plan, share: float) -> float:
    """The share of a once-per-step data-parallel collective the neighbouring compute hides: the calibrated `share`
    (dp_overlap, zero_grad_overlap, param_gather_overlap) where the plan overlaps it (grad_reduce_overlap, as
    meshplan's render runs it), 0 where it does not: Megatron-Core without --overlap-grad-reduce waits for every
    bucket in finalize_model_grads after the last backward and, without --overlap-param-gather (which needs it),
    gathers the parameters inside the optimizer step; DeepSpeed ZeRO-1/2 without overlap_comm reduces the
    buckets on the compute stream (cards/frameworks/megatron-core.yaml, deepspeed.yaml read sections)."""
    return share if plan.grad_reduce_overlap else 0.0


def param_gather_bytes(job: Job, plan: Plan) -> float:
    """Bytes per element of a decoder layer's weights the ZeRO-3 / FSDP all-gather moves: one with fp8 primary
    weights (memory_states.fp8_param_gather, the plan's or the framework's default: Megatron-FSDP's fp8_param_gather,
    torchtitan's enable_fsdp_float8_all_gather; the weights are kept and gathered in FP8), else bf16."""
    return 1.0 if fp8_param_gather(job, plan) else BF16


def optimizer_gather_bytes(job: Job, plan: Plan, dense: float, expert: float, edge: float) -> tuple[float, float]:
    """Bytes the distributed optimizer's once-per-step all-gather of the updated parameters (ZeRO-1/2) moves for a rank
    holding `dense` and `expert` parameters, `edge` of the dense ones its embedding and output layer: with fp8 primary
    weights (memory_states.fp8_param_gather) Megatron-Core keeps Transformer Engine's linear weights as fp8 tensors in
    a uint8 parameter buffer and gathers them in one byte (megatron-core 0.12.0 distributed_data_parallel.py:
    param_dtype = torch.uint8 for an fp8 parameter; distributed_data_parallel_config.py fp8_param_gather: "perform
    the param all-gather in fp8"); the embedding and output layer, no Transformer Engine modules, stay bf16, as every
    weight does without it, and a LoRA job's adapters."""
    if job.lora is not None or not fp8_param_gather(job, plan):
        return BF16 * dense, BF16 * expert
    edge = min(edge, dense)
    return (dense - edge) + BF16 * edge, float(expert)


def unprefetched_shares(weights: Sequence[float], max_live: float) -> tuple[float, float]:
    """The shares of a unit's parameters whose all-gather waits whole in the forward and in the backward, under a
    ZeRO-3 coordinator that prefetches the next weight only while the gathered ones hold fewer than `max_live`
    elements (the framework card's zero3_prefetch): `weights` are the unit's gathered weights (elements each) in
    forward order, the unit repeated, so the weight before the first is the last of the unit before. Forward, weight
    i waits whole after a weight i - 1 of at least max_live elements; backward (reverse order), after weight i + 1."""
    total = sum(weights)
    if total <= 0:
        return 0.0, 0.0
    n = len(weights)
    fwd = sum(w for i, w in enumerate(weights) if weights[i - 1] >= max_live)
    bwd = sum(w for i, w in enumerate(weights) if weights[(i + 1) % n] >= max_live)
    return fwd / total, bwd / total


def exposed_sharding(units: Sequence[ShardUnit], gather_fwd: bool, gather_bwd: bool, reduce: bool,
                     share: float = 0.0) -> float:
    """Seconds of sharding traffic one pass over `units` (forward, then backward) leaves exposed.

    Forward: each unit's all-gather is prefetched behind the previous unit's forward, so it costs
    max(0, gather - that forward); the first unit's all-gather has nothing before it and waits whole.
    Backward (reverse order): a unit's backward hides the all-gather of the unit after it in backward order
    (`gather_bwd`, if that unit was resharded) and the reduce-scatter of the unit before it (`reduce`), both on
    the same links; the first backward unit's all-gather and the last one's reduce-scatter have nothing to hide
    behind. Exact for the stated model: runs of identical units are summed in closed form. `share`: of the SMs the
    NCCL kernels hold (DpTraffic.sm_share), so the compute beside them runs slower: each window costs
    beside_compute, not only the traffic beyond it.
    """
    exposed = 0.0
    if gather_fwd and units:
        prev_fwd = None
        for u in units:
            if u.gathers_fwd:
                wait = u.waits_fwd * u.gather  # gathered when its submodule starts: nothing hides it
                exposed += u.gather if prev_fwd is None else wait + beside_compute(u.gather - wait, prev_fwd, share)
                exposed += (u.count - 1) * (wait + beside_compute(u.gather - wait, u.fwd, share))
            prev_fwd = u.fwd
    if not (gather_bwd or reduce) or not units:
        return exposed
    back = units[::-1]
    if gather_bwd:  # the backward all-gathers no prefetch starts early wait whole (the first one whole below)
        exposed += sum((u.count - (i == 0)) * u.waits_bwd * u.gather for i, u in enumerate(back) if u.resharded)

    def g(u: ShardUnit | None) -> float:
        return u.gather * (1.0 - u.waits_bwd) if (u is not None and gather_bwd and u.resharded) else 0.0

    def r(u: ShardUnit | None) -> float:
        return u.reduce if (u is not None and reduce) else 0.0

    exposed += (back[0].gather if gather_bwd and back[0].resharded else 0.0) + r(back[-1])
    for i, u in enumerate(back):
        before = back[i - 1] if i else None  # the unit whose backward ran just before (its reduce-scatter)
        after = back[i + 1] if i + 1 < len(back) else None  # the unit whose backward comes next (its gather)
        if u.count == 1:
            exposed += beside_compute(g(after) + r(before), u.bwd, share)
            continue
        exposed += beside_compute(g(u) + r(before), u.bwd, share)  # first of the run
        exposed += (u.count - 2) * beside_compute(g(u) + r(u), u.bwd, share)
        exposed += beside_compute(g(after) + r(u), u.bwd, share)  # last of the run
    return exposed


@dataclass
class DpTraffic:
    """One ring collective (all-gather or reduce-scatter) over the dense and the expert DP groups, remembered per
    estimate (pipeline stages repeat the same layers)."""

    plan: Plan
    lk: Links
    dense: Group  # dense weights are replicated over DP x CP (mesh.MeshGroups.dp_cp)
    expert: Group  # routed experts over expert-DP (mesh.MeshGroups.edp)
    seen: dict[tuple[float, float, float], float] = field(default_factory=dict)
    # hybrid sharding (Plan.dp_replicate > 1): dense/expert are one replica's shard groups and these the groups
    # across the replicas (mesh.replica_groups); None: no replicas
    replicas: tuple[Group, Group] | None = None
    # the replicas' all-reduce runs with each unit's reduce-scatter (FSDP2); False: once, in the last micro-batch
    # (Megatron-FSDP; cards/calibration.yaml fsdp_hybrid_allreduce_last_microbatch), timed by the step's DP term
    replicas_with_each_reduce: bool = True

    def reduce(self, dense: float, expert: float, nbytes: float) -> float:
        """A sharded unit's gradient reduction: the reduce-scatter over the shard groups, then with replicas (where
        they run with each reduce, FSDP2 HSDP: foreach_reduce's all-reduce in post-backward) the all-reduce of the
        shard across them, so it hides where the reduce-scatter does."""
        with_each = self.replica_allreduce(dense, expert, nbytes) if self.replicas_with_each_reduce else 0.0
        return self(dense, expert, nbytes) + with_each

    def replica_allreduce(self, dense: float, expert: float, nbytes: float) -> float:
        """Hybrid sharding's once-per-step all-reduce across the replicas of each rank's gradient shard (its
        `dense` and `expert` elements over the shard groups), after the reduce-scatter inside the replica
        (Megatron-Core DDP/Megatron-FSDP with num_distributed_optimizer_instances; FSDP2 HSDP); 0 without replicas."""
        if self.replicas is None:
            return 0.0
        return sum(allreduce_time(n / shard.size * nbytes, rep.size, rep.stride, self.lk)
                   for n, shard, rep in ((dense, self.dense, self.replicas[0]), (expert, self.expert, self.replicas[1]))
                   if n > 0)

    @property
    def dense_group(self) -> int:
        return self.dense.size

    @property
    def sm_share(self) -> float:
        """The share of the GPU's SMs the dense group's NCCL ring collectives hold while they run (comm.ring_sm_share):
        every unit's gathers and reduce-scatters are timed at it (a routed expert's, over expert-DP, too)."""
        return ring_sm_share(self.dense.size, self.dense.stride, self.lk)

    @property
    def expert_group(self) -> int:
        return self.expert.size

    def __call__(self, dense: float, expert: float, nbytes: float) -> float:
        key = (dense, expert, nbytes)
        if key not in self.seen:
            self.seen[key] = (ring_time(dense * nbytes, self.dense.size, self.dense.stride, self.lk)
                              + ring_time(expert * nbytes, self.expert.size, self.expert.stride, self.lk))
        return self.seen[key]


class UnitCopies(NamedTuple):
    """What a sharding engine copies on the compute stream per parameter of a unit (memory_states.fsdp_copy_bytes:
    torch's fully_shard), and the HBM bandwidth its memory-bound copies run at."""

    bytes: FsdpCopyBytes
    hbm: float  # bytes per second

    def seconds(self, dense: float, expert: float, traffic: DpTraffic) -> tuple[float, float]:
        """(each gather, each reduce) of a unit of `dense` and `expert` parameters on this rank: a gather over one
        rank copies as fully_shard's world_size == 1 path does, over more its copy-out; each group apart."""
        b = self.bytes
        gather = sum(n * (b.gather_one_rank if group.size <= 1 else b.gather)
                     for n, group in ((dense, traffic.dense), (expert, traffic.expert)) if n > 0)
        return gather / self.hbm, (dense + expert) * b.reduce / self.hbm


class StageShards(NamedTuple):
    """One pipeline stage as its FSDP units see it: its decoder layers and their kinds (True: MoE; MTP blocks
    appended), each kind's (forward, backward) window, whether it holds the embedding and the output head."""

    layers: Sequence[int]
    kinds: list[bool]
    windows: dict[bool, tuple[float, float]]
    first: bool
    head_stage: bool


def layer_weights(arch: Architecture, plan: Plan, moe: bool) -> list[float]:
    """The elements of each weight one rank gathers for a decoder layer, in forward order (the GEMMs' k x n: fused
    QKV, output projection, the MLP's or each local expert's and the shared expert's fc1 and fc2, the router)."""
    sh = Shard(tokens=1.0, tp=plan.tp, ep=plan.ep, etp=plan.etp, sp=plan.sequence_parallel)
    gemms = attention_gemms(arch, sh) + (moe_gemms(arch, sh) if moe else
                                         mlp_gemms(arch, sh, arch.ffn_hidden_size, "mlp"))
    return [g.n * g.k for g in gemms for _ in range(max(1, round(g.count)))]


def copy_seconds(copies: UnitCopies | None, dense: float, expert: float, traffic: DpTraffic) -> tuple[float, float]:
    """(each gather, each reduce) seconds of a unit's compute-stream copies (UnitCopies.seconds); none without
    copies."""
    return copies.seconds(dense, expert, traffic) if copies is not None else (0.0, 0.0)


def shard_units(stage: StageShards, *, parts: RankParts, plan: Plan, arch: Architecture, head: float,
                traffic: DpTraffic, grad_bytes: float, max_live: float | None = None,
                weight_bytes: float = BF16, copies: UnitCopies | None = None,
                head_resharded: bool = False, embedding_in_root: bool = False) -> list[ShardUnit]:
    """A stage's FSDP units in forward order: the embedding on the first stage (no compute to hide the next
    gather behind), one unit per decoder layer (runs of one kind summed), the output head on the last stage
    (kept gathered into its backward: torchtitan does not reshard norm + output, Megatron-FSDP's root keeps
    the output layer). Tied embeddings without PP are one unit (torchtitan groups them, not resharded). With
    `max_live` (a ZeRO-3 engine's live-parameter limit, the framework card's zero3_prefetch) a decoder layer's
    weights that follow one of at least max_live elements wait whole (unprefetched_shares), and a dense layer's
    weights are gathered one collective each (DeepSpeed fetches per submodule). A decoder layer's weights move
    `weight_bytes` each (param_gather_bytes), the embedding and the output head bf16. Each unit's parameters on this
    rank: RankParts, as the memory holds them. `copies`: what the engine copies on the compute stream at each
    gather and reduce (UnitCopies; None: nothing). `head_resharded`: the output head's unit is freed after its
    forward; `embedding_in_root`: one root unit holds the embedding with the head, where the stage holds both
    (edge_units)."""
    units: list[ShardUnit] = []
    kinds = stage.kinds
    embedding, output = edge_units(arch, plan, parts, head, traffic, grad_bytes, copies, head_resharded,
                                   embedding_in_root and stage.first and stage.head_stage)
    if stage.first:
        units.append(embedding)
    # MTP blocks cost like the last layer
    index = list(stage.layers) + [arch.num_layers - 1] * (len(kinds) - len(stage.layers))
    start = 0
    while start < len(kinds):
        end = start
        while end < len(kinds) and kinds[end] == kinds[start]:
            end += 1
        i = index[start]
        dense, expert = parts.layer(i)
        fwd, bwd = stage.windows[kinds[start]]
        gather, waits = traffic(dense, expert, weight_bytes), (0.0, 0.0)
        if max_live is not None:  # a ZeRO-3 coordinator: one all-gather per submodule, prefetch under max_live
            weights = layer_weights(arch, plan, kinds[start])
            waits = unprefetched_shares(weights, max_live)
            if not kinds[start]:  # a dense layer's weights, one collective each (each pays its ring's latency)
                gather = sum(traffic(w, 0.0, weight_bytes) for w in weights)
        copied = copy_seconds(copies, dense, expert, traffic)
        units.append(ShardUnit(count=end - start, gather=gather, reduce=traffic.reduce(dense, expert, grad_bytes),
                               fwd=fwd, bwd=bwd, resharded=True, waits_fwd=waits[0], waits_bwd=waits[1],
                               copy_gather=copied[0], copy_reduce=copied[1]))
        start = end
    if stage.head_stage:
        units.append(output)
    return units


def edge_units(arch: Architecture, plan: Plan, parts: RankParts, head: float, traffic: DpTraffic,
               grad_bytes: float, copies: UnitCopies | None = None,
               head_resharded: bool = False, root: bool = False) -> tuple[ShardUnit, ShardUnit]:
    """The embedding's unit (first stage: no compute before it to hide its gather) and the output head's (head
    stage: `head` its seconds, kept gathered into its backward: torchtitan does not reshard norm + output,
    Megatron-FSDP's root keeps the output layer; `head_resharded`: freed after its forward and gathered again, verl's
    root, the convention's output_resharded_at_loss), bf16 each. Tied embeddings without PP are one unit (torchtitan
    groups them, not resharded): the head's moves nothing of its own. Their parameters on this rank: RankParts (the
    head with the final norm). `copies`: the engine's compute-stream copies (shard_units).

    `root`: one FSDP unit holds the embedding, the final norm and the head (the convention's embedding_in_root:
    KempnerForge's apply_fsdp2 fully_shards each block, then the whole model). torch's FSDP2 gathers that root in its
    pre_forward, before the embedding, so the whole of it waits (the head gathers nothing in the forward:
    ShardUnit.gathers_fwd); freed after the forward where `head_resharded`, its pre_backward (on the logits) gathers
    the whole of it again for the head's backward, the backward's first unit, and it stays gathered to the end; its
    post_backward runs in the end-of-backward callback (the token ids need no gradient, so no post-backward hook:
    torch _fsdp_param_group.py _register_post_backward_hook, _fsdp_state.py _root_post_backward_final_callback), so
    its reduce-scatter, embedding and head together, comes after every block's, in the embedding unit's place. The
    same facts as the memory's walk (fsdp_walk.embedding_in_root)."""
    tied_one_unit = arch.tie_word_embeddings and plan.pp == 1
    embed_params = parts.embedding
    head_params = 0.0 if tied_one_unit else parts.head + parts.norm
    if root:
        whole = embed_params + head_params
        gather, (copy_gather, copy_reduce) = traffic(whole, 0.0, BF16), copy_seconds(copies, whole, 0.0, traffic)
        return (ShardUnit(count=1, gather=gather, reduce=traffic.reduce(whole, 0.0, grad_bytes), fwd=0.0, bwd=0.0,
                          resharded=False, copy_gather=copy_gather, copy_reduce=copy_reduce),
                ShardUnit(count=1, gather=gather, reduce=0.0, fwd=head / TRAINING_PASSES_PER_FORWARD,
                          bwd=head * (1 - 1 / TRAINING_PASSES_PER_FORWARD), resharded=head_resharded,
                          copy_gather=copy_gather, gathers_fwd=False))
    embed_copies = copy_seconds(copies, embed_params, 0.0, traffic)
    head_copies = copy_seconds(copies, head_params, 0.0, traffic)
    return (ShardUnit(count=1, gather=traffic(embed_params, 0.0, BF16),
                      reduce=traffic.reduce(embed_params, 0.0, grad_bytes), fwd=0.0, bwd=0.0,
                      resharded=not tied_one_unit, copy_gather=embed_copies[0], copy_reduce=embed_copies[1]),
            ShardUnit(count=1, gather=traffic(head_params, 0.0, BF16),
                      reduce=traffic.reduce(head_params, 0.0, grad_bytes), fwd=head / TRAINING_PASSES_PER_FORWARD,
                      bwd=head * (1 - 1 / TRAINING_PASSES_PER_FORWARD),
                      resharded=head_resharded and not tied_one_unit, copy_gather=head_copies[0],
                      copy_reduce=head_copies[1]))


@dataclass(frozen=True)
class ShardingSchedule:
    """When a plan's data-parallel sharding moves bytes: per micro-batch or once per step (the framework
    card's grad_accumulation, read through memory_states.holds_grads and keeps_gathered)."""

    params_sharded: bool  # ZeRO-3 / FSDP: parameters gathered before use
    grads_sharded: bool  # ZeRO-2/3 / FSDP: gradients reduce-scattered into shards
    gather_each_microbatch: bool  # freed after forward, gathered forward and backward in every micro-batch
    reduce_each_microbatch: bool  # every backward reduce-scatters (else only the last micro-batch's)
    # False where the engine runs each unit's transfers on the compute stream with the plan's grad_reduce_overlap off
    # (the card's sharding_overlap_off units compute_stream, overlap_off): nothing hides them
    overlapped: bool = True
    # the backward gathers each unit again, every micro-batch (freed after its forward); False: FSDP2's
    # reshard_after_forward=False, the plan's zero_stage 2, keeps it gathered from its forward into its backward
    regathered: bool = True

    @property
    def per_step(self) -> bool:
        return self.params_sharded or self.grads_sharded


def sharding_schedule(job: Job, plan: Plan) -> ShardingSchedule:
    """FSDP2 (torchtitan, KempnerForge), Megatron-FSDP and DeepSpeed ZeRO-3 shard parameters; ZeRO-2 gradients
    too; ZeRO-1 only the optimizer (its traffic stays once per step, in the step's DP term)."""
    fsdp = uses_fsdp(job.card, plan.zero_stage)
    # FSDP2 at zero_stage 0 is dp_replicate: DDP, or fully_shard over a shard of one (torchtitan 0.3), whose units
    # gather and reduce as ZeRO-3's (memory_states.replicates_by_sharding)
    params = fsdp and (plan.zero_stage != 0 or replicates_by_sharding(job.card, 0, job.framework_version))
    grads = params or plan.zero_stage >= 2
    through = params and keeps_gathered(job.card, plan.pp)  # under PP, gathered through every forward too
    # kept gathered from a backward to the next micro-batch (keeps_units, zero_stage 3: each forward still reshards):
    # that forward gathers nothing, its backward gathers again
    kept = keeps_units(job, plan)
    keep = through or (params and kept)
    defer = grads and holds_grads(job.card, plan.pp, plan.num_microbatches(job.global_batch_size),
                                  plan.defer_fsdp_grad_sync, kept)
    off = overlap_off(job, plan)
    in_line = params and off is not None and off.units == "compute_stream"
    # FSDP2 at zero_stage 2 is fully_shard(reshard_after_forward=False) (cards/memory.yaml fsdp2 zero "2"): torch's
    # FSDPParamGroup.post_forward does not reshard, so the unit's pre_backward finds it gathered
    return ShardingSchedule(params, grads, params and not keep, grads and not defer, not in_line,
                            params and not through and plan.zero_stage != 2)


def overlap_off(job: Job, plan: Plan) -> ShardingOverlapOff | None:
    """Where the plan's sharding units run their transfers with its grad_reduce_overlap off: the framework card's
    sharding_overlap_off at the plan's ZeRO stage (DeepSpeed ZeRO-3 on the compute stream; Megatron-FSDP turns its
    overlap back on). None with the switch on, or where the card does not say (timed as overlapped, and said)."""
    off = job.card.sharding_overlap_off
    if plan.grad_reduce_overlap or off is None or plan.zero_stage not in off.zero_stages:
        return None
    return off


def units_kept_overlapped(job: Job, plan: Plan) -> bool:
    """The switch is off but the engine keeps its units' transfers overlapped (sharding_overlap_off units
    overlapped: Megatron-FSDP's MegatronFSDP.__init__ sets overlap_grad_reduce back on), so the hybrid-sharding
    all-reduce its per-unit reduction issues is hidden as with the switch on."""
    off = overlap_off(job, plan)
    return off is not None and off.units == "overlapped"


class ShardingExposed(NamedTuple):
    """A stage's exposed sharding traffic: per micro-batch (inside the pipeline), and once per step (the
    parameters' all-gather, the gradients' reduce-scatter: the step's DP term)."""

    micro: float = 0.0
    step_gather: float = 0.0
    step_reduce: float = 0.0
    copies: float = 0.0  # the engine's compute-stream copies per micro-batch (ShardUnit.copy_*): nothing hides them
    step_copies: float = 0.0  # ... and those of the once-per-step gathers and reduces


def in_line_sharding(units: Sequence[ShardUnit], gather_fwd: bool, gather_bwd: bool, reduce: bool) -> float:
    """exposed_sharding's pass where every transfer runs on the compute stream (ShardingSchedule.overlapped false):
    each all-gather and reduce-scatter waits whole, the same transfers exposed_sharding moves."""
    return sum(u.count * ((u.gather if gather_fwd and u.gathers_fwd else 0.0)
                          + (u.gather if gather_bwd and u.resharded else 0.0) + (u.reduce if reduce else 0.0))
               for u in units)


def unit_copies(units: Sequence[ShardUnit], gather_fwd: bool, gather_bwd: bool, reduce: bool) -> float:
    """Seconds of the units' compute-stream copies in one pass (forward, then backward): one per gather and reduce
    in_line_sharding counts, on the compute stream whatever the collectives' overlap."""
    return sum(u.count * ((u.copy_gather if gather_fwd and u.gathers_fwd else 0.0)
                          + (u.copy_gather if gather_bwd and u.resharded else 0.0)
                          + (u.copy_reduce if reduce else 0.0)) for u in units)


def exposed_by_schedule(units: Sequence[ShardUnit], sched: ShardingSchedule, share: float = 0.0) -> ShardingExposed:
    """The units' exposed traffic split as the schedule runs it: per micro-batch or once per step; and their
    compute-stream copies, likewise. A reduce-scatter held to the step's last backward (reduce_each_microbatch off)
    runs beside that backward's own all-gathers where the units are gathered each micro-batch: FSDP2 issues both on
    its one data-parallel process group (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py unshard and
    post_backward; ProcessGroupNCCL runs a communicator's collectives on one stream), so the step pays what the two
    leave exposed together less what the gathers alone leave (each micro-batch's `micro`). `share`: of the SMs the
    overlapped transfers hold (exposed_sharding)."""

    def exposed(units: Sequence[ShardUnit], gather_fwd: bool, gather_bwd: bool, reduce: bool) -> float:
        if sched.overlapped:
            return exposed_sharding(units, gather_fwd, gather_bwd, reduce, share)
        return in_line_sharding(units, gather_fwd, gather_bwd, reduce)

    each = (sched.gather_each_microbatch, sched.regathered, sched.reduce_each_microbatch)
    step_gather = sched.params_sharded and not sched.gather_each_microbatch
    step_reduce = sched.grads_sharded and not sched.reduce_each_microbatch
    micro = exposed(units, *each)
    reduce = exposed(units, *each[:2], True) - micro if step_reduce else 0.0
    return ShardingExposed(
        micro, exposed(units, step_gather, False, False), reduce,
        unit_copies(units, *each), unit_copies(units, step_gather, False, step_reduce))
