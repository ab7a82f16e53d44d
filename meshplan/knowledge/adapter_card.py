"""The framework card's `adapter` section: what meshplan.adapters renders for the framework, its variants, versions
and each version's key (or what to do instead) for every knob a plan can set. Apart from cards.py, which holds the
card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.schema.choices import Framework


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The knobs an adapter section must account for in every version (a key, or `instead` saying what to do).
ADAPTER_KNOBS: tuple[str, ...] = (
    "tp", "pp", "vpp", "cp", "cp_comm_type", "ep", "etp", "sequence_parallel", "zero_0", "zero_1",
    "zero_2", "zero_3", "recompute_none", "recompute_selective", "recompute_full", "recompute_layers",
    "selective_ac_option", "recompute_method", "recompute_modules", "uneven_pp",
    "micro_batch_size", "global_batch_size", "fp8", "moe_flex_dispatcher", "moe_a2a_overlap", "torch_compile",
    "tp_comm_overlap", "pipeline_layout",
    "account_for_embedding",
    "account_for_loss", "activation_offload", "param_offload", "grad_offload", "optimizer_offload",
    "optimizer_offload_fraction",
    "optimizer", "optimizer_state_dtype", "fp8_param_gather", "grad_reduce_fp32", "grad_reduce_bf16", "fp8_delayed",
    "fp8_tensorwise", "fp8_rowwise", "fp8_blockwise", "fp8_mxfp8",
    "lora_rank", "lora_targets", "attention_backend", "dropout", "pipeline_schedule", "dp_replicate",
    "mtp_num_layers", "cuda_graphs", "fp8_activation_input_store", "fp8_dot_product_attention",
    "moe_shared_expert_overlap",
    "bias_activation_fusion", "moe_flex_backend", "activation_offload_layers",
)


class AdapterKnob(_Card):
    key: str | None = Field(description="The framework's name for this knob; null when it has none")
    instead: str | None = Field(None, description="What to use when the framework lacks the knob (or a value); "
                                                 "beside a key, the caveat the skill guide prints with it")
    values: dict[str, str | None] | None = Field(
        None, description="A knob with a vocabulary (attention_backend, pipeline_schedule): the framework's value for "
                          "each of meshplan's; "
                          "null where the framework has none (refused with 'instead')")
    zero_stages: list[Literal[0, 1, 2, 3]] | None = Field(
        None, description="The ZeRO stages at which the key takes effect, where not all (verl's bf16 gradient buffer: "
                          "through Megatron's precision-aware optimizer, inside the distributed optimizer only); "
                          "'instead' says what to do at the others")
    beside: dict[str, str] | None = Field(
        None, description="Keys the framework reads this knob's value only beside (Megatron-Bridge's "
                          "data_parallel_sharding_strategy takes effect with ddp.use_megatron_fsdp on), each with its "
                          "value as a YAML word: a fix that sets the knob writes them too")
    reason: str | None = Field(None, description="A missing knob a request gets when it leaves the field out "
                                                 "(REASON_KNOBS): what the run does instead, the words of the note "
                                                 "that says so (no final period)")
    runs_on: Framework | None = Field(
        None, description="A missing knob (key: null) that another framework has for the same model code: a job that "
                          "needs the knob is that framework's job (Megatron-LM's pretrain_gpt has no LoRA; Megatron-"
                          "Bridge trains the same Megatron-Core model with it), named in 'instead' too")
    off_beside_flex: bool = Field(
        False, description="The framework's own flex-dispatcher setup turns this knob off whatever the config "
                           "says (Megatron-Bridge's apply_flex_dispatcher_backend: moe_shared_expert_overlap = False), "
                           "where Megatron-Core itself runs it beside flex: render writes it off with flex and rule "
                           "EP012 refuses it on there")

    @model_validator(mode="after")
    def _missing_says_instead(self) -> AdapterKnob:
        if (self.key is None or None in (self.values or {}).values() or self.zero_stages) and not self.instead:
            raise ValueError("a missing knob (key: null), value (null) or ZeRO stage (zero_stages) needs 'instead'")
        if self.reason is not None and (self.key is not None or self.reason.endswith(".")):
            raise ValueError("'reason' belongs to a missing knob (key: null) and ends without a period")
        if self.runs_on is not None and (self.key is not None or self.runs_on not in (self.instead or "")):
            raise ValueError("'runs_on' belongs to a missing knob (key: null) whose 'instead' names that framework")
        return self


# Knobs a request that leaves its field out gets: one missing (key null) needs its `reason`, which request.resolve
# tells that request (recompute left out: full where checkpointing cannot be turned off, SkyRL's main_sft at ZeRO-3).
REASON_KNOBS = ("recompute_none",)


class AdapterVersion(_Card):
    format: str
    knobs: dict[str, AdapterKnob]

    @model_validator(mode="after")
    def _every_knob(self) -> AdapterVersion:
        unknown, missing = set(self.knobs) - set(ADAPTER_KNOBS), set(ADAPTER_KNOBS) - set(self.knobs)
        if unknown or missing:
            raise ValueError(f"unknown knobs {sorted(unknown)}, missing {sorted(missing)}; knobs are "
                             f"{', '.join(ADAPTER_KNOBS)}")
        return self


class AdapterSection(_Card):
    """What meshplan.adapters renders for the framework: variants, versions and each version's keys."""

    variants: dict[str, str] = Field(description="Variant name -> what it renders")
    default_version: str
    versions: dict[str, AdapterVersion]
    variant_knobs: dict[str, dict[str, AdapterKnob]] = Field(
        default_factory=dict, description="Per-variant overrides of the version's knobs (e.g. verl's FSDP backend)"
    )
    sources: list[str]

    @model_validator(mode="after")
    def _consistent(self) -> AdapterSection:
        if self.default_version not in self.versions:
            raise ValueError(f"default_version {self.default_version!r} is not in versions "
                             f"({', '.join(self.versions)})")
        for variant, knobs in self.variant_knobs.items():
            unknown = sorted(set(knobs) - set(ADAPTER_KNOBS))
            if variant not in self.variants or unknown:
                raise ValueError(f"variant_knobs.{variant}: unknown variant or knob ({unknown})")
        for table in [*self.variant_knobs.values(), *(v.knobs for v in self.versions.values())]:
            if any(k in table and table[k].key is None and not table[k].reason for k in REASON_KNOBS):
                raise ValueError(f"a missing {' or '.join(REASON_KNOBS)} needs 'reason' (what the run does instead)")
        return self

    def renders(self, knob: str) -> bool:
        """Whether the default version writes this knob (a key, not `instead`)."""
        return self.versions[self.default_version].knobs[knob].key is not None
