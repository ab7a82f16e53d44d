"""How close meshplan's throughput model comes to Megatron-Bridge's published training throughput.

Data: bench/data/megatron_bridge_published.csv, transcribed from Megatron-Bridge's performance summary
(NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md and docs/performance-summary-archive.md,
releases 25.11 and 26.02; tokens/s per GPU as published). Kept: the systems in cards/hardware.yaml
(DGX-H100, DGX-B200, DGX-GB200, DGX-B300, DGX-GB300) and the precisions meshplan models (BF16; FP8 delayed/current
scaling and MXFP8 are all timed as `fp8`); left out: NVFP4 (meshplan has no FP4 precision), and the token-drop rows
(the MoE rows kept are dropless with force-balanced routing, which is what the model assumes). The Blackwell Ultra
rows (b300, gb300: 20 of them, added 2026-12-06) came after every constant of the card was set: none is fitted on
them (HELD_OUT_SYSTEMS: fit_cases, which every fit reads, leaves them out; they are scored, never fitted).

This is the only measured data with expert parallelism, context parallelism, FP8, Megatron-FSDP and
Blackwell GPUs, so it checks the terms ../shared/validation cannot. Settings the tables do not give are
assumptions, the same for every row: expert TP 1, sequence parallelism whenever TP > 1, the
distributed optimizer (ZeRO-1) unless FSDP is on (ZeRO-3, i.e. Megatron-FSDP), no CUDA-graph or
overlap flags beyond meshplan's Megatron defaults. Recompute is the preset's of the row's release where it took
effect (published_runs.BRIDGE_PERF_PRESET_RECOMPUTE, each entry's source; none elsewhere; before 2026-12-07 none
for every row). The `dispatcher` column is read from Bridge's performance
configs (scripts/performance/configs/*/..._workload_base_configs.py: rows whose preset sets
moe_flex_dispatcher_backend are `flex`); those files are newer than some of the published rows, so it is
an assumption too. It moves the EP traffic (flex sends a token once per destination rank and, across nodes, once per
destination node; alltoall every routed copy: comm.dispatch_time). Qwen3-30B-A3B's rows read the preset of their own
release: a preset that sets no moe_flex_dispatcher_backend leaves Megatron-Bridge's Qwen3-MoE provider default,
alltoall (qwen_provider.py moe_token_dispatcher_type "alltoall"; training/flex_dispatcher_backend.py
apply_flex_dispatcher_backend returns on None, "Not a valid flex dispatcher backend"): B200 at v0.2.0 (25.11) and
v0.3.0 (26.02), H100 at v0.2.0, all `alltoall`; H100 at v0.3.0 sets deepep
(scripts/performance/configs/qwen/qwen3_workload_base_configs.py, added by "qwen x86 flex backend", #2351) and GB200
hybridep, `flex` (B200 moved to hybridep and micro-batch 4 only in #2499, after 26.02). DeepSeek-V3's and
GPT-OSS-120B's rows read their release's preset the same way (their providers' default is alltoall too:
deepseek_provider.py, gpt_oss_provider.py): DeepSeek-V3 on B200 sets no backend at v0.2.0
(configs/deepseek/workload_base_configs.py DEEPSEEK_V3_B200_BASE_CONFIG), so 25.11 is `alltoall`, and hybridep at
v0.3.0 (DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1, which v0.3.0's apply_flex_dispatcher_backend takes on any sm100 GPU),
so 26.02 is `flex`; GB200 and H100 set hybridep / deepep at both. GPT-OSS-120B sets no backend at v0.2.0 or v0.3.0
(configs/gpt_oss/*workload_base_configs.py), so every GPT-OSS row is `alltoall`. The `flex_backend` column is the
backend each flex row's preset set (v0.3.0 21b02e0cf scripts/performance/configs/{deepseek/deepseek,qwen/qwen3}_
workload_base_configs.py: hybridep for GB200, GB300, B200 (DeepSeek-V3) and B300, deepep for H100 Qwen3-30B-A3B;
v0.2.0 7af9601c9 configs/{deepseek,qwen3}/workload_base_configs.py: hybridep for GB200 and GB300; 25.09's H100
DeepSeek-V3, v0.1.0rc4 run_script.py enable_deepep on H100: deepep), passed as moe_flex_backend, so 26.02's B200
DeepSeek-V3 row and B300's, which ran HybridEP inside one 8-GPU node, are timed as HybridEP (before 2026-12-06,
flex57: as DeepEP, the machine's backend). The GB300 and B300 rows read their release's presets the same way
(v0.3.0 configs/*/*_workload_base_configs.py *_GB300_* / *_B300_*, v0.2.0 configs/*/workload_base_configs.py
*_GB300_*): DeepSeek-V3 and Qwen3-30B-A3B set hybridep on both parts and Qwen3-235B-A22B on GB300, `flex`; B300's
Qwen3-235B-A22B sets no backend (alltoall) and moe_a2a_overlap=True, on; GPT-OSS-120B none, `alltoall`. So B300's
DeepSeek-V3 and Qwen3-30B-A3B rows, which ran HybridEP inside one 8-GPU node, are timed as HybridEP (the
flex_backend column), as 26.02's B200 one is. 25.11's GB200 and GB300 DeepSeek-V3 rows ("w/o MTP", GBS 4096) ran
the configs of the branch gaod/r0.2.0_test (r0.2.0 + 4fabba48d, d19cb73c8, 2025-12-05: its presets are the table's
GB200 PP4 VP4 EP64 and GB300 PP2 EP32 layouts), which pass the layout "Et*3|(t*4|)*14ttL" with mtp_num_layers None
(published_runs.BRIDGE_PERF_PRESET_SPLIT, preset_split_fields): 16 virtual stages, so VPP 4 at PP4, 2 at PP8 and 8
at PP2, as Megatron-Core derives it from the layout (its TransformerConfig refuses any other VPP beside a layout);
the table prints VP 4 for all three, its presets' field. Before 2026-12-07 meshplan refused the PP8 and PP2 rows
(PP001: no helper row or perf-recipe string at (8, 4) or (2, 4) without MTP) and read the PP4 one with the helper's
(4, 4) row, MTP dropped.
The precision column's MXFP8 is passed as Transformer Engine's mxfp8 recipe, its FP8 (FP8-CS) as the
card's default tensorwise current scaling (the table's parenthesised blockwise figures are not transcribed); the
recipe sets how many quantize kernels each local expert's grouped GEMM launches (the framework card's
grouped_gemm_launches). Not recorded: the CUDA-graph scope of each preset (attn / moe_router / moe_preprocess on
the Blackwell MoE rows, none on H100 FP8): meshplan's cuda_graph_impl / cuda_graph_modules time such graphs as eager
(throughput_assumptions.cuda_graph_assumption), since none of these scopes covers the routed experts' grouped GEMMs,
whose launches the estimate floors, nor removes the dispatcher's host sync (Megatron-Core token_dispatcher.py: with
moe_preprocess captured, the alltoall dispatcher's device-to-host copy moves to before_ep_alltoall, still a sync).
The `tp_comm_overlap` column is read from the same perf recipes: the Llama rows with TP > 1 run
Transformer Engine's userbuffers (src/megatron/bridge/perf_recipes/llama/*: tp_comm_overlap_cfg on the base recipes'
tp_comm_overlap=True, recipes/llama/h100/llama3.py; NVFP4 turns it off, and those rows are left out), Qwen3-235B on
H100 sets tp_comm_overlap=False (perf_recipes/qwen/h100/qwen3_moe.py), DeepSeek-V3 on H100 leaves it unset (off).
The `moe_a2a_overlap` column (the plan's moe_a2a_overlap: Megatron-Core overlap_moe_expert_parallel_comm with
delay_wgrad_compute, one micro-batch's EP all-to-all hidden behind another's compute) is read from the launcher of the
row's own release, not today's recipes: WorkloadBaseConfig.moe_a2a_overlap of
scripts/performance/configs/*/*workload_base_configs.py at Bridge v0.3.0 (26.02) and v0.2.0 (25.11), which
utils/overrides.py _set_moe_a2a_overlap_overrides (v0.2.0 utils/helpers.py set_moe_a2a_overlap_overrides) turns into
those two settings; for 25.09, v0.1.0rc4 scripts/performance/run_script.py (A2A_1F1B on H100 for DeepSeek-V3). On:
Qwen3-30B-A3B and Qwen3-235B-A22B on H100 (both releases), Qwen3-235B-A22B on B200 in 25.11, DeepSeek-V3 on H100
(25.09); off for every other row (the default False). Where the published layout differs from the preset of its
release (25.11 B200 Qwen3-235B VPP 2 vs the preset's 4; 25.11 H100 Qwen3-30B MBS 2 VPP 24 vs 1 and 12; 25.11 GB200
Qwen3-235B BF16 256 GPUs VPP 3 EP 32 vs the preset's 64, 1 and 8) the column still takes the preset's setting, an
assumption.
26.02's B300 Qwen3-235B-A22B row (+57%, the B300 rows' worst; 2026-12-07, lane hw61) is read as its release ran it:
v0.3.0's QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_FP8_CS_V1 (= FP8_MX, V2 at 256 GPUs) sets PP 8, VPP 4, EP 8 and
moe_a2a_overlap=True with no flex backend, as the table prints (VP 4), and 26.02.01 repeats it (2,644 against 2,691).
NVIDIA then withdrew both settings for B300, "disabling VP and moe_a2a_overlap" to match B200's preset (PR #2669,
592711afc, and #2706 on the release branch, 6f5e31aab, in v0.3.1); without them 26.04 and 26.04.01 ran B300 at
4,865 and 5,936 tokens/s (micro-batch 2), and 26.02's B200 row, the same layout without VPP or the overlap, 3,805
(-5%) where B300 with them ran 2,691. So the row measures a configuration its maintainers found slow: every Bridge
row that runs the overlap with an EP group inside one node reads fast (26.02 B300 Qwen3-235B +53%, 25.11 B200
Qwen3-235B +22%, H100 Qwen3-30B-A3B +22% / +80%), those whose EP spans nodes do not (H100 Qwen3-235B EP32 -10% / -10%,
DeepSeek-V3 EP64 +6%). Megatron-Bridge's docs say as much without a figure ("small-EP `alltoall` runs can be correct
but flat or slower", docs/training/communication-overlap.md at 067f987df). What the overlap costs, priced since
2026-12-07 (lane a2a61): Megatron-Core's combined 1F1B (core_v0.16.0 models/common/model_chunk_schedule_plan.py
TransformerLayerSchedulePlan.run) runs each layer's dispatch and combine on a communication stream beside the other
micro-batch's compute, and NCCL's all-to-all holds its p2p channels' CTAs (pow2Up of the ring's channels, NVIDIA/nccl
5067397c graph/paths.cc ncclTopoComputeP2pChannels: 32 of an H100's 132 SMs in a node, 16 across nodes; the flex
backend its own 20 or 32) for as long as it runs, so the hidden all-to-all costs that share of its seconds
(moe_time.overlapped_a2a, comm.alltoall_sm_share; the B300 row 3,817 plain -> 4,114 overlapped, was 4,219). On the one
measured pair (64 GB200, GPT-OSS-120B, EP 64, alltoall, 15,754 -> 16,640, +5.6%; read without recompute) the overlap
now gains +7.5% (23,916 -> 25,698), was +9.7%; +8.0% (25,617 -> 27,672) after the joint refit it needed
(2026-12-07, lane a2a62: 0.64 / 6 / 1.50 ms). It does not explain the in-node rows, and no cost the overlap adds can:
a cost bounded by the all-to-all it runs beside is larger across nodes (that is where the rows moved most), and the
in-node rows read fast without the overlap already (plain: B300 Qwen3-235B 3,817 against 2,691 measured, +42%; 25.11
B200 3,712, +14%; H100 Qwen3-30B-A3B 5,923, +16%, and 8,994, +70%), where the overlap gains them 5-8%: to match, it
would have to cost 14-42% of the step, more than the whole all-to-all it hides. Read and ruled out in core_v0.16.0:
the four stream pairings (combine backward beside attention forward, dispatch forward beside the experts' backward,
dispatch backward beside their weight gradients and the experts' forward, combine forward beside attention backward:
with an all-to-all shorter than its partner every cross-stream wait is covered); the dispatcher's host sync
(token_dispatcher.py: the device-to-host copy at before_permutation_1 inside the attention node, the sync in the
dispatch node after the other micro-batch's expert backward is issued, so more GPU work is queued across it than in
plain 1F1B, not less); what the overlap forbids (transformer_config.py __post_init__: full recompute and
recompute_method, moe / mlp CUDA-graph scopes, moe_shared_expert_overlap, MTP > 1: none of them set by these rows'
presets, Qwen3 has neither shared experts nor MTP); delay_wgrad_compute (the same weight-gradient GEMMs, run later);
the split layer's nodes (pipeline_parallel/utils.py ScheduleNode: an event wait and record per node, one
run_backward per node; no device synchronize). What is left is in the plain estimate of those layouts (PP2-PP8 with
VPP 2-24 at micro-batch 1-2: the same H100 Qwen3-30B-A3B layout ran 1.77x faster at 26.02.01, below), not the
overlap.
One row's micro-batch is not the table's: 25.11 H100 GPT-OSS-120B prints MBS 4 and GA 2 at GBS 512, PP 4, 64 GPUs,
which cannot both hold (GA = GBS / (MBS x DP): MBS 4 at DP 16 is GA 8; every other row of the 25.11 tables satisfies
it; both figures are the B200 row's above it). The preset of that release leaves BASE_GPT_OSS_120B_CONFIG's
micro_batch_size=1 on H100 (v0.2.0 scripts/performance/configs/gpt_oss/workload_base_configs.py
GPT_OSS_120B_H100_BF16_BASE_CONFIG: pipeline_model_parallel_size=4 only), as 26.02's row of the same preset prints
(MBS 1), so the row is read at micro-batch 1 (GA 32). One row's EP is not the table's: 25.11 B200 GPT-OSS-120B prints
EP 8, and the preset of its release sets expert_model_parallel_size=64 there (v0.2.0
GPT_OSS_120B_B200_BF16_BASE_CONFIG, its GBS 512 and MBS 4 as printed; GA does not involve EP, so the row's own
columns cannot tell). Bridge's later tables settle it (v0.5.0 docs/performance-summary-archive.md, GPT OSS 120B): the
same system at EP 8 (64 B200, MBS 4, GBS 1280: 26.02.01 13,722, 26.04 13,045, 26.04.01 13,568 tokens/s/GPU, the
presets that moved B200 to expert_model_parallel_size=8 in v0.4.0) runs 1.6-1.7x this row's 8,213, which is the
EP 64 rate (26.02's EP 64 row, GBS 1280: 8,047), so the row is read at EP 64 (+56% at EP 8, -3% at 64; before
2026-12-07 it was kept as printed).
GPT-OSS-120B on Blackwell reads 23-46% fast here (the EP 64 rows across InfiniBand aside), on H100 -4% / -6%. Ruled
out (2026-12-07): the EP all-to-all, the open candidate on NVL72 (the same 64-GB200 EP 64 layout measured 15,754 with
the alltoall dispatcher at 26.02.01, 15,938 with HybridEP and moe_a2a_overlap at 26.04 (v0.4.0
GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2) and 16,640 with alltoall and the overlap at 26.04.01, where meshplan moves
25,617 -> 28,464 / 27,672 (23,916 -> 27,270 / 26,237 before the all-to-all's SMs were counted and the
constants refitted): the time is not in the
all-to-all), and NVL72 itself (the later B200 and B300 rows at EP 8
inside one node read +22..+34% without their presets' recompute). What is left is a cost per token, not per
micro-batch nor per attention score: with the fitted per-micro-batch sync (cards/calibration.yaml moe_host_sync_s)
taken out, the GB200 rows miss 0.72-0.92 us per token per layer at micro-batch 1 and sequence 8192 (25.11) as at
micro-batch 4 and 4096 (26.02-26.04.01), B200 / B300 at EP 8 0.57-0.69 us, GB300 0.47-0.51 us (read without recompute;
the presets' recompute, read below, takes 0.04 us of it); attention's per-token share doubles from 4096 to 8192 and
the miss does not. The H100 rows are right by way of fitted constants that amortise where the Blackwell rows run: at
micro-batch 1 with 1,024 rows an expert the per-micro-batch sync and the expert GEMMs' rows curve
(cards/calibration.yaml moe_gemm_half_ridges, half the fraction there) add about 1.7 us per token per layer, at
GB200's micro-batch 4 with 32,768 rows an expert 0.2 us. Read, and pricing none of it: Transformer Engine v2.9 / v2.11
fused_attn.cpp nvte_get_fused_attn_backend (sink attention on cuDNN >= 9.13.1 with no architecture condition, the
window's (left, 0) on causal masks from cuDNN 9.2) and dot_product_attention/utils.py (sinks disable only
FlashAttention, FP8 attention, THD and non-a2a CP); Megatron-Core core_v0.16.0 experts.py TEGroupedMLP (fc1's bias in
the grouped GEMM, the fused weighted_bias_quick_geglu_impl behind the eager clamps, the per-expert fc2 bias loop: all
counted, cards/calibration.yaml activation_passes); Bridge v0.3.0 gpt_oss_provider.py (YaRN, window (128, 0) on every
other layer, learnable softmax, bias_dropout_fusion off) and scripts/performance/perf_plugins.py (nothing
GPT-OSS-specific). The two EP 64 rows across InfiniBand read -1% (B200) and +45% (B300, which measured B200's rate
though its card gives it twice B200's NIC). The 26.02 GB200, B200 and H100 presets recompute layernorm and moe_act,
the 25.11 ones set the same modules without effect (BRIDGE_PERF_PRESET_RECOMPUTE's note): read so, 26.02 GB200 +52% ->
+46%, B200 -1% -> -2%, H100 -4% -> -6%.
The same layout published at two releases bounds what one software state can fit. In this file's rows (same columns
but the release) 25.11 -> 26.02 moves 0.94x-1.10x (Llama-3.1-70B and 405B on GB200, Qwen3-30B-A3B on GB200 and
B200). Outside it (docs/performance-summary-archive.md) Qwen3-30B-A3B on 16 H100, FP8, TP1 PP2 VPP12 EP8, micro-batch
1, GBS 1024 ran 5,113 tok/s in 26.02 and 9,058 in 26.02.01 (1.77x; the dev set's mbridge_h100_qwen3_30b_16_fp8_pp2vp12
is the 26.02.01 run, so the two sets' signs differ on one layout), and 25.11's PP2 VPP24 micro-batch 2 layout (5,275)
ran 10,494 in 25.09 with token dropping (2.0x). Both slow H100 runs take the same time per token (micro-batch 2 at
VPP 24 and micro-batch 1 at VPP 12 within 4%), as do both fast ones (within 16%), where the estimate's per-micro-batch
MoE costs (moe_host_sync_s, the per-expert launches) make the first 1.64x faster per token. Per-chunk costs at one
layer per chunk do not close that: the output layer replayed in its own chunk (perf._chunk_seconds; its combined 1F1B
steps wait on it) takes +105% to +98% at VPP 24, every chunk's p2p exposed would add at most 13% to the step, where
matching 5,275 needs +98%. On B200 those per-micro-batch costs are borne out (26.02 micro-batch 1: 9,691;
26.02.01 micro-batch 4: 26,695, 2.75x, predicted 2.4-2.6x). Qwen3-235B-A22B moves 1.015x (GB200) and 0.99x (H100)
from 26.02 to 26.02.01; DeepSeek-V3 on B200 1.26x from 25.11 to 26.02 (its dispatcher changed too).

`--fit` refits the two Megatron-family constants these rows identify (cards/calibration.yaml
`gemm_peak_fraction`, `moe_host_sync_s`) by grid search on the median |log error| of this set plus the
classic Megatron tables of bench/throughput_accuracy.py, and scores held-out splits (fit on one part, score on
the other). The card holds the all-rows fit; without --fit the card's constants are used.

Run: python bench/bridge_published.py [--fit]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from production_sources import BRIDGE_TABLE_CSV, split_fields
from throughput_accuracy import DEFAULT_VALIDATION, Case, classic_cases, golden_cases

from meshplan.knowledge.published_runs import (
    BRIDGE,
    BRIDGE_PERF_CROSS_ENTROPY,
    BRIDGE_PERF_TABLE,
    RECIPE_SPLITS,
    bridge_perf_activation_fusion,
    bridge_perf_preset_recompute,
    bridge_perf_preset_split,
)

DATA = BRIDGE_TABLE_CSV
# Systems whose rows were transcribed after the card's constants were set: held out of every fit (bench/README.md).
HELD_OUT_SYSTEMS = frozenset({"b300", "gb300"})


def cases(path: Path = DATA):
    """(row, job, plan) for every published row."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            tp, pp, cp, ep = int(r["tp"]), int(r["pp"]), int(r["cp"]), int(r["ep"])
            gpus = int(r["gpus"])
            req = Request(
                model=r["model"], gpu=r["system"], num_gpus=gpus, framework="megatron-bridge",
                precision="bf16" if r["precision"] == "bf16" else "fp8",
                # the table's MXFP8 is Transformer Engine's mxfp8 recipe, its FP8 / FP8-CS the card's default
                # (Megatron-Bridge's tensorwise current scaling)
                fp8_recipe="mxfp8" if r["precision"] == "mxfp8" else None,
                seq_length=int(r["seq"]), global_batch_size=int(r["gbs"]), micro_batch_size=int(r["mbs"]),
                tp=tp, pp=pp, vpp=int(r["vp"]), cp=cp, ep=ep, etp=1 if ep > 1 else None,
                dp=gpus // (tp * pp * cp), sequence_parallel=tp > 1,
                zero_stage=3 if int(r["fsdp"]) else 1,
                # the recompute the row's release preset set where it took effect (published_runs.
                # BRIDGE_PERF_PRESET_RECOMPUTE), else none
                **preset_recompute_fields(r),
                moe_token_dispatcher=r["dispatcher"] if ep > 1 else None,
                # the backend the release's preset set (the flex_backend column), not the machine's
                moe_flex_backend=(r["flex_backend"] or None) if ep > 1 and r["dispatcher"] == "flex" else None,
                tp_comm_overlap=r["tp_comm_overlap"] == "1",
                moe_a2a_overlap=r["moe_a2a_overlap"] == "1" if ep > 1 else None,
                # the performance launchers reduce gradients in bf16 (published_runs.BRIDGE_PERF_TABLE, the fact the
                # dev rows of the same tables get from production_sources.perf_table_fields)
                grad_reduce_in_fp32=False,
                # and turn the fused bias + activation on for the Qwen families, whose provider leaves it off
                # (published_runs.BRIDGE_PERF_ACTIVATION_FUSION, production_sources.perf_table_fields for the dev rows)
                bias_activation_fusion=True if bridge_perf_activation_fusion(
                    BRIDGE_PERF_TABLE, resolve_model(r["model"]).model_type) else None,
                # Transformer Engine's fused cross-entropy, set by every release's launcher
                # (published_runs.BRIDGE_PERF_CROSS_ENTROPY; production_sources.perf_table_fields for the dev rows)
                **BRIDGE_PERF_CROSS_ENTROPY,
            )
            split = preset_split_fields(r) or recipe_split_fields(r["model"], pp, int(r["vp"]), int(r["mtp"]))
            if split:
                req = req.model_copy(update=split)
            job, plan = resolve(req)
            if int(r["mtp"]) == 0 and job.model.num_mtp_layers:
                job = job.model_copy(update={"model": job.model.model_copy(update={"num_mtp_layers": 0})})
            out.append((r, job, plan))
    return out


