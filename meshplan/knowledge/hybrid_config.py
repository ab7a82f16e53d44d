"""A hybrid Mamba-2 model's config.json (model_type nemotron_h: NVIDIA Nemotron-H, Nemotron Nano 2, Nemotron 3) read
as transformers' NemotronHConfig and NemotronHForCausalLM build it: which kind each layer is, the Mamba-2 mixer's
shapes and the MoE blocks' experts. Kept apart from model_config.py, which hands it its field reader.

Each layer of such a model is one RMSNorm and one mixer (NemotronHBlock): a Mamba-2 mixer (M), attention without
rotary embedding (*), a squared-ReLU MLP (-) or a mixture of non-gated experts with a shared expert (E), whose
routed experts Nemotron 3 Super runs at a latent width (moe_latent_size: LatentMoE); Nemotron 3 Super adds one
multi-token-prediction block of such layers (num_nextn_predict_layers, mtp_hybrid_override_pattern).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.knowledge.families_card import unknown_activation
from meshplan.schema.model import LAYER_KINDS, Architecture, MambaSpec, MoESpec

# NemotronHConfig._pattern_to_list and its layers_block_type names (the legacy "mamba" and "attention" included)
PATTERN_KINDS = {k: name for k, name in LAYER_KINDS.items() if k != "G"}  # nemotron_h's: no Gated DeltaNet
_BLOCK_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                "moe": "E"}
# NemotronHConfig's defaults for the keys a config.json may omit
_DEFAULTS = {"ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4,
             "chunk_size": 128, "head_dim": 128, "mlp_hidden_act": "relu2"}
# Their older names, which NemotronHConfig.__post_init__ reads the same
_LEGACY = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_chunk_size": "chunk_size",
           "mamba_conv_bias": "use_conv_bias"}


def _written_pattern(f: Any, pattern_key: str, list_key: str) -> Any:
    """The pattern under `pattern_key`, or the block-type list under `list_key` written as one (NemotronHConfig keeps
    either); None when neither is given. Checking the pattern's characters is the caller's."""
    pattern = f.cfg.get(pattern_key)
    if pattern is None and isinstance(f.cfg.get(list_key), list):
        kinds = f.cfg[list_key]
        if not all(isinstance(k, str) and k in _BLOCK_TYPES for k in kinds):
            raise f.fail(f"{list_key} may hold only {', '.join(sorted(_BLOCK_TYPES))}.")
        pattern = "".join(_BLOCK_TYPES[k] for k in kinds)
    return pattern


def layer_pattern(f: Any) -> str:
    """hybrid_override_pattern, or layers_block_type written as one (NemotronHConfig keeps the list and derives the
    pattern); every character one of M, *, - or E."""
    pattern = _written_pattern(f, "hybrid_override_pattern", "layers_block_type")
    if not isinstance(pattern, str) or not pattern:
        raise f.fail("a nemotron_h config.json must give hybrid_override_pattern (or layers_block_type): which "
                     "layer is Mamba-2 (M), attention (*), MLP (-) or MoE (E).")
    wrong = sorted(set(pattern) - set(PATTERN_KINDS))
    if wrong:
        raise f.fail(f"hybrid_override_pattern holds {', '.join(map(repr, wrong))}: allowed M (Mamba-2), "
                     "* (attention), - (MLP) and E (MoE).")
    return pattern


def read_hybrid_names(cfg: dict[str, Any], f: Any) -> None:
    """NemotronHConfig's defaults and older names copied under the names the reader asks for; the layer count is
    the pattern's length (NemotronHConfig derives it so), and a num_hidden_layers that disagrees is refused."""
    for old, new in _LEGACY.items():
        if cfg.get(new) is None and cfg.get(old) is not None:
            cfg[new] = cfg[old]
    if cfg.get("head_dim") is None and cfg.get("attention_head_dim") is not None:
        cfg["head_dim"] = cfg["attention_head_dim"]  # Nemotron-H's first config.json files name it so
    for key, value in _DEFAULTS.items():
        cfg.setdefault(key, value)
    pattern = layer_pattern(f)
    stated = cfg.get("num_hidden_layers")
    if stated is not None and stated != len(pattern):
        raise f.fail(f"num_hidden_layers = {stated} but hybrid_override_pattern has {len(pattern)} layers.",
                     fix="Pass the config.json as published: its pattern has one character per layer.")
    cfg["num_hidden_layers"] = len(pattern)


