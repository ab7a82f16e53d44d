"""torchtitan's Python job configs (the config_registry.py generation), read with ast and never run: the upstream
registry kept verbatim in tests/configs/ (SOURCES.txt), its functions picked by FILE.py:NAME, derived configs
followed to their base, and this generation's renamed keys carried over to the request."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError

REGISTRY = Path(__file__).resolve().parent / "configs" / "torchtitan_llama3_config_registry.py"


@pytest.mark.parametrize(("function", "fields"), [
    # training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=8 * 8192, max_context_length=8192),
    # parallelism=ParallelismConfig(tensor_parallel_degree=8), activation_checkpoint=FullAC.Config()
    ("llama3_70b", {"model": "llama-3.1-70b", "tp": 8, "recompute": "full", "seq_length": 8192,
                    "micro_batch_size": 8}),
    # 2 * 8192 tokens per micro-batch, Float8 converters, CompileConfig(enable=True, enable_async_tensor_parallel)
    ("llama3_405b", {"model": "llama-3.1-405b", "tp": 8, "micro_batch_size": 2, "precision": "fp8",
                     "torch_compile": True, "tp_comm_overlap": True}),
    # config = llama3_8b(); config.compile = CompileConfig(enable=True, ...); MXFP8 converters
    ("llama3_8b_mxfp8", {"model": "llama-3.1-8b", "recompute": "selective", "seq_length": 8192,
                         "micro_batch_size": 1, "torch_compile": True, "precision": "fp8", "fp8_recipe": "mxfp8"}),
])
def test_registry_function_states_its_fields(function, fields):
    result = api.import_file(f"{REGISTRY}:{function}")
    assert result.framework == "torchtitan"
    for name, value in fields.items():
        assert result.request.get(name) == value, (name, result.sources.get(name))
    assert result.sources["tp" if "tp" in fields else "seq_length"].startswith(str(REGISTRY))
    assert any("num_gpus" in u for u in result.unresolved)  # a job config says nothing of the GPU count


def test_derived_function_is_said_and_the_others_listed():
    result = api.import_file(f"{REGISTRY}:llama3_8b_mxfp8")
    assert any("derived from llama3_8b()" in n and "llama3_70b" in n for n in result.notes)


def test_without_a_name_the_first_builder_is_read_and_a_debug_model_is_unresolved():
    result = api.import_config(REGISTRY.read_text(encoding="utf-8"), path="registry.py")
    assert result.framework == "torchtitan" and result.request["seq_length"] == 2048
    assert any("llama3_debugmodel is not in meshplan's catalog" in u for u in result.unresolved)


def test_unknown_function_and_bad_python():
    with pytest.raises(MeshplanError, match="no config function 'llama3_7b'"):
        api.import_file(f"{REGISTRY}:llama3_7b")
    with pytest.raises(MeshplanError, match=r"registry.py:2: not Python"):
        api.import_config("def f() -> Trainer.Config:\n    return Trainer.Config(\n", path="registry.py")


def test_never_run(tmp_path):
    marker = tmp_path / "ran"
    text = (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
            "def cfg() -> Trainer.Config:\n    return Trainer.Config(parallelism=ParallelismConfig("
            "tensor_parallel_degree=2))\n")
    result = api.import_config(text, framework="torchtitan")
    assert result.request["tp"] == 2 and not marker.exists()


def test_check_with_the_registry_config():
    imported = api.import_file(f"{REGISTRY}:llama3_70b")
    report = api.check_config(api.request_from_config(imported, {"num_gpus": 64, "gpu": "h100"}), config=imported)
    assert report.framework == "torchtitan" and report.plan.tp == 8


def test_fixes_are_written_as_attributes_of_the_config():
    from meshplan.adapters.read.fixes import file_change

    imported = api.import_file(f"{REGISTRY}:llama3_70b")
    line = int(imported.sources["tp"].split(":")[1].split()[0])
    assert file_change(imported, "tp", 4).text == f"config.parallelism.tensor_parallel_degree = 4  # line {line}, was 8"
    assert file_change(imported, "pp", 2).text == "config.parallelism.pipeline_parallel_degree = 2"
    assert file_change(imported, "recompute", "selective").text == "config.activation_checkpoint = SelectiveAC.Config()"
