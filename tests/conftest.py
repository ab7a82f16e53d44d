"""Shared test set-up: tests import helpers (framework_packages) from this folder; the dev set's rows, read once;
the dataset tests' guard; the HTTP server the MCP transport tests and the browser tests talk to.

The dataset tests (marked `shared_data(path)`) read the shared validation set from ../shared beside the
checkout. Without it they fail, saying where it must be, unless MESHPLAN_NO_SHARED=1 says to skip them; under
CI=true a skipped dataset test fails the run all the same, so CI cannot pass without them."""

import os
import sys
from pathlib import Path

import pytest
import yaml

from meshplan.search.job_memo import forget_jobs

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parent.parent
# A user's stored cluster factors (meshplan compare --calibrate) must not move the suite's answers: calibration is
# off for every test and every process a test starts; tests/test_compare.py turns it on with its own file.
os.environ["MESHPLAN_CALIBRATION_FILE"] = ""
SHARED = REPO.parent / "shared"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def skip_allowed() -> bool:
    """MESHPLAN_NO_SHARED=1 lets the dataset tests skip, except under CI."""
    return os.environ.get("MESHPLAN_NO_SHARED") == "1" and not in_ci()


def require_shared(path: Path) -> None:
    """Fails the test (or skips it under MESHPLAN_NO_SHARED=1) when a file of ../shared is missing."""
    if path.exists():
        return
    if skip_allowed():
        pytest.skip(f"MESHPLAN_NO_SHARED=1: {path} (the shared validation set) is not here")
    pytest.fail(f"{path} is missing: the dataset tests read the shared validation set from ../shared beside the "
                f"checkout ({SHARED}). Put it there, or set MESHPLAN_NO_SHARED=1 to skip these tests.",
                pytrace=False)


@pytest.hookimpl(wrapper=True, optionalhook=True)  # a checkout without the test extras still loads this file
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): xdist's own count of the cores, at most 4 unless PYTEST_XDIST_AUTO_NUM_WORKERS
    names the count. Each worker holds its own caches and starts its own servers, and the throwaway virtual
    environments are built once whichever worker asks first (their locks)."""
    count = yield
    return count if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else min(4, count)


def pytest_configure(config):
    config.addinivalue_line("markers", "shared_data(path): reads a file of ../shared/validation (fails without it, "
                                       "skips under MESHPLAN_NO_SHARED=1)")


def pytest_runtest_setup(item):
    for mark in item.iter_markers("shared_data"):
        require_shared(Path(mark.args[0]))
    forget_jobs()  # each test's searches start without another test's job memos (a test may patch what they read)


SKIPPED_DATASET_TESTS: list[str] = []  # node ids, this session


def pytest_runtest_logreport(report):
    if report.skipped and "shared_data" in report.keywords:
        SKIPPED_DATASET_TESTS.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """Under CI=true a dataset test that skipped (for any reason) fails the run: CI must run them."""
    if in_ci() and SKIPPED_DATASET_TESTS and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = SKIPPED_DATASET_TESTS
    if in_ci() and skipped:
        terminalreporter.write_line(f"CI=true: {len(skipped)} dataset tests skipped (first: {skipped[0]}); CI needs "
                                    f"../shared beside the checkout ({SHARED}) and runs them all", red=True)


@pytest.fixture(scope="session")
def production_rows():
    """The dev set's production configurations by id (../shared/validation/production_configs_dev.yaml, the rows
    bench/production_rows.load_rows reads), read once per test run for every bench test module that maps rows
    (missing ../shared: see require_shared)."""
    data = SHARED / "validation" / "production_configs_dev.yaml"
    require_shared(data)
    return {r["id"]: r for r in yaml.safe_load(data.read_text(encoding="utf-8"))}


@pytest.fixture
def record_calls(monkeypatch):
    """record_calls(owner, name): `owner.name` replaced for this test by a wrapper that still calls it and appends
    each call's positional arguments to the list returned (the memo tests count what is computed)."""
    def record(owner, name: str) -> list[tuple]:
        calls: list[tuple] = []
        original = getattr(owner, name)

        def recorded(*args):
            calls.append(args)
            return original(*args)

        monkeypatch.setattr(owner, name, recorded)
        return calls

    return record


@pytest.fixture(scope="session")
def http_server(tmp_path_factory):
    """`meshplan serve --transport http` started once per test run (per xdist worker): the MCP endpoint's URL
    (http://127.0.0.1:PORT/mcp); the same server serves the report's page at /."""
    from http_servers import serving  # here, not at the top: a checkout's conftest.py alone still loads (the
    # infrastructure tests copy it without the helpers)

    with serving([sys.executable, "-m", "meshplan.faces.cli", "serve", "--transport", "http", "--port"],
                 tmp_path_factory.mktemp("http")) as port:
        yield f"http://127.0.0.1:{port}/mcp"
