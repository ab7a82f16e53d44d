"""The records the per-layer time model passes around: what it needs (LayerContext, computed once per estimate),
what it returns (LayerTime), and the counted constants every part of it shares.

The model itself is in layer_time.py; its parts (attention, context parallelism, TP overlap, MoE, recompute,
LoRA) each have their own module beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import NamedTuple

from meshplan.arithmetic.comm import Links
from meshplan.arithmetic.flops import Shard
from meshplan.arithmetic.fp8_casts import Fp8Casts
from meshplan.arithmetic.gemm import expert_ridge_rows
from meshplan.knowledge.calibration import Calibration
from meshplan.knowledge.cards import WorldSizeLaw
from meshplan.knowledge.lora_card import LoraEngine
from meshplan.schema.model import Architecture
from meshplan.schema.plan import PLAN_LIST_FIELDS, LoraSpec, Plan

BF16 = 2  # bytes per activation element on the wire
# Communication that runs once in the forward runs mirrored once in the backward (activations forward, their
# gradients backward; FSDP gathers the weights for each): a forward is half of it.
FORWARD_AND_BACKWARD = 2.0
# A gated fc1's output is two FFN widths (gate and up), what the SwiGLU's fp8 input store casts
GATED_FC1_WIDTHS = 2


class DispatchPasses(NamedTuple):
    """bf16 passes over the routed copies, forward + backward, that a token dispatcher runs beside its all-to-alls
    (moe_time.dispatcher_passes): over the rank's own copies (Megatron-Core's alltoall dispatcher's permute and
    unpermute) and over what it receives, every copy sent to each rank of the expert-TP group, etp x them (the
    alltoall dispatcher's chunk sort and unsort after its gather over that group, the flex dispatcher's backend's
    permutes)."""

    own: float
    received: float


@dataclass(frozen=True)
class TpSms:
    """The GPU's SMs and those its framework's TP overlap kernels hold beside each TP pair's GEMMs (attention's,
    the MLP's): the forward reduce-scatter's and the bulk dgrad reduce-scatter's (the card's tp_overlap)."""

    sms: int
    fprop_rs: tuple[int, int] = (0, 0)
    wgrad_rs: tuple[int, int] = (0, 0)
    wgrad_margin: bool = False


@dataclass(frozen=True, kw_only=True)
class LayerContext:
    """Everything the per-layer model needs, computed once per estimate (perf.layer_context builds it)."""

    arch: Architecture
    plan: Plan
    law: WorldSizeLaw  # the framework's world-size law: its rank order (mesh.mesh_groups)
    seq: int
    cal: Calibration
    lk: Links
    shard: Shard
    bf16_peak: float
    fp8_peak: float | None
    hbm: float
    flash: bool = True
    dropout: bool = False
    lora: LoraSpec | None = None  # a LoRA job's adapters (meshplan/arithmetic/lora.py); None: every weight trained
    lora_engine: LoraEngine | None = None
    a2a_steady_share: float = 0.0  # moe_a2a_overlap: the share of micro-batch chunks in the 1F1B steady state
    stacked_experts: bool = False  # MoE layers copy their local experts' weights each forward (stacks_experts)
    moe_host_syncs: float = 1.0  # device-to-host reads per MoE layer forward (moe_host_syncs: the dispatcher's)
    # bf16 passes over the routed copies the dispatcher runs beside its all-to-alls (moe_time.dispatcher_passes);
    # None: cards/calibration.yaml moe_dispatch_passes, half over the rank's own copies and half over etp x them
    dispatch_passes: DispatchPasses | None = None
    expert_launches: tuple[float, float] = (0.0, 0.0)  # (fwd, bwd) per-expert grouped-GEMM launches (expert_launches)
    eager: bool = False  # blocks run as eager PyTorch ops (a compile switch left off): eager_elementwise_passes
    hf_eager: bool = False  # transformers' modeling code run eagerly (the card's eager_model_code): hf_eager_* passes
    experts_fused: bool = False  # ... but the routed experts' activation is a fused kernel (compile.experts_fused)
    compiled: bool = False  # blocks run torch.compile'd (a compile switch on): one kernel per activation
    attention_fraction: float = 0.5  # of BF16 peak, the job's attention kernel on its GPU (attention_efficiency)
    attention_kernel: str | None = None  # that kernel's name (None: the shared fused-kernel fraction)
    routed_load: float = 1.0  # routed tokens on the most loaded EP rank over the mean (memory.ep_rank_load)
    consecutive_routing: bool = False  # Job.moe_fake_balanced_gate: consecutive experts (comm.consecutive_routing)
    gather_dispatch: bool = False  # the non-flex MoE dispatcher gathers the EP group's tokens (moe_time.gather_ep)
    ulysses: bool = False  # cp is Ulysses sequence parallelism on this engine (rules/context.runs_ulysses)
    torch_cp: bool = False  # cp is torch's context_parallel ring on this engine (rules/context.runs_torch_cp)
    kv_repeated: bool = False  # ... with K and V repeated to every query head before SDPA (context.ring_repeats_kv)
    mla_v_pad: bool = False  # MLA's V padded to the QK head width for flash attention (the convention's mla_v_pad)
    qkv_separate: bool = False  # Q, K, V as three linears (the convention's qkv_projections): op-level SAC counts each
    tp_overlap_mode: str = "fraction"  # which TP collectives run beside a GEMM (tp_overlap_mode; tp_hidden)
    tp_rs_splits: int = 0  # chunks of a pipelined forward reduce-scatter (the card's tp_overlap.rs_splits; 0: tp)
    tp_input_ops: tuple[tuple[int, int], ...] = ((1, 1), (1, 1))  # per TP pair (fwd, bwd) input-side collectives
    tp_input_regather: bool = False  # the column-parallel backward gathers its input again (backward_input_gather)
    tp_sms: TpSms | None = None  # SMs the TP communication kernels hold beside their GEMMs (tp_sms; tp_hidden)
    sp_copies: tuple[float, float] = (0.0, 0.0)  # copies per unfused SP all-gather, reduce-scatter (sp_copies)
    async_tp_unfused: tuple[bool, bool] = (False, False)  # per TP pair: async TP leaves its input grad's RS unfused
    # bytes per element of fc1's output the SwiGLU's fp8 input store's two casts move (memory_states.
    # swiglu_store_cast_bytes); 0 without it
    fp8_store_cast_bytes: float = 0.0
    # Megatron-Core's fused bias + activation runs the MLP's activation (Job.bias_activation_fusion); false: its
    # unfused glu(), activation_code's unfused_functions
    bias_activation_fusion: bool = True
    # the rotary embedding runs Megatron-Core's unfused ops (attention_time.runs_unfused_rope): unfused_rope_passes
    unfused_rope: bool = False
    fp8_casts: Fp8Casts | None = None  # Transformer Engine's FP8 quantize passes (fp8_casts.fp8_casts); None: none
    # the shared experts on their own stream beside the EP all-to-alls (adapter_knobs.shared_expert_overlap;
    # moe_time.shared_overlap_windows)
    shared_expert_overlap: bool = False

    @property
    def ridge_rows(self) -> float:
        return expert_ridge_rows(self.bf16_peak, self.hbm)


def activation_code(ctx: LayerContext, routed: bool) -> str:
    """Which code runs the layer's FFN activation (cards/calibration.yaml activation_passes.codes; the routed
    experts' where `routed`): transformers' eager model code; the routed experts' activation compiled where the
    framework compiles it whatever its blocks do (ctx.experts_fused); eager blocks; torch.compile'd blocks; else
    Megatron-Core's fused functions, or its unfused ones where the job turns bias_activation_fusion off."""
    if ctx.hf_eager:
        return "hf_eager"
    if routed and ctx.experts_fused:
        return "compiled"
    if ctx.eager:
        return "eager"
    if ctx.compiled:
        return "compiled"
    return "fused_functions" if ctx.bias_activation_fusion else "unfused_functions"


