"""prompts_per_mini_batch: the RL update split into optimizer steps (verl actor.ppo_mini_batch_size, SkyRL
trainer.policy_mini_batch_size), each paying its pipeline fill and drain, gradient sync, optimizer step and in-step
offload (meshplan/rl/step_time.py mini_batch_update, at_tokens), and update_epochs, every mini-batch again per pass
(verl actor.ppo_epochs, SkyRL update_epochs_per_batch); rendered into both frameworks' keys, checked by SkyRL's own
batch law (SK001), and a mini-batch over the step refused on every face."""

from __future__ import annotations

import pytest
from mcp_calls import call_tools

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import estimate_throughput
from meshplan.faces import cli
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.step_time import at_tokens

# verl's one-step-off DAPO colocated script: 512 prompts x 16 in mini-batches of 32 (16 optimizer steps), pp 2
DAPO = {"model": "qwen2.5-7b", "gpu": "h20", "framework": "verl", "num_gpus": 16, "tp": 2, "pp": 2, "job": "rl",
        "algorithm": "dapo", "prompts_per_step": 512, "samples_per_prompt": 16, "prompt_length": 2048,
        "response_length": 8192, "rollout_tp": 2, "rollout_memory_fraction": 0.8, "micro_batch_size": 1,
        "param_offload": True, "optimizer_offload": True}
SKYRL = {"model": "qwen3-8b", "framework": "skyrl", "num_gpus": 8, "job": "rl", "prompts_per_step": 64,
         "samples_per_prompt": 5, "response_length": 1024, "micro_batch_size": 2}


def step(fields: dict, **more):
    return api.estimate_throughput(parse_request({**fields, **more}))


def test_each_mini_batch_pays_its_pipeline_flush_sync_and_optimizer_step():
    whole, split = step(DAPO).rl, step(DAPO, prompts_per_mini_batch=32).rl
    job, plan = resolve(parse_request({**DAPO, "prompts_per_mini_batch": 32}))
    assert job.rl.optimizer_steps == 16
    mini = estimate_throughput(job.model_copy(update={"global_batch_size": 32 * 16}), plan)
    b = mini.breakdown
    assert b.bubble_s > 0 and b.dp_comm_s > 0  # pp 2 and dp 4: a fill and drain and a gradient sync per step
    assert split.update_s == pytest.approx(at_tokens(mini, 1.0, 1.0, 16.0))
    assert split.update_s > whole.update_s
    assert split.update_s - whole.update_s == pytest.approx(
        15 * (b.bubble_s + b.dp_comm_s + b.other_s + b.offload_s), rel=0.05)
    assert split.update_mfu < whole.update_mfu  # the same FLOPs over more seconds
    # the rollout and the log-prob passes run the whole batch: unchanged
    assert (split.generation_s, split.log_prob_s) == (whole.generation_s, whole.log_prob_s)


def test_a_mini_batch_of_the_whole_step_is_one_optimizer_step():
    assert step(DAPO, prompts_per_mini_batch=512).rl == step(DAPO).rl


def test_a_last_smaller_mini_batch_is_a_whole_optimizer_step_of_its_share_of_the_tokens():
    job, plan = resolve(parse_request({**DAPO, "prompts_per_mini_batch": 200}))
    assert job.rl.optimizer_steps == 3  # 200 + 200 + 112 prompts
    mini = estimate_throughput(job.model_copy(update={"global_batch_size": 200 * 16}), plan)
    assert step(DAPO, prompts_per_mini_batch=200).rl.update_s == pytest.approx(at_tokens(mini, 1.0, 1.0, 512 / 200))


def test_each_update_epoch_runs_every_mini_batch_again():
    one, three = step(DAPO, prompts_per_mini_batch=32), step(DAPO, prompts_per_mini_batch=32, update_epochs=3)
    assert three.rl.update_s == pytest.approx(3 * one.rl.update_s)
    assert three.rl.update_mfu == pytest.approx(one.rl.update_mfu)  # verl counts ppo_epochs x the batch's FLOPs
    assert three.model_flops_per_step == pytest.approx(3 * one.model_flops_per_step)
    assert (three.rl.generation_s, three.rl.log_prob_s) == (one.rl.generation_s, one.rl.log_prob_s)
    job, _ = resolve(parse_request({**DAPO, "prompts_per_mini_batch": 32, "update_epochs": 3}))
    assert job.rl.optimizer_steps == 48
    assert step(DAPO, update_epochs=1).rl == step(DAPO).rl


