"""The framework card's `read` section (cards/frameworks/*.yaml): what meshplan's readers of a framework's own files
(adapters/read/) and the model built from a launch script's flags (knowledge/flag_models.py) take from the card.
Typed here so a misspelt key fails when the card loads, naming the card and the key, instead of a reader quietly
finding nothing under it. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from meshplan.schema.choices import Fp8Recipe, JobKind, Precision
from meshplan.schema.request import Request


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The fields of a model_shape entry, in its order (the launch script's shape: knowledge/flag_models.py builds them)
SHAPE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size")

# What a model flag sets: a field the readers compare with a catalog model (adapters/read/model_match.py) or the
# builder reads (knowledge/flag_models.py), by this name.
ModelField = Literal[
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size", "head_dim",
    "num_experts", "top_k", "expert_ffn_hidden_size", "shared_expert_ffn_hidden_size", "moe_layer_freq",
    "expert_interval", "num_groups", "group_topk", "mla", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "untied", "swiglu", "qk_layernorm", "num_mtp_layers", "gqa", "normalization",
    "no_bias_linear", "qkv_bias", "position_embedding", "rotary", "no_position_embedding", "max_position_embeddings",
    "squared_relu", "quick_geglu", "rotary_base", "rotary_percent", "norm_eps", "mlp_type", "layer_pattern",
    "mamba_num_heads", "mamba_head_dim", "mamba_num_groups", "mamba_state_dim", "shared_expert_gate",
    "attention_output_gate", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "linear_attention_freq", "index_n_heads", "index_head_dim",
    "index_topk", "tokenizer_type"]
Default = StrictBool | StrictInt | StrictFloat | StrictStr | None  # as the card writes it: never coerced
FlagDefault = StrictBool | StrictInt | None  # a matched field's default: a count, or a switch


class BuildValue(_Card):
    """A flag whose values meshplan builds only some of (model_build_values): any other is refused with `why`."""

    allowed: list[str] = Field(min_length=1)
    why: str


class RecipePrecision(_Card):
    """The request fields a recipe name's precision word states (Megatron-Bridge's fp8cs: fp8, tensorwise)."""

    precision: Precision
    fp8_recipe: Fp8Recipe | None = None


class RecipeNames(_Card):
    """What a Megatron-Bridge recipe function's name states: its job and precision words."""

    jobs: dict[str, JobKind]
    precisions: dict[str, RecipePrecision]
    grad_reduce_overlap: dict[str, bool] = Field(
        default_factory=dict, description="Per job word, the DP overlap its recipes run with where the file sets "
                                          "neither ddp.overlap_grad_reduce nor cfg.comm_overlap (a job not listed: "
                                          "meshplan's default, on)")
    source: str


class SftEntry(_Card):
    """One SFT entry point of a framework (verl's sft_trainer, its older fsdp_sft_trainer): the module, its keys read
    as the rendered entry point's, and what a file leaving a key out runs."""

    launcher: str
    keys_as: dict[str, str] = Field(
        default_factory=dict, description="This entry point's key (or a prefix ending in '.') and the rendered entry "
                                          "point's key it is read as")
    defaults: dict[str, Default] = Field(
        default_factory=dict, description="A request field or a reader's name (dynamic_batch, token_budget, "
                                          "remove_padding) and its value when the file leaves its key out")
    sections: list[str] = Field(
        min_length=1, description="The top-level keys of this entry point's Hydra YAML (its own and the config "
                                  "groups its defaults list composes): a YAML mapping whose keys are all among "
                                  "them is read as its config (adapters/read/detect.py)")
    source: str


class SftEngine(_Card):
    """An engine the SFT trainer runs beside its default one (verl's engine=megatron): the adapter variant its keys
    are read with, and what that engine runs when a key is left out, over the entry point's defaults."""

    variant: str
    defaults: dict[str, Default] = Field(default_factory=dict)
    source: str


class NeutralValue(_Card):
    """A key whose default value changes nothing meshplan plans; any other value is said as not modelled."""

    value: Default
    otherwise: str


class SftRead(_Card):
    """What the readers take from a framework's SFT trainer files beside its adapter knobs (the variant `variant`)."""

    variant: str
    keys: dict[str, str] = Field(description="The keys that are no adapter knob, and what each sets")
    entries: list[SftEntry] = Field(min_length=1)
    neutral: dict[str, NeutralValue] = Field(default_factory=dict)
    engines: dict[str, SftEngine] = Field(
        default_factory=dict, description="The Hydra engine group's other values the trainer runs (engine=NAME), "
                                          "each read as its own variant; any other engine is said as not read")
    source: str


