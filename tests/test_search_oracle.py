"""The search is exact (issue 23): on sampled requests its top K are the exhaustive oracle's (search/oracle.py: every
plan estimated by brute force, no bounds, no pruning, none of the search's caches). The sampler draws dense, MoE and
MLA models, short and long sequences (CP), odd GPU counts, every framework, GPU and batch size, from a seed per
request, so a failure names the request that reproduces it. The default run holds 32 requests; the `slow` run 200
more and 160 that fix knobs (392 sampled in all; issue 23 asks for at least 300)."""

import random

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k, recommend
from meshplan.search.policy import same_numbers

MODELS = {
    "dense": ["llama-3.1-8b", "qwen3-8b", "mistral-7b", "1B", "3B"],
    "moe": ["olmoe-1b-7b", "qwen3-30b-a3b", "gpt-oss-20b", "mixtral-8x7b"],
    "mla": ["deepseek-v2-lite", "moonlight-16b-a3b"],
}
FRAMEWORKS = ["megatron-core", "megatron-bridge", "deepspeed", "torchtitan", "nanotron", "kempnerforge", "verl",
              "skyrl"]
GPUS = ["h100", "a100-80gb", "h200", "b200"]
COUNTS = [1, 2, 3, 4, 6, 8, 12, 16]  # odd counts included: the degrees must divide them
SEQUENCES = [1024, 2048, 4096, 8192, 32768, 131072]  # long ones need CP to fit


def sampled_request(seed: int) -> tuple[Request, int]:
    """One request and a top K, drawn from `seed`."""
    rng = random.Random(seed)
    kind = ("dense", "moe", "mla")[seed % 3]
    gpus = rng.choice(COUNTS)
    fields = dict(model=rng.choice(MODELS[kind]), framework=rng.choice(FRAMEWORKS), gpu=rng.choice(GPUS),
                  num_gpus=gpus, seq_length=rng.choice(SEQUENCES), global_batch_size=gpus * rng.choice((1, 2, 4, 8)))
    return Request(**fields), rng.randint(1, 5)


def rows_of(step_times_and_peaks) -> list[tuple[float, int]]:
    return [same_numbers(t, p) for t, p in step_times_and_peaks]


def check_against_the_oracle(seed: int) -> bool:
    """The search's top K equal the oracle's (step times to 1e-12, each row one of the oracle's); True when the
    request had a row to rank."""
    return check_request_against_the_oracle(*sampled_request(seed))


def check_request_against_the_oracle(req: Request, top_k: int) -> bool:
    """check_against_the_oracle of one request."""
    try:
        rec = recommend(req, top_k=top_k)
    except MeshplanError:  # refused up front (a rule no layout passes): the oracle has nothing either
        assert exhaustive_top_k(req, 1) == [], req
        return False
    oracle = exhaustive_top_k(req, 100)
    times = [c.throughput.step_time_s for c in rec.candidates]
    assert times == pytest.approx([r.step_time_s for r in oracle[:top_k]], rel=1e-12), req
    every = set(rows_of((r.step_time_s, r.peak_bytes) for r in oracle))
    assert set(rows_of((c.throughput.step_time_s, c.memory.peak_bytes) for c in rec.candidates)) <= every, req
    return bool(oracle)


# A cluster's own network (network_gbps_per_node, request/resolve.cluster_gpu): 100 and 400 Gb/s per node (Jean Zay's
# 4x Omni-Path 100 Gb/s: an eighth of a DGX's), the DGX's 3,200 and 51,200 (6.4 Tb/s per GPU, over NVLink's share);
# nodes of 2 where the count allows, so that even the sampler's small counts cross the network.
NETWORKS = (100.0, 400.0, 3200.0, 51200.0)


