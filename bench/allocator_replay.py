"""What torch's CUDA caching allocator reserves over a torchtitan FSDP2 step, from the step's own allocations.

The FakeTensorMode harness (bench/fake_tensor_harness.py) counts allocated bytes. The torchtitan production rows
report reserved bytes (torchtitan's memory monitor logs max_reserved), and what the allocator keeps reserved beside
the live tensors depends on the order and sizes of the step's allocations and on the stream each was made on. This
script records that order and replays it:

1. trace (inside the torchtitan venv, torch 2.13 CPU + torchtitan 0.3.0): Llama-3.1-8B's registry model, cut to
   `layers`, fully_shard on a fake process group of `world` ranks (apply_fsdp_to_decoder: bf16 params, fp32
   reduce), the activation-checkpointing policy (`seqs`: each step's own sequence length, as token-budget
   micro-batches such as verl's use_dynamic_bsz give, each of a different size; else `seq` every step), the
   2024-12 trainer's unchunked loss
   (F.cross_entropy(pred.flatten(0, 1).float(), labels), `del pred`, loss.backward()), AdamW and
   zero_grad(set_to_none=True), three steps. Every storage the FSDPMemTracker sees made, resized or freed is one
   event, with the stream fully_shard makes it on: foreach_all_gather's copy-in in the all-gather copy-in stream,
   foreach_reduce's reduce-scatter output (the sharded gradients are views of it) in the reduce-scatter stream,
   the rest in the default stream (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
2. replay (here): a model of c10/cuda/CUDACachingAllocator.cpp with its defaults (no max_split_size, no expandable
   segments): sizes rounded to 512 B; requests <= 1 MiB from the small pool in 2 MiB segments, larger ones from the
   large pool, a new segment of 20 MiB below 10 MiB and of the size rounded to 2 MiB above; best fit (smallest free
   block of the same stream and pool that is large enough, then lowest address); a block split when the rest is
   >= 512 B (small) or > 1 MiB (large); a freed block merged with its free neighbours in its segment and returned to
   its own stream's pool; no segment released while the memory lasts (no empty_cache). Reported: the steady-state
   (third step) allocated and reserved peaks, with per-stream pools and with one pool.
3. the fit (`least_capacity`): the same model on a GPU of `capacity` bytes, with the allocator's out-of-memory path
   (c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc: when no cached block fits and cudaMalloc
   fails, release_available_cached_blocks, which does nothing without max_split_size, then release_cached_blocks,
   which cudaFrees every cached block that is a whole segment, split from nothing, and alloc_block again; only then
   out of memory). The least capacity that runs every step is what decides the fit on the default allocator: the
   reserved peak of a run with memory to spare counts whole free segments that such a run would hand back. With
   one pool (every allocation on one stream) the seven traces below each need their whole reserved peak: on any
   less, some allocation finds too few whole free segments to hand back (the free memory is in segments that
   still hold a live block). With per-stream pools the reduce-scatter stream's freed gradients lie in whole
   segments of that stream's pool, handed back to the default stream's allocations, and they run on 20-96% of
   the reserve over the allocated peak (2026-12-02: 51% at 2 x 8192 selective, 44% with steps of 8192 / 7168 /
   7680 tokens, 20% / 41% without AC at one / those sizes, 64% at 1 x 32768 full AC, 96% on 128 GPUs).

AdamW runs both ways: foreach (torchtitan 2024-12's build_optimizers: foreach = not fused, fused off by default;
all of a step's sqrt temporaries at once) and single-tensor. DTensor's sharding propagation makes global-shape example
tensors under FakeTensorMode that a GPU makes on the meta device; they are left out of the trace. Not modelled:
torch.compile and Float8 (the production rows ran both), context parallelism, cuBLAS workspaces and NCCL buffers.

    python bench/allocator_replay.py            # the cases below, each optimizer, then FIT_CASES (about 10 minutes)
    python bench/allocator_replay.py --replay TRACE.json   # one saved trace (--trace's output): its peaks and fit
"""

from __future__ import annotations

import bisect
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20
GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]

