"""A rule's fix names changes that work: applied to the request, the rule it fixes no longer fires, and no change it
names is one the framework's adapter refuses (AD001) or one that breaks the GPU count's tiling (WS*, AM001). Checked on
a seeded sample of refused layouts over every framework, each fix read as `check --config` reads it
(adapters/read/fixes.fix_changes: one request change per alternative; `drop <field>` clears it)."""

from __future__ import annotations

import random
import re

import pytest

from meshplan import api
from meshplan.adapters.read.fixes import fix_changes
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.request.resolve import resolve
from meshplan.rules.engine import load_rules
from meshplan.rules.pipeline import MICROBATCH_RULES
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.request import Request

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "mixtral-8x7b", "qwen3-30b-a3b")
EXTRA = {"recompute": ["none", "selective", "full"], "precision": ["bf16", "fp8"], "sequence_parallel": [True, False],
         "moe_token_dispatcher": ["alltoall", "flex"], "moe_a2a_overlap": [True], "tp_comm_overlap": [True],
         "optimizer_offload": [True], "activation_offload": [True], "cp_comm_type": ["a2a", "p2p"],
         "dp_replicate": [2], "micro_batch_size": [1, 2, 4], "optimizer": ["muon", "adam"],
         "fp8_recipe": ["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"],
         "zero_stage": [0, 1, 2, 3], "pipeline_schedule": ["1f1b", "interleaved_1f1b", "zero_bubble", "dualpipev",
                                                           "gpipe"]}
# Rules that name the first of several settings a framework lacks: fixing it may reveal the next one (another setting).
FIRST_OF_SEVERAL = ("AD001", "NT001", "OF001")
NEW_ERRORS = ("AD001", "WS001", "WS002", "WS004", "WS006", "AM001")  # a change must not bring these in


def sampled_requests(seed: int, n: int):
    rng = random.Random(seed)
    for _ in range(n):
        req = dict(model=rng.choice(MODELS), framework=rng.choice(FRAMEWORKS), gpu="h100",
                   num_gpus=rng.choice([8, 16, 24, 64]), tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 1, 2, 3, 4, 8]),
                   vpp=rng.choice([1, 2, 2, 3]), global_batch_size=rng.choice([16, 64, 256]))
        if rng.random() < 0.3:
            req["ep"] = rng.choice([2, 4, 8])
        if rng.random() < 0.2:
            req["cp"] = 2
        for name in rng.sample(sorted(EXTRA), 3):
            req[name] = rng.choice(EXTRA[name])
        yield req


def structural(req: dict):
    job, plan = resolve(Request(**req))
    return check_config(job, plan, include_memory=False).findings, plan


def applied(fix: str, req: dict, current: dict) -> list[dict]:
    """Each alternative of the fix as the request it makes (fix_changes per alternative, `drop x` clearing x)."""
    out = []
    for alternative in re.split(r",?\s+or\s+", fix):
        change = (fix_changes(alternative, current) or [{}])[0]
        change |= {name: None for name in re.findall(r"\b[Dd]rop ([a-z][a-z0-9_]*)", alternative)
                   if name in Request.model_fields}
        if change:
            out.append({k: v for k, v in {**req, **change}.items() if v is not None})
    return out


def broken(req: dict, found, before: set[str]) -> list[str]:
    """What is still wrong once the fix's change is applied: the rule itself (for a first-of-several rule, on the same
    setting), or an adapter/world-size error the change brought in."""
    try:
        after = {f.id: f for f in structural(req)[0] if f.severity == "error"}
    except MeshplanError as exc:
        return [f"refused: {exc}"]
    out = []
    if found.id in after and not (found.id in FIRST_OF_SEVERAL and
                                  after[found.id].message.split(":")[0] != found.message.split(":")[0]):
        out.append(f"{found.id} again: {after[found.id].message}")
    out += [f"{r} brought in: {after[r].message}" for r in NEW_ERRORS if r in after and r not in before]
    return out


