"""The plan report (meshplan/faces/report/): its pictures hold the api's numbers, one shape per thing drawn, nothing
fetched from outside; the CLI, the MCP tool and the web page all draw from the same calls."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import re
from html import unescape
from html.parser import HTMLParser

import anyio
import pytest
from mcp import Client
from report_cases import CASES, report_for

from meshplan import api
from meshplan.arithmetic.pipeline_timeline import V_ORDERS, rank_actions, shape_for, simulate, timed_actions
from meshplan.faces.cli import main
from meshplan.faces.report import figures, gather, render_html
from meshplan.faces.report.figures import rl_figure, stage_parts
from meshplan.faces.report.figures_layout import (
    MAX_LISTED_RANKS,
    drawn_microbatches,
    drawn_ranks,
    mesh_figure,
    schedule_figure,
    schedule_shape,
)
from meshplan.request.parse import parse_request


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


def test_the_limit_labels_are_drawn_over_the_bars_with_a_halo():
    """A stage bar reaching the right edge hid the headroom line's label (DeepSeek-V3 PP16: the last bars end under
    it): the capacity and headroom labels come after every bar in the picture's order, with svg.css's halo."""
    report = report_for("dense_pp_vpp")
    memory = next(f for f in figures(report) if f.id == "memory")
    kinds = [(shape.kind, shape.css) for shape in memory.shapes]
    labels = [i for i, (kind, css) in enumerate(kinds) if kind == "text" and "limit-label" in css.split()]
    bars = [i for i, (kind, css) in enumerate(kinds) if kind == "rect" and "stage-bar" in css.split()]
    assert len(labels) == 2 and bars and min(labels) > max(bars)
    assert [memory.shapes[i].text.split()[0] for i in labels] == ["capacity", "headroom"]
    assert "text.limit-label { paint-order: stroke;" in render_html(report)


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


def test_a_large_group_0_is_listed_by_its_ends():
    """The mesh table listed every rank of group 0: recommend llama-3.1-8b on 100,000,000 GPUs on the page wrote DP
    group 0's 390,625 ranks into one cell (a 4.4 MB page); 8,192 GPUs at TP1 wrote 8,192 numbers. A long group is
    its first ranks, an ellipsis, its last rank and its size."""
    report = gather(parse_request({"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8192}))
    figure = mesh_figure(report)
    assert figure is not None
    row = next(r for r in figure.tables[0].rows if r[0] == "DP")
    dp = next(a for a in report.axes if a.name == "DP")
    assert row[-1] == " ".join(map(str, dp.members(0)[:MAX_LISTED_RANKS])) + " … 8191 (8,192 ranks)"
    small = report_for("dense_pp_vpp")
    listed = mesh_figure(small).tables[0].rows
    assert [r[-1] for r in listed] == [" ".join(map(str, a.members(0))) for a in small.axes]  # short: every rank


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


ORDERS = ["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev",
          "combined_1f1b"]


def _shapes():
    """Every order the replay knows over small pipelines, m < p, m not a multiple of p, several chunks."""
    for order, (pp, vpp, m) in itertools.product(ORDERS, itertools.product((2, 3, 4), (1, 2, 3), (1, 3, 4, 8, 9))):
        if (order in V_ORDERS) != (vpp == 2 and order in V_ORDERS) or (order == "dualpipev" and m < 2 * pp):
            continue
        yield shape_for(order, "pp", pp, vpp, m)


def test_the_picture_s_timeline_is_the_estimate_s_step_for_every_order():
    """timed_actions (what the picture draws) runs each rank's rank_actions in order, every op once, and ends when
    simulate's step ends (what the throughput estimate prices), whatever the op times."""
    seen = set()
    for shape in _shapes():
        p = shape.pp
        fwd, bwd, wgrad = [1.0 + 0.1 * r for r in range(p)], [2.0 + 0.05 * r for r in range(p)], [0.8] * p
        try:
            step = simulate(shape, fwd, bwd, 0.05, wgrad).seconds
        except AssertionError:  # an order the replay itself cannot run: the picture refuses it the same way
            with pytest.raises(AssertionError, match="deadlocks"):
                timed_actions(shape, fwd, bwd, 0.05, wgrad)
            continue
        ranks = timed_actions(shape, fwd, bwd, 0.05, wgrad)
        for r, timed in enumerate(ranks):
            assert tuple(t.action for t in timed) == rank_actions(shape, r)
            assert all(b.start >= a.end - 1e-12 for a, b in itertools.pairwise(timed))  # one op at a time
        end = max(t.end for timed in ranks for t in timed)
        assert end == pytest.approx(step, rel=1e-12), shape
        seen.add(shape.order)
    assert seen == set(ORDERS)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 1, 8), (4, 2, 8), (2, 1, 1), (4, 3, 4), (4, 2, 3)])
