"""The bench reads a row's hardware.inter_node text into network_gbps_per_node (production_rows.network_for), with one
parser for every row and no row-keyed table; a text it cannot read leaves the GPU card's network and is counted.

A test of the bench itself where it reads rows: it imports the bench's modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.knowledge.hardware import get_gpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_rows as prow


@pytest.mark.parametrize(("text", "node", "gbps"), [
    ("8x NDR InfiniBand 400 Gb/s per node (DGX H100)", 8, 3200.0),
    ("InfiniBand NDR 8x 400 Gb/s per node (NVIDIA Eos-DFW)", 8, 3200.0),
    ("8x 400 Gb/s InfiniBand NDR per node (NVIDIA Eos, DGX H100 SuperPOD)", 8, 3200.0),
    ("4x Omni-Path 100 Gb/s per node (Jean Zay, bigscience tr11 README)", 8, 400.0),
    ("8x 800 Gb/s per node (DGX B300)", 8, 6400.0),
    ("400 Gb/s per GPU (IB or RoCE; not always stated)", 8, 3200.0),
    ("RDMA 400 Gb/s CX-7 per GPU", 4, 1600.0),  # per GPU: times the row's node
    ("3.2 Tb/s per node", 8, 3200.0),
    ("50 GB/s per GPU", 8, 3200.0),  # bytes: x 8
])
def test_the_bench_reads_a_rows_network_text(text, node, gbps):
    assert prow.network_for({"inter_node": text, "gpus_per_node": node}, "h100") == (gbps, prow.NETWORK_READ)


@pytest.mark.parametrize(("text", "why"), [
    ("NDR InfiniBand", "states no rate"),
    ("InfiniBand between NVL72 racks", "states no rate"),
    ("not stated", "states no rate"),
    (None, "states no rate"),
    ("InfiniBand NDR 400 Gb/s", "a rate without 'per node' or 'per GPU'"),  # a port's rate: the NICs not said
])
def test_a_text_the_bench_cannot_read_leaves_the_cards_network(text, why):
    assert prow.network_for({"inter_node": text, "gpus_per_node": 8}, "h100") == (None, why)


def test_a_per_gpu_rate_without_the_rows_node_takes_the_parts():
    assert prow.network_for({"inter_node": "400 Gb/s per GPU", "gpus_per_node": None}, "gb200") == (
        400.0 * get_gpu("gb200").gpus_per_node, prow.NETWORK_READ)


def test_the_bench_notes_a_network_only_where_it_is_not_the_cards():
    assert pmap.network_note("h100", 3200.0, 8) is None
    assert pmap.network_note("a100-80gb", 400.0, 8) == (
        "network 400 Gb/s per node: 6.25 GB/s per GPU, where the a100-80gb card has 25")
