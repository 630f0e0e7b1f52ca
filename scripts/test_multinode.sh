#!/usr/bin/env bash
# Several machines on one: network namespaces joined by veth pairs to a
# bridge (in a namespace of its own), a driver host and two agent hosts, each
# with its own address and loopback. Checks, with the project's GRPO driver on
# the toy task (random base model, a few steps):
#   1. a run on two agent hosts (nnodes=2, 2 workers each, tensor parallel 2
#      within each host, data parallel 2 across them) reports the same
#      training metrics as the same run on one machine (4 local workers);
#   2. an agent killed in the middle of a run fails the run promptly, with a
#      message naming its node;
#   3. with trainer.max_restarts, an agent killed in the middle of a run is
#      replaced by a new one on the same host: the trainer waits for it,
#      resumes from its latest checkpoint and ends with the same metrics as
#      the uninterrupted two-host run;
#   4. nothing is left behind: no process in any namespace, the namespaces
#      and links removed.
# Needs root (ip netns) and iproute2; exits 77 (ctest's "skipped") without them.
#   scripts/test_multinode.sh [BUILD_DIR]    (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(cd "${1:-build}" && pwd)"
grpo="$build/examples/grpo"
agent="$build/runtime/baton-agent"
toy_task="$build/examples/toy_task"
for exe in "$grpo" "$agent" "$toy_task"; do
  [[ -x "$exe" ]] || { echo "test_multinode: $exe is not built" >&2; exit 1; }
done
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! ip netns add "bt$$-probe" 2>/dev/null; then
  echo "test_multinode: skipped (needs root and ip netns)"
  exit 77
fi
ip netns del "bt$$-probe"

tag="bt$$"
sw="$tag-sw"
hosts=("$tag-h0" "$tag-h1" "$tag-h2")
addrs=(10.77.0.1 10.77.0.2 10.77.0.3)
tmp="$(mktemp -d /tmp/baton-multinode.XXXXXX)"
agent_pids=()

cleanup() {
  set +e
  for p in "${agent_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ns in "${hosts[@]}" "$sw"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
for i in 0 1 2; do
  ns="${hosts[$i]}"
  ip netns add "$ns"
  ip link add "$tag-v$i" type veth peer name eth0 netns "$ns"
  ip link set "$tag-v$i" netns "$sw"
  ip -n "$sw" link set "$tag-v$i" master br0 up
  ip -n "$ns" addr add "${addrs[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

# The job's token, as a cluster would share it: a file only its owner reads.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/token"
chmod 600 "$tmp/token"
export BATON_CLUSTER_TOKEN_FILE="$tmp/token"
unset BATON_CLUSTER_TOKEN

"$toy_task" --out "$tmp/toy" >/dev/null
common=(--config configs/grpo_toy.yaml
  "data.train_files=[$tmp/toy/data/train.jsonl]" "data.val_files=[$tmp/toy/data/val.jsonl]"
  "actor_rollout_ref.model.path=$tmp/toy/model" data.train_batch_size=8
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.rollout.n=4
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
  actor_rollout_ref.rollout.tensor_model_parallel_size=2
  actor_rollout_ref.actor.entropy_coeff=0.01 actor_rollout_ref.actor.use_kl_loss=true
  trainer.val_before_train=false trainer.test_freq=-1 'trainer.logger=[file]')

start_agent() {  # host $1 (1 or 2, node $1 - 1), its log named $2
  ip netns exec "${hosts[$1]}" "$agent" --driver "${addrs[0]}:29400" --node-rank $(($1 - 1)) \
    --name "host$1" --slots 2 >"$tmp/agent$1.$2.log" 2>&1 &
  agent_pids+=($!)
}
start_agents() {  # the two agent hosts, node 0 and node 1
  agent_pids=()
  start_agent 1 "$1"
  start_agent 2 "$1"
}
# Waits until the run's first step is done (its metrics.jsonl in $1 has a row).
wait_first_step() {
  for _ in $(seq 600); do
    [[ -s "$1/metrics.jsonl" ]] && return 0
    sleep 0.1
  done
  echo "test_multinode: no step in 60 s" >&2
  return 1
}

# Training metrics of the last step in a run's metrics.jsonl: every number
# but timings, throughputs and memory.
metrics() {
  python3 - "$1" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
skip = ("timing", "time", "throughput", "perf/", "memory", "mfu")
print(json.dumps({k: v for k, v in sorted(last.items())
                  if isinstance(v, (int, float)) and not any(s in k for s in skip)}, indent=1))
EOF
}

echo "test_multinode: one machine, 4 workers"
ip netns exec "${hosts[0]}" "$grpo" "${common[@]}" trainer.nnodes=1 trainer.n_gpus_per_node=4 \
  trainer.total_training_steps=3 "trainer.default_local_dir=$tmp/one" >"$tmp/one.log" 2>&1 ||
  { tail -30 "$tmp/one.log"; exit 1; }

echo "test_multinode: two agent hosts, 2 workers each"
start_agents two
ip netns exec "${hosts[0]}" "$grpo" "${common[@]}" trainer.nnodes=2 trainer.n_gpus_per_node=2 \
  "trainer.cluster_listen=${addrs[0]}:29400" trainer.total_training_steps=3 \
  "trainer.default_local_dir=$tmp/two" >"$tmp/two.log" 2>&1 ||
  { tail -30 "$tmp/two.log"; tail -5 "$tmp"/agent*.two.log; exit 1; }
for p in "${agent_pids[@]}"; do wait "$p"; done  # they exit with the driver
agent_pids=()
grep -q "node 1 (host2, ${addrs[2]}) joined" "$tmp/two.log" ||
  { echo "test_multinode: the driver never saw node 1 join" >&2; tail -20 "$tmp/two.log"; exit 1; }
metrics "$tmp/one/metrics.jsonl" >"$tmp/one.json"
metrics "$tmp/two/metrics.jsonl" >"$tmp/two.json"
if ! diff -u "$tmp/one.json" "$tmp/two.json"; then
  echo "test_multinode: FAILED: the two-host run's metrics differ from the one-host run's" >&2
  exit 1
fi
echo "test_multinode: the same $(grep -c : "$tmp/one.json") metrics on one host and on two:"
grep -E '"(actor/entropy|actor/grad_norm|actor/kl_loss|response_length/mean)"' "$tmp/one.json"
# Training moved the policy, so that the comparison means something.
python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); sys.exit(0 if m["actor/grad_norm"] > 0 and m["actor/kl_loss"] != 0 else 1)' "$tmp/one.json" ||
  { echo "test_multinode: FAILED: the runs did not train (zero gradient or KL)" >&2; exit 1; }

