"""The search space: world-size laws per framework, divisor-only enumeration, and the bounds the search prunes with.

The bounds are only allowed to prune because they never exceed what the estimators compute; the last tests
check that against estimate_memory on sampled plans of several models and frameworks.
"""

import random

import pytest

from meshplan.arithmetic.schedule import pipeline_split
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.cards import framework_card
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.request import Request
from meshplan.search import search_job
from meshplan.search.floors import first_stage_floor, layout_floor, ranks_floor
from meshplan.search.space import (
    Fixed,
    Layout,
    divisors,
    enumerate_layouts,
    micro_batches,
    states_lower_bound,
    zero_ladder,
)


def job_for(model: str, num_gpus: int, framework: str = "megatron-core", **extra):
    return search_job(Request(model=model, num_gpus=num_gpus, framework=framework, **extra))[0]


def test_divisors():
    assert divisors(1) == (1,)
    assert divisors(64) == (1, 2, 4, 8, 16, 32, 64)
    assert divisors(36) == (1, 2, 3, 4, 6, 9, 12, 18, 36)
    assert divisors(97) == (1, 97)


@pytest.mark.parametrize(("layers", "pp", "split"), [
    (80, 4, (None, None)),      # even
    (61, 16, (3, 2)),           # DeepSeek-V3: 3 + 14x4 + 2, the split PP001's fix names
    (46, 4, (11, 11)),          # GLM-4.5-Air: 11 + 12 + 12 + 11
    (94, 16, (5, 5)),           # Qwen3-235B: 5 + 14x6 + 5
    (7, 2, (4, 3)),             # the lighter stage last: it also holds the output layer and loss
    (80, 32, None),             # only 10 + 30x2 + 10 adds up: its heaviest stage is not ceil(80/32) = 3
    (4, 8, None),               # deeper than the model
])
def test_pipeline_split(layers, pp, split):
    assert pipeline_split(layers, pp) == split
    if split and split[0] is not None:
        first, last = split
        assert (layers - first - last) % (pp - 2 or 1) == 0


