"""One training step of Hugging Face transformers' model code on a real GPU: the CUDA caching allocator's peaks and
the step time, as verl's FSDP2 engine runs it on one rank.

The GPU twin of `bench/fake_tensor_hf_harness.py`'s `step_peak` (same model build, same wrap, same loss, same
optimizer), run by `bench/gpu_steps.py` on a lent GPU machine; meshplan never imports it, and it never imports
meshplan (the device has torch and transformers, not meshplan's runtime). One case per process, because the
allocator's settings (expandable segments) are fixed when CUDA starts:

    python gpu_step_harness.py CASE.json OUT.json              # one case
    python gpu_step_harness.py --cases CASES.json --out DIR    # each case, each allocator setting, a process each
    python gpu_step_harness.py --fit CASES.json --out DIR      # each case's least capacity on the default allocator

`--fit` measures what decides the fit on PyTorch's default allocator: each case runs once with the memory to spare,
then again under torch.cuda.set_per_process_memory_fraction at capacities between its allocated and reserved peaks
(bisection, a process each), where the allocator's cudaMalloc fails as on a full GPU and it frees its cached whole
segments and retries (c10/cuda/CUDACachingAllocator.cpp malloc: release_cached_blocks) before raising out of memory.
A case's `step_tokens` (a list, taken in turn by the steps) gives each step its own packed length, as verl's
token-budget micro-batches (use_dynamic_bsz) are each of a different size; else every step packs `tokens`. A case's
`one_stream` trains the model in bf16 without FSDP2, so every allocation is on the default stream (as in Megatron's
actor update without overlapped gradient reduction): the caching allocator keeps one pool per stream, and a cached
whole segment of another stream's pool is what the out-of-memory path hands back (bench/allocator_replay.py).

What runs: the HF causal-LM class of the config.json fields (cut to `num_layers` decoder layers), fp32 parameters,
fully_shard per `_no_split_modules` layer (and an untied embedding) then the root, MixedPrecisionPolicy bf16 params /
fp32 reduce, over a real one-rank process group (nccl); one packed row of tokens with position ids; attention through
torch's flash SDPA kernel (flash-attention 2: saves q, k, v unrepeated, the output and the fp32 log-sum-exp, as
flash_attn does; no flash_attn package is needed); the log-probs from a cross-entropy that allocates nothing per
logit and writes its gradient into the logits (as flash_attn's Triton cross-entropy that verl calls: here chunked
torch ops, whose fp32 temporaries of CHUNK_ROWS rows are the only difference); a per-token policy loss; AdamW with
torch's default (foreach on CUDA); zero_grad(set_to_none=True). HF gradient checkpointing for policy "full".

What it reports, from torch.cuda's own counters: the allocated and reserved peaks over the steps after the first
(the first builds the optimizer state), the allocated peak of each phase (forward to the loss, backward, optimizer
step), what is allocated between steps, the device's used memory (mem_get_info) before the model and at the end,
and the wall time of each timed step and of its phases (cuda synchronised at each phase's end; the 2026-11-30 run
predates the phase times).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings

import torch

# the verl step's model build, FSDP2 wrap and loss, shared with the FakeTensorMode harness (this folder, on sys.path as
# the script's own); it imports only torch at module level
from fake_tensor_hf_harness import build, verl_fsdp2_wrap, verl_loss

warnings.filterwarnings("ignore")

ATTENTION = "fa2_torch_kernel"  # no "flash" in the name: transformers would look for a flash_attn package
CHUNK_ROWS = 128
FALLBACKS: set[str] = set()  # what ran otherwise than verl would, reported with the case


def flash_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """An AttentionInterface function: q [b, a, s, d], k/v [b, g, s, d] -> [b, s, a, d] (flash_attention_2's
    layout). A V head narrower than Q's (MLA) is padded to Q's width, as HF does for flash, and the output sliced."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    v_dim, q_dim = value.shape[-1], query.shape[-1]
    if v_dim < q_dim:
        value = torch.nn.functional.pad(value, [0, q_dim - v_dim])
    backend = SDPBackend.FLASH_ATTENTION if query.is_cuda else SDPBackend.MATH
    groups = query.shape[1] // key.shape[1]
    try:
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, is_causal=True, scale=scaling, enable_gqa=groups > 1)
    except RuntimeError as exc:  # this torch's flash kernel refuses GQA: repeat K/V (saved, unlike flash_attn's)
        FALLBACKS.add(f"repeated K/V heads: {str(exc)[:200]}")
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    out = out.transpose(1, 2)
    return (out[..., :v_dim] if v_dim < q_dim else out), None


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(ATTENTION, flash_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, flash_attention_mask)


