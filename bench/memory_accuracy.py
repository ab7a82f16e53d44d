"""How far meshplan's memory estimate is from measured training runs (shared/validation), honestly.

Two sources (shared/validation/README.md):
- The Ultra-Scale Playbook nanotron sweep: rank 0's (first pipeline stage) peak for `ok` rows, and
  whether a row ran at all (`ok`) or failed / ran out of memory (`failed_or_oom`).
- Megatron-LM functional tests on one node of 8 H100s: the last rank's (last pipeline stage) peak
  allocated memory. Each row's columns map to a Job/Plan; a blank column is Megatron's default.

Each source is compared with the quantity it measured. The CUDA context is outside torch's accounting,
so it is taken off the estimate for both. The playbook figure is taken as peak *reserved* memory
(nanotron's bench CSV logs both max_memory_allocated and max_memory_reserved; identical layouts that differ
only in dp, whose allocated peak is the same, are logged up to 1.9x apart, which only the caching
allocator's reserve can do), so the estimate keeps its allocator reserve; the Megatron tests log
mem-max-allocated-bytes, so the allocator reserve is taken off too. The fits/OOM verdict uses the full
estimate.

    python bench/memory_accuracy.py [--validation DIR] [--rows] [--fit-overhead]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from collections.abc import Iterator
from pathlib import Path

import yaml

from meshplan.adapters.common import DROPOUT_ON, offload_modules
from meshplan.arithmetic.memory_states import memory_card
from meshplan.arithmetic.schedule import parse_layout
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory, stage_allocated
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.model import Architecture, MLASpec, MoESpec
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import MemoryReport

GIB = 1 << 30
DEFAULT_VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"


# --------------------------------------------------------------------------- the playbook sweep (nanotron)


def playbook_estimates(validation: Path) -> Iterator[tuple[dict[str, str], Job, Plan, MemoryReport | None]]:
    """Every playbook sweep row with meshplan's estimate (None where meshplan refuses the layout, e.g. pp larger
    than the layer count): the one reading of the sweep the accuracy card and the peer bench reuse."""
    with open(validation / "ultrascale_playbook_nanotron_sweep.csv", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            job, plan = playbook_case(row)
            try:
                report = estimate_memory(job, plan)
            except MeshplanError:
                report = None
            yield row, job, plan, report


def playbook_case(row: dict[str, str]) -> tuple[Job, Plan]:
    h, heads = int(row["hidden"]), int(row["heads"])
    arch = Architecture(
        name=f"playbook {row['model_label']}", model_type="llama", num_layers=int(row["num_layers"]),
        hidden_size=h, ffn_hidden_size=int(row["ffn"]), num_attention_heads=heads,
        num_kv_heads=int(row["kv_heads"]), head_dim=h // heads, vocab_size=int(row["vocab"]),
        tie_word_embeddings=row["tied_embeddings"] == "True", origin="playbook sweep",
    )
    tp = int(row["tp"])
    plan = Plan(tp=tp, pp=int(row["pp"]), dp=int(row["dp"]), sequence_parallel=tp > 1,
                zero_stage=int(row["zero_stage"]), micro_batch_size=int(row["mbs"]))
    job = carry_cards(Job(model=arch, gpu=get_gpu("h100"), num_gpus=int(row["gpus"]), gpus_per_node=8,
                          seq_length=int(row["seq_len"]), global_batch_size=int(row["gbs_seqs"]), framework="nanotron"))
    return job, plan


# --------------------------------------------------------------------------- Megatron functional tests

# Rows left out, with the reason: not a decoder-only GPT, multi-node release recipes whose world size the
# CSV does not record, RL jobs that also hold an inference engine, and settings meshplan does not model.
EXCLUDE = [
    (r"^(bert|t5|hybrid|mimo|multimodal)", "not a decoder-only GPT model"),
    (r"_release", "multi-node release recipe: world size not in the CSV"),
    (r"grpo", "RL job: the GPU also holds an inference engine and KV cache"),
    (r"reruns_resume_check_grads", "rerun-state machine keeps extra copies to compare gradients"),
]

# The Megatron-LM arguments the CSV has no column for (dropout, the embedding and loss in the pipeline split,
# fine-grained activation offloading, the cross-entropy fusion and its implementation), read from each case's
# model_config.yaml into a file of further columns beside the CSV's (bench/data/megatron_functional_columns.yaml,
# with its source): megatron_rows gives every row all of them, blank where the case does not set one (Megatron's
# default, as in the CSV).
FURTHER_COLUMNS = Path(__file__).resolve().parent / "data" / "megatron_functional_columns.yaml"
TOKENIZER_VOCAB = {"": 50257, "GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}
# The functional tests' full-size models (the 7B rows); the rest are tiny (hidden 512-3072) and their peaks and steps
# are dominated by what does not scale with the model (buffers, launches).
FULL_SIZE_HIDDEN = 4096


def _int(row: dict[str, str], key: str, default: int | None = None) -> int | None:
    value = row.get(key, "")
    return int(value) if value else default


def _moe_layers(pattern: str, num_layers: int) -> list[int]:
    """--moe-layer-freq: blank = every layer; '([0]*3+[1]*13)' = an explicit 0/1 list."""
    if not pattern:
        return list(range(num_layers))
    flags: list[int] = []
    for value, count in re.findall(r"\[(\d)\]\*(\d+)", pattern):
        flags += [int(value)] * int(count)
    return [i for i, flag in enumerate(flags) if flag]


def _cell(value: object) -> str:
    """A YAML value as the CSV writes its cells: True, 0.0, text."""
    return value if isinstance(value, str) else str(value)


def megatron_rows(validation: Path) -> Iterator[dict[str, str]]:
    """Every functional-test row of the CSV with the further columns of FURTHER_COLUMNS (blank where the case sets
    none): the one reading of the rows every bench takes."""
    further = yaml.safe_load(FURTHER_COLUMNS.read_text(encoding="utf-8"))
    blank = dict.fromkeys(further["columns"], "")
    with open(validation / "megatron_functional_golden_h100.csv", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            set_here = further["cases"].get(row["case"], {})
            unknown = set(set_here) - set(blank)
            if unknown:
                raise ValueError(f"{FURTHER_COLUMNS.name}: case {row['case']} sets {sorted(unknown)}, not among its "
                                 f"columns {further['columns']}")
            yield row | blank | {k: _cell(v) for k, v in set_here.items()}


def _dropouts(row: dict[str, str]) -> tuple[float, float]:
    """(attention, hidden) dropout probability of the row; a blank cell is Megatron's default."""
    return (float(row["attention-dropout"] or DROPOUT_ON), float(row["hidden-dropout"] or DROPOUT_ON))


