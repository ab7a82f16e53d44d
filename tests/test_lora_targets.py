"""LoRA targets beyond Megatron-Bridge's default four (meshplan/arithmetic/lora.py, adapters/lora.py): MLA attention's
own linears, named as Bridge's MLA recipes name them, counted from the MLA shapes, rendered and read back on every
engine; and Llama 4, whose router PEFT's all-linear cannot wrap, rendered for the PEFT engines as its projections."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from meshplan.adapters.lora import hf_projections
from meshplan.adapters.read import request_values
from meshplan.adapters.read.keys import LORA_NOT_MODELLED
from meshplan.adapters.render import render
from meshplan.api import import_config
from meshplan.arithmetic.lora import adapter_params, lora_engine, peft_all_linear, total_adapter_params
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.request.resolve import resolve
from meshplan.schema.plan import LoraSpec
from meshplan.schema.request import Request

# Megatron-Bridge 067f987 recipes/moonlight/h100/moonlight_16b.py (the PEFT convergence recipe's default_peft_config)
MOONLIGHT_TARGETS = ["linear_q_proj", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj"]
# recipes/glm/h100/glm5.py (a q_lora_rank model: q down and up projections)
Q_LORA_TARGETS = ["linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj"]
BRIDGE = dict(framework="megatron-bridge", job="lora", global_batch_size=64, lora_rank=8)


def test_bridge_counts_renders_and_reads_back_moonlights_mla_targets():
    """Moonlight (h 2048, 16 heads, nope 128 + rope 64, v 128, kv_lora_rank 512, no q_lora_rank, 27 layers): each
    adapter is r(in + out) from MLASelfAttention's shapes, split over TP (ParallelLinearAdapter), and the recipe's
    target names are written to cfg.peft.target_modules and read back from both render variants (fails before: the
    request refused every MLA name)."""
    job, plan = resolve(Request(model="moonlight-16b-a3b", num_gpus=16, tp=2, lora_targets=MOONLIGHT_TARGETS, **BRIDGE))
    r, h = 8, 2048
    layer = r * ((h + 16 * 192) + (h + 512 + 64) + (512 + 16 * (128 + 128)) + (16 * 128 + h))
    engine = lora_engine(framework_card("megatron-bridge"), plan.zero_stage)
    assert total_adapter_params(job.model, job.lora, engine) == 27 * layer
    assert adapter_params(job.model, [0], job.lora, engine, tp=2, ep=1, etp=1) == (layer / 2, 0.0)
    assert not [f for f in check_config(job, plan).findings if f.id.startswith("LORA")]
    for variant in ("python", "run_recipe"):
        result = render("megatron-bridge", job, plan, variant=variant)
        assert "linear_kv_down_proj" in result.text
        back = import_config(result.text, path=result.filename, framework="megatron-bridge")
        assert sorted(back.request["lora_targets"]) == sorted(MOONLIGHT_TARGETS)


def test_mla_targets_the_model_lacks_are_refused_with_the_ones_it_has():
    """LORA002 names the model's own MLA linears: linear_qkv on Moonlight, linear_q_proj on DeepSeek-V3 (a
    q_lora_rank: down and up), an MLA name on a model without MLA."""
    def lora002(model, targets):
        job, plan = resolve(Request(model=model, num_gpus=256, lora_targets=targets, **BRIDGE))
        return [f.message for f in check_config(job, plan).findings if f.id == "LORA002"]

    assert "linear_kv_down_proj" in lora002("moonlight-16b-a3b", ["linear_qkv", "linear_proj"])[0]
    assert "linear_q_down_proj" in lora002("deepseek-v3", ["linear_q_proj", "linear_proj"])[0]
    assert "not MLA" in lora002("llama-3.1-8b", ["linear_kv_up_proj"])[0]
    assert lora002("deepseek-v3", Q_LORA_TARGETS) == []


@pytest.mark.parametrize(("model", "targets", "modules"), [
    ("moonlight-16b-a3b", MOONLIGHT_TARGETS, ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]),
    ("deepseek-v3", Q_LORA_TARGETS, ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]),
])
def test_automodel_wildcards_match_its_deepseek_modules_and_read_back(model, targets, modules):
    """NeMo AutoModel 0.7.0 components/models/deepseek_v3/layers.py MLA names its linears q_proj (no q_lora_rank) or
    q_a_proj and q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, under model.layers.N.self_attn; its ModuleMatcher
    full-matches a wildcard against that dotted name. Each rendered wildcard matches exactly its own module (q_proj's
    not q_a_proj's), and the recipe reads back as the same targets (fails before: MLA names refused)."""
    job, plan = resolve(Request(model=model, framework="nemo-automodel", num_gpus=256, job="lora",
                                global_batch_size=256, lora_targets=targets))
    result = render("nemo-automodel", job, plan)
    patterns = yaml.safe_load(result.text)["peft"]["target_modules"]
    names = ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "kv_a_layernorm"]
    matched = {n for n in names for p in patterns
               if re.fullmatch(p.replace("*", "(.*)"), f"model.layers.3.self_attn.{n}")}
    assert matched == set(modules)
    back = import_config(result.text, path=result.filename, framework="nemo-automodel", config_format="yaml")
    assert sorted(back.request["lora_targets"]) == sorted(targets)


