"""The count-free memory floor (meshplan/search/count_free.py): a lower bound of every layout's estimate at any GPU
count, so where it is over the budget min-gpus and recommend's nothing-fits answer give a proof instead of a scan."""

import random

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import output_activations
from meshplan.check.config import check_structure
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.count_free import AdmittedShapes, count_free_floor, floor_proof
from meshplan.search.policy import memory_budget
from meshplan.search.space import Fixed, enumerate_layouts, micro_batches, state_preset

LIMIT = 1 << 20
SEEDS = 6
MODELS = ["llama-3.1-8b", "qwen2.5-7b", "qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b", "nemotron-h-8b",
          "qwen3-next-80b-a3b", "moonlight-16b-a3b"]
FRAMEWORKS = ["megatron-core", "megatron-bridge", "deepspeed", "torchtitan", "kempnerforge", "verl", "skyrl",
              "nemo-automodel", "nanotron"]
KF_128K = {"model": "qwen2.5-7b", "framework": "kempnerforge", "gpu": "h100", "seq_length": 131072}


@pytest.mark.parametrize("seed", range(SEEDS))
def test_the_floor_never_exceeds_an_estimate(seed):
    """For sampled requests (dense, MoE, MLA, Mamba-2 and Gated DeltaNet hybrids; 4K to 128K tokens; every framework;
    some with expandable segments, offloaded activations or fixed fields) and sampled layouts, ZeRO stages, recomputes
    and micro-batches at several GPU counts, the figure that decides the estimate's fit is at least the count-free
    floor: were the floor to count a model state, miss a reserve or over-count a layer, this fails."""
    rng = random.Random(seed)
    checked = 0
    while checked < 60:
        extra: dict = {}
        if rng.random() < 0.2:
            extra["expandable_segments"] = True
        if rng.random() < 0.15:
            extra["recompute"] = rng.choice(["none", "selective", "full"])
        gpus = rng.choice([8, 16, 32, 64])
        try:
            req = Request(model=rng.choice(MODELS), framework=rng.choice(FRAMEWORKS), num_gpus=gpus,
                          seq_length=rng.choice([4096, 16384, 65536, 131072]), **extra)
            job, _ = search_job(req)
            fixed = Fixed.from_request(req, job)
            search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
        except MeshplanError:
            continue
        floor = count_free_floor(job, fixed, LIMIT).floor
        layouts, _ = enumerate_layouts(job, fixed)
        if not layouts:
            continue
        # the most split layout too, where the floor comes nearest the estimate
        most = max(layouts, key=lambda lay: (lay.tp * lay.cp * lay.pp, lay.pp))
        for lay in [most, *rng.sample(layouts, min(3, len(layouts)))]:
            sizes = micro_batches(job, lay, fixed)
            for zero in search.zeros if sizes else ():
                for recompute in search.recomputes:
                    try:
                        memory = search.engine.memory(job, search.plan(lay, zero, recompute, rng.choice(sizes[:3])))
                    except MeshplanError:
                        continue
                    assert floor <= memory.fit_bytes * (1 + 1e-9), (req, lay, zero, recompute, floor, memory.fit_bytes)
                    checked += 1


def test_the_floor_comes_near_the_estimate_where_one_term_dominates():
    """Qwen2.5-7B at 128K on KempnerForge, TP4 PP28 with full recompute and micro-batch 1 on 1,120 H100: the last
    stage's logits dominate its estimate, and the floor is within 10% under it (a floor far under every estimate would
    prove nothing; one over it would be wrong)."""
    req = Request(**KF_128K, num_gpus=1120, tp=4, pp=28, recompute="full", micro_batch_size=1)
    memory = api.estimate_memory(req)
    job, _ = search_job(req)
    floor = count_free_floor(job, Fixed.from_request(Request(**KF_128K), job), LIMIT).floor
    assert 0.9 * memory.fit_bytes <= floor <= memory.fit_bytes


def test_qwen_7b_at_128k_on_kempnerforge_gets_a_proof():
    """KempnerForge runs no CP and gathers the whole logits on every TP rank: one 131,072-token micro-batch's logits
    (x 152,064 vocabulary entries x 8 B) alone are ~149 GiB, over an H100's 71.7 GiB budget at every count."""
    answer = api.minimum_gpus(Request(**KF_128K))
    assert answer.num_gpus is None and answer.stopped_by == "memory" and answer.counts_checked == 0
    proof = answer.memory_floor
    assert proof is not None and proof.term == "output" and proof.up_to_gpus is None
    assert proof.term_bytes >= 8 * 131072 * 152064 > proof.budget_bytes
    assert proof.floor_bytes > proof.budget_bytes
    assert "No GPU count can fit" in answer.rationale and "--seq-length" in answer.rationale
    assert any("context parallelism" in change and "torchtitan" in change for change in proof.changes)
    assert any("GB200" in change or "MI300X" in change for change in proof.changes)


