"""The rules one framework adds (HY001-HY004, DSA001-DSA003, TT001, TT003, TT004, DS*, KF*, AM*, SK002, VL002): no
hybrid Mamba-2 or Gated DeltaNet model, nor DeepSeek Sparse Attention, where its model code builds none or meshplan
does not model it, DSA's CP all-gather; its own limits on etp, ep, ZeRO with pp, the mesh, pipeline micro-batches and
dispatcher of NeMo AutoModel, and the padding its sequence splits need; a ZeRO-0 that torchtitan 0.1/0.2 shard over
CP; and AD001, a setting the framework's adapter cannot write."""

from __future__ import annotations

from meshplan.arithmetic.lora import lora_frameworks
from meshplan.arithmetic.memory_states import bytes_per_param, convention, replicates_by_sharding
from meshplan.core.identity_memo import IdentityMemo
from meshplan.core.units import either_or
from meshplan.knowledge.adapter_knobs import (
    LAYOUT_DEGREES,
    SPLIT_KNOBS,
    MissingKnob,
    default_render,
    missing_knob,
    missing_layout_knob,
)
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.engine_card import ZERO_STAGES
from meshplan.knowledge.releases import numbers
from meshplan.rules.engine import Context, Values, rule, rule_specs
from meshplan.rules.fix_values import BATCH_READS, fmt_set, layout_words
from meshplan.rules.pipeline import fewer_microbatches_than_stages
from meshplan.rules.world import ep_borrows, mesh_product, working_ep
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Job, Plan


@rule("HY001", reads=())
def no_hybrid_model(ctx: Context) -> Values:
    """A hybrid Mamba-2 model (nemotron_h) on a framework whose model code builds none (the card lists them); the fix
    names the frameworks neither HY001 nor HY002 refuses, and of those, for a LoRA job, the ones that run LoRA."""
    pattern = ctx.arch.layer_pattern
    if pattern is None or ctx.arch.mamba is None:
        return None
    return {"model": ctx.arch.name, "framework": ctx.job.framework, "mamba": pattern.count("M"),
            **_builders(ctx, ("HY001", "HY002"))}


def _unrefused(refusing: tuple[str, ...]) -> list[str]:
    """The frameworks none of the rules `refusing` lists (rules.yaml `frameworks`): the ones whose model code builds
    the model as meshplan models it, which a refusal's fix names."""
    refused = {f for rid in refusing for f in rule_specs()[rid].frameworks}
    return [f for f in FRAMEWORKS if f not in refused]


def _builders(ctx: Context, refusing: tuple[str, ...]) -> dict[str, str]:
    """A refusal fix's `builders` and `job`: the frameworks none of the rules `refusing` lists (_unrefused), and for a
    LoRA job those of them that run LoRA; where none of them does (DeepSeek-V3.2: Megatron-Core alone builds it, and
    runs no LoRA), the frameworks for the job as full training, said so, rather than a LoRA job LORA001 then refuses."""
    builders = _unrefused(refusing)
    if ctx.job.lora is None:
        return {"builders": either_or(builders), "job": "job"}
    lora = [f for f in builders if f in lora_frameworks()]
    if lora:
        return {"builders": either_or(lora), "job": "LoRA job"}
    return {"builders": either_or(builders),
            "job": "job as full training (none of the frameworks that build it runs LoRA)"}


@rule("HY002", reads=())
def hybrid_through_transformers(ctx: Context) -> Values:
    """A hybrid Mamba-2 model on a framework that trains it through transformers' code (the card lists them)."""
    return no_hybrid_model(ctx)


@rule("HY003", reads=())
def no_gated_deltanet_model(ctx: Context) -> Values:
    """A Gated DeltaNet hybrid (qwen3_next) on a framework whose model code builds none (the card lists them); the fix
    names the frameworks neither HY003 nor HY004 refuses, and of those, for a LoRA job, the ones that run LoRA."""
    pattern = ctx.arch.layer_pattern
    if pattern is None or ctx.arch.gdn is None:
        return None
    return {"model": ctx.arch.name, "framework": ctx.job.framework, "gdn": pattern.count("G"),
            "model_type": ctx.arch.model_type,
            **_builders(ctx, ("HY003", "HY004"))}