def test_automodel_default_on_an_mla_moe_model_matches_its_deepseek_module_paths():
    """The default targets on DeepSeek-V3 (no linear_qkv: o_proj, the MLPs, the routed experts) as wildcards over
    AutoModel's own module paths: the dense layers' and the shared experts' gate/up/down (MLP), the routed experts
    (one GroupedExperts, 'experts'); not the router ('gate') nor the output head."""
    job, plan = resolve(Request(model="deepseek-v3", framework="nemo-automodel", num_gpus=256, job="lora",
                                global_batch_size=256))
    patterns = yaml.safe_load(render("nemo-automodel", job, plan).text)["peft"]["target_modules"]

    def hit(name):
        return any(re.fullmatch(p.replace("*", "(.*)"), name) for p in patterns)

    for name in ["model.layers.0.self_attn.o_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj",
                 "model.layers.3.mlp.shared_experts.up_proj", "model.layers.3.mlp.experts"]:
        assert hit(name), (name, patterns)
    assert not any(hit(n) for n in ["lm_head", "model.layers.3.mlp.gate", "model.layers.3.self_attn.q_a_proj"])


@pytest.mark.parametrize(("framework", "variant"), [("verl", "sft-fsdp"), ("verl", "fsdp"), ("skyrl", "fsdp")])
def test_llama4_on_the_peft_engines_names_its_projections_not_all_linear(framework, variant):
    """transformers 5.9.0's Llama4Router is an nn.Linear whose forward returns (scores, logits): PEFT's all-linear
    wraps it and the forward fails ('tuple' object has no attribute 'dtype'). The PEFT engines' render names the
    projections instead (fails before: all-linear), says why, and reads back as the same job."""
    job, plan = resolve(Request(model="llama-4-scout", framework=framework, num_gpus=32, zero_stage=3, job="lora",
                                global_batch_size=64))
    text = render(framework, job, plan, variant=variant).text
    assert "all-linear" not in text and "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" in text
    assert any("Llama4Router" in n for n in job.notes)
    back = import_config(text, path="run.sh", framework=framework)
    assert sorted(back.request["lora_targets"]) == sorted(job.lora.targets)


def _peft(ask: dict) -> dict:
    from framework_packages import peft_lora_count

    return peft_lora_count(ask)


LLAMA4 = {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 96,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 100,
          "tie_word_embeddings": False}


