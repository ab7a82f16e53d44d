"""Shared test set-up: tests import helpers (framework_packages) from this folder; the dev set's rows, read once."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="session")
def production_rows():
    """The dev set's production configurations by id (bench/production_configs.load_rows), read once per test run
    for every bench test module that maps rows; a module skips when ../shared is not beside the checkout."""
    sys.path.insert(0, str(BENCH))
    import production_configs as pc

    data = pc.DEFAULT_VALIDATION / pc.DATA_NAME
    if not data.exists():
        pytest.skip(f"{data} (the shared validation set) is not here")
    return {r["id"]: r for r in pc.load_rows(data)}
