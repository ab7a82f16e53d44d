"""`meshplan compare`: each framework's log reader on real log excerpts (tests/logs/, sources in SOURCES.txt), the
comparison's arithmetic and band, its faces (CLI, api, MCP), and --calibrate's user file: stored only when asked,
then applied and stated by every face, and nothing changes without it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from meshplan import api
from meshplan.adapters.logs import READERS, detect_log, read_log, read_log_file
from meshplan.arithmetic.memory_states import memory_card
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.estimate.memory import stage_allocated
from meshplan.faces import cli
from meshplan.request.parse import parse_request

LOGS = Path(__file__).resolve().parent / "logs"
CONFIGS = Path(__file__).resolve().parent / "configs"
MIB = 1 << 20
TITAN = {"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100-sxm", "framework": "torchtitan"}


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- readers, one per framework


def test_megatron_memory_report_and_iteration_lines():
    run = read_log_file(str(LOGS / "megatron_mixtral_8x7b_h100.log"))
    assert run.framework == "megatron-core" and run.steps == 2
    assert run.peak_allocated_bytes == int(54250.98583984375 * MIB)  # max allocated, MiB
    assert run.peak_reserved_bytes == int(61480.0 * MIB)
    assert run.step_time_s == pytest.approx(5.4106)  # iteration 3 (iteration 2, the first logged, is warm-up)
    assert run.tflops_per_gpu == pytest.approx(241.4) and run.global_batch_size == 128


def test_megatron_deepspeed_timer_and_iteration_lines():
    run = read_log_file(str(LOGS / "megatron_deepspeed_alcf_polaris.log"))
    assert run.framework == "deepspeed"
    assert run.peak_allocated_bytes == int(19.52 * GIB)  # ThroughputTimer's MaxMemAllocated
    assert run.step_time_s == pytest.approx(14.5414) and run.tokens_per_s_per_gpu == pytest.approx(1126.713)
    assert run.samples_per_s == pytest.approx(52.815) and run.global_batch_size == 768


def test_deepspeed_see_memory_usage():
    run = read_log_file(str(LOGS / "deepspeed_cpu_checkpointing.log"))
    assert run.framework == "deepspeed" and run.steps == 0
    assert run.peak_allocated_bytes == int(5.55 * GIB) and run.peak_reserved_bytes == 6 * GIB
    assert any("rounds to whole GiB" in n for n in run.notes)


@pytest.mark.parametrize(("name", "reserved", "tps", "mfu"), [
    ("torchtitan_dcp_zoc.log", 49.66, 5864, 0.3434),  # median of steps 210-250 (step 200 is the first logged)
    ("torchtitan_moe_gate_fp32.log", 66.91, 10007, 0.1393),  # each rank logs step 4: counted once
])
def test_torchtitan_metrics_lines(name, reserved, tps, mfu):
    run = read_log_file(str(LOGS / name))
    assert run.framework == "torchtitan"
    assert run.peak_reserved_bytes == int(reserved * GIB) and run.peak_allocated_bytes is None
    assert run.tokens_per_s_per_gpu == tps and run.mfu == pytest.approx(mfu) and run.step_time_s is None


def test_torchtitan_coloured_line():
    text = "\x1b[31mstep:  7  \x1b[32mloss:  2.1000  \x1b[33mmemory: 10.00GiB(12.50%)  \x1b[34mtps: 1,234  " \
           "\x1b[36mtflops: 100.00  \x1b[35mmfu: 10.00%\x1b[39m"
    run = read_log(text)
    assert run.tokens_per_s_per_gpu == 1234 and run.peak_reserved_bytes == 10 * GIB and run.mfu == pytest.approx(0.1)


def test_verl_metrics_line_wrapped_in_a_paste():
    run = read_log_file(str(LOGS / "verl_gh200_sglang.log"))
    assert run.framework == "verl"
    assert run.peak_allocated_bytes == int(25.921 * GIB) and run.peak_reserved_bytes == int(61.611 * GIB)
    assert run.step_time_s == pytest.approx(96.551)  # on the wrapped second line of the record
    assert run.mfu is None  # its perf/mfu/actor 1.018 is over verl's peak for the name, not the GPU's


def test_a_logged_mfu_over_one_is_left_out_with_verl_s_reason():
    """verl's perf/mfu/actor is a fraction: its FLOP count over the peak its table gives the device's name
    (verl/utils/flops_counter.py get_device_flops); before verl 0.4.0 a GH200's name matched H20's 148 TFLOPS, so
    issue 1208's GH200 run logged 1.018. Before: compare showed it as 101.8% of the GPU's peak beside the prediction
    and judged it inside the band. Now it is left out, with its line and verl's reason, and the figure says why."""
    from meshplan.adapters.logs.verl import MFU_OVER_ONE

    run = read_log_file(str(LOGS / "verl_gh200_sglang.log"))
    assert run.mfu is None and "mfu" not in run.sources
    assert MFU_OVER_ONE in run.notes and any("mfu = 1.018 is over the GPU's peak" in n for n in run.notes)
    req = {"model": "qwen2.5-7b", "num_gpus": 8, "gpu": "h100", "framework": "verl", "job": "rl",
           "prompt_length": 256, "response_length": 1024}
    logged = next(f for f in api.compare_run(parse_request(req), log("verl_gh200_sglang.log")).figures
                  if f.figure == "logged_mfu")
    assert logged.measured is None and logged.error is None and "over 1" in logged.missing
    assert read_log("step:2 - perf/mfu/actor:0.43 - timing_s/step:9.0", framework="verl").mfu == pytest.approx(0.43)
    titan = "step:  7  loss:  2.1000  memory: 10.00GiB(12.50%)  tps: 1,234  tflops: 100.00  mfu: 104.00%"
    assert read_log(titan).mfu is None  # torchtitan's percent, over 100