class ChunkedCrossEntropy(torch.autograd.Function):
    """Per-row losses of bf16 logits [T, V] with no per-logit allocation: fp32 log-sum-exp per row, the gradient
    written into the saved logits (flash_attn's Triton cross-entropy, inplace_backward, as verl calls it)."""

    @staticmethod
    def forward(ctx, logits, labels):
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], CHUNK_ROWS):
            lse[start:start + CHUNK_ROWS] = torch.logsumexp(logits[start:start + CHUNK_ROWS].float(), dim=-1)
        picked = logits.gather(1, labels.unsqueeze(1)).squeeze(1).float()
        ctx.save_for_backward(logits, lse, labels)
        return lse - picked

    @staticmethod
    def backward(ctx, grad_losses):
        logits, lse, labels = ctx.saved_tensors
        for start in range(0, logits.shape[0], CHUNK_ROWS):
            rows = slice(start, start + CHUNK_ROWS)
            probs = torch.exp(logits[rows].float() - lse[rows].unsqueeze(1))
            probs.scatter_add_(1, labels[rows].unsqueeze(1), -torch.ones_like(lse[rows]).unsqueeze(1))
            logits[rows].copy_(probs * grad_losses[rows].unsqueeze(1))
        return logits, None


def one_rank_mesh(device: torch.device):
    """A real process group of one rank (nccl on a GPU, gloo on a CPU dry run) and its one-dimensional mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    return init_device_mesh(device.type, (1,))


class Counters:
    """torch.cuda's allocator counters, or nothing on a CPU dry run."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else 0

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated() if self.cuda else 0

    def reserved_peak(self) -> int:
        return torch.cuda.max_memory_reserved() if self.cuda else 0

    def used(self) -> int:
        if not self.cuda:
            return 0
        free, total = torch.cuda.mem_get_info()
        return total - free


def run(case: dict) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    counters = Counters(device)
    if counters.cuda:
        torch.cuda.init()
        torch.empty(1, device=device)
        if case.get("capacity_bytes"):  # the allocator's reserve may not pass this: a smaller GPU
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(case["capacity_bytes"] / total, device)
    used_before = counters.used()
    register_attention()
    one_stream = case.get("one_stream", False)
    with device:  # one_stream: a bf16 model, no FSDP2 (whose collectives allocate on streams of their own)
        model = build(case, dtype=torch.bfloat16 if one_stream else torch.float32, attention=ATTENTION)
    if not one_stream:
        verl_fsdp2_wrap(model, one_rank_mesh(device))
    params_bytes = counters.allocated()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    step_tokens = case.get("step_tokens") or [case["tokens"]]
    generator = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, int(model.config.vocab_size), (1, max(step_tokens) + 1), generator=generator).to(device)
    steps, timed, phases, between, peaks, reserved = case.get("steps", 6), [], [], [], [], []
    phase_times: list[dict] = []
    for step in range(steps):
        tokens = step_tokens[step % len(step_tokens)]
        inputs, labels = ids[:, :tokens], ids[0, 1:tokens + 1]
        positions = torch.arange(tokens, device=device).unsqueeze(0)
        counters.sync()
        start = time.perf_counter()
        counters.reset()
        loss = verl_loss(model, inputs, positions, labels, case, ChunkedCrossEntropy)
        counters.sync()
        forward_at = time.perf_counter()
        forward_peak = counters.peak()
        overall = forward_peak
        counters.reset()
        loss.backward()
        counters.sync()
        backward_at = time.perf_counter()
        backward_peak = counters.peak()
        overall = max(overall, backward_peak)
        counters.reset()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        counters.sync()
        step_peak = counters.peak()
        overall = max(overall, step_peak)
        seconds = time.perf_counter() - start
        del loss
        if step >= 1:
            phases.append({"forward": forward_peak, "backward": backward_peak, "optimizer": step_peak})
            peaks.append(overall)
            reserved.append(counters.reserved_peak())
            between.append(counters.allocated())
        if step >= 2:
            timed.append(seconds)
            phase_times.append({"forward": forward_at - start, "backward": backward_at - forward_at,
                                "optimizer": start + seconds - backward_at})
    counters.sync()
    return {"ok": True, "device": torch.cuda.get_device_name() if counters.cuda else "cpu",
            "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "experts_implementation": getattr(model.config, "_experts_implementation", None),
            "model_class": type(model).__name__, "fallbacks": sorted(FALLBACKS),
            "hidden": int(model.config.hidden_size),
            "params": sum(p.numel() for p in model.parameters()),
            "used_before_model": used_before, "used_at_end": counters.used(),
            "params_bytes": params_bytes, "peak_allocated": max(peaks), "peak_reserved": max(reserved),
            "phase_peaks": phases[-1], "allocated_between_steps": between[-1],
            "step_seconds": timed, "step_seconds_median": statistics.median(timed),
            "phase_seconds_median": {k: statistics.median(p[k] for p in phase_times) for k in phase_times[0]}}


