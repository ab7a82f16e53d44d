"""Shared test set-up: tests import helpers (framework_packages) from this folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