def fit_cases(path: Path = DATA):
    """cases() less the rows of HELD_OUT_SYSTEMS: what a fit of the card's constants may read (this module's --fit,
    moe_fit.rows, fitted_constants.megatron_pool)."""
    return [(r, job, plan) for r, job, plan in cases(path) if r["system"] not in HELD_OUT_SYSTEMS]


def preset_recompute_fields(row: dict[str, str]) -> dict[str, Any]:
    """The recompute the performance preset of the row's release set and ran (published_runs.
    bridge_perf_preset_recompute), as Request fields; recompute none where it set none or it did not take effect."""
    preset = bridge_perf_preset_recompute(row["release"], row["system"], row["model"])
    return {"recompute": "none"} if preset is None else preset.fields()


def preset_split_fields(row: dict[str, str]) -> dict[str, Any]:
    """The layout and MTP depth the performance config of the row's release passed for its system and model
    (published_runs.bridge_perf_preset_split), as Request fields, with vpp left to the layout (Megatron-Core derives
    it from the layout's stages and refuses another: the table prints its preset's VP, which the layout overrules);
    {} where none is recorded or the row's MTP column is not the config's depth."""
    preset = bridge_perf_preset_split(row["release"], row["system"], row["model"])
    if preset is None or preset.mtp_num_layers != int(row["mtp"]):
        return {}
    return preset.fields() | {"vpp": None}


