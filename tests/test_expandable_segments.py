"""Plan.expandable_segments: with PyTorch's expandable segments the allocated peak (plus page rounding) decides the
fit, the reserved peak is still reported; left out, each framework's card says whether its launcher sets it; the knob
goes through the request, the search, the render and the bench."""

from __future__ import annotations

import json

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import memory_card
from meshplan.faces.cli import main
from meshplan.faces.mcp import tools
from meshplan.knowledge.published_runs import ran_without_expandable_segments
from meshplan.request.resolve import resolve
from meshplan.schema.reports import peak_words
from meshplan.schema.request import Request

BASE = dict(model="llama-3-8b", gpu="h100", num_gpus=8, seq_length=8192, global_batch_size=64, micro_batch_size=2,
            tp=1, pp=1, recompute="none")


def _memory(framework: str, expandable: bool | None):
    return api.estimate_memory(Request(**BASE, framework=framework, expandable_segments=expandable))


def test_allocated_peak_decides_with_expandable_segments():
    reserved, allocated = _memory("megatron-core", False), _memory("megatron-core", True)
    slack = memory_card().expandable_segments_slack_bytes
    assert slack == 40 << 20  # two 20 MiB large-pool pages (cards/memory.yaml)
    # the reported peak is the reserved one either way
    assert reserved.peak_bytes == allocated.peak_bytes
    assert reserved.fit_basis == "reserved" and reserved.fit_bytes == reserved.peak_bytes
    assert allocated.fit_basis == "allocated"
    want = max(s.total_bytes - s.detail["allocator_reserve"] + slack for s in allocated.stages)
    assert allocated.fit_bytes == want
    assert allocated.stages[0].detail["allocator_reserve"] > slack  # so the fit figure is below the peak
    for r in (reserved, allocated):
        assert r.fits == (r.fit_bytes <= r.capacity_bytes)
        assert r.headroom_bytes == r.capacity_bytes - r.fit_bytes
    assert any("allocated peak" in a for a in allocated.assumptions)
    assert not any("allocated peak" in a for a in reserved.assumptions)


def test_a_plan_over_by_less_than_its_reserve_fits_only_with_expandable_segments():
    """Llama-3-8B, 8 H100, seq 2048, micro-batch 2, no recompute: about 80.4 GiB reserved on 79.6 GiB (MEM001), about
    78.1 GiB allocated + page rounding, which fits with expandable segments."""
    fields = {**BASE, "seq_length": 2048, "micro_batch_size": 2, "framework": "megatron-core"}
    off = api.estimate_memory(Request(**fields, expandable_segments=False))
    on = api.estimate_memory(Request(**fields, expandable_segments=True))
    assert on.fit_bytes <= on.capacity_bytes < off.peak_bytes == on.peak_bytes
    assert not off.fits and on.fits
    ids = lambda e: {f.id for f in api.check_config(Request(**fields, expandable_segments=e)).findings}  # noqa: E731
    assert "MEM001" in ids(False) and "MEM001" not in ids(True)


@pytest.mark.parametrize("framework, job_kind, default", [
    ("megatron-bridge", "sft", True), ("torchtitan", "sft", True), ("verl", "rl", True),
    ("verl", "sft", False),  # verl's SFT trainer sets none; its RL workers do (cards/frameworks/verl.yaml allocator)
    ("megatron-core", "sft", False), ("nanotron", "sft", False), ("deepspeed", "sft", False),
    # SkyRL 0.4.0's training workers turn them on after building the model (trainer.use_expandable_segments, default
    # true), main_sft's as the RL trainer's (its SFTConfig has no key for it); before, SkyRL had no allocator section
    # and every job was fitted on the reserved peak
    ("skyrl", "sft", True), ("skyrl", "rl", True),
])
def test_left_out_it_is_how_the_framework_launches(framework, job_kind, default):
    ask = dict(model="llama-3-8b", gpu="h100", num_gpus=8, seq_length=4096, framework=framework, job=job_kind)
    job, plan = resolve(Request(**ask))
    assert plan.expandable_segments is default
    assert any("expandable_segments=true" in n for n in job.notes) is default
    _, plan = resolve(Request(**ask, expandable_segments=not default))
    assert plan.expandable_segments is (not default)


VERL_SFT = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="verl", zero_stage=3, seq_length=4096,
                global_batch_size=64, micro_batch_size=1, recompute="full")