class ElementwiseLoad(NamedTuple):
    """What one layer's memory-bound work reads and writes per micro-batch: elements of its hidden-sized tensors
    (sequence-sharded under SP) and of its FFN activations by kind, and the MoE dispatcher's and router's bytes
    (forward + backward)."""

    hidden: float = 0.0
    routed_ffn: float = 0.0
    shared_ffn: float = 0.0
    dense_ffn: float = 0.0
    dispatch_bytes: float = 0.0
    router_bytes: float = 0.0
    weight_copy_bytes: float = 0.0  # the local experts' weights stacked each forward, read and written
    expert_bias: float = 0.0  # routed copies x hidden a per-expert fc2 bias loop passes over (biased experts)
    query: float = 0.0  # attention's query elements (heads x head width; transformers' eager code: hf_eager_*)
    key_value: float = 0.0  # its key and value elements
    normed: float = 0.0  # elements under a per-head Q/K norm or an MLA latent norm (fp32 RMSNorm in eager code)
    rotated: float = 0.0  # query and key elements an unfused rotary embedding passes over (unfused_rope)


@dataclass
class LayerTime:
    """Seconds for one layer, one micro-batch, forward + backward, on one rank."""

    gemm: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0
    overhead: float = 0.0
    tp: float = 0.0
    tp_fwd: float = 0.0  # forward share of tp (what full recompute repeats, the forward's overlap window)
    cp: float = 0.0
    cp_fwd: float = 0.0  # forward share of cp (what full recompute repeats)
    ep: float = 0.0
    recompute: float = 0.0
    fwd_compute: float = 0.0  # forward share of gemm + attention + elementwise (recompute, overlap windows)
    attention_fwd: float = 0.0  # forward of the attention core alone (what selective recompute repeats)
    op_sac_fwd: float = 0.0  # forward of what torchtitan's op-level SAC does not keep (what its recompute repeats)
    module_fwd: dict[str, float] = field(default_factory=dict)  # forward of what each Megatron recompute module repeats
    # (module_fwd, op_sac_fwd) to work out on their first read, where layer_time leaves them (recompute.
    # recomputed_forwards): only a selective recompute reads them (recompute_time), and most layers a search times
    # serve no such plan (its per-token references: a third of their layers' time on DeepSeek-V3). Read through
    # properties (_worked_out_on_read), so no reader sees them before they are worked out.
    later: Callable[[], tuple[dict[str, float], float]] | None = field(default=None, repr=False, compare=False)

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.elementwise + self.overhead


