"""When torch FSDP2's step peaks: the backward walked unit by unit as fully_shard runs it (cards/memory.yaml
`step_peak: backward_walk`): the gathered parameters, the saved and recomputed activations of the units not yet
reached, each unit's gradients and fp32 reduce-scatter input, whether the gradients are freed each step, and
whether the memory they leave stays reserved in the reduce-scatter stream's pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

from meshplan.arithmetic.memory_states import (
    accumulated_grad_bytes,
    experts_in_units,
    keeps_units,
    loss_logits,
    pipeline_held,
    state_bytes,
    state_replicas,
    unsharded_grad_bytes,
)
from meshplan.core.units import GIB
from meshplan.estimate.layer_records import scope_memo
from meshplan.estimate.memory_terms import MemoryTerms, StageParams, layer_on_rank
from meshplan.schema.reports import StageMemory


class FsdpUnit(NamedTuple):
    """One fully_shard unit of a stage, in forward order, for the backward walk (bytes per GPU)."""

    name: str
    params: float  # its parameters (all-gathered while it runs, reduce-scattered in its post_backward)
    stored: float  # what one micro-batch keeps for its backward (the output unit: the loss at its peak)
    working: float = 0.0  # what its backward rebuilds on top (recompute)
    grads: float = 0.0  # its sharded gradients (allocated by its reduce-scatter when the trainer freed them)
    in_loss: bool = False  # it reduces inside the chunked loss, in the last chunk, its gradient accumulated before
    kept: float = 0.0  # what of its activations is alive at its reduce-scatter (in_loss: the chunk's logits)
    loss: bool = False  # its `stored` is the loss, which peaks before the unit's pre_backward hook fires
    head: float = 0.0  # what of its activations is alive at its head's backward, the loss's peak passed (root unit,
    # or in_loss: at the head's matmul backward, which writes its weight gradient)
    grads_last: float = 0.0  # of its params, those whose gradient the graph's last backward writes (a root's embedding)
    own_grads: float = 0.0  # of its grads, those of parameters outside the unit (full-EP experts: their own .grad,
    # written in its backward and accumulated in place, there from the step's first backward through the unit)
    sharded: float = 0.0  # of its params, what one rank holds of them over its shard group (reduce_output_bytes)
    alone: float = 0.0  # of its params, those whose shard group is one rank (no reduce-scatter: reduce_output_bytes)
    # the hidden-state gradient flowing between units (the convention's hidden_grad_bytes): that of its output, alive
    # from its pre_backward through its backward, and that of its input, from the end of its backward through its
    # reduce (decoder layers; the embedding's input, token ids, has none)
    grad_out: float = 0.0
    grad_in: float = 0.0


class StepMoment(NamedTuple):
    """A moment of the backward: activations alive, FSDP transient (gathered params, unsharded grads and their
    reduce-scatter input) and the sharded gradients not allocated yet."""

    name: str
    activations: float
    transient: float
    absent_grads: float
    accumulated: float = 0.0  # unsharded gradients held between micro-batches (memory_states.accumulated_grad_bytes)


class Accumulation(NamedTuple):
    """The unsharded gradient each unit holds between a step's micro-batches (memory_states.accumulated_grad_bytes,
    bytes per parameter; 0: none) and the step's micro-batches. Under a pipeline stage that holds its units
    (memory_states.pipeline_held): `pipeline`, whether they stay gathered through the forward too (the card's
    gathered_through_forward), and what other micro-batches a backward that follows a backward holds (`cooldown_other`,
    None: no backward of the stage follows another without a forward between)."""

    bytes_per_param: float = 0.0
    micro_batches: int = 1
    pipeline: bool = False
    through_forward: bool = False
    cooldown_other: float | None = None


NO_ACCUMULATION = Accumulation()


def fsdp_backward_moments(conv, units: list[FsdpUnit], held_other: float, grads_absent: bool,
                          accumulation: Accumulation = NO_ACCUMULATION,
                          output: ReduceOutput | None = None) -> list[StepMoment]:
    """Every moment of the backward, unit by unit in reverse forward order, as torch's fully_shard runs it
    (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): in pre_backward the unit is all-gathered
    (`unsharded_param_bytes`) and the unit before it prefetched (`prefetched_bytes`), while its own saved activations
    and whatever its recompute rebuilds are alive, beside the saved activations of the units backward has not reached
    (`held_other`: other micro-batches in flight), and the reduce-scatter input of the unit reduced just before is still
    held (`retained_reduce_bytes`: post_backward keeps reduce_scatter_max_input_buffers = 1 until the next unit's
    post_backward recycles it); in post_backward its saved activations are freed, reshard() frees its parameters, and
    foreach_reduce copies its unsharded grads into the reduce-scatter input (`gathered_layers` x `gathered_bytes`).
    The output unit's loss peaks in the cross-entropy's backward, before the unit's pre_backward hook (registered on
    its outputs) fires, so nothing is prefetched yet; its parameters stay gathered from its forward
    (reshard_after_forward=False in torchtitan's apply_fsdp_to_decoder), unless the trainer resharded it after the
    forward (`output_resharded_at_loss`); a root output unit's pre_backward then gathers it again for the head's
    backward, with the logits' gradient alive (head_moments). After each unit's copy-in its reduce output
    (reduce_output_bytes, with `output`): the input, the output and any quotient, the unsharded gradients freed; with
    replicas every unit reduced in the backward keeps its output to its end (an in-loss unit's, to the loss's). A
    unit that reduces inside the chunked loss (`in_loss`) is walked by in_loss_moments, its reduce output after them;
    its buffers are gone by the time the decoder's backward starts (the root's post-backward callback after the last
    chunk's backward clears the retained reduce-scatter input). With
    `grads_absent` (the trainer set the gradients to None; one micro-batch per step) a unit's sharded gradient exists
    only after its own reduce-scatter, so the units not yet reduced are absent. With `output_held_bytes` the output
    unit is the root module, whose forward inputs (token ids) need no gradient, so its post_backward waits for the
    end-of-backward callback: its gathered parameters and unsharded gradients stay through every later moment
    (root_held), and its reduce-scatter comes last, after the embedding's. With an `accumulation`
    (accumulated_moments) the moments are those of the micro-batches that hold the unsharded gradients; under a
    pipeline stage that holds its units, pipeline_moments'."""
    if accumulation.pipeline:
        return pipeline_moments(conv, units, held_other, accumulation, grads_absent)
    out, at = [], []
    root = units[-1] if units and units[-1].loss and conv.output_held_bytes else None
    stored, grads = prefix_sums([v.stored for v in units]), prefix_sums([v.grads for v in units])
    kept = 0.0  # the reduce outputs the replicas' all-reduce keeps, of the units reduced in this backward
    for k in range(len(units) - 1, -1, -1):
        u = units[k]
        before = held_other + stored[k]
        prefetch = conv.prefetched_bytes * units[k - 1].params if k else 0.0
        rooted = root_held(conv, root) if root and u is not root else 0.0
        held = rooted + kept
        absent = (grads[k + 1] + (root.grads if rooted else 0.0)) if grads_absent else 0.0
        gathered = 0.0 if u.loss and conv.output_resharded_at_loss else conv.unsharded_param_bytes * u.params
        if u.in_loss:
            moments = in_loss_moments(conv, u, before, gathered, prefetch, held, absent)
            out += moments
            at += [k] * len(moments)
            if output is not None:
                written, apart = output_moment(conv, u, output, grads_absent)
                if written:
                    # the accumulated gradient, the last of foreach_reduce's gradients, outlives its copy-in where the
                    # shard group has more than one rank (torch 2.13 _fsdp_collectives.py:580-606: the loop that runs
                    # there keeps its variable to the end of the call; over a shard of one it does not run)
                    accumulated = 0.0 if u.alone else conv.retained_reduce_bytes * u.params
                    out.append(StepMoment(f"{u.name} reduce output", before + u.kept,
                                          written + prefetch + gathered + accumulated + held,
                                          absent - (0.0 if apart or not grads_absent else u.grads - u.own_grads)))
                    at.append(k)
            continue
        # the last reduce-scatter input still held: the unit reduced just before's
        last = units[k + 1] if k + 1 < len(units) and not units[k + 1].in_loss else None
        retained = conv.retained_reduce_bytes * last.params if last and last is not root else 0.0
        if not u.loss and k + 1 < len(units):
            # its pre_backward's copy-out: prefetched by the unit after it, its all-gather output is copied into the
            # unsharded parameters before it is freed, then the unit before it is prefetched (copy_out)
            out.append(StepMoment(f"{u.name} gathered", before + u.stored + u.grad_out,
                                  copy_out(conv, u.params) + retained + held, absent))
            at.append(k)
        out.append(StepMoment(f"{u.name} backward", before + u.stored + u.working + u.grad_out,
                              gathered + (0.0 if u.loss else prefetch) + retained + held, absent))
        at.append(k)
        if not u.loss:
            # the end of its backward, before its post_backward hook: every unsharded gradient written beside its
            # gathered params, its activations used up
            out.append(StepMoment(f"{u.name} gradients", before + u.grad_in,
                                  gathered + unsharded_grad_bytes(conv) * u.params + prefetch + retained + held,
                                  absent))
            at.append(k)
        if u is root:
            head = head_moments(conv, root, before, prefetch, absent)
            out += head
            at += [k] * len(head)
            continue
        reduce = conv.gathered_layers * conv.gathered_bytes * u.params + prefetch
        out.append(StepMoment(f"{u.name} reduce-scatter", before + u.kept + u.grad_in, reduce + held, absent))
        at.append(k)
        if output is not None:
            written, apart = output_moment(conv, u, output, grads_absent)
            if written:
                # the previous unit's input was recycled before this reduce (retained), its gradients freed
                out.append(StepMoment(f"{u.name} reduce output", before + u.kept + u.grad_in,
                                      written + prefetch + held,
                                      absent - (0.0 if apart or not grads_absent else u.grads - u.own_grads)))
                at.append(k)
            if output.replicas:
                kept += reduce_output_bytes(conv, u, apart)[0]
    if root:
        retained = conv.retained_reduce_bytes * units[0].params if len(units) > 1 else 0.0
        out.append(StepMoment(f"{root.name} reduce-scatter (end of backward)", held_other,
                              conv.gathered_layers * conv.gathered_bytes * root.params + retained + kept,
                              root.grads if grads_absent else 0.0))
        at.append(-1)
        written, apart = output_moment(conv, root, output, grads_absent) if output is not None else (0.0, True)
        if written:
            out.append(StepMoment(f"{root.name} reduce output (end of backward)", held_other, written + kept,
                                  root.grads if grads_absent and apart else 0.0))
            at.append(-1)
    if not accumulation.bytes_per_param:
        return out
    return accumulated_moments(out, at, units, root, accumulation, grads_absent)


class ReduceOutput(NamedTuple):
    """What a stage's units' reduce outputs are (reduce_output_bytes): `cast`, whether the sharded gradient is of
    another dtype than reduce_dtype, so the output is cast into a new one and is never the gradient itself; `replicas`,
    whether replicas all-reduce it and keep it to the end of the backward (HSDP)."""

    cast: bool
    replicas: bool


def reduce_output_bytes(conv, unit: FsdpUnit, apart: bool) -> tuple[float, float]:
    """A unit's foreach_reduce output and quotient, bytes (cards/memory.yaml fsdp2, reduce_divide_copy, with the torch
    2.13 lines): the output, in reduce_dtype (the input's `retained_reduce_bytes`) per parameter one rank holds of
    the unit over its shard group (`sharded`), where it is a buffer of its own (`apart`; else it is the sharded
    gradient, counted there); and, where the framework sets a gradient_divide_factor, the quotient of the input that a
    shard of one rank copies into it (`alone`: the parameters no reduce-scatter splits), the input's own size."""
    out = conv.retained_reduce_bytes * unit.sharded if apart else 0.0
    return out, conv.retained_reduce_bytes * unit.alone if conv.reduce_divide_copy else 0.0


def output_moment(conv, unit: FsdpUnit, output: ReduceOutput, grads_absent: bool) -> tuple[float, bool]:
    """The FSDP bytes of a unit's reduce-output moment (0: no moment, nothing written beside the input) and whether the
    output is apart from the sharded gradient: the fp32 reduce-scatter input, the output (the sharded gradient
    itself where it is not apart and the trainer freed the gradients: counted as a gradient no longer absent) and the
    quotient; the unit's unsharded gradients are freed by then."""
    apart = output.cast or not grads_absent  # else the output becomes the sharded gradient
    out, quotient = reduce_output_bytes(conv, unit, apart)
    if not (out or quotient or (unit.sharded and grads_absent)):
        return 0.0, apart
    return conv.gathered_layers * conv.retained_reduce_bytes * unit.params + out + quotient, apart


def in_loss_moments(conv, u: FsdpUnit, before: float, gathered: float, prefetch: float, held: float, absent: float,
                    when: str = "", accumulated_other: float = 0.0) -> list[StepMoment]:
    """The moments of a unit that reduces inside the chunked loss (`in_loss`, cards/memory.yaml output_reduce_in_loss:
    torchtitan 0.3.0's ChunkedLossWrapper turns the unit's gradient sync off for every chunk but the last, its
    parameters gathered throughout), each after the first chunk: the loss's peak, beside the gradient the earlier
    chunks left in the reduce_dtype accumulator (torch 2.13 FSDPParam.to_accumulated_grad_if_needed, then
    accumulate_unsharded_grad_if_needed: the reduce input's `retained_reduce_bytes` per parameter; in bf16 the
    gradient itself); the head's matmul backward (`head` alive: the chunk's logits and their gradient), its new
    unsharded gradient beside the accumulated one; and in the last chunk the reduce-scatter, that gradient added into
    the accumulator and freed first, the accumulator beside the reduce input it is copied into (the chunk's `kept`
    logits alive). `when` names the micro-batch; `accumulated_other`, other units' held gradients (pipeline)."""
    accumulated = conv.retained_reduce_bytes * u.params
    loaded = gathered + accumulated + held
    return [StepMoment(f"{u.name} backward{when}", before + u.stored + u.working, loaded, absent, accumulated_other),
            StepMoment(f"{u.name} gradients{when}", before + u.head,
                       loaded + unsharded_grad_bytes(conv) * u.params + prefetch, absent, accumulated_other),
            StepMoment(f"{u.name} reduce-scatter{when}", before + u.kept,
                       loaded + conv.gathered_layers * conv.retained_reduce_bytes * u.params + prefetch, absent,
                       accumulated_other)]


def head_moments(conv, root: FsdpUnit, before: float, prefetch: float, absent: float) -> list[StepMoment]:
    """The root output unit's head backward, right after the loss's peak (root.head alive: the logits' gradient and
    what the loss code still holds, beside `before`), where its pre_backward hook (torch 2.13 _fsdp_state.py
    _pre_backward -> _fsdp_param_group.py pre_backward) gathers it: wait_for_unshard copies the all-gather output
    (`prefetched_bytes` per parameter) into the unsharded parameters before freeing it, so both are alive (a root not
    resharded after its forward is gathered already and skips it); then it prefetches the unit before it and the
    head's matmul backward writes its unsharded weight gradient beside the logits' gradient, root_held's bytes. Left
    out: the hidden-state gradient (hidden/vocab of a logit's). Listed only where the convention says what of the
    loss is alive then (head_backward_bytes_per_element)."""
    if not root.head:
        return []
    acts = before + root.head
    gathered_again = ([StepMoment(f"{root.name} gathered again", acts, copy_out(conv, root.params), absent)]
                      if conv.output_resharded_at_loss else [])
    return [*gathered_again, StepMoment(f"{root.name} head backward", acts, root_held(conv, root) + prefetch, absent)]


def copy_out(conv, params: float) -> float:
    """A unit gathered in its pre_backward without a prefetch, at its copy-out (torch 2.13 _fsdp_param_group.py
    wait_for_unshard -> foreach_all_gather_copy_out): the all-gather output (`prefetched_bytes` per parameter) beside
    the unsharded parameters it is copied into, until it is freed."""
    return (conv.unsharded_param_bytes + conv.prefetched_bytes) * params


def loss_left(conv, out_acts: float, logits: float, per_logit: float) -> float:
    """The output layer's and the loss's activations once the loss's peak has passed, with `per_logit` bytes of its
    logits_bytes_per_element still alive (at a chunk's reduce-scatter, at the head's backward)."""
    return out_acts - (conv.logits_bytes_per_element - per_logit) * logits


def root_held(conv, root: FsdpUnit) -> float:
    """What the root unit holds through the decoder's backward, from its pre_backward at the loss: its gathered
    parameters and the unsharded gradients its backward wrote (output_held_bytes per parameter), but for the
    gradient of what its backward reaches only at the end (`grads_last`: KempnerForge's root holds the embedding,
    the graph's last backward)."""
    grad_bytes = conv.output_held_bytes - conv.unsharded_param_bytes
    return conv.output_held_bytes * root.params - grad_bytes * root.grads_last


def accumulated_moments(moments: list[StepMoment], at: list[int], units: list[FsdpUnit], root: FsdpUnit | None,
                        accumulation: Accumulation, grads_absent: bool) -> list[StepMoment]:
    """The walk's moments (each at unit `at[i]`; -1: the root's reduce-scatter at the end of the backward) in the
    micro-batches that hold unsharded gradients, where the trainer turns gradient sync off for all but the last
    (torch FSDP2 FSDPParamGroup.post_backward with reduce_grads False: to_accumulated_grad_if_needed keeps each
    gradient in reduce_dtype, later backwards add into it, the last micro-batch's reduce-scatter frees it). The
    sharded gradients (set to None each step) are written by the last micro-batch's reduce-scatters alone. With three
    or more micro-batches a middle one holds every unit's accumulated gradient at every moment, none sharded yet, at
    least what the first and last ones hold (its unit's transient counted as a reducing one's, at most one unit's
    reduce-scatter input over). With two, the first holds the units backward has passed (the root's after the end of
    the backward), the last those it has not reduced yet (the root's until the end)."""
    per = [accumulation.bytes_per_param * u.params for u in units]
    every = sum(per)
    # the units' gradients outside FSDP (own_grads) are written by the step's first backward, not its last
    all_grads = sum(u.grads - u.own_grads for u in units) if grads_absent else 0.0
    if accumulation.micro_batches > 2:
        return [s._replace(name=f"{s.name} (a middle micro-batch)", absent_grads=all_grads, accumulated=every)
                for s in moments]
    rooted = per[-1] if root is not None else 0.0
    after, before = suffix_sums(per), prefix_sums(per)
    own = prefix_sums([u.own_grads for u in units]) if grads_absent else []
    out = []
    for s, k in zip(moments, at, strict=True):
        passed = every - rooted if k < 0 else after[k + 1] - (rooted if k + 1 < len(units) else 0.0)
        unwritten = all_grads + (own[k] if grads_absent and k >= 0 else 0.0)  # the own ones of units not reached
        out.append(s._replace(name=f"{s.name} (first micro-batch)", absent_grads=unwritten, accumulated=passed))
        left = rooted if k < 0 else before[k + 1] + (rooted if k + 1 < len(units) else 0.0)
        out.append(s._replace(name=f"{s.name} (last micro-batch)", accumulated=left))
    return out


def pipeline_moments(conv, units: list[FsdpUnit], held_other: float, accumulation: Accumulation,
                     grads_absent: bool) -> list[StepMoment]:
    """The moments of a pipeline stage whose units torch's PipelineStage holds (torch/distributed/pipelining/stage.py
    backward_maybe_with_nosync: set_reshard_after_backward(False) and set_requires_gradient_sync(False) for every
    backward; _post_backward runs each unit's post_backward with sync after the last): no unit reduce-scatters during
    the backwards, each keeps its gathered parameters (`unsharded_param_bytes`) and its unsharded gradient in
    reduce_dtype (FSDPParam.to_accumulated_grad_if_needed) to the end of the step. Every backward is walked as one
    that follows earlier ones (every unit's gradient held, no sharded gradient written yet); a unit that reduces inside
    the chunked loss (`in_loss`) reduce-scatters in every micro-batch's last chunk, so it holds neither. Where the
    forward reshards (not `through_forward`) a backward right after a forward holds gathered the units it has passed,
    and one right after another backward (`cooldown_other`) all of them, and a loss unit resharded after its forward
    is gathered again for its head's backward, its all-gather output beside its copy-out (where the convention says
    what the loss leaves alive then, FsdpUnit.head); then the _post_backward moments (stage_post_backward)."""
    held = [u for u in units if not u.in_loss]
    every = accumulation.bytes_per_param * sum(u.params for u in held)
    gathered_all = conv.unsharded_param_bytes * sum(u.params for u in held)
    # a unit's gradients outside FSDP (own_grads) are written by the step's first backward: there in every later one
    absent = sum(u.grads - u.own_grads for u in held) if grads_absent else 0.0
    walks = [(held_other, accumulation.through_forward, "")]
    if accumulation.cooldown_other is not None and not accumulation.through_forward:
        walks.append((accumulation.cooldown_other, True, ", after a backward"))
    stored = prefix_sums([v.stored for v in units])  # stored[k]: sum(v.stored for v in units[:k])
    # passed[c]: sum of the params of the units after the c-th gathered one that the walk holds gathered
    passed = suffix_sums([v.params for v in units if not v.in_loss])
    # gathered_before[k]: how many of units[:k + 1] are not in_loss
    gathered_before = list(accumulate(0 if v.in_loss else 1 for v in units))
    out = []
    for other, all_gathered, when in walks:
        for k in range(len(units) - 1, -1, -1):
            u = units[k]
            before = other + stored[k]
            if all_gathered:
                gathered = gathered_all + (conv.unsharded_param_bytes * u.params if u.in_loss else 0.0)
            else:
                prefetch = conv.prefetched_bytes * units[k - 1].params if k and not u.loss else 0.0
                # the unit's own too, the loss unit's included: its pre_backward hook (torch 2.13 _fsdp_state.py
                # _pre_backward -> _fsdp_param_group.py pre_backward -> unshard) gathers it again for the head's
                # backward, right after the loss's peak with the logits' gradient alive; a root resharded after its
                # forward (`output_resharded_at_loss`) is ungathered only at that peak, which holds no more
                # activations than this moment and less transient, so the walk does not list it apart; its copy-out,
                # the all-gather output beside it, is listed below (as head_moments lists it without a pipeline)
                gathered = conv.unsharded_param_bytes * (passed[gathered_before[k]] + u.params) + prefetch
            name = f"{u.name} backward (a middle micro-batch{when})"
            if u.in_loss:  # its accumulation over the chunks and its reduce, as fsdp_backward_moments walks them
                out += in_loss_moments(conv, u, before, gathered, 0.0, 0.0, absent, f" (a middle micro-batch{when})",
                                       every)
                continue
            out.append(StepMoment(name, before + u.stored + u.working + u.grad_out, gathered, absent, every))
            if u.loss and u.head and conv.output_resharded_at_loss and not all_gathered:
                # its copy-out when gathered again for the head's backward (head_moments): its all-gather output
                # beside its unsharded parameters, the loss's peak passed
                copy = gathered - prefetch - conv.unsharded_param_bytes * u.params + copy_out(conv, u.params)
                out.append(StepMoment(f"{u.name} gathered again (a middle micro-batch{when})", before + u.head, copy,
                                      absent, every))
            # its post_backward: the bf16 unsharded gradient autograd wrote, added into the held one, then freed
            out.append(StepMoment(f"{u.name} accumulate (a middle micro-batch{when})", before + u.kept + u.grad_in,
                                  gathered + conv.unsharded_param_bytes * u.params, absent, every))
    return out + stage_post_backward(conv, held, accumulation.bytes_per_param, grads_absent)


def stage_post_backward(conv, held: list[FsdpUnit], bytes_per_param: float, grads_absent: bool) -> list[StepMoment]:
    """The schedule's _post_backward after the stage's last backward (torch stage.py: each FSDP state's
    post_backward with reshard and sync on, in the order of _state_ctx.all_states, the modules' forward order), no
    activation left: each unit reshards its parameters, then foreach_reduce copies its held gradient into a
    reduce-scatter input in reduce_dtype and frees it, the previous unit's input still held
    (`retained_reduce_bytes`); the units after it are still gathered with their gradients, and with `grads_absent`
    their sharded gradients not yet written."""
    out = []
    params = suffix_sums([v.params for v in held])  # params[k]: sum(v.params for v in held[k:])
    grads = suffix_sums([v.grads - v.own_grads for v in held]) if grads_absent else []
    for k, u in enumerate(held):
        retained = conv.retained_reduce_bytes * held[k - 1].params if k else 0.0
        out.append(StepMoment(
            f"{u.name} reduce-scatter (the schedule's post-backward)", 0.0,
            conv.unsharded_param_bytes * params[k + 1] + bytes_per_param * u.params + retained,
            grads[k] if grads_absent else 0.0,
            bytes_per_param * params[k]))
    return out


def prefix_sums(values: list[float]) -> list[float]:
    """out[k] == sum(values[:k]) bit for bit, k = 0 .. len(values): Python's sum adds from 0 left to right, as a
    running sum does."""
    return list(accumulate(values, initial=0))


def suffix_sums(values: list[float]) -> list[float]:
    """out[k] == sum(values[k:]) bit for bit, k = 0 .. len(values) (the walk's sums over the units it has not
    passed): Python's sum adds from 0 left to right, so a suffix's sum is no running sum taken from the end; but a
    suffix that starts inside a run of equal values (a stage's uniform layers) adds that value the same number of
    times from 0 whatever the run's start, so each run's partial sums are worked out once and only the values after
    the run are added per start: about linear for a stage of uniform layers between an embedding and an output unit."""
    n = len(values)
    out: list[float] = [0] * (n + 1)
    end = n
    while end > 0:
        start = end - 1
        v = values[start]
        while start > 0 and same_value(values[start - 1], v):
            start -= 1
        total = 0
        for k in range(end - 1, start - 1, -1):  # the suffix from k adds v end - k times, then values[end:]
            total = total + v
            rest = total
            for w in values[end:]:
                rest = rest + w
            out[k] = rest
        end = start
    return out


def same_value(a: float, b: float) -> bool:
    """Whether adding `a` and adding `b` give the same result bit for bit: equal, of one type, and of one sign where
    zero (0.0 and -0.0 are equal)."""
    return a == b and type(a) is type(b) and (a != 0 or str(a) == str(b))


def fsdp_step_peak(conv, units: list[FsdpUnit], held_other: float, *, grads_absent: bool,
                   reserve_fraction: float, accumulation: Accumulation = NO_ACCUMULATION) -> StepMoment:
    """The moment of the backward walk with the largest peak: activations and transient (plus the caching
    allocator's reserve over them, as the estimate counts it) less the gradients not allocated yet."""
    return peaks(conv, fsdp_backward_moments(conv, units, held_other, grads_absent, accumulation),
                 reserve_fraction)[0]


def fsdp_allocated_peak(conv, units: list[FsdpUnit], held_other: float, *, grads_absent: bool,
                        accumulation: Accumulation = NO_ACCUMULATION) -> StepMoment:
    """The moment of the backward walk with the largest allocated peak: activations and transient less the gradients
    not allocated yet, with no allocator reserve. It can be another moment than fsdp_step_peak's: the reserve favours
    moments with much churning memory (the loss), while late in the backward, with few activations left, a large
    unit's reduce-scatter beside the gradients already reduced holds more allocated bytes."""
    return peaks(conv, fsdp_backward_moments(conv, units, held_other, grads_absent, accumulation), 0.0)[1]


def peaks(conv, moments: list[StepMoment], reserve_fraction: float) -> tuple[StepMoment, StepMoment]:
    """fsdp_step_peak's and fsdp_allocated_peak's picks among walked moments, in one pass: the reserved figure
    (activations, transient and held gradients with the allocator's reserve over them, less the gradients not
    allocated yet, plus the freed ones still reserved) and the allocated one (the same with no reserve); each the
    first of equal ones, as max() picks (a later moment replaces a pick only where its figure is larger)."""
    scale = 1 + reserve_fraction
    if not moments:
        raise ValueError("no moments to pick a peak from")  # as max() of none
    reserved = allocated = moments[0]
    top_reserved = top_allocated = None
    for s in moments:
        held = s.activations + s.transient + s.accumulated
        figure = scale * held - s.absent_grads + freed_grads_reserved(conv, s.absent_grads)
        alloc = held - s.absent_grads
        if top_reserved is None:
            top_reserved, top_allocated = figure, alloc
            continue
        if figure > top_reserved:
            reserved, top_reserved = s, figure
        if alloc > top_allocated:
            allocated, top_allocated = s, alloc
    return reserved, allocated


def freed_grads_reserved(conv, absent: float) -> float:
    """The sharded gradients the trainer freed (zero_grad(set_to_none=True)) that the caching allocator still holds
    when the step peaks: fully_shard allocates each unit's sharded gradient, a view of its reduce-scatter output, in
    the reduce-scatter stream (torch _fsdp_collectives.py foreach_reduce), and a freed block goes back to the pool of
    the stream it was allocated on (c10/cuda/CUDACachingAllocator.cpp: free blocks are found by stream and size), so
    the default stream's activations and loss cannot reuse it. Reserved, not allocated (`freed_grads_stay_reserved`,
    cards/memory.yaml); with expandable segments the out-of-memory retry unmaps it, as the rest of the reserve."""
    return absent if conv.freed_grads_stay_reserved else 0.0


@dataclass(frozen=True, kw_only=True)
class WalkStage:
    """One pipeline stage as the backward walk reads it: its parameters, the recompute mode each of its layers ran
    in, and the activations the estimate counted for it (bytes per GPU, as StageMemory.detail rounds them)."""

    terms: MemoryTerms
    params: StageParams
    modes: dict[int, str]  # the mode each layer ran in (one micro-batch)
    layer_acts: int  # the decoder layers' activations of every micro-batch in flight
    emb_acts: int  # the embedding's (first stage)
    out_acts: int  # the output layer's and the loss's (last stage)
    mtp_acts: int  # the MTP blocks', where they are not on the last stage


def stage_step_peak(stage: WalkStage) -> tuple[StepMoment, StepMoment]:
    """The moments this stage peaks at, walking its FSDP units through the backward: on the reserved basis
    (fsdp_step_peak) and on the allocated one (fsdp_allocated_peak), each at its own moment."""
    terms = stage.terms
    units = stage_units(stage)
    held_other = units.held_other
    card, pp = terms.job.card, terms.plan.pp
    # the MTP blocks' activations and, where the root unit holds the embedding, its saved input: alive to the end
    held = held_other + stage.mtp_acts + (stage.emb_acts if embedding_in_root(stage) else 0)
    held_bytes = accumulated_grad_bytes(card, terms.m, True, pp, terms.plan.defer_fsdp_grad_sync,
                                        terms.job.lora is not None, terms.plan.grad_reduce_in_fp32)
    accumulation = Accumulation(held_bytes, terms.m)
    if pipeline_held(card, pp, keeps_units(terms.job, terms.plan)):  # without PP each forward reshards (zero 3)
        one_batch = stage.layer_acts - held_other  # held_other: the layers' other micro-batches in flight
        accumulation = accumulation._replace(
            pipeline=True, through_forward=pp > 1 and card.grad_accumulation.gathered_through_forward,
            cooldown_other=max(0.0, held - one_batch) if held_other > 0 else None)
    # with one micro-batch, or with the sync deferred to the last one, a sharded gradient exists only after the
    # reduce-scatter that writes it (under a pipeline: in the schedule's first run of the step)
    once = terms.plan.schedule_runs(terms.job.global_batch_size) == 1 if accumulation.pipeline else terms.m == 1
    absent = terms.conv.grads_set_to_none and (once or bool(accumulation.bytes_per_param and not accumulation.pipeline))
    # one walk serves both picks (fsdp_step_peak and fsdp_allocated_peak each walk the same moments), once per
    # search for the same walk: what it reads, the convention (its object), the units (stage_units' key, by the
    # objects they were worked out from), the other activations, the switches and the reserve; the entry keeps those
    # objects alive, so their ids stay their own
    reserve = terms.card.allocator_reserve_fraction
    output = stage_output(terms)
    memo = scope_memo("fsdp_walks")
    key = (id(terms.conv), reserve, held, absent, accumulation, output, units.key)
    hit = memo.get(key) if memo is not None else None
    if hit is not None:
        return hit[-1]
    moments = fsdp_backward_moments(terms.conv, units.walked(), held, absent, accumulation, output)
    picks = peaks(terms.conv, moments, reserve)
    if memo is not None:
        memo[key] = (terms.conv, terms.table, terms.per_kind, terms.tensors, picks)
    return picks


def stage_output(terms: MemoryTerms) -> ReduceOutput:
    """The stage's reduce outputs (ReduceOutput): cast where the sharded gradient's bytes per parameter (the states'
    dp-sharded gradients) differ from the reduce_dtype's (the input's retained_reduce_bytes); kept with replicas
    (memory_states.state_replicas over 1: dp_replicate, or torchtitan 0.3's ZeRO-0 over a shard of one)."""
    grad = next((t.bytes for t in terms.tensors if t.tensor_class == "gradients" and t.shard == "dp"), None)
    cast = grad is not None and grad != terms.conv.retained_reduce_bytes
    return ReduceOutput(cast, state_replicas(terms.job, terms.plan) > 1)


class StageUnits(NamedTuple):
    """A stage's FSDP units as the walk reads them (stage_units): the embedding's and output layer's units, the
    decoder layers' as layer_units' arguments (worked out only where the walk runs: walked), the activations of the
    other micro-batches in flight, and a key that tells the units apart (the layers' arguments, the objects by id, and
    the edge units themselves)."""

    pre: tuple[FsdpUnit, ...]
    layers: tuple  # layer_units' arguments
    post: tuple[FsdpUnit, ...]
    held_other: float
    key: tuple

    def walked(self) -> list[FsdpUnit]:
        """The units in forward order."""
        return [*self.pre, *layer_units(*self.layers)[0], *self.post]


def stage_units(stage: WalkStage) -> StageUnits:
    """The stage's FSDP units in forward order (embedding on the first stage, each decoder layer, the output layer
    with the final norm on the last; torchtitan's apply_fsdp_to_decoder; the embedding inside the output layer's root
    unit where embedding_in_root) with one micro-batch's activations each, and the activations of the other
    micro-batches in flight."""
    terms, params = stage.terms, stage.params
    plan, conv = terms.plan, terms.conv
    args, one_batch, layers_key = layer_units_of(terms, params.layers, stage.modes)
    pre: tuple[FsdpUnit, ...] = ()
    post: tuple[FsdpUnit, ...] = ()
    emb, in_root = params.embedding, embedding_in_root(stage)
    dp = terms.dense_dp
    if params.first and not in_root:
        pre = (FsdpUnit("embedding", emb, stage.emb_acts, grads=unit_grads(terms.tensors, dp, terms.expert_dp, emb),
                        grad_out=hidden_grad(terms), **unit_shards(dp, terms.expert_dp, emb)),)
    if params.last:
        head = params.output_layer + terms.norm_width
        logits = loss_logits(conv, terms.tokens, terms.vocab, plan.tp)
        # a chunk's loss tensors are freed at its reduce-scatter but for its logits (and their gradient), and, from
        # its head's matmul backward on, the gradient of the chunk's hidden state (its share of hidden_grad) until
        # the loss adds it into its accumulator
        chunk_grad = hidden_grad(terms) / conv.loss_chunks if conv.output_reduce_in_loss else 0.0
        kept = loss_left(conv, stage.out_acts, logits, conv.loss_reduce_bytes_per_element) + chunk_grad \
            if conv.output_reduce_in_loss else 0.0
        # what the head's backward sees of the loss, where the root output unit is gathered again (head_moments)
        at_head = loss_left(conv, stage.out_acts, logits, conv.head_backward_bytes_per_element) + chunk_grad \
            if conv.head_backward_bytes_per_element else 0.0
        if in_root:
            post = (FsdpUnit("embedding, output layer and loss", emb + head, stage.out_acts,
                             grads=unit_grads(terms.tensors, dp, terms.expert_dp, emb + head), kept=kept,
                             loss=True, grads_last=emb, head=at_head, **unit_shards(dp, terms.expert_dp, emb + head)),)
        else:
            post = (FsdpUnit("output layer and loss", head, stage.out_acts,
                             grads=unit_grads(terms.tensors, dp, terms.expert_dp, head),
                             in_loss=conv.output_reduce_in_loss, kept=kept, loss=True, head=at_head,
                             **unit_shards(dp, terms.expert_dp, head)),)
    return StageUnits(pre, args, post, max(0.0, stage.layer_acts - one_batch), (layers_key, pre, post))


def layer_units_of(terms: MemoryTerms, layers, modes: dict[int, str]) -> tuple[tuple, float, tuple]:
    """layer_units' arguments for the stage's decoder layers, one micro-batch's activations of them (worked out once
    per search for the same arguments: scope_memo 'fsdp_layer_units', keyed by them, the objects by id, kept alive in
    the entry so their ids stay their own; the plans of a search repeat a few stages), and that key. The units
    themselves are not kept: only a walk the memo has not seen needs them."""
    plan = terms.plan
    layers = tuple(layers)
    ran = tuple(modes[i] for i in layers)
    args = (terms.table, terms.per_kind, terms.tensors, terms.dense_dp, terms.expert_dp, terms.selective, plan.tp,
            plan.ep * plan.etp, layers, ran, experts_in_units(terms.job.card, plan.ep, terms.expert_dp),
            hidden_grad(terms))
    memo = scope_memo("fsdp_layer_units")
    if memo is None:
        return args, layer_units(*args)[1], None
    key = (id(terms.table), id(terms.per_kind), id(terms.tensors), *args[3:])
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (args, layer_units(*args)[1])
    return hit[0], hit[1], key


def layer_units(table, per_kind: dict, tensors: list, dense_dp: int, expert_dp: float, selective: str, tp: int,
                ep_etp: int, layers: tuple[int, ...], modes: tuple[str, ...],
                experts_in: bool = True, grad: float = 0.0) -> tuple[tuple[FsdpUnit, ...], float]:
    """The decoder layers' FSDP units (`modes`: the recompute mode each ran in) and one micro-batch's activations of
    them all, from these arguments alone. Without `experts_in` (memory_states.experts_in_units: the framework's
    fully_shard ignores the routed experts at full EP) a unit's parameters, gathered, reduced and accumulated, are its
    dense ones alone, while its gradients still count the experts' (their own .grad, written in its backward). `grad`:
    the hidden-state gradient each layer's backward receives and passes on (hidden_grad)."""
    worked: dict[tuple[float, float], float] = {}  # the stage's layers repeat a few shapes: each worked out once
    units = []
    one_batch = 0.0
    for i, mode in zip(layers, modes, strict=True):
        moe = table.kind[i]
        stored = per_kind[(moe, mode)]
        one_batch += stored
        if mode == "full":  # checkpointed: its backward rebuilds the layer's activations
            working = per_kind[(moe, "none")]
        elif mode == "selective" and selective == "op_sac":  # op-level SAC: what the recompute rebuilds
            working = per_kind[(moe, "none")] - stored
        else:
            working = 0.0
        dense, experts = layer_on_rank(table, i, tp, ep_etp)
        grads = worked.get((dense, experts))
        if grads is None:
            grads = worked[(dense, experts)] = unit_grads(tensors, dense_dp, expert_dp, dense, experts)
        own = 0.0 if experts_in else state_bytes(tensors, experts, expert_dp)["gradients"]
        units.append(FsdpUnit(f"layer {i}", dense + experts if experts_in else dense, stored, working, grads,
                              own_grads=own, grad_out=grad, grad_in=grad,
                              **unit_shards(dense_dp, expert_dp, dense, experts if experts_in else 0.0)))
    return tuple(units), one_batch


def hidden_grad(terms: MemoryTerms) -> float:
    """The gradient of the hidden state one micro-batch's backward passes from unit to unit, bytes per GPU: the
    convention's hidden_grad_bytes per token and hidden unit, split by sequence parallelism as the residual stream is
    (the FakeTensorMode trace of torchtitan 0.3.0's DeepSeek-V3 cut: at the MoE unit's reduce the bf16 gradient of
    the layer's input, [b, s, h], made by the residual add in its backward)."""
    return terms.conv.hidden_grad_bytes * terms.tokens * terms.job.model.hidden_size / terms.ts


def unit_shards(dense_dp: int, expert_dp: float, dense: float, experts: float = 0.0) -> dict[str, float]:
    """A unit's FsdpUnit.sharded and .alone: what one rank holds of its dense parameters over the dense shard group and
    of its routed experts over the expert one, and those of them whose group is one rank (no reduce-scatter)."""
    return {"sharded": dense / dense_dp + experts / expert_dp,
            "alone": (dense if dense_dp == 1 else 0.0) + (experts if expert_dp == 1 else 0.0)}


def unit_grads(tensors: list, dense_dp: int, expert_dp: float, dense: float, experts: float = 0.0) -> float:
    """A unit's sharded gradient bytes: its dense parameters' over the dense data-parallel ranks, its routed experts'
    over the expert ones."""
    return (state_bytes(tensors, dense, dense_dp)["gradients"]
            + state_bytes(tensors, experts, expert_dp)["gradients"])


def embedding_in_root(stage: WalkStage) -> bool:
    """Whether the stage's embedding is a parameter of its root unit, with the output layer and final norm
    (the convention's embedding_in_root: KempnerForge's apply_fsdp2), so it has no unit of its own."""
    return stage.terms.conv.embedding_in_root and stage.params.first and stage.params.last


def walk_assumption(conv, stage: StageMemory, moment: str, m: int, pipeline: bool = False,
                    reduce_dtype: str = "fp32") -> str:
    """What the backward walk found on the peak stage (`pipeline`: memory_states.pipeline_held; `reduce_dtype`: the
    dtype the held gradients accumulate in, the plan's)."""
    held = stage.detail.get("unsharded_accumulated_gradients", 0)
    absent = stage.detail.get("gradients_absent_at_peak", 0)
    grads = ("the trainer sets the gradients to None each step, so a unit's sharded gradients exist only after its "
             f"reduce-scatter ({absent / GIB:.2f} GiB not yet allocated"
             + ("; still reserved: the caching allocator keeps the freed blocks in the reduce-scatter stream's pool)"
                if conv.freed_grads_stay_reserved else ")")
             if conv.grads_set_to_none and (m == 1 or held) and (absent or not pipeline) else
             "every sharded gradient allocated" + (" (accumulated over the step's micro-batches)"
                                                   if conv.grads_set_to_none else " (zeroed in place, not freed)"))
    if held and pipeline:
        grads += ("; torch's pipeline stage (without PP, the framework's own switch: the card's grad_accumulation "
                  "keep_knob) defers gradient sync and resharding to the step's last backward, so "
                  f"the units stay gathered and hold {held / GIB:.2f} GiB of unsharded gradients accumulated in "
                  f"{reduce_dtype} (the card's grad_accumulation)")
    elif held:
        grads += (f"; gradient sync waits for the last of the {m} micro-batches, so the units hold "
                  f"{held / GIB:.2f} GiB of unsharded gradients accumulated in {reduce_dtype} (the card's "
                  "grad_accumulation)")
    return (f"FSDP2 step peak walked unit by unit through the backward (cards/memory.yaml step_peak): stage "
            f"{stage.stage} peaks at the {moment} moment, {stage.activations_bytes / GIB:.2f} GiB of activations "
            f"and {stage.detail.get('gathered_layers', 0) / GIB:.2f} GiB of gathered parameters, unsharded gradients "
            f"and reduce-scatter buffers; {grads}.")
