"""Random requests over the whole catalog, every framework and GPU, as a demanding user sends them; each sweep prints
what a user would trip on (tests/test_random_requests.py runs a few dozen draws of the same properties in CI).

    python bench/random_requests.py errors   SEED N  # every operation: a traceback, a timeout, an answer over --slow s
    python bench/random_requests.py fixes    SEED N  # check, each fix applied, check again: the rule still fires
                                                    # or the fix brings another error in
    python bench/random_requests.py rlfixes  SEED N  # the same over verl/SkyRL RL jobs (RL005, RL006, VL*, SK*)
    python bench/random_requests.py memfix   SEED N  # each layout MEM001 names, applied: the figure it stated
    python bench/random_requests.py render   SEED N  # render -> import: a field the request set reads back otherwise
    python bench/random_requests.py rl       SEED N  # the same for verl/SkyRL RL jobs, plan and job compared
    python bench/random_requests.py faces    SEED N  # the MCP tools (in process) against the api
    python bench/random_requests.py recommend SEED N  # recommend's candidates asked again: check, memory, time, render
    python bench/random_requests.py rlparts  SEED N  # an RL step's parts (separate pools too): they add up, no NaN

Run from the worktree (`python bench/...` puts bench/, not the tree, on sys.path: the tree is added below).
Known differences the render sweep reports and that are no defect: Megatron-Bridge's expandable_segments=false (the
recipe's cfg.env_vars, not the snippet, holds it: render's note says so), a ds_config's seq_length and recompute (the
model code's, not the file's), SP at tp=1 on KempnerForge (nothing to write)."""

from __future__ import annotations

import argparse
import math
import random
import re
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import ValidationError

from meshplan import api
from meshplan.adapters.read.fixes import NO_FIX, fix_changes
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib
from meshplan.request.resolve import resolve
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.request import Request

GPUS = ("h100", "h200", "b200", "a100-80gb", "a100-40gb", "h20", "mi300x", "gb200")
EXTRA = {"recompute": ["none", "selective", "full"], "precision": ["bf16", "fp8"], "sequence_parallel": [True, False],
         "micro_batch_size": [1, 2, 4], "zero_stage": [0, 1, 2, 3], "job": ["lora", "sft", "rl", "pretrain"],
         "seq_length": [1024, 8192, 32768, 131072], "cp": [2, 4], "ep": [2, 4, 8, 16], "tp": [1, 2, 3, 4, 8],
         "pp": [1, 2, 4, 8], "vpp": [2], "etp": [1], "global_batch_size": [1, 16, 64, 100, 256, 1024],
         "optimizer": ["muon"], "mtp_num_layers": [0, 1], "activation_offload": [True], "optimizer_offload": [True],
         "param_offload": [True], "tp_comm_overlap": [True], "moe_a2a_overlap": [True], "torch_compile": [True],
         "grad_reduce_in_fp32": [False], "expandable_segments": [False], "lora_rank": [8, 64]}
RL_MODELS = ("qwen3-8b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-30b-a3b", "qwen3-32b", "deepseek-v2-lite",
             "moonlight-16b-a3b", "gpt-oss-20b", "mistral-7b")
RL_EXTRA = dict(tp=[1, 2, 4], pp=[1, 2], zero_stage=[1, 3], recompute=["full", "selective"], micro_batch_size=[1, 2],
                prompts_per_step=[32, 64, 128], samples_per_prompt=[4, 8], prompts_per_mini_batch=[8, 16, 32],
                response_length=[1024, 4096], prompt_length=[512, 2048], rollout_tp=[1, 2, 4],
                rollout_memory_fraction=[0.5, 0.7], param_offload=[True, False], optimizer_offload=[True, False],
                optimizer_offload_fraction=[0.5, 1.0], update_epochs=[1, 2], algorithm=["grpo", "ppo", "dapo"],
                rollout_engine=["vllm", "sglang"], ep=[2, 4], rollout_enforce_eager=[True])
