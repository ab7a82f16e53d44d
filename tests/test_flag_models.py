"""A Megatron-LM launch script's model that no catalog card has is built from its own flags as Megatron-LM builds it
(meshplan/knowledge/flag_models.py): exact counts against Megatron-LM's own module arithmetic, the catalog shape an MoE
script states, the errors naming the flag, and every face planning with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan import api
from meshplan.adapters.read import import_config, import_file, model_match
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.knowledge.catalog import describe_model, resolve_model
from meshplan.knowledge.model_counts import total_params
from meshplan.schema.request import Request

CONFIGS = Path(__file__).parent / "configs"
LLAMA2_13B = """torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 40 --hidden-size 5120 \\
  --ffn-hidden-size 13824 --num-attention-heads 40 --seq-length 4096 --max-position-embeddings 4096 \\
  --micro-batch-size 1 --global-batch-size 512 --tensor-model-parallel-size {tp} --pipeline-model-parallel-size 2 \\
  --bf16 --swiglu --vocab-size 32000 --untie-embeddings-and-output-weights{extra}
"""
LLAMA = " --normalization RMSNorm --disable-bias-linear --position-embedding-type rope"


def _model(text: str, path: str = "train.sh") -> str:
    imported = import_config(text, path)
    assert "model" in imported.request, imported.unresolved
    return imported.request["model"]


def test_llama2_13b_script_counts_the_published_model_exactly():
    """Llama-2-13B's shape (RMSNorm, no biases, rope): 13,015,864,320, the count of meta-llama/Llama-2-13b-hf, the
    published 13.0B; one model at any tp (Megatron-LM's run-time vocabulary padding is the estimates')."""
    arch = resolve_model(_model(LLAMA2_13B.format(tp=4, extra=LLAMA)))
    assert arch is resolve_model(_model(LLAMA2_13B.format(tp=1, extra=LLAMA)))
    assert total_params(arch) == 13_015_864_320
    assert (arch.norm_type, arch.qkv_bias, arch.mlp_bias, arch.learned_position_embeddings) == ("rmsnorm", False,
                                                                                             False, 0)


def test_flags_left_out_are_megatron_defaults():
    """The brief's script as written: Megatron-LM's LayerNorm, biases on every linear, a learned position table of
    --max-position-embeddings rows; per layer (megatron/core/transformer): linear_qkv 3h^2+3h, linear_proj h^2+h,
    fc1 2fh+2f, fc2 fh+h, two LayerNorms 4h. The vocabulary is the tokenizer's, as a checkpoint counts it (the
    estimates pad it per plan's tp, as for every model)."""
    imported = import_config(LLAMA2_13B.format(tp=4, extra=""), "train.sh")
    arch = resolve_model(imported.request["model"])
    h, f, v, layers = 5120, 13824, 32000, 40
    per_layer = 3 * h * h + 3 * h + h * h + h + 2 * f * h + 2 * f + f * h + h + 4 * h
    assert total_params(arch) == layers * per_layer + 2 * v * h + 4096 * h + 2 * h
    note = next(n for n in imported.notes if n.startswith("model: "))
    assert "normalization LayerNorm (--normalization not given)" in note
    assert "linear_biases on (--disable-bias-linear not given)" in note
    assert "num_kv_heads 40 (--group-query-attention not given)" in note
    assert "num_layers 40 (train.sh:1 --num-layers)" in note
    assert imported.sources["model"].startswith("train.sh (built from its flags")


