"""cards/model_families.yaml's record: the model family names published runs write, the model_type each is built
as, the config.json defaults families leave out, and the activations transformers knows. Its own module so the
config.json reader (model_config) reads the activations without importing the catalog that imports it."""

from __future__ import annotations

from pydantic import Field, model_validator

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import _Card, load_card


class FamilyType(_Card):
    """The Hugging Face model_type a model family is built as; `leaves_out`: what a nearest model_type misses."""

    model_type: str
    leaves_out: str | None = None


class ModelFamiliesCard(_Card):
    description: str
    families: dict[str, FamilyType]
    nearest: dict[str, FamilyType]
    config_defaults: dict[str, dict[str, str | int | float | bool]]
    activations: list[str] = Field(description="The activation names transformers' ACT2FN knows (a config.json's "
                                               "hidden_act): any other is refused when the file is read")
    activations_source: str

    @model_validator(mode="after")
    def _exact_or_nearest(self) -> ModelFamiliesCard:
        """A nearest model_type says what it leaves out; an exact one leaves nothing out; no family is both."""
        both = sorted(set(self.families) & set(self.nearest))
        vague = sorted(k for k, v in self.nearest.items() if not v.leaves_out)
        inexact = sorted(k for k, v in self.families.items() if v.leaves_out)
        if both or vague or inexact:
            raise ValueError(f"families both exact and nearest {both}; nearest without leaves_out {vague}; exact "
                             f"with leaves_out {inexact}")
        return self


def families_card() -> ModelFamiliesCard:
    """cards/model_families.yaml: model family names -> the model_type meshplan builds each as."""
    return load_card("model_families", ModelFamiliesCard)


def unknown_activation(key: str, act: str, where: str) -> MeshplanError | None:
    """The refusal of a config.json's activation `act` at `key` that transformers' ACT2FN does not know (the card's
    activations), None where it knows it: transformers raises KeyError building the MLP, where meshplan read it
    silently. `where`: the file, as the reader names it."""
    card = families_card()
    if act in card.activations:
        return None
    return MeshplanError(f"{where}: {key} {act!r} is no activation transformers knows: its MLP is built with "
                         f"ACT2FN[{key}], which takes {', '.join(card.activations)} ({card.activations_source}).",
                         fix=f"Set {key} to the model's activation, one of those (silu for a SwiGLU model).")