def megatron_skip_reason(row: dict[str, str]) -> str | None:
    for pattern, reason in EXCLUDE:
        if re.search(pattern, row["case"]):
            return reason
    if row["fp16"] == "True":
        return "fp16 (meshplan models bf16/fp8)"
    if row["optimizer"] == "muon":
        return "Muon optimizer (meshplan models Adam)"
    if row["tokenizer-type"] not in TOKENIZER_VOCAB and not row["vocab-size"]:
        return f"vocabulary of {row['tokenizer-type']} unknown"
    attention, hidden = _dropouts(row)
    if (attention > 0) != (hidden > 0):
        return "attention dropout without hidden dropout or the reverse (meshplan's dropout is one switch)"
    if row["fine-grained-activation-offloading"] == "True":
        job, plan = megatron_case(row)
        if set(row["offload-modules"].strip("[]").split()) != set(offload_modules(job, plan)):
            return "fine-grained offloading of some modules (meshplan's activation_offload offloads every one)"
    return None


def megatron_estimate(job: Job, plan: Plan) -> MemoryReport | str:
    """The row's memory estimate, or why a rule refuses it: the row ran, so a refusal means a setting the CSV does
    not record (biases off for EP004, a micro-batch group size for PP005, a first/last split for PP001)."""
    try:
        return estimate_memory(job, plan)
    except EstimateBlocked as refused:
        return f"refused by rule {refused.rule_id} (a setting the CSV does not record)"


def megatron_estimates(validation: Path) -> Iterator[tuple[dict[str, str], Job | None, Plan | None,
                                                             MemoryReport | str]]:
    """Every functional-test row with meshplan's estimate, or why the row is not scored: megatron_skip_reason's
    reason (no job, no plan), or a rule's refusal (megatron_estimate). run() scores them; the accuracy card reads the
    same list, so each estimate is computed once."""
    for row in megatron_rows(validation):
        reason = megatron_skip_reason(row)
        if reason:
            yield row, None, None, reason
            continue
        job, plan = megatron_case(row)
        yield row, job, plan, megatron_estimate(job, plan)