class TargetParameterKeys(_Card):
    """A framework's keys for Hugging Face PEFT's target_parameters (verl's model.target_parameters: ParamWrappers on
    the routed experts' 3D weights), by the adapter variants whose engine passes them to PEFT: read into a LoRA job's
    lora_target_parameters (read/lora_keys.py target_parameters_read); on another variant, or beside no LoRA, only
    said."""

    keys: list[str] = Field(min_length=1, description="The file keys, as the readers normalize them")
    variants: list[str] = Field(min_length=1, description="The adapter variants whose engine reads the keys")
    source: str


class QuantizedBase(_Card):
    """A framework's switches that load the frozen base weights quantized (AutoModel's `quantization` section: a
    bitsandbytes 4-bit NF4 or 8-bit base under LoRA, QLoRA), which meshplan does not model: its estimate holds the
    base in bf16. A file that turns one on is refused an estimate (read/__init__.py request_values)."""

    keys: list[str] = Field(min_length=1, description="The switches, as the readers normalize the keys")
    what: str = Field(description="What the switch does to the job and what meshplan's estimate would hold instead")
    fix: str = Field(description="What to run or pass instead (the refusal's fix)")
    source: str


class GatedDeltaNetRead(_Card):
    """How a launch script builds Megatron-Core's GPTModel with Gated DeltaNet layers: the flag and the values that
    select them (the model_flags entry of linear_attention_freq then marks each decoder layer's mixer), read back as
    the hybrid pattern meshplan plans, two pattern layers per decoder layer."""

    variant_flag: str
    variants: list[str] = Field(min_length=1)
    pattern_launchers: list[str] = Field(
        default_factory=list, description="Launchers that build the hybrid pattern layer by layer (HybridModel): "
                                          "their stage sizes count pattern layers, not decoder layers")
    source: str


class ModelConfigBuild(_Card):
    """How a framework builds its model from a config section that states the whole architecture (KempnerForge's
    [model], its ModelConfig): the section, every field's default where the file leaves it out, the values meshplan
    builds, the FFN widths' rounding, and the section's keys that make a model meshplan cannot count
    (knowledge/section_models.py)."""

    section: str = Field(description="The file's section that holds the architecture ([model])")
    defaults: dict[str, Default] = Field(description="The framework's default of every architecture field, by its name")
    values: dict[str, BuildValue] = Field(default_factory=dict, description="Fields meshplan builds some values of")
    ffn_multiple: int = Field(ge=1, description="A computed dense FFN width rounds up to this")
    expert_ffn_multiple: int = Field(ge=1, description="An expert's width rounds to the nearest multiple of this")
    refused_sections: dict[str, str] = Field(
        default_factory=dict, description="Sections beside the model whose parts meshplan does not count, with why")
    source: str


class TokenizerVocab(_Card):
    """A tokenizer whose vocabulary a launch script's --tokenizer-type decides without its file being read: the
    rows it builds before the framework pads them (the estimates pad: memory_states.built_vocab)."""

    vocab_size: int = Field(ge=1, description="The tokenizer's vocabulary, as a checkpoint counts it")
    assumes: str | None = Field(None, description="What the script's flags cannot confirm and this size takes as so "
                                                  "(said beside the model)")
    source: str


class TrainerWorld(_Card):
    """The nodes x GPUs per node a framework's trainer runs on where a file sets neither (verl's ppo_trainer.yaml)."""

    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    keys: list[str] = Field(description="The file's keys that set them, said in the note")
    source: str


class CiRecipes(_Card):
    """Where a framework's CI states the GPUs a test config of its own runs on (Megatron-LM's functional tests: the
    config names none, the recipe its CI reads does): read only where the file sits in the framework's own tree."""

    test_cases: str = Field(description="The folder of the test configs, relative to the repository: "
                                        "<test_cases>/<model>/<test_case>/<config_name>")
    config_name: str = Field(description="The test config's file name")
    recipes: str = Field(description="The folder of the CI recipes (YAML, searched recursively)")
    default_gpus_per_node: int = Field(ge=1, description="The ranks per node the test launcher starts where the "
                                                         "recipe's script sets none")
    source: str


class CiWorld(_Card):
    """The keys of a recipe's own CI block that state the GPUs the framework's CI runs it on (NeMo AutoModel's `ci:`):
    read where the file's settings state no count, said as the CI's run, not the recipe's setting."""

    nodes_key: str
    gpus_per_node_key: str
    dynamic_key: str = Field(description="The switch that scales the node count at run time (no count read)")
    default_nodes: int = Field(ge=1, description="The nodes the CI runs on where the block gives none")
    source: str