@pytest.mark.slow
def test_peft_runs_and_counts_what_meshplan_renders_for_llama4():
    """Ground truth in PEFT 0.18.1 on transformers 5.9.0, a tiny llama4_text model on the CPU: the target_modules
    meshplan writes on verl's and SkyRL's FSDP engines run a forward and backward, and train exactly meshplan's count
    (the dense MLP, the shared expert, q/k/v/o; no router, no routed expert); all-linear does not run."""
    arch = architecture_from_config(LLAMA4)
    spec = LoraSpec(rank=4, targets=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"])
    assert not peft_all_linear(arch, spec)
    ran = _peft({"config": LLAMA4, "rank": 4, "target_modules": hf_projections(spec.targets), "forward": True})
    assert ran["runs"], ran["error"]
    assert ran["trainable"] == total_adapter_params(arch, spec, lora_engine(framework_card("verl"), 3))
    assert not _peft({"config": LLAMA4, "rank": 4, "target_modules": "all-linear", "forward": True})["runs"]


MLA_V3 = {"model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
          "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
          "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "q_lora_rank": 96,
          "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 1000,
          "tie_word_embeddings": False}


@pytest.mark.slow
@pytest.mark.parametrize("q_lora_rank", [96, None])
def test_peft_counts_mla_targets_named_as_meshplan_names_them(q_lora_rank):
    """PEFT 0.18.1 on transformers 5.9.0's DeepSeek-V3 (meta device): the MLA projection names meshplan writes for
    MLA targets on the PEFT engines adapt exactly the linears meshplan counts from the MLA shapes."""
    config = {**MLA_V3, "q_lora_rank": q_lora_rank}
    arch = architecture_from_config(config)
    q = ["linear_q_down_proj", "linear_q_up_proj"] if q_lora_rank else ["linear_q_proj"]
    spec = LoraSpec(rank=8, targets=[*q, "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj"])
    peft = _peft({"config": config, "rank": 8, "target_modules": hf_projections(spec.targets)})
    assert peft["trainable"] == total_adapter_params(arch, spec, lora_engine(framework_card("verl"), 3))


@pytest.mark.parametrize(("model", "said"), [("meta-llama/Llama-4-Scout-17B-16E-Instruct", True),
                                             ("meta-llama/Llama-3.1-8B", False)])
def test_a_files_all_linear_on_llama4_is_said_not_to_run(model, said):
    """verl's SFT trainer on the FSDP engine with model.target_modules=all-linear: on Llama 4 the import says the
    setting fails (its router wrapped) and names the list that runs, the one meshplan counts; on a model without such
    a router it says nothing (fails before: nothing was said)."""
    text = (f"torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer model.path={model} data.train_batch_size=64 "
            "model.lora_rank=16 model.target_modules=all-linear\n")
    lines = [u for u in import_config(text, path="sft.sh").unsupported if "all-linear" in u]
    assert bool(lines) == said
    if said:
        assert "Llama4Router" in lines[0] and "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" in lines[0]


CONFIGS = Path(__file__).resolve().parent / "configs"


@pytest.mark.parametrize(("path", "rank", "targets"), [
    ("bridge_moonlight_16b_h100.py:moonlight_16b_peft_4gpu_h100_bf16_config", 8, MOONLIGHT_TARGETS),
    ("bridge_glm5_h100.py:glm52_peft_208gpu_h100_bf16_config", 8, Q_LORA_TARGETS),
])
def test_bridge_mla_recipes_peft_is_read(path, rank, targets):
    """Megatron-Bridge 067f987's MLA recipes set their LoRA under `if peft_scheme is lora`: Moonlight as
    cfg.peft = default_peft_config(scheme, dim=8, target_modules=[...]), GLM-5 through a peft_cfg variable
    (peft_cfg.dim = 8; peft_cfg.target_modules = [...]; cfg.peft = peft_cfg). Both are read as the recipe's lora_rank
    and lora_targets (fails before: neither was read, so the job took rank 32 on the default targets)."""
    imported = import_config((CONFIGS / path.split(":")[0]).read_text(), path=str(CONFIGS / path),
                             framework="megatron-bridge")
    assert imported.request["lora_rank"] == rank
    assert sorted(imported.request["lora_targets"]) == sorted(targets)


def _bridge_recipe(targets: list[str], model: str = "qwen3_30b_a3b") -> str:
    return ("from megatron.bridge.peft.lora import LoRA\n"
            f"def {model}_peft_8gpu_h100_bf16_config() -> ConfigContainer:\n    cfg = _peft_common()\n"
            f"    cfg.peft = LoRA(dim=8, target_modules={targets!r})\n    return cfg\n")


@pytest.mark.parametrize(("model", "targets", "read", "refused"), [
    ("qwen3_30b_a3b", ["*.linear_qkv", "*.linear_proj"], ["linear_qkv", "linear_proj"], False),
    ("qwen3_30b_a3b", ["linear_qkv", "*.mlp.*linear_fc1", "*linear_fc2"], ["linear_qkv", "linear_fc1", "linear_fc2"],
     False),
    # Qwen3-30B-A3B has no dense MLP: decoder.layers.*.mlp.linear_fc1 matches no module (Bridge only warns)
    ("qwen3_30b_a3b", ["*.linear_qkv", "decoder.layers.*.mlp.linear_fc1", "*.experts.linear_fc2"],
     ["linear_qkv", "linear_fc2"], False),
    ("qwen3_30b_a3b", ["decoder.layers.*.mlp.linear_fc1"], None, True),
    ("qwen3_30b_a3b", ["*.layers.0.*.linear_qkv"], None, True),  # one layer (of each pipeline stage)
    # DeepSeek-V3: dense MLPs in its first 3 layers; '*.experts.' also matches mlp.shared_experts (a regex dot)
    ("deepseek_v3", ["*.linear_kv_up_proj", "*.experts.linear_fc1"], ["linear_fc1", "linear_kv_up_proj"], True),
    # decoder.layers.* leaves out the MTP block's layer (mtp.layers.0.mtp_model_layer...), which Bridge's bare names and
    # '*.' patterns adapt too
    ("deepseek_v3", ["*.linear_kv_up_proj", "decoder.layers.*.mlp*.linear_fc1"],
     ["linear_fc1", "linear_kv_up_proj"], True),
    # Bridge's LoRA adapts a router an entry matches (LoRATopKRouter): said, as meshplan counts none
    ("qwen3_30b_a3b", ["*.linear_qkv", "*.router"], ["linear_qkv"], False),
])
def test_bridge_path_patterns_are_read_as_bridge_matches_them(model, targets, read, refused):
    """Megatron-Bridge 0.6.2 peft/module_matcher.py adapts a module whose name equals a target_modules entry or whose
    path matches it (peft/utils.py wildcard_match: '*' any text, '.' any character), paths from the GPTModel
    (decoder.layers.<i>.mlp.experts.linear_fc1 ...). A pattern set is read as the targets it adapts in every place
    the model holds them; one adapting some layers or some of a target's places only is said and refused an estimate
    (fails before: every pattern was 'no projection meshplan knows' and the job took the default four)."""
    got = import_config(_bridge_recipe(targets, model), path="r.py", framework="megatron-bridge")
    assert got.request.get("lora_targets") == read
    said = [u for u in got.unsupported if u.endswith(LORA_NOT_MODELLED)]
    assert bool(said) == refused and not [u for u in got.unsupported if "no projection" in u]
    assert bool([u for u in got.unsupported if "adapts the router too" in u]) == ("*.router" in targets)
    if refused:
        with pytest.raises(MeshplanError, match="no estimate of this LoRA job"):
            request_values(got, {})
    else:
        job, plan = resolve(Request(**request_values(got, {"num_gpus": 256})))
        assert sorted(job.lora.targets) == sorted(read)
        result = render("megatron-bridge", job, plan)  # the bare names, each Bridge's `name == pattern` matches
        back = import_config(result.text, path=result.filename, framework="megatron-bridge")
        assert sorted(back.request["lora_targets"]) == sorted(read)


QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1000, "decoder_sparse_step": 1,
             "mlp_only_layers": [1]}