def test_a_verl_training_job_is_estimated_on_its_sft_trainers_allocator():
    """verl 0.9.1's SFT trainer (sft_trainer.py, TrainingWorker) never calls set_expandable_segments; the RL workers
    do. Before, every verl job took expandable segments, so a ZeRO-3 SFT job's fit was its allocated peak."""
    left_out = api.estimate_memory(Request(**VERL_SFT))
    off = api.estimate_memory(Request(**VERL_SFT, expandable_segments=False))
    on = api.estimate_memory(Request(**VERL_SFT, expandable_segments=True))
    assert (left_out.fit_basis, left_out.fit_bytes) == (off.fit_basis, off.fit_bytes) == ("reserved", off.peak_bytes)
    assert on.fit_basis == "allocated" and on.fit_bytes < left_out.fit_bytes
    assert any("expandable_segments=false: verl's SFT trainer" in a for a in left_out.assumptions)
    rl = resolve(Request(**VERL_SFT, job="rl"))[1]  # the RL workers' training phases keep them
    assert rl.expandable_segments is True


def test_recommend_ranks_a_verl_training_job_on_its_sft_trainers_allocator():
    ask = {k: v for k, v in VERL_SFT.items() if k not in ("zero_stage", "micro_batch_size", "recompute")}
    plans = [c.plan for c in api.recommend(Request(**ask)).candidates]
    assert plans and not any(p.expandable_segments for p in plans)


def test_verl_sft_script_exports_it_and_reads_back():
    """The SFT script render writes exports the setting when the plan takes it (the trainer does not set it), and
    import reads an exported PYTORCH_CUDA_ALLOC_CONF back; left out, the trainer's own (off)."""
    from meshplan.adapters.read import import_config

    on = api.render_config("verl", Request(**VERL_SFT, expandable_segments=True))
    assert on.variant == "sft-fsdp" and "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in on.text
    back = import_config(on.text, "run_verl_sft.sh")
    assert back.request["expandable_segments"] is True
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in back.sources["expandable_segments"]
    off = api.render_config("verl", Request(**VERL_SFT))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in off.text and not any("expandable" in n for n in off.notes[-1:])
    plain = import_config(off.text, "run_verl_sft.sh")
    assert "expandable_segments" not in plain.request and plain.defaults["expandable_segments"] is False
    inline = import_config(off.text.replace("torchrun ", "PYTORCH_ALLOC_CONF=expandable_segments:False torchrun "),
                           "run.sh")
    assert inline.request["expandable_segments"] is False


def test_round_trip_through_request_json_cli_and_mcp_schema():
    req = Request(**BASE, framework="megatron-core", expandable_segments=True)
    again = Request.model_validate(json.loads(req.model_dump_json()))
    assert again.expandable_segments is True
    assert resolve(again)[1].expandable_segments is True
    assert "expandable_segments" in Request.model_json_schema()["properties"]


def test_render_writes_it_where_the_framework_takes_it():
    small = {**BASE, "seq_length": 2048, "micro_batch_size": 1}
    on = api.render_config("megatron-core", Request(**small, framework="megatron-core", expandable_segments=True))
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in on.text
    off = api.render_config("megatron-core", Request(**small, framework="megatron-core"))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in off.text
    titan = api.render_config("torchtitan", Request(**small, framework="torchtitan"))  # run_train.sh sets it
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in titan.text
    rl = {**small, "framework": "verl", "job": "rl", "param_offload": True, "optimizer_offload": True}
    verl = api.render_config("verl", Request(**rl))  # hydra: no key, the RL workers set it
    assert "PYTORCH_CUDA_ALLOC_CONF" not in verl.text
    assert any("set_expandable_segments" in n for n in verl.notes)
    verl_off = api.render_config("verl", Request(**rl, expandable_segments=False))
    assert any("expandable_segments=false" in n for n in verl_off.notes)


def test_search_floor_without_reserve_bounds_the_fit_figure():
    from meshplan.search.floors import first_stage_floor
    from meshplan.search.space import Layout

    req = Request(**BASE, framework="megatron-core", expandable_segments=True)
    job, plan = resolve(req)
    lay = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, dp=8)
    report = api.estimate_memory(req)
    floor = first_stage_floor(job, lay, plan.zero_stage, "none", 2, False, reserved=False)
    assert floor <= report.fit_bytes
    assert first_stage_floor(job, lay, plan.zero_stage, "none", 2, False) > floor


