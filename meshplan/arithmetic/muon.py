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
from meshplan.knowledge.muon_card import MuonFacts
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


def ns_gemms(rows: float, cols: float, steps: int, side: str = "smaller") -> list[Gemm]:
    """The GEMMs of `steps` Newton-Schulz iterations on one rows x cols matrix, run on its smaller side (m x n,
    m <= n; the card's ns_side smaller) or on its rows as stored (m the rows, ns_side rows): X X^T (m x m over n),
    A A (m x m over m), B X (m x n over m): 4 m^2 n + 2 m^3 FLOPs per step."""
    m, n = sorted((rows, cols)) if side == "smaller" else (rows, cols)
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


def _modules(arch: Architecture, g: Gemm, tp: int) -> list[Matrix]:
    """A GEMM's weights as separate nn.Linear modules (the card's matrices per_module: KempnerForge's q_proj,
    k_proj, v_proj, and a gated MLP's gate_proj and up_proj, each its own parameter)."""
    expert = g.name.startswith("expert_")
    if g.name == "qkv" and arch.mla is None:
        q = arch.num_attention_heads / tp * arch.head_dim
        return [Matrix(q, g.k, g.count), Matrix((g.n - q) / 2, g.k, 2 * g.count)]
    if g.name.endswith("_fc1") and arch.gated_mlp:
        return [Matrix(g.n / 2, g.k, 2 * g.count, expert=expert)]
    return [Matrix(g.n, g.k, g.count, expert=expert)]


def layer_matrices(arch: Architecture, shard: Shard, moe: bool, muon: MuonFacts) -> list[Matrix]:
    """The matrices of one decoder layer one rank orthogonalizes, at the size it orthogonalizes them: its own
    shards (blockwise, distributed) or the whole matrix (duplicated: gathered over tensor parallelism); as Megatron
    fuses them or one per module (the card's matrices)."""
    whole = muon.tp_mode == "duplicated"
    view = Shard(shard.tokens, 1, shard.ep, 1, False) if whole else shard
    gemms = attention_gemms(arch, view)
    gemms += moe_gemms(arch, view) if moe else mlp_gemms(arch, view, arch.ffn_hidden_size, "mlp")
    out = []
    for g in gemms:
        if muon.matrices == "per_module":
            out += _modules(arch, g, view.tp)
        elif g.name == "qkv" and muon.split_qkv and arch.mla is None:
            out += _qkv_blocks(arch, g.n, g.k)
        else:
            out.append(Matrix(g.n, g.k, g.count, expert=g.name.startswith("expert_")))
    return out


def takes_muon(rows: float, cols: float, muon: MuonFacts) -> bool:
    """Whether a whole (global) rows x cols weight takes Muon rather than Adam: every decoder matrix where the card
    sets no max_aspect_ratio (Megatron-Core), else only one whose longer side is at most that many times its shorter
    (KempnerForge's _is_muon_eligible: embeddings and output heads of a large vocabulary, routers of few experts, go
    to AdamW)."""
    return muon.max_aspect_ratio is None or max(rows, cols) <= muon.max_aspect_ratio * min(rows, cols)


def muon_matrices(arch: Architecture, shard: Shard, moe: bool, muon: MuonFacts) -> list[tuple[Matrix, Matrix]]:
    """(this rank's TP shard, the whole matrix) of each matrix of one decoder layer that takes Muon (takes_muon)."""
    local = layer_matrices(arch, shard, moe, muon.model_copy(update={"tp_mode": "blockwise"}))
    whole = layer_matrices(arch, shard, moe, muon.model_copy(update={"tp_mode": "duplicated"}))
    return [(a, b) for a, b in zip(local, whole, strict=True) if takes_muon(b.rows, b.cols, muon)]


def vocab_matrices(arch: Architecture, first: float, last: float, muon: MuonFacts) -> list[Matrix]:
    """The embedding (`first` of its parameters on this rank) and output layer (`last`) as Muon matrices where the
    card lets them take it (max_aspect_ratio; Megatron-Core keeps both on Adam): vocab x hidden, its TP shard's
    rows."""
    if muon.max_aspect_ratio is None or not takes_muon(arch.vocab_size, arch.hidden_size, muon):
        return []
    h = arch.hidden_size
    return [Matrix(n / h, h) for n in (first, last) if n]


def _matrix_seconds(rows: float, cols: float, muon: MuonFacts, cal: Calibration, peak: float) -> float:
    """One copy of a rows x cols matrix's Newton-Schulz time, at the model GEMMs' calibrated efficiency and `peak`
    (the card's ns_dtype: BF16, the iteration in BF16 under fp32 matmul precision 'medium'; or fp32 at torch's
    default precision, the GPU's fp32_flops)."""
    return sum(g.flops / (peak * gemm_efficiency(g, cal)) for g in ns_gemms(rows, cols, muon.ns_steps, muon.ns_side))