# The production rows' shapes (../shared/validation/production_configs_dev.yaml torchtitan_llama31_8b_*): 1D FSDP on
# 8 and 128 GPUs (local batch 2 x 8192, selective AC), and FSDP8 CP1 at 32K (full AC).
CASES = {
    "8 GPUs, 2 x 8192, selective AC": {"world": 8, "seq": 8192, "batch": 2, "layers": 32, "policy": "selective"},
    "128 GPUs, 2 x 8192, selective AC": {"world": 128, "seq": 8192, "batch": 2, "layers": 32, "policy": "selective"},
    "8 GPUs, 1 x 32768, full AC": {"world": 8, "seq": 32768, "batch": 1, "layers": 32, "policy": "full"},
}
# What decides the fit on the default allocator (least_capacity) where the steps' sizes differ, as token-budget
# micro-batches (verl's use_dynamic_bsz) do, and without recompute, beside the same steps at one size
FIT_CASES = {
    "8 GPUs, 2 x 8192/7168/7680, selective": {"world": 8, "seq": 8192, "seqs": [8192, 7168, 7680], "batch": 2,
                                              "layers": 32, "policy": "selective"},
    "8 GPUs, 2 x 8192, no AC": {"world": 8, "seq": 8192, "batch": 2, "layers": 32, "policy": "none"},
    "8 GPUs, 2 x 8192/7168/7680, no AC": {"world": 8, "seq": 8192, "seqs": [8192, 7168, 7680], "batch": 2,
                                          "layers": 32, "policy": "none"},
}
STEPS = 3
# Under FakeTensorMode DTensor's sharding propagation makes its global-shape example tensors as fake CPU tensors, which
# the tracker sees; on a GPU they are meta tensors and take no memory (torch/distributed/tensor/_sharding_prop.py)
SHARDING_PROPAGATION = {"_propagate_tensor_meta_non_cached", "gen_fake_args"}


# --------------------------------------------------------------------------- the trace (torchtitan venv)


