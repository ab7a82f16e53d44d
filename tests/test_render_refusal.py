"""`render` through its faces: a layout that breaks a rule is refused (unless forced), a misspelt framework
names only the renderable ones, override values read back unchanged, and the snippet carries the model's
own architecture flags or says which ones to add.

Faces: `meshplan.api.render_config`, the CLI through `meshplan.faces.cli.main`, and the MCP tool function.
"""

from __future__ import annotations

import json

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from meshplan import api
from meshplan.adapters.parse import cli_flags, overrides, python_assignments, shell_tokens
from meshplan.adapters.render import TARGETS, RefusedLayout, dotlist_value, hydra_value, render
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib
from meshplan.estimate.memory import estimate_memory
from meshplan.faces.cli import main
from meshplan.faces.mcp import tools
from meshplan.knowledge.cards import model_card
from meshplan.request.resolve import resolve
from meshplan.rules.engine import unwritable_rules
from meshplan.schema.request import Request

TP3 = dict(model="llama-3.1-8b", num_gpus=8, tp=3)  # dp = 8/3: WS001, and 32 heads / 3: TP001
TITAN_70B = dict(model="llama-3.1-70b", num_gpus=8)  # one 70B replica per GPU: far over 80 GB
LOW_HEADROOM = dict(model="qwen3-30b-a3b", num_gpus=16, tp=1, pp=1, ep=8, global_batch_size=256)  # 1.7% free


def _mcp(framework: str, **fields):
    """The MCP tool as the server calls it: every argument present, the optional ones at their defaults."""
    return tools.render_config(framework=framework, variant=None, version=None, force=fields.pop("force", False),
                               **fields)


# --------------------------------------------------------------------------- 1. rule errors refuse the render


def test_a_layout_the_framework_rejects_is_refused_with_each_finding_and_its_fix():
    with pytest.raises(RefusedLayout) as exc:
        api.render_config("megatron-core", Request(**TP3))
    ids = [f.id for f in exc.value.findings]
    assert {"WS001", "TP001"} <= set(ids) and all(f.severity == "error" for f in exc.value.findings)
    text = str(exc.value)
    for finding in exc.value.findings:
        assert f"{finding.id} (error): {finding.message} Fix: {finding.fix}" in text
    assert "tp*pp*cp = 3*1*1 = 3" in text and "tp in {1, 2, 4, 8} works" in text
    assert "megatron-core would reject it" in text and "--force" in text and "force=true" in text


def test_a_setting_the_written_config_has_no_key_for_is_refused_as_that_not_as_the_frameworks_rejection():
    """SkyRL's main_sft at ZeRO 3 always checkpoints every layer: recompute=none has no key there (RC006, a rule the
    card marks unwritable). The framework would not reject the layout; meshplan cannot write the setting, and the
    refusal's headline says that. A layout that breaks a framework's own rule still says the framework rejects it."""
    req = Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="skyrl", zero_stage=3, recompute="none")
    with pytest.raises(RefusedLayout) as exc:
        api.render_config("skyrl", req)
    headline = str(exc.value).splitlines()[0]
    assert "RC006" in headline and "would reject it" not in headline
    assert "the skyrl config meshplan writes has no key for a setting it uses" in headline
    assert unwritable_rules() == {"AD001", "RC005", "RC006", "TT004"}


def test_a_layout_that_does_not_fit_is_refused_with_its_peak_against_the_capacity():
    with pytest.raises(RefusedLayout) as exc:
        api.render_config("torchtitan", Request(**TITAN_70B))
    assert [f.id for f in exc.value.findings] == ["MEM001"]
    report = estimate_memory(*resolve(Request(framework="torchtitan", **TITAN_70B)))
    assert report.peak_bytes > 3 * report.capacity_bytes  # about 267 GiB against 79.6 GiB
    # torchtitan launches with expandable segments: the allocated peak decides, the reserved one is named beside it
    assert (f"it does not fit: an allocated peak of {gib(report.fit_bytes)} per GPU (stage {report.peak_stage}; "
            f"{gib(report.peak_bytes)} reserved, but with expandable segments the allocated peak decides the fit) "
            f"against {gib(report.capacity_bytes)} of memory") in str(exc.value)


