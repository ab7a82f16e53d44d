"""What the caching allocator needs over the allocated peak under Megatron-Core's layer-wise CPU offload, replayed.

Why: the dev row mbridge_gb200_llama3_70b_64_fp8_fsdp (Megatron-Bridge v0.4.2, NeMo 26.04.01: Llama-3-70B, FP8
current scaling, Megatron-FSDP over 64 GB200, micro-batch 2 x 8192, 40 of 80 layers' activations offloaded) ran,
while meshplan puts it at 177.3 GiB allocated and 195.1 GiB reserved (its 11% reserve on 173 GB of activations,
logits and gathered buffers, cards/memory.yaml allocator_reserve_fraction) against the GB200's 185.0 GiB. The run set
no expandable segments (Megatron-Bridge v0.4.2 scripts/performance/perf_plugins.py sets
PYTORCH_CUDA_ALLOC_CONF for Llama 3 70B only on its SFT/LoRA and GB300 MXFP8 runs; utils/executors.py
PERF_ENV_VARS has none), so the default allocator's mechanism decides whether the reserve fits, which this
replays through bench/allocator_replay.CachingAllocator with its out-of-memory path.

The trace, per micro-batch of t tokens, one stream (the offload copies run on Transformer Engine's side stream, but
every GPU tensor of them is allocated on the compute stream: TE v2.14.1 366798ef cpu_offload.py start_reload
allocates the reloaded tensor 'on main stream, not offloaded stream', and the offloaded ones were made there):
- per decoder layer, what Megatron-Core 2edffadb's TE layer keeps under FP8 current scaling at tp 1 (the same
  tensors meshplan's arithmetic/activations.py counts for convention megatron: the script prints both sums): the
  input norm's input, its fp8 output and rstd, the fused QKV output (V views it), the rotated Q and K (fused RoPE),
  the attention output and log-sum-exp, the residual (pre-MLP norm input), its fp8 output and rstd, fc1's output
  (the SwiGLU input) and fc2's fp8 input; and the transients between them (each norm's bf16 output before its
  current-scaling cast, the out-projection's fp8 input and output, the SwiGLU's bf16 output, fc2's output);
- TE's DefaultOffloadSynchronizer (v2.14.1 cpu_offload.py _init_offload_synchronization_dicts, fwd_step, bwd_step,
  release_all_memory; _check_if_offload: every saved tensor of at least 256K elements that is not a parameter): the
  first N of M layers offloaded; layer i's saved tensors freed on the GPU before layer M - N + i's forward; in the
  backward its tensors allocated again at the start of layer M - 1 - N + i's backward and freed, as every layer's,
  once its own backward is done;
- the output layer's bf16 logits, which Transformer Engine's fused cross-entropy overwrites with their gradient, then
  the backward in reverse: each layer's gradients as one chain of its forward's widths.
Model states and Megatron-FSDP's buffers (fsdp_double_buffer: the perf script's llama3_70b_pretrain_config_gb200
sets it, persistent) are one block held throughout, at meshplan's figures for the row. Not in the trace: cuBLAS /
TE workspaces, NCCL buffers, the optimizer step (after the activations are gone).

Run: python bench/offload_replay.py [DEV_YAML]   (a few seconds; default: ../shared/validation's dev set)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import production_mapping as pmap
from megatron_packed_replay import Trace, least_capacity, replay
from production_rows import DEFAULT_VALIDATION

from meshplan import api
from meshplan.arithmetic.activations import layer_activations
from meshplan.arithmetic.memory_states import memory_card
from meshplan.estimate.memory import architecture_shape, layout_terms, micro_batch_terms, stage_allocated
from meshplan.request.resolve import resolve

GIB = 1 << 30
BF16, FP8, FP32 = 2, 1, 4
ROW = "mbridge_gb200_llama3_70b_64_fp8_fsdp"
OFFLOAD_MIN_ELEMENTS = 256 * 1024  # TE v2.14.1 cpu_offload.py _check_if_offload
STEPS = 3


def row_request(dev: Path):
    """The dev row's request as bench/production_configs.py maps it."""
    rows = {r["id"]: r for r in yaml.safe_load(dev.read_text(encoding="utf-8"))}
    return pmap.map_row(rows[ROW], Path(tempfile.mkdtemp())).request


def layer_forward(tr: Trace, m, t: int, layer_input: int) -> tuple[list[tuple[int, int, int]], int]:
    """One decoder layer's forward: ((handle, elements, bytes) of what it keeps for the backward, its input first;
    its output)."""
    h, q, kv, f = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.ffn_hidden_size
    keep = [(layer_input, t * h, BF16 * t * h)]

    def kept(nbytes_per: float, elements: int) -> int:
        handle = tr.make(nbytes_per * elements)
        keep.append((handle, elements, int(nbytes_per * elements)))
        return handle

    norm = tr.make(BF16 * t * h)  # input norm's bf16 output, cast to fp8 (current scaling)
    kept(FP8, t * h)
    tr.free(norm)
    kept(FP32, t)  # rstd
    kept(BF16, t * (q + 2 * kv))  # fused QKV output: V views it
    kept(BF16, t * q)  # rotated Q (fused RoPE)
    kept(BF16, t * kv)  # rotated K
    kept(BF16, t * q)  # attention output (the out-projection's saved original input)
    kept(FP32, t * m.num_attention_heads)  # log-sum-exp
    cast = tr.make(FP8 * t * q)  # the out-projection's fp8 input
    proj = tr.make(BF16 * t * h)
    tr.free(cast)
    kept(BF16, t * h)  # the residual: pre-MLP norm input
    tr.free(proj)
    norm = tr.make(BF16 * t * h)
    kept(FP8, t * h)
    tr.free(norm)
    kept(FP32, t)
    kept(BF16, t * 2 * f)  # fc1 output: the SwiGLU input
    act = tr.make(BF16 * t * f)
    kept(FP8, t * f)  # fc2's fp8 input
    tr.free(act)
    fc2 = tr.make(BF16 * t * h)
    output = tr.make(BF16 * t * h)  # the residual add: the next layer's input
    tr.free(fc2)
    return keep, output