FIRST_OF_SEVERAL = ("AD001", "NT001", "OF001", "RL005")  # fixing one setting (phase) may reveal the next
ESTIMATE_RULES = ("MEM001", "MEM003", "RL005", "RL006")  # judged only once the plan's memory is estimated
RULE_ID = re.compile(r"\b[A-Z]{2,5}\d{3}\b")
TRIED = re.compile(r"([a-z_]+=[^:()+]+?(?:, [a-z_]+=[^:()+]+?)*): ([\d,.]+ GiB)")
FITS = re.compile(r"(?:^|or |together, |: )([a-z_]+=[^():]+?) \(([\d,.]+ GiB) peak")


def draw(rng: random.Random, extra: int) -> dict:
    models = [m.key for m in api.list_models()]
    req = dict(model=rng.choice(models), framework=rng.choice(FRAMEWORKS), gpu=rng.choice(GPUS),
               num_gpus=rng.choice([1, 4, 8, 12, 16, 24, 32, 64, 128, 256]))
    for name in rng.sample(sorted(EXTRA), extra):
        req[name] = rng.choice(EXTRA[name])
    return req


def refused(exc: Exception) -> str:
    ids = sorted(set(RULE_ID.findall(str(exc))))
    return ",".join(ids) or str(exc)[:70]


class TimedOut(Exception):
    pass


def errors(rng: random.Random, n: int, slow: float) -> None:
    def alarm(*_):
        raise TimedOut()

    signal.signal(signal.SIGALRM, alarm)
    answered = 0
    for _ in range(n):
        req = draw(rng, 4)
        op = rng.choice(["recommend", "estimate_memory", "estimate_throughput", "check_config", "minimum_gpus",
                         "render", "describe"])
        start = time.time()
        signal.alarm(120)
        try:
            if op == "render":
                api.render_config(req["framework"], Request(**req))
            elif op == "describe":
                api.describe_model(req["model"])
            elif op == "minimum_gpus":
                api.minimum_gpus(Request(**{k: v for k, v in req.items() if k != "num_gpus"}))
            else:
                getattr(api, op)(Request(**req))
            answered += 1
        except (MeshplanError, ValidationError):
            pass
        except TimedOut:
            print("TIMEOUT", op, req, flush=True)
        except Exception:
            print("BUG", op, req, flush=True)
            traceback.print_exc(limit=6)
        finally:
            signal.alarm(0)
        if time.time() - start > slow:
            print(f"SLOW {time.time() - start:.1f} s", op, req, flush=True)
    print("requests", n, "answered", answered, "(the rest refused with a reason)")


def alternatives(fix: str, rule: str) -> list[str]:
    if rule == "MEM001":
        if fix.startswith("none of the nearby"):
            return []
        # each alternative without its figures, the settings named with it kept ('pp=2 (first_stage_layers=14,
        # last_stage_layers=13) (57.5 GiB peak, ...)': cut at ' (' it was pp=2 alone, which PP001 refuses)
        return [re.sub(r" \([\d,.]+ GiB peak.*$", "", a) for a in fix.split("together, ")[-1].removesuffix(" fits.")
                .removesuffix(" fit.").split(") or ")]
    return re.split(r",?\s+or\s+", fix)


def named_layouts(fix: str) -> list[tuple[str, str]]:
    """(label, figure) of each layout a MEM001 fix names with its estimate (tests/test_random_requests.py too)."""
    return TRIED.findall(fix) + FITS.findall(fix)


def applied(req: dict, alternative: str, in_effect: dict) -> dict:
    change: dict = {}
    for part in alternative.split(" + "):
        change |= (fix_changes(part, req, in_effect) or [{}])[0]
    change |= {name: None for name in re.findall(r"\b[Dd]rop ([a-z][a-z0-9_]*)", alternative)
               if name in Request.model_fields}
    return {k: v for k, v in {**req, **change}.items() if v is not None} if change else {}


def draw_rl(rng: random.Random, extra: int = 0) -> dict:
    """An RL job on verl or SkyRL, the trainer and rollout knobs drawn (a separate pool left out: it needs its GPUs)."""
    req = dict(model=rng.choice((*RL_MODELS, "qwen3-235b-a22b", "llama-3.1-70b", "qwen2.5-72b")),
               framework=rng.choice(["verl", "skyrl"]), gpu=rng.choice(GPUS), num_gpus=rng.choice([8, 16, 32, 64]),
               job="rl")
    return req | {k: rng.choice(v) for k, v in RL_EXTRA.items() if rng.random() < 0.25}