def test_gpt3_175b_script_with_its_catalog_card_hidden(monkeypatch):
    """Megatron-LM's own GPT-3 175B script (examples/gpt3/train_gpt3_175b_distributed.sh), its GPT-2 tokenizer's
    vocabulary stated: with no catalog card to match, the model Megatron-LM builds counts what the catalog's card
    (GPT-2's layout at 175B) counts."""
    monkeypatch.setattr(model_match, "catalog_keys", lambda: [k for k in api_keys() if k != "gpt3-175b"])
    text = (CONFIGS / "megatron_gpt3_175b.sh").read_text().replace("--num-layers 96", "--num-layers 96 --vocab-size "
                                                                                      "50257")
    arch = resolve_model(_model(text))
    h, layers, v = 12288, 96, 50257
    assert total_params(arch) == layers * (12 * h * h + 13 * h) + v * h + 2048 * h + 2 * h  # tied, learned, biases
    assert total_params(arch) == total_params(resolve_model("gpt3-175b"))  # 174.6B, the paper's 175B


def api_keys() -> list[str]:
    return [m.key for m in api.list_models()]


def test_mixtral_script_with_its_catalog_card_hidden_builds_mixtrals_shape(monkeypatch, tmp_path):
    """Megatron-LM's Mixtral 8x7B script, its Llama2Tokenizer's 32000 tokens stated as the error asks (meshplan
    reads no tokenizer file)."""
    monkeypatch.setattr(model_match, "catalog_keys", lambda: [k for k in api_keys() if k != "mixtral-8x7b"])
    text = (CONFIGS / "megatron_mixtral_8x7b.sh").read_text()
    assert "add --vocab-size N" in " ".join(import_config(text, "mixtral.sh").unresolved)
    path = tmp_path / "mixtral.sh"
    path.write_text(text.replace("--num-layers 32", "--num-layers 32 --vocab-size 32000"))
    imported = import_file(str(path))
    built, catalog = resolve_model(imported.request["model"]), resolve_model("mixtral-8x7b")
    assert built.moe is not None and catalog.moe is not None
    assert (built.moe.num_experts, built.moe.top_k, built.moe.expert_ffn_hidden_size, built.moe.moe_layers) == (
        catalog.moe.num_experts, catalog.moe.top_k, catalog.moe.expert_ffn_hidden_size, catalog.moe.moe_layers)
    assert (built.num_kv_heads, built.head_dim, built.vocab_size) == (8, 128, 32000)
    assert total_params(built) == total_params(catalog)  # the router's expert bias is a buffer, no parameter
    assert describe_model(imported.request["model"]).active_params == describe_model("mixtral-8x7b").active_params
    plans = []  # and it plans as the catalog's Mixtral does
    for name in (imported.request["model"], "mixtral-8x7b"):
        req = Request(model=name, num_gpus=32, tp=1, pp=4, ep=8, gpu="h100")
        plans.append((api.estimate_memory(req).peak_bytes, api.estimate_throughput(req).step_time_s))
    assert plans[0] == plans[1]


def test_megatron_deepspeed_script_builds_what_megatron_deepspeed_builds():
    """Megatron-DeepSpeed's Llama-2 example: RMSNorm, no biases, rotary, 4 KV heads by --num-key-value-heads, and
    its learned position table too (kept unless --no-position-embedding, language_model.py), which this script does
    not turn off; --mlp-type residual (PR-MoE) refused naming the flag."""
    text = (CONFIGS / "mds_pretrain_llama2.sh").read_text().replace("--num-layers $NUM_LAYERS", "--num-layers "
                                                                    "$NUM_LAYERS --vocab-size 32000")
    arch = resolve_model(_model(text))
    h, f, layers, kv, v, seq = 2048, 5504, 24, 4, 32000, 2048  # 32000 a multiple of 128 x tp 2
    per_layer = 2 * h * h + 2 * h * kv * 128 + 3 * h * f + 2 * h
    assert total_params(arch) == layers * per_layer + 2 * v * h + seq * h + h
    assert arch.learned_position_embeddings == seq and arch.rope is not None
    residual = import_config(text.replace("--swiglu", "--swiglu --num-experts 8 --mlp-type residual"), "mds.sh")
    line = next(u for u in residual.unresolved if "not built" in u)
    assert "--mlp-type residual: meshplan builds models with standard only (residual is PR-MoE" in line
    assert "config.json" in line


