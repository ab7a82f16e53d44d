"""Runs Megatron-Core 0.19.2's own validators on layouts read from stdin; prints one verdict per layout.

Runs INSIDE the validators venv (CPU torch), never in the test process. Three real code paths, in
the order a Megatron-LM launch meets them:
1. `megatron.training.arguments.parse_args` + `validate_args` (world % tp*pp*cp, VPP, CP sequence,
   EP vs experts, SP with TP=1 silently dropped, eval global batch);
2. `TransformerConfig(...)` / `ModelParallelConfig.__post_init__` (heads and KV groups vs TP, MoE
   bias vs ETP, uneven PP, SP without TP);
3. `get_num_layers_to_build` for every pipeline rank and virtual stage (layers vs pp and vpp);
4. `parallel_state.initialize_model_parallel` on a fake process group of the real world size
   (expert grid world % etp*ep*pp) and the constant micro-batch calculator (gbs % mbs*dp).
Interleaved-schedule micro-batch checks live in the CUDA-only schedule and are not run here.

Input: a JSON list of cases (see tests/framework_probes/harness.py `Case`). Output: a JSON list of
{"id", "accept", "stage", "message", "warnings"}.
"""

from __future__ import annotations

import os
import sys
import traceback
import typing
import warnings

import typing_extensions
from probe_io import serve

# megatron/training/models/hybrid.py imports typing.override (Python 3.12); same object on 3.11.
if not hasattr(typing, "override"):
    typing.override = typing_extensions.override


def _cli(case: dict) -> list[str]:
    m = case["model"]
    argv = [
        "pretrain_gpt.py",
        "--num-layers", str(m["num_layers"]),
        "--hidden-size", str(m["hidden_size"]),
        "--ffn-hidden-size", str(m["ffn_hidden_size"]),
        "--num-attention-heads", str(m["num_attention_heads"]),
        "--seq-length", str(case["seq_length"]),
        "--max-position-embeddings", str(max(case["seq_length"], 4096)),
        "--micro-batch-size", str(case["micro_batch_size"]),
        "--global-batch-size", str(case["global_batch_size"]),
        "--tensor-model-parallel-size", str(case["tp"]),
        "--pipeline-model-parallel-size", str(case["pp"]),
        "--context-parallel-size", str(case["cp"]),
        "--expert-model-parallel-size", str(case["ep"]),
        "--expert-tensor-parallel-size", str(case["etp"]),
        "--bf16",
        "--lr", "1e-4",
        "--train-iters", "10",
        "--use-distributed-optimizer",
    ]
    if m["num_kv_heads"] != m["num_attention_heads"]:
        argv += ["--group-query-attention", "--num-query-groups", str(m["num_kv_heads"])]
    if m.get("num_experts"):
        argv += ["--num-experts", str(m["num_experts"]), "--moe-router-topk", str(m["top_k"])]
    if not m.get("add_bias_linear", True):
        argv.append("--disable-bias-linear")
    if case["sequence_parallel"]:
        argv.append("--sequence-parallel")
    if case["vpp"] > 1:
        argv += ["--num-virtual-stages-per-pipeline-rank", str(case["vpp"])]
    if case.get("first_stage_layers") is not None:
        argv += ["--decoder-first-pipeline-num-layers", str(case["first_stage_layers"])]
    if case.get("last_stage_layers") is not None:
        argv += ["--decoder-last-pipeline-num-layers", str(case["last_stage_layers"])]
    return argv