def _stage_matrices(arch: Architecture, shard: Shard, kinds: list[bool], muon: MuonFacts,
                    vocab: tuple[float, float]) -> list[tuple[Matrix, float]]:
    """(matrix at the size this rank orthogonalizes it, copies on the stage) of every matrix of the stage that takes
    Muon: its decoder layers' (`kinds`, True: MoE) and, where the card lets them, the embedding and output layer
    (`vocab`: their parameters on this rank, vocab_matrices)."""
    gathered = muon.tp_mode == "duplicated"  # all-gathered over TP: the whole matrix, else this rank's shard
    out = []
    for is_moe in (False, True):
        n = kinds.count(is_moe)
        if n:
            out += [(whole if gathered else local, n * local.count)
                    for local, whole in muon_matrices(arch, shard, is_moe, muon)]
    return out + [(mat, 1.0) for mat in vocab_matrices(arch, *vocab, muon)]


def newton_schulz_seconds(arch: Architecture, shard: Shard, kinds: list[bool], muon: MuonFacts, cal: Calibration,
                          peak: float, dense_group: int, expert_group: int,
                          vocab: tuple[float, float] = (0.0, 0.0)) -> float:
    """Seconds one rank spends orthogonalizing in a step, for a stage whose layers are `kinds` (True: MoE).

    layer_wise (Megatron-Core): the layer-wise distributed optimizer gives each data-parallel rank whole matrices,
    balanced by their cost: each rank does about 1/group of the stage's work, but never less than its costliest
    single matrix. Dense matrices are shared over `dense_group` (dp x cp; 1 without the distributed optimizer),
    routed experts over the expert-data-parallel group. `distributed` tensor-parallel mode is timed as blockwise,
    each rank iterating on its own shard (exact when the shard cuts the matrix's long side; its Gram all-reduces are
    not timed). local_shard (KempnerForge): every rank iterates on its own FSDP2 shard of every matrix, rows / the
    shard group (dense_group, expert_group: its optimizer's shard groups)."""
    totals = {False: 0.0, True: 0.0}
    largest = {False: 0.0, True: 0.0}
    local = muon.assignment == "local_shard"
    for mat, copies in _stage_matrices(arch, shard, kinds, muon, vocab):
        rows = mat.rows / (expert_group if mat.expert else dense_group) if local else mat.rows
        one = _matrix_seconds(rows, mat.cols, muon, cal, peak)
        totals[mat.expert] += copies * one
        largest[mat.expert] = max(largest[mat.expert], one)
    if local:
        return totals[False] + totals[True]
    return sum(max(totals[e] / (expert_group if e else dense_group), largest[e]) for e in (False, True))


def matrix_params(arch: Architecture, shard: Shard, kinds: list[bool], muon: MuonFacts,
                  vocab: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """The stage's matrix parameters this rank holds (its own TP shards), dense and routed: what Muon updates in
    place of Adam (the rest, norms, biases and where the card says so the embedding and output layer, keep Adam)."""
    local = muon.model_copy(update={"tp_mode": "blockwise"})  # this rank's own shards; the QKV split keeps its size
    dense = expert = 0.0
    for mat, copies in _stage_matrices(arch, shard, kinds, local, vocab):
        if mat.expert:
            expert += copies * mat.rows * mat.cols
        else:
            dense += copies * mat.rows * mat.cols
    return dense, expert


def step_working_bytes(arch: Architecture, shard: Shard, kinds: list[bool], muon: MuonFacts,
                       step: MuonStepBytes, dense_group: float = 1, expert_group: float = 1) -> float:
    """The bytes Muon's step allocates at its peak on this rank, for a stage whose layers are `kinds` (True: MoE):
    the step updates one matrix at a time, so its largest matrix decides (memory_states.muon_matrix_step_bytes):
    this rank's shard of it, all-gathered whole over tensor parallelism in tp_mode duplicated. Every matrix of the
    stage counts, as the layer-wise distributed optimizer may give any of them to this rank. Under local_shard
    (KempnerForge) the rank's FSDP2 shard of each, its rows over `dense_group` or `expert_group`."""
    gather = muon.tp_mode == "duplicated"
    out = 0.0
    for is_moe in {bool(k) for k in kinds}:
        for local, whole in muon_matrices(arch, shard, is_moe, muon):
            if muon.assignment == "local_shard":  # its FSDP2 shard of the rows, iterated as it is
                rows = local.rows / (expert_group if local.expert else dense_group)
                out = max(out, muon_matrix_step_bytes(step, (rows, local.cols), (rows, local.cols), False,
                                                      muon.ns_side))
                continue
            gathered = gather and whole.rows * whole.cols > local.rows * local.cols
            out = max(out, muon_matrix_step_bytes(step, (local.rows, local.cols), (whole.rows, whole.cols), gathered))
    return out
