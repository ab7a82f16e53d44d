"""The plan report (meshplan/faces/report/): its pictures hold the api's numbers, one shape per thing drawn, nothing
fetched from outside; the CLI, the MCP tool and the web page all draw from the same calls."""

from __future__ import annotations

import base64
import json
import re
from html import unescape
from html.parser import HTMLParser

import anyio
import pytest
from mcp import Client
from report_cases import CASES, report_for

from meshplan import api
from meshplan.faces.cli import main
from meshplan.faces.report import figures, render_html
from meshplan.faces.report.figures import stage_parts
from meshplan.faces.report.mesh import drawn_ranks
from meshplan.faces.report.schedule import drawn_microbatches, simulate


class Elements(HTMLParser):
    """Every start tag with its attributes."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def having(self, tag: str, css: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and css in a.get("class", "").split()]


def assert_offline(html: str) -> None:
    """No script, nothing loaded from anywhere: the only URL is the SVG namespace."""
    assert "<script" not in html.lower()
    assert not re.search(r"\b(src|href)\s*=", html, re.I)
    assert "url(" not in html.replace("url(#bubble-hatch)", "")
    assert set(re.findall(r"https?://[^\s\"'<]+", html)) <= {"http://www.w3.org/2000/svg"}


@pytest.mark.parametrize("name", list(CASES))
def test_report_draws_the_api_numbers(name):
    report = report_for(name)
    html = render_html(report)
    assert_offline(html)
    dom = Elements(html)
    memory = api.estimate_memory(report.drawn)  # what `meshplan memory --json` answers for the plan drawn
    assert memory.model_dump() == report.memory.model_dump()
    bars = dom.having("rect", "stage-bar")
    assert [int(b["data-stage"]) for b in bars] == [s.stage for s in memory.stages]  # one bar per stage
    assert [int(b["data-total-bytes"]) for b in bars] == [s.total_bytes for s in memory.stages]
    for stage in memory.stages:
        parts = {p["data-part"]: int(p["data-bytes"]) for p in dom.having("rect", "seg")
                 if p["data-stage"] == str(stage.stage) and p["data-part"] != "host"}
        assert parts == {part: b for part, b in stage_parts(stage) if b > 0}
        assert sum(parts.values()) == stage.total_bytes
    assert f"{memory.peak_bytes:,} B" in html and f"{memory.capacity_bytes:,} B" in html  # the numbers beside
    assert dom.having("line", "headroom-line") and dom.having("line", "capacity")


@pytest.mark.parametrize("name", [n for n in CASES if n != "nothing_fits"])
def test_mesh_draws_every_group(name):
    report = report_for(name)
    dom = Elements(render_html(report))
    assert report.axes, "each of these plans has a parallel group"
    shown = drawn_ranks(report.world)
    for axis in report.axes:
        cells = [c for c in dom.having("rect", "rank") if c["data-axis"] == axis.name]
        assert len(cells) == shown
        groups = {int(c["data-group"]) for c in cells}
        assert len(groups) == shown // axis.size if shown == report.world else len(groups) >= 1
        for g in list(groups)[:4]:
            ranks = sorted(int(c["data-rank"]) for c in cells if c["data-group"] == str(g))
            assert ranks == [r for r in axis.members(g) if r < shown]


def test_the_groups_that_cross_the_network_are_marked():
    moe = report_for("moe_ep_across_nodes")
    crossing = {a.name: a.crosses_network for a in moe.axes}
    assert crossing["EP"] is True and crossing["PP"] is True  # 16 experts' ranks over two 8-GPU nodes
    cp = report_for("long_context_cp")
    assert {a.name: a.crosses_network for a in cp.axes} == {"CP": False, "DP": True}
    html = render_html(moe)
    assert html.count('class="network-link"') >= 1 and "EP: 2 groups of 16 (stride 1), crosses the network" in html


def test_the_schedule_has_every_forward_and_backward_and_the_bubble_in_seconds():
    report = report_for("dense_pp_vpp")
    plan = report.plan
    dom = Elements(render_html(report))
    drawn = drawn_microbatches(plan.pp, plan.vpp, report.microbatches)
    assert len(dom.having("rect", "fwd")) == len(dom.having("rect", "bwd")) == plan.pp * plan.vpp * drawn
    assert len(dom.having("rect", "bubble")) == plan.pp
    assert f"{report.throughput.breakdown.bubble_s:.4g} s" in render_html(report)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 1, 8), (4, 2, 8), (2, 1, 1), (4, 3, 4), (4, 2, 3)])
def test_the_schedule_runs_every_operation_once_with_the_textbook_bubble(pp, vpp, m):
    slots = simulate(pp, vpp, m)
    assert len(slots) == len({(s.rank, s.microbatch, s.chunk, s.backward) for s in slots}) == 2 * pp * vpp * m
    if m % pp == 0:  # Megatron's bubble: (pp - 1) x (forward + backward) of a whole rank, over vpp
        assert max(s.end for s in slots) == 3 * m * vpp + 3 * (pp - 1)


def test_rl_phases_are_drawn_with_their_memory():
    report = report_for("rl")
    dom = Elements(render_html(report))
    drawn = {p["data-phase"]: int(p["data-peak-bytes"]) for p in dom.having("rect", "rl-phase")}
    for phase in report.memory.phases:
        if phase.phase in drawn:
            assert drawn[phase.phase] == phase.peak_bytes
    assert {"rollout", "log_prob", "actor_update"} <= set(drawn)


def test_recommend_draws_the_candidates_and_the_first_one_in_full():
    report = report_for("recommend")
    rec = report.recommendation
    assert rec.candidates and report.plan == report.memory.plan
    assert report.memory.peak_bytes == rec.candidates[0].memory.peak_bytes  # redrawn through the api: same numbers
    dom = Elements(render_html(report))
    speeds = [float(r["data-tokens-per-s-per-gpu"]) for r in dom.having("rect", "speed")]
    assert speeds == [c.throughput.tokens_per_s_per_gpu for c in rec.candidates]
    html = render_html(report)
    assert all(c.rationale.replace("'", "&#39;")[:60] in html for c in rec.candidates)


def test_nothing_fits_shows_the_closest_misses():
    report = report_for("nothing_fits")
    rec = report.recommendation
    assert not rec.candidates and (rec.closest or rec.best_below_headroom)
    dom = Elements(render_html(report))
    peaks = [int(r["data-peak-bytes"]) for r in dom.having("rect", "near-miss") if "peak" in r["class"]]
    expected = ([rec.best_below_headroom.memory.peak_bytes] if rec.best_below_headroom else []) + \
        [m.memory.peak_bytes for m in rec.closest]
    assert peaks == expected
    if rec.min_gpus:
        assert f"The smallest GPU count that fits: {rec.min_gpus}." in render_html(report)


def test_cli_writes_the_html_and_one_svg_per_picture(tmp_path, capsys):
    args, _ = CASES["dense_pp_vpp"]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in args.items() if k != "model"]
    html, svgs = tmp_path / "r.html", tmp_path / "svg"
    assert main(["report", args["model"], *flags, "--html", str(html), "--svg", str(svgs)]) == 0
    assert html.read_text() == render_html(report_for("dense_pp_vpp"))
    assert sorted(p.stem for p in svgs.iterdir()) == sorted(f.id for f in figures(report_for("dense_pp_vpp")))
    for path in svgs.iterdir():
        assert_offline(path.read_text())
    assert main(["report", "llama-3.1-8b", "--num-gpus", "8"]) == 2
    assert "report needs somewhere to write" in capsys.readouterr().err


def test_mcp_render_report_gives_text_then_the_svg_then_the_html():
    from meshplan.faces.mcp.server import app

    async def call():
        async with Client(app) as client:
            return await client.call_tool("render_report", {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 2})

    result = anyio.run(call)
    assert not result.is_error
    text, image, resource = result.content
    assert text.type == "text" and "Llama-3.1-8B" in text.text
    assert image.type == "image" and image.mime_type == "image/svg+xml"
    assert base64.b64decode(image.data).decode().startswith("<svg")
    assert resource.type == "resource" and resource.resource.mime_type == "text/html"
    assert_offline(resource.resource.text)
    assert result.structured_content["figures"][:1] == ["memory"] and result.structured_content["plan"]["tp"] == 2


def test_the_page_answers_with_recommend_and_keeps_the_host_check():
    from meshplan.faces.mcp.server import transport_security
    from meshplan.faces.report.page import PageRouter

    async def fallback(scope, receive, send):
        raise AssertionError("only / is the page's")

    router = PageRouter(fallback, transport_security("127.0.0.1"))

    async def get(query: str, host: str = "127.0.0.1:8765") -> tuple[int, str]:
        sent: list[dict] = []
        scope = {"type": "http", "method": "GET", "path": "/", "query_string": query.encode(), "headers":
                 [(b"host", host.encode())], "scheme": "http", "server": ("127.0.0.1", 8765), "root_path": ""}

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        await router(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]).decode()

    status, html = anyio.run(get, "model=llama-3.1-8b&gpu=h100&num_gpus=16&framework=megatron-core")
    assert status == 200
    shown = json.loads(unescape(re.search(r'<pre class="answer" id="answer-json">(.*?)</pre>', html, re.S).group(1)))
    assert shown == json.loads(api.recommend(report_for("recommend").request).model_dump_json())
    assert anyio.run(get, "", "attacker.example:8765")[0] == 421