def test_verl_numpy_values_and_actor_prefix():
    text = ("step:3 - actor/perf/max_memory_allocated_gb:np.float64(20.5) - timing_s/step:np.float64(12.0) - "
            "perf/throughput:np.float64(900.0)")
    run = read_log(text, framework="verl")
    assert run.peak_allocated_bytes == int(20.5 * GIB) and run.step_time_s == 12.0
    assert run.tokens_per_s_per_gpu == 900.0


def test_an_rl_log_is_compared_with_an_rl_prediction_only():
    """`meshplan compare qwen2.5-7b --framework verl --log verl.log` with no RL field compared verl's RL step (rollout,
    log-probs, update: 96.6 s) with a pretraining step's prediction (4.2M tokens, 42.5 s) and judged every figure
    outside the band. A verl or SkyRL RL log is an RL job's: the comparison refuses a training job's prediction,
    naming the fields to give and the lengths the log states; with job=rl it compares."""
    run = read_log_file(str(LOGS / "verl_gh200_sglang.log"))
    assert run.rl_fields == {"prompt_length": 256, "response_length": 1024, "mean_response_length": 325,
                             "mean_prompt_length": 103}
    req = {"model": "qwen2.5-7b", "num_gpus": 8, "gpu": "h100", "framework": "verl"}
    with pytest.raises(MeshplanError, match="RL") as refused:
        api.compare_run(parse_request(req), log("verl_gh200_sglang.log"))
    for field in ("job=rl", "prompts_per_step", "samples_per_prompt", "prompt_length=256", "response_length=1024",
                  "mean_response_length=325", "mean_prompt_length=103"):
        assert field in refused.value.fix
    rl = api.compare_run(parse_request({**req, "job": "rl", "prompt_length": 256, "response_length": 1024}),
                         log("verl_gh200_sglang.log"))
    logged = next(f for f in rl.figures if f.figure == "logged_mfu")
    assert logged.label == "MFU as the framework logs it (actor update)"
    skyrl = read_log("Step 3:\n{'timing/step': '286.05', 'timing/generate': '27.65'}\n", framework="skyrl")
    assert skyrl.rl_fields == {}
    assert read_log("Step 4: loss=1.2, grad_norm=0.3, tokens_per_second=9000.0", framework="skyrl").rl_fields is None
    assert read_log_file(str(LOGS / "torchtitan_dcp_zoc.log")).rl_fields is None


def test_verl_sft_trainer_log_is_a_training_jobs():
    """verl.trainer.sft_trainer (0.9.1) logs perf/max_memory_* and train/mfu per step. Its MFU was not read (compare
    showed MFU '-'); read as a step, it must not count as an RL step, or compare refuses the SFT job it measured."""
    text = ("step:1 - train/loss:1.234 - perf/max_memory_allocated_gb:30.512 - perf/max_memory_reserved_gb:36.25 - "
            "train/mfu:0.412 - train/global_tokens:262144\n"
            "step:2 - train/loss:1.101 - perf/max_memory_allocated_gb:30.61 - perf/max_memory_reserved_gb:36.25 - "
            "train/mfu:0.425 - train/global_tokens:262144\n")
    run = read_log(text)
    assert run.framework == "verl" and run.rl_fields is None and run.mfu == pytest.approx(0.425)
    assert not any("RL step" in n for n in run.notes)
    req = {"model": "llama-3.1-8b", "num_gpus": 16, "gpu": "h100", "framework": "verl", "job": "sft",
           "zero_stage": 3, "cp": 2, "micro_batch_size": 2, "global_batch_size": 64}
    got = api.compare_run(parse_request(req), text)
    assert next(f for f in got.figures if f.figure == "logged_mfu").measured == pytest.approx(0.425)


def test_kempnerforge_metrics_line():
    run = read_log_file(str(LOGS / "kempnerforge_first_run.log"))
    assert run.framework == "kempnerforge"
    assert run.tokens_per_s == 42000 and run.tokens_per_s_per_gpu is None  # the whole job's tokens/s
    assert run.step_time_s == pytest.approx(0.15) and run.mfu == pytest.approx(0.182)
    assert run.peak_allocated_bytes == int(2.1 * GIB)


def test_skyrl_console_tracker_and_sft_lines():
    # SkyRL's formats (skyrl/train/utils/tracking.py ConsoleLogger: floats as '%.4f' strings in a pprint'ed dict;
    # skyrl/train/sft_trainer.py's per-step line); no public SkyRL log with these lines was found (SOURCES.txt).
    rl = "Step 1: \n{'timing/step': '290.1000',\n 'trainer/tokens_per_second_per_gpu': '700.0000'}\n" \
         "Step 2: \n{'timing/step': '286.0500',\n 'trainer/tokens_per_second_per_gpu': '720.0000'}\n"
    run = read_log(rl)
    assert run.framework == "skyrl" and run.step_time_s == pytest.approx(286.05)
    assert run.tokens_per_s_per_gpu == 720 and run.peak_allocated_bytes is None
    sft = read_log("Step 4: loss=0.2099, grad_norm=1.10, tokens_per_second=51234\n", framework="skyrl")
    assert sft.tokens_per_s == 51234


