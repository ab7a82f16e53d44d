"""A lower bound of the step time of every plan of a search tier, from its TP traffic alone (no reference estimate):
run_search (meshplan/search/engine.py) leaves a tier unseeded when this bound is over the search's cutoff (the
thinner-headroom probe's), since no plan of it could be wanted. On DeepSeek-V3 on 2,048 H100 it spares the probe the
TP-across-domains tier (23 K layouts, 4 K groups and their seed references)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from meshplan.arithmetic.comm import Links, job_links, ring_time
from meshplan.estimate.layer_records import BF16
from meshplan.estimate.tp_overlap import TP_COLLECTIVES_PER_LAYER, moe_layer_tp_ops, tp_overlap_mode
from meshplan.knowledge.calibration import Calibration, calibration
from meshplan.knowledge.cards import FrameworkCard
from meshplan.schema.plan import Job, Plan, step_microbatches
from meshplan.search.space import Layout


def tp_step_floor(job: Job, lay: Layout, sizes: tuple[int, ...], lk: Links, share: float) -> float:
    """A lower bound of the step time of every plan of `lay` at these micro-batch sizes (any ZeRO stage, recompute,
    schedule and TP overlap mode), under the cost model (estimate/perf.py, stage_time.py, layer_time.py,
    tp_overlap.py), where a job has no LoRA:
    - step >= m x the slowest stage's total (StepTerms.floor, the search's STEP bound), and a stage's total is at
      least the sum over its decoder layers of the layer's compute + exposed TP (every other part is non-negative);
      some stage holds at least ceil(num_layers / pp) of the decoder layers;
    - a layer's exposed TP is tp_comm less what its overlap mode hides (tp_hidden), plus non-negative extras, with
      tp_comm >= its TP collectives (TP_COLLECTIVES_PER_LAYER, or an MoE layer's moe_layer_tp_ops where fewer) x
      ring_time of the layer's activations (tokens x hidden x BF16, tokens = micro-batch x seq_length / cp) over
      the TP group (tp ranks at stride 1: arithmetic/mesh.mesh_groups). In the mode "fraction" it is
      (1 - tp_overlap) x tp_comm. Otherwise tp_hidden is at most 2 x (input + output forward GEMM seconds)
      per TP pair (each min(...) at most its GEMM's share, and the slowed GEMMs' extra seconds taken back),
      at most 2/3 of the layer's GEMM seconds (their three passes, gemm_time), which its compute holds: compute +
      exposed TP >= tp_comm. So each layer costs at least `share` (exposed_share) x tp_comm.
    - m = max(1, global batch // (micro-batch x dp)), as the estimate counts it.
    The least over `sizes`; 0 without sizes (the batch rule's layouts, never timed)."""
    if not sizes or lay.tp <= 1:
        return 0.0
    arch = job.model
    ops = TP_COLLECTIVES_PER_LAYER
    if arch.moe is not None and arch.moe.moe_layers:
        ops = min(ops, moe_layer_tp_ops(arch, job.card.moe_whole_over_tp))
    layers = -(-arch.num_layers // lay.pp)
    least = float("inf")
    for mbs in sizes:
        m = step_microbatches(job.global_batch_size, mbs, lay.dp)
        act_bytes = mbs * job.seq_length / lay.cp * arch.hidden_size * BF16
        least = min(least, m * layers * share * ops * ring_time(act_bytes, lay.tp, 1, lk))
    return least


def exposed_share(card: FrameworkCard, tp_comm_overlap: bool, cal: Calibration) -> float:
    """The least share of a layer's tp_comm its compute + exposed TP is (tp_step_floor): 1 - tp_overlap (at most 1,
    not below 0) in the overlap mode "fraction", 1 in every mode tp_hidden works out beside the GEMMs. The mode is
    tp_overlap.tp_overlap_mode's for a plan with TP and this tp_comm_overlap (the search sets it on every plan with
    TP: plans.SearchPlans.plan)."""
    if tp_overlap_mode(card, Plan(tp=2, tp_comm_overlap=tp_comm_overlap)) != "fraction":
        return 1.0
    return max(0.0, min(1.0, 1.0 - cal.tp_overlap))


def tier_floor(job: Job, layouts: Iterable[Layout], sizes: Callable[[Layout], tuple[int, ...]],
               tp_comm_overlap: bool) -> float:
    """The least tp_step_floor over a tier's layouts (`sizes`: each layout's micro-batches, search.sizes;
    `tp_comm_overlap`: the search's), once per (tp, pp, cp, dp), all it reads of a layout; 0 for a LoRA job (its GEMM
    seconds are not gemm_time's three passes) or an empty tier."""
    if job.lora is not None:
        return 0.0
    cal = calibration(job.framework)
    lk = job_links(job, cal)
    share = exposed_share(job.card, tp_comm_overlap, cal)
    # a layout per (tp, pp, cp, dp), in the order of their first layouts (one pass over the tier's ~23,000 on
    # DeepSeek-V3 over 2,048 GPUs, no call per layout)
    least = float("inf")
    for lay in {(lay.tp, lay.pp, lay.cp, lay.dp): lay for lay in layouts}.values():
        least = min(least, tp_step_floor(job, lay, sizes(lay), lk, share))
        if least <= 0.0:
            return 0.0
    return least if least < float("inf") else 0.0