def test_the_megatron_schedule_runs_every_operation_once_with_the_textbook_bubble(pp, vpp, m):
    shape = shape_for("1f1b", "pp", pp, vpp, m)
    ranks = timed_actions(shape, [1.0] * pp, [2.0] * pp)
    ops = [(r, t.action.kind, t.action.chunk, t.action.mb) for r, timed in enumerate(ranks) for t in timed]
    assert len(ops) == len(set(ops)) == 2 * pp * vpp * m
    if m % pp == 0:  # Megatron's bubble: (pp - 1) x (forward + backward) of a whole rank, over vpp
        assert max(t.end for timed in ranks for t in timed) == 3 * m * vpp + 3 * (pp - 1)


@pytest.mark.parametrize(("schedule", "vpp"), [(None, 2), (None, 1), ("gpipe", 1), ("zero_bubble", 2),
                                               ("zero_bubble", 3), ("dualpipev", 2), ("combined_1f1b", 2)])
def test_the_schedule_picture_draws_the_plan_s_schedule_as_the_timeline_replays_it(schedule, vpp):
    report = report_for("dense_pp_vpp")
    plan = report.plan.model_copy(update={"pipeline_schedule": schedule, "vpp": vpp})
    report = dataclasses.replace(report, plan=plan)
    drawn = drawn_microbatches(plan.pp, plan.vpp, report.microbatches)
    shape = schedule_shape(report, drawn)
    assert shape.vpp == vpp and shape.microbatches == drawn
    figure = schedule_figure(report)
    slots = [s for s in figure.shapes if s.css.startswith("slot ")]
    split = any(a.kind == "W" for r in range(plan.pp) for a in rank_actions(shape, r))
    expected = timed_actions(shape, [1.0] * plan.pp, [2.0] * plan.pp, 0.0, [1.0 if split else 0.0] * plan.pp)
    for rank in range(plan.pp):
        drawn_ops = [(s.data["kind"], s.data["chunk"], s.data["microbatch"], s.data["start"]) for s in slots
                     if s.data["rank"] == str(rank)]
        assert drawn_ops == [(t.action.kind, str(t.action.chunk), str(t.action.mb), str(round(t.start, 6)))
                             for t in expected[rank]]
    kinds = {s.data["kind"] for s in slots}
    assert kinds == ({"F", "I", "W"} | ({"B"} if shape.order == "dualpipev" else set()) if split else {"F", "B"})


def test_rl_phases_are_drawn_with_their_memory():
    report = report_for("rl")
    dom = Elements(render_html(report))
    drawn = {p["data-phase"]: int(p["data-peak-bytes"]) for p in dom.having("rect", "rl-phase")}
    for phase in report.memory.phases:
        if phase.phase in drawn:
            assert drawn[phase.phase] == phase.peak_bytes
    assert {"rollout", "log_prob", "actor_update"} <= set(drawn)