def mtp_pattern(f: Any, pattern: str) -> tuple[int, str | None]:
    """(MTP blocks, one block's layers) from num_nextn_predict_layers and mtp_hybrid_override_pattern (or
    mtp_layers_block_type written as one), as NemotronHConfig reads them and Megatron-Bridge's NemotronHBridge hands
    them to Megatron-Core (mtp_num_layers, mtp_hybrid_override_pattern): Nemotron 3 Super's one block of '*E'. Each
    layer of the block must be a kind the main pattern holds (its shapes are that kind's)."""
    blocks = f.int("num_nextn_predict_layers", default=0) or 0
    if not blocks:
        return 0, None
    block = _written_pattern(f, "mtp_hybrid_override_pattern", "mtp_layers_block_type")
    if not isinstance(block, str) or not block:
        raise f.fail(f"num_nextn_predict_layers = {blocks} needs mtp_hybrid_override_pattern (or "
                     "mtp_layers_block_type): the layers of each multi-token-prediction block.",
                     fix="Pass the config.json as published (Nemotron 3 Super's is '*E').")
    missing = sorted(set(block) - set(pattern))
    if missing:
        raise f.fail(f"mtp_hybrid_override_pattern {block!r} holds {', '.join(map(repr, missing))}, a layer kind "
                     "hybrid_override_pattern does not: allowed the main pattern's kinds "
                     f"{', '.join(map(repr, sorted(set(pattern))))}.")
    return blocks, block


def mamba_spec(f: Any) -> MambaSpec:
    """The Mamba-2 mixer (NemotronHMamba2Mixer): heads x head_dim inner channels, n_groups groups of B and C, which
    must divide the heads (Megatron-Core's MambaMixer asserts it)."""
    heads = f.int("mamba_num_heads", "num_attention_heads")
    groups = f.int("n_groups", "num_key_value_heads", lo=1, hi=heads, why=f"at most mamba_num_heads = {heads}")
    if heads % groups:
        raise f.fail(f"n_groups = {groups} does not divide mamba_num_heads = {heads}.",
                     fix="Use an n_groups that divides mamba_num_heads.")
    return MambaSpec(num_heads=heads, head_dim=f.int("mamba_head_dim", "head_dim"),
                     state_size=f.int("ssm_state_size", "head_dim"), n_groups=groups,
                     conv_kernel=f.int("conv_kernel", lo=1, hi=64, why="a causal conv1d a few tokens wide"),
                     chunk_size=f.int("chunk_size", "head_dim"), conv_bias=f.flag("use_conv_bias", True),
                     proj_bias=f.flag("use_bias", False))


def hybrid_moe(f: Any, pattern: str, groups: Callable[..., dict[str, int]]) -> MoESpec | None:
    """NemotronHMoE on the E layers: n_routed_experts non-gated experts, one shared expert of
    moe_shared_expert_intermediate_size (one NemotronHMLP, whatever n_shared_experts says), a sigmoid router with
    e_score_correction_bias; group-limited routing read by model_config's `groups`."""
    layers = [i for i, kind in enumerate(pattern) if kind == "E"]
    if not layers:
        return None
    experts = f.int("n_routed_experts", "num_experts")
    top_k = f.int("num_experts_per_tok", lo=1, hi=experts,
                  why=f"a token cannot use more than the n_routed_experts = {experts} experts there are")
    shared = f.int("moe_shared_expert_intermediate_size", "intermediate_size", default=7688)
    hidden = f.int("hidden_size")
    latent = f.int("moe_latent_size", "hidden_size", default=None, hi=hidden,
                   why=f"a latent projection narrows the hidden size = {hidden}")
    return MoESpec(num_experts=experts, top_k=top_k,
                   expert_ffn_hidden_size=f.int("moe_intermediate_size", "intermediate_size", default=7688),
                   num_shared_experts=1, shared_expert_ffn_hidden_size=shared, moe_layers=layers,
                   score_correction_bias=True, latent_size=latent or None, **groups(f, experts, top_k, None))


def hybrid_architecture(arch: Architecture, f: Any, groups: Callable[..., dict[str, int]]) -> Architecture:
    """The architecture model_config read with the hybrid's own parts: the pattern, the Mamba-2 mixer, the MoE, one
    norm per layer, a squared-ReLU (non-gated) MLP and no rotary embedding (NemotronHAttention applies none)."""
    pattern = layer_pattern(f)
    mtp_blocks, mtp_layers = mtp_pattern(f, pattern)
    act = f.text("mlp_hidden_act") or _DEFAULTS["mlp_hidden_act"]  # NemotronHMLP: ACT2FN[config.mlp_hidden_act]
    if (error := unknown_activation("mlp_hidden_act", act, f.where)) is not None:
        raise error
    return arch.model_copy(update={
        "layer_pattern": pattern, "mamba": mamba_spec(f) if "M" in pattern else None,
        "moe": hybrid_moe(f, pattern, groups), "norms_per_layer": 1, "gated_mlp": False,
        "activation": act, "rope": None, "num_mtp_layers": mtp_blocks,
        "mtp_layer_pattern": mtp_layers})
