"""verl training logs: one console line per RL step of ' - '-separated metrics (verl/utils/tracking.py's console
logger; the keys from verl/trainer/ppo/metric_utils.py and the workers):
    step:2 - ... - perf/max_memory_allocated_gb:25.921 - perf/max_memory_reserved_gb:61.611 - ...
        - perf/mfu/actor:0.343 - timing_s/step:96.551 - perf/throughput:3330.4
perf/max_memory_* are torch's peaks / 1024**3 (newer releases prefix them with actor/); timing_s/step is the
whole RL step (verl's PPO trainer logs it; its prompt_length/max, response_length/max and /mean are read as the RL
request's fields); timing_s/update_actor is the actor update alone (verl/trainer/ppo/ray_trainer.py's
marked_timer("update_actor")); perf/throughput is total tokens / (step seconds x GPUs), per GPU; perf/mfu/actor is the
actor update's MFU, a fraction: the FLOPs verl's flops_counter counts over the peak its own table gives the device's
name (verl/utils/flops_counter.py get_device_flops, the first table key found in the name). Before verl 0.4.0 (commit
bd94bd61f, 'fix flops for H200') that table was tried H100, H800, A100, A800, L40, L20, then H20 (148 TFLOPS), so an
H200's or GH200's name matched H20's peak and its MFU read 6.7x high (issue 1208's GH200 run logged 1.018): an MFU over
1 is left out, MFU_OVER_ONE saying why. Values may print as np.float64(...); a pasted line may wrap anywhere.
The SFT trainer (verl/trainer/sft_trainer.py, verl 0.9.1) logs the same memory keys and train/mfu (its engine's FLOP
count over the GPUs' peak), no step time and no RL key: its steps are a training job's, so they state no RL fields.
"""

from __future__ import annotations

import re

from meshplan.adapters.logs.common import NUMBER, LogReading, MemoryFigures, StepFigures, number
from meshplan.core.units import GIB

RECORD = re.compile(r"(?<![\w/])step:(\d+) - ")
VALUE = re.compile(rf"(?:^|\s)([\w/@.\-]+):(?:np\.float\d+\()?({NUMBER})")
DETECT = re.compile(r"(?<![\w/])step:\d+ - .*(?:timing_s/|perf/)")
LOOKS_LIKE = "'step:10 - ... timing_s/step:... perf/...'"  # what DETECT finds, in an error's words

STEP_KEYS = {"timing_s/step": "step_time_s", "perf/throughput": "tokens_per_s_per_gpu", "perf/mfu/actor": "mfu",
             "train/mfu": "mfu", "timing_s/update_actor": "actor_update_s"}
SFT_KEYS = ("train/mfu", "train/loss")  # verl.trainer.sft_trainer's metrics (the train/ prefix is its own)
# the RL workload a step states, as request fields: the longest prompt and response (what the run allows at least)
# and their means
RL_KEYS = {"prompt_length/max": "prompt_length", "response_length/max": "response_length",
           "response_length/mean": "mean_response_length", "prompt_length/mean": "mean_prompt_length"}
MEMORY_KEYS = {"perf/max_memory_allocated_gb": "allocated_bytes", "actor/perf/max_memory_allocated_gb":
               "allocated_bytes", "perf/max_memory_reserved_gb": "reserved_bytes",
               "actor/perf/max_memory_reserved_gb": "reserved_bytes"}


MFU_OVER_ONE = ("verl's MFU is over 1: verl divides its FLOP count by its own table's peak for the device's name "
                "(verl/utils/flops_counter.py get_device_flops); before verl 0.4.0 an H200's or GH200's name matched "
                "H20's 148 TFLOPS, 6.7x below their 989, so the logged MFU is not over the GPU's peak: the run's "
                "MFU here is its logged rate over the GPU's peak")


def read(text: str, path: str, framework: str = "verl") -> LogReading:
    reading = LogReading(framework=framework, path=path)
    starts = list(RECORD.finditer(text))
    for k, start in enumerate(starts):
        end = starts[k + 1].start() if k + 1 < len(starts) else len(text)
        record = re.sub(r"\n(?!\S*step:\d+ - )", "", text[start.end():end])  # a wrapped paste, re-joined
        values = {m.group(1): number(m.group(2)) for m in VALUE.finditer(" " + record)}
        line = text.count("\n", 0, start.start()) + 1
        figures = StepFigures(line=line, step=int(start.group(1)),
                              **{attr: values[key] for key, attr in STEP_KEYS.items() if key in values})
        if any(getattr(figures, attr) is not None for attr in STEP_KEYS.values()):
            reading.steps.append(figures)
            if not any(key in values for key in SFT_KEYS):
                reading.rl_fields = {**(reading.rl_fields or {}),
                                     **{field: round(values[key]) for key, field in RL_KEYS.items() if key in values}}
        memory = {attr: values[key] * GIB for key, attr in MEMORY_KEYS.items() if key in values}
        if memory:
            reading.memory.append(MemoryFigures(line=line, **memory))
    if any(s.mfu is not None and s.mfu > 1 for s in reading.steps):
        reading.notes.append(MFU_OVER_ONE)
    if reading.steps and reading.rl_fields is not None:
        reading.notes.append("verl's timing_s/step is the whole RL step (rollout, log-probs, update)")
    elif reading.steps:
        reading.notes.append("verl's SFT trainer logs train/mfu and no step time: the MFU is its own FLOP count")
    return reading
