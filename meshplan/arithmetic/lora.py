"""LoRA fine-tuning: which linears get adapters, how many adapter parameters each rank holds, their FLOPs.

A LoRA job freezes every base weight (it keeps its weight bytes, but has no gradient and no optimizer state) and
trains, for each targeted linear of width in -> out, A (in x r) and B (r x out). The framework's facts (whether
an engine has LoRA at all, its default rank, whether the fused QKV and gate/up linears share one A, whether the
routed experts of a layer share one adapter) are the `lora` section of its card (cards/frameworks/<name>.yaml),
keyed by engine; this module reads them and does the arithmetic that memory.py and perf.py call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, get_args

from pydantic import BaseModel, Field

from meshplan.arithmetic.activations import BF16
from meshplan.arithmetic.flops import mamba_scan_flops, model_flops_per_token
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD
from meshplan.arithmetic.memory_states import StateTensor
from meshplan.arithmetic.param_wrapper import param_wrapper_flops, wrapped
from meshplan.core.errors import MeshplanError
from meshplan.core.identity_memo import IdentityMemo
from meshplan.knowledge.cards import FrameworkCard, framework_card
from meshplan.knowledge.lora_card import LoraEngine
from meshplan.knowledge.model_counts import mtp_weight_blocks
from meshplan.schema.choices import (
    FRAMEWORKS,
    DefaultLoraTarget,
    LoraTarget,
    MambaLoraTarget,
    MlaLoraTarget,
    PeftLoraTarget,
)
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, LoraSpec
from meshplan.schema.request import Request

TARGETS: tuple[str, ...] = get_args(LoraTarget)
"""Every target name lora_targets takes: Megatron-Bridge's four, MLA attention's own linears and the other linears
only Hugging Face PEFT adapts (PEFT_TARGETS)."""
PEFT_TARGETS: tuple[str, ...] = get_args(PeftLoraTarget)
"""The router and shared_expert_gate linears of transformers' code (other_linears), which only the engines whose
target_modules are Hugging Face PEFT's module names adapt (LoraEngine.all_linear; rule LORA003)."""
MEGATRON_TARGETS: tuple[str, ...] = tuple(t for t in TARGETS if t not in PEFT_TARGETS)
"""The target names that are Megatron-Core module names, what Megatron-Bridge's LoRA matches."""
DEFAULT_TARGETS: tuple[str, ...] = get_args(DefaultLoraTarget)
"""Megatron-Bridge's LoRA.target_modules default (peft/lora.py), what a job that names no target adapts on an engine
built on it (those the model has), and what SkyRL's all-linear is on its Megatron worker; on a PEFT engine all-linear
is every linear the model has (all_linear_targets)."""
MLA_TARGETS: tuple[str, ...] = get_args(MlaLoraTarget)
MAMBA_TARGETS: tuple[str, ...] = get_args(MambaLoraTarget)
"""A hybrid model's Mamba-2 mixer linears (Megatron-Core MambaMixer: in_proj a column-parallel h -> 2 d_inner +
2 groups x state + heads, z x B C dt; out_proj a row-parallel d_inner -> h), which Megatron-Bridge's LoRA wraps by name
like any Megatron-Core linear (peft/lora.py LoRA.transform: ParallelLinearAdapter; peft/adapter_wrapper.py
_compute_mamba_dim_info splits in_proj's adapter for checkpoints). Both run outside the fused kernel in Megatron-Core
(ssm/mamba_mixer.py forward: self.in_proj(hidden_states), then mamba_split_conv1d_scan_combined over zxBCdt with no
outproj_weight, then self.out_proj(y)), so both adapters get their gradient; the conv1d is a Conv1d Bridge wraps no
adapter on, its weight read straight into the kernel (cp.get_conv1d_weight). transformers' NemotronH kernel path fuses
out_proj into the kernel (outproj_weight), where an adapter on it would get none: the frameworks that train through
that code are refused a hybrid anyway (rule HY002)."""


def lora_engines(card: FrameworkCard) -> dict[str, LoraEngine]:
    """The framework's LoRA engines from its card (empty: it runs no LoRA job). The card holds each entry once, so the
    layer memos that key an engine by identity (estimate/layer_records.py) see the same object every time."""
    return card.lora


def lora_engine(card: FrameworkCard, zero_stage: int) -> LoraEngine | None:
    """LoRA as the engine of this ZeRO stage runs it; None when that engine has none (rule LORA001)."""
    return lora_engines(card).get(card.engine_at(zero_stage))


