"""Sliding-window attention: the keys a windowed layer's query attends to, counted once (flops.attended_keys) and
read by the model FLOPs (MFU), the attention core's time and the rollout's KV cache; checked against hand arithmetic
and against Megatron-Bridge's own FLOP count (training/utils/flop_utils.py num_floating_point_operations, run from
the pinned wheel)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshplan.arithmetic.flops import (
    Shard,
    attended_keys,
    attention_core_flops,
    model_flops_per_token,
    noncausal_flops_per_token,
    window_attended_keys,
)
from meshplan.knowledge.catalog import resolve_model


def _full(arch):
    """The same model with every layer full (no window)."""
    return arch.model_copy(update={"sliding_window": None, "sliding_window_layers": None})


@pytest.mark.parametrize(("seq", "window"), [(4096, 128), (8192, 4096), (1000, 999), (300, 7)])
def test_window_keys_are_min_of_position_and_window(seq, window):
    """Query i (1-based) sees min(i, w) keys: the mean over the sequence is w - w(w - 1) / 2s."""
    mean = sum(min(i, window) for i in range(1, seq + 1)) / seq
    assert window_attended_keys(seq, window) == pytest.approx(mean, rel=1e-12)


def test_a_window_no_shorter_than_the_sequence_counts_as_full_causal():
    """Megatron's causal half s/2, as full attention is counted, where the window covers the sequence."""
    assert window_attended_keys(4096, 4096) == window_attended_keys(4096, 8192) == 2048


def test_gpt_oss_layers_average_their_windows():
    """gpt-oss-120b: 18 of its 36 layers see 128 tokens (gpt_oss even layers), the other 18 s/2."""
    arch = resolve_model("gpt-oss-120b")
    assert (arch.sliding_window, arch.windowed_layers) == (128, 18)
    s = 4096
    window = 128 - 128 * 127 / (2 * s)
    assert attended_keys(arch, s) == pytest.approx((18 * s / 2 + 18 * window) / 36)
    assert attended_keys(_full(arch), s) == s / 2


def test_model_flops_drop_by_the_windowed_cores():
    """MFU's FLOPs: each windowed layer's core, 6 x 2 x heads x 2 x head_dim per key (fwd + bwd, FMA 2, QK and PV),
    at its window's keys in place of s/2; nothing else moves. The pre-2025 count keeps full s^2 at every layer."""
    arch = resolve_model("gpt-oss-120b")
    s = 4096
    per_key = 12 * arch.num_attention_heads * arch.head_dim
    saved = 18 * per_key * (s / 2 - window_attended_keys(s, 128))
    assert model_flops_per_token(_full(arch), s) - model_flops_per_token(arch, s) == pytest.approx(saved)
    assert noncausal_flops_per_token(arch, s) == pytest.approx(noncausal_flops_per_token(_full(arch), s))


def test_mistral_windows_every_layer_and_only_past_the_window():
    """Mistral-7B-v0.1 windows all 32 layers at 4096: no change at 4K, the core shrinks at 32K."""
    arch = resolve_model("mistral-7b")
    assert arch.windowed_layers == 32
    assert model_flops_per_token(arch, 4096) == model_flops_per_token(_full(arch), 4096)
    assert model_flops_per_token(arch, 32768) < model_flops_per_token(_full(arch), 32768)


def test_attention_core_time_reads_the_same_keys():
    """The flash core's forward FLOPs on one rank: 2 x tokens x attended keys x local heads x (QK + PV widths)."""
    arch = resolve_model("gemma-2-27b")
    sh = Shard(tokens=32768, tp=2, ep=1, etp=1, sp=True)
    s = 32768
    expected = 2.0 * 32768 * attended_keys(arch, s) * (arch.num_attention_heads / 2) * 2 * arch.head_dim
    assert attention_core_flops(arch, sh, s) == pytest.approx(expected)
    assert attention_core_flops(arch, sh, s) < attention_core_flops(_full(arch), sh, s)