def sampled_network_request(seed: int) -> tuple[Request, int]:
    """sampled_request(seed) on a network of NETWORKS, in nodes of 2 GPUs where its count is even."""
    req, top_k = sampled_request(seed)
    nodes = {"gpus_per_node": 2} if req.num_gpus and req.num_gpus % 2 == 0 else {}
    return req.model_copy(update={"network_gbps_per_node": NETWORKS[seed % len(NETWORKS)], **nodes}), top_k


@pytest.mark.parametrize("seed", range(8))
def test_the_search_finds_the_oracles_top_k_on_a_stated_network(seed):
    check_request_against_the_oracle(*sampled_network_request(seed))


def test_the_search_finds_the_oracles_top_k_on_sampled_requests():
    ranked = sum(check_against_the_oracle(seed) for seed in range(32))
    assert ranked >= 16  # the sampler stays meaningful: most requests have layouts to rank


# One test per request: a failure names its seed, and the test workers (pytest-xdist) share them out evenly. Seeds
# 1000-1299 all passed on the tree of 2026-12-05 (fd6ba71b); 1200-1299 were left out of the suite then to keep CI on
# two cores under 30 minutes (widen the range to run them: each seed draws its own request).
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1000, 1200))
def test_the_search_finds_the_oracles_top_k_on_200_more(seed):
    check_against_the_oracle(seed)


# Knobs a request fixes (the search keeps them): drawn one to four at a time, half the time with a bundle of fixed
# degrees, so the bounds, floors and rules are held to the oracle where they read the request's own choices (the
# named requests below marked "found by a sampler of requests that fix knobs" came from this draw).
FIXED_KNOBS = {
    "moe_a2a_overlap": (True, False), "moe_token_dispatcher": ("alltoall", "flex"),
    "pipeline_schedule": ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "dualpipev", "combined_1f1b"),
    "recompute": ("none", "selective", "full"), "recompute_layers": (1, 2, 4), "recompute_method": ("uniform", "block"),
    "activation_offload": (True,), "param_offload": (True,), "optimizer_offload": (True,),
    "optimizer_offload_fraction": (0.0, 0.5, 1.0), "cpu_memory_per_node": (64.0, 2048.0), "precision": ("fp8",),
    "fp8_recipe": ("delayed", "tensorwise", "blockwise", "mxfp8"), "sequence_parallel": (True, False),
    "cp_comm_type": ("p2p", "a2a", "allgather", "a2a+p2p"), "tp_comm_overlap": (True, False),
    "torch_compile": (True, False), "optimizer": ("muon",), "optimizer_state_dtype": ("bf16", "fp8"),
    "lora_rank": (8, 64), "headroom": (0.0, 0.05, 0.3, 0.73), "attention_backend": ("flash", "fused", "unfused"),
    "moe_routing_imbalance": (1.0, 1.3), "gpus_per_node": (2, 4), "first_stage_layers": (1, 3, 5),
    "last_stage_layers": (1, 3, 5), "account_for_loss": (True,), "pipeline_microbatches": (1, 2),
}
DEGREES = {"tp": (1, 2, 4), "pp": (1, 2, 4), "cp": (1, 2), "ep": (1, 2, 4), "vpp": (1, 2, 3),
           "zero_stage": (0, 1, 2, 3), "micro_batch_size": (1, 2, 4)}


