"""Megatron-Core's pipeline_model_parallel_layout and the embedding/loss-accounted split
(meshplan/arithmetic/schedule.py):
the parse is Megatron's parse_str_to_list, a bad string is an error naming its position and the grammar, rule PP009
refuses what Megatron-Core refuses with a working layout, and the published Megatron-Bridge recipes pass."""

from __future__ import annotations

import json
import re

import pytest

from meshplan.arithmetic.schedule import accounted_counts, compose_layout, layout_problem, parse_layout, plan_stages
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

DSV3_PP16 = "Et*4|(t*4|)*14t,mL"  # Bridge recipes/deepseek/h100/deepseek_v3.py layout_map[(16, 1)], as a string
KIMI_PP16 = "Et*4|(t*4|)*14tL"  # Bridge recipes/kimi/h100/kimi_k2.py map_pp_vp_to_layout[(16, 1)]
DSV3 = dict(model="deepseek-v3", num_gpus=1024, tp=2, ep=64, etp=1, global_batch_size=8192, recompute="full",
            framework="megatron-bridge")
KIMI = dict(model="kimi-k2", num_gpus=1024, tp=2, pp=16, ep=32, etp=1, global_batch_size=4096, recompute="full",
            framework="megatron-bridge")


def test_parse_is_megatrons_unrolling():
    assert parse_layout(DSV3_PP16) == ("Etttt",) + ("tttt",) * 14 + ("tmL",)
    assert parse_layout(KIMI_PP16) == ("Etttt",) + ("tttt",) * 14 + ("tL",)
    # the Megatron doc's PP16 x VPP2 example: group first, then single characters, commas dropped, empty stage none
    doc = parse_layout("Et*3|(tt|)*29,m|L")
    assert doc == ("Ettt",) + ("tt",) * 29 + ("m", "L") and len(doc) == 32
    assert parse_layout("Et|(tt|)*30mL") == ("Et",) + ("tt",) * 30 + ("mL",)
    assert parse_layout("E|t*2||L") == ("E", "tt", "", "L")  # an empty stage is a stage


@pytest.mark.parametrize("text,position,what", [
    ("Et*3|(tt|)*29,x|L", 15, "'x', which is not a layer character"),
    ("Et*|L", 3, "'*' not followed by a count"),
    ("Et3|L", 3, "a count without '*'"),
    ("E(t(t)*2)*2|L", 4, "'(' inside a group (groups do not nest)"),
    ("Et*3|(tt|L", 6, "a '(' never closed"),
    ("Et)*2|L", 3, "')' without an opening '('"),
    ("E(tt|)|L", 6, "a group ')' not followed by '*n'"),
    ("*3Et|L", 1, "'*' that repeats nothing"),
])
def test_a_malformed_layout_names_the_position_and_the_grammar(text, position, what):
    with pytest.raises(MeshplanError) as err:
        parse_layout(text)
    assert err.value.reason == f"pipeline_layout {text!r}: {what} at position {position}."
    assert "E = embedding, t = decoder layer, m = MTP layer, L = loss" in err.value.fix


@pytest.mark.parametrize("text,position,char", [
    ("Et*\u00b2|t*8|t*8|t*8L", 4, "\u00b2"),  # a superscript: str.isdigit() takes it, int() does not
    ("Et*\u0668|t*8", 4, "\u0668"),  # an Arabic-Indic 8: int() reads it, Megatron's parser does not
    ("Et*8\u0668|L", 5, "\u0668"),
    ("E(tt|)*\u0663L", 8, "\u0663"),
    ("Et\u00b2|L", 3, "\u00b2"),
])
def test_a_count_is_ascii_digits_and_another_digit_is_named(text, position, char):
    with pytest.raises(MeshplanError) as err:
        parse_layout(text)
    assert err.value.reason == (f"pipeline_layout {text!r}: {char!r} (U+{ord(char):04X}), which is not an ASCII digit "
                                f"0-9 at position {position}.")


def test_an_enormous_unrolling_is_refused_before_it_is_built():
    with pytest.raises(MeshplanError, match="unrolls to 99,980,002 characters"):
        parse_layout("(t*9999)*9999E")


