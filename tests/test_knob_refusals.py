"""Settings a framework cannot run are refused, not estimated (issue 23's "seen, not fixed" list): recompute_layers
(RC005) and recompute_method (RC003) where the framework's card has no key for them, with the card's `instead` as the
fix; recommend refuses such a request up front with the same rule and fix, on the api and the CLI (exit 2, no
traceback; MCP through tests/test_faces_agree.py's CASES). Before: `check` said ok and recommend ranked plans pricing
N layers recomputed where the framework recomputes every one."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stderr, redirect_stdout

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.knowledge.adapter_knobs import default_render, knob_table, missing_knob
from meshplan.knowledge.cards import framework_card, framework_names
from meshplan.request.resolve import resolve
from meshplan.rules import frameworks
from meshplan.rules.engine import Context
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search.job import search_job

L8 = dict(model="llama-3.1-8b", num_gpus=8)


def card_instead(framework: str, zero_stage: int, name: str) -> str | None:
    """The card's own words for a knob the framework lacks (the render target's table; a card without an adapter:
    cannot_run), None where it has a key."""
    job, _ = search_job(Request(**L8, framework=framework, zero_stage=zero_stage))
    target = default_render(job.card, job, Plan(zero_stage=zero_stage))
    if target is None:
        return framework_card(framework).cannot_run.get(name)
    knob = knob_table(job.card, *target)[name]
    return knob.instead if knob.key is None else None


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


# (framework, ZeRO stage): every card whose default render target (or card, without an adapter) has no key for
# recompute_layers, and every one that has it.
LACKS_LAYERS = [("torchtitan", 3), ("deepspeed", 1), ("kempnerforge", 3), ("nemo-automodel", 3), ("nanotron", 1),
                ("verl", 3), ("skyrl", 3)]
HAS_LAYERS = [("megatron-core", 1), ("megatron-bridge", 1), ("verl", 1), ("skyrl", 1)]


def test_the_lists_cover_every_framework_card():
    assert {f for f, _ in LACKS_LAYERS} | {f for f, _ in HAS_LAYERS} == set(framework_names())
    assert all(card_instead(f, z, "recompute_layers") for f, z in LACKS_LAYERS)
    assert not any(card_instead(f, z, "recompute_layers") for f, z in HAS_LAYERS)


@pytest.mark.parametrize("framework,zero", LACKS_LAYERS)
def test_check_refuses_recompute_layers_with_the_cards_instead(framework, zero):
    req = Request(**L8, framework=framework, zero_stage=zero, recompute="full", recompute_layers=2)
    found = [f for f in api.check_config(req).findings if f.id == "RC005"]
    assert len(found) == 1 and found[0].severity == "error"
    assert found[0].fix == card_instead(framework, zero, "recompute_layers")
    assert "recompute_layers=2" in found[0].message


@pytest.mark.parametrize("framework,zero", HAS_LAYERS)
def test_a_framework_with_the_key_still_passes(framework, zero):
    req = Request(**L8, framework=framework, zero_stage=zero, recompute="full", recompute_layers=2)
    findings = api.check_config(req).findings
    assert not [f for f in findings if f.severity == "error" and not f.id.startswith("MEM")]  # memory is not the point


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed", "kempnerforge", "nemo-automodel", "nanotron"])
def test_recompute_method_is_refused_with_the_cards_instead(framework):
    """RC003 refused it before too, with a generic fix; the fix is now the card's."""
    req = Request(**L8, framework=framework, recompute="full", recompute_layers=2, recompute_method="uniform")
    found = [f for f in api.check_config(req).findings if f.id == "RC003"]
    assert len(found) == 1 and found[0].fix == card_instead(framework, 1, "recompute_method")


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
@pytest.mark.parametrize("name,fields", [("recompute_method", dict(recompute="full", recompute_method="uniform")),
                                         ("recompute_modules", dict(recompute="selective", recompute_modules=["mlp"]))])
