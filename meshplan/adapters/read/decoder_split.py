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
from meshplan.rules.pipeline import hybrid_model_split_problem
from meshplan.schema.imported import ImportedConfig
from meshplan.schema.plan import Plan

# what a GPTModel file counts in decoder layers: its stage sizes, and the layers its full recompute takes
# (recompute_num_layers, render's decoder_recompute)
STAGE_SIZES = ("first_stage_layers", "last_stage_layers", "recompute_layers")


def counts_decoder_layers(reading: Reading) -> bool:
    """Whether the file's stage sizes count GPTModel TransformerLayers: its framework builds Gated DeltaNet layers
    in a GPTModel (the card's read.gated_delta_net) and its launcher is none of that entry's pattern_launchers."""
    facts = read_section(reading.framework).gated_delta_net
    return facts is not None and _launcher(reading) not in facts.pattern_launchers


def builds_hybrid_model(reading: Reading) -> bool:
    """Whether the file's launcher is one of the card's read.gated_delta_net.pattern_launchers (pretrain_mamba.py),
    which builds Megatron-Core's HybridModel from the pattern, layer by layer."""
    facts = read_section(reading.framework).gated_delta_net
    return facts is not None and _launcher(reading) in facts.pattern_launchers


def hybrid_model_assumed(reading: Reading) -> bool:
    """builds_hybrid_model, with what meshplan assumes of such a script of a Gated DeltaNet hybrid said in
    `reading.assumed` (check's config_assumed): it plans the GPTModel pretrain_gpt.py builds of the same layers, whose
    stages and full-recompute checkpoints are whole decoder layers, where HybridModel's are pattern layers."""
    if not builds_hybrid_model(reading):
        return False
    try:
        gdn = "model" in reading.request and resolve_model(str(reading.request["model"])).gdn is not None
    except MeshplanError:
        gdn = False
    if gdn:
        reading.assumed.append(
            f"{reading.launch_line}: HybridModel builds the model layer by layer of --hybrid-layer-pattern; meshplan "
            "plans the GPTModel pretrain_gpt.py --experimental-attention-variant gated_delta_net builds of the same "
            "layers, whose pipeline stages and full-recompute checkpoints are whole decoder layers (two pattern "
            "layers): a stage of an odd number of pattern layers, which HybridModel takes, is refused (PP017), and "
            "full recompute is estimated keeping each decoder layer's input, where HybridModel keeps each pattern "
            "layer's. Launch pretrain_gpt.py for the plan as estimated (`meshplan render megatron-core` writes it)")
    return True


def _launcher(reading: Reading) -> str | None:
    """The file name of the script the launch line runs."""
    return reading.launch_line.rsplit(" ", 1)[-1].rsplit("/", 1)[-1] if reading.launch_line else None


def refuse_hybrid_model_split(imported: ImportedConfig, values: dict[str, Any]) -> None:
    """A Gated DeltaNet hybrid's pretrain_mamba.py script whose split HybridModel refuses: its
    select_pipeline_segment takes no virtual stages without '|' separators in --hybrid-layer-pattern (ValueError; a
    pattern with them is not read as a catalog model), and the transformer block's pipeline_model_parallel_layout and
    account_for_embedding / account_for_loss_in_pipeline_split do not reach its split (rule PP016's test,
    rules/pipeline.hybrid_model_split_problem). meshplan plans the model as the GPTModel pretrain_gpt.py builds, which
    interleaves, so without this the script passed check."""
    if not imported.builds_hybrid_model or "model" not in values:
        return
    try:
        gdn = resolve_model(str(values["model"])).gdn is not None
    except MeshplanError:
        return  # the request's own refusal says why
    fields = {k: values[k] for k in ("vpp", "pipeline_layout", "account_for_embedding", "account_for_loss")
              if values.get(k) is not None}
    problem = hybrid_model_split_problem(Plan(**fields)) if gdn else None
    if problem:
        raise MeshplanError(
            f"{imported.path}: {problem['reason']}: pretrain_mamba.py builds the model as Megatron-Core's HybridModel "
            "from --hybrid-layer-pattern, which cuts its pipeline stages by layer count without '|' separators "
            "(select_pipeline_segment refuses virtual pipeline stages there, and a pipeline layout or embedding / loss "
            "accounting does not reach its split).",
            fix=f"{problem['fix']} Or launch pretrain_gpt.py with --experimental-attention-variant gated_delta_net "
                "(`meshplan render megatron-core` writes it), whose GPTModel interleaves whole decoder layers.")


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
