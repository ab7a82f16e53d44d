"""What the launchers, recipes and releases behind published training runs set, with their sources.

A run published with a framework's launcher or recipe ran that launcher's settings even where its write-up does not
state them: Megatron-Bridge's performance tables reduce gradients in bf16, its recipes set each big model's pipeline
split, verl's example scripts pack micro-batches to a token budget, and a framework release decides its loss and
attention kernel. These are facts about the frameworks, read from their code at the commits cited; a user planning
the same run needs them as much as the bench (bench/production_sources.py), which maps the published rows of the dev
set onto meshplan requests with them. Data and look-ups only: nothing here estimates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

BRIDGE = "Megatron-Bridge"
MODELZOO = "Megatron-MoE-ModelZoo"

# --------------------------------------------------------------------------- framework releases, by date


# A run's day in its row: an ISO date or month, NeMo's container tag YY.MM (NeMo 24.03.01), or a lone year; and
# whether the row says it ran the development branch.
_RUN_DAY = re.compile(r"\b(\d{4})-(0[1-9]|1[0-2])(?:-(\d{2}))?\b")
_NEMO_TAG = re.compile(r"\bnemo\s*(\d{2})\.(0[1-9]|1[0-2])\b", re.IGNORECASE)
_LONE_YEAR = re.compile(r"^(20\d{2})(?![\d-])")
_MAIN_BRANCH = re.compile(r"\bmain\b")


@dataclass(frozen=True)
class RunDay:
    """The day a published run's row dates it, read once (read_run_day) for every reader of a row's date: `day` ISO,
    or its month or year (a shorter prefix counts as before any day it holds), None where none is stated; `leads`,
    whether `when` opens with that ISO date or month (the release, snapshot and micro-batch readers take only those:
    a date further in, "PR #3107 (2026-04); card validated ...", or a container tag dates no release of theirs);
    `main_branch`, whether `when` says the run ran the main branch ('2025-10-02 (main branch)')."""

    day: str | None = None
    leads: bool = False
    main_branch: bool = False

    @property
    def to_the_day(self) -> bool:
        """Whether the row dates the run to the day (YYYY-MM-DD), not its month or year only."""
        return self.day is not None and len(self.day) == len("YYYY-MM-DD")

    def before(self, since: str) -> bool:
        """Whether the run predates the ISO day `since` (a month-only or year-only date counts as before any day it
        holds); False where no day is stated."""
        return self.day is not None and self.day < since


def read_run_day(framework: str, when: str | None) -> RunDay:
    """A row's RunDay from its date words `when` (version_or_date) and its framework's words: an ISO date or month in
    `when`, else NeMo's container tag YY.MM in `when` or `framework`, else a lone year leading `when` ("2024
    (r0.8.0)"); no day where none is stated or `when` spans years ("2025-2026")."""
    text = str(when or "")
    main = _MAIN_BRANCH.search(text) is not None
    if found := _RUN_DAY.search(text):
        return RunDay("-".join(part for part in found.groups() if part), found.start() == 0, main)
    if tag := (_NEMO_TAG.search(text) or _NEMO_TAG.search(framework)):
        return RunDay(f"20{tag.group(1)}-{tag.group(2)}", main_branch=main)
    if year := _LONE_YEAR.match(text.strip()):
        return RunDay(year.group(1), main_branch=main)
    return RunDay(main_branch=main)


def run_day(framework: str, when: str | None) -> str | None:
    """The day (ISO, or its month or year) a run's row dates it (read_run_day's), None where none is stated."""
    return read_run_day(framework, when).day


# torchtitan's loss became chunked with ChunkedCELoss (pytorch/torchtitan PR #2937, merged 2026-04-27; the card's
# memory_convention_why): a torchtitan row measured before that ran the whole-sequence loss of the 0.2 line.
TORCHTITAN_CHUNKED_LOSS_SINCE = "2026-04-27"
# torchtitan's SDPA has run cuDNN attention first since v0.2.0 (2025-10-17; pytorch/torchtitan 6a3a9da95, the card's
# attention section): a torchtitan row measured before ran FlashAttention-2 on Hopper, as the 0.1 line did. Rows of
# other FSDP trainers scored with the torchtitan card (LLM Foundry 2023, fms-fsdp) keep the card's release: their
# loss's bytes are not torchtitan 0.1's either (knob "framework"); the kernel a run used is RUN_ATTENTION_KERNELS'.
TORCHTITAN_CUDNN_SDPA_SINCE = "2025-10-17"
# verl's Megatron engine forces attention_backend flash since volcengine/verl f1d212c6e (PR #3578, 2025-09-24, first
# in v0.6.0; cards/frameworks/verl.yaml attention); rows published before (a month-only date counts as before) ran
# Megatron-Core's auto, which the card gives as "0.5" (its estimated release 0.5.0).
VERL_FLASH_SINCE = "2025-09-24"
VERL_BEFORE_FLASH = "0.5.0"
# verl's workers turn on expandable segments for the training phases since volcengine/verl bf56a2aa2 (PR #3181,
# 2025-08-23; Megatron workers, cards/frameworks/verl.yaml allocator); rows published before or dated by month only
# (a month-only date counts as before) trained without it: docs/perf/dpsk.md's 96-H20 DeepSeek-V3 run (measured by
# 2025-08-14, e2e4c35ec), its 32/256-H20 Qwen3-235B rows, whose stated settings first appear in f6f910069
# (2025-08-22), and its 8/16/32-H20 Qwen3-30B-A3B table, added with its script in that commit. Before bf56a2aa2 the
# Megatron workers' sharding managers (verl/workers/sharding_manager/megatron_vllm.py at f6f910069) set no allocator
# setting, and a colocated run cannot set it in the environment instead: vLLM's sleep-mode allocator refuses
# expandable segments (fsdp_vllm.py at f6f910069 turns them off before waking vLLM: "vllm need to set
# _set_allocator_settings to False"), so those actor updates ran PyTorch's default allocator.
VERL_EXPANDABLE_SINCE = "2025-08-23"
# Megatron-Bridge performance recipes the rows cite whose cfg.env_vars leave expandable segments out (every other
# Bridge recipe sets it, cards/frameworks/megatron-bridge.yaml allocator): recipe function -> why.
BRIDGE_RECIPES_WITHOUT_EXPANDABLE = {
    "llama3_70b_pretrain_64gpu_gb200_fp8cs_config": "perf_recipes/llama/gb200/llama3.py: Megatron-FSDP with "
    "fsdp_double_buffer and NCCL user buffers, which Megatron-Core refuses with expandable segments before torch 2.11 "
    "(megatron/core/distributed/distributed_data_parallel_config.py, nccl_ub)",
}

# A run of a framework's development branch on a stated day (its row's date says "main"), where the framework card
# dates the changes its estimate reads (release_changes, oldest_snapshot): framework_version main@YYYY-MM-DD, the
# card's facts less the changes made after that day (knowledge/releases.py). NeMo AutoModel's published tables say
# "NeMo AutoModel Version: main Branch" with their "Last Updated" day (docs/performance-summary.md at 89e3a9fdd).


def main_snapshot(when: str | None) -> str | None:
    """main@YYYY-MM-DD for a run dated to the day that says it ran the main branch ('2025-10-02 (main branch)'),
    else None (a release, or a month-only date)."""
    dated = read_run_day("", when)
    return f"main@{dated.day}" if dated.leads and dated.to_the_day and dated.main_branch else None


# How many micro-batches torchtitan cut a local batch into under PP (pytorch/torchtitan): until 90567fc (2025-01-07,
# "fix num_microbatches input for PP") parallelism.pipeline_parallel_microbatches, default the pipeline degree
# (parallelisms/pipelining_utils.py build_pipeline_schedule at 9dec370, the commit of its 2024-12 benchmarks); then
# default the number of stages, pp x stages per rank (distributed/pipeline.py); since 5e2033c (2025-04-07, "[PP] Add
# microbatch_size and remove num_microbatches config") micro-batches of parallelism.pipeline_parallel_microbatch_size,
# default 1 (the card's pipeline section).
TORCHTITAN_PP_STAGES_MICROBATCHES_SINCE = "2025-01-07"
TORCHTITAN_PP_MICROBATCH_SIZE_SINCE = "2025-04-07"