def test_the_mini_batch_is_rendered_into_verl_and_skyrl_keys():
    text = api.render_config("verl", parse_request({**DAPO, "prompts_per_mini_batch": 32}), force=True).text
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=32" in text and "data.train_batch_size=512" in text
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=512" in api.render_config(
        "verl", parse_request(DAPO), force=True).text
    text = api.render_config("skyrl", parse_request({**SKYRL, "prompts_per_mini_batch": 16}), force=True).text
    assert "trainer.policy_mini_batch_size=16" in text and "trainer.train_batch_size=64" in text
    assert "update_epochs_per_batch" not in text
    assert "trainer.update_epochs_per_batch=2" in api.render_config(
        "skyrl", parse_request({**SKYRL, "update_epochs": 2}), force=True).text
    assert "actor_rollout_ref.actor.ppo_epochs=2" in api.render_config(
        "verl", parse_request({**DAPO, "update_epochs": 2}), force=True).text


def test_skyrl_divides_one_mini_batch_over_its_data_parallel_ranks():
    # 64 x 5 = 320 sequences over dp 8: 40 a GPU, whole micro-batches of 2; a mini-batch of 3 prompts: 15 // 8 = 1
    assert not [f for f in api.check_config(parse_request(SKYRL)).findings if f.id == "SK001"]
    found = [f for f in api.check_config(parse_request({**SKYRL, "prompts_per_mini_batch": 3})).findings
             if f.id == "SK001"]
    assert found and "prompts_per_mini_batch x samples_per_prompt=15" in found[0].message


def test_verl_steps_each_ranks_share_of_a_mini_batch_in_whole_micro_batches():
    # verl's FSDP workers: 10 prompts x 3 = 30 sequences over 8 ranks, 3 each, not whole micro-batches of 4;
    # 12 prompts give 36, 4 each (fsdp_workers.py asserts both)
    fsdp = {"model": "llama-3.1-8b", "framework": "verl", "num_gpus": 8, "job": "rl", "prompts_per_step": 64,
            "samples_per_prompt": 3, "zero_stage": 3, "micro_batch_size": 4}
    found = [f for f in api.check_config(parse_request({**fsdp, "prompts_per_mini_batch": 10})).findings
             if f.id == "VL004"]
    assert found and "gives 3 per rank" in found[0].message and "micro_batch_size=4" in found[0].message
    assert "prompts_per_mini_batch = 11," in found[0].fix  # 33 sequences, 4 a rank; none fewer fits
    assert not [f for f in api.check_config(parse_request({**fsdp, "prompts_per_mini_batch": 12})).findings
                if f.id == "VL004"]


@pytest.mark.parametrize("layout", [{"zero_stage": 3}, {"zero_stage": 1, "tp": 2, "micro_batch_size": 2}])
def test_vl001_judges_the_step_not_the_mini_batch_the_update_is_estimated_at(layout):
    """verl's validate_config checks train_batch_size x rollout.n, the step (verl/utils/config.py real_train_batch_size
    % minimal_bsz). The update's estimate runs at one mini-batch's sequences (rl/step_time.mini_batch_update), and VL001
    read that job's batch: 3 prompts x 8 = 24 over 16 GPUs refused throughput and recommend with 'global_batch_size=24
    (data.train_batch_size * rollout.n)' and 'Use prompts_per_step = 2 or 4', under the mini-batch of 3, where check
    passed the step's 128; and memory, whose update job holds its micro-batches x dp, passed a step that check and
    throughput refused. Now every face judges the step; a step that fails is named with a fix that passes."""
    ask = {"model": "qwen3-8b", "framework": "verl", "num_gpus": 16, "job": "rl", "samples_per_prompt": 8,
           "prompts_per_step": 16, "prompts_per_mini_batch": 3, **layout}
    req = parse_request(ask)
    assert "VL001" not in {f.id for f in api.check_config(req).findings}
    assert api.estimate_throughput(req).step_time_s > 0
    assert api.estimate_memory(req).peak_bytes > 0
    bad = parse_request({**ask, "prompts_per_step": 15})  # 120 sequences, not a multiple of 16
    found = [f for f in api.check_config(bad).findings if f.id == "VL001"]
    assert len(found) == 1 and found[0].message.startswith("global_batch_size=120 (data.train_batch_size * rollout.n)")
    for face in (api.estimate_throughput, api.estimate_memory):  # memory's update job held dp x micro-batches: ok
        with pytest.raises(MeshplanError, match=r"VL001: global_batch_size=120 "):
            face(bad)
    fixed = int(found[0].fix.removeprefix("Use prompts_per_step = ").split()[0])
    assert fixed >= 3 and "VL001" not in {f.id for f in api.check_config(parse_request(
        {**ask, "prompts_per_step": fixed})).findings}


ERROR = "prompts_per_mini_batch 600 is over prompts_per_step 512"


def test_a_mini_batch_over_the_step_is_refused_by_the_api():
    with pytest.raises(MeshplanError, match=ERROR) as exc:
        step(DAPO, prompts_per_mini_batch=600)
    assert "from 1 to 512" in str(exc.value)
    with pytest.raises(MeshplanError, match="prompts_per_mini_batch is an RL field, not for job=sft"):
        resolve(parse_request({"model": "qwen3-8b", "num_gpus": 8, "framework": "verl", "job": "sft",
                               "prompts_per_mini_batch": 4}))


