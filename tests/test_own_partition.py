"""A framework that partitions the pipeline's layers itself (its card's pipeline.partition; DeepSpeed's). Megatron-
DeepSpeed's GPTModelPipe hands DeepSpeed's PipelineModule partition_method='type:transformer', and DeepSpeed cuts the
layer specs with partition_balanced: no flag sets another split. Before: the search offered DeepSpeed Megatron's
first/last-stage sizes where pp does not divide the layers (Llama-3.1-405B on 512 GPUs: 4 of 5 rows), which check
passed and render refused; the decision table fitted one as well."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.parse import parse_plan
from meshplan.arithmetic.schedule import own_stages
from meshplan.check.split import framework_options
from meshplan.core.errors import MeshplanError
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

INF = float("inf")


def _partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """deepspeedai/DeepSpeed edaa722 deepspeed/runtime/utils.py partition_uniform, numpy's arange in plain ints."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunksize = num_items // num_parts
    parts = list(range(0, (num_parts + 1) * chunksize, chunksize))
    for i in range(num_items - chunksize * num_parts):
        parts[i + 1:] = [p + 1 for p in parts[i + 1:]]
    return parts


def _partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """deepspeedai/DeepSpeed edaa722 deepspeed/runtime/utils.py partition_balanced, line for line (numpy's inf
    arrays as lists of floats): the linear-partition DP on (max - min) of the stage weights, `>=` keeping the latest
    cut on a tie."""
    n, m = len(weights), num_parts
    if n <= m:
        return _partition_uniform(n, m)
    dp_max = [[INF] * (m + 1) for _ in range(n + 1)]
    dp_min = [[INF] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[INF] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    dp_max[0][0] = 0
    dp_cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                max_sum = max(dp_max[k][j - 1], prefix[i] - prefix[k])
                min_sum = min(dp_min[k][j - 1], prefix[i] - prefix[k])
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j], position[i][j] = cost, max_sum, min_sum, k
    parts = [n]
    for i in reversed(range(1, m + 1)):
        parts.append(position[parts[-1]][i])
    parts.reverse()
    return parts


def deepspeed_counts(num_layers: int, pp: int, moe: bool = False) -> tuple[int, ...]:
    """Decoder layers per stage as DeepSpeed partitions Megatron-DeepSpeed's GPTModelPipe (deepspeedai/Megatron-
    DeepSpeed 4efb479 megatron/model/gpt_model.py): the specs _to_float16, the embedding, num_layers
    ParallelTransformerLayerPipe, _calculate_moe_loss for an MoE model, the final norm, the head, float16_to_fp32
    (--bf16); 'type:transformer' weighs the transformer layers 1 and the rest 0 (pipe/module.py _partition_layers)."""
    weights = [0, 0] + [1] * num_layers + [0] * moe + [0, 0, 0]
    parts = _partition_balanced(weights, pp)
    return tuple(sum(weights[parts[s]:parts[s + 1]]) for s in range(pp))


@pytest.mark.parametrize("layers,pp", [(61, 16), (126, 16), (126, 8), (126, 32), (61, 8), (80, 3), (95, 4),
                                       (27, 4), (13, 12), (7, 7), (32, 5), (64, 16)])
def test_own_split_is_deepspeeds_partition(layers, pp):
    """schedule.own_stages against DeepSpeed's own partition_balanced over the Megatron-DeepSpeed layer specs."""
    expected = deepspeed_counts(layers, pp)
    assert deepspeed_counts(layers, pp, moe=True) == expected  # the MoE-loss spec weighs nothing
    assert own_stages(layers, pp, 1).counts == expected
    assert deepspeed_counts(61, 16) == (4,) * 13 + (3,) * 3 and deepspeed_counts(126, 16) == (8,) * 14 + (7,) * 2


def test_deepspeed_offers_only_its_own_split():
    job, _ = resolve(Request(model="deepseek-v3", gpu="h100", framework="deepspeed", num_gpus=1024))
    assert {(o.vpp, o.first, o.last, o.split) for o in framework_options(job, 16)} == {(1, None, None, None)}
    job, _ = resolve(Request(model="deepseek-v3", gpu="h100", framework="megatron-core", num_gpus=1024))
    assert any(o.first is not None for o in framework_options(job, 16))  # a told split stays searched there


CASES = [dict(model="llama-3.1-405b", num_gpus=512),
         dict(model="deepseek-v3", num_gpus=1024, seq_length=4096, global_batch_size=4096),
         dict(model="qwen2.5-7b", num_gpus=24, pp=3),  # 28 layers over 3 stages: 10, 9, 9
         dict(model="deepseek-v2-lite", num_gpus=16, pp=4)]  # 27 layers over 4 stages: 7, 7, 7, 6


