#!/usr/bin/env bash
# verl's example scripts (tests/fixtures/verl/*.sh, unchanged copies) run on
# baton with only the model path, the data paths and sizes changed: the
# script's `python3 -m verl.trainer.main_ppo` is baton's main_ppo, and the
# changes are appended as overrides (the scripts end with `$@` for that). The
# toy task stands in for GSM8K and Qwen; trainer.device=cpu is this machine.
# Each run must finish its steps, log the fate of the verl keys baton does not
# have, and write what its loggers promise (wandb's offline run when the
# script asks for wandb). PYTHON (baton's venv) comes first on PATH, as a verl
# user's environment has wandb on it.
#
#   tests/examples/verl_scripts.sh MAIN_PPO_EXE TOY_TASK_EXE SOURCE_DIR SCRIPT [PYTHON]
set -euo pipefail
main_ppo=$1 toy_task=$2 source_dir=$3 script=$4
if [[ -n "${5:-}" ]]; then PATH=$(dirname "$5"):$PATH; fi
work=$(mktemp -d /tmp/baton_verl_script.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$toy_task" --out "$work/toy" --val-size 8 >"$work/toy.log" 2>&1
t=$work/toy

# The sizes of a 7B run on 8 GPUs, scaled to the toy model on 2 CPU workers.
sizes=(data.train_batch_size=8 data.max_prompt_length=8 data.max_response_length=10
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.rollout.n=4
  trainer.n_gpus_per_node=2 trainer.total_training_steps=2 trainer.test_freq=2
  trainer.save_freq=2)
case "$(basename "$script")" in
  run_qwen2-7b_math_megatron.sh)
    sizes+=(actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1
      actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1
      actor_rollout_ref.rollout.tensor_model_parallel_size=1) ;;
  run_qwen2_5-3b_gsm8k_grpo_lora.sh)
    sizes+=(actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
      actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
      actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4) ;;
esac
# The script names two data sets in the megatron case: both are the toy task's.
paths=(actor_rollout_ref.model.path="$t/model"
  "data.train_files=['$t/data/train.jsonl']" "data.val_files=['$t/data/val.jsonl']"
  trainer.default_local_dir="$work/out")

python3() {
  if [[ "${1:-}" == -m && "${2:-}" == verl.trainer.main_ppo ]]; then
    shift 2
    "$BATON_MAIN_PPO" "$@"
  else
    command python3 "$@"
  fi
}
export -f python3
export BATON_MAIN_PPO=$main_ppo HOME=$work WANDB_MODE=offline WANDB_DIR=$work/wandb
mkdir -p "$work/wandb"
cd "$source_dir"
status=0
bash "$script" "${paths[@]}" "${sizes[@]}" trainer.device=cpu >"$work/run.log" 2>&1 || status=$?
fail() { echo "verl_scripts: $(basename "$script"): $1" >&2; tail -n 60 "$work/run.log" >&2; exit 1; }
[[ $status == 0 ]] || fail "exited with $status"
grep -q "^steps: 2$" "$work/run.log" || fail "did not train 2 steps"
grep -q "actor_rollout_ref.rollout.name=[a-z]*: ignored: baton's own engine generates" \
  "$work/run.log" || fail "no line on rollout.name"
[[ -f "$work/out/actor_hf/config.json" ]] || fail "no trained model in $work/out/actor_hf"
if grep -q wandb "$script"; then
  ls "$work"/wandb/wandb/offline-run-*/run-*.wandb >/dev/null 2>&1 || fail "no wandb offline run"
fi
echo "verl_scripts: $(basename "$script"): 2 steps, keys' fates logged"
