"""The framework card's registered mixed-precision presets (cards/frameworks/*.yaml `mixed_precision_presets`: what
a recipe can name as mixed_precision=<preset>, Megatron-Bridge's training/mixed_precision.py). Apart from cards.py,
which holds the card."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, model_validator

from meshplan.schema.choices import Fp8Recipe

PresetRecipe = Literal["bf16", Fp8Recipe]


class MixedPrecisionPreset(BaseModel):
    """One registered preset: the FP8 recipe it trains with (bf16: none) and whether it keeps FP8 primary weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: PresetRecipe
    fp8_param_gather: bool
    name: str


class MixedPrecisionPresets(BaseModel):
    """The presets in the card's order. The card writes each as `<recipe>/<fp8_param_gather>: <preset name>`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    presets: tuple[MixedPrecisionPreset, ...]

    @model_validator(mode="before")
    @classmethod
    def _from_card_mapping(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "presets" in data:
            return data
        presets = []
        for key, name in data.items():
            recipe, sep, gather = str(key).partition("/")
            if not sep or gather not in ("true", "false"):
                raise ValueError(f"preset key {key!r} is not '<recipe>/<true|false>' (recipes: "
                                 f"{', '.join(get_args(Fp8Recipe))} or bf16)")
            presets.append({"recipe": recipe, "fp8_param_gather": gather == "true", "name": name})
        return {"presets": presets}

    def of_recipe(self, recipe: str, fp8_param_gather: bool | None = None) -> list[MixedPrecisionPreset]:
        """The presets of an FP8 recipe (bf16: none), those with that fp8_param_gather where it is given."""
        return [p for p in self.presets if p.recipe == recipe
                and (fp8_param_gather is None or p.fp8_param_gather == fp8_param_gather)]

    def keeps_fp8_params(self, recipe: str) -> bool:
        """Whether the recipe's preset keeps FP8 primary weights (a preset of it with fp8_param_gather)."""
        return bool(self.of_recipe(recipe, True))

    def named(self, name: str) -> MixedPrecisionPreset | None:
        return next((p for p in self.presets if p.name == name), None)
