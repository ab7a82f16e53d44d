"""DeepSeek-V3.2 (DeepSeek Sparse Attention): its indexer counted exactly, its attention timed as Megatron-Core runs it
(the sparse core on absorbed MLA over min(position, index_topk) keys, the indexer over every preceding key), its
activations, the frameworks' rules and a recommendation through the API."""

from __future__ import annotations

import json

import pytest

from meshplan.api import check_config, estimate_throughput, recommend, render_config
from meshplan.arithmetic.activations import TOPK_INDEX_BYTES, Layout, indexer_bytes, shape_of
from meshplan.arithmetic.flops import (
    Shard,
    attention_core_flops,
    attention_gemms,
    dsa_attended_keys,
    dsa_core_flops,
    indexer_score_flops,
    model_flops_per_token,
)
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import model_card
from meshplan.knowledge.catalog import describe_model, published_mismatches, resolve_model
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.knowledge.model_counts import indexer_params, total_params
from meshplan.schema.request import Request

# DeepSeek-V3.2-Exp inference/model.py Indexer: wq_b Linear(q_lora_rank 1536, 64 x 128), wk Linear(7168, 128),
# k_norm LayerNorm(128) (weight and bias), weights_proj Linear(7168, 64); no biases
INDEXER = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64


@pytest.fixture(scope="module")
def v32():
    return resolve_model("deepseek-v3.2")


@pytest.fixture(scope="module")
def v3():
    return resolve_model("deepseek-v3")


def test_indexer_counted_to_the_parameter(v32, v3):
    assert INDEXER == 13_959_424 == indexer_params(v32)
    assert indexer_params(v3) == 0
    assert total_params(v32) - total_params(v3) == 61 * INDEXER
    assert total_params(v32) == 671_877_944_064
    report, base = describe_model("deepseek-v3.2"), describe_model("deepseek-v3")
    assert report.mtp_params - base.mtp_params == INDEXER  # the MTP block's layer has its indexer too
    assert published_mismatches(report) == []
    # the hub checkpoint: main model, MTP module and the embedding and head copies stored in layer 61: "685B"
    hub = report.total_params + report.mtp_params + 2 * 129_280 * 7168
    assert hub == 685_355_329_792 and round(hub / 1e9) == 685


def test_config_json_reads_as_the_catalog_card(v32):
    config = dict(model_card("deepseek-v3.2").config)
    arch = architecture_from_config(config)
    assert (arch.dsa.index_n_heads, arch.dsa.index_head_dim, arch.dsa.index_topk) == (64, 128, 2048)
    assert total_params(arch) == total_params(v32)
    assert describe_model("deepseek-ai/DeepSeek-V3.2-Exp").key == "deepseek-v3.2"


@pytest.mark.parametrize("change, named", [({"index_topk": None}, "index_topk"),
                                           ({"index_head_dim": 32}, "index_head_dim"),
                                           ({"q_lora_rank": None}, "q_lora_rank")])
def test_bad_indexer_fields_are_refused_by_name(change, named):
    config = {k: v for k, v in {**model_card("deepseek-v3.2").config, **change}.items() if v is not None}
    with pytest.raises(MeshplanError, match=named):
        architecture_from_config(json.loads(json.dumps(config)))


def test_mfu_model_flops_are_megatron_lms_dense_mla(v32, v3):
    """Megatron-LM's num_floating_point_operations has no DSA term: the same model FLOPs at any length."""
    for seq in (1024, 2048, 131_072):
        assert model_flops_per_token(v32, seq) == model_flops_per_token(v3, seq)


def test_attended_keys_causal_half_then_topk():
    assert dsa_attended_keys(2048, 2048) == 1024 and dsa_attended_keys(1000, 2048) == 500
    assert dsa_attended_keys(131_072, 2048) == 2048 - 2048 ** 2 / (2 * 131_072)
    assert dsa_attended_keys(10 ** 9, 2048) == pytest.approx(2048, rel=1e-5)