def lora_frameworks() -> list[str]:
    """The frameworks whose card runs LoRA jobs."""
    return [f for f in FRAMEWORKS if lora_engines(framework_card(f))]


# --------------------------------------------------------------------------- the request


def lora_asked(req: Request) -> bool:
    """Whether the request trains LoRA adapters: job=lora, or lora_rank / lora_targets / lora_vision given with the
    job left out (or an RL job's); resolve_lora refuses them on a pretrain or sft job."""
    return req.job == "lora" or (req.job not in ("pretrain", "sft") and lora_fields_given(req))


def lora_fields_given(req: Request) -> bool:
    """Whether the request sets any LoRA field (lora_rank, lora_targets, lora_vision, lora_target_parameters)."""
    return any(v is not None for v in (req.lora_rank, req.lora_targets, req.lora_vision, req.lora_target_parameters))


def resolve_lora(req: Request, card: FrameworkCard, arch: Architecture, zero_stage: int,
                 notes: list[str]) -> LoraSpec | None:
    """The job's LoRA adapters: job=lora or a lora_rank (unless job is pretrain/sft), each default noted; None for a
    job that trains every weight. A framework without LoRA is left to rule LORA001 (it names the nearest), so check
    reports it like any other finding; here its default rank is Megatron-Bridge's (the LoRA dataclass's dim)."""
    if req.job in ("pretrain", "sft") and lora_fields_given(req):
        raise MeshplanError(f"lora_rank / lora_targets / lora_vision / lora_target_parameters are LoRA fields, not "
                            f"for job={req.job}.",
                            fix="Drop them, or pass job=lora (or leave job out).")
    if not lora_asked(req):
        return None
    if req.job is None:
        notes.append("job not given: lora, as lora_rank, lora_targets, lora_vision or lora_target_parameters is "
                     "given.")
    engine = lora_engine(card, zero_stage)
    rank = req.lora_rank
    if rank is None:
        rank, said = default_rank(card, zero_stage)
        notes.append(f"lora_rank not given: {said}")
    has, peft = model_targets(arch), engine is not None and engine.all_linear
    # the engine's default: Megatron-Bridge's four (those the model has), or on a PEFT engine all-linear, every linear
    # the model has, its other linears named (every_linear)
    hybrid = arch.layer_pattern is not None and engine is not None and bool(engine.hybrid_targets)
    targets = list(req.lora_targets or (all_linear_targets(arch) if peft else default_targets(arch, engine)))
    if req.lora_targets is None:
        skipped = [t for t in DEFAULT_TARGETS if t not in has]
        why = engine.hybrid_targets_why if hybrid and engine and engine.hybrid_targets_why else \
            engine.default_targets_why if engine and engine.default_targets_why else BRIDGE_TARGETS_WHY
        bridge = engine is None or engine.adapters == "fused"  # Megatron-Bridge's LoRA builds the adapters
        said = (f"; {', '.join(skipped)} skipped: {arch.name} has none" + (", and Megatron-Bridge only warns for a "
                "target that matches nothing" if bridge else "")) if skipped else ""
        notes.append("lora_targets not given: " + ", ".join(targets) + f" ({why}{said}).")
    if req.lora_vision is not None and arch.vision is None:
        notes.append(f"lora_vision={str(req.lora_vision).lower()}: {arch.name} has no vision tower; nothing changes.")
    spec = LoraSpec(rank=rank, targets=targets, vision=req.lora_vision is not False,
                    target_parameters=list(req.lora_target_parameters or []))
    if peft and peft_all_linear(arch, spec):
        others = list(dict.fromkeys(a.target for i in range(arch.num_layers) for a in other_linears(arch, i)))
        if others:
            notes.append(f"LoRA on {arch.name}'s other linears too: {', '.join(others)} (every target is "
                         "written as PEFT's all-linear, which adapts every nn.Linear but the output head).")
    elif peft and every_linear(arch, spec):
        notes.append(f"LoRA target_modules on {arch.name}: the projections by name, not PEFT's all-linear (its "
                     "router is an nn.Linear whose forward returns (scores, logits), Llama4Router: all-linear wraps it "
                     "and the LoRA layer's forward fails on the tuple); the router gets no adapter.")
    if (arch.moe is not None and engine is not None and engine.experts == "none" and not spec.target_parameters
            and {"linear_fc1", "linear_fc2"} & set(targets)):
        notes.append(f"LoRA on {arch.name}'s routed experts: none ({engine.experts_why}); linear_fc1 / linear_fc2 "
                     "adapt its dense and shared-expert MLPs only.")
    return spec


