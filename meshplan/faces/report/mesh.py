"""Which ranks form each parallel group, for the mesh picture.

Ranks are placed in Megatron-Core's order, the one meshplan's communication model assumes
(meshplan/arithmetic/mesh.py): TP innermost, then CP, then DP, PP outermost; the expert groups ETP, EP,
expert-DP, then PP. A group is `size` ranks spaced `stride` apart; whether it needs the network is
`mesh.crosses_domains`, the same call the step-time estimate makes, so the picture and the numbers agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.arithmetic.mesh import crosses_domains
from meshplan.schema.plan import Plan

MAX_DRAWN_RANKS = 256  # a larger world is drawn by its first ranks (whole groups of the inner axes), and says so


@dataclass(frozen=True)
class Axis:
    """One kind of parallel group: its name, members per group, their spacing, and whether it crosses nodes."""

    name: str
    size: int
    stride: int
    crosses_network: bool
    expert: bool = False

    def group_of(self, rank: int) -> int:
        """The index of the group `rank` belongs to (groups numbered in rank order of their first member)."""
        block = rank // (self.stride * self.size)
        return block * self.stride + rank % self.stride

    def members(self, group: int) -> list[int]:
        block, offset = divmod(group, self.stride)
        first = block * self.stride * self.size + offset
        return [first + i * self.stride for i in range(self.size)]


def axes(plan: Plan, world: int, domain: int, moe: bool) -> list[Axis]:
    """The groups of size > 1 a plan forms over `world` ranks, dense axes first, then the expert axes."""
    dp = max(1, world // (plan.tp * plan.cp * plan.pp))
    dense = [("TP", plan.tp, 1), ("CP", plan.cp, plan.tp), ("DP", dp, plan.tp * plan.cp),
             ("PP", plan.pp, plan.tp * plan.cp * dp)]
    found = [Axis(name, size, stride, crosses_domains(size, stride, domain))
             for name, size, stride in dense if size > 1]
    if moe and plan.ep > 1:
        expert_dp = max(1, world // (plan.pp * plan.ep * plan.etp))
        for name, size, stride in [("EP", plan.ep, plan.etp), ("EDP", expert_dp, plan.ep * plan.etp)]:
            if size > 1:
                found.append(Axis(name, size, stride, crosses_domains(size, stride, domain), expert=True))
    return found


def drawn_ranks(world: int) -> int:
    """How many ranks the picture draws: all of them up to MAX_DRAWN_RANKS."""
    return min(world, MAX_DRAWN_RANKS)
