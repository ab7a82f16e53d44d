"""Rule MEM003 in the RL recommend: an RL step whose offloads the node's host cannot hold (cpu_memory_per_node) is not
ranked, as `check` refuses it; and where the framework offloads every trainer model around the rollout by itself
(SkyRL's colocate_all), a host below the floor of what that takes on any layout is refused before any search, with
the numbers and the changes that open it (it used to search until the estimate budget ran out, then answer that this
was "not proof that none fits")."""

from __future__ import annotations

import pytest

import meshplan.search.engine as search_engine
from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.request.resolve import resolve
from meshplan.rl.memory import least_framework_host, rl_memory
from meshplan.schema.request import Request
from meshplan.search.job import search_job
from meshplan.search.refusal import HostRefused
from meshplan.search.rl import _training, refuse_host
from meshplan.search.rl_actor import (
    HOST_FREE_FIELDS,
    ActorHost,
    actor_engine,
    actor_layout,
    host_key,
    offload_options,
)
from meshplan.search.space import Fixed, params_split, zero_ladder
from meshplan.search.zero_stages import LeftOut, least_offloaded_state_bytes

SKYRL = dict(model="qwen3-30b-a3b", framework="skyrl", gpu="h100", num_gpus=16, job="rl", algorithm="grpo")
VERL = dict(model="qwen3-30b-a3b", framework="verl", gpu="h100", num_gpus=16, job="rl", algorithm="grpo")


def floor_of(req: Request) -> float:
    """least_framework_host of the request, as refuse_host reads it."""
    job, base = resolve(req)
    training = _training(req)
    trainer, _ = search_job(training)
    fixed = Fixed.from_request(training, trainer)
    states = least_offloaded_state_bytes(trainer, zero_ladder(trainer.card), fixed.carried)
    return least_framework_host(job, base, states, sum(params_split(trainer)))


LAYOUTS = [dict(tp=1, pp=1, dp=16, zero_stage=3), dict(tp=2, pp=2, dp=4, zero_stage=1, ep=4),
           dict(tp=4, pp=1, dp=4, zero_stage=1, ep=4), dict(tp=1, pp=4, dp=4, zero_stage=1, ep=4),
           dict(tp=1, pp=4, dp=4, zero_stage=1), dict(tp=2, pp=1, dp=8, zero_stage=1, ep=8),
           dict(tp=8, pp=2, dp=1, zero_stage=1), dict(tp=1, pp=1, dp=8, cp=2, zero_stage=3)]


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_the_framework_host_floor_never_over_counts(model, algorithm):
    """The floor is at most the host every plan's RL memory estimate takes (dense and MoE, with a reference model,
    with a critic; ZeRO 0, 1 and 3; experts over EP where the layout has it)."""
    base = dict(SKYRL, model=model, algorithm=algorithm)
    floor = floor_of(Request(**base))
    assert floor > 0
    checked = 0
    for fields in LAYOUTS:
        if not model.endswith("a3b"):
            fields = {k: v for k, v in fields.items() if k != "ep"}  # expert parallelism: the MoE model's only
        try:
            job, plan = resolve(Request(**base, **fields))
            host = rl_memory(job, plan).host_bytes_per_node
        except MeshplanError:
            continue  # a layout the framework's rules refuse
        checked += 1
        assert floor <= host, (fields, floor / GIB, host / GIB)
    assert checked >= (4 if algorithm == "grpo" else 2)  # SkyRL trains PPO's critic on its FSDP strategy only


def test_verl_offloads_by_its_knobs_so_it_has_no_framework_floor():
    assert floor_of(Request(**VERL)) == 0.0


