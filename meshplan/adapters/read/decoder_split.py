"""A Gated DeltaNet hybrid's pipeline split as a Megatron-Core GPTModel file writes it (Megatron-LM's pretrain_gpt.py,
Megatron-Bridge's recipes): first and last stage sizes in decoder layers, one TransformerLayer each, read into
meshplan's pattern layers, two per decoder layer (the inverse of render's decoder_split). A HybridModel launcher
(pretrain_mamba.py, the card's read.gated_delta_net.pattern_launchers) counts pattern layers itself."""

from __future__ import annotations

from typing import Any

from meshplan.adapters.read.keys import Reading, read_section
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.gdn_config import PATTERN_LAYERS_PER_DECODER_LAYER

# what a GPTModel file counts in decoder layers: its stage sizes, and the layers its full recompute takes
# (recompute_num_layers, render's decoder_recompute)
STAGE_SIZES = ("first_stage_layers", "last_stage_layers", "recompute_layers")


def counts_decoder_layers(reading: Reading) -> bool:
    """Whether the file's stage sizes count GPTModel TransformerLayers: its framework builds Gated DeltaNet layers
    in a GPTModel (the card's read.gated_delta_net) and its launcher is none of that entry's pattern_launchers."""
    facts = read_section(reading.framework).gated_delta_net
    if facts is None:
        return False
    launcher = reading.launch_line.rsplit(" ", 1)[-1].rsplit("/", 1)[-1] if reading.launch_line else None
    return launcher not in facts.pattern_launchers


def in_pattern_layers(values: dict[str, Any], names: list[str], model: Any) -> list[str]:
    """Doubles the stage sizes `names` of `values` where `model` is a Gated DeltaNet hybrid (a decoder layer is two
    pattern layers); the names doubled. A model that does not resolve is left to the request's own refusal."""
    try:
        gdn = resolve_model(str(model)).gdn is not None
    except MeshplanError:
        return []
    done = [n for n in names if gdn and isinstance(values.get(n), int) and not isinstance(values[n], bool)
            and not (n == "recompute_layers" and values[n] == 1 and values.get("recompute_method") == "uniform")]
    # (uniform over one layer a chunk is Megatron's every-layer default, render's for recompute_layers left out)
    for n in done:
        values[n] *= PATTERN_LAYERS_PER_DECODER_LAYER
    return done


def read_decoder_split(reading: Reading) -> bool:
    """The file's stage sizes in pattern layers where its model is known (each source says so); True where they
    count decoder layers and the model is not known yet, for request_values to double once it is given."""
    if not counts_decoder_layers(reading):
        return False
    if "model" not in reading.request:
        return any(n in reading.request for n in STAGE_SIZES)
    for n in in_pattern_layers(reading.request, list(STAGE_SIZES), reading.request["model"]):
        reading.sources[n] += (f" ({reading.request[n] // PATTERN_LAYERS_PER_DECODER_LAYER} decoder layers: "
                               f"{reading.request[n]} layers of meshplan's pattern)")
    return False
