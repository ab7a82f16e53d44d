"""Runs SkyRL 0.4.0's own config checks on cases read from stdin; prints one verdict per case.

Runs INSIDE the validators venv. The megatron strategy of the RL trainer, one prompt = one sample
(n_samples_per_prompt=1), one mini-batch per step (policy_mini_batch_size = train_batch_size =
the global batch). Real code paths:
1. `SkyRLTrainConfig.from_cli_overrides` (unknown keys and the dataclass `__post_init__` checks);
2. `validate_batch_sizes` (policy world % pp*cp*tp, per-GPU mini batch vs micro batch);
3. `validate_megatron_cfg` (megatron-only restrictions; CP is given remove_microbatch_padding).
The Megatron TransformerConfig checks run later, on GPU workers, through Megatron-Bridge.

SkyRL's wheel targets Python 3.12; on 3.11 two typing names it uses are taken from
typing_extensions (same objects pydantic and the code expect).
"""

from __future__ import annotations

import sys
import traceback
import typing

import typing_extensions
from probe_io import serve

if sys.version_info < (3, 12):
    typing.TypedDict = typing_extensions.TypedDict
    typing.override = typing_extensions.override


def _overrides(case: dict) -> list[str]:
    mc = "trainer.policy.megatron_config"
    return [
        "trainer.strategy=megatron",
        "trainer.placement.policy_num_nodes=1",
        f"trainer.placement.policy_num_gpus_per_node={case['num_gpus']}",
        f"trainer.train_batch_size={case['global_batch_size']}",
        f"trainer.policy_mini_batch_size={case['global_batch_size']}",
        f"trainer.micro_train_batch_size_per_gpu={case['micro_batch_size']}",
        "generator.n_samples_per_prompt=1",
        "trainer.algorithm.use_kl_loss=false",
        "trainer.remove_microbatch_padding=true",
        f"{mc}.tensor_model_parallel_size={case['tp']}",
        f"{mc}.pipeline_model_parallel_size={case['pp']}",
        f"{mc}.context_parallel_size={case['cp']}",
        f"{mc}.expert_model_parallel_size={case['ep']}",
        f"{mc}.expert_tensor_parallel_size={case['etp']}",
    ]


def run(case: dict) -> dict:
    from skyrl.train.config.config import SkyRLTrainConfig
    from skyrl.train.utils.utils import validate_batch_sizes, validate_megatron_cfg

    verdict = {"id": case["id"], "accept": True, "stage": "", "message": "", "warnings": []}
    stage = "from_cli_overrides"
    try:
        cfg = SkyRLTrainConfig.from_cli_overrides(_overrides(case))
        stage = "validate_batch_sizes"
        validate_batch_sizes(cfg)
        stage = "validate_megatron_cfg"
        validate_megatron_cfg(cfg)
    except (AssertionError, ValueError) as exc:
        verdict.update(accept=False, stage=stage, message=f"{type(exc).__name__}: {exc}"[:500])
    except Exception:
        verdict.update(accept=None, stage=stage, message=traceback.format_exc()[-800:])
    return verdict


def main() -> None:
    serve(run)


if __name__ == "__main__":
    main()
