"""The RL actors' loss paths as verl and SkyRL run them (cards/frameworks/verl.yaml and skyrl.yaml engine.rl_loss,
knowledge/engine_card.RlLossPasses): the temperature division, the log-probs kernel and the entropy, timed in the
update (perf.loss_hbm_bytes, beside the Megatron-Core loss an engine calls) and in each no-grad log-prob pass
(perf.log_prob_loss_bytes, rl/step_time.log_prob_loss_seconds), kept at the update's loss peak
(memory_states.rl_loss_bytes); and the entropy coefficient that puts the entropy's gradient in the update, a request
field rendered into and read back from both frameworks' overrides."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import memory_card, with_precision
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import entropy_chunks, head_loss, log_prob_loss_bytes
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.memory import trainer_reports
from meshplan.rl.step_time import log_prob_loss_seconds

UNFUSED = memory_card().megatron_cross_entropy["unfused"]


def job_plan(framework: str, zero_stage: int, **more):
    return resolve(parse_request({"model": "qwen3-8b", "framework": framework, "num_gpus": 8, "job": "rl",
                                  "zero_stage": zero_stage, **more}))


def passes(framework: str, engine: str):
    return framework_card(framework).engine.rl_loss[engine]


def test_verl_megatron_adds_its_division_and_entropy_to_megatrons_unfused_loss():
    card = passes("verl", "megatron")
    job, plan = job_plan("verl", 1)
    assert head_loss(job, plan).update_bytes == UNFUSED.hbm_bytes_per_logit + card.update_hbm_bytes_per_logit == 78
    job, plan = job_plan("verl", 1, entropy_coeff=0.001)
    assert head_loss(job, plan).update_bytes == 52 + 26 + card.entropy_update_hbm_bytes_per_logit == 130
    assert card.entropy_chunk_bytes_per_logit == 0  # verl's entropy runs over the whole logits, unchunked
    # the old policy's pass computes the entropy without grad (calculate_entropy = not is_lora), the reference's not
    assert log_prob_loss_bytes(job, plan, True) == UNFUSED.forward_hbm_bytes_per_logit + 4 + 24 == 66
    assert log_prob_loss_bytes(job, plan, False) == 38 + card.forward_hbm_bytes_per_logit == 42


def test_verl_fsdp_runs_flash_attns_kernels_after_an_in_place_division_on_a_view():
    card = passes("verl", "fsdp")
    job, plan = job_plan("verl", 3)
    assert head_loss(job, plan).update_bytes == card.update_hbm_bytes_per_logit == 26
    entropy = head_loss(*job_plan("verl", 3, entropy_coeff=0.01)).update_bytes
    assert entropy == 26 + card.entropy_update_hbm_bytes_per_logit
    assert log_prob_loss_bytes(job, plan, True) == card.forward_hbm_bytes_per_logit + 6 == 12
    assert log_prob_loss_bytes(job, plan, False) == 6


def test_skyrl_fsdp_divides_out_of_view_and_computes_the_entropy_every_training_step():
    card = passes("skyrl", "fsdp")
    job, plan = job_plan("skyrl", 3)
    assert head_loss(job, plan).update_bytes == card.update_hbm_bytes_per_logit == 14 + 46
    job, plan = job_plan("skyrl", 3, entropy_coeff=0.01, micro_batch_size=4, seq_length=1536,
                         response_length=1024)
    # 4 x 1,536 tokens a micro-batch in chunks of 1,024: 6, each adding a zero-filled whole-logits gradient (8 B)
    assert entropy_chunks(card, 6144, 151936) == 6
    assert head_loss(job, plan).update_bytes == 60 + card.entropy_update_hbm_bytes_per_logit + 8 * 6 == 60 + 74 + 48
    assert log_prob_loss_bytes(job, plan, True) == log_prob_loss_bytes(job, plan, False) == 6


def test_skyrl_megatron_runs_its_own_chunked_log_probs_not_megatrons_loss():
    card = passes("skyrl", "megatron")
    job, plan = job_plan("skyrl", 1)
    assert head_loss(job, plan).update_bytes == card.update_hbm_bytes_per_logit == 114 + 20
    # its entropy chunks as many tokens as 512 MiB holds at 4 bf16 copies of the vocabulary shard: Qwen3-8B's
    # 151,936 padded to 152,064 (128 x tp) over tp 2 gives 882, 512 a chunk (a power of two); 4 x 1,536 tokens: 12
    assert entropy_chunks(card, 6144, 152064 / 2) == 12
    assert entropy_chunks(card, 512, 152064 / 2) == 1
    job, plan = job_plan("skyrl", 1, entropy_coeff=0.01, tp=2, micro_batch_size=4, seq_length=1536,
                         response_length=1024)
    assert head_loss(job, plan).update_bytes == 134 + card.entropy_update_hbm_bytes_per_logit + 8 * 12
    assert log_prob_loss_bytes(job, plan, True) == card.forward_hbm_bytes_per_logit == 38


@pytest.mark.parametrize(("zero_stage", "old", "ref"), [(1, 66, 42), (3, 12, 6)])
def test_a_lora_actors_old_policy_pass_computes_the_entropy_too(zero_stage, old, ref):
    # verl b178a3c fsdp_workers.py and megatron_workers.py compute_log_prob: calculate_entropy = not is_lora, where
    # is_lora is the meta_info flag compute_ref_log_prob sets for a LoRA job's reference pass (the actor with its
    # adapter disabled), not the job's LoRA; the update computes it only at entropy_coeff != 0 (dp_actor.py
    # update_policy, megatron_actor.py update_policy), 0 by default (actor.yaml)
    job, plan = job_plan("verl", zero_stage, lora_rank=8)
    assert job.lora is not None and job.rl.entropy_coeff == 0
    assert log_prob_loss_bytes(job, plan, True) == old and log_prob_loss_bytes(job, plan, False) == ref
    assert head_loss(job, plan).update_bytes == head_loss(*job_plan("verl", zero_stage)).update_bytes


def test_a_training_job_keeps_the_loss_it_had():
    sft = resolve(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "job": "sft",
                                 "zero_stage": 1}))
    assert head_loss(*sft).update_bytes == UNFUSED.hbm_bytes_per_logit
    assert log_prob_loss_bytes(*sft, True) is None


@pytest.mark.parametrize(("framework", "zero_stage", "engine"),
                         [("verl", 1, "megatron"), ("verl", 3, "fsdp"), ("skyrl", 1, "megatron"),
                          ("skyrl", 3, "fsdp")])
def test_the_update_keeps_the_engines_logits_bytes_at_the_loss_peak(framework, zero_stage, engine):
    job, plan = job_plan(framework, zero_stage)
    conv = with_precision(job, plan)[1]
    assert conv.logits_bytes_per_element == passes(framework, engine).logits_bytes_per_element


@pytest.mark.parametrize(("framework", "zero_stage", "engine", "kept"),
                         [("verl", 1, "megatron", 8), ("verl", 3, "fsdp", 2), ("skyrl", 1, "megatron", 2),
                          ("skyrl", 3, "fsdp", 2)])
def test_a_log_prob_pass_keeps_its_own_loss_bytes(framework, zero_stage, engine, kept):
    job, plan = job_plan(framework, zero_stage)
    update, forward = trainer_reports(job, plan)
    card = passes(framework, engine)
    assert card.log_prob_logits_bytes_per_element == kept
    pass_job = job.model_copy(update={"rl": job.rl.model_copy(update={"log_prob_pass": True})})
    assert with_precision(pass_job, plan)[1].logits_bytes_per_element == kept
    # the forward report's logits against the update's: their bytes per logit apart, over the same logits
    last_update, last_forward = update.stages[-1].detail, forward.stages[-1].detail
    ratio = last_forward["logits_and_loss"] / last_update["logits_and_loss"]
    assert ratio < 1 if kept < card.logits_bytes_per_element else ratio == pytest.approx(1.0, abs=0.01)


def test_each_log_prob_pass_takes_its_own_forward_less_a_third_of_the_update():
    job, plan = job_plan("verl", 1, algorithm="ppo")
    hbm = job.gpu.hbm_bandwidth * calibration(job.framework).hbm_efficiency
    head = head_loss(job, plan)
    assert head.update_bytes == 78
    per_byte = head.logits * 0.5 / hbm
    old, ref, critic = log_prob_loss_seconds(job, plan, head, 0.5)
    assert old == pytest.approx((66 - 26) * per_byte)
    assert ref == pytest.approx((42 - 26) * per_byte)
    assert critic == pytest.approx(-26 * per_byte)  # the critic's value head reads no vocabulary
    step = api.estimate_throughput(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8,
                                                  "job": "rl", "zero_stage": 1}))
    more = api.estimate_throughput(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8,
                                                  "job": "rl", "zero_stage": 1, "entropy_coeff": 0.01}))
    assert more.rl.update_s > step.rl.update_s and more.rl.log_prob_s == pytest.approx(step.rl.log_prob_s)


def test_the_head_ranks_logits_are_the_trainers_batch_over_its_data_and_context_ranks():
    # a separate rollout pool takes its GPUs out of num_gpus (rl/job._pools): 20 - 4 leaves the trainer 16, dp 8 at
    # tp 2, the dp the world-size rules hold (WS001, WS003: verl derives it as world / (tp x pp x cp))
    job, plan = job_plan("verl", 1, num_gpus=20, placement="separate", rollout_gpus=4, tp=2)
    assert (job.num_gpus, plan.dp, plan.cp) == (16, 8, 1)
    vocab = 152064  # Qwen3-8B's 151,936 padded to 128 x tp, split over the 2 TP ranks
    assert head_loss(job, plan).logits == job.global_batch_size * job.seq_length / 8 * vocab / 2


@pytest.mark.parametrize(("framework", "zero_stage", "keys"), [
    ("verl", 1, ["actor_rollout_ref.actor.entropy_coeff=0.002"]),
    ("verl", 3, ["actor_rollout_ref.actor.entropy_coeff=0.002"]),
    ("skyrl", 1, ["trainer.algorithm.use_entropy_loss=true", "trainer.algorithm.entropy_loss_coef=0.002"]),
    ("skyrl", 3, ["trainer.algorithm.use_entropy_loss=true", "trainer.algorithm.entropy_loss_coef=0.002"]),
])
def test_the_entropy_coefficient_is_rendered_and_read_back(framework, zero_stage, keys):
    req = parse_request({"model": "qwen3-8b", "framework": framework, "num_gpus": 8, "job": "rl",
                         "zero_stage": zero_stage, "entropy_coeff": 0.002})
    text = api.render_config(framework, req, force=True).text
    assert all(key in text for key in keys)
    assert api.import_config(text, path="run.sh", framework=framework).request["entropy_coeff"] == 0.002
    plain = api.render_config(framework, parse_request({**req.model_dump(exclude_unset=True), "entropy_coeff": 0}),
                              force=True).text
    assert "entropy" not in plain  # each framework's default, off, left to it


def test_skyrls_entropy_switch_reads_as_the_coefficient_it_runs():
    base = "python -m skyrl.train.entrypoints.main_base trainer.strategy=fsdp2 trainer.policy.model.path=Qwen/Qwen3-8B"
    on = api.import_config(f"{base} trainer.algorithm.use_entropy_loss=true\n", path="run.sh", framework="skyrl")
    assert on.request["entropy_coeff"] == 0.01  # entropy_loss_coef left out: SkyRL's AlgorithmConfig default
    off = api.import_config(f"{base} trainer.algorithm.use_entropy_loss=false "
                            "trainer.algorithm.entropy_loss_coef=0.5\n", path="run.sh", framework="skyrl")
    assert off.request["entropy_coeff"] == 0.0


def test_a_negative_coefficient_or_one_on_a_training_job_is_refused():
    with pytest.raises(MeshplanError, match="entropy_coeff"):
        parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "job": "rl", "entropy_coeff": -1})
    with pytest.raises(MeshplanError, match="entropy_coeff"):
        api.estimate_throughput(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8,
                                               "job": "sft", "entropy_coeff": 0.01}))
