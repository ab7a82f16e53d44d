"""recommend and the knobs it does not enumerate as degrees: the EP all-to-all overlap it chooses per plan (rule EP009
decides where), the request's fields it keeps as given (the optimizer above all: never searched), and each row's
account of the terms it rests on (cards/accuracy.yaml)."""

import pytest

from meshplan.check.config import check_config
from meshplan.estimate.accuracy import terms
from meshplan.estimate.perf import estimate_throughput
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k, recommend


@pytest.mark.parametrize("fields", [
    {"model": "olmoe-1b-7b", "num_gpus": 8, "seq_length": 2048, "pp": 2, "tp": 1},
    # ZeRO-1: at ZeRO-3 over virtual stages PP015 refuses the overlap, and those plans (without it) are faster here
    {"model": "qwen3-30b-a3b", "num_gpus": 32, "seq_length": 1024, "tp": 1, "cp": 1, "pp": 2,
     "global_batch_size": 256, "zero_stage": 1},
])
def test_search_with_ep_overlap_finds_the_exhaustive_top_k(fields):
    """The overlap's bound (references at a steady share of 1, plus what each micro-batch outside the steady state
    exposes) keeps the search exact: the same top K as brute force, overlapped plans among them."""
    req = Request(**fields)
    rec = recommend(req, top_k=4)
    oracle = exhaustive_top_k(req, 100)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle[:4]], rel=1e-12)
    assert any(c.plan.moe_a2a_overlap for c in rec.candidates)


def test_overlap_is_chosen_where_the_rule_allows_it_and_said_with_its_price():
    fields = dict(model="qwen3-30b-a3b", num_gpus=16, ep=16, pp=1, global_batch_size=128, seq_length=2048)
    best = recommend(Request(**fields, framework="megatron-bridge"), top_k=1).candidates[0]
    assert best.plan.moe_a2a_overlap and best.plan.recompute != "full"
    assert "moe_a2a_overlap" in best.rationale and "Without the EP overlap" in best.rationale
    job, plan = resolve(Request(**fields, framework="megatron-bridge", **{
        k: getattr(best.plan, k) for k in ("tp", "etp", "micro_batch_size", "zero_stage", "recompute",
                                           "moe_token_dispatcher")}, moe_a2a_overlap=False))
    assert estimate_throughput(job, plan).step_time_s > best.throughput.step_time_s
    # the user's choice stands
    off = recommend(Request(**fields, framework="megatron-bridge", moe_a2a_overlap=False), top_k=2)
    assert not any(c.plan.moe_a2a_overlap for c in off.candidates)
    assert "moe_a2a_overlap=False" in off.rationale
    # a framework that does not render it never gets it (EP009 would refuse it)
    titan = recommend(Request(**{**fields, "ep": 8}, framework="torchtitan"), top_k=2)
    assert titan.candidates and not any(c.plan.moe_a2a_overlap for c in titan.candidates)
    # a pipeline without virtual stages cannot overlap (Megatron-Core asserts vpp with pp > 1)
    piped = recommend(Request(**{**fields, "pp": 2, "vpp": 1}, framework="megatron-bridge"), top_k=2)
    assert not any(c.plan.moe_a2a_overlap for c in piped.candidates)


def test_the_overlap_is_off_where_pp015_refuses_it():
    """Megatron-Core refuses the EP overlap (its combined 1F1B) with Megatron-FSDP over virtual stages (PP015), so
    there the valid plan is the one without it; the search took the overlap wherever EP009 allowed it, and every
    ZeRO-3 plan over virtual stages broke PP015. Qwen3-30B-A3B on 32 H100 at PP2 and ZeRO-3 ranks interleaved plans
    without the overlap (the oracle's top 4). Since the joint refit of 2026-12-07 (the all-to-all's SM share, host
    sync 3.25 -> 1.50 ms) the ZeRO-1 overlapped plans are the faster ones when the stage is left open."""
    req = Request(model="qwen3-30b-a3b", num_gpus=32, seq_length=1024, tp=1, cp=1, pp=2, global_batch_size=256,
                  zero_stage=3)
    rec = recommend(req, top_k=4)
    oracle = exhaustive_top_k(req, 4)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12)
    best = rec.candidates[0].plan
    assert best.zero_stage == 3 and best.vpp > 1 and not best.moe_a2a_overlap
    job, plan = resolve(Request(**{**req.model_dump(exclude_unset=True), **{
        k: getattr(best, k) for k in ("ep", "vpp", "micro_batch_size", "zero_stage", "recompute")}},
        moe_a2a_overlap=True))
    assert "PP015" in {f.id for f in check_config(job, plan, include_memory=False).findings if f.severity == "error"}
    zero1 = recommend(req.model_copy(update={"zero_stage": 1}), top_k=1).candidates[0]
    assert zero1.plan.moe_a2a_overlap and zero1.plan.vpp > 1


