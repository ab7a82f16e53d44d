"""Muon's optimizer step: the matrices one rank orthogonalizes and the seconds its Newton-Schulz iterations take.

Muon keeps one momentum per weight matrix and replaces Adam's elementwise update by an orthogonalization: a few
Newton-Schulz iterations, each three GEMMs on the matrix. That is compute Adam does not have, so the step costs
more than the optimizer's memory traffic. Which matrices, at what size and on which rank follow the framework
card's `muon` section (tensor-parallel mode, iterations, the split QKV); the GEMMs run at the same calibrated
efficiency as the model's own (gemm.gemm_efficiency), so no constant here is fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.arithmetic.flops import Gemm, Shard, attention_gemms, mlp_gemms, moe_gemms
from meshplan.arithmetic.gemm import gemm_efficiency
from meshplan.arithmetic.memory_states import MuonStepBytes, muon_matrix_step_bytes
from meshplan.knowledge.calibration import Calibration
from meshplan.knowledge.compute_card import MuonFacts
from meshplan.schema.model import Architecture


@dataclass(frozen=True)
class Matrix:
    """One weight matrix (rows = the linear's outputs, cols = its inputs) held `count` times, as one rank
    orthogonalizes it."""

    rows: float
    cols: float
    count: float = 1.0
    expert: bool = False  # a routed expert's (replicated over expert-data-parallel ranks, not data-parallel ones)

    @property
    def params(self) -> float:
        return self.rows * self.cols * self.count


def ns_gemms(rows: float, cols: float, steps: int) -> list[Gemm]:
    """The GEMMs of `steps` Newton-Schulz iterations on one rows x cols matrix, run on its smaller side (m x n,
    m <= n): X X^T (m x m over n), A A (m x m over m), B X (m x n over m): 4 m^2 n + 2 m^3 FLOPs per step."""
    m, n = sorted((rows, cols))
    return [Gemm("newton_schulz_gram", m, m, n, steps), Gemm("newton_schulz_square", m, m, m, steps),
            Gemm("newton_schulz_update", m, n, m, steps)]


def _qkv_blocks(arch: Architecture, rows: float, cols: float) -> list[Matrix]:
    """Megatron's fused QKV weight as Muon splits it (muon_split_qkv): per query group a Q block of the group's
    heads and a K and a V block of one head each, `rows` being the rows this rank orthogonalizes."""
    d = arch.head_dim
    group_rows = (arch.num_attention_heads // arch.num_kv_heads + 2) * d
    groups = rows / group_rows
    q = arch.num_attention_heads // arch.num_kv_heads * d
    return [Matrix(q, cols, groups), Matrix(d, cols, 2 * groups)]


def layer_matrices(arch: Architecture, shard: Shard, moe: bool, muon: MuonFacts) -> list[Matrix]:
    """The matrices of one decoder layer one rank orthogonalizes, at the size it orthogonalizes them: its own
    shards (blockwise, distributed) or the whole matrix (duplicated: gathered over tensor parallelism)."""
    whole = muon.tp_mode == "duplicated"
    view = Shard(shard.tokens, 1, shard.ep, 1, False) if whole else shard
    gemms = attention_gemms(arch, view)
    gemms += moe_gemms(arch, view) if moe else mlp_gemms(arch, view, arch.ffn_hidden_size, "mlp")
    out = []
    for g in gemms:
        if g.name == "qkv" and muon.split_qkv and arch.mla is None:
            out += _qkv_blocks(arch, g.n, g.k)
        else:
            out.append(Matrix(g.n, g.k, g.count, expert=g.name.startswith("expert_")))
    return out


def _matrix_seconds(mat: Matrix, muon: MuonFacts, cal: Calibration, bf16_peak: float) -> float:
    """One copy of a matrix's Newton-Schulz time, at the model GEMMs' calibrated efficiency (BF16: the iteration
    runs in BF16 under fp32 matmul precision 'medium', the card's source)."""
    return sum(g.flops / (bf16_peak * gemm_efficiency(g, cal)) for g in ns_gemms(mat.rows, mat.cols, muon.ns_steps))


def newton_schulz_seconds(arch: Architecture, shard: Shard, kinds: list[bool], muon: MuonFacts, cal: Calibration,
                          bf16_peak: float, dense_group: int, expert_group: int) -> float:
    """Seconds one rank spends orthogonalizing in a step, for a stage whose layers are `kinds` (True: MoE).

    Muon's layer-wise distributed optimizer gives each data-parallel rank whole matrices, balanced by their cost:
    each rank does about 1/group of the stage's work, but never less than its costliest single matrix. Dense
    matrices are shared over `dense_group` (dp x cp; 1 without the distributed optimizer), routed experts over the
    expert-data-parallel group. `distributed` tensor-parallel mode is timed as blockwise, each rank iterating on
    its own shard (exact when the shard cuts the matrix's long side; its Gram all-reduces are not timed)."""
    totals = {False: 0.0, True: 0.0}
    largest = {False: 0.0, True: 0.0}
    for is_moe in (False, True):
        n = kinds.count(is_moe)
        if not n:
            continue
        for mat in layer_matrices(arch, shard, is_moe, muon):
            one = _matrix_seconds(mat, muon, cal, bf16_peak)
            totals[mat.expert] += n * mat.count * one
            largest[mat.expert] = max(largest[mat.expert], one)
    return sum(max(totals[e] / (expert_group if e else dense_group), largest[e]) for e in (False, True))


def matrix_params(arch: Architecture, shard: Shard, kinds: list[bool], muon: MuonFacts) -> tuple[float, float]:
    """The stage's matrix parameters this rank holds (its own TP shards), dense and routed: what Muon updates in
    place of Adam (the rest, embeddings, norms and biases, keep Adam)."""
    local = muon.model_copy(update={"tp_mode": "blockwise"})  # this rank's own shards; the QKV split keeps its size
    dense = expert = 0.0
    for is_moe in (False, True):
        n = kinds.count(is_moe)
        for mat in layer_matrices(arch, shard, is_moe, local) if n else []:
            if mat.expert:
                expert += n * mat.params
            else:
                dense += n * mat.params
    return dense, expert


def step_working_bytes(arch: Architecture, shard: Shard, kinds: list[bool], muon: MuonFacts,
                       step: MuonStepBytes) -> float:
    """The bytes Muon's step allocates at its peak on this rank, for a stage whose layers are `kinds` (True: MoE):
    the step updates one matrix at a time, so its largest matrix decides (memory_states.muon_matrix_step_bytes):
    this rank's shard of it, all-gathered whole over tensor parallelism in tp_mode duplicated. Every matrix of the
    stage counts, as the layer-wise distributed optimizer may give any of them to this rank."""
    local_view = muon.model_copy(update={"tp_mode": "blockwise"})
    whole_view = muon.model_copy(update={"tp_mode": "duplicated"})
    gather = muon.tp_mode == "duplicated"
    out = 0.0
    for is_moe in {bool(k) for k in kinds}:
        pairs = zip(layer_matrices(arch, shard, is_moe, local_view), layer_matrices(arch, shard, is_moe, whole_view),
                    strict=True)
        for local, whole in pairs:
            gathered = gather and whole.rows * whole.cols > local.rows * local.cols
            out = max(out, muon_matrix_step_bytes(step, (local.rows, local.cols), (whole.rows, whole.cols), gathered))
    return out
