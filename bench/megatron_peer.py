"""Megatron-LM's own memory estimator as a peer: its figure and meshplan's on the same measured rows (issue 14).

The peer is `megatron/training/theoretical_memory_usage.py` of the pinned megatron-core wheel (PINS in
tests/framework_packages.py, downloaded and cached by `wheel_tree`), the function Megatron's training loop
calls to log "Theoretical memory footprints" (report_theoretical_memory: compute_weight_and_optimizer_memory
plus compute_activation_memory with sequence parallelism and selective recompute, else
compute_activation_memory_without_sp). Its source is executed unchanged; the one import it makes,
`from .utils import is_hybrid_model, print_rank_0` (megatron/training/utils imports torch), is answered by a
stub package holding those two names with Megatron's meaning (hybrid = `args.hybrid_layer_pattern` set;
print_rank_0 prints). No torch, no GPU.

Each row's meshplan Job/Plan becomes the `args` Namespace the function reads (`peer_args`): the model's
shapes (hidden, layers, heads, GQA groups, kv_channels, FFN, swiglu, norm, Megatron's padded vocabulary from
meshplan.arithmetic.memory_states.built_vocab with the framework's padding multiple, untied embeddings, MoE experts /
top-k /
expert FFN / shared-expert FFN / the 0-1 moe_layer_freq list, MLA ranks and head dims, MTP layers) and the
layout (tp, pp, vpp, ep, etp, world size, data-parallel size = world / (tp*pp*cp) as Megatron sets it,
sequence parallelism, recompute granularity, the distributed optimizer = ZeRO >= 1, sequence, micro-batch);
num_microbatches = global batch / (micro-batch x dp), as the training loop passes get_num_microbatches().

Rows, the ones the other scripts score (their loaders and scoring are imported, not copied):
- bench/memory_accuracy.py: the Megatron-LM functional tests (last rank's mem-max-allocated-bytes) and the
  playbook nanotron sweep (rank 0's peak reserved). The sweep is not Megatron-shaped (nanotron's Llama: no
  vocabulary padding, ZeRO-0/1); the peer is applied to it as the generic transformer formula it is.
- bench/production_configs.py: the production rows with a measured peak whose framework string names Megatron
  (Megatron-Bridge, verl on Megatron-Core today), mapped with its map_row.
The peer answers tensor bytes only (no CUDA context, workspaces or allocator reserve), so its total is
compared as-is with every measured figure; meshplan's is compared as the owning script compares it
(allocated: less context and allocator reserve; reserved: less context; not stated: the device total).
The peer answers the first (most loaded) stage; the functional tests measured the last rank, as for meshplan.

What the peer's formula does not read is listed per row (`peer_misses`): its activation term is Korthikanti
et al.'s Table 2 for a dense layer with selective recompute (no attention scores stored), whatever the row sets.

    python bench/megatron_peer.py [--rows] [--validation DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import types
from collections import Counter
from functools import cache
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import memory_accuracy  # noqa: E402
import production_mapping  # noqa: E402
import production_rows as prow  # noqa: E402
from framework_packages import PINS, wheel_tree  # noqa: E402

from meshplan.arithmetic.memory_states import built_vocab, convention, memory_card  # noqa: E402
from meshplan.core.units import GB  # noqa: E402
from meshplan.estimate.memory import estimate_memory, stage_allocated  # noqa: E402
from meshplan.request.resolve import resolve  # noqa: E402
from meshplan.schema.plan import Job, Plan  # noqa: E402

GIB = 1 << 30
MB = 1 << 20  # the function's NUM_BYTES_IN_MEGABYTE
PEER_PATH = "megatron/training/theoretical_memory_usage.py"
STUB = "_megatron_peer_stub"


# --------------------------------------------------------------------------- the peer


@cache
def peer_module() -> types.ModuleType:
    """theoretical_memory_usage.py from the pinned wheel, executed unchanged against a stub `.utils`."""
    source_path = wheel_tree("megatron-core") / PEER_PATH
    package = types.ModuleType(STUB)
    package.__path__ = []
    utils = types.ModuleType(f"{STUB}.utils")
    utils.is_hybrid_model = lambda args: args.hybrid_layer_pattern is not None  # megatron/training/utils/common_utils
    utils.print_rank_0 = print
    sys.modules[STUB], sys.modules[f"{STUB}.utils"] = package, utils
    module = types.ModuleType(f"{STUB}.theoretical_memory_usage")
    module.__package__, module.__file__ = STUB, str(source_path)
    exec(compile(source_path.read_text(encoding="utf-8"), str(source_path), "exec"), module.__dict__)
    return module


def peer_args(job: Job, plan: Plan) -> argparse.Namespace:
    """The Megatron arguments the function reads, from meshplan's job and plan."""
    arch = job.model
    _, conv, _ = convention(job.card, plan.zero_stage, job.framework_version)
    moe, mla = arch.moe, arch.mla
    return argparse.Namespace(
        hidden_size=arch.hidden_size, num_layers=arch.num_layers, num_attention_heads=arch.num_attention_heads,
        kv_channels=arch.head_dim, group_query_attention=mla is None and arch.num_kv_heads != arch.num_attention_heads,
        num_query_groups=arch.num_kv_heads, ffn_hidden_size=arch.ffn_hidden_size, swiglu=arch.gated_mlp,
        normalization="RMSNorm" if arch.norm_type == "rmsnorm" else "LayerNorm",
        padded_vocab_size=built_vocab(arch.vocab_size, conv, plan.tp),
        untie_embeddings_and_output_weights=not arch.tie_word_embeddings, add_bias_linear=arch.o_bias,
        num_experts=moe.num_experts if moe else None, moe_router_topk=moe.top_k if moe else 2,
        moe_ffn_hidden_size=moe.expert_ffn_hidden_size if moe else None,
        moe_shared_expert_intermediate_size=(moe.shared_expert_ffn_hidden_size or None) if moe else None,
        moe_layer_freq=[int(i in moe.moe_layers) for i in range(arch.num_layers)] if moe else 1,
        moe_latent_size=None, moe_shared_expert_gate=False, mtp_num_layers=arch.num_mtp_layers or None,
        multi_latent_attention=mla is not None, q_lora_rank=mla.q_lora_rank if mla else None,
        kv_lora_rank=mla.kv_lora_rank if mla else None, qk_head_dim=mla.qk_nope_head_dim if mla else None,
        qk_pos_emb_head_dim=mla.qk_rope_head_dim if mla else None, v_head_dim=mla.v_head_dim if mla else None,
        hybrid_layer_pattern=None,
        tensor_model_parallel_size=plan.tp, pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=plan.vpp if plan.vpp > 1 else None,
        expert_tensor_parallel_size=plan.etp, expert_model_parallel_size=plan.ep,
        world_size=plan.tp * plan.pp * plan.cp * plan.dp, data_parallel_size=plan.dp,
        sequence_parallel=plan.sequence_parallel,
        recompute_granularity=None if plan.recompute == "none" else plan.recompute,
        use_distributed_optimizer=plan.zero_stage >= 1,
        seq_length=job.seq_length, micro_batch_size=plan.micro_batch_size,
    )


