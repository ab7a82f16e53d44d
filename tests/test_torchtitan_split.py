"""A torchtitan file's pipeline split read as torchtitan makes it (distributed/pipeline_parallel.py, 0.2.2 and 0.3:
generate_llm_fqn_per_model_part counts the embedding and the output as first_less and last_less layers, 1 each by
default, shares the effective layers evenly over the stages, the first ones taking the remainder), with or without
pipeline_parallel_layers_per_stage; a split with a stage of no decoder layer (torchtitan accepts one: stage 0 holds
only tok_embeddings) is named on every face, never a traceback and never estimated as an even split."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp_calls import call_tool

from meshplan import api
from meshplan.adapters.read.files import torchtitan_stage_layers
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main

BASE = (Path(__file__).parent / "configs" / "torchtitan_llama3_8b.toml").read_text(encoding="utf-8")  # 32 layers


def _toml(parallelism: str) -> str:
    return BASE.replace("pipeline_parallel_degree = 1", parallelism)


def test_the_split_is_torchtitans():
    """generate_llm_fqn_per_model_part's docstring example (3 layers, 2 stages, weights 2 and 2): [emb, l0, l1],
    [l2, norm, output]; 32 layers over 4 stages with the default weights: 34 effective, 9 9 8 8, so 8 9 8 7."""
    assert torchtitan_stage_layers(3, 2, None, 2, 2) == [2, 1]
    assert torchtitan_stage_layers(32, 4, None, 1, 1) == [8, 9, 8, 7]
    assert torchtitan_stage_layers(32, 2, 33, 33, 1) == [0, 32]  # torchtitan accepts it: stage 0 holds the embedding
    assert "stages over pp=4" in torchtitan_stage_layers(32, 4, 8, 1, 1)  # ceil(34 / 8) = 5 stages
    assert "refuses" in torchtitan_stage_layers(32, 4, None, 12, 1)  # 45 effective: 12 above the 11 of a stage


def test_without_layers_per_stage_the_default_split_is_read():
    """pp=4 and no layers_per_stage: torchtitan's 8 9 8 7, not an even 8 8 8 8."""
    got = api.import_config(_toml("pipeline_parallel_degree = 4"), path="t.toml", framework="torchtitan")
    assert got.request["first_stage_layers"] == 8 and got.request["last_stage_layers"] == 7
    assert "default split" in got.sources["first_stage_layers"]
    over = api.import_config(_toml("pipeline_parallel_degree = 4\npipeline_parallel_first_stage_less_layers = 3"),
                             path="t.toml", framework="torchtitan")  # 36 effective: 9 9 9 9, so 6 9 9 8
    assert over.request["first_stage_layers"] == 6 and over.request["last_stage_layers"] == 8


@pytest.mark.parametrize(("extra", "said"), [
    ("pipeline_parallel_layers_per_stage = 8", "5 stages over pp=2, which torchtitan refuses with a single-stage "
                                               "schedule (exactly 1 stage per rank): layers_per_stage 17 gives one"),
    ("pipeline_parallel_first_stage_less_layers = 40", "torchtitan refuses it: first_less 40")])
def test_a_split_torchtitan_refuses_is_said_where_check_lists_what_it_could_not_read(extra, said):
    """A single-stage schedule (1F1B, the file's) with layers_per_stage giving 5 stages over pp=2: torchtitan's
    pipeline_parallel.py raises ('Single stage schedule requires exactly 1 stage per rank'; pp must divide the
    stages). The reader only noted '5 stages over pp=2; the split is not read', so check answered ok with nothing
    said beside it; now the line is among the file's unresolved ones (config_unread), with what torchtitan takes."""
    got = api.import_config(_toml(f"pipeline_parallel_degree = 2\n{extra}"), path="t.toml", framework="torchtitan")
    assert any(said in line for line in got.unresolved), got.unresolved
    assert not any(said in line for line in got.notes)