def fixes(rng: random.Random, n: int, rl_jobs: bool = False) -> None:
    tried = failed = 0
    for _ in range(n):
        req = draw_rl(rng) if rl_jobs else draw(rng, 4)
        try:
            report = api.check_config(Request(**req))
        except (MeshplanError, ValidationError):
            continue
        in_effect = resolve(Request(**req))[1].model_dump()
        before = {f.id for f in report.findings}
        for found in (f for f in report.findings if f.severity == "error" and f.id != "LORA001"
                      and not NO_FIX.search(f.fix)):  # 'None of the changes ... fits': misses, named as no fix
            for alternative in alternatives(found.fix, found.id):
                fixed = applied(req, alternative, in_effect)
                if not fixed:
                    continue
                tried += 1
                try:
                    after = {f.id: f for f in api.check_config(Request(**fixed)).findings if f.severity == "error"}
                except (MeshplanError, ValidationError) as exc:
                    failed += 1
                    print("REFUSED", found.id, repr(alternative), req, "|", str(exc)[:200], flush=True)
                    continue
                again = found.id in after and not (
                    found.id in FIRST_OF_SEVERAL
                    and after[found.id].message.split(":")[0] != found.message.split(":")[0])
                # any error the fix brings in (one the estimate decides only where the plan was estimated before): a
                # degree's fix that moved dp against the stated batch (BS001, VL001, VL003, VL004, SK001) went unseen
                new = [r for r in after if r not in before and (report.memory is not None or r not in ESTIMATE_RULES)]
                if again or new:
                    failed += 1
                    print("FIX FAILS", found.id, repr(alternative), req, "->",
                          after[found.id].message[:160] if again else new, flush=True)
    print("fixes tried", tried, "failing", failed)


def memfix(rng: random.Random, n: int) -> None:
    compared = bad = 0
    for _ in range(n):
        req = draw(rng, 4)
        try:
            report = api.check_config(Request(**req))
        except (MeshplanError, ValidationError):
            continue
        found = next((f for f in report.findings if f.id == "MEM001"), None)
        if found is None:
            continue
        in_effect = resolve(Request(**req))[1].model_dump()
        for label, figure in named_layouts(found.fix):
            fixed = applied(req, label, in_effect) or req
            try:
                memory = api.check_config(Request(**fixed)).memory
            except MeshplanError as exc:
                bad += 1
                print("REFUSED", repr(label), req, str(exc)[:160], flush=True)
                continue
            compared += 1
            if memory is None or gib(memory.fit_bytes) != figure:
                bad += 1
                print("MISMATCH", repr(label), "said", figure, "request gives",
                      gib(memory.fit_bytes) if memory else None, req, flush=True)
    print("compared", compared, "bad", bad)


def _fields(request: Request, names) -> dict:
    job, plan = resolve(request)
    out = {}
    for name in names:
        if name in ("model", "num_gpus", "gpu"):
            continue
        if name in type(plan).model_fields:
            out[name] = getattr(plan, name)
        elif name in type(job).model_fields:
            out[name] = getattr(job, name)
        elif name == "job":
            out[name] = "lora" if job.lora else "rl" if job.rl else "train"
        elif name == "lora_rank":
            out[name] = job.lora.rank if job.lora else None
        else:
            out[name] = getattr(request, name)
    return out


def render(rng: random.Random, n: int) -> None:
    counts: dict[str, int] = {}
    for _ in range(n):
        req = draw(rng, 2)
        req.pop("num_gpus") if req["num_gpus"] < 8 else None
        req.setdefault("num_gpus", 8)
        if req.get("lora_rank") and req.get("job") != "lora":
            req.pop("lora_rank")
        try:
            request = Request(**req)
            rendered = api.render_config(req["framework"], request)
        except (MeshplanError, ValidationError) as exc:
            counts[refused(exc)] = counts.get(refused(exc), 0) + 1
            continue
        path = {"python": "run.py", "json": "ds_config.json", "yaml": "config.yaml", "toml": "job.toml"}.get(
            rendered.format, "run.sh")
        try:
            back = api.request_from_config(api.import_config(rendered.text, path=path, framework=req["framework"]),
                                           {k: req[k] for k in ("model", "num_gpus", "gpu")})
            before, after = _fields(request, req), _fields(back, req)
        except MeshplanError as exc:
            print("IMPORT REFUSED", req, str(exc)[:200], flush=True)
            continue
        counts["ok"] = counts.get("ok", 0) + 1
        if before != after:
            print("READS BACK", req, {k: (v, after[k]) for k, v in before.items() if after[k] != v}, flush=True)
    print(sorted(counts.items(), key=lambda kv: -kv[1])[:12])


