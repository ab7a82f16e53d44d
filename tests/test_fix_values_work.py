"""A rule's fix names changes that work: PP003 and PP013 name virtual stages only where the framework runs them
(its adapter writes vpp) and pipelines only where they tile the GPU count; torchtitan's vpp at pp=1, a pipeline it
never builds, is refused."""

from __future__ import annotations

from meshplan import api
from meshplan.schema.request import Request


def fix_of(rule_id: str, **fields) -> str:
    return next(f.fix for f in api.check_config(Request(**fields)).findings if f.id == rule_id)


def test_vpp_without_a_pipeline_names_only_pipelines_the_framework_runs_at_this_gpu_count():
    # SkyRL runs no virtual stages (AD001), and at 8 GPUs with tp=8 no pp > 1 tiles: vpp=1 alone (it said "or use pp>1")
    assert fix_of("PP003", model="llama-3.1-8b", framework="skyrl", gpu="h100", num_gpus=8, tp=8, pp=1, vpp=2) == \
        "Set vpp=1."
    # Megatron-Core at 8 GPUs, tp=2: pp 2 and 4 tile the count and split 32 layers into pp*2 chunks; 8 needs 16 GPUs
    assert fix_of("PP003", model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, vpp=2) == \
        "Set vpp=1, or pp in {2, 4} with vpp=2."
    # verl's FSDP engine (zero_stage 3) has no pipeline at all
    assert fix_of("PP003", model="llama-3.1-8b", framework="verl", gpu="h100", num_gpus=8, zero_stage=3,
                  vpp=2) == "Set vpp=1."


def test_torchtitan_refuses_virtual_stages_without_a_pipeline():
    """torchtitan builds its pipeline (pipeline_parallel_schedule, layers_per_stage) only when pp > 1 and runs the
    model whole at pp=1: TP8 PP1 VPP2 was reported ok under that name; PP003 now refuses it, with pps that work."""
    fields = dict(model="llama-3.1-70b", framework="torchtitan", gpu="h100", num_gpus=64, tp=8, pp=1, dp=8, vpp=2)
    report = api.check_config(Request(**fields))
    pp003 = next(f for f in report.findings if f.id == "PP003")
    assert "torchtitan builds no pipeline at pp=1" in pp003.message
    assert pp003.fix == "Set vpp=1, or pp in {2, 4, 8} with vpp=2."
    for pp in (2, 4, 8):
        ids = {f.id for f in api.check_config(Request(**{**fields, "pp": pp, "dp": 64 // (8 * pp)})).findings
               if f.severity == "error"}
        assert not ids & {"PP003", "AD001", "WS004", "PP007"}, (pp, ids)


def test_named_schedules_offer_virtual_stages_only_where_the_framework_runs_them():
    # SkyRL: interleaved_1f1b at vpp=1 said "Use vpp=2", which AD001 refuses there
    fix = fix_of("PP013", model="llama-3.1-8b", framework="skyrl", gpu="h100", num_gpus=64, tp=8, pp=2, vpp=1,
                 pipeline_schedule="interleaved_1f1b")
    assert "vpp=2" not in fix and fix == "Use pipeline_schedule=1f1b, or leave it out."
    # ...and at pp=1 it named pp >= 2 with vpp=2
    assert fix_of("PP013", model="llama-3.1-8b", framework="deepspeed", gpu="h100", num_gpus=64, tp=2,
                  pipeline_schedule="zero_bubble") == "Leave pipeline_schedule out."
    assert fix_of("PP013", model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, pipeline_schedule="zero_bubble") == \
        "Use pp in {2, 4} with vpp=2, or leave pipeline_schedule out."
