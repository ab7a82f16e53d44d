"""Request resolution: the defaults each framework really applies, written down in Job.notes."""

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.request.parse import field_aliases, parse_request
from meshplan.request.resolve import default_global_batch, resolve
from meshplan.schema.request import Request


def test_megatron_defaults_etp_to_tp_for_moe_like_megatron_core():
    job, plan = resolve(Request(model="mixtral-8x7b", num_gpus=16, tp=2, ep=4))
    assert plan.etp == 2 and any("etp not given" in n for n in job.notes)
    _, plan = resolve(Request(model="mixtral-8x7b", num_gpus=16, tp=2, ep=4, etp=1))
    assert plan.etp == 1


def test_etp_note_says_the_megatron_core_default_and_what_the_framework_recipes_set():
    def etp_note(framework: str) -> str:
        job, _ = resolve(Request(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, framework=framework))
        return next(n for n in job.notes if n.startswith("etp not given"))

    assert etp_note("megatron-bridge") == ("etp not given: 2 = tp, as Megatron-Core defaults it; every Megatron-Bridge "
                                           "MoE LLM recipe sets etp=1 (pass etp=1 to keep experts whole).")
    assert etp_note("verl") == ("etp not given: 2 = tp, as Megatron-Core defaults it; verl's MoE examples set etp=1 "
                                "(pass etp=1 to keep experts whole).")
    # Megatron-Core's card names no recipes: the note states the default alone.
    assert etp_note("megatron-core") == ("etp not given: 2 = tp, as Megatron-Core defaults it "
                                         "(pass etp=1 to keep experts whole).")


def test_etp_default_is_one_for_dense_models_and_other_frameworks():
    _, plan = resolve(Request(model="llama-3.1-8b", num_gpus=8, tp=2))
    assert plan.etp == 1
    _, plan = resolve(Request(model="mixtral-8x7b", num_gpus=16, tp=2, ep=4, framework="torchtitan"))
    assert plan.etp == 1


def test_dp_derived_per_world_size_law():
    _, plan = resolve(Request(model="mixtral-8x7b", num_gpus=32, tp=4, ep=2, etp=1))
    assert plan.dp == 8
    _, plan = resolve(Request(model="mixtral-8x7b", num_gpus=32, tp=4, ep=2, framework="kempnerforge"))
    assert plan.dp == 4  # KempnerForge gives EP ranks of its own


def test_default_global_batch_is_about_4m_tokens_in_whole_microbatches():
    assert default_global_batch(4096, 8) == 1024
    assert default_global_batch(4096, 48) == 1056  # rounded up to a multiple of the GPU count
    assert default_global_batch(131072, 8) == 32
    assert default_global_batch(4096, 8, micro_batch_size=3, dp=8) == 1032  # and of micro-batch x dp where it is not
    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=8))
    assert job.global_batch_size == 1024 and any("global_batch_size not given" in n for n in job.notes)


def test_the_default_batch_is_the_requests_whatever_the_layout():
    """One default per request: check of any layout on 20 GPUs takes recommend's 520 sequences (a multiple of the 20
    GPUs), where it took 512 = 256 micro-batches of 2 x dp 1 and PP005 refused pp 5 (256 % 5)."""
    ask = {"model": "llama-3.1-70b", "num_gpus": 20, "gpu": "h100", "seq_length": 8192}
    for layout in ({"tp": 4, "pp": 5, "micro_batch_size": 2}, {"tp": 4}, {"tp": 2, "micro_batch_size": 4}):
        job, _ = resolve(Request(**ask, **layout))
        assert job.global_batch_size == 520 == default_global_batch(8192, 20), layout
    job, _ = resolve(Request(**ask, tp=4, micro_batch_size=3))  # 3 x 5 does not divide 520: a multiple of both
    assert job.global_batch_size == 540 and any("micro-batch 3 x 5 data-parallel ranks" in n for n in job.notes)