@pytest.mark.parametrize(("script", "key", "vocab", "buffers"), [
    ("megatron_qwen3_30b_a3b_excerpt.sh", "qwen3-30b-a3b", 151936, 0),
    # MLA, group-limited routing, a shared expert, --moe-layer-freq [0]*3+[1]*58: Megatron-Core keeps the routing
    # bias of --moe-router-enable-expert-bias as a buffer (router.py register_buffer), HF's checkpoint as the
    # parameter e_score_correction_bias, 256 per MoE layer
    ("megatron_deepseek_v3_excerpt.sh", "deepseek-v3", 129280, 58 * 256),
])
def test_catalog_scripts_with_their_cards_hidden_build_the_catalog_model(monkeypatch, script, key, vocab, buffers):
    text = (CONFIGS / script).read_text()
    assert import_config(text, script).request["model"] == key
    monkeypatch.setattr(model_match, "catalog_keys", lambda: [k for k in api_keys() if k != key])
    built = describe_model(_model(text.replace("--num-layers", f"--vocab-size {vocab} --num-layers", 1), script))
    catalog = describe_model(key)
    assert catalog.total_params - built.total_params == buffers
    assert catalog.active_params - built.active_params == buffers
    assert built.architecture.moe.moe_layers == catalog.architecture.moe.moe_layers
    assert built.mtp_params == catalog.mtp_params - buffers // 58 * catalog.architecture.num_mtp_layers


@pytest.mark.parametrize(("extra", "said"), [
    (" --moe-latent-size 512", "--moe-latent-size: the experts' latent projections"),
    (" --position-embedding-type relative", "--position-embedding-type relative: meshplan builds models with"),
    (" --normalization LayerNorm1P", "--normalization LayerNorm1P"),
    (" --qk-layernorm", "--qk-layernorm with --normalization LayerNorm"),
])
def test_a_flag_meshplan_cannot_express_is_named(extra, said):
    imported = import_config(LLAMA2_13B.format(tp=1, extra=extra), "train.sh")
    assert "model" not in imported.request
    line = next(u for u in imported.unresolved if u.startswith("model: not built from the file's flags"))
    assert said in line and "config.json" in line


def test_a_missing_field_is_named_with_what_to_do():
    text = LLAMA2_13B.format(tp=1, extra=LLAMA).replace("--vocab-size 32000 ", "")
    unresolved = import_config(text, "train.sh").unresolved
    line = next(u for u in unresolved if "not built" in u)
    assert "--vocab-size is not given" in line and "add --vocab-size N" in line
    # the near misses of a dense script are dense models first (a 48-layer MoE was named nearest before)
    nearest = next(u for u in unresolved if "nearest: " in u).split("nearest: ")[1].split(" differs")[0]
    assert resolve_model(nearest).moe is None
    text = LLAMA2_13B.format(tp=1, extra=LLAMA).replace("--max-position-embeddings 4096 ", "")
    line = next(u for u in import_config(text, "train.sh").unresolved if "not built" in u)
    assert "--max-position-embeddings is not given: Megatron-Core / Megatron-LM requires it" in line