class TypedKey(_Card):
    """A config key the framework validates by type when it loads the file (DeepSpeed's pydantic config models): the
    reader accepts what the framework accepts, coerced as it coerces, and refuses the rest naming the forms."""

    form: Literal["section", "section_or_null", "bool", "bool_or_null", "bool_or_section", "choice", "truthy"] = Field(
        description="section: a JSON object; _or_null: null too (read as absent); bool: what pydantic's bool takes "
                    "(the card's bool_words); bool_or_section: a bool (a deprecated short form) or an object; "
                    "choice: one of choices, coerced as the framework's enum coerces (2, '2', 2.0 for an int enum); "
                    "truthy: read unvalidated and tested by Python truth (DeepSpeed's get_scalar_param keys), so any "
                    "non-empty string, \"false\" too, is on")
    choices: list[StrictInt | StrictStr] = Field(default_factory=list)
    by: str = Field(description="What the framework does with the key: its model, field and what it refuses")

    @model_validator(mode="after")
    def _choices_for_choice(self) -> TypedKey:
        if (self.form == "choice") != bool(self.choices):
            raise ValueError("choices are given for form 'choice' and only for it")
        if len({type(c) for c in self.choices}) > 1:
            raise ValueError("choices are all numbers or all strings (one enum)")
        return self


class OldName(_Card):
    """A key an older release of the framework read under another name: the import reads it as that key, saying so
    (it was 'no meshplan field' and the setting dropped: torchtitan 0.1's [training] compile left torch_compile off)."""
    key: StrictStr = Field(description="The key it is read as (the current name, as the card's knobs or read keys "
                                       "write it; a current key meshplan leaves out is said as one)")
    said: StrictStr = Field(description="Which releases read it, what it did there, what later releases do with it")


