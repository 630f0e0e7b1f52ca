#!/usr/bin/env bash
# The GRPO driver on the toy task under a connection flood, in a network
# namespace of its own (its loopback holds nothing else): every port the driver
# listens on gets 200 connections that never send a byte as soon as it opens,
# from 8 source addresses, while the driver runs with `ulimit -n 256`. The run
# must train to its last step; the driver's CPU must stay near idle (a listener
# spinning on EMFILE costs a core); its log must show the refusals rate-limited.
# Needs root (ip netns); exits 77 (skipped) without it.
#   connection_flood.sh GRPO TOY_TASK CONFIG
set -euo pipefail
grpo="$1" toy_task="$2" config="$3"
here="$(cd "$(dirname "$0")" && pwd)"
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! ip netns add "bf$$" 2>/dev/null; then
  echo "connection_flood: skipped (needs root and ip netns)"
  exit 77
fi
tmp="$(mktemp -d /tmp/baton-flood.XXXXXX)"
cleanup() {
  set +e
  for p in $(ip netns pids "bf$$" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  ip netns del "bf$$" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ip -n "bf$$" link set lo up

"$toy_task" --out "$tmp/toy" >/dev/null
ip netns exec "bf$$" bash -c 'ulimit -n 256; exec "$@"' grpo "$grpo" --config "$config" \
  "data.train_files=[$tmp/toy/data/train.jsonl]" "data.val_files=[$tmp/toy/data/val.jsonl]" \
  "actor_rollout_ref.model.path=$tmp/toy/model" data.train_batch_size=8 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.rollout.n=2 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  trainer.val_before_train=false trainer.test_freq=-1 'trainer.logger=[file]' \
  trainer.total_training_steps=2 "trainer.default_local_dir=$tmp/run" >"$tmp/run.log" 2>&1 &
driver=$!
ip netns exec "bf$$" python3 "$here/connection_flood.py" "$driver" 200 >"$tmp/flood.json" &
flood=$!
status=0
wait "$driver" || status=$?
wait "$flood" || true
echo "connection_flood: $(cat "$tmp/flood.json")"
if ((status != 0)); then
  echo "connection_flood: FAILED: the run under the flood exited $status" >&2
  tail -30 "$tmp/run.log" >&2
  exit 1
fi
steps=$(grep -c . "$tmp/run/metrics.jsonl" || true)
if ((steps != 2)); then
  echo "connection_flood: FAILED: $steps steps in metrics.jsonl, not 2" >&2
  exit 1
fi
python3 - "$tmp/flood.json" <<'PY' || { tail -20 "$tmp/run.log" >&2; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
flooded = [n for n in r["ports"].values() if n > 0]
if not flooded:
    sys.exit("connection_flood: FAILED: no port of the driver was flooded")
# The driver waits on its workers most of the run; a listener spinning on
# accept() would hold a core for as long as the flood lasts.
if r["driver_cpu_s"] > 0.5 * r["wall_s"]:
    sys.exit(f"connection_flood: FAILED: the driver used {r['driver_cpu_s']} CPU s in {r['wall_s']} s")
PY
refusals=$(grep -c "refused a connection from" "$tmp/run.log" || true)
dropped=$(grep -o "([0-9]* more such lines not shown)" "$tmp/run.log" | head -1 || true)
echo "connection_flood: the run trained 2 steps; $refusals refusal lines logged${dropped:+, e.g. $dropped}"
echo "connection_flood: OK"
