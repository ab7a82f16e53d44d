"""`meshplan check` end to end: exit status, --json, --batch."""

from __future__ import annotations

import json

import pytest

from meshplan.faces.cli import main


def test_check_exit_status_and_json(capsys):
    assert main(["check", "llama-3.1-8b", "--num-gpus", "8", "--tp", "3", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["framework"] == "megatron-core"
    found = {f["id"]: f for f in out["findings"]}
    assert found["TP001"]["fix"] == "tp in {1, 2, 4, 8} works."
    assert {"id", "severity", "message", "fix", "source"} <= set(found["TP001"])

    assert main(["check", "mixtral-8x7b", "--num-gpus", "64", "--pp", "4", "--ep", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["memory"]["fits"] is True


def test_check_table_output(capsys):
    assert main(["check", "llama-3.1-8b", "--num-gpus", "8", "--tp", "3"]) == 1
    text = capsys.readouterr().out
    assert "TP001" in text and "errors found" in text


def test_check_uneven_split_flags(capsys):
    args = ["check", "kimi-k2", "--num-gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "32", "--json"]
    main(args)
    assert "PP001" in {f["id"] for f in json.loads(capsys.readouterr().out)["findings"]}
    main([*args, "--first-stage-layers", "3", "--last-stage-layers", "2"])
    ids = {f["id"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "PP001" not in ids and "PP004" not in ids


def test_check_batch(tmp_path, capsys):
    lines = [
        {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 3},
        "not json",
        {"model": "mixtral-8x7b", "num_gpus": 64, "pp": 4, "ep": 8, "framework": "megatron-bridge"},
        {"model": "llama-3.1-8b", "tp": -1},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    assert main(["check", "--batch", str(path)]) == 2  # lines 2 and 4 are bad requests
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in results] == [1, 2, 3, 4]
    assert results[0]["ok"] is False and "TP001" in {f["id"] for f in results[0]["findings"]}
    assert "error" in results[1] and "error" in results[3]
    assert results[2]["ok"] is True and results[2]["framework"] == "megatron-bridge"


def test_the_tp_fix_without_num_gpus_is_the_same_on_every_face(capsys):
    """num_gpus left out follows the layout, so TP001's fix lists the tps the heads take ({1, 2, 4, 8} inside an H100
    node), not the one value that divides the 3 GPUs tp=3 implied ({1}): CLI check and memory, the api."""
    from meshplan import api
    from meshplan.core.errors import MeshplanError
    from meshplan.schema.request import Request

    args = ["llama-3.1-70b", "--gpu", "h100", "--tp", "3"]
    assert main(["check", *args, "--json"]) == 1
    found = {f["id"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert found["TP001"]["fix"] == "tp in {1, 2, 4, 8} works."
    assert main(["memory", *args]) != 0
    assert "TP001: tp=3 does not divide 64 attention heads. Fix: tp in {1, 2, 4, 8} works." in capsys.readouterr().err
    req = Request(model="llama-3.1-70b", gpu="h100", tp=3)
    assert {f.id: f.fix for f in api.check_config(req).findings}["TP001"] == "tp in {1, 2, 4, 8} works."
    with pytest.raises(MeshplanError, match=r"Fix: tp in \{1, 2, 4, 8\} works"):
        api.estimate_memory(req)
