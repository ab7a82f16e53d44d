"""Bad input gets the same first error on every face: an unknown name before any value, with the name it most likely
means (the CLI's flags, the api's and MCP's fields), and never a traceback."""

from __future__ import annotations

import pytest
from mcp_calls import call_tool

from meshplan.faces import cli

BASE = ["recommend", "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8"]


def cli_error(capsys, *flags: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([*BASE, *flags])
    assert exc.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[0]


@pytest.mark.parametrize(("flags", "said"), [
    (["--tpp", "2"], "unknown flag '--tpp' (did you mean '--tp'?)"),
    (["--tensor-model-parallel-size", "2"], "unknown flag '--tensor-model-parallel-size' (did you mean '--tp'?)"),
    (["--gpu_type", "h100"], "unknown flag '--gpu_type' (did you mean '--gpu'?)"),
    (["--jsn"], "unknown flag '--jsn' (did you mean '--json'?)"),
    (["--zzzz"], "unknown flag '--zzzz'"),
    # 'gpus' is num_gpus's synonym on every face: argparse took '--gpus 8' as --gpus-per-node (its unique prefix) and
    # planned one GPU, where the api refuses 'gpus' with "did you mean 'num_gpus'"
    (["--gpus", "8"], "unknown flag '--gpus' (did you mean '--num-gpus'?)"),
    # A bad value of a known flag given before the unknown flag: the unknown name is still the first error.
    (["--tp", "x", "--tpp", "2"], "unknown flag '--tpp' (did you mean '--tp'?)"),
    (["--tp=x", "--tpp=2"], "unknown flag '--tpp' (did you mean '--tp'?)"),
    # a single-dash flag and an extra word: argparse said 'meshplan: error: unrecognized arguments: -n 8' from the top,
    # pointing at 'meshplan --help', without the subcommand or the flag meant
    (["-tp", "2"], "unknown flag '-tp' (did you mean '--tp'?)"),
    (["-n", "8"], "unknown flag '-n'"),
    (["llama-3.1-70b"], "unrecognized arguments: llama-3.1-70b"),
])
def test_cli_names_an_unknown_flag_first_with_the_subcommand_and_a_hint(capsys, flags, said):
    assert cli_error(capsys, *flags) == f"meshplan recommend: error: {said}"


def test_cli_abbreviations_and_values_after_double_dash_are_not_unknown_flags(capsys):
    assert cli_error(capsys, "--num-gpu", "8", "--tp", "x").startswith("meshplan recommend: error: argument --tp:")


def test_unknown_field_before_a_bad_value_on_cli_and_mcp_alike(capsys):
    """The same request with a misspelt field and a bad value: both faces name the misspelt field and its guess."""
    said = call_tool("recommend_parallelism", {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8, "tp": "x",
                                               "tpp": 2})
    assert said.is_error and "Unknown field 'tpp'. Fix: Did you mean 'tp'?" in said.content[0].text
    assert "'--tpp' (did you mean '--tp'?)" in cli_error(capsys, "--tp", "x", "--tpp", "2")


TOML = tuple(open("tests/configs/torchtitan_llama3_8b.toml", encoding="utf-8").read().splitlines())
TP_LINE = TOML.index("tensor_parallel_degree = 1") + 1


def toml_with(old: str, new: str) -> str:
    return "\n".join(new if line == old else line for line in TOML) + "\n"


@pytest.mark.parametrize(("old", "new", "said"), [
    ("tensor_parallel_degree = 1", "tensor_parallel_degree = 0",
     f":{TP_LINE} parallelism.tensor_parallel_degree: 0 is not a valid tp "
     "(Input should be greater than or equal to 1)"),
    ("tensor_parallel_degree = 1", 'tensor_parallel_degree = "x"',
     f":{TP_LINE} parallelism.tensor_parallel_degree: 'x' is not a valid tp"),
])
def test_a_bad_value_in_a_pasted_config_cites_key_and_line_on_mcp_and_cli(tmp_path, capsys, old, new, said):
    text = toml_with(old, new)
    answer = call_tool("estimate_memory", {"config_text": text, "gpu": "h100", "num_gpus": 8})
    assert answer.is_error and f"<config_text>{said}" in answer.content[0].text
    path = tmp_path / "job.toml"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["memory", "--config", str(path), "--gpu", "h100", "--num-gpus", "8"]) == cli.EXIT_USAGE
    assert f"{path}{said}" in capsys.readouterr().err


