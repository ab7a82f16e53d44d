"""bench/offload_replay.py: Megatron-Core's layer-wise CPU offload as Transformer Engine v2.14.1's
DefaultOffloadSynchronizer frees and reloads it, on one stream, through the default allocator's model.

The trace keeps per layer what meshplan's activation arithmetic counts, holds at most M - N layers' saved tensors as
arithmetic/offload.layer_offload_split says (the tensors under 256K elements staying on the GPU), frees everything by
the end of the backward; on the GB200 Llama-3-70B FSDP row's own steps (micro-batches all of one size) it runs on
about 1% of the transient over its allocated peak, not the card's allocator_reserve_fraction that puts the row over.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import offload_replay as bench
import production_mapping as pmap

from meshplan.arithmetic.memory_states import memory_card
from meshplan.arithmetic.offload import layer_offload_split

# six layers wide enough that their tensors take segments of their own size (>= 10 MiB), as the row's do
TINY = SimpleNamespace(hidden_size=2048, num_attention_heads=16, head_dim=128, num_kv_heads=4, ffn_hidden_size=5632,
                       num_layers=6, vocab_size=8192)
T = 4096


def _live(events: list) -> tuple[int, list[int]]:
    """(bytes live after the events, the live bytes after each event)."""
    sizes, live, trail = {}, 0, []
    for event in events:
        if event[0] == "a":
            sizes[event[1]] = event[2]
            live += event[2]
        else:
            live -= sizes.pop(event[1])
        trail.append(live)
    return live, trail


def test_trace_keeps_what_meshplan_counts(production_rows, tmp_path):
    request = pmap.map_row(production_rows[bench.ROW], tmp_path).request
    ours, meshplan = bench.check_sum(request)
    assert abs(ours - meshplan) / meshplan < 0.001


def test_the_gpu_holds_the_last_m_minus_n_layers_and_the_small_tensors_of_the_rest():
    """At the forward's end the GPU holds the M - N layers TE never offloaded (layer_offload_split), the offloaded
    layers' tensors under 256K elements (each norm's rstd, the log-sum-exp here) and the last layer's output."""
    tr = bench.Trace()
    keep, _ = bench.layer_forward(tr, TINY, T, tr.make(bench.BF16 * T * TINY.hidden_size))
    layer = sum(n for _, _, n in keep)
    small = sum(n for _, e, n in keep if e < bench.OFFLOAD_MIN_ELEMENTS)
    assert 0 < small < layer
    for offloaded in (0, 2, 5):
        tr = bench.Trace()
        bench.micro_batch(tr, TINY, T, offloaded)
        logits = next(i for i, e in enumerate(tr.events) if e[0] == "a" and e[2] == bench.BF16 * T * TINY.vocab_size)
        end_of_forward = _live(tr.events[:logits - 1])[0]  # before the final norm's output
        resident, _ = layer_offload_split([layer] * TINY.num_layers, offloaded)
        assert end_of_forward == resident + offloaded * small + bench.BF16 * T * TINY.hidden_size
        live, trail = _live(tr.events)
        assert live == 0  # every reload and saved tensor freed once its layer's backward is done
        assert max(trail) < (TINY.num_layers - offloaded + 2) * layer + bench.BF16 * T * TINY.vocab_size


def test_the_gb200_row_runs_on_its_allocated_peak_and_a_percent(production_rows, tmp_path):
    """The dev row's own steps (two micro-batches of 2 x 8192 a step, 40 of 80 layers offloaded): the replay's
    allocated peak is meshplan's, and the default allocator serves each micro-batch from the blocks the one before
    freed, so the step runs on about 1% of the transient over it, under the GB200's memory, where meshplan's reserve
    (the card's allocator_reserve_fraction of the transient) puts the row over."""
    from meshplan import api
    from meshplan.estimate.memory import stage_allocated
    from meshplan.request.resolve import resolve

    request = pmap.map_row(production_rows[bench.ROW], tmp_path).request
    tr, held, _ = bench.trace(request)
    allocator = bench.replay(tr.events)
    allocated = allocator.peak_allocated
    need = bench.least_capacity(tr.events, allocated, allocator.peak_reserved)
    card = memory_card()
    outside = card.cuda_context_bytes + card.fixed_overhead_bytes
    stage = api.estimate_memory(request).stages[0]
    assert abs(allocated + outside - stage_allocated(stage)) / stage_allocated(stage) < 0.01
    assert need - allocated < card.allocator_reserve_fraction / 4 * (allocated - held)
    capacity = resolve(request)[0].gpu.memory_bytes
    assert need + outside < capacity < stage.total_bytes