def torchtitan_pipeline_microbatches(when: str | None, pp: int, vpp: int) -> int | None:
    """The micro-batches a torchtitan run dated `when` (a month-only date counts as before a day in that month) cut
    its local batch into by default under PP, in the releases that counted them; None since 5e2033c (the local batch
    is cut into micro-batches of pipeline_parallel_microbatch_size) or for a run without a date."""
    dated = read_run_day("torchtitan", when)
    if not dated.leads or not dated.before(TORCHTITAN_PP_MICROBATCH_SIZE_SINCE):
        return None
    return pp if dated.before(TORCHTITAN_PP_STAGES_MICROBATCHES_SINCE) else pp * vpp


def release_ran(framework: str, when: str | None) -> str | None:
    """The framework release a run dated `when` (ISO; a month-only date counts as before a day in that month) ran,
    where meshplan's estimate depends on it (torchtitan's loss and attention kernel, verl's attention kernel), else
    None."""
    dated = read_run_day(framework, when)
    if framework not in ("torchtitan", "verl") or not dated.leads:
        return None
    if framework == "verl":
        return VERL_BEFORE_FLASH if dated.before(VERL_FLASH_SINCE) else None
    if dated.before(TORCHTITAN_CUDNN_SDPA_SINCE):
        return "0.1"
    if dated.before(TORCHTITAN_CHUNKED_LOSS_SINCE):
        return "0.2"
    return None


# A TFLOP/s a run logged divides its step's work by its framework's own model-FLOP formula at that release, and those
# formulas counted the causal attention core over the whole score matrix until each halved it: Megatron-LM's
# num_floating_point_operations (megatron/training/training.py; core_r0.8.0 has "+ (args.seq_length /
# args.hidden_size)") since NVIDIA/Megatron-LM 8873b55d (2025-03-06, "Fixes in number of floating-point operation
# estimates for MoE and attention layer": "/ 2"; MLA's own branch, d4f9a6f7 2025-04-03, halved from the start),
# NeMo's flops_formulas (nemo/utils/flops_formulas.py, the FLOPsMeasurementCallback's) since NVIDIA/NeMo 6251117f4c
# (2025-08-09, "Discount FLOPs in dot-product att"), Megatron-Bridge's flop_utils since NVIDIA-NeMo/Megatron-Bridge
# d42316e94 (2025-09-26, "Add Flops calculator and training flop achieved log"). The formula family is the one the
# run's framework (its row's words) starts with; a framework that starts with none (verl, torchtitan, a paper's own
# stack "with Megatron-style TP") counts as Megatron-LM's current formula, as meshplan's MFU does. Counted full, the
# formulas of those releases are arithmetic/flops.noncausal_flops_per_token (no MTP term either: Megatron-LM's came
# with d4f9a6f7, after its halving).
TFLOPS_CAUSAL_HALVED_SINCE: tuple[tuple[str, str], ...] = (
    ("megatron-bridge", "2025-09-26"),
    ("nemo automodel", ""),  # NeMo AutoModel trains through its own code, not NeMo's callback: today's formula
    ("nemo", "2025-08-09"),
    ("megatron-core", "2025-03-06"),
    ("megatron-lm", "2025-03-06"),
)


def tflops_causal_full(framework: str, when: str | None) -> bool:
    """Whether the TFLOP/s a run of `framework` (its row's words) on day `when` logged counted the causal attention
    core full (TFLOPS_CAUSAL_HALVED_SINCE): its release predates the halving in the formula family its framework
    starts with. A run whose day is not stated counts as today's formula."""
    words = framework.strip().lower()
    since = next((since for name, since in TFLOPS_CAUSAL_HALVED_SINCE if words.startswith(name)), "")
    return read_run_day(framework, when).before(since)


def ran_without_expandable_segments(framework: str, when: str | None, cited: str) -> bool:
    """A run whose launcher left PyTorch's expandable segments off where its framework card's default sets them: a
    verl run before its workers set them (a month-only date counts as before), a Megatron-Bridge run of a recipe
    whose env_vars leave them out (BRIDGE_RECIPES_WITHOUT_EXPANDABLE, named in `cited`)."""
    dated = read_run_day(framework, when)
    if framework == "verl" and (dated.day is None or dated.before(VERL_EXPANDABLE_SINCE)):
        return True
    return framework == "megatron-bridge" and any(name in cited for name in BRIDGE_RECIPES_WITHOUT_EXPANDABLE)


# --------------------------------------------------------------------------- what a launcher or recipe sets


# The attention kernel of a published run whose trainer meshplan scores with another framework's card, by the words
# its citation holds. LLM Foundry's benchmark tables: their launcher (mosaicml/llm-foundry
# scripts/train/benchmarking/submit_benchmarks.py, every version from 300cc5c to 5e85bd6, incl. b2a43a1 that wrote
# the H100 tables) sets the model's attn_impl from --attn_impl, default 'triton', which sweep.sh never passes:
# MPT's Triton FlashAttention (llmfoundry/models/layers/flash_attn_triton.py), cards/calibration.yaml
# attention_kernels.triton_flash_attn.
RUN_ATTENTION_KERNELS: tuple[tuple[str, str], ...] = (
    ("mosaicml/llm-foundry scripts/train/benchmarking", "triton_flash_attn"),
)


def attention_kernel_of_run(citation: str) -> str | None:
    """The attention kernel a run used, by the words its citation holds, where the framework card it is scored with
    would pick another (RUN_ATTENTION_KERNELS), else None."""
    cited = citation.lower()
    return next((kernel for words, kernel in RUN_ATTENTION_KERNELS if words in cited), None)


# Only llama3_8b.toml sets mode = "selective" with selective_ac_option = "op": at 9dec370 (2024-12-26, the 2024-12
# benchmarks' pin; train_configs/llama3_8b.toml) and e7c0cae (2025-06-13, the Trainy pin;
# torchtitan/models/llama3/train_configs/llama3_8b.toml); the 70B and 405B files set mode = "full", so selective there
# would take the JobConfig default option "2". A torchtitan Llama 3 8B row with selective AC and no option ran the
# file's "op": (model family, total parameters in billions) of the train configs that set it.
TITAN_OP_TOMLS = {("llama3", 8.0)}


# Megatron-Bridge's performance tables (docs/performance-summary.md and its archive) were measured with its
# performance launchers, which reduce gradients in bf16 for every model: scripts/performance/configs/*/*.yaml
# `grad_reduce_in_fp32: false` (2025-09), each model's set_<model>_common_configs in
# scripts/performance/configs/<model>/*_llm_pretrain.py (2025-11 to 2026-04, e.g. c4fc11d2e), and since then every
# flat perf recipe through perf_recipes/_common.py _benchmark_common and _perf_precision (cfg.ddp.grad_reduce_in_fp32
# = False; of the perf recipes only GLM-5's and WAN's set it back, no row here). The bf16 grad buffer is 2 B/param,
# not the 4 of the hardware recipes' bf16_mixed.
BRIDGE_PERF_TABLE = "megatron-bridge docs/performance-summary"

