"""RL post-training jobs (verl, SkyRL): the rollout engine, the phases of an RL step, their memory and time."""
