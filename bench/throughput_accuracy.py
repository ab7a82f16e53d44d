"""How close meshplan's step-time model comes to measured training throughput.

Data (read-only, ../shared/validation and ../shared/reference/estimators.md section 5.2):
- the Ultra-Scale Playbook nanotron sweep (tokens/s per GPU of every `ok` row; 1B/3B/80B llama-shaped
  models on 1-64 nodes of 8 H100), each row's Architecture built from its own columns;
- the classic tables: Korthikanti et al. 2022 Table 5 (A100, s/iter) and Megatron-Core's 2024 H100
  model table (TFLOP/s per GPU, turned into tokens/s with the same non-causal formula they used);
- Megatron-LM's functional-test golden iteration times of the two 7B H100 cases.

Reports the median absolute % error of tokens/s per GPU, and ranking quality within each
(model, node count) group of the sweep: Spearman correlation and whether our top-ranked layout
measures >= 90% of the best measured one; the same on the sweep without "stalled" runs (a measured
micro-batch >= STALL_S seconds, a fixed stall the model does not try to produce), without the pipeline runs that
measured nanotron bench2's polled p2p (`polled`: a 0.1 s sleep per p2p metadata message, a program meshplan does
not model; bench/data/playbook_sweep_p2p.yaml) and by node count.
`--fit` refits the fitted constants of
cards/calibration.yaml (scipy Nelder-Mead on a robust loss of the log error) on half of the groups
and on all of them, and prints both; the card holds the all-groups fit.

Run: python bench/throughput_accuracy.py [--fit all|half] [--groups] [--validation DIR]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from memory_accuracy import FULL_SIZE_HIDDEN, megatron_rows, megatron_skip_reason

from meshplan.arithmetic.flops import noncausal_flops_per_token
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import Calibration, calibration
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan

HERE = Path(__file__).resolve().parent
DEFAULT_VALIDATION = HERE.parent.parent / "shared" / "validation"
DEFAULT_REFERENCE = HERE.parent.parent / "shared" / "reference"

# The GEMM curve (gemm_peak_fraction, gemm_half_dim) stays frozen at the card's nanotron values: refitted with
# the runtime terms it drifts to 99% of peak (it trades off against the elementwise passes). The
# Megatron-family value is fitted on Megatron data by bench/bridge_published.py --fit. tp_overlap is not fitted:
# nanotron's card times its TP schedule from its source (tp_overlap base local_shard): nothing of nanotron's reads it.
FITTED = (
    "elementwise_passes",
    "layer_overhead_s",
    "host_time_per_layer_s",
    "network_efficiency",
    "latency_intra_s",
    "latency_inter_s",
    "pp_latency_inter_s",
    "ring_nic_scaling",
    "dp_overlap",
    "pp_overlap",
    "pp_host_sync",
    "pp_cross_sync_per_layer_s",
)
FRACTIONS = {"network_efficiency", "dp_overlap", "pp_overlap", "ring_nic_scaling", "pp_host_sync"}


@dataclass
class Case:
    source: str
    group: str
    job: Job
    plan: Plan
    measured_tps: float  # tokens/s per GPU


def llama_like(label: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, tied: bool,
               gated: bool = True) -> Architecture:
    return Architecture(
        name=label, model_type="llama" if gated else "gpt2", num_layers=layers, hidden_size=hidden,
        ffn_hidden_size=ffn, num_attention_heads=heads, num_kv_heads=kv, head_dim=hidden // heads,
        vocab_size=vocab, tie_word_embeddings=tied, gated_mlp=gated, activation="silu" if gated else "gelu",
        origin="bench",
    )


def sweep_cases(validation: Path) -> list[Case]:
    h100 = get_gpu("h100")
    cases = []
    with open(validation / "ultrascale_playbook_nanotron_sweep.csv", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["status"] != "ok":
                continue
            arch = llama_like(f"playbook {r['model_label']}", int(r["num_layers"]), int(r["hidden"]),
                              int(r["heads"]), int(r["kv_heads"]), int(r["ffn"]), int(r["vocab"]),
                              r["tied_embeddings"] == "True")
            tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp"])
            mbs, acc = int(r["mbs"]), int(r["grad_acc"])
            job = carry_cards(Job(model=arch, gpu=h100, num_gpus=int(r["gpus"]), gpus_per_node=8,
                                  seq_length=int(r["seq_len"]),
                                  global_batch_size=dp * mbs * acc, framework="nanotron"))
            plan = Plan(tp=tp, pp=pp, dp=dp, sequence_parallel=tp > 1, zero_stage=int(r["zero_stage"]),
                        micro_batch_size=mbs)
            cases.append(Case("playbook sweep", f"{r['model_label']} x{r['nodes']} nodes", job, plan,
                              float(r["tok_per_s_per_gpu"])))
    return cases


def gpt_job(label: str, layers: int, hidden: int, heads: int, vocab: int, tied: bool, gpu_key: str, gpus: int,
            seq: int, gbs: int) -> Job:
    """A GPT-shaped (GeLU 4h, MHA) Megatron-Core job of the classic tables."""
    arch = llama_like(label, layers, hidden, heads, heads, 4 * hidden, vocab, tied, gated=False)
    return carry_cards(Job(model=arch, gpu=get_gpu(gpu_key), num_gpus=gpus, gpus_per_node=8, seq_length=seq,
                           global_batch_size=gbs, framework="megatron-core"))


def classic_cases() -> list[Case]:
    """estimators.md 5.2 (E), (F) and (G); settings the tables do not state are assumptions, listed here.

    (E) and (F) are Megatron-LM on A100 before FlashAttention (Dao et al., arXiv 2205.14135, May 2022):
    attention materialises the s x s scores, with GPT's attention dropout 0.1, so they are timed with
    attention_backend=unfused, dropout=true.
    """
    cases = []
    # (E) Korthikanti 2022 Table 5: GPT, s 2048, V 51200, dp 1, SP + selective recompute, s/iter measured.
    for label, L, h, a, gpus, t, p, v, gbs, mbs, sec in [
        ("22B", 48, 6144, 64, 8, 8, 1, 1, 4, 4, 1.10),
        ("175B", 96, 12288, 96, 64, 8, 8, 3, 64, 1, 13.75),
        ("530B", 105, 20480, 128, 280, 8, 35, 3, 280, 1, 37.83),
        ("1T", 128, 25600, 160, 512, 8, 64, 1, 512, 1, 71.49),
    ]:
        job = gpt_job(f"GPT {label}", L, h, a, 51200, False, "a100-80gb", gpus, 2048, gbs)
        plan = Plan(tp=t, pp=p, vpp=v, dp=1, sequence_parallel=True, micro_batch_size=mbs, recompute="selective",
                    attention_backend="unfused", dropout=True)
        cases.append(Case("Korthikanti T5", "classic", job, plan, gbs * 2048 / sec / gpus))
    # (F) Narayanan 2021 Table 1: GPT, s 2048, V 51200, full recompute, no SP (it came in 2022); the
    # table gives hardware TFLOP/s by the 96*B*s*L*h^2*(1 + s/6h + V/16Lh) formula (recompute counted),
    # turned back into tokens/s with that formula. Micro-batch 1, no interleaving, dp = GPUs/(t*p),
    # the heads of the paper: assumptions (the table does not state them).
    for label, h, L, a, t, p, gpus, gbs, tflops in [
        ("1.7B", 2304, 24, 24, 1, 1, 32, 512, 137),
        ("3.6B", 3072, 30, 32, 2, 1, 64, 512, 138),
        ("7.5B", 4096, 36, 32, 4, 1, 128, 512, 142),
        ("18.4B", 6144, 40, 48, 8, 1, 256, 1024, 135),
        ("39.1B", 8192, 48, 64, 8, 2, 512, 1536, 138),
        ("76.1B", 10240, 60, 80, 8, 4, 1024, 1792, 140),
        ("145.6B", 12288, 80, 96, 8, 8, 1536, 2304, 148),
        ("310.1B", 16384, 96, 128, 8, 16, 1920, 2160, 155),
        ("529.6B", 20480, 105, 128, 8, 35, 2520, 2520, 163),
        ("1008B", 25600, 128, 160, 8, 64, 3072, 3072, 163),
    ]:
        job = gpt_job(f"GPT {label}", L, h, a, 51200, False, "a100-80gb", gpus, 2048, gbs)
        plan = Plan(tp=t, pp=p, dp=gpus // (t * p), micro_batch_size=1, recompute="full", zero_stage=0,
                    attention_backend="unfused", dropout=True)
        hw_flops_per_token = 96 * L * h * h * (1 + 2048 / (6 * h) + 51200 / (16 * L * h))
        cases.append(Case("Narayanan T1", "classic", job, plan, tflops * 1e12 / hw_flops_per_token))
    # (G) Megatron-Core r0.8.0 H100 table: s 4096, V 131072; mbs 1, no recompute, GeLU 4h, tied (assumed); "TP comm
    # overlap enabled" (the table's note, production_configs_dev.yaml mcore_h100_weak_*): tp_comm_overlap where tp > 1.
    for label, a, h, L, t, p, gpus, gbs, tflops in [
        ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
        ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
        ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
        ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
        ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
        ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
        ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
        ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
        ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
    ]:
        job = gpt_job(f"MCore {label}", L, h, a, 131072, True, "h100", gpus, 4096, gbs)
        plan = Plan(tp=t, pp=p, dp=gpus // (t * p), sequence_parallel=t > 1, micro_batch_size=1, tp_comm_overlap=t > 1)
        tps = tflops * 1e12 / noncausal_flops_per_token(job.model, 4096)
        cases.append(Case("MCore H100 table", "classic", job, plan, tps))
    return cases


def golden_row(r: dict[str, str]) -> bool:
    """Whether a functional-test row is one golden_cases times: a row the memory bench keeps (a decoder-only GPT on
    the node the CSV records, memory_accuracy.megatron_skip_reason), with a measured iteration time, at the memory
    bench's full size (hidden >= memory_accuracy.FULL_SIZE_HIDDEN; the others are tiny models whose step is
    launches), and of the shape golden_cases builds: dense, without MLA, in BF16. Read from the row's columns, never
    its case name: today the two 7B cases."""
    return (megatron_skip_reason(r) is None and bool(r["iter_time_s_median"])
            and int(r["hidden-size"]) >= FULL_SIZE_HIDDEN and not r["num-experts"]
            and r["multi-latent-attention"] != "True" and not r["fp8-format"])


def golden_cases(validation: Path) -> list[Case]:
    """The full-size dense Megatron functional tests on one node of 8 H100 (golden_row: the two 7B cases)."""
    h100 = get_gpu("h100")
    out = []
    for r in megatron_rows(validation):
        if not golden_row(r):
            continue
        L, h, a = int(r["num-layers"]), int(r["hidden-size"]), int(r["num-attention-heads"])
        g = int(r["num-query-groups"] or a)
        ffn, vocab = int(r["ffn-hidden-size"] or 4 * h), int(r["vocab-size"] or 131072)
        arch = llama_like("golden 7B", L, h, a, g, ffn, vocab, False, gated=r["swiglu"] == "True")
        t, p = int(r["tensor-model-parallel-size"]), int(r["pipeline-model-parallel-size"])
        v = int(r["num-virtual-stages-per-pipeline-rank"] or 0) or (
            L // p // int(r["num-layers-per-virtual-pipeline-stage"])
            if r["num-layers-per-virtual-pipeline-stage"] else 1)
        gbs, mbs, s = int(r["global-batch-size"]), int(r["micro-batch-size"]), int(r["seq-length"])
        job = carry_cards(Job(model=arch, gpu=h100, num_gpus=8, gpus_per_node=8, seq_length=s,
                              global_batch_size=gbs, framework="megatron-core",
                              # the loss as the case sets it (memory_accuracy.megatron_case reads the same columns)
                              cross_entropy_loss_fusion=r["cross-entropy-loss-fusion"] == "True",
                              cross_entropy_fusion_impl=r["cross-entropy-fusion-impl"] or "native"))
        plan = Plan(tp=t, pp=p, vpp=v, dp=8 // (t * p), sequence_parallel=r["sequence-parallel"] == "True",
                    micro_batch_size=mbs, zero_stage=1 if r["use-distributed-optimizer"] == "True" else 0)
        out.append(Case("Megatron golden", "classic", job, plan, gbs * s / float(r["iter_time_s_median"]) / 8))
    return out


# --------------------------------------------------------------------------- metrics


def predict(cases: list[Case], cal: Calibration | None) -> list[float]:
    out = []
    for c in cases:
        try:
            use = None
            if cal is not None:
                base = calibration(c.job.framework)
                use = base.with_overrides(**{k: getattr(cal, k) for k in FITTED})
            out.append(estimate_throughput(c.job, c.plan, use).tokens_per_s_per_gpu)
        except MeshplanError:
            out.append(float("nan"))
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else float("nan")


def _valid(cases: list[Case], preds: list[float]) -> tuple[list[Case], list[float]]:
    """Rows meshplan refuses (e.g. more pipeline stages than layers) are left out of every metric."""
    keep = [i for i, p in enumerate(preds) if p == p]
    return [cases[i] for i in keep], [preds[i] for i in keep]


def summarize(cases: list[Case], preds: list[float]) -> dict:
    cases, preds = _valid(cases, preds)
    errs = [abs(p / c.measured_tps - 1) for c, p in zip(cases, preds, strict=True) if p == p]
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(c.group, []).append(i)
    rhos, top_ok, n_groups = [], 0, 0
    for idx in groups.values():
        if len(idx) < 3:
            continue
        meas = [cases[i].measured_tps for i in idx]
        pred = [preds[i] for i in idx]
        rhos.append(spearman(pred, meas))
        n_groups += 1
        top = max(range(len(idx)), key=pred.__getitem__)
        top_ok += meas[top] >= 0.9 * max(meas)
    return {
        "rows": len(errs),
        "median_abs_err": statistics.median(errs) if errs else float("nan"),
        "p90_abs_err": sorted(errs)[int(0.9 * (len(errs) - 1))] if errs else float("nan"),
        "groups": n_groups,
        "median_spearman": statistics.median(rhos) if rhos else float("nan"),
        "min_spearman": min(rhos) if rhos else float("nan"),
        "top1_within_90pct": top_ok / n_groups if n_groups else float("nan"),
    }


def per_group(cases: list[Case], preds: list[float]) -> list[tuple[str, int, float, float, bool]]:
    cases, preds = _valid(cases, preds)
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(c.group, []).append(i)
    out = []
    for name, idx in groups.items():
        meas = [cases[i].measured_tps for i in idx]
        pred = [preds[i] for i in idx]
        err = statistics.median(abs(p / m - 1) for p, m in zip(pred, meas, strict=True))
        top = max(range(len(idx)), key=pred.__getitem__)
        rho = spearman(pred, meas) if len(idx) >= 3 else float("nan")
        out.append((name, len(idx), err, rho, meas[top] >= 0.9 * max(meas)))
    return out


# --------------------------------------------------------------------------- fitting


def _encode(cal: Calibration) -> list[float]:
    out = []
    for k in FITTED:
        v = getattr(cal, k)
        if k in FRACTIONS:
            v = min(max(v, 1e-4), 1 - 1e-4)
            out.append(math.log(v / (1 - v)))
        else:
            out.append(math.log(max(v, 1e-12)))
    return out


def _decode(x: list[float], base: Calibration) -> Calibration:
    values = {}
    for k, v in zip(FITTED, x, strict=True):
        v = min(max(v, -60.0), 60.0)  # a fraction driven to 0 or 1 must not overflow exp()
        values[k] = 1 / (1 + math.exp(-v)) if k in FRACTIONS else math.exp(v)
    return base.with_overrides(**values)


def fit(cases: list[Case], start: Calibration, max_evals: int = 800, stride: int = 3) -> Calibration:
    """Nelder-Mead on every `stride`-th row (for speed: ~0.1 s per evaluation), at most `max_evals` evaluations."""
    from scipy.optimize import minimize  # bench-only dependency

    cases = cases[::stride]

    def loss(x: list[float]) -> float:
        cal = _decode(list(x), start)
        preds = predict(cases, cal)
        # Robust (Cauchy) loss on the log ratio: the sweep has a tail of pathological runs (cross-node
        # pipelines at 1-5% MFU) that a least-squares fit would chase at the expense of the bulk.
        errs = [math.log1p((math.log(p / c.measured_tps) / 0.15) ** 2)
                for c, p in zip(cases, preds, strict=True) if p == p and p > 0]
        return statistics.fmean(errs)

    res = minimize(loss, _encode(start), method="Nelder-Mead",
                   options={"maxfev": max_evals, "xatol": 1e-3, "fatol": 1e-5, "adaptive": True})
    return _decode(list(res.x), start)


# A run is "stalled" when one micro-batch takes >= STALL_S measured seconds (step / grad_acc). In the
# sweep such runs sit at 0.9-3 s per micro-batch whatever the model (1B or 80B), micro-batch size, TP or
# PP degree, so the time is not work; the same layout is often fast in a sibling run. They are 100% of the
# pipeline rows at 64 nodes, 20-50% at 16-32 nodes and rare at 1-4 nodes (bench/README.md). Most of them
# (the pp > 1 ones) ran nanotron's polled p2p, `polled` below; the threshold also catches 80B runs whose
# micro-batch is that long by its work.
STALL_S = 0.9

P2P_POLLING = HERE / "data" / "playbook_sweep_p2p.yaml"


@dataclass(frozen=True)
class P2pPolling:
    """nanotron bench2 67c5ebb6's pipeline p2p: every metadata message polled with a fixed sleep
    (bench/data/playbook_sweep_p2p.yaml, with its source)."""

    poll_interval_s: float
    metadata_messages_per_tensor: int
    end_stage_tensors: int
    middle_stage_tensors: int
    signature_fraction: float

    def floor_s(self, pp: int) -> float:
        """The least host time the polling adds per micro-batch on the pipeline's busiest stage: one sleep per
        metadata message of every tensor the stage sends or receives (a middle stage's where pp > 2)."""
        if pp == 1:
            return 0.0
        tensors = self.middle_stage_tensors if pp > 2 else self.end_stage_tensors
        return self.poll_interval_s * self.metadata_messages_per_tensor * tensors


def p2p_polling(path: Path = P2P_POLLING) -> P2pPolling:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    tensors = data["tensors_per_micro_batch"]
    return P2pPolling(float(data["poll_interval_s"]), int(data["metadata_messages_per_tensor"]),
                      int(tensors["end_stage"]), int(tensors["middle_stage"]), float(data["signature_fraction"]))


def excess_floors(c: Case, predicted_tps: float, polling: P2pPolling) -> float:
    """How many polling floors (P2pPolling.floor_s) a pp > 1 run's measured step exceeds meshplan's estimate by,
    per micro-batch; nan for pp = 1 or a refused estimate. Over the sweep it is bimodal: about 0, or 1.1-2.0."""
    if c.plan.pp == 1 or predicted_tps != predicted_tps:
        return float("nan")
    tokens = c.job.seq_length * c.job.global_batch_size
    measured_s, predicted_s = (tokens / (tps * c.job.num_gpus) for tps in (c.measured_tps, predicted_tps))
    micro_batches = c.job.global_batch_size // (c.plan.dp * c.plan.micro_batch_size)
    return (measured_s - predicted_s) / micro_batches / polling.floor_s(c.plan.pp)


def with_polling_tps(c: Case, predicted_tps: float, polling: P2pPolling) -> float:
    """The estimate with the polling floor added to every slot of the 1F1B step (grad_acc + pp - 1 micro-batch
    slots on the busiest stage's cadence): the mechanism's check on the polled runs, not a score (which runs
    polled is read from their own excess)."""
    tokens = c.job.seq_length * c.job.global_batch_size
    micro_batches = c.job.global_batch_size // (c.plan.dp * c.plan.micro_batch_size)
    step_s = tokens / (predicted_tps * c.job.num_gpus) + polling.floor_s(c.plan.pp) * (micro_batches + c.plan.pp - 1)
    return tokens / step_s / c.job.num_gpus


def polled(c: Case, predicted_tps: float, polling: P2pPolling) -> bool:
    """Whether a sweep run measured nanotron bench2's polled p2p: pp > 1 and at least signature_fraction of the
    polling floor per micro-batch beyond the estimate (meshplan models main's p2p, which does not poll)."""
    floors = excess_floors(c, predicted_tps, polling)
    return floors == floors and floors >= polling.signature_fraction


def measured_seconds_per_microbatch(c: Case) -> float:
    step = c.job.seq_length * c.job.global_batch_size / (c.measured_tps * c.job.num_gpus)
    return step / c.job.global_batch_size * c.plan.micro_batch_size * c.plan.dp


def stalled(c: Case) -> bool:
    return measured_seconds_per_microbatch(c) >= STALL_S


def _print_polled(sweep: list[Case], preds: list[float], polling: P2pPolling) -> None:
    """The sweep split by the pipeline p2p its runs measured (`polled`), with the polled runs' excess per
    micro-batch in floors by pp (the mechanism's check: at least 1 wherever the polling ran)."""
    flags = [polled(c, p, polling) for c, p in zip(sweep, preds, strict=True)]
    n_polled = sum(flags)
    print(f"  pp > 1 runs that measured nanotron bench2's polled p2p (excess >= {polling.signature_fraction} x the "
          f"floor of {polling.poll_interval_s} s per metadata message; bench/data/playbook_sweep_p2p.yaml): "
          f"{n_polled} rows")
    for pp in sorted({c.plan.pp for c, f in zip(sweep, flags, strict=True) if f}):
        floors = [excess_floors(c, p, polling) for c, p, f in zip(sweep, preds, flags, strict=True)
                  if f and c.plan.pp == pp]
        print(f"    pp {pp:2d}: {len(floors):3d} runs, floor {polling.floor_s(pp):.1f} s per micro-batch, measured "
              f"excess {min(floors):.2f}-{max(floors):.2f} floors (median {statistics.median(floors):.2f})")
    runs = [(c, p) for c, p, f in zip(sweep, preds, flags, strict=True) if f]
    plain = statistics.median(abs(p / c.measured_tps - 1) for c, p in runs) if runs else float("nan")
    floored = statistics.median(abs(with_polling_tps(c, p, polling) / c.measured_tps - 1)
                                for c, p in runs) if runs else float("nan")
    print(f"    the polled runs with the floor added to each of the step's grad_acc + pp - 1 slots: median |err| "
          f"{floored:.1%} ({plain:.1%} without; a check of the mechanism, not a score)")
    keep = [i for i, f in enumerate(flags) if not f]
    _print_summary("  without the polled runs", summarize([sweep[i] for i in keep], [preds[i] for i in keep]))
    keep = [i for i in keep if not stalled(sweep[i])]
    _print_summary("  without the polled or stalled runs",
                   summarize([sweep[i] for i in keep], [preds[i] for i in keep]))


def _print_summary(title: str, s: dict) -> None:
    print(f"{title}: {s['rows']} rows, median |err| {s['median_abs_err']:.1%}, p90 {s['p90_abs_err']:.1%}; "
          f"{s['groups']} groups: median Spearman {s['median_spearman']:.2f} (min {s['min_spearman']:.2f}), "
          f"top-1 >= 90% of best in {s['top1_within_90pct']:.0%}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    ap.add_argument("--fit", choices=["all", "half"], help="Refit the fitted constants (needs scipy): on all "
                    "rows, or on half the groups / on 1B+3B with the rest held out")
    ap.add_argument("--groups", action="store_true", help="Print every sweep group")
    ap.add_argument("--only", help="With --fit: refit only these comma-separated constants (the others stay at "
                    "the card's values), e.g. the data-parallel ones after a change to the DP structure")
    args = ap.parse_args(argv)
    if args.only:
        global FITTED
        only = tuple(k.strip() for k in args.only.split(",") if k.strip())
        unknown = [k for k in only if k not in FITTED]
        if unknown:
            print(f"--only: {unknown} are not fitted constants; choose among {', '.join(FITTED)}", file=sys.stderr)
            return 2
        FITTED = only
    if not args.validation.is_dir():
        print(f"validation data not found at {args.validation}", file=sys.stderr)
        return 2
    sweep = sweep_cases(args.validation)
    classic = classic_cases() + golden_cases(args.validation)
    base = calibration("nanotron")

    if args.fit == "half":
        names = sorted({c.group for c in sweep})
        half_a = {g for i, g in enumerate(names) if i % 2 == 0}
        train = [c for c in sweep if c.group in half_a]
        test = [c for c in sweep if c.group not in half_a]
        cal_half = fit(train, base)
        print(f"fit on {len(train)} rows of {len(half_a)} groups (every other group, sorted by name)")
        _print_summary("  train half", summarize(train, predict(train, cal_half)))
        test_preds = predict(test, cal_half)
        _print_summary("  held-out half", summarize(test, test_preds))
        polling, card_preds = p2p_polling(), predict(test, None)  # which runs polled, read at the card's constants
        rest = [i for i, c in enumerate(test) if not polled(c, card_preds[i], polling)]
        _print_summary("  held-out half without the polled runs",
                       summarize([test[i] for i in rest], [test_preds[i] for i in rest]))
        no80 = [c for c in sweep if not c.group.startswith("80B")]
        only80 = [c for c in sweep if c.group.startswith("80B")]
        cal_small = fit(no80, base)
        preds80 = predict(only80, cal_small)
        _print_summary("fit on 1B+3B, test on 80B", summarize(only80, preds80))
        card80 = predict(only80, None)
        rest = [i for i, c in enumerate(only80) if not polled(c, card80[i], polling)]
        _print_summary("  80B without the polled runs",
                       summarize([only80[i] for i in rest], [preds80[i] for i in rest]))
        for k in FITTED:
            print(f"  {k}: half-fit {getattr(cal_half, k):.4g}, 1B+3B fit {getattr(cal_small, k):.4g}")
        return 0
    if args.fit == "all":
        cal_all = fit(sweep, base)
        print("fit on all sweep rows; constants for cards/calibration.yaml:")
        for k in FITTED:
            print(f"  {k}: {getattr(cal_all, k):.4g}")
        _print_summary("  all rows, all-fit", summarize(sweep, predict(sweep, cal_all)))
        return 0

    t0 = time.perf_counter()
    preds = predict(sweep, None)
    elapsed = time.perf_counter() - t0
    _print_summary("playbook sweep (card constants)", summarize(sweep, preds))
    refused = [c for c, p in zip(sweep, preds, strict=True) if p != p]
    for c in refused:
        print(f"  refused by meshplan (left out): {c.group} {c.plan.short()} ({c.job.model.num_layers} layers)")
    print(f"  {len(sweep)} estimates in {elapsed:.2f} s ({elapsed / len(sweep) * 1e3:.2f} ms each)")
    for model in ("1B", "3B", "80B"):
        sub = [(c, p) for c, p in zip(sweep, preds, strict=True) if c.group.startswith(model + " ") and p == p]
        errs = [abs(p / c.measured_tps - 1) for c, p in sub]
        print(f"  {model}: {len(sub)} rows, median |err| {statistics.median(errs):.1%}")
    keep = [i for i, c in enumerate(sweep) if not stalled(c)]
    _print_summary(f"  without stalled runs (>= {STALL_S} s per micro-batch measured; {len(sweep) - len(keep)} rows)",
                   summarize([sweep[i] for i in keep], [preds[i] for i in keep]))
    _print_polled(sweep, preds, p2p_polling())
    for lo, hi in ((1, 4), (16, 32), (64, 64)):
        idx = [i for i, c in enumerate(sweep) if lo <= c.job.num_gpus // 8 <= hi]
        _print_summary(f"  {lo}-{hi} nodes", summarize([sweep[i] for i in idx], [preds[i] for i in idx]))
    if args.groups:
        for name, n, err, rho, ok in sorted(per_group(sweep, preds)):
            print(f"  {name:18s} n={n:4d} median|err| {err:6.1%} spearman {rho:5.2f} top1 {'ok' if ok else 'MISS'}")
    cpreds = predict(classic, None)
    print("classic tables (estimators.md 5.2) and Megatron golden 7B:")
    for c, p in zip(classic, cpreds, strict=True):
        print(f"  {c.source:18s} {c.job.model.name:14s} {c.plan.short():22s} measured {c.measured_tps:9.0f} "
              f"predicted {p:9.0f} tok/s/GPU ({p / c.measured_tps - 1:+.0%})")
    errs = [abs(p / c.measured_tps - 1) for c, p in zip(classic, cpreds, strict=True)]
    print(f"  classic median |err| {statistics.median(errs):.1%} over {len(errs)} rows")
    for source in dict.fromkeys(c.source for c in classic):
        sub = [abs(p / c.measured_tps - 1) for c, p in zip(classic, cpreds, strict=True) if c.source == source]
        signed = [p / c.measured_tps - 1 for c, p in zip(classic, cpreds, strict=True) if c.source == source]
        print(f"    {source:18s} {len(sub):2d} rows: median |err| {statistics.median(sub):.1%}, "
              f"median signed {statistics.median(signed):+.1%}")
    h100 = [abs(p / c.measured_tps - 1) for c, p in zip(classic, cpreds, strict=True) if c.job.gpu.key == "h100"]
    print(f"    H100 rows (Megatron-Core 2024 + golden) {len(h100)} rows: median |err| {statistics.median(h100):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