def test_a_misspelt_key_in_a_config_is_named_with_the_key_meshplan_reads():
    """A key one slip from a key meshplan reads is said at its line with that key, on check's config_unread (the
    CLI's check and import print the same lines), not dropped unsaid; a key far from any is left as it was."""
    text = toml_with("tensor_parallel_degree = 1", "tensor_paralel_degree = 2")
    answer = call_tool("check_config", {"config_text": text, "gpu": "h100", "num_gpus": 8})
    unread = answer.structured_content["config_unread"]
    assert (f"<config_text>:{TP_LINE} parallelism.tensor_paralel_degree = 2: no meshplan field (did you mean "
            "tensor_parallel_degree? meshplan reads that one; this one it leaves out)") in unread
    assert not [u for u in unread if "did you mean" in u and "tensor_paralel" not in u]


def test_a_framework_config_given_as_the_model_says_where_it_goes(capsys):
    """A TOML passed where a model's config.json goes: the error says what a model path is and where a framework's
    config is read instead, the same on the CLI and MCP (before: only 'not valid JSON')."""
    path = "tests/configs/torchtitan_llama3_8b.toml"
    fix = ("Fix: A model path is a Hugging Face config.json; a framework's config or launch script (TOML, YAML, "
           "shell) is read as --config FILE on the CLI, config_text on MCP.")
    assert cli.main(["memory", path, "--gpu", "h100", "--num-gpus", "8"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"'{path}' is not valid JSON" in err and fix in err and "Traceback" not in err
    answer = call_tool("estimate_memory", {"model": path, "gpu": "h100", "num_gpus": 8})
    assert answer.is_error and fix in answer.content[0].text


@pytest.mark.parametrize(("field", "given", "hint"), [
    ("framework", "VERL", "Did you mean framework='verl'?"),
    ("framework", "verl ", "Did you mean framework='verl'?"),
    ("framework", "megatron_bridge", "Did you mean framework='megatron-bridge'?"),
    ("recompute", "Full", "Did you mean recompute='full'?"),
    ("job", "rlhf", "Did you mean job='rl'?"),
    ("pipeline_schedule", "1F1B", "'1F1B' is megatron-bridge's name for pipeline_schedule='1f1b'; pass that."),
])
def test_a_misspelt_choice_names_the_value_meant_on_the_api_and_mcp_alike(field, given, hint):
    from meshplan.core.errors import MeshplanError
    from meshplan.request.parse import parse_request

    args = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8, field: given}
    with pytest.raises(MeshplanError) as exc:
        parse_request(args)
    said = str(exc.value)
    assert said.startswith(f"Invalid request: {field}: Input should be ") and said.endswith(f"Fix: {hint}")
    answer = call_tool("estimate_memory", args)
    assert answer.is_error and answer.content[0].text.endswith(said)


def test_a_choice_nothing_resembles_gets_no_guess():
    from meshplan.core.errors import MeshplanError
    from meshplan.request.parse import parse_request

    with pytest.raises(MeshplanError) as exc:
        parse_request({"model": "llama-3.1-8b", "framework": "zzz"})
    assert exc.value.fix is None and "(got 'zzz')" in str(exc.value)


@pytest.mark.parametrize(("field", "given", "hint"), [
    ("num_gpus", "8", "Send num_gpus as a JSON number, num_gpus=8, not the string '8'."),
    ("sequence_parallel", "true", "Send sequence_parallel as a JSON boolean, sequence_parallel=true, not the string "
                                  "'true'."),
    ("headroom", "0.1", "Send headroom as a JSON number, headroom=0.1, not the string '0.1'."),
    ("tp", "x", None),  # nothing to convert: no hint
    ("headroom", "inf", None),  # text that reads as a number JSON cannot send: no hint (it said 'headroom=None')
    # a whole number as a JSON float (Python's json.dumps(8.0)): JSON Schema's integer admits it, the strict field
    # does not, and the refusal gave no hint
    ("num_gpus", 8.0, "Send num_gpus as a JSON integer, num_gpus=8, not the float 8.0."),
    ("tp", 1e3, "Send tp as a JSON integer, tp=1000, not the float 1000.0."),
    ("tp", 2.5, None),  # no whole number: no value to send
    # a switch as YAML's or a shell's word, a list as one name or a comma list: they had no hint
    ("sequence_parallel", "yes", "Send sequence_parallel as a JSON boolean, sequence_parallel=true, not the string "
                                 "'yes'."),
    ("expandable_segments", "off", "Send expandable_segments as a JSON boolean, expandable_segments=false, not the "
                                   "string 'off'."),
    ("sequence_parallel", "maybe", None),
    ("recompute_modules", "core_attn", 'Send recompute_modules as a JSON list, recompute_modules=["core_attn"], not '
                                       "the string 'core_attn'."),
    ("lora_targets", "linear_qkv, linear_proj", 'Send lora_targets as a JSON list, lora_targets=["linear_qkv", '
                                                '"linear_proj"], not the string \'linear_qkv, linear_proj\'.'),
])
def test_a_number_sent_as_text_says_what_to_send_on_the_api_and_mcp(field, given, hint):
    from meshplan.core.errors import MeshplanError
    from meshplan.request.parse import parse_request

    args = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8, field: given}
    with pytest.raises(MeshplanError) as exc:
        parse_request(args)
    assert exc.value.fix == hint
    answer = call_tool("estimate_memory", args)
    assert answer.is_error and answer.content[0].text.endswith(str(exc.value))


