"""Runs inside the NeMo AutoModel venv (tests/framework_packages.py AUTOMODEL_VENV): each rendered recipe YAML loaded
with AutoModel's own code, and what that code makes of it.

Reads a JSON list of {"id", "yaml", "num_gpus", "num_layers"} on stdin; prints one line "RESULT <json list>" (with
--serve, one such list per line of stdin, one RESULT line each: bench/harness_serve.py). Per case:
load_yaml_config (its loader, which imports every `_target_`), recipes/_dist_utils.parse_distributed_section (the
strategy dataclass, PipelineConfig, MoEParallelizerConfig), mesh_utils._create_device_meshes over num_gpus ranks (the
DeviceMesh constructor replaced by a recorder that asserts what torch's init_device_mesh asserts: the mesh covers the
world), StepScheduler (global / local / dp), pipelining calculate_virtual_stages and torch's get_schedule_class,
BackendConfig, PeftConfig, FP8Config and CompileConfig built from their sections. An exception is the verdict
"rejected" with its message.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

from nemo_automodel.components.config.loader import load_yaml_config  # noqa: E402
from nemo_automodel.components.distributed import mesh_utils  # noqa: E402
from nemo_automodel.components.distributed.pipelining.functional import calculate_virtual_stages  # noqa: E402
from nemo_automodel.components.quantization.fp8 import FP8Config  # noqa: E402
from nemo_automodel.components.training.step_scheduler import StepScheduler  # noqa: E402
from nemo_automodel.components.utils.compile_utils import CompileConfig  # noqa: E402
from nemo_automodel.recipes._dist_utils import parse_distributed_section  # noqa: E402
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from harness_serve import serve  # noqa: E402  (one ask, or with --serve one per line: the tests keep one server)

WORLD: dict[str, int] = {}


def _record_mesh(spec, *, timeout_minutes=None, ranks=None):
    if math.prod(spec.shape) != WORLD["n"]:  # torch init_device_mesh: the mesh must hold every rank
        raise RuntimeError(f"mesh {spec.shape} holds {math.prod(spec.shape)} ranks, the world has {WORLD['n']}")
    return {"shape": list(spec.shape), "axes": [str(a.value) for a in spec.axes]}


def _record_moe_mesh(device_mesh, *, ep_shard_size, ep_size, pp_size=1, timeout_minutes=None, ranks=None):
    return {"ep_shard": ep_shard_size, "ep": ep_size}


mesh_utils._init_named_mesh = _record_mesh
mesh_utils._create_moe_mesh = _record_moe_mesh


def _section(cfg, name):
    node = cfg.get(name, None)
    return node.to_dict() if node is not None else None


def probe(case: dict) -> dict:
    WORLD["n"] = case["num_gpus"]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as handle:
        handle.write(case["yaml"])
        handle.flush()
        cfg = load_yaml_config(handle.name)
    parsed = parse_distributed_section(_section(cfg, "distributed"))
    strategy = parsed["strategy_config"]
    device_mesh, moe_mesh = mesh_utils._create_device_meshes(strategy, parsed["parallelism_sizes"],
                                                             world_size=case["num_gpus"])
    out = {"ok": True, "strategy": type(strategy).__name__, "mesh": device_mesh, "moe_mesh": moe_mesh,
           "sequence_parallel": getattr(strategy, "sequence_parallel", False),
           "reshard_after_forward": getattr(strategy, "reshard_after_forward", None),
           "async_tp": getattr(strategy, "enable_async_tensor_parallel", False),
           "offload": type(getattr(strategy, "offload_policy", None)).__name__,
           "ac": parsed["activation_checkpointing"], "sizes": {k: parsed[k] for k in ("tp_size", "pp_size", "cp_size",
                                                                                        "ep_size", "dp_size")}}
    steps = _section(cfg, "step_scheduler")
    dp = device_mesh["shape"][1] * device_mesh["shape"][2] if device_mesh else case["num_gpus"]
    scheduler = StepScheduler(steps["global_batch_size"], steps["local_batch_size"], dp, dataloader=None,
                              max_steps=1)
    out["grad_acc_steps"] = scheduler.grad_acc_steps
    pipeline = parsed["pipeline_config"]
    if pipeline is not None:
        schedule = get_schedule_class(pipeline.pp_schedule)
        single = issubclass(schedule, PipelineScheduleSingle)
        if pipeline.module_fqns_per_model_part is not None:
            stages = len(pipeline.module_fqns_per_model_part)
        else:
            stages, _ = calculate_virtual_stages(case["num_layers"], pipeline.layers_per_stage, parsed["pp_size"],
                                                 single, pipeline.round_virtual_stages_to_pp_multiple)
        out["pipeline"] = {"schedule": schedule.__name__, "stages": stages,
                           "microbatches": steps["local_batch_size"] // pipeline.pp_microbatch_size,
                           "fqns": pipeline.module_fqns_per_model_part}
    model = cfg.get("model")
    backend = model.get("backend", None)
    if backend is not None:
        built = backend.instantiate()
        out["backend"] = {"attn": built.attn, "dispatcher": built.dispatcher}
    if cfg.get("peft", None) is not None:
        peft = cfg.peft.instantiate()
        out["peft"] = {"dim": peft.dim, "target_modules": list(peft.target_modules)}
    if cfg.get("fp8", None) is not None:
        fp8 = FP8Config(**_section(cfg, "fp8"))
        out["fp8"] = {"enabled": fp8.enabled, "recipe": fp8.recipe_name, "gather": fp8.enable_fsdp_float8_all_gather}
    if cfg.get("compile", None) is not None:
        out["compile"] = CompileConfig(**_section(cfg, "compile")).enabled
    return out


def verdicts(cases: list[dict]) -> list[dict]:
    results = []
    for case in cases:
        try:
            results.append({"id": case["id"], **probe(case)})
        except Exception as exc:  # the framework's verdict: rejected, with its own words
            results.append({"id": case["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return json.loads(json.dumps(results, default=str))


if __name__ == "__main__":
    serve(verdicts)
