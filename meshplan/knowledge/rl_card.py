"""The `rl` section of a framework card (cards/frameworks/<name>.yaml): what an RL post-training framework (verl,
SkyRL) does when a request leaves an RL field out, the rollout engines it runs and what their memory fraction means,
and the facts its rollout rules test. Below the rules (RL001-RL004 read it) and the RL arithmetic (meshplan/rl/);
cards.py holds it (FrameworkCard.rl, read by rl_card).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshplan.knowledge.offload_card import StateClass
from meshplan.schema.choices import Engine, Placement, RLAlgorithm, RolloutEngine


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RLDefaults(_Card):
    """What the framework does when the request leaves an RL field out (its own config defaults)."""

    algorithm: RLAlgorithm
    samples_per_prompt: int = Field(ge=1)
    prompts_per_step: int = Field(ge=1)
    prompt_length: int = Field(ge=1)
    response_length: int = Field(ge=1)
    engine: RolloutEngine
    rollout_tp: int = Field(ge=1)
    rollout_dp: int = Field(ge=1)
    rollout_ep: int = Field(ge=1)
    memory_fraction: float = Field(gt=0, le=1)
    placement: Placement
    max_num_seqs: int = Field(ge=1, description="The engine's cap on sequences decoded at once")
    max_num_batched_tokens: int = Field(ge=1, description="The engine's cap on tokens per forward (its profile run)")
    entropy_coeff: float = Field(0.0, ge=0, description="The policy loss' entropy coefficient (0: no entropy term)")
    source: str


class SWAPool(_Card):
    """An engine that sizes its KV cache as two pools (SGLang's HybridSWAPoolConfigurator): full layers take
    full_tokens slots, windowed layers full_tokens_ratio x as many; a running sequence frees the windowed slots the
    window has passed every eviction_interval_windows x window decode steps."""

    model_types: list[str] = Field(description="The model types (config.json model_type) the engine gives the split "
                                               "pool; the others keep every token in one pool")
    full_tokens_ratio: float = Field(gt=0, le=1, description="Windowed slots per full slot (swa_full_tokens_ratio)")
    eviction_interval_windows: float = Field(
        gt=0, description="Decode steps between a sequence's windowed-slot evictions, in windows "
                          "(SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER): it holds at most window x (1 + this)")
    source: str


class RolloutEngineFacts(_Card):
    """One rollout engine as the framework runs it."""

    memory_fraction_of: Literal["total", "free"] = Field(
        description="total: the fraction is a share of the GPU's total memory (vLLM gpu_memory_utilization); free: a "
                    "share of the memory free when the engine starts (SGLang mem_fraction_static)"
    )
    multi_node_tp: bool = Field(description="Whether the engine runs a tensor-parallel group across nodes")
    ep_needs_experts: bool = Field(
        False, description="Rollout EP > 1 on a model without experts is refused when the engine starts (the "
                           "framework turns the engine's expert parallelism on, and the engine checks the model)")
    ep_needs_experts_source: str = ""
    windowed_kv: Literal["window", "every_token"] = Field(
        "every_token", description="What a sliding-window layer's KV cache holds per sequence: window, the last "
                                   "window tokens (the engine frees the blocks the window has passed); every_token, "
                                   "every token as a full layer (the engine's one pool, where swa_pool leaves the "
                                   "model type out)")
    windowed_kv_source: str = ""
    swa_pool: SWAPool | None = Field(
        None, description="The engine's split pool for the model types it names (SGLang's hybrid SWA memory pool); "
                          "None: windowed_kv alone")
    why: str


class FrameworkOffload(_Card):
    """What a framework's own offload around the rollout does with the actor's states on one engine."""

    moves: list[StateClass] = Field(description="Classes it copies to the host")
    frees: list[StateClass] = Field(default_factory=list, description="Classes it releases, no host copy")


class StepPhase(_Card):
    """One phase of the trainer's RL step: the model it runs and what it does with it."""

    model: Literal["actor", "reference", "critic", "rollout"] = Field(
        description="The model the phase runs (rollout: the colocated engine, which takes the GPUs from the trainer's "
                    "models and moves no trainer state itself)")
    runs: Literal["generate", "sync", "forward", "update"] = Field(
        description="generate (the engine's), sync (the actor's weights exported to the engine), forward (a log-prob "
                    "or value pass: the weights), update (the weights and the states only an update needs: "
                    "gradients, optimizer)")
    placement: Placement | None = Field(None, description="The one rollout placement the phase runs at; None: both")


class RLCard(_Card):
    """The `rl` section of a framework card."""

    defaults: RLDefaults
    engines: dict[RolloutEngine, RolloutEngineFacts]
    ep_equals_tp_dp: bool = Field(description="Rollout EP > 1 must equal rollout TP x DP")
    rollout_pp: bool = Field(description="Whether the engine may be pipeline-parallel (meshplan plans PP 1)")
    colocated_gpus_equal_training: bool = Field(description="Colocated engines must span exactly the trainer's GPUs")
    colocated_offload: bool = Field(
        description="With colocated engines the framework itself moves every trainer model (policy, reference, critic:"
                    " weights, gradients, optimizer) to the host between phases, whatever the offload knobs say"
    )
    separate_offload: bool = Field(
        False, description="Where the rollout is placed apart, the framework still keeps the policy and the "
                           "reference model on the same GPUs and offloads the one not running, as colocated_offload "
                           "does (SkyRL's placement.colocate_policy_ref, on by default)")
    separate_offload_source: str = ""
    separate_overlaps: bool = Field(
        description="Where the rollout is placed apart, whether the trainer the framework runs for it generates the "
                    "next batch while it trains on this one (verl's one-step-off recipe), so the RL step is the "
                    "longer of the two sides; false: its loop generates, then trains, then syncs the weights, and "
                    "the parts add as colocated ones do")
    separate_overlaps_source: str
    colocated_offload_states: dict[Engine, FrameworkOffload] = Field(
        default_factory=dict, description="Per trainer engine, what that offload does with the actor's states (the "
                                          "offload knobs' classes come on top); needed where colocated_offload is on")
    colocated_offload_source: str
    reference_model: dict[RLAlgorithm, bool] = Field(description="Whether the algorithm keeps a reference model")
    critic: dict[RLAlgorithm, bool] = Field(description="Whether the algorithm trains a critic")
    reference_on_host: dict[Engine, Literal["always", "param_offload"]] = Field(
        description="Where the trainer engine keeps the reference model's weights between its passes: always on the "
                    "host (verl's FSDP workers build it with CPU offload), or on the host only with the actor's "
                    "param_offload (and with colocated_offload); on the GPU otherwise. Either way it is built like "
                    "the actor, so its weights are sharded as the actor's are (FSDP: over the FSDP group)"
    )
    reference_pass_weights: dict[Engine, Literal["whole", "per_unit"]] = Field(
        description="How the reference model's weights that are on the host between its passes are on the GPU during "
                    "its own log-prob pass: whole (its shard is loaded back before the pass: the param_offload knobs, "
                    "SkyRL's backload_to_gpu), or per_unit (FSDP CPU offload: each FSDP unit's shard is copied to the "
                    "GPU at its all-gather and freed at its reshard, so the pass holds only the gathered units)"
    )
    reference_pass_source: str
    critic_apart_when_separate: bool = Field(
        description="Where the rollout is placed apart, PPO's critic runs on GPUs of its own (as many as the "
                    "policy's: meshplan renders it with the policy's count and layout), not beside the actor; the "
                    "job's GPUs are then the policy's, the critic's and the rollout's"
    )
    critic_placement_source: str
    critic_engines: list[Engine] = Field(
        description="The trainer engines on which the framework trains PPO's critic (an algorithm with a critic on "
                    "another engine is refused, and a zero_stage left out takes the lowest one on these)")
    critic_engines_source: str
    gradients_freed_after_update: dict[Engine, bool] = Field(
        description="Whether the trainer engine frees the actor's gradients after its update (optimizer.zero_grad, "
                    "set_to_none), so that between phases they are neither on the GPU nor on the host"
    )
    trainer_memory_source: str
    packed_micro_batches: bool = Field(
        False, description="The update's micro-batches are packed to the token budget by a balanced partition with "
                           "no cap, so the largest exceeds it, the count the MAX over the DP ranks rounded up to "
                           "the virtual-pipeline group where vpp > 1 (rl/packing.py): verl's use_dynamic_bsz")
    packed_micro_batches_source: str = ""
    balanced_step_batch: bool = Field(
        False, description="The trainer partitions the step's sequences over the data-parallel ranks in equal counts "
                           "balanced by tokens and each rank splits its share into mini-batches in rollout order, "
                           "each ending in an optimizer step every rank joins: a mini-batch lasts as long as its "
                           "slowest rank's tokens (rl/stragglers.py; verl's trainer.balance_batch). False: no "
                           "straggler is timed")
    balanced_step_batch_source: str = ""
    in_order_rank_chunks: bool = Field(
        False, description="The trainer cuts each mini-batch into equal data-parallel chunks of consecutive sequences "
                           "in rollout order, balancing nothing, each mini-batch ending in an optimizer step every "
                           "rank joins; the old policy's and the critic's log-prob passes run the same chunks a "
                           "mini-batch at a time and the reference's the whole step's in dp chunks, each waited for "
                           "whole: every one lasts as long as its slowest rank's tokens (rl/stragglers.py in_order; "
                           "SkyRL's MeshDispatch). False: see balanced_step_batch")
    in_order_rank_chunks_source: str = ""
    micro_batch_sync: dict[Engine, Literal["data_parallel", "expert_parallel"]] = Field(
        default_factory=dict, description="Per trainer engine, which data-parallel ranks meet at every micro-batch, "
                                          "not only at the mini-batch's optimizer step: data_parallel (FSDP's "
                                          "per-layer all-gathers and gradient reduce-scatters span them all), "
                                          "expert_parallel (Megatron-Core's MoE token all-to-all spans an expert-"
                                          "parallel group's; a dense model's ranks meet only at the gradient "
                                          "reduction). Each micro-batch then waits for its slowest rank there "
                                          "(rl/stragglers.py micro_batch_max); an engine left out: none")
    micro_batch_sync_source: str = ""
    step_phases: list[StepPhase] = Field(
        default_factory=list, description="The trainer's phases of one RL step in the order its loop runs them, each "
                                          "the model it runs (what moves its phase-offloaded states to the GPU, "
                                          "rl/memory.state_loads); left empty: each model's states move once")
    phase_offload: Literal["around", "swap"] = Field(
        "around", description="How the trainer moves a model's phase-offloaded states: around, loaded before each "
                              "phase that runs the model and offloaded after it (verl's param_offload / "
                              "optimizer_offload); swap, left on the GPU until another model sharing the GPUs runs "
                              "(SkyRL's WorkerDispatch _ensure_on_gpu), so a model's consecutive phases load it once")
    step_phases_source: str = ""
    logged_mfu_flops: Literal["model", "flops_counter"] = Field(
        "model", description="Whose FLOP count the trainer's logged actor MFU divides by the update's seconds: model "
                             "(meshplan's own, Megatron-LM's formula) or flops_counter (verl's utils/flops_counter.py: "
                             "arithmetic/flops.verl_flops), a log's MFU compared with the prediction as it counts")
    logged_mfu_flops_source: str = ""
    rules_source: str

    def trained_models(self, algorithm: RLAlgorithm) -> int:
        """The models an RL step's update trains, one after the other: the actor, and the critic where the algorithm
        has one (PPO): the update's time is that many actor updates."""
        return 2 if self.critic[algorithm] else 1

    def critic_on_own_gpus(self, algorithm: RLAlgorithm, placement: Placement) -> bool:
        """Whether PPO's critic runs on GPUs of its own, as many as the policy's (critic_apart_when_separate, with
        the rollout placed apart), not beside the actor: what the job's pools and every figure of the step read."""
        return self.critic[algorithm] and self.critic_apart_when_separate and placement == "separate"