class ReadSection(_Card):
    """The keys of a framework's files that are no adapter knob, and the flags that build a launch script's model."""

    launcher: list[str] = Field(default_factory=list, description="The scripts or modules a launch command runs")
    launcher_source: str | None = None
    cli: list[str] = Field(default_factory=list, description="The command-line entry points that take the config "
                                                             "file as their first positional argument, not --config")
    cli_source: str | None = None
    keys: dict[str, str] = Field(
        default_factory=dict, description="A file's key and what it sets: a request field, an adapter knob or a name "
                                          "the reader takes (nodes, dp_shard, ...)")
    absent: dict[str, StrictBool | StrictInt] = Field(
        default_factory=dict, description="Request fields a script leaving their flag out states, at this value")
    absent_why: str | None = None
    model_shape: list[str] = Field(
        default_factory=list, description=f"The flags of {', '.join(SHAPE_FIELDS)}, in that order; `a|b`: the first "
                                          "of those given")
    model_flags: dict[str, ModelField] = Field(
        default_factory=dict, description="The other flags of the model a script's model is matched by")
    model_defaults: dict[ModelField, FlagDefault] = Field(
        default_factory=dict, description="The framework's value of a model_flags field its flag is left out of")
    model_defaults_source: str | None = None
    model_build: dict[str, ModelField] = Field(
        default_factory=dict, description="The flags only the model built from the flags reads")
    model_build_defaults: dict[ModelField, Default] = Field(default_factory=dict)
    model_build_values: dict[str, BuildValue] = Field(default_factory=dict)
    model_build_position_table: Literal["by_type", "unless_no_position_embedding"] = Field(
        "by_type", description="Where the learned position table is: with --position-embedding-type learned_absolute "
                               "only (Megatron-LM), or unless --no-position-embedding (Megatron-DeepSpeed)")
    model_build_refused: dict[str, str] = Field(
        default_factory=dict, description="Flags whose model meshplan cannot count, each with what it adds")
    model_build_source: str | None = None
    tokenizer_vocab: dict[str, TokenizerVocab] = Field(
        default_factory=dict, description="--tokenizer-type values whose vocabulary is known without the tokenizer's "
                                          "file, for a script that gives no --vocab-size")
    default_tokenizer: str | None = Field(
        None, description="The --tokenizer-type the launcher takes where a script gives --vocab-file and none")
    default_tokenizer_source: str | None = None
    trainer_world: TrainerWorld | None = Field(
        None, description="The trainer's nodes x GPUs per node where a file sets neither key (the config's default)")
    ci_world: CiWorld | None = Field(
        None, description="The recipe's CI block that states its GPU count (NeMo AutoModel's ci:)")
    ci_recipes: CiRecipes | None = Field(
        None, description="The CI recipes that state a test config's GPU count (Megatron-LM's functional tests)")
    model_section: ModelConfigBuild | None = Field(
        None, description="The model built from a config section that states the architecture (KempnerForge's [model])")
    sections: list[str] = Field(
        default_factory=list, description="The top-level keys (a ds_config's) or [sections] (a TOML job file's) of "
                                          "the framework's own config file: a file holding none of them is not its "
                                          "config and is refused with the keys it holds, not read as an empty one")
    sections_source: str | None = None
    dp_through: str | None = Field(
        None, description="The key a file states its dp through beside the batch keys (a ds_config's "
                          "gradient_accumulation_steps), which a fix that drops dp removes: the framework then derives "
                          "it from the GPU count")
    dp_through_source: str | None = None
    placeholder_model: StrictStr | None = Field(
        None, description="The model path the framework's packaged config holds in place of one (verl's "
                          "~/models/deepseek-llm-7b-chat): read as no model, the user told to give it")
    placeholder_model_source: str | None = None
    typed: dict[str, TypedKey] = Field(
        default_factory=dict, description="Keys the framework validates by type at load (a ds_config's bf16, "
                                          "zero_optimization.stage ...): what it takes, the rest refused by name")
    typed_source: str | None = None
    bool_words: list[StrictStr] = Field(
        default_factory=list, description="The strings a typed bool takes (any case), said in a refusal; the "
                                          "reader validates with pydantic's own bool")
    bool_words_source: str | None = None
    recipe_names: RecipeNames | None = None
    sft_keys: dict[str, str] = Field(
        default_factory=dict, description="A second entry point's keys as the first's (SkyRL's main_sft: a key, or "
                                          "a prefix ending in '.', and the key it is read as)")
    sft_source: str | None = None
    sft: SftRead | None = Field(None, description="The SFT trainer's own files (verl's sft_trainer, fsdp_sft_trainer)")
    absent_by_variant: dict[str, dict[str, StrictBool | StrictInt | StrictStr]] = Field(
        default_factory=dict, description="Per adapter variant: request fields a file leaving their keys out "
                                          "states, at the framework's default (a recompute field other than recompute "
                                          "itself only where the recompute is then full)")
    absent_by_variant_source: str | None = None
    gated_delta_net: GatedDeltaNetRead | None = Field(
        None, description="The flag that builds GPTModel's Gated DeltaNet layers (Megatron-LM's pretrain_gpt.py)")
    said: dict[str, str] = Field(
        default_factory=dict, description="A file's key that sets no meshplan field, and what it does (or does not do) "
                                          "to the job meshplan plans: an import says that, not 'no meshplan field'")
    said_source: str | None = None
    old_names: dict[str, OldName] = Field(
        default_factory=dict, description="A key an older release read, by the key it is read as")
    old_names_source: str | None = None
    lora_target_parameters: TargetParameterKeys | None = None
    quantized_base: QuantizedBase | None = None
    estimator_default: StrictStr | None = Field(
        None, description="The advantage estimator an RL launcher leaving it out runs (gae: PPO with a critic)")
    kl_loss_default: StrictBool | None = Field(
        None, description="An RL launcher's KL-loss switch left out (the reference model is loaded for a KL term)")
    kl_source: str | None = None
    entropy_coef_default: float | None = Field(
        None, ge=0, description="The entropy loss' coefficient an RL launcher that turns the entropy loss on "
                                "(use_entropy_loss) but leaves the coefficient out runs (SkyRL's entropy_loss_coef)")
    source: str

    @model_validator(mode="after")
    def _entries_agree(self) -> ReadSection:
        if self.model_shape and len(self.model_shape) != len(SHAPE_FIELDS):
            raise ValueError(f"model_shape names {len(self.model_shape)} flags; it names those of "
                             f"{', '.join(SHAPE_FIELDS)}, in that order")
        if unknown := set(self.absent).union(*self.absent_by_variant.values()) - set(Request.model_fields):
            raise ValueError(f"absent names {sorted(unknown)}, which are no request fields")
        if unset := set(self.model_defaults) - set(self.model_flags.values()):
            raise ValueError(f"model_defaults names {sorted(unset)}, which no model_flags entry sets")
        if unbuilt := set(self.model_build_values) - set(self.model_build):
            raise ValueError(f"model_build_values names {sorted(unbuilt)}, which are no model_build flags")
        if both := set(self.model_build_refused) & {*self.model_flags, *self.model_build}:
            raise ValueError(f"model_build_refused names {sorted(both)}, which the model is built with")
        return self


class RegistryEntry(_Card):
    """A catalog model in a framework's own model registry (torchtitan's --module and --config), which a file names
    the model by and a rendered command line names it with."""

    module: str
    config: str


class TomlModel(_Card):
    """A catalog model as a torchtitan 0.1.x / 0.2.x TOML job file names it: [model] name (the train spec) and flavor
    (a key of the model's args table), for a model the 0.3 registry no longer has."""

    name: str
    flavor: str


NO_READ = ReadSection(source="the card has no read section: meshplan reads none of the framework's files")
