"""What the probes share: JSON cases on stdin, one JSON verdict per case on stdout.

The frameworks print while they validate; their output is kept off stdout so it stays parseable.
A probe runs as a script inside its venv, so this module is found beside it on sys.path.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable


def serve(run: Callable[[dict], dict]) -> None:
    cases = json.load(sys.stdin)
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(io.StringIO()):
        verdicts = [run(case) for case in cases]
    json.dump(verdicts, real_stdout)