@pytest.mark.parametrize("layout,pp,vpp,problem", [
    (KIMI_PP16, 16, 1, ""),
    (KIMI_PP16, 8, 1, "its 16 stages are pp=8 x 2 virtual stages, not vpp=1"),
    (KIMI_PP16, 3, 1, "its 16 stages do not fill pp=3 ranks equally (a multiple of 3 is needed)"),
    ("tE" + KIMI_PP16[2:], 16, 1, "the first layer must be the embedding E"),
    ("Et*4|(t*4|)*14tLt", 16, 1, "the last layer must be the loss L"),
    ("Et*4|(t*4|)*14tLEL", 16, 1, "E and L must each appear once (E 2, L 2)"),
    ("Et*4|(t*4|)*14L", 16, 1, "it has 60 decoder layers t, the model 61"),
])
def test_layout_problems_in_megatrons_order(layout, pp, vpp, problem):
    assert layout_problem(parse_layout(layout), pp, vpp, 61, 0) == problem


def test_mtp_layers_where_megatron_allows_them():
    assert layout_problem(parse_layout(DSV3_PP16), 16, 1, 61, 1) == ""
    assert layout_problem(parse_layout(KIMI_PP16), 16, 1, 61, 1) == ""  # MTP not trained: none in the layout
    assert layout_problem(parse_layout("Et*4|(t*4|)*14tmmL"), 16, 1, 61, 1) == \
        "it has 2 MTP layers m, the model 1 (or none)"
    assert layout_problem(parse_layout("Et*4|(t*4|)*13t*4m|tL"), 16, 1, 61, 1) == \
        "decoder layers t must come before the MTP layers m"
    # PP8 x VPP2: MTP on rank 7's first virtual stage (flat stage 7), not its last; stages 8-14 empty
    assert layout_problem(parse_layout("Et*7|(t*8|)*6t*6m|(|)*7L"), 8, 2, 61, 1) == \
        "the MTP layers m must be in a rank's last virtual stage"


def test_accounted_split_is_megatrons_get_num_layers_to_build():
    # 30 layers + E + L = 32 over pp=4 -> 8 per rank, 4 per virtual stage, rank 0's first and rank 3's last one fewer
    assert accounted_counts(30, 4, 2, True, True) == ([3, 4, 4, 4, 4, 4, 4, 3], "")
    assert accounted_counts(31, 4, 1, False, True) == ([8, 8, 8, 7], "")
    assert accounted_counts(32, 4, 1, True, False)[1] == \
        "32 layers + 1 (embedding/loss counted) = 33 do not split evenly over pp=4"
    assert accounted_counts(30, 4, 3, True, True)[1] == \
        "8 layers per rank (embedding/loss counted) do not split into vpp=3 virtual stages"


def test_compose_layout_reproduces_the_bridge_perf_recipe():
    """DeepSeek-V3 on PP8 x VPP4 (61 layers + E + L = 63 over 32 stages): 2 per stage, the embedding's and the
    loss's stages one decoder layer lighter, MTP with the loss: exactly Bridge's H100 perf recipe string."""
    assert compose_layout(61, 8, 4, 1) == "Et|(tt|)*30mL"
    assert compose_layout(61, 16, 1, 1) == "Et*3|(t*4|)*14ttmL"
    assert compose_layout(3, 4, 1) == "E|tt|t|L"  # 5 units over 4 stages: the extra one to the first middle stage
    assert compose_layout(1, 4, 1) is None  # 3 units cannot fill 4 stages


@pytest.mark.parametrize("fields", [
    {**DSV3, "pp": 16, "pipeline_layout": DSV3_PP16},
    {**DSV3, "pp": 8, "pipeline_layout": "Et|(tt|)*30mL"},
    {**DSV3, "pp": 16, "vpp": 2, "pipeline_layout": "Et*3|(tt|)*29,m|L"},
    {**KIMI, "pipeline_layout": KIMI_PP16},
])
def test_published_bridge_layouts_pass_check(fields):
    """What Bridge runs is what check accepts: no PP error (PP001 would have refused 61 layers over pp=16)."""
    report = check_config(*resolve(Request(**fields)))
    assert not [f.id for f in report.findings if f.id.startswith("PP") and f.severity == "error"]


