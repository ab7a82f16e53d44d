"""NeMo AutoModel builds a checkpoint's own MTP blocks only where its model code for that model type does
(cards/frameworks/nemo-automodel.yaml engine.builds_model_mtp_types): Nemotron-H's, not DeepSeek-V3's."""

from __future__ import annotations

from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.mtp_depth import default_mtp_depth
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def test_automodel_builds_mtp_by_model_type():
    card = framework_card("nemo-automodel")
    dsv3, super_ = resolve_model("deepseek-v3"), resolve_model("nemotron-3-super-120b-a12b")
    assert dsv3.num_mtp_layers == 1 and super_.num_mtp_layers == 1
    assert default_mtp_depth(dsv3, card, 3) == 0  # components/models/deepseek_v3/model.py: no MTP block
    assert default_mtp_depth(super_, card, 3) == 1  # nemotron_v3/mtp.py reads num_nextn_predict_layers
    # Megatron-Core builds every model's own blocks: no model-type list on its card
    assert framework_card("megatron-core").engine.builds_model_mtp_types is None
    assert default_mtp_depth(dsv3, framework_card("megatron-core"), 1) == 1


def test_job_trains_no_dsv3_mtp_unless_asked():
    base = dict(model="deepseek-v3", gpu="h100", num_gpus=256, pp=4, ep=64, framework="nemo-automodel")
    job = resolve(Request(**base))[0]
    assert job.model.num_mtp_layers == 0
    assert any("mtp_num_layers not given: 0" in note for note in job.notes)
    assert resolve(Request(**base | {"framework": "megatron-core"}))[0].model.num_mtp_layers == 1