def megatron_case(row: dict[str, str]) -> tuple[Job, Plan]:
    """(job, plan) for one functional-test row, its attention backend and dropout on the plan; blank = Megatron
    default."""
    layers, h, heads = int(row["num-layers"]), int(row["hidden-size"]), int(row["num-attention-heads"])
    swiglu = row["swiglu"] == "True"
    ffn = _int(row, "ffn-hidden-size") or (int(4 * h * 2 / 3 / 64) * 64 if swiglu else 4 * h)
    kv_channels = _int(row, "kv-channels", h // heads)
    groups = _int(row, "num-query-groups", heads) if row["group-query-attention"] == "True" else heads
    moe = None
    if row["num-experts"]:
        shared = _int(row, "moe-shared-expert-intermediate-size", 0)
        moe = MoESpec(num_experts=int(row["num-experts"]), top_k=_int(row, "moe-router-topk", 2),
                      expert_ffn_hidden_size=_int(row, "moe-ffn-hidden-size", ffn),
                      num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared,
                      moe_layers=_moe_layers(row["moe-layer-freq"], layers))
    mla = None
    if row["multi-latent-attention"] == "True":  # Megatron defaults: qk 128, rope 64, v 128, kv_lora 32
        mla = MLASpec(q_lora_rank=_int(row, "q-lora-rank"), kv_lora_rank=_int(row, "kv-lora-rank", 32),
                      qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
        kv_channels = 192
    arch = Architecture(
        name=row["case"], model_type="gpt", num_layers=layers, hidden_size=h, ffn_hidden_size=ffn,
        num_attention_heads=heads, num_kv_heads=groups, head_dim=kv_channels,
        vocab_size=_int(row, "vocab-size") or TOKENIZER_VOCAB[row["tokenizer-type"]],
        tie_word_embeddings=row["untie-embeddings-and-output-weights"] != "True",
        gated_mlp=swiglu, activation="silu" if swiglu else "gelu",
        qkv_bias=True, o_bias=True, mlp_bias=not swiglu, norm_type="layernorm",
        moe=moe, mla=mla, num_mtp_layers=_int(row, "mtp-num-layers", 0), origin="megatron functional test",
    )
    tp, pp, cp = _int(row, "tensor-model-parallel-size", 1), _int(row, "pipeline-model-parallel-size", 1), \
        _int(row, "context-parallel-size", 1)
    vpp = _int(row, "num-virtual-stages-per-pipeline-rank")
    if vpp is None and row["num-layers-per-virtual-pipeline-stage"]:
        vpp = layers // (pp * int(row["num-layers-per-virtual-pipeline-stage"]))
    layout = row["pipeline-model-parallel-layout"] or None
    if vpp is None and layout is not None:  # a layout lists pp x vpp stages (stage k on rank k % pp)
        vpp = len(parse_layout(layout)) // pp
    zero = 3 if row["use-megatron-fsdp"] == "True" else 1 if row["use-distributed-optimizer"] == "True" else 0
    recompute = {"": "none", "selective": "selective", "full": "full"}[row["recompute-granularity"]]
    gpus = 8
    dp = max(1, gpus // (tp * pp * cp))
    mbs = _int(row, "micro-batch-size", 1)
    plan = Plan(tp=tp, pp=pp, vpp=vpp or 1, cp=cp, ep=_int(row, "expert-model-parallel-size", 1),
                etp=_int(row, "expert-tensor-parallel-size", tp), dp=dp,
                sequence_parallel=row["sequence-parallel"] == "True", zero_stage=zero, micro_batch_size=mbs,
                recompute=recompute, recompute_layers=_int(row, "recompute-num-layers"),
                recompute_method=row.get("recompute-method") or None if recompute == "full" else None,
                recompute_modules=row["recompute-modules"].strip("[]").split() or None
                if recompute == "selective" and row.get("recompute-modules") else None,
                account_for_embedding=row["account-for-embedding-in-pipeline-split"] == "True",
                account_for_loss=row["account-for-loss-in-pipeline-split"] == "True", pipeline_layout=layout,
                activation_offload=row["fine-grained-activation-offloading"] == "True")
    job = carry_cards(Job(model=arch, gpu=get_gpu("h100"), num_gpus=gpus, gpus_per_node=8,
                          seq_length=_int(row, "seq-length", 1024),
                          global_batch_size=_int(row, "global-batch-size", mbs * dp),
                          precision="fp8" if row["fp8-format"] else "bf16", framework="megatron-core",
                          # the loss as the case sets it (blank: Megatron-LM's unfused one; the impl native)
                          cross_entropy_loss_fusion=row["cross-entropy-loss-fusion"] == "True",
                          cross_entropy_fusion_impl=row["cross-entropy-fusion-impl"] or "native"))
    # --attention-backend as the row sets it (local: Megatron's own DotProductAttention, unfused too); dropout as
    # its columns set it (blank: Megatron's default, on; megatron_skip_reason keeps only rows whose two agree)
    backend = {"unfused": "unfused", "local": "unfused", "flash": "flash", "fused": "fused"}.get(
        row["attention-backend"], "auto")
    return job, plan.model_copy(update={"attention_backend": backend, "dropout": _dropouts(row)[0] > 0})


# --------------------------------------------------------------------------- scoring


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


Estimates = list[tuple[dict[str, str], Job | None, Plan | None, MemoryReport | str | None]]


def run(validation: Path, show_rows: bool, fit_overhead: bool, playbook: Estimates | None = None,
        megatron: Estimates | None = None) -> dict[str, dict[str, float]]:
    """The figures of both sets; `playbook` / `megatron`: playbook_estimates' / megatron_estimates' rows where the
    caller has them already (bench/accuracy_card.py), else read and estimated here."""
    context = memory_card().cuda_context_bytes
    overhead = memory_card().fixed_overhead_bytes
    results: dict[str, dict[str, float]] = {}
    residuals: list[float] = []

    errors, fit_right, fit_total, oom_right, oom_total, rejected = [], 0, 0, 0, 0, 0
    for row, _job, plan, report in playbook_estimates(validation) if playbook is None else playbook:
        if report is None:  # meshplan says it cannot run
            fit_total += row["status"] == "ok"
            oom_total += row["status"] != "ok"
            oom_right += row["status"] != "ok"
            rejected += 1
            continue
        if row["status"] == "ok":
            fit_total += 1
            fit_right += report.fits
            predicted = report.stages[0].total_bytes - context
            measured = float(row["gpu_memory_GB_reported"]) * GIB
            errors.append(abs(predicted - measured) / measured * 100)
            residuals.append(measured - (predicted - overhead))
            if show_rows:
                print(f"playbook {row['model_label']:>4} dp{plan.dp} tp{plan.tp} pp{plan.pp} z{plan.zero_stage} "
                      f"mbs{plan.micro_batch_size}: measured {measured / GIB:6.1f} predicted "
                      f"{predicted / GIB:6.1f} GiB ({(predicted - measured) / measured:+.0%})")
        else:
            oom_total += 1
            oom_right += not report.fits
    results["playbook sweep (first stage, ok rows)"] = {
        "rows": len(errors), "median_abs_pct": statistics.median(errors), "p90_abs_pct": percentile(errors, 0.9),
    }
    results["playbook sweep fit/OOM"] = {
        "rows": fit_total + oom_total, "accuracy_pct": 100 * (fit_right + oom_right) / (fit_total + oom_total),
        "ok_rows_predicted_fit_pct": 100 * fit_right / fit_total,
        "failed_rows_predicted_oom_pct": 100 * oom_right / oom_total,
        "rows_meshplan_rejects_as_impossible": rejected,
    }

    meg_errors, meg_big, skipped = [], [], {}
    for row, job, _plan, report in megatron_estimates(validation) if megatron is None else megatron:
        if isinstance(report, str):  # a skip reason or a rule's refusal
            skipped[report] = skipped.get(report, 0) + 1
            continue
        last = report.stages[-1]
        predicted = stage_allocated(last) - context  # allocated (at its own moment), not reserved
        measured = float(row["mem_maxalloc_GiB_max"]) * GIB
        err = abs(predicted - measured) / measured * 100
        meg_errors.append(err)
        if job.model.hidden_size >= FULL_SIZE_HIDDEN:
            meg_big.append(err)
            residuals.append(measured - (predicted - overhead))
        if show_rows:
            print(f"megatron {row['case'][:70]:70s} measured {measured / GIB:6.2f} predicted "
                  f"{predicted / GIB:6.2f} GiB ({(predicted - measured) / measured:+.0%})")
    results["megatron functional tests (last stage, all kept rows)"] = {
        "rows": len(meg_errors), "median_abs_pct": statistics.median(meg_errors),
        "p90_abs_pct": percentile(meg_errors, 0.9),
    }
    results["megatron functional tests (7B rows, h >= 4096)"] = {
        "rows": len(meg_big), "median_abs_pct": statistics.median(meg_big), "p90_abs_pct": percentile(meg_big, 0.9),
    }
    results["megatron rows skipped"] = {k: float(v) for k, v in skipped.items()}
    if fit_overhead:
        results["fixed overhead fit (median residual, GiB)"] = {"value": statistics.median(residuals) / GIB}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    parser.add_argument("--rows", action="store_true", help="Print every row")
    parser.add_argument("--fit-overhead", action="store_true", help="Print the median residual used to calibrate")
    args = parser.parse_args()
    for name, figures in run(args.validation, args.rows, args.fit_overhead).items():
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in figures.items()))


if __name__ == "__main__":
    main()