@pytest.mark.slow
def test_peft_param_wrapper_on_the_experts_costs_what_meshplan_says():
    """verl's model.target_parameters in PEFT 0.18.1 on transformers 5.9.0, a tiny Qwen3-MoE (one MoE layer, one
    dense) on the CPU: the ParamWrappers train r x E x (in + out) per expert weight, and one forward and backward
    (transformers' per-expert loop, so FlopCounterMode sees the experts' matmuls) costs, beyond the same job without
    them, the experts' weight gradients per routed token and the delta's einsum and its gradients per micro-batch,
    exactly arithmetic/param_wrapper.py's (fails before: no such count)."""
    from meshplan.arithmetic.param_wrapper import param_wrapper_flops, param_wrapper_params

    arch, tokens = architecture_from_config(QWEN3_MOE), 64
    ask = {"config": QWEN3_MOE, "rank": 4, "target_modules": ["q_proj"], "forward": True, "tokens": tokens,
           "experts_implementation": "eager"}
    wrapped = _peft({**ask, "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]})
    plain = _peft(ask)
    assert wrapped["runs"] and wrapped["experts"] == param_wrapper_params(arch, 4) == 4 * 8 * (64 + 64 + 32 + 64)
    per_token, per_batch = param_wrapper_flops(arch, 4)
    assert wrapped["flops"] - plain["flops"] == per_token * tokens + per_batch


def test_bridge_lora_matches_module_paths_as_the_pinned_bridge_does():
    """meshplan's reading of Bridge path patterns against the pinned Megatron-Bridge 0.6.2 wheel: its
    peft/utils.py wildcard_match (run from the wheel's own source) agrees with bridge_lora.wildcard_match on every
    pattern and module path meshplan tries, and ModuleMatcher.match takes a module whose name is the entry or whose
    path the entry matches, and LoRA.transform adapts a matched router (fails before: no such reading)."""
    import ast
    from typing import Optional

    from framework_packages import wheel_tree

    from meshplan.adapters.read.bridge_lora import LAYER_INDICES, OTHER_PLACES, places, wildcard_match
    from meshplan.arithmetic.lora import TARGETS

    peft = wheel_tree("megatron-bridge") / "megatron" / "bridge" / "peft"
    tree = ast.parse((peft / "utils.py").read_text(encoding="utf-8"))
    source = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "wildcard_match")
    namespace = {"re": re, "Optional": Optional}
    exec(compile(ast.Module(body=[source], type_ignores=[]), "utils.py", "exec"), namespace)
    paths = [path.format(i=i, t=t) for t in TARGETS for path in places(t).values() for i in LAYER_INDICES]
    paths += [path.format(i=i) for path in OTHER_PLACES.values() for i in LAYER_INDICES]
    patterns = ["*.linear_qkv", "decoder.layers.*.mlp.linear_fc1", "*.experts.linear_fc2", "*.layers.0.*.linear_qkv",
                "*.mlp.*linear_fc1", "*linear_fc2", "*.router", "*", "decoder.layers.1*.self_attention.*"]
    for pattern in patterns:
        assert [namespace["wildcard_match"](pattern, p) for p in paths] == [wildcard_match(pattern, p) for p in paths]
    assert "if name == pattern or wildcard_match(pattern, full_name):" in (peft / "module_matcher.py").read_text()
    assert "if isinstance(module, TopKRouter):" in (peft / "lora.py").read_text()
    # the paths: megatron-core 0.19.2 GPTModel.decoder (TransformerBlock: layers, a ModuleList of the stage's own layer
    # specs, so <i> counts from 0 on every stage) and output_layer; TransformerLayer.self_attention and mlp; MoELayer
    # experts (TEGroupedMLP linear_fc1 / linear_fc2), shared_experts and router
    core = wheel_tree("megatron-core") / "megatron" / "core"
    for file, attributes in [("models/gpt/gpt_model.py", ["self.decoder = ", "self.output_layer = "]),
                             ("transformer/transformer_block.py", ["self.layers = torch.nn.ModuleList("]),
                             ("transformer/transformer_layer.py", ["self.self_attention = ", "self.mlp = "]),
                             ("transformer/moe/moe_layer.py", ["self.experts = ", "self.shared_experts = ",
                                                               "self.router = "]),
                             ("transformer/moe/experts.py", ["self.linear_fc1 = ", "self.linear_fc2 = "])]:
        text = (core / file).read_text(encoding="utf-8")
        assert all(a in text for a in attributes), file


SFT_LORA = ("torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer model.path=meta-llama/Llama-3.1-8B "
            "data.train_batch_size=64 model.lora_rank=16 model.target_modules=all-linear {}\n")


@pytest.mark.parametrize(("exclude", "targets"), [
    ("model.exclude_modules=[down_proj]", ["linear_qkv", "linear_proj", "linear_fc1"]),
    ("model.exclude_modules=[q_proj,k_proj,v_proj]", ["linear_proj", "linear_fc1", "linear_fc2"]),
    ("model.exclude_modules=[mlp.gate_proj,mlp.up_proj]", ["linear_qkv", "linear_proj", "linear_fc2"]),
    ("'model.exclude_modules=.*mlp.*'", ["linear_qkv", "linear_proj"]),  # a string: one regex, re.fullmatch
    ("'model.exclude_modules=.*visual.*'", ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]),  # none here
])
def test_peft_exclude_modules_takes_whole_linears_out_of_the_targets(exclude, targets):
    """verl's FSDP engine passes exclude_modules to PEFT's LoraConfig, which adapts the targets less what it excludes;
    the import reads it into lora_targets, saying where from, so check and the estimate count the adapters that run
    (fails before: the key was 'no meshplan field' and all four linears were counted)."""
    imported = import_config(SFT_LORA.format(exclude), path="sft.sh")
    assert imported.request["lora_targets"] == targets
    assert not [u for u in imported.unsupported if "exclude_modules" in u]
    if len(targets) < 4:
        assert "exclude_modules" in imported.sources["lora_targets"]
        job, _ = resolve(Request(**request_values(imported, {"gpu": "h100", "seq_length": 2048})))
        assert job.lora is not None and job.lora.targets == targets