@rule("HY004", reads=())
def gated_deltanet_elsewhere(ctx: Context) -> Values:
    """A Gated DeltaNet hybrid on a framework that trains it through transformers' or its own Gated DeltaNet code
    (the card lists them)."""
    return no_gated_deltanet_model(ctx)


@rule("DSA001", reads=())
def no_dsa_model(ctx: Context) -> Values:
    """A DeepSeek Sparse Attention model (deepseek_v32) on a framework whose model code builds no indexer (the card
    lists them); the fix names the frameworks neither DSA001 nor DSA002 refuses (_builders: Megatron-Core, which runs
    no LoRA, so a LoRA job is told to plan full training there)."""
    dsa = ctx.arch.dsa
    if dsa is None:
        return None
    return {"model": ctx.arch.name, "framework": ctx.job.framework, "heads": dsa.index_n_heads,
            "topk": dsa.index_topk, "layers": ctx.arch.num_layers,
            **_builders(ctx, ("DSA001", "DSA002"))}


@rule("DSA002", reads=())
def dsa_through_dense_mask(ctx: Context) -> Values:
    """A DeepSeek Sparse Attention model on a framework that runs it as dense attention under a top-k mask."""
    return no_dsa_model(ctx)


@rule("DSA003", reads=("cp", "cp_comm_type"))
def dsa_cp_allgather(ctx: Context) -> Values:
    """Megatron-Core's DSAttention asserts cp_comm_type allgather under context parallelism."""
    p = ctx.plan
    if ctx.arch.dsa is None or p.cp == 1 or p.cp_comm_type == "allgather":
        return None
    return {"cp": p.cp, "comm": p.cp_comm_type}


@rule("TT003", reads=(), words=BATCH_READS)
def release_without_the_model(ctx: Context) -> Values:
    """A chunked model (Llama 4) on a release of the framework whose model code has none (the card's
    attention.chunked_releases: torchtitan's llama4 in its 0.1.x and 0.2.x releases only); the fix names the newest
    known release that ships it and the frameworks whose current model code runs its chunks. That release's model
    code refuses cp > 1 (CP007), so at cp > 1 the fix names cp=1 with it and what must follow (fix_values.layout_words:
    'framework_version=0.2.2' at cp=4, a stated batch of 1 on 4 GPUs, took cp=1 from CP007 and left dp 4, BS001)."""
    att, arch = ctx.card.attention, ctx.arch
    if att is None or arch.model_type not in att.chunked_model_types:
        return None
    release = ctx.job.framework_version or ctx.card.version
    if att.ships_chunked(release):
        return None
    shipping = sorted((v for v in ctx.card.known_versions() if att.ships_chunked(v)), key=lambda v: numbers(v) or ())
    others = [f for f in FRAMEWORKS if (a := framework_card(f).attention) is not None
              and a.builds_chunks(arch.model_type) and a.ships_chunked(framework_card(f).version)]
    cp_one = ""
    if ctx.plan.cp > 1:  # the release named refuses cp > 1 (CP007): cp=1 with it, and what must follow
        follows = layout_words(ctx, {"cp": 1})
        cp_one = f" with cp=1, {follows}" if follows else " with cp=1"
    return {"framework": ctx.card.display_name, "release": release, "model": arch.name, "type": arch.model_type,
            "series": either_or([f"{s}.x" for s in att.chunked_releases]), "release_fix": shipping[-1],
            "cp_one": cp_one, "others": either_or(others)}