ZERO = _toml("pipeline_parallel_degree = 2\npipeline_parallel_layers_per_stage = 33\n"
             "pipeline_parallel_first_stage_less_layers = 33")  # 66 effective: 33 33, so 0 32


def test_import_names_the_empty_stage_and_reads_the_rest():
    got = api.import_config(ZERO, path="t.toml", framework="torchtitan")
    assert got.request["pp"] == 2 and "first_stage_layers" not in got.request
    assert any("stage 0 of 2 holds no decoder layer" in line for line in got.unresolved)


def test_check_refuses_it_on_every_face_unless_the_split_is_given(tmp_path, capsys):
    path = tmp_path / "zero.toml"
    path.write_text(ZERO, encoding="utf-8")
    with pytest.raises(MeshplanError, match="stage 0 of 2 holds no decoder layer") as err:
        api.request_from_config(api.import_file(str(path)), {"num_gpus": 16})
    assert "--first-stage-layers" in err.value.fix
    args = ["check", "--config", str(path), "--num-gpus", "16", "--global-batch-size", "32"]
    assert main(args) == 2
    out = capsys.readouterr()
    assert "stage 0 of 2 holds no decoder layer" in out.err and "Traceback" not in out.err + out.out
    main([*args, "--first-stage-layers", "1"])
    assert "TP1 PP2 DP8" in capsys.readouterr().out
    result = call_tool("check_config", {"config_text": ZERO, "num_gpus": 16, "global_batch_size": 32})
    assert result.is_error and "stage 0 of 2 holds no decoder layer" in result.content[0].text


def test_the_cuda_graphs_key_render_writes_at_pp_is_read_and_said():
    """render writes --training.disable_cuda_graphs for torchtitan 0.3 at pp>1 (its _validate_cuda_graphs raises
    otherwise); import called it 'no meshplan field'. It is said now: what it does to the step (zero_grad frees the
    gradients, trainer.py train_step) and where meshplan's memory frees them."""
    from meshplan.schema.request import Request

    text = api.render_config("torchtitan", Request(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4)).text
    assert "--training.disable_cuda_graphs" in text
    got = api.import_config(text, path="run_torchtitan.sh", framework="torchtitan")
    assert not any("disable_cuda_graphs" in u for u in got.unsupported), got.unsupported
    (said,) = [n for n in got.notes if "disable_cuda_graphs" in n]
    assert "zero_grad(set_to_none=True) frees the gradients" in said and "frees them on the layouts" in said


def test_with_cuda_graphs_off_the_gradients_are_freed_before_the_step():
    """torchtitan 0.3 runs train_step's zero_grad(set_to_none=disable_cuda_graphs): by default (CUDA graphs on) the
    sharded gradients are zeroed in place and stay allocated; at pp>1 or ep>1, where render writes
    --training.disable_cuda_graphs (_validate_cuda_graphs), they are freed before the next forward. The estimate held
    them at every layout (allocated 43.27 GiB on TP8 PP4 DP2, 64 H100); at pp>1 they now leave the allocated peak
    (39.04 GiB, the fit's figure under expandable segments) and stay reserved (freed_grads_stay_reserved: the same
    46.04 GiB), and at pp=1 they are held as before."""
    from meshplan.schema.request import Request

    def walk(report):
        (said,) = [a for a in report.assumptions if a.startswith("FSDP2 step peak walked")]
        return said

    at_pp = api.estimate_memory(Request(model="llama-3.1-70b", framework="torchtitan", gpu="h100", num_gpus=64,
                                        tp=8, pp=4))
    assert 38.9 * 2**30 < at_pp.fit_bytes < 39.2 * 2**30  # was 43.27 GiB
    assert 46.0 * 2**30 < at_pp.peak_bytes < 46.1 * 2**30  # reserved: the same
    assert "sets the gradients to None each step" in walk(at_pp)
    flat = api.estimate_memory(Request(model="llama-3.1-70b", framework="torchtitan", gpu="h100", num_gpus=64, tp=8))
    assert "zeroed in place, not freed" in walk(flat)
