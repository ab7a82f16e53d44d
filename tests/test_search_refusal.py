"""Bad input to recommend (issue 23): a request that breaks a framework rule whatever the layout is refused with that
rule's id and fix (not "no layout fits"); the search applies MEM003 as `check` does; a space the rules empty between
them is answered with the plans each rule removed and the nearest change that opens it; the RL table shows what
differs between its rows. Every face: meshplan.api, the CLI (exit 2, no traceback), and MCP through
tests/test_faces_agree.py's CASES."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB, either_or
from meshplan.faces import cli, display
from meshplan.rules import engine
from meshplan.rules.context import Context, backend_of
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search import refusal
from meshplan.search.job import job_at, search_job
from meshplan.search.refusal import COUNT_READ_FIELDS, Space, blocking_rule, host_floor, reads_no_count
from meshplan.search.space import Fixed

LORA = dict(model="llama-3.1-70b", num_gpus=8, lora_rank=16)  # megatron-core, the default: no LoRA
HOST = dict(model="llama-3.1-8b", num_gpus=8, optimizer_offload_fraction=1.0, cpu_memory_per_node=1)
EMPTY = dict(model="llama-3.1-8b", num_gpus=8, seq_length=2048, cp=2, micro_batch_size=3)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def flags(fields: dict) -> list[str]:
    argv = [fields["model"]]
    for name, value in fields.items():
        if name != "model":
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def test_lora_on_a_framework_without_it_is_refused_with_lora001():
    """Before: 'Impossible ... no layout fits even with every memory-saving knob' and a 4 s GPU-count scan."""
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**LORA))
    assert exc.value.reason.startswith("LORA001:") and "every one of the" in exc.value.reason
    assert "megatron-bridge" in exc.value.fix and "no layout fits" not in exc.value.reason
    code, out, err = run_cli(["recommend", *flags(LORA)])
    assert code == cli.EXIT_USAGE and "LORA001" in err and "Traceback" not in err + out
    # the same request on a framework that has LoRA is searched as before
    assert api.recommend(Request(**{**LORA, "framework": "megatron-bridge"}), top_k=1).candidates


def test_a_refusal_names_no_zero_stage_the_request_left_open():
    """Before: 'OF001: optimizer_offload on KempnerForge at zero_stage 0: ...' for a request that fixed no ZeRO stage
    (the plainest plan's stage); the refusal now says the rule at every stage the search tries, and names the one a
    request fixes alone. Where the stages' fixes differ (SkyRL's Megatron and FSDP engines), each says its stages."""
    req = dict(model="llama-3.1-8b", num_gpus=16, framework="kempnerforge", optimizer_offload=True)
    job, _ = search_job(Request(**req))
    stages = Space.of(job, Fixed.from_request(Request(**req), job)).zeros
    assert len(stages) > 1
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**req))
    words = either_or(list(stages))
    assert exc.value.reason.startswith(f"OF001: optimizer_offload on KempnerForge at zero_stage {words}: ")
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**req, zero_stage=3))
    assert exc.value.reason.startswith("OF001: optimizer_offload on KempnerForge at zero_stage 3: ")
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**{**req, "framework": "torchtitan", "optimizer": "muon", "optimizer_offload": False}))
    assert "(zero_stage=0)" not in exc.value.reason and exc.value.reason.startswith("PR005:")
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**{**req, "framework": "skyrl"}))
    assert exc.value.fix.startswith("At zero_stage ") and exc.value.fix.count("At zero_stage ") == 2
    code, out, err = run_cli(["min-gpus", "llama-3.1-8b", "--framework", "kempnerforge", "--optimizer-offload", "true"])
    assert code != 0 and f"at zero_stage {words}: " in out + err and "Traceback" not in out + err


def test_a_blocker_is_one_no_plan_of_the_space_passes():
    """A rule that fires on the plainest plan but not on every plan is no blocker (TP1 fails nothing here; a fixed
    ep on a dense model fails EP001 everywhere)."""
    req = Request(model="llama-3.1-8b", num_gpus=8, ep=2)
    job, _ = search_job(req)
    found, total = blocking_rule(Space.of(job, Fixed.from_request(req, job)))
    assert found.id == "EP001" and total > 0
    ok = Request(model="llama-3.1-8b", num_gpus=8)
    job, _ = search_job(ok)
    assert blocking_rule(Space.of(job, Fixed.from_request(ok, job))) is None


def test_a_host_too_small_for_any_offload_is_refused_with_mem003():
    """Before: the search ranked first a layout needing 119.7 GiB of host memory per node, which check rejects."""
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**HOST))
    reason, fix = exc.value.reason, exc.value.fix
    assert reason.startswith("MEM003:") and "119.7 GiB" in reason and "1.0 GiB" in reason
    assert fix.startswith("Drop the optimizer offload; or use at least") or fix.startswith(
        "Use optimizer_offload_fraction=")
    code, _, err = run_cli(["recommend", *flags(HOST)])
    assert code == cli.EXIT_USAGE and "MEM003" in err and "Traceback" not in err


def test_the_host_floor_never_exceeds_what_check_estimates():
    """The floor refuses only what no layout passes: it is at most the host bytes the estimate gives any plan."""
    req = Request(**{**HOST, "cpu_memory_per_node": None, "num_gpus": 16})
    job, _ = search_job(req)
    rec = api.recommend(req, top_k=5)
    space = Space.of(job, Fixed.from_request(req, job))
    plan = space.plan(space.layouts[0], space.zeros[0], space.recomputes[0], 1)
    floor = min(host_floor(job, z, plan) for z in space.zeros)
    assert floor > 0
    assert all(floor <= c.memory.host_bytes_per_node * (1 + 1e-9) for c in rec.candidates)
    # 8B, 16 B per parameter on the host, over 16 GPUs, 8 per node: 59.8 GiB
    assert floor / GIB == pytest.approx(59.8, abs=0.1)


def test_the_search_applies_mem003_like_check():
    """cpu_memory_per_node between the host needs of two layouts: the one check rejects (MEM003) is not ranked, the
    other is, and every ranked plan passes check's MEM003."""
    base = dict(model="qwen3-30b-a3b", num_gpus=16, optimizer_offload_fraction=1.0)
    free = api.recommend(Request(**base), top_k=8)
    hosts = sorted({c.memory.host_bytes_per_node for c in free.candidates})
    assert len(hosts) > 1, "the test needs two host figures among the top layouts"
    top = free.candidates[0].memory.host_bytes_per_node
    below = max(h for h in hosts if h < top) if any(h < top for h in hosts) else None
    assert below is not None, "the fastest layout needs more host memory than another ranked one"
    capacity = (below + top) / 2 / GIB
    rec = api.recommend(Request(**base, cpu_memory_per_node=capacity), top_k=3)
    assert rec.candidates
    # the plans within the GPU budget that only the host rejects are counted under MEM003, not the GPU's MEM001
    assert rec.rejected["MEM003"] > 0 and rec.considered == len(rec.candidates) + sum(rec.rejected.values())
    for c in rec.candidates:
        assert c.memory.host_bytes_per_node <= capacity * GIB
        p = c.plan
        check = api.check_config(Request(**base, cpu_memory_per_node=capacity, tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp,
                                         ep=p.ep, etp=p.etp, zero_stage=p.zero_stage, recompute=p.recompute,
                                         micro_batch_size=p.micro_batch_size))
        assert "MEM003" not in {f.id for f in check.findings}