class PeerAnswer(BaseModel):
    """The peer's figures in bytes (its MB x 2**20), or None where it refuses the model."""

    weight_and_optimizer_bytes: float | None
    activation_bytes: float | None
    total_bytes: float | None
    branch: str  # which activation function report_theoretical_memory chose


def peer_estimate(job: Job, plan: Plan) -> PeerAnswer:
    args = peer_args(job, plan)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        answer = peer_module().report_theoretical_memory(
            args, num_microbatches=plan.num_microbatches(job.global_batch_size))
    branch = "with SP" if "with SP" in out.getvalue() else "without_sp"
    if answer is None:
        return PeerAnswer(weight_and_optimizer_bytes=None, activation_bytes=None, total_bytes=None, branch="refused")
    weights, activations, total = (x * MB for x in answer)
    return PeerAnswer(weight_and_optimizer_bytes=weights, activation_bytes=activations, total_bytes=total,
                      branch=branch)


def peer_misses(job: Job, plan: Plan) -> list[str]:
    """What the row sets that the peer's formula does not read (each changes the memory it should answer)."""
    arch, misses = job.model, []
    if arch.moe is not None:
        misses.append("MoE activations (every layer's activations use the dense FFN width)")
    if arch.mla is not None:
        misses.append("MLA activations (attention activations sized as h-wide MHA)")
    if arch.gated_mlp:
        misses.append("gated MLP (the SwiGLU gate branch's activations are not counted)")
    without_sp = not (plan.sequence_parallel and plan.recompute == "selective")
    if without_sp and arch.ffn_hidden_size != 4 * arch.hidden_size:
        misses.append("FFN width (the without-SP formula assumes a 4h MLP)")
    if plan.sequence_parallel and plan.tp > 1 and plan.recompute != "selective":
        misses.append("sequence parallelism without selective recompute (its without-SP formula: 10 sbh per layer "
                      "not split by tp)")
    if plan.recompute == "full":
        misses.append("full recompute (every layer's selective-recompute activations are kept)")
    if plan.recompute == "selective" and plan.recompute_modules not in (None, ["core_attn"]):
        misses.append(f"recompute_modules {plan.recompute_modules} (only core_attn's saving is in the formula)")
    if plan.attention_backend == "unfused":  # with flash attention, no recompute keeps what selective keeps
        misses.append("unfused attention (the s x s scores and dropout mask are not counted)")
    if plan.pp == 1:  # cards/memory.yaml logits_bytes_per_element: 6 for Megatron's cross-entropy, 10 for nanotron's
        misses.append("fp32 loss (logits counted in bf16 only, not the cross-entropy's fp32 copy)")
    if plan.cp > 1:
        misses.append("context parallelism (sequence not split by cp; optimizer sharded over dp only)")
    if plan.zero_stage == 3:
        misses.append("Megatron-FSDP (weights and gradients sharded; counted as the distributed optimizer)")
    if job.precision != "bf16":
        misses.append(f"{job.precision} weights (bf16 assumed)")
    # precision-aware optimizer and offload fields: read where this checkout's Plan has them
    dtype = getattr(plan, "optimizer_state_dtype", None)
    if dtype is not None:
        misses.append(f"optimizer_state_dtype {dtype} (fp32 moments assumed)")
    if any(getattr(plan, name, False) for name in ("activation_offload", "param_offload", "optimizer_offload",
                                                    "optimizer_offload_fraction")):
        misses.append("offload (everything counted on the GPU)")
    if plan.pp > 1 and (plan.pipeline_layout or plan.first_stage_layers is not None
                        or plan.last_stage_layers is not None or plan.account_for_embedding or plan.account_for_loss):
        misses.append("uneven pipeline split (an even split assumed)")
    if job.rl is not None:
        misses.append("RL rollout engine")
    return misses