def test_the_fsdp_backends_refuse_recompute_method_and_modules(framework, name, fields):
    """RC003 and RC004 read the table of the config `render` writes for the plan (zero_stage 3: the FSDP backend,
    which checkpoints whole layers), not the default version's Megatron table only: before, recompute_method=uniform
    passed at ZeRO 3 and render dropped it. The Megatron backend (zero_stage 1) still takes both."""
    rule = {"recompute_method": "RC003", "recompute_modules": "RC004"}[name]
    fsdp = [f for f in api.check_config(Request(**L8, framework=framework, zero_stage=3, **fields)).findings
            if f.id == rule]
    variant = "sft-fsdp"  # a training job renders SkyRL's main_sft (f1b7686) and verl's sft_trainer
    assert len(fsdp) == 1 and fsdp[0].severity == "error" and f"({variant})" in fsdp[0].message
    assert fsdp[0].fix == card_instead(framework, 3, name) and "drop " + name in fsdp[0].fix
    megatron = api.check_config(Request(**L8, framework=framework, zero_stage=1, **fields)).findings
    assert card_instead(framework, 1, name) is None and not [f for f in megatron if f.id == rule]


def test_recommend_with_recompute_method_on_verl_ranks_only_the_megatron_backend():
    """Before, the FSDP backend's plans ranked with a recompute_method its config has no key for."""
    rec = api.recommend(Request(**L8, framework="verl", recompute="full", recompute_method="uniform"), top_k=5)
    assert rec.candidates and all(c.plan.zero_stage != 3 for c in rec.candidates)
    assert rec.rejected.get("RC003", 0) > 0


@pytest.mark.parametrize("framework,zero", [("torchtitan", None), ("nanotron", None), ("verl", 3)])
def test_recommend_refuses_recompute_layers_up_front(framework, zero):
    fields = dict(L8, framework=framework, recompute="full", recompute_layers=2)
    if zero is not None:
        fields["zero_stage"] = zero
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**fields))
    assert exc.value.reason.startswith("RC005:") and "every one of the" in exc.value.reason
    assert exc.value.fix == card_instead(framework, zero or 3, "recompute_layers")
    argv = ["recommend", "llama-3.1-8b", "--num-gpus", "8", "--framework", framework, "--recompute", "full",
            "--recompute-layers", "2", *(["--zero-stage", str(zero)] if zero is not None else [])]
    code, out, err = run_cli(argv)
    assert code == cli.EXIT_USAGE and "RC005" in err and exc.value.fix in err and "Traceback" not in err + out


def test_recommend_with_recompute_layers_open_to_the_search_is_refused_too():
    """recompute left open: RC005 reads no recompute mode, so every plan of the space breaks it."""
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**L8, framework="torchtitan", recompute_layers=2))
    assert exc.value.reason.startswith("RC005:")


def test_recommend_still_ranks_recompute_layers_where_the_framework_has_the_key():
    rec = api.recommend(Request(**L8, recompute="full", recompute_layers=2), top_k=1)
    assert rec.candidates and rec.candidates[0].plan.recompute_layers == 2


# nanotron (the Ultra-Scale Playbook sweep's convention) opens no cp, ep or etp in its search; its card's cannot_run
# says why (huggingface/nanotron: Llama has no context parallelism, the MoE layer no all-to-all over the EP group).
# Before: check accepted cp=2 / ep=2 / etp=2 and recommend ranked TP2 CP2 DP2 for a fixed cp=2.
MIX = dict(model="mixtral-8x7b", num_gpus=64, framework="nanotron")
NT_DEGREES = [("cp", dict(L8, framework="nanotron", cp=2)), ("ep", dict(MIX, ep=2)), ("etp", dict(MIX, ep=2, etp=2))]