def test_detection_and_errors():
    assert detect_log(log("megatron_deepspeed_alcf_polaris.log")) == "deepspeed"
    assert detect_log(log("megatron_mixtral_8x7b_h100.log")) == "megatron-core"
    with pytest.raises(MeshplanError, match="empty"):
        read_log("  \n")
    with pytest.raises(MeshplanError, match="no training-log line"):
        read_log("hello world\n")
    with pytest.raises(MeshplanError, match="looks like a torchtitan log"):
        read_log(log("torchtitan_dcp_zoc.log"), framework="megatron-core")
    with pytest.raises(MeshplanError, match="no log reader for nanotron"):
        read_log(log("torchtitan_dcp_zoc.log"), framework="nanotron")


def test_a_negative_or_infinite_figure_is_left_out_with_its_line_not_compared():
    """'elapsed time per iteration (ms): -5.0' was compared as a measured step of -0.005 s (error -905,399%), and a
    memory report of 1e400 MiB raised OverflowError: a logged time, rate or peak is finite and not negative."""
    steps = ("iteration 2/10 | elapsed time per iteration (ms): 5000.0 |\n"
             "iteration 3/10 | elapsed time per iteration (ms): -5.0 |\n"
             "iteration 4/10 | elapsed time per iteration (ms): 1e400 |\n"
             "iteration 5/10 | elapsed time per iteration (ms): 7000.0 |\n")
    run = read_log(steps, "run.log")
    assert run.step_time_s == pytest.approx(7.0)  # steps 3 and 4 left out, step 2 the warm-up
    assert any(n.startswith("run.log:2: step_time_s = -0.005 is not a measurement") for n in run.notes)
    assert any(n.startswith("run.log:3: step_time_s = inf is not a measurement") for n in run.notes)
    memory = ("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1e400 | max allocated: 1e400 | reserved: 2048"
              " | max reserved: 2048\n")
    run = read_log(memory, "run.log")
    assert run.peak_allocated_bytes is None and run.peak_reserved_bytes == 2048 * 2**20
    assert any(n.startswith("run.log:1: allocated_bytes = inf is not a measurement") for n in run.notes)
    run = read_log("iteration 2/10 | elapsed time per iteration (ms): 5000.0 | global batch size: 1e400 |\n", "b.log")
    assert run.global_batch_size is None and run.step_time_s == 5.0
    assert read_log("iteration 2/10 | global batch size: 2.5 | elapsed time per iteration (ms): 5000.0 |\n",
                    "b.log").global_batch_size is None  # was read as 2


def test_a_zero_time_rate_or_batch_is_left_out_not_shown_as_measured(tmp_path, capsys):
    """A logged step time of 0 ms was shown as measured (0) while the tokens/s and MFU derived from it read it as
    absent ('the log lacks a step time'), and a global batch of 0 was 'the log's' tokens per step in one note while
    the rates took the request's: a step takes time and runs sequences, so a zero is no measurement."""
    run = read_log("iteration 2/10 | elapsed time per iteration (ms): 5000.0 |\n"
                   "iteration 3/10 | elapsed time per iteration (ms): 0.0 | throughput per GPU (TFLOP/s/GPU): 0.0 | "
                   "global batch size: 0 |\n", "run.log")
    assert run.step_time_s is None and run.tflops_per_gpu is None and run.global_batch_size is None
    for attr in ("step_time_s = 0", "tflops_per_gpu = 0", "global_batch_size = 0"):
        assert any(n.startswith(f"run.log:2: {attr} is not a measurement") for n in run.notes), attr


# --------------------------------------------------------------------------- the comparison


def test_comparison_arithmetic_and_band():
    req = parse_request(TITAN)
    result = api.compare_run(req, log("torchtitan_dcp_zoc.log"), log_path="titan.log")
    memory = api.estimate_memory(req)
    throughput = api.estimate_throughput(req)
    figures = {f.figure: f for f in result.figures}
    stage = memory.stages[memory.peak_stage]
    context = memory_card().cuda_context_bytes
    reserved = figures["peak_reserved"]
    assert reserved.predicted == pytest.approx((stage.total_bytes - context) / GIB)
    assert reserved.measured == pytest.approx(int(49.66 * GIB) / GIB)
    assert reserved.error == pytest.approx(reserved.predicted / reserved.measured - 1)
    assert reserved.band == memory.error_band.median_error
    assert reserved.inside == (abs(reserved.error) <= reserved.band)
    assert figures["peak_allocated"].measured is None and figures["peak_allocated"].error is None
    assert figures["peak_allocated"].predicted == pytest.approx(
        (max(stage_allocated(s) for s in memory.stages) - context) / GIB)
    job_tokens = throughput.tokens_per_s * throughput.step_time_s  # tokens per step of the request
    step = figures["step_time"]
    assert step.measured == pytest.approx(job_tokens / (5864 * 8), rel=1e-6)  # derived from torchtitan's tps
    assert step.band == throughput.error_band.median_error
    assert figures["logged_mfu"].measured == pytest.approx(0.3434) and figures["logged_mfu"].predicted == throughput.mfu
    assert result.calibration is None and result.stored is None
    assert "step time" in result.summary