def whole_step(rl_job):
    """An RL job with a mini-batch of the whole step written as no split (the config's mini-batch = its batch)."""
    if rl_job is not None and rl_job.prompts_per_mini_batch == rl_job.prompts_per_step:
        return rl_job.model_copy(update={"prompts_per_mini_batch": None})
    return rl_job


# Megatron's full recompute with recompute_method/num_layers unset is uniform over 1 layer (transformer_config.py):
# the rendered config writes it, the request left it open
SAME = {"recompute_layers": (None, 1), "recompute_method": (None, "uniform")}


def rl_read_back(req: dict, text: str) -> dict:
    """An RL request's rendered verl or SkyRL config `text` imported and resolved again: the plan and job fields that
    read back otherwise, as {field: (before, after)} (tests/test_random_requests.py too); an import refusal raises."""
    framework = req["framework"]
    back = api.request_from_config(api.import_config(text, path="run.sh", framework=framework),
                                   {k: req[k] for k in ("model", "gpu", "num_gpus")})
    (job, plan), (job_back, plan_back) = resolve(Request(**req)), resolve(back)
    a, b = plan.model_dump(), plan_back.model_dump()
    diff = {k: (v, b[k]) for k, v in a.items() if b[k] != v and SAME.get(k) != (v, b[k])}
    diff |= {k: (getattr(job, k), getattr(job_back, k)) for k in ("global_batch_size", "seq_length")
             if getattr(job, k) != getattr(job_back, k)}
    if whole_step(job.rl) != whole_step(job_back.rl):
        diff["rl"] = (job.rl, job_back.rl)
    return diff


def rl(rng: random.Random, n: int) -> None:
    for _ in range(n):
        framework = rng.choice(["verl", "skyrl"])
        req = dict(model=rng.choice(RL_MODELS), gpu=rng.choice(GPUS[:4]), num_gpus=rng.choice([8, 16, 32]),
                   framework=framework, job="rl")
        req |= {k: rng.choice(v) for k, v in RL_EXTRA.items() if rng.random() < 0.2}
        try:
            diff = rl_read_back(req, api.render_config(framework, Request(**req)).text)
        except (MeshplanError, ValidationError):
            continue
        if diff:
            print("READS BACK", req, diff, flush=True)


def draw_rl_pools(rng: random.Random) -> dict:
    """draw_rl's job, half of them with the rollout on a separate pool of its own GPUs (num_gpus counts both)."""
    req = draw_rl(rng)
    if rng.random() < 0.5:
        rollout = rng.choice([4, 8, 16])
        req |= {"placement": "separate", "rollout_gpus": rollout, "num_gpus": req["num_gpus"] + rollout}
    return req