# ... and with Transformer Engine's fused cross-entropy on every run: the GPTModelProvider's cross_entropy_loss_fusion
# True (gpt_provider.py) beside the launchers' cross_entropy_fusion_impl "te": v0.1.0rc4 (2025-09)
# scripts/performance/configs/{deepseek,llama3,llama31,qwen3}/*_llm_pretrain.yaml (model.cross_entropy_fusion_impl:
# "te"), v0.2.0 scripts/performance/utils/helpers.py and v0.3.0 utils/overrides.py set_common_perf_overrides
# (recipe.model.cross_entropy_fusion_impl = "te", run by get_model_recipe_with_user_overrides for every model),
# v0.6.0 perf_recipes/_common.py _benchmark_common(cross_entropy_impl="te"). The containers of those releases pin
# Transformer Engine 2.9-2.17, whose kernel writes the gradient over the bf16 logits (cards/memory.yaml
# megatron_cross_entropy te).
BRIDGE_PERF_CROSS_ENTROPY = {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}

# Measured studies whose rows cite the study, not the recipe it ran, where the study's text names the recipe:
# (words the row's citation and location both hold) -> (recipe, the fields that recipe sets; its source above).
# NVIDIA-NeMo/Megatron-Bridge a67b5735d skills/nemo-mbridge-perf-activation-recompute/SKILL.md "Matched H100 Evidence:
# Moonlight 16B": "The Moonlight 16B BF16 pretraining recipe ran on 8 H100 80GB GPUs ... TP=2, PP=1, CP=1, EP=8" at
# Bridge 600d069; the one such recipe there is recipes/moonlight/h100/moonlight_16b.py
# moonlight_16b_pretrain_8gpu_h100_bf16_config, which sets use_precision_aware_optimizer=True with bf16 exp_avg /
# exp_avg_sq and bf16 main grads, and MixedPrecisionConfig(grad_reduce_in_fp32=False), and
# cfg.model.moe_shared_expert_overlap = True (with the alltoall dispatcher). The same text says a native 8-H100 layout
# "failed during FP32 optimizer-state initialization".
# NVIDIA-NeMo/Megatron-Bridge 067f987df skills/nemo-mbridge-perf-moe-hardware-configs/card.yaml and
# nemo-mbridge-perf-moe-optimization-workflow/card.yaml (best_configs.qwen3_30b_h100_16, qwen3_30b_h100_case_study)
# name src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py as their evidence, whose every Qwen3 config sets
# cfg.model.bias_activation_fusion = True (lines 72, 140, 193), as v0.6.0's recipes/qwen/h100/qwen3_moe.py
# qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config (the same 16-H100 TP1 EP16 HybridEP MBS1 GBS1024 layout) does, and
# whose every config calls perf_recipes/_common.py _benchmark_common(cfg), cross_entropy_impl "te" by default
# (BRIDGE_PERF_CROSS_ENTROPY).
STUDY_RECIPES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("nemo-mbridge-perf-activation-recompute", "moonlight"): (
        "moonlight_16b_pretrain_8gpu_h100_bf16_config",
        {"optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False, "moe_shared_expert_overlap": True}),
    ("nemo-mbridge-perf-moe-hardware-configs", "qwen3"): (
        "perf_recipes/qwen/h100/qwen3_moe.py", {"bias_activation_fusion": True} | BRIDGE_PERF_CROSS_ENTROPY),
}

# verl example scripts the RL rows cite that train with actor.use_dynamic_bsz=True and ppo_max_token_len_per_gpu =
# max_prompt_length + max_response_length (the row's seq_length): verl packs whole sequences into micro-batches of at
# most that many tokens (times cp) and ignores ppo_micro_batch_size_per_gpu (volcengine/verl
# workers/actor/megatron_actor.py forward_backward_batch: rearrange_micro_batches(max_token_len=...)). The largest
# micro-batch is one budget of tokens: micro_batch_size 1 at the row's seq_length, not the script's 2 x seq_length.
VERL_DYNAMIC_BSZ_SCRIPTS = (
    "run_qwen3-235b_megatron_96gb.sh",  # examples/grpo_trainer/, f6f910069 (2025-08-22): (2048 + 1204*8) * 10 / 10
    "run_deepseek671b_math_megatron_96gb.sh",  # bd756c15c (2025-08-14): the same budget
    "run_qwen3moe-30b_megatron_96gb.sh",  # c281ea779 (2025-11-11): 2048 + 1024*8
)

# Megatron-Bridge's performance tables (BRIDGE_PERF_TABLE) ran its perf recipes, which set userbuffers TP overlap
# wherever TP > 1 for these model families (the row's model.family) and leave it off for the others the tables list:
# perf_recipes/qwen/h100/qwen3_moe.py sets tp_comm_overlap=False for Qwen3-235B, DeepSeek-V3's leave it unset (the
# same fact as bench/data/megatron_bridge_published.csv's tp_comm_overlap column): family -> source.
BRIDGE_PERF_TP_OVERLAP = {
    "llama3": (f"{BRIDGE} perf_recipes/llama/*: tp_comm_overlap_cfg userbuffers on the base recipes' "
               "tp_comm_overlap=True (recipes/llama/h100/llama3.py) wherever TP > 1"),
}


# Megatron-Bridge's performance tables (BRIDGE_PERF_TABLE) ran its perf recipes, which turn bias_activation_fusion on
# for the model types whose provider leaves it off (cards/frameworks/megatron-bridge.yaml defaults): model_type (a
# dev row's model.family names the same) -> source. The other families the tables list run their provider's fused
# default (Llama, DeepSeek, gpt-oss, Kimi-K2) or an activation Megatron-Core does not fuse (Nemotron-H's squared ReLU).
_QWEN_PERF = (f"{BRIDGE} v0.2.0 / v0.3.0 scripts/performance/configs/qwen3/qwen3_llm_pretrain.py "
              "(set_qwen3_common_configs, set_qwen3_next_common_configs: cfg.model.bias_activation_fusion = True); "
              "v0.6.0 perf_recipes/qwen/{h100,b200,gb200,b300,gb300}/qwen3_moe.py")
BRIDGE_PERF_ACTIVATION_FUSION = {"qwen3": _QWEN_PERF, "qwen3_moe": _QWEN_PERF, "qwen3_next": _QWEN_PERF}


def bridge_perf_activation_fusion(citation: str, model_type: str | None) -> str | None:
    """The perf recipe (its source) that turned bias_activation_fusion on for a Megatron-Bridge performance-table run
    of this model type (BRIDGE_PERF_ACTIVATION_FUSION), else None: not that table, or a type it leaves at its
    provider's default."""
    if BRIDGE_PERF_TABLE not in citation.lower():
        return None
    return BRIDGE_PERF_ACTIVATION_FUSION.get(str(model_type or ""))


def bridge_perf_tp_overlap(citation: str, family: str | None, tp: int | None) -> str | None:
    """The perf recipe (its source) that ran a Megatron-Bridge performance-table run of this model family with
    userbuffers TP overlap (BRIDGE_PERF_TP_OVERLAP), else None: not that table, another family, or TP 1 (nothing to
    overlap)."""
    if BRIDGE_PERF_TABLE not in citation.lower() or (tp or 1) <= 1:
        return None
    return BRIDGE_PERF_TP_OVERLAP.get(str(family or ""))


# NeMo 24.07's pretraining table (NVIDIA/NeMo docs/source/performance/performance_summary.md) ran the NeMo Framework
# Launcher's default training configs; those that set userbuffers TP overlap at the 24.07 line (NVIDIA/
# NeMo-Framework-Launcher 1ab2c781, 2024-08-13, launcher_scripts/conf/training/<config>.yaml ub_tp_comm_overlap:
# True; the row's TP, PP and SP match each config). gpt3/175b and nemotron/nemotron_340b set it False, the TP-1
# configs have nothing to overlap; the SFT / LoRA runs ran other configs, not read. Keyed by (model family, nominal
# size in billions): a pretraining run of that release whose model is within 10% of the size ran that config.
NEMO_LAUNCHER_RELEASE = "24.07"
NEMO_2407_TP_OVERLAP = {("gpt3", 20): "gpt3/20b", ("llama2", 70): "llama/llama2_70b",
                        ("llama3", 70): "llama/llama3_70b", ("nemotron3", 8): "nemotron/nemotron_8b",
                        ("nemotron3", 22): "nemotron/nemotron_22b"}


def nemo_launcher_tp_overlap(release: str | None, pretraining: bool, family: str | None,
                             params_b: float | None) -> str | None:
    """The NeMo-Framework-Launcher config a NeMo `release` pretraining run of this model family and size ran with
    ub_tp_comm_overlap True (NEMO_2407_TP_OVERLAP), else None."""
    if not pretraining or not params_b or NEMO_LAUNCHER_RELEASE not in str(release or ""):
        return None
    return next((cfg for (fam, size), cfg in NEMO_2407_TP_OVERLAP.items()
                 if fam == family and abs(params_b - size) <= 0.1 * size), None)


# NeMo 2.0's performance-summary runs (NeMo user guide performance/performance_summary, the NeMo 25.02, 25.04 and 25.07
# containers) ran NVIDIA/NeMo's performance scripts (scripts/llm/performance at v2.2.0, scripts/performance at v2.3.0
# and v2.4.0), whose fp8 precision plugin sets the fp8 recipe and fp8 primary weights (fp8_param_gather) of every fp8
# run they make. 25.02, v2.2.0 pretrain_<model>.py: bf16_with_fp8_mixed() (nemo/collections/llm/recipes/precision/
# mixed_precision.py: fp8 'hybrid' at MegatronMixedPrecision's default delayed scaling, amax history 1024,
# fp8_params=True, which the plugin turns into fp8_param_gather True). 25.04, v2.3.0 utils.set_primary_perf_configs,
# and 25.07, v2.4.0 helpers.set_precision_configs: the tables' per-tensor current scaling ('--fp8_recipe cs') is
# bf16_with_fp8_current_scaling_mixed() (fp8_recipe 'tensorwise', fp8_param_gather True); v2.3.0 turns
# fp8_param_gather off under use_mcore_fsdp ("Currently FSDP does not support FP8 param gather"), v2.4.0 no longer.
@dataclass(frozen=True)
class NemoPerfPrecision:
    """The fp8 settings NeMo 2.0's performance scripts of one release ran every fp8 run with."""

    fp8_recipe: str  # a Request fp8_recipe
    fp8_param_gather: bool  # with the distributed optimizer (no Megatron-FSDP)
    fp8_param_gather_fsdp: bool  # under Megatron-FSDP (use_mcore_fsdp)
    source: str


NEMO2_PERF_PRECISION = {
    "25.02": NemoPerfPrecision("delayed", True, True, "NVIDIA/NeMo v2.2.0 scripts/llm/performance pretrain_*.py "
                               "bf16_with_fp8_mixed() (fp8_params=True)"),
    "25.04": NemoPerfPrecision("tensorwise", True, False, "NVIDIA/NeMo v2.3.0 scripts/performance/utils.py "
                               "set_primary_perf_configs: bf16_with_fp8_current_scaling_mixed(), fp8_param_gather "
                               "False under use_mcore_fsdp"),
    "25.07": NemoPerfPrecision("tensorwise", True, True, "NVIDIA/NeMo v2.4.0 scripts/performance/helpers.py "
                               "set_precision_configs: bf16_with_fp8_current_scaling_mixed()"),
}


def nemo2_perf_precision(release: str | None) -> NemoPerfPrecision | None:
    """The fp8 settings of the NeMo 2.0 performance scripts of the container `release` names (NEMO2_PERF_PRECISION:
    'NeMo 25.04' and the like), else None."""
    found = _nemo_container(release)
    return NEMO2_PERF_PRECISION.get(found) if found else None


def _nemo_container(release: str | None) -> str | None:
    """The NeMo container a release's words name ('NeMo 25.04 (NeMo 2.0, Megatron-Core)' -> '25.04'), else None."""
    found = re.search(r"\bNeMo (\d\d\.\d\d)\b", str(release or ""))
    return found.group(1) if found else None


# The same runs' loss: NeMo 2.0's GPTConfig turns Megatron-Core's cross_entropy_loss_fusion on
# (nemo/collections/llm/gpt/model/base.py at v2.2.0, v2.3.0 and v2.4.0: cross_entropy_loss_fusion: bool = True; the
# Llama, Mixtral, Nemotron and GPT-3 configs inherit it), and from v2.3.0 the performance scripts set Transformer
# Engine's implementation on every run ("enable cross entropy fusion with TE kernel": v2.3.0
# scripts/performance/utils.py set_primary_perf_configs, v2.4.0 helpers.py set_perf_optimization_configs, called by
# set_primary_perf_configs; v2.2.0's scripts/llm/performance set neither). Each container's Megatron-Core is the
# NVIDIA/Megatron-LM commit of NeMo's requirements/manifest.json: 25.02 791b70e0 (core_r0.11.0, whose
# ModelParallelConfig has the fusion but no cross_entropy_fusion_impl: the native fused loss), 25.04 3cdfd613
# (core_v0.12.0), 25.07 03f77931 (core_v0.13.0), both of which took te (the refusal came with core_v0.19.0, rule
# PR009).
@dataclass(frozen=True)
class NemoPerfLoss:
    """The cross-entropy NeMo 2.0's performance scripts of one release ran every run with (fusion on)."""

    fusion_impl: str  # a Request cross_entropy_fusion_impl, with cross_entropy_loss_fusion true
    megatron_core: str  # the Megatron-Core release of the container
    source: str


NEMO2_PERF_LOSS = {
    "25.02": NemoPerfLoss("native", "0.11", "NVIDIA/NeMo v2.2.0 nemo/collections/llm/gpt/model/base.py GPTConfig "
                                            "(cross_entropy_loss_fusion True); Megatron-LM 791b70e0 (core_r0.11.0)"),
    "25.04": NemoPerfLoss("te", "0.12.0", "NVIDIA/NeMo v2.3.0 GPTConfig, scripts/performance/utils.py "
                                          "set_primary_perf_configs; Megatron-LM 3cdfd613 (core_v0.12.0)"),
    "25.07": NemoPerfLoss("te", "0.13.0", "NVIDIA/NeMo v2.4.0 GPTConfig, scripts/performance/helpers.py "
                                          "set_perf_optimization_configs; Megatron-LM 03f77931 (core_v0.13.0)"),
}


def nemo2_perf_loss(release: str | None) -> NemoPerfLoss | None:
    """The cross-entropy of the NeMo 2.0 performance scripts of the container `release` names (NEMO2_PERF_LOSS),
    else None."""
    found = _nemo_container(release)
    return NEMO2_PERF_LOSS.get(found) if found else None


# The caching allocator NeMo 2.0's performance scripts launched every run of a release with: v2.4.0 (the 25.07
# container's) scripts/performance/executors.py slurm_executor sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# on every GPU but B200 ("it causes an unexpected error" there), which nemo/lightning/run/plugins.py PerfEnvPlugin
# takes off again only under user-buffer registration (nccl_ub, set by a recommended_model_configs CSV's
# use_user_buffer_registration: none of its GB200 rows). v2.3.0's (25.04) slurm_executor sets none (only
# pretrain_llama4_e16.py adds it), the framework card's default; 25.02's is not read.
@dataclass(frozen=True)
class NemoPerfAllocator:
    """Whether NeMo 2.0's performance scripts of one release ran with expandable segments, and the systems left
    without them."""

    expandable_segments: bool
    except_systems: tuple[str, ...]  # lower-case system names, as the scripts' --gpu takes them
    source: str


NEMO2_PERF_ALLOCATOR = {
    "25.07": NemoPerfAllocator(True, ("b200",), "NVIDIA/NeMo v2.4.0 scripts/performance/executors.py slurm_executor "
                                                "(PERF_ENV_VARS PYTORCH_CUDA_ALLOC_CONF, not on B200)"),
}


def nemo2_perf_expandable_segments(release: str | None, system: str) -> bool | None:
    """Whether the NeMo 2.0 performance scripts of the container `release` names ran `system` (a GPU system as
    their --gpu names it: 'gb200', 'b200', 'h100') with expandable segments (NEMO2_PERF_ALLOCATOR); None where the
    release's executor is not read."""
    found = _nemo_container(release)
    facts = NEMO2_PERF_ALLOCATOR.get(found) if found else None
    if facts is None:
        return None
    return facts.expandable_segments and system.lower() not in facts.except_systems


# LoRA settings of the recipes LoRA rows cite, for a row whose own lora section states none of them (the bench's
# production_rows.stated_lora): recipe function -> (rank, targets, source).
LORA_RECIPES: dict[str, tuple[int, list[str], str]] = {
    "llama3_70b_peft_8gpu_h100_fp8cs_config": (16, ["linear_qkv"], "Megatron-Bridge perf_recipes/llama/h100/llama3.py "
                                               "(cfg.peft.target_modules = ['linear_qkv']) on recipes/llama llama3_70b "
                                               "peft (dim 16, alpha 32)"),
}


# --------------------------------------------------------------------------- Megatron-Bridge perf presets' dispatch


@dataclass(frozen=True)
class PresetDispatch:
    """The token dispatch a Megatron-Bridge release's performance preset (scripts/performance/configs/<model>/
    *_workload_base_configs.py, a WorkloadBaseConfig, or from v0.6.0 its flat perf recipe) set for a run of its
    published table whose row states none: moe_flex_dispatcher_backend (the flex dispatcher with that backend;
    training/flex_dispatcher_backend.py apply_flex_dispatcher_backend also sets moe_shared_expert_overlap False,
    adapter_knobs.shared_expert_overlap's off_beside_flex), or None where the preset sets no backend and the
    alltoall dispatcher runs, and moe_a2a_overlap (comm_overlap.overlap_moe_expert_parallel_comm)."""

    backend: str | None
    a2a_overlap: bool
    source: str

    @property
    def dispatcher(self) -> str:
        """The Request moe_token_dispatcher the preset ran."""
        return "alltoall" if self.backend is None else "flex"


_BRIDGE_V050 = "NVIDIA-NeMo/Megatron-Bridge v0.5.0 (fcbb6031, the 26.06 container's) scripts/performance/configs/"
# The container each release ships: docs/versions1.json ("0.4.2 · 26.04.01", "0.6.0 (latest) · 26.08"). v0.4.2's
# B200 Qwen3-235B preset and config builder are v0.4.0's (v0.4.2 changed only B300's).
_BRIDGE_V042 = "NVIDIA-NeMo/Megatron-Bridge v0.4.2 (c81012934, the 26.04.01 container's) scripts/performance/configs/"
# v0.6.0 (51885cf13; its docs/performance-summary.md carries the 26.08 table): flat perf recipes
_BRIDGE_V060 = "NVIDIA-NeMo/Megatron-Bridge v0.6.0 (51885cf13, the 26.08 container's) src/megatron/bridge/perf_recipes/"
# (container release, system, catalog model) -> the preset its table row ran; the preset's layout and batch are the
# row's (Kimi-K2: PP4 VP4 EP64, GBS 4096, micro-batch 2; DeepSeek-V3 B300 V2: PP8 EP8, GBS 4096, micro-batch 2; v0.5.1's
# B300 FP8_MX_V2 moved to PP8 VP2, micro-batch 1 with moe_a2a_overlap, not the layout its 26.06 table publishes)
BRIDGE_PERF_PRESET_DISPATCH: dict[tuple[str, str, str], PresetDispatch] = {
    ("26.06", "gb300", "kimi-k2"): PresetDispatch(
        "hybridep", False, _BRIDGE_V050 + "kimi/kimi_workload_base_configs.py KIMI_K2_PRETRAIN_CONFIG_GB300"),
    ("26.06", "b300", "deepseek-v3"): PresetDispatch(
        "hybridep", False, _BRIDGE_V050 + "deepseek/deepseek_workload_base_configs.py "
                                          "DEEPSEEK_V3_PRETRAIN_CONFIG_B300_FP8_MX_V2 (B300_V2 over B300_V1)"),
    # PP8 EP8, GBS 8192 (the V2 variant: B200_FP8_CS_V1 at 256 GPUs), moe_a2a_overlap=False, no backend; the config
    # builder sets moe_token_dispatcher_type "alltoall" (qwen3_llm_pretrain.py qwen3_235b_a22b_pretrain_config_b200)
    ("26.04.01", "b200", "qwen3-235b-a22b"): PresetDispatch(
        None, False, _BRIDGE_V042 + "qwen/qwen3_workload_base_configs.py "
                                    "QWEN3_235B_A22B_PRETRAIN_CONFIG_B200_FP8_MX_V2, "
                                    "qwen3_llm_pretrain.py qwen3_235b_a22b_pretrain_config_b200"),
    # PP4 VP12 EP32, GBS 8192, micro-batch 2: flex with hybridep, and _enable_hybridep_full_iteration_mxfp8's
    # CommOverlapConfig(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    ("26.08", "gb300", "qwen3-235b-a22b"): PresetDispatch(
        "hybridep", True, _BRIDGE_V060 + "qwen/gb300/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config, "
                                         "qwen/common.py _enable_hybridep_full_iteration_mxfp8"),
}