def _worked_out_on_read(name: str) -> property:
    """LayerTime's field `name` (module_fwd or op_sac_fwd) as a property: set as a field is (the dataclass's __init__
    sets it), read after LayerTime.later, if any, has given both (once: the same values on every read)."""
    own = "_" + name

    def read(self: LayerTime) -> object:
        fields_ = self.__dict__
        later = fields_.get("later")
        if later is not None:
            fields_["_module_fwd"], fields_["_op_sac_fwd"] = later()
            fields_["later"] = None
        return fields_[own]

    def write(self: LayerTime, value: object) -> None:
        self.__dict__[own] = value

    return property(read, write)


LayerTime.module_fwd = _worked_out_on_read("module_fwd")  # type: ignore[assignment]
LayerTime.op_sac_fwd = _worked_out_on_read("op_sac_fwd")  # type: ignore[assignment]


# --------------------------------------------------------------------------- one layer's time, shared across plans

PER_STEP_FIELDS = frozenset({"pp", "vpp", "dp", "zero_stage", "recompute", "recompute_layers", "recompute_method",
                             "first_stage_layers", "last_stage_layers", "pipeline_layout", "account_for_embedding",
                             "account_for_loss"})
"""Plan fields one layer's time (layer_time.layer_time) never reads: how the layers are split into stages, the ZeRO
stage, which layers recompute and how (stage_time applies recompute_time to the layer's forward shares), the data
parallel size. What they change reaches the layer only through LayerContext's own fields (flash and dropout from the
ZeRO stage's convention, the attention fraction, the all-to-all's steady share), which the key holds. So plans that
differ only in these share one layer's time; tests/test_layer_memo.py holds layer_time to it field by field."""

