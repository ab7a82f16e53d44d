"""A model known only by its size ('70B'): the Llama-3-shaped dense model of about that many parameters (the shaping
rules and their reasons: cards/model_shapes.yaml generic)."""

from __future__ import annotations

import math
import re
from functools import cache

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.model_config import shapes_card
from meshplan.knowledge.model_counts import layer_params, total_params
from meshplan.schema.model import Architecture

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbt]?)\s*(?:params?)?\s*$", re.IGNORECASE | re.ASCII)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> float | None:
    """'70B', '7e9', '1.5T', '350M' -> parameter count; None when the text is not a size."""
    match = _SIZE_RE.match(text)
    if not match:
        return None
    value = float(match.group(1)) * _SCALE[match.group(2).lower()]
    return value


def _generic_shape(hidden: int, layers: int, label: str) -> Architecture:
    """The Llama-3-shaped dense model of this width and depth (numbers and their reasons: cards/model_shapes.yaml)."""
    g = shapes_card().generic
    heads = hidden // g.head_dim
    return Architecture(
        name=f"generic dense {label} (llama-shaped)",
        model_type="llama",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=round(hidden * g.ffn_ratio / g.ffn_multiple) * g.ffn_multiple,
        num_attention_heads=heads,
        num_kv_heads=min(g.kv_heads, heads),
        head_dim=g.head_dim,
        vocab_size=g.vocab_size,
        max_position_embeddings=g.max_position_embeddings,
        generic=True,
        origin=f"generic size {label}",
    )


@cache
def _generic_widths() -> list[tuple[int, int, int]]:
    """(hidden, params of one layer, params outside the layers) for every width a generic model may take:
    whole groups of `heads_multiple` heads of `head_dim`, up to the hidden_size bound."""
    g, bounds = shapes_card().generic, shapes_card().bounds
    step = g.head_dim * g.heads_multiple
    out = []
    for hidden in range(step, bounds["hidden_size"].max + 1, step):
        one = _generic_shape(hidden, 1, "")
        per_layer = sum(layer_params(one, 0).values())
        out.append((hidden, per_layer, total_params(one) - per_layer))
    return out


def _size_text(size: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if size >= scale:
            return f"{size / scale:.3g}{unit}"
    return f"{size:.3g}"


def generic_architecture(size: float, label: str) -> Architecture:
    """A Llama-3-shaped dense model of about `size` parameters: heads in groups of 8 (TP 1/2/4/8 valid), 8 KV
    heads, and the width/depth ratio nearest Llama 3's among the shapes within the size tolerance."""
    g, max_layers = shapes_card().generic, shapes_card().bounds["num_hidden_layers"].max
    widths = _generic_widths()
    smallest = widths[0][1] * g.min_layers + widths[0][2]
    largest = widths[-1][1] * max_layers + widths[-1][2]
    if not (math.isfinite(size) and smallest * (1 - g.size_tolerance) <= size <= largest * (1 + g.size_tolerance)):
        raise MeshplanError(
            f"A generic model of {label} parameters is outside the range meshplan can shape: "
            f"{_size_text(smallest)} to {_size_text(largest)} (a Llama-3-shaped model with {g.heads_multiple} "
            f"heads of {g.head_dim} and vocab {g.vocab_size:,} at its smallest, the hidden-size and layer bounds "
            "at its largest).",
            fix="Give a size such as '7B', '70B' or '1.5T', a catalog model, or a config.json.",
        )
    best: tuple[float, int, int] | None = None
    for hidden, per_layer, fixed in widths:
        fewest = max(g.min_layers, math.ceil((size * (1 - g.size_tolerance) - fixed) / per_layer))
        most = min(max_layers, math.floor((size * (1 + g.size_tolerance) - fixed) / per_layer))
        if fewest > most:
            continue
        # Within the tolerance, the depth with the most factors of two (70B: 80 layers, as Llama 3 70B), so
        # pipeline stages of 2, 4 and 8 split it evenly; then the one nearest the size.
        layers = max(range(fewest, most + 1),
                     key=lambda n: ((n & -n).bit_length(), -abs(fixed + n * per_layer - size)))
        score = abs(math.log(hidden / layers / g.hidden_per_layer))
        if best is None or score < best[0]:
            best = (score, hidden, layers)
    if best is None:
        raise MeshplanError(
            f"No Llama-3-shaped dense model comes within {g.size_tolerance:.0%} of {label} parameters.",
            fix="Give a slightly different size, a catalog model, or a config.json.",
        )
    return _generic_shape(best[1], best[2], label)