def run_all(cases_path: str, out_dir: str, budget_seconds: float) -> None:
    """Each case in its own process, once with the default allocator and once with expandable segments; no new
    process starts after `budget_seconds` (the lease's device time), and the cases come in the order given."""
    cases = json.loads(open(cases_path).read())
    os.makedirs(out_dir, exist_ok=True)
    start, results = time.perf_counter(), []
    for case in cases:
        for alloc in case.get("allocators", ["", "expandable_segments:True"]):
            if time.perf_counter() - start > budget_seconds:
                results.append({"case": case["case"], "allocator": alloc, "ok": False, "error": "not run: budget"})
                continue
            results.append(run_one(case, alloc, f"{case['case']}{'_exp' if alloc else ''}"))
            print(json.dumps({k: results[-1].get(k) for k in ("case", "allocator", "ok", "peak_allocated",
                                                               "peak_reserved", "step_seconds_median", "error")}),
                  flush=True)
            with open(os.path.join(out_dir, "gpu_steps.json"), "w") as handle:
                json.dump({"results": results, "nvidia_smi": smi()}, handle, indent=1)


def run_one(case: dict, alloc: str, name: str) -> dict:
    """One case in a process of its own with the allocator setting `alloc` ("" the default)."""
    import subprocess

    case_file, out_file = f"/tmp/{name}.json", f"/tmp/{name}.out.json"
    with open(case_file, "w") as handle:
        json.dump(case, handle)
    if os.path.exists(out_file):
        os.remove(out_file)
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": alloc} if alloc else {
        k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    try:
        proc = subprocess.run([sys.executable, __file__, case_file, out_file], env=env, capture_output=True,
                              text=True, timeout=case.get("timeout", 240))
    except subprocess.TimeoutExpired as exc:
        proc = subprocess.CompletedProcess(exc.cmd, -9, "", f"timed out after {exc.timeout} s")
    if os.path.exists(out_file):
        return json.loads(open(out_file).read())
    return {"case": case["case"], "allocator": alloc, "ok": False,
            "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}


def fit_all(cases_path: str, out_dir: str, budget_seconds: float, rounds: int = 6) -> None:
    """Each case on the default allocator: its peaks with memory to spare, then the least capacity (to 1/2**rounds
    of the gap between them) on which it runs every step; a case that fails for another reason than out of memory
    stops its bisection, and no new process starts after `budget_seconds`."""
    cases = json.loads(open(cases_path).read())
    os.makedirs(out_dir, exist_ok=True)
    start, results = time.perf_counter(), []
    for case in cases:
        free = run_one(case, "", f"{case['case']}_fit")
        entry = {"case": case["case"], "ok": free.get("ok", False), "peak_allocated": free.get("peak_allocated"),
                 "peak_reserved": free.get("peak_reserved"), "tries": []}
        if entry["ok"]:
            low, high = free["peak_allocated"], free["peak_reserved"]  # nothing runs below; this one ran
            for n in range(rounds):
                if time.perf_counter() - start > budget_seconds:
                    entry["stopped"] = "budget"
                    break
                mid = (low + high) // 2
                out = run_one(case | {"capacity_bytes": mid}, "", f"{case['case']}_fit{n}")
                oom = not out.get("ok") and "OutOfMemory" in str(out.get("error"))
                entry["tries"].append({"capacity": mid, "ok": out.get("ok", False), "oom": oom})
                if out.get("ok"):
                    high = mid
                elif oom:
                    low = mid
                else:
                    entry["stopped"] = str(out.get("error"))[:500]
                    break
            entry["least_capacity"] = high
        results.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "tries"}), flush=True)
        with open(os.path.join(out_dir, "gpu_fit.json"), "w") as handle:
            json.dump({"results": results, "nvidia_smi": smi()}, handle, indent=1)


def smi() -> str:
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi: {exc}"


def main() -> None:
    import transformers

    if sys.argv[1] == "--fit":
        fit_all(sys.argv[2], sys.argv[sys.argv.index("--out") + 1],
                float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 1e9)
        return
    if sys.argv[1] == "--cases":
        run_all(sys.argv[2], sys.argv[sys.argv.index("--out") + 1],
                float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 1e9)
        return
    case = json.loads(open(sys.argv[1]).read())
    start = time.perf_counter()
    try:
        out = run(case)
    except Exception as exc:  # reported per case: one failing case does not hide the others
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    out.update({"case": case["case"], "seconds": round(time.perf_counter() - start, 2), "torch": torch.__version__,
                "transformers": transformers.__version__})
    with open(sys.argv[2], "w") as handle:
        json.dump(out, handle)
    print(json.dumps({k: v for k, v in out.items() if k not in ("step_seconds",)}))


if __name__ == "__main__":
    main()