def test_a_host_below_the_floor_is_refused_with_the_numbers_and_a_fix_that_works():
    req = Request(**SKYRL, cpu_memory_per_node=64)
    floor = floor_of(req)
    assert 64 * GIB < floor < 86 * GIB  # ZeRO-3 over all 16 GPUs, the optimizer kept on the GPU, takes it: 85.3 GiB
    with pytest.raises(HostRefused) as err:  # min-gpus takes it as "none at this count" and scans on
        api.recommend(req)
    assert err.value.reason.startswith("MEM003")
    assert f"{floor / GIB:,.1f} GiB" in err.value.reason and "64.0 GiB" in err.value.reason
    assert "24 GPUs" in err.value.fix and "placement=separate" in err.value.fix  # min-gpus' count at 64 GiB too
    bigger = Request(**{**SKYRL, "num_gpus": 24}, cpu_memory_per_node=64)
    job, base = resolve(bigger)
    refuse_host(job, base, _training(bigger))  # the fix's GPU count passes the floor
    assert floor_of(bigger) <= 64 * GIB


def test_an_rl_step_whose_offloads_the_host_cannot_hold_is_not_ranked():
    """verl's phase offloads put 398.6 GiB per node on the host for the fastest steps; with 100 GiB they are counted
    under MEM003 and the steps without them ranked, so `check` passes the #1 (it ranked a plan `check` refused)."""
    req = Request(**VERL, cpu_memory_per_node=100)
    rec = api.recommend(req)
    assert rec.candidates and rec.rejected.get("MEM003", 0) > 0
    assert all(c.memory.host_bytes_per_node <= 100 * GIB for c in rec.candidates)
    plan = rec.candidates[0].plan
    fields = {k: getattr(plan, k) for k in ("tp", "pp", "vpp", "ep", "etp", "dp", "cp", "zero_stage", "recompute",
                                              "micro_batch_size", "rollout_tp", "rollout_dp", "rollout_ep",
                                              "rollout_memory_fraction", "param_offload", "optimizer_offload")}
    report = api.check_config(Request(**VERL, cpu_memory_per_node=100, **fields))
    assert not [f for f in report.findings if f.severity == "error"], report.findings


def fields_of(plan) -> dict:
    """The plan's fields a request can fix, for `check` of a ranked RL plan."""
    return {k: getattr(plan, k) for k in ("tp", "pp", "vpp", "ep", "etp", "dp", "cp", "zero_stage", "recompute",
                                          "micro_batch_size", "rollout_tp", "rollout_dp", "rollout_ep",
                                          "rollout_memory_fraction", "param_offload", "optimizer_offload")}


def test_a_host_between_the_floor_and_the_fastest_layouts_host_ranks_the_layouts_that_fit():
    """SkyRL's colocated offload puts ~290-370 GiB per node on the host for the training search's fastest layouts
    (ZeRO-1, little model parallelism); with 290 GiB it used to answer that no RL step fits on its best 256 (all
    MEM003). The actor search now counts each layout's RL step host (search/rl_actor.py), so it ranks the sharded
    layouts whose RL step fits, and `check` passes the #1."""
    req = Request(**SKYRL, cpu_memory_per_node=290)
    rec = api.recommend(req)
    assert rec.candidates, rec.rationale
    assert all(c.memory.host_bytes_per_node <= 290 * GIB for c in rec.candidates)
    report = api.check_config(Request(**SKYRL, cpu_memory_per_node=290, **fields_of(rec.candidates[0].plan)))
    assert not [f for f in report.findings if f.severity == "error"], report.findings


def test_the_actor_search_host_is_the_rl_steps():
    """One home for MEM003's figure: the host the actor search reads per layout (ActorHost) is the host rl_memory
    reports for that layout's RL step (rl_host_bytes)."""
    req = Request(**SKYRL, cpu_memory_per_node=290)
    job, base = resolve(req)
    for fields in ({"tp": 8, "pp": 2, "dp": 1, "zero_stage": 1}, {"tp": 2, "pp": 2, "ep": 4, "dp": 4, "zero_stage": 1}):
        _, actor = resolve(_training(Request(**SKYRL, **fields)))
        host = ActorHost(job, base, req)(actor)
        plan = actor_layout(actor, base).model_copy(update={k: getattr(base, k) for k in (
            "rollout_tp", "rollout_dp", "rollout_ep", "rollout_memory_fraction")})
        assert host == rl_memory(job, plan).host_bytes_per_node > 200 * GIB