def test_every_card_without_an_adapter_says_why_each_closed_degree_cannot_run():
    for name in framework_names():
        card = framework_card(name)
        if card.adapter is None:
            closed = {k for k in ("cp", "ep", "etp") if not getattr(card.search, k)}
            assert closed <= set(card.cannot_run), (name, closed - set(card.cannot_run))


@pytest.mark.parametrize("name,fields", NT_DEGREES)
def test_check_refuses_a_degree_nanotron_does_not_run(name, fields):
    found = [f for f in api.check_config(Request(**fields)).findings if f.id == "NT001"]
    first = "ep" if name == "etp" else name  # ep and etp both over 1: the first in (cp, ep, etp) is named
    assert len(found) == 1 and found[0].severity == "error"
    assert found[0].fix == framework_card("nanotron").cannot_run[first]
    assert found[0].message.startswith(f"{first}={fields[first]}:")


def test_nanotron_without_those_degrees_still_passes():
    findings = api.check_config(Request(**L8, framework="nanotron", tp=2)).findings
    assert not [f for f in findings if f.severity == "error" and not f.id.startswith("MEM")]


@pytest.mark.parametrize("name,fields", NT_DEGREES)
def test_recommend_refuses_a_fixed_degree_on_nanotron_up_front(name, fields):
    """The ep/etp requests: the layouts a cheap law drops (tp over the heads, pp over the layers) keep the fixed
    expert degrees (refusal.fixed_experts), so NT001 is proven on every plan; before, recommend searched them."""
    first = "ep" if name == "etp" else name
    with pytest.raises(MeshplanError) as exc:
        api.recommend(Request(**fields))
    assert exc.value.reason.startswith(f"NT001: {first}=") and "every one of the" in exc.value.reason
    assert exc.value.fix == framework_card("nanotron").cannot_run[first]
    argv = [fields["model"], *[a for k, v in fields.items() if k != "model" for a in ("--" + k.replace("_", "-"),
                                                                                    str(v))]]
    code, out, err = run_cli(["recommend", *argv])
    assert code == cli.EXIT_USAGE and "NT001" in err and exc.value.fix in err and "Traceback" not in err + out


def test_a_dropped_groups_example_carries_the_fixed_expert_degrees():
    from meshplan.search.refusal import Space, fixed_experts
    from meshplan.search.space import Fixed
    req = Request(**MIX, ep=2, etp=2)
    job, _ = search_job(req)
    space = Space.of(job, Fixed.from_request(req, job))
    assert space.dropped and all(g.example.ep == 1 for g in space.dropped)  # the law drops before experts
    assert all((fixed_experts(space, g.example).ep, fixed_experts(space, g.example).etp) == (2, 2)
               for g in space.dropped)


KF_TOML = """[model]
n_layers = 32
dim = 4096
ffn_hidden_dim = 14336
n_heads = 32
n_kv_heads = 8
vocab_size = 128256

[train]
seq_len = 8192

[distributed]
dp_shard = 4
tp = 2
cp = 2
"""


def test_kempnerforge_runs_no_context_parallelism():
    """KempnerForge declares distributed.cp for its world-size product but wires no context parallelism (the card's
    search.cp and adapter cp, with the source): recommend never ranks cp > 1 on it, even at 32K tokens where
    torchtitan's first pick takes CP (32K: at 128K its logits, whole on every TP rank and never chunked, fit no
    layout); check refuses cp=2 with the card's words; and a file that sets distributed.cp is read as cp=2 and
    refused, not read as cp=1 (which left its world-size product short)."""
    long = dict(model="llama-3.1-8b", gpu="h100", num_gpus=64, seq_length=32768, global_batch_size=64)
    ranked = api.recommend(Request(**long, framework="kempnerforge")).candidates
    assert ranked and all(c.plan.cp == 1 for c in ranked)
    assert api.recommend(Request(**long, framework="torchtitan")).candidates[0].plan.cp > 1
    instead = card_instead("kempnerforge", 3, "cp")
    assert instead and "not wired" in instead
    report = api.check_config(Request(**L8, framework="kempnerforge", cp=2))
    assert not report.ok and any(f.id == "AD001" and f.fix == instead for f in report.findings)
    imported = api.import_config(KF_TOML, framework="kempnerforge")
    req = api.request_from_config(imported, {"gpu": "h100", "num_gpus": 16})
    assert req.cp == 2
    assert {f.id for f in api.check_config(req, config=imported).findings if f.severity == "error"} == {"AD001"}