def test_force_renders_the_refused_layout_with_the_findings_as_warnings():
    result = api.render_config("megatron-core", Request(**TP3), force=True)
    assert "--tensor-model-parallel-size 3" in result.text
    assert result.warnings[0].startswith("Rendered because force was given")
    assert any(w.startswith("WS001 (error): ") and "Fix: Use num_gpus = 6 or 9" in w for w in result.warnings)


def test_low_headroom_renders_with_a_warning_and_the_same_snippet_as_the_adapter():
    result = api.render_config("megatron-core", Request(**LOW_HEADROOM))
    assert [w.split(" ", 1)[0] for w in result.warnings] == ["MEM002"]
    assert "(1.7%) free" in result.warnings[0] and "Fix: " in result.warnings[0]
    job, plan = resolve(Request(framework="megatron-core", **LOW_HEADROOM))
    assert result.text == render("megatron-core", job, plan).text


def test_cli_refuses_with_exit_1_and_the_fixes_and_renders_with_force(capsys):
    args = ["render", "megatron-core", "llama-3.1-8b", "--num-gpus", "8", "--tp", "3"]
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert "WS001 (error)" in err and "Fix: Use num_gpus = 6 or 9" in err and "TP001 (error)" in err
    assert err.rstrip().endswith("pass --force (MCP: force=true).")
    assert main([*args, "--force"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/usr/bin/env bash") and "--tensor-model-parallel-size 3" in out
    assert "# warning: WS001 (error)" in err


def test_cli_says_how_far_a_layout_is_over_memory(capsys):
    assert main(["render", "torchtitan", "llama-3.1-70b", "--num-gpus", "8"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "MEM001 (error): needs " in err and "it does not fit: an allocated peak of " in err


def test_cli_plain_output_shows_warnings_and_notes_on_stderr_and_keeps_stdout_the_snippet(capsys):
    assert main(["render", "megatron-core", "qwen3-30b-a3b", "--num-gpus", "16", "--tp", "1", "--pp", "1",
                 "--ep", "8", "--global-batch-size", "256"]) == 0
    out, err = capsys.readouterr()
    job, plan = resolve(Request(framework="megatron-core", **LOW_HEADROOM))
    assert out == render("megatron-core", job, plan).text
    lines = err.splitlines()
    assert lines[0].startswith("# warning: MEM002 (warning): only ")
    assert any(line.startswith("# note: Data, tokenizer, optimizer") for line in lines)
    assert all(line.startswith(("# warning: ", "# note: ")) for line in lines)


def test_mcp_refuses_with_the_same_text_and_renders_with_force():
    with pytest.raises(RefusedLayout) as refused:
        api.render_config("megatron-core", Request(**TP3))
    with pytest.raises(ToolError) as exc:
        _mcp("megatron-core", **TP3)
    assert str(exc.value) == str(refused.value)
    answer = _mcp("megatron-core", force=True, **TP3)
    assert any(w.startswith("TP001 (error)") for w in answer.warnings) and "warning(s)" in answer.summary


# --------------------------------------------------------------------------- 4. a misspelt framework


def test_a_misspelt_framework_suggests_the_closest_and_lists_only_renderable_ones(capsys):
    assert main(["render", "megatrom-core", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'megatron-core'?" in err
    assert f"meshplan renders: {', '.join(TARGETS)}." in err
    assert "models/" not in err and "calibration" not in err and err.count("\n") == 1
    with pytest.raises(MeshplanError, match="Did you mean 'torchtitan'"):
        api.render_config("torchtitn", Request(model="llama-3.1-8b"))


def test_render_targets_are_the_cards_with_an_adapter_section_in_schema_order():
    assert TARGETS == ("deepspeed", "kempnerforge", "megatron-bridge", "megatron-core", "nemo-automodel", "skyrl",
                       "torchtitan", "verl")
    with pytest.raises(MeshplanError, match="memory convention only") as exc:
        api.render_config("nanotron", Request(model="llama-3.1-8b"))
    assert "Did you mean" not in str(exc.value)


# --------------------------------------------------------------------------- 3. override values read back unchanged


@pytest.mark.parametrize("text,hydra,dotlist", [
    # Hydra keeps a backslash inside quotes unless a run of them ends at a quote; it was doubled before.
    ("C:\\models\\llama", "'C:\\models\\llama'", '"C:\\\\models\\\\llama"'),
    ("end\\", "'end\\\\'", '"end\\\\"'),
    ("it's", "'it\\'s'", '"it\'s"'),
    ("x\\'y", "'x\\\\\\'y'", '"x\\\\\'y"'),
    ("${oops}", "'\\${oops}'", '"\\\\${oops}"'),  # OmegaConf would resolve an interpolation
    ("org/model with space", "'org/model with space'", '"org/model with space"'),
    ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B"),
    ("null", "'null'", '"null"'),
    ("on", "'on'", '"on"'),  # YAML 1.1 reads a bare on as true
    ("NaN", "'NaN'", '"NaN"'),  # Hydra reads a bare nan as a float
])
def test_override_values_are_quoted_the_way_each_reader_reads_them(text, hydra, dotlist):
    assert hydra_value(text) == hydra and dotlist_value(text) == dotlist


def test_a_backslash_in_a_model_path_reaches_verl_and_skyrl_once():
    job, plan = resolve(Request(framework="verl", model="llama-3.1-8b", num_gpus=8, tp=2))
    job = job.model_copy(update={"model": job.model.model_copy(update={"hf_id": "C:\\models\\llama"})})
    # a verl training job renders its SFT trainer (sft-megatron below ZeRO 3), whose key is model.path
    assert "model.path='C:\\models\\llama'" in shell_tokens(render("verl", job, plan).text)
    assert 'model.path="C:\\\\models\\\\llama"' in shell_tokens(render("skyrl", job, plan).text)  # main_sft
    assert 'trainer.policy.model.path="C:\\\\models\\\\llama"' in shell_tokens(
        render("skyrl", job, plan, variant="rl").text)


# --------------------------------------------------------------------------- 2. the model's own architecture


def _core(model: str, **fields):
    """pretrain_gpt.py's flags (flag -> value, True for a switch) and the result, straight from the adapter."""
    job, plan = resolve(Request(framework="megatron-core", model=model, **{"num_gpus": 8, **fields}))
    result = render("megatron-core", job, plan)
    tokens = shell_tokens(result.text)
    return cli_flags(tokens[tokens.index("pretrain_gpt.py") + 1:]), result


def _bridge(model: str, variant: str | None = None, **fields) -> dict:
    job, plan = resolve(Request(framework="megatron-bridge", model=model, **{"num_gpus": 8, **fields}))
    result = render("megatron-bridge", job, plan, variant=variant)
    return python_assignments(result.text) if result.format == "python" else overrides(shell_tokens(result.text))


def test_llama_3_1_carries_its_rope_base_llama3_scaling_and_norm_epsilon():
    flags, result = _core("llama-3.1-8b", tp=2)
    assert {k: flags[k] for k in ("--rotary-base", "--use-rope-scaling", "--rope-scaling-factor", "--norm-epsilon",
                                  "--swiglu", "--position-embedding-type", "--normalization")} == {
        "--rotary-base": "500000", "--use-rope-scaling": True, "--rope-scaling-factor": "8.0",
        "--norm-epsilon": "1e-05", "--swiglu": True, "--position-embedding-type": "rope", "--normalization": "RMSNorm"}
    assert "# add:" not in result.text  # nothing left for the user to add
    model = {k: v for k, v in _bridge("llama-3.1-8b", tp=2).items() if k.startswith("model.") and "parallel" not in k}
    assert {"model.rotary_base": 500000, "model.rope_scaling": True, "model.rope_scaling_factor": 8.0,
            "model.layernorm_epsilon": 1e-05, "model.gated_linear_unit": True}.items() <= model.items()
    assert _bridge("llama-3.1-8b", "run_recipe", tp=2)["model.rotary_base"] == "500000"


def test_qwen3_gets_its_own_rope_base_and_qk_layernorm():
    flags, _ = _core("qwen3-8b", tp=2)
    assert flags["--rotary-base"] == "1000000" and flags["--norm-epsilon"] == "1e-06" and flags["--qk-layernorm"]
    assert "--use-rope-scaling" not in flags


def test_gemma_2_is_not_given_swiglu_and_says_what_pretrain_gpt_cannot_build():
    flags, result = _core("gemma-2-27b", num_gpus=16, tp=4)
    assert not {"--swiglu", "--quick-geglu", "--squared-relu"} & set(flags)
    assert flags["--apply-layernorm-1p"] and flags["--norm-epsilon"] == "1e-06" and flags["--rotary-base"] == "10000"
    geglu = next(n for n in result.notes if "GeGLU" in n)
    assert "gelu_pytorch_tanh" in geglu and "fast_gelu" in geglu
    assert any("soft-capping" in n for n in result.notes)
    assert f"# add: {geglu}" in result.text  # in the snippet itself, not only in the JSON
    bridge = _bridge("gemma-2-27b", num_gpus=16, tp=4)
    assert bridge["model.gated_linear_unit"] is True and bridge["model.layernorm_zero_centered_gamma"] is True
    assert not any("activation" in k for k in bridge)


def test_gemma_2_notes_reach_the_plain_cli_output_and_the_json(capsys):
    # tp 8: at tp 4 its unfused glu() (Megatron-Core never fuses fast_gelu) is 1.4 GiB over an H100 (MEM001)
    args = ["render", "megatron-core", "gemma-2-27b", "--num-gpus", "16", "--tp", "8"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "--swiglu" not in shell_tokens(out) and "# add: gemma-2-27b's MLP is GeGLU" in out
    assert "# note: gemma-2-27b's MLP is GeGLU" in err
    assert any("GeGLU" in n for n in api.render_config("megatron-core", Request(
        model="gemma-2-27b", num_gpus=16, tp=8)).notes)


def test_mla_models_carry_their_yarn_or_plain_rope_and_the_lora_norms():
    flags, _ = _core("deepseek-v3", num_gpus=64, ep=8)
    assert {k: flags[k] for k in ("--rotary-base", "--rope-type", "--rotary-scaling-factor", "--mscale",
                                  "--mscale-all-dim", "--qk-layernorm")} == {
        "--rotary-base": "10000", "--rope-type": "yarn", "--rotary-scaling-factor": "40.0", "--mscale": "1.0",
        "--mscale-all-dim": "1.0", "--qk-layernorm": True}
    # MLA takes its rope from rope_type, and rope as position_embedding_type all the same: left at Megatron-LM's
    # learned_absolute, GPTModel adds a learned table of max_position_embeddings rows (its DeepSeek scripts pass rope)
    assert flags["--position-embedding-type"] == "rope"
    flags, _ = _core("moonlight-16b-a3b", ep=8)  # no rope scaling: Megatron's MLA default is yarn x40
    assert flags["--position-embedding-type"] == "rope"
    assert flags["--rope-type"] == "rope" and flags["--no-rope-fusion"] and flags["--rotary-base"] == "50000"
    _, kimi = _core("kimi-k2", num_gpus=64, ep=8)  # beta_fast 1, not MLA's 32: only a config field can say so
    assert any(n.startswith("pretrain_gpt.py has no flag for beta_fast=1.0") for n in kimi.notes)
    assert _bridge("kimi-k2", num_gpus=64, ep=8)["model.beta_fast"] == 1.0


def test_gpt_oss_gets_yarn_and_its_clamped_glu():
    flags, result = _core("gpt-oss-20b", ep=8)
    assert flags["--position-embedding-type"] == "yarn" and flags["--rotary-scaling-factor"] == "32.0"
    assert flags["--yarn-original-max-position-embeddings"] == "4096"
    assert flags["--no-yarn-correction-range-round-to-int"]
    assert flags["--quick-geglu"] and flags["--activation-func-clamp-value"] == "7.0" and "--swiglu" not in flags
    assert any("attention sinks" in n for n in result.notes)


def test_scaling_megatron_cannot_express_is_a_note_not_a_wrong_flag():
    flags, result = _core("llama-4-scout", num_gpus=16, ep=16)  # llama3 scaling with high_freq_factor 1, not 4
    assert "--use-rope-scaling" not in flags and flags["--rotary-base"] == "500000"
    assert any("high_freq_factor=1" in n and "_apply_scaling" in n for n in result.notes)


def test_unknown_rope_base_and_norm_epsilon_are_named_for_the_user_to_add():
    flags, result = _core("qwen2.5-72b", num_gpus=64, tp=8)
    assert "--rotary-base" not in flags and "--norm-epsilon" not in flags
    assert any("add --rotary-base" in n for n in result.notes) and any("add --norm-epsilon" in n for n in result.notes)


def test_a_config_json_in_transformers_5_form_carries_its_rope_parameters(tmp_path):
    cfg = {**model_card("qwen3-8b").config, "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default"}}
    del cfg["rope_theta"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    flags, _ = _core(str(path), tp=2)
    assert flags["--rotary-base"] == "5000000"


def test_megatron_deepspeed_gives_swiglu_only_to_silu_and_names_what_to_add():
    job, plan = resolve(Request(framework="deepspeed", model="gemma-2-27b", num_gpus=16, tp=4))
    result = render("deepspeed", job, plan)
    assert "--swiglu" not in shell_tokens(result.text)
    assert any(n.startswith("Add gemma-2-27b's rope base 10000, norm epsilon 1e-06, a gated MLP with gelu_pytorch_tanh")
               for n in result.notes)
    job, plan = resolve(Request(framework="deepspeed", model="llama-3.1-8b", num_gpus=16, tp=2))
    assert "--swiglu" in shell_tokens(render("deepspeed", job, plan).text)


@pytest.mark.parametrize(("framework", "variant", "zero", "other"), [
    ("verl", "megatron", 3, "sft-fsdp"), ("verl", "sft-fsdp", 1, "sft-megatron"), ("skyrl", "sft", 3, "sft-fsdp"),
    ("skyrl", "fsdp", 1, "sft")])
def test_a_variant_of_another_engine_than_the_zero_stages_is_refused(framework, variant, zero, other):
    """verl's and SkyRL's zero_stage 3 runs their FSDP engine, 0-2 their Megatron one: check and the estimates take
    the plan there. Before: render verl --variant megatron --zero-stage 3 wrote Megatron-FSDP (use_megatron_fsdp=true)
    for a plan estimated on verl's FSDP2 engine; now it is refused, even forced, naming the variant that runs it."""
    from meshplan.schema.request import Request

    req = Request(model="qwen3-8b", framework=framework, num_gpus=16, zero_stage=zero)
    with pytest.raises(MeshplanError, match=f"Variant {variant} runs .* engine, but zero_stage {zero} selects") as exc:
        api.render_config(framework, req, variant=variant, force=True)
    assert f"Use variant {other} (or leave variant out)" in exc.value.fix
    assert api.render_config(framework, req, variant=other, force=True).variant == other


@pytest.mark.parametrize("framework, ask, named", [
    # 80 layers over 32 stages: the only splits Megatron accepts put 10 on each end; before, "Choose first/last so
    # that the remaining layers divide evenly over the middle stages"
    ("megatron-core", dict(model="llama-3.1-70b", num_gpus=32, pp=32, first_stage_layers=1, last_stage_layers=1),
     "Use first_stage_layers=10, last_stage_layers=10, 2 on each of the 30 middle stages"),
    # torchtitan makes the ends lighter only; before, "Put fewer layers on the first/last stages than on the middle"
    ("torchtitan", dict(model="llama-3.1-8b", num_gpus=8, pp=4, first_stage_layers=11, last_stage_layers=1),
     "Use first_stage_layers=8, last_stage_layers=8"),
    # 32 layers over 3 stages; before, "Give first_stage_layers/last_stage_layers, or a pp*vpp that divides ..."
    ("nemo-automodel", dict(model="llama-3.1-8b", num_gpus=6, pp=3),
     "Use first_stage_layers=11, last_stage_layers=10, 11 on the middle stage"),
])
def test_a_forced_render_of_a_split_that_cannot_be_written_names_one_that_can(framework, ask, named):
    with pytest.raises(MeshplanError) as err:
        api.render_config(framework, Request(**ask, framework=framework), force=True)
    assert err.value.fix.startswith(named), err.value.fix
    split = {k: v for k, v in (p.split("=") for p in named.split(", ")[:2] if "=" in p)}
    fixed = {**ask, **{k.replace("Use ", ""): int(v) for k, v in split.items()}}
    assert api.render_config(framework, Request(**fixed, framework=framework), force=True).text