@pytest.mark.parametrize(("gpus", "per_node"), [(20, 4), (12, 4), (18, 2), (9, 3), (15, 5), (24, 8), (6, 8), (3, 8)])
def test_a_count_filling_no_whole_node_runs_with_a_share_that_divides_the_node(gpus, per_node):
    """Launchers start the same number of processes on every node: a count over one 8-GPU node that is no multiple
    of it runs as the largest count dividing both it and the node (20: 5 x 4, so TP4 stays inside a node, where 4 x 5
    would split it), else as its largest divisor not above 8 (9: 3 x 3), said in the notes; whole nodes and one node
    keep 8."""
    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=gpus, gpu="h100"))
    assert job.gpus_per_node == per_node
    said = [n for n in job.notes if n.startswith("gpus_per_node not given")]
    assert bool(said) == (per_node != 8)
    if said:
        assert f"{gpus // per_node} nodes x {per_node}" in said[0] and f"{8 - per_node} GPU" in said[0]
    given = Request(model="llama-3.1-8b", num_gpus=gpus, gpu="h100", gpus_per_node=2)
    if gpus % 2:  # nodes of 2 the count leaves part-filled: no launcher starts it (render refuses it too)
        with pytest.raises(MeshplanError, match="do not fill whole 2-GPU nodes"):
            resolve(given)
        return
    job, _ = resolve(given)
    assert job.gpus_per_node == 2  # the request's own, as given


def test_a_prime_count_over_one_node_is_refused_with_counts_that_launch():
    with pytest.raises(MeshplanError) as err:
        resolve(Request(model="llama-3.1-8b", num_gpus=13, gpu="h100"))
    assert "13 GPUs cannot be launched on 8-GPU" in str(err.value)
    assert "12 (3 nodes x 4) or 14 (7 nodes x 2) or 16 (2 whole nodes)" in err.value.fix
    assert "gpus_per_node=1" in err.value.fix


@pytest.mark.parametrize(("typed", "meant"), [
    ("tensor_model_parallel_size", "tp"),
    ("pipeline_model_parallel_layout", "pipeline_layout"),
    ("account_for_embedding_in_pipeline_split", "account_for_embedding"),
    ("recompute_num_layers", "recompute_layers"),
])
def test_a_frameworks_own_key_names_the_field(typed, meant):
    """The aliases come from every adapter knob that is a request field, so a knob added later is covered too."""
    with pytest.raises(MeshplanError, match=f"Did you mean '{meant}'"):
        parse_request({"model": "llama-3.1-8b", typed: 2})
    assert all(alias.isidentifier() for alias in field_aliases())  # no prose key such as '(implicit: ...)'


def test_the_resolved_job_carries_its_framework_cards_and_a_hand_built_or_re_framed_one_is_refused():
    """Resolve once: the resolver attaches the job's framework card and its RL section (request/resolve.carry_cards),
    which estimators read as job.card / job.rl_card; a job that did not come through the resolver, or a copy whose
    framework changed, is refused with what to do, never given a wrong card; the cards are no field (nothing dumped)."""
    from meshplan.knowledge.cards import framework_card, rl_card
    from meshplan.request.resolve import carry_cards
    from meshplan.schema.plan import Job

    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=8, framework="verl"))
    assert job.card is framework_card("verl") and job.rl_card is rl_card("verl")
    assert job.model_copy(update={"num_gpus": 16}).card is job.card  # a copy keeps them
    assert resolve(Request(model="llama-3.1-8b", num_gpus=8))[0].rl_card is None  # megatron-core runs no RL job
    with pytest.raises(MeshplanError, match=r"carries 'verl''s \(a copy changed its framework\).*carry_cards"):
        _ = job.model_copy(update={"framework": "torchtitan"}).card
    hand = Job(**job.model_dump())
    assert hand.model_dump() == job.model_dump() and "_cards" not in job.model_dump_json()
    with pytest.raises(MeshplanError, match=r"built by hand, not by the resolver.*resolve\(Request"):
        _ = hand.rl_card
    assert carry_cards(hand).card is job.card and hand == job
    with pytest.raises(MeshplanError, match=r"The card of 'torchtitan' cannot go with a job of framework 'verl'"):
        hand.attach_cards(framework_card("torchtitan"))