SKYRL_SH = """python -m skyrl.train.entrypoints.main_base \\
  trainer.strategy=megatron \\
  trainer.policy.model.path=meta-llama/Llama-3.1-70B \\
  trainer.placement.policy_num_nodes=8 \\
  trainer.placement.policy_num_gpus_per_node=8 \\
  trainer.train_batch_size=64 \\
  trainer.policy.megatron_config.tensor_model_parallel_size=4 \\
  trainer.policy.megatron_config.pipeline_model_parallel_size=4 \\
  trainer.policy.megatron_config.transformer_config_kwargs.virtual_pipeline_model_parallel_size=5
"""


def test_skyrl_runs_no_virtual_pipeline_stages():
    """SkyRL initializes Megatron-Core without virtual_pipeline_model_parallel_size (its MegatronStrategy's
    setup_distributed), so its workers run the non-interleaved 1F1B, which asserts one model chunk (the card's
    search.vpp and adapter vpp, with the source): recommend never ranks vpp > 1 on it (it ranked TP2 PP8 VPP10 CP2
    first for Llama-3.1-70B on 64 H100), check refuses vpp=5 with the card's words, and a file that sets
    transformer_config_kwargs.virtual_pipeline_model_parallel_size is read as vpp=5 and refused, not as vpp=1."""
    l70 = dict(model="llama-3.1-70b", gpu="h100", num_gpus=64, global_batch_size=512)
    ranked = api.recommend(Request(**l70, framework="skyrl")).candidates
    assert ranked and all(c.plan.vpp == 1 for c in ranked) and any(c.plan.pp > 1 for c in ranked)
    assert any(c.plan.vpp > 1 for c in api.recommend(Request(**l70, framework="verl")).candidates)
    instead = card_instead("skyrl", 1, "vpp")
    assert instead and "virtual_pipeline_model_parallel_size" in instead
    report = api.check_config(Request(**l70, framework="skyrl", tp=4, pp=4, vpp=5))
    assert not report.ok and any(f.id == "AD001" and f.fix == instead for f in report.findings)
    imported = api.import_config(SKYRL_SH, framework="skyrl")
    req = api.request_from_config(imported, {"gpu": "h100"})
    assert (req.pp, req.vpp) == (4, 5)
    assert {f.id for f in api.check_config(req, config=imported).findings if f.severity == "error"} == {"AD001"}


# A plan that uses one knob a card's `search:` section opens (and the degrees it needs), per knob.
SEARCHED_KNOB_PROBES = {
    "vpp": (dict(model="llama-3.1-8b", num_gpus=16, global_batch_size=64), dict(pp=2, vpp=2)),
    "cp": (dict(model="llama-3.1-8b", num_gpus=16, global_batch_size=64, seq_length=8192), dict(cp=2)),
    "ep": (dict(model="qwen3-30b-a3b", num_gpus=16, global_batch_size=64), dict(ep=2)),
    "etp": (dict(model="qwen3-30b-a3b", num_gpus=16, global_batch_size=64),
            dict(tp=2, ep=2, etp=2, sequence_parallel=True)),
}