@rule("TT004", reads=("cp", "zero_stage", "dp"), words=BATCH_READS)
def zero_zero_sharded_over_cp(ctx: Context) -> Values:
    """ZeRO-0 at cp > 1 on a release whose FSDP2 shards over the data-shard x CP ranks whenever cp > 1 (the card's
    engine.torch_cp.shards_over_cp) but whose ZeRO-0 meshplan estimates as DDP's replicated states (not
    memory_states.replicates_by_sharding: torchtitan 0.1 and 0.2.x, the card's engine.replica_shard.ddp_releases):
    the file render writes runs ZeRO-3 over the CP ranks, so the estimate would not be what runs. The fix names the
    ZeRO-3 plan that file is (dp_replicate = dp) and cp=1, where those releases run DDP."""
    p, card = ctx.plan, ctx.card
    ring = card.engine.torch_cp
    version = ctx.job.framework_version
    if (p.cp == 1 or p.zero_stage != 0 or ring is None or not ring.shards_over_cp
            or replicates_by_sharding(card, 0, version)):
        return None
    follows = layout_words(ctx, {"cp": 1})
    return {"cp": p.cp, "dp": p.dp, "replica_count": f"{p.dp} replica{'s' if p.dp > 1 else ''}",
            "framework": card.display_name, "release": version or card.version,
            "sharded": bytes_per_param(convention(card, 3, version)[2], p.cp),
            "replicated": bytes_per_param(convention(card, 0, version)[2], p.cp),
            "replicas": f" with dp_replicate={p.dp}" if p.dp > 1 else "",
            "follows": f" with {follows}" if follows else ""}


@rule("TT001", reads=("etp",))
def torchtitan_no_etp(ctx: Context) -> Values:
    if ctx.plan.etp == 1:
        return None
    return {"etp": ctx.plan.etp}



@rule("DS001", reads=("ep", "etp", "dp"))
def deepspeed_ep_divides_dp(ctx: Context) -> Values:
    """With experts split over the TP group (etp=tp, DS003) the expert groups are carved out of each TP rank's
    data-parallel group; with experts whole (etp=1) they are consecutive ranks of a pipeline stage, where WS002's
    megatron law (ep divides tp*dp) is DeepSpeed's own test."""
    p = ctx.plan
    if p.ep == 1 or p.etp == 1 or p.dp % p.ep == 0:
        return None
    eps = working_ep(ctx, p.dp)
    return {"ep": p.ep, "dp": p.dp, "eps": fmt_set(eps) if eps else "none"}



@rule("DS002", reads=("pp", "zero_stage"), words=("vpp", *BATCH_READS))
def deepspeed_zero_with_pp(ctx: Context) -> Values:
    """DeepSpeed's pipeline engine refuses ZeRO-2/3. The pp=1 alternative names vpp=1 beside it where the plan has
    virtual stages (pp=1 at vpp=2 brought PP003 in) and what must follow its dp (fix_values.layout_words)."""
    p = ctx.plan
    if p.pp == 1 or p.zero_stage < 2:
        return None
    single = {"pp": 1} | ({"vpp": 1} if p.vpp > 1 else {})
    follows = layout_words(ctx, single)
    return {"zero": p.zero_stage, "pp": p.pp,
            "single": ", ".join([f"{name}=1" for name in single] + ([follows] if follows else []))}



@rule("DS003", reads=("tp", "etp"))
def deepspeed_etp(ctx: Context) -> Values:
    p = ctx.plan
    if p.etp in (1, p.tp):
        return None
    return {"etp": p.etp, "tp": p.tp}



@rule("DS004", reads=("tp", "pp", "ep", "zero_stage"))
def deepspeed_moe_zero3(ctx: Context) -> Values:
    """Megatron-DeepSpeed (which meshplan renders for tp, pp or ep over 1) builds a MoE model's expert layers as
    deepspeed.moe.layer.MoE, and DeepSpeed's engine asserts that no such layer runs under ZeRO-3; a plain ds_config
    (tp = pp = ep = 1) trains the user's own model code, which need not use DeepSpeed-MoE."""
    p = ctx.plan
    if not ctx.arch.is_moe or p.zero_stage != 3 or max(p.tp, p.pp, p.ep) == 1:
        return None
    used = ", ".join(f"{name}={value}" for name, value in (("tp", p.tp), ("pp", p.pp), ("ep", p.ep)) if value > 1)
    return {"used": used, "model": ctx.arch.name}



