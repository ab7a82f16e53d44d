"""LoRA keys of the adapters: Megatron-Bridge's peft config, verl's and SkyRL's model LoRA fields.

The key names are the framework cards' lora_rank / lora_targets adapter knobs (checked against the pinned packages by
tests/test_adapters_frameworks.py); this module writes their values. Engines built on Megatron-Bridge's LoRA take its
target names (linear_qkv ...); the FSDP engines run Hugging Face PEFT, whose targets are the model's own projection
names (Llama/Qwen naming: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
"""

from __future__ import annotations

from typing import Any

from meshplan.arithmetic.lora import DEFAULT_TARGETS, TARGETS, peft_all_linear
from meshplan.schema.plan import Job

Setting = tuple[str, Any]

# Megatron-Core linear -> the Hugging Face projections it fuses (Llama/Qwen/Mistral naming; PEFT matches by suffix);
# MLA's linears -> DeepSeek's names, the same in transformers 5.9.0 (models/deepseek_v3 DeepseekV3Attention) and NeMo
# AutoModel 0.7.0 (components/models/deepseek_v3/layers.py MLA): q_proj (no q_lora_rank) or q_a_proj and q_b_proj,
# kv_a_proj_with_mqa, kv_b_proj; the router an nn.Linear in DeepSeek-V2's code (mlp.gate) and Qwen2-MoE's
# shared_expert_gate (adapters/hf_modules.py), which PEFT matches by that last name
HF_PROJECTIONS = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                  "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",),
                  "linear_q_proj": ("q_proj",), "linear_q_down_proj": ("q_a_proj",), "linear_q_up_proj": ("q_b_proj",),
                  "linear_kv_down_proj": ("kv_a_proj_with_mqa",), "linear_kv_up_proj": ("kv_b_proj",),
                  "router": ("gate",), "shared_expert_gate": ("shared_expert_gate",),
                  "in_proj": ("in_proj",), "out_proj": ("out_proj",)}  # transformers' NemotronHMamba2Mixer
MLA_ONLY = frozenset(HF_PROJECTIONS["linear_q_down_proj"] + HF_PROJECTIONS["linear_q_up_proj"]
                     + HF_PROJECTIONS["linear_kv_down_proj"] + HF_PROJECTIONS["linear_kv_up_proj"])
"""The projection names only MLA attention has: a list holding one names DeepSeek's modules, so its q_proj is MLA's
linear_q_proj (no q_lora_rank), not a third of linear_qkv."""
VISION_EXCLUDE = "vision_model[.].*"
"""PEFT's exclude_modules (a string: re.fullmatch on the full module name) that leaves a multimodal model's vision tower
out, every module under Llama4ForConditionalGeneration.vision_model (adapters/hf_modules.py): LoraSpec.vision false."""
ALL_LINEAR = "all-linear"  # verl's and SkyRL's default target_modules: every linear (the same four, per projection)

# Megatron-Bridge: the LoRA class a recipe's cfg.peft must be before its fields are set (a pretrain/SFT recipe has
# cfg.peft = None; a *_peft_config recipe already holds a LoRA, whose other fields (alpha, dropout) are kept).
BRIDGE_SETUP = ("from megatron.bridge.peft.lora import LoRA", "if not isinstance(cfg.peft, LoRA):",
                "    cfg.peft = LoRA()")


def bridge_lora(job: Job) -> list[Setting]:
    """cfg.peft.dim and cfg.peft.target_modules (ConfigContainer.peft, a Megatron-Bridge LoRA)."""
    if job.lora is None:
        return []
    return [("peft.dim", job.lora.rank), ("peft.target_modules", list(job.lora.targets))]


def hf_targets(job: Job) -> str | list[str]:
    """PEFT target_modules for the job's Megatron target names: every one the model has (an MLA model has no
    linear_qkv) = all-linear, which also adapts the model's other linears (arithmetic/lora.py other_linears, as the
    count takes them), unless all-linear would wrap a router whose forward returns a tuple (peft_all_linear: Llama 4);
    else the projections."""
    assert job.lora is not None
    if peft_all_linear(job.model, job.lora):
        return ALL_LINEAR
    return hf_projections(job.lora.targets)


def vision_exclusion(job: Job) -> list[str]:
    """The exclude_modules a PEFT engine's job writes: VISION_EXCLUDE where the adapters leave a vision tower out (the
    engine builds it: LoraSpec.vision false on a model with one), else none."""
    assert job.lora is not None
    return [VISION_EXCLUDE] if job.model.vision is not None and not job.lora.vision else []


def hf_projections(targets: list[str]) -> list[str]:
    """The Hugging Face projection names of Megatron target names, in order (PEFT's and AutoModel's module names)."""
    return [name for target in targets for name in HF_PROJECTIONS[target]]