@pytest.mark.parametrize("framework", sorted(f for f in framework_names() if framework_card(f).adapter is not None))
def test_every_knob_the_search_opens_is_one_the_adapter_writes(framework):
    """The search enumerates a knob (vpp, cp, ep, etp, each recompute) only where the framework's adapter can write it:
    at every ZeRO stage the search takes, a plan using it breaks no rule but memory's, or a rule besides AD001 refuses
    it too (verl's and SkyRL's FSDP engines: FS001), and at one stage at least it is written. Before: DeepSpeed
    searched ep (its adapter refused it) and KempnerForge vpp (it builds one pipeline stage per rank)."""
    from meshplan.search import BestFirstSearch, default_engine
    from meshplan.search.space import Fixed

    search = framework_card(framework).search
    for knob in [k for k in SEARCHED_KNOB_PROBES if getattr(search, k)]:
        base, fields = SEARCHED_KNOB_PROBES[knob]
        req = Request(**base, gpu="h100", framework=framework)
        job, _ = search_job(req)
        zeros = BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(framework), 1).zeros
        written = []
        for zero in zeros:
            errors = {f.id for f in api.check_config(Request(**base, gpu="h100", framework=framework, zero_stage=zero,
                                                             **fields)).findings if f.severity == "error"}
            assert errors - {"MEM001", "MEM002"} != {"AD001"}, (framework, knob, zero)
            written += [zero] if "AD001" not in errors else []
        assert written, (framework, knob, zeros)
    for recompute in search.recompute:
        plan = Plan(zero_stage=framework_card(framework).defaults.zero_stage, recompute=recompute)
        job, _ = search_job(Request(**L8, framework=framework))
        target = default_render(job.card, job, plan)
        assert missing_knob(job.card, *target, job, plan) is None, (framework, recompute)


@pytest.mark.parametrize("framework,recompute,variant", [
    ("skyrl", "none", "sft-fsdp"), ("skyrl", "selective", "sft-fsdp"), ("verl", "selective", "sft-fsdp")])
def test_a_recompute_mode_the_zero3_config_cannot_set_is_refused_on_every_face(framework, recompute, variant):
    """SkyRL's main_sft (a training job's config at ZeRO-3, the FSDP strategy) always checkpoints every layer
    (SFTConfig has no gradient_checkpointing), and verl's and SkyRL's FSDP backends have no selective: before, check
    said ok, recommend ranked recompute=none first and render only warned (or refused selective). Now RC006 refuses
    them with the card's instead, recommend ranks none of them, and render refuses with the same rule."""
    req = Request(**L8, gpu="h100", framework=framework, zero_stage=3, recompute=recompute)
    found = [f for f in api.check_config(req).findings if f.id == "RC006"]
    assert len(found) == 1 and found[0].severity == "error" and f"({variant})" in found[0].message
    assert found[0].fix == card_instead(framework, 3, f"recompute_{recompute}")
    with pytest.raises(MeshplanError, match="RC006"):
        api.estimate_memory(req)
    with pytest.raises(MeshplanError, match="RC006"):
        api.render_config(framework, req)
    rec = api.recommend(req.model_copy(update={"recompute": None}), top_k=5)
    assert rec.candidates and all(c.plan.recompute != recompute for c in rec.candidates)
    assert rec.rejected.get("RC006", 0) > 0 or recompute == "selective"


def test_an_rl_job_or_the_megatron_strategy_sets_recompute_none():
    """SkyRL's RL trainer (trainer.gradient_checkpointing false) and main_sft's megatron strategy (recompute_granularity
    null) can turn checkpointing off: RC006 passes there."""
    for fields in (dict(zero_stage=3, job="rl"), dict(zero_stage=1, tp=2)):
        req = Request(**L8, gpu="h100", framework="skyrl", recompute="none", **fields)
        assert "RC006" not in {f.id for f in api.check_config(req).findings}


