"""Megatron-Core's layer-wise CPU offload (cpu_offloading, cpu_offloading_num_layers): what the GPU keeps, what the
host holds, what the copies cost, where Megatron-Core refuses it, and its render read back."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.offload import layer_offload_split, layer_offload_stall, offload_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rules.engine import Context
from meshplan.rules.offload import layer_offload_refused
from meshplan.schema.request import Request

L8B = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="megatron-core", tp=2, pp=1, seq_length=8192,
           global_batch_size=32, micro_batch_size=1, recompute="none")


def memory(**fields):
    return api.estimate_memory(parse_request(fields))


def test_the_gpu_keeps_m_minus_n_consecutive_layers_and_the_host_the_first_n():
    """Transformer Engine's DefaultOffloadSynchronizer frees layer i before layer M - N + i's forward: at most M - N
    consecutive layers are held; the host holds the first N."""
    assert offload_card().layer_offload_kept_layers == 0  # TE v2.10+'s path; v1 (TE 2.5) would keep one more
    assert layer_offload_split([1.0] * 10, 7) == (3.0, 7.0)
    assert layer_offload_split([1.0, 2.0, 3.0, 4.0, 5.0], 2) == (12.0, 3.0)  # the last three, never offloaded
    assert layer_offload_split([2.0] * 4, 0) == (8.0, 0.0)
    assert layer_offload_split([2.0] * 4, 9) == (2.0, 6.0)  # refused (OF003); forced: M - 1, Transformer Engine's most


def test_the_estimate_moves_the_offloaded_layers_to_the_host():
    base, off = memory(**L8B), memory(**L8B, activation_offload_layers=20)
    b, o = base.stages[0], off.stages[0]
    layer = b.detail["layer_activations"] / 32  # one micro-batch, 32 equal layers
    assert o.detail["host_activations"] == pytest.approx(20 * layer, rel=1e-9)
    assert b.activations_bytes - o.activations_bytes == pytest.approx(20 * layer, abs=2)
    assert o.host_bytes == o.detail["host_activations"]
    assert off.host_bytes_per_node == o.host_bytes * 8
    assert off.peak_bytes < base.peak_bytes
    assert "first 20 of 32 layers on the host" in " ".join(off.assumptions)


def test_copies_hide_behind_the_layers_the_synchronizer_leaves_them():
    # each copy shorter than a layer, more than one layer kept: nothing waits
    assert layer_offload_stall(32, 20, 0.5, 1.0, 2.0) == 0
    # N = M - 1: every copy is waited for as it starts ('prevents overlapping of computation and offload/reload')
    assert layer_offload_stall(4, 3, 0.5, 1.0, 2.0) == pytest.approx(3 * 0.5 + 3 * 0.5)
    # copies longer than the layers: the one stream falls behind and the later layers wait for it
    # copies longer than the layers (M 10, N 5, copy 3, forward 1, backward 2): the stream holds copy i from
    # 1 + 3i to 4 + 3i; layer 5 + i's forward waits for it: 0, 1, 2, 2, 2 = 7 s; the backward's reloads start four
    # layers early and arrive in time
    assert layer_offload_stall(10, 5, 3.0, 1.0, 2.0) == pytest.approx(7.0)
    assert layer_offload_stall(10, 5, 2.0, 1.0, 2.0) == pytest.approx(2.0)


def test_slow_copies_show_in_the_step_time():
    base = api.estimate_throughput(parse_request(dict(L8B)))
    off = api.estimate_throughput(parse_request(dict(L8B, activation_offload_layers=31)))
    assert off.breakdown.offload_s > 0 and off.step_time_s > base.step_time_s


@pytest.mark.parametrize("fields, why", [
    (dict(activation_offload_layers=32), "fewer layers than the model's 32"),
    (dict(activation_offload_layers=8, pp=2), "pp=2"),
    (dict(activation_offload_layers=8, recompute="selective"), "recompute=selective"),
    (dict(activation_offload_layers=8, activation_offload=True), "fine-grained"),
    (dict(activation_offload_layers=8, framework="torchtitan"), "no key for it"),
    (dict(activation_offload_layers=8, model="nemotron-h-8b"), "no CPU offload context"),
])
def test_megatron_core_refusals(fields, why):
    job, plan = resolve(Request(**{**L8B, **fields}))
    values = layer_offload_refused(Context(job, plan))
    assert values is not None and why in values["why"]


def test_refusal_fix_works():
    job, plan = resolve(Request(**{**L8B, "activation_offload_layers": 40}))
    values = layer_offload_refused(Context(job, plan))
    assert "at most 31" in values["fix"]
    fixed, plan = resolve(Request(**{**L8B, "activation_offload_layers": 31}))
    assert layer_offload_refused(Context(fixed, plan)) is None


@pytest.mark.parametrize("framework, keys", [
    ("megatron-core", ["--cpu-offloading-num-layers 20"]),
    ("megatron-bridge", ["cpu_offloading = True", "cpu_offloading_num_layers = 20"]),
])
def test_render_reads_back(framework, keys):
    req = Request(**{**L8B, "framework": framework, "activation_offload_layers": 20})
    rendered = api.render_config(framework, req)
    for key in keys:
        assert key in rendered.text
    imported = api.import_config(rendered.text, path=rendered.filename, framework=framework)
    assert imported.request["activation_offload_layers"] == 20


def test_bridge_count_without_its_switch_offloads_nothing():
    """Megatron-Bridge's provider is a TransformerConfig: cpu_offloading_num_layers alone offloads nothing."""
    req = Request(**{**L8B, "framework": "megatron-bridge", "activation_offload_layers": 20})
    rendered = api.render_config("megatron-bridge", req).text.replace("cfg.model.cpu_offloading = True\n", "")
    imported = api.import_config(rendered, path="layout.py", framework="megatron-bridge")
    assert "activation_offload_layers" not in imported.request
    assert any("no layer offloaded" in note for note in imported.notes)