_PLAN_FIELDS = tuple(name for name in Plan.model_fields if name not in PER_STEP_FIELDS)
_OBJECT_FIELDS = ("arch", "cal", "lora", "lora_engine")  # unhashable or costly to hash: by identity, kept alive
_CONTEXT_FIELDS = tuple(f.name for f in fields(LayerContext) if f.name not in ("plan", *_OBJECT_FIELDS))
_PLAN_VALUES = itemgetter(*_PLAN_FIELDS)  # read from the fields' own dicts (a pydantic model's, a dataclass's)
_CONTEXT_VALUES = itemgetter(*_CONTEXT_FIELDS)
_LIST_AT = tuple(k for k, name in enumerate(_PLAN_FIELDS) if name in PLAN_LIST_FIELDS)
MOE_ONLY_FIELDS = frozenset({"ep", "etp", "moe_token_dispatcher", "moe_a2a_overlap"})
MOE_ONLY_CONTEXT = frozenset({"a2a_steady_share", "routed_load", "moe_host_syncs", "gather_dispatch", "experts_fused",
                              "stacked_experts", "expert_launches", "dispatch_passes", "shared_expert_overlap"})
"""Plan fields and LayerContext fields a dense layer's time (layer_time.layer_time(ctx, False)) without LoRA never
reads, beside PER_STEP_FIELDS, nor the shard's ep and etp: the expert grid, the dispatcher and its all-to-all's
overlap, the routed tokens' load, host syncs and grouped-GEMM launches, the routed experts' fused activation (an MoE
layer's own terms: its expert GEMMs, dispatch, expert TP, routed FFN elements). So a dense layer is shared by plans that
differ only in these (layer_key); tests/test_layer_memo.py holds it field by field. A LoRA job's dense key keeps them
all."""
_DENSE_PLAN_AT = tuple(k for k, name in enumerate(_PLAN_FIELDS) if name not in MOE_ONLY_FIELDS)
_DENSE_CONTEXT_AT = tuple(k for k, name in enumerate(_CONTEXT_FIELDS) if name not in MOE_ONLY_CONTEXT)
_SHARD_AT = _CONTEXT_FIELDS.index("shard")
# the dense key's parts read at C speed: the context's values before and after its shard (kept as tokens, tp, sp)
_DENSE_PLAN = itemgetter(*_DENSE_PLAN_AT)
_DENSE_BEFORE = itemgetter(*(k for k in _DENSE_CONTEXT_AT if k < _SHARD_AT), _SHARD_AT)
_DENSE_AFTER = itemgetter(*(k for k in _DENSE_CONTEXT_AT if k > _SHARD_AT))
MEMO_LIMIT = 1 << 14  # entries per scope: a search sees a few thousand distinct layers (bench/recommend_speed.py)


class LayerKey(NamedTuple):
    """What one layer's time depends on: the context's values, the plan's fields but PER_STEP_FIELDS, and the
    identity of the context's objects (architecture, calibration, LoRA), which a memo entry keeps alive. A tuple:
    hashed and compared at C speed (memo_layer finds one per estimate and layer kind)."""

    moe: bool
    context: tuple
    plan: tuple
    objects: tuple[int, ...]


