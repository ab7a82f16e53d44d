"""NeMo AutoModel's FakeBalancedGate (model.backend.fake_balanced_gate): consecutive routing's destinations, the
flex dispatch it prices, and the reading of the key from a recipe, a request and a bench row."""

from __future__ import annotations

import pytest

from meshplan.adapters.read import import_config
from meshplan.arithmetic.comm import (
    Links,
    alltoall_time,
    consecutive_routing,
    dispatch_time,
    flex_dispatch_time,
    learned_routing,
)
from meshplan.core.errors import MeshplanError
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

LK = Links(domain=8, intra_bw=360e9, inter_bw=40e9, intra_lat=5e-6, inter_lat=10e-6, nic_scaling=1.0, node=8)


def brute(experts: int, top_k: int, ep: int, domain_ranks: int, tokens: int) -> tuple[float, float]:
    """FakeBalancedGate's indices, arange(tokens x top_k).view(-1, top_k) % experts, counted token by token."""
    local = experts // ep
    ranks = domains = 0
    for t in range(tokens):
        picked = [(t * top_k + j) % experts for j in range(top_k)]
        ranks += len({e // local for e in picked})
        domains += len({e // (local * domain_ranks) for e in picked})
    return ranks / tokens, domains / tokens


@pytest.mark.parametrize("experts, top_k, ep, domain_ranks, want", [
    (128, 8, 8, 8, (1.0, 1.0)),  # 16 local experts, blocks of 8 aligned: one rank
    (256, 8, 64, 8, (2.0, 1.0)),  # 4 local experts: two ranks, one node of 32 experts
    (384, 8, 32, 8, (4 / 3, 1.0)),  # 12 local experts: a block of 8 straddles a rank one time in three
    (32, 4, 8, 8, (1.0, 1.0)),
    (6, 4, 3, 1, (2.0, 2.0)),  # blocks wrap around the expert count (token 1: experts 4, 5, 0, 1)
])
def test_consecutive_routing_counts_destinations(experts, top_k, ep, domain_ranks, want):
    got = consecutive_routing(experts, top_k, ep, domain_ranks)
    assert got == pytest.approx(want)
    # the pattern repeats every `experts` tokens: many periods give the same mean
    assert got == pytest.approx(brute(experts, top_k, ep, domain_ranks, 7 * experts))


def test_consecutive_dispatch_inside_one_domain_sends_once_per_rank():
    copy = 1e6
    assert flex_dispatch_time(copy, 1.0, 1.0, 8, 1, LK) == alltoall_time(copy, 8, 1, LK)
    assert dispatch_time(copy, 8, 8, 1, LK, dedup=True, experts=128, consecutive=True) == alltoall_time(copy, 8, 1, LK)
    # learned routing's flex dispatch inside a domain sends a token to each of the ~5.3 ranks its 8 experts reach
    ranks = learned_routing(128, 8, 8, 8)[0]
    assert dispatch_time(copy, 8, 8, 1, LK, dedup=True, experts=128) == alltoall_time(ranks * copy, 8, 1, LK)


def test_consecutive_dispatch_across_domains_formula():
    copy, ranks, domains, size = 1e6, 2.0, 1.0, 64
    want = max(copy * ranks * 63 / 64 / LK.nvlink_bw(8), copy * domains * 7 / 8 / LK.inter_bw) + LK.inter_lat
    assert flex_dispatch_time(copy, ranks, domains, size, 1, LK) == pytest.approx(want)
    assert flex_dispatch_time(copy, ranks, domains, 1, 1, LK) == 0.0


RECIPE = """\
step_scheduler:
  global_batch_size: 512
  local_batch_size: 4
distributed:
  strategy: fsdp2
  ep_size: 8
model:
  config:
    pretrained_model_name_or_path: Qwen/Qwen3-30B-A3B
  backend:
    dispatcher: deepep
    fake_balanced_gate: true
"""


def test_recipe_key_read():
    result = import_config(RECIPE, "recipe.yaml", framework="nemo-automodel", config_format="yaml")
    assert result.request["moe_fake_balanced_gate"] is True
    off = import_config(RECIPE.replace("fake_balanced_gate: true", "fake_balanced_gate: false"), "recipe.yaml",
                        framework="nemo-automodel", config_format="yaml")
    assert off.request["moe_fake_balanced_gate"] is False


def test_request_reaches_the_job_and_refuses_a_dense_model():
    base = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=8, framework="nemo-automodel")
    assert resolve(Request(**base, moe_fake_balanced_gate=True))[0].moe_fake_balanced_gate is True
    assert resolve(Request(**base))[0].moe_fake_balanced_gate is False
    with pytest.raises(MeshplanError, match="moe_fake_balanced_gate"):
        resolve(Request(**base | {"model": "llama-3.1-8b"}, moe_fake_balanced_gate=True))