@pytest.mark.parametrize("seed", range(3))
def test_every_concrete_fix_clears_its_rule_without_an_adapter_or_tiling_error(seed):
    failures, tried = [], 0
    for req in sampled_requests(seed, 150):
        try:
            findings, plan = structural(req)
        except MeshplanError:
            continue
        before = {f.id for f in findings}
        current = {**plan.model_dump(), **req}
        for found in findings:
            if found.severity != "error":
                continue
            for fixed in applied(found.fix, req, current):
                tried += 1
                failures += [f"{req} {found.id} fix {found.fix!r} -> {fixed}: {why}"
                             for why in broken(fixed, found, before)]
    assert tried > 300
    assert not failures, "\n".join(failures[:5])


def fix_of(rule_id: str, **fields) -> str:
    return next(f.fix for f in api.check_config(Request(**fields)).findings if f.id == rule_id)


def test_vpp_without_a_pipeline_names_only_pipelines_the_framework_runs_at_this_gpu_count():
    # SkyRL runs no virtual stages (AD001), and at 8 GPUs with tp=8 no pp > 1 tiles: vpp=1 alone (it said "or use pp>1")
    assert fix_of("PP003", model="llama-3.1-8b", framework="skyrl", gpu="h100", num_gpus=8, tp=8, pp=1, vpp=2) == \
        "Set vpp=1."
    # Megatron-Core at 8 GPUs, tp=2: pp 2 and 4 tile the count and split 32 layers into pp*2 chunks; 8 needs 16 GPUs
    assert fix_of("PP003", model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, vpp=2) == \
        "Set vpp=1, or pp in {2, 4} with vpp=2."
    # verl's FSDP engine (zero_stage 3) has no pipeline at all
    assert fix_of("PP003", model="llama-3.1-8b", framework="verl", gpu="h100", num_gpus=8, zero_stage=3,
                  vpp=2) == "Set vpp=1."