def sampled_fixed_request(seed: int) -> tuple[dict, int]:
    """A request that fixes knobs, and a top K (1 to 3: a key over its plan shows first at K=1), drawn from `seed`."""
    rng = random.Random(seed)
    gpus = rng.choice((2, 4, 6, 8, 12, 16))
    fields = dict(model=rng.choice(MODELS[("dense", "moe", "mla")[seed % 3]]),
                  framework=(*FRAMEWORKS, "nemo-automodel")[(seed // 3) % 9], gpu=rng.choice(("h100", "h200", "b200")),
                  num_gpus=gpus, seq_length=rng.choice((1024, 4096, 16384)),
                  global_batch_size=gpus * rng.choice((1, 2, 4)))
    if rng.random() < 0.5:
        for name in rng.sample(sorted(DEGREES), rng.randint(2, 4)):
            fields[name] = rng.choice([d for d in DEGREES[name]
                                       if name not in ("tp", "pp", "cp", "ep") or gpus % d == 0])
    for name in rng.sample(sorted(FIXED_KNOBS), rng.randint(1, 4)):
        fields[name] = rng.choice(FIXED_KNOBS[name])
    return fields, rng.randint(1, 3)


def check_fixed_against_the_oracle(seed: int) -> None:
    """recommend answers the oracle's top K, or both refuse the request (a MeshplanError, never another exception)."""
    fields, top_k = sampled_fixed_request(seed)
    try:
        req = Request(**fields)
    except ValueError:  # a field combination the schema refuses (pydantic's error, before any search)
        return
    try:
        rec = recommend(req, top_k=top_k)
    except MeshplanError:
        try:
            assert exhaustive_top_k(req, 1) == [], (seed, fields)
        except MeshplanError:
            pass
        return
    oracle = exhaustive_top_k(req, top_k)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12), (seed, fields)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5000, 5160))
def test_the_search_finds_the_oracles_top_k_on_requests_that_fix_knobs(seed):
    check_fixed_against_the_oracle(seed)