def test_each_candidate_s_bars_carry_their_values():
    """The candidates picture had two unlabelled bars per layout (its numbers only in the table beside it): each
    bar now shows its tokens/s per GPU and its peak GiB, the candidate's own figures."""
    report = report_for("recommend")
    picture = next(f for f in figures(report) if f.id == "candidates")
    values = [shape.text for shape in picture.shapes if shape.kind == "text" and "bar-value" in shape.css.split()]
    expected = []
    for c in report.recommendation.candidates:
        expected += [f"{c.throughput.tokens_per_s_per_gpu:,.0f}", f"{c.memory.peak_bytes / 2**30:,.1f} GiB"]
    assert values == expected


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
    capacity = rec.closest[0].memory.capacity_bytes  # a bar cut at 1.2 x capacity says how far over it goes
    clipped = re.findall(r'<text class="tick clipped"[^>]*>([^<]*)</text>', render_html(report))
    assert clipped == [f"{p / capacity:.1f}× capacity" for p in expected if p > 1.2 * capacity] and clipped
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


def test_cli_refuses_a_report_path_it_cannot_write_before_the_search(tmp_path, capsys, monkeypatch):
    """--html naming a folder raised a bare '[Errno 21] Is a directory' after the search; each bad path is named,
    with what works, before anything is computed."""
    from meshplan.faces import report

    monkeypatch.setattr(report, "gather", lambda *a, **k: pytest.fail("searched before the path was checked"))
    (tmp_path / "file.svg").write_text("")
    for flags, said in ((["--html", str(tmp_path)], "is a folder"),
                        (["--html", str(tmp_path / "no" / "r.html")], "which is not an existing folder"),
                        (["--svg", str(tmp_path / "file.svg")], "is a file, not a folder")):
        assert main(["report", "llama-3.1-8b", "--num-gpus", "8", *flags]) == 2
        err = capsys.readouterr().err
        assert said in err and "Fix: Pass --" in err and "Errno" not in err


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


def test_the_page_answers_head_as_get_without_a_body():
    """`meshplan serve --http` answered HEAD / with 405 (allow: GET, POST): monitoring and link checkers send HEAD.
    It answers as GET does (status, headers, the Content-Length of GET's page) and sends no body."""
    from meshplan.faces.mcp.server import transport_security
    from meshplan.faces.report.page import PageRouter

    async def fallback(scope, receive, send):
        raise AssertionError("only / is the page's")

    router = PageRouter(fallback, transport_security("127.0.0.1"))

    async def ask(method: str) -> tuple[dict, bytes]:
        sent: list[dict] = []
        scope = {"type": "http", "method": method, "path": "/", "query_string": b"", "headers":
                 [(b"host", b"127.0.0.1:8765")], "scheme": "http", "server": ("127.0.0.1", 8765), "root_path": ""}

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        await router(scope, receive, send)
        return sent[0], b"".join(m.get("body", b"") for m in sent[1:])

    (get, page), (head, none) = anyio.run(ask, "GET"), anyio.run(ask, "HEAD")
    assert head["status"] == get["status"] == 200 and none == b"" and page.startswith(b"<!")
    assert dict(head["headers"])[b"content-length"] == str(len(page)).encode()
    assert dict(head["headers"]) == dict(get["headers"])
    assert anyio.run(ask, "PUT")[0]["status"] == 405


def test_the_page_names_a_pasted_config_json_not_its_temporary_file():
    """A config.json pasted into the page was named by the temporary file it was written to
    ('/tmp/meshplan-page-o4xuhe4q/config.json with TP1 PP1 DP8'), in the report, the JSON and its errors."""
    from meshplan.faces.report.page import PASTED, answer

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
              "intermediate_size": 8192, "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 8,
              "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
              "tie_word_embeddings": False, "hidden_act": "silu"}
    body, shown, error = answer({"config": json.dumps(config), "num_gpus": "8", "gpu": "h100"})
    assert not error and f"{PASTED} with TP" in body and json.loads(shown)["model"] == PASTED
    assert "meshplan-page-" not in body + shown
    _, _, error = answer({"config": "{not json", "num_gpus": "8"})
    assert error.startswith(f"'{PASTED}' is not valid JSON") and "meshplan-page-" not in error