# --------------------------------------------------------------------------- Megatron-Bridge's own count


def _bridge_flop_function():
    """num_floating_point_operations from the pinned Megatron-Bridge wheel, its imports stubbed (the transformer
    branch reads none of them for a plain GPT model without LoRA)."""
    from tests.framework_packages import wheel_tree

    path = wheel_tree("megatron-bridge") / "megatron/bridge/training/utils/flop_utils.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in (
        "num_floating_point_operations", "vit_flops", "_get_vision_config", "_packed_data_exists")]
    namespace = {"Path": Path, "LoRA": type("LoRA", (), {}), "ConfigContainer": object,
                 "_lora_seq_stats_cache": {}, "calculate_padded_vocab_size": lambda v, *a, **k: v}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["num_floating_point_operations"]


def _bridge_cfg(arch, seq: int, window: tuple[int, int] | None, skip_freq: int | None):
    m = arch.moe
    model = SimpleNamespace(
        kv_channels=arch.head_dim, num_attention_heads=arch.num_attention_heads, num_query_groups=arch.num_kv_heads,
        num_layers=arch.num_layers, hidden_size=arch.hidden_size, ffn_hidden_size=arch.ffn_hidden_size,
        num_moe_experts=m.num_experts if m else None, moe_router_topk=m.top_k if m else 1,
        moe_ffn_hidden_size=m.expert_ffn_hidden_size if m else None, moe_shared_expert_intermediate_size=None,
        mtp_num_layers=None, gated_linear_unit=True, multi_latent_attention=False, seq_length=seq,
        vocab_size=arch.vocab_size, make_vocab_size_divisible_by=128, tensor_model_parallel_size=1,
        window_size=window, window_attn_skip_freq=skip_freq)
    return SimpleNamespace(model=model, peft=None, dataset=None)


@pytest.mark.parametrize(("key", "seq"), [("gpt-oss-120b", 4096), ("gpt-oss-120b", 131072), ("gemma-2-27b", 8192),
                                          ("mistral-7b", 32768)])
def test_bridge_counts_the_window_as_meshplan_does(key, seq):
    """What the window takes off one token's FLOPs in Megatron-Bridge 0.6.2's own count (the gpt-oss bridge's
    window_size (sliding_window - 1, 0) with window_attn_skip_freq 2; every layer where no skip frequency is set)
    equals what it takes off meshplan's model FLOPs."""
    count = _bridge_flop_function()
    arch = resolve_model(key)
    skip = 2 if arch.windowed_layers < arch.num_layers else None
    if skip:  # Bridge's skip frequency 2 windows the odd 1-based layers: transformers' even 0-based ones
        assert arch.windowed_layers == (arch.num_layers + 1) // 2
    windowed = count(_bridge_cfg(arch, seq, (arch.sliding_window - 1, 0), skip), batch_size=1)
    full = count(_bridge_cfg(arch, seq, None, None), batch_size=1)
    ours = (model_flops_per_token(_full(arch), seq) - model_flops_per_token(arch, seq)) * seq
    assert full - windowed == pytest.approx(ours, rel=1e-9)
    if arch.sliding_window < seq:
        assert ours > 0


# --------------------------------------------------------------------------- the rollout's KV cache


def _rl_job(engine: str = "vllm"):
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve

    job, plan = resolve(parse_request({"model": "gpt-oss-20b", "framework": "verl", "num_gpus": 8, "job": "rl",
                                       "response_length": 8192, "rollout_tp": 2, "rollout_engine": engine}))
    return job, plan


