"""NeMo AutoModel's MoE under the DeepEP (flex) dispatcher, as its GroupedExpertsDeepEP keeps it (cards/memory.yaml
fsdp2_automodel moe_activations_flex, activations.AUTOMODEL_DEEPEP_MOE), and the gradient sync of its published MoE
runs from before its outer model was an FSDP unit (the card's release_changes moe_outer_model_sharded): the counts
behind its gpt-oss-120B / 64 H100 row (bench/data/nemo_automodel, automodel_gptoss_120b_64)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.arithmetic.activations import (
    AUTOMODEL_DEEPEP_MOE,
    GENERIC_MOE,
    MEGATRON_CORE_MOE,
    Layout,
    layer_activations,
    least_moe_bytes,
    moe_bytes,
    shape_of,
)
from meshplan.arithmetic.memory_states import convention
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.releases import predates
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

T = 8192  # tokens of one micro-batch: mbs 2 x 4096, the row's


def _conv(framework: str = "nemo-automodel"):
    return convention(framework_card(framework), 3)[1]


def _layout(moe, **kw) -> Layout:
    """TP1 EP16, flash attention, bf16, the fsdp2 preset's unfused dense SwiGLU (AutoModel's own MLP class)."""
    base = {"tokens": T, "seq_kv": 4096, "tp": 1, "sp": False, "etp": 1, "flash": True, "dropout": False,
            "swiglu_unfused": True, "fp8": False, "ep": 16, "moe": moe}
    return Layout(**(base | kw))


def test_the_flex_dispatcher_picks_the_engines_own_count():
    """AutoModel's convention keeps the generic count for its torch dispatcher and its DeepEP path's under flex; a
    convention without a flex count of its own (Megatron's) keeps its one count under flex."""
    gpt = resolve_model("gpt-oss-120b")
    conv = _conv()
    assert moe_bytes(conv, gpt, "flex") == AUTOMODEL_DEEPEP_MOE
    assert moe_bytes(conv, gpt, "alltoall") == moe_bytes(conv, gpt) == GENERIC_MOE
    assert moe_bytes(_conv("megatron-bridge"), gpt, "flex") == MEGATRON_CORE_MOE
    assert moe_bytes(conv, gpt, "flex", fake_gate=True) == AUTOMODEL_DEEPEP_MOE._replace(router_saves=False)


def test_deepep_moe_layer_term_by_term():
    """Per routed copy grouped_gemm keeps fc1's input (2 B per hidden element) and fc2's input (2 B per expert-width
    element), the compiled clamped activation its input, the biased fc1 output, gate and up (4 B per expert-width
    element), and the fp32 routing prob (4 B); the router keeps the layer input and the generic router count."""
    gpt = shape_of(resolve_model("gpt-oss-120b"))
    h, e, k, f = gpt.h, gpt.experts, gpt.top_k, gpt.f_expert
    assert (h, e, k, f) == (2880, 128, 4, 2880)
    copies = T * k
    deepep = layer_activations(gpt, _layout(AUTOMODEL_DEEPEP_MOE), True, "none")["moe"]
    assert deepep == 2 * T * h + T * 8 * e + copies * (4 + 2 * h + 2 * 2 * f + 2 * f)
    generic = layer_activations(gpt, _layout(GENERIC_MOE), True, "none")["moe"]
    # the generic count keeps two more hidden-wide copies of every routed token and the activation's output
    assert generic - deepep == copies * (2 * 2 * h + 2 * f - 4)
    # 6 B per expert-width element, not 8; 2 B per hidden element, not 6
    assert (deepep - 2 * T * h - T * 8 * e) / copies == 4 + 2 * h + 6 * f == 23044


def test_fake_balanced_gate_keeps_no_router_tensors():
    """FakeBalancedGate's weights are constant and its indices an arange: no router tensor and no copy of the layer
    input is kept (the experts' own dispatched copy is); with shared experts their fc1 still keeps the input."""
    gpt = shape_of(resolve_model("gpt-oss-120b"))
    fake = AUTOMODEL_DEEPEP_MOE._replace(router_saves=False)
    real = layer_activations(gpt, _layout(AUTOMODEL_DEEPEP_MOE), True, "none")["moe"]
    assert real - layer_activations(gpt, _layout(fake), True, "none")["moe"] == 2 * T * gpt.h + T * 8 * gpt.experts
    ds = shape_of(resolve_model("deepseek-v3"))
    real = layer_activations(ds, _layout(AUTOMODEL_DEEPEP_MOE), True, "none")["moe"]
    assert real - layer_activations(ds, _layout(fake), True, "none")["moe"] == T * 8 * ds.experts


@pytest.mark.parametrize("model", ["gpt-oss-120b", "deepseek-v3", "qwen3-30b-a3b"])
@pytest.mark.parametrize("fake", [False, True])
def test_the_floors_count_is_at_most_each_dispatchers(model, fake):
    """The search's floors (least_moe_bytes) do not know the plan's dispatcher: their count is at most either's,
    and short of the least by no more than the routing prob of each copy (the generic count keeps none, DeepEP's
    no hidden-wide copy)."""
    arch, conv = resolve_model(model), _conv()
    shape = shape_of(arch)
    least = least_moe_bytes(conv, arch, fake)
    for mode, modules in (("none", ()), ("selective", ("moe_act",)), ("selective", ("layernorm",))):
        floor = layer_activations(shape, _layout(least), True, mode, modules)["moe"]
        each = [layer_activations(shape, _layout(moe_bytes(conv, arch, d, fake)), True, mode, modules)["moe"]
                for d in ("alltoall", "flex")]
        assert min(each) - T * shape.top_k * 4 <= floor <= min(each)


def _row_request(**kw) -> Request:
    """automodel_gptoss_120b_64 as the bench maps it: 64 H100, EP64 (the experts whole on every rank, outside FSDP),
    FSDP over 64, mbs 2 x 4096, GBS 512 (4 micro-batches), no recompute, DeepEP, fake balanced gate, bf16 loss."""
    base = {"model": "gpt-oss-120b", "gpu": "h100", "num_gpus": 64, "gpus_per_node": 8, "seq_length": 4096,
            "global_batch_size": 512, "micro_batch_size": 2, "framework": "nemo-automodel", "tp": 1, "pp": 1,
            "cp": 1, "ep": 64, "etp": 1, "dp": 64, "zero_stage": 3, "recompute": "none",
            "moe_token_dispatcher": "flex", "moe_fake_balanced_gate": True, "loss_fp32_upcast": False}
    return Request(**(base | kw))


def test_the_estimate_counts_the_deepep_layers():
    """The whole estimate's layer activations are the 36 layers' DeepEP count; the torch dispatcher's generic."""
    gpt = shape_of(resolve_model("gpt-oss-120b"))
    flex = api.estimate_memory(_row_request()).stages[0].detail["layer_activations"]
    torch_dispatch = api.estimate_memory(_row_request(moe_token_dispatcher="alltoall")).stages[0].detail[
        "layer_activations"]
    # the two norms' inputs, the QKV input, Q K V (64 + 2 x 8 heads of 64), the fp32 lse, the out-projection input
    per_layer = T * (2 * 2 * gpt.h + 2 * gpt.h + (64 + 2 * 8) * 64 * 2 + 4 * 64 + 64 * 64 * 2)
    routed = T * gpt.top_k * (4 + 2 * gpt.h + 6 * gpt.f_expert)
    assert flex == 36 * (per_layer + routed)
    # the fake gate keeps no router tensor on either path; the generic count two more hidden-wide copies per routed
    # copy and the activation's output, less the routing prob
    assert torch_dispatch - flex == 36 * T * gpt.top_k * (4 * gpt.h + 2 * gpt.f_expert - 4)


def test_runs_before_the_outer_model_was_sharded_reduced_every_micro_batch():
    """AutoModel's MoE parallelizer left the outer ...ForCausalLM unsharded until 8134b0c03 (2025-11-11), so
    get_sync_ctx deferred nothing: its own MoE models' runs without PP on a main snapshot before that day reduced every
    micro-batch (framework_version main@YYYY-MM-DD; the card's release_changes)."""
    change = framework_card("nemo-automodel").release_change("moe_outer_model_sharded")
    assert (change.commit, change.date, change.release) == ("8134b0c03", "2025-11-11", "0.2.0")
    assert predates("main@2025-10-02", change) and predates("main@2025-11-10", change)
    assert not predates("main@2025-11-11", change) and not predates("0.7.0", change) and not predates(None, change)
    assert predates("0.1.2", change) and not predates("main", change)

    def plan(**kw):
        return resolve(_row_request(**kw))

    old = plan(framework_version="main@2025-10-02")
    assert old[1].defer_fsdp_grad_sync is False
    assert any("release_changes moe_outer_model_sharded" in n for n in old[0].notes)
    assert plan(framework_version="main@2025-11-11")[1].defer_fsdp_grad_sync is True
    assert plan()[1].defer_fsdp_grad_sync is True  # the card's release (0.7.0): the setting's default
    assert plan(framework_version="main@2025-10-02", defer_fsdp_grad_sync=False)[1].defer_fsdp_grad_sync is False
    # a model the change does not act on (the dense path sharded the whole model): the default
    dense = Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="nemo-automodel", seq_length=4096,
                    global_batch_size=64, micro_batch_size=1, framework_version="main@2025-10-02")
    assert resolve(dense)[1].defer_fsdp_grad_sync is True
    # under PP the stage holds the gradients whatever the switch says (memory_states.pipeline_held)
    piped = api.estimate_memory(_row_request(pp=2, dp=32, ep=32, framework_version="main@2025-10-02")).stages[0]
    assert piped.detail["unsharded_accumulated_gradients"] > 0