# Requests the sampler cannot draw (models over its GPU counts) where the search was once wrong.
NAMED = [
    # Llama-4-Maverick's layers alternate dense and MoE, so an interleaved rank holds other kinds of layers than its
    # non-interleaved base's (floors.own_memory): TP1 PP8 VPP2 EP32 without ZeRO peaks at 145.7 GB without recompute
    # and fits, but its base's first-rank floor was 153.3 GB, and the search answered the oracle's first and third
    # rows and a slower one.
    dict(model="llama-4-maverick", num_gpus=256, gpu="h200", framework="megatron-core", seq_length=4096,
         global_batch_size=512, tp=1, pp=8, vpp=2, ep=32, zero_stage=0, micro_batch_size=2, headroom=0.0),
    # torchtitan's ZBV (zero_bubble at VPP2) places rank 0's chunks in a V: stage 0 holds 4 micro-batches, the last
    # stage 1 (pipeline_counts.in_flight); the first-rank floor counted 4 on both, 81.4 GB of fit figure against the
    # plan's 75.4 GB and a budget of 78.7 GB (headroom 8% of 85.5 GB), so the search answered nothing where it fits.
    dict(model="llama-3.1-8b", num_gpus=16, gpu="h100", framework="torchtitan", seq_length=4096, global_batch_size=32,
         tp=1, pp=4, vpp=2, cp=1, pipeline_schedule="zero_bubble", zero_stage=0, recompute="none", micro_batch_size=2,
         headroom=0.08),
    # A LoRA job skips the frozen linears' weight gradients, but the search's ideal step time (every seed key's
    # floor) counted full training's FLOPs: 0.2398 s against the oracle's best plan's 0.1924 s (TP1 PP1 ZeRO-1 mbs 8),
    # and the search answered 0.2014 s first (search.estimators.ideal_time now reads lora.frozen_flops_per_token).
    dict(model="mistral-7b", num_gpus=2, gpu="b200", framework="megatron-bridge", lora_rank=64, seq_length=1024,
         global_batch_size=16, headroom=0.0),
    # Rules that read the recompute (engine.apply_rules asked them at the lightest one and took the verdict for every
    # recompute). OF002: DeepSpeed offloads only the inputs its checkpointing keeps, so activation_offload needs full
    # recompute: every layout was rejected at `none`, and the search answered nothing where the oracle ranks 0.910 s
    # (ZeRO-3 mbs 2 full).
    dict(model="llama-3.1-8b", num_gpus=2, gpu="h100", framework="deepspeed", activation_offload=True,
         seq_length=2048, global_batch_size=8, headroom=0.1),
    # EP009: a fixed moe_a2a_overlap refuses full recompute; the rules passed at `none`, so the staircase's memory
    # estimate at `full` raised out of recommend (EstimateBlocked) where the oracle ranks 0.264 s.
    dict(model="deepseek-v2-lite", num_gpus=6, gpu="b200", framework="megatron-core", moe_a2a_overlap=True,
         seq_length=2048, global_batch_size=24, headroom=0.4),
    # With moe_a2a_overlap fixed on, the per-token bounds' references ran without it (pipeline_overlaps read only
    # the search's own choice): the seed key of TP2 EP8 ETP2 DP8 (3.504 s) was over its ZeRO-3 plan's 3.478 s, and
    # the search answered 3.696 s first (before the recompute masks it raised EstimateBlocked instead).
    dict(model="mixtral-8x7b", num_gpus=16, gpu="h100", framework="megatron-core", moe_a2a_overlap=True,
         seq_length=4096, global_batch_size=64),
    # The oracle left out rule MEM003 (the host holds what the plan offloads) that `check` and the search's fit
    # apply: SkyRL offloads the optimizer by default, 351 GiB of host memory per node against cpu_memory_per_node 64
    # (176 GiB since the node is charged the job's 4 ranks, not 8: mesh.ranks_per_node),
    # so the search answered nothing where the oracle ranked 1.677 s (ZeRO-1 mbs 1) (found by a sampler of requests
    # that fix knobs; oracle.exhaustive_top_k now skips a plan over the host's memory).
    dict(model="deepseek-v2-lite", num_gpus=4, gpu="h100", framework="skyrl", cpu_memory_per_node=64.0,
         seq_length=2048, global_batch_size=32),
    # OLMoE's 16 layers at pp=16 with last_stage_layers=5 leave 11 layers for 15 middle stages: PP004 checks that on
    # the Megatron engines only, so on NeMo AutoModel the estimate split them into empty stages and a bare ValueError
    # came out of recommend and the oracle (PP007 now counts the middle stages' chunks on every engine).
    dict(model="olmoe-1b-7b", num_gpus=32, gpu="h200", framework="nemo-automodel", last_stage_layers=5,
         seq_length=1024, global_batch_size=256, headroom=0.02),
    # TP fixed over the node: no plan keeps TP inside the NVLink domain, so the search ranks its second tier (TP
    # across domains, engine.run_search); the oracle searched the first tier only and had nothing to hold it to (it
    # now takes the second where the first has no row).
    dict(model="llama-3.1-8b", num_gpus=16, gpu="h100", framework="megatron-core", tp=8, gpus_per_node=4,
         seq_length=4096, global_batch_size=32),
    # The decision table searches the request at its strategies' degrees (pp=2 here), the given stage sizes kept:
    # 4 + 1 of Mixtral's 32 layers with no middle stage, which no rule refused off the Megatron engines, so the
    # estimate's MeshplanError came out of recommend where the oracle ranks 31.12 s (PP007 now refuses it).
    dict(model="mixtral-8x7b", num_gpus=16, gpu="h200", framework="nemo-automodel", pp=4, first_stage_layers=4,
         last_stage_layers=1, gpus_per_node=4, seq_length=32768, global_batch_size=32),
    # pipeline_schedule=combined_1f1b turns the EP overlap on in every plan the search builds (plans.a2a_overlap), but
    # the up-front refusal (refusal.Space.plan) probed the plans with it off, where PP015 refuses every one: recommend
    # raised "No layout can pass rule PP015" where the oracle ranks 0.2753 s (TP1 PP2 VPP7 EP8 DP8).
    dict(model="qwen3-30b-a3b", num_gpus=16, gpu="b200", framework="megatron-core", pipeline_schedule="combined_1f1b",
         seq_length=2048, global_batch_size=16),
    # KempnerForge's FSDP units hold their unsharded gradients between micro-batches (card grad_accumulation), so
    # memory is not monotone in the micro-batch: TP1 EP2 DP2 at mbs 1 (2 micro-batches) holds them and needs more
    # than any recompute gives, at mbs 2 (one micro-batch) it holds none and fits at 48.8 GB with full recompute. The
    # search took mbs 1's need as a floor for mbs 2 (need_range) and answered 5.41 s second where the oracle ranks
    # 2.865 s (slow sampled seed 1064).
    dict(model="deepseek-v2-lite", num_gpus=4, gpu="a100-80gb", framework="kempnerforge", seq_length=8192,
         global_batch_size=4),
    # A carried field given makes the search probe which ZeRO stages an estimate can take (zero_stages.estimable_zeros);
    # it probed at recompute none only, where SkyRL's main_sft refuses ZeRO 3 (RC006: it runs full recompute), so the
    # search left ZeRO 3 out, and the oracle, which tried the search's own stages, left it out with it. The oracle now
    # tries every stage the request leaves open: it ranks 2.040 s (ZeRO 3, full recompute) first.
    dict(model="moonlight-16b-a3b", num_gpus=8, gpu="h100", framework="skyrl", seq_length=8192, global_batch_size=32,
         expandable_segments=True),
    # DeepSpeed ZeRO-3 with overlap_comm false runs every all-gather and reduce-scatter in line with the compute
    # (ShardingSchedule.overlapped): its plans' steps rise above the sharding floor the bounds read, never under it.
    dict(model="llama-3.1-8b", num_gpus=8, gpu="a100-80gb", framework="deepspeed", grad_reduce_overlap=False,
         zero_stage=3, seq_length=8192, global_batch_size=16),
    # Megatron-FSDP with --overlap-grad-reduce off turns its overlap back on (MegatronFSDP.__init__, card
    # sharding_overlap_off units overlapped at ZeRO-2/3): its units and the replicas' all-reduce stay hidden
    # (sharding_traffic.units_kept_overlapped, read by step_sync, which the sync floor reads too), while ZeRO-1's
    # sync is exposed: the oracle ranks ZeRO-3 first (0.7037 s, mbs 2) and the bounds must hold on both sides.
    dict(model="llama-3.1-8b", num_gpus=16, gpu="h100", framework="megatron-core", grad_reduce_overlap=False,
         dp_replicate=2, seq_length=4096, global_batch_size=32),
]