def test_runs_whose_launcher_left_it_off():
    """verl runs before its workers set it (a month-only date counts as before) and the Bridge recipe that leaves it
    out ran without it (meshplan/knowledge/published_runs.py); the bench passes expandable_segments=False for them."""
    assert ran_without_expandable_segments("verl", "2025-08", "")
    assert ran_without_expandable_segments("verl", None, "")
    assert not ran_without_expandable_segments("verl", "2025-09", "")
    assert not ran_without_expandable_segments("megatron-bridge", "2025-08", "x y")
    cited = "perf_recipes/llama/gb200/llama3.py (llama3_70b_pretrain_64gpu_gb200_fp8cs_config) "
    assert ran_without_expandable_segments("megatron-bridge", "NeMo container 26.04.01", cited)


def test_cli_flag_and_json(capsys, monkeypatch):
    from meshplan.faces import cli

    monkeypatch.setenv("COLUMNS", "200")
    args = ["memory", "llama-3-8b", "--gpu", "h100", "--num-gpus", "8", "--seq-length", "2048",
            "--global-batch-size", "64", "--micro-batch-size", "2", "--framework", "megatron-core"]
    assert cli.main([*args, "--expandable-segments", "true", "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert out["fit_basis"] == "allocated" and out["plan"]["expandable_segments"] is True and out["fits"] is True
    assert cli.main([*args, "--expandable-segments", "false", "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert out["fit_basis"] == "reserved" and out["fits"] is False
    cli.main([*args, "--expandable-segments", "true"])
    assert "the allocated peak" in capsys.readouterr().out


def test_a_rendered_env_line_is_not_read_as_a_config_override():
    """The shell snippets export PYTORCH_CUDA_ALLOC_CONF before the command; the Hydra/OmegaConf override reader
    (used by the render -> parse round trip and the proofs against the frameworks' config classes) skips it."""
    from meshplan.adapters.parse import overrides, shell_tokens

    text = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\ntorchrun run.py model.tp=2 +a.b=3 --x=1\n"
    assert overrides(shell_tokens(text)) == {"model.tp": "2", "+a.b": "3"}


def test_an_rl_jobs_actor_search_keeps_the_rl_workers_allocator():
    """recommend and min-gpus rank an RL job's actor layouts as a training request (rl/job.trainer_request): that
    request must carry the RL launcher's allocator, not the SFT trainer's a training job left out would take, and the
    RL plan takes it from the RL job's own (search/rl_actor.actor_layout)."""
    from meshplan.rl.job import resolve_rl, trainer_request
    from meshplan.search.rl_actor import actor_layout

    rl = Request(**{**VERL_SFT, "zero_stage": None}, job="rl")
    training = trainer_request(resolve_rl(rl, [])[0])
    assert training.job is None and training.expandable_segments is True
    assert resolve(training)[1].expandable_segments is True
    asked = trainer_request(resolve_rl(rl.model_copy(update={"expandable_segments": False}), [])[0])
    assert asked.expandable_segments is False
    base = resolve(rl)[1]
    actor = resolve(Request(**VERL_SFT))[1]
    assert actor_layout(actor, base).expandable_segments is True



def test_mem002_states_the_peak_its_headroom_is_left_from():
    """With expandable segments the headroom is what the allocated peak leaves; MEM002 said "only 1.5 GiB (1.9%) free
    at a predicted peak of 80.4 GiB" on a 79.6 GiB GPU, the reserved peak beside the allocated peak's headroom."""
    report = api.check_config(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="megatron-bridge"))
    memory = api.estimate_memory(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="megatron-bridge"))
    assert memory.fit_basis == "allocated" and memory.peak_bytes > memory.capacity_bytes > memory.fit_bytes
    finding = next(f for f in report.findings if f.id == "MEM002")
    assert f"at a predicted peak of {memory.fit_bytes / 2**30:.1f} GiB allocated (expandable segments; " \
           f"{memory.peak_bytes / 2**30:.1f} GiB reserved)" in finding.message


def test_a_layout_below_the_headroom_states_the_free_memory_its_ranking_reads():
    """Nothing keeps 10% free here (expandable segments: the allocated peak decides); the fastest that fits with less
    was said to leave 0.4 GiB (0.3%), the reserved peak's, beside 'headroom=0.008 would rank it' and MEM002's 1.1 GiB
    (0.8%), the allocated peak's, in the same answer."""
    rec = api.recommend(Request(model="deepseek-v2-lite", framework="skyrl", gpu="h200", num_gpus=2,
                                seq_length=16384, global_batch_size=2, account_for_loss=True,
                                cpu_memory_per_node=64.0), top_k=2)
    row = rec.best_below_headroom
    assert row is not None and not rec.candidates and row.memory.fit_basis == "allocated"
    free = row.memory.headroom_bytes
    assert f"it leaves {free / 2**30:.1f} GiB ({free / row.memory.capacity_bytes:.1%}) free" in row.rationale
    assert row.memory.capacity_bytes - row.memory.peak_bytes < free  # the reserved peak's would say less


@pytest.mark.parametrize("given", [None, True])
def test_a_verl_rl_render_says_once_that_its_workers_set_it(given):
    """verl's RL workers set expandable segments themselves (no config key): the rendered script's notes say so once,
    left out or given. Before, the resolver's note and render's allocator note both said it, nearly word for word."""
    rl = {**BASE, "seq_length": 2048, "micro_batch_size": 1, "framework": "verl", "job": "rl", "zero_stage": 3,
          "expandable_segments": given}
    notes = api.render_config("verl", Request(**rl)).notes
    said = [n for n in notes if n.startswith("expandable_segments=true")]
    assert len(said) == 1 and "set_expandable_segments" in said[0], said
    assert given is None or "as given" in said[0]


TITAN_8B = ["llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8", "--framework", "torchtitan", "--top-k", "2"]


def test_recommends_table_names_the_allocated_peak_that_ranked_it(capsys):
    """torchtitan launches with expandable segments, so its rows are fitted on the allocated peak; the table's 'peak
    GiB' is the reserved one. Before, Llama-3.1-8B on 8 H100 listed TP1 PP2 VPP2 DP4 dualpipev at 78.10 GiB of 79.65
    under '10% of GPU memory kept free' with no word that 68.41 GiB allocated had ranked it."""
    rec = api.recommend(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="torchtitan"), top_k=2)
    assert all(c.memory.fit_basis == "allocated" for c in rec.candidates)
    assert main(["recommend", *TITAN_8B]) == 0
    out = " ".join(capsys.readouterr().out.split())
    figures = ", ".join(f"#{c.rank} {c.memory.fit_bytes / 2**30:.2f}" for c in rec.candidates)
    assert f"with expandable segments the allocated peak decides the fit and the headroom: {figures} GiB" in out


def test_a_reserved_fit_gets_no_allocated_line(capsys):
    assert main(["recommend", "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8", "--top-k", "1"]) == 0
    assert "allocated peak decides" not in capsys.readouterr().out


def test_mcp_recommends_summary_names_the_allocated_peak():
    """The MCP summary, the one line some hosts show, said 'peak memory 72.4 GiB of 79.6 GiB' for a row ranked on
    63.3 GiB allocated; it now names both, as estimate_memory's and check_config's summaries do."""
    answer = tools.recommend_parallelism(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="torchtitan",
                                         top_k=1)
    best = answer.candidates[0].memory
    assert (f"peak memory {best.peak_bytes / 2**30:.1f} GiB reserved (allocated {best.fit_bytes / 2**30:.1f} GiB: "
            "with expandable segments it decides the fit)") in answer.summary
    assert f"Best of {answer.considered:,} layouts" in answer.summary


def test_recommends_rationale_names_the_peak_that_decided_the_fit():
    """Each row's rationale said 'peak memory 78.1 of 79.6 GiB', the reserved peak with no basis, while the table's
    note and the MCP summary name the allocated peak that ranked it: the rationale now says it the same way
    (schema/reports.peak_words, the one helper)."""
    rec = api.recommend(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="torchtitan"), top_k=2)
    for c in rec.candidates:
        assert f"peak memory {peak_words(c.memory)} of " in c.rationale
        assert f"allocated {c.memory.fit_bytes / 2**30:.1f} GiB: with expandable segments it decides" in c.rationale
    reserved = api.recommend(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8), top_k=1).candidates[0]
    assert reserved.memory.fit_basis == "reserved"
    assert f"peak memory {reserved.memory.peak_bytes / 2**30:.1f} GiB reserved of " in reserved.rationale
