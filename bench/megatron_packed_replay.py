"""What the caching allocator needs over the allocated peak in verl's Megatron actor update, replayed on one stream.

Why: the verl Qwen3-30B-A3B GRPO rows on 8/16/32 H20 ran, but meshplan puts the update at 101.1 GB allocated and
108.7 GB reserved (its 11% reserve on the 69 GB of activations and logits, cards/memory.yaml
allocator_reserve_fraction) against the H20's 102.6 GB. Whether the reserve or an activation term decides that is
what this replays: the update's allocations in the order Megatron-Core makes and frees them, through
bench/allocator_replay.CachingAllocator (PyTorch's default allocator: no expandable segments, which verl's workers
did not set before bf56a2aa2), with its out-of-memory path (whole free segments handed back before the error).

The trace, per micro-batch of t tokens, on one stream (verl sets overlap_grad_reduce False: no gradient stream;
pp 1: Megatron-Core's forward_backward_no_pipelining runs each micro-batch's forward then its backward):
- per decoder layer in the forward, what Megatron-Core's GQA attention and MoE layer with the flex dispatcher keep
  (the same tensors meshplan's arithmetic/activations.py counts for memory convention megatron: the script prints
  both sums) and the transients between them (the q/k norm outputs the fused RoPE replaces, the out-projection
  output before the residual add, the router logits, the dispatched tokens before the permute, the expert output,
  its unpermuted and combined copies);
- the output layer's bf16 logits and verl's loss path beside Megatron's vocab_parallel_cross_entropy
  (use_fused_kernels False) as the verl card's engine.rl_loss.megatron keeps it, 8 B per logit at its peak (`loss`;
  6 before lane rlloss59 counted the path), then the backward in reverse: each layer's
  gradients as one chain of its forward's widths (an approximation of autograd's order: the figures move by a few
  points of the transient with it), then its saved tensors freed.
Weights and fp32 gradient buffers (31.0 GB on the worst rank, meshplan's) are one block held throughout. Not in
the trace: cuBLAS / Transformer Engine workspaces, NCCL and DeepEP buffers, the optimizer step.

Micro-batches as verl's dynamic batching packs them (verl f6f910069 verl/utils/seqlen_balancing.py
rearrange_micro_batches): each mini-batch of one rank (prompts_per_mini_batch x samples / dp sequences) in
ceil(tokens / ppo_max_token_len_per_gpu) balanced partitions (Karmarkar-Karp there, longest-first greedy here), the
heaviest (sum of squared lengths) first. No rule caps a partition at the budget: where the sequences are long
against it some micro-batches exceed it (two sequences of 8.4K tokens in one of 10,240 when every response is at the
maximum and the prompts below theirs), which meshplan, planning micro-batches of the budget, does not count.
Responses drawn from meshplan's length shape at a mean (rl/lengths.py
quantile: the truncated exponential of that mean on [0, maximum]), prompts uniform on [100, 400] tokens (DAPO-Math
prompts; an assumption, said). Nothing here is fitted and no estimate reads it.

Found (2026-12-07, lane reserve61, the loss path at 8 B per logit; 2 mini-batches of 256 sequences a rank; GB with
the 0.81 GB of CUDA context and fixed overhead the trace leaves out): at the rows' scored workload, every micro-batch
10,240 tokens, the allocator serves each micro-batch from the blocks the one before freed and the update runs on
101.94 GB (+1.2% of the transient; reserved with memory to spare +2.0%), which fits the H20's 102.6 GB where
meshplan's 11% says 108.7. At verl's packed micro-batches of differing sizes (mean response 1,000 / 2,000 / 4,000) a
larger micro-batch after a smaller one cannot reuse the blocks the smaller one split, and the update needs 107.46 /
110.27 / 115.35 GB (+8.4% / +11.5% / +11.8% of the transient; reserved +26% / +54% / +90%) against meshplan's
114.07 / 111.18 / 111.12 GB reserved: the default allocator's mechanism does not make these runs fit once their
lengths differ, so the reserve alone does not explain that they ran.

Run: python bench/megatron_packed_replay.py [MEAN ...]   (default 1000 2000 4000; about 1-3 minutes each)
     MEAN `max`: the workload bench/rl_jobs.py scores the rows at (no mean stated): every prompt and response at the
     request's maximum, 2,048 + 8,192, so every micro-batch is one sequence of the 10,240-token budget.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allocator_replay import MIB, CachingAllocator, OutOfMemory

from meshplan.arithmetic.activations import layer_activations
from meshplan.estimate.memory import architecture_shape, layout_terms, micro_batch_terms
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.lengths import quantile, rate

GB = 10**9
BF16, FP32, INT64 = 2, 4, 8
# bench/data/rl_workloads.yaml run_qwen3moe-30b_megatron_96gb.sh on 8 H20 (the row verl_qwen3_30b_h20_8)
REQUEST = next(w["request"] for w in yaml.safe_load((Path(__file__).resolve().parent / "data" / "rl_workloads.yaml")
                                                    .read_text())["scripts"]
               if w["script"] == "run_qwen3moe-30b_megatron_96gb.sh") | {"num_gpus": 8, "gpu": "h20"}
PROMPTS = (100, 400)  # DAPO-Math prompt tokens (assumed; the script's 2,048 is its maximum)


@dataclass(frozen=True)
class Shapes:
    """The per-token widths the trace allocates, from the catalog model and the plan."""

    hidden: int
    q: int  # query width (heads x head dim)
    kv: int  # one of K or V (kv heads x head dim)
    heads: int
    kv_heads: int
    experts: int  # routed experts in all
    local: int  # routed experts on this EP rank
    top_k: int
    ffn: int  # one routed expert's width
    vocab: int
    layers: int
    ranks_reached: float  # EP ranks a token's top-k experts reach on average (DeepEP sends a token once per rank)


def shapes(job, plan) -> Shapes:
    arch, moe = job.model, job.model.moe
    head = arch.head_dim or arch.hidden_size // arch.num_attention_heads
    local = moe.num_experts // plan.ep
    miss = math.comb(moe.num_experts - local, moe.top_k) / math.comb(moe.num_experts, moe.top_k)
    return Shapes(arch.hidden_size, arch.num_attention_heads * head, arch.num_kv_heads * head,
                  arch.num_attention_heads, arch.num_kv_heads, moe.num_experts, local, moe.top_k,
                  moe.expert_ffn_hidden_size, arch.vocab_size, arch.num_layers, plan.ep * (1 - miss))


class Trace:
    """Allocation events ("a", id, bytes, stream) / ("f", id), as allocator_replay replays them."""

    def __init__(self) -> None:
        self.events: list = []
        self.count = 0

    def make(self, nbytes: float) -> int:
        self.count += 1
        self.events.append(("a", self.count, int(nbytes), "default"))
        return self.count

    def free(self, *handles: int) -> None:
        self.events += [("f", h) for h in handles]


def layer_forward(tr: Trace, s: Shapes, t: int) -> tuple[list[int], int]:
    """One decoder layer's forward: (what it keeps for the backward, its output)."""
    rows, recv, h = s.top_k * t, s.ranks_reached * t, s.hidden
    keep = [tr.make(BF16 * t * h), tr.make(FP32 * t)]  # input norm output (QKV weight grad), its rstd
    keep.append(tr.make(BF16 * t * (s.q + 2 * s.kv)))  # fused QKV output: V views it, the q/k norms keep it
    qn, kn = tr.make(BF16 * t * s.q), tr.make(BF16 * t * s.kv)  # q/k norm outputs, replaced by the fused RoPE
    keep += [tr.make(FP32 * t * s.heads), tr.make(FP32 * t * s.kv_heads)]  # their rstd
    keep += [tr.make(BF16 * t * s.q), tr.make(BF16 * t * s.kv)]  # rotated Q and K
    tr.free(qn, kn)
    keep += [tr.make(BF16 * t * s.q), tr.make(FP32 * t * s.heads)]  # attention output, log-sum-exp
    proj = tr.make(BF16 * t * h)
    keep.append(tr.make(BF16 * t * h))  # residual: the pre-MLP norm's input
    tr.free(proj)
    keep += [tr.make(BF16 * t * h), tr.make(FP32 * t)]  # pre-MLP norm output (router and dispatch input), rstd
    logits = tr.make(FP32 * t * s.experts)
    keep += [tr.make(FP32 * t * s.experts), tr.make(INT64 * t * s.top_k), tr.make(FP32 * t * s.top_k),
             tr.make(t * s.experts)]  # softmax scores, top-k ids and probs, routing map
    tr.free(logits)
    dispatched = tr.make(BF16 * recv * h)
    keep.append(tr.make(FP32 * recv * (2 * s.local + 1)))  # the permute's row map
    keep.append(tr.make(BF16 * rows * h))  # permuted tokens: the experts' fc1 input
    tr.free(dispatched)
    keep += [tr.make(FP32 * rows), tr.make(BF16 * rows * 2 * s.ffn), tr.make(BF16 * rows * s.ffn)]  # probs, fc1, act
    out = tr.make(BF16 * rows * h)
    unpermuted = tr.make(BF16 * recv * h)
    tr.free(out)
    combined = tr.make(BF16 * t * h)
    tr.free(unpermuted)
    output = tr.make(BF16 * t * h)  # the residual add: the next layer's input
    tr.free(combined)
    return keep, output


