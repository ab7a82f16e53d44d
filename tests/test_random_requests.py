"""Seeded random requests over the catalog, every framework and GPU, held to what a user relies on across faces:

- MEM001's fix, each layout it names applied to the request as `check --config` applies it (fix_changes with the
  request as the file and the checked plan in effect), estimates the figure the fix stated: the tp neighbour turned
  sequence parallelism on where DeepSpeed runs none and where a tp=1 file states it off, split an MoE model's experts
  over the new tp where the plan kept them whole, kept it in KempnerForge's pipeline stages, and named
  optimizer_offload for verl's in-step CPU optimizer, optimizer_offload_fraction's;
- an RL job's rendered verl or SkyRL config reads back as the plan it was rendered from (SkyRL's phase optimizer
  offload was written as Megatron-Core's in-step CPU optimizer);
- the MCP tools answer what the api answers;
- an RL step's report, colocated or on a separate pool, holds together (bench/random_requests.py rl_step_faults: its
  parts finite and adding to the step, or overlapping with a word; a replica decoding at most its share at once).

The sweeps these came from (bench/random_requests.py) run the same draws wider; here a few dozen per property."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from mcp_calls import call_tools

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib
from meshplan.request.resolve import resolve
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from random_requests import applied, draw_rl_pools, named_layouts, rl_read_back, rl_step_faults

GPUS = ("h100", "h200", "b200", "a100-80gb", "h20", "mi300x", "gb200")
EXTRA = {"recompute": ["none", "selective", "full"], "precision": ["bf16", "fp8"], "sequence_parallel": [True, False],
         "micro_batch_size": [1, 2, 4], "zero_stage": [0, 1, 2, 3], "job": ["lora", "sft", "rl"],
         "seq_length": [8192, 32768], "cp": [2], "ep": [2, 4, 8], "tp": [1, 2, 4], "pp": [1, 2, 4], "etp": [1],
         "global_batch_size": [64, 256], "optimizer": ["muon"], "activation_offload": [True]}


def drawn(seed: int, n: int, extra: int = 4):
    rng = random.Random(seed)
    models = [m.key for m in api.list_models()]
    for _ in range(n):
        req = dict(model=rng.choice(models), framework=rng.choice(FRAMEWORKS), gpu=rng.choice(GPUS),
                   num_gpus=rng.choice([8, 16, 32, 64]))
        for name in rng.sample(sorted(EXTRA), extra):
            req[name] = rng.choice(EXTRA[name])
        yield req


@pytest.mark.parametrize("seed", range(2))
def test_each_layout_a_memory_fix_names_estimates_as_the_request_it_makes(seed):
    compared, failures = 0, []
    for req in drawn(seed, 120):
        try:
            report = api.check_config(Request(**req))
        except (MeshplanError, ValueError):
            continue
        found = next((f for f in report.findings if f.id == "MEM001"), None)
        if found is None:
            continue
        in_effect = resolve(Request(**req))[1].model_dump()
        for label, figure in named_layouts(found.fix):
            fixed = applied(req, label, in_effect) or req
            memory = api.check_config(Request(**fixed)).memory
            compared += 1
            if memory is None or gib(memory.fit_bytes) != figure:
                failures.append(f"{req}: {label!r} said {figure}, the request with it "
                                f"{gib(memory.fit_bytes) if memory else 'no estimate'}")
    assert compared > 40
    assert not failures, "\n".join(failures[:5])


RL_MODELS = ("qwen3-8b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-30b-a3b", "deepseek-v2-lite", "moonlight-16b-a3b")
RL_EXTRA = dict(tp=[1, 2, 4], pp=[1, 2], zero_stage=[1, 3], recompute=["full", "selective"], micro_batch_size=[1, 2],
                prompts_per_step=[32, 64, 128], samples_per_prompt=[4, 8], prompts_per_mini_batch=[8, 16, 32],
                response_length=[1024, 4096], rollout_tp=[1, 2, 4], rollout_memory_fraction=[0.5, 0.7],
                param_offload=[True, False], optimizer_offload=[True, False], optimizer_offload_fraction=[0.5],
                update_epochs=[1, 2], algorithm=["grpo", "dapo"], rollout_enforce_eager=[True])
def test_a_rendered_rl_config_reads_back_as_its_plan():
    rng, compared, failures = random.Random(0), 0, []
    for _ in range(80):
        framework = rng.choice(["verl", "skyrl"])
        req = dict(model=rng.choice(RL_MODELS), gpu=rng.choice(("h100", "h200", "b200")), framework=framework,
                   num_gpus=rng.choice([8, 16, 32]), job="rl")
        req |= {k: rng.choice(v) for k, v in RL_EXTRA.items() if rng.random() < 0.2}
        try:
            text = api.render_config(framework, Request(**req)).text
        except (MeshplanError, ValueError):
            continue
        diff = rl_read_back(req, text)  # an import refusal fails the test
        compared += 1
        if diff:
            failures.append(f"{req}: {diff}")
    assert compared > 15
    assert not failures, "\n".join(failures[:5])


TOOLS = ("estimate_memory", "estimate_throughput", "check_config")


def _without_words(value):
    """A tool's structured answer less what the MCP face adds to the report (its summary and next steps)."""
    if isinstance(value, dict):
        return {k: _without_words(v) for k, v in value.items() if k not in ("summary", "next_steps")}
    if isinstance(value, list):
        return [_without_words(v) for v in value]
    return value