def test_the_floor_is_the_memory_models_logits_term():
    """The output term is output_activations' own figure at the shape named (one home for the arithmetic)."""
    req = Request(**KF_128K)
    job, _ = search_job(req.model_copy(update={"num_gpus": 8}))
    floor = count_free_floor(job, Fixed.from_request(req, job), LIMIT)
    conv = state_preset(job, floor.zero, {})[0]
    assert floor.output == output_activations(conv, floor.tokens, floor.vocab, floor.tp, job.model.hidden_size,
                                              floor.tp if floor.sp else 1, floor.mbs)
    held = max(floor.output, floor.layer)
    assert floor.floor == held + floor.reserve * held + floor.fixed_bytes


def test_the_nearest_sequence_length_opens_the_floor():
    """The sequence length the proof names is the longest (in 1,024-token steps) at which the floor fits."""
    req = Request(**KF_128K)
    job, _ = search_job(req.model_copy(update={"num_gpus": 8}))
    fixed = Fixed.from_request(req, job)
    proof = floor_proof(job, fixed, 0.1, LIMIT)
    assert proof is not None
    text = next(c for c in proof.changes if "seq_length=" in c)
    longest = int(text.split("seq_length=")[1].split(",")[0])
    budget = memory_budget(job, 0.1)
    assert count_free_floor(job.model_copy(update={"seq_length": longest}), fixed, LIMIT).floor <= budget
    assert count_free_floor(job.model_copy(update={"seq_length": longest + 1024}), fixed, LIMIT).floor > budget


def test_recommends_impossible_answer_gives_the_same_proof():
    """recommend's nothing-fits answer runs the same scan: it ends with the proof, not 'not proof that none fits'."""
    rec = api.recommend(Request(**KF_128K, num_gpus=8), top_k=1)
    assert not rec.candidates and rec.min_gpus is None
    assert "No GPU count can fit" in rec.rationale and "not proof" not in rec.rationale


def test_a_fixed_field_that_closes_the_floor_is_named():
    """A long context that fits with TP on a vocab-parallel loss: fixed tp=1, the floor is over and the proof names tp
    as the field to leave open."""
    req = Request(model="llama-3.1-8b", framework="megatron-core", gpu="h100", seq_length=131072, tp=1, cp=1)
    job, _ = search_job(req.model_copy(update={"num_gpus": 8}))
    fixed = Fixed.from_request(req, job)
    proof = floor_proof(job, fixed, 0.1, LIMIT)
    assert proof is not None
    assert any(change.startswith("tp, cp left open") for change in proof.changes), proof.changes


@pytest.mark.parametrize("fields", [{"model": "llama-3.1-70b", "framework": "megatron-bridge"},
                                    {"model": "kimi-k2"}, {"model": "deepseek-v3"},
                                    {"model": "llama-3.1-8b", "framework": "torchtitan", "seq_length": 131072}])
def test_requests_that_fit_get_no_proof(fields):
    """Where a count fits, the floor is under the budget: the scan runs as before."""
    req = Request(gpu="h100", **fields)
    job, _ = search_job(req.model_copy(update={"num_gpus": 8}))
    assert floor_proof(job, Fixed.from_request(req, job), 0.1, LIMIT) is None
    assert count_free_floor(job, Fixed.from_request(req, job), LIMIT).floor < 0.1 * GIB * 80


def test_mcp_answers_the_proof_with_its_changes_as_next_steps():
    """MCP's minimum_gpus: a proof's next steps are its changes, never 'raise max_gpus' (no count can help)."""
    from meshplan.faces.mcp import tools

    answer = tools.minimum_gpus(**KF_128K, max_gpus=None)
    assert answer.memory_floor is not None and answer.summary.count("No GPU count can fit") == 1
    assert answer.next_steps and all(step.startswith("Call minimum_gpus again with") for step in answer.next_steps)
    assert not any("max_gpus" in step for step in answer.next_steps)


def test_a_framework_that_runs_the_model_on_one_stage_holds_every_layer():
    """KempnerForge runs an MoE model at pp 1 only (KF001): one stage holds every decoder layer's saved activations
    and the output. The floor took one layer or the output alone (any PP spreads the layers), so DeepSeek-V2-Lite at
    64K with selective recompute scanned 512 counts and ended "not proof that none fits"; every layer and the
    output on one rank are over the budget: a proof. Where pp > 1 runs (Megatron-Core), the floor stays one layer's."""
    fields = {"model": "deepseek-v2-lite", "framework": "kempnerforge", "gpu": "h100", "seq_length": 65536,
              "recompute": "selective"}
    req = Request(**fields, num_gpus=64)
    job, _ = search_job(req)
    floor = count_free_floor(job, Fixed.from_request(req, job), LIMIT)
    assert floor.one_stage and floor.floor > memory_budget(job, 0.1)
    one_stage = Request(**fields, num_gpus=64, pp=1)
    one, _ = search_job(one_stage)
    assert count_free_floor(one, Fixed.from_request(one_stage, one), LIMIT).floor == floor.floor
    answer = api.minimum_gpus(Request(**fields))
    assert answer.stopped_by == "memory" and "every decoder layer's saved activations" in answer.rationale
    core = Request(**{**fields, "framework": "megatron-core"}, num_gpus=64)
    job, _ = search_job(core)
    assert not count_free_floor(job, Fixed.from_request(core, job), LIMIT).one_stage


