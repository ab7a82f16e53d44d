"""The framework card's `allocator` section: how each of the framework's launchers sets PyTorch's caching allocator
(Plan.expandable_segments when the request leaves it out). Apart from cards.py, which holds the card.

One fact per launcher, because a framework's launchers differ: verl's RL workers turn expandable segments on for the
training phases, while its SFT trainer (verl.trainer.sft_trainer, what a training job renders) leaves PyTorch's
default, so a verl SFT job's reserved memory is estimated on the allocator it really runs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AllocatorSetting(_Card):
    """How one launcher sets the allocator, and where a rendered config says so."""

    expandable_segments: bool = Field(description="Whether the launcher or the workers it starts enable it")
    how: str = Field(description="Where the framework takes it, as the rendered config's note says it (an env "
                                 "line, a config key, or set by the framework itself)")
    source: str
    launch_script: str | None = Field(
        None, description="The framework's own launch script that sets it in the environment of the torchrun it "
                          "runs (torchtitan's run_train.sh), not the framework's code: a launch command of the "
                          "user's own that starts the trainer itself runs PyTorch's default (no expandable "
                          "segments) unless its own environment sets it; absent: the framework's code or config "
                          "sets it, whatever command starts it")
    over_env: str | None = Field(
        None, description="Where the framework's own code sets the allocator at run time after start-up "
                          "(torch.cuda.memory._set_allocator_settings), so a PYTORCH_CUDA_ALLOC_CONF the launch "
                          "script exports does not decide the phases meshplan estimates: what it does, with its "
                          "source; absent: the script's environment decides")


class AllocatorFacts(AllocatorSetting):
    """The framework's launcher's setting, for every job unless `training_job` names another for a training job."""

    training_job: AllocatorSetting | None = Field(
        None, description="The setting of the launcher a training job (sft, LoRA) runs, where the framework's SFT "
                          "trainer differs from its RL launcher (verl); absent: the same as the RL launcher's")

    def for_job(self, rl: bool) -> AllocatorSetting:
        """The setting of the launcher that runs an RL job (`rl`) or a training job."""
        return self if rl or self.training_job is None else self.training_job


ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""PyTorch's caching-allocator settings in the environment, under either of its names (c10/cuda/CUDAAllocatorConfig.h
instance(): 2.8 reads PYTORCH_ALLOC_CONF first, later releases PYTORCH_CUDA_ALLOC_CONF first, so a launch script that
sets both to different expandable_segments is ambiguous)."""

ALLOC_OPTIONS: dict[str, str] = {
    "backend": "native or cudaMallocAsync (meshplan estimates the native caching allocator; cudaMallocAsync has no "
               "expandable segments and its own reserve)",
    "max_split_size_mb": "blocks above it are never split (less fragmentation, more cudaMalloc calls)",
    "max_non_split_rounding_mb": "how far a large request may be rounded up to reuse an unsplit block",
    "roundup_power2_divisions": "request sizes rounded to power-of-two divisions",
    "garbage_collection_threshold": "cached blocks reclaimed above that share of the memory",
    "release_lock_on_cudamalloc": "the allocator's lock released around cudaMalloc",
    "pinned_use_cuda_host_register": "pinned host memory by cudaHostRegister",
    "pinned_num_register_threads": "threads that register pinned host memory",
    "pinned_use_background_threads": "pinned host memory allocated on background threads",
    "graph_capture_record_stream_reuse": "CUDA-graph capture's block reuse",
    "per_process_memory_fraction": "a cap on the memory the process may allocate",
}
"""The options PyTorch's caching allocator takes beside expandable_segments (pytorch/pytorch c10/cuda/
CUDAAllocatorConfig.cpp parseArgs and c10/core/AllocatorConfig.cpp): what each changes; meshplan models none of
them (the reserve each leaves is not estimated), so an import names them rather than ignoring them."""
