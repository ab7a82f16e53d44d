"""A multimodal config.json's vision tower read into `VisionTower`: Llama 4's vision_config (transformers'
Llama4VisionConfig), each field within its bound, so a bad value is refused with the field and the allowed range.
Apart from model_config.py, which reads the text model and hands this module its field reader."""

from __future__ import annotations

from typing import Any

from meshplan.schema.model import VisionTower

# Llama4VisionConfig's defaults (transformers 5.9.0 models/llama4/configuration_llama4.py) for the fields a
# config.json may leave out; the rest are required
_DEFAULTS = {"num_channels": 3}


def llama4_vision_tower(config: dict[str, Any], fields: Any) -> VisionTower | None:
    """The vision tower of a Llama 4 config (model_type llama4 with a vision_config), else None. `fields` builds the
    reader of one mapping (model_config._Fields: (mapping, where) -> reader with .int and .fail)."""
    if config.get("model_type") != "llama4" or config.get("vision_config") is None:
        return None
    vision = config["vision_config"]
    f = fields(vision if isinstance(vision, dict) else {}, "vision_config")
    if not isinstance(vision, dict):
        raise f.fail(f"vision_config must be a mapping of the vision tower's fields, got {type(vision).__name__}.")
    hidden = f.int("hidden_size")
    heads = f.int("num_attention_heads", lo=1, hi=hidden, why="at most one head per hidden channel")
    image = f.int("image_size", lo=1, hi=1 << 16)
    return VisionTower(
        hidden_size=hidden,
        num_layers=f.int("num_hidden_layers"),
        num_heads=heads,
        intermediate_size=f.int("intermediate_size"),
        image_size=image,
        patch_size=f.int("patch_size", lo=1, hi=image, why="a patch fits in the image"),
        num_channels=f.int("num_channels", lo=1, hi=64, default=_DEFAULTS["num_channels"]),
        projector_input_dim=f.int("projector_input_dim", "hidden_size"),
        projector_output_dim=f.int("projector_output_dim", "hidden_size"),
        vision_output_dim=f.int("vision_output_dim", "hidden_size"),
    )
