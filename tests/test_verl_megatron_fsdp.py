"""verl's Megatron engine on Megatron-FSDP (megatron.use_megatron_fsdp, verl 0.9.1 workers/config/engine.py
McoreEngineConfig): meshplan's zero_stage 3 on verl is its FSDP engine (strategy fsdp2, Ulysses), so the Megatron
variants never write the key (its default, false, is what they run) and a file that turns it on is said as not
modelled rather than read as zero_stage 3, which would estimate another engine."""

from __future__ import annotations

import pytest

from meshplan.adapters.read import import_config
from meshplan.adapters.render import render
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

MOE = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, gpus_per_node=8, framework="verl", tp=1, pp=2, ep=8,
           etp=1, zero_stage=1)


@pytest.mark.parametrize("job", ["rl", "sft"])
def test_the_megatron_variants_write_no_megatron_fsdp_key(job):
    """Before: use_megatron_fsdp=false on every role (RL) or the engine (SFT), a Megatron-FSDP key no verl plan of
    meshplan's can turn on."""
    result = render("verl", *resolve(Request(**MOE, job=job)))
    assert result.variant in ("megatron", "sft-megatron")
    assert "use_megatron_fsdp" not in result.text


@pytest.mark.parametrize("text", [
    "python3 -m verl.trainer.main_ppo model_engine=megatron actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B "
    "trainer.nnodes=2 trainer.n_gpus_per_node=8 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 "
    "actor_rollout_ref.actor.megatron.use_megatron_fsdp=true\n",
    "torchrun --nnodes=2 --nproc_per_node=8 -m verl.trainer.sft_trainer engine=megatron optim=megatron "
    "model.path=Qwen/Qwen3-30B-A3B engine.tensor_model_parallel_size=2 engine.use_megatron_fsdp=true\n"])
def test_a_file_on_megatron_fsdp_is_said_not_read_as_the_fsdp_engine(text):
    """Before: read as zero_stage 3, which meshplan plans on verl's FSDP engine (no TP, Ulysses for cp)."""
    got = import_config(text, "run.sh")
    assert got.request.get("zero_stage") != 3
    assert any("Megatron-FSDP" in u and "use_megatron_fsdp" in u for u in got.unsupported), got.unsupported


def test_false_is_the_default_and_reads_as_the_distributed_optimizer():
    got = import_config("torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer engine=megatron optim=megatron "
                        "engine.use_megatron_fsdp=false engine.use_distributed_optimizer=true\n", "sft.sh")
    assert got.unsupported == [] and got.request["zero_stage"] == 1