def test_pp009_fix_is_a_layout_that_passes():
    job, plan = resolve(Request(**{**KIMI, "pipeline_layout": "Et*4|(t*4|)*14L"}))
    found = [f for f in check_config(job, plan).findings if f.id == "PP009"]
    assert len(found) == 1 and "it has 60 decoder layers t, the model 61" in found[0].message
    working = re.search(r'pipeline_layout="([^"]+)"', found[0].fix)[1]
    assert working == "Et*3|(t*4|)*14ttL"
    fixed = plan.model_copy(update={"pipeline_layout": working})
    assert not [f for f in check_config(job, fixed).findings if f.id.startswith("PP") and f.severity == "error"]
    assert plan_stages(job, fixed).counts == (3,) + (4,) * 14 + (2,)


def test_pp009_fix_at_one_stage_is_the_one_stage_layout():
    """pp=1: the fix is the layout of its one stage (PipelineParallelLayerLayout takes it at pp 1), not 'pp*vpp <= 34
    stages', which pp*vpp = 1 already keeps; and it drops only the fields the plan gives (none here)."""
    job, plan = resolve(Request(model="llama-3.1-8b", pipeline_layout="Ett|xx"))
    (found,) = [f for f in check_config(job, plan).findings if f.id == "PP009"]
    assert found.fix == ('Use pipeline_layout="Et*32L" (pp=1, vpp=1; E embedding, t decoder layer, m MTP, L loss).')
    fixed = plan.model_copy(update={"pipeline_layout": "Et*32L"})
    assert not [f for f in check_config(job, fixed).findings if f.id.startswith("PP") and f.severity == "error"]
    assert compose_layout(61, 1, 1, 1) == "Et*61mL"


def test_pp009_reports_a_parse_error_with_its_position():
    job, plan = resolve(Request(**{**KIMI, "pipeline_layout": "Et*4|(t*4|)*14t,xL"}))
    (found,) = [f for f in check_config(job, plan).findings if f.id == "PP009"]
    assert "'x', which is not a layer character at position 17" in found.message
    assert "E = embedding, t = decoder layer" in found.message


def test_layout_sets_vpp_when_left_out_and_conflicts_are_refused():
    job, plan = resolve(Request(**{**DSV3, "pp": 8, "pipeline_layout": "Et|(tt|)*30mL"}))
    assert plan.vpp == 4 and "vpp not given: 4, the pipeline layout's 32 stages over pp=8." in job.notes
    for extra in ({"first_stage_layers": 4}, {"account_for_loss": True}):
        job, plan = resolve(Request(**{**KIMI, "pipeline_layout": KIMI_PP16, **extra}))
        (found,) = [f for f in check_config(job, plan).findings if f.id == "PP009"]
        assert "pipeline_layout cannot be combined with" in found.message


FOUR = "Et*8|t*8|t*8|t*8L"  # Llama-3.1-8B's 32 layers over four stages