def test_megatron_law_folds_experts_into_the_same_ranks():
    job = job_for("mixtral-8x7b", 64)
    layouts, _ = enumerate_layouts(job, Fixed())
    assert layouts
    for lay in layouts:
        assert lay.tp * lay.pp * lay.cp * lay.dp == 64
        assert (64 // lay.pp) % (lay.ep * lay.etp) == 0
        assert 8 % lay.ep == 0 and lay.tp % lay.etp == 0
    assert any(lay.ep == 8 and lay.pp == 4 for lay in layouts)
    assert any(lay.etp > 1 for lay in layouts)


def test_torchtitan_law_has_no_expert_tp_and_ep_divides_dp_cp_tp():
    job = job_for("mixtral-8x7b", 64, "torchtitan")
    layouts, _ = enumerate_layouts(job, Fixed())
    assert layouts and all(lay.etp == 1 for lay in layouts)
    for lay in layouts:
        assert lay.tp * lay.pp * lay.cp * lay.dp == 64
        assert (lay.dp * lay.cp * lay.tp) % lay.ep == 0


def test_kempnerforge_law_gives_experts_ranks_of_their_own():
    job = job_for("mixtral-8x7b", 64, "kempnerforge")
    layouts, _ = enumerate_layouts(job, Fixed())
    assert any(lay.ep > 1 for lay in layouts)
    for lay in layouts:
        assert lay.tp * lay.pp * lay.cp * lay.dp * lay.ep == 64
        assert lay.etp == 1


def test_deepspeed_searches_no_cp_and_no_interleaving():
    job = job_for("llama-3.1-8b", 16, "deepspeed")
    layouts, _ = enumerate_layouts(job, Fixed())
    assert all(lay.cp == 1 and lay.vpp == 1 for lay in layouts)
    assert zero_ladder(framework_card("deepspeed")) == (0, 1, 2, 3)


def test_zero_ladder_skips_identical_presets():
    # Megatron's stage 2 keeps the full grad buffer, so it is the same bytes as stage 1 and is not searched twice.
    assert zero_ladder(framework_card("megatron-core")) == (0, 1, 3)
    assert zero_ladder(framework_card("nanotron")) == (0, 1)


def test_fixed_fields_and_prefilter_groups():
    job = job_for("llama-3.1-70b", 64)
    layouts, dropped = enumerate_layouts(job, Fixed({"tp": 8, "pp": 4}))
    assert layouts and all(lay.tp == 8 and lay.pp == 4 for lay in layouts)
    # 64 heads and 8 KV heads: tp in {1, 2, 4, 8, 16, 32, 64} all pass Megatron's rule; pp=32/64 have no split that
    # keeps the heaviest stage at ceil(80/pp) (80 over 32 only adds up as 10 + 30x2 + 10)
    layouts, dropped = enumerate_layouts(job, Fixed())
    assert any(g.reason == "pp-layers" and g.example.pp in (32, 64) for g in dropped)
    assert not any(lay.pp in (32, 64) for lay in layouts)
    qwen = job_for("qwen2.5-7b", 12)  # 28 heads, 4 KV heads: tp 3 and 6 break the head split
    _, dropped = enumerate_layouts(qwen, Fixed())
    assert any(g.reason == "tp-heads" and g.example.tp in (3, 6, 12) for g in dropped)


def test_micro_batches_divide_the_local_batch():
    job = job_for("llama-3.1-8b", 8, global_batch_size=48)
    layouts, _ = enumerate_layouts(job, Fixed({"tp": 1, "pp": 1, "cp": 1}))
    assert micro_batches(job, layouts[0], Fixed()) == (1, 2, 3, 6)
    assert micro_batches(job, layouts[0], Fixed({"micro_batch_size": 4})) == ()


CASES = [
    ("llama-3.1-70b", 64, "megatron-core"),
    ("deepseek-v3", 1024, "megatron-core"),
    ("mixtral-8x7b", 64, "torchtitan"),
    ("qwen3-30b-a3b", 16, "kempnerforge"),
    ("llama-3.1-8b", 8, "deepspeed"),
    ("gpt-oss-20b", 16, "verl"),
    ("glm-4.5-air", 64, "megatron-bridge"),
    ("llama-3.1-8b", 16, "nanotron"),
    ("kimi-k2", 256, "megatron-core"),
    ("qwen3-235b-a22b", 256, "megatron-bridge"),
    ("qwen3-next-80b-a3b", 32, "megatron-bridge"),  # hybrids: floors per layer kind (arithmetic/mamba.py)
    ("nemotron-3-nano-30b-a3b", 16, "megatron-core"),
]


@pytest.mark.parametrize(("model", "gpus", "framework"), CASES)
def test_memory_bounds_never_exceed_the_estimate(model, gpus, framework):
    """The search drops plans whose floor is over capacity without estimating them: the floor must be a floor."""
    rng = random.Random(7)
    job = job_for(model, gpus, framework)
    layouts, _ = enumerate_layouts(job, Fixed())
    checked = 0
    for lay in rng.sample(layouts, min(120, len(layouts))):  # 120: AD001 blocks FSDP2's zero_stage 1
        sizes = micro_batches(job, lay, Fixed())
        if not sizes:
            continue
        for zero in zero_ladder(framework_card(framework)):
            for recompute in ("none", "selective", "full"):
                mbs = rng.choice(sizes[:4])
                sp = lay.tp > 1
                plan = lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs, sequence_parallel=sp,
                                cp_comm_type="p2p")
                try:
                    report = estimate_memory(job, plan)
                except EstimateBlocked:  # a structural error: the search drops it before any bound
                    continue
                peak = report.peak_bytes
                assert first_stage_floor(job, lay, zero, recompute, mbs, sp) <= peak * (1 + 1e-9), plan
                assert layout_floor(job, lay, zero) <= peak * (1 + 1e-9), plan
                assert ranks_floor(job, lay, zero) <= report.fit_bytes * (1 + 1e-9), plan
                from meshplan.search.space import params_split

                assert states_lower_bound(job, lay, zero, params_split(job)) <= peak * (1 + 1e-9), plan
                checked += 1
    assert checked > 50