def test_an_empty_space_names_each_rule_and_the_change_that_opens_it():
    rec = api.recommend(Request(**EMPTY), top_k=1)
    assert not rec.candidates
    words = rec.rationale
    for rule, count in rec.rejected.items():
        assert f"{rule} (" in words and f"removed {count:,}" in words
    assert len(rec.rejected) >= 2
    assert "leave micro_batch_size open" in words
    code, out, err = run_cli(["recommend", *flags(EMPTY)])
    assert code != cli.EXIT_USAGE and "leave micro_batch_size open" in out and "Traceback" not in out + err


@pytest.fixture(scope="module")
def rl_rec():
    req = Request(model="qwen3-30b-a3b", framework="verl", gpu="h100", num_gpus=16, job="rl", algorithm="grpo")
    return req, api.recommend(req, top_k=5)


def test_grpo_on_qwen3_30b_with_verl_ranks_rl_plans(rl_rec):
    """Issue 23: '0 layouts considered' on the CLI and over MCP (the actor search's clock); now ranked RL plans."""
    _, rec = rl_rec
    assert rec.considered > 0 and rec.candidates
    for c in rec.candidates:
        p = c.plan
        assert p.rollout_tp and p.rollout_dp and p.rollout_ep and p.rollout_memory_fraction
        assert c.throughput.rl is not None


