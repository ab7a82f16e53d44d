"""An RL recommend's rows carry the error band estimate_throughput gives the same job and plan (the RL regime's,
cards/accuracy.yaml), and every face says it. Before: each RL candidate's band was None, so the CLI's RL table printed
no 'error of #1' line, MCP's summary no band and the rationale no 'How sure', though `meshplan throughput` for the #1
plan gave one."""

from __future__ import annotations

from meshplan import api
from meshplan.faces.cli import main
from meshplan.faces.mcp import tools
from meshplan.schema.reports import peak_words
from meshplan.schema.request import Request

RL = dict(model="qwen3-8b", framework="verl", job="rl", num_gpus=8, gpu="h100")


def test_each_rl_row_has_the_band_estimate_throughput_gives_its_plan():
    rec = api.recommend(Request(**RL), top_k=2)
    assert rec.candidates
    for cand in rec.candidates:
        fields = {k: v for k, v in cand.plan.model_dump().items() if k not in ("dp", "rollout_gpus")}
        alone = api.estimate_throughput(Request(**{**RL, **fields}))
        assert alone.error_band is not None
        assert cand.throughput.error_band == alone.error_band
        assert f"How sure: {alone.error_band.text}" in cand.rationale
        assert f"peaks at {peak_words(cand.memory)}" in cand.rationale  # the peak named as every answer names it


def test_every_face_says_how_sure_the_rl_pick_is(capsys):
    rec = api.recommend(Request(**RL), top_k=1)
    band = rec.candidates[0].throughput.error_band
    assert main(["recommend", "qwen3-8b", "--framework", "verl", "--job", "rl", "--num-gpus", "8", "--gpu", "h100",
                 "--top-k", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"error of #1: {band.text}" in out
    summary = tools.recommend_parallelism(model="qwen3-8b", framework="verl", job="rl", num_gpus=8, gpu="h100",
                                          top_k=1).summary
    assert band.text in summary