LLAMA_8B_ON_8 = {"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100-sxm", "framework": "megatron-core",
                 "global_batch_size": 128, "seq_length": 4096}


def megatron_iterations(logged: str = "") -> str:
    """Three of Megatron-LM's iteration lines of LLAMA_8B_ON_8 at 9 s a step, with `logged` figures before the batch."""
    line = ("iteration {i}/ 100 | consumed samples: 256 | elapsed time per iteration (ms): 9000.0 | "
            + logged + "global batch size: 128 | lm loss: 2.0E+00 |\n")
    return "".join(line.format(i=i) for i in (2, 3, 4))


def test_the_measured_mfu_is_the_logged_rate_through_the_estimate_s_own_flops_and_peak(tmp_path, capsys):
    """compare showed no MFU of the run where the framework logs none (Megatron-LM's iteration lines: MFU '-'), and
    where it logs one, its own FLOP count beside meshplan's. Now the run's MFU is its measured rate through the
    estimate's model FLOPs per token and the GPU's peak (ThroughputReport.mfu_at), on every face, with its basis; the
    framework's own is a figure of its own (logged_mfu)."""
    from meshplan.faces.mcp.server import app
    from meshplan.knowledge.hardware import get_gpu

    req = parse_request(LLAMA_8B_ON_8)
    throughput = api.estimate_throughput(req)
    text = megatron_iterations()
    figures = {f.figure: f for f in api.compare_run(req, text).figures}
    mfu = figures["mfu"]
    peak = get_gpu("h100-sxm").bf16_flops
    assert mfu.measured == pytest.approx(throughput.model_flops_per_step / (9.0 * 8 * peak))
    assert mfu.predicted == throughput.mfu and mfu.missing is None and "model FLOPs per token" in mfu.basis
    assert figures["logged_mfu"].measured is None  # Megatron-LM logs no MFU of its own
    result = anyio.run(lambda: app.call_tool("compare_run", {**LLAMA_8B_ON_8, "log_text": text}))
    structured = result.structured_content if hasattr(result, "structured_content") else result[1]
    sent = next(f for f in structured["figures"] if f["figure"] == "mfu")
    assert sent["measured"] == pytest.approx(mfu.measured) and sent["basis"] == mfu.basis
    (tmp_path / "run.log").write_text(text, encoding="utf-8")
    assert cli.main(["compare", "llama-3.1-8b", "--num-gpus", "8", "--gpu", "h100-sxm", "--global-batch-size", "128",
                     "--log", str(tmp_path / "run.log")]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("MFU (meshplan's model FLOPs)"))
    assert f"{mfu.predicted:.1%}" in row and f"{mfu.measured:.1%}" in row


def test_a_log_without_a_rate_or_an_rl_log_says_what_the_measured_mfu_lacks(capsys, tmp_path):
    """Where the log states no step time, tokens/s or samples/s, or is an RL run's (whose predicted MFU is the actor
    update's, not the whole step's), the measured MFU is no number: `missing` says what the log lacks, and the CLI
    prints it."""
    memory_only = "[Rank 0] (after 10 iterations) memory (MB) | allocated: 30000.0 | max allocated: 40000.0 | " \
                  "reserved: 42000.0 | max reserved: 45000.0\n"
    req = parse_request({"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100-sxm", "framework": "megatron-core"})
    mfu = next(f for f in api.compare_run(req, memory_only).figures if f.figure == "mfu")
    assert mfu.measured is None and "step time, tokens/s or samples/s" in mfu.missing
    (tmp_path / "run.log").write_text(memory_only, encoding="utf-8")
    assert cli.main(["compare", "llama-3.1-8b", "--num-gpus", "8", "--gpu", "h100-sxm", "--log",
                     str(tmp_path / "run.log")]) == 0
    assert "not measured, the log lacks a step time" in " ".join(capsys.readouterr().out.split())
    req = parse_request({"model": "qwen2.5-7b", "num_gpus": 8, "gpu": "h100", "framework": "verl", "job": "rl",
                         "prompt_length": 256, "response_length": 1024})
    text = log("verl_gh200_sglang.log").replace("timing_s/update_actor", "timing_s/update_other")
    mfu = next(f for f in api.compare_run(req, text).figures if f.figure == "mfu")
    assert mfu.measured is None and "actor update's own time (verl's timing_s/update_actor" in mfu.missing


