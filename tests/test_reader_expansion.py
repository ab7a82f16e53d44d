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
