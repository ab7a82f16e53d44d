set -xeuo pipefail
MODEL_PATH=${MODEL_PATH:-"Qwen/Qwen2.5-7B"}
max_prompt_length=2048
max_response_length=4096
train_batch_size=128
ppo_mini_batch_size=32
adv_estimator=rloo                        # RLOO advantage estimator

python3 -m verl.trainer.main_ppo \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    data.train_batch_size=${train_batch_size} \
    algorithm.adv_estimator=${adv_estimator} \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.actor.ppo_mini_batch_size=${ppo_mini_batch_size} \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=vllm \
    trainer.logger='["console","wandb"]' \
    trainer.total_epochs=10