def test_an_rl_run_s_mfu_is_its_actor_update_s_flops_over_the_logged_update_time():
    """An RL job's predicted MFU is the actor update's (RLStepTime.update_mfu, over one actor update's seconds); verl
    logs that update's own time (timing_s/update_actor: 14.302 s in verl_gh200_sglang.log), so the run's MFU is the
    same FLOPs over it. Before: no measured MFU for an RL log (the whole step's rate is not the update's)."""
    from meshplan.request.resolve import resolve
    from meshplan.rl.step_time import actor_update_seconds

    fields = {"model": "qwen2.5-7b", "num_gpus": 8, "gpu": "h100", "framework": "verl", "job": "rl",
              "prompt_length": 256, "response_length": 1024}
    assert read_log_file(str(LOGS / "verl_gh200_sglang.log")).actor_update_s == pytest.approx(14.302)
    result = api.compare_run(parse_request(fields), log("verl_gh200_sglang.log"))
    mfu = next(f for f in result.figures if f.figure == "mfu")
    rl = api.estimate_throughput(parse_request(fields)).rl
    job, _ = resolve(parse_request(fields))
    assert actor_update_seconds(job, rl) == pytest.approx(rl.update_s)  # GRPO: the actor alone is trained
    assert mfu.predicted == rl.update_mfu and mfu.missing is None
    assert mfu.measured == pytest.approx(rl.update_mfu * rl.update_s / 14.302)
    ppo = {**fields, "algorithm": "ppo"}
    job, _ = resolve(parse_request(ppo))
    rl = api.estimate_throughput(parse_request(ppo)).rl
    assert actor_update_seconds(job, rl) == pytest.approx(rl.update_s / 2)  # the critic's update beside the actor's


# Two RL steps of a SkyRL run as it prints them (SkyRL a956457): the timer's lines (skyrl/train/utils/utils.py:43,
# `Finished: '{message}', time cost: {s:.2f}s`, policy_train's inside its step's) and the console tracker's dict
# (skyrl/train/utils/tracking.py:186-197: `Step {step}: ` then pprint.pformat of the payload, floats as '%.4f'
# strings), whose timing/ keys are the trainer's timers (skyrl/train/trainer.py:527; policy_train at 1569, inside
# train_critic_and_policy at 450), each line behind loguru's default prefix.
TIMER_AT, TRACKER_AT = "skyrl.train.trainer:train_critic_and_policy:1569", "skyrl.train.utils.tracking:log:189"


def _skyrl_step(step: int, at: str, update: float, seconds: float, generate: float) -> list[str]:
    """One step's lines: the policy_train and step timers, then the tracker's header (its trailing space is
    `f"Step {step}: \\n..."`'s) and the payload dict as pprint wraps it (keys sorted, one a line)."""
    return [
        f"2026-11-30 {at} | INFO     | {TIMER_AT} - Finished: 'policy_train', time cost: {update:.2f}s",
        f"2026-11-30 {at} | INFO     | skyrl.train.trainer:train:342 - Finished: 'step', time cost: {seconds:.2f}s",
        f"2026-11-30 {at} | INFO     | {TRACKER_AT} - Step {step}: ",
        "{'policy/grad_norm': '0.4100',",
        " 'policy/policy_loss': '0.0123',",
        " 'timing/fwd_logprobs_values_reward': '9.8000',",
        f" 'timing/generate': '{generate:.4f}',",
        f" 'timing/policy_train': '{update:.4f}',",
        f" 'timing/step': '{seconds:.4f}',",
        " 'timing/sync_weights': '3.2000',",
        f" 'timing/train_critic_and_policy': '{update + 0.31:.4f}',",
        " 'trainer/epoch': 0,",
        f" 'trainer/global_step': {step},",
        " 'trainer/tokens_per_second_per_gpu': '1510.3000'}",
    ]


SKYRL_RL_LOG = "\n".join(_skyrl_step(1, "10:02:14.905", 40.5, 131.9, 61.2)
                          + _skyrl_step(2, "10:04:21.291", 38.25, 126.4, 58.7)) + "\n"


def test_a_skyrl_rl_log_gives_the_actor_updates_own_time():
    """SkyRL's actor update alone is its policy_train timer (timing/policy_train; train_critic_and_policy adds PPO's
    critic): read into actor_update_s as verl's timing_s/update_actor is, from the console dict or, without the
    tracker, from the timer lines. Before, a SkyRL RL log had no actor-update time, so compare's MFU of an RL job
    was missing ("the actor update's own time")."""
    run = read_log(SKYRL_RL_LOG)
    assert run.framework == "skyrl" and run.rl_fields == {}
    assert run.actor_update_s == pytest.approx(38.25) and run.step_time_s == pytest.approx(126.4)  # step 2: steady
    assert run.sources["actor_update_s"].endswith(":17")  # step 2's header
    timers = read_log("\n".join(line for line in SKYRL_RL_LOG.splitlines() if "Finished:" in line))
    assert timers.actor_update_s == pytest.approx(38.25) and timers.step_time_s == pytest.approx(126.4)
    fields = {"model": "qwen2.5-7b", "num_gpus": 8, "gpu": "h100", "framework": "skyrl", "job": "rl",
              "prompt_length": 256, "response_length": 1024}
    mfu = next(f for f in api.compare_run(parse_request(fields), SKYRL_RL_LOG).figures if f.figure == "mfu")
    rl = api.estimate_throughput(parse_request(fields)).rl
    assert mfu.missing is None and mfu.measured == pytest.approx(rl.update_mfu * rl.update_s / 38.25)