def test_the_page_says_a_negative_gpu_count_is_below_one_not_no_integer():
    """The form's GPUs '-8' answered 'num_gpus: Input should be a valid integer (got '-8')': the page turned only
    digit strings into numbers, so a signed count reached the parser as text. It is a whole number below 1."""
    from meshplan.faces.report.page import answer

    _, _, error = answer({"model": "llama-3.1-8b", "num_gpus": "-8", "gpu": "h100"})
    assert "greater than or equal to 1" in error and "valid integer" not in error
    _, _, error = answer({"model": "llama-3.1-8b", "num_gpus": "eight", "gpu": "h100"})
    assert "valid integer (got 'eight')" in error


def test_a_requested_schedule_is_drawn_from_the_request_through_the_api():
    """pipeline_schedule=zero_bubble on torchtitan (ZBV at two chunks per rank): the report drawn from the request
    shows each rank's F, I and W in the V placement, where the timeline the throughput estimate prices puts them."""
    report = gather(parse_request({"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 16, "framework": "torchtitan",
                                   "tp": 2, "pp": 4, "global_batch_size": 32, "micro_batch_size": 1,
                                   "pipeline_schedule": "zero_bubble"}))
    assert report.plan.pipeline_schedule == "zero_bubble" and report.throughput is not None
    shape = schedule_shape(report, drawn_microbatches(report.plan.pp, report.plan.vpp, report.microbatches))
    assert shape.order == "zbv_zero_bubble"
    dom = Elements(render_html(report))
    slots = dom.having("rect", "slot")
    assert {s["data-kind"] for s in slots} == {"F", "I", "W"}
    assert {(s["data-rank"], s["data-stage"]) for s in slots} == {(str(r), str(st)) for r in range(4)
                                                                 for st in (r, 7 - r)}  # the V: stages r, 2p-1-r
    assert "ZBV zero-bubble" in render_html(report)


@pytest.mark.parametrize("query", ["model=llama-3.1-8b&gpu=h100&num_gpus=8%00",
                                   "model=llama-3.1-8b&gpu=h100&num_gpus=8%1b%5B2J",
                                   "config=%7B%00%7D&gpu=h100&num_gpus=8", "model=llama-3.1-8b&gpu=h1%7F00&num_gpus=8"])
def test_the_page_refuses_control_characters_and_echoes_none(query):
    """`meshplan serve --http`'s page echoed a NUL, an escape or DEL from a form field back into the page (the
    num_gpus input's value, the pasted config.json's textarea): each is refused, naming the field, its code point and
    place, and the form comes back without it."""
    from urllib.parse import parse_qs

    from meshplan.faces.report.page import _form_values, page

    html = page(_form_values(parse_qs(query)))
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", html)
    error = unescape(re.search(r'<p class="error" id="error">(.*?)</p>', html, re.S).group(1))
    assert re.search(r"The form's (num_gpus|config|gpu) holds U\+00(00|1B|7F) at character \d+: a field is text "
                     r"without control characters", error), error


@pytest.mark.parametrize("form, request_fields", [
    ({"seq_length": "8192", "global_batch_size": "64", "tp": "2", "precision": "fp8"},
     {"seq_length": 8192, "global_batch_size": 64, "tp": 2, "precision": "fp8"}),
    ({"pp": "2", "cp": "2", "job": "sft"}, {"pp": 2, "cp": 2, "job": "sft"}),
])
def test_the_page_s_other_fields_ask_what_the_api_answers(form, request_fields):
    """The page took model, GPU, count and framework only, so a browser could not ask at another sequence length or
    batch, in fp8, or with a degree held: its other fields are the request's, and its answer recommend's for them."""
    import json

    from meshplan import api
    from meshplan.faces.report.page import answer
    from meshplan.schema.request import Request

    base = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": "16"}
    _, shown, error = answer({**base, **form})
    assert not error
    expected = api.recommend(Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, **request_fields))
    assert json.loads(shown) == json.loads(expected.model_dump_json())
    plan = expected.candidates[0].plan
    assert all(getattr(plan, k) == v for k, v in request_fields.items() if k in ("tp", "pp", "cp"))