def test_render_refuses_a_part_filled_node_of_a_job_built_outside_resolve_in_the_resolvers_words():
    """One refusal of a count that leaves a node part-filled (arithmetic/mesh.whole_nodes). Before: render's
    adapters/common.nodes said it in words of its own ('...; launchers start the same number...', a fix without the
    counts that launch), the resolver in others."""
    from meshplan.adapters.common import Nodes, nodes

    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=12, gpus_per_node=4))
    assert nodes(job) == Nodes(3, 4)
    with pytest.raises(MeshplanError) as asked:
        resolve(Request(model="llama-3.1-8b", num_gpus=13, gpus_per_node=4))
    with pytest.raises(MeshplanError) as built:
        nodes(job.model_copy(update={"num_gpus": 13}))
    assert (built.value.reason, built.value.fix) == (asked.value.reason, asked.value.fix)
    assert "12 or 16" in built.value.fix


def test_a_given_gpus_per_node_that_leaves_a_node_part_filled_is_refused_on_every_face():
    """Before: recommend ranked 13 GPUs on nodes of 4 and said they ran 'as 3 nodes x 4' (12 GPUs), memory and
    throughput estimated them, while render refused the same request (adapters/common.nodes). Now the resolver refuses
    it for every face; an RL job names the trainer's share it checks."""
    from meshplan import api
    from meshplan.faces import cli

    for ask in (api.estimate_memory, api.recommend):
        with pytest.raises(MeshplanError, match=r"13 GPUs do not fill whole 4-GPU nodes \(gpus_per_node=4\)") as err:
            ask(Request(model="llama-3.1-8b", num_gpus=13, gpus_per_node=4))
        assert "12 or 16" in err.value.fix
    with pytest.raises(MeshplanError, match=r"12 GPUs \(the trainer's share of num_gpus=16\) do not fill whole 8-GPU"):
        resolve(Request(model="qwen3-8b", framework="verl", job="rl", num_gpus=16, placement="separate", rollout_gpus=4,
                        gpus_per_node=8))
    assert cli.main(["recommend", "llama-3.1-8b", "--num-gpus", "13", "--gpus-per-node", "4"]) == cli.EXIT_USAGE
    _, plan = resolve(Request(model="llama-3.1-8b", num_gpus=12, gpus_per_node=4))  # whole nodes
    assert plan.dp == 12
    _, plan = resolve(Request(model="llama-3.1-8b", num_gpus=3, gpus_per_node=4))  # one node, part of it
    assert plan.dp == 3


def test_recompute_layers_or_method_alone_take_full_recompute():
    """Before: recompute_layers=4 alone was refused with 'RC001: recompute_layers=4 with recompute=none', a recompute
    the user never chose (recompute_modules alone already take selective, their mode)."""
    from meshplan import api

    for given in ({"recompute_layers": 4}, {"recompute_method": "uniform"}, {"recompute_layers": 2,
                                                                            "recompute_method": "block"}):
        req = Request(model="llama-3.1-8b", num_gpus=8, pp=2, **given)
        job, plan = resolve(req)
        assert plan.recompute == "full"
        assert any(n.startswith("recompute not given: full") for n in job.notes)
        assert not [f for f in api.check_config(req).findings if f.id == "RC001"]
    _, plan = resolve(Request(model="llama-3.1-8b", num_gpus=8, recompute="none"))  # a mode given is kept
    assert plan.recompute == "none"
    with pytest.raises(MeshplanError, match="RC001: recompute_layers=4 with recompute=selective"):
        api.estimate_memory(Request(model="llama-3.1-8b", num_gpus=8, recompute="selective", recompute_layers=4))