def test_a_missing_argument_and_an_argument_to_a_tool_that_takes_none_are_said_plainly():
    """Before: 'framework: Field required (got {...the whole request...})' and 'Valid fields: .'"""
    base = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8}
    render = call_tool("render_config", base)
    assert render.is_error and render.content[0].text.endswith("Invalid request: framework: required, and not given.")
    listed = call_tool("list_models", {"x": 1})
    assert listed.is_error and listed.content[0].text.endswith("Unknown field 'x'. Fix: This takes no arguments: "
                                                               "send none.")


def test_the_page_refuses_a_field_its_form_does_not_have():
    """A hand-made URL (?vpp=3) was answered as if vpp were left to the search: the page now names the field and
    where the other fields are set; a misspelt one (num_gpu) the closest form field. vpp, a request field meant as
    it is, was offered 'did you mean 'pp'?', a different field."""
    from meshplan.faces.report.page import FORM_FIELDS, answer

    base = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": "8"}
    said = answer({**base, "vpp": "3"})[2]
    assert said.startswith(f"The page has no field 'vpp' (a request field the form does not hold); it takes "
                           f"{', '.join(FORM_FIELDS)}. Fix: Set the request's other fields")
    assert "(did you mean 'num_gpus'?)" in answer({**base, "num_gpu": "8"})[2]


def test_the_page_reads_a_number_in_ascii_digits_as_the_cli_and_the_api_do():
    """'１６' (fullwidth digits) in the page's num_gpus was answered for 16 GPUs (Python's \\d and int() take any
    script's digits), where the CLI (ascii_int) and the api refuse it: the page refuses it as the api does."""
    from meshplan.faces.report.page import answer

    error = answer({"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": "\uff11\uff16"})[2]
    assert error.startswith("Invalid request: num_gpus: Input should be a valid integer"), error


def test_the_page_s_route_refuses_a_field_its_form_does_not_have():
    """The same URL through the page's own reading of a query (`meshplan serve --http`, GET /?...&vpp=3): the form's
    reader kept its own fields alone, so the answer came back as if vpp were left to the search."""
    from urllib.parse import parse_qs

    from meshplan.faces.report.page import _form_values, page

    html = page(_form_values(parse_qs("model=llama-3.1-8b&gpu=h100&num_gpus=8&vpp=3")))
    assert "The page has no field &#39;vpp&#39; (a request field the form does not hold)" in html
    assert 'id="answer-json"' not in html


def test_a_config_json_with_a_slip_is_told_to_fix_its_json_not_to_use_config():
    from meshplan.faces.report.page import PASTED, answer

    error = answer({"config": '{"hidden_size": 4096,}', "num_gpus": "8", "gpu": "h100"})[2]
    assert error.startswith(f"'{PASTED}' is not valid JSON") and error.endswith("Fix: Fix the JSON there.")


