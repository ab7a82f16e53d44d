"""`meshplan check --config FILE` says what the file states that meshplan cannot express or could not read, the same
lines `meshplan import` prints (ImportedConfig.unsupported and .unresolved), on the CLI and in the MCP check tool's
result. Before: check showed neither, so a verl SFT script with PEFT all-linear on Llama 4 (which fails: its router
is wrapped) checked ok with no word of it."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

from meshplan import api
from meshplan.faces import cli
from meshplan.faces.mcp import tools

SCRIPT = ("torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer "
          "model.path=meta-llama/Llama-4-Scout-17B-16E-Instruct data.train_batch_size=64 model.lora_rank=16 "
          "model.target_modules=all-linear\n")


def test_check_from_a_file_says_what_the_file_states_that_meshplan_cannot_express(tmp_path):
    imported = api.import_config(SCRIPT, path="sft.sh")
    [line] = [u for u in imported.unsupported if "all-linear" in u]
    req = api.request_from_config(imported, {"gpu": "h100", "num_gpus": 64})
    assert api.check_config(req, config=imported).config_unread == imported.unsupported + imported.unresolved
    answer = tools.check_config(config_text=SCRIPT, gpu="h100", num_gpus=64)
    assert [u.split(":1 ", 1)[1] for u in answer.config_unread] == [line.split(":1 ", 1)[1]]
    path = tmp_path / "sft.sh"
    path.write_text(SCRIPT, encoding="utf-8")
    out = io.StringIO()
    with redirect_stdout(out):
        cli.main(["check", "--config", str(path), "--gpu", "h100", "--num-gpus", "64"])
    assert "meshplan cannot express" in out.getvalue() and "Llama4Router" in out.getvalue()


TORCHTITAN = """[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = 1
seq_len = 8192

[parallelism]
data_parallel_shard_degree = -1
"""


def test_a_field_the_file_leaves_unread_is_not_said_once_given_beside_it(tmp_path):
    """torchtitan's TOML states no GPU count: import says 'num_gpus: ... (pass --num-gpus)'; a check run with
    --num-gpus beside the file said it again as what the check does not cover, though it ran at the flag's count."""
    imported = api.import_config(TORCHTITAN, path="llama3_8b.toml")
    assert [u for u in imported.unresolved if u.startswith("num_gpus:")]
    # the line with the request field that settles it, a typed record (it was parsed off the line's front)
    assert [left.fields for left in imported.left_to_request] == [["num_gpus"]]
    assert imported.left_to_request[0].said in imported.unresolved
    kept = api.check_config(api.request_from_config(imported, {"gpu": "h100", "dp": 8}), config=imported)
    assert [u for u in kept.config_unread if u.startswith("num_gpus:")]  # dp given, not num_gpus: still said
    req = api.request_from_config(imported, {"gpu": "h100", "num_gpus": 8})
    assert not [u for u in api.check_config(req, config=imported).config_unread if u.startswith("num_gpus:")]
    answer = tools.check_config(config_text=TORCHTITAN, gpu="h100", num_gpus=8)
    assert answer.ok and not [u for u in answer.config_unread if u.startswith("num_gpus:")]
    path = tmp_path / "llama3_8b.toml"
    path.write_text(TORCHTITAN, encoding="utf-8")
    out = io.StringIO()
    with redirect_stdout(out):
        cli.main(["check", "--config", str(path), "--gpu", "h100", "--num-gpus", "8"])
    assert "the file does not say how many GPUs" not in out.getvalue() and ": ok" in out.getvalue()
