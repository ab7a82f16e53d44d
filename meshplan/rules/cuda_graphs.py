"""The CUDA-graph rules of cards/rules.yaml (CG*): what Megatron-Core 0.19's TransformerConfig.__post_init__ refuses of
cuda_graph_impl and cuda_graph_modules beside the rest of the plan (CG001), and the MoE layers it cannot capture under
dropless routing (CG002), the moe and mlp graphs beside the EP overlap (CG003); and, first, a framework whose adapter
writes no CUDA-graph key (CG001)."""

from __future__ import annotations

from meshplan.arithmetic.activations import DEFAULT_RECOMPUTE_MODULES
from meshplan.knowledge.cards import framework_card
from meshplan.rules.context import Context
from meshplan.rules.engine import Values, rule
from meshplan.schema.choices import FRAMEWORKS

# The per-layer capture that leaves a dropless MoE layer's experts eager: the router, the dispatcher's preprocess
# and attention (Megatron-LM megatron/core/transformer/moe/README.md "CUDA Graph")
DROPLESS_MODULES = ["attn", "moe_router", "moe_preprocess"]


def _graphs_on(values: dict, job: object) -> tuple | None:
    """CG001's screen: it passes wherever the graphs are off; with them on, every field it reads decides."""
    if values["cuda_graph_impl"] == "none":
        return None
    return tuple(tuple(v) if isinstance(v := values[k], list) else v for k in CG_READS)


CG_READS = ("cuda_graph_impl", "cuda_graph_modules", "recompute", "recompute_modules", "dropout", "activation_offload")


def captures_whole_layer(impl: str, modules: tuple[str, ...]) -> bool:
    """Whether every transformer layer is captured whole: a per-layer implementation with no modules named (the
    framework's 'full'), or the full-iteration graph (transformer_config.py: full_cudagraph)."""
    return impl == "full_iteration" or (impl != "none" and not modules)


@rule("CG001", reads=CG_READS, screen=_graphs_on)
def cuda_graph_asserts(ctx: Context) -> Values:
    """The first of Megatron-Core's CUDA-graph asserts the plan breaks, with a fix that works."""
    if ctx.plan.cuda_graph_impl == "none":
        return None
    found = _first_assert(ctx)
    return None if found is None else {"impl": ctx.plan.cuda_graph_impl, **found}


def _first_assert(ctx: Context) -> dict[str, str] | None:
    """CG001's reason and fix: the framework first, then TransformerConfig.__post_init__'s asserts in its order."""
    p, arch = ctx.plan, ctx.arch
    impl, modules = p.cuda_graph_impl, set(p.cuda_graph_modules)
    card = ctx.card
    if card.adapter is None or not card.adapter.renders("cuda_graphs"):
        writes = [n for n in FRAMEWORKS if (c := framework_card(n)).adapter is not None
                  and c.adapter.renders("cuda_graphs")]
        return {"reason": f"{ctx.job.framework} has no Megatron-Core CUDA-graph setting meshplan renders",
                "fix": f"Leave cuda_graph_impl out, or use {', '.join(writes)}."}
    recompute = set(p.recompute_modules or DEFAULT_RECOMPUTE_MODULES) if p.recompute == "selective" else set()
    whole = captures_whole_layer(impl, p.cuda_graph_modules)
    if "moe" in modules and "moe_router" in modules:
        return {"reason": "cuda_graph_modules names both moe and moe_router",
                "fix": "Keep one: moe_router (the router, with moe_preprocess the dispatcher's preprocess) or moe."}
    if impl == "transformer_engine" and "moe_preprocess" in modules and "moe_router" not in modules:
        return {"reason": "moe_preprocess is only captured together with moe_router",
                "fix": "Add moe_router to cuda_graph_modules, or drop moe_preprocess."}
    if not arch.is_moe and modules & {"moe", "moe_router", "moe_preprocess"}:
        return {"reason": f"{arch.name} has no MoE layers to capture (moe, moe_router, moe_preprocess)",
                "fix": "Drop the MoE modules from cuda_graph_modules (attn, mlp capture a dense layer)."}
    if arch.is_moe and "mlp" in modules and len(arch.moe.moe_layers) == arch.num_layers:
        return {"reason": f"every layer of {arch.name} is MoE, and mlp captures a dense layer's MLP only",
                "fix": "Drop mlp from cuda_graph_modules (moe_router captures an MoE layer's router)."}
    if p.recompute == "full" and impl != "full_iteration":
        return {"reason": "full recompute runs only under the full-iteration graph",
                "fix": "Use recompute=selective, or cuda_graph_impl=full_iteration (no modules)."}
    if impl == "transformer_engine" and "moe" in recompute and "moe_router" in modules:
        return {"reason": "'moe' recompute with the moe_router graph of Transformer Engine's implementation",
                "fix": "Drop 'moe' from recompute_modules (moe_act is allowed), or use cuda_graph_impl=local."}
    if p.dropout and recompute:
        attn = whole or "attn" in modules
        hidden = whole or "mlp" in modules or "moe" in modules
        if (attn and "core_attn" in recompute) or (hidden and recompute & {"mlp", "moe"}):
            return {"reason": "dropout inside a captured module that selective recompute replays (a graphed "
                              "recompute takes no random numbers)",
                    "fix": "Use dropout=false, or leave the recomputed modules out of the graphs "
                           "(cuda_graph_modules without attn / mlp / moe)."}
    if p.activation_offload and impl == "local":
        return {"reason": "activation_offload offloads the dense modules' inputs too, and local graphs take "
                          "fine-grained offloading of expert_fc1, moe_act and fused_group_mlp only",
                "fix": "Use cuda_graph_impl=transformer_engine, or activation_offload=false."}
    if p.activation_offload and impl == "full_iteration":
        return {"reason": "activation_offload under the full-iteration graph needs "
                          "fine_grained_offloading_max_inflight_offloads, which meshplan does not render",
                "fix": "Use cuda_graph_impl=transformer_engine, or activation_offload=false."}
    return None


@rule("CG003", reads=("cuda_graph_impl", "cuda_graph_modules", "moe_a2a_overlap"))
def graphs_beside_ep_overlap(ctx: Context) -> Values:
    """Transformer Engine graphs of the moe or mlp module beside the EP overlap (overlap_moe_expert_parallel_comm):
    Megatron-Core asserts them apart. One of the rules that refuse moe_a2a_overlap (search/plans.OVERLAP_RULES)."""
    p = ctx.plan
    if not (p.moe_a2a_overlap and p.cuda_graph_impl == "transformer_engine"):
        return None
    named = [m for m in ("moe", "mlp") if m in p.cuda_graph_modules]
    if not named:
        return None
    return {"modules": " and ".join(named),
            "fix": "Drop moe and mlp from cuda_graph_modules (attn, moe_router, moe_preprocess), or "
                   "moe_a2a_overlap=false."}


@rule("CG002", reads=("cuda_graph_impl", "cuda_graph_modules"))
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
    fix_impl = "local" if p.cuda_graph_impl == "local" else "transformer_engine"
    return {"what": what, "fix": f"cuda_graph_impl={fix_impl} with cuda_graph_modules {DROPLESS_MODULES}: the "
                                 "attention, router and the dispatcher's preprocess in graphs, the experts eager"}
