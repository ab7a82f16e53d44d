"""The multi-token-prediction depth read back from a config as the request's training knob (mtp_num_layers,
mtp_use_repeated_layer), not as a model field compared with the catalog: Megatron-Bridge's Nemotron 3 Super recipes
train the checkpoint's one MTP block at two depths (--mtp-num-layers 2 --mtp-use-repeated-layer), which is the catalog
Super trained deeper, not another model. Megatron-LM trains no MTP block where the script leaves --mtp-num-layers out
(transformer_config.py mtp_num_layers None). Each test here fails before the readers took the depth as a knob: the
Megatron-Core script matched no catalog model, Megatron-Bridge's keys were set aside as the model's architecture and
its repeated layer was "no meshplan field", and a hybrid without an MTP block was refused as an unknown model."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

SUPER = "nemotron-3-super-120b-a12b"
WORLD = {"model": SUPER, "num_gpus": 64}  # what a Bridge python snippet leaves to its recipe and launch


def _imported(framework: str, text: str, path: str):
    return api.import_config(text, path=path, framework=framework)


@pytest.mark.parametrize(("framework", "variant"), [("megatron-core", None), ("megatron-bridge", None),
                                                    ("megatron-bridge", "run_recipe")])
def test_a_rendered_mtp_depth_imports_as_the_request_it_was_rendered_from(framework, variant):
    request = Request(framework=framework, model=SUPER, num_gpus=64, pp=2, ep=8, global_batch_size=256,
                      mtp_num_layers=2, mtp_use_repeated_layer=True)
    rendered = api.render_config(framework, request, force=True, **({"variant": variant} if variant else {}))
    imported = _imported(framework, rendered.text, "run.py" if rendered.format == "python" else "run.sh")
    back = api.request_from_config(imported, WORLD)
    assert (back.model, back.mtp_num_layers, back.mtp_use_repeated_layer) == (SUPER, 2, True)
    job, _ = resolve(back)
    assert (job.model.num_mtp_layers, job.model.mtp_repeated_layer, job.mtp_asked) == (2, True, True)


def test_a_megatron_lm_script_without_the_depth_trains_no_mtp_block():
    request = Request(framework="megatron-core", model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1,
                      global_batch_size=4096)
    text = api.render_config("megatron-core", request, force=True).text
    assert "  --mtp-num-layers 1 \\\n" in text
    imported = _imported("megatron-core", text.replace("  --mtp-num-layers 1 \\\n", ""), "run.sh")
    assert (imported.request["model"], imported.request["mtp_num_layers"]) == ("deepseek-v3", 0)
    job, _ = resolve(api.request_from_config(imported, {}))
    assert job.model.num_mtp_layers == 0


def test_a_depth_on_a_hybrid_without_an_mtp_block_is_refused_as_the_request_refuses_it():
    request = Request(framework="megatron-core", model="nemotron-h-8b", num_gpus=8, tp=2, global_batch_size=64)
    text = api.render_config("megatron-core", request, force=True).text
    text = text.replace("  --hidden-size", "  --mtp-num-layers 1 \\\n  --hidden-size", 1)
    imported = _imported("megatron-core", text, "run.sh")
    assert (imported.request["model"], imported.request["mtp_num_layers"]) == ("nemotron-h-8b", 1)
    with pytest.raises(MeshplanError, match=r"without an MTP block pattern.*mtp_num_layers=1 has no block to train"):
        api.check_config(api.request_from_config(imported, {}), config=imported)


def test_a_refused_depth_read_from_a_file_names_the_files_line():
    """The depth's refusals (request/mtp_depth.py) named the fields but not where the file set them; a value read from
    a file is refused with its line (MeshplanError.fields, api.request_from_config), on the api and the CLI alike.
    Before, 'mtp_use_repeated_layer applies one MTP block at every depth, and Llama-3.1-8B trains none' alone."""
    text = ("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096 \\\n"
            "  --micro-batch-size 1 --global-batch-size 64 --bf16 \\\n  --mtp-use-repeated-layer\n")
    imported = _imported("megatron-core", text, "train.sh")
    with pytest.raises(MeshplanError, match=r"trains none .*read from the file: mtp_use_repeated_layer at "
                                            r"train\.sh:3 --mtp-use-repeated-layer; mtp_num_layers at train\.sh \("):
        api.request_from_config(imported, {"model": "llama-3.1-8b"})
    given = api.request_from_config(imported, {"model": "llama-3.1-8b", "mtp_use_repeated_layer": False})
    assert given.mtp_use_repeated_layer is False  # a field given beside the file overrides it: nothing refused


def test_the_cli_cites_the_line_too(tmp_path, capsys):
    from meshplan.faces import cli

    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
                      "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 --mtp-use-repeated-layer\n")
    assert cli.main(["memory", "--config", str(script), "--model", "llama-3.1-8b"]) == 2
    assert f"mtp_use_repeated_layer at {script}:1 --mtp-use-repeated-layer" in capsys.readouterr().err


@pytest.mark.parametrize("depth, repeated", [(2, True), (0, False)])
def test_skyrls_megatron_strategy_writes_the_depth_and_reads_it_back(depth, repeated):
    """SkyRL 0.4.0's Megatron worker builds its provider with AutoBridge (the checkpoint's depth) and then sets every
    transformer_config_kwargs entry on it before finalize (megatron_worker.py), so the depth is
    transformer_config_kwargs.mtp_num_layers / mtp_use_repeated_layer. Before, a depth was refused ('meshplan writes
    no multi-token-prediction depth for SkyRL')."""
    request = Request(framework="skyrl", model="deepseek-v3", num_gpus=256, tp=2, pp=8, ep=16, zero_stage=1,
                      job="rl", mtp_num_layers=depth, mtp_use_repeated_layer=repeated)
    rendered = api.render_config("skyrl", request, force=True)
    written = "null" if depth == 0 else str(depth)
    assert f"trainer.policy.megatron_config.transformer_config_kwargs.mtp_num_layers={written} " in rendered.text
    back = _imported("skyrl", rendered.text, rendered.filename)
    assert (back.request["mtp_num_layers"], back.request["mtp_use_repeated_layer"]) == (depth, repeated)


def test_a_null_depth_reads_as_no_mtp_block_not_as_the_frameworks_default():
    """Megatron-Core's mtp_num_layers None builds no MTP block; Megatron-Bridge writes depth 0 as
    model.mtp_num_layers=null, which import read as 'the framework's default' (the checkpoint's depth)."""
    request = Request(framework="megatron-bridge", model="deepseek-v3", num_gpus=256, tp=2, pp=8, ep=16,
                      mtp_num_layers=0)
    rendered = api.render_config("megatron-bridge", request, force=True, variant="run_recipe")
    assert "model.mtp_num_layers=null" in rendered.text
    assert _imported("megatron-bridge", rendered.text, rendered.filename).request["mtp_num_layers"] == 0


def test_skyrls_fsdp_strategy_refuses_a_depth_with_where_to_set_one():
    request = Request(framework="skyrl", model="deepseek-v3", num_gpus=256, zero_stage=3, job="rl",
                      mtp_num_layers=1)
    with pytest.raises(MeshplanError, match=r"SkyRL's FSDP strategy .* no MTP depth key.*strategy=megatron"):
        api.estimate_memory(request)


def test_verls_refusal_names_its_real_mtp_keys_and_where_a_depth_can_be_set():
    """verl's MtpConfig (actor_rollout_ref.model.mtp.enable / enable_train) switches the checkpoint's own blocks on, on
    the Megatron engine only, and has no depth: the refusal says so and names the frameworks that set a depth. Before,
    'its actor_rollout_ref.model.mtp section is not rendered ... (the model's own MTP blocks)', which named no key and
    no limit."""
    request = Request(framework="verl", model="deepseek-v3", num_gpus=256, tp=2, pp=8, ep=16, zero_stage=1, job="rl",
                      mtp_num_layers=2)
    with pytest.raises(MeshplanError) as refused:
        api.estimate_memory(request)
    fix = refused.value.fix
    assert "actor_rollout_ref.model.mtp.enable and enable_train" in fix and "Megatron engine only" in fix
    assert "transformer_config_kwargs.mtp_num_layers" in fix


def test_a_script_without_the_depth_states_the_flag_it_read_as_absent():
    """Megatron-LM's --mtp-num-layers defaults to None, no MTP block (transformer_config.py; the card's
    read.absent_why): depth 0 is read from the flag's absence, and the source names that flag. Before,
    '(not given: Megatron-LM's default)', which named no flag."""
    text = ("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096 "
            "--micro-batch-size 1 --global-batch-size 64\n")
    imported = _imported("megatron-core", text, "train.sh")
    assert imported.request["mtp_num_layers"] == 0
    assert imported.sources["mtp_num_layers"] == "train.sh (no --mtp-num-layers: Megatron-LM's default)"
    assert imported.sources["sequence_parallel"] == "train.sh (no --sequence-parallel: Megatron-LM's default)"