echo "test_multinode: an agent killed in the middle of a run"
start_agents kill
ip netns exec "${hosts[0]}" "$grpo" "${common[@]}" trainer.nnodes=2 trainer.n_gpus_per_node=2 \
  "trainer.cluster_listen=${addrs[0]}:29400" trainer.total_training_steps=1000 \
  "trainer.default_local_dir=$tmp/kill" >"$tmp/kill.log" 2>&1 &
driver=$!
wait_first_step "$tmp/kill" || { tail -20 "$tmp/kill.log"; exit 1; }
kill -9 "${agent_pids[1]}"
killed=$(date +%s)
status=0
wait "$driver" || status=$?
took=$(($(date +%s) - killed))
if ((status == 0)); then
  echo "test_multinode: FAILED: the run went on without node 1" >&2
  exit 1
fi
failure="the node agent of node 1 (host2, ${addrs[2]}) disconnected"
if ! grep -qF "$failure" "$tmp/kill.log"; then
  echo "test_multinode: FAILED: the failure does not name node 1:" >&2
  tail -20 "$tmp/kill.log" >&2
  exit 1
fi
if ((took > 30)); then
  echo "test_multinode: FAILED: the run took ${took}s to fail" >&2
  exit 1
fi
echo "test_multinode: the run failed ${took}s after the kill, naming the node:"
grep -m1 -F "$failure" "$tmp/kill.log" | cut -c1-400
wait "${agent_pids[0]}" || true  # the surviving agent exits with the driver
agent_pids=()

echo "test_multinode: an agent killed and replaced, trainer.max_restarts=1"
start_agents rejoin
ip netns exec "${hosts[0]}" "$grpo" "${common[@]}" trainer.nnodes=2 trainer.n_gpus_per_node=2 \
  "trainer.cluster_listen=${addrs[0]}:29400" trainer.total_training_steps=3 trainer.save_freq=1 \
  trainer.max_restarts=1 "trainer.default_local_dir=$tmp/rejoin" >"$tmp/rejoin.log" 2>&1 &
driver=$!
wait_first_step "$tmp/rejoin" || { tail -20 "$tmp/rejoin.log"; exit 1; }
kill -9 "${agent_pids[1]}"
for _ in $(seq 300); do  # the trainer has seen the loss and is restarting
  grep -q "restarting every worker group" "$tmp/rejoin.log" && break
  sleep 0.1
done
grep -q "restarting every worker group" "$tmp/rejoin.log" ||
  { echo "test_multinode: FAILED: no restart within 30 s of the kill" >&2; tail -20 "$tmp/rejoin.log"; exit 1; }
start_agent 2 rejoin-new
status=0
wait "$driver" || status=$?
if ((status != 0)); then
  echo "test_multinode: FAILED: the run did not finish on the replacement agent (exit $status)" >&2
  tail -30 "$tmp/rejoin.log" >&2
  tail -5 "$tmp"/agent*.rejoin*.log >&2
  exit 1
fi
joined=$(grep -c "node 1 (host2, ${addrs[2]}) joined" "$tmp/rejoin.log" || true)
if ((joined != 2)); then
  echo "test_multinode: FAILED: node 1 joined $joined times, not twice (once replaced)" >&2
  exit 1
fi
metrics "$tmp/rejoin/metrics.jsonl" >"$tmp/rejoin.json"
if ! diff -u "$tmp/two.json" "$tmp/rejoin.json"; then
  echo "test_multinode: FAILED: the resumed run's metrics differ from the uninterrupted run's" >&2
  exit 1
fi
echo "test_multinode: the run resumed on the replacement agent and ended with the same metrics:"
grep -m1 "restarting every worker group" "$tmp/rejoin.log" | cut -c1-300
for p in "${agent_pids[@]}"; do wait "$p" || true; done  # they exit with the driver
agent_pids=()

sleep 1
for ns in "${hosts[@]}"; do
  left=$(ip netns pids "$ns" | tr '\n' ' ')
  if [[ -n "$left" ]]; then
    echo "test_multinode: FAILED: processes left in $ns: $left" >&2
    ps -o pid,ppid,args -p "${left// /,}" >&2 || true
    exit 1
  fi
done
echo "test_multinode: no process left on any host"
echo "test_multinode: OK"