def rl_step_faults(report, sequences: int) -> list[str]:
    """What an RL step's report must hold whatever the job: finite, non-negative parts; a step no shorter than its
    longest part and no longer than their sum (equal to it unless generation overlaps, which overlap_words then
    says); prefill + decode = generation; a replica decoding at most its share of the sequences at once, in waves of
    that batch; MFU in (0, 1]."""
    t, faults = report.rl, []
    parts = report.parts()
    if any(not math.isfinite(v) or v < 0 for v in (*parts.values(), t.step_s, t.decode_step_s)):
        faults.append(f"a part negative or not finite: {parts}")
    added = sum(parts.values())
    if not max(parts.values()) * (1 - 1e-9) <= t.step_s <= added * (1 + 1e-9):
        faults.append(f"step {t.step_s:.4g} s outside its longest part and its parts' sum {added:.4g} s")
    if (added > t.step_s * (1 + 1e-9)) != bool(t.overlap_words()):
        faults.append("the parts pass the step without a word, or a word without it")
    if not math.isclose(t.prefill_s + t.decode_s, t.generation_s, rel_tol=1e-9):
        faults.append(f"prefill {t.prefill_s:.4g} + decode {t.decode_s:.4g} != generation {t.generation_s:.4g}")
    dp = report.plan.rollout_dp
    share = -(-sequences // (t.replicas * dp)) * dp  # rl_step_time's per_dp_rank, over a replica's dp ranks
    if not 1 <= t.sequences_at_once <= share or t.decode_waves != -(-share // t.sequences_at_once):
        faults.append(f"{t.sequences_at_once} sequences at once, {t.decode_waves} waves, of a replica's share {share}")
    if not 0 < report.mfu <= 1:
        faults.append(f"MFU {report.mfu:.3g}")
    return faults


def rlparts(rng: random.Random, n: int) -> None:
    for _ in range(n):
        req = draw_rl_pools(rng)
        try:
            report = api.estimate_throughput(Request(**req))
            job, _ = resolve(Request(**req))
        except (MeshplanError, ValidationError):
            continue
        for fault in rl_step_faults(report, job.rl.prompts_per_step * job.rl.samples_per_prompt):
            print("RL STEP", req, fault, flush=True)


def faces(rng: random.Random, n: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from mcp_calls import call_tools

    tools = ("estimate_memory", "estimate_throughput", "check_config")
    calls = [(rng.choice(tools), draw(rng, 3)) for _ in range(n)]
    for (tool, req), result in zip(calls, call_tools(*calls), strict=True):
        try:
            answer = getattr(api, tool)(Request(**req)).model_dump(mode="json")
        except (MeshplanError, ValidationError) as exc:
            if not result.is_error:
                print("API REFUSED, TOOL ANSWERED", tool, req, str(exc)[:160], flush=True)
            continue
        if result.is_error:
            print("TOOL REFUSED, API ANSWERED", tool, req, result.content[0].text[:160], flush=True)
            continue
        sent = (result.structured_content or {}).get("result", result.structured_content or {})
        differ = [k for k in answer if k in sent and k not in ("summary", "next_steps") and answer[k] != sent[k]]
        if differ:
            print("DIFFER", tool, req, differ[:5], flush=True)


def recommend(rng: random.Random, n: int, slow: float) -> None:
    for _ in range(n):
        req = draw(rng, 2)
        for name in ("tp", "pp", "cp", "ep", "etp", "vpp", "zero_stage", "recompute", "micro_batch_size"):
            req.pop(name, None)  # the search's to choose
        start = time.time()
        try:
            rec = api.recommend(Request(**req), top_k=3)
        except (MeshplanError, ValidationError):
            continue
        if time.time() - start > slow:
            print(f"SLOW {time.time() - start:.1f} s recommend", req, flush=True)
        for c in rec.candidates:
            asked = {**req, **{k: v for k, v in c.plan.model_dump().items()
                               if k in Request.model_fields and v is not None}}
            if req.get("job") == "rl":
                asked.pop("global_batch_size", None)
            try:
                check = api.check_config(Request(**asked))
                errors_ = [f.id for f in check.findings if f.severity == "error"]
                if errors_:
                    print("CHECK REFUSES A PICK", errors_, asked, flush=True)
                if check.memory and gib(check.memory.fit_bytes) != gib(c.memory.fit_bytes):
                    print("MEMORY DIFFERS", gib(check.memory.fit_bytes), gib(c.memory.fit_bytes), asked, flush=True)
                step = api.estimate_throughput(Request(**asked)).step_time_s
                if abs(step - c.throughput.step_time_s) > 1e-6 * step:
                    print("STEP DIFFERS", step, c.throughput.step_time_s, asked, flush=True)
            except (MeshplanError, ValidationError) as exc:
                print("REFUSED A PICK", asked, str(exc)[:200], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", choices=("errors", "fixes", "rlfixes", "memfix", "render", "rl", "faces",
                                          "recommend", "rlparts"))
    parser.add_argument("seed", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("--slow", type=float, default=8.0, help="seconds over which an answer is printed as SLOW")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.sweep in ("errors", "recommend"):
        globals()[args.sweep](rng, args.n, args.slow)
    elif args.sweep == "rlfixes":
        fixes(rng, args.n, rl_jobs=True)
    else:
        globals()[args.sweep](rng, args.n)


if __name__ == "__main__":
    main()
