"""The report and the served page in a real browser: headless Chromium (Debian's `chromium`) loads each report and
the page, which must show their elements, log no console error and request nothing but themselves; the page works
end to end (form in, recommend's answer out, the same numbers as `meshplan recommend --json`).

Skipped when chromium is not installed, except under CI=true (.ci/run installs it), where that is a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from chromium_cdp import Browser, chromium_path
from report_cases import CASES, report_for
from tree_under_test import tree_env

from meshplan.faces.report import figures, render_html

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def browser():
    chromium_path()  # skip (or, under CI=true, fail) before starting anything
    b = Browser()
    yield b
    b.close()


def _count(browser: Browser, selector: str) -> int:
    return browser.evaluate(f"document.querySelectorAll({json.dumps(selector)}).length")


@pytest.mark.parametrize("name", list(CASES))
def test_each_report_loads_offline_with_its_elements(browser, name, tmp_path):
    report = report_for(name)
    path = tmp_path / f"{name}.html"
    path.write_text(render_html(report), encoding="utf-8")
    mark = len(browser.events)
    browser.load(path.as_uri())
    new = Browser.__new__(Browser)  # the events of this load only
    new.events = browser.events[mark:]
    assert new.requested_urls() == [path.as_uri()]  # nothing fetched beside the file itself
    assert new.console_errors() == []
    totals = browser.evaluate("[...document.querySelectorAll('rect.stage-bar')].map(r => +r.dataset.totalBytes)")
    assert totals == [s.total_bytes for s in report.memory.stages]  # one bar per stage, the JSON's bytes
    sections = browser.evaluate("[...document.querySelectorAll('section.figure')].map(s => s.dataset.figure)")
    assert sections == [f.id for f in figures(report)]
    for axis in report.axes:
        assert _count(browser, f'rect.rank[data-axis="{axis.name}"]') == min(report.world, 256)
    assert browser.evaluate("document.querySelector('svg#svg-memory').getBBox().width") > 100  # laid out, drawn
    shot = tmp_path / f"{name}.png"
    browser.screenshot(str(shot))
    assert shot.read_bytes().startswith(PNG) and shot.stat().st_size > 10_000


@pytest.fixture
def served(http_server):
    """The page at / of the shared HTTP server (tests/conftest.py), once chromium is known to be there."""
    chromium_path()
    return http_server.removesuffix("mcp")


def test_the_page_end_to_end_gives_the_cli_numbers(browser, served, tmp_path):
    mark = len(browser.events)
    browser.load(served)
    assert _count(browser, "form#ask select#model option") > 10 and _count(browser, "#answer") == 0
    fill = ("document.querySelector('#model').value = 'llama-3.1-8b';"
            "document.querySelector('#gpu').value = 'h100';"
            "document.querySelector('#num_gpus').value = '16';"
            "document.querySelector('#framework').value = 'megatron-core';"
            "document.querySelector('#seq_length').value = '8192';"
            "document.querySelector('#tp').value = '2';")
    browser.evaluate(fill)
    loaded = len(browser.events)
    browser.evaluate("document.querySelector('#go').click(); true")
    browser.wait_for("Page.loadEventFired", loaded)
    shown = json.loads(browser.evaluate("document.querySelector('#answer-json').textContent"))
    cli = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "recommend", "llama-3.1-8b", "--gpu", "h100",
                          "--num-gpus", "16", "--framework", "megatron-core", "--seq-length", "8192", "--tp", "2",
                          "--json"], capture_output=True, text=True, env=tree_env())
    assert shown == json.loads(cli.stdout)
    best = shown["candidates"][0]
    totals = browser.evaluate("[...document.querySelectorAll('rect.stage-bar')].map(r => +r.dataset.totalBytes)")
    assert max(totals) == best["memory"]["peak_bytes"]
    speeds = browser.evaluate("[...document.querySelectorAll('rect.speed')].map(r => +r.dataset.tokensPerSPerGpu)")
    assert speeds == pytest.approx([c["throughput"]["tokens_per_s_per_gpu"] for c in shown["candidates"]])
    page = Browser.__new__(Browser)
    page.events = browser.events[mark:]
    assert all(url.startswith(served) for url in page.requested_urls())  # the page and its form, nothing else
    assert page.console_errors() == []
    shot = tmp_path / "page.png"
    browser.screenshot(str(shot))
    assert shot.read_bytes().startswith(PNG)


def test_the_page_names_a_bad_request_instead_of_failing(browser, served):
    browser.load(served + "?model=no-such-model-xyz&num_gpus=8")
    error = browser.evaluate("document.querySelector('#error').textContent")
    assert "no-such-model-xyz" in error and "Traceback" not in error