@pytest.mark.parametrize("given,pp,vpp,note", [
    ({}, 4, 1, "pp not given: 4, the pipeline layout's 4 stages (one per rank; pass vpp to interleave them)."),
    ({"vpp": 2}, 2, 2, "pp not given: 2, the pipeline layout's 4 stages over vpp=2."),
    ({"pp": 2}, 2, 2, "vpp not given: 2, the pipeline layout's 4 stages over pp=2."),
    ({"pp": 4, "vpp": 1}, 4, 1, None),
])
def test_a_layout_implies_pp_and_vpp_left_out(given, pp, vpp, note):
    """The layout alone used to resolve to PP1 VPP4: a traceback in memory, a silent PP1 in throughput."""
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=8, pipeline_layout=FOUR, **given))
    assert (plan.pp, plan.vpp, plan.dp) == (pp, vpp, 8 // pp)
    assert note is None or note in job.notes
    assert plan_stages(job, plan).counts == ((8,) * 4 if pp == 4 else (16, 16))


@pytest.mark.parametrize("given,why", [
    ({"pp": 3}, "which pp=3 cannot hold: a layout lists pp x vpp stages"),
    ({"vpp": 3}, "which vpp=3 cannot hold"),
    ({"pp": 2, "vpp": 1}, "which pp=2, vpp=1 cannot hold"),
    ({"pp": 1}, "which pp=1 cannot hold: interleaving needs pp > 1 (rule PP003)"),
])
def test_a_layout_that_disagrees_with_pp_or_vpp_is_refused_naming_the_mismatch(given, why):
    with pytest.raises(MeshplanError) as err:
        resolve(Request(model="llama-3.1-8b", num_gpus=8, pipeline_layout=FOUR, **given))
    assert err.value.reason.startswith(f"pipeline_layout has 4 stages, {why}")
    assert "pp=2 vpp=2, pp=4" in err.value.fix


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_layout_without_pp_answers_alike_on_every_face(anyio_backend, capsys):
    from mcp import Client

    from meshplan import api
    from meshplan.faces.cli import main
    from meshplan.faces.mcp.server import app
    from meshplan.request.parse import parse_request

    fields = dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, pipeline_layout=FOUR)
    req = parse_request(fields)
    assert api.check_config(req).plan.pp == 4 and api.estimate_memory(req).plan.pp == 4
    assert api.estimate_throughput(req).plan.pp == 4
    assert api.render_config("megatron-core", req).plan.pp == 4
    assert main(["memory", "llama-3.1-8b", "--num-gpus", "8", "--pipeline-layout", FOUR, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["pp"] == 4
    assert main(["check", "llama-3.1-8b", "--num-gpus", "8", "--pp", "3", "--pipeline-layout", FOUR]) == 2
    assert "pipeline_layout has 4 stages, which pp=3 cannot hold" in capsys.readouterr().err
    async with Client(app) as client:
        good = await client.call_tool("estimate_memory", fields)
        bad = await client.call_tool("check_config", {**fields, "vpp": 3})
    assert not good.is_error and good.structured_content["plan"]["pp"] == 4
    assert bad.is_error and "pipeline_layout has 4 stages, which vpp=3 cannot hold" in bad.content[0].text


def test_accounting_passes_where_it_divides_and_fails_with_a_layout_fix():
    base = dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, framework="megatron-core")
    job, plan = resolve(Request(**base, pp=2, account_for_embedding=True, account_for_loss=True))  # 34 / 2
    assert not [f for f in check_config(job, plan).findings if f.severity == "error"]
    assert plan_stages(job, plan).counts == (16, 16)
    job, plan = resolve(Request(**base, pp=4, account_for_embedding=True))  # 33 over 4
    (found,) = [f for f in check_config(job, plan).findings if f.id == "PP009"]
    assert "33 do not split evenly over pp=4" in found.message
    assert 'pipeline_layout="Et*7|(t*9|)*2t*7L"' in found.fix


QWEN235 = dict(model="qwen3-235b-a22b", num_gpus=256, tp=4, pp=8, ep=4, etp=1, global_batch_size=256)
ACCOUNT = dict(account_for_embedding=True, account_for_loss=True)


def _pp_errors(fields: dict) -> list[str]:
    return [f.id for f in check_config(*resolve(Request(**fields))).findings
            if f.id.startswith("PP") and f.severity == "error"]


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge", "verl", "skyrl"])
def test_stage_sizes_with_accounting_are_the_conflict_megatron_reports_first(framework):
    """TransformerConfig.__post_init__ refuses first/last stage sizes given with account_for_embedding/loss before it
    looks at the sizes: one PP009 naming the conflict, no PP004 about a split Megatron never checks. verl and SkyRL
    hand their overrides to the same TransformerConfig, so PP009 checks them too."""
    fields = {**QWEN235, "framework": framework, **ACCOUNT}
    job, plan = resolve(Request(**fields, last_stage_layers=6))  # 88 middle layers over 7 stages on their own
    errors = [f for f in check_config(job, plan).findings if f.id.startswith("PP") and f.severity == "error"]
    assert [f.id for f in errors] == ["PP009"]
    assert "account_for_embedding/loss cannot be combined with first/last_stage_layers" in errors[0].message
    # the accounting alone, as verl's run_qwen3-235b_megatron_96gb.sh passes it: 96 / 8 = 12 a rank
    assert _pp_errors(fields) == []
    assert plan_stages(*resolve(Request(**fields))).counts == (11,) + (12,) * 6 + (11,)
    # accounting that does not divide: Megatron-Core refuses 96 over pp=5 (verl and SkyRL had no rule for it)
    assert _pp_errors({**fields, "num_gpus": 160, "pp": 5}) == ["PP009"]
    # without the accounting the sizes are PP004's: 94 - 6 = 88 over 7 middle stages
    assert _pp_errors({**QWEN235, "framework": framework, "last_stage_layers": 6}) == ["PP004"]


def test_published_recipe_splits_pass_check():
    """The splits the production rows run (meshplan/knowledge/published_runs.py RECIPE_SPLITS): Bridge's
    DeepSeek-V3 and Kimi-K2 helper layouts, the perf recipes' strings, ModelZoo's long-context layout, the base
    recipes' account_for_* on Qwen3-235B-A22B (94 layers) and Llama-3.1-405B (126)."""
    for pp, vpp, layout in [(4, 4, "Et*4|(t*4|)*14tmL"), (2, 8, "Et*4|(t*4|)*14tmL"), (8, 1, "Et*8|(t*8|)*6t*5mL"),
                            (8, 2, "Et*4|(t*4|)*14tmL"), (8, 4, "Et*2|(tt|)*22t|(tt|)*7mL")]:
        assert _pp_errors({**DSV3, "num_gpus": 256, "tp": 1, "ep": 32, "pp": pp, "vpp": vpp,
                           "global_batch_size": 4096, "pipeline_layout": layout}) == [], (pp, vpp)
    assert _pp_errors({**KIMI, "num_gpus": 256, "tp": 1, "pp": 4, "vpp": 4, "ep": 64,
                       "pipeline_layout": "Et*4|(t*4|)*14tL"}) == []
    for pp, vpp in [(8, 3), (8, 4), (4, 12)]:
        assert _pp_errors({**QWEN235, "framework": "megatron-bridge", "tp": 1, "pp": pp, "vpp": vpp, "ep": 32,
                           "num_gpus": 256 if pp == 8 else 128, "global_batch_size": 2048, **ACCOUNT}) == []
    for pp, vpp, tp, gpus in [(8, 8, 8, 1024), (16, 4, 4, 256), (8, 4, 4, 256)]:
        assert _pp_errors(dict(model="llama-3.1-405b", framework="megatron-bridge", num_gpus=gpus, tp=tp, pp=pp,
                               vpp=vpp, global_batch_size=2048, **ACCOUNT)) == [], (pp, vpp)
    # the same model without the accounting is PP001's (126 layers over pp=8)
    assert _pp_errors(dict(model="llama-3.1-405b", framework="megatron-bridge", num_gpus=256, tp=4, pp=8, vpp=4,
                           global_batch_size=2048)) == ["PP001"]


@pytest.mark.parametrize("extra", [{"pipeline_layout": "Et*16|t*16L"}, {"account_for_loss": True}])
def test_recommend_keeps_a_given_layout(extra):
    """A given layout or embedding/loss accounting is kept by every candidate (it was refused before the search
    enumerated such splits), on recommend and min-gpus alike."""
    from meshplan import api

    rec = api.recommend(Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-core", **extra))
    assert rec.candidates
    for c in rec.candidates:
        assert {k: getattr(c.plan, k) for k in extra} == extra, c.plan.short()
    least = api.minimum_gpus(Request(model="llama-3.1-8b", framework="megatron-core", **extra))
    assert least.candidate is not None
    assert {k: getattr(least.candidate.plan, k) for k in extra} == extra


# --------------------------------------------------------------------------- against Megatron-Core's own code


def _megatron_layout_class():
    """PipelineParallelLayerLayout from the pinned megatron-core wheel, run as it is (only parallel_state, which it
    reads for the current rank and not in parsing or validation, is stubbed)."""
    import sys
    import types

    from framework_packages import wheel_tree

    root = wheel_tree("megatron-core") / "megatron" / "core" / "transformer"
    enums = types.ModuleType("megatron.core.transformer.enums")
    exec(compile((root / "enums.py").read_text(), "enums.py", "exec"), enums.__dict__)
    stubs = {"megatron": types.ModuleType("megatron"), "megatron.core": types.ModuleType("megatron.core"),
             "megatron.core.transformer": types.ModuleType("megatron.core.transformer"),
             "megatron.core.transformer.enums": enums}
    stubs["megatron.core"].parallel_state = types.ModuleType("megatron.core.parallel_state")
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        module = types.ModuleType("pipeline_parallel_layer_layout")
        source = (root / "pipeline_parallel_layer_layout.py").read_text()
        exec(compile(source, "pipeline_parallel_layer_layout.py", "exec"), module.__dict__)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module.PipelineParallelLayerLayout, enums.LayerType


@pytest.mark.slow
def test_parse_and_validation_agree_with_megatron_core():
    """parse_layout is parse_str_to_list, and layout_problem is '' exactly where PipelineParallelLayerLayout and
    validate_layer_layout accept (mtp_num_layers the model's where the layout has m, else None), on the recipes'
    layouts, composed ones and random mutations of them."""
    import random

    layout_cls, layer_type = _megatron_layout_class()
    names = {layer_type.embedding: "E", layer_type.decoder: "t", layer_type.mtp: "m", layer_type.loss: "L"}
    rng = random.Random(14)
    cases = [(DSV3_PP16, 16, 61, 1), (KIMI_PP16, 16, 61, 0), ("Et|(tt|)*30mL", 8, 61, 1),
             ("Et*3|(tt|)*29,m|L", 16, 61, 1), ("Et*7|(t*8|)*6t*6m|(|)*7L", 8, 61, 1),
             ("Et*2|(tt|)*22t|(tt|)*7mL", 8, 61, 1), ("Et*4|(t*4|)*14tmL", 2, 61, 1), ("Et*8|(t*8|)*6t*5mL", 8, 61, 1),
             ("Et*16|(t*16|)*2t*13L", 4, 61, 0)]
    for layers, pp, vpp, mtp in [(61, 16, 1, 1), (61, 8, 4, 1), (80, 4, 2, 0), (32, 2, 3, 0), (94, 8, 3, 1)]:
        cases.append((compose_layout(layers, pp, vpp, mtp), pp, layers, mtp))
    for text, pp, layers, mtp in list(cases):
        flat = list("|".join(parse_layout(text)))
        for _ in range(12):  # move, drop or add one character
            mutated = flat.copy()
            k = rng.randrange(len(mutated))
            op = rng.choice(("move", "drop", "add"))
            if op == "add":
                mutated.insert(k, rng.choice("EtmL|"))
            else:
                ch = mutated.pop(k)
                if op == "move":
                    mutated.insert(rng.randrange(len(mutated) + 1), ch)
            cases.append(("".join(mutated), pp, layers, mtp))
    agreed = rejected = 0
    for text, pp, layers, mtp in cases:
        ours = parse_layout(text)
        theirs = layout_cls.parse_str_to_list(text)
        assert list(ours) == ["".join(names[t] for t in stage) for stage in theirs], text
        try:
            megatron = layout_cls(text, pp)
            # a layout without m is the model trained without its MTP blocks: mtp_num_layers None (layout_problem)
            megatron.validate_layer_layout(layers, (mtp if "m" in text else 0) or None)
            accepted = True
        except AssertionError:
            accepted = False
        vpp = len(ours) // pp if len(ours) % pp == 0 else 1
        assert (layout_problem(ours, pp, vpp, layers, mtp) == "") == accepted, (text, pp, layers, mtp)
        agreed += 1
        rejected += not accepted
    assert agreed > 100 and 10 < rejected < agreed