@pytest.mark.parametrize("fields", NAMED)
def test_the_search_finds_the_oracles_top_k_on_named_requests(fields):
    req = Request(**fields)
    oracle = exhaustive_top_k(req, 3)
    rec = recommend(req, top_k=3)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12)
    assert set(rows_of((c.throughput.step_time_s, c.memory.peak_bytes) for c in rec.candidates)) <= set(
        rows_of((r.step_time_s, r.peak_bytes) for r in oracle))


def test_the_search_finds_the_oracles_top_k_on_llama_4_scout_with_fixed_degrees():
    """Found by a generic sampler (pre-existing at 2e32021): the search answers one row, 16.93 s (ZeRO-1 mbs 1 full),
    where the oracle's next four are ZeRO-3 plans that fit (17.09 s at 49.2 GB, 17.92 s at 55.7 GB, 20.72 s, 27.76 s on
    an 80 GB H100 at headroom 5%). The same cause as the test above: apply_rules asks the rules at recompute none, where
    the EP overlap is on and PP015 refuses it with ZeRO-3 over virtual stages; at full recompute EP009 turns the overlap
    off and PP015 passes, so ZeRO-3's full-recompute plans are valid but never searched."""
    req = Request(model="llama-4-scout", num_gpus=256, gpu="h100", framework="megatron-core", tp=2, pp=4, vpp=3, ep=2,
                  cp=2, seq_length=32768, global_batch_size=256, headroom=0.05)
    oracle = exhaustive_top_k(req, 5)
    rec = recommend(req, top_k=5)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12)


