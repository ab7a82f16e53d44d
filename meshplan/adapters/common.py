"""What every adapter shares: what a builder hands the template (`Built`), and the arithmetic: nodes, the pipeline
split, Megatron's recompute fields, rollout TP.

Each function is pure and says in its docstring which framework rule it follows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from meshplan.arithmetic import mesh
from meshplan.arithmetic.offload import optimizer_share
from meshplan.arithmetic.schedule import layers_per_rank, model_uneven_split, split_problem
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import ep_rank_load
from meshplan.knowledge.adapter_knobs import adapter_section, knob_table
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.gdn_config import decoder_flags
from meshplan.knowledge.model_counts import total_params
from meshplan.knowledge.precision_card import MixedPrecisionPresets
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import RenderFormat


@dataclass
class Built:
    """What a target builder hands the template (and the result)."""

    template: str
    context: dict[str, Any]
    format: RenderFormat
    filename: str
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    exports_env: bool = False  # a shell script of another format (hydra): it exports the allocator setting itself


Builder = Callable[[Job, Plan, str, str], Built]
"""A target's builder: (job, plan, variant, version) -> the template and its context."""


@dataclass(frozen=True)
class Nodes:
    nnodes: int
    per_node: int


def nodes(job: Job) -> Nodes:
    """The nodes and processes per node the launcher starts: torchrun/Ray launch the same number of processes on
    every node, so the GPUs must fill whole nodes (mesh.whole_nodes, the resolver's refusal, for a Job built outside
    it)."""
    return Nodes(mesh.whole_nodes(job.num_gpus, job.gpus_per_node), mesh.ranks_per_node(job))


@dataclass(frozen=True)
class Split:
    """Layers per pipeline stage: `stages` = pp*vpp model chunks; first/last may differ (uneven PP)."""

    stages: int
    first: int | None
    last: int | None
    per_chunk: int | None  # layers of every chunk (even split) or of the middle chunks (uneven split)


def split_fields(job: Job, plan: Plan) -> Split:
    """The plan's split in the renderers' terms (schedule.py owns the split itself). Megatron's rule
    (schedule.split_problem): the middle stages share the remaining layers evenly; whether vpp divides each part is
    rule PP004's to say (a forced render keeps it)."""
    layers = job.model.num_layers
    stages = plan.pp * plan.vpp
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if first is None and last is None:
        per = layers // stages if layers % stages == 0 else None
        return Split(stages, None, None, per)
    if plan.pp < 2:
        raise MeshplanError("first_stage_layers/last_stage_layers need pp > 1.", fix="Drop them or set pp >= 2.")
    problem = split_problem(layers, plan.pp, 1, first, last)
    if problem:
        raise MeshplanError(
            f"{layers} layers do not split as first={first}, last={last} over pp={plan.pp}: {problem}.",
            fix=split_fix(job, plan))
    rest_stages = plan.pp - (first is not None) - (last is not None)
    counts, _ = layers_per_rank(layers, plan.pp, first, last)
    return Split(stages, first, last, counts[first is not None] if rest_stages else None)


