"""Runs torchtitan 0.3.0's own layout validation on cases read from stdin; prints one verdict per case.

Runs INSIDE the validators venv (CPU torch). Real code paths:
1. `ParallelismConfig(...)`: the dataclass of the `--parallelism.*` flags (0.3.0 has no expert tensor
   parallel degree, so an etp > 1 case has no flag to land on and is rejected here);
2. `ParallelDims(...)`: `_validate` (dp_replicate*dp_shard*cp*tp*pp == world, dp_shard=-1 resolved);
3. `ParallelDims.build_mesh()` on a fake process group of the real world size: unflattening the
   expert mesh (pp, dp_replicate, efsdp, ep) fails unless ep divides dp_shard*cp*tp.
The sequence-length and global-batch checks sit inside `Trainer.__init__`, after model building,
and are not run here.
"""

from __future__ import annotations

import traceback

from probe_io import serve


def run(case: dict) -> dict:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.distributed.parallel_dims import ParallelDims

    verdict = {"id": case["id"], "accept": True, "stage": "", "message": "", "warnings": []}
    stage = "ParallelismConfig"
    try:
        knobs = dict(
            data_parallel_replicate_degree=1,
            data_parallel_shard_degree=case["dp"] if case.get("dp") else -1,
            tensor_parallel_degree=case["tp"],
            pipeline_parallel_degree=case["pp"],
            context_parallel_degree=case["cp"],
            expert_parallel_degree=case["ep"],
        )
        if case["etp"] > 1:
            knobs["expert_tensor_parallel_degree"] = case["etp"]
        config = ParallelismConfig(**knobs)
        stage = "ParallelDims"
        dims = ParallelDims.from_config(config, world_size=case["num_gpus"])
        stage = "build_mesh"
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case["num_gpus"])
        try:
            dims.build_mesh()
        finally:
            dist.destroy_process_group()
    except (AssertionError, ValueError, RuntimeError, TypeError) as exc:
        verdict.update(accept=False, stage=stage, message=f"{type(exc).__name__}: {exc}"[:500])
    except Exception:
        verdict.update(accept=None, stage=stage, message=traceback.format_exc()[-800:])
    return verdict


def main() -> None:
    serve(run)


if __name__ == "__main__":
    main()