def test_torchtitan_refuses_virtual_stages_without_a_pipeline():
    """torchtitan builds its pipeline (pipeline_parallel_schedule, layers_per_stage) only when pp > 1 and runs the
    model whole at pp=1: TP8 PP1 VPP2 was reported ok under that name; PP003 now refuses it, with pps that work."""
    fields = dict(model="llama-3.1-70b", framework="torchtitan", gpu="h100", num_gpus=64, tp=8, pp=1, dp=8, vpp=2)
    report = api.check_config(Request(**fields))
    pp003 = next(f for f in report.findings if f.id == "PP003")
    assert "torchtitan builds no pipeline at pp=1" in pp003.message
    assert pp003.fix == "Set vpp=1, or pp in {2, 4, 8} with vpp=2."
    for pp in (2, 4, 8):
        ids = {f.id for f in api.check_config(Request(**{**fields, "pp": pp, "dp": 64 // (8 * pp)})).findings
               if f.severity == "error"}
        assert not ids & {"PP003", "AD001", "WS004", "PP007"}, (pp, ids)


def test_named_schedules_offer_virtual_stages_only_where_the_framework_runs_them():
    # SkyRL: interleaved_1f1b at vpp=1 said "Use vpp=2", which AD001 refuses there
    fix = fix_of("PP013", model="llama-3.1-8b", framework="skyrl", gpu="h100", num_gpus=64, tp=8, pp=2, vpp=1,
                 pipeline_schedule="interleaved_1f1b")
    assert "vpp=2" not in fix and fix == "Use pipeline_schedule=1f1b, or leave it out."
    # ...and at pp=1 it named pp >= 2 with vpp=2
    assert fix_of("PP013", model="llama-3.1-8b", framework="deepspeed", gpu="h100", num_gpus=64, tp=2,
                  pipeline_schedule="zero_bubble") == "Leave pipeline_schedule out."
    assert fix_of("PP013", model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, pipeline_schedule="zero_bubble") == \
        "Use pp in {2, 4} with vpp=2, or leave pipeline_schedule out."


def test_offload_and_precision_fixes_clear_the_setting_they_replace():
    # OF001 named the nearest knob (recompute=full) but left the offload on, so OF001 fired again
    assert fix_of("OF001", model="llama-3.1-8b", framework="skyrl", gpu="h100", num_gpus=8, zero_stage=1,
                  activation_offload=True).startswith("Set activation_offload=false; ")
    # PR003 offered precision=fp8 for a recipe the GPU cannot run (mxfp8 on H100), refused again under fp8
    assert fix_of("PR003", model="llama-3.1-8b", gpu="h100", num_gpus=8, fp8_recipe="mxfp8") == \
        "Drop fp8_recipe (mxfp8 does not run on NVIDIA H100 SXM5 80GB with Megatron-Core / Megatron-LM)."
    assert fix_of("PR003", model="llama-3.1-8b", gpu="h100", num_gpus=8, fp8_recipe="blockwise") == \
        "Use precision=fp8 with it, or drop fp8_recipe."
    # PR005 at ZeRO-2 named zero_stage=1, where the optimizer offload is refused next
    assert fix_of("PR005", model="llama-3.1-8b", gpu="h100", num_gpus=8, zero_stage=2, optimizer="muon",
                  optimizer_offload=True).startswith("Use zero_stage=1 and optimizer_offload=false ")


def test_deepspeed_offloads_the_whole_optimizer_at_zero_1():
    """offload_optimizer runs at ZeRO stages 1-3; only a ratio below 1 (ZeRO-Offload++) needs ZeRO-3. The resolver's
    fraction 1.0 beside optimizer_offload is the whole optimizer: OF001 refused it at ZeRO-1 and told the user to drop a
    fraction they never gave."""
    base = dict(model="llama-3.1-8b", framework="deepspeed", gpu="h100", num_gpus=8, optimizer_offload=True)
    assert "OF001" not in {f.id for f in api.check_config(Request(**base)).findings}
    assert "OF001" in {f.id for f in api.check_config(Request(**base, optimizer_offload_fraction=0.5)).findings}


MESH_PRODUCT = {"torchtitan": "WS004", "nemo-automodel": "AM001", "kempnerforge": "WS006"}


@pytest.mark.parametrize("framework", sorted(MESH_PRODUCT))
def test_a_mesh_product_fix_names_only_changes_that_work_with_dp_given_or_derived(framework):
    """WS004, AM001 and WS006 ended with 'or leave dp to be derived' even where dp already was (the GPU count is off the
    multiples of the model-parallel product: deriving changes nothing), and named GPU counts a dp given explicitly does
    not fill. Every alternative, each GPU count listed included, applied, now clears the rule; 'drop dp' only where dp
    was given and the derived one tiles the count."""
    rule_id, failures, tried = MESH_PRODUCT[framework], [], 0
    for num_gpus, tp, pp, dp in ((g, t, p, d) for g in (8, 12, 16, 24) for t in (2, 4, 8) for p in (1, 2)
                                 for d in (None, 1, 2, 3)):
        req = {k: v for k, v in dict(model="mixtral-8x7b", framework=framework, gpu="h100", num_gpus=num_gpus, tp=tp,
                                     pp=pp, dp=dp, ep=2 if framework == "kempnerforge" else None).items()
               if v is not None}
        try:
            findings, plan = structural(req)
        except MeshplanError:
            continue
        found = next((f for f in findings if f.id == rule_id), None)
        if found is None:
            continue
        current = {**plan.model_dump(), **req}
        every_count = re.sub(r"num_gpus = (\d+) or (\d+)", r"num_gpus = \1, or num_gpus = \2", found.fix)
        alternatives = applied(every_count, req, current)
        assert alternatives, f"{req}: {found.fix!r} names no change"
        unit = plan.tp * plan.pp * plan.cp * (plan.ep if framework == "kempnerforge" else 1)
        assert ("drop dp" in found.fix) == (dp is not None and dp != max(1, num_gpus // unit) and num_gpus % unit == 0)
        for fixed in alternatives:
            if "dp" in fixed and "dp = num_gpus/" in found.fix:  # a dp given as derived follows the count, the fix says
                fixed["dp"] = fixed["num_gpus"] // unit
            tried += 1
            failures += [f"{req} fix {found.fix!r} -> {fixed}: {why}"
                         for why in broken(fixed, found, {f.id for f in findings})]
    assert tried > 20
    assert not failures, "\n".join(failures[:5])


def test_a_mesh_product_fix_offers_deriving_dp_only_where_it_was_given():
    torchtitan = dict(model="llama-3.1-8b", framework="torchtitan", gpu="h100", tp=8)
    assert fix_of("WS004", **torchtitan, num_gpus=12) == \
        "Use num_gpus = 8 or 16 (multiples of cp*tp*pp = 8; dp = num_gpus/8)."
    assert fix_of("WS004", **torchtitan, num_gpus=16, dp=1) == (
        "Use num_gpus = dp*cp*tp*pp = 1*8 = 8, or drop dp (data_parallel_shard_degree=-1 derives 16/(cp*tp*pp) = 16/8 "
        "= 2).")
    assert fix_of("WS004", **torchtitan, num_gpus=12, dp=2) == "Use num_gpus = dp*cp*tp*pp = 2*8 = 16."
    assert fix_of("AM001", **{**torchtitan, "framework": "nemo-automodel"}, num_gpus=24, dp=1).endswith(
        ", or drop dp (dp_size: null derives 24/(cp*tp*pp) = 24/8 = 3).")
    assert fix_of("WS006", model="mixtral-8x7b", framework="kempnerforge", gpu="h100", tp=4, ep=2, num_gpus=12) == \
        "Use num_gpus = 8 or 16 (multiples of tp*pp*cp*ep = 8; dp = num_gpus/8)."


@pytest.mark.parametrize("seed", range(3))
def test_pipeline_sizes_a_fix_names_pass_the_micro_batch_rules(seed):
    """PP003 and PP013 named every pp that splits the layers and tiles the GPUs; at the job's global batch some of those
    leave a micro-batch count that PP005/PP011 (or AM003, PP014) refuse. Each pp they name (every one of the set), with
    its vpp, applied, now passes them."""
    failures, tried = [], 0
    for req in sampled_requests(seed, 300):
        try:
            findings = structural(req)[0]
        except MeshplanError:
            continue
        for found in (f for f in findings if f.id in ("PP003", "PP013")):
            named = re.search(r"pp in \{([\d, ]+)\} with vpp=(\d+)", found.fix)
            for pp in [int(v) for v in named.group(1).split(", ")] if named else []:
                tried += 1
                after = {f.id for f in structural({**req, "pp": pp, "vpp": int(named.group(2))})[0]
                         if f.severity == "error"}
                if after & set(MICROBATCH_RULES):
                    failures.append(f"{req} {found.id} fix {found.fix!r} -> pp={pp}: "
                                    f"{sorted(after & set(MICROBATCH_RULES))}")
    assert tried > 30
    assert not failures, "\n".join(failures[:5])


def test_pp003_names_the_pipeline_sizes_the_batch_rules_pass_and_says_when_none_does():
    # torchtitan, 64 GPUs at tp=8, 20 sequences: pp=2 leaves 5 micro-batches over 2 rounds (torch's interleaved 1F1B
    # refuses them: PP011); pp=4 and pp=8 leave 10 and 20, which divide into their rounds
    assert fix_of("PP003", model="llama-3.1-70b", framework="torchtitan", gpu="h100", num_gpus=64, tp=8, vpp=2,
                  global_batch_size=20) == "Set vpp=1, or pp in {4, 8} with vpp=2."
    # Megatron-Core, 8 GPUs, 12 sequences: pp 2, 4, 8 leave 3, 6, 12 micro-batches, none a multiple of pp (PP005)
    assert fix_of("PP003", model="llama-3.1-8b", gpu="h100", num_gpus=8, vpp=2, global_batch_size=12) == (
        "Set vpp=1 (pp {2, 4, 8} would split the layers into pp*vpp chunks, but at a global batch of 12 each breaks "
        "PP005).")


def test_pp003_and_pp013_read_what_the_micro_batch_rules_they_run_read():
    """Their verdicts are kept per the fields they read (engine.Verdicts): those include what the micro-batch rules read
    (but pp, vpp and dp, which the fix sets itself)."""
    conditions = load_rules()
    needed = {name for r in MICROBATCH_RULES for name in conditions[r].reads} - {"pp", "vpp", "dp"}
    for rule_id in ("PP003", "PP013"):
        assert needed <= set(conditions[rule_id].reads), (rule_id, needed - set(conditions[rule_id].reads))


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_rollout_replicas_fix_names_no_rollout_gpus_a_colocated_engine_cannot_take(framework):
    """RL002's fix offered 'rollout_gpus 6 or 9' for a colocated engine on 8 GPUs, which RL003 refuses (the engines
    span exactly the trainer's GPUs) or which is more than the job has; apart, the engine's own count is a fix."""
    rl = {"model": "qwen2.5-7b", "framework": framework, "gpu": "h100", "num_gpus": 8, "job": "rl", "rollout_tp": 3}
    colocated = fix_of("RL002", **rl)
    assert "rollout_gpus" not in colocated and "{1, 2, 4, 8}" in colocated
    assert "rollout_gpus 3 or 6" in fix_of("RL002", **{**rl, "num_gpus": 12}, placement="separate", rollout_gpus=4)


def test_rollout_ep_fix_names_a_tp_and_dp_whose_product_is_the_ep():
    """RL001 (rollout EP must be rollout TP x DP) offered 'rollout_dp=2 with rollout_tp=3' for rollout_ep=4 at TP3 DP2,
    the layout it refuses: where TP does not divide the EP, the fix takes the largest TP that does."""
    req = {"model": "qwen3-30b-a3b", "framework": "verl", "gpu": "h100", "num_gpus": 16, "job": "rl", "zero_stage": 3,
           "rollout_tp": 3, "rollout_dp": 2, "rollout_ep": 4, "rollout_gpus": 16}
    findings, plan = structural(req)
    found = next(f for f in findings if f.id == "RL001")
    assert "rollout_dp=2 with rollout_tp=2" in found.fix, found.fix
    for fixed in applied(found.fix, req, {**plan.model_dump(), **req}):
        assert "RL001" not in {f.id for f in structural(fixed)[0]}, (found.fix, fixed)


@pytest.mark.parametrize(("framework", "algorithm", "layout", "total"), [
    # the trainer's 32 + the rollout engine's 2; the trainer's 24 (26 in all) leaves dp 3, which the step does not
    # divide (VL001), so the fix leaves it out (rules/fix_values.kept_counts)
    ("verl", "grpo", {"zero_stage": 1, "tp": 4, "pp": 2}, 34),
    ("skyrl", "ppo", {"zero_stage": 3, "cp": 4}, 58),  # the policy's 28, the critic's as many, the rollout engine's 2
])
def test_world_size_fixes_name_the_gpu_count_an_rl_job_placed_apart_passes(framework, algorithm, layout, total):
    """With the rollout placed apart the trainer's world is num_gpus less the engine's GPUs (and, for SkyRL's PPO, half
    of the rest): WS001 said 'num_gpus=30' of a request for 32 and offered 'num_gpus = 24 or 32', counts of the
    trainer's that the request's num_gpus then splits again (24 left 22 to the trainer, WS001 once more)."""
    req = {"model": "qwen2.5-7b", "framework": framework, "gpu": "h100", "num_gpus": 32 if algorithm == "grpo" else 62,
           "job": "rl", "algorithm": algorithm, "placement": "separate", "rollout_gpus": 2, **layout}
    findings, plan = structural(req)
    found = next(f for f in findings if f.id == "WS001")
    assert f"num_gpus={req['num_gpus']}" in found.message and "the trainer's 30 GPUs" in found.message, found.message
    assert f"num_gpus = {total} " in found.fix, found.fix
    for fixed in applied(found.fix, req, {**plan.model_dump(), **req}):
        assert "WS001" not in {f.id for f in structural(fixed)[0]}, (found.fix, fixed)