def test_the_rl_table_shows_the_rollout_and_offloads_of_each_row(rl_rec, capsys):
    """Rows that differ only in the rollout shape, memory fraction or offloads no longer look identical."""
    req, rec = rl_rec
    display.recommendation(rec, req)
    out = capsys.readouterr().out
    assert "rollout" in out and "offload" in out and "RL step s" in out
    for c in rec.candidates:
        p = c.plan
        ep = f" EP{p.rollout_ep}" if p.rollout_ep > 1 else ""  # at EP1 the experts are split over the engine's TP
        assert display.rollout_words(p) == f"TP{p.rollout_tp} DP{p.rollout_dp}{ep}"
        assert f"{c.throughput.step_time_s:.2f}" in out and display.offload_words(p) in out
    rows = {(c.plan.short(), c.plan.micro_batch_size, display.rollout_words(c.plan), c.plan.rollout_memory_fraction,
             display.offload_words(c.plan)) for c in rec.candidates}
    steps = {round(c.throughput.step_time_s, 2) for c in rec.candidates}
    assert len(rows) == len(rec.candidates) or len(steps) < len(rec.candidates)
    # the same numbers as --json
    _, text, _ = run_cli(["recommend", "qwen3-30b-a3b", "--framework", "verl", "--gpu", "h100", "--num-gpus", "16",
                             "--job", "rl", "--algorithm", "grpo", "--json"])
    data = json.loads(text)
    assert [c["plan"]["rollout_tp"] for c in data["candidates"]] == [c.plan.rollout_tp for c in rec.candidates]


def test_an_rl_job_whose_trainer_has_no_layout_says_why():
    rec = api.recommend(Request(model="qwen3-30b-a3b", framework="verl", gpu="h100", num_gpus=2, job="rl",
                                algorithm="grpo"))
    assert not rec.candidates and rec.considered > 0 and rec.rejected
    assert rec.rationale.startswith("No actor layout for the trainer's step") and rec.closest


def test_min_gpus_stops_on_a_rule_no_gpu_count_passes_instead_of_scanning_to_its_bound():
    """LoRA on Megatron-Core fails LORA001 at every count: min-gpus names the rule and its fix at once (it scanned to
    its work bound before, minutes); a count-dependent rule (a fixed tp no power-of-two count holds) is left to the
    scan, which finds the count that holds it."""
    answer = api.minimum_gpus(Request(model="llama-3.1-70b", lora_rank=16))
    assert answer.num_gpus is None and answer.stopped_by == "rules"
    assert "LORA001" in answer.rationale and "megatron-bridge" in answer.rationale
    _, out, err = run_cli(["min-gpus", "llama-3.1-70b", "--lora-rank", "16"])
    assert "LORA001" in out + err and "Traceback" not in err
    answer = api.minimum_gpus(Request(model="llama-3.1-8b", gpu="h100", tp=2), max_gpus=64)
    assert answer.num_gpus is not None and answer.num_gpus % 2 == 0