def verl_lora(job: Job, variant: str, notes: list[str]) -> list[Setting]:
    """verl 0.9.1: the Megatron engine's actor_rollout_ref.model.lora.{rank,target_modules} (a Megatron-Bridge LoRA),
    the FSDP engine's actor_rollout_ref.model.lora_rank / target_modules (Hugging Face PEFT); the SFT trainer's
    model.lora_rank / target_modules, or on its Megatron engine model.lora.* (the same HFModelConfig,
    sft_trainer_engine.yaml model@model: hf_model); on the FSDP engine, PEFT's target_parameters named by the routed
    experts' weights (LoraSpec.target_parameters: gate_up_proj, down_proj, which PEFT matches as the last part of
    mlp.experts.<name>)."""
    if job.lora is None:
        return []
    m = "model." if variant in ("sft-fsdp", "sft-megatron") else "actor_rollout_ref.model."
    if variant in ("fsdp", "sft-fsdp"):
        notes.append(f"LoRA (FSDP engine, Hugging Face PEFT): rank {job.lora.rank}, lora_alpha left at verl's 16; "
                     "target_modules name the model's projections (Llama/Qwen naming)"
                     + (f"; target_parameters wraps the routed experts' {' and '.join(job.lora.target_parameters)} "
                        "(PEFT's ParamWrapper: one adapter per expert, W + delta built each forward)."
                        if job.lora.target_parameters else "."))
        # '++': verl 0.9.1's hf_model.yaml declares no target_parameters (only HFModelConfig does), and Hydra refuses
        # a plain override of a key its composed config lacks
        wrapped = ([("++" + m + "target_parameters", list(job.lora.target_parameters))]
                   if job.lora.target_parameters else [])
        return [(m + "lora_rank", job.lora.rank), (m + "target_modules", hf_targets(job)),
                *[(m + "exclude_modules", value) for value in vision_exclusion(job)], *wrapped]
    notes.append(f"LoRA (Megatron engine, Megatron-Bridge LoRA): rank {job.lora.rank}, lora.alpha left at verl's 32.")
    return [(m + "lora.rank", job.lora.rank), (m + "lora.target_modules", list(job.lora.targets))]


def skyrl_lora(job: Job, variant: str, notes: list[str]) -> list[Setting]:
    """SkyRL 0.4.0: trainer.policy.model.lora.{rank,target_modules} (SkyRLLoraConfig), and main_sft's model.lora.*
    (SFTConfig.model is the same ModelConfig, copied onto trainer.policy.model: sft_config.py
    build_skyrl_config_for_sft); all-linear is the four Megatron targets on the Megatron strategy (megatron_worker.py)
    and every linear under FSDP (PEFT)."""
    if job.lora is None:
        return []
    targets: str | list[str] = hf_targets(job) if variant in ("fsdp", "sft-fsdp") else (
        ALL_LINEAR if set(job.lora.targets) == set(DEFAULT_TARGETS) else list(job.lora.targets))
    notes.append(f"LoRA: rank {job.lora.rank}, alpha left at SkyRL's 16.")
    model = "model" if variant in ("sft", "sft-fsdp") else "trainer.policy.model"
    peft = [(f"{model}.lora.exclude_modules", v) for v in vision_exclusion(job)] if variant in ("fsdp", "sft-fsdp") \
        else []
    return [(f"{model}.lora.rank", job.lora.rank), (f"{model}.lora.target_modules", targets), *peft]


def read_targets(value: Any, hf: bool) -> list[str]:
    """The Megatron target names a rendered target_modules value stands for (the inverse of the functions above)."""
    if value == ALL_LINEAR:
        return list(DEFAULT_TARGETS)
    if isinstance(value, str) and value.startswith("["):  # a Hydra list override: [a,b]
        value = [name.strip() for name in value.strip("[]").split(",") if name.strip()]
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    if not hf:
        return names
    return projection_targets({projection_name(name) for name in names})


def projection_name(pattern: Any) -> str:
    """The projection a target pattern names: AutoModel's wildcards over module paths (fnmatch: '*.q_proj', '*q_proj')
    end in it."""
    return str(pattern).rsplit(".", 1)[-1].lstrip("*")


def projection_targets(names: set[str]) -> list[str]:
    """The Megatron target names whole Hugging Face projections make up: q_proj is MLA's linear_q_proj beside an
    MLA-only name (MLA_ONLY) without k_proj and v_proj, else a third of linear_qkv."""
    mla = bool(names & MLA_ONLY) and not names & {"k_proj", "v_proj"}
    return [t for t in TARGETS if set(HF_PROJECTIONS[t]) <= names
            and not (t == "linear_qkv" and mla) and not (t == "linear_q_proj" and not mla)]


def known_projections() -> str:
    """The Hugging Face projection names read_targets knows (hf=True), in the groups each Megatron target needs: what
    a refusal of targets that match none of them names."""
    groups = {" and ".join(HF_PROJECTIONS[t]): t for t in TARGETS}
    return "; ".join(f"{names} ({target})" for names, target in groups.items())


def unknown_projections(names: list[str]) -> list[str]:
    """The names (a module path's last part, a leading wildcard dropped) that are none of the Hugging Face projections
    read_targets knows: what it would drop."""
    known = {name for group in HF_PROJECTIONS.values() for name in group}
    return [n for n in names if projection_name(n) not in known]


def parsed_lora(rank: Any, targets: Any, hf: bool = False, exclude: Any = None,
                wrapped: Any = None) -> dict[str, Any]:
    """The job's lora as a snippet states it ({} when the snippet sets no rank); a PEFT exclude_modules of
    VISION_EXCLUDE (vision_exclusion) is the vision tower left out; `wrapped`, PEFT's target_parameters, the routed
    experts' weights verl_lora names."""
    if rank in (None, 0):
        return {}
    weights = [] if wrapped is None else read_targets(wrapped, hf=False)
    return {"lora": {"rank": int(rank), "targets": read_targets(targets, hf), "vision": exclude != VISION_EXCLUDE,
                     "target_parameters": weights}}