def test_sparse_core_at_short_and_long_sequences(v32, v3):
    """At s <= topk every causal key is attended: DeepSeek-V3's causal core at the absorbed widths (kv_lora + rope
    scored, kv_lora summed per key: 1088 where MLA's per-head q/k/v is 320), no speed-up; at 128K only topk keys."""
    sh = Shard(tokens=4096, tp=2, ep=1, etp=1, sp=True)
    absorbed, dense = 2 * 512 + 64, 192 + 128
    for seq in (1024, 2048):
        assert dsa_core_flops(v32, sh, seq) == pytest.approx(attention_core_flops(v3, sh, seq) * absorbed / dense)
        assert attention_core_flops(v32, sh, seq) == dsa_core_flops(v32, sh, seq)
    seq = 131_072
    assert dsa_core_flops(v32, sh, seq) == pytest.approx(
        2 * 4096 * (2048 - 2048 ** 2 / (2 * seq)) * 64 * absorbed)
    ratio = dsa_attended_keys(seq, 2048) / (seq / 2) * absorbed / dense  # 9.45x fewer FLOPs than V3's dense core
    assert dsa_core_flops(v32, sh, seq) == pytest.approx(attention_core_flops(v3, sh, seq) * ratio) and ratio < 0.11
    # the indexer: every preceding key, all 64 heads on every TP rank (duplicated), one FMA per head to weigh them
    assert indexer_score_flops(v32, sh, seq) == 2 * 4096 * (seq / 2) * 64 * (128 + 1)


def test_indexer_linears_whole_on_every_tp_rank(v32, v3):
    sh = Shard(tokens=8192, tp=8, ep=1, etp=1, sp=True)
    extra = {g.name for g in attention_gemms(v32, sh)} - {g.name for g in attention_gemms(v3, sh)}
    assert extra == {"indexer_wq_b", "indexer_wk", "indexer_weights_proj"}
    flops = sum(g.flops for g in attention_gemms(v32, sh)) - sum(g.flops for g in attention_gemms(v3, sh))
    assert flops == 2 * 8192 * (1536 * 64 * 128 + 7168 * 128 + 7168 * 64)


def test_long_context_gets_the_speed_up_short_none():
    layout = dict(gpu="h100", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, first_stage_layers=3, last_stage_layers=2,
                  recompute="full")

    def compute(model, seq, cp, gbs):
        return estimate_throughput(Request(model=model, seq_length=seq, cp=cp, global_batch_size=gbs,
                                           cp_comm_type="allgather", **layout)).breakdown.compute_s

    assert compute("deepseek-v3.2", 2048, 1, 2048) > compute("deepseek-v3", 2048, 1, 2048)
    assert compute("deepseek-v3.2", 131_072, 16, 64) < 0.7 * compute("deepseek-v3", 131_072, 16, 64)


def test_indexer_activations(v32):
    shape = shape_of(v32)
    lay = Layout(tokens=4096, seq_kv=4096, tp=1, sp=False, etp=1, flash=True, dropout=False, swiglu_unfused=False,
                 fp8=False)
    assert TOPK_INDEX_BYTES == 8  # torch.topk's indices are int64: stated here, not only read from the code
    per_token = 2 * (64 * 128 + 64 + 2 * 128) + 8 + TOPK_INDEX_BYTES * 2048
    assert indexer_bytes(shape, lay) == 4096 * per_token
    # under SP with tp > 1 the indexer keeps its own gathered layer input and q latent, on every TP rank
    sp = lay._replace(tp=4, sp=True)
    assert indexer_bytes(shape, sp) == 4096 * (per_token + 2 * (7168 + 1536))


def test_rules_name_megatron_core():
    base = dict(model="deepseek-v3.2", num_gpus=256, pp=8, ep=32, first_stage_layers=7, last_stage_layers=6)
    for framework, rule in (("megatron-bridge", "DSA001"), ("torchtitan", "DSA001"), ("verl", "DSA002"),
                            ("nemo-automodel", "DSA002")):
        found = {f.id: f for f in check_config(Request(framework=framework, **base)).findings}
        assert rule in found and "megatron-core" in found[rule].fix
    found = {f.id for f in check_config(Request(cp=2, cp_comm_type="p2p", seq_length=8192, **base)).findings}
    assert "DSA003" in found
    found = {f.id for f in check_config(Request(cp=2, seq_length=8192, **base)).findings}
    assert not found & {"DSA001", "DSA002", "DSA003"}  # cp_comm_type left out: all-gather for a DSA model


