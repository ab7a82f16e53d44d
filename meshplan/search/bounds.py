"""The optimistic step times that order the search's queue (meshplan/search/engine.py). Each bound is at most the
step time the estimator would predict, so a plan reaching the top of the queue is faster than anything left in it:
the ideal time (every GPU at the cost model's best fraction of peak), the per-token bound of single-stage reference
plans stretched over a layout's stages and micro-batches, the pipeline traffic interleaving multiplies, a
ZeRO-2/3 / FSDP stage's sharding traffic per micro-batch, and the once-per-step DP term after the pipeline (the first
rank's gradient reduction and parameter all-gather, less what its compute may hide: estimate/sync_floor.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from meshplan.arithmetic import mesh
from meshplan.arithmetic.activations import least_rank_tokens
from meshplan.arithmetic.pipeline_counts import steady_share
from meshplan.arithmetic.schedule import plan_shape
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory_terms import job_layer_sums
from meshplan.estimate.moe_time import a2a_steady_share
from meshplan.estimate.perf import StageWork, StepSync, sync_chunks
from meshplan.estimate.sync_floor import StageSync, SyncFloor, SyncRates, synced_keys, unraised_from
from meshplan.knowledge.adapter_knobs import shared_overlap_in_some_plan
from meshplan.rules.context import rank_tokens
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.plan import Job, Plan, step_microbatches
from meshplan.search.estimators import reference_seconds
from meshplan.search.floors import estimate_stages
from meshplan.search.grid_syncs import grid_stage_sync
from meshplan.search.job_memo import kept_or_refused
from meshplan.search.plans import PlanKey, SearchPlans
from meshplan.search.rank_chains import Ranks, heavy_bound, heavy_chains, light_stages, pipeline_ranks, stages_bound
from meshplan.search.seed_groups import SeedGroup, group_floor
from meshplan.search.space import Layout, reference_split
from meshplan.search.zero_stages import reference_zeros

ONE_OVERLAPPED = "one overlapped"  # a work reference's key's last element: overlapped, one micro-batch (_alone_key)


def pow2_at_least(x: float) -> int:
    """The smallest power of two >= x (and >= 1): the reference micro-batch of the per-token bounds."""
    return 1 << max(0, (math.ceil(x) - 1).bit_length()) if x > 1 else 1


def by_key(keys: list[float], items: object) -> list[tuple[float, tuple]]:
    """The items (one per key) per distinct key, in the keys' order and the items' own within each: a node split by
    the keys of its ZeRO stages (engine.refine_shard, carry)."""
    per: dict[float, list] = {}  # (one pass: a node's ZeRO stages mostly each have a key of their own)
    for item, k in zip(items, keys, strict=True):  # type: ignore[call-overload]
        at = per.get(k)
        if at is None:
            per[k] = [item]
        else:
            at.append(item)
    return [(k, tuple(per[k])) for k in sorted(per)]


def every_stages_light(ranks: Ranks | None, light: tuple | None) -> bool:
    """Whether every stages of a layout's last_ranks `ranks` is light at a rate (`light`: ranks_light's of them):
    StepTimeBounds.whole_light, and the stretch on the ranks it has just read."""
    return light is not None and ranks is not None and len(light) == len(ranks.flat)


@dataclass(kw_only=True)
class StepTimeBounds(SearchPlans):
    """The step-time bounds of a search's plans, with the references they share."""

    cp_mbs: dict[tuple[int, int], int] = field(default_factory=dict)  # largest micro-batch per (tp, cp)
    work_mbs: dict[tuple[int, int, int], float] = field(default_factory=dict)  # most sequences per rank per shard
    # pipeline_overlaps per (pp, vpp, schedule), and the verdict of EP009 per (pp, vpp) it reads
    pipeline_overlap: dict[tuple, bool] = field(default_factory=dict)
    # Per (dp, pp, vpp, schedule, micro-batch sizes, ideal time): per size, (m + bubble stages, the share of
    # micro-batches outside the EP overlap's steady state, ideal_time, m): what stretch and seed_keys read of a
    # layout's pipeline (stretch_factors).
    factors: dict[tuple, list[tuple[float, float, float, int]]] = field(default_factory=dict)
    p2p_shares: dict[tuple[int, int, int], float] = field(default_factory=dict)  # blocking_p2p_share per (pp, vpp, m)
    chunks_by_vpp: dict[int, int] = field(default_factory=dict)  # sync_vpp per vpp (all it reads besides the card)
    sync_s: float | None = None  # moe_sync_s, once
    ref_jobs: dict[int, Job] = field(default_factory=dict)  # _per_token's job per global batch size (a few)
    # What is a pure function of its key at the search's job, fixed fields and estimators, kept in the job's memo
    # across requests (job_memo.py): pp_unit's ("unit", ...: None where only the base's step terms give it),
    # last_ranks' ("last", ...; light_ranks' in each Ranks), the grid plans, DP and sharding floors, the references'
    # ZeRO stages
    bounds_memo: dict[tuple, float | tuple | None] = field(default_factory=dict)
    # what the search works out as it goes (kept for a search of the same job at another budget, the thinner-headroom
    # probe, not across requests: job_memo.py): shard_rate's ("rate", ...: its references are counted where it is
    # worked out), the least first ranks noted so far ("least rank0"; the shapes noted, note_rank0) and the seed
    # groups' DP bounds ("syncs", group_syncs)
    search_memo: dict[tuple, float | tuple | None] = field(default_factory=dict)
    # token_bound's, pipeline_bound's and seed_keys' figures per their keys, this search's (shared with the probe, as
    # search_memo) and those an earlier request's search kept in the job's memo (keep_for_job: read where not empty)
    token_bounds: dict[tuple, float] = field(default_factory=dict)
    pipe_bounds: dict[tuple, float] = field(default_factory=dict)
    seed_key_rows: dict[tuple, tuple[float, ...]] = field(default_factory=dict)
    kept_token_bounds: dict[tuple, float] = field(default_factory=dict)
    kept_pipe_bounds: dict[tuple, float] = field(default_factory=dict)
    kept_seed_keys: dict[tuple, tuple[float, ...]] = field(default_factory=dict)
    parts_by_refs: dict[tuple, tuple[float, ...]] = field(default_factory=dict)  # token_parts per references

    def microbatches(self, lay: Layout, mbs: int) -> int:
        return step_microbatches(self.job.global_batch_size, mbs, lay.dp)

    def ideal_time(self, lay: Layout, mbs: int, ideal: float) -> float:
        """Every GPU at the cost model's best fraction of peak, stretched by the bubble (p-1)/(m*v)."""
        return self.ideal_times(lay, (mbs,), ideal)[0]

    def ideal_times(self, lay: Layout, sizes: tuple[int, ...], ideal: float) -> list[float]:
        """ideal_time per micro-batch size (what does not change with the micro-batch read once)."""
        if not lay.bubble_stages():
            return [ideal * (1.0 + 0.0)] * len(sizes)
        gbs, dp, pp, vpp = self.job.global_batch_size, lay.dp, lay.pp, lay.vpp  # (microbatches', without its call)
        return [ideal * (1.0 + (pp - 1) / (step_microbatches(gbs, mbs, dp) * vpp)) for mbs in sizes]

    def pp_unit(self, lay: Layout, mbs: int) -> float:
        """Exposed pipeline send/receive per stage per micro-batch without interleaving, read from the
        non-interleaved base; interleaving multiplies it by vpp (Narayanan et al. 2021). With the Engine's
        pipeline_unit, once per what it reads (tp, cp, dp, pp, micro-batch, sequence parallelism), whether or not the
        rules refuse the base: the base is only the arithmetic's device, and the interleaved plan's own hop (what its
        estimate charges vpp times per micro-batch) reads the same fields. Otherwise once per base (0 where an estimate
        refuses it); from the Engine's pp_unit where it has one, without building the base's step."""
        base = lay.base()
        if self.engine.pipeline_unit is not None:
            sp = self.sequence_parallel(base)
            key = ("unit", base.tp, base.cp, base.dp, base.pp, mbs, sp)
            if key not in self.bounds_memo:
                unit = self.engine.pipeline_unit(self.job, self.plan(base, self.zeros[0], self.recomputes[0], mbs))
                m = self.microbatches(base, mbs)
                # the estimate's pp_comm_s (m x the stage's) per micro-batch, to the last bit (as _pp_unit)
                self.bounds_memo[key] = None if unit is None else m * unit / m  # type: ignore[assignment]
            unit = self.bounds_memo[key]
            if unit is not None:
                return unit  # type: ignore[return-value]
        key = (base, self.zeros[0], self.recomputes[0], mbs)
        hit = self.caches.pp_units.get(key)
        if hit is None:
            hit = self.caches.pp_units[key] = self._pp_unit(key)
        return hit

    def _pp_unit(self, key: PlanKey) -> float:
        lay, mbs = key[0], key[3]
        m = self.microbatches(lay, mbs)
        if self.engine.pp_unit is not None and key not in self.caches.throughput:
            try:
                unit = self.engine.pp_unit(self.job, self.plan(*key))
            except MeshplanError:
                return 0.0
            if unit is not None:
                return m * unit / m  # the estimate's pp_comm_s (m x the stage's) per micro-batch, to the last bit
        try:
            report = self.caches.throughput.get(key)
            if report is not None or self.engine.terms is None:
                report = report or self.throughput(*key)
                return report.breakdown.pp_comm_s / self.microbatches(lay, mbs)
            self.step_floor(*key)  # its terms, cached: no pipeline replay for a bound
        except MeshplanError:
            return 0.0
        terms = self.caches.terms[key]
        # the estimate's pp_comm_s without nanotron's per-layer host sync (paid per layer, not per chunk: pipeline_unit)
        return terms.m * terms.inputs.pp_comm[terms.worst] / self.microbatches(lay, mbs)

    def _per_token(self, key: tuple, tp: int, cp: int, ep: int, etp: int, b: int, recompute: str, part: str,
                   may_overlap: bool = False, one_overlapped: bool = False) -> float:
        """Seconds per token a rank computes (rules.context.rank_tokens: padding included) of a single-stage reference
        plan, b sequences a rank; with `may_overlap`, its EP all-to-all overlapped wherever the reference can, and no
        more than the plain reference's (the key without overlap): a layout that may overlap it runs the faster of
        the two plans (overlap_choice), and the plain one can be the faster where it hides the all-to-all behind the
        shared experts instead (adapter_knobs.shared_expert_overlap: off beside moe_a2a_overlap). The least of the
        reference at each of the search's ZeRO stages that times it differently (zero_stages.reference_zeros: the CP
        mechanism at cp > 1, the experts' launches one at a time). `one_overlapped`: the overlapped reference at one
        micro-batch, whole (_alone_key)."""
        hit = self.caches.token_time.get(key)
        if hit is not None:
            return hit
        dp_ref = mesh.derived_dp(self.law, self.job.num_gpus, tp, 1, cp, ep)
        ref = Layout(tp=tp, pp=1, cp=cp, ep=ep, etp=etp, dp=dp_ref, split=reference_split(self.job.model, self.fixed))
        overlap = may_overlap and any(self.a2a_overlap(ref, zero, recompute) for zero in self.zeros)
        if may_overlap and not overlap:
            return self._plain_twin(key, tp, cp, ep, etp, b, recompute, part)
        zeros = self.reference_zeros(tp, cp, ep)
        alone = plain = 0.0
        alone_key = None
        if overlap:
            # One micro-batch alone is all warm-up (its all-to-all exposed), so it would over-charge a layout whose
            # micro-batches run in the steady state; the second micro-batch's increment is one fully overlapped
            # (moe_time.overlapped_a2a at a steady share of 1), the least any pays.
            plain = self._per_token((*key[:-1], False), tp, cp, ep, etp, b, recompute, part)
            alone_key = self._alone_key(key)
            one = self._per_token(alone_key, tp, cp, ep, etp, b, recompute, part, one_overlapped=True) \
                if alone_key[-1] == ONE_OVERLAPPED else plain
            alone = one * rank_tokens(self.job, b, tp, cp, zeros[0])  # (one zero: none across mechanisms, below)
        gbs = (2 if overlap else 1) * b * dp_ref
        job_ref = self.ref_jobs.get(gbs)
        if job_ref is None:
            job_ref = self.ref_jobs[gbs] = self.job.model_copy(update={"global_batch_size": gbs})
        # with EP overlap, the increment over one alone holds within one mechanism: none across them (cp 1 stands)
        value = 0.0 if overlap and len(zeros) > 1 else math.inf
        for zero in zeros if value else ():
            tokens = rank_tokens(self.job, b, tp, cp, zero)  # the reference's, as its estimate runs them
            # a CP reference's seconds read no recompute (cp_time): the first the rules pass at this stage; a work
            # reference at a recompute its engine's config cannot set (RC006: SkyRL's SFT trainer at none, the FSDP
            # backends at selective) runs none of the layout's plans there: the next in the search's order (least
            # time first) that the config sets, the least any of them takes
            for rec in self.recomputes[self.recomputes.index(recompute):]:
                try:
                    self.calls["throughput"] += 1
                    total, work = self.reference(job_ref, ref, zero, rec, b, overlap or one_overlapped, part)
                    break
                except MeshplanError as refused:
                    total = work = None
                    if part != "cp" and not (isinstance(refused, EstimateBlocked) and refused.rule_id == "RC006"):
                        break
            if work is not None and part == "work":  # its layers' and head's parts, what token_parts reads
                self._keep_parts(key, work, tokens, alone_key)
            if total is None:  # refused: no bound from this reference
                self.caches.token_parts.pop(key, None)
                value = 0.0
                break
            value = min(value, (max(0.0, total - alone) if alone else 0.0) / tokens if overlap else total / tokens)
        if overlap:  # the faster of the twins
            value = min(value, plain)
        self.caches.token_time[key] = value
        return value

    def reference(self, job_ref: Job, ref: Layout, zero: int, recompute: str, b: int, overlap: bool, part: str
                  ) -> tuple[float, StageWork | None]:
        """estimators.reference_seconds of a reference plan (or the refusal it raises), once per job memo: what it
        reads is the search's plan of these arguments (plan: the job's and the fixed fields') and job_ref's global
        batch; counted by _per_token at each ask, as before."""
        key = (job_ref.global_batch_size, ref, zero, recompute, b, overlap, part)
        return kept_or_refused(self.job_memo, "references", key, lambda: reference_seconds(
            self.engine, job_ref, self.plan(ref, zero, recompute, b, overlap=overlap), part))

    def _alone_key(self, key: tuple) -> tuple:
        """The reference whose one micro-batch the overlapped reference `key` (_per_token) takes its second one's
        increment over: the plain reference (the key without overlap), the same plan where no plan of the job runs
        the shared-expert overlap; else the overlapped reference at one micro-batch (ONE_OVERLAPPED), since the
        plain one hides part of its all-to-all behind the shared experts (adapter_knobs.shared_overlap_in_some_plan),
        and an increment over it would over-charge the overlapped plan."""
        return (*key[:-1], ONE_OVERLAPPED if shared_overlap_in_some_plan(self.job) else False)

    def reference_zeros(self, tp: int, cp: int, ep: int) -> tuple[int, ...]:
        """zero_stages.reference_zeros of the search's job and ZeRO stages at these degrees, kept in bounds_memo per
        them (all it reads: _per_token asks it of every reference, some 700 on DeepSeek-V3/2,048 of 115 values)."""
        key = ("reference zeros", self.zeros, tp, cp, ep)
        hit = self.bounds_memo.get(key)
        if hit is None:
            hit = self.bounds_memo[key] = reference_zeros(self.job, self.zeros, tp, cp, ep)
        return hit  # type: ignore[return-value]

    def _plain_twin(self, key: tuple, tp: int, cp: int, ep: int, etp: int, b: int, recompute: str, part: str) -> float:
        """_per_token of a reference that may overlap its EP all-to-all where no ZeRO stage's rules let it: the plan,
        and so the figure and parts, of the plain reference (the key without overlap), estimated once for both."""
        plain = (*key[:-1], False)
        value = self.caches.token_time[key] = self._per_token(plain, tp, cp, ep, etp, b, recompute, part)
        parts = self.caches.token_parts.get(plain)
        if parts is not None:
            self.caches.token_parts[key] = parts
        return value

    def pipeline_overlaps(self, lay: Layout) -> bool:
        """Whether this layout's plans may overlap the EP all-to-all: as the request fixes it, on with the combined
        1F1B schedule, else where EP009 lets its pipeline shape overlap it (Megatron-Core wants virtual stages when
        pp > 1), asked once per (pp, vpp): a layout that cannot is bounded by a reference without it. A layout that may
        is bounded by the faster of the references with it and without it (_per_token): its plan may be either
        (overlap_choice). Kept per (pp, vpp, schedule) of a layout with EP, all it reads of one (the request's fields
        and the job's card are the memo's): the seeding asks it of some 27,000 layouts on DeepSeek-V3/2,048."""
        if lay.ep <= 1:
            return False
        pipe = (lay.pp, lay.vpp, lay.schedule)  # (the (pp, vpp) keys below are pairs: no clash in the one memo)
        hit = self.pipeline_overlap.get(pipe)
        if hit is None:
            hit = self.pipeline_overlap[pipe] = self._pipeline_overlaps(lay)  # type: ignore[index]
        return hit

    def _pipeline_overlaps(self, lay: Layout) -> bool:
        fixed = self.fixed.values
        if "moe_a2a_overlap" in fixed:
            return bool(fixed["moe_a2a_overlap"])
        if lay.schedule == "combined_1f1b":
            return True
        if not self.a2a_open:
            return False
        key = (lay.pp, lay.vpp)
        hit = self.pipeline_overlap.get(key)
        if hit is None:
            shape = Layout(tp=1, pp=lay.pp, cp=1, ep=lay.ep, etp=1, dp=1, vpp=lay.vpp)
            hit = self.pipeline_overlap[key] = any(self.a2a_overlap(shape, zero, self.recomputes[0])
                                                   for zero in self.zeros)
        return hit

    def token_bound(self, lay: Layout, mbs: int, recompute: str, exact: bool = False) -> float:
        """A cheaper bound shared by many shards. The time per token of a layer only falls as a rank sees more
        tokens (bigger GEMMs run closer to peak; launch overheads and message latencies are amortised), and
        its compute does not depend on how the tokens were split by context parallelism. So two single-stage
        references bound every layout: per (tp, ep, etp, recompute) with cp = 1, and per (tp, cp) for the
        context-parallel traffic, at a power-of-two micro-batch holding at least this layout's tokens per rank
        (`exact`: the smallest such, and where a CP rank holds part of a sequence the first at its own cp, the
        least micro-batch holding its sequences; otherwise the most any layout of the shard uses, one for all):
        step >= tokens per rank x (their times per token) / pp x (m + (pp-1)/vpp). Kept per what it reads: the
        layout, micro-batch and recompute, and without `exact` its shard's largest micro-batches."""
        work = None if exact else self.work_mbs.get((lay.tp, lay.ep, lay.etp))
        most = None if exact else self.cp_mbs.get((lay.tp, lay.cp))
        key = (lay, mbs, recompute, exact, work, most)
        bound = self.token_bounds.get(key)
        if bound is None:
            kept = self.kept_token_bounds  # (empty until a search of the job kept its own: keep_for_job)
            bound = kept.get(key) if kept else None
            if bound is None:
                bound = self.stretch_one(lay, mbs, *self.shard_rate(lay, mbs, recompute, work, most))
            else:  # an earlier request's: what working it out counts and notes, asked in this search
                self.shard_rate(lay, mbs, recompute, work, most)
                self.last_ranks(lay)  # (as the stretch's light_ranks notes its first ranks)
            self.token_bounds[key] = bound
        return bound  # type: ignore[return-value]

    def token_rate(self, lay: Layout, mbs: int, recompute: str, exact: bool = False) -> tuple[int, float, float, tuple]:
        """token_bound's references: (b_tok, seconds per token, and with EP overlap the seconds per token a micro-batch
        outside the steady state adds: its all-to-all exposed; what names the references, for token_parts). Without
        `exact` it is the same for every micro-batch of a seeded layout (work_mbs and cp_mbs hold its shard's largest),
        so `seed` reads it once."""
        if exact:
            return self.shard_rate(lay, mbs, recompute, None, None)
        return self.shard_rate(lay, mbs, recompute, self.work_mbs.get((lay.tp, lay.ep, lay.etp)),
                               self.cp_mbs.get((lay.tp, lay.cp)))

    def shard_rate(self, lay: Layout, mbs: int, recompute: str, work: float | None,
                   most: int | None, exposed_a2a: bool = False) -> tuple[int, float, float, tuple]:
        """token_rate given what it reads of the seeded shards (`work`: work_mbs of the layout's (tp, ep, etp), `most`:
        cp_mbs of its (tp, cp); both None for the exact bound, or where the shard is not seeded), kept in bounds_memo
        per all it reads: tp, ep, etp, cp, whether the pipeline may overlap the all-to-all, recompute, those two, and
        the micro-batch only where one is None (the references then read it). `exposed_a2a`: of plans without the
        EP overlap (the all-to-all exposed)."""
        overlap = not exposed_a2a and self.pipeline_overlaps(lay)
        key = ("rate", lay.tp, lay.ep, lay.etp, lay.cp, overlap, recompute, work, most,
               mbs if work is None or most is None else 0)
        hit = self.search_memo.get(key)
        if hit is None:
            hit = self.search_memo[key] = self._shard_rate(lay, mbs, recompute, work, most, overlap)
        return hit  # type: ignore[return-value]

    def _shard_rate(self, lay: Layout, mbs: int, recompute: str, work: float | None, most: int | None,
                    overlap: bool) -> tuple[int, float, float, tuple]:
        s = self.job.seq_length
        b_tok = b_key = pow2_at_least(-(-s // lay.cp) * mbs / s if work is None else work)
        # A CP rank holding part of a sequence (exact): the reference at its own cp with as many sequences, where the
        # rules take it (a whole sequence at cp 1 runs more rows: up to 2.8x less per token on DeepSeek-V3)
        own = (pow2_at_least(mbs), lay.cp) if work is None and mbs < lay.cp else None
        per_token, exposed = self._work_rate(lay, recompute, own, *own, overlap) if own else (0.0, 0.0)
        if per_token:
            b_key, b_tok = own, own[0] / own[1]  # type: ignore[assignment, index]
        else:
            per_token, exposed = self._work_rate(lay, recompute, b_key, b_tok, 1, overlap)
        b_cp = 0
        if lay.cp > 1:
            # exact micro-batch when asked; otherwise the largest any layout of this (tp, cp) uses (a weaker
            # bound, since the time per token only falls with more tokens, but one reference for all of them)
            b_cp = pow2_at_least(mbs if most is None else most)
            per_token += self._per_token(("cp", lay.tp, lay.cp, b_cp), lay.tp, lay.cp, 1, 1, b_cp,
                                         self.recomputes[0], "cp")
        return b_tok, per_token, exposed, (lay.tp, lay.ep, lay.etp, recompute, b_key, overlap, lay.cp, b_cp)

    def _work_rate(self, lay: Layout, recompute: str, b_key: int | tuple[int, int], b: int, cp: int,
                   overlap: bool) -> tuple[float, float]:
        """_shard_rate's work reference (b sequences a rank at this cp; `b_key` names it): seconds per token, and
        with EP overlap those a micro-batch outside the steady state adds."""
        per_token = self._per_token(("work", lay.tp, lay.ep, lay.etp, recompute, b_key, overlap), lay.tp, cp, lay.ep,
                                    lay.etp, b, recompute, "work", overlap)
        if not overlap:
            return per_token, 0.0
        alone = self._per_token(("work", lay.tp, lay.ep, lay.etp, recompute, b_key, False), lay.tp, cp, lay.ep,
                                lay.etp, b, recompute, "work")
        # a micro-batch outside the steady state: the plain plan's, or the overlapped one's alone where less
        one = self.caches.token_time.get(("work", lay.tp, lay.ep, lay.etp, recompute, b_key, ONE_OVERLAPPED))
        return per_token, max(0.0, (alone if one is None else min(alone, one)) - per_token)

    def stretch(self, lay: Layout, sizes: tuple[int, ...], b_tok: int, per_token: float, exposed: float = 0.0,
                refs: tuple | None = None, factors: list[tuple[float, float, float, int]] | None = None,
                ideal: bool = False, plain: list[float] | None = None, ranks: Ranks | bool | None = False,
                whole: list[bool] | None = None) -> list[float]:
        """token_bound from its references, per micro-batch size: this layout's tokens per rank over its stages
        and micro-batches; with EP overlap, its micro-batches outside the steady state (moe_time.a2a_steady_share) pay
        `exposed` more per token, as the estimate charges them. Where the last rank may hold less than 1/pp of the
        work (light_ranks), the pipeline's chains where under it (rank_chains.stages_bound; `refs`: the rate's
        references; the ideal time then without its bubble), or over it too where every stages' may (whole_light:
        then none holds the stretch; not the seeds'); elsewhere, but in the seeds, the chains where over it
        (rank_chains.heavy_chains). `factors`: the layout's stretch_factors; `ideal`: each bound the larger of it and
        their ideal_time (the seed keys); `plain`: where given, each bound without the chains is appended to it (the
        stretch without `refs`, the same floats: chained reads both); `ranks`: the layout's last_ranks where the caller
        has them (the seeding keeps them with each shape's entry); `whole`: where given, whether every stages is light
        (whole_light, of the ranks and light read here: pipeline_bound reads it) is appended to it."""
        s, pp = self.job.seq_length, lay.pp
        cp = lay.cp
        sync = self.sync_s
        if sync is None:
            sync = self.moe_sync_s()
        light = heavy = last = None
        if refs is not None and ranks is False:
            last = self.last_ranks(lay)  # (light_ranks, its ranks kept for whole_light below)
            if last is not None:
                light = self.ranks_light(last, lay, (b_tok, per_token, exposed, refs))
            if light is None and not ideal:  # (not the seeds': their keys are many, their chains seldom over)
                heavy = heavy_chains(self.bounds_memo, self.job, lay, self.zeros, refs, self.token_parts)
        elif refs is not None and ranks is not None:
            light = self.ranks_light(ranks, lay, (b_tok, per_token, exposed, refs))  # type: ignore[arg-type]
        whole_light = not ideal and ranks is False and every_stages_light(last, light)  # (of the ranks just read)
        if whole is not None:
            whole.append(whole_light)
        fixed, vpp, ref_tokens = self.engine.moe_layer_fixed_s, lay.vpp, b_tok * s  # (an int: the same product)
        bounds = []
        for mbs, (stages, outside, low, m) in zip(sizes, factors or self.stretch_factors(lay, sizes), strict=True):
            # the hot loop of seeding: what does not change with the micro-batch read once
            tokens = least_rank_tokens(s, mbs, cp)  # padding an engine may add not counted
            per_stage = tokens * (per_token + outside * exposed if exposed else per_token) / pp
            rest = 1.0 - tokens / ref_tokens  # 1 - the share of b_tok sequences it holds
            if sync:
                # The reference spreads the per-micro-batch host sync of its MoE layers over b_tok sequences;
                # this layout pays it whole on each of its micro-batches (the average stage holds 1/pp of them).
                per_stage += sync * (rest if rest > 0.0 else 0.0) / pp  # max(0, rest)
            bound = per_stage * stages
            if plain is not None:
                plain.append(bound)
            if light is not None or heavy is not None:
                weights = (tokens, tokens * outside * exposed, fixed * rest if rest > 0.0 else 0.0)
                if heavy is not None:
                    bound = heavy_bound(m, pp, vpp, per_stage * pp, heavy, weights, bound)
                elif whole_light:
                    bound = stages_bound(m, pp, vpp, per_stage * pp, light, weights, math.inf)
                elif (least := stages_bound(m, pp, vpp, per_stage * pp, light, weights, bound)) < bound:
                    bound = least
                    low = low * m / stages  # the ideal time: no bubble counted
            bounds.append(low if ideal and low >= bound else bound)
        return bounds

    def last_ranks(self, lay: Layout) -> Ranks | None:
        """rank_chains.pipeline_ranks of the layout at the search's ZeRO stages (None where the stretch holds), kept
        per what they read of it (one object per those; not per layout: the seeding asks it of every layout, most of
        which nothing else hashes)."""
        if lay.pp == 1:
            return None  # (pipeline_ranks': no bubble)
        key = ("last", lay.pp, lay.vpp, lay.first, lay.last, lay.split, lay.schedule)
        entry = self.bounds_memo.get(key)
        if entry is None:
            entry = self.bounds_memo[key] = [pipeline_ranks(self.job, lay, self.zeros), None]  # type: ignore[assignment]
        if entry[1] is not self.search_memo:  # type: ignore[index]
            # its first ranks noted in this search (the ranks are kept across requests, with the search_memo of the
            # last search that noted them: noting again is harmless, each a least)
            entry[1] = self.search_memo  # type: ignore[index]
            self.note_rank0(lay)
        return entry[0]  # type: ignore[index]

    def note_rank0(self, lay: Layout) -> None:
        """Keep, per pp and ZeRO stage, the least first-rank parameters of each kind (rank0_params) over the pipeline
        shapes seen (seeding asks last_ranks of every layout, so every shape of the space with pp > 1): what
        group_syncs reads of a seed group's layouts, none with less. A shape no estimate takes leaves them."""
        for zero in self.zeros:
            params = self.rank0_params(lay, zero)
            if params is None:
                continue
            key = ("least rank0", lay.pp, zero)
            least = self.search_memo.get(key)
            self.search_memo[key] = params if least is None else tuple(  # type: ignore[assignment]
                map(min, least, params))  # type: ignore[arg-type]

    def chained(self, lay: Layout, mbs: int, rate: tuple[int, float, float, tuple]) -> bool:
        """Whether the stretch at this rate takes the pipeline's chains (rank_chains.stages_bound under it, where the
        last rank may hold less than 1/pp of the work): its bound with the rate's references under the one without."""
        plain: list[float] = []
        return self.stretch_one(lay, mbs, *rate, plain=plain) < plain[0]

    def light_ranks(self, lay: Layout, rate: tuple[int, float, float, tuple]) -> tuple | None:
        """Per stages of the layout (last_ranks) whose last rank may hold less than 1/pp of the work at this rate:
        (its last rank's least time's parts: seconds per token, its share of the exposed all-to-all, its MoE layers'
        host syncs; and each of its chains' parts, rank_chains.stages_bound reads); None where none may. A
        rank holding at least 1/pp of the seconds per token (its layers of each kind, head and CP share), of the
        exposed all-to-all and of the host syncs holds 1/pp of W at every micro-batch. Kept per ranks and rate."""
        ranks = self.last_ranks(lay)
        return None if ranks is None else self.ranks_light(ranks, lay, rate)

    def whole_light(self, lay: Layout, light: tuple | None) -> bool:
        """Whether every stages of the layout's last_ranks is light (light_ranks: `light`)."""
        return every_stages_light(self.last_ranks(lay), light)

    def ranks_light(self, ranks: Ranks, lay: Layout, rate: tuple[int, float, float, tuple]) -> tuple | None:
        """light_ranks of a layout whose last_ranks the caller has (not None): the seeding keeps them per shape."""
        refs = rate[3]  # (the rate is its references')
        hit = ranks.light.get(refs, False)
        if hit is False:  # (token_parts' and moe_sync_s' kept figures read without their calls where they are kept)
            sync = self.sync_s
            hit = ranks.light[refs] = light_stages(
                ranks.flat, self.parts_by_refs.get(refs) or self.token_parts(refs), rate[1], rate[2],
                self.moe_sync_s() if sync is None else sync, lay.pp, lay.vpp)
        return hit

    def _keep_parts(self, key: tuple, work: StageWork, tokens: float, alone_key: tuple | None) -> None:
        """token_parts' layer and head parts per token of the work reference `key` of _per_token, from its StageWork:
        with EP overlap (`alone_key`: _alone_key's) the second micro-batch's increment over one alone (whose own
        _per_token kept its parts), each no more than the plain reference's (the faster of the twins); where the key's
        references are several (zero_stages.reference_zeros), each part the least of theirs."""
        parts = tuple(work.m * x for x in (work.dense, work.moe, work.dense_rec, work.moe_rec, work.head))
        kept = self.caches.token_parts
        if alone_key is None:
            own = tuple(x / tokens for x in parts)
            kept[key] = tuple(map(min, kept[key], own)) if key in kept else own
            return
        alone, plain = kept.get(alone_key), kept.get((*key[:-1], False))
        if alone is not None and plain is not None:  # (one without its parts: none kept, token_parts reads none)
            kept[key] = tuple(min(max(0.0, x - a * tokens) / tokens, p)
                              for x, a, p in zip(parts, alone, plain, strict=True))

    def token_parts(self, refs: tuple) -> tuple[float, float, float, float, float, float]:
        """Per token at a rate's references (shard_rate's last element): one dense layer's work, one MoE layer's, one
        dense and one MoE decoder layer's recompute, the head's (perf.stage_work's parts of the work reference, kept
        by _per_token), and the CP reference's seconds (every layer's). Zeros where the references have no parts (an
        engine without stage_work, a refused reference): no share of the work. Kept per references in this search
        (parts_by_refs): a rate's references are all estimated, and their parts final, before any caller has the rate
        (shard_rate), and some 10,000 light_ranks asks on DeepSeek-V3/2,048 read a few hundred."""
        hit = self.parts_by_refs.get(refs)
        if hit is None:
            tp, ep, etp, recompute, b_tok, may_overlap, cp, b_cp = refs
            work = self.caches.token_parts.get(("work", tp, ep, etp, recompute, b_tok, may_overlap))
            cp_s = self.caches.token_time.get(("cp", tp, cp, b_cp), 0.0) if cp > 1 else 0.0
            hit = self.parts_by_refs[refs] = (*(work or (0.0, 0.0, 0.0, 0.0, 0.0)), cp_s)
        return hit  # type: ignore[return-value]

    def moe_sync_s(self) -> float:
        """The MoE layers' host sync per micro-batch (Engine.moe_layer_fixed_s each), 0 for a dense model."""
        if self.sync_s is None:
            moe = self.job.model.moe
            self.sync_s = len(moe.moe_layers) * self.engine.moe_layer_fixed_s if moe is not None else 0.0
        return self.sync_s

    def stretch_one(self, lay: Layout, mbs: int, b_tok: int, per_token: float, exposed: float,
                    refs: tuple | None = None, plain: list[float] | None = None,
                    whole: list[bool] | None = None) -> float:
        """stretch of one micro-batch size (token_bound's and the exact one pipeline_bound adds to)."""
        sizes = (mbs,)
        return self.stretch(lay, sizes, b_tok, per_token, exposed, refs, self.stretch_factors(lay, sizes),
                            plain=plain, whole=whole)[0]

    def stretch_factors(self, lay: Layout, sizes: tuple[int, ...], ideal: float = 0.0) -> list[tuple[float, float,
                                                                                                   float, int]]:
        """Per micro-batch size, what the bounds read of the layout's pipeline: m + its bubble stages, the share of
        its micro-batches outside the EP overlap's steady state (1 - moe_time.a2a_steady_share), ideal_time and m;
        once per (dp, pp, vpp, schedule, sizes, ideal), all they read (the bubble stages read pp, vpp and schedule).
        A dense model's outside share is 0.0, not worked out: no plan of it has an all-to-all, so every reader
        multiplies the share by an exposed all-to-all of 0.0 (stretch, group_floor), the same 0.0 at any share."""
        key = (lay.dp, lay.pp, lay.vpp, lay.schedule, sizes, ideal)
        hit = self.factors.get(key)
        if hit is None:
            bubble = lay.bubble_stages()
            gbs, dp, pp, vpp = self.job.global_batch_size, lay.dp, lay.pp, lay.vpp
            ms = [step_microbatches(gbs, mbs, dp) for mbs in sizes]  # (microbatches', without its call)
            lows = self.ideal_times(lay, sizes, ideal)
            dense = self.job.model.moe is None
            hit = self.factors[key] = [(m + bubble, 0.0 if dense else 1.0 - a2a_steady_share(m, pp, vpp), low, m)
                                       for m, low in zip(ms, lows, strict=True)]
        return hit

    def pipeline_bound(self, lay: Layout, mbs: int, recompute: str, interleave: bool = False,
                       exposed_a2a: bool = False) -> float:
        """The per-token bound plus the pipeline traffic interleaving multiplies: each stage sends and receives vpp
        times per micro-batch, so step >= (C/pp + vpp*pp_unit)(m + (pp-1)/vpp) (where the last rank may hold less and
        the stretch takes the pipeline's chains, m of them: each chain holds a rank's m micro-batches, each transfer at
        least the unit's). Once per arguments: it reads only them and the job (the exact token bound, pp_unit's cached
        units), not the seeded shards' sizes. `exposed_a2a`: of the layout's plans without the EP overlap
        (twin_bound)."""
        interleave = interleave and lay.vpp > 1  # without virtual stages there is no interleaving to add
        key = (lay, mbs, recompute, interleave, exposed_a2a)
        bound = self.pipe_bounds.get(key)
        if bound is not None:
            return bound  # type: ignore[return-value]
        kept = self.kept_pipe_bounds  # (empty until a search of the job kept its own: keep_for_job)
        bound = kept.get(key) if kept else None
        if bound is not None:  # an earlier request's: what working it out counts and notes, asked in this search
            self.shard_rate(lay, mbs, recompute, None, None, exposed_a2a)  # its references
            self.last_ranks(lay)  # (as the stretch's light_ranks notes its first ranks)
            if interleave:
                self.pp_unit(lay, mbs)  # its base's step terms, where only they give the unit
        else:
            rate = self.shard_rate(lay, mbs, recompute, None, None, exposed_a2a)
            plain: list[float] | None = [] if interleave else None
            flags: list[bool] = []  # whole_light at the rate, as the stretch read it
            bound = self.stretch_one(lay, mbs, *rate, plain=plain, whole=flags)  # exact token_bound
            if plain:  # the stretch's m + bubble transfers, a chain's m (it holds a rank's m micro-batches): the
                # chains under the stretch (chained) or over it (heavy_chains: the larger, the stretch's held)
                m, unit = self.microbatches(lay, mbs), lay.vpp * self.pp_unit(lay, mbs)
                stretched = plain[0] + (unit := unit * self.blocking_p2p_share(lay, m)) * (m + lay.bubble_stages())
                chains = bound
                if whole := flags[0]:  # (the chains over it: as capped)
                    bound = min(bound, plain[0])
                if bound == plain[0]:
                    bound = stretched
                elif bound < plain[0]:
                    bound += unit * m
                else:
                    bound = max(stretched, bound + unit * m)
                if whole and chains + unit * m > bound:
                    bound = chains + unit * m
        self.pipe_bounds[key] = bound
        return bound  # type: ignore[return-value]

    def keep_for_job(self) -> None:
        """Keep what this search worked out of the exact token and pipeline bounds and the seed keys in its job's memo
        (job_memo.py: each a pure function of its key), for a later request's search: copied dict to dict, so no key
        is hashed again (the first ask pays nothing for it)."""
        self.kept_token_bounds.update(self.token_bounds)
        self.kept_pipe_bounds.update(self.pipe_bounds)
        self.kept_seed_keys.update(self.seed_key_rows)

    def twin_bound(self, key: PlanKey) -> float:
        """overlap_choice.twin_bound: the plain twin's pipeline bound (its all-to-all exposed: the rate of a pipeline
        that cannot overlap it; the interleaved order's bubble and blocking share, the twin's schedule) and the DP term
        after it (sync_bound)."""
        lay, zero, recompute, mbs = key
        return self.sync_bound(lay, zero, mbs, self.pipeline_bound(lay, mbs, recompute, interleave=True,
                                                              exposed_a2a=True))

    def sharding_bound(self, lay: Layout, zero: int, mbs: int) -> float:
        """A bound of every plan of the layout at this ZeRO stage and micro-batch, at any recompute: m x the least
        seconds its slowest stage takes per micro-batch for the sharding traffic each micro-batch moves (the Engine's
        sharding_floor: 0 where none is per micro-batch, or without one)."""
        return self.microbatches(lay, mbs) * self.sharding_per_micro(lay, zero)

    def sharding_per_micro(self, lay: Layout, zero: int) -> float:
        """sharding_bound's seconds per micro-batch, kept per what it reads of a search's plan (the grid and the ZeRO
        stage: sequence parallelism follows tp, the rest is the request's)."""
        if self.engine.sharding_floor is None:
            return 0.0
        key = ("sharding", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero)
        per_micro = self.bounds_memo.get(key)
        if per_micro is None:
            per_micro = self.bounds_memo[key] = self.engine.sharding_floor(self.job, self.grid_plan(lay, zero))
        return per_micro  # type: ignore[return-value]

    def first_rank_sync(self, lay: Layout, zero: int, params: tuple[float, float, float] | None = None,
                        vpp: int | None = None) -> SyncFloor | None:
        """The SyncFloor of the layout's plans at this ZeRO stage, or of a first rank holding `params` (RankParts.sums:
        TP-split, TP-whole, routed, unsharded; default: the layout's own, rank0_params), in plans of at most `vpp`
        virtual chunks (default: the layout's); None where there is none (no such Engine estimator, a LoRA job, no
        estimate takes the layout's stages). Kept per grid, ZeRO stage, parameters and sync_vpp (the step_sync under it
        per all but the last: first_rank_step)."""
        if params is None:
            params = self.rank0_params(lay, zero)
            if params is None:
                return None
        chunks = self.sync_vpp(lay.vpp if vpp is None else vpp)
        key = ("sync", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero, params, chunks)
        hit = self.bounds_memo.get(key, False)
        if hit is False:
            step = self.first_rank_step(lay, zero, params)
            hit = self.bounds_memo[key] = None if step is None else step[0].chunked(step[1], chunks)
        return hit  # type: ignore[return-value]

    def first_rank_step(self, lay: Layout, zero: int, params: tuple[float, float, float]
                        ) -> tuple[SyncRates, StepSync] | None:
        """The grid's SyncRates at this ZeRO stage (grid_sync) and the step_sync of a first rank holding `params`
        under them (SyncRates.step: what does not depend on the virtual chunks, which SyncRates.chunked then reads), or
        None where there is no such Engine estimator; kept per grid, ZeRO stage and parameters, so a floor at another
        chunk count (first_rank_sync, grid_syncs.grid_stage_sync) costs only its chunked share."""
        key = ("step sync", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero, params)
        hit = self.bounds_memo.get(key, False)
        if hit is False:
            rates = self.grid_sync(lay, zero)
            hit = self.bounds_memo[key] = None if rates is None else (rates, rates.step(params))
        return hit  # type: ignore[return-value]

    def sync_vpp(self, vpp: int) -> int:
        """The virtual chunks a DP floor reads of plans of at most `vpp`: those, where the framework launches its DP
        sync chunk by chunk (perf.sync_chunks, the card's pipeline.chunk_dp_sync), else 1 (the floor is the same).
        Kept per vpp (the job's card is the search's: some 12,000 asks of 11 values on DeepSeek-V3/2,048)."""
        hit = self.chunks_by_vpp.get(vpp)
        if hit is None:
            hit = self.chunks_by_vpp[vpp] = sync_chunks(self.job, 1, vpp).chunks
        return hit

    def syncs_key(self, lay: Layout, chunks: int) -> tuple:
        """The bounds memo's key of group_syncs's DP bounds of the layout's grid at `chunks` (sync_vpp): one home for
        the writer and its readers (grid_stage_keys, impossible.least_dp_key)."""
        return ("syncs", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, chunks)

    def grid_sync(self, lay: Layout, zero: int) -> SyncRates | None:
        """The Engine's sync_rates of the layout's grid at this ZeRO stage (a plan of the grid: the DP traffic reads
        of a plan its degrees, its ZeRO stage and the request's fields), once per those."""
        if self.engine.sync_rates is None:
            return None
        key = ("rates", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero)
        hit = self.bounds_memo.get(key, False)
        if hit is False:
            grid = ("rates", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp)  # another ZeRO stage's: same groups
            other = self.bounds_memo.get(grid)
            plan = self.grid_plan(lay, zero)
            if other is None:
                hit = self.bounds_memo[grid] = self.engine.sync_rates(self.job, plan)
            else:
                hit = other.at(plan)  # type: ignore[union-attr]
            self.bounds_memo[key] = hit
        return hit  # type: ignore[return-value]

    def grid_plan(self, lay: Layout, zero: int) -> Plan:
        """A plan of the layout's grid (its degrees, no virtual stages or split) at this ZeRO stage, with the
        request's fields and sequence parallelism as the search sets them: all that sharding_per_micro's and
        grid_sync's estimators read of a plan. A copy of the search's first such plan with those fields changed
        (Plan has no validator beyond its fields' ranges, which a layout's degrees meet): validating one per grid
        cost more than the bounds it serves; copied: model_copy in fewer instructions (StrictModel.copied)."""
        grid = ("grid plan", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp)
        key = (*grid, zero)
        plan = self.bounds_memo.get(key)
        if plan is not None:
            return plan  # type: ignore[return-value]
        other = self.bounds_memo.get(grid)  # the grid's at another ZeRO stage: only that field to change
        if other is not None:
            plan = self.bounds_memo[key] = other.copied({"zero_stage": zero})  # type: ignore[union-attr]
            return plan
        base = self.bounds_memo.get("grid plan")
        if base is None:
            one = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, dp=1)
            base = self.bounds_memo["grid plan"] = self.plan(one, self.zeros[0], self.recomputes[0], 1)
        plan = self.bounds_memo[key] = base.copied({  # type: ignore[union-attr]
            "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "etp": lay.etp, "dp": lay.dp, "zero_stage": zero,
            "sequence_parallel": self.sequence_parallel(lay), "tp_comm_overlap": self.tp_overlap and lay.tp > 1})
        self.bounds_memo[grid] = plan
        return plan

    def rank0_params(self, lay: Layout, zero: int) -> tuple[float, float, float] | None:
        """The parameters of the decoder layers the layout's first pipeline rank holds at this ZeRO stage
        (floors.estimate_stages: the stages the estimate weighs), unsharded, as RankParts.sums splits them; None where
        no estimate takes them. Kept per the pipeline shape (what the stages read of the layout)."""
        key = ("rank0", lay.pp, lay.vpp, lay.first, lay.last, lay.split, lay.schedule, zero)
        hit = self.bounds_memo.get(key, False)
        if hit is False:
            stages = estimate_stages(self.job, lay, zero)
            hit = self.bounds_memo[key] = None if stages is None else job_layer_sums(self.job, stages.layers(0))
        return hit  # type: ignore[return-value]

    def sync_bound(self, lay: Layout, zero: int, mbs: int, pipe: float) -> float:
        """A bound of every plan of the layout at this ZeRO stage and micro-batch, at any recompute, where `pipe` bounds
        their pipeline: the pipeline is at least that, their sharding traffic (sharding_bound) and m x the first rank's
        compute and recompute per micro-batch, and the once-per-step DP term after it at least its traffic less a
        share of that (first_rank_sync): the least their sum can be (synced, of this ZeRO stage alone)."""
        floor = self.first_rank_sync(lay, zero) or SyncFloor()
        stage = StageSync(self.sharding_per_micro(lay, zero), floor.seconds, floor.hidden)
        return self.synced([pipe], [self.microbatches(lay, mbs)], (stage,))[0]

    def group_syncs(self, lays: list[Layout], seeds: list[tuple[float, int]] | None = None,
                    keep: bool = True) -> tuple[StageSync, ...]:
        """Per ZeRO stage of the search, for these layouts (one grid: a seed group's): the sharding traffic's seconds
        per micro-batch (sharding_per_micro) and the SyncFloor (seconds, hidden) of the least first-rank parameters of
        each kind among them (the floor only grows with either; none where one of them has no stages at that ZeRO
        stage, or no such Engine estimator): what synced reads; () where no stage has either (nothing to raise), or
        where a stage raises none of `seeds` (per micro-batch size, the least pipeline bound of the seeds to raise
        and their micro-batches: synced's own test, which only grows easier with a larger bound, so that stage keeps
        every later key of those layouts too, and the least over the stages is the key; the later stages are not
        worked out). Each stage's is grid_syncs.grid_stage_sync's, shared by the grids alike in what it reads. Kept per
        grid for grid_stage_keys, unless `keep` is False (impossible.below_settled: without `seeds`, the same keys from
        synced as the seeds' own would give, since a stage that raises none of them raises none of theirs)."""
        lay, syncs = lays[0], []
        chunks = self.sync_vpp(max(one.vpp for one in lays))  # the floor's hidden share grows with the chunks
        for zero in self.zeros:
            least = self.search_memo.get(("least rank0", lay.pp, zero)) if lay.pp > 1 else None
            if least is None:  # one stage (one shape), or none noted: the layouts' own
                params = [self.rank0_params(one, zero) for one in lays]
                if all(p is not None for p in params):
                    least = tuple(map(min, zip(*params, strict=True)))  # type: ignore[arg-type]
            stage = grid_stage_sync(self, lay, zero, least, chunks)  # type: ignore[arg-type]
            per_micro, seconds, hidden = stage
            # (synced's own test, term for term)
            if seeds is not None and all(m * per_micro <= key and (seconds <= 0.0 or seconds - hidden * key / m <= 0.0)
                                         for key, m in seeds):
                syncs = []  # this stage raises none of them
                break
            syncs.append(stage)
        found = () if all(not (per_micro or seconds) for per_micro, seconds, _ in syncs) else tuple(syncs)
        if keep:
            self.search_memo[self.syncs_key(lay, chunks)] = found
        return found

    def grid_stage_keys(self, lay: Layout, mbs: int, pipe: float) -> list[float]:
        """Per ZeRO stage, synced of one node where `pipe` bounds its plans' pipeline, with its grid's group_syncs
        (its seed group's, kept when it opened; worked out for this layout otherwise): no estimate beyond the group's,
        so a node's stages are split at no cost (engine.refine_shard); `pipe` for each where none raises it."""
        vpp = lay.vpp  # (sync_vpp's kept count read without its call where it is kept: some 5,000 asks of a few vpps)
        syncs = self.search_memo.get(self.syncs_key(lay, self.chunks_by_vpp.get(vpp) or self.sync_vpp(vpp)))
        if syncs is None:
            syncs = self.group_syncs([lay])
        if not syncs:
            return [pipe] * len(self.zeros)
        m = step_microbatches(self.job.global_batch_size, mbs, lay.dp)  # (microbatches', without its call)
        return self.synced([pipe], [m], syncs, True)  # type: ignore[arg-type]

    def raise_to_sync(self, group: SeedGroup, members: list) -> None:
        """Raise the seed keys of these members of an opened seed group (engine.open_group: where one of its layouts
        may fit) to the once-per-step DP bound (group_syncs, synced), once per shape entry: a budget-free bound, so
        kept with the keys (a search of the job at another budget reads them raised)."""
        gbs, dp = self.job.global_batch_size, members[0][0].dp  # (they read the group's dp)
        ms = [step_microbatches(gbs, mbs, dp) for mbs in group.sizes]  # (microbatches', without its call)
        if group.syncs is None:  # (its members' keys unraised until now)
            least = list(members[0][1][1])  # per micro-batch size, the least of the members' keys
            for _, entry, _ in members:
                for i, key in enumerate(entry[1]):
                    if key < least[i]:
                        least[i] = key
            seeds = list(zip(least, ms, strict=True))
            group.syncs = self.group_syncs([lay for lay, _, _ in group.members], seeds)
        if not group.syncs:
            return
        unraised = unraised_from(ms, group.syncs)  # (the same counts and stages for every member)
        for _, entry, _ in members:
            if not entry[3]:
                keys = entry[1] = self.synced(entry[1], ms, group.syncs, False, unraised)
                entry[2], entry[3] = min(keys), True
        group.note_keys()

    synced = staticmethod(synced_keys)  # (estimate/sync_floor.py)

    def blocking_p2p_share(self, lay: Layout, m: int) -> float:
        """The least share of a rank's pipeline transfers that block it (perf._exposed_p2p) in the layout's plans of
        `m` micro-batches (microbatches: the caller's): 1, or where the framework overlaps the steady state's (its
        card's pipeline.steady_p2p_overlap) the least over ranks of 1 - steady_share, at the interleaved order's
        warm-up (combined 1F1B's is one longer: more blocks)."""
        if lay.vpp == 1:
            return 1.0
        key = (lay.pp, lay.vpp, m)
        hit = self.p2p_shares.get(key)
        if hit is None:
            hit = self.p2p_shares[key] = 1.0
            if self.job.card.pipeline.steady_p2p_overlap:
                shape = plan_shape(self.job.card, *key)
                hit = self.p2p_shares[key] = min(1.0 - steady_share(shape, r) for r in range(lay.pp))
        return hit

    def seed_rate(self, lay: Layout, mbs: int, rates: dict[tuple, tuple[int, float, float, tuple]],
                  overlap: bool | None = None) -> tuple[int, float, float, tuple]:
        """token_rate of a seeded layout (no recompute, not `exact`), kept in `rates` for one seeding: there it reads
        of the layout only its tp, ep, etp, cp and whether its pipeline may overlap the all-to-all (work_mbs and
        cp_mbs hold the shard's largest micro-batch, set before any key is read); `overlap`: pipeline_overlaps of the
        layout where the caller has it."""
        if overlap is None:
            overlap = self.pipeline_overlaps(lay)
        key = (lay.tp, lay.ep, lay.etp, lay.cp, overlap)
        hit = rates.get(key)
        if hit is None:
            hit = rates[key] = self.token_rate(lay, mbs, self.recomputes[0])
        return hit

    def group_key(self, group: SeedGroup, lay: Layout, ideal: float,
                  rates: dict[tuple, tuple[int, float, float, tuple]]) -> float:
        """A seed group's key: group_floor at its layouts' seed rates (one per pipeline_overlaps over its vpps, by_vpp:
        all seed_rate reads besides the group's degrees), the MoE host sync, the least share outside the EP overlap's
        steady state (stretch_factors at its most vpps: group_floor) and least bubble (least_bubble), `lay` any one."""
        mbs = group.sizes[0]
        rated: dict[bool, tuple[int, float, float]] = {}
        for one in group.by_vpp.values():
            overlap = self.pipeline_overlaps(one)
            if overlap not in rated:
                rated[overlap] = self.seed_rate(one, mbs, rates, overlap)[:3]
        bubble = group.least_bubble(lambda one, ranks:
                                    self.ranks_light(ranks, one, self.seed_rate(one, mbs, rates)) is not None)
        outsides = None if not any(rate[2] for rate in rated.values()) else [
            factor[1] for factor in self.stretch_factors(group.by_vpp[max(group.by_vpp)], group.sizes)]
        return group_floor(self.job.seq_length, self.job.global_batch_size, lay, group.sizes, tuple(rated.values()),
                           bubble, ideal, self.moe_sync_s(), outsides)

    def seed_keys(self, lay: Layout, sizes: tuple[int, ...], ideal: float,
                  rate: tuple[int, float, float, tuple] | None = None, ranks: Ranks | bool | None = False
                  ) -> list[float]:
        """The seed key of each micro-batch: the larger of the ideal time and the per-token bound, whose
        references are the same for all of them (token_rate, or `rate` when the caller has it; `ranks`: the layout's
        last_ranks where it has them). The search keeps each shape's keys with its seeds (Seeds), so they are worked
        out once per shape."""
        if rate is None:
            rate = self.token_rate(lay, sizes[0], self.recomputes[0])
        if ranks is False:  # (the stretch notes the layout's first ranks: last_ranks)
            return self.stretch(lay, sizes, *rate, factors=self.stretch_factors(lay, sizes, ideal), ideal=True)
        # the layout's last ranks given: a pure function of the layout, micro-batches, ideal time and the rate's
        # references (which name its figures), kept for a later request (keep_for_job)
        key = (lay, sizes, ideal, rate[3])
        kept = self.kept_seed_keys
        keys = kept.get(key) if kept else None
        if keys is not None:
            return list(keys)
        keys = self.stretch(lay, sizes, *rate, factors=self.stretch_factors(lay, sizes, ideal), ideal=True, ranks=ranks)
        self.seed_key_rows[key] = tuple(keys)
        return keys

