"""The plans the report tests draw (tests/test_report.py, tests/test_report_browser.py): dense with PP and VPP,
MoE with EP across nodes, long-context CP, an RL job, a nothing-fits answer, and a recommend answer."""

from __future__ import annotations

from functools import cache

from meshplan.faces.report import PlanReport, gather
from meshplan.request.parse import parse_request

CASES: dict[str, tuple[dict, bool]] = {
    "dense_pp_vpp": ({"model": "llama-3.1-70b", "gpu": "h100", "num_gpus": 64, "tp": 4, "pp": 4, "vpp": 2,
                      "global_batch_size": 128}, False),
    "moe_ep_across_nodes": ({"model": "qwen3-30b-a3b", "gpu": "h100", "num_gpus": 32, "ep": 16, "etp": 1,
                             "pp": 2}, False),
    "long_context_cp": ({"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 32, "cp": 4, "seq_length": 65536,
                         "global_batch_size": 64}, False),
    "rl": ({"model": "qwen3-30b-a3b", "gpu": "h100", "framework": "verl", "num_gpus": 16, "ep": 8, "job": "rl",
            "samples_per_prompt": 8, "prompts_per_step": 64, "response_length": 4096}, False),
    "nothing_fits": ({"model": "llama-3.1-405b", "gpu": "h100", "num_gpus": 8}, True),
    "recommend": ({"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 16}, True),
}


@cache
def report_for(name: str) -> PlanReport:
    args, recommend = CASES[name]
    return gather(parse_request(args), recommend=recommend)