def trace(case: dict) -> list:
    """The step's storage events: ("a", id, bytes, stream), ("f", id), ("m", label)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import inspect

    import fake_tensor_harness as harness
    import torch
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as collectives
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import _UpdateType
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    source, first = inspect.getsourcelines(collectives.foreach_reduce)
    rs_line = first + next(i for i, line in enumerate(source) if "stream(reduce_scatter_stream)" in line)

    def stream() -> str | None:
        frame = sys._getframe(3)
        while frame is not None:
            if frame.f_code.co_name in SHARDING_PROPAGATION:
                return None  # DTensor's shape propagation: global-shape tensors a GPU makes on the meta device
            if frame.f_code.co_name == "foreach_all_gather":
                return "all_gather_copy_in"
            if frame.f_code.co_name == "foreach_reduce":
                return "reduce_scatter" if frame.f_lineno >= rs_line else "default"
            frame = frame.f_back
        return "default"

    harness.cpu_stand_ins()
    mesh = harness.fake_fsdp_mesh(case["world"])
    cfg = harness.model_config("llama3-8b", list(range(case["layers"])), case["seq"])
    events: list = []
    live: dict[int, int] = {}

    class Recorder(harness.tracker_class(fsdp=True)):
        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            super()._update_snap(u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)
            key = id(winfo)
            if u_type in (_UpdateType.DEL, _UpdateType.SIZE) and key in live:
                events.append(("f", live.pop(key)))
            if u_type in (_UpdateType.ADD, _UpdateType.SIZE) and winfo.mem_consumed > 0:
                where = stream()
                if where is not None:
                    live[key] = len(events)
                    events.append(("a", len(events), winfo.mem_consumed, where))

    with FakeTensorMode():
        model = cfg.build()
        model.train()
        harness.apply_policy(model, case["policy"], "llama3-8b", None)
        apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=case["foreach"])
        tracker = Recorder(model, optimizer)
        tracker.track_external(model, optimizer)
        with tracker:
            for step, seq in enumerate(case.get("seqs") or [case["seq"]] * STEPS):
                tokens, positions = harness._inputs(seq, case["batch"])
                masks = model.get_attention_masks(positions)
                events.append(("m", f"step {step}"))
                pred = model(tokens, positions, masks)
                loss = F.cross_entropy(pred.flatten(0, 1).float(), tokens.flatten(0, 1))
                del pred  # the 2024-12 train.py: "need to free to before bwd to avoid peaking memory"
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del loss
    return events


# --------------------------------------------------------------------------- the allocator model


class _Block:
    __slots__ = ("free", "next", "offset", "pool", "prev", "segment", "size")

    def __init__(self, pool: tuple, segment: int, offset: int, size: int):
        self.pool, self.segment, self.offset, self.size = pool, segment, offset, size
        self.free, self.prev, self.next = True, None, None

    def key(self) -> tuple[int, int, int]:
        return self.size, self.segment, self.offset


class CachingAllocator:
    """The caching allocator's block bookkeeping (see the module docstring), counting allocated and reserved bytes."""

    def __init__(self, per_stream: bool = True, capacity: int | None = None):
        self.per_stream = per_stream
        self.capacity = capacity  # the GPU's bytes for the allocator (None: never runs out)
        self.free_keys: dict[tuple, list] = {}
        self.free_blocks: dict[tuple, dict] = {}
        self.live: dict[int, _Block] = {}
        self.segments = self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def _add_free(self, block: _Block) -> None:
        bisect.insort(self.free_keys.setdefault(block.pool, []), block.key())
        self.free_blocks.setdefault(block.pool, {})[block.key()] = block

    def _take_free(self, block: _Block) -> None:
        keys = self.free_keys[block.pool]
        keys.pop(bisect.bisect_left(keys, block.key()))
        del self.free_blocks[block.pool][block.key()]

    def malloc(self, handle: int, nbytes: int, stream: str) -> None:
        size = 512 if nbytes < 512 else -(-nbytes // 512) * 512
        small = size <= MIB
        pool = (stream if self.per_stream else "default", small)
        keys = self.free_keys.setdefault(pool, [])
        i = bisect.bisect_left(keys, (size, -1, -1))
        if i < len(keys):
            block = self.free_blocks[pool][keys[i]]
            self._take_free(block)
        else:
            segment = 2 * MIB if small else 20 * MIB if size < 10 * MIB else -(-size // (2 * MIB)) * 2 * MIB
            if self.capacity is not None and self.reserved + segment > self.capacity:
                self.release_cached_blocks()  # cudaMalloc failed: hand back every whole free segment, retry
                if self.reserved + segment > self.capacity:
                    raise OutOfMemory(f"{size} B with {self.allocated} B allocated, {self.reserved} B reserved")
            self.segments += 1
            block = _Block(pool, self.segments, 0, segment)
            self.reserved += segment
        rest = block.size - size
        if rest >= 512 if small else rest > MIB:
            tail = _Block(pool, block.segment, block.offset + size, rest)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._add_free(tail)
        block.free = False
        self.live[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, handle: int) -> None:
        block = self.live.pop(handle)
        self.allocated -= block.size
        block.free = True
        for other in (block.prev, block.next):
            if other is None or not other.free:
                continue
            self._take_free(other)
            first, second = (other, block) if other is block.prev else (block, other)
            first.size += second.size
            first.next = second.next
            if second.next is not None:
                second.next.prev = first
            block = first
        self._add_free(block)

    def release_cached_blocks(self) -> None:
        """cudaFree every cached free block that is a whole segment (release_cached_blocks -> release_blocks: a
        block with no prev and no next); the free parts of segments that still hold a live block stay."""
        for blocks in self.free_blocks.values():
            whole = [b for b in blocks.values() if b.prev is None and b.next is None]
            for block in whole:
                self._take_free(block)
                self.reserved -= block.size


class OutOfMemory(RuntimeError):
    """No cached block fits and the whole free segments handed back leave too little for a new one."""


def replay(events: list, per_stream: bool, capacity: int | None = None) -> dict[str, float]:
    """Allocated and reserved peaks of the last step (the earlier ones fill the cache), in GiB; OutOfMemory where
    a GPU of `capacity` bytes cannot run every step."""
    allocator = CachingAllocator(per_stream, capacity)
    steps = 0
    for event in events:
        if event[0] == "a":
            allocator.malloc(event[1], event[2], event[3])
        elif event[0] == "f":
            allocator.free(event[1])
        else:
            steps += 1
            if steps == STEPS:
                allocator.peak_allocated = allocator.allocated
    return {"allocated": allocator.peak_allocated / GIB, "reserved": allocator.peak_reserved / GIB}


def runs(events: list, per_stream: bool, capacity: int) -> bool:
    """Whether every step runs on a GPU of `capacity` bytes."""
    try:
        replay(events, per_stream, capacity)
    except OutOfMemory:
        return False
    return True


def all_steps(events: list, per_stream: bool) -> tuple[int, int]:
    """The allocated and reserved peaks in bytes over every step, with memory to spare."""
    allocator = CachingAllocator(per_stream)
    for event in events:
        if event[0] == "a":
            allocator.malloc(event[1], event[2], event[3])
        elif event[0] == "f":
            allocator.free(event[1])
    return allocator.peak_allocated, allocator.peak_reserved


def least_capacity(events: list, per_stream: bool, step: int = 2 * MIB) -> float:
    """The least capacity, to `step` bytes, on which every step runs (bisection between just below the allocated
    peak of all steps, where nothing runs, and the reserved peak with memory to spare, on which it runs), in GiB."""
    allocated, reserved = all_steps(events, per_stream)
    low, high = -(-allocated // step) - 1, -(-reserved // step)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if runs(events, per_stream, mid * step) else (mid, high)
    return high * step / GIB


# --------------------------------------------------------------------------- entry point


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--trace":  # inside the venv
        case = json.loads(sys.argv[2])
        Path(case["out"]).write_text(json.dumps(trace(case)))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--replay":  # a saved trace
        events = json.loads(Path(sys.argv[2]).read_text())
        for per_stream in (False, True):
            allocated, reserved = all_steps(events, per_stream)
            fit = least_capacity(events, per_stream)
            share = (fit * GIB - allocated) / (reserved - allocated) if reserved > allocated else 0.0
            print(f"every step, {'per-stream pools' if per_stream else 'one pool'}: allocated peak "
                  f"{allocated / GIB:.2f} GiB, reserved peak {reserved / GIB:.2f} GiB with memory to spare; runs on "
                  f"{fit:.2f} GiB: {share:.0%} of the reserve decides the fit")
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from framework_packages import TORCHTITAN_VENV, venv_python

    python = venv_python("torchtitan", TORCHTITAN_VENV, python_version="3.11")
    print("Llama-3.1-8B, torchtitan 0.3.0 model code (eager), FSDP2, unchunked loss, AdamW, "
          f"zero_grad(set_to_none=True); step {STEPS} of {STEPS}, GiB")
    print(f"{'case':36} {'AdamW':13} {'allocated':>9} {'reserved, one pool':>19} {'reserved, per stream':>21} "
          f"{'runs on, one pool':>18} {'runs on, per stream':>20}   (runs on: every step, least_capacity)")
    with tempfile.TemporaryDirectory() as tmp:
        for name, case, foreach in [(n, c, f) for n, c in CASES.items() for f in (True, False)] + [
                (n, c, True) for n, c in FIT_CASES.items()]:
            out = Path(tmp) / "trace.json"
            request = case | {"foreach": foreach, "out": str(out)}
            proc = subprocess.run([str(python), __file__, "--trace", json.dumps(request)],
                                  capture_output=True, text=True, timeout=1800)
            if proc.returncode:
                raise RuntimeError(f"the trace failed ({name}):\n{proc.stderr[-4000:]}")
            events = json.loads(out.read_text())
            one, per = replay(events, per_stream=False), replay(events, per_stream=True)
            print(f"{name:36} {'foreach' if foreach else 'single-tensor':13} {per['allocated']:9.2f} "
                  f"{one['reserved']:19.2f} {per['reserved']:21.2f} {least_capacity(events, False):18.2f} "
                  f"{least_capacity(events, True):20.2f}")

if __name__ == "__main__":
    main()
