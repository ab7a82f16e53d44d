"""What a user meets reading their own configs through the faces (meshplan import, check --config, compare --config):
a YAML file that is no mapping is named as what it is, not called an AutoModel recipe."""

import pytest

from meshplan.faces.cli import main

NOT_MAPPINGS = [("- a\n- b\n", "the YAML is a list (2 items)"), ("just a string\n", "the YAML is a single value"),
                ("# nothing yet\n", "the YAML holds no document")]


@pytest.mark.parametrize(("text", "said"), NOT_MAPPINGS)
@pytest.mark.parametrize("face", ["import", "check", "compare"])
def test_a_yaml_that_is_no_mapping_says_what_it_is(tmp_path, capsys, text, said, face):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    log = tmp_path / "run.log"
    log.write_text("step 1\n")
    args = {"import": ["import", str(path)], "check": ["check", "--config", str(path)],
            "compare": ["compare", "--config", str(path), "--log", str(log)]}[face]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert said in err and "not a mapping" in err and "Traceback" not in err
    assert "an AutoModel recipe is" not in err  # no framework was named: not called an AutoModel recipe
    assert "NeMo AutoModel recipe" in err and "verl's SFT trainer config" in err  # what meshplan reads from YAML


def test_a_named_framework_keeps_its_own_words(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("- a\n")
    assert main(["import", str(path), "--framework", "nemo-automodel"]) == 2
    err = capsys.readouterr().err
    assert "the YAML is a list (1 item)" in err and "an AutoModel recipe is a YAML mapping" in err