def test_the_optimizer_is_kept_never_searched():
    muon = recommend(Request(model="deepseek-v2-lite", num_gpus=16, optimizer="muon"), top_k=3)
    assert muon.candidates and all(c.plan.optimizer == "muon" and c.plan.zero_stage < 2 for c in muon.candidates)
    text = " ".join(muon.assumptions)
    assert "optimizer=muon (given)" in text and "ZeRO stage 3 not searched" in text
    adam = recommend(Request(model="deepseek-v2-lite", num_gpus=16), top_k=3)
    assert all(c.plan.optimizer == "adam" for c in adam.candidates)
    assert "optimizer=adam (default)" in " ".join(adam.assumptions) and "not a layout" in " ".join(adam.assumptions)


def test_the_frameworks_compile_default_is_what_the_search_times():
    """KempnerForge compiles by default: its ranked plans are timed compiled, as `meshplan estimate` takes them."""
    rec = recommend(Request(model="llama-3.1-8b", num_gpus=8, framework="kempnerforge"), top_k=2)
    assert all(c.plan.torch_compile for c in rec.candidates)
    eager = recommend(Request(model="llama-3.1-8b", num_gpus=8, framework="kempnerforge", torch_compile=False), top_k=1)
    assert not eager.candidates[0].plan.torch_compile


def test_each_row_names_the_terms_no_measured_run_validated():
    rec = recommend(Request(model="qwen3-30b-a3b", num_gpus=16, pp=1, etp=2, ep=1, global_batch_size=128), top_k=2)
    for c in rec.candidates:
        band = c.throughput.error_band
        assert "How sure: " + band.text in c.rationale
        assert all(term in c.rationale for term in band.unvalidated)
        assert ("relies on them unchecked" in c.rationale) == bool(band.unvalidated)
        job, _ = resolve(Request(model="qwen3-30b-a3b", num_gpus=16, global_batch_size=128))
        mechanisms = [t for t in terms(job, c.plan, "throughput") if not t.startswith(("framework ", "GPU "))]
        assert "ETP > 1" in mechanisms and all(t in c.rationale for t in mechanisms)
    assert "ZeRO-3/FSDP with MoE" in terms(job, c.plan.model_copy(update={"zero_stage": 3}), "throughput")


