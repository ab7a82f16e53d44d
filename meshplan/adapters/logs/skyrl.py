"""SkyRL training logs. The console tracker (skyrl/train/utils/tracking.py ConsoleLogger) prints each step's
metrics as a pretty-printed dict with floats as strings:
    Step 12:
    {'timing/step': '286.05', 'timing/generate': '27.65', 'trainer/tokens_per_second_per_gpu': '812.3', ...}
and the trainer's timer (skyrl/train/trainer.py; a generate phase marks the RL trainer's steps) logs
`Finished: 'step', time cost: 288.78s`. The actor update alone, what verl logs as timing_s/update_actor, is SkyRL's
"policy_train" timer (SkyRL a956457, skyrl/train/trainer.py:1569 `with Timer("policy_train", self.all_timings)`
around the policy's mini-batch forward/backward and optimizer steps, inside "train_critic_and_policy", which adds
PPO's critic_train): the tracker logs it as timing/policy_train (trainer.py:527, `f"timing/{k}"` over all_timings)
and the timer as `Finished: 'policy_train', time cost: 40.50s` (skyrl/train/utils/utils.py:43) before its step's
`Finished: 'step'`. The SFT trainer
(skyrl/train/sft_trainer.py) logs `Step N: loss=..., grad_norm=..., tokens_per_second=...` (the whole job's).
SkyRL logs no torch memory peak (its Ray GPU monitor reports device-wide use, engine included): memory is left
unmeasured.
"""

from __future__ import annotations

import re

from meshplan.adapters.logs.common import NUMBER, LogReading, StepFigures, number, plain_lines

QUOTED = re.compile(rf"'([\w/@.\-]+)':\s*'?({NUMBER})'?")
HEADER = re.compile(r"\bStep (\d+):")
TIMER = re.compile(rf"Finished: '(step|policy_train)', time cost: ({NUMBER})s")
SFT = re.compile(rf"\bStep (\d+): loss=.*\btokens_per_second=({NUMBER})")
# the RL trainer's generation phase (skyrl/train/trainer.py Timer("generate"), logged as timing/generate and by the
# timer itself); the SFT trainer's step has no such phase
RL_STEP = re.compile(r"'timing/generate'|Finished: 'generate'")
DETECT = re.compile(r"'timing/step':|Finished: 'step', time cost:|\bStep \d+: loss=.*tokens_per_second=")
LOOKS_LIKE = (  # what DETECT finds, in an error's words
    '"{... \'timing/step\': ...}" or '
    '"Finished: \'step\', time cost: ..." or '
    "'Step 10: loss=... tokens_per_second=...'"
)

KEYS = {"timing/step": "step_time_s", "timing/policy_train": "actor_update_s",
        "trainer/tokens_per_second_per_gpu": "tokens_per_s_per_gpu",
        "train/tokens_per_second_per_gpu": "tokens_per_s_per_gpu", "train/tokens_per_second": "tokens_per_s"}


def read(text: str, path: str, framework: str = "skyrl") -> LogReading:
    reading = LogReading(framework=framework, path=path)
    current: StepFigures | None = None
    timers: list[StepFigures] = []
    update: float | None = None  # a policy_train timer's seconds, for the step timer that closes it
    for i, line in enumerate(plain_lines(text), start=1):
        if (found := SFT.search(line)) is not None:
            reading.steps.append(StepFigures(line=i, step=int(found.group(1)), tokens_per_s=number(found.group(2))))
        elif (found := HEADER.search(line)) is not None:
            current = StepFigures(line=i, step=int(found.group(1)))
            reading.steps.append(current)
        elif (found := TIMER.search(line)) is not None:
            if found.group(1) == "policy_train":
                update = number(found.group(2))
            else:
                timers.append(StepFigures(line=i, step_time_s=number(found.group(2)), actor_update_s=update))
                update = None
        for m in QUOTED.finditer(line):
            attr = KEYS.get(m.group(1))
            if attr is None:
                continue
            if current is None or getattr(current, attr) is not None:  # a dict with no `Step N:` header
                current = StepFigures(line=i)
                reading.steps.append(current)
            setattr(current, attr, number(m.group(2)))
    reading.steps = [s for s in reading.steps if s.step_time_s or s.tokens_per_s or s.tokens_per_s_per_gpu]
    if not reading.steps:
        reading.steps = timers
    reading.notes.append("SkyRL logs no torch memory peak: memory is not compared")
    if RL_STEP.search(text):
        reading.rl_fields = {}  # its lines state no prompt or response length meshplan reads
    return reading