def test_skyrls_exclude_modules_leaves_its_default_targets_less_those():
    text = ("python -m skyrl.train.entrypoints.main_base trainer.policy.model.path=meta-llama/Llama-3.1-8B "
            "trainer.strategy=fsdp2 trainer.policy.model.lora.rank=16 'trainer.policy.model.lora.exclude_modules="
            ".*down_proj' trainer.placement.policy_num_gpus_per_node=8\n")
    imported = import_config(text, path="skyrl.sh")
    assert imported.request["lora_targets"] == ["linear_qkv", "linear_proj", "linear_fc1"]
    assert imported.sources["lora_targets"].startswith("the engine's default targets, less skyrl.sh:1")


@pytest.mark.parametrize(("text", "said"), [
    (SFT_LORA.format("model.exclude_modules=[v_proj]"), "leaves v_proj out of a fused linear"),
    (SFT_LORA.format("model.exclude_modules=[layers.0.mlp.down_proj]"),
     "excludes linear_fc2 (down_proj) in 1 of the 32"),
    (SFT_LORA.format("'model.exclude_modules=model[.]layers[.]1[0-9][.].*'"),
     "excludes linear_qkv (k_proj, q_proj, v_proj) in 30 of the 96"),
    (SFT_LORA.format("model.exclude_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"),
     "excludes every target"),
    (SFT_LORA.replace("meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V2-Lite").format(
        "model.exclude_modules=[shared_experts.down_proj]"), "in the shared experts), not in model.layers.0.mlp"),
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=meta-llama/Llama-3.1-8B "
     "actor_rollout_ref.actor.strategy=megatron actor_rollout_ref.model.lora.rank=16 "
     "actor_rollout_ref.model.lora.exclude_modules=[linear_fc2] trainer.nnodes=1 trainer.n_gpus_per_node=8\n",
     "only with an empty target_modules"),
    ((CONFIGS / "automodel_llama3_3_70b_instruct_peft_benchmark.yaml").read_text().replace(
        "  dim: 16\n", "  dim: 16\n  exclude_modules: ['*.lm_head']\n").replace("Llama-3.3-70B-Instruct",
                                                                                  "Llama-3.1-8B"),
     "only without target_modules"),
])
def test_an_exclusion_meshplan_cannot_count_is_said_and_refused_an_estimate(text, said):
    """Part of a fused linear, one layer's module, every target (PEFT then adapts nothing and raises), all-linear less
    some on a model whose other linears (MLA's, the router) all-linear still adapts, or
    exclude_modules on Megatron-Bridge's LoRA (verl's Megatron engine passes it there: Bridge asserts it empty beside
    target_modules, and without them adapts every linear, the output layer too) or NeMo AutoModel's (the same
    modes): said, and no estimate is made."""
    imported = import_config(text, path="x.yaml" if "\npeft:" in text else "x.sh")
    lines = [u for u in imported.unsupported if "exclude_modules" in u]
    assert lines and said in lines[0] and lines[0].endswith(LORA_NOT_MODELLED), imported.unsupported
    with pytest.raises(MeshplanError, match="no estimate of this LoRA job"):
        request_values(imported, {"gpu": "h100", "seq_length": 2048, "num_gpus": 8})


LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
         "tie_word_embeddings": False}


@pytest.mark.slow
def test_peft_trains_what_meshplan_counts_after_exclude_modules():
    """PEFT 0.18.1 on transformers 5.9.0, a tiny Llama: all-linear less exclude_modules [down_proj] trains exactly
    meshplan's count of the targets the import leaves (linear_qkv, linear_proj, linear_fc1)."""
    arch = architecture_from_config(LLAMA)
    spec = LoraSpec(rank=4, targets=["linear_qkv", "linear_proj", "linear_fc1"])
    ran = _peft({"config": LLAMA, "rank": 4, "target_modules": "all-linear", "exclude_modules": ["down_proj"]})
    assert ran["trainable"] == total_adapter_params(arch, spec, lora_engine(framework_card("verl"), 3))