def test_the_gpu_fit_alone_costs_no_rl_host_estimate(monkeypatch):
    """host_counts.host_only asks the actor engine for the GPU's fit alone (host=None) to tell MEM003 from MEM001; the
    RL step's host (ActorHost: an estimate per offload variant) is then not worked out, while a verdict under the host
    limit still reads it and refuses a plan over it."""
    req = Request(**SKYRL, cpu_memory_per_node=290)
    job, base = resolve(req)
    trainer = resolve(_training(Request(**SKYRL, tp=2, pp=2, ep=4, dp=4, zero_stage=1)))
    engine = actor_engine(job, base, req, job.framework)
    asked: list[int] = []
    real = ActorHost.__call__
    monkeypatch.setattr(ActorHost, "__call__", lambda self, actor, *count: asked.append(1) or real(self, actor, *count))
    budget = job.gpu.memory_bytes
    alone = engine.memory_fit(trainer[0], trainer[1], budget, None)
    assert alone.complete and not asked
    limited = engine.memory_fit(trainer[0], trainer[1], budget, 290 * GIB)
    assert asked and limited.figure == alone.figure and limited.host_per_node > 200 * GIB
    assert not engine.memory_fit(trainer[0], trainer[1], budget, 200 * GIB).complete



@pytest.mark.parametrize("fields", [dict(tp=2, pp=2, ep=4, dp=4, zero_stage=1), dict(tp=1, pp=4, dp=4, zero_stage=1)])
def test_an_actor_verdict_that_fits_gives_the_actor_reports_figures(fields):
    """A complete verdict of the actor engine under a host limit carries its memory report's fit figure, host (the RL
    step's) and peak exactly, as the oracle reads them in place of the report; one the host refuses keeps the GPU's
    figures, floors of the report's."""
    req = Request(**SKYRL, cpu_memory_per_node=290)
    job, base = resolve(req)
    trainer, plan = resolve(_training(Request(**SKYRL, **fields)))
    engine = actor_engine(job, base, req, job.framework)
    report = engine.memory(trainer, plan)
    budget = job.gpu.memory_bytes
    fits = engine.memory_fit(trainer, plan, budget, report.host_bytes_per_node)
    assert fits.complete and report.fit_bytes <= budget
    assert (fits.figure, fits.host_per_node, fits.peak) == (
        report.fit_bytes, report.host_bytes_per_node, report.peak_bytes)
    over = engine.memory_fit(trainer, plan, budget, report.host_bytes_per_node - 1)
    assert not over.complete and over.peak <= report.peak_bytes and over.figure <= report.fit_bytes


HOST_FREE_VARIANTS = [{"micro_batch_size": 4}, {"recompute": "full"}, {"recompute": "selective"},
                      {"recompute": "full", "recompute_layers": 2, "recompute_method": "uniform"},
                      {"recompute": "full", "recompute_layers": 2, "recompute_method": "block"},
                      {"recompute": "selective", "recompute_modules": ["core_attn", "mlp"]},
                      {"recompute": "selective", "selective_ac_option": "2"}]


@pytest.mark.parametrize("fields", [dict(tp=2, pp=2, ep=4, dp=4, zero_stage=1), dict(tp=1, pp=1, dp=16, zero_stage=3)])
@pytest.mark.parametrize("framework", ["skyrl", "verl"])
def test_the_rl_host_reads_no_micro_batch_or_recompute_unless_activations_go_to_the_host(framework, fields):
    """ActorHost keeps one host figure per host_key, every field but HOST_FREE_FIELDS: each of those, varied alone,
    leaves the RL step's host (worked out afresh) as it was; with activations offloaded the host reads the
    micro-batch, so such a layout has no key."""
    assert set().union(*HOST_FREE_VARIANTS) == HOST_FREE_FIELDS
    req = Request(**{**SKYRL, "framework": framework}, cpu_memory_per_node=290)
    job, base = resolve(req)
    _, actor = resolve(_training(Request(**{**SKYRL, "framework": framework}, **fields)))
    plain = ActorHost(job, base, req)(actor)
    tried = set()
    for update in HOST_FREE_VARIANTS:
        varied = actor.model_copy(update=update)
        try:
            host = ActorHost(job, base, req)(varied)
        except MeshplanError:  # a setting this engine refuses (its rule says why): nothing to hold
            continue
        assert host == plain, update
        assert host_key(actor_layout(varied, base)) == host_key(actor_layout(actor, base))
        tried |= set(update)
    assert {"micro_batch_size", "recompute"} <= tried


