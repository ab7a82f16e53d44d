"""How the harnesses run in the tests' throwaway venvs answer: one ask (JSON on stdin, a `RESULT {...}` line on
stdout), or with --serve one ask per line of stdin, a RESULT or an ERROR line each, until stdin closes. The tests keep
one server per worker (tests/framework_packages.harness_answer, served_answer), so torch, transformers and PEFT (or
AutoModel: tests/framework_probes/automodel_probe.py; or transformers alone for bench/fake_tensor_hf_harness.py, one
server per fake process group's world: bench/fake_tensor_hf.served_harness) are imported once per worker, not once per
ask. Imported by the harness scripts beside it and that probe; it imports nothing of meshplan."""

import json
import sys
from collections.abc import Callable


def serve(answer: Callable[[dict], dict]) -> None:
    """Answers stdin's ask(s) with `answer`, as the module docstring says."""
    if "--serve" not in sys.argv[1:]:
        print("RESULT " + json.dumps(answer(json.load(sys.stdin))))
        return
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            said = "RESULT " + json.dumps(answer(json.loads(line)))
        except Exception as error:  # this ask's failure, said; the next ask is answered afresh
            said = "ERROR " + json.dumps(f"{type(error).__name__}: {error}")
        print(said, flush=True)