def test_a_bad_flags_name_is_a_clear_error():
    tiny = ("megatron-core flags: --num-layers 4 --hidden-size 256 --num-attention-heads 4 --vocab-size 1024 "
            "--max-position-embeddings 128")
    with pytest.raises(MeshplanError, match="--hidden-sise is no architecture flag"):
        resolve_model("megatron-core flags: --num-layers 2 --hidden-sise 64")
    with pytest.raises(MeshplanError, match="--num-layers 0 is out of range"):
        resolve_model("megatron-core flags: --num-layers 0 --hidden-size 64 --num-attention-heads 4 "
                      "--vocab-size 128 --max-position-embeddings 64")
    with pytest.raises(MeshplanError, match="--moe-router-num-groups 3 and --moe-router-group-topk 1: the 8 experts"):
        resolve_model(f"{tiny} --num-experts 8 --moe-router-num-groups 3")
    for flag in ("--num-layers", "--normalization", "--rotary-percent --position-embedding-type rope"):
        with pytest.raises(MeshplanError, match=f"{flag.split()[0]} is given without a value"):
            resolve_model(f"{tiny} {flag}")
    with pytest.raises(MeshplanError, match=r"--num-layers 9{37}\.\.\. is not a whole number"):
        resolve_model(f"{tiny} --num-layers {'9' * 5000}")  # past Python's int() digit limit, never a traceback
    with pytest.raises(MeshplanError, match="not a MoE layer pattern meshplan can read"):
        resolve_model(f"{tiny} --num-experts 8 --moe-layer-freq '([1]*65535)*65535'")  # never built in memory
    assert resolve_model(f"{tiny} --swiglu=false") is resolve_model(f"{tiny} --swiglu=false")
    assert not resolve_model(f"{tiny} --swiglu=false").gated_mlp and resolve_model(f"{tiny} --swiglu").gated_mlp
    with pytest.raises(MeshplanError, match="'torchtitan' launch scripts' models are not built"):
        resolve_model("torchtitan flags: --num-layers 2")