def test_a_layout_offloading_activations_has_no_host_key():
    """With activations offloaded (verl's FSDP enable_activation_offload) the RL step's host grows with the
    micro-batch: no key, each plan's host worked out."""
    req = Request(**VERL, cpu_memory_per_node=290, activation_offload=True)
    job, base = resolve(req)
    _, actor = resolve(_training(Request(**VERL, tp=1, pp=1, dp=16, zero_stage=3)))
    assert base.activation_offload and host_key(actor_layout(actor, base)) is None
    hosts = [ActorHost(job, base, req)(actor.model_copy(update={"micro_batch_size": b})) for b in (1, 8)]
    assert hosts[1] > hosts[0]  # the offloaded activations grow with the micro-batch


def test_an_rl_recommend_never_ranks_one_plan_twice():
    """SkyRL resolves optimizer_offload on (offload_after_step, its default) and its colocate_all offloads every
    trainer model anyway: the variant 'with the phase offload' was the plan as resolved, so #1 and #2 were one plan.
    No two candidates are equal once their rank is dropped, and their table rows differ."""
    from meshplan.faces.display import rl_table

    rec = api.recommend(Request(**SKYRL))
    plans = [c.model_copy(update={"rank": 0}).model_dump_json() for c in rec.candidates]
    assert len(rec.candidates) == 5 and len(set(plans)) == len(plans)
    rows = [tuple(cells[1:]) for cells in zip(*(col._cells for col in rl_table(rec.candidates).columns), strict=True)]
    assert len(set(rows)) == len(rows)


def test_the_phase_offload_variants_are_each_a_different_rl_step():
    """verl: without and with its phase offloads (two RL steps). SkyRL, colocated or placed apart (where
    colocate_policy_ref still swaps the policy and the reference through the host): its Megatron workers' own offload
    moves the optimizer whatever the knob says, so only its default; its FSDP workers move the optimizer only with
    offload_after_step, so with it and without."""
    apart = {**SKYRL, "placement": "separate", "rollout_gpus": 8}
    for spec, expected in ((VERL, [{}, {"param_offload": True, "optimizer_offload": True}]),
                           (SKYRL, [{}]), (apart, [{}]),
                           ({**apart, "zero_stage": 3}, [{}, {"optimizer_offload": False}])):
        req = Request(**spec)
        job, base = resolve(req)
        assert offload_options(job, base, req) == expected, spec
    fixed = Request(**VERL, optimizer_offload=False)
    job, base = resolve(fixed)
    assert offload_options(job, base, fixed) == [{}]


def test_the_floors_fix_names_the_count_min_gpus_finds():
    """The floor counts what the RL step's host counts (least_offloaded_state_bytes: the states the framework's own
    offload copies there): with 64 GiB per node the refusal at 16 GPUs names 24 GPUs, the count min-gpus finds (the
    ZeRO-3 layout with the optimizer kept on the GPU takes 56.9 GiB per node there). min-gpus' scan checks the
    trainer's GPU fit only: the training step's host, with SkyRL's offload_after_step on as resolved, ruled 24 out
    though the RL step turns it off (it answered 32)."""
    with pytest.raises(HostRefused) as err:
        api.recommend(Request(**SKYRL, cpu_memory_per_node=64))
    assert "at least 24 GPUs" in err.value.fix
    spec = {k: v for k, v in SKYRL.items() if k != "num_gpus"}
    assert api.minimum_gpus(Request(**spec, cpu_memory_per_node=64)).num_gpus == 24