# --------------------------------------------------------------------------- the rows


class Row(BaseModel):
    """One measured row: the measured figure, the peer's and meshplan's figure compared with it."""

    set: str
    name: str
    measured_bytes: float
    convention: str
    peer_bytes: float | None
    meshplan_bytes: float
    misses: list[str]
    branch: str

    @property
    def peer_error(self) -> float | None:
        return None if self.peer_bytes is None else self.peer_bytes / self.measured_bytes - 1

    @property
    def meshplan_error(self) -> float:
        return self.meshplan_bytes / self.measured_bytes - 1


def _meshplan_compared(report, stage_index: int, conv: str) -> float:
    """meshplan's figure in the measured convention, as memory_accuracy.py / production_configs.py take it."""
    stage = report.stages[stage_index]
    compared = float(stage.total_bytes)
    if conv in ("reserved", "allocated"):
        compared -= memory_card().cuda_context_bytes
    if conv == "allocated":  # the allocated peak, found at its own moment (memory.stage_allocated)
        compared = float(stage_allocated(stage)) - memory_card().cuda_context_bytes
    return compared


def _row(set_name: str, name: str, job: Job, plan: Plan, measured: float, conv: str, report,
         stage_index: int) -> Row:
    peer = peer_estimate(job, plan)
    misses = peer_misses(job, plan)
    if plan.pp > 1 and stage_index in (-1, plan.pp - 1):
        misses.append("last stage measured (the peer answers the first: no output layer, logits or loss)")
    if peer.total_bytes is None:
        misses = ["hybrid model (the function refuses it)", *misses]
    return Row(set=set_name, name=name, measured_bytes=measured, convention=conv, peer_bytes=peer.total_bytes,
               meshplan_bytes=_meshplan_compared(report, stage_index, conv), misses=misses, branch=peer.branch)