def layer_backward(tr: Trace, s: Shapes, t: int, keep: list[int]) -> int:
    """One decoder layer's backward: its gradients in reverse, its saved tensors freed; returns the input gradient."""
    rows, recv, h = s.top_k * t, s.ranks_reached * t, s.hidden
    chain = [BF16 * t * h, BF16 * recv * h, BF16 * rows * h, BF16 * rows * s.ffn, BF16 * rows * 2 * s.ffn,
             BF16 * rows * h, BF16 * recv * h, BF16 * t * h, BF16 * t * h, BF16 * t * s.q,
             BF16 * t * (s.q + 2 * s.kv)]
    grad = tr.make(chain[0])
    for nbytes in chain[1:]:
        nxt = tr.make(nbytes)
        tr.free(grad)
        grad = nxt
    result = tr.make(BF16 * t * h)
    tr.free(grad, *reversed(keep))
    return result


def loss(tr: Trace, s: Shapes, t: int) -> int:
    """The output layer's logits and verl's loss path through the backward, as cards/frameworks/verl.yaml
    engine.rl_loss.megatron counts it (its kept bytes per logit, meshplan's rl_loss_bytes): the bf16 logits, divided
    in place by the temperature, and Megatron's fp32 copy, exponentiated in place; in the backward the incoming bf16
    gradient, the fp32 copy released, then CopySlices' base-sized zero-filled buffer and the cloned slice beside the
    logits. Returns the gradient of the final norm's output."""
    logits = tr.make(BF16 * t * s.vocab)
    softmax = tr.make(FP32 * t * s.vocab)
    grad_logits = tr.make(BF16 * t * s.vocab)
    tr.free(softmax)
    base, clone = tr.make(BF16 * t * s.vocab), tr.make(BF16 * t * s.vocab)
    tr.free(grad_logits, clone, logits)
    grad = tr.make(BF16 * t * s.hidden)
    tr.free(base)
    return grad