def test_rl_min_gpus_stops_on_a_rule_no_gpu_count_passes():
    """fp8 on an A100 (FP001) for a GRPO job with verl: the RL scan settled no count (each one's lightest variant broke
    the rule) and ran to its bound of 512 counts, about 3 minutes; it now stops at the first count as a training
    job's scan does, naming the rule and its fix, on the API and the CLI."""
    fields = dict(model="gemma-2-27b", gpu="a100-80gb", framework="verl", seq_length=2048, job="rl", precision="fp8")
    answer = api.minimum_gpus(Request(**fields))
    assert answer.num_gpus is None and answer.stopped_by == "rules" and answer.counts_checked == 1
    assert "FP001" in answer.rationale and "precision=bf16" in answer.rationale
    _, out, err = run_cli(["min-gpus", "gemma-2-27b", "--gpu", "a100-80gb", "--framework", "verl", "--job", "rl",
                           "--precision", "fp8"])
    assert "FP001" in out + err and "Traceback" not in err


@pytest.mark.parametrize("fields", [dict(model="qwen3-30b-a3b"), dict(model="llama-3.1-8b", framework="torchtitan"),
                                    dict(model="mixtral-8x7b", framework="deepspeed"),
                                    dict(model="deepseek-v2-lite", framework="megatron-bridge", recompute="full")])
def test_only_the_count_read_fields_take_other_values_at_another_count(fields):
    """COUNT_READ_FIELDS: of the plans of two counts' spaces, every other field takes the same values at both (what
    lets min-gpus stop on a rule reading none of them after one count)."""
    job, _ = search_job(Request(gpu="h100", num_gpus=8, **fields))
    fixed = Fixed.from_request(Request(gpu="h100", num_gpus=8, **fields), job)
    seen = []
    names = tuple(Plan.model_fields)
    for world in (8, 64):
        space = Space.of(job_at(job, world, False), fixed)
        assert space.layouts
        values: dict[str, set] = {}
        for lay in space.layouts:
            rows = []
            for plan in space.plans(lay):
                assert tuple(plan.__dict__) == names
                rows.append(tuple(plan.__dict__.values()))
            # each field's values over the layout's plans, a column at a time (a list as its tuple)
            for name, column in zip(names, zip(*rows, strict=True), strict=True) if rows else ():
                field = values.setdefault(name, set())
                try:
                    field.update(column)
                except TypeError:  # a list: unhashable
                    field.update(tuple(value) if isinstance(value, list) else value for value in column)
        seen.append(values)
    differ = {name for name in seen[0] if seen[0][name] != seen[1][name]}
    assert differ and differ <= COUNT_READ_FIELDS, differ - COUNT_READ_FIELDS


def test_min_gpus_stops_after_one_count_on_a_rule_that_reads_no_count(monkeypatch):
    """recompute_layers with recompute=none breaks RC001 whatever the layout, and RC001 reads neither field a count
    changes: min-gpus names it after the first count (it built every plan of 1,048,576 GPUs' space before, 25 s),
    while a rule reading a degree keeps the other counts probed."""
    probed = []
    real = refusal.blocking_rule
    monkeypatch.setattr(refusal, "blocking_rule", lambda space: probed.append(space.job.num_gpus) or real(space))
    answer = api.minimum_gpus(Request(model="qwen3-30b-a3b", recompute="none", recompute_layers=1))
    assert answer.num_gpus is None and answer.stopped_by == "rules" and "RC001" in answer.rationale
    assert probed == [8]
    assert reads_no_count("RC001") and not reads_no_count("RC003")  # RC003 reads tp, pp and ep


def _runs_and_fires(job, plan, rule_id: str) -> bool:
    """The plain verdict, kept nowhere: the rule applies to the plan's framework and engine, and its condition fires."""
    if not engine.rule_specs()[rule_id].applies_to(job.framework, backend_of(job.card, plan.zero_stage)):
        return False
    return engine.load_rules()[rule_id](Context(job, plan)) is not None


@pytest.mark.parametrize("fields", [dict(recompute="none", recompute_method="uniform"),  # RC003: reads tp, pp, ep
                                    dict(recompute="none", recompute_layers=1),  # RC001: reads no degree
                                    dict(recompute="selective", recompute_layers=2),
                                    dict(model="mixtral-8x7b", framework="deepspeed", zero_stage=3),  # DS004 (ep)
                                    dict(recompute="full", recompute_method="block")])  # passes: no blocker