@pytest.mark.parametrize(("fields", "framework"), [
    ({"optimizer": "muon"}, "megatron-core"),
    ({"optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False}, "megatron-core"),
    ({"precision": "fp8", "fp8_param_gather": True}, "megatron-bridge"),
    ({}, "kempnerforge"),  # compiles by default: the compiled loss keeps fewer logit bytes
    ({"optimizer_offload_fraction": 0.5}, "megatron-core"),  # half the optimizer stepped on the CPU
    ({"activation_offload": True}, "megatron-core"),  # saved activations on the host: the floor counts none
    ({}, "deepspeed"),  # DeepSpeed-MoE's expert-parallel layouts
    # ZeRO-Offload: ZeRO-3, which Megatron-DeepSpeed's MoE layers refuse past tp = pp = ep = 1 (DS004): a dense model
    ({"param_offload": True, "optimizer_offload": True, "model": "llama-3.1-8b"}, "deepspeed"),
])
def test_memory_floors_take_the_carried_fields(fields, framework):
    """The search drops plans whose floor is over the budget unestimated: with the request's optimizer, precision and
    compile fields the floors (space.state_preset) must stay under the estimate of the plans it builds."""
    import random

    from meshplan.estimate.memory import estimate_memory
    from meshplan.rules.engine import EstimateBlocked
    from meshplan.search import BestFirstSearch, default_engine, search_job
    from meshplan.search.floors import first_stage_floor
    from meshplan.search.space import Fixed, enumerate_layouts, micro_batches, states_lower_bound

    req = Request(**{"model": "deepseek-v2-lite", "num_gpus": 16, "framework": framework, **fields})
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(framework), 1)
    rng = random.Random(3)
    layouts, _ = enumerate_layouts(job, fixed)
    checked = 0
    for lay in rng.sample(layouts, min(30, len(layouts))):
        sizes = micro_batches(job, lay, fixed)
        for zero in search.zeros:
            for recompute in search.recomputes:
                if not sizes:
                    continue
                mbs = rng.choice(sizes[:4])
                plan = search.plan(lay, zero, recompute, mbs)
                try:
                    peak = estimate_memory(job, plan).peak_bytes
                except EstimateBlocked:
                    continue
                sp = search.sequence_parallel(lay)
                assert first_stage_floor(job, lay, zero, recompute, mbs, sp, search.presets[zero],
                                         activation_offload=plan.activation_offload) <= peak, plan
                assert states_lower_bound(job, lay, zero, search.split, search.presets[zero][1]) <= peak, plan
                checked += 1
    assert checked > (10 if "param_offload" in fields else 20)  # ZeRO-Offload: ZeRO-3 without pp (DS002), 15 plans


def test_the_requests_offloads_are_kept_in_every_ranked_plan():
    """An offload the user asks for is part of every plan the search ranks (and of the floors that prune it):
    Llama-3-70B on 16 H100 keeps no layout 10% free with the optimizer on the GPU, and ranks layouts with it on the
    CPU."""
    fields = {"model": "llama-3-70b", "num_gpus": 16, "seq_length": 4096, "global_batch_size": 64}
    assert not recommend(Request(**fields), top_k=1).candidates
    rec = recommend(Request(**fields, optimizer_offload_fraction=1.0), top_k=3)
    assert rec.candidates
    for c in rec.candidates:
        assert c.plan.optimizer_offload and c.plan.optimizer_offload_fraction == 1.0
        assert c.throughput.breakdown.offload_s > 0 and c.memory.host_bytes_per_node > 0
    assert "optimizer_offload_fraction=1.0 (given)" in " ".join(rec.assumptions)


@pytest.mark.parametrize("extra", [{"recompute": "full"}, {}])
def test_the_requests_recompute_layers_are_kept_in_every_ranked_plan(extra):
    """Full recompute of some layers per stage (Megatron recompute_num_layers, recompute_method) is part of every
    plan the search ranks, as the request gives it (it once dropped both silently and ranked every layer recomputed:
    3.575 s where 2 layers per stage take 2.826 s); left with the recompute open, RC001 keeps it to full recompute.
    The same top K as the oracle."""
    req = Request(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, recompute_layers=2, recompute_method="block",
                  **extra)
    rec = recommend(req, top_k=3)
    assert rec.candidates
    for c in rec.candidates:
        assert (c.plan.recompute, c.plan.recompute_layers, c.plan.recompute_method) == ("full", 2, "block")
    plain = recommend(Request(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, recompute="full"), top_k=1)
    assert rec.candidates[0].throughput.step_time_s < plain.candidates[0].throughput.step_time_s
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in exhaustive_top_k(req, 3)], rel=1e-12)
    assert "recompute_layers=2 (given)" in " ".join(rec.assumptions)


def test_the_requests_tp_overlap_is_kept_wherever_there_is_tp():
    """tp_comm_overlap is the request's (not searched), on every ranked plan with TP to overlap; a TP-1 layout has
    none, so the switch does not rule it out (rule TP005 would refuse tp=1 with it)."""
    fields = {"model": "llama-3.1-8b", "num_gpus": 8, "seq_length": 4096, "global_batch_size": 64,
              "framework": "megatron-core"}
    rec = recommend(Request(**fields, tp_comm_overlap=True), top_k=12)  # TP2 DP4 first ranks 10th
    assert rec.candidates
    assert all(c.plan.tp_comm_overlap == (c.plan.tp > 1) for c in rec.candidates)
    assert any(c.plan.tp > 1 for c in rec.candidates)
    plain = recommend(Request(**fields), top_k=12)
    assert not any(c.plan.tp_comm_overlap for c in plain.candidates)


@pytest.mark.parametrize("fields, says", [
    (dict(framework="nanotron"), "nanotron has no TP communication overlap switch"),
    (dict(framework="megatron-core", sequence_parallel=False), "sequence_parallel=false"),
    (dict(framework="torchtitan", torch_compile=False), "async TP is a torch.compile pass"),
])
def test_a_tp_overlap_no_layout_can_run_is_refused_up_front(fields, says):
    """Asked for where rule TP005 refuses every layout with TP, recommend says so at once (what and why, and the fix
    TP005 gives) instead of ranking only the TP-1 layouts the rule lets through."""
    from meshplan.core.errors import MeshplanError

    with pytest.raises(MeshplanError) as exc:
        recommend(Request(model="llama-3.1-8b", num_gpus=8, tp_comm_overlap=True, **fields))
    assert says in exc.value.reason and "TP005" in exc.value.reason and exc.value.fix
    ok = recommend(Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-core", tp_comm_overlap=True), top_k=1)
    assert ok.candidates