def test_skyrl_placed_apart_ranks_an_rl_step_on_its_eight_trainer_gpus():
    """Placed apart (8 rollout + 8 trainer GPUs), the reference waits on the host while the policy updates
    (colocate_policy_ref): the training search's fastest layouts fit the RL step. Counted resident beside the update
    (8 GB more), every one of the 256 actor layouts tried was over the headroom (RL005) and nothing was ranked."""
    rec = api.recommend(Request(**SKYRL, placement="separate", rollout_gpus=8))
    assert rec.candidates and "RL005" not in rec.rejected
    # the figure that decides the fit (memory.fit_figure): with expandable segments the allocated peak
    assert rec.candidates[0].memory.fit_bytes <= 0.9 * rec.candidates[0].memory.capacity_bytes


@pytest.mark.slow  # about a minute: an RL recommend at every count scanned
def test_min_gpus_of_an_rl_job_whose_actor_search_is_empty_scans_without_error(monkeypatch):
    """An RL job whose actor search is empty at the count the host floor opens (24 GPUs) explains itself by scanning
    other counts. The actor engine's host (rl_actor.ActorHost) took those counts' plans on the RL job of 24 GPUs:
    min-gpus ended in WS003 ("dp=1 was given, but num_gpus/(tp*pp*cp) = 24/8 = 3"). ActorHost.at resolves the RL job
    at the count asked. Found on SkyRL with the allocator given, whose search then left ZeRO 3 out (the stage probe
    at recompute none, zero_stages.estimable_zeros, fixed since): that ladder is forced here, the host floor still
    reading every stage the request leaves open (search/rl.py)."""
    real = search_engine.search_ladder

    def without_fsdp(job, fixed, recomputes):
        zeros, left = real(job, fixed, recomputes)
        return tuple(z for z in zeros if z != 3), (*left, LeftOut(3, ("RC006",) * len(recomputes)))

    monkeypatch.setattr(search_engine, "search_ladder", without_fsdp)
    spec = {k: v for k, v in SKYRL.items() if k != "num_gpus"}
    answer = api.minimum_gpus(Request(**spec, cpu_memory_per_node=64))
    assert answer.num_gpus is not None and answer.num_gpus > 24


# verl's GRPO job with responses of 320 tokens (prompt 512): at mbs 64 its TP4 PP2 EP1 update keeps the unfused
# loss's logits at 8 B (cards/frameworks/verl.yaml engine.rl_loss megatron: CopySlices' bf16 copies at the loss's
# peak, 6 before the RL loss path was counted), so the default 512-token responses no longer fit it without offload
SHORT = {**VERL, "response_length": 320}


def test_the_rl_ranking_fits_a_step_on_the_figure_check_reads():
    """verl's RL workers run the training phases with expandable segments (cards/frameworks/verl.yaml allocator), so
    check's RL005 fits them on their allocated peak (rl/memory.worst_stage fit_bytes); the RL ranking compared the
    reserved peak with the budget and refused (RL005) the plans without offload whose reserved peak is over it though
    their fit is not, ranking an offloaded step first (fails before: the top plan's reserved peak was under the
    budget). Asked at the actor layout whose update phase decides its fit, TP4 PP2 EP1 (the free request's first
    before the experts' launch floor: test_the_rl_ranking_follows_the_experts_launches), it ranks (at SHORT) the
    15.73 s step without offload, 71.2 GiB allocated, 73.4 GiB reserved, of the 71.7 GiB the headroom leaves."""
    rec = api.recommend(Request(**SHORT, tp=4, pp=2, ep=1), top_k=1)
    top = rec.candidates[0]
    assert "RL005" not in rec.rejected and top.memory.fit_basis == "allocated"
    assert top.memory.fit_bytes <= 0.9 * top.memory.capacity_bytes < top.memory.peak_bytes
    assert not top.plan.param_offload and not top.plan.optimizer_offload


