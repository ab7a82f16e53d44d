"""What `meshplan import` made of the frameworks' own example and config files (bench/real_configs.py draws them from
the repositories): short excerpts in their formats under tests/data/real_configs/ (README.md there names each
original), each read as the file it imitates is, on the api and the CLI."""

from pathlib import Path

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main

DATA = Path(__file__).resolve().parent / "data" / "real_configs"


@pytest.mark.parametrize(("name", "found"), [("pyrightconfig.json", "typeCheckingMode"),
                                             ("golden_values.json", "lm loss, iteration-time")])
def test_a_json_with_no_deepspeed_key_is_refused_with_its_keys(name, found):
    with pytest.raises(MeshplanError) as err:
        api.import_file(str(DATA / name))
    said = str(err.value)
    assert "not a deepspeed ds_config" in said and found in said and "train_micro_batch_size_per_gpu" in said


def test_a_toml_of_no_job_sections_is_refused_not_read_as_torchtitan(capsys):
    assert main(["import", str(DATA / "pyproject.toml")]) == 2
    err = capsys.readouterr().err
    assert "not a torchtitan TOML job file" in err and "build-system, project, tool" in err
    assert "Traceback" not in err


def test_a_ds_config_with_one_known_key_is_still_read():
    imported = api.import_config('{"zero_optimization": {"stage": 2}}', config_format="json")
    assert imported.framework == "deepspeed" and imported.request["zero_stage"] == 2