def megatron_rows(validation: Path) -> tuple[list[Row], dict[str, int]]:
    """The functional-test rows memory_accuracy.py keeps (its loader), last stage, allocated."""
    rows, skipped = [], Counter()
    for raw in memory_accuracy.megatron_rows(validation):
        reason = memory_accuracy.megatron_skip_reason(raw)
        if reason:
            skipped[reason] += 1
            continue
        job, plan = memory_accuracy.megatron_case(raw)
        report = memory_accuracy.megatron_estimate(job, plan)
        if isinstance(report, str):
            skipped[report] += 1
            continue
        rows.append(_row("megatron functional tests", raw["case"], job, plan,
                         float(raw["mem_maxalloc_GiB_max"]) * GIB, "allocated", report, -1))
    return rows, dict(skipped)


def playbook_rows(validation: Path) -> list[Row]:
    """The playbook sweep's `ok` rows meshplan estimates (memory_accuracy.py's loader), first stage, reserved."""
    rows = []
    for raw, job, plan, report in memory_accuracy.playbook_estimates(validation):
        if raw["status"] != "ok" or report is None:
            continue
        name = (f"{raw['model_label']} dp{plan.dp} tp{plan.tp} pp{plan.pp} z{plan.zero_stage} "
                f"mbs{plan.micro_batch_size}")
        rows.append(_row("playbook sweep", name, job, plan, float(raw["gpu_memory_GB_reported"]) * GIB,
                         "reserved", report, 0))
    return rows


def production_rows(validation: Path) -> tuple[list[Row], dict[str, str]]:
    """Production rows with a measured peak on a Megatron-family framework (production_mapping.py's map_row)."""
    rows, left = [], {}
    data = prow.load_rows(validation / prow.DATA_NAME)
    with tempfile.TemporaryDirectory(prefix="meshplan-peer-") as tmp:
        for raw in data:
            measured = raw["outcome"]["peak_memory_gb_per_gpu"]
            if measured is None or "megatron" not in raw["framework"].lower():
                continue
            mapping = production_mapping.map_row(raw, Path(tmp))
            if mapping.request is None:
                left[raw["id"]] = f"does not map: {mapping.unmapped}"
                continue
            job, plan = resolve(mapping.request)
            report = estimate_memory(job, plan)
            conv = prow.peak_convention(raw)
            row = _row("production configs", raw["id"], job, plan, measured * GB, conv, report,
                       report.peak_stage)
            row.misses += [f"{k} (neither models it)" for k in mapping.knobs]
            rows.append(row)
    return rows, left


# --------------------------------------------------------------------------- report


def median_abs(values: list[float]) -> float | None:
    return statistics.median(abs(v) for v in values) * 100 if values else None


# Shortfalls of the formula itself that hit almost every row (its dense GeLU-4h layer, bf16 logits, first stage,
# without-SP choice); the others are settings of the row the formula does not read.
FORMULA_WIDE = ("gated MLP", "FFN width", "fp32 loss", "last stage measured", "sequence parallelism without")


