"""mean_prompt_length: the prompts' mean below prompt_length (the maximum verl and SkyRL pad and filter to; verl logs
prompt_length/mean): the rollout prefills and caches the mean, the log-prob passes and the update cost it, memory
plans for prompt_length (meshplan/rl/step_time.py); a mean over the maximum is refused on every face."""

from __future__ import annotations

import pytest
from mcp_calls import call_tools

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.step_time import flops_share

# verl's one-step-off DAPO script on DAPO-Math-17k, whose prompts are far under the 2,048 it allows
DAPO = {"model": "qwen2.5-7b", "gpu": "h20", "framework": "verl", "num_gpus": 16, "tp": 2, "pp": 2, "job": "rl",
        "algorithm": "dapo", "prompts_per_step": 512, "samples_per_prompt": 16, "prompt_length": 2048,
        "response_length": 8192, "rollout_tp": 2, "rollout_memory_fraction": 0.8, "micro_batch_size": 1}


def step(fields: dict, **more):
    return api.estimate_throughput(parse_request({**fields, **more}))


def test_a_mean_at_the_maximum_is_every_prompt_at_the_maximum():
    assert step(DAPO, mean_prompt_length=2048).rl == step(DAPO).rl
    assert step(DAPO, mean_prompt_length=2048, mean_response_length=3000).rl == step(
        DAPO, mean_response_length=3000).rl


@pytest.mark.parametrize("mean_response", [None, 3000])
def test_shorter_prompts_cost_less_everywhere_but_memory(mean_response):
    more = {"mean_response_length": mean_response} if mean_response else {}
    full, short = step(DAPO, **more).rl, step(DAPO, mean_prompt_length=256, **more).rl
    # the prefill is the prompts' forward FLOPs: tokens x FLOPs per token, both shorter
    assert short.prefill_s < full.prefill_s * 256 / 2048
    # the KV cache holds more sequences of a shorter prompt (up to max_num_seqs), each decode step reads less context
    assert short.decode_s < full.decode_s and short.sequences_at_once >= full.sequences_at_once
    if mean_response is None:  # every response at the longest: the KV cache, not max_num_seqs, caps the batch
        assert short.sequences_at_once > full.sequences_at_once and short.decode_waves < full.decode_waves
    assert short.log_prob_s < full.log_prob_s and short.update_s < full.update_s
    job, _ = resolve(parse_request({**DAPO, "mean_prompt_length": 256, **more}))
    assert job.rl.token_share == pytest.approx((256 + (mean_response or 8192)) / (2048 + 8192))
    assert flops_share(job) < job.rl.token_share
    assert job.seq_length == 2048 + 8192  # memory plans for the longest prompt
    assert (api.estimate_memory(parse_request({**DAPO, "mean_prompt_length": 256, **more})).peak_bytes
            == api.estimate_memory(parse_request({**DAPO, **more})).peak_bytes)


def test_the_rl_note_says_the_prompts_mean():
    note = step(DAPO, mean_prompt_length=256).assumptions[0]
    assert "prompts of mean 256 of at most 2,048 tokens" in note and " of 8,192 steps" in note
    assert "prompts of mean" not in step(DAPO).assumptions[0]


ERROR = "mean_prompt_length 3000 is over prompt_length 2048"


def test_a_mean_over_the_maximum_is_refused_by_the_api():
    with pytest.raises(MeshplanError, match=ERROR) as exc:
        step(DAPO, mean_prompt_length=3000)
    assert "from 1 to 2048" in str(exc.value)
    with pytest.raises(MeshplanError, match="mean_prompt_length is an RL field, not for job=sft") as exc:
        resolve(parse_request({"model": "qwen3-8b", "num_gpus": 8, "framework": "verl", "job": "sft",
                               "mean_prompt_length": 100}))
    assert exc.value.fix.startswith("Drop it, or pass job=rl")  # one field: 'it' (was 'them')
    with pytest.raises(MeshplanError, match="algorithm, mean_prompt_length are RL fields") as exc:
        resolve(parse_request({"model": "qwen3-8b", "num_gpus": 8, "framework": "verl", "job": "sft",
                               "algorithm": "ppo", "mean_prompt_length": 100}))
    assert exc.value.fix.startswith("Drop them, or pass job=rl")


def test_a_mean_over_the_maximum_is_refused_by_the_cli(capsys):
    code = cli.main(["throughput", "--model", "qwen2.5-7b", "--gpu", "h20", "--framework", "verl", "--num-gpus", "16",
                     "--job", "rl", "--prompt-length", "2048", "--mean-prompt-length", "3000"])
    err = capsys.readouterr().err
    assert code != 0 and ERROR in err and "from 1 to 2048" in err and "Traceback" not in err
    code = cli.main(["throughput", "--model", "qwen2.5-7b", "--framework", "verl", "--num-gpus", "16",
                     "--job", "rl", "--mean-prompt-length", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "mean_prompt_length" in err and "greater than or equal to 1" in err


def test_a_mean_over_the_maximum_is_refused_by_the_mcp_tools():
    over, ok = call_tools(("estimate_throughput", {**DAPO, "mean_prompt_length": 3000}),
                          ("estimate_throughput", {**DAPO, "mean_prompt_length": 256}))
    assert over.is_error and ERROR in over.content[0].text and "from 1 to 2048" in over.content[0].text
    assert not ok.is_error
    assert ok.structured_content["rl"] == step(DAPO, mean_prompt_length=256).rl.model_dump(mode="json")
