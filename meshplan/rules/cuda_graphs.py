"""The CUDA-graph rules of cards/rules.yaml (CG*): what Megatron-Core 0.19's TransformerConfig.__post_init__ refuses of
cuda_graph_impl and cuda_graph_modules beside the rest of the plan (CG001), and the MoE layers it cannot capture under
dropless routing (CG002), the moe and mlp graphs beside the EP overlap (CG003); and, first, a framework whose adapter
writes no CUDA-graph key (CG001)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meshplan.arithmetic.activations import DEFAULT_RECOMPUTE_MODULES
from meshplan.knowledge.cards import framework_card
from meshplan.rules.context import Context
from meshplan.rules.engine import Values, rule
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Plan

# The per-layer capture that leaves a dropless MoE layer's experts eager: the router, the dispatcher's preprocess
# and attention (Megatron-LM megatron/core/transformer/moe/README.md "CUDA Graph")
DROPLESS_MODULES = ["attn", "moe_router", "moe_preprocess"]


def _graphs_on(values: dict, job: object) -> tuple | None:
    """CG001's screen: it passes wherever the graphs are off; with them on, every field it reads decides."""
    if values["cuda_graph_impl"] == "none":
        return None
    return tuple(tuple(v) if isinstance(v := values[k], list) else v for k in CG_READS)


CG_READS = ("cuda_graph_impl", "cuda_graph_modules", "recompute", "recompute_modules", "dropout", "activation_offload")
# What a CUDA-graph rule's fix reads beside its verdict: every CUDA-graph rule run at each alternative (graph_fix)
CG_WORDS = (*CG_READS, "moe_a2a_overlap")


def captures_whole_layer(impl: str, modules: tuple[str, ...]) -> bool:
    """Whether every transformer layer is captured whole: a per-layer implementation with no modules named (the
    framework's 'full'), or the full-iteration graph (transformer_config.py: full_cudagraph)."""
    return impl == "full_iteration" or (impl != "none" and not modules)


@rule("CG001", reads=CG_READS, screen=_graphs_on, words=CG_WORDS)
def cuda_graph_asserts(ctx: Context) -> Values:
    """The first of Megatron-Core's CUDA-graph asserts the plan breaks, with a fix that works."""
    if ctx.plan.cuda_graph_impl == "none":
        return None
    found = _first_assert(ctx)
    return None if found is None else {"impl": ctx.plan.cuda_graph_impl, **found}


Alternative = tuple[str, dict[str, Any]]  # a fix's words and the plan change they make


def _modules(modules: Iterable[str]) -> tuple[str, dict[str, Any]]:
    """cuda_graph_modules set to `modules` as a fix words it (a `name="a,b"` value check --config applies: the list
    written whole), or dropped where none is left (no modules: the whole layer)."""
    kept = tuple(modules)
    if not kept:
        return "drop cuda_graph_modules", {"cuda_graph_modules": ()}
    return f'cuda_graph_modules="{",".join(kept)}"', {"cuda_graph_modules": kept}


def _without(p: Plan, drop: set[str]) -> tuple[str, dict[str, Any]]:
    return _modules(m for m in p.cuda_graph_modules if m not in drop)


def _first_assert(ctx: Context) -> dict[str, str] | None:
    """CG001's reason and fix: the first assert the plan breaks, its alternatives those at which no CUDA-graph rule
    refuses (graph_fix)."""
    found = _assert_alternatives(ctx)
    return None if found is None else {"reason": found[0], "fix": graph_fix(ctx, found[1])}