def setting_misses(row: Row) -> list[str]:
    return [m for m in row.misses if not m.startswith(FORMULA_WIDE)]


def summary(rows: list[Row]) -> dict[str, float | int | None]:
    answered = [r for r in rows if r.peer_error is not None]
    complete = [r for r in answered if not setting_misses(r)]
    return {
        "rows": len(rows), "peer_answers": len(answered),
        "peer_median_abs_pct": median_abs([r.peer_error for r in answered]),
        "meshplan_median_abs_pct": median_abs([r.meshplan_error for r in answered]),
        "peer_p90_abs_pct": memory_accuracy.percentile([abs(r.peer_error) * 100 for r in answered], 0.9)
        if answered else None,
        "meshplan_p90_abs_pct": memory_accuracy.percentile([abs(r.meshplan_error) * 100 for r in answered], 0.9)
        if answered else None,
        "peer_signed_median_pct": statistics.median(r.peer_error for r in answered) * 100 if answered else None,
        "meshplan_signed_median_pct": statistics.median(r.meshplan_error for r in answered) * 100 if answered else None,
        "rows_peer_reads_fully": len(complete),
        "peer_median_abs_pct_full_rows": median_abs([r.peer_error for r in complete]),
        "meshplan_median_abs_pct_full_rows": median_abs([r.meshplan_error for r in complete]),
    }


def run(validation: Path) -> dict[str, object]:
    megatron, skipped = megatron_rows(validation)
    production, left = production_rows(validation)
    sets = {"megatron functional tests (last stage, allocated)": megatron,
            "playbook sweep (first stage, reserved; nanotron)": playbook_rows(validation),
            "production configs, Megatron family (measured peaks)": production}
    return {"sets": sets, "megatron_skipped": skipped, "production_left": left}


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--validation", type=Path, default=memory_accuracy.DEFAULT_VALIDATION)
    parser.add_argument("--rows", action="store_true", help="Print every row with what the peer misses")
    args = parser.parse_args()
    result = run(args.validation)
    print(f"peer: megatron-core {PINS['megatron-core']} {PEER_PATH} (report_theoretical_memory)")
    for name, rows in result["sets"].items():
        s = summary(rows)
        print(f"{name}: {s['rows']} rows, peer answers {s['peer_answers']}; median |error| peer "
              f"{_fmt(s['peer_median_abs_pct'])} (signed {_fmt(s['peer_signed_median_pct'])}, p90 "
              f"{_fmt(s['peer_p90_abs_pct'])}), meshplan {_fmt(s['meshplan_median_abs_pct'])} (signed "
              f"{_fmt(s['meshplan_signed_median_pct'])}, p90 {_fmt(s['meshplan_p90_abs_pct'])}); "
              f"rows with no setting the peer ignores {s['rows_peer_reads_fully']} (peer "
              f"{_fmt(s['peer_median_abs_pct_full_rows'])}, meshplan {_fmt(s['meshplan_median_abs_pct_full_rows'])})")
        misses = Counter(m.split(" (")[0] for r in rows for m in r.misses)
        print("  peer misses, rows: " + "; ".join(f"{k} {v}" for k, v in misses.most_common()))
        if args.rows:
            for r in rows:
                peer = "refused" if r.peer_bytes is None else f"{r.peer_bytes / GIB:6.2f} ({r.peer_error:+.0%})"
                print(f"  {r.name[:64]:64s} measured {r.measured_bytes / GIB:6.2f} GiB  peer {peer}  meshplan "
                      f"{r.meshplan_bytes / GIB:6.2f} ({r.meshplan_error:+.0%})  [{r.branch}] "
                      + "; ".join(r.misses))
    for row_id, why in result["production_left"].items():
        print(f"production row left out: {row_id}: {why}")


if __name__ == "__main__":
    main()
