"""rollout_ep > 1 on a dense model (issue 23): verl and SkyRL turn on vLLM's expert parallelism for it, and vLLM refuses
it on a model without experts when the engine starts (rule RL007). It used to be ranked and labelled "EP2"; now every
face refuses it with the rule's finding, and an SGLang engine, which the rule does not cover, is never labelled EP."""

import pytest
from mcp_calls import call_tool

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main
from meshplan.request.resolve import resolve
from meshplan.rl.engine import engine_memory
from meshplan.schema.request import Request

DENSE = dict(model="qwen3-8b", framework="verl", gpu="h100", num_gpus=8, job="rl", algorithm="grpo", rollout_tp=2,
             rollout_ep=2)


def test_the_python_api_refuses_it():
    with pytest.raises(MeshplanError, match="RL007: rollout_ep=2 on Qwen3-8B, which has no experts") as err:
        api.recommend(Request(**DENSE), top_k=1)
    assert "rollout_ep=1" in err.value.fix
    assert "RL007" in {f.id for f in api.check_config(Request(**DENSE)).findings}
    assert "RL007" not in {f.id for f in api.check_config(Request(**{**DENSE, "rollout_ep": 1})).findings}


def test_the_cli_refuses_it(capsys):
    args = ["recommend", "qwen3-8b", "--framework", "verl", "--job", "rl", "--algorithm", "grpo", "--gpu", "h100",
            "--num-gpus", "8", "--rollout-tp", "2", "--rollout-ep", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "RL007" in err and "Traceback" not in err


def test_the_mcp_tool_refuses_it():
    result = call_tool("recommend_parallelism", DENSE)
    assert result.is_error and "RL007" in result.content[0].text


def test_an_sglang_engine_on_a_dense_model_is_not_labelled_ep():
    job, plan = resolve(Request(**{**DENSE, "rollout_engine": "sglang"}))
    assert plan.rollout_ep == 2
    note = engine_memory(job, plan, job.gpu.memory_bytes).note
    assert "rollout TP2)" in note and "EP2" not in note


def test_the_cli_table_names_no_ep_for_a_dense_model(capsys):
    """SGLang (no source says it refuses EP on a dense model, so RL007 leaves it) is ranked, and the table's rollout
    cell and the answer's words name its TP and DP only; a MoE model's keep their EP."""
    base = ["recommend", "--framework", "verl", "--job", "rl", "--algorithm", "grpo", "--gpu", "h100", "--num-gpus",
            "8", "--top-k", "1"]
    assert main([*base, "qwen3-8b", "--rollout-engine", "sglang", "--rollout-tp", "2", "--rollout-ep", "2"]) == 0
    out = capsys.readouterr().out
    assert "TP2 DP1 " in out and "EP2" not in out
    assert main([*base, "qwen3-30b-a3b"]) == 0
    assert " EP" in capsys.readouterr().out