def test_the_rl_ranking_follows_the_experts_launches():
    """verl's Megatron engine launches the routed experts' grouped GEMMs one local expert at a time (its card's
    grouped_gemm_launches: config_converter's moe_grouped_gemm=True, Transformer Engine's GroupedLinear), so TP4 PP2
    EP1's 128 local experts take at least 256 launches of 29.2 us per MoE layer and micro-batch forward: its RL step
    12.09 -> 15.84 s. The free request ranks first a layout of at most 32 local experts with param and optimizer
    offload on the alltoall dispatcher (TP1 EP8 at micro-batch 16, 14.05 s, since 2026-12-06's NCCL SM share made
    TP2's overlapped collectives dearer; TP2 EP4 at micro-batch 32, 13.55 s, before); free to take the flex dispatcher,
    whose DeepEP backend permutes in 8 passes, not 16 (moe_time.dispatcher_passes), it ranks TP1 EP16 flex without
    offload first (14.30 s, 8 local experts). On alltoall, the offloaded plan's twin without offload steps faster but
    keeps the reference model on the GPU through the update, whose allocated peak is over what the default headroom
    leaves at any memory fraction: check refuses it there too (MEM001 over the capacity, or MEM002, fits but without
    the headroom), and the ranking refuses every memory fraction of it, counting under MEM002 the layouts whose phases
    fit without the headroom, as check names them (RL005 only for a phase over the capacity, which check names RL005
    too)."""
    pinned = api.recommend(Request(**SHORT, tp=4, pp=2, ep=1), top_k=1).candidates[0]
    free = api.recommend(Request(**SHORT), top_k=1).candidates[0]
    assert free.plan.ep >= 4 and free.throughput.step_time_s < pinned.throughput.step_time_s  # <= 32 local experts
    rec = api.recommend(Request(**SHORT, moe_token_dispatcher="alltoall"), top_k=1)
    top = rec.candidates[0]
    assert top.plan.ep >= 4 and top.plan.param_offload and top.plan.optimizer_offload
    assert top.throughput.step_time_s < pinned.throughput.step_time_s
    twin = {**SHORT, **{k: getattr(top.plan, k) for k in ("tp", "pp", "ep", "etp", "micro_batch_size", "zero_stage",
                                                         "moe_token_dispatcher",
                                                         "recompute", "rollout_tp", "rollout_dp", "rollout_ep")},
            "param_offload": False, "optimizer_offload": False, "rollout_memory_fraction": 0.25}
    faster = api.estimate_throughput(Request(**twin)).step_time_s
    assert faster < top.throughput.step_time_s
    update = next(p for p in api.estimate_memory(Request(**twin)).phases if p.phase == "actor_update")
    assert update.fit_bytes > 0.9 * top.memory.capacity_bytes > top.memory.fit_bytes
    thinnest = {f.id for f in api.check_config(Request(**{**twin, "rollout_memory_fraction": 0.05})).findings}
    assert {"MEM001", "MEM002"} & thinnest  # refused at any memory fraction
    assert rec.rejected.get("MEM002") and ("RL005" not in rec.rejected or "RL005" in thinnest)


def _asked_again(monkeypatch, req: Request) -> tuple[int, int]:
    """The RL recommend of `req` with its actor engine's verdicts watched: (GPU-only verdicts asked of a plan whose
    verdict under the host limit had already read every stage, verdicts under the host limit that refused a plan
    by its host)."""
    import dataclasses

    import meshplan.search.rl as rl_search

    real = rl_search.actor_engine
    read_all: set[str] = set()
    counts = [0, 0]

    def watched(*args, **kwargs):
        engine = real(*args, **kwargs)
        inner = engine.memory_fit

        def memory_fit(trainer, plan, budget, host=None, first=0, checked=False):
            verdict = inner(trainer, plan, budget, host, first, checked)
            key = plan.model_dump_json()
            if host is None:
                counts[0] += key in read_all
            elif not verdict.complete and verdict.figure <= budget:
                counts[1] += 1
                if verdict.over is None:
                    read_all.add(key)
            return verdict
        return dataclasses.replace(engine, memory_fit=memory_fit)

    monkeypatch.setattr(rl_search, "actor_engine", watched)
    api.recommend(req)
    return counts[0], counts[1]