def test_an_estimate_that_leaves_recompute_out_takes_what_the_config_runs():
    """Left out, recompute is none for an estimate; where the config `render` writes cannot turn checkpointing off
    (SkyRL's main_sft at ZeRO-3) that refused the request with RC006 though the user asked no recompute: it is full
    there, with a note; an RL job (trainer.gradient_checkpointing false) keeps none."""
    sft = Request(**L8, gpu="h100", framework="skyrl", zero_stage=3)
    report = api.estimate_memory(sft)
    assert report.plan.recompute == "full"
    assert any(n.startswith("recompute not given: full") and "main_sft" in n for n in report.assumptions)
    assert api.estimate_memory(sft.model_copy(update={"job": "rl"})).plan.recompute == "none"
    megatron = Request(**L8, gpu="h100", framework="skyrl", zero_stage=1, tp=2)
    assert api.estimate_memory(megatron).plan.recompute == "none"


def test_the_note_quotes_the_cards_reason_and_the_card_requires_one():
    """request.resolve's note takes what the run does from the knob's own `reason` (cards/frameworks/skyrl.yaml),
    not from the first ';'-clause of its `instead`; a recompute_none with key null and no reason fails when the card
    loads, as a reason beside a key or ending in a period does."""
    from pydantic import ValidationError

    from meshplan.knowledge.adapter_card import AdapterKnob, AdapterSection
    from meshplan.knowledge.adapter_knobs import knob_table
    from meshplan.knowledge.cards import framework_card

    skyrl = framework_card("skyrl")
    knob = knob_table(skyrl, skyrl.adapter.default_version, "sft-fsdp")["recompute_none"]
    assert knob.key is None and knob.reason and knob.reason in knob.instead
    original = knob.reason
    try:
        knob.reason = "main_sft checkpoints every layer"
        job = api.estimate_memory(Request(**L8, gpu="h100", framework="skyrl", zero_stage=3))
        assert "recompute not given: full, what the run does: main_sft checkpoints every layer." in job.assumptions
    finally:
        knob.reason = original
    section = framework_card("skyrl").adapter.model_dump()
    del section["variant_knobs"]["sft-fsdp"]["recompute_none"]["reason"]
    with pytest.raises(ValidationError, match="needs 'reason'"):
        AdapterSection.model_validate(section)
    for bad in (dict(key="x", reason="r"), dict(key=None, instead="i", reason="ends.")):
        with pytest.raises(ValidationError, match="'reason' belongs"):
            AdapterKnob.model_validate(bad)


def named_stages(text: str) -> set[int]:
    """The ZeRO stages a fix tells the user to take ('zero_stage 0 or 1', 'zero_stage 1, or 3', 'zero_stage 0-2')."""
    import re

    out: set[int] = set()
    for found in re.finditer(r"zero_stage[ =](\d(?:\s*(?:, or|,|or|-)\s*\d)*)", text):
        words = found.group(1)
        for a, b in re.findall(r"(\d)\s*-\s*(\d)", words):
            out.update(range(int(a), int(b) + 1))
        out.update(int(d) for d in re.findall(r"\d", words))
    return out


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
@pytest.mark.parametrize("degree", ["tp", "pp", "ep"])
def test_the_fsdp_engines_fixes_name_megatron_stages_that_pass(framework, degree):
    """verl and SkyRL run their FSDP engine at zero_stage 3, without TP, PP or EP: FS001 and AD001 name the stages
    of their Megatron engine instead. Before: FS001 said 'zero_stage 0-2' and the cards' AD001 text 'zero_stage 1, or
    3 for Megatron-FSDP' (verl) and 'zero_stage 0-2' (SkyRL), where AD001 refuses verl's ZeRO-2 and SkyRL's ZeRO-0
    and ZeRO-2 and zero_stage 3 is the FSDP engine again: each stage a fix names now passes both rules."""
    model = "qwen3-30b-a3b" if degree == "ep" else "qwen3-8b"
    ask = dict(model=model, framework=framework, num_gpus=16, **{degree: 2})
    findings = api.check_config(Request(**ask, zero_stage=3)).findings
    fixes = [f.fix for f in findings if f.id in ("FS001", "AD001")]
    assert any(f.id == "FS001" for f in findings) and fixes
    stages = set().union(*(named_stages(fix) for fix in fixes))
    assert stages
    for zero in stages:
        left = {f.id for f in api.check_config(Request(**ask, zero_stage=zero)).findings if f.severity == "error"}
        assert not left & {"FS001", "AD001"}, (zero, left)