def _assert_alternatives(ctx: Context) -> tuple[str, list[Alternative]] | None:
    """The reason and the alternatives (words, plan change) of the first of Megatron-Core's CUDA-graph asserts the
    plan breaks: the framework first, then TransformerConfig.__post_init__'s asserts in its order. Each alternative
    names the change as check --config applies it (fix_changes: 'Drop the MoE modules from cuda_graph_modules' and
    'Keep one' named no value, so no edit)."""
    p, arch = ctx.plan, ctx.arch
    impl, modules = p.cuda_graph_impl, set(p.cuda_graph_modules)
    if impl == "none":
        return None
    card = ctx.card
    if card.adapter is None or not card.adapter.renders("cuda_graphs"):
        writes = [n for n in FRAMEWORKS if (c := framework_card(n)).adapter is not None
                  and c.adapter.renders("cuda_graphs")]
        off = "cuda_graph_impl=none" + (", drop cuda_graph_modules" if modules else "")
        return (f"{ctx.job.framework} has no Megatron-Core CUDA-graph setting meshplan renders",
                [(off, {"cuda_graph_impl": "none", "cuda_graph_modules": ()}), (", ".join(writes), {})])
    recompute = set(p.recompute_modules or DEFAULT_RECOMPUTE_MODULES) if p.recompute == "selective" else set()
    whole = captures_whole_layer(impl, p.cuda_graph_modules)
    if "moe" in modules and "moe_router" in modules:
        return ("cuda_graph_modules names both moe and moe_router",
                [_without(p, {"moe"}), _without(p, {"moe_router", "moe_preprocess"})])
    if impl == "transformer_engine" and "moe_preprocess" in modules and "moe_router" not in modules:
        return ("moe_preprocess is only captured together with moe_router",
                [_modules((*p.cuda_graph_modules, "moe_router")), _without(p, {"moe_preprocess"})])
    if not arch.is_moe and modules & {"moe", "moe_router", "moe_preprocess"}:
        return (f"{arch.name} has no MoE layers to capture (moe, moe_router, moe_preprocess)",
                [_without(p, {"moe", "moe_router", "moe_preprocess"})])
    if arch.is_moe and "mlp" in modules and len(arch.moe.moe_layers) == arch.num_layers:
        return (f"every layer of {arch.name} is MoE, and mlp captures a dense layer's MLP only",
                [_without(p, {"mlp"})])
    if p.recompute == "full" and impl != "full_iteration":
        whole_iteration = ("cuda_graph_impl=full_iteration" + (", drop cuda_graph_modules" if modules else ""),
                           {"cuda_graph_impl": "full_iteration", "cuda_graph_modules": ()})
        return ("full recompute runs only under the full-iteration graph",
                [("recompute=selective", {"recompute": "selective"}), whole_iteration])
    if impl == "transformer_engine" and "moe" in recompute and "moe_router" in modules:
        left = tuple(m for m in (p.recompute_modules or DEFAULT_RECOMPUTE_MODULES) if m != "moe")
        return ("'moe' recompute with the moe_router graph of Transformer Engine's implementation",
                [(f'recompute_modules="{",".join(left)}"', {"recompute_modules": left}),
                 ("cuda_graph_impl=local", {"cuda_graph_impl": "local"})])
    if p.dropout and recompute:
        attn = whole or "attn" in modules
        hidden = whole or "mlp" in modules or "moe" in modules
        if (attn and "core_attn" in recompute) or (hidden and recompute & {"mlp", "moe"}):
            return ("dropout inside a captured module that selective recompute replays (a graphed recompute takes "
                    "no random numbers)",
                    [("dropout=false", {"dropout": False}), _without(p, {"attn", "mlp", "moe"})])
    if p.activation_offload and impl == "local":
        return ("activation_offload offloads the dense modules' inputs too, and local graphs take fine-grained "
                "offloading of expert_fc1, moe_act and fused_group_mlp only",
                [("cuda_graph_impl=transformer_engine", {"cuda_graph_impl": "transformer_engine"}),
                 ("activation_offload=false", {"activation_offload": False})])
    if p.activation_offload and impl == "full_iteration":
        return ("activation_offload under the full-iteration graph needs "
                "fine_grained_offloading_max_inflight_offloads, which meshplan does not render",
                [("cuda_graph_impl=transformer_engine", {"cuda_graph_impl": "transformer_engine"}),
                 ("activation_offload=false", {"activation_offload": False})])
    return None


def _refused(ctx: Context, change: dict[str, Any]) -> list[Alternative] | None:
    """At the plan with `change`, the alternatives of the first CUDA-graph refusal left (CG001's assert, CG002's
    dropless capture, CG003's overlap), [] where one is left with none; None where none is."""
    at = Context(ctx.job, ctx.plan.model_copy(update=change))
    found = _assert_alternatives(at)
    if found is not None:
        return found[1]
    for alternatives in (_dropless_alternatives(at), _overlap_alternatives(at)):
        if alternatives is not None:
            return alternatives
    return None


