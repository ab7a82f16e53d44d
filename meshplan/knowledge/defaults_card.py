"""The framework card's choices a request leaves open and the limits the layout-fitting code keeps to (cards/frameworks/
*.yaml `defaults`, `memory_fix`, `limits`, `search`): what the framework runs by default, how far MEM001's fix may
raise the ZeRO stage, what it refuses, and the knobs recommend opens. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.knowledge.release_lines import longest_line
from meshplan.schema.choices import CrossEntropyFusionImpl, Fp8Recipe, Recompute
from meshplan.schema.model import Architecture


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FrameworkDefaults(_Card):
    zero_stage: int = Field(ge=0, le=3)
    sequence_parallel_when_tp: bool = True
    sequence_parallel_off_for: list[Literal["moe", "tied_embeddings", "pipeline"]] = Field(
        default_factory=list, description="Models the framework turns sequence parallelism off for, whatever tp, and "
                                          "`pipeline`: off in every pipeline stage (pp > 1) (its why in "
                                          "sequence_parallel_why)")
    sequence_parallel_why: str | None = None
    etp: Literal["tp", 1] = Field(1, description="An MoE model's expert TP when the request leaves etp unset")
    etp_why: str | None = None
    etp_recipes: str | None = Field(
        None, description="What the framework's own MoE recipes set instead of the default, as resolve()'s etp note "
                          "says it (its files cited in etp_why)")
    fp8_recipe: Fp8Recipe | None = Field(
        None, description="The FP8 recipe the framework runs when precision=fp8 leaves fp8_recipe out (None: it has no "
                          "fp8 recipe choice meshplan models)")
    fp8_recipe_why: str | None = None
    fp8_recipe_reaches_optimizer: bool = Field(
        False, description="The framework writes fp8_recipe (the plan's, else this default) into Megatron-Core's "
                           "OptimizerConfig whatever the precision, where its precision-aware optimizer reads it "
                           "(memory_states.optimizer_fp8_recipe); False: a run without fp8 hands it none")
    fp8_recipe_reaches_optimizer_why: str | None = None
    bias_activation_fusion: bool | None = Field(
        None, description="Megatron-Core's bias_activation_fusion where the request leaves it out (None: the framework "
                          "has no such switch; its own activation code runs, request.resolve refuses the field)")
    bias_activation_fusion_flipped_for: list[str] = Field(
        default_factory=list, description="model_types whose model provider sets the opposite of "
                                          "bias_activation_fusion (Megatron-Bridge's Llama, DeepSeek, GLM, gpt-oss, "
                                          "Kimi and GPT-3 providers turn it on)")
    bias_activation_fusion_flipped_by_release: dict[str, list[str]] = Field(
        default_factory=dict, description="Per release line, the model_types flipped there in place of "
                                          "bias_activation_fusion_flipped_for (verl 0.5's own config converter turns "
                                          "it on for its MoE models only)")
    bias_activation_fusion_why: str | None = None
    cross_entropy_loss_fusion: bool | None = Field(
        None, description="Megatron-Core's cross_entropy_loss_fusion where the request leaves it out (None: the "
                          "framework has no such switch; its memory convention's loss runs, request.resolve refuses "
                          "the fields)")
    cross_entropy_fusion_impl: CrossEntropyFusionImpl = Field(
        "native", description="The fused implementation where the request leaves cross_entropy_fusion_impl out")
    cross_entropy_te_for: list[str] = Field(
        default_factory=list, description="model_types whose model provider sets cross_entropy_loss_fusion with "
                                          "cross_entropy_fusion_impl te (Megatron-Bridge's DeepSeek and Kimi bridges)")
    cross_entropy_te_refused_from: str | None = Field(
        None, description="The release from which the framework's argument validation refuses "
                          "cross_entropy_fusion_impl te with cross_entropy_loss_fusion (None: it takes it)")
    cross_entropy_why: str | None = None
    moe_shared_expert_overlap: bool | None = Field(
        None, description="Megatron-Core's moe_shared_expert_overlap where the request leaves it out, for a model with "
                          "shared experts (None: the framework has no such key; rule EP012 refuses the field)")
    moe_shared_expert_overlap_flipped_for: list[str] = Field(
        default_factory=list, description="model_types whose model provider sets the opposite of "
                                          "moe_shared_expert_overlap (Megatron-Bridge's DeepSeek-V2/V3, GLM-4.5 and "
                                          "Kimi-K2 bridges turn it on)")
    moe_shared_expert_overlap_why: str | None = None

    @model_validator(mode="after")
    def _claim_has_why(self) -> FrameworkDefaults:
        if self.etp != 1 and not self.etp_why:
            raise ValueError("etp: tp needs etp_why (the framework source that defaults it so)")
        if self.etp_recipes and self.etp != "tp":
            raise ValueError("etp_recipes qualifies an etp: tp default; with etp: 1 there is nothing to qualify")
        if self.fp8_recipe is not None and not self.fp8_recipe_why:
            raise ValueError("fp8_recipe needs fp8_recipe_why (the framework source that defaults it so)")
        if self.fp8_recipe_reaches_optimizer and (self.fp8_recipe is None or not self.fp8_recipe_reaches_optimizer_why):
            raise ValueError("fp8_recipe_reaches_optimizer needs an fp8_recipe default and "
                             "fp8_recipe_reaches_optimizer_why (the framework source that hands it over)")
        if self.bias_activation_fusion is not None and not self.bias_activation_fusion_why:
            raise ValueError("bias_activation_fusion needs bias_activation_fusion_why (the framework source)")
        if (self.bias_activation_fusion_flipped_for or self.bias_activation_fusion_flipped_by_release) \
                and self.bias_activation_fusion is None:
            raise ValueError("bias_activation_fusion_flipped_for qualifies a bias_activation_fusion default")
        if self.cross_entropy_loss_fusion is not None and not self.cross_entropy_why:
            raise ValueError("cross_entropy_loss_fusion needs cross_entropy_why (the framework source)")
        if (self.cross_entropy_te_for or self.cross_entropy_te_refused_from) and self.cross_entropy_loss_fusion is None:
            raise ValueError("cross_entropy_te_for / cross_entropy_te_refused_from qualify a cross_entropy_loss_fusion "
                             "default")
        if self.moe_shared_expert_overlap is not None and not self.moe_shared_expert_overlap_why:
            raise ValueError("moe_shared_expert_overlap needs moe_shared_expert_overlap_why (the framework source)")
        if self.moe_shared_expert_overlap_flipped_for and self.moe_shared_expert_overlap is None:
            raise ValueError("moe_shared_expert_overlap_flipped_for qualifies a moe_shared_expert_overlap default")
        if self.sequence_parallel_off_for and not self.sequence_parallel_why:
            raise ValueError("sequence_parallel_off_for needs sequence_parallel_why (the framework source)")
        return self

    def sequence_parallel_with_tp(self, arch: Architecture, pp: int = 1) -> bool:
        """Whether the framework runs sequence parallelism beside TP > 1 for this model at this pipeline degree (a
        request that leaves sequence_parallel out gets it): sequence_parallel_when_tp, unless the model is of a kind
        it turns it off for, or its pipeline stages run without it."""
        off = (("moe" in self.sequence_parallel_off_for and arch.is_moe)
               or ("tied_embeddings" in self.sequence_parallel_off_for and arch.tie_word_embeddings))
        return self.sequence_parallel_when_tp and not off and self.sequence_parallel_in_pipeline(pp)

    def activation_fusion(self, model_type: str, release: str | None = None) -> bool | None:
        """Whether the framework runs Megatron-Core's fused bias + activation for a model of this type when the request
        leaves bias_activation_fusion out (the provider's default on Megatron-Bridge), in `release` (its line's
        bias_activation_fusion_flipped_by_release, else the card's own); None where it has no switch."""
        if self.bias_activation_fusion is None:
            return None
        line = longest_line(release, self.bias_activation_fusion_flipped_by_release)
        flipped = self.bias_activation_fusion_flipped_for if line is None else \
            self.bias_activation_fusion_flipped_by_release[line]
        return self.bias_activation_fusion != (model_type in flipped)

    def cross_entropy(self, model_type: str) -> tuple[bool, CrossEntropyFusionImpl] | None:
        """(cross_entropy_loss_fusion, cross_entropy_fusion_impl) the framework runs a model of this type with when
        the request leaves them out (the provider's on Megatron-Bridge); None where it has no such switch."""
        if self.cross_entropy_loss_fusion is None:
            return None
        if model_type in self.cross_entropy_te_for:
            return True, "te"
        return self.cross_entropy_loss_fusion, self.cross_entropy_fusion_impl

    def shared_expert_overlap(self, model_type: str) -> bool | None:
        """Whether the framework overlaps a model of this type's shared experts with the token dispatch when the
        request leaves moe_shared_expert_overlap out (the model provider's default on Megatron-Bridge, Megatron-Core's
        TransformerConfig default elsewhere); None where it has no such key."""
        if self.moe_shared_expert_overlap is None:
            return None
        return self.moe_shared_expert_overlap != (model_type in self.moe_shared_expert_overlap_flipped_for)

    def sequence_parallel_in_pipeline(self, pp: int) -> bool:
        """False where the framework turns sequence parallelism off in its pipeline stages and pp > 1."""
        return pp == 1 or "pipeline" not in self.sequence_parallel_off_for


class MemoryFix(_Card):
    """How far MEM001's fix may raise zero_stage on this framework (null: the fix never changes it)."""

    highest_zero_stage: int | None = Field(ge=0, le=3)
    highest_zero_stage_with_pp: int | None = Field(None, ge=0, le=3)
    why: str


class FrameworkLimits(_Card):
    """Combinations the framework refuses that the layout-fitting code must avoid (rules.yaml reports them)."""

    moe_with_pipeline: bool = True
    why: str | None = None
    data_parallel: str | None = Field(
        None, description="How the framework sets its data-parallel size against the GPU count, as rule WS003's "
                          "message says it (its source in data_parallel_source); None: the card states none")
    data_parallel_source: str | None = None

    @model_validator(mode="after")
    def _claim_has_why(self) -> FrameworkLimits:
        if not self.moe_with_pipeline and not self.why:
            raise ValueError("a limit needs a why (the framework source that imposes it)")
        if self.data_parallel and not self.data_parallel_source:
            raise ValueError("data_parallel needs data_parallel_source (the framework source that sets dp so)")
        return self


class SearchKnobs(_Card):
    """The knobs `recommend` opens on this framework; tp, pp, dp and the ZeRO stages of cards/memory.yaml are
    always searched. Whether the flex MoE dispatcher is searched follows the adapter (FrameworkCard.flex_dispatcher)."""

    vpp: bool
    cp: bool
    ep: bool
    etp: bool
    recompute: list[Recompute] = Field(min_length=1)
    source: str