def bridge_perf_preset_dispatch(release: str, system: str, model_key: str | None) -> PresetDispatch | None:
    """BRIDGE_PERF_PRESET_DISPATCH's entry for a published-table run (its container release, system and catalog
    model), else None."""
    return BRIDGE_PERF_PRESET_DISPATCH.get((release, system, model_key or ""))


@dataclass(frozen=True)
class PresetSplit:
    """The pipeline layout and MTP depth a Megatron-Bridge release's performance config passed for a run of its
    published table whose row states neither (recipes/deepseek's pretrain_config(layout=..., mtp_num_layers=...)):
    the layout string as the config writes it (its m count is mtp_num_layers: Megatron-Core's validate_layer_layout)
    and the MTP depth trained (None in the config: none, 0). A layout string fixes the virtual stages per rank:
    Megatron-Core's PipelineParallelLayerLayout derives vpp from its stage count over pp and TransformerConfig
    refuses any other vpp given ("virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout",
    megatron/core/transformer/transformer_config.py, core_dev_r0.15.0 as core_v0.15.0)."""

    layout: str
    mtp_num_layers: int
    source: str

    def fields(self) -> dict[str, Any]:
        """The Request fields the config set."""
        return {"pipeline_layout": self.layout, "mtp_num_layers": self.mtp_num_layers}


