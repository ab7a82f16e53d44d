"""Megatron-Core's CUDA graphs (Request/Plan cuda_graph_impl and cuda_graph_modules): the asserts of its
TransformerConfig.__post_init__ (rule CG001), the dropless MoE layers it cannot capture (CG002), each fix a plan that
passes, the render and import of the framework's own keys (0.19's and the older scope and switches), and what the
estimate does with them (nothing it times: the experts stay eager; graph pools not counted)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.estimate.moe_time import expert_launches
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

QWEN = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, ep=8, seq_length=4096, global_batch_size=512,
            micro_batch_size=1, framework="megatron-bridge")
LLAMA = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, zero_stage=3, seq_length=4096, global_batch_size=256,
             micro_batch_size=1, framework="megatron-core")
MOE_SAFE = ["attn", "moe_router", "moe_preprocess"]


def errors(**fields) -> dict[str, str]:
    report = api.check_config(Request(**fields))
    return {f.id: f"{f.message} {f.fix}" for f in report.findings if f.severity == "error"}


@pytest.mark.parametrize("fields,words", [
    (dict(cuda_graph_modules=["moe", "moe_router"]), "both moe and moe_router"),
    (dict(cuda_graph_modules=["moe_preprocess"]), "only captured together with moe_router"),
    (dict(cuda_graph_modules=["mlp"]), "every layer of Qwen3-30B-A3B is MoE"),
    (dict(cuda_graph_modules=["attn"], recompute="full"), "full recompute runs only under the full-iteration"),
    (dict(cuda_graph_modules=MOE_SAFE, recompute="selective", recompute_modules=["moe"]), "'moe' recompute"),
    (dict(cuda_graph_modules=["attn"], recompute="selective", recompute_modules=["core_attn"], dropout=True),
     "a graphed recompute takes no random numbers"),
])
def test_megatron_core_asserts(fields, words):
    found = errors(**QWEN, cuda_graph_impl="transformer_engine", **fields)
    assert "CG001" in found and words in found["CG001"]


def test_each_module_set_the_asserts_take_passes():
    assert not {"CG001", "CG002"} & errors(**QWEN, cuda_graph_impl="transformer_engine",
                                             cuda_graph_modules=MOE_SAFE).keys()
    # local adds moe_router to moe_preprocess itself (transformer_config.py): no assert
    assert not {"CG001", "CG002"} & errors(**QWEN, cuda_graph_impl="local",
                                             cuda_graph_modules=["moe_preprocess"]).keys()
    # a dense model: its MLP, the whole layer, or the full iteration (even with full recompute)
    for fields in (dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn", "mlp"]),
                   dict(cuda_graph_impl="transformer_engine"),
                   dict(cuda_graph_impl="full_iteration", recompute="full")):
        assert not {"CG001", "CG002"} & errors(**LLAMA, **fields).keys(), fields
    assert "moe_router" in errors(**LLAMA, cuda_graph_impl="transformer_engine",
                                  cuda_graph_modules=["moe_router"])["CG001"]


@pytest.mark.parametrize("fields", [dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe"]),
                                    dict(cuda_graph_impl="transformer_engine"), dict(cuda_graph_impl="local"),
                                    dict(cuda_graph_impl="full_iteration")])
def test_dropless_moe_layers_are_not_captured_and_the_fix_passes(fields):
    found = errors(**QWEN, **fields)
    assert "CG002" in found and "attn" in found["CG002"]
    impl = "local" if fields["cuda_graph_impl"] == "local" else "transformer_engine"
    assert not {"CG001", "CG002"} & errors(**QWEN, cuda_graph_impl=impl, cuda_graph_modules=MOE_SAFE).keys()


def test_the_ep_overlap_refuses_graphs_of_the_moe_and_mlp_under_transformer_engine():
    overlap = dict(QWEN, num_gpus=32, pp=2, vpp=2, moe_a2a_overlap=True, cuda_graph_impl="transformer_engine")
    model = dict(overlap, model="deepseek-v2-lite")  # dense first layer: mlp is a module it has
    assert "moe_a2a_overlap" in errors(**model, cuda_graph_modules=["attn", "mlp"])["CG003"]
    assert not {"CG001", "CG003"} & errors(**overlap, cuda_graph_modules=MOE_SAFE).keys()


def test_a_framework_without_the_key_is_refused_naming_those_with_it():
    found = errors(**{**LLAMA, "framework": "torchtitan"}, cuda_graph_impl="transformer_engine",
                   cuda_graph_modules=["attn"])
    assert "megatron-core" in found["CG001"] and "megatron-bridge" in found["CG001"]


def test_modules_need_a_per_layer_implementation():
    for impl in (None, "full_iteration"):
        with pytest.raises(MeshplanError, match="cuda_graph_modules"):
            resolve(Request(**LLAMA, cuda_graph_impl=impl, cuda_graph_modules=["attn"]))


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
@pytest.mark.parametrize("fields", [dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=MOE_SAFE),
                                    dict(cuda_graph_impl="local", cuda_graph_modules=["attn"])])
def test_render_and_import_round_trip(framework, fields):
    # fused as the perf recipes that capture graphs run it (Bridge's Qwen3 provider leaves it off: 2.7 GiB more, over)
    req = Request(**{**QWEN, "framework": framework, **fields}, bias_activation_fusion=True)
    text = api.render_config(framework, req).text
    back = api.import_config(text, framework=framework).request
    assert back["cuda_graph_impl"] == fields["cuda_graph_impl"]
    assert back["cuda_graph_modules"] == fields["cuda_graph_modules"]


def test_full_iteration_renders_what_the_framework_asserts_beside_it():
    req = Request(**LLAMA, cuda_graph_impl="full_iteration")
    core = api.render_config("megatron-core", req).text
    assert "--cuda-graph-impl full_iteration" in core and "--no-check-for-nan-in-loss-and-grad" in core
    assert "--cuda-graph-modules" not in core
    bridge = api.render_config("megatron-bridge", req.model_copy(update={"framework": "megatron-bridge"})).text
    assert "rerun_state_machine.check_for_nan_in_loss = False" in bridge


@pytest.mark.parametrize("flags,impl,modules", [
    ("--cuda-graph-impl local --cuda-graph-scope full_iteration", "full_iteration", None),  # older releases' API
    ("--cuda-graph-scope full_iteration --cuda-graph-impl local", "full_iteration", None),
    ("--external-cuda-graph --cuda-graph-scope attn moe_router", "transformer_engine", ["attn", "moe_router"]),
    ("--enable-cuda-graph --cuda-graph-scope full", "local", None),  # 'full': the whole layer
    ("--cuda-graph-modules attn", None, None),  # no implementation: Megatron-Core's none, the modules do nothing
])
def test_import_reads_every_release_key(flags, impl, modules):
    text = ("torchrun --nproc-per-node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 1 "
            "--pipeline-model-parallel-size 1 --micro-batch-size 1 --global-batch-size 64 --seq-length 4096 "
            f"--num-layers 32 --hidden-size 4096 --num-attention-heads 32 {flags}")
    request = api.import_config(text, framework="megatron-core").request
    assert request.get("cuda_graph_impl") == impl
    assert request.get("cuda_graph_modules") == modules


def test_the_estimate_times_the_graphs_as_eager_and_says_so():
    """The experts stay eager under every capture the rules let through: the launch floor and host sync stand."""
    fp8 = dict(QWEN, precision="fp8", fp8_recipe="tensorwise")
    eager = api.estimate_throughput(Request(**fp8))
    graphs = Request(**fp8, cuda_graph_impl="transformer_engine", cuda_graph_modules=MOE_SAFE)
    graphed = api.estimate_throughput(graphs)
    assert graphed.step_time_s == eager.step_time_s
    assert expert_launches(*resolve(graphs)) == expert_launches(*resolve(Request(**fp8))) != (0.0, 0.0)
    assert any("routed experts stay eager" in a for a in graphed.assumptions)
    memory = api.estimate_memory(graphs)
    assert any("CUDA-graph pools (cuda_graph_impl=transformer_engine" in a for a in memory.assumptions)


def test_recommend_carries_the_graphs_given_and_says_nothing_of_them_otherwise():
    given = api.recommend(Request(**QWEN, cuda_graph_impl="transformer_engine", cuda_graph_modules=MOE_SAFE), top_k=2)
    assert given.candidates and all((c.plan.cuda_graph_impl, c.plan.cuda_graph_modules)
                                    == ("transformer_engine", tuple(MOE_SAFE)) for c in given.candidates)
    assert any("cuda_graph_impl=transformer_engine (given)" in a for a in given.assumptions)
    plain = api.recommend(Request(**QWEN), top_k=2)
    assert not any("cuda_graph" in a for a in plain.assumptions)


@pytest.mark.parametrize("lines,impl,modules", [
    ("cfg.model.cuda_graph_impl = 'local'\ncfg.model.cuda_graph_scope = ['full_iteration']", "full_iteration", None),
    ("cfg.model.cuda_graph_impl = 'transformer_engine'\ncfg.model.cuda_graph_scope = ['attn', 'mlp']",
     "transformer_engine", ["attn", "mlp"]),  # Bridge's perf recipes still write the older key
    ("cfg.model.cuda_graph_impl = 'none'\ncfg.model.cuda_graph_scope = 'full'", "none", None),
])
def test_bridge_import_reads_the_older_scope_key(lines, impl, modules):
    req = Request(**{**LLAMA, "framework": "megatron-bridge", "zero_stage": 1})
    text = api.render_config("megatron-bridge", req, force=True).text + "\n" + lines + "\n"
    request = api.import_config(text, framework="megatron-bridge").request
    assert (request.get("cuda_graph_impl"), request.get("cuda_graph_modules")) == (impl, modules)