def test_recommend_on_256_h100_ranks_layouts():
    answer = recommend(Request(model="deepseek-v3.2", gpu="h100", num_gpus=256, seq_length=4096,
                               global_batch_size=1024), top_k=3)
    assert len(answer.candidates) >= 2
    times = [c.throughput.step_time_s for c in answer.candidates]
    assert times == sorted(times)
    assert all(c.plan.cp == 1 or c.plan.cp_comm_type == "allgather" for c in answer.candidates)


def test_megatron_core_render_builds_dsa():
    text = render_config("megatron-core", Request(model="deepseek-v3.2", gpu="h100", num_gpus=256, pp=16, ep=16,
                                                  first_stage_layers=3, last_stage_layers=2,
                                                  recompute="full")).text
    for flag in ("--experimental-attention-variant dsa", "--dsa-indexer-n-heads 64", "--dsa-indexer-head-dim 128",
                 "--dsa-indexer-topk 2048", "--dsa-indexer-use-sparse-loss", "--no-rope-fusion",
                 "--multi-latent-attention"):
        assert flag in text


def test_megatron_core_script_reads_back_as_deepseek_v32():
    from meshplan import api
    from meshplan.request.parse import parse_request

    req = parse_request({"model": "deepseek-v3.2", "framework": "megatron-core", "num_gpus": 64, "tp": 2, "pp": 2})
    read = api.import_config(api.render_config("megatron-core", req, force=True).text)
    assert read.request["model"] == "deepseek-v3.2" and read.unsupported == []
    dense = parse_request({"model": "deepseek-v3", "framework": "megatron-core", "num_gpus": 64, "tp": 2, "pp": 2})
    assert api.import_config(api.render_config("megatron-core", dense, force=True).text).request["model"] == \
        "deepseek-v3"


FLAGS = ("megatron-core flags: --num-layers 4 --hidden-size 512 --num-attention-heads 8 --max-position-embeddings "
         "4096 --vocab-size 32000 --swiglu --normalization RMSNorm --position-embedding-type rope "
         "--disable-bias-linear ")
MLA_FLAGS = "--multi-latent-attention --q-lora-rank 192 --kv-lora-rank 64 --qk-head-dim 16 --qk-pos-emb-head-dim 8 " \
            "--v-head-dim 16 "


def test_a_dsa_model_built_from_launch_flags():
    arch = resolve_model(FLAGS + MLA_FLAGS + "--dsa-indexer-n-heads 4 --dsa-indexer-head-dim 32 --dsa-indexer-topk 256")
    assert (arch.dsa.index_n_heads, arch.dsa.index_head_dim, arch.dsa.index_topk) == (4, 32, 256)
    assert indexer_params(arch) == 192 * 4 * 32 + 512 * 32 + 2 * 32 + 512 * 4
    with pytest.raises(MeshplanError, match="without --multi-latent-attention"):
        resolve_model(FLAGS + "--dsa-indexer-n-heads 4 --dsa-indexer-head-dim 32 --dsa-indexer-topk 256")


def test_a_lora_job_is_told_to_plan_full_training_where_the_only_builder_runs_no_lora():
    """DSA001's fix named megatron-core for a LoRA job on DeepSeek-V3.2, where LORA001 then refuses it (Megatron-Core
    runs no LoRA meshplan plans): it now says the job is planned there as full training, and a plain job is not."""
    lora = check_config(Request(model="deepseek-v3.2", framework="torchtitan", gpu="h100", num_gpus=256,
                                lora_rank=16))
    fix = next(f.fix for f in lora.findings if f.id == "DSA001")
    assert fix.startswith("Plan this job as full training (none of the frameworks that build it runs LoRA) on "
                          "framework megatron-core")
    plain = check_config(Request(model="deepseek-v3.2", framework="torchtitan", gpu="h100", num_gpus=256))
    fix = next(f.fix for f in plain.findings if f.id == "DSA001")
    assert fix.startswith("Plan this job on framework megatron-core")