def test_memory_floors_take_off_fp8_primary_weights():
    """Megatron-Bridge keeps fp8 weights in place of the bf16 ones under fp8 (fp8_param_gather, its presets'
    default): on Blackwell (one fp8 copy in any layout) the estimate's weights fall by a byte per linear-layer
    parameter (a negative conv.fp8_weight_bytes), which the floors left out, so they stood over the estimate
    (Mistral-7B on 2 B200, CP2 ZeRO-0 mbs 1: first-stage floor 131.2 GB against a 126.5 GB peak).
    search.space.fp8_primary_weights takes it off the unsharded weights."""
    rng = random.Random(3)
    job = job_for("mistral-7b", 2, "megatron-bridge", precision="fp8", gpu="b200", seq_length=1024,
                  global_batch_size=16)
    layouts, _ = enumerate_layouts(job, Fixed())
    checked = 0
    for lay in rng.sample(layouts, min(40, len(layouts))):
        sizes = micro_batches(job, lay, Fixed())
        for zero in zero_ladder(framework_card("megatron-bridge")):
            for recompute in ("none", "full"):
                sp = lay.tp > 1
                mbs = sizes[0]
                plan = lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs, sequence_parallel=sp,
                                cp_comm_type="p2p")
                try:
                    report = estimate_memory(job, plan)
                except EstimateBlocked:
                    continue
                assert first_stage_floor(job, lay, zero, recompute, mbs, sp) <= report.peak_bytes, plan
                assert layout_floor(job, lay, zero) <= report.peak_bytes, plan
                assert ranks_floor(job, lay, zero) <= report.fit_bytes, plan
                checked += 1
    assert checked > 10


@pytest.mark.parametrize("model", ["qwen3-next-80b-a3b", "nemotron-3-nano-30b-a3b"])
@pytest.mark.parametrize("recompute", ["selective", "none"])
@pytest.mark.parametrize(("tp", "pp", "ep", "etp", "mbs"), [(2, 4, 4, 2, 4), (1, 2, 16, 1, 1), (2, 2, 8, 2, 2)])
def test_a_hybrid_s_first_stage_floor_counts_each_layer_at_its_kind(model, recompute, tp, pp, ep, etp, mbs):
    """A hybrid's first-stage floor took one least for its layers of every kind but MoE (Qwen3-Next's 48 mixers at an
    attention layer's 196 MiB without recompute, where its 36 Gated DeltaNet ones save 474 MiB each at TP2), and its
    selective floor took every recompute module (moe, moe_act, ...), which no searched plan recomputes (recommend
    refuses recompute_modules; its plans run Megatron's default, core_attn, as the estimate does): an MoE layer's
    routed rows were left out, 32 MiB for its 335. The floor was 0.45-0.82 of the stage's estimate, and recommend
    estimated some 6,000 Qwen3-Next layouts on 32 H100 that it should have refused; now it is over 0.85."""
    dp = 32 // (tp * pp)
    job = job_for(model, 32, "megatron-bridge")
    lay = Layout(tp=tp, pp=pp, cp=1, ep=ep, etp=etp, dp=dp)
    plan = lay.plan(zero_stage=1, recompute=recompute, micro_batch_size=mbs, sequence_parallel=tp > 1,
                    cp_comm_type="p2p")
    stage = estimate_memory(job, plan).stages[0]
    floor = first_stage_floor(job, lay, 1, recompute, mbs, tp > 1, reserved=False)
    assert 0.85 * stage.total_bytes <= floor <= stage.total_bytes