@pytest.mark.parametrize("framework,zero", [("skyrl", 0), ("skyrl", 2), ("verl", 2)])
def test_a_zero_stage_fix_names_only_stages_that_write_the_plans_degrees(framework, zero):
    """AD001's fix for a ZeRO stage the config lacks names only stages whose config writes the plan's tp (verl's and
    SkyRL's FSDP engines at zero_stage 3 have no TP), and following it clears AD001 and FS001. Before: SkyRL's said
    'use zero_stage=1 (or 3 for FSDP)' to a tp=2 plan, and zero_stage 3 then hit AD001 and FS001."""
    base = dict(model="qwen3-8b", num_gpus=16, gpu="h100", framework=framework, tp=2)
    report = api.check_config(Request(**base, zero_stage=zero))
    fix = next(f.fix for f in report.findings if f.id == "AD001")
    named = {int(z) for z in re.findall(r"\d", re.search(r"zero_stage=([\d, or]+)", fix).group(1))}
    assert "3 for FSDP" not in fix and named, fix
    for z in named:
        errors = {f.id for f in api.check_config(Request(**base, zero_stage=z)).findings if f.severity == "error"}
        assert not errors & {"AD001", "FS001"}, (z, errors)
    plain = api.check_config(Request(**{**base, "tp": 1}, zero_stage=zero))
    assert next(f.fix for f in plain.findings if f.id == "AD001") == card_instead(framework, zero, f"zero_{zero}")


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_the_uniform_method_refuses_zero_layers_per_chunk(framework):
    """Megatron-Core's uniform method steps through a stage recompute_num_layers layers at a time
    (transformer_block.py _checkpointed_forward: `layer_idx += self.config.recompute_num_layers`), so 0 never advances:
    the run hangs. Before, check said ok and the estimate priced a full recompute; block with 0 (no layer recomputed)
    stays allowed."""
    req = Request(**L8, framework=framework, recompute="full", recompute_layers=0, recompute_method="uniform")
    found = [f for f in api.check_config(req).findings if f.id == "RC003"]
    assert len(found) == 1 and found[0].severity == "error", found
    assert "never advances" in found[0].message and "recompute_layers=1" in found[0].fix
    block = req.model_copy(update={"recompute_method": "block"})
    assert not [f for f in api.check_config(block).findings if f.id == "RC003"]


def test_ad001s_zero_stage_fix_is_worked_out_once_per_the_fields_it_reads(monkeypatch):
    """min-gpus of Qwen3-30B-A3B on verl at zero_stage=2 (which verl's Megatron engine cannot write) asked AD001 on
    170,288 plans and worked out its ZeRO-stage fix (every stage tried twice) on each: 35 CPU-s for a refusal. The fix
    depends on the job and AD001's reads alone, so plans that differ elsewhere (micro-batch, recompute) share it, and
    the words stay those of the first."""
    calls = []
    worked_out = frameworks._zero_stage_instead
    monkeypatch.setattr(frameworks, "_ZERO_INSTEAD", frameworks.IdentityMemo())
    monkeypatch.setattr(frameworks, "_zero_stage_instead", lambda ctx, words: calls.append(1) or worked_out(ctx, words))
    job, plan = resolve(Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=8, framework="verl", zero_stage=2,
                                ep=8))
    found = [frameworks.adapter_cannot_write(Context(job, plan.copied({"micro_batch_size": mbs, "recompute": rc})))
             for mbs in (1, 2, 4) for rc in ("none", "full")]
    assert all(f is not None and f["knob"].startswith("zero_") for f in found)
    assert len(calls) == 1 and len({f["instead"] for f in found}) == 1