def recipe_split_fields(model: str, pp: int, vpp: int, mtp: int) -> dict[str, str | bool]:
    """The pipeline split Megatron-Bridge's recipes set for the row's model at its pp/vpp (the package's
    published_runs.RECIPE_SPLITS, the same entries the production rows read), as Request fields; {} where the
    layers split evenly or no Bridge recipe sets one (Megatron-Core then refuses an uneven split, rule PP001)."""
    if pp == 1:
        return {}
    found = [s for s in RECIPE_SPLITS if s.repo == BRIDGE and s.model == model and s.pp in (None, pp)
             and s.vpp in (None, vpp) and not s.section]
    fields = [f for s in found if (f := split_fields(s, mtp)) is not None]
    return fields[0] if fields else {}


def megatron_rows() -> tuple[list[Case], list[Case]]:
    """(Bridge published rows, classic Megatron tables + golden 7B), as throughput_accuracy's Cases."""
    bridge = [Case("Megatron-Bridge", f"{r['system']} {r['model']}", job, plan, float(r["tokens_per_s_per_gpu"]))
              for r, job, plan in cases()]
    return bridge, classic_cases() + golden_cases(DEFAULT_VALIDATION)


def log_errors(rows: list, **overrides: float) -> list[float]:
    """log(predicted / measured) of every row meshplan can time, with the given constants overridden (any row with
    .job, .plan and .measured_tps: moe_fit's rows too)."""
    out = []
    for c in rows:
        cal = calibration(c.job.framework).with_overrides(**overrides)
        try:
            pred = estimate_throughput(c.job, c.plan, cal).tokens_per_s_per_gpu
        except MeshplanError:
            continue
        out.append(math.log(pred / c.measured_tps))
    return out