def test_nanotron_is_never_ranked_interleaved():
    """Found by a sampler of requests that fix knobs: nanotron has no interleaved schedule (its card's
    pipeline.interleaved is null), but with the loss counted in the split the search enumerated virtual stages and no
    rule refused them without a named schedule: DeepSeek-V2-Lite on 12 A100 ranked TP1 PP2 VPP7 CP2 EP2 DP3 first
    (14.62 s); PP013 now refuses vpp > 1 where the framework cannot interleave. (Its pipeline bound there was also
    over the plan, nanotron's per-layer host sync multiplied by vpp: perf.pipeline_unit leaves it out.) The request
    fixed ep=2 and cp=2 too, which rule NT001 now refuses on nanotron (tests/test_knob_refusals.py); without them, on
    the 16 GPUs the shorter-sharded plans need."""
    req = Request(model="deepseek-v2-lite", framework="nanotron", gpu="a100-80gb", num_gpus=16, seq_length=16384,
                  global_batch_size=48, pp=2, account_for_loss=True)
    oracle = exhaustive_top_k(req, 3)
    rec = recommend(req, top_k=3)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12)
    assert rec.candidates and all(c.plan.vpp == 1 for c in rec.candidates)


HYBRIDS = ["nemotron-h-8b", "nemotron-3-nano-30b-a3b"]


def sampled_hybrid_request(seed: int) -> tuple[Request, int]:
    """A hybrid Mamba-2 request (Nemotron-H, Nemotron 3 Nano) on the frameworks that build one, and a top K."""
    rng = random.Random(seed)
    gpus = rng.choice([1, 2, 4, 8, 12, 16])
    fields = dict(model=rng.choice(HYBRIDS), framework=rng.choice(["megatron-core", "megatron-bridge"]),
                  gpu=rng.choice(GPUS), num_gpus=gpus, seq_length=rng.choice([1024, 4096, 8192, 32768]),
                  global_batch_size=gpus * rng.choice((1, 2, 4, 8)))
    return Request(**fields), rng.randint(1, 5)


def test_the_search_finds_the_oracles_top_k_on_hybrid_requests():
    """Hybrid models (before: recommend refused them): the bounds take a stage's least layer of each kind
    (stage_time.hybrid_one_layer_work, rank_chains.hybrid_rank_load, floors._layer_activation_sums), so the search's
    top K are still the oracle's."""
    ranked = 0
    for seed in (3, 6, 7, 18, 22, 23, 25):  # the sampler's requests that rank a layout and take seconds
        req, top_k = sampled_hybrid_request(seed)
        rec = recommend(req, top_k=top_k)
        oracle = exhaustive_top_k(req, 100)
        times = [c.throughput.step_time_s for c in rec.candidates]
        assert times == pytest.approx([r.step_time_s for r in oracle[:top_k]], rel=1e-12), (seed, req)
        ranked += bool(oracle)
    assert ranked >= 6


@pytest.mark.parametrize("fields", [
    dict(gpu="h200", num_gpus=32, seq_length=4096, global_batch_size=256, ep=32),
    dict(gpu="h200", num_gpus=32, seq_length=4096, global_batch_size=128, pp=2, ep=16),
    # its recipes' two depths of the one block (request/mtp_depth.py): the bounds' references train both
    dict(gpu="h200", num_gpus=32, seq_length=4096, global_batch_size=128, pp=2, ep=16, mtp_num_layers=2,
         mtp_use_repeated_layer=True),
])
def test_the_search_finds_the_oracles_top_k_on_nemotron_3_super(fields):
    """Nemotron 3 Super: latent MoE layers and an MTP block of an attention and an MoE layer, which the last stage
    trains (stage_time.layer_kinds); the hybrid bounds count the MTP block's layers in the work a reference holds
    (rank_chains.trained_pattern), so a rank with 1/pp of the main pattern is not taken for 1/pp of the work."""
    req = Request(model="nemotron-3-super-120b-a12b", framework="megatron-core", **fields)
    rec = recommend(req, top_k=3)
    oracle = exhaustive_top_k(req, 100)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle[:3]], rel=1e-12)
    assert len(rec.candidates) == 3