def test_an_old_snapshot_refuses_the_setting_it_did_not_have():
    """defer_fsdp_grad_sync true on a snapshot that reduced every micro-batch is refused, naming the change; a day
    before the card's oldest snapshot, or no calendar day, is refused with the releases and snapshots it knows."""
    with pytest.raises(MeshplanError, match="8134b0c03") as err:
        resolve(_row_request(framework_version="main@2025-10-02", defer_fsdp_grad_sync=True))
    assert "main@2025-11-11" in err.value.fix
    with pytest.raises(MeshplanError, match="before 2025-10-02") as err:
        resolve(_row_request(framework_version="main@2025-09-30"))
    assert "main@YYYY-MM-DD from 2025-10-02" in err.value.fix
    with pytest.raises(MeshplanError, match="not a calendar day"):
        resolve(_row_request(framework_version="main@2025-02-30"))
    with pytest.raises(MeshplanError, match=r"no Megatron-Core .* main-branch snapshot"):
        resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="megatron-core", seq_length=4096,
                        framework_version="main@2025-10-02"))


def test_bench_row_reads_the_release_fact():
    """The bench maps every AutoModel row of the main-branch table to framework_version main@2025-10-02, and
    automodel_gptoss_120b_64 resolves to defer_fsdp_grad_sync false from it; a row stating the setting keeps it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from production_rows import load_rows
    from production_sources import defer_field, framework_version_for

    rows = {r["id"]: r for r in load_rows(Path(__file__).resolve().parents[1]
                                          / "bench/data/nemo_automodel/production_configs_dev.yaml")}
    row = rows["automodel_gptoss_120b_64"]
    assert framework_version_for(row, "nemo-automodel") == "main@2025-10-02"
    released = {**row, "source": {**row["source"], "version_or_date": "2026-03-01"}}  # no "main": a release's row
    assert framework_version_for(released, "nemo-automodel") is None
    early = {**row, "source": {**row["source"], "version_or_date": "2025-09-01 (main branch)"}}
    assert framework_version_for(early, "nemo-automodel") is None  # before the card's oldest snapshot: its release
    assert framework_version_for(row, "torchtitan") == "0.1"  # no snapshot on its card: release_ran by the date
    assert defer_field(row, "nemo-automodel") == {}  # the config leaves it out: the release decides (resolve)
    stated = {**row, "outcome": {**row["outcome"], "other": "it sets distributed.defer_fsdp_grad_sync true"}}
    assert defer_field(stated, "nemo-automodel") == {"defer_fsdp_grad_sync": True}
    held = api.estimate_memory(_row_request()).stages[0]
    reduced = api.estimate_memory(_row_request(framework_version="main@2025-10-02")).stages[0]
    assert held.detail["unsharded_accumulated_gradients"] > 0
    assert reduced.detail.get("unsharded_accumulated_gradients", 0) == 0


def test_every_dated_change_is_in_its_cards_release():
    """A card's release_changes are part of the release it describes (its facts have every one: a job that leaves
    framework_version out never predates one) and come after its oldest snapshot (a snapshot before one runs
    without it); a card with changes dates its oldest snapshot."""
    from meshplan.core.card_files import framework_names
    from meshplan.knowledge.releases import numbers

    for name in framework_names():
        card = framework_card(name)
        for change in card.release_changes:
            assert numbers(change.release) <= numbers(card.version), (name, change.change)
            assert card.oldest_snapshot is not None and card.oldest_snapshot <= change.date, (name, change.change)
            assert not predates(card.version, change)


def test_gpt_oss_ran_flex_attention_before_te_attention_came():
    """AutoModel's gpt-oss asserted backend.attn == 'flex' until 2b7c02cfc (2025-11-01): a main snapshot before it
    times the model's attention at FlexAttention's fraction whatever the backend, and says so; from that day, and on
    the card's release, the backend's kernel (cuDNN on Hopper); another model type keeps the backend's."""
    from meshplan.estimate.attention_time import attention_efficiency
    from meshplan.knowledge.calibration import calibration, calibration_card

    change = framework_card("nemo-automodel").release_change("model_te_attention")
    assert (change.commit, change.date, change.kernel_before) == ("2b7c02cfc", "2025-11-01", "flex_attention")

    def kernel(version=None, **kw):
        job, plan = resolve(_row_request(framework_version=version, **kw))
        return attention_efficiency(job, calibration(), backend=plan.attention_backend, zero_stage=3), job.notes

    (old, fraction), notes = kernel("main@2025-10-02")
    assert old == "flex_attention" and fraction == calibration_card().attention_kernels["flex_attention"].by_arch[
        "hopper"]
    assert any("release_changes model_te_attention" in n for n in notes)
    assert kernel("main@2025-10-02", attention_backend="fused")[0][0] == "flex_attention"  # whatever the backend
    assert kernel("main@2025-11-01")[0][0] == kernel()[0][0] == "cudnn"
    qwen = Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=8, framework="nemo-automodel", seq_length=4096,
                   global_batch_size=64, micro_batch_size=1, ep=8, framework_version="main@2025-10-02")
    job, plan = resolve(qwen)
    assert attention_efficiency(job, calibration(), backend=plan.attention_backend, zero_stage=3)[0] == "cudnn"