def split_fix(job: Job, plan: Plan, lighter_ends: bool = False) -> str:
    """A fix naming a pipeline split that works for the job's layers over the plan's pp (and vpp): the split the
    search takes (schedule.uneven_split), else any Megatron-Core accepts (closest_uneven_split, its heavier stage
    said), else the pipeline sizes whose stages the layers fill evenly. `lighter_ends`: the framework can only make
    the first and last stages lighter than the middle ones (torchtitan's first/last_stage_less_layers)."""
    layers, pp, vpp = job.model.num_layers, plan.pp, plan.vpp
    split = model_uneven_split(job.model, pp, vpp) or model_uneven_split(job.model, pp, vpp, closest=True)
    if split and lighter_ends and max(split[0], split[2]) > split[1]:
        split = None
    if split:
        first, per, last = split
        even = -(-layers // pp)
        caveat = "" if max(first, per) <= even else \
            f" (its heaviest stage holds {max(first, per)} layers, over the {even} of the most even split)"
        middle = "" if pp < 3 else f", {per} on the middle stage" if pp == 3 else \
            f", {per} on each of the {pp - 2} middle stages"
        return f"Use first_stage_layers={first}, last_stage_layers={last}{middle}{caveat}."
    room = max(job.num_gpus // (plan.tp * plan.cp), 1)
    even = [p for p in range(2, min(layers, room) + 1) if layers % p == 0 and room % p == 0]
    return (f"No first/last split of {layers} layers works over pp={pp}" + (f", vpp={vpp}" if vpp > 1 else "") +
            (f"; use pp in {{{', '.join(map(str, even))}}}, which split them evenly"
             f"{' (vpp=1)' if vpp > 1 else ''}, or pp=1." if even else "; use pp=1."))


def megatron_recompute(plan: Plan) -> dict[str, object]:
    """Megatron-Core TransformerConfig recompute fields.

    selective: granularity only (recompute_method and recompute_num_layers must stay None, per
    TransformerConfig.__post_init__ and validate_args); full: 'uniform' with 1 layer per chunk
    recomputes every layer ('uniform' with N: in chunks of N layers, recompute_method=uniform with
    recompute_layers=N), 'block' with N recomputes the first N layers of each stage
    (megatron/core/transformer/transformer_block.py, _checkpointed_forward).
    """
    if plan.recompute == "selective":
        rec: dict[str, object] = {"recompute_granularity": "selective", "recompute_method": None,
                                  "recompute_num_layers": None}
        if plan.recompute_modules is not None:  # left out: Megatron's default, ["core_attn"]
            rec["recompute_modules"] = list(plan.recompute_modules)
        return rec
    if plan.recompute == "full":
        if plan.recompute_layers is None or plan.recompute_method == "uniform":
            return {"recompute_granularity": "full", "recompute_method": "uniform",
                    "recompute_num_layers": plan.recompute_layers or 1}
        return {"recompute_granularity": "full", "recompute_method": "block",
                "recompute_num_layers": plan.recompute_layers}
    return {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}


def plan_recompute(granularity: str | None, method: str | None, num_layers: int | None,
                   modules: object = None) -> dict[str, object]:
    """Inverse of `megatron_recompute` (for the parse-back round trip)."""
    if granularity in (None, "null", "None"):
        return {"recompute": "none", "recompute_layers": None}
    if granularity == "selective":
        if modules is not None:  # a list, one flag value, or a Hydra / dotlist list of bare names: [a,b]
            names = modules.strip("[]").split(",") if isinstance(modules, str) else list(modules)  # type: ignore[call-overload]
            return {"recompute": "selective", "recompute_layers": None,
                    "recompute_modules": [str(n).strip().strip("'\"") for n in names]}
        return {"recompute": "selective", "recompute_layers": None}
    if method == "uniform" and num_layers not in (None, 1, "1"):  # chunks of N layers checkpointed together
        return {"recompute": "full", "recompute_layers": int(num_layers), "recompute_method": "uniform"}
    return {"recompute": "full", "recompute_layers": int(num_layers) if method == "block" else None}


def hierarchical_cp(job: Job, plan: Plan) -> list[int]:
    """a2a+p2p context parallelism's [a2a, p2p] group sizes (Megatron-Core):
    meshplan.arithmetic.mesh.hierarchical_cp_sizes,
    the grouping the step time assumes."""
    return list(mesh.hierarchical_cp_sizes(plan.cp, plan.tp, job.gpus_per_node))


def rollout_tp(job: Job, memory_fraction: float = 0.5) -> int:
    """Smallest inference TP whose bf16 weight shard takes at most `memory_fraction` of a GPU.

    The other half is left to the KV cache (verl's rollout.gpu_memory_utilization defaults to 0.5 of
    the GPU for weights plus cache, so this is a floor, not an optimum). vLLM and SGLang need the
    attention heads divisible by TP and TP within one node.
    """
    total = total_params(job.model)
    tp = 1
    while tp < job.gpus_per_node:
        if 2 * total / tp <= memory_fraction * job.gpu.memory_bytes and job.model.num_attention_heads % tp == 0:
            break
        tp *= 2
    return min(tp, job.gpus_per_node)


def moe_layer_freq(job: Job) -> str | None:
    """Megatron's --moe-layer-freq as a Python list expression (1 = MoE layer), or None for all-MoE: over the
    TransformerLayers Megatron-Core builds, a Gated DeltaNet hybrid's decoder layers (its pattern's E per mixer and
    MLP pair, as get_moe_layer_pattern reads it on the GPTModel path)."""
    moe, m = job.model.moe, job.model
    if moe is None:
        return None
    flags = ([1 if i in set(moe.moe_layers) else 0 for i in range(m.num_layers)] if m.gdn is None or
             m.layer_pattern is None else decoder_flags(m.layer_pattern, 1, "E"))
    if all(flags):
        return None
    k = flags.index(1) if 1 in flags else len(flags)
    if all(flags[k:]):
        return f"([0]*{k}+[1]*{len(flags) - k})"
    return "[" + ",".join(map(str, flags)) + "]"


def flex_backend(job: Job) -> str:
    """Megatron-Core's moe_flex_dispatcher_backend for the job: its Job.moe_flex_backend, the request's, else the
    machine's (mesh.flex_backend: "hybridep" where one NVLink domain spans nodes, GB200 NVL72, else "deepep", which
    sends a token once per destination node over RDMA and fans it out over the node's NVLink)."""
    return job.moe_flex_backend


def megatron_dispatcher(job: Job, plan: Plan) -> list[tuple[str, str]]:
    """TransformerConfig MoE dispatcher fields: none for a dense model, else the type (and the flex backend).

    Always explicit for MoE: megatron-core's own default is "allgather", which is neither plan meshplan
    models. With flex and ep = etp = 1 no token leaves its rank, and DeepEP asserts TPxEP > 1
    (megatron/core/transformer/moe/token_dispatcher.py, MoEFlexTokenDispatcher), so that is refused.
    """
    if job.model.moe is None:
        return []
    if plan.moe_token_dispatcher != "flex":
        return [("moe_token_dispatcher_type", plan.moe_token_dispatcher)]
    if plan.ep * plan.etp == 1:
        raise MeshplanError(
            "moe_token_dispatcher=flex needs expert parallelism: with ep=1 and etp=1 no token leaves its rank, "
            "and Megatron-Core's DeepEP dispatcher asserts TPxEP > 1.",
            fix="Use moe_token_dispatcher=alltoall, or ep > 1.")
    return [("moe_token_dispatcher_type", "flex"), ("moe_flex_dispatcher_backend", flex_backend(job))]


def routing_notes(job: Job, plan: Plan) -> list[str]:
    """A MoE config's note on routing imbalance (Job.moe_routing_imbalance): no framework key says it, and the
    switch that forces balance is for benchmarks only, so the framework card's note says so instead of a key."""
    facts = framework_card(job.framework).moe_routing
    if job.model.moe is None or facts is None:
        return []
    return [facts.note.format(imbalance=ep_rank_load(job, plan))]


def flex_notes(job: Job, plan: Plan) -> tuple[list[str], list[str]]:
    """(notes, warnings) for a flex-dispatcher plan: what must be installed and why this backend."""
    if job.model.moe is None or plan.moe_token_dispatcher != "flex":
        return [], []
    gpu, per_node = job.gpu, job.gpus_per_node
    domain = mesh.fast_domain(gpu, per_node)
    machine = mesh.flex_backend(gpu, per_node)
    if flex_backend(job) != machine:
        why = (f"{flex_backend(job)}, as the request sets it (moe_flex_backend; {machine} is what meshplan writes "
               f"for {gpu.name} when it is left out)")
        package = ("HybridEP (DeepEP's hybrid-ep branch, deep_ep.HybridEPBuffer)" if flex_backend(job) == "hybridep"
                   else "DeepEP (deep_ep.Buffer)")
    elif machine == "hybridep":
        why = (f"hybridep: the {gpu.name} NVLink domain ({domain} GPUs) spans several {per_node}-GPU "
               "nodes, and only HybridEP covers a multi-node NVLink domain (megatron-core TransformerConfig)")
        package = "HybridEP (DeepEP's hybrid-ep branch, deep_ep.HybridEPBuffer)"
    else:
        why = (f"deepep: the {gpu.name} NVLink domain is one node, so DeepEP sends a token once per destination "
               "node and fans it out over NVLink")
        package = "DeepEP (deep_ep.Buffer)"
    notes = [f"moe_token_dispatcher=flex renders Megatron-Core's flex dispatcher with backend {why}. "
             f"{package} must be installed on every node: without it the dispatcher raises ImportError when the "
             "model is built (megatron/core/transformer/moe/token_dispatcher.py)."]
    warnings = []
    if domain < per_node:
        warnings.append(f"{gpu.name} links only {domain} GPUs by NVLink, fewer than the {per_node} of a "
                        "node: DeepEP's intra-node path needs the whole node on NVLink.")
    return notes, warnings


# --------------------------------------------------------------------------- offload (cards/frameworks/*.yaml offload)

# Megatron-Core fine-grained activation offloading: the module inputs saved for backward that go to host
# (transformer_config.py offload_modules; attn_proj only with core_attn, whose output it reads).
DENSE_OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")
MOE_OFFLOAD_MODULES = ("expert_fc1", "moe_act")


def offload_modules(job: Job, plan: Plan) -> list[str]:
    """Every module input Megatron-Core can offload for this model; the routed experts' only when their inputs
    are kept (recompute_modules 'moe' replays the whole MoE, and Megatron-Core then refuses offloading inside it)."""
    modules = list(DENSE_OFFLOAD_MODULES)
    if job.model.moe is not None and "moe" not in (plan.recompute_modules or ()):
        modules += MOE_OFFLOAD_MODULES
    return modules


def megatron_cpu_optimizer(job: Job, plan: Plan) -> dict[str, object]:
    """Megatron-Core OptimizerConfig fields of the in-step CPU optimizer (HybridDeviceOptimizer): the share, the
    precision-aware optimizer whose code path it reuses (arguments.py asserts it), and the D2H/H2D overlap. Where the
    engine's optimizer_offload moves the optimizer between an RL step's phases (verl's and SkyRL's Megatron engines:
    the card's offload section, optimizer `when: phase`), only optimizer_offload_fraction steps it on the CPU."""
    semantics = job.card.offload_at(plan.zero_stage)
    phase = semantics is not None and semantics.optimizer.when == "phase"
    share = plan.optimizer_offload_fraction if phase else optimizer_share(plan)
    if share == 0:
        return {}
    return {"optimizer_cpu_offload": True, "optimizer_offload_fraction": share,
            "use_precision_aware_optimizer": True, "overlap_cpu_optimizer_d2h_h2d": True}


def read_offload(values: dict[str, object]) -> dict[str, object]:
    """Inverse of the offload settings (for the parse-back round trip): Megatron-Core's names to the plan's."""
    out: dict[str, object] = {}
    if _true(values.get("fine_grained_activation_offloading")):
        out["activation_offload"] = True
    if _true(values.get("optimizer_cpu_offload")):
        out["optimizer_offload"] = True
        out["optimizer_offload_fraction"] = float(values.get("optimizer_offload_fraction", 1.0))
    return out


def _true(value: object) -> bool:
    return value is True or str(value).lower() == "true"


# Megatron-Core's TransformerConfig defaults attention_dropout and hidden_dropout to 0.1 (transformer_config.py),
# the probability Megatron-LM's functional tests run: Plan.dropout on renders it, off renders 0.0.
DROPOUT_ON = 0.1


def absent_defaults(framework: str, variant: str, given: Collection[str], stated: Collection[str]
                    ) -> dict[str, Any]:
    """What a `variant` script runs for the fields it leaves to the framework (the card's read.absent_by_variant:
    Megatron-DeepSpeed's CoreAttention and dropout 0.1, Megatron-LM pretrain_gpt.py's dropout 0.1): dropout where
    any of its knob's keys (attention, hidden) is missing from the flags `given`, each missing one running at the
    framework's default whatever the other says; any other field where the fields the script set (`stated`) lack
    it."""
    card = framework_card(framework)
    absent = card.read.absent_by_variant.get(variant, {}) if card.read is not None else {}
    out: dict[str, Any] = {}
    for name, value in absent.items():
        if name == "dropout":
            keys = (knob_table(card, adapter_section(card).default_version, variant)["dropout"].key or "").split()
            if any(key not in given for key in keys):
                out[name] = value
        elif name not in stated:
            out[name] = value
    return out


def attention_value(framework: str, variant: str, backend: str, mla: bool = False) -> str | None:
    """The framework's own value for an attention_backend (its card's adapter knob `values`, with the variant's
    overrides); None for auto (nothing to render), except an MLA model on an engine whose card names an mla_backend
    (verl's Megatron engine: fused, as its DeepSeek-V3 recipe sets, where its flash default finds no kernel): that
    backend, the one perf times. capabilities.refuse_missing has already refused a value the framework lacks."""
    if backend == "auto":
        attention = framework_card(framework).attention
        if not mla or attention is None or attention.mla_backend is None:
            return None
        backend = attention.mla_backend
    card = framework_card(framework)
    knob = knob_table(card, adapter_section(card).default_version, variant)["attention_backend"]
    return (knob.values or {}).get(backend)


def attention_backend_of(framework: str, variant: str, value: Any) -> str:
    """attention_backend read back from a snippet: the meshplan value the framework's value is (absent: auto)."""
    if value is None:
        return "auto"
    card = framework_card(framework)
    knob = knob_table(card, adapter_section(card).default_version, variant)["attention_backend"]
    return next(ours for ours, theirs in (knob.values or {}).items() if theirs == str(value).lower())


def torchtitan_batch(local_batch_size: int, pp_microbatch_size: int | None, pp: int, *,
                     microbatches: int | None = None, dp: int | None = None,
                     global_batch_size: int | None = None) -> dict[str, int]:
    """torchtitan's batch keys as Request fields (its card's pipeline section, runs_per_accumulation_step): without PP
    training.local_batch_size is the micro-batch; with PP it is one run of the schedule, cut into micro-batches of
    parallelism.pipeline_parallel_microbatch_size (default 1), so micro_batch_size = that size and
    pipeline_microbatches = local / size; releases before 5e2033c cut it into `microbatches` instead
    (parallelism.pipeline_parallel_microbatches: knowledge/published_runs.torchtitan_pipeline_microbatches).
    pipeline_microbatches is left out where one run is the whole step (global_batch_size = local x dp); with
    global_batch_size -1 (local x dp) or unknown it stays, and resolve fills the global batch from it."""
    if pp <= 1:
        return {"micro_batch_size": local_batch_size}
    size = local_batch_size // microbatches if microbatches else (pp_microbatch_size or 1)
    if size < 1 or local_batch_size % size:
        raise MeshplanError(
            f"torchtitan: training.local_batch_size {local_batch_size} is not a multiple of the pipeline "
            f"micro-batch ({size}); torchtitan refuses it (distributed/pipeline_parallel.py).",
            fix="Give a local_batch_size that pipeline_parallel_microbatch_size divides.")
    out = {"micro_batch_size": size, "pipeline_microbatches": local_batch_size // size}
    if dp and global_batch_size == local_batch_size * dp:  # one run is the step: resolve's default, left out
        del out["pipeline_microbatches"]
    return out


# The one call a rendered Bridge snippet makes: the registered mixed-precision preset its fields start from
PRESET_CALL = re.compile(r"get_mixed_precision_config\(['\"](\w+)['\"]\)")


def bridge_presets() -> MixedPrecisionPresets:
    """Megatron-Bridge's registered mixed-precision presets (its card's mixed_precision_presets): what a recipe names
    as mixed_precision=<preset>, rendered and read back."""
    presets = framework_card("megatron-bridge").mixed_precision_presets
    if presets is None:
        raise MeshplanError("cards/frameworks/megatron-bridge.yaml has no mixed_precision_presets; its adapter names "
                            "a registered preset in every config it writes.",
                            fix="Restore the section (Megatron-Bridge training/mixed_precision.py's presets).")
    return presets