def graph_fix(ctx: Context, alternatives: list[Alternative]) -> str:
    """A CUDA-graph rule's fix: of its alternatives, those at which no CUDA-graph rule refuses; an alternative that
    leaves another refusal comes with that refusal's first alternative which clears them all, changing other fields
    ('recompute=selective with cuda_graph_impl=transformer_engine': full recompute, then local graphs beside
    activation_offload); one clearing nothing, or cleared only by another alternative named alone, is left out, unless
    none clears (then all of them, as found). Another framework named (an empty change) stays as it is."""
    named = []
    for words, change in alternatives:
        left = _refused(ctx, change) if change else None
        if left is None:
            named.append(words)
            continue
        follow = next((w for w, c in left if c and not c.keys() & change.keys()
                       and _refused(ctx, change | c) is None), None)
        if follow is not None and follow not in (w for w, _ in alternatives):  # alone, it is named already
            named.append(f"{words} with {follow}")
    named = named or [words for words, _ in alternatives]
    return "Use " + ", or ".join(named) + "."


@rule("CG003", reads=("cuda_graph_impl", "cuda_graph_modules", "moe_a2a_overlap"), words=CG_WORDS)
def graphs_beside_ep_overlap(ctx: Context) -> Values:
    """Transformer Engine graphs of the moe or mlp module beside the EP overlap (overlap_moe_expert_parallel_comm):
    Megatron-Core asserts them apart. One of the rules that refuse moe_a2a_overlap (search/plans.OVERLAP_RULES)."""
    p = ctx.plan
    if not (p.moe_a2a_overlap and p.cuda_graph_impl == "transformer_engine"):
        return None
    named = [m for m in ("moe", "mlp") if m in p.cuda_graph_modules]
    if not named:
        return None
    return {"modules": " and ".join(named), "fix": graph_fix(ctx, _overlap_alternatives(ctx) or [])}


def _overlap_alternatives(ctx: Context) -> list[Alternative] | None:
    """CG003's alternatives where it refuses (None where it passes): the modules without moe and mlp, or the
    overlap off."""
    p = ctx.plan
    if not (p.moe_a2a_overlap and p.cuda_graph_impl == "transformer_engine") or \
            not {"moe", "mlp"} & set(p.cuda_graph_modules):
        return None
    return [_without(p, {"moe", "mlp"}), ("moe_a2a_overlap=false", {"moe_a2a_overlap": False})]


@rule("CG002", reads=("cuda_graph_impl", "cuda_graph_modules"), words=CG_WORDS)
def dropless_moe_capture(ctx: Context) -> Values:
    """MoE layers captured (moe, the whole layer, or the full iteration) where routing is dropless, as every
    meshplan plan routes: their token counts per expert change every step, so the graph cannot be replayed."""
    p, arch = ctx.plan, ctx.arch
    if p.cuda_graph_impl == "none" or not arch.is_moe:
        return None
    if "moe" in p.cuda_graph_modules:
        what = "cuda_graph_modules moe"
    elif captures_whole_layer(p.cuda_graph_impl, p.cuda_graph_modules):
        what = ("the full-iteration graph" if p.cuda_graph_impl == "full_iteration" else
                "the whole layer (no cuda_graph_modules)")
    else:
        return None
    return {"what": what, "fix": graph_fix(ctx, _dropless_alternatives(ctx) or [])[:-1]
            + " (the attention, router and the dispatcher's preprocess in graphs, the experts eager)."}


def _dropless_alternatives(ctx: Context) -> list[Alternative] | None:
    """CG002's alternative where it refuses (None where it passes): the per-layer graphs of the attention, the router
    and the dispatcher's preprocess, the experts eager."""
    p = ctx.plan
    if p.cuda_graph_impl == "none" or not ctx.arch.is_moe or not (
            "moe" in p.cuda_graph_modules or captures_whole_layer(p.cuda_graph_impl, p.cuda_graph_modules)):
        return None
    impl = "local" if p.cuda_graph_impl == "local" else "transformer_engine"
    words, change = _modules(DROPLESS_MODULES)
    return [(f"cuda_graph_impl={impl} with {words}", {"cuda_graph_impl": impl, **change})]
