"""What `meshplan import` reads from a user's own configuration file: the request it states, field by field."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from meshplan.schema.choices import Framework, StrictModel


class LeftToRequest(StrictModel):
    """An unresolved line that request fields given beside the file settle (a model or GPU count the file does not
    state), with those fields: what check --config drops when they are given, and what an estimate refuses without."""

    fields: list[str] = Field(description="The request fields that settle it (model, num_gpus, gpu ...)")
    said: str = Field(description="The line, as ImportedConfig.unresolved says it")


class StatedKey(StrictModel):
    """A key the file states, as it writes it, with its value and line."""

    key: str = Field(description="The key as the file writes it")
    value: Any = Field(description="Its value as read (True for a flag given alone)")
    line: int = Field(description="The file's line that states it")


class ImportedConfig(StrictModel):
    """A framework config or launch script read into request fields, each with the file's line and key."""

    framework: Framework = Field(description="The framework the file is for (detected, or as given)")
    variant: str | None = Field(None, description="The form of the file (verl: megatron|fsdp; skyrl: rl|sft|fsdp ...)")
    path: str = Field(description="The file read (or '<config_text>' for pasted text)")
    request: dict[str, Any] = Field(description="The request fields the file states (same names as everywhere)")
    sources: dict[str, str] = Field(description="field -> 'file:line key' that states it")
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="Fields the file leaves to the framework's default, and that default")
    unsupported: list[str] = Field(default_factory=list,
                                   description="Settings the file makes that meshplan cannot express")
    misspelt: list[str] = Field(default_factory=list,
                                description="Of the unsupported settings, the keys one slip from a key meshplan reads "
                                            "(with the key meant): the estimates from the file warn of them")
    unresolved: list[str] = Field(default_factory=list,
                                  description="What could not be read: unset variables, unevaluated branches, a "
                                              "missing model or GPU count (pass them as fields)")
    left_to_request: list[LeftToRequest] = Field(
        default_factory=list, description="Of the unresolved lines, those request fields given beside the file settle, "
                                          "with their fields")
    notes: list[str] = Field(default_factory=list, description="How composed values were derived")
    assumed: list[str] = Field(
        default_factory=list, description="Values meshplan runs at that the file implies but cannot settle (a "
                                          "ds_config's recompute: the model code turns checkpointing on), each with "
                                          "why and the flag that changes it")
    config_format: str | None = Field(None, description="The file's format as read: shell, toml or json")
    config_variable: str | None = Field(
        None, description="The name a Python script holds the framework's config in where it is not the one meshplan "
                          "renders (Bridge's quickstart: `config = llama32_1b_pretrain_config()`, not cfg): its "
                          "fixes set the fields on it")
    batch_per_dp: int | None = Field(
        None, description="Where the file's global batch is this many sequences per data-parallel rank and dp is the "
                          "GPUs left over (torchtitan: global_batch_size -1 = local_batch_size x dp): the global batch "
                          "once the GPU count is given")
    stage_sizes_in_decoder_layers: bool = Field(
        False, description="Where the file's first/last stage sizes count a Megatron-Core GPTModel's TransformerLayers "
                           "and its model was not known when read: a Gated DeltaNet hybrid's are decoder layers, "
                           "two pattern layers each, doubled once the model is given")
    beside_stated: dict[str, StatedKey] = Field(
        default_factory=dict, description="The keys a fix writes beside a field's own key (the framework card's "
                                          "AdapterKnob.beside: Megatron-Bridge's ddp.use_megatron_fsdp and "
                                          "checkpoint.ckpt_format beside the sharding strategy) that the file states, "
                                          "by the card's key: a fix writes one only where the file lacks the value it "
                                          "needs, and changes the file's own line where it states another")
    builds_hybrid_model: bool = Field(
        False, description="Where the file's launcher builds Megatron-Core's HybridModel from --hybrid-layer-pattern "
                           "(pretrain_mamba.py: the card's read.gated_delta_net.pattern_launchers), which cuts a Gated "
                           "DeltaNet hybrid's pattern into stages by layer count: no virtual stages, layout or "
                           "embedding / loss accounting without '|' separators (select_pipeline_segment)")


class FileChange(StrictModel):
    """One request field's new value, written in the user's file's own syntax and key."""

    field: str = Field(description="The request field the fix changes")
    value: Any = Field(description="Its new value")
    key: str | None = Field(description="The file's key for it (the one the file used, else the framework card's)")
    line: int | None = Field(None, description="The file's line that states it now (None: the file leaves it out)")
    text: str = Field(description="What to paste: an override line, a flag, a TOML section line or a JSON fragment")


class ConfigFix(StrictModel):
    """A finding's fix as edits of the checked file: each option is one way out, all its changes together."""

    finding: str = Field(description="The finding's rule id")
    fix: str = Field(description="The finding's fix, as check words it")
    options: list[list[FileChange]] = Field(description="The fix's alternatives, each as the file's own lines")