def layer_backward(tr: Trace, m, t: int) -> int:
    """One decoder layer's gradients in reverse (a chain of its forward's widths); returns its input gradient."""
    h, q, kv, f = m.hidden_size, m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.ffn_hidden_size
    chain = [BF16 * t * f, BF16 * t * 2 * f, BF16 * t * h, BF16 * t * h, BF16 * t * q, BF16 * t * (q + 2 * kv),
             BF16 * t * h]
    grad = tr.make(chain[0])
    for nbytes in chain[1:]:
        nxt = tr.make(nbytes)
        tr.free(grad)
        grad = nxt
    return grad


def micro_batch(tr: Trace, m, t: int, offloaded: int) -> None:
    """One micro-batch: the forward under TE's synchronizer, logits and fused loss, the backward with its reloads."""
    layers = m.num_layers
    saved: list[list[tuple[int, int, int]]] = []
    gpu: dict[int, list[int]] = {}  # layer -> its saved tensors' handles on the GPU now
    x = tr.make(BF16 * t * m.hidden_size)  # the embedding output
    for i in range(layers):
        j = i - (layers - offloaded)  # fwd_step(i): the offloaded layer whose copy must be done, its GPU copy freed
        if 0 <= j < offloaded:
            tr.free(*[hd for hd, n, _ in saved[j] if n >= OFFLOAD_MIN_ELEMENTS])
            gpu[j] = [hd for hd, n, _ in saved[j] if n < OFFLOAD_MIN_ELEMENTS]
        keep, x = layer_forward(tr, m, t, x)
        saved.append(keep)
        gpu[i] = [hd for hd, _, _ in keep]
    final = tr.make(BF16 * t * m.hidden_size)  # final norm output
    logits = tr.make(BF16 * t * m.vocab_size)  # TE's fused cross-entropy writes the gradient into it
    grad = tr.make(BF16 * t * m.hidden_size)
    tr.free(logits, final, x)
    for i in reversed(range(layers)):
        j = i - (layers - 1 - offloaded)  # bwd_step(i): the reload due now, allocated on the compute stream
        if 0 <= j < offloaded:
            gpu[j] += [tr.make(nbytes) for _, n, nbytes in saved[j] if n >= OFFLOAD_MIN_ELEMENTS]
        nxt = layer_backward(tr, m, t)
        tr.free(grad, *gpu.pop(i))  # release_all_memory once the layer's backward is done
        grad = nxt
    tr.free(grad)


def trace(request) -> tuple[Trace, int, int]:
    """The row's steps as allocation events: (trace, held bytes, tokens per micro-batch)."""
    job, plan = resolve(request)
    t = plan.micro_batch_size * job.seq_length
    mem = api.estimate_memory(request).stages[0]
    held = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes + mem.detail["gathered_layers"]
    tr = Trace()
    tr.make(held)
    for _ in range(STEPS * plan.num_microbatches(job.global_batch_size)):
        micro_batch(tr, job.model, t, job.activation_offload_layers)
    return tr, held, t


def check_sum(request) -> tuple[float, float]:
    """One layer's kept bytes: the trace's and meshplan's (arithmetic/activations.py)."""
    job, plan = resolve(request)
    t = plan.micro_batch_size * job.seq_length
    tr = Trace()
    keep, _ = layer_forward(tr, job.model, t, tr.make(BF16 * t * job.model.hidden_size))
    _, lay, _, _ = micro_batch_terms(job, plan, layout_terms(job, plan))
    return sum(n for _, _, n in keep), sum(layer_activations(architecture_shape(job.model), lay, False,
                                                              "none").values())


def main(argv: list[str]) -> int:
    request = row_request(Path(argv[0]) if argv else DEFAULT_VALIDATION / "production_configs_dev.yaml")
    ours, meshplan = check_sum(request)
    print(f"one layer kept: trace {ours / 1e9:.3f} GB, meshplan {meshplan / 1e9:.3f} GB")
    tr, held, t = trace(request)
    free_run = replay(tr.events)
    allocated, reserved = free_run.peak_allocated, free_run.peak_reserved
    need = least_capacity(tr.events, allocated, reserved)
    card = memory_card()
    outside = card.cuda_context_bytes + card.fixed_overhead_bytes
    transient = allocated - held
    stage = api.estimate_memory(request).stages[0]
    job, _ = resolve(request)
    print(f"{len(tr.events):,} events; {t:,} tokens a micro-batch; held {held / GIB:.1f} GiB")
    spare, runs = (reserved - allocated) / transient, (need - allocated) / transient
    print(f"replay (GiB, + {outside / GIB:.2f} context and fixed overhead): allocated "
          f"{(allocated + outside) / GIB:.1f}, reserved with memory to spare {(reserved + outside) / GIB:.1f} "
          f"(+{spare:.1%} of the transient), runs on {(need + outside) / GIB:.1f} (+{runs:.1%})")
    print(f"meshplan: allocated {stage_allocated(stage) / GIB:.1f}, reserved {stage.total_bytes / GIB:.1f} "
          f"(+{card.allocator_reserve_fraction:.0%}); the {job.gpu.name}: {job.gpu.memory_bytes / GIB:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