def test_a_rate_is_inside_the_band_exactly_when_its_step_time_is(tmp_path, capsys, monkeypatch):
    """The band is the step time's median |predicted / measured - 1|; tokens/s per GPU is its reciprocal. A run 0.99
    band faster than predicted had its step time inside the band and its tokens/s (error 1 / (1 - 0.99 band) - 1,
    more than the band) outside: one measurement, two verdicts (verl's RL log: step -78% 'yes', tokens/s +358% 'NO'
    at +-86%). A rate is judged on the step-time scale, measured / predicted - 1."""
    req = parse_request({"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100-sxm", "framework": "megatron-core",
                         "global_batch_size": 128, "seq_length": 4096})
    throughput = api.estimate_throughput(req)
    band = throughput.error_band.median_error
    step_ms = throughput.step_time_s / (1 - 0.99 * band) * 1000
    line = ("iteration {i}/ 100 | consumed samples: 256 | elapsed time per iteration (ms): {ms:.3f} | "
            "global batch size: 128 | lm loss: 2.0E+00 |\n")
    text = "".join(line.format(i=i, ms=step_ms) for i in (2, 3, 4))
    result = api.compare_run(req, text)
    figures = {f.figure: f for f in result.figures}
    step, rate = figures["step_time"], figures["tokens_per_s_per_gpu"]
    assert step.error == pytest.approx(-0.99 * band) and rate.error > band  # the error as the ratio has it
    assert step.inside is True and rate.inside is True
    (tmp_path / "run.log").write_text(text, encoding="utf-8")  # the CLI prints a rate's band as its own range
    monkeypatch.setenv("COLUMNS", "80")  # a terminal of 80 columns, the table's design width (display._table)
    assert cli.main(["compare", "llama-3.1-8b", "--num-gpus", "8", "--gpu", "h100-sxm", "--global-batch-size", "128",
                     "--log", str(tmp_path / "run.log")]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("tokens/s per GPU"))
    assert f"{-band / (1 + band):.0%}/+{band / (1 - band):.0%}" in row and row.rstrip().endswith("yes")


def test_log_batch_differs_from_request_is_said():
    req = parse_request({"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100-sxm", "framework": "megatron-core",
                         "global_batch_size": 64, "seq_length": 4096})
    result = api.compare_run(req, log("megatron_mixtral_8x7b_h100.log"))
    assert any("global batch size 128 is not the request's 64" in n for n in result.notes)


def test_a_step_of_another_batch_is_shown_not_judged_and_not_calibrated_against(calibration_file):
    """The request's batch (64, from flags or a config) and the log's (128) differ: the step time compared a
    prediction of 64 sequences with a step of 128 and called it outside the band (its error and the rate's disagreed),
    and --calibrate stored that ratio as the cluster's factor, off by the batch."""
    req = parse_request({"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100-sxm", "framework": "megatron-core",
                         "global_batch_size": 64, "seq_length": 4096})
    result = api.compare_run(req, log("megatron_mixtral_8x7b_h100.log"))
    step = next(f for f in result.figures if f.figure == "step_time")
    rate = next(f for f in result.figures if f.figure == "tokens_per_s_per_gpu")
    assert step.measured == pytest.approx(5.4106) and step.predicted is not None
    assert step.error is None and step.inside is None and step.basis.startswith("not compared: the log's step runs 128")
    assert rate.error is not None and "step time" not in result.summary
    with pytest.raises(MeshplanError, match="times steps of 128 sequences and the request predicts 64"):
        api.compare_run(req, log("megatron_mixtral_8x7b_h100.log"), calibrate=True)
    assert not calibration_file.exists()


def test_cli_compare_with_config(capsys):
    args = ["compare", "--config", str(CONFIGS / "torchtitan_llama3_8b.toml"), "--log",
            str(LOGS / "torchtitan_dcp_zoc.log"), "--num-gpus", "8", "--gpu", "h100-sxm", "--json"]
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["framework"] == "torchtitan" and {f["figure"] for f in out["figures"]} >= {"peak_reserved", "mfu"}
    assert cli.main(args[:-1]) == 0
    text = capsys.readouterr().out
    assert "peak reserved, GiB" in text and "band" in text


def test_cli_compare_missing_log(capsys):
    assert cli.main(["compare", "llama-3.1-8b", "--num-gpus", "8", "--log", "/nonexistent/x.log"]) == 2
    assert "Cannot read the log" in capsys.readouterr().err


def test_cli_compare_reads_a_long_log_only_up_to_the_bound(tmp_path, capsys, monkeypatch):
    """`meshplan compare --log` read the whole file into memory (a long run's stdout: gigabytes) before read_log
    refused what passed MAX_LOG_CHARS; it now reads one character past the bound, as read_log_file does."""
    import meshplan.adapters.logs as logs

    monkeypatch.setattr(logs, "MAX_LOG_CHARS", 1000)
    path = tmp_path / "run.log"
    path.write_text("iteration 2/10 | elapsed time per iteration (ms): 5000.0 |\n" * 100)  # 6,000 characters
    handed: list[int] = []
    real = api.compare_run

    def spy(req, text, **kw):
        handed.append(len(text))
        return real(req, text, **kw)

    monkeypatch.setattr(api, "compare_run", spy)
    assert cli.main(["compare", "llama-3.1-8b", "--num-gpus", "8", "--log", str(path)]) == 2
    assert handed == [1001]
    assert f"{path}: more than 1,000 characters; a log is read up to that" in capsys.readouterr().err