def test_the_mcp_tools_answer_what_the_api_answers():
    rng = random.Random(1)
    calls = [(rng.choice(TOOLS), req) for req in drawn(1, 40, extra=3)]
    differ = []
    for (tool, req), result in zip(calls, call_tools(*calls), strict=True):
        try:
            answer = getattr(api, tool)(Request(**req)).model_dump(mode="json")
        except (MeshplanError, ValueError) as exc:
            if not result.is_error:
                differ.append(f"{tool} {req}: the api refused ({exc}), the tool answered")
            continue
        if result.is_error:
            differ.append(f"{tool} {req}: the tool refused ({result.content[0].text[:200]}), the api answered")
            continue
        sent = _without_words(result.structured_content or {})
        sent = sent.get("result", sent)
        shared = [k for k in answer if k in sent]
        if not shared or any(_without_words(answer[k]) != sent[k] for k in shared):
            differ.append(f"{tool} {req}: {[k for k in shared if _without_words(answer[k]) != sent[k]][:5]}")
    assert not differ, "\n".join(differ[:5])


@pytest.mark.parametrize("seed", [40, 41])
def test_an_rl_steps_parts_add_up_on_either_placement(seed):
    rng, compared, faults = random.Random(seed), 0, []
    for _ in range(30):
        req = draw_rl_pools(rng)
        try:
            report = api.estimate_throughput(Request(**req))
            job, _ = resolve(Request(**req))
        except (MeshplanError, ValueError):
            continue
        compared += 1
        sequences = job.rl.prompts_per_step * job.rl.samples_per_prompt
        faults += [(req, fault) for fault in rl_step_faults(report, sequences)]
    assert compared >= 10 and not faults, faults[:3]


ROUND_TRIP = ("tp", "pp", "vpp", "cp", "ep", "dp", "zero_stage", "micro_batch_size", "recompute", "sequence_parallel")
CONFIG_SUFFIX = {"json": "json", "yaml": "yaml", "toml": "toml", "python": "py", "shell": "sh", "hydra": "sh"}


@pytest.mark.parametrize("seed", [2])
def test_a_rendered_file_checked_ok_imports_back_as_its_plan(seed):
    """torchtitan, DeepSpeed and KempnerForge files render writes for random training requests that check passes,
    imported back with the model and GPUs given beside them as a user passes them: the same layout, batch and
    precision (the hand-edit sweep of these three readers started from such a file)."""
    from meshplan.adapters.render import render

    rng, compared, differ = random.Random(seed), 0, []
    models = [m.key for m in api.list_models()]
    for _ in range(300):
        req = dict(model=rng.choice(models), framework=rng.choice(["torchtitan", "deepspeed", "kempnerforge"]),
                   gpu=rng.choice(["h100", "h200", "b200", "a100-80gb"]), num_gpus=rng.choice([8, 16, 32]))
        for name, values in (("tp", [1, 2, 4]), ("pp", [1, 2]), ("zero_stage", [1, 2, 3]), ("ep", [1, 2, 4]),
                             ("recompute", ["none", "selective", "full"]), ("micro_batch_size", [1, 2]),
                             ("global_batch_size", [64, 256]), ("cp", [1, 2]), ("precision", ["bf16", "fp8"])):
            if rng.random() < 0.4:
                req[name] = rng.choice(values)
        try:
            job, plan = resolve(Request(**req))
            if any(f.severity == "error" for f in api.check_config(Request(**req)).findings):
                continue
            result = render(req["framework"], job, plan)
        except (MeshplanError, ValueError):
            continue
        compared += 1
        imported = api.import_config(result.text, path=f"rendered.{CONFIG_SUFFIX[result.format]}",
                                     framework=req["framework"])
        back_job, back = resolve(api.request_from_config(imported, {k: req[k] for k in ("model", "gpu", "num_gpus")}))
        # a ds_config does not say what the model code recomputes: assumed none, said (read_deepspeed_json)
        unread = {"recompute"} if req["framework"] == "deepspeed" and any(
            line.startswith("recompute = none") for line in imported.assumed) else set()
        moved = {f: (getattr(plan, f), getattr(back, f)) for f in ROUND_TRIP
                 if f not in unread and getattr(plan, f) != getattr(back, f)}
        moved.update({f: (getattr(job, f), getattr(back_job, f)) for f in ("global_batch_size", "precision")
                      if getattr(job, f) != getattr(back_job, f)})
        if moved:
            differ.append(f"{req}: {moved}")
    assert compared >= 25 and not differ, "\n".join(differ[:5])
