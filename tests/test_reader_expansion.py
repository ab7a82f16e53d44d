"""A configuration whose text is small but expands without end is refused with its line, not read for hours: a shell
variable or array built from itself line after line doubles at each (forty lines held 7 GB and ran past a minute
before the bound), as do YAML aliases of aliases (the "billion laughs"). The bound is a configuration's own size,
MAX_CONFIG_CHARS, so no real launch script or recipe meets it."""

from __future__ import annotations

import time

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main

LAUNCH = "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096"
DOUBLED_VARIABLE = "X=aaaaaaaaaaaaaaaa\n" + 'X="$X$X"\n' * 40 + LAUNCH + " --foo $X\n"
DOUBLED_ARRAY = "A=(1)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40 + LAUNCH + ' "${A[@]}"\n'


@pytest.mark.parametrize(("text", "line", "name"), [(DOUBLED_VARIABLE, 17, "X"), (DOUBLED_ARRAY, 19, "A")],
                         ids=["variable", "array"])
def test_a_script_whose_variables_double_on_themselves_is_refused_with_its_line(text, line, name):
    start = time.monotonic()
    with pytest.raises(MeshplanError, match=rf"run\.sh:{line}: the script's variables expand to more than "
                                            rf"1,048,576 characters \(here \${name}\)"):
        api.import_config(text, path="run.sh")
    assert time.monotonic() - start < 20


def test_a_script_using_its_variables_as_launch_scripts_do_is_read():
    text = ("ARGS=(--tensor-model-parallel-size 2)\nARGS+=(--pipeline-model-parallel-size 2)\n"
            'TP=${TP:-2}\nX="$TP $TP"\ntorchrun --nproc-per-node 8 pretrain_gpt.py "${ARGS[@]}" --seq-length 4096\n')
    assert api.import_config(text, path="run.sh").request["pp"] == 2


def test_the_cli_refuses_it_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "run.sh"
    path.write_text(DOUBLED_VARIABLE)
    assert main(["import", str(path)]) == 2
    err = capsys.readouterr().err
    assert "expand to more than 1,048,576 characters" in err and "Traceback" not in err


LAUGHS = 'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))
BILLION_LAUGHS = LAUGHS + "distributed:\n  tp_size: 2\nstep_scheduler:\n  global_batch_size: *i\n"
NESTED_LAUGHS = "m0: &m0 {x: 1, y: 2}\n" + "".join(
    f"m{k}: &m{k} {{p: *m{k - 1}, q: *m{k - 1}}}\n" for k in range(1, 31)) + "distributed:\n  tp_size: 2\n" \
    "step_scheduler:\n  global_batch_size: 32\n  extra: *m30\n"


@pytest.mark.parametrize(("text", "where"), [(BILLION_LAUGHS, "6 f"), (NESTED_LAUGHS, "18 m17.")],
                         ids=["sequence", "mapping"])
def test_yaml_aliases_of_aliases_are_refused_not_expanded(text, where):
    """9^9 scalars through nine aliases, 2^30 keys through thirty nested mappings: each was read for minutes. The
    first key whose value passes the bound is named (9^6 scalars of two characters each at `f`)."""
    start = time.monotonic()
    with pytest.raises(MeshplanError, match=rf"recipe\.yaml:{where}: the YAML's aliases expand to more than "
                                            r"1,048,576 characters"):
        api.import_config(text, path="recipe.yaml")
    assert time.monotonic() - start < 20


MERGED = """\
base: &base
  tp_size: 2
  pp_size: 2
distributed:
  <<: *base
  pp_size: 4
  dp_size: 2
step_scheduler:
  global_batch_size: 32
  local_batch_size: 2
"""


def test_a_yaml_merge_key_is_read_as_the_frameworks_loader_reads_it():
    """AutoModel's recipe (yaml.safe_load) and verl's SFT config (OmegaConf's SafeLoader) take `<<: *base` as base's
    keys, a key written beside it winning: read as a key named `<<` they were 'no meshplan field'."""
    imported = api.import_config(MERGED, path="recipe.yaml")
    assert (imported.request["tp"], imported.request["pp"]) == (2, 4)
    assert imported.sources["tp"] == "recipe.yaml:2 distributed.tp_size"
    assert not any("<<" in u for u in imported.unsupported)


def test_a_merge_of_no_mapping_is_refused_as_the_loader_refuses_it():
    with pytest.raises(MeshplanError, match=r"recipe\.yaml:2: `<<` merges a mapping or a list of mappings"):
        api.import_config("distributed:\n  <<: 3\n  tp_size: 2\nstep_scheduler:\n  global_batch_size: 32\n",
                          path="recipe.yaml")