def median_abs(log_errs: list[float]) -> float:
    return statistics.median(abs(math.exp(e) - 1) for e in log_errs)


GRID = {
    "gemm_peak_fraction": [round(0.60 + 0.02 * i, 2) for i in range(14)],
    "moe_host_sync_s": [round(0.5e-3 * i, 4) for i in range(17)],
}


def fit(rows: list[Case]) -> dict[str, float]:
    """Grid search of the two constants on the median |log error| (robust to the few rows far off)."""
    best: tuple[float, dict[str, float]] | None = None
    for g in GRID["gemm_peak_fraction"]:
        for mo in GRID["moe_host_sync_s"]:
            ov = {"gemm_peak_fraction": g, "moe_host_sync_s": mo}
            loss = statistics.median(abs(e) for e in log_errors(rows, **ov))
            if best is None or loss < best[0]:
                best = (loss, ov)
    assert best is not None
    return best[1]


def run_fit() -> None:
    bridge, classic = megatron_rows()
    bridge = [c for c in bridge if c.job.gpu.key not in HELD_OUT_SYSTEMS]  # scored by main, never fitted
    everything = bridge + classic
    moe = [c for c in bridge if c.job.model.moe is not None]
    dense_bridge = [c for c in bridge if c.job.model.moe is None]
    h100 = [c for c in everything if c.job.gpu.key == "h100"]
    other = [c for c in everything if c.job.gpu.key != "h100"]
    splits = [
        ("all Megatron rows", everything, [("Bridge", bridge), ("classic", classic)]),
        ("Bridge rows", bridge, [("classic (held out)", classic)]),
        ("classic + Bridge MoE", classic + moe, [("Bridge dense (held out)", dense_bridge)]),
        ("H100 rows", h100, [("A100/B200/GB200 (held out)", other)]),
        ("A100/B200/GB200 rows", other, [("H100 (held out)", h100)]),
    ]
    print("| fitted on | rows | gemm_peak_fraction | moe_host_sync_s | scored on | median abs error |")
    print("|---|---|---|---|---|---|")
    for name, train, tests in splits:
        ov = fit(train)
        for tname, test in tests:
            errs = log_errors(test, **ov)
            print(f"| {name} | {len(train)} | {ov['gemm_peak_fraction']:.2f} | "
                  f"{ov['moe_host_sync_s'] * 1e3:.1f} ms | {tname} ({len(errs)}) | {median_abs(errs):.1%} |")
    for m in sorted({c.job.model.name for c in moe}):
        train = [c for c in everything if c.job.model.name != m]
        ov = fit(train)
        errs = log_errors([c for c in moe if c.job.model.name == m], **ov)
        print(f"| all but {m} | {len(train)} | {ov['gemm_peak_fraction']:.2f} | "
              f"{ov['moe_host_sync_s'] * 1e3:.1f} ms | {m} (held out, {len(errs)}) | {median_abs(errs):.1%} |")


