"""Runs verl 0.9.1's own config validation on cases read from stdin; prints one verdict per case.

Runs INSIDE the validators venv (CPU torch, ray, tensordict: `import verl` needs them). The case is
composed into the packaged `ppo_megatron_trainer.yaml` through Hydra (an unknown key fails there),
then checked by the real code paths:
1. `verl.utils.config.validate_config` (n_gpus % tp*pp*cp, train batch % (dp * micro batch per GPU),
   actor mini/micro batch rules, micro-batch options of ref and rollout);
2. `omega_conf_to_dataclass(actor.megatron)` -> `McoreEngineConfig.__post_init__` (TP == 1 turns
   sequence parallelism off, with a warning).
verl does not check heads, layers or experts against the layout: Megatron-Core does that on the
GPU workers (through Megatron-Bridge), so those rule classes are compared in megatron_probe.py.

One RL step here: data.train_batch_size = ppo_mini_batch_size = the global batch, rollout.n = 1.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import traceback
import warnings


def _overrides(case: dict) -> list[str]:
    mg = "actor_rollout_ref.actor.megatron"
    return [
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={case['num_gpus']}",
        f"data.train_batch_size={case['global_batch_size']}",
        "actor_rollout_ref.rollout.n=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={case['global_batch_size']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={case['micro_batch_size']}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={case['micro_batch_size']}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={case['micro_batch_size']}",
        f"{mg}.tensor_model_parallel_size={case['tp']}",
        f"{mg}.pipeline_model_parallel_size={case['pp']}",
        f"{mg}.virtual_pipeline_model_parallel_size={case['vpp'] if case['vpp'] > 1 else 'null'}",
        f"{mg}.context_parallel_size={case['cp']}",
        f"{mg}.expert_model_parallel_size={case['ep']}",
        f"{mg}.expert_tensor_parallel_size={case['etp']}",
        f"{mg}.sequence_parallel={str(case['sequence_parallel']).lower()}",
    ]


def _value(text: str):
    return {"null": None, "true": True, "false": False}.get(text, int(text) if text.lstrip("-").isdigit() else text)


_BASE = []


def _compose(case: dict):
    """The packaged config with the case's overrides.

    Hydra composes the first case (that proves every key exists in the packaged YAML); a compose costs
    ~2 s, so the later cases set the same keys on a copy of it (interpolations such as the ref's
    `${oc.select:actor_rollout_ref.actor.megatron...}` still resolve lazily, as after a compose).
    """
    from hydra import compose
    from omegaconf import OmegaConf

    overrides = _overrides(case)
    if not _BASE:
        _BASE.append(compose("ppo_megatron_trainer", overrides=overrides))
        return OmegaConf.create(OmegaConf.to_container(_BASE[0], resolve=False))
    cfg = OmegaConf.create(OmegaConf.to_container(_BASE[0], resolve=False))
    for item in overrides:
        key, text = item.split("=", 1)
        OmegaConf.update(cfg, key, _value(text), merge=False)
    return cfg


def run(case: dict) -> dict:
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    verdict = {"id": case["id"], "accept": True, "stage": "", "message": "", "warnings": []}
    stage = "hydra compose"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cfg = _compose(case)
            stage = "validate_config"
            validate_config(cfg, use_reference_policy=True, use_critic=False)
            stage = "McoreEngineConfig"
            engine = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.megatron)
            if case["sequence_parallel"] and not engine.sequence_parallel:
                verdict["warnings"].append("McoreEngineConfig turned sequence_parallel off (tp == 1)")
        except (AssertionError, ValueError) as exc:
            verdict.update(accept=False, stage=stage, message=f"{type(exc).__name__}: {exc}"[:500])
        except Exception:
            verdict.update(accept=None, stage=stage, message=traceback.format_exc()[-800:])
    verdict["warnings"] += sorted({str(w.message)[:200] for w in caught if "parallel" in str(w.message).lower()})
    return verdict


def main() -> None:
    cases = json.load(sys.stdin)
    import verl
    from hydra import initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    logging.disable(logging.WARNING)
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(io.StringIO()), initialize_config_dir(config_dir=config_dir, version_base=None):
        verdicts = [run(case) for case in cases]
    json.dump(verdicts, real_stdout)


if __name__ == "__main__":
    main()