@pytest.mark.parametrize("fields", CASES, ids=[c["model"] for c in CASES])
def test_every_ranked_deepspeed_row_renders_and_reads_back(fields):
    base = dict(gpu="h100", framework="deepspeed", **fields)
    rec = api.recommend(Request(**base))
    assert rec.candidates
    for cand in rec.candidates:
        p = cand.plan
        assert p.first_stage_layers is None and p.last_stage_layers is None and p.pipeline_layout is None
        req = Request(**{**base, **{k: getattr(p, k) for k in ("tp", "pp", "ep", "dp", "zero_stage",
                                                                "micro_batch_size", "recompute")}})
        out = api.render_config("deepspeed", req)  # no refusal
        job, _ = resolve(req)
        parsed = parse_plan("deepspeed", out.variant, out.text, job.model.num_layers)
        assert parsed["pp"] == p.pp and parsed.get("first_stage_layers") is None
        imported = api.import_config(out.text, framework="deepspeed")  # read back: the split DeepSpeed implies
        back = api.request_from_config(imported, {"gpu": "h100", "model": fields["model"]})
        assert (back.pp, back.first_stage_layers, back.last_stage_layers) == (p.pp, None, None)
        memory = api.estimate_memory(back)
        assert memory.peak_bytes == cand.memory.peak_bytes
        if p.pp > 1:
            assert tuple(s.layers for s in memory.stages) == deepspeed_counts(job.model.num_layers, p.pp,
                                                                              job.model.moe is not None)
        assert not [f for f in api.check_config(back, config=imported).findings if f.severity == "error"]


def test_odd_layers_on_deepspeed_estimate_its_split_without_megatron_warning():
    req = Request(model="llama-3.1-405b", gpu="h100", framework="deepspeed", num_gpus=512, tp=4, pp=16,
                  zero_stage=1, recompute="full", micro_batch_size=1)
    memory = api.estimate_memory(req)
    assert [s.layers for s in memory.stages] == [8] * 14 + [7] * 2
    assert not any("Megatron needs" in w for w in memory.warnings)


def test_a_given_first_last_on_deepspeed_is_refused_with_what_deepspeed_does():
    req = Request(model="llama-3.1-405b", gpu="h100", framework="deepspeed", num_gpus=512, tp=4, pp=16,
                  zero_stage=1, recompute="full", micro_batch_size=1, first_stage_layers=7, last_stage_layers=7)
    with pytest.raises(MeshplanError, match="type:transformer") as err:
        api.render_config("deepspeed", req)
    assert "first L % pp stages" in str(err.value)
    errors = [f for f in api.check_config(req).findings if f.severity == "error"]  # check agrees with render
    assert [f.id for f in errors] == ["AD001"] and "type:transformer" in errors[0].fix
    with pytest.raises(MeshplanError, match="AD001"):
        api.estimate_memory(req)  # no estimate of a split DeepSpeed does not run
    megatron = req.model_copy(update={"framework": "megatron-core"})  # told its split: no AD001 there
    assert "AD001" not in [f.id for f in api.check_config(megatron).findings]


def test_the_decision_table_names_no_split_on_deepspeed():
    rec = api.recommend(Request(model="llama-3.1-405b", gpu="h100", framework="deepspeed", num_gpus=512))
    table = rec.decision_table
    assert table is not None and "partitions them itself" in str(table)
    assert "first_stage_layers" not in str(table)


def kempnerforge_counts(num_layers: int, pp: int) -> tuple[int, ...]:
    """KempnerInstitute/KempnerForge 5666d0d kempnerforge/distributed/pipeline_parallel.py compute_layer_assignment:
    n_layers // pp_size per stage, one more on the stages whose index is under n_layers % pp_size."""
    base, remainder = divmod(num_layers, pp)
    return tuple(base + (1 if stage < remainder else 0) for stage in range(pp))


def test_every_ranked_kempnerforge_row_renders_with_its_own_split():
    """KempnerForge assigns the layers itself too (the card's pipeline.partition): Llama-3.1-405B on 512 GPUs ranked
    PP32 first/last 3/3 and PP64 1/1, which its adapter refuses; every ranked row now renders, and each stage holds
    what compute_layer_assignment gives it."""
    base = dict(model="llama-3.1-405b", gpu="h100", framework="kempnerforge", num_gpus=512)
    rec = api.recommend(Request(**base))
    assert any(c.plan.pp > 1 and 126 % c.plan.pp for c in rec.candidates)  # an uneven pipeline is ranked
    for cand in rec.candidates:
        p = cand.plan
        assert p.first_stage_layers is None and p.last_stage_layers is None and p.pipeline_layout is None
        req = Request(**{**base, **{k: getattr(p, k) for k in ("tp", "pp", "dp", "zero_stage", "micro_batch_size",
                                                                "recompute")}})
        api.render_config("kempnerforge", req)  # no refusal
        memory = api.estimate_memory(req)
        assert memory.peak_bytes == cand.memory.peak_bytes
        assert tuple(s.layers for s in memory.stages) == kempnerforge_counts(126, p.pp)