def test_the_report_estimates_its_memory_once_and_warns_from_it(monkeypatch):
    """gather drew api.estimate_memory, then api.estimate_throughput estimated the same memory again for its unfit
    warning (api._warn_unfit). One estimate now serves both (api.memory_and_throughput), and the report's step time
    is estimate_throughput's, its warning included."""
    import meshplan.rl.memory as rl_memory

    req = parse_request({"model": "llama-3.1-70b", "gpu": "h100", "num_gpus": 8})  # does not fit: warned
    estimated = []
    job_memory = rl_memory.job_memory
    monkeypatch.setattr(rl_memory, "job_memory", lambda job, plan: estimated.append(plan) or job_memory(job, plan))
    report = gather(req)
    assert len(estimated) == 1
    assert report.throughput == api.estimate_throughput(req)
    assert report.throughput.warnings[0].startswith("This layout does not fit")
    assert report.memory == api.estimate_memory(req)


def test_an_rl_step_on_a_separate_pool_says_its_drawn_parts_overlap():
    """The RL picture lays the parts end to end; on a separate pool generation overlaps the training side, so the
    drawn width passes the step its caption names (sweep40: 3.78 s of parts under 'One RL step (2.459 s)'): the
    figure's notes say so, in RLStepTime.overlap_words' words; colocated, the parts are the step and nothing is said."""
    base = {"model": "qwen3-8b", "gpu": "h100", "framework": "verl", "job": "rl", "prompts_per_step": 16,
            "response_length": 512, "pp": 2}
    apart = gather(parse_request({**base, "placement": "separate", "rollout_gpus": 4, "num_gpus": 6}))
    picture = rl_figure(apart.memory, apart.throughput)
    assert apart.throughput.rl.overlap_words() in picture.notes
    together = gather(parse_request({**base, "num_gpus": 2}))
    assert not any("more than the step" in n for n in rl_figure(together.memory, together.throughput).notes)


def test_rl_candidates_name_their_rollout_and_no_split_that_tells_nothing_apart():
    """Qwen2.5-7B on 8 H100 with verl: recommend's #1 and #5 differ only in the rollout TP (2, 4); the page's plan
    cells read 'TP1 PP1 DP8 the even split' for both (check/split.layout_cells added the split, the same one, where
    rows read alike) and named no rollout. Each RL row now carries its rollout engine and offloads, and a split is
    added only where it differs between rows that read alike."""
    from meshplan.check.split import layout_cells
    from meshplan.faces.report.figures_layout import candidates_figure
    from meshplan.schema.plan import Plan

    a, b = Plan(tp=1, pp=1, dp=8, rollout_engine="vllm", rollout_tp=2), Plan(tp=1, pp=1, dp=8, rollout_engine="vllm",
                                                                              rollout_tp=4)
    assert layout_cells([a, b]) == ["TP1 PP1 DP8", "TP1 PP1 DP8"]
    rec = gather(parse_request({"model": "qwen2.5-7b", "framework": "verl", "job": "rl", "num_gpus": 8}),
                 recommend=True).recommendation
    cells = [row[1] for row in candidates_figure(rec).tables[0].rows]
    assert not any("the even split" in cell for cell in cells)
    for cell, c in zip(cells, rec.candidates, strict=False):
        assert f"rollout vllm TP{c.plan.rollout_tp} DP{c.plan.rollout_dp} at {c.plan.rollout_memory_fraction:g}" in cell
