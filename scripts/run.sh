#!/usr/bin/env bash
# Quick start, part one: set up, build, and run the main job — the toy task
# end to end: make the data and a tiny model, SFT it into a base with partial
# accuracy (cached after the first run), then GRPO on 2 worker processes,
# printing a table per step and, at the end, the base's and the trained
# model's greedy validation accuracy and the plot of the curves.
#   BATON_TOY_DIR   where the task lives (default toy/, the configs' paths)
#   extra arguments go to the GRPO driver as overrides (key=value)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_TARGETS="toy_task sft grpo" bash scripts/build.sh
toy="${BATON_TOY_DIR:-toy}"
if [[ ! -f "$toy/model/config.json" ]]; then
  ./build/examples/toy_task --out "$toy"
fi
if [[ ! -f "$toy/sft/eval.json" ]]; then
  ./build/examples/sft --config configs/sft_toy.yaml \
    "data.train_files=[$toy/data/sft.jsonl]" "data.val_files=[$toy/data/val.jsonl]" \
    "model.path=$toy/model" "trainer.default_local_dir=$toy/sft"
else
  echo "run: SFT base cached in $toy/sft (delete it to train it again)"
fi
rm -rf "$toy/grpo"
./build/examples/grpo --config configs/grpo_toy.yaml \
  "data.train_files=[$toy/data/train.jsonl]" "data.val_files=[$toy/data/val.jsonl]" \
  "actor_rollout_ref.model.path=$toy/sft/model" "trainer.default_local_dir=$toy/grpo" "$@"