DP_DEGREES = ("tp", "pp", "cp", "ep")  # the degrees whose change moves dp (on some framework's law)
ONE_STAGE_READS = ("pp", "vpp", "first_stage_layers", "last_stage_layers", "pipeline_layout")


def _one_stage(ctx: Context) -> str:
    """pp=1 as a fix names it, with the pipeline settings it clears: 'Set pp=1' on a plan at vpp=2 left the virtual
    stages, which PP003 then refuses (no pipeline at pp=1), and a stage split set beside it; and what follows the dp
    it leaves (fix_values.layout_words): a file's dp_shard=1 kept beside pp=1 no longer tiled the GPUs (WS006)."""
    p = ctx.plan
    dropped = [f"drop {name}" for name in ONE_STAGE_READS[2:] if getattr(p, name) is not None]
    follows = layout_words(ctx, {"pp": 1, "vpp": 1})
    return ("pp=1" + (", vpp=1" if p.vpp > 1 else "") + (f", {follows}" if follows else "")
            + (f" ({', '.join(dropped)})" if dropped else ""))


@rule("KF001", reads=ONE_STAGE_READS, words=BATCH_READS)
def kempnerforge_moe_pp(ctx: Context) -> Values:
    if not ctx.arch.is_moe or ctx.plan.pp == 1:
        return None
    return {"pp": ctx.plan.pp, "one_stage": _one_stage(ctx)}



@rule("KF002", reads=ONE_STAGE_READS, words=BATCH_READS)
def kempnerforge_tied_pp(ctx: Context) -> Values:
    if not ctx.arch.tie_word_embeddings or ctx.plan.pp == 1:
        return None
    return {"pp": ctx.plan.pp, "one_stage": _one_stage(ctx)}



@rule("KF003", reads=("tp",))
def kempnerforge_fp8_tp(ctx: Context) -> Values:
    if ctx.job.precision != "fp8" or ctx.plan.tp == 1:
        return None
    return {"tp": ctx.plan.tp}



@rule("KF004", reads=("etp",))
def kempnerforge_no_etp(ctx: Context) -> Values:
    if ctx.plan.etp == 1:
        return None
    return {"etp": ctx.plan.etp}



@rule("SK002", reads=("cp",))
def skyrl_cp_padding(ctx: Context) -> Values:
    if ctx.plan.cp == 1:
        return None
    return {"cp": ctx.plan.cp}



@rule("VL002", reads=("cp",))
def verl_ulysses_padding(ctx: Context) -> Values:
    """The switch in the key of the trainer that runs the job: a training job on the FSDP engine is the SFT trainer's
    (model.use_remove_padding, what render writes there), an RL job main_ppo's actor_rollout_ref.model."""
    if ctx.plan.cp == 1:
        return None
    trainer = "actor_rollout_ref." if ctx.job.rl is not None else ""
    return {"u": ctx.plan.cp, "key": f"{trainer}model.use_remove_padding"}


@rule("AM001", reads=("tp", "pp", "cp", "dp"), words=BATCH_READS)
def automodel_mesh_product(ctx: Context) -> Values:
    """_create_fsdp2_device_mesh: the mesh (pp, dp_replicate, dp_shard, cp, tp) covers the world, as torchtitan's;
    dp_size left out (null) is derived (_infer_dp_size)."""
    return mesh_product(ctx, "dp_size: null")



@rule("AM002", reads=("tp", "cp", "dp", "ep"))
def automodel_ep_divides(ctx: Context) -> Values:
    """_create_fsdp2_device_mesh: non_pp_size = dp_size*cp*tp must be a multiple of ep (the EP mesh reshapes those
    ranks; dp_size is the whole data-parallel degree, dp_replicate_size's replicas included, at any ZeRO stage)."""
    return ep_borrows(ctx, ctx.plan.dp)