def micro_batch(tr: Trace, s: Shapes, t: int) -> None:
    """One micro-batch's forward, logits and loss, and backward."""
    inputs, x = [], tr.make(BF16 * t * s.hidden)
    saved = []
    for _ in range(s.layers):
        keep, out = layer_forward(tr, s, t)
        saved.append(keep)
        inputs.append(x)
        x = out
    final = tr.make(BF16 * t * s.hidden)
    grad = loss(tr, s, t)
    tr.free(final, x)
    for keep, layer_input in zip(reversed(saved), reversed(inputs), strict=True):
        nxt = layer_backward(tr, s, t, keep)
        tr.free(grad, layer_input)
        grad = nxt
    tr.free(grad)


def packed(rng: random.Random, sequences: int, budget: int, maximum: int, mean: int | None,
           prompts: tuple[int, int] = PROMPTS) -> list[int]:
    """One rank's mini-batch in verl's dynamic micro-batches: their token counts, heaviest first."""
    u = rate(mean / maximum) if mean else None
    lengths = [rng.randint(*prompts) + (maximum if u is None else max(1, round(maximum * quantile(u, rng.random()))))
               for _ in range(sequences)]
    bins: list[list[int]] = [[] for _ in range(-(-sum(lengths) // budget))]
    for n in sorted(lengths, reverse=True):
        min(bins, key=sum).append(n)
    bins.sort(key=lambda b: sum(n * n for n in b), reverse=True)
    return [sum(b) for b in bins]


def replay(events: list, capacity: int | None = None) -> CachingAllocator:
    allocator = CachingAllocator(per_stream=False, capacity=capacity)
    for event in events:
        if event[0] == "a":
            allocator.malloc(event[1], event[2], event[3])
        else:
            allocator.free(event[1])
    return allocator


def least_capacity(events: list, allocated: int, reserved: int, step: int = 2 * MIB) -> int:
    """The least capacity, to `step`, on which the trace runs (bisected between the allocated and reserved peaks)."""
    low, high = allocated // step - 1, -(-reserved // step)
    while high - low > 1:
        mid = (low + high) // 2
        try:
            replay(events, mid * step)
            high = mid
        except OutOfMemory:
            low = mid
    return high * step


def run(mean: int | None, mini_batches: int = 2, seed: int = 0, at_maximum: bool = False) -> dict:
    """The replay at a mean response (None: every response at the maximum, prompts drawn from PROMPTS), or
    `at_maximum`: every prompt and response at the request's maximum, the rows' workload in bench/rl_jobs.py."""
    job, plan = resolve(parse_request(REQUEST))
    s = shapes(job, plan)
    rl = job.rl
    budget = rl.prompt_length + rl.response_length  # ppo_max_token_len_per_gpu in the script
    sequences = rl.prompts_per_mini_batch * rl.samples_per_prompt // plan.dp
    tr = Trace()
    tr.make(31.0 * GB)  # weights and fp32 gradient buffers, held throughout (meshplan's 10.33 + 20.66 GB)
    rng = random.Random(seed)
    sizes: list[int] = []
    for _ in range(mini_batches):
        batch = packed(rng, sequences, budget, rl.response_length, None if at_maximum else mean,
                       (rl.prompt_length, rl.prompt_length) if at_maximum else PROMPTS)
        sizes += batch
        for t in batch:
            micro_batch(tr, s, t)
    free_run = replay(tr.events)
    allocated, reserved = free_run.peak_allocated, free_run.peak_reserved
    need = least_capacity(tr.events, allocated, reserved)
    transient = allocated - 31.0 * GB
    return {"mean": mean, "micro_batches": len(sizes), "tokens": (min(sizes), max(sizes)),
            "over_budget": sum(1 for n in sizes if n > budget),
            "allocated_gb": allocated / GB, "reserved_gb": reserved / GB, "runs_on_gb": need / GB,
            "reserve_share": (reserved - allocated) / transient, "needed_share": (need - allocated) / transient}


def check_sum() -> tuple[float, float]:
    """One layer's kept bytes at a full micro-batch: the trace's and meshplan's (arithmetic/activations.py)."""
    job, plan = resolve(parse_request(REQUEST))
    s = shapes(job, plan)
    t = job.rl.prompt_length + job.rl.response_length
    tr = Trace()
    keep, _ = layer_forward(tr, s, t)
    sizes = {e[1]: e[2] for e in tr.events if e[0] == "a"}
    trace_bytes = sum(sizes[h] for h in keep) + BF16 * t * s.hidden  # plus the layer's input
    _, lay, _, _ = micro_batch_terms(job, plan, layout_terms(job, plan))
    return trace_bytes, sum(layer_activations(architecture_shape(job.model), lay, True, "none").values())


def meshplan_update(mean: int | None) -> tuple[float, float, float]:
    """meshplan's actor update on the request's worst stage: allocated peak, reserved peak (allocated + the card's
    allocator_reserve_fraction of the transient) and the CUDA context and fixed overhead inside both, in bytes."""
    from meshplan import api
    from meshplan.arithmetic.memory_states import memory_card
    from meshplan.estimate.memory import stage_allocated

    mem = api.estimate_memory(parse_request(REQUEST | ({"mean_response_length": mean} if mean else {})))
    stage = max(mem.stages, key=stage_allocated)
    card = memory_card()
    return stage_allocated(stage), stage.total_bytes, card.cuda_context_bytes + card.fixed_overhead_bytes


def main(argv: list[str]) -> int:
    means = [a if a == "max" else int(a) for a in argv] if argv else [1000, 2000, 4000]
    ours, meshplan = check_sum()
    print(f"one layer kept at 10,240 tokens: trace {ours / 1e6:.1f} MB, meshplan {meshplan / 1e6:.1f} MB")
    print("verl Qwen3-30B-A3B, 8 H20 (EP8), 2 mini-batches of 256 sequences; one stream, default allocator")
    for mean in means:
        r = run(None, at_maximum=True) if mean == "max" else run(mean)
        print(f"  mean response {mean}: {r['micro_batches']} micro-batches of "
              f"{r['tokens'][0]:,}-{r['tokens'][1]:,} tokens ({r['over_budget']} over the budget); allocated "
              f"{r['allocated_gb']:.2f} GB, reserved "
              f"{r['reserved_gb']:.2f} GB (+{r['reserve_share']:.1%} of the transient), runs on {r['runs_on_gb']:.2f} "
              f"GB (+{r['needed_share']:.1%})")
        allocated, reserved, outside = meshplan_update(None if mean == "max" else mean)
        print(f"    meshplan's update: allocated {allocated / GB:.2f} GB, reserved {reserved / GB:.2f} GB, of which "
              f"{outside / GB:.2f} GB the CUDA context and fixed overhead the trace leaves out: the replay's "
              f"\"runs on\" with them {(r['runs_on_gb'] * GB + outside) / GB:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
