"""framework_version: a release whose loss kept other tensors has its own byte convention, and render writes it."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import memory_card
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

LLAMA_32K = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, seq_length=32768, micro_batch_size=1,
                 recompute="full")


def loss_bytes(version):
    report = api.estimate_memory(parse_request(dict(LLAMA_32K, framework_version=version)))
    return report.stages[0].detail["logits_and_loss"], report


def test_torchtitan_before_its_chunked_loss_keeps_every_logit_at_ten_bytes():
    card = framework_card("torchtitan")
    assert card.convention_for("0.2.2") == "fsdp2" and card.convention_for("0.3.0") == "fsdp2_chunked_loss"
    old, report = loss_bytes("0.2")
    new, _ = loss_bytes(None)
    vocab = 128256  # Llama 3 vocabulary, unpadded by torchtitan (tp 1)
    conv = memory_card().conventions["fsdp2"]
    hidden = conv.output_hidden_bytes * 32768 * 4096
    assert old == int(conv.logits_bytes_per_element * 32768 * vocab + hidden)
    assert old > 3 * new  # the chunked loss holds one of 8 pieces at a time
    assert any("memory convention fsdp2" in a for a in report.assumptions)


def test_an_unknown_release_names_the_known_ones_and_a_prefix_picks_the_newest():
    with pytest.raises(MeshplanError, match=r"0\.1\.0 \(0\.1\.x\), 0\.2\.2 \(0\.2\.x\), 0\.3\.0 \(0\.3 and later\)"):
        resolve(parse_request(dict(LLAMA_32K, framework_version="0.0.9")))  # before the first known release
    job, _ = resolve(parse_request(dict(LLAMA_32K, framework_version="0.2")))
    assert job.framework_version == "0.2.2" and not any("framework_version" in n for n in job.notes)
    with pytest.raises(MeshplanError, match="framework_version"):
        parse_request(dict(LLAMA_32K, framework_version="latest; rm -rf /"))


@pytest.mark.parametrize("asked,release,covers", [
    ("0.2.0", "0.2.2", "0.2.x"),  # a release of a series meshplan knows: that series' facts (the unchunked loss)
    ("0.2.0+cu128", "0.2.2", "0.2.x"),  # a local build suffix does not change the release
    ("0.2.1", "0.2.2", "0.2.x"),
    ("0.1.7", "0.1.0", "0.1.x"),
    ("0.3.1", "0.3.0", "0.3 and later"),
    ("0.4.0rc1", "0.3.0", "0.3 and later"),  # newer than every known release: the newest, said as such
])
def test_any_torchtitan_version_resolves_to_the_release_whose_facts_apply(asked, release, covers):
    job, _ = resolve(parse_request(dict(LLAMA_32K, framework_version=asked)))
    assert job.framework_version == release
    (note,) = [n for n in job.notes if n.startswith(f"framework_version {asked}:")]
    assert f"the facts of torchtitan {release}, which stands for {covers}" in note
    conv = framework_card("torchtitan").convention_for(release)
    assert any(f"memory convention {conv}" in n for n in job.notes) == (conv != "fsdp2_chunked_loss")


@pytest.mark.parametrize("asked", ["0.14", "0.15", "0.15.0rc1", "0.16.1"])
def test_megatron_core_releases_from_its_oldest_one_take_the_cards_facts(asked):
    """Megatron-Core 0.14 and 0.15 (NeMo 25.09/25.11) were refused; the card's oldest_release says from where its
    facts stand, and the note names them."""
    job, _ = resolve(parse_request(dict(model="llama-3.1-8b", num_gpus=8, framework_version=asked)))
    assert job.framework_version == "0.19.2"
    assert any(n.startswith(f"framework_version {asked}: estimated with the facts of Megatron-Core / Megatron-LM "
                            "0.19.2, which stands for 0.14 and later") for n in job.notes)


@pytest.mark.parametrize("asked,why", [
    ("0.13.1", "older than 0.14, the oldest Megatron-Core / Megatron-LM release meshplan's facts stand for"),
    ("0.x.y", "not a version"),
    ("1..2", "not a version"),
])
def test_a_version_before_the_first_release_or_not_a_version_is_an_error_listing_the_releases(asked, why):
    with pytest.raises(MeshplanError) as err:
        resolve(parse_request(dict(model="llama-3.1-8b", num_gpus=8, framework_version=asked)))
    assert why in err.value.reason and "0.19.2 (0.14 and later)" in err.value.fix


def test_every_face_resolves_the_version_alike():
    """The CLI and the api agree (the MCP tools and batch lines share parse_request and resolve: test_faces_agree)."""
    from meshplan.faces.cli import main

    fields = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, global_batch_size=64,
                  framework_version="0.2.0+cu128")
    rendered = api.render_config("torchtitan", parse_request(fields))
    assert (rendered.version, rendered.format) == ("0.2.2", "toml")
    assert main(["memory", "llama-3.1-8b", "--framework", "torchtitan", "--num-gpus", "8",
                 "--framework-version", "0.2.0+cu128", "--json"]) == 0
    assert main(["memory", "llama-3.1-8b", "--num-gpus", "8", "--framework-version", "0.12"]) == 2


def test_render_resolves_its_version_option_through_the_same_resolver():
    fields = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, global_batch_size=64)
    assert api.render_config("torchtitan", parse_request(fields), version="0.2.0").version == "0.2.2"
    with pytest.raises(MeshplanError, match="estimates but writes no config for"):
        api.render_config("torchtitan", parse_request(fields), version="0.1.3")


def test_render_writes_the_release_the_request_names():
    fields = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, global_batch_size=64)
    old = api.render_config("torchtitan", parse_request(dict(fields, framework_version="0.2")))
    new = api.render_config("torchtitan", parse_request(fields))
    assert (old.version, old.format) == ("0.2.2", "toml") and (new.version, new.format) == ("0.3.0", "shell")


def test_a_render_version_is_the_release_the_layout_is_checked_at():
    """render's version option wrote a torchtitan 0.2 config for a layout checked at 0.3.0's chunked loss: Llama-3.1-8B
    at micro-batch 2 and 5,120 tokens fits at 0.3 (74 GiB allocated) and not at 0.2 (86 GiB), and was rendered. The
    version is the request's framework_version now, so the same refusal as framework_version="0.2"; two versions
    naming different releases are an error."""
    from meshplan.adapters.render import RefusedLayout

    fields = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, micro_batch_size=2, seq_length=5120,
                  global_batch_size=128)
    assert api.render_config("torchtitan", parse_request(fields)).version == "0.3.0"
    with pytest.raises(RefusedLayout, match="MEM001"):
        api.render_config("torchtitan", parse_request(fields), version="0.2")
    with pytest.raises(RefusedLayout, match="MEM001"):
        api.render_config("torchtitan", parse_request(dict(fields, framework_version="0.2")))
    with pytest.raises(MeshplanError, match=r"framework_version '0.3' \(release 0.3.0\) and the render version '0.2'"):
        api.render_config("torchtitan", parse_request(dict(fields, framework_version="0.3")), version="0.2")
    small = dict(fields, micro_batch_size=1)
    assert api.render_config("torchtitan", parse_request(dict(small, framework_version="0.2.2")),
                             version="0.2").version == "0.2.2"


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_torchtitan_0_2_llama4_renders_its_flavor_and_reads_back_to_the_same_plan(precision):
    """torchtitan 0.2.2's TOML names the model by [model] name and flavor; render wrote neither for Llama 4 (its 0.3
    registry has no llama4), so import could not say which model the file trains. It writes llama4 / 17bx16e_irope
    (the iRoPE flavor: the chunked model meshplan estimates; card flavors), in the one [model] table fp8's converters
    share, and import reads it back to the same plan."""
    import tomllib

    from meshplan.request.resolve import resolve

    fields = dict(model="llama-4-scout", framework="torchtitan", framework_version="0.2.2", gpu="h200", num_gpus=64,
                  ep=8, recompute="full", precision=precision)
    out = api.render_config("torchtitan", parse_request(fields))
    model = tomllib.loads(out.text)["model"]
    assert (model["name"], model["flavor"]) == ("llama4", "17bx16e_irope")
    imported = api.import_config(out.text, path="torchtitan_job.toml")
    assert imported.request["model"] == "llama-4-scout"
    back = api.request_from_config(imported, {"num_gpus": 64, "gpu": "h200", "framework_version": "0.2.2",
                                              "precision": precision})
    planned = resolve(parse_request(fields))[1]
    if precision == "fp8":  # render writes the card's default recipe (recipe_name), which import reads back
        assert imported.request["fp8_recipe"] == framework_card("torchtitan").defaults.fp8_recipe == "rowwise"
        planned = planned.model_copy(update={"fp8_recipe": "rowwise"})
    assert resolve(back)[1] == planned


@pytest.mark.parametrize(("model", "name", "flavor", "extra"), [
    ("llama-3.1-8b", "llama3", "8B", {}),
    ("qwen3-30b-a3b", "qwen3", "30B-A3B", {"ep": 8}),
    ("deepseek-v3", "deepseek_v3", "671B", {"ep": 8, "num_gpus": 256}),
])
def test_torchtitan_0_2_names_every_catalog_model_it_has_and_reads_it_back(model, name, flavor, extra):
    """A 0.2.x TOML with no [model] trains JobConfig's default, llama3 debugmodel (v0.2.2 config/job_config.py
    Model): render wrote [model] for Llama 4 only, so a Llama-3.1-8B or Qwen3 plan rendered for 0.2.2 trained a
    debug model. Now every model 0.2.2 has is named by its module and flavor (card flavors), and import reads the
    file back to the catalog model (Qwen3's 30B-A3B never matched the 0.3 registry's qwen3_30b_a3b)."""
    import tomllib

    fields = dict(model=model, framework="torchtitan", framework_version="0.2.2", gpu="h200", num_gpus=64,
                  recompute="full") | extra
    out = api.render_config("torchtitan", parse_request(fields))
    table = tomllib.loads(out.text)["model"]
    assert (table["name"], table["flavor"]) == (name, flavor)
    assert api.import_config(out.text, path="torchtitan_job.toml").request["model"] == model


def test_torchtitan_0_2_warns_for_a_model_it_has_no_flavor_for():
    out = api.render_config("torchtitan", parse_request(dict(
        model="moonlight-16b-a3b", framework="torchtitan", framework_version="0.2.2", gpu="h200", num_gpus=16,
        recompute="full")))
    assert "[model]" not in out.text
    assert any("flavor debugmodel" in w for w in out.warnings)