def test_a_blocker_read_on_the_layouts_told_apart_is_the_one_every_plan_breaks(fields):
    """blocking_rule asks a rule of one layout per distinct value of what it reads of a layout (layouts_told_apart):
    the same answer as asking it of every plan of the space."""
    req = Request(**{"model": "qwen3-30b-a3b", "gpu": "h100", "num_gpus": 64, **fields})
    job, _ = search_job(req)
    space = Space.of(job, Fixed.from_request(req, job))
    fast = blocking_rule(space)
    plainest = space.layouts[0]
    candidates = {f.id for f in refusal.first_errors(job, space.plan(plainest, space.zeros[0], space.recomputes[0],
                                                                         space.sizes(plainest)[0]))}
    every = [rule_id for rule_id in sorted(candidates, key=list(refusal.rule_specs()).index)
             if all(_runs_and_fires(job, plan, rule_id) for lay in space.layouts for plan in space.plans(lay))]
    assert (fast[0].id if fast else None) == (every[0] if every else None)
    if fast:
        assert len(refusal.layouts_told_apart(space, fast[0].id)) < len(space.layouts)


def test_no_rule_that_reads_the_gpu_count_is_taken_as_reading_no_count():
    """reads_no_count trusts a rule's declared reads for everything but the GPU count, which no reads name
    (Context.world, the job's num_gpus): every rule that reads it is one reads_no_count refuses (a COUNT_DEPENDENT
    family, or reads that name a field the count changes: DP001, VL001, SK001)."""
    import ast
    import inspect

    readers = []
    for rule_id, cond in refusal.load_rules().items():
        tree = ast.parse(inspect.getsource(inspect.getmodule(cond)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == cond.__name__:
                names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                if names & {"world", "num_gpus"}:
                    readers.append(rule_id)
    assert readers and not [rule_id for rule_id in readers if refusal.reads_no_count(rule_id)]


def test_the_search_entry_refuses_an_rl_job_and_names_the_rl_planner():
    # meshplan.search.recommend ranks training layouts; an RL request used to reach the rollout memory estimate with no
    # rollout engine chosen and raise KeyError. api.recommend routes it to the RL planner; the search entry refuses it.
    from meshplan.search import recommend
    req = Request(model="qwen3-30b-a3b", num_gpus=16, gpu="h100", job="rl", algorithm="grpo", framework="verl")
    with pytest.raises(MeshplanError) as err:
        recommend(req)
    assert "RL" in err.value.reason and "meshplan.api.recommend" in err.value.fix


def test_min_gpus_says_a_rule_stopped_it_at_the_first_count_on_every_face():
    """Where a rule refuses every count, the scan checks one count: its words say so (api and MCP `stepping`, the
    CLI's line, the assumption), not the stepping it never took. Before: 'checked 1 count from 1 to 1: 1, 2, 4, then
    every multiple of 8'."""
    from meshplan.faces.mcp import tools

    answer = api.minimum_gpus(Request(model="llama-3.1-70b", lora_rank=16))
    assert answer.stopped_by == "rules" and answer.counts_checked == 1
    said = f"only the first count, {answer.searched_from:,}: a rule refuses the fixed fields at every count"
    assert answer.stepping.startswith(said) and answer.assumptions[1].startswith("A rule refuses every count")
    mcp = tools.minimum_gpus(model="llama-3.1-70b", lora_rank=16, max_gpus=None)
    assert mcp.stepping == answer.stepping
    _, out, _ = run_cli(["min-gpus", "llama-3.1-70b", "--lora-rank", "16"])
    assert f"checked {said}" in out and "checked 1 count from" not in out


def test_the_scan_settles_a_stage_a_micro_batch_free_rule_refuses_without_an_estimate(monkeypatch):
    """SkyRL's FSDP engine (zero_stage 3) has no tp, pp or ep (FS001, which reads only those): the min-gpus scan's
    lightest-variant check estimated each such stage's memory and asked the rules at every micro-batch (557,000 checks
    for Kimi-K2 SFT on H200, 18 s); the rules at the smallest micro-batch now settle it, with no estimate. A rule
    reading the micro-batch (BS001) is asked at each."""
    from meshplan.search.engine import BestFirstSearch
    from meshplan.search.estimators import default_engine
    from meshplan.search.gpu_count import lightest_passes
    from meshplan.search.refusal import reads_no_micro_batch
    from meshplan.search.space import Layout, micro_batches

    assert reads_no_micro_batch("FS001") and not reads_no_micro_batch("BS001")
    job, _ = search_job(Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, framework="skyrl", job="sft"))
    search = BestFirstSearch.for_job(job, Fixed(), default_engine(job.framework), 1, budget_bytes=10**15)
    assert 3 in search.zeros
    estimated = []
    monkeypatch.setattr(search, "fits", lambda *a: estimated.append(a) or True)
    lay = Layout(tp=2, pp=1, cp=1, ep=1, etp=2, dp=8)
    sizes = micro_batches(job, lay, Fixed())
    assert not lightest_passes(search, lay, 3, search.recomputes[-1], sizes) and not estimated
    assert set(search.check_errors(lay, 3, sizes[0])) == {"FS001"}
    plain = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, dp=16)  # FSDP's own: estimated, and it passes
    assert lightest_passes(search, plain, 3, search.recomputes[-1], micro_batches(job, plain, Fixed())) and estimated