def test_mcp_compare_run_matches_the_api():
    from meshplan.faces.mcp.server import app

    async def call():
        return await app.call_tool("compare_run", {**TITAN, "log_text": log("torchtitan_dcp_zoc.log")})

    result = anyio.run(call)
    structured = result.structured_content if hasattr(result, "structured_content") else result[1]
    expected = api.compare_run(parse_request(TITAN), log("torchtitan_dcp_zoc.log"))
    assert [f["error"] for f in structured["figures"]] == [f.error for f in expected.figures]
    assert structured["summary"] == expected.summary and structured["next_steps"]


# --------------------------------------------------------------------------- --calibrate


@pytest.fixture
def calibration_file(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    monkeypatch.setenv("MESHPLAN_CALIBRATION_FILE", str(path))
    monkeypatch.delenv("MESHPLAN_CLUSTER", raising=False)
    return path


def test_without_a_stored_factor_nothing_changes(calibration_file):
    req = parse_request(TITAN)
    before = api.estimate_throughput(req)
    api.compare_run(req, log("torchtitan_dcp_zoc.log"))  # compare alone never stores anything
    assert not calibration_file.exists()
    after = api.estimate_throughput(req)
    assert after == before and after.calibration is None


def test_calibrate_stores_and_every_face_applies_and_states_it(calibration_file, capsys):
    from meshplan.faces.mcp.server import app

    req = parse_request(TITAN)
    model = api.estimate_throughput(req)
    result = api.compare_run(req, log("torchtitan_dcp_zoc.log"), log_path="titan.log", calibrate=True)
    step = next(f for f in result.figures if f.figure == "step_time")
    factor = step.measured / model.step_time_s
    stored = json.loads(calibration_file.read_text())["factors"]["default"]["h100/torchtitan"]
    assert stored["step_time_factor"] == pytest.approx(factor, rel=1e-5) and stored["sources"] == ["titan.log"]
    assert result.stored.step_time_factor == pytest.approx(factor, rel=1e-5)

    calibrated = api.estimate_throughput(req)  # the api
    assert calibrated.step_time_s == pytest.approx(model.step_time_s * calibrated.calibration.step_time_factor)
    assert calibrated.mfu == pytest.approx(model.mfu / calibrated.calibration.step_time_factor)
    assert calibrated.assumptions[0].startswith("calibrated: step time x")
    assert cli.main(["throughput", "llama-3.1-8b", "--num-gpus", "8", "--gpu", "h100-sxm", "--framework",
                     "torchtitan"]) == 0  # the CLI
    assert "calibrated: step time x" in capsys.readouterr().out

    async def call():
        return await app.call_tool("estimate_throughput", TITAN)

    structured = anyio.run(call).structured_content  # MCP
    assert "Calibrated: step time x" in structured["summary"] and structured["calibration"] is not None
    again = api.compare_run(req, log("torchtitan_dcp_zoc.log"))  # compare shows it beside the model's own
    figure = next(f for f in again.figures if f.figure == "step_time")
    assert figure.predicted == pytest.approx(model.step_time_s) and figure.calibrated == pytest.approx(step.measured)
    other = api.estimate_throughput(parse_request({**TITAN, "framework": "megatron-core"}))
    assert other.calibration is None  # a factor is per GPU and framework


def test_bad_calibration_file_is_a_clear_error(calibration_file):
    calibration_file.write_text("{not json", encoding="utf-8")
    with pytest.raises(MeshplanError, match="Cannot read the calibration file"):
        api.estimate_throughput(parse_request(TITAN))
    calibration_file.write_text('{"version": 9}', encoding="utf-8")
    with pytest.raises(MeshplanError, match="not a meshplan calibration file"):
        api.estimate_throughput(parse_request(TITAN))


def test_calibrate_refuses_a_mismatched_log(calibration_file):
    crawl = "".join(f"step: {n}  loss:  1.0  memory: 10.00GiB(1.00%)  tps: 3  tflops: 0.10  mfu: 0.01%\n"
                    for n in (1, 2))  # 3 tokens/s per GPU: a log of some other job than this 8B request
    with pytest.raises(MeshplanError, match="do not describe the same job"):
        api.compare_run(parse_request(TITAN), crawl, calibrate=True)
    assert not calibration_file.exists()


def test_calibration_off_refuses_to_store(monkeypatch):
    monkeypatch.setenv("MESHPLAN_CALIBRATION_FILE", "")
    with pytest.raises(MeshplanError, match="turned off"):
        api.compare_run(parse_request(TITAN), log("torchtitan_dcp_zoc.log"), calibrate=True)


def test_a_request_without_a_batch_is_predicted_at_the_logs():
    """Before: the Mixtral log's run (global batch 128) was compared with a prediction at the default batch of 1,024
    sequences: step time +140%, 'outside the band', for a step eight times the one the log timed."""
    fields = {"model": "mixtral-8x7b", "num_gpus": 64, "gpu": "h100-sxm", "framework": "megatron-core", "ep": 8,
              "pp": 4, "seq_length": 4096}
    result = api.compare_run(parse_request(fields), log("megatron_mixtral_8x7b_h100.log"))
    figures = {f.figure: f for f in result.figures}
    at_128 = api.estimate_throughput(parse_request({**fields, "global_batch_size": 128}))
    assert figures["step_time"].predicted == pytest.approx(at_128.step_time_s)
    assert any(n.startswith("global_batch_size not given: 128 sequences, the log's") for n in result.notes)
    assert not any("is not the request's" in n for n in result.notes)
    given = api.compare_run(parse_request({**fields, "global_batch_size": 256}), log("megatron_mixtral_8x7b_h100.log"))
    assert any("global batch size 128 is not the request's 256" in n for n in given.notes)  # a batch given is kept


def test_the_logged_tflops_per_gpu_is_shown_beside_the_estimate_s_own(tmp_path, capsys):
    """Megatron's 'throughput per GPU (TFLOP/s/GPU)' was read (MeasuredRun.tflops_per_gpu) and shown nowhere. It is a
    figure beside the predicted model TFLOP/s per GPU in the estimate's one FLOP count: its model FLOPs per step over
    the predicted step time and the GPUs, what its MFU divides by the peak."""
    from meshplan.knowledge.hardware import get_gpu

    req = parse_request(LLAMA_8B_ON_8)
    throughput = api.estimate_throughput(req)
    text = megatron_iterations("throughput per GPU (TFLOP/s/GPU): 241.4 | ")
    tflops = {f.figure: f for f in api.compare_run(req, text).figures}["logged_tflops"]
    assert tflops.measured == pytest.approx(241.4)
    assert tflops.predicted == pytest.approx(throughput.model_flops_per_step / (throughput.step_time_s * 8) / 1e12)
    assert tflops.predicted == pytest.approx(throughput.mfu * get_gpu("h100-sxm").bf16_flops / 1e12)
    (tmp_path / "run.log").write_text(text, encoding="utf-8")
    assert cli.main(["compare", "llama-3.1-8b", "--num-gpus", "8", "--gpu", "h100-sxm", "--global-batch-size", "128",
                     "--log", str(tmp_path / "run.log")]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("model TFLOP/s per GPU"))
    assert f"{tflops.predicted:.3g}" in row and "241" in row


MEGATRON_STEP = ("[2026-11-02 10:00:01] iteration      100/   10000 | consumed samples:   102400 | elapsed time per "
                 "iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): {tflops} | global batch size:  1024 | "
                 "lm loss: 2.345E+00 |\n")


def test_a_log_the_request_s_job_cannot_have_run_is_said():
    """A step 12x faster than the request's 70B job at 8K could run (565% of peak) and a TFLOP/s the step time does not
    imply: the request's shape is not the run's, said in the notes; a log that matches it gets neither note."""
    req = parse_request({"model": "llama-3.1-70b", "num_gpus": 64, "gpu": "h100", "framework": "megatron-core",
                         "tp": 8, "pp": 2, "seq_length": 8192, "global_batch_size": 1024})
    notes = api.compare_run(req, MEGATRON_STEP.format(ms=10532.1, tflops=412.3)).notes
    assert any("which no run reaches" in n and "seq_length (8,192)" in n for n in notes), notes
    assert any("13.6x" in n for n in notes), notes
    ok = api.compare_run(req, MEGATRON_STEP.format(ms=130532.1, tflops=440.3)).notes
    assert not any("no run reaches" in n or "not the request's" in n for n in ok), ok


def test_a_log_stating_far_more_tflops_than_its_step_time_implies_is_said():
    """The other side of SHAPE_MISMATCH, which no test reached: a log whose own TFLOP/s is twice or more what its step
    time implies at the request's tokens per step (451 here) gets the note; one just under twice it does not."""
    from meshplan.check.measured import SHAPE_MISMATCH

    req = parse_request({"model": "llama-3.1-70b", "num_gpus": 64, "gpu": "h100", "framework": "megatron-core",
                         "tp": 8, "pp": 2, "seq_length": 8192, "global_batch_size": 1024})

    def said(tflops: float) -> list[str]:
        notes = api.compare_run(req, MEGATRON_STEP.format(ms=130532.1, tflops=tflops)).notes
        return [n for n in notes if "the log's step time implies 451 model TFLOP/s" in n]

    assert SHAPE_MISMATCH == 2.0
    assert said(1000.0) and "(0.5x)" in said(1000.0)[0]  # 451 / 1000 <= 1 / 2
    assert not said(900.0)  # 451 / 900 > 1 / 2


def test_each_measured_rate_says_how_it_was_taken():
    """A Megatron-LM log gives the step time and no tokens/s: the step time row's basis read 'tokens/s per GPU =
    ... / (step time x 8 GPUs)', how the other row was derived from it. The step time is as logged, and the tokens/s
    per GPU names its derivation."""
    figures = {f.figure: f for f in api.compare_run(parse_request(LLAMA_8B_ON_8), megatron_iterations()).figures}
    assert figures["step_time"].basis == "as logged", figures["step_time"].basis
    assert figures["tokens_per_s_per_gpu"].basis.startswith("tokens/s per GPU = "), figures["tokens_per_s_per_gpu"]


@pytest.mark.parametrize("framework", ["deepspeed", "kempnerforge", "megatron-core", "skyrl", "torchtitan", "verl"])
def test_a_log_with_no_line_a_reader_knows_says_what_such_lines_look_like(framework):
    """The refusal named the reader's regular expression ('memory \\(MB\\) \\| allocated:|\\biteration\\s+...'); it
    now shows lines as the framework prints them."""
    with pytest.raises(MeshplanError) as refused:
        read_log("hello world\nnothing here\n", "x.log", framework=framework)
    assert READERS[framework].LOOKS_LIKE in refused.value.fix and "\\" not in refused.value.fix