def default_rank(card: FrameworkCard, zero_stage: int) -> tuple[int, str]:
    """The rank a LoRA job runs when lora_rank is left out, and a sentence saying which default it is and where it is
    read: the card entry (cards/frameworks/<name>.yaml lora.<engine>.default_rank) and its source. A framework with
    no LoRA on this engine takes the default of the first framework, in FRAMEWORKS' order, that runs LoRA (the one
    rule LORA001's fix names first: Megatron-Bridge's today), said so; LORA001 refuses the job."""
    engine_name = card.engine_at(zero_stage)
    engine, home = lora_engines(card).get(engine_name), card
    if engine is None:
        home = next(c for c in (framework_card(f) for f in FRAMEWORKS) if lora_engines(c))
        engine_name, engine = next(iter(lora_engines(home).items()))
    where = f"cards/frameworks/{home.name}.yaml lora.{engine_name}.default_rank"
    whose = (f"{card.display_name}'s default on its {engine_name} engine" if home is card else
             f"{home.display_name}'s default, as {card.display_name} has no LoRA on its {card.engine_at(zero_stage)} "
             "engine")
    return engine.default_rank, f"{engine.default_rank}, {whose} ({where}; source: {engine.default_rank_why})."
BRIDGE_TARGETS_WHY = "Megatron-Bridge's LoRA target_modules default"
"""Where the default targets come from on an engine whose card names no other (LoraEngine.default_targets_why)."""


def base_tensors(job: Job, tensors: list[StateTensor]) -> list[StateTensor]:
    """The state tensors the base parameters keep: all of the convention's, or for a LoRA job (a frozen base) its
    weights only. The search's memory floors call it, so a LoRA job is not pruned on states it does not hold."""
    return tensors if job.lora is None else [t for t in tensors if t.tensor_class == "weights"]


# --------------------------------------------------------------------------- adapter shapes


class Adapted(BaseModel):
    """One adapted linear of a layer at full (unsharded) width: A is in x r (`a_inputs` A's), B is r x out."""

    target: str
    inputs: int
    outputs: int
    a_copies: int = Field(1, description="How many A matrices (per_projection: q/k/v or gate/up each have one)")
    expert: bool = False  # a routed-expert linear: sharded by etp (and ep, per_expert), its copies per expert
    column: bool = Field(False, description="Column-parallel under TP (its output split), else row-parallel or "
                                            "whole: how the adapter's GEMMs split (estimate/lora_gemms.py)")
    gathers: bool = Field(False, description="The base is a column-parallel linear of the layer's sequence-sharded "
                                             "input (linear_qkv, a dense or shared-expert linear_fc1, in_proj): under "
                                             "sequence parallelism Megatron-Bridge's adapter keeps that input "
                                             "all-gathered (adapter_activation_bytes)")

    def params(self, rank: int) -> int:
        return rank * (self.a_copies * self.inputs + self.outputs)


def model_targets(arch: Architecture) -> set[str]:
    """The LoRA targets the model has: MLA attention has no fused linear_qkv but its own q/kv linears
    (mla_linears); a router or shared_expert_gate transformers builds as an nn.Linear (other_linears); a hybrid, those
    of the layer kinds its pattern holds (kind_targets)."""
    has = set(DEFAULT_TARGETS) if arch.mla is None else set(DEFAULT_TARGETS) - {"linear_qkv"}
    if arch.layer_pattern is not None:
        has = {t for kind in set(arch.layer_pattern) for t in kind_targets(kind)} & (has | set(MAMBA_TARGETS))
    return has | other_targets(arch)


def kind_targets(kind: str) -> tuple[str, ...]:
    """The target names a layer of this kind holds (Architecture.layer_kind): a hybrid's Mamba-2 layer its mixer's
    in_proj and out_proj, its attention layer linear_qkv and linear_proj, its MLP and MoE layers linear_fc1 and
    linear_fc2; a transformer layer ('block') attention's and the MLP's."""
    attention, mlp = ("linear_qkv", "linear_proj"), ("linear_fc1", "linear_fc2")
    return {"M": MAMBA_TARGETS, "*": attention, "-": mlp, "E": mlp}.get(kind, attention + mlp)


def default_targets(arch: Architecture, engine: LoraEngine | None) -> list[str]:
    """The targets a job on Megatron-Bridge's LoRA adapts when it names none, those the model has: the LoRA
    dataclass's four, or on a hybrid the engine's hybrid recipes' (LoraEngine.hybrid_targets: Bridge's add the Mamba-2
    mixer's in_proj and out_proj)."""
    has = model_targets(arch)
    named = engine.hybrid_targets if arch.layer_pattern is not None and engine and engine.hybrid_targets \
        else DEFAULT_TARGETS
    return [t for t in TARGETS if t in named and t in has]