def test_a_windowed_layer_holds_its_window_in_vllm():
    """gpt-oss-20b: 12 of 24 layers windowed at 128. vLLM's SlidingWindowSpec keeps their last window, so one
    sequence of L tokens holds per-layer bytes x (12 L + 12 x 128); an engine that keeps every token, 24 L."""
    from meshplan.rl.engine import (
        engine_kv_bytes_per_sequence,
        engine_memory,
        kv_bytes_per_sequence,
        kv_bytes_per_token,
    )

    job, plan = _rl_job()
    arch = job.model
    per_layer = kv_bytes_per_token(arch, 2) / arch.num_layers
    length = job.rl.prompt_length + job.rl.response_length
    assert engine_kv_bytes_per_sequence(job, plan, length) == kv_bytes_per_sequence(arch, 2, length, True)
    assert kv_bytes_per_sequence(arch, 2, length, True) == per_layer * (12 * length + 12 * 128)
    assert kv_bytes_per_sequence(arch, 2, length, False) == per_layer * 24 * length
    assert kv_bytes_per_sequence(arch, 2, 100, True) == per_layer * 24 * 100  # shorter than the window
    memory = engine_memory(job, plan, free_bytes=60 * 2**30)
    held = int(memory.kv_bytes // kv_bytes_per_sequence(arch, 2, length, True))
    assert memory.sequences_at_once == min(held, job.rl_card.defaults.max_num_seqs) * plan.rollout_dp


def _sglang_pool(available: int, full_bytes: int, swa_bytes: int, full_layers: int, swa_layers: int,
                 ratio: float = 0.8) -> tuple[int, int]:
    """sglang 0.5.12 model_executor/pool_configurator.py HybridSWAPoolConfigurator as written there (page size 1):
    cell_size, then max_total_num_tokens = available // cell_size = the full pool, swa_tokens = int(full x ratio)."""
    cell_size = full_bytes * full_layers + ratio * swa_bytes * swa_layers
    full_tokens = int(available // cell_size)
    return full_tokens, int(full_tokens * ratio)


def test_sglang_splits_a_gpt_oss_pool_as_its_configurator_does():
    """gpt-oss-20b on verl's SGLang (0.5.12): full layers get full_tokens slots, the 12 windowed layers 0.8 x as
    many; a sequence of L tokens takes L full slots and at most 2 x 128 windowed ones (evicted every window steps),
    so the full pool binds: the sequences held are SGLang's full_tokens // L, between vLLM's and every token's."""
    from meshplan.rl.engine import (
        engine_kv_bytes_per_sequence,
        engine_memory,
        kv_bytes_per_sequence,
        kv_bytes_per_token,
        swa_pool_bytes_per_sequence,
    )

    job, plan = _rl_job("sglang")
    arch, pool = job.model, job.rl_card.engines["sglang"].swa_pool
    length = job.rl.prompt_length + job.rl.response_length
    per_layer = int(kv_bytes_per_token(arch, 2) / arch.num_layers)
    memory = engine_memory(job, plan, free_bytes=60 * 2**30)
    full_tokens, swa_tokens = _sglang_pool(int(memory.kv_bytes), per_layer, per_layer, 12, 12)
    assert swa_tokens >= (full_tokens // length) * 2 * 128  # the windowed pool does not bind
    assert memory.sequences_at_once == min(full_tokens // length, job.rl_card.defaults.max_num_seqs) * plan.rollout_dp
    sequence = engine_kv_bytes_per_sequence(job, plan, length)
    assert sequence == swa_pool_bytes_per_sequence(arch, 2, length, pool) == per_layer * (12 + 0.8 * 12) * length
    assert kv_bytes_per_sequence(arch, 2, length, True) < sequence < kv_bytes_per_sequence(arch, 2, length, False)
    # a sequence shorter than the 0.8 share of what it holds windowed: the windowed pool binds (held / ratio)
    assert swa_pool_bytes_per_sequence(arch, 2, 200, pool) == pytest.approx(per_layer * (12 + 0.8 * 12) * 200 / 0.8)


@pytest.mark.parametrize("model", ["mistral-7b", "gemma-2-27b"])
def test_sglang_keeps_every_token_where_it_does_not_split_the_pool(model):
    """SGLang 0.5.12 pools apart only the architectures is_hybrid_swa_model lists (gpt-oss, Llama 4, ...); Mistral is
    not listed and server_args turns the split off for Gemma 2: every windowed layer keeps every token."""
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve
    from meshplan.rl.engine import engine_kv_bytes_per_sequence, kv_bytes_per_sequence

    job, plan = resolve(parse_request({"model": model, "framework": "verl", "num_gpus": 8, "job": "rl",
                                       "response_length": 8192, "rollout_tp": 2, "rollout_engine": "sglang"}))
    assert job.model.windowed_layers
    assert engine_kv_bytes_per_sequence(job, plan, 9000) == kv_bytes_per_sequence(job.model, 2, 9000, False)


# --------------------------------------------------------------------------- frameworks that ignore the window


@pytest.mark.parametrize(("framework", "windowed"), [("megatron-bridge", True), ("verl", True), ("kempnerforge", False),
                                                     ("torchtitan", False)])
def test_the_model_each_framework_trains(framework, windowed):
    """Mistral-7B at 32K: Megatron-Core (window_size) and transformers run its window; KempnerForge's SDPA and
    torchtitan's Llama model do not, so there every layer is timed and counted full and the answer says so."""
    from meshplan.api import estimate_throughput
    from meshplan.estimate.attention_time import trained_model
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve

    fields = {"model": "mistral-7b", "framework": framework, "num_gpus": 8, "seq_length": 32768,
              "recompute": "full"}
    job, _ = resolve(parse_request(fields))
    arch = trained_model(job)
    assert (arch.windowed_layers == 32) is windowed and trained_model(job) is arch
    report = estimate_throughput(parse_request(fields))
    assert report.model_flops_per_step == pytest.approx(
        model_flops_per_token(arch, 32768) * 32768 * job.global_batch_size, rel=1e-9)
    ignored = [w for w in report.warnings if "no sliding window" in w]
    assert bool(ignored) is not windowed


@pytest.mark.parametrize(("framework", "model", "comm"), [("megatron-bridge", "mistral-7b", "allgather"),
                                                          ("megatron-core", "gpt-oss-20b", "allgather"),
                                                          ("megatron-bridge", "llama-3.1-8b", "p2p"),
                                                          ("torchtitan", "gpt-oss-20b", "p2p"),
                                                          ("kempnerforge", "mistral-7b", "p2p")])
def test_cp_comm_type_default_runs_the_window(framework, model, comm):
    """TE's context parallelism asserts a2a or all-gather under a window (rule CP006): a windowed model on the
    Megatron frameworks gets all-gather where cp_comm_type is left out; the ring elsewhere."""
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve

    _, plan = resolve(parse_request({"model": model, "framework": framework, "num_gpus": 8, "cp": 2,
                                     "seq_length": 16384}))
    assert plan.cp_comm_type == comm


def test_gemma2_on_megatron_bridge_is_searched_without_context_parallelism():
    """Megatron-Bridge's Gemma 2 attention (its own FlexAttention module) raises on context_parallel_size != 1
    (rule CP007): recommend offers no cp > 1 there and its refusals name the rule; Megatron-Core, which runs the
    window through TE, keeps cp in its space."""
    from meshplan import api
    from meshplan.request.parse import parse_request

    ask = {"model": "gemma-2-27b", "num_gpus": 64, "seq_length": 32768}
    bridge = api.recommend(parse_request({**ask, "framework": "megatron-bridge"}), top_k=5)
    assert bridge.candidates and all(c.plan.cp == 1 for c in bridge.candidates)
    assert bridge.rejected.get("CP007", 0) > 0
    core = api.recommend(parse_request({**ask, "framework": "megatron-core"}), top_k=5)
    assert "CP007" not in core.rejected


def test_llama4_on_torchtitan_is_searched_on_the_releases_that_ship_it_without_context_parallelism():
    """torchtitan ships Llama 4 in 0.1.x and 0.2.x only (models/llama4, gone before 0.3.0): on its default 0.3.0
    recommend refuses every plan by TT003 and names 0.2.2; there its iRoPE flavors' FlexAttention refuses cp > 1
    (CP007), so no candidate runs cp and the refusals name the rule (fails before: 0.3.0 ranked Llama 4 layouts,
    and 0.2.2 ranked cp > 1)."""
    from meshplan import api
    from meshplan.core.errors import MeshplanError
    from meshplan.request.parse import parse_request

    ask = {"model": "llama-4-scout", "framework": "torchtitan", "num_gpus": 64, "seq_length": 32768}
    with pytest.raises(MeshplanError, match="TT003") as refused:
        api.recommend(parse_request(ask), top_k=3)
    assert "framework_version=0.2.2" in str(refused.value)
    ran = api.recommend(parse_request({**ask, "framework_version": "0.2.2"}), top_k=3)
    assert ran.candidates and all(c.plan.cp == 1 for c in ran.candidates)
    assert ran.rejected.get("CP007", 0) > 0 and "TT003" not in ran.rejected



def test_torchtitan_0_1_llama4_is_searched_without_selective_recompute():
    """torchtitan v0.1.0's experiments/llama4 refuses selective AC with FlexAttention (RC008): recommend ranks no
    selective plan there and counts the refusals under the rule; 0.2.2, whose op-level SAC takes a FlexAttention
    block, is not refused by it (fails before: 0.1.0 ranked selective plans the job would raise on)."""
    from meshplan import api
    from meshplan.request.parse import parse_request

    ask = {"model": "llama-4-scout", "framework": "torchtitan", "num_gpus": 64, "seq_length": 8192}
    old = api.recommend(parse_request({**ask, "framework_version": "0.1.0"}), top_k=5)
    assert old.candidates and all(c.plan.recompute != "selective" for c in old.candidates)
    assert old.rejected.get("RC008", 0) > 0
    new = api.recommend(parse_request({**ask, "framework_version": "0.2.2"}), top_k=5)
    assert "RC008" not in new.rejected


# --------------------------------------------------------------------------- Llama 4's chunked attention (iRoPE)


@pytest.mark.parametrize(("seq", "chunk"), [(32768, 8192), (20000, 8192), (8192, 8192), (4096, 8192), (300, 7)])
def test_chunk_keys_are_the_position_within_the_chunk(seq, chunk):
    """transformers' chunked_overlay under the causal mask: query i (0-based) sees keys j <= i with j // c == i // c,
    (i mod c) + 1 of them; a chunk no shorter than the sequence counts as full causal, s/2."""
    from meshplan.arithmetic.flops import chunk_attended_keys

    counted = sum(sum(1 for j in range(i + 1) if j // chunk == i // chunk) for i in range(seq)) / seq \
        if seq <= 4096 else sum((i % chunk) + 1 for i in range(seq)) / seq
    expected = seq / 2 if chunk >= seq else counted
    assert chunk_attended_keys(seq, chunk) == pytest.approx(expected, rel=1e-12)


def test_llama4_chunks_three_layers_of_four_as_its_config_does():
    """Llama4TextConfig (transformers 5.9.0): attention_chunk_size 8192, no_rope_layers empty -> every fourth layer
    ((i + 1) % 4 == 0) NoPE and full, the rest chunked; an explicit layer_types or no_rope_layers wins; a null
    chunk is none."""
    from meshplan.knowledge.model_config import architecture_from_config

    scout = resolve_model("llama-4-scout")
    assert (scout.attention_chunk_size, scout.chunked_layers, scout.local_attention) == (8192, 36, (36, 8192))
    assert resolve_model("llama-3.1-8b").local_attention == (0, None)
    text = {"model_type": "llama4_text", "num_hidden_layers": 8, "hidden_size": 512, "intermediate_size": 256,
            "intermediate_size_mlp": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
            "vocab_size": 1000, "num_local_experts": 4, "num_experts_per_tok": 1}
    assert architecture_from_config(text).chunked_layers == 6
    assert architecture_from_config({**text, "no_rope_layers": [1, 0] * 4}).chunked_layers == 4
    kinds = ["chunked_attention"] * 7 + ["full_attention"]
    assert architecture_from_config({**text, "layer_types": kinds, "attention_chunk_size": 1024}).local_attention \
        == (7, 1024)
    assert architecture_from_config({**text, "attention_chunk_size": None}).chunked_layers == 0


def test_chunked_layers_count_in_mfu_where_the_framework_runs_them():
    """Llama 4 Scout at 32K: torchtitan's llama4 (flex, fixed_attn_block_size) and transformers run the chunk, so the
    attention core counts 36 layers at chunk_attended_keys and 12 at s/2; Megatron-Core / Bridge (no chunked
    attention) train and count every layer full (trained_model)."""
    from meshplan.arithmetic.flops import chunk_attended_keys
    from meshplan.estimate.attention_time import trained_model
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve

    arch = resolve_model("llama-4-scout")
    keys = (36 * chunk_attended_keys(32768, 8192) + 12 * 32768 / 2) / 48
    assert attended_keys(arch, 32768) == pytest.approx(keys) and keys == pytest.approx((36 * 4096.5 + 12 * 16384) / 48)
    shard = Shard(tokens=32768, tp=1, ep=1, etp=1, sp=False)
    core = attention_core_flops(arch, shard, 32768)
    assert core == pytest.approx(attention_core_flops(_full_chunks(arch), shard, 32768) * keys / 16384)
    assert model_flops_per_token(arch, 32768) < model_flops_per_token(_full_chunks(arch), 32768)
    for framework, runs in [("torchtitan", True), ("verl", True), ("megatron-bridge", False),
                            ("megatron-core", False), ("kempnerforge", False)]:
        job, _ = resolve(parse_request({"model": "llama-4-scout", "framework": framework, "num_gpus": 64,
                                        "seq_length": 32768}))
        assert (trained_model(job).chunked_layers == 36) is runs, framework


def _full_chunks(arch):
    return arch.model_copy(update={"attention_chunk_size": None, "chunked_attention_layers": None})


def test_a_chunked_layer_holds_its_chunk_in_the_rollout_cache():
    """vLLM's ChunkedLocalAttentionManager frees the blocks before a sequence's current chunk, and SGLang pools a
    chunked layer as a window of the chunk: per-layer bytes x (12 L + 36 min(L, 8192)) on vLLM."""
    from meshplan.rl.engine import kv_bytes_per_sequence, kv_bytes_per_token

    arch = resolve_model("llama-4-scout")
    per_layer = kv_bytes_per_token(arch, 8) / arch.num_layers
    assert kv_bytes_per_sequence(arch, 8, 20000, True) == pytest.approx(per_layer * (12 * 20000 + 36 * 8192))
    assert kv_bytes_per_sequence(arch, 8, 20000, False) == pytest.approx(per_layer * 48 * 20000)


# --------------------------------------------------------------------------- a flash kernel's tiles under a window


def _tiles_by_hand(seq, window, block_m, block_n):
    """FlashAttention-2 v2.8.3 compute_attn_1rowblock, query block by query block: key blocks n_block_min =
    max(0, (m x block_m - (window - 1)) // block_n) up to n_block_max = ceil((m + 1) x block_m / block_n), whole."""
    import math

    total = 0
    for m in range(math.ceil(seq / block_m)):
        rows = min(block_m, seq - m * block_m)
        first = max(0, (m * block_m - (window - 1)) // block_n)
        last = min(math.ceil(seq / block_n), math.ceil((m + 1) * block_m / block_n))
        total += rows * (last - first) * block_n
    return total / seq


@pytest.mark.parametrize(("seq", "window", "tiles"), [(4096, 128, (128, 128)), (131072, 128, (128, 128)),
                                                      (8192, 4096, (128, 64)), (1000, 100, (128, 64)),
                                                      (4100, 128, (128, 128)), (8192, 1024, (64, 64)),
                                                      (4096, 64, (64, 128)), (32768, 200, (64, 128))])
def test_a_window_runs_whole_tiles(seq, window, tiles):
    """The tiles a window's query blocks overlap, against the kernel's loop bounds counted by hand; a 128-token window
    on 128 x 128 tiles computes 2 key blocks a query past the first (256 keys, where it attends 128)."""
    from meshplan.arithmetic.flops import tiled_window_keys

    assert tiled_window_keys(seq, window, *tiles) == pytest.approx(_tiles_by_hand(seq, window, *tiles), rel=1e-12)
    assert tiled_window_keys(seq, window, *tiles) >= window_attended_keys(seq, window)


def test_flash_attention_2_times_gpt_oss_windows_in_whole_tiles():
    """gpt-oss (head dim 64) on FlashAttention-2 runs 128 x 128 forward tiles (calibration.yaml attention_kernels
    local_tiles); cuDNN lists none: its time counts the window's keys exactly. MFU's count is unchanged."""
    from meshplan.arithmetic.flops import tiled_window_keys
    from meshplan.knowledge.calibration import attention_tiles

    arch = resolve_model("gpt-oss-20b")
    assert attention_tiles("flash_attn_2", arch.head_dim) == (128, 128)
    assert attention_tiles("flash_attn_2", 80) == (128, 64) and attention_tiles("cudnn", 64) is None
    sh = Shard(tokens=8192, tp=1, ep=1, etp=1, sp=False)
    tiled = attention_core_flops(arch, sh, 8192, (128, 128))
    keys = (12 * 4096 + 12 * tiled_window_keys(8192, 128, 128, 128)) / 24
    assert tiled == pytest.approx(attention_core_flops(arch, sh, 8192) * keys / attended_keys(arch, 8192))
    assert attended_keys(arch, 8192) == pytest.approx((12 * 4096 + 12 * window_attended_keys(8192, 128)) / 24)


def test_ch001_reads_the_packed_row_the_mask_builder_sees():
    """verl's FSDP engine packs a micro-batch into one row (use_remove_padding) and Ulysses hands each rank its share,
    so transformers' create_chunked_causal_mask reads kv_length = micro_batch_size x seq_length / cp: 4 sequences of
    4,096 tokens make a 16,384-key row that flash_attention_2 refuses on Llama 4's 8,192-token chunks, 2 of them or
    cp 2 do not (fails before: CH001 read seq_length alone and passed all three)."""
    from meshplan.check.config import check_config
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve

    def fired(**fields):
        job, plan = resolve(parse_request({"model": "llama-4-scout", "framework": "verl", "zero_stage": 3,
                                           "num_gpus": 16, "seq_length": 4096, **fields}))
        return [f for f in check_config(job, plan).findings if f.id == "CH001"]

    four = fired(micro_batch_size=4)
    assert four and "16,384 keys" in four[0].message and "micro_batch_size=2" in four[0].fix
    assert not fired(micro_batch_size=2) and not fired(micro_batch_size=4, cp=2)


def test_recommend_keeps_verls_packed_llama4_rows_within_the_chunk():
    """recommend on verl's FSDP engine ranks no layout whose packed row passes the chunk: before, a LoRA job on 16
    H200 at 4,096 tokens ranked micro_batch_size 8 first (a 32,768-key row transformers refuses at the first
    forward)."""
    from meshplan import api
    from meshplan.request.parse import parse_request

    rec = api.recommend(parse_request({"model": "llama-4-scout", "framework": "verl", "gpu": "h200", "num_gpus": 16,
                                       "seq_length": 4096, "global_batch_size": 256, "zero_stage": 3, "job": "lora"}),
                        top_k=3)
    assert rec.candidates and rec.rejected.get("CH001", 0) > 0
    assert all(c.plan.micro_batch_size * 4096 // c.plan.cp <= 8192 for c in rec.candidates)


def test_sglang_pools_llama4_chunks_as_a_window_of_the_chunk():
    """sglang 0.5.12 lists Llama4ForConditionalGeneration in is_hybrid_swa_model, its chunked layers ((i + 1) % 4 != 0)
    as SWA with sliding_window_size = attention_chunk_size (model_runner.py): 12 full and 36 pooled layers."""
    from meshplan.request.parse import parse_request
    from meshplan.request.resolve import resolve
    from meshplan.rl.engine import engine_kv_bytes_per_sequence, kv_bytes_per_token

    job, plan = resolve(parse_request({"model": "llama-4-scout", "framework": "verl", "num_gpus": 16, "job": "rl",
                                       "response_length": 8192, "rollout_tp": 8, "rollout_engine": "sglang"}))
    per_layer = kv_bytes_per_token(job.model, 8) / job.model.num_layers
    assert engine_kv_bytes_per_sequence(job, plan, 40000) == pytest.approx(per_layer * (12 + 0.8 * 36) * 40000)


def test_bridge_gemma2_under_attention_dropout_runs_the_unfused_path():
    """Megatron-Bridge's Gemma2FlexDotProductAttention takes FlexAttention only with dropout off in training
    (fused_eligible = attention_mask is None and dropout_p == 0.0); with dropout on it falls back to
    Gemma2DotProductAttention's unfused scores, softmax and dropout (card attention.unfused_with_dropout). The
    estimate with dropout on is the unfused one, memory and time, whatever the backend; Megatron-Core's Gemma 2 (TE's
    attention) keeps its fused kernel (fails before: Bridge's dropout estimate stayed the flash one, 55.3 GiB)."""
    from meshplan import api
    from meshplan.schema.request import Request

    base = dict(model="gemma-2-27b", gpu="h100", num_gpus=16, tp=8, seq_length=8192, recompute="none", dropout=True)

    def peak(**fields):
        return max(s.total_bytes for s in api.estimate_memory(Request(**{**base, **fields})).stages)

    bridge = dict(framework="megatron-bridge")
    assert peak(**bridge) == peak(**bridge, attention_backend="unfused") > peak(**bridge, dropout=False)
    assert (api.estimate_throughput(Request(**base, **bridge)).step_time_s
            == api.estimate_throughput(Request(**base, **bridge, attention_backend="unfused")).step_time_s)
    core = dict(framework="megatron-core")
    assert peak(**core) < peak(**core, attention_backend="unfused")


def test_bridge_gemma2_unfused_path_keeps_the_softcap_tanh_output():
    """Gemma2DotProductAttention caps the scores as softcap * tanh(scores / softcap) before the softmax; tanh saves
    its output for the backward (one bf16 b x heads/tp x s x s tensor a layer), the division and multiplication by the
    Python float only the scalar (card attention.unfused_softcap). Megatron-Core's unfused attention has no softcap:
    Bridge's dropout-on Gemma 2 keeps exactly one more score matrix a layer (fails before: the two were equal)."""
    from meshplan import api
    from meshplan.schema.request import Request

    base = dict(model="gemma-2-27b", gpu="h100", num_gpus=16, tp=8, seq_length=8192, recompute="none", dropout=True)
    bridge = api.estimate_memory(Request(**base, framework="megatron-bridge")).stages
    core = api.estimate_memory(Request(**base, framework="megatron-core", attention_backend="unfused")).stages
    heads_per_rank, layers = 32 // 8, 46
    assert [b.activations_bytes - c.activations_bytes for b, c in zip(bridge, core, strict=True)] == \
        [layers * 2 * heads_per_rank * 8192 ** 2]
    # core attention recomputed (selective): the tanh output goes with the softmax's
    sel = dict(base, recompute="selective")
    assert (api.estimate_memory(Request(**sel, framework="megatron-bridge")).stages[0].activations_bytes
            == api.estimate_memory(Request(**sel, framework="megatron-core",
                                           attention_backend="unfused")).stages[0].activations_bytes)