@pytest.mark.parametrize("fields", [
    dict(framework="verl", model="llama-3.1-8b", gpu="h100", num_gpus=2, seq_length=16384, global_batch_size=16,
         lora_rank=16, lora_targets=["linear_qkv", "linear_proj"], headroom=0.0),
    dict(framework="megatron-bridge", model="llama-3.1-8b", gpu="h100", num_gpus=4, seq_length=16384,
         global_batch_size=16, lora_rank=16, lora_targets=["linear_fc1", "linear_fc2"], headroom=0.0),
    dict(framework="megatron-bridge", model="qwen3-30b-a3b", gpu="h100", num_gpus=8, seq_length=8192,
         global_batch_size=32, lora_rank=16, lora_targets=["linear_qkv", "linear_proj"]),
])
def test_the_search_finds_the_oracles_top_k_on_lora_target_subsets(fields):
    """A LoRA job whose targets leave linears without an adapter: those keep no input (activations.frozen_linear_bytes),
    which the estimate and the search's first-stage floor both take off, so the search's top 3 are the oracle's."""
    req = Request(**fields)
    rec = recommend(req, top_k=3)
    oracle = exhaustive_top_k(req, 100)
    assert rec.candidates
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle[:3]], rel=1e-12)


@pytest.mark.parametrize("fields", [
    dict(model="nemotron-3-nano-30b-a3b", gpu="h100", num_gpus=8, seq_length=4096, global_batch_size=64, lora_rank=16),
    dict(model="nemotron-h-8b", gpu="h200", num_gpus=4, seq_length=8192, global_batch_size=16, lora_rank=32),
    dict(model="nemotron-h-8b", gpu="h100", num_gpus=8, seq_length=4096, global_batch_size=32, lora_rank=8,
         lora_targets=["in_proj", "out_proj"]),
])
def test_the_search_finds_the_oracles_top_k_on_hybrid_lora(fields):
    """A LoRA job on a hybrid (before: refused) on Megatron-Bridge: the frozen base's two passes and each layer kind's
    adapters (a Mamba-2 layer's in_proj / out_proj) enter the hybrid bounds as dense LoRA's do, so the search's top 3
    are the oracle's."""
    req = Request(framework="megatron-bridge", **fields)
    rec = recommend(req, top_k=3)
    oracle = exhaustive_top_k(req, 100)
    assert rec.candidates
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle[:3]], rel=1e-12)


@pytest.mark.parametrize("seed", [3, 8, 11, 5024])
def test_the_oracles_kept_verdicts_are_checks(seed):
    """Verdicts.passes (each blocking rule's verdict kept per what it declares it reads, a firing one too), in a
    Verdicts of its own as the oracle asks it, answers `check`'s ok on every plan the oracle builds, in its order:
    AD001 fires on most of seed 11's plans (its screen keys them), 5024 fixes knobs."""
    from meshplan.rules.engine import Verdicts
    from meshplan.search.engine import BestFirstSearch
    from meshplan.search.estimators import default_engine
    from meshplan.search.job import search_job
    from meshplan.search.space import Fixed, enumerate_layouts, micro_batches, request_zeros

    req = Request(**sampled_fixed_request(seed)[0]) if seed >= 5000 else sampled_request(seed)[0]
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    engine = default_engine(job.framework)
    space = BestFirstSearch.for_job(job, fixed, engine, 1)
    kept, verdicts = Verdicts(job), []
    for lay in enumerate_layouts(job, fixed)[0][:40]:
        for mbs in micro_batches(job, lay, fixed):
            for zero in request_zeros(job.card, fixed):
                for recompute in space.recomputes:
                    plan = space.plan(lay, zero, recompute, mbs)
                    verdicts.append((kept.passes(job, plan), engine.check(job, plan).ok))
    assert verdicts and all(kept == ok for kept, ok in verdicts)
    assert {ok for _, ok in verdicts} == {True, False}  # both verdicts asked