def all_linear_targets(arch: Architecture) -> list[str]:
    """PEFT's all-linear as target names: every linear the model has (model_targets), in TARGETS' order."""
    has = model_targets(arch)
    return [t for t in TARGETS if t in has]


def other_targets(arch: Architecture) -> set[str]:
    """The target names of the model's other linears (other_linears' in any layer: MLA's in every layer, the router
    and shared_expert_gate in its MoE layers)."""
    names = {a.target for a in mla_linears(arch)}
    if arch.moe is not None and arch.moe.moe_layers:
        names |= {"shared_expert_gate"} if arch.moe.shared_expert_gate else set()
        names |= {"router"} if arch.moe.router_linear else set()
    return names


def every_linear(arch: Architecture, spec: LoraSpec) -> bool:
    """Whether the targets name every linear the model has (model_targets: the four it has and its other linears,
    MLA's, a router or shared_expert_gate built as an nn.Linear): what the PEFT engines write as all-linear
    (adapters/lora.py hf_targets, unless peft_all_linear says it cannot run), and what their default and a file's
    all-linear resolve to; a list short of one (all-linear less the router, read from a file's exclude_modules) is
    written as the projections it names."""
    return model_targets(arch) <= set(spec.targets)


def peft_all_linear(arch: Architecture, spec: LoraSpec) -> bool:
    """Whether a PEFT engine's target_modules is written as all-linear: every target (every_linear), unless the model
    has a router that is an nn.Linear returning a tuple (MoESpec.router_returns_tuple, Llama 4): all-linear wraps every
    nn.Linear (peft 0.18.1 tuners/tuners_utils.py _maybe_include_all_linear_layers: isinstance(module, nn.Linear)),
    and lora.Linear's forward adds its delta to the base layer's result, which fails on (scores, logits); there the
    projections are named instead (adapters/lora.py hf_targets), which adapt no router."""
    return every_linear(arch, spec) and not (arch.moe is not None and arch.moe.router_returns_tuple)


def mla_linears(arch: Architecture) -> list[Adapted]:
    """MLA attention's q/kv linears at full width (none without MLA), the same in Megatron-Core (MLASelfAttention:
    linear_q_down_proj h -> q_lora_rank and linear_q_up_proj q_lora_rank -> heads x (nope + rope), or linear_q_proj
    without a q_lora_rank; linear_kv_down_proj h -> kv_lora_rank + rope; linear_kv_up_proj kv_lora_rank -> heads x
    (nope + v)) and in transformers' and NeMo AutoModel's DeepSeek code (q_a_proj, q_b_proj or q_proj,
    kv_a_proj_with_mqa, kv_b_proj: adapters/lora.py HF_PROJECTIONS). Megatron-Bridge's adapter of each is r(in + out)
    split over TP whether or not the base linear is (peft/utils.py ParallelLinearAdapter: A and B both
    ColumnParallelLinear for a duplicated base)."""
    if arch.mla is None:
        return []
    h, mla, heads = arch.hidden_size, arch.mla, arch.num_attention_heads
    qk = mla.qk_head_dim
    if mla.q_lora_rank:
        out = [Adapted(target="linear_q_down_proj", inputs=h, outputs=mla.q_lora_rank, column=True),
               Adapted(target="linear_q_up_proj", inputs=mla.q_lora_rank, outputs=heads * qk, column=True)]
    else:
        out = [Adapted(target="linear_q_proj", inputs=h, outputs=heads * qk, column=True)]
    return [*out, Adapted(target="linear_kv_down_proj", inputs=h, outputs=mla.kv_lora_rank + mla.qk_rope_head_dim,
                          column=True),
            Adapted(target="linear_kv_up_proj", inputs=mla.kv_lora_rank,
                    outputs=heads * (mla.qk_nope_head_dim + mla.v_head_dim), column=True)]


def other_linears(arch: Architecture, index: int) -> list[Adapted]:
    """The nn.Linear modules of decoder layer `index` in transformers' code (5.9.0) that none of Megatron-Bridge's
    default four names, which PEFT's all-linear adapts too (every nn.Linear but the output head: peft 0.18.1
    tuners/tuners_utils.py _maybe_include_all_linear_layers): MLA's projections (mla_linears), Qwen2-MoE's
    shared_expert_gate (Linear(h, 1)) and a router built as a Linear(h, experts) (MoESpec.router_linear)."""
    h, out = arch.hidden_size, mla_linears(arch)
    if arch.is_moe_layer(index):
        assert arch.moe is not None
        if arch.moe.shared_expert_gate:
            out.append(Adapted(target="shared_expert_gate", inputs=h, outputs=1))
        if arch.moe.router_linear:
            out.append(Adapted(target="router", inputs=h, outputs=arch.moe.num_experts))
    return out