def test_a_mini_batch_over_the_step_is_refused_by_the_cli(capsys):
    code = cli.main(["throughput", "--model", "qwen2.5-7b", "--gpu", "h20", "--framework", "verl", "--num-gpus", "16",
                     "--job", "rl", "--prompts-per-step", "512", "--prompts-per-mini-batch", "600"])
    err = capsys.readouterr().err
    assert code != 0 and ERROR in err and "from 1 to 512" in err and "Traceback" not in err
    code = cli.main(["throughput", "--model", "qwen2.5-7b", "--framework", "verl", "--num-gpus", "16",
                     "--job", "rl", "--prompts-per-mini-batch", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "prompts_per_mini_batch" in err and "greater than or equal to 1" in err


def test_a_mini_batch_over_the_step_is_refused_by_the_mcp_tools():
    over, ok = call_tools(("estimate_throughput", {**DAPO, "prompts_per_mini_batch": 600}),
                          ("estimate_throughput", {**DAPO, "prompts_per_mini_batch": 32}))
    assert over.is_error and ERROR in over.content[0].text and "from 1 to 512" in over.content[0].text
    assert not ok.is_error
    assert ok.structured_content["rl"] == step(DAPO, prompts_per_mini_batch=32).rl.model_dump(mode="json")


# a pipeline deeper than one rank's mini-batch: 16 prompts x 2 in mini-batches of 4 prompts on dp 4 = 2 sequences a
# rank per optimizer step, 8 a rank in the whole step, pp 4
SHALLOW = {"model": "qwen2.5-7b", "gpu": "h100", "framework": "verl", "num_gpus": 16, "tp": 1, "pp": 4, "job": "rl",
           "algorithm": "dapo", "prompts_per_step": 16, "prompts_per_mini_batch": 4, "samples_per_prompt": 2,
           "prompt_length": 1024, "response_length": 3072, "micro_batch_size": 1}


def update_stages(fields: dict) -> list:
    """The actor update's stages of an RL memory report (its stage table)."""
    return api.estimate_memory(parse_request(fields)).stages


def test_a_stage_holds_one_mini_batch_s_micro_batches_not_the_step_s():
    """verl steps the optimizer after each mini-batch (forward_backward_batch per mini-batch, num_microbatches its
    micro-batches): the 1F1B pipeline flushes there, so stage r holds min(mini-batch micro-batches, pp - r)."""
    from meshplan.rl.memory import update_micro_batches

    job, plan = resolve(parse_request(SHALLOW))
    assert update_micro_batches(job, plan) == 4 * 2 // 4 == 2
    held = [s.detail["microbatches_in_flight"] for s in update_stages(SHALLOW)]
    assert held == [2, 2, 2, 1]  # min(2, pp - r); the whole step's 8 a rank would fill the pipeline: 4, 3, 2, 1
    whole = [s.detail["microbatches_in_flight"] for s in update_stages({**SHALLOW, "prompts_per_mini_batch": 16})]
    assert whole == [4, 3, 2, 1]
    assert update_stages(SHALLOW)[0].activations_bytes < update_stages({**SHALLOW, "prompts_per_mini_batch": 16})[
        0].activations_bytes
    said = api.estimate_memory(parse_request(SHALLOW)).assumptions
    assert any("one mini-batch at a time" in a and "min(2, pp - r)" in a for a in said)


def test_packed_micro_batches_bound_the_pipeline_at_the_stated_lengths():
    """Under verl's use_dynamic_bsz the mini-batch's micro-batch count is its packing's (ceil(tokens / budget), the
    MAX over DP): at short mean lengths a rank's mini-batch packs into fewer micro-batches than stages."""
    from meshplan.rl.memory import update_micro_batches
    from meshplan.rl.packing import packed_micro_batch_count

    fields = {**SHALLOW, "prompts_per_mini_batch": 16, "mean_response_length": 500, "mean_prompt_length": 200}
    job, plan = resolve(parse_request(fields))
    count = update_micro_batches(job, plan)
    assert count == packed_micro_batch_count(4096, 8, 1024, 3072, 200, 500, 4)
    assert 1 <= count < 4  # 8 sequences of ~700 tokens in 4,096-token micro-batches
    held = [s.detail["microbatches_in_flight"] for s in update_stages(fields)]
    assert held == [min(count, 4 - r) for r in range(4)]


def test_the_packed_count_is_the_token_count_over_the_budget():
    """packed_micro_batch_count: every sequence at its maximum packs budget // sequence of them per micro-batch
    (ceil(50 x 10,240 / 30,720) = 17); at stated means the count is the tokens over the budget, never below it."""
    from meshplan.rl.packing import packed_micro_batch_count

    assert packed_micro_batch_count(3 * 10240, 50, 2048, 8192, 2048, 8192) == 17
    count = packed_micro_batch_count(10240, 256, 2048, 8192, 300, 2000)
    assert 256 * 2300 / 10240 * 0.8 < count < 256 * 2300 / 10240 * 1.25
