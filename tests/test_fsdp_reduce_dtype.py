"""FSDP2 gradient reduction in bf16 (grad_reduce_in_fp32=false) where the framework's config takes it: verl's and
SkyRL's FSDP engines (fsdp_config.mixed_precision.reduce_dtype) and NeMo AutoModel (distributed.mp_policy), not
torchtitan (training.mixed_precision_reduce is Literal['float32']) nor KempnerForge (default_mp_policy hard-codes
fp32). Memory: torch 2.13 foreach_reduce allocates the reduce-scatter input in reduce_dtype, and a bf16 reduce_dtype
(clamped to None as it equals param_dtype) keeps the gradients held between micro-batches in bf16; the step time's
reduce-scatter moves 2 bytes an element; render writes the key and import reads it back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_search_bounds_hold import check_bounds

from meshplan import api
from meshplan.adapters.parse import parse_plan
from meshplan.adapters.read import import_config
from meshplan.adapters.render import render
from meshplan.arithmetic.memory_states import accumulated_grad_bytes, memory_card, unsharded_grad_bytes, with_precision
from meshplan.check.config import check_config
from meshplan.estimate.fsdp_walk import FsdpUnit, fsdp_backward_moments
from meshplan.estimate.sharding_traffic import grad_reduce_bytes
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k, recommend

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
L8B = dict(model="llama-3.1-8b", num_gpus=8, zero_stage=3, global_batch_size=8)
RL = dict(job="rl", samples_per_prompt=8, prompt_length=512, response_length=1024, rollout_tp=4)


def _conv(framework: str, reduce_fp32: bool | None):
    job, plan = resolve(Request(**L8B, framework=framework, grad_reduce_in_fp32=reduce_fp32))
    return with_precision(job, plan)[1]


@pytest.mark.parametrize("framework", ["verl", "skyrl", "nemo-automodel"])
def test_the_reduce_scatter_input_follows_the_reduce_dtype(framework):
    """Of a unit's reduce (bf16 unsharded grads 2 + input 4) and the input held into the next unit (4), the input
    drops to 2 bytes; the unsharded gradients stay bf16; true reduces as the default does."""
    default, fp32, bf16 = (_conv(framework, r) for r in (None, True, False))
    assert (default.gathered_bytes, default.retained_reduce_bytes) == (6, 4)
    assert (fp32.gathered_bytes, fp32.retained_reduce_bytes) == (6, 4)
    assert (bf16.gathered_bytes, bf16.retained_reduce_bytes) == (4, 2)
    assert unsharded_grad_bytes(default) == unsharded_grad_bytes(bf16) == 2
    assert (bf16.unsharded_param_bytes, bf16.prefetched_bytes) == (default.unsharded_param_bytes,
                                                                   default.prefetched_bytes)


def test_the_walks_moments_at_both_dtypes():
    """A unit's reduce-scatter holds 2 B per parameter less, and every moment that still holds the previous unit's
    input 2 B per parameter of that unit less; the moments without a reduce-scatter buffer do not move."""
    units = [FsdpUnit("embedding", 10, 1), FsdpUnit("layer 0", 20, 100), FsdpUnit("layer 1", 1000, 300),
             FsdpUnit("output", 5, 40, loss=True)]
    fp32, bf16 = (_conv("verl", r).model_copy(update={"output_held_bytes": 0, "output_resharded_at_loss": False})
                  for r in (None, False))
    wide, narrow = ({m.name: m.transient for m in fsdp_backward_moments(c, units, 0, False)} for c in (fp32, bf16))
    assert wide["layer 1 reduce-scatter"] - narrow["layer 1 reduce-scatter"] == 2 * 1000
    assert wide["layer 0 backward"] - narrow["layer 0 backward"] == 2 * 1000  # layer 1's input still held
    assert wide["layer 1 backward"] - narrow["layer 1 backward"] == 2 * 5  # the output unit's
    assert wide["output backward"] == narrow["output backward"]


def test_the_gradients_held_between_micro_batches_are_bf16():
    """NeMo AutoModel defers the sync to the last micro-batch: FSDP2 keeps the unsharded gradient in reduce_dtype,
    4 B in fp32, 2 in bf16 (to_accumulated_grad_if_needed leaves the bf16 gradient as autograd accumulates it)."""
    card = framework_card("nemo-automodel")
    assert accumulated_grad_bytes(card, 4, True) == card.grad_accumulation.bytes_per_param == 4
    assert accumulated_grad_bytes(card, 4, True, reduce_fp32=True) == 4
    # 2: bf16's bytes stated here, not read from the card the function reads (which would pass whatever it held)
    assert accumulated_grad_bytes(card, 4, True, reduce_fp32=False) == memory_card().precision.dtype_bytes["bf16"] == 2
    assert accumulated_grad_bytes(card, 1, True, reduce_fp32=False) == 0  # one micro-batch holds nothing

    def report(reduce_fp32):
        return api.estimate_memory(Request(**{**L8B, "global_batch_size": 64}, framework="nemo-automodel",
                                           micro_batch_size=1, grad_reduce_in_fp32=reduce_fp32))

    fp32, bf16 = report(None), report(False)
    held = [r.stages[0].detail["unsharded_accumulated_gradients"] for r in (fp32, bf16)]
    assert held[0] == pytest.approx(2 * held[1], abs=2)
    assert bf16.stages[0].total_bytes < fp32.stages[0].total_bytes - held[1] * 0.99
    assert any("accumulated in bf16" in a for a in bf16.assumptions)
    assert any("accumulated in fp32" in a for a in fp32.assumptions)


def test_the_step_times_reduce_scatter_reads_the_dtype():
    job, plan = resolve(Request(**L8B, framework="verl", grad_reduce_in_fp32=False))
    cal = calibration(job.framework)
    assert grad_reduce_bytes(plan, cal) == 2
    assert grad_reduce_bytes(plan.model_copy(update={"grad_reduce_in_fp32": None}), cal) == cal.grad_reduce_bytes == 4
    fast, slow = (api.estimate_throughput(Request(**{**L8B, "num_gpus": 64, "global_batch_size": 128},
                                                  framework="verl", grad_reduce_in_fp32=r)) for r in (False, None))
    assert fast.step_time_s < slow.step_time_s


CASES = [("verl", "fsdp", RL, "run.sh", "++actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bf16"),
         ("verl", "sft-fsdp", {}, "run.sh", "++engine.mixed_precision.reduce_dtype=bf16"),
         ("skyrl", "fsdp", RL, "run.sh", "trainer.policy.fsdp_config.mixed_precision.reduce_dtype=bf16"),
         ("skyrl", "sft-fsdp", {}, "run.sh", "  fsdp_config.mixed_precision.reduce_dtype=bf16"),
         ("nemo-automodel", "yaml", {}, "recipe.yaml", 'reduce_dtype: "bfloat16"')]


@pytest.mark.parametrize("framework,variant,extra,name,written", CASES)
def test_render_writes_the_reduce_dtype_and_reads_it_back(framework, variant, extra, name, written):
    fields = dict(model="qwen3-8b", framework=framework, num_gpus=8, zero_stage=3, global_batch_size=64, **extra)
    job, plan = resolve(Request(**fields, grad_reduce_in_fp32=False))
    assert "PR004" not in {f.id for f in check_config(job, plan, include_memory=False).findings}
    result = render(framework, job, plan, variant=variant)
    assert result.variant == variant and written in result.text, result.text
    assert parse_plan(framework, variant, result.text, job.model.num_layers)["grad_reduce_in_fp32"] is False
    imported = import_config(result.text, name)
    assert imported.request["grad_reduce_in_fp32"] is False
    assert not [u for u in imported.unsupported if "mp_policy" in u or "mixed_precision" in u], imported.unsupported
    default = render(framework, *resolve(Request(**fields)), variant=variant)
    assert "reduce_dtype" not in default.text  # fp32: the framework's default, nothing written
    assert "grad_reduce_in_fp32" not in parse_plan(framework, variant, default.text, job.model.num_layers)


def test_verls_ppo_critic_reduces_as_the_actor():
    """verl's FSDP render writes the critic's engine config too (critic.fsdp), as its Megatron render the critic's
    optim fields; GRPO trains no critic and writes none."""
    def text(algorithm: str) -> str:
        job, plan = resolve(Request(model="qwen3-8b", framework="verl", num_gpus=8, zero_stage=3, global_batch_size=64,
                                    grad_reduce_in_fp32=False, **{**RL, "algorithm": algorithm}))
        return render("verl", job, plan).text

    assert "++critic.fsdp.mixed_precision.reduce_dtype=bf16" in text("ppo")
    assert "critic.fsdp.mixed_precision" not in text("grpo")


@pytest.mark.parametrize("framework,said", [
    ("torchtitan", "Literal['float32']"),
    ("kempnerforge", "reduce-dtype knob"),
])
def test_frameworks_without_a_bf16_reduce_still_refuse_it_with_their_reason(framework, said):
    job, plan = resolve(Request(**L8B, framework=framework, grad_reduce_in_fp32=False))
    found = {f.id: f for f in check_config(job, plan, include_memory=False).findings}
    assert found["PR004"].severity == "error" and said in found["PR004"].fix
    fp32 = resolve(Request(**L8B, framework=framework, grad_reduce_in_fp32=True))
    assert "PR004" not in {f.id for f in check_config(*fp32, include_memory=False).findings}


def test_verls_megatron_engine_keeps_its_zero_stage_reason():
    """The knob PR004 reads is the engine's the plan runs: verl's Megatron engine below ZeRO-1 still refuses."""
    job, plan = resolve(Request(**{**L8B, "zero_stage": 0}, framework="verl", grad_reduce_in_fp32=False))
    found = {f.id: f for f in check_config(job, plan, include_memory=False).findings}
    assert "zero_stage 1 only" in found["PR004"].message


def test_the_harness_moves_as_meshplan_does():
    """bench/fake_tensor_hf.py's verl steps with reduce_dtype fp32 and bf16 (FakeTensorMode, 8 ranks): where the
    loss decides nothing moves on either side; where a reduce-scatter decides, meshplan's drop is the harness's within
    3% and each peak is within 3% of the harness's."""
    steps = json.loads((ROOT / "bench" / "data" / "fake_tensor_hf.json").read_text())["steps"]
    pairs: dict[tuple[str, str], dict[str, dict]] = {}
    for row in steps:
        if row.get("reduce") and row["case"].endswith(" reduce"):
            pairs.setdefault((row["case"], row["policy"]), {})[row["reduce"]] = row
    assert len(pairs) == 6
    for (case, policy), pair in pairs.items():
        fp32, bf16 = pair["fp32"], pair["bf16"]
        theirs = fp32["framework_peak_bytes"] - bf16["framework_peak_bytes"]
        ours = fp32["meshplan_allocated_bytes"] - bf16["meshplan_allocated_bytes"]
        if case.startswith("llama-3.1-8b reduce"):
            assert theirs == ours == 0, (case, policy)
        else:
            assert theirs > 0.5 * GIB and ours == pytest.approx(theirs, rel=0.03), (case, policy)
        assert all(abs(r["diff_pct"]) < 3 for r in (fp32, bf16)), (case, policy)