@pytest.mark.parametrize("seed", range(SEEDS))
def test_every_valid_layouts_shape_is_admitted(seed):
    """The floor leaves out a shape only where a rule refuses it at every count: for sampled requests and plans the
    search builds at several GPU counts that pass every structural rule, AdmittedShapes admits the plan's ZeRO stage,
    TP, CP, sequence parallelism, expert TP and recompute. Were it to refuse a valid layout's shape (a rule asked that
    turns on dp, the count or the batch, or one probe too few), the floor could rise over that layout's estimate
    and prove a fit impossible where one exists: this fails."""
    rng = random.Random(100 + seed)
    checked = 0
    while checked < 40:
        gpus = rng.choice([8, 16, 32, 64])
        extra: dict = {"precision": "fp8"} if rng.random() < 0.15 else {}
        if rng.random() < 0.2:
            extra["zero_stage"] = rng.choice([0, 1, 3])
        try:
            req = Request(model=rng.choice(MODELS), framework=rng.choice(FRAMEWORKS), num_gpus=gpus, gpu="h100",
                          seq_length=rng.choice([4096, 16384, 65536]), **extra)
            job, _ = search_job(req)
            fixed = Fixed.from_request(req, job)
            search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
        except MeshplanError:
            continue
        layouts, _ = enumerate_layouts(job, fixed)
        admits = AdmittedShapes(job, fixed, 1)
        for lay in rng.sample(layouts, min(4, len(layouts))):
            sizes = micro_batches(job, lay, fixed)
            for zero in search.zeros if sizes else ():
                recompute = rng.choice(search.recomputes)
                plan = search.plan(lay, zero, recompute, sizes[0])
                if any(f.severity == "error" for f in check_structure(job, plan)):
                    continue
                assert admits(zero, plan.tp, plan.cp, plan.sequence_parallel, plan.etp, plan.recompute), (req, plan)
                checked += 1


def test_the_proof_names_a_tp_the_framework_runs():
    """KempnerForge needs the KV heads divisible by tp (TP003): Qwen2.5-7B's 4 KV groups admit TP 1, 2 and 4, not the
    TP28 Megatron's rule would (a KV group count dividing tp). The proof at 128K names TP4; the rule-blind floor
    named TP28, a layout KempnerForge refuses."""
    req = Request(**KF_128K)
    job, _ = search_job(req.model_copy(update={"num_gpus": 8}))
    fixed = Fixed.from_request(req, job)
    proof = floor_proof(job, fixed, 0.1, LIMIT)
    assert proof is not None and proof.floor.tp == 4 and "TP4 " in proof.sentence()
    assert count_free_floor(job, fixed, LIMIT, rules=False).tp == 28
    admits = AdmittedShapes(job, fixed, 1)
    assert not admits(3, 28, 1, True, 1, "full") and admits(3, 4, 1, True, 1, "full")


@pytest.mark.parametrize("fields, tp", [
    ({"model": "llama-3.1-8b", "framework": "kempnerforge", "precision": "fp8"}, 1),  # KF003: fp8 with tp > 1
    ({"model": "llama-3.1-8b", "framework": "verl", "zero_stage": 3}, 1),  # FS001: verl's FSDP engine runs no TP
])
def test_a_rule_that_refuses_tp_holds_the_floor_to_tp_1(fields, tp):
    """A rule that refuses every TP > 1 whatever the count leaves the floor at TP1, where the rule-blind floor took
    the most TP the heads allow."""
    req = Request(gpu="h100", seq_length=65536, **fields)
    job, _ = search_job(req.model_copy(update={"num_gpus": 8}))
    fixed = Fixed.from_request(req, job)
    assert count_free_floor(job, fixed, LIMIT).tp == tp
    assert count_free_floor(job, fixed, LIMIT, rules=False).tp > tp


def test_a_floor_over_the_rules_tps_proves_what_the_heads_tps_did_not():
    """Qwen3-30B-A3B at 54,272 tokens on KempnerForge: one pipeline stage (KF001) holds every layer's saved rows and
    the output. Over every TP the heads allow (TP32) the floor is 69.3 GiB, under the H100's 71.7 GiB budget, so
    min-gpus scanned 512 counts and ended 'not proof that none fits'; over the TPs TP003 admits (up to TP4) it is
    71.8 GiB: a proof, with no count scanned."""
    fields = {"model": "qwen3-30b-a3b", "framework": "kempnerforge", "gpu": "h100", "seq_length": 54272}
    req = Request(**fields)
    job, _ = search_job(req.model_copy(update={"num_gpus": 8}))
    fixed = Fixed.from_request(req, job)
    budget = memory_budget(job, 0.1)
    blind, floor = count_free_floor(job, fixed, LIMIT, rules=False), count_free_floor(job, fixed, LIMIT)
    assert blind.floor <= budget < floor.floor and blind.tp == 32 and floor.tp == 4 and floor.one_stage
    answer = api.minimum_gpus(req)
    assert answer.stopped_by == "memory" and answer.counts_checked == 0 and "TP4 " in answer.rationale