def _transformer_config(case: dict, args):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    m = case["model"]
    return TransformerConfig(
        num_layers=m["num_layers"],
        hidden_size=m["hidden_size"],
        ffn_hidden_size=m["ffn_hidden_size"],
        num_attention_heads=m["num_attention_heads"],
        num_query_groups=m["num_kv_heads"],
        tensor_model_parallel_size=case["tp"],
        pipeline_model_parallel_size=case["pp"],
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=case["cp"],
        expert_model_parallel_size=case["ep"],
        expert_tensor_parallel_size=case["etp"],
        # What validate_args left of --sequence-parallel (it drops SP silently when TP == 1).
        sequence_parallel=args.sequence_parallel,
        num_moe_experts=m.get("num_experts") or None,
        moe_router_topk=m.get("top_k") or 2,
        add_bias_linear=m.get("add_bias_linear", True),
        num_layers_in_first_pipeline_stage=case.get("first_stage_layers"),
        num_layers_in_last_pipeline_stage=case.get("last_stage_layers"),
        pipeline_dtype=torch.bfloat16,
        bf16=True,
    )


def _layers_per_rank(config) -> None:
    """What every pipeline rank (and virtual stage) builds: asserts the even and uneven splits."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    vpp = config.virtual_pipeline_model_parallel_size
    for pp_rank in range(config.pipeline_model_parallel_size):
        for vp_stage in range(vpp) if vpp else [None]:
            get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)


def _parallel_state(case: dict, args) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = case["num_gpus"]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=case["tp"],
            pipeline_model_parallel_size=case["pp"],
            virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
            context_parallel_size=case["cp"],
            expert_model_parallel_size=case["ep"],
            expert_tensor_parallel_size=case["etp"],
            create_gloo_process_groups=False,  # the fake backend has no gloo sub-groups
        )
        dp = parallel_state.get_data_parallel_world_size()
        ConstantNumMicroBatchesCalculator(
            global_batch_size=case["global_batch_size"], micro_batch_size=case["micro_batch_size"],
            data_parallel_size=dp, decrease_batch_size_if_needed=False, rank=0,
        )
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


_PARSER = []


def _cached_parser(build):
    """Building Megatron's 847 flags costs ~0.8 s (it reads docstrings with inspect); build them once.

    argparse does not change a parser while parsing, so reusing it gives the same namespace.
    """

    def add_megatron_arguments(parser):
        if not _PARSER:
            _PARSER.append(build(parser))
        return _PARSER[0]

    return add_megatron_arguments


def run(case: dict) -> dict:
    import megatron.training.arguments as arguments

    if not _PARSER:
        arguments.add_megatron_arguments = _cached_parser(arguments.add_megatron_arguments)
    # validate_args asks the GPU generation when TP or CP > 1; there is none here: say Hopper.
    arguments.get_device_arch_version = lambda: 9
    os.environ.update(WORLD_SIZE=str(case["num_gpus"]), RANK="0", LOCAL_RANK="0",
                      CUDA_DEVICE_MAX_CONNECTIONS="1")
    verdict = {"id": case["id"], "accept": True, "stage": "", "message": "", "warnings": []}
    stage = "validate_args"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sys.argv = _cli(case)
            args = arguments.parse_args()
            arguments.validate_args(args)
            if case["sequence_parallel"] and not args.sequence_parallel:
                verdict["warnings"].append("validate_args disabled --sequence-parallel (tp == 1)")
            stage = "TransformerConfig"
            config = _transformer_config(case, args)
            stage = "get_num_layers_to_build"
            _layers_per_rank(config)
            stage = "initialize_model_parallel"
            _parallel_state(case, args)
        except (AssertionError, ValueError, RuntimeError, NotImplementedError) as exc:
            verdict.update(accept=False, stage=stage, message=f"{type(exc).__name__}: {exc}"[:500])
        except SystemExit as exc:  # argparse rejected the command line
            verdict.update(accept=False, stage="parse_args", message=f"SystemExit {exc.code}")
        except Exception:  # a crash is not a verdict: report it as such
            verdict.update(accept=None, stage=stage, message=traceback.format_exc()[-800:])
    verdict["warnings"] += sorted({str(w.message)[:200] for w in caught
                                   if "parallel" in str(w.message).lower()})
    return verdict


def main() -> None:
    serve(run)


if __name__ == "__main__":
    main()