def test_a_verdict_that_read_every_stage_is_not_estimated_again_to_count_mem003(monkeypatch):
    """The actor engine reads the RL step's host after the GPU's whole verdict, so a plan it refuses by the host has
    its GPU figure within the budget on every stage: the count takes it as MEM003 without a second, GPU-only verdict
    (host_counts.host_rejected took every pipelined one as stopped early and asked again: 2,996 verdicts of the
    SkyRL Qwen3-30B-A3B request on 24 H100 with 64 GiB per node)."""
    again, refused = _asked_again(monkeypatch, Request(**{**SKYRL, "num_gpus": 24}, cpu_memory_per_node=64))
    assert refused > 1000  # the request refuses most plans by the host: the test reads the path it is about
    assert again == 0


def _gpu_verdicts(monkeypatch, req: Request, gpu_first: bool):
    """The RL recommend of `req` and the GPU verdicts its actor engine asked; `gpu_first`: with ActorHost.known turned
    off, so that every plan's GPU is estimated before its host (the order before the known host was read first)."""
    import dataclasses

    import meshplan.search.rl_actor as rl_actor

    real_engine = rl_actor.default_engine
    asked = [0]

    def counting(framework):
        engine = real_engine(framework)
        inner = engine.memory_fit

        def memory_fit(*args, **kwargs):
            asked[0] += 1
            return inner(*args, **kwargs)
        return dataclasses.replace(engine, memory_fit=memory_fit)

    with monkeypatch.context() as patch:
        patch.setattr(rl_actor, "default_engine", counting)
        if gpu_first:
            patch.setattr(ActorHost, "known", lambda self, actor, trainer_gpus: None)
        return api.recommend(req), asked[0]


def test_a_plan_whose_known_host_is_over_the_limit_costs_no_gpu_estimate_and_counts_stay(monkeypatch):
    """Once the RL step's host of a host_key is worked out, the actor engine refuses every other plan of that key over
    the limit before its GPU estimate (no micro-batch or recompute changes that host). The RL recommend's actor
    search, whose counts nothing reads (rows_only), then asks no GPU verdict of them: SkyRL Qwen3-30B-A3B on 24 H100
    with 64 GiB per node asked about 4,750 before, 430 after. Before, every such plan cost its GPU verdict."""
    ranked = Request(**{**SKYRL, "num_gpus": 24}, cpu_memory_per_node=64)
    before, gpu_first = _gpu_verdicts(monkeypatch, ranked, gpu_first=True)
    after, host_first = _gpu_verdicts(monkeypatch, ranked, gpu_first=False)
    assert after.candidates and after.model_dump() == before.model_dump()
    assert host_first < gpu_first / 4, (host_first, gpu_first)


def test_a_counted_search_over_the_host_tells_the_gpus_rule_first(monkeypatch):
    """As the test above, on a counted search (the empty actor search's whole answer, which shows MEM001 and MEM003):
    it still tells the GPU's rule first (host_counts.host_only), the same answer as the GPU-first order gives, counts
    included."""
    empty = Request(**SKYRL, cpu_memory_per_node=86, tp=2)  # above the floor; no actor layout's RL step fits the host
    before, _ = _gpu_verdicts(monkeypatch, empty, gpu_first=True)
    after, _ = _gpu_verdicts(monkeypatch, empty, gpu_first=False)
    assert not after.candidates and after.rejected["MEM003"] > 0 and after.rejected["MEM001"] > 0
    assert after.model_dump() == before.model_dump()