_ADAPTERS: IdentityMemo[tuple[Adapted, ...]] = IdentityMemo()
_CLASSES: IdentityMemo[tuple[tuple[int, int], ...]] = IdentityMemo()


def layer_adapters(arch: Architecture, index: int, spec: LoraSpec, engine: LoraEngine | None) -> tuple[Adapted, ...]:
    """_layer_adapters once per architecture, spec, engine and layer class (layer_classes): the memory and time of a
    LoRA job's every stage read them."""
    return _ADAPTERS.get((arch, spec, engine), (arch.layer_kind(index), arch.is_moe_layer(index)),
                         lambda: tuple(_layer_adapters(arch, index, spec, engine)))


def _layer_adapters(arch: Architecture, index: int, spec: LoraSpec, engine: LoraEngine | None) -> list[Adapted]:
    """The adapted linears of decoder layer `index` on `engine` (None: Megatron-Bridge's layout). Megatron-Core's
    linear_qkv is h -> (heads + 2 kv heads) x head_dim, linear_proj heads x head_dim (MLA: x v_head_dim) -> h,
    linear_fc1 h -> (2 if gated) x ffn and linear_fc2 ffn -> h, for the dense MLP, the shared experts and (as expert
    linears) the routed experts, unless the engine adapts no routed expert (LoraEngine.experts none); and the layer's
    other linears (other_linears) the targets name: MLA's q/kv linears on any engine, the router and
    shared_expert_gate on a PEFT one (rule LORA003), every one of them where a PEFT engine runs all-linear
    (resolve_lora names them all, every_linear)."""
    h, per = arch.hidden_size, engine is not None and engine.adapters == "per_projection"
    gated = 2 if arch.gated_mlp else 1
    held = set(kind_targets(arch.layer_kind(index))) | set(MLA_TARGETS) | set(PEFT_TARGETS)
    targets = [t for t in spec.targets if t in held]
    if arch.layer_kind(index) == "M":
        return mamba_adapters(arch, targets)
    spec = spec.model_copy(update={"targets": targets})
    out: list[Adapted] = []
    if "linear_qkv" in spec.targets and arch.mla is None:
        out.append(Adapted(target="linear_qkv", inputs=h, a_copies=3 if per else 1, column=True, gathers=True,
                           outputs=(arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim))
    if arch.layer_kind(index) in ("*", "block"):
        out += [a for a in other_linears(arch, index) if a.target in spec.targets]
    elif arch.is_moe_layer(index):  # a hybrid's MoE layer: its router and shared_expert_gate, no attention
        out += [a for a in other_linears(arch, index) if a.target in spec.targets and a.target in PEFT_TARGETS]
    if "linear_proj" in spec.targets:
        width = arch.mla.v_head_dim if arch.mla is not None else arch.head_dim
        out.append(Adapted(target="linear_proj", inputs=arch.num_attention_heads * width, outputs=h))
    mlps: list[tuple[int, bool]] = []
    if arch.is_moe_layer(index):
        assert arch.moe is not None
        if engine is None or engine.experts != "none":
            mlps.append((arch.moe.expert_ffn_hidden_size, True, arch.moe.expert_width(h)))
        if arch.moe.shared_expert_ffn_hidden_size:
            mlps.append((arch.moe.shared_expert_ffn_hidden_size, False, h))
    else:
        mlps.append((arch.ffn_hidden_size, False, h))
    for width, expert, side in mlps:  # side: the width a latent MoE's routed experts read and write
        if "linear_fc1" in spec.targets:
            out.append(Adapted(target="linear_fc1", inputs=side, outputs=gated * width, expert=expert,
                               a_copies=gated if per else 1, column=True, gathers=not expert))
        if "linear_fc2" in spec.targets:
            out.append(Adapted(target="linear_fc2", inputs=width, outputs=side, expert=expert))
    return out


def mamba_adapters(arch: Architecture, targets: list[str]) -> list[Adapted]:
    """The adapted linears of a hybrid's Mamba-2 layer (MAMBA_TARGETS): in_proj h -> 2 d_inner + 2 n_groups x
    state_size + heads (z, x, B, C, dt; column-parallel) and out_proj d_inner -> h (row-parallel), one adapter each
    (Megatron-Bridge's ParallelLinearAdapter over the whole fused in_proj)."""
    m = arch.mamba
    assert m is not None
    h, out = arch.hidden_size, []
    if "in_proj" in targets:
        out.append(Adapted(target="in_proj", inputs=h, column=True, gathers=True,
                           outputs=2 * m.d_inner + 2 * m.n_groups * m.state_size + m.num_heads))
    if "out_proj" in targets:
        out.append(Adapted(target="out_proj", inputs=m.d_inner, outputs=h))
    return out


def mtp_adapters(arch: Architecture, spec: LoraSpec, engine: LoraEngine | None) -> list[Adapted]:
    """The adapted linears of the model's MTP blocks, all of them (none where the engine's LoRA reaches no MTP block,
    LoraEngine.adapts_mtp; engine None is Megatron-Bridge's, which does). Megatron-Core builds each block's
    mtp_model_layer from the decoder's last layer spec (megatron-core 0.19.2 models/gpt/gpt_layer_specs.py
    get_gpt_mtp_block_spec_for_backend: spec.layer_specs[-1]; transformer/multi_token_prediction.py
    MultiTokenPredictionLayer), and Megatron-Bridge's LoRA matches a bare target name against every module's name
    (peft/module_matcher.py: name == pattern), so mtp.layers.<k>.mtp_model_layer's linears are adapted as the last
    decoder layer's are; its eh_proj (2h -> h) is no default target."""
    if not arch.num_mtp_layers or not (engine is None or engine.adapts_mtp):
        return []
    if arch.mtp_layer_pattern is not None:  # a hybrid's block: one layer per character, each that kind's first
        assert arch.layer_pattern is not None
        block = [a for kind in arch.mtp_layer_pattern
                 for a in layer_adapters(arch, arch.layer_pattern.index(kind), spec, engine)]
        return block * mtp_weight_blocks(arch)
    return list(layer_adapters(arch, arch.num_layers - 1, spec, engine)) * mtp_weight_blocks(arch)


def vision_adapters(arch: Architecture, spec: LoraSpec) -> list[Adapted]:
    """The adapted linears of the model's vision tower where an engine builds it (Architecture.vision, Llama 4's; the
    caller says whether, memory_terms.vision_built): the PEFT engines name Llama 4's projections (adapters/lora.py
    hf_targets: never all-linear, its router forbids it), and the vision encoder's attention has modules of those
    names, q_proj, k_proj, v_proj (linear_qkv) and o_proj (linear_proj), h -> heads x head_dim with biases
    (transformers 5.9.0 Llama4VisionAttention), so PEFT adapts them in every encoder layer; its MLP (fc1, fc2), the
    pixel-shuffle MLP, the patch embedding's linear and the projector's linear_1 match no name meshplan writes. On
    text-only data the tower never runs, so these adapters, like the tower, get no gradient and no optimizer state
    (torch's optimizers skip a parameter whose grad is None): weights only."""
    v = arch.vision
    if v is None or not spec.vision:  # exclude_modules leaves the tower out (LoraSpec.vision)
        return []
    width = v.num_heads * (v.hidden_size // v.num_heads)
    out = []
    if "linear_qkv" in spec.targets:
        out += [Adapted(target="linear_qkv", inputs=v.hidden_size, outputs=width)] * 3  # q, k, v_proj each
    if "linear_proj" in spec.targets:
        out.append(Adapted(target="linear_proj", inputs=width, outputs=v.hidden_size))
    return out * v.num_layers


def layer_classes(arch: Architecture, layers: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """(first index, how many) of each class of `layers` that layer_adapters tells apart: it reads a layer's index only
    through its kind and whether it is an MoE layer, so a stage's or the model's adapters are each class's times its
    count (the search asks this for thousands of stages)."""
    layers = tuple(layers)
    return _CLASSES.get((arch,), layers, lambda: _layer_classes(arch, layers))


def _layer_classes(arch: Architecture, layers: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    classes: dict[tuple[str, bool], list[int]] = {}
    for i in layers:
        key = (arch.layer_kind(i), arch.is_moe_layer(i))
        if key in classes:
            classes[key][1] += 1
        else:
            classes[key] = [i, 1]
    return tuple((first, count) for first, count in classes.values())


def adapter_params(arch: Architecture, layers: list[int], spec: LoraSpec, engine: LoraEngine | None, *, tp: int,
                   ep: int, etp: int, mtp: bool = False) -> tuple[float, float]:
    """(dense, expert) adapter parameters one rank of a stage holding `layers` (and, with `mtp`, the model's MTP
    blocks: mtp_adapters) keeps; the vision tower's (vision_adapters) are weights only, held beside its own
    (estimate/memory_terms.vision_weight_bytes). Megatron-Bridge's
    ParallelLinearAdapter shards both matrices over TP (peft/utils.py): for a column-parallel base, A is a
    ColumnParallelLinear(in, r) (r split) and B a ColumnParallelLinear(r, out) (out split); for a row-parallel base,
    A is a RowParallelLinear(in, r) (in split) and B a ColumnParallelLinear(r, out) (out split): r(in + out)/tp
    either way. A routed expert linear is sharded over etp: shared (share_expert_adapters, the default) it is one
    adapter per layer on every EP rank, its gradient all-reduced over EP; per_expert, one per local expert. PEFT's
    ParamWrappers on the experts' 3D weights (LoraSpec.target_parameters, arithmetic/param_wrapper.py) are one adapter
    per expert, counted with the expert parameters."""
    shared = engine is None or engine.experts == "shared"
    dense = expert = 0.0
    if spec.target_parameters:  # PEFT's ParamWrappers: one adapter per expert, the local experts' over etp
        assert arch.moe is not None
        expert += sum(w.params(spec.rank, arch.moe.num_experts) for i in layers
                      for w in wrapped(arch, i, spec.target_parameters)) / ep / etp
    groups = [(count, layer_adapters(arch, first, spec, engine)) for first, count in layer_classes(arch, layers)]
    if mtp:
        groups.append((1, mtp_adapters(arch, spec, engine)))
    for count, adapted in groups:
        kind_dense = kind_expert = 0.0
        for a in adapted:
            if not a.expert:
                kind_dense += a.params(spec.rank) / tp
            elif shared:
                kind_expert += a.params(spec.rank) / etp
            else:
                assert arch.moe is not None
                kind_expert += arch.moe.num_experts / ep * a.params(spec.rank) / etp
        dense += count * kind_dense
        expert += count * kind_expert
    return dense, expert


def total_adapter_params(arch: Architecture, spec: LoraSpec, engine: LoraEngine | None = None) -> int:
    """Adapter parameters of the whole model, its MTP blocks' where the engine adapts them (shared expert adapters
    counted once per layer)."""
    dense, expert = adapter_params(arch, list(range(arch.num_layers)), spec, engine, tp=1, ep=1, etp=1, mtp=True)
    return int(dense + expert)


# --------------------------------------------------------------------------- activations


class AdapterSaves(NamedTuple):
    """What of one adapted linear decides the activations its adapter keeps (hashable, for the memory's caches)."""

    inputs: int     # the base's input width
    a_copies: int   # A matrices, each with its own rank-r output (PEFT's q/k/v, gate/up)
    expert: bool    # a routed-expert linear: its rows are the routed token copies
    gathers: bool   # Adapted.gathers
    mlp: bool       # linear_fc1 / linear_fc2: what Megatron's mlp / moe recompute module re-runs


def adapter_saves(arch: Architecture, index: int, spec: LoraSpec,
                  engine: LoraEngine | None) -> tuple[AdapterSaves, ...]:
    """The adapters of decoder layer `index` (layer_adapters) as adapter_activation_bytes reads them."""
    return tuple(AdapterSaves(a.inputs, a.a_copies, a.expert, a.gathers, a.target in ("linear_fc1", "linear_fc2"))
                 for a in layer_adapters(arch, index, spec, engine))


def adapter_activation_bytes(saves: tuple[AdapterSaves, ...], rank: int, style: str, *, tokens: float,
                             routed_rows: float, tp: int, sp: bool, fp8: bool) -> float:
    """Bytes one layer's adapters keep for their backward per micro-batch on one GPU, beyond what the frozen base's
    layer keeps (arithmetic/activations.py), bf16, by the engine's LoraEngine.adapter_saves:

    - every adapter: the rank-r output of each of its A matrices, kept by B (`tokens` rows, a routed expert's
      `routed_rows`), whole on every TP rank: Megatron-Bridge's linear_in is a ColumnParallelLinear with
      gather_output=True or a RowParallelLinear whose output is all-reduced (peft/utils.py ParallelLinearAdapter);
      PEFT's lora_B(lora_A(x)) keeps lora_A's output, one per projection (a_copies);
    - parallel_adapter, a base of the sequence-sharded input (AdapterSaves.gathers) under sequence parallelism with
      tp > 1: the all-gathered input (tokens x inputs) linear_in keeps, a tensor beside the local shard the
      layernorm-fused base keeps (Transformer Engine layernorm_linear.py: with return_layernorm_output it saves
      ln_out even for a frozen weight; return_layernorm_output_gathered hands the adapter the gathered copy), or
      that a column-parallel base gathers itself; under fp8 without SP, the bf16 input beside the base's fp8 copy.
    Nothing else: linear_in's input is otherwise the base's own input tensor, which layer_activations counts once,
    and a frozen base keeps no input of its own (Megatron-Core LinearWithFrozenWeight saves the weight only; Transformer
    Engine's _Linear saves its input only if weight.requires_grad; torch's mm keeps mat1 only for mat2's gradient), so
    a row-parallel adapter's input (the attention output flash keeps, the fc2 input) is the tensor counted there.
    LoRA dropout is off on every engine meshplan renders (Megatron-Bridge's LoRA.dropout, PEFT's lora_dropout and
    AutoModel's dropout all default to 0.0, an Identity), so no mask."""
    total = 0.0
    for a in saves:
        total += BF16 * (routed_rows if a.expert else tokens) * rank * a.a_copies
        if style == "parallel_adapter" and a.gathers and ((sp and tp > 1) or fp8):
            total += BF16 * tokens * a.inputs
    return total


# --------------------------------------------------------------------------- FLOPs

# A frozen linear's backward computes only the input gradient: forward + data gradient = 2 of the 3 forward-sized
# GEMMs of a trained linear (no weight-gradient GEMM). Megatron-Bridge's LoRA FLOP count does the same
# (src/megatron/bridge/training/utils/flop_utils.py: model_flops_frozen * 2/3 + the attention core in full).
FROZEN_PASSES_PER_FORWARD = 2.0


def adapter_flops_per_token(arch: Architecture, spec: LoraSpec, engine: LoraEngine | None = None) -> float:
    """Forward + backward FLOPs of the adapters per token: 6 per adapter parameter a token passes (a routed token
    passes its top-k experts' adapters, the same shared adapter top-k times), the MTP blocks' too where the engine
    adapts them (mtp_adapters), as model_flops_per_token counts the MTP blocks' own linears; and PEFT's ParamWrappers'
    (LoraSpec.target_parameters): the wrapped experts' weight gradients per routed token (their delta's einsum runs
    per micro-batch, not per token: param_wrapper_flops, which the step's report adds)."""
    groups = [(count, layer_adapters(arch, first, spec, engine))
              for first, count in layer_classes(arch, range(arch.num_layers))]
    groups.append((1, mtp_adapters(arch, spec, engine)))
    wrapper_per_token = param_wrapper_flops(arch, spec.rank, tuple(spec.target_parameters))[0]
    return (6.0 * sum(count * a.params(spec.rank) * (arch.moe.top_k if a.expert and arch.moe else 1)
                      for count, adapted in groups for a in adapted)
            + wrapper_per_token)


def lora_flops_per_token(arch: Architecture, seq_length: int, spec: LoraSpec,
                         engine: LoraEngine | None = None) -> float:
    """Model FLOPs of one LoRA training token: Megatron's formula with the frozen linears' weight gradients left
    out (the formula is linear in the sequence: its seq-independent part is the linears and logits, 6 FLOPs per
    weight, of which 2 are the weight gradient) plus the adapters, trained in full."""
    return frozen_flops_per_token(arch, seq_length) + adapter_flops_per_token(arch, spec, engine)


def frozen_flops_per_token(arch: Architecture, seq_length: int) -> float:
    """lora_flops_per_token without the adapters: Megatron's formula less the frozen linears' weight gradients (the
    search's ideal step time of a LoRA job reads it: any adapter only adds); a hybrid's Mamba-2 scan, sequence-free in
    the formula but no linear, keeps its backward whole."""
    full = model_flops_per_token(arch, seq_length)
    linear = model_flops_per_token(arch, 0) - TRAINING_PASSES_PER_FORWARD * mamba_scan_flops(arch) * scan_layers(arch)
    return full - linear * (1 - FROZEN_PASSES_PER_FORWARD / 3)


def scan_layers(arch: Architecture) -> int:
    """The Mamba-2 layers hybrid_flops counts a scan of: the pattern's M layers and those of each MTP depth's block
    (arithmetic/flops.py hybrid_flops_per_token); their scan is no weight's GEMM, so the frozen discount leaves it."""
    if arch.layer_pattern is None:
        return 0
    return (arch.layer_pattern + (arch.mtp_layer_pattern or "") * arch.num_mtp_layers).count("M")