@pytest.mark.parametrize("framework", ["verl", "nemo-automodel"])
def test_the_search_bounds_stay_under_the_estimate_with_a_bf16_reduce(framework):
    """The step-time bounds (a ZeRO-3 stage's traffic per micro-batch, the DP sync) read the request's reduce dtype as
    the estimate does: none over any plan's estimate (tests/test_search_bounds_hold.py's check)."""
    req = Request(model="qwen3-8b", num_gpus=16, gpu="h100", framework=framework, zero_stage=3,
                  grad_reduce_in_fp32=False)
    assert check_bounds(req, stride=1) >= 40


@pytest.mark.parametrize("framework", ["verl", "nemo-automodel"])
def test_recommend_matches_the_oracle_with_a_bf16_reduce(framework):
    """The memory floors (search/floors.py) never exceed an estimate the reduce dtype lowered: the search's top
    layouts are the exhaustive oracle's."""
    req = Request(model="llama-3.1-8b", num_gpus=8, gpu="h100", framework=framework, zero_stage=3, seq_length=8192,
                  global_batch_size=64, grad_reduce_in_fp32=False)
    oracle = exhaustive_top_k(req, 3)
    rec = recommend(req, top_k=3)
    assert oracle and [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12)
    assert {c.memory.peak_bytes for c in rec.candidates} <= {r.peak_bytes for r in oracle}


@pytest.mark.slow
def test_fsdp2_holds_the_unsharded_gradient_in_the_reduce_dtype():
    """Under FakeTensorMode (bench/fake_tensor_hf_harness.py accumulation_probe: verl's wrap of a 2-layer
    Llama-3.1-8B cut, 8 ranks, one micro-batch with gradient sync off after a full step), what the backward leaves
    held is every parameter's unsharded gradient, at accumulated_grad_bytes's bytes to the byte: 4 with reduce_dtype
    fp32 (FSDPParam's fp32 accumulated gradient), 2 with bf16 (the gradient autograd wrote)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import fake_tensor_hf as bench

    spec = {"kind": "accumulate", "model": "llama-3.1-8b", "config": bench.card_config("llama-3.1-8b"),
            "num_layers": 2, "tokens": 512, "world": 8, "policy": "full", "override": {}}
    result = bench.served_harness([{**spec, "reduce": r} for r in ("fp32", "bf16")])
    card = framework_card("nemo-automodel")
    for res in result["results"]:
        assert res["ok"], res
        held = res["after"]["Total"] - res["before"]["Total"]
        per = accumulated_grad_bytes(card, 2, True, reduce_fp32=False if res["reduce"] == "bf16" else None)
        assert held == per * res["params"], res