@rule("AM003", reads=("pp", "dp", "micro_batch_size", "pipeline_microbatches", "global_batch_size"))
def automodel_pipeline_microbatches(ctx: Context) -> Values:
    """train_ft.py: local_batch_size // pp_microbatch_size >= pp_size, for every schedule: the micro-batches of one
    run of the schedule (Context.microbatches, over Plan.pipeline_microbatches' runs per step)."""
    if ctx.plan.pp == 1 or ctx.microbatches >= ctx.plan.pp:
        return None
    return fewer_microbatches_than_stages(ctx)



@rule("AM004", reads=("tp", "pp", "cp", "ep", "zero_stage"))
def automodel_ddp_alone(ctx: Context) -> Values:
    """_create_device_meshes: DDPConfig requires tp, pp, cp and ep of 1."""
    p = ctx.plan
    used = [f"{name}={value}" for name, value in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep))
            if value > 1]
    if p.zero_stage != 0 or not used:
        return None
    return {"used": ", ".join(used), "unset": ", ".join(u.split("=")[0] + "=1" for u in used)}



@rule("AM005", reads=("ep", "moe_token_dispatcher"))
def automodel_torch_dispatcher(ctx: Context) -> Values:
    """GroupedExperts.forward: the torch dispatcher gathers the EP group's tokens and all-reduces the output."""
    p = ctx.plan
    if not ctx.arch.is_moe or p.ep == 1 or p.moe_token_dispatcher == "flex":
        return None
    return {"ep": p.ep, "gathered": p.ep}



@rule("NT001", reads=("cp", "ep", "etp"), words=BATCH_READS)
def nanotron_degree_not_modelled(ctx: Context) -> Values:
    """cp, ep or etp over 1 where the card's cannot_run (a card without an adapter: nanotron's) says the framework
    cannot run it: the first, in that order. Its degree of 1 can move dp: what must follow is named beside it
    (fix_values.layout_words; 'use cp=1' at cp=4 and a stated batch of 64 on 256 GPUs left dp 256, BS001)."""
    cannot_run = ctx.card.cannot_run
    for name in ("cp", "ep", "etp"):
        value = getattr(ctx.plan, name)
        instead = cannot_run.get(name) if value > 1 else None
        if instead is not None:
            follows = layout_words(ctx, {name: 1})
            return {"setting": f"{name}={value}", "framework": ctx.card.display_name,
                    "instead": instead, "follows": f" With {name}=1: {follows}." if follows else ""}
    return None



def _layout_knobs_used(values: dict, job: Job) -> tuple:
    """AD001's screen: whether a layout knob or a split knob is one the adapter cannot write is decided by the knobs
    the plan uses (its ZeRO stage, which degrees are over 1, whether a split is given: adapter_knobs.knobs_in_use),
    its schedule and attention backend (the values a knob's key takes), and the variant `render` writes, which those
    decide (DEFAULT_VARIANTS); the degrees themselves only word the finding."""
    v = values
    return (v["zero_stage"], v["tp"] > 1, v["pp"] > 1, v["vpp"] > 1, v["cp"] > 1, v["ep"] > 1, v["etp"] > 1,
            v["dp_replicate"] > 1, v["pipeline_schedule"], v["attention_backend"],
            v["first_stage_layers"] is not None or v["last_stage_layers"] is not None,
            v["pipeline_layout"] is not None, v["account_for_embedding"] not in (None, False),
            v["account_for_loss"] not in (None, False))


AD001_READS = ("tp", "pp", "vpp", "cp", "ep", "etp", "zero_stage", "dp_replicate", "pipeline_schedule",
               "attention_backend", "first_stage_layers", "last_stage_layers", "pipeline_layout",
               "account_for_embedding", "account_for_loss")
