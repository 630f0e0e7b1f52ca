#!/usr/bin/env bash
# kill -9 the GRPO trainer (driver and workers) KILLS times, each time 0-9
# ms after it starts writing a checkpoint (it saves every step), and
# start it again (trainer.resume_mode=auto): after every kill the latest
# checkpoint is complete, every start resumes from it (its log says so), no
# process outlives a kill, and the last start finishes the run with every
# step logged once (issue 26, "training that survives faults").
#
#   tests/examples/kill_during_save.sh GRPO_EXE TOY_TASK_EXE CONFIG [KILLS]
#
# That a resumed step equals the uninterrupted run's is
# PpoTrainerTest.AResumedRunTakesTheSameNextStepAsAnUninterruptedOne's (and
# the max_restarts test's); over dozens of restarts, kernels that MKL picks
# anew in each process make the runs' last bits drift apart, so the tokens
# sampled many steps later are not compared here.
set -euo pipefail
grpo=$1 toy_task=$2 config=$3 kills=${4:-50}
for tool in pgrep setsid; do
  command -v "$tool" >/dev/null || { echo "kill_during_save: needs $tool (scripts/setup.sh)" >&2; exit 1; }
done
steps=$((kills + 10))
work=$(mktemp -d /tmp/baton_kill_save.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$toy_task" --out "$work/toy" --val-size 16 >/dev/null 2>&1
run_args=(--config "$config"
  "data.train_files=[$work/toy/data/train.jsonl]" "data.val_files=[$work/toy/data/val.jsonl]"
  "actor_rollout_ref.model.path=$work/toy/model" "trainer.logger=[file]"
  trainer.test_freq=-1 trainer.val_before_train=false trainer.save_freq=1
  "trainer.total_training_steps=$steps")

out="$work/killed"
torn=0
latest="$out/latest_checkpointed_iteration.txt"
for ((i = 1; i <= kills; i++)); do
  before=$(cat "$latest" 2>/dev/null || echo 0)
  log="$work/run_$i.log"
  touch "$work/started"
  sleep 0.01
  setsid "$grpo" "${run_args[@]}" "trainer.default_local_dir=$out" >"$log" 2>&1 &
  pid=$!
  # Until this run writes into the next checkpoint (an earlier run's torn
  # directory of that step may be there already: files newer than the
  # start count), or ends; then 0-9 ms more.
  next="$out/global_step_$((before + 1))"
  for ((t = 0; t < 3000; t++)); do
    [[ -d $next && -n $(find "$next" -newer "$work/started" -print -quit) ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  sleep "0.00$((RANDOM % 10))"
  kill -9 -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for ((t = 0; t < 50; t++)); do
    pgrep -g "$pid" >/dev/null || break
    sleep 0.1
  done
  if pgrep -g "$pid" >/dev/null; then
    echo "kill_during_save: processes of run $i outlived the kill" >&2
    exit 1
  fi
  if ((before > 0)) && ! grep -q "resumed from $out/global_step_$before (step $before)" "$log"; then
    echo "kill_during_save: run $i did not resume from global_step_$before:" >&2
    tail -5 "$log" >&2
    exit 1
  fi
  [[ -f $latest ]] || continue
  n=$(cat "$latest")
  for f in "global_step_$n/trainer_state.json" "global_step_$n/actor"; do
    if [[ ! -e "$out/$f" ]]; then
      echo "kill_during_save: after kill $i, latest names step $n but $f is missing" >&2
      exit 1
    fi
  done
  # A checkpoint newer than latest is one the kill interrupted.
  [[ -d "$out/global_step_$((n + 1))" ]] && torn=$((torn + 1))
done
echo "kill_during_save: $kills kills, $torn of them during a save, latest step $(cat "$latest" 2>/dev/null || echo none)"

last=$(cat "$latest" 2>/dev/null || echo 0)
"$grpo" "${run_args[@]}" "trainer.default_local_dir=$out" >"$work/final.log" 2>&1 || {
  echo "kill_during_save: the resumed run failed:" >&2
  tail -20 "$work/final.log" >&2
  exit 1
}

((last == 0)) || grep -q "resumed from $out/global_step_$last (step $last)" "$work/final.log" || {
  echo "kill_during_save: the last run did not resume from the latest checkpoint" >&2
  exit 1
}
python3 - "$out/metrics.jsonl" "$steps" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["step"] for r in rows if "critic/score/mean" in r]
want = list(range(1, int(sys.argv[2]) + 1))
assert steps == want, f"metrics.jsonl training steps {steps}, want each of 1..{want[-1]} once"
print(f"kill_during_save: the last run finished; steps 1..{want[-1]} logged once each")
EOF