# The 25.11 container ships Megatron-Bridge 0.2.0 (docs/releases/software-versions.md); its v0.2.0 GB200 and GB300
# DeepSeek-V3 configs pass layout=None at PP4 VP4 with MTP (the helper's (4, 4) row) and GBS 2048, which the 25.11
# table first published (44dae92b0: GB300 PP8 VP2, GB200 PP4 VP4, both "DeepSeekV3", FP8-MX, GBS 2048). The table
# was then rewritten to "DeepSeekV3 (w/o MTP)" at GBS 4096 (1804c076f on main, 2025-12-09; 5baa08b46 into r0.2.0,
# v0.2.1's docs) from runs of the branch gaod/r0.2.0_test, cut from r0.2.0 after v0.2.0 (commits 4fabba48d
# "gb200changes" and d19cb73c8 "gb300 changes", 2025-12-05): deepseek_v3_gb200_config and deepseek_v3_gb300_config
# pass layout="Et*3|(t*4|)*14ttL", mtp_num_layers=None, mtp_loss_scaling_factor=None, and its presets are the
# table's GB200 BF16 and GB300 layouts (DEEPSEEK_V3_GB200_BASE_CONFIG PP4 VP4 EP64, DEEPSEEK_V3_GB300_BASE_CONFIG
# PP2 EP32, both GBS 4096). The layout's 16 stages are 4 per rank at PP4, 2 at PP8 and 8 at PP2 (the split the next
# release's GB300 preset states: v0.3.0 DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_V1 PP2 VP8, a 16-stage pp_layout); the
# table prints VP 4 at PP8 and PP2, the presets' virtual_pipeline_model_parallel_size field, which Megatron-Core
# refuses beside that layout.
_GAOD_R020 = ("NVIDIA-NeMo/Megatron-Bridge gaod/r0.2.0_test (r0.2.0 + 4fabba48d, d19cb73c8, 2025-12-05) "
              "scripts/performance/configs/deepseek/deepseek_llm_pretrain.py ")