# AD001's ZeRO-stage fix per job and the plan's AD001_READS: the search's refusal once asked the rule itself on every
# plan of a space (now per screen, rules/engine.Verdicts.fires), and the fix tries each stage twice; 170,288 plans of
# one job on 1 GPU (Qwen3-30B-A3B, verl, zero_stage=2) took 35 CPU-s in it, where a handful of distinct reads decide it
_ZERO_INSTEAD: IdentityMemo[str] = IdentityMemo(limit=1 << 16)


@rule("AD001", reads=AD001_READS, screen=_layout_knobs_used, words=BATCH_READS)
def adapter_cannot_write(ctx: Context) -> Values:
    """A layout knob (degree or ZeRO stage) `render` would refuse: the same card function, on the version and variant
    it writes by default; and a pipeline split given to a framework that partitions the layers itself (SPLIT_KNOBS),
    which would run its own split instead."""
    found = _adapter_refusal(ctx.job, ctx.plan)
    if found is None:
        return None
    (version, variant), missing = found
    instead = missing.instead
    if missing.knob.startswith("zero_"):
        reads = tuple(getattr(ctx.plan, name) for name in AD001_READS)
        instead = _ZERO_INSTEAD.get((ctx.job,), (reads, missing.instead),
                                    lambda: _zero_stage_instead(ctx, missing.instead))
    elif missing.knob in DP_DEGREES and f"{missing.knob}=1" in instead:  # the card's 'use cp=1': dp grows with it
        follows = layout_words(ctx, {missing.knob: 1})
        at = f"{missing.knob}=1"  # beside the degree, before any other alternative the card's words name after it
        instead = instead.replace(at, f"{at} with {follows}", 1) if follows else instead
    return {"setting": missing.setting, "display": ctx.card.display_name, "version": version,
            "variant": variant, "reason": missing.reason, "instead": instead, "knob": missing.knob}


def _adapter_refusal(job: Job, plan: Plan) -> tuple[tuple[str, str], MissingKnob] | None:
    """The render target (version, variant) and the first layout or split knob of the plan its config cannot write,
    or None where it writes them all (or the framework has no adapter)."""
    card = job.card
    target = default_render(card, job, plan)
    if target is None:
        return None
    version, variant = target
    missing = missing_layout_knob(card, version, variant, job, plan)
    if missing is None and card.pipeline.partition != "told":
        missing = missing_knob(card, version, variant, job, plan, SPLIT_KNOBS)
    return None if missing is None else (target, missing)


def _zero_stage_instead(ctx: Context, card_instead: str) -> str:
    """AD001's fix for a ZeRO stage the config cannot write: the card's words where every stage its config writes
    for a plain layout also writes this plan's degrees; else only the stages that write them (SkyRL's sft-fsdp
    variant at zero_stage 3 has no tp: naming it would send a tp=2 plan from AD001 to AD001 and FS001). A function
    of the job and AD001_READS alone (each stage's _adapter_refusal reads no other field: the rule's verdict, which
    tests/test_rule_verdicts.py holds to its reads), so kept per them."""
    plain = ctx.plan.model_copy(update=dict.fromkeys(LAYOUT_DEGREES, 1))
    writes = [z for z in ZERO_STAGES
              if _adapter_refusal(ctx.job, ctx.plan.model_copy(update={"zero_stage": z})) is None]
    plainly = [z for z in ZERO_STAGES if _adapter_refusal(ctx.job, plain.model_copy(update={"zero_stage": z})) is None]
    if writes == plainly:
        return card_instead
    used = ", ".join(f"{k}={getattr(ctx.plan, k)}" for k in LAYOUT_DEGREES if getattr(ctx.plan, k) > 1)
    if not writes:
        return f"No ZeRO stage of {ctx.card.display_name}'s config writes {used}; set them to 1."
    left_out = either_or([z for z in plainly if z not in writes])
    return (f"Use zero_stage={either_or(writes)}: {ctx.card.display_name}'s config at zero_stage {left_out} "
            f"cannot write {used}.")

