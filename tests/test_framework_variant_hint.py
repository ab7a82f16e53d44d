"""A render variant's name given as the framework (megatron-deepspeed) is refused with the framework that renders it,
on the api and the CLI alike; a name that starts a framework's, or that two frameworks render, keeps the closest."""

from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main
from meshplan.request.parse import framework_variant_hint, parse_request

ASK = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8}


@pytest.mark.parametrize("given", ["megatron-deepspeed", "Megatron_DeepSpeed"])
def test_api_names_the_framework_that_renders_the_variant(given: str) -> None:
    with pytest.raises(MeshplanError) as err:
        parse_request({**ASK, "framework": given})
    assert "render variant of framework 'deepspeed'" in str(err.value)
    assert "framework='deepspeed'" in str(err.value)


def test_cli_says_the_same_with_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["memory", "llama-3.1-8b", "--framework", "megatron-deepspeed", "--gpu", "h100", "--num-gpus", "8"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "render variant of framework 'deepspeed'" in err and "--framework 'deepspeed'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("given", ["megatron", "fsdp", "verl", "torchtitan-x", 3])
def test_no_variant_hint_where_it_would_mislead(given: object) -> None:
    # 'megatron' starts megatron-core's name; 'fsdp' is a variant of both verl and skyrl
    assert framework_variant_hint(given) is None


def test_megatron_keeps_the_closest_framework() -> None:
    with pytest.raises(MeshplanError) as err:
        parse_request({**ASK, "framework": "megatron"})
    assert "Did you mean framework='megatron-" in str(err.value)