# The columns that make two rows the same run on two systems: release, model, precision and every layout and
# dispatcher setting the table or its presets give (the measured figure and its MFU aside).
SAME_RUN_COLUMNS = ("release", "model", "mtp", "gpus", "precision", "gbs", "mbs", "seq", "fsdp", "tp", "pp", "cp",
                    "vp", "ep", "dispatcher", "tp_comm_overlap", "moe_a2a_overlap", "flex_backend")


def same_run_pairs(rows: list[dict[str, str]]) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Pairs of rows that ran the same release, model, precision and layout on two systems (SAME_RUN_COLUMNS equal,
    `system` not), each pair once, in the file's order: what sets a part's measured speed beside another's with
    nothing else changed, so a per-part term the estimate lacks shows as measured / predicted ratios that differ."""
    pairs = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            if a["system"] != b["system"] and all(a[c] == b[c] for c in SAME_RUN_COLUMNS):
                pairs.append((a, b))
    return pairs


def print_pairs() -> None:
    """Each same-run pair (same_run_pairs): its measured tokens/s per GPU ratio beside the predicted one."""
    predicted: dict[int, float] = {}
    table = []
    for r, job, plan in cases():
        try:
            predicted[id(r)] = estimate_throughput(job, plan).tokens_per_s_per_gpu
        except MeshplanError:
            continue
        table.append(r)
    print("Same run on two systems (tokens/s per GPU, second / first):")
    for a, b in same_run_pairs(table):
        measured = float(b["tokens_per_s_per_gpu"]) / float(a["tokens_per_s_per_gpu"])
        pred = predicted[id(b)] / predicted[id(a)]
        print(f"  {a['release']} {a['model']:16s} {a['precision']:6s} {b['system']:6s}/{a['system']:6s} "
              f"measured {measured:5.2f} predicted {pred:5.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the Megatron-family constants, with held-out splits")
    parser.add_argument("--pairs", action="store_true",
                        help="the rows that ran the same layout on two systems: measured and predicted ratios")
    args = parser.parse_args()
    if args.fit:
        run_fit()
        return 0
    if args.pairs:
        print_pairs()
        return 0
    rows = []
    for r, job, plan in cases():
        measured = float(r["tokens_per_s_per_gpu"])
        try:
            pred = estimate_throughput(job, plan).tokens_per_s_per_gpu
        except MeshplanError as exc:
            print(f"  refused: {r['release']} {r['system']} {r['model']}: {exc}")
            continue
        moe = job.model.moe is not None
        rows.append((r, moe, measured, pred))
        print(f"  {r['release']} {r['system']:6s} {r['model']:16s} {r['precision']:6s} {plan.short():30s} "
              f"mbs{plan.micro_batch_size} measured {measured:7.0f} predicted {pred:7.0f} ({pred / measured - 1:+.0%})")

    def report(label, sub):
        if not sub:
            return
        errs = [abs(p / m - 1) for _, _, m, p in sub]
        signed = [p / m - 1 for _, _, m, p in sub]
        print(f"  {label:28s} {len(sub):2d} rows: median |err| {statistics.median(errs):6.1%}, "
              f"median signed {statistics.median(signed):+6.1%}")

    print("Megatron-Bridge published throughput (releases 25.11, 26.02), card constants, nothing fitted:")
    report("all", rows)
    report("dense", [x for x in rows if not x[1]])
    report("MoE (expert parallel)", [x for x in rows if x[1]])
    for gpu in dict.fromkeys(x[0]["system"] for x in rows):  # each system of the table, in the file's order
        report(gpu, [x for x in rows if x[0]["system"] == gpu])
    return 0


if __name__ == "__main__":
    sys.exit(main())
