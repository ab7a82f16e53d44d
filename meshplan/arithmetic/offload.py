"""CPU offload: which model states and activations leave the GPU, what they cost in host memory, and in time.

The framework card (`offload`, per engine) says what each knob moves and when: inside the training step (the
GPU peak falls, the host holds the state, transfers and the CPU Adam step cost time) or only between the phases
of an RL job (the training step's peak is unchanged; the host must still hold the state while the rollout runs).
The bytes per parameter of a CPU optimizer and the activation layers kept on the GPU are in cards/offload.yaml.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pydantic import BaseModel, ConfigDict, Field

from meshplan.knowledge.adapter_knobs import DEFAULT_VARIANTS
from meshplan.knowledge.cards import FrameworkCard, load_card
from meshplan.knowledge.gdn_config import split_layers
from meshplan.knowledge.offload_card import EngineOffload
from meshplan.schema.plan import Job, Plan

CLASSES = ("weights", "gradients", "optimizer")


class OffloadCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str
    cpu_optimizer_bytes_per_param: float = Field(gt=0)
    cpu_optimizer_bytes_source: str
    activation_offload_resident_layers: int = Field(ge=1)
    activation_offload_resident_source: str
    layer_offload_kept_layers: int = Field(ge=0)
    layer_offload_source: str
    cpu_adam_s_per_param: float = Field(gt=0)
    cpu_adam_source: str


def offload_card() -> OffloadCard:
    return load_card("offload", OffloadCard)


@dataclass(frozen=True)
class OffloadPlan:
    """What the plan's offload knobs mean on its framework's engine.

    in_step: share of each state class kept in host memory during the training step; cpu_optimizer: share of the
    optimizer stepped on the CPU (its host tensors are cards/offload.yaml's cpu_optimizer_bytes_per_param);
    phase: classes off the GPU only between RL phases, on the host but `phase_freed` (released, no host copy);
    activations: whether saved activations go to host."""

    in_step: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    cpu_optimizer: float = 0.0
    phase: frozenset[str] = frozenset()
    phase_freed: frozenset[str] = frozenset()
    activations: bool = False
    cpu_classes: frozenset[str] = frozenset()  # classes the CPU optimizer's own host tensors stand for
    layers: int = 0  # Megatron-Core's layer-wise offload: the first `layers` layers' saved tensors go to the host

    @property
    def any(self) -> bool:
        return bool(self.activations or self.layers or self.phase or self.cpu_optimizer
                    or any(self.in_step.values()))


def optimizer_share(plan: Plan) -> float:
    """The share of the optimizer offloaded: optimizer_offload_fraction when given, else all of it with
    optimizer_offload, else none."""
    if plan.optimizer_offload_fraction > 0:
        return plan.optimizer_offload_fraction
    return 1.0 if plan.optimizer_offload else 0.0


def job_offload_plan(job: Job, plan: Plan) -> OffloadPlan:
    """offload_plan with the job's layer-wise activation offload (Job.activation_offload_layers: Megatron-Core's
    cpu_offloading_num_layers), which rule OF003 holds to the frameworks and plans that run it."""
    off = offload_plan(job.card, plan)
    return replace(off, layers=job.activation_offload_layers) if job.activation_offload_layers else off


def offload_plan(card: FrameworkCard, plan: Plan) -> OffloadPlan:
    """The plan's offload knobs read through the framework card. A knob the engine lacks is left out here: rule
    OF001 reports it (with the framework's nearest knob), so an estimate never silently pretends to offload. A plan
    with no offload knob set moves nothing whatever the card says (every share below is 0): the empty plan, unread."""
    if not (plan.param_offload or plan.grad_offload or plan.optimizer_offload or plan.optimizer_offload_fraction > 0
            or plan.activation_offload):
        return OffloadPlan()
    sem: EngineOffload | None = card.offload_at(plan.zero_stage)
    out = OffloadPlan()
    if sem is None:
        return out
    in_step = dict.fromkeys(CLASSES, 0.0)
    phase: set[str] = set()
    freed: set[str] = set()
    cpu_classes: set[str] = set()
    cpu_optimizer = 0.0

    def move(knob, share: float) -> None:
        nonlocal cpu_optimizer
        if share <= 0 or knob.when == "none":
            return
        if knob.when == "phase":
            phase.update(knob.moves, knob.frees)
            freed.update(knob.frees)
            return
        for cls in knob.moves:
            in_step[cls] = max(in_step[cls], share)
        if "optimizer" in knob.moves:
            cpu_optimizer = max(cpu_optimizer, share)
            cpu_classes.update(knob.moves)  # e.g. FSDP2's fp32 shard and grads are the CPU Adam's own tensors

    move(sem.param, 1.0 if plan.param_offload else 0.0)
    move(sem.grad, 1.0 if plan.grad_offload else 0.0)
    if sem.optimizer.when == "in_step":  # Megatron-Core's CPU optimizer, DeepSpeed's offload_optimizer (ratio)
        move(sem.optimizer, optimizer_share(plan))
    else:
        move(sem.optimizer, 1.0 if plan.optimizer_offload else 0.0)  # between phases (verl, SkyRL)
        if plan.optimizer_offload_fraction > 0 and sem.optimizer_fraction == "in_step":
            # verl's / SkyRL's Megatron backend: Megatron-Core's HybridDeviceOptimizer through the optimizer config
            in_step["optimizer"] = max(in_step["optimizer"], plan.optimizer_offload_fraction)
            cpu_optimizer = max(cpu_optimizer, plan.optimizer_offload_fraction)
            cpu_classes.add("optimizer")
    activations = plan.activation_offload and sem.activation == "in_step"
    return OffloadPlan(in_step=in_step, cpu_optimizer=cpu_optimizer, phase=frozenset(phase),
                       phase_freed=frozenset(freed), activations=activations, cpu_classes=frozenset(cpu_classes))


@dataclass(frozen=True)
class StageOffload:
    """One stage's GPU bytes after offload and what its GPU puts in host memory."""

    states: dict[str, float]
    activations: float
    host: float
    detail: dict[str, int]


def offload_stage(off: OffloadPlan, states: dict[str, float], optimizer_params: float, activations: float,
                  largest_layer: float, layer_bytes: Sequence[float] = (), held: int = 1) -> StageOffload:
    """Apply the offload to one stage: `states` are the GPU bytes per class without offload, `optimizer_params`
    the parameters this GPU's optimizer steps (its shard), `activations` the stored layer activations of the
    micro-batches in flight, `largest_layer` the most one layer stores for one micro-batch, `layer_bytes` what each
    of the stage's layers saves for one micro-batch, in order, and `held` the micro-batches in flight (the
    layer-wise offload's)."""
    card = offload_card()
    kept = {cls: value * (1.0 - off.in_step[cls]) for cls, value in states.items()}
    detail: dict[str, int] = {}
    # the CPU optimizer's own fp32 tensors for its share; a state moved without the optimizer (DeepSpeed
    # offload_param) sits on the host as it was on the GPU
    host = card.cpu_optimizer_bytes_per_param * optimizer_params * off.cpu_optimizer
    if off.cpu_optimizer:
        detail["host_cpu_optimizer"] = int(host)
    for cls in CLASSES:
        moved = states[cls] * off.in_step[cls]
        if moved and cls not in off.cpu_classes:
            host += moved
            detail[f"host_{cls}"] = int(moved)
    phase = sum(kept[cls] for cls in off.phase - off.phase_freed)
    if phase:
        host += phase
        detail["host_between_phases"] = int(phase)
    on_gpu = activations
    if off.activations and activations:
        on_gpu = min(activations, card.activation_offload_resident_layers * largest_layer)
        host += activations - on_gpu
        detail["host_activations"] = int(activations - on_gpu)
    elif off.layers and layer_bytes:
        resident, sent = layer_offload_split(layer_bytes, off.layers)
        on_gpu = max(0.0, activations - held * (sum(layer_bytes) - resident))
        host += held * sent
        detail["host_activations"] = int(held * sent)
        detail["offloaded_layers"] = min(off.layers, len(layer_bytes) - 1)
    return StageOffload(states=kept, activations=on_gpu, host=host, detail=detail)


def layer_offload_split(layer_bytes: Sequence[float], offloaded: int) -> tuple[float, float]:
    """(the most the GPU holds at once, what goes to the host) of one micro-batch's saved layer tensors under
    Megatron-Core's layer-wise CPU offload of the first `offloaded` of its M layers (cards/offload.yaml
    layer_offload_source: Transformer Engine's DefaultOffloadSynchronizer frees layer i's copy before layer
    M - N + i's forward, so at most M - N consecutive layers are held, plus layer_offload_kept_layers). Megatron-Core
    refuses N >= M (rule OF003); a forced one offloads M - 1, all Transformer Engine allows."""
    m = len(layer_bytes)
    n = max(0, min(offloaded, m - 1))
    window = min(m, m - n + offload_card().layer_offload_kept_layers)
    kept = max(sum(layer_bytes[i:i + window]) for i in range(m - window + 1)) if m else 0.0
    return kept, float(sum(layer_bytes[:n]))


def layer_offload_stall(layers: int, offloaded: int, copy_s: float, forward_s: float, backward_s: float) -> float:
    """Seconds one micro-batch's compute waits on the host copies of Megatron-Core's layer-wise offload, as
    Transformer Engine's DefaultOffloadSynchronizer streams them (cards/offload.yaml layer_offload_source): one side
    stream copies layer i out once layer i+1's forward starts, and the forward of layer M - N + i waits for it; in
    the backward the same stream copies it back from the backward of layer M - 1 - N + i, and layer i's backward
    waits for it. Each layer takes `forward_s` / `backward_s` of compute and each copy `copy_s`."""
    m, n = layers, max(0, min(offloaded, layers - 1))
    stall = 0.0
    for order, own_s in (("forward", forward_s), ("backward", backward_s)):
        clock = stream = 0.0
        done: dict[int, float] = {}
        for step in range(m):
            layer = step if order == "forward" else m - 1 - step
            start = layer - 1 if order == "forward" else layer - (m - 1 - n)  # the copy this layer's step starts
            if 0 <= start < n:
                stream = max(clock, stream) + copy_s
                done[start] = stream
            needed = layer - (m - n) if order == "forward" else layer  # the copy this layer waits for
            if 0 <= needed < n and done[needed] > clock:
                stall += done[needed] - clock
                clock = done[needed]
            clock += own_s
    return stall


def offload_time(job: Job, plan: Plan, *, optimizer_params: float, host_activation_bytes: float,
                 param_bytes_moved: float, compute_s: float) -> tuple[float, str]:
    """Seconds an offload adds to one step, and how they were counted: the CPU Adam step of the offloaded share
    (not hidden), plus the host transfers the step's compute cannot cover (activations out in the forward and
    back in the backward, each micro-batch; in-step parameter offload: the shard in for every forward and backward
    gather and its gradient out, each micro-batch)."""
    off = job_offload_plan(job, plan)
    if not off.any:
        return 0.0, ""
    card = offload_card()
    m = plan.num_microbatches(job.global_batch_size)
    layer_stall = 0.0
    if off.layers and host_activation_bytes:  # Megatron-Core's layer-wise offload: its copies are timed layer by layer
        layers = split_layers(job.model) // max(1, plan.pp)  # Megatron-Core's layers (a GDN hybrid's decoder layers)
        n = max(1, min(off.layers, layers - 1))
        forward_s = compute_s / m / layers / 3  # a layer's forward: a third of its forward and backward
        layer_stall = m * layer_offload_stall(layers, n, host_activation_bytes / n / job.gpu.host_bandwidth,
                                              forward_s, 2 * forward_s)
    adam = card.cpu_adam_s_per_param * optimizer_params * off.cpu_optimizer
    moved = 2 * host_activation_bytes * m if off.activations else 0.0
    if off.in_step["weights"]:
        moved += 3 * param_bytes_moved * m  # in for the forward and the backward gather, the gradient out
    transfer = moved / job.gpu.host_bandwidth
    exposed = max(0.0, transfer - compute_s)
    parts = []
    if adam:
        parts.append(f"CPU Adam {adam:.3f} s ({card.cpu_adam_s_per_param:.1e} s x {optimizer_params:,.0f} params x "
                     f"{off.cpu_optimizer:g}, cards/offload.yaml)")
    if moved:
        parts.append(f"host transfers {moved / 1e9:,.1f} GB at {job.gpu.host_bandwidth / 1e9:g} GB/s = "
                     f"{transfer:.3f} s, {exposed:.3f} s beyond the compute")
    if off.layers and host_activation_bytes:
        parts.append(f"{off.layers} layers' saved tensors out and back ({2 * host_activation_bytes * m / 1e9:,.1f} GB "
                     f"at {job.gpu.host_bandwidth / 1e9:g} GB/s on one side stream, each copy behind the layers "
                     f"Transformer Engine's synchronizer lets it run under): {layer_stall:.3f} s exposed")
    return adam + exposed + layer_stall, "; ".join(parts)


def unsupported_offloads(card: FrameworkCard, job: Job, plan: Plan) -> list[tuple[str, str, str]]:
    """(knob, why, the framework's nearest knob) for each offload knob set that the engine of this ZeRO stage lacks,
    or that needs a higher zero_stage there; on a training job, a `phase` knob of an engine whose phase offloads act
    in an RL job only (phase_offloads_when: rl; the nearest knob then from the variant `render` writes for it)."""
    sem = card.offload_at(plan.zero_stage)
    no_phases = sem is not None and sem.phase_offloads_when == "rl" and job.rl is None
    asked = {
        "activation_offload": plan.activation_offload,
        "param_offload": plan.param_offload,
        "grad_offload": plan.grad_offload,
        "optimizer_offload": plan.optimizer_offload,
        # the whole optimizer (1.0, what the resolver fills beside optimizer_offload) is the optimizer knob itself, not
        # a share: DeepSpeed's ZeRO-1/2 offload_optimizer moves everything, only a ratio below 1 needs ZeRO-3
        "optimizer_offload_fraction": plan.optimizer_offload_fraction > 0 and not (
            plan.optimizer_offload and plan.optimizer_offload_fraction >= 1.0),
    }
    out = []
    for knob, on in asked.items():
        if not on:
            continue
        has = sem is not None and {
            "activation_offload": sem.activation != "none",
            "param_offload": sem.param.when != "none",
            "grad_offload": sem.grad.when != "none",
            "optimizer_offload": sem.optimizer.when != "none",
            "optimizer_offload_fraction": sem.optimizer_fraction != "none" or sem.optimizer.when != "none",
        }[knob]
        if not has:
            out.append((knob, f"the {card.engine_at(plan.zero_stage)} engine has no such offload",
                        _instead(card, knob, plan.zero_stage)))
            continue
        if no_phases and knob in _PHASE_KNOBS and getattr(sem, _SEMANTIC_NAME[knob]).when == "phase":
            out.append((knob, "it acts only between the phases of an RL step (rollout and training), which a "
                              "training job does not have",
                        _instead(card, knob, plan.zero_stage, DEFAULT_VARIANTS[card.name](card, job, plan))))
            continue
        need = sem.requires_zero_stage.get(_SEMANTIC_NAME[knob])
        if need is not None and plan.zero_stage < need:
            out.append((knob, "it needs a higher zero_stage there",
                        f"Use zero_stage >= {need} with {knob} on {card.display_name}, or drop {knob}."))
    return out


_PHASE_KNOBS = ("param_offload", "grad_offload", "optimizer_offload")  # the OffloadKnob ones: `when` in_step or phase
_SEMANTIC_NAME = {"activation_offload": "activation", "param_offload": "param", "grad_offload": "grad",
                  "optimizer_offload": "optimizer", "optimizer_offload_fraction": "optimizer_fraction"}


def _instead(card, knob: str, zero_stage: int, variant_name: str | None = None) -> str:
    """The card's own words for the nearest knob: the variant's first (`variant_name`, else the one named as this
    engine: verl's and SkyRL's FSDP)."""
    if card.adapter is not None:
        variant = card.adapter.variant_knobs.get(variant_name or card.engine_at(zero_stage), {})
        spec = variant.get(knob) or card.adapter.versions[card.adapter.default_version].knobs.get(knob)
        if spec is not None and spec.instead:
            return spec.instead
    return f"{card.display_name} has no {knob} at zero_stage {zero_stage}; drop it."