def test_every_face_plans_with_it(tmp_path, capsys):
    """check --config, memory, throughput, recommend and render on the CLI, the api and MCP's string model alike."""
    path = tmp_path / "train.sh"
    path.write_text(LLAMA2_13B.format(tp=4, extra=LLAMA))
    imported = import_file(str(path))
    model = imported.request["model"]
    req = api.request_from_config(imported, {"num_gpus": 16})
    assert (req.model, req.tp, req.pp) == (model, 4, 2)
    memory = api.estimate_memory(req)
    assert cli.main(["memory", "--config", str(path), "--num-gpus", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_bytes"] == memory.peak_bytes
    assert cli.main(["check", "--config", str(path), "--num-gpus", "16"]) == 0
    assert "launch script model (40 layers, hidden 5120)" in capsys.readouterr().out
    assert api.estimate_throughput(req).tokens_per_s_per_gpu > 0
    assert api.recommend(req.model_copy(update={"tp": None, "pp": None}), top_k=1).candidates
    rendered = api.render_config("megatron-core", req).text  # the model's own flags, Megatron-LM's norm epsilon
    assert "--num-layers 40" in rendered and "--disable-bias-linear" in rendered and "--norm-epsilon 1e-05" in rendered
    assert "does not know" not in rendered
    assert "Built from a Megatron-Core" in " ".join(api.describe_model(model).assumptions)
    assert "Vocabulary padded to 32256 (multiple of 128*tp)." in memory.assumptions  # at the plan's tp 4


def test_a_launch_scripts_path_is_a_model_read_again_when_it_changes(tmp_path):
    """`model` the path of a launch script (api, so the CLI's --model and MCP's model argument): the model its flags
    state, read from the file on every call."""
    path = tmp_path / "train.sh"
    path.write_text(LLAMA2_13B.format(tp=1, extra=LLAMA))
    assert api.describe_model(str(path)).total_params == 13_015_864_320
    same = api.estimate_memory(Request(model=str(path), num_gpus=16, tp=4, pp=2))
    assert same == api.estimate_memory(Request(model=_model(path.read_text()), num_gpus=16, tp=4, pp=2))
    path.write_text(LLAMA2_13B.format(tp=1, extra=LLAMA).replace("--num-layers 40", "--num-layers 48"))
    assert api.describe_model(str(path)).architecture.num_layers == 48
    path.write_text(LLAMA2_13B.format(tp=1, extra=LLAMA + " --moe-latent-size 512"))
    with pytest.raises(MeshplanError, match=r"the launch script's model is not read.*--moe-latent-size"):
        api.estimate_memory(Request(model=str(path), num_gpus=16))
    seven = LLAMA2_13B.format(tp=1, extra=LLAMA)
    for was, now in (("layers 40", "layers 32"), ("size 5120", "size 4096"), ("size 13824", "size 11008"),
                     ("heads 40", "heads 32")):
        seven = seven.replace(was, now)
    path.write_text(seven)
    assert api.describe_model(str(path)).key == "llama-2-7b"  # a catalog model's flags: the catalog model


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_plans_with_a_scripts_model(tmp_path):
    """MCP's tools take the script's path or its flags as `model` (beside its text as config_text too): one
    answer."""
    from mcp import Client

    from meshplan.faces.mcp.server import app

    text = LLAMA2_13B.format(tp=4, extra=LLAMA)
    path = tmp_path / "train.sh"
    path.write_text(text)
    model = _model(text)
    # the script states no dropout flag, so its run trains at Megatron-LM's 0.1 (read.absent_by_variant): the two
    # asks that take only its model from it say so themselves
    fixed = {"num_gpus": 16, "gpu": "h100", "tp": 4, "pp": 2, "dropout": True}
    async with Client(app) as client:
        answers = [(await client.call_tool("estimate_memory", args)).structured_content for args in (
            {"config_text": text, "model": str(path), "num_gpus": 16, "sequence_parallel": True, "zero_stage": 1},
            {"model": str(path), **fixed}, {"model": model, **fixed})]
        described = (await client.call_tool("describe_model", {"model": str(path)})).structured_content
    assert answers[0]["peak_bytes"] == answers[1]["peak_bytes"] == answers[2]["peak_bytes"]
    assert described["total_params"] == api.describe_model(model).total_params


MLA = " --multi-latent-attention --q-lora-rank 512 --kv-lora-rank 256 --qk-head-dim 128 --qk-pos-emb-head-dim 64"


def test_an_output_gate_beside_mla_is_refused_naming_megatron_cores_refusal(tmp_path):
    """--attention-output-gate beside --multi-latent-attention was dropped without a word (the model built ungated, so
    check said ok and render wrote no gate): Megatron-Core's MLATransformerConfig raises NotImplementedError ('Output
    gate is not supported for MLA yet.', d98e8a6), so the script does not run. Import, check and render say so."""
    path = tmp_path / "train.sh"
    path.write_text(LLAMA2_13B.format(tp=1, extra=LLAMA + MLA + " --attention-output-gate"))
    imported = import_file(str(path))
    assert "model" not in imported.request
    line = next(u for u in imported.unresolved if u.startswith("model: not built from the file's flags"))
    assert "--attention-output-gate with --multi-latent-attention" in line and "Output gate is not supported" in line
    for face in (api.check_config, lambda req: api.render_config("megatron-core", req, force=True)):
        with pytest.raises(MeshplanError, match="Output gate is not supported for MLA yet"):
            face(api.request_from_config(imported, {"num_gpus": 8}))
    assert resolve_model(_model(LLAMA2_13B.format(tp=1, extra=LLAMA + MLA))).mla is not None  # MLA alone: built


def test_a_gpt_scripts_output_gate_is_rendered_and_read_back(tmp_path):
    """A GPT model's --attention-output-gate (no MLA) was built into the model, counted and timed, but render wrote it
    only for a Gated DeltaNet hybrid: the rendered script trained an ungated model. Both renders write it now, and
    import reads the rendered script back as the gated model."""
    req = Request(model=_model(LLAMA2_13B.format(tp=4, extra=LLAMA + " --attention-output-gate")), num_gpus=16,
                  tp=4, pp=2)
    assert resolve_model(req.model).attention_output_gate
    core = api.render_config("megatron-core", req).text
    assert "--attention-output-gate" in core
    assert "cfg.model.attention_output_gate = True" in api.render_config("megatron-bridge", req).text
    path = tmp_path / "rendered.sh"
    # the vocabulary is the tokenizer's, which render leaves to the user
    path.write_text(core.replace("--num-layers", "--vocab-size 32000 --num-layers"))
    assert resolve_model(import_file(str(path)).request["model"]).attention_output_gate