def test_a_blocker_is_asked_per_what_decides_its_verdict_not_per_plan(monkeypatch):
    """min-gpus of Qwen3-30B-A3B with LoRA on verl at zero_stage=2 (FP8, B200) is refused by AD001 on every plan.
    blocking_rule ran AD001, fix words and all, on each of the 170,288 plans of the spaces it proved that on (18 CPU-s);
    it now asks the job's kept verdicts (rules/engine Verdicts.fires), which keep the rule's verdict per its screen
    (AD001's ZeRO stage and which degrees are over 1: `rule(screen=...)`), else per the fields it reads, and builds a
    layout's recompute and micro-batch variants only where the rule reads them: the same refusal from a few dozen runs
    of the rule (its check on the plainest plans included)."""
    runs = []
    conditions = engine.load_rules()
    real = conditions["AD001"]

    def counted(ctx):
        runs.append(ctx.plan)
        return real(ctx)

    counted.reads, counted.screen, counted.words = real.reads, real.screen, real.words
    monkeypatch.setitem(conditions, "AD001", counted)
    engine.rules_for.cache_clear()
    engine.blocking_rules.cache_clear()
    try:
        req = Request(model="qwen3-30b-a3b", framework="verl", gpu="b200", lora_rank=8, micro_batch_size=4,
                      zero_stage=2, precision="fp8")
        answer = api.minimum_gpus(req)
    finally:
        monkeypatch.undo()
        engine.rules_for.cache_clear()
        engine.blocking_rules.cache_clear()
    assert answer.num_gpus is None and answer.stopped_by == "rules" and "AD001" in answer.rationale
    assert 0 < len(runs) < 1_000


def test_fp001_fix_names_every_catalog_gpu_with_fp8():
    """FP001's fix listed seven GPUs of its own (H100, H200, H800, H20, B200, GB200, MI300X), leaving out the catalog's
    B300, GB300, B200-750W and the H100 variants, which run FP8: it names the catalog's GPUs that state FP8
    throughput (cards/hardware.yaml fp8_flops), so a GPU added there is named too."""
    from meshplan.knowledge.hardware import gpu_catalog

    report = api.check_config(Request(model="llama-3.1-8b", gpu="a100-80gb", num_gpus=8, precision="fp8"))
    fix = next(f.fix for f in report.findings if f.id == "FP001")
    fp8 = [key for key, spec in gpu_catalog().items() if spec.fp8_flops is not None]
    assert {"b300", "gb300", "b200-750w", "h100-pcie"} <= set(fp8)
    assert fix == f"Use precision=bf16, or a GPU of the catalog with FP8 tensor cores: {', '.join(fp8)}."
    assert "a100-80gb" not in fix and "a100-40gb" not in fix