def test_a_missing_model_beside_a_bad_value_names_the_value_first_on_every_face(capsys):
    """MCP's argument check refuses num_gpus=0 before anything asks for the model; the api and the CLI said 'A model
    is required' first. Now every face names the bad value first, and the model once the values are right."""
    from meshplan.core.errors import MeshplanError
    from meshplan.request.parse import parse_request

    said = "Invalid request: num_gpus: Input should be greater than or equal to 1 (got 0)."
    with pytest.raises(MeshplanError, match=r"^Invalid request: num_gpus: Input should be greater than or equal to 1"):
        parse_request({"gpu": "h100", "num_gpus": 0})
    assert call_tool("estimate_memory", {"gpu": "h100", "num_gpus": 0}).content[0].text.endswith(said)
    assert cli.main(["memory", "--gpu", "h100", "--num-gpus", "0"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip() == f"meshplan: {said}"
    with pytest.raises(MeshplanError, match=r"^A model is required"):
        parse_request({"gpu": "h100", "num_gpus": 8})
    # the CLI's answer named MCP's tool alone ('a catalog key (see list_models)'): each face's way is named
    assert cli.main(["memory", "--num-gpus", "8"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "MODEL or --model" in err and "meshplan models" in err and "list_models" in err


def test_recommend_without_a_gpu_count_names_an_unknown_model_first(capsys):
    """`meshplan recommend no-such-model` (and the page without a count) said 'recommend needs the GPU count'; given
    the count, it then said 'Unknown model': two tries for one slip each. The model is named first now."""
    from meshplan import api
    from meshplan.core.errors import MeshplanError
    from meshplan.schema.request import Request

    with pytest.raises(MeshplanError, match=r"^Unknown model 'lama-3.1-8b'.*Did you mean: llama-3.1-8b"):
        api.recommend(Request(model="lama-3.1-8b"))
    with pytest.raises(MeshplanError, match=r"^recommend needs the GPU count"):
        api.recommend(Request(model="llama-3.1-8b"))
    assert cli.main(["recommend", "lama-3.1-8b"]) == cli.EXIT_USAGE
    assert "Unknown model 'lama-3.1-8b'" in capsys.readouterr().err


def test_an_empty_name_gets_no_guess():
    """closest('') matched every name (the empty string is in each) and offered the first five as 'did you mean'."""
    from meshplan.core.errors import closest

    assert closest("", ["h100", "h200"]) == [] and closest("  ", ["h100"]) == []
    assert closest("h10", ["h100"]) == ["h100"]


def test_a_framework_with_no_reader_is_said_so_not_an_empty_list_of_formats():
    """Was: 'meshplan reads nanotron from  files ... Fix: Pass nanotron's  file'."""
    from meshplan import api
    from meshplan.core.errors import MeshplanError

    text = "\n".join(TOML) + "\n"
    with pytest.raises(MeshplanError) as exc:
        api.import_config(text, path="job.toml", framework="nanotron")
    said = str(exc.value)
    assert said.startswith("job.toml: meshplan reads no nanotron file. Fix: Pass the framework this toml file is for "
                           "(torchtitan or kempnerforge)") and "  " not in said


def test_a_bad_model_beside_a_bad_gpu_names_the_model_first_on_every_face(capsys):
    from meshplan import api
    from meshplan.core.errors import MeshplanError
    from meshplan.request.parse import parse_request

    args = {"model": "llama-3.1-8", "gpu": "h1000", "num_gpus": 8}
    with pytest.raises(MeshplanError) as exc:
        api.recommend(parse_request(args))
    said = str(exc.value)
    assert said.startswith("Unknown model 'llama-3.1-8'. Fix: Did you mean: llama-3.1-8b")
    assert call_tool("recommend_parallelism", args).content[0].text.endswith(said)
    assert cli.main(["recommend", "llama-3.1-8", "--gpu", "h1000", "--num-gpus", "8"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip() == f"meshplan: {said}"


def test_estimates_from_a_config_warn_first_of_its_misspelt_key_on_mcp_and_cli(tmp_path, capsys):
    """A misspelt key changed the estimate unsaid (TP1 instead of the TP2 the file meant): memory and throughput from
    the file now lead their warnings with it, its line and the key meant; a clean file adds no warning."""
    text = toml_with("tensor_parallel_degree = 1", "tensor_paralel_degree = 2")
    line = (f":{TP_LINE} parallelism.tensor_paralel_degree = 2: no meshplan field (did you mean tensor_parallel_degree?"
            " meshplan reads that one; this one it leaves out): the estimate runs without it")
    for tool in ("estimate_memory", "estimate_throughput"):
        answer = call_tool(tool, {"config_text": text, "gpu": "h100", "num_gpus": 8})
        assert answer.structured_content["warnings"][0] == f"<config_text>{line}"
        clean = call_tool(tool, {"config_text": toml_with("", ""), "gpu": "h100", "num_gpus": 8})
        assert not [w for w in clean.structured_content["warnings"] if "did you mean" in w]
    path = tmp_path / "job.toml"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["memory", "--config", str(path), "--gpu", "h100", "--num-gpus", "8", "--json"]) == cli.EXIT_OK
    import json

    assert json.loads(capsys.readouterr().out)["warnings"][0] == f"{path}{line}"


def test_a_misspelt_variant_is_named_before_the_layouts_rules_on_every_face(capsys):
    """render_config with variant='nope' on a layout that does not fit answered MEM001's refusal; once the memory was
    fixed it named the variant. The variant is an input of its own: refused first, with the variants there are."""
    from meshplan import api
    from meshplan.core.errors import MeshplanError
    from meshplan.schema.request import Request

    fields = dict(model="qwen3-8b", framework="verl", num_gpus=8)  # TP1 DP8: MEM001 on 80 GB
    with pytest.raises(MeshplanError, match="verl has no variant 'nope'"):
        api.render_config("verl", Request(**fields), variant="nope")
    result = call_tool("render_config", {**fields, "variant": "nope"})
    assert result.is_error and "verl has no variant 'nope'" in result.content[0].text
    assert cli.main(["render", "verl", "--model", "qwen3-8b", "--num-gpus", "8", "--variant", "nope"]) == cli.EXIT_USAGE
    assert "verl has no variant 'nope'" in capsys.readouterr().err