BRIDGE_PERF_PRESET_SPLIT: dict[tuple[str, str, str], PresetSplit] = {
    ("25.11", "gb200", "deepseek-v3"): PresetSplit("Et*3|(t*4|)*14ttL", 0, _GAOD_R020 + "deepseek_v3_gb200_config"),
    ("25.11", "gb300", "deepseek-v3"): PresetSplit("Et*3|(t*4|)*14ttL", 0, _GAOD_R020 + "deepseek_v3_gb300_config"),
}


def bridge_perf_preset_split(release: str, system: str, model_key: str | None) -> PresetSplit | None:
    """BRIDGE_PERF_PRESET_SPLIT's entry for a published-table run (its container release, system and catalog model),
    else None."""
    return BRIDGE_PERF_PRESET_SPLIT.get((release, system, model_key or ""))


@dataclass(frozen=True)
class PresetRecompute:
    """The activation recompute a Megatron-Bridge release's performance preset set for a run of its published table,
    where it took effect: recompute_modules under recompute_granularity 'selective' (v0.3.0 scripts/performance/
    utils/overrides.py _set_recompute_overrides sets the granularity beside the modules; v0.2.0 utils/helpers.py
    set_recompute_overrides sets the modules alone, so at 25.11 they ran only where the model's own config set
    'selective', DeepSeek-V3's set_deepseek_v3_common_configs, and GPT-OSS-120B's recipe, which leaves it None,
    recomputed nothing), or recompute_num_layers, which both set as Megatron's full block recompute."""

    modules: tuple[str, ...]
    full_layers: int | None
    source: str

    def fields(self) -> dict[str, Any]:
        """The Request fields the preset set."""
        if self.full_layers is not None:
            return {"recompute": "full", "recompute_method": "block", "recompute_layers": self.full_layers}
        return {"recompute": "selective", "recompute_modules": list(self.modules)}


_BRIDGE_V030 = "NVIDIA-NeMo/Megatron-Bridge v0.3.0 (the 26.02 container's) scripts/performance/configs/"
_BRIDGE_V020 = "NVIDIA-NeMo/Megatron-Bridge v0.2.0 (the 25.11 container's) scripts/performance/configs/"
_GPT_OSS_V030 = _BRIDGE_V030 + "gpt_oss/gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_"
_DSV3_V030 = _BRIDGE_V030 + "deepseek/deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_"
_GPT_OSS_RECOMPUTE = ("layernorm", "moe_act")
# (container release, system, catalog model) -> the recompute the preset its table row ran set; a run not listed
# recomputed nothing (Qwen3's configs clear it, qwen3_llm_pretrain.py; the Llama presets recompute only in NVFP4
# rows, left out of the table, and Llama 3 8B FP8 on H100; GPT-OSS-120B on GB300 / B300 and every 25.11 GPT-OSS run)
BRIDGE_PERF_PRESET_RECOMPUTE: dict[tuple[str, str, str], PresetRecompute] = {
    ("26.02", "gb200", "gpt-oss-120b"): PresetRecompute(_GPT_OSS_RECOMPUTE, None, _GPT_OSS_V030 + "GB200_BF16_V2"),
    ("26.02", "b200", "gpt-oss-120b"): PresetRecompute(_GPT_OSS_RECOMPUTE, None, _GPT_OSS_V030 + "B200_BF16_V2"),
    ("26.02", "h100", "gpt-oss-120b"): PresetRecompute(_GPT_OSS_RECOMPUTE, None, _GPT_OSS_V030 + "H100_BF16_V2"),
    ("26.02", "gb200", "deepseek-v3"): PresetRecompute(("mla_up_proj",), None, _DSV3_V030 + "GB200_FP8_MX_V2"),
    ("26.02", "b200", "deepseek-v3"): PresetRecompute(("mla_up_proj",), None, _DSV3_V030 + "B200_FP8_MX_V2"),
    ("26.02", "gb300", "deepseek-v3"): PresetRecompute(("mla_up_proj",), None, _DSV3_V030 + "GB300_FP8_MX_V2"),
    ("26.02", "b300", "deepseek-v3"): PresetRecompute(("mla_up_proj",), None, _DSV3_V030 + "B300_FP8_MX_V2"),
    # the branch's GB200 preset for both GB200 rows (its GB300 preset sets recompute_modules=[]: none)
    ("25.11", "gb200", "deepseek-v3"): PresetRecompute(
        ("mla_up_proj",), None, _GAOD_R020 + "deepseek_v3_gb200_config, workload_base_configs.py "
                                             "DEEPSEEK_V3_GB200_BASE_CONFIG"),
    ("25.11", "b200", "deepseek-v3"): PresetRecompute(
        ("mla_up_proj",), None, _BRIDGE_V020 + "deepseek/workload_base_configs.py DEEPSEEK_V3_B200_BASE_CONFIG"),
    ("25.11", "h100", "llama-3.1-8b"): PresetRecompute(
        (), 5, _BRIDGE_V020 + "llama3/workload_base_configs.py LLAMA3_8B_H100_FP8_CS_BASE_CONFIG"),
    # v0.1.0rc4 scripts/performance/run_script.py on H100; recipes/deepseek/deepseek_v3.py recompute_granularity
    # "selective" by default
    ("25.09", "h100", "deepseek-v3"): PresetRecompute(
        ("mla_up_proj", "mlp"), None, "NVIDIA-NeMo/Megatron-Bridge v0.1.0rc4 scripts/performance/run_script.py"),
}


def bridge_perf_preset_recompute(release: str, system: str, model_key: str | None) -> PresetRecompute | None:
    """BRIDGE_PERF_PRESET_RECOMPUTE's entry for a published-table run (its container release, system and catalog
    model), else None (it recomputed nothing)."""
    return BRIDGE_PERF_PRESET_RECOMPUTE.get((release, system, model_key or ""))


@dataclass(frozen=True)
class PresetOffload:
    """Megatron-Core's layer-wise activation offload a Megatron-Bridge performance preset set for a Megatron-FSDP run
    of its published table (WorkloadBaseConfig.cpu_offloading_num_layers, which scripts/performance/utils/
    overrides.py _set_recompute_overrides turns into cpu_offloading True, cpu_offloading_weights False and that
    count; from v0.6.0 the flat perf recipe sets the three itself): the Request's activation_offload_layers for a run
    of that system, catalog model, Bridge precision (its presets' BF16 / FP8_CS / FP8_MX, RECIPE_PRECISION's names)
    and tensor parallelism under Megatron-FSDP, in the container releases listed."""

    system: str
    model: str  # catalog key
    precision: str  # bf16, fp8cs, fp8mx
    tp: int
    layers: int
    releases: tuple[str, ...]  # the container releases whose Bridge release was read
    source: str


