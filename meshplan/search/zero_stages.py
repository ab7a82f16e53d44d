"""The ZeRO stages a search takes and what it reads of each: the stages an estimate can take with the request's carried
fields, their model-state presets as the memory bounds read them, and the recomputes the structural rules pass at a
stage (a mask per stage, engine.apply_rules)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from meshplan.arithmetic.memory_states import Convention, StateTensor, bytes_per_param, states_at_shards
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import engine_terms, state_shards
from meshplan.estimate.moe_time import launches_per_expert
from meshplan.rl.memory import framework_offload
from meshplan.rules.context import runs_torch_cp, runs_ulysses
from meshplan.rules.engine import EstimateBlocked, require_estimable
from meshplan.rules.tensor import stage_refuses_degrees
from meshplan.schema.plan import Job, Plan
from meshplan.search.policy import ADAPTER_RULE
from meshplan.search.space import Fixed, Layout, adapter_refused_zeros, params_split, request_zeros, state_preset


def first_valid(mask: int, low: int, n_r: int) -> int:
    """The least recompute index from `low` up whose bit is set in `mask` (the recomputes the rules pass at a ZeRO
    stage: apply_rules), `n_r` where there is none."""
    rest = mask >> low
    return low + (rest & -rest).bit_length() - 1 if rest else n_r


@dataclass(frozen=True)
class LeftOut:
    """A ZeRO stage the search leaves out of its ladder, its plans counted as refused: per recompute the search runs
    (in its order), the rule that refuses the stage there (AD001 where the adapter has no key for the stage)."""

    zero: int
    rules: tuple[str, ...]


def estimable_zeros(job: Job, fixed: Fixed, zeros: tuple[int, ...],
                    recomputes: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[LeftOut, ...]]:
    """The ZeRO stages an estimate can take with the request's carried fields, and those it cannot: a stage where a
    blocking rule refuses the plainest layout (no model parallelism) at every recompute the search runs
    (`recomputes`: the request's, else the framework's) while another stage passes at one is left out of the ladder,
    e.g. FSDP with optimizer=muon (PR005), or verl's FSDP backend with a recompute_method (RC003, its config has no
    key for it). A stage estimable at some recompute stays: SkyRL's main_sft at ZeRO 3 runs full recompute only
    (RC006 at none), so a probe at none alone dropped ZeRO 3 from every SkyRL search that gave a carried field. The
    search's model-state bounds take the ladder's last stage as the lightest, so a stage no estimate can take cannot
    stay in it; its plans are counted under the rule that refuses each recompute (LeftOut, tiers.split_space), as
    the rules count them where the stage is searched. When every stage is refused the ladder stays whole: the rules
    say why."""
    if not fixed.given:  # the frameworks' own defaults block no stage
        return zeros, ()
    plain = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, dp=job.num_gpus)

    def refusing(zero: int, recompute: str) -> str | None:
        try:
            require_estimable(job, plain.plan(zero_stage=zero, recompute=recompute, micro_batch_size=1,
                                              sequence_parallel=False, cp_comm_type="p2p", **fixed.carried))
        except EstimateBlocked as blocked:
            return blocked.rule_id
        return None

    ok, left = [], []
    for zero in zeros:
        rules = []
        for recompute in recomputes:
            if (rule := refusing(zero, recompute)) is None:
                ok.append(zero)
                break
            rules.append(rule)
        else:
            left.append(LeftOut(zero, tuple(rules)))
    return (tuple(ok), tuple(left)) if ok else (zeros, ())


def search_ladder(job: Job, fixed: Fixed, recomputes: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[LeftOut, ...]]:
    """The ZeRO stages the search takes (the request's, estimable_zeros') less those rule AD001 refuses on every
    layout (space.adapter_refused_zeros), and the stages it leaves out with the rules that count their plans. Where
    AD001 refuses every stage left they stay: the rules say why."""
    zeros, left_out = estimable_zeros(job, fixed, request_zeros(job.card, fixed), recomputes)
    adapter = adapter_refused_zeros(job, zeros)
    if len(adapter) == len(zeros):
        return zeros, left_out
    return (tuple(zero for zero in zeros if zero not in adapter),
            left_out + tuple(LeftOut(zero, (ADAPTER_RULE,) * len(recomputes)) for zero in adapter))


def one_plan_key(job: Job, plan: Plan) -> tuple | None:
    """What the estimates read of the plan's ZeRO stage at its layout: two stages of one layout with the same key are
    one plan there (the same bytes, the same step, the same config but the stage's key). The engine the card runs
    the stage on (its kernels, CP, MoE launches, adapter variant), its convention with the plan's precision knobs,
    optimizer implementation and offload (memory.engine_terms), its model states at the layout's shard sizes
    (memory_states.states_at_shards over memory.state_shards: sharded over one rank, a tensor is the whole tensor),
    and the card's gradient accumulation pass at the stage (DeepSpeed's ZeRO-1 adds each micro-batch's gradient in
    place, its ZeRO-2 does not: two plans at dp 1 though their states are alike). None where the engine terms refuse
    the stage or the layout has no whole replica to shard over (dp_replicate over dp: rule DP001): a key of its
    own."""
    card = job.card
    try:
        conv_name, conv, tensors, offload, implementation = engine_terms(job, plan)
    except MeshplanError:
        return None
    dense, expert = state_shards(job, plan)
    if dense < 1 or expert < 1:
        return None
    passes = card.grad_accumulation_pass
    return (card.engine_at(plan.zero_stage), conv_name, conv, implementation, offload,
            states_at_shards(tensors, dense, expert if job.model.moe is not None else None),
            passes.by_zero_stage.get(plan.zero_stage) if passes is not None else None)


def one_plan_stages(job: Job, plan: Plan, zeros: tuple[int, ...]) -> tuple[int, ...]:
    """The other stages of `zeros` that are one plan with `plan` at its layout (one_plan_key): at dp x cp 1 (and
    expert-dp 1 for an MoE model) Megatron's and nanotron's ZeRO-1 shard nothing, so ZeRO 0 and 1 are the same plan;
    a stage that shards the weights never is one with a stage that does not (memory_states.states_at_shards)."""
    key = one_plan_key(job, plan)
    if key is None:
        return ()
    return tuple(zero for zero in zeros if zero != plan.zero_stage
                 and one_plan_key(job, plan.copied({"zero_stage": zero})) == key)


def offered_before(job: Job, plan: Plan, zeros: tuple[int, ...]) -> tuple[int, ...]:
    """The stages of `zeros` one plan with `plan` at its layout (one_plan_stages) that the answer offers before its
    own: the framework's default stage first, then the lower ones. The search and the oracle leave the plan out where
    one of them passes the rules at the same recompute and micro-batch, so the answer has one row for that plan, at
    the default stage (else the lowest) the rules pass."""
    default = job.card.defaults.zero_stage
    order = sorted((plan.zero_stage, *one_plan_stages(job, plan, zeros)), key=lambda zero: (zero != default, zero))
    return tuple(order[:order.index(plan.zero_stage)])


def left_out_counts(stages: tuple[LeftOut, ...]) -> Counter:
    """Per rule, the (ZeRO stage, recompute) pairs of the left-out `stages` it refuses: a layout's plans counted
    under it are these times its micro-batches (tiers.split_space)."""
    return Counter(rule for stage in stages for rule in stage.rules)


def reference_zeros(job: Job, zeros: tuple[int, ...], tp: int, cp: int, ep: int) -> tuple[int, ...]:
    """The ZeRO stages a single-stage reference of the search with these degrees is estimated at (bounds._per_token,
    which keeps the least): one of `zeros` per way their engines time it differently, the first of each: at cp > 1 the
    CP mechanism (Transformer Engine's cp_comm_type on a Megatron-Core engine, Ulysses' all-to-alls on verl's and
    SkyRL's FSDP engine: rules/context.runs_ulysses, torch's ring on torchtitan's: runs_torch_cp, what the estimate's
    cp_time reads), and for an MoE model whether the routed experts' grouped GEMMs launch one local expert at a time
    (estimate/moe_time.launches_per_expert, what expert_launches reads: verl's and SkyRL's Megatron engine, whose
    experts' forward is no shorter than its launches, not their FSDP engine). Neither engine's time bounds the other's
    (Qwen3-30B-A3B on 8 H100 with verl at 1,024 tokens: the Megatron engine's 128 local experts at EP1 take 1.25 s a
    step at mbs 1, the FSDP engine's 0.95 s). A stage whose engine runs none of the layout's plans
    (rules/tensor.stage_refuses_degrees: FS001, the FSDP engine at tp or ep over 1) is left out: it has no plan to
    bound, and its refused reference would leave the bound at 0."""
    firsts = {(cp > 1 and runs_ulysses(job.card, zero), cp > 1 and runs_torch_cp(job.card, zero),
               launches_per_expert(job, zero)): zero
              for zero in reversed(zeros) if not stage_refuses_degrees(job, zero, tp, ep)}
    return tuple(sorted(firsts.values())) or zeros[:1]


def bound_preset(job: Job, zero: int, carried: dict[str, object]) -> tuple[Convention, list[StateTensor]]:
    """space.state_preset as the search's memory bounds read it (the model-state bounds, the first stage's floor, the
    smallest GPU count's floor). Where the trainer sets the gradients to None before each backward (the convention's
    grads_set_to_none: torch FSDP2), the estimate's peak with one micro-batch per step comes before the gradients
    exist (estimate/fsdp_walk.py), so the bounds count none: Moonlight-16B-A3B on 3 A100 with verl, ZeRO-3, fits in
    72.8 GB though its states are 85.1 GB (tests/test_search_oracle.py found it)."""
    conv, tensors = state_preset(job, zero, carried)
    if conv.grads_set_to_none:
        tensors = [t for t in tensors if t.tensor_class != "gradients"]
    return conv, tensors


def least_state_bytes(job: Job, zeros: tuple[int, ...], carried: dict[str, object] | None = None) -> float:
    """Model-state bytes (weights, gradients, optimizer) every layout of the job holds across all its GPUs at least.
    Sharding splits a parameter's state tensors and replication copies them, so across the N GPUs every parameter,
    routed experts included, holds at least its bytes per parameter unsharded (bytes_per_param at a shard of 1), at
    the lightest of the ZeRO stages `zeros`, with the request's carried fields (bound_preset: a LoRA job's frozen
    base keeps its weights only; what the step offloads leaves the GPU; gradients a trainer frees before each
    backward are not counted). The most loaded GPU holds at least 1/N of it: the smallest GPU count's floor
    (gpu_count.states_floor) and the host a framework offloading every state needs (search/rl.py) read it."""
    dense, routed = params_split(job)
    return min(bytes_per_param(bound_preset(job, z, carried or {})[1], 1.0) for z in zeros) * (dense + routed)


def least_offloaded_state_bytes(job: Job, zeros: tuple[int, ...], carried: dict[str, object] | None = None) -> float:
    """Model-state bytes every layout of the job puts on the host across all its GPUs at least where the framework
    offloads them by itself between an RL step's phases (search/rl.py's host floor): at each ZeRO stage the classes
    its own offload copies to the host on that stage's engine (rl/memory.framework_offload: SkyRL's Megatron workers
    the weights and optimizer, its FSDP workers the weights; the gradients are released, never on the host), as
    rl/memory.stage_host_extra counts them, unsharded (bytes_per_param at a shard of 1). The offload knobs may add
    more, a floor either way."""
    dense, routed = params_split(job)

    def per_param(zero: int) -> float:
        copied, _ = framework_offload(job, zero)
        return bytes_per_param([t for t in state_preset(job, zero, carried or {})[1]
                                if t.tensor_class in copied], 1.0)

    return min(per_param(z) for z in zeros) * (dense + routed)