def test_host_memory_holds_the_offloaded_layers():
    """MEM003 reads the node's host bytes: the offloaded layers' saved tensors of each of its ranks."""
    report = memory(**L8B, activation_offload_layers=20)
    per_node = report.host_bytes_per_node / (1 << 30)
    small = api.check_config(Request(**L8B, activation_offload_layers=20, cpu_memory_per_node=int(per_node) - 1))
    large = api.check_config(Request(**L8B, activation_offload_layers=20, cpu_memory_per_node=int(per_node) + 1))
    assert "MEM003" in {f.id for f in small.findings}
    assert "MEM003" not in {f.id for f in large.findings}


def test_a_gated_deltanet_hybrid_offloads_whole_decoder_layers():
    """Qwen3-Next is built as Megatron-Core's GPTModel: its TransformerBlock's layers are decoder layers of two
    pattern layers each, which the offload count and the refusal's bound read."""
    qwen = dict(model="qwen3-next-80b-a3b", gpu="h100", num_gpus=64, framework="megatron-core", tp=4, pp=1, ep=16,
                seq_length=4096, global_batch_size=64, micro_batch_size=1, recompute="none")
    job, plan = resolve(Request(**qwen, activation_offload_layers=47))
    assert layer_offload_refused(Context(job, plan)) is None  # 48 decoder layers (96 pattern layers)
    job, plan = resolve(Request(**qwen, activation_offload_layers=48))
    assert "at most 47" in layer_offload_refused(Context(job, plan))["fix"]
    base, off = memory(**qwen), memory(**qwen, activation_offload_layers=24)
    layers = base.stages[0].detail["layer_activations"]
    # the first 24 of 48 decoder layers: six whole periods of its pattern, half its saved bytes
    assert off.stages[0].detail["host_activations"] == pytest.approx(layers / 2, rel=1e-9)


@pytest.mark.parametrize("fields", [
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="megatron-core", seq_length=16384,
         global_batch_size=32, activation_offload_layers=24),
    dict(model="llama-3.1-70b", gpu="h100", num_gpus=32, framework="megatron-bridge", seq_length=8192,
         global_batch_size=64, activation_offload_layers=70),
])
def test_the_search_finds_the_oracles_top_k_with_layers_offloaded(fields):
    """recommend keeps the job's offload and searches the rest; its floors count no activations where it offloads
    (a lower bound), so it finds what the exhaustive oracle finds: single-stage plans without recompute (OF003)."""
    from tests.test_search_oracle import check_request_against_the_oracle
    req = Request(**fields)
    assert check_request_against_the_oracle(req, 3)
    for candidate in api.recommend(req, top_k=3).candidates:
        assert candidate.plan.pp == 1 and candidate.plan.recompute == "none"