def layer_key(ctx: LayerContext, moe: bool) -> LayerKey:
    """The key of one layer kind of this context: what it reads of the context, built once per context (an estimate
    asks for its dense and its MoE layer) and kept on it (frozen: it cannot change); a dense layer's without
    MOE_ONLY_FIELDS and MOE_ONLY_CONTEXT (its shard as tokens, tp and sp) unless the job has LoRA adapters."""
    parts = ctx.__dict__.get("_key_parts")
    if parts is None:
        plan = _PLAN_VALUES(ctx.plan.__dict__)
        if any(isinstance(plan[k], list) for k in _LIST_AT):  # a list field set: its values, as a tuple
            plan = tuple(tuple(v) if isinstance(v, list) else v for v in plan)
        parts = ctx.__dict__["_key_parts"] = (
            _CONTEXT_VALUES(ctx.__dict__), plan, tuple(id(ctx.__dict__[name]) for name in _OBJECT_FIELDS))
    if moe or ctx.lora is not None:
        return LayerKey(moe, *parts)
    dense = ctx.__dict__.get("_dense_parts")
    if dense is None:
        context, plan, objects = parts
        *before, shard = _DENSE_BEFORE(context)
        dense = ctx.__dict__["_dense_parts"] = (
            (*before, (shard.tokens, shard.tp, shard.sp), *_DENSE_AFTER(context)), _DENSE_PLAN(plan), objects)
    return LayerKey(False, *dense)


# LayerKey -> (objects, LayerTime), and scope_memo's named memos
_MEMO: ContextVar[dict | None] = ContextVar("layer_memo", default=None)


@contextmanager
def shared_layers() -> Iterator[None]:
    """Within it (one recommend, min-gpus or RL search: one request, so one set of cards and calibration), one layer's
    time is computed once per LayerKey and shared by every estimate that asks for it (memo_layer), as are the other
    estimates' named memos (scope_memo: a layout's memory terms, memory.layout_terms). Per context (a thread, an MCP
    call), bounded (MEMO_LIMIT), dropped on exit; nested scopes share the outer one. Outside any scope every estimate
    computes its own."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def scope_memo(name: str) -> dict | None:
    """The current shared_layers scope's memo `name` (the other estimates' own, beside the layers'), None outside a
    scope: made on first use, bounded (MEMO_LIMIT: cleared when full), dropped with the scope."""
    memo = _MEMO.get()
    if memo is None:
        return None
    own = memo.get(name)
    if own is None or len(own) >= MEMO_LIMIT:
        own = memo[name] = {}
    return own


def memo_layer(compute: Callable[[LayerContext, bool], LayerTime], ctx: LayerContext, moe: bool,
               overlapped: Callable[[LayerContext, LayerTime], LayerTime] | None = None) -> LayerTime:
    """compute(ctx, moe), once per LayerKey inside shared_layers (the same LayerTime object: no caller mutates it).
    `overlapped`: how an MoE layer whose plan overlaps its EP all-to-all is had from its plain twin's time (the key but
    the overlap and its steady share, plain_twin_key), used where the memo holds that twin (the search's references
    time a layer alone before its overlapped twin): layer_time.overlapped_twin."""
    memo = _MEMO.get()
    if memo is None:
        return compute(ctx, moe)
    try:
        key = layer_key(ctx, moe)
        hit = memo.get(key)
    except TypeError:  # a context field that cannot be hashed: computed, not shared
        return compute(ctx, moe)
    if hit is None:
        if len(memo) >= MEMO_LIMIT:
            memo.clear()
        plain = memo.get(plain_twin_key(key)) if overlapped is not None and moe and ctx.plan.moe_a2a_overlap \
            else None
        hit = memo[key] = (tuple(getattr(ctx, name) for name in _OBJECT_FIELDS),
                           compute(ctx, moe) if plain is None else overlapped(ctx, plain[1]))
    return hit[1]


_OVERLAP_AT, _STEADY_AT = _PLAN_FIELDS.index("moe_a2a_overlap"), _CONTEXT_FIELDS.index("a2a_steady_share")


def plain_twin_key(key: LayerKey) -> LayerKey:
    """The LayerKey of an MoE layer's plain twin: the same context and plan without moe_a2a_overlap, so with no steady
    share (perf.layer_context's 0.0 where the plan does not overlap)."""
    context, plan = list(key.context), list(key.plan)
    context[_STEADY_AT], plan[_OVERLAP_AT] = 0.0, False
    return LayerKey(key.moe, tuple(context), tuple(plan), key.objects)
