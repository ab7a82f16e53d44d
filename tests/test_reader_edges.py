"""Launch-script values torchrun and Megatron-LM take that meshplan misread (issue 23), on the CLI and MCP faces:
torchrun's `--nproc_per_node gpu` refused the whole script; `--hidden-dropout nan` was read as dropout off."""

import pytest
from mcp import Client

from meshplan.faces.cli import main
from meshplan.faces.mcp.server import app

SCRIPT = ("torchrun --nproc_per_node {nproc} --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 2 "
          "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --attention-dropout 0.0 "
          "--hidden-dropout {dropout}\n")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_the_cli_reads_nproc_gpu_and_refuses_a_nan_dropout(tmp_path, capsys):
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT.format(nproc="gpu", dropout="0.0"))
    assert main(["check", "--config", str(path), "--model", "llama-3.1-8b", "--num-gpus", "8", "--json"]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err
    path.write_text(SCRIPT.format(nproc="8", dropout="nan"))
    assert main(["check", "--config", str(path), "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert "--hidden-dropout: 'nan' is not a dropout probability" in err and "Traceback" not in err


@pytest.mark.anyio
async def test_the_mcp_tools_read_nproc_gpu_and_refuse_a_nan_dropout():
    async with Client(app) as client:
        ok = await client.call_tool("check_config", {"config_text": SCRIPT.format(nproc="gpu", dropout="0.0"),
                                                     "config_format": "shell", "model": "llama-3.1-8b",
                                                     "num_gpus": 8})
        bad = await client.call_tool("check_config", {"config_text": SCRIPT.format(nproc="8", dropout="nan"),
                                                      "config_format": "shell", "model": "llama-3.1-8b"})
    assert not ok.is_error and ok.structured_content["plan"]["tp"] == 2
    assert bad.is_error and "is not a dropout probability" in bad.content[0].text


def _uneven_renders():
    """(framework, variant, version) of every target that renders an uneven pipeline split."""
    from meshplan.adapters.render import BUILDERS
    from meshplan.knowledge.adapter_knobs import adapter_section
    from meshplan.knowledge.cards import framework_card

    out = []
    for framework in sorted(BUILDERS):
        section = adapter_section(framework_card(framework))
        out += [(framework, variant, version) for variant in section.variants for version in section.versions]
    return out


SUFFIX = {"python": "py", "shell": "sh", "yaml": "yaml", "toml": "toml", "json": "json", "hydra": "sh"}


@pytest.mark.parametrize(("framework", "variant", "version"), _uneven_renders())
def test_a_rendered_uneven_split_imports_back(framework, variant, version):
    """`meshplan render` then `meshplan import` of the output keeps first/last stage layers, for every framework,
    variant and release that renders them (NeMo AutoModel's module_fqns_per_model_part was left unread, torchtitan's
    layers_per_stage with first/last_stage_less_layers only noted); the others refuse to render them."""
    from meshplan import api
    from meshplan.adapters.read import import_config
    from meshplan.adapters.render import render
    from meshplan.core.errors import MeshplanError
    from meshplan.request.resolve import resolve
    from meshplan.schema.request import Request

    fields = dict(model="llama-3.1-405b", num_gpus=1024, tp=8, pp=16, global_batch_size=2560)
    if variant == "rl":
        fields.update(job="rl", algorithm="grpo")
    if variant in ("fsdp", "sft-fsdp"):  # the FSDP variants shard fully, without TP
        fields.update(zero_stage=3, tp=1, num_gpus=128)
    job, plan = resolve(Request(framework=framework, **fields, first_stage_layers=7, last_stage_layers=7))
    try:
        result = render(framework, job, plan, variant=variant, version=version)
    except MeshplanError as exc:  # a target that cannot write the split says so
        assert any(word in str(exc) for word in ("first_stage_layers", "uneven", "pipeline", "pp=")), exc
        return
    imported = import_config(result.text, f"job.{SUFFIX[result.format]}")
    back = api.request_from_config(imported, {"model": "llama-3.1-405b", "num_gpus": fields["num_gpus"]})
    assert (back.pp, back.first_stage_layers, back.last_stage_layers) == (16, 7, 7), imported.unresolved
    if variant == "sft":  # SkyRL's main_sft keys (SFTConfig) were not read at all; its batch counts sequences
        assert (back.job, back.tp, back.global_batch_size) == ("sft", 8, 2560)