# The container each release ships (_BRIDGE_V042's note): 25.11 v0.2.0 (7af9601c9), 26.02 v0.3.0 (21b02e0cf), 26.04.01
# v0.4.2 (c81012934), 26.06 v0.5.0 (fcbb60311), 26.08 v0.6.0 (51885cf13). Llama 3 70B's Megatron-FSDP presets (tp 1,
# 64 GPUs; the V1 GBS-128 and V2 GBS-256 variants alike) set the same counts at all five: v0.2.0
# scripts/performance/configs/llama3/workload_base_configs.py LLAMA3_70B_<SYSTEM>_<PRECISION>_BASE_CONFIG, v0.3.0 to
# v0.5.0 configs/llama/llama3_workload_base_configs.py LLAMA3_70B_PRETRAIN_CONFIG_<SYSTEM>_<PRECISION>_V1/_V2, v0.6.0
# perf_recipes/llama/<system>/llama3.py llama3_70b_pretrain_64gpu_<system>_<precision>_config. Llama 3.1 405B's
# (128 GPUs, tp 2, V1) from v0.2.0 configs/llama31/workload_base_configs.py to v0.5.0
# configs/llama/llama31_workload_base_configs.py; v0.6.0's flat recipes changed them (gb300 fp8cs at tp 4 without
# FSDP), not recorded.
_LLAMA3_70B_PRESETS = f"{BRIDGE} v0.2.0-v0.6.0 Llama 3 70B perf presets (LLAMA3_70B_*_{{system}}_{{precision}}*)"
_LLAMA31_405B_PRESETS = f"{BRIDGE} v0.2.0-v0.5.0 Llama 3.1 405B perf presets (LLAMA31_405B_*_{{system}}_{{precision}}*)"
_PRESET_NAMES = {"bf16": "BF16", "fp8cs": "FP8_CS", "fp8mx": "FP8_MX"}  # the presets' spelling
_PRESETS_0200_0600 = ("25.11", "26.02", "26.04.01", "26.06", "26.08")
_PRESETS_0200_0500 = _PRESETS_0200_0600[:-1]
BRIDGE_PERF_PRESET_OFFLOAD: tuple[PresetOffload, ...] = (
    *(PresetOffload(system, "llama-3-70b", precision, 1, layers, _PRESETS_0200_0600,
                    _LLAMA3_70B_PRESETS.format(system=system.upper(), precision=_PRESET_NAMES[precision]))
      for system, precision, layers in (("gb300", "bf16", 30), ("gb300", "fp8cs", 20), ("gb200", "bf16", 20),
                                        ("gb200", "fp8cs", 40), ("b200", "fp8cs", 5))),
    *(PresetOffload(system, "llama-3.1-405b", precision, 2, layers, _PRESETS_0200_0500,
                    _LLAMA31_405B_PRESETS.format(system=system.upper(), precision=_PRESET_NAMES[precision]))
      for system, precision, layers in (("gb300", "bf16", 40), ("gb300", "fp8cs", 10), ("gb200", "fp8cs", 92))),
)


def bridge_precision(precision: str, fp8_recipe: str | None) -> str | None:
    """The name Megatron-Bridge's perf presets give a run's precision (BF16, FP8_CS current scaling: Transformer
    Engine's tensorwise recipe, FP8_MX), lower-cased as RECIPE_PRECISION's; None for another fp8 recipe."""
    if precision == "bf16":
        return "bf16"
    return {"tensorwise": "fp8cs", "mxfp8": "fp8mx"}.get(fp8_recipe or "") if precision == "fp8" else None


def bridge_perf_preset_offload(release: str, system: str, model_key: str | None, precision: str | None,
                               tp: int) -> PresetOffload | None:
    """The layer-wise offload (BRIDGE_PERF_PRESET_OFFLOAD) of the preset a Megatron-FSDP run of a published table ran
    (its container release, system, catalog model, Bridge precision, tp), else None."""
    found = [p for p in BRIDGE_PERF_PRESET_OFFLOAD if release in p.releases and
             (p.system, p.model, p.precision, p.tp) == (system, model_key, precision, tp)]
    return found[0] if found else None


# --------------------------------------------------------------------------- Megatron-Bridge perf recipes' MoE runs


@dataclass(frozen=True)
class RecipeMoe:
    """What a Megatron-Bridge perf recipe sets for its MoE run that a row citing it may not state: the EP all-to-all
    overlap (comm_overlap.overlap_moe_expert_parallel_comm with delay_wgrad_compute, the plan's moe_a2a_overlap) and
    a full-iteration CUDA graph (cuda_graph_impl "full_iteration" with moe_expert_rank_capacity_factor and the paged
    stash: a static per-rank expert capacity, so the dispatcher reads no routing counts on the host)."""

    source: str  # path under src/megatron/bridge/ (NVIDIA-NeMo/Megatron-Bridge 067f987, 2026-08-22)
    a2a_overlap: bool
    full_iteration_graph: bool = False
    # per-layer CUDA graphs the recipe sets: cfg.model.cuda_graph_impl and the modules of its cuda_graph_scope
    graphs: tuple[str, tuple[str, ...]] | None = None


# Transformer Engine graphs of the attention, router and dispatcher preprocess, the experts eager (dropless)
TE_MOE_GRAPHS = ("transformer_engine", ("attn", "moe_router", "moe_preprocess"))
HYBRIDEP_FULL = "perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8"
DSV3_FULL = "perf_recipes/deepseek/common.py _enable_deepseek_full_iteration_mxfp8"
RECIPE_MOE: dict[str, RecipeMoe] = {
    "deepseek_v3_pretrain_256gpu_b200_fp8mx_config": RecipeMoe("perf_recipes/deepseek/b200/deepseek_v3.py", True),
    # partial (TE-scoped) CUDA graph there: "B200's 180 GB cannot hold the full-iteration graph for this model"
    "qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config": RecipeMoe("perf_recipes/qwen/b200/qwen3_moe.py", True,
                                                               graphs=TE_MOE_GRAPHS),  # its lines 314-315
    "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config": RecipeMoe(
        f"perf_recipes/qwen/gb200/qwen3_moe.py, {HYBRIDEP_FULL}", True, True),
    "qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config": RecipeMoe(
        f"perf_recipes/qwen/gb200/qwen3_moe.py, {HYBRIDEP_FULL}", True, True),
    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config": RecipeMoe(
        f"perf_recipes/deepseek/gb200/deepseek_v3.py, {DSV3_FULL}", True, True),
    "deepseek_v3_pretrain_1024gpu_h100_fp8cs_config": RecipeMoe("perf_recipes/deepseek/h100/deepseek_v3.py", False),
    "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config": RecipeMoe("perf_recipes/qwen/h100/qwen3_moe.py", False,
                                                                graphs=TE_MOE_GRAPHS),  # its lines 94-95
}
RECIPE_PRECISION = {"mxfp8": "fp8mx", "bf16": "bf16", "fp8": "fp8cs"}


# --------------------------------------------------------------------------- the pipeline split a recipe sets


@dataclass(frozen=True)
class RecipeSplit:
    """What a framework source sets for a catalog model's pipeline split: a layout for one (pp, vpp), or the
    embedding and the loss counted in the split (account_for_embedding/loss_in_pipeline_split) at any pp/vpp.
    A layout is either a string the source passes (its MTP layers m as written) or a helper's table row
    (decoder layers per virtual stage; E on the first, the model's MTP layers, where the helper places them,
    and L on the last). The Request fields an entry sets for a model are the bench's split_fields (they need the
    layout grammar of meshplan/arithmetic/schedule.py)."""

    repo: str  # the repository a row's framework or citation must name for the entry to apply to it
    source: str  # the path (and function) in that repository
    model: str  # catalog key
    pp: int | None = None  # None: any pp and vpp
    vpp: int | None = None
    layout: str | None = None
    counts: tuple[int, ...] = ()
    mtp_before_loss: bool = False  # the helper puts the model's MTP layers before the loss
    account_for: bool = False
    section: str = ""  # the part of the source it comes from, where the source sets several for one (pp, vpp)


# NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout
# (set_deepseek_v3_pipeline_model_parallel_layout, which every DeepSeek-V3 recipe and perf recipe calls, and
# scripts/performance/utils/overrides.py when pp or vp is overridden): (pp, vp) -> decoder layers per virtual stage,
# the last stage also ["mtp"] * mtp_num_layers + ["loss"] (MTP colocated with the loss, its default).
DSV3_HELPER = {(4, 1): (16, 16, 16, 13), (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
               (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,)}
# NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/kimi/h100/kimi_k2.py _get_kimi_k2_pipeline_layout (the
# Kimi-K2 recipes and perf recipes, and overrides.py): the same rows, the last stage [decoder..., "loss"] (no MTP),
# and (2, 8).
KIMI_HELPER = {**DSV3_HELPER, (2, 8): (4,) * 15 + (1,)}
RECIPE_SPLITS: tuple[RecipeSplit, ...] = (
    *(RecipeSplit(BRIDGE, "recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout", "deepseek-v3",
                  pp, vp, counts=c, mtp_before_loss=True) for (pp, vp), c in DSV3_HELPER.items()),
    *(RecipeSplit(BRIDGE, "recipes/kimi/h100/kimi_k2.py _get_kimi_k2_pipeline_layout", "kimi-k2", pp, vp, counts=c)
      for (pp, vp), c in KIMI_HELPER.items()),
    # (pp, vp) outside the helper's table: the perf recipes pass the string (set_deepseek_v3_..._layout(cfg.model, s))
    RecipeSplit(BRIDGE, "perf_recipes/deepseek/h100/deepseek_v3.py deepseek_v3_pretrain_1024gpu_h100_*_config",
                "deepseek-v3", 8, 4, layout="Et|(tt|)*30mL"),
    RecipeSplit(BRIDGE, "perf_recipes/deepseek/gb300/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb300_*_config",
                "deepseek-v3", 2, 8, layout="Et*4|(t*4|)*14tmL"),
    # the base recipe every Qwen3-235B-A22B / Llama-3.1-405B perf recipe starts from (perf_recipes/qwen/common.py,
    # perf_recipes/llama/common.py) sets both flags; the perf recipes change only pp and vpp
    RecipeSplit(BRIDGE, "recipes/qwen/h100/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config",
                "qwen3-235b-a22b", account_for=True),
    RecipeSplit(BRIDGE, "recipes/llama/h100/llama3.py llama31_405b_pretrain_256gpu_h100_bf16_config",
                "llama-3.1-405b", account_for=True),
    # yanring/Megatron-MoE-ModelZoo best_practice/deepseek-v3/run_deepseek_v3_*.sh (--pipeline-model-parallel-layout;
    # pp from PP=, vpp from the layout's stages) and model_configs/benchmarking/Qwen3-235B-A22B.yaml
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_h100.sh (1024 H100; 256 B200)", "deepseek-v3",
                8, 4, layout="Et|(tt|)*30mL"),
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_h100.sh '# Long Context' (256/512 H100)",
                "deepseek-v3", 8, 4, layout="Et*2|(tt|)*22t|(tt|)*7mL", section="long context"),
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_b200.sh", "deepseek-v3", 8, 2,
                layout="Et*4|(tttt|)*14tmL"),
    RecipeSplit(MODELZOO, "best_practice/deepseek-v3/run_deepseek_v3_gb200.sh, run_deepseek_v3_gb300.sh",
                "deepseek-v3", 4, 4, layout="Et*4|(tttt|)*14tmL"),
    RecipeSplit(MODELZOO, "model_configs/benchmarking/Qwen3-235B-A22B.yaml", "qwen3-235b-a22b", account_for=True),
)



@dataclass(frozen=True)
class RecipeMtp:
    """The multi-token-prediction depth a framework's recipes train a catalog model at (Megatron-Core's
    mtp_num_layers and mtp_use_repeated_layer: the run's, which the model's config need not state), as the Request
    fields mtp_num_layers and mtp_use_repeated_layer."""

    repo: str  # the repository a row's framework or citation must name for the entry to apply to it
    source: str  # the path (and what it sets) in that repository
    model: str  # catalog key
    depth: int
    repeated: bool = False

    def fields(self) -> dict[str, Any]:
        return {"mtp_num_layers": self.depth, **({"mtp_use_repeated_layer": True} if self.repeated else {})}


# NVIDIA-NeMo/Megatron-Bridge 067f987: every Nemotron 3 Super recipe trains its one MTP block at two depths, and the
# performance recipes start from them (perf_recipes/nemotronh/common.py imports nemotron_3_super_pretrain_config,
# _apply_nemotron_3_super_perf_defaults leaves the MTP fields); DeepSeek-V3's recipes train its one block once.
RECIPE_MTP: tuple[RecipeMtp, ...] = (
    RecipeMtp(BRIDGE, "src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_super.py (cfg.model.mtp_num_layers = 2, "
                      "cfg.model.mtp_use_repeated_layer = True)", "nemotron-3-super-120b-a12b", 2, repeated=True),
    RecipeMtp(BRIDGE, "src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py (cfg.model.mtp_num_layers = 1)",
              "deepseek-v3", 1),
)

# What the recipes of a file a split comes from set for the optimizer and the gradient buffer, which the split was
# written for (the job a RecipeSplit's pipeline runs): the recipe file (RecipeSplit.source's path) -> (Request fields,
# where they are set). NVIDIA-NeMo/Megatron-Bridge 067f987 src/megatron/bridge/recipes/kimi/h100/kimi_k2.py
# kimi_k2_pretrain_512gpu_h100_bf16_config calls _apply_kimi_k2_optimizer(cfg, "muon"):
# recipes/utils/optimizer_utils.py distributed_muon_with_cosine_annealing (optimizer "dist_muon", Megatron-Core's
# layer-wise distributed Muon: meshplan's optimizer=muon at zero_stage 1, left to the search as every ZeRO stage is),
# fp32 main params and one fp32 momentum, grad_reduce_in_fp32 True (MixedPrecisionConfig and cfg.ddp); the perf
# recipes start from it (perf_recipes/kimi/common.py) and keep Muon. recipes/deepseek/h100/deepseek_v3.py (1024gpu and
# 256gpu_32nodes configs): use_precision_aware_optimizer with bf16 exp_avg / exp_avg_sq and fp32 main params,
# grad_reduce_in_fp32 False; the perf recipes start from deepseek_v3_pretrain_config (that 1024-GPU recipe) and
# _perf_precision keeps the bf16 grad buffer. Qwen3-235B-A22B's recipe keeps fp32 moments and grads (the defaults).
DSV3_OPTIMIZER = {"optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False}
RECIPE_OPTIMIZERS: dict[str, tuple[dict[str, Any], str]] = {
    "recipes/kimi/h100/kimi_k2.py": (
        {"optimizer": "muon", "grad_reduce_in_fp32": True},
        f"{BRIDGE} recipes/kimi/h100/kimi_k2.py _apply_kimi_k2_optimizer(cfg, 'muon'): dist_muon, fp32 grads"),
    **{path: (DSV3_OPTIMIZER, f"{BRIDGE} recipes/deepseek/h100/deepseek_v3.py deepseek_v3_pretrain_1024gpu_h100_bf16_"
                              "config: precision-aware optimizer, bf16 moments, bf16 grad buffer")
       for path in ("recipes/deepseek/h100/deepseek_v3.py", "perf_recipes/deepseek/h100/deepseek_v3.py",
                    "perf_recipes/deepseek/gb300/deepseek_v3.py")},
}


def recipe_optimizer(split: RecipeSplit) -> dict[str, Any]:
    """The Request fields the recipes of the file `split` comes from set for the optimizer and the gradient buffer
    (RECIPE_OPTIMIZERS), {} where meshplan's defaults are what they set or the file is not listed."""
    return dict(RECIPE_OPTIMIZERS.get(split.source.split()[0], ({}, ""))[0])
