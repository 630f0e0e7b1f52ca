#!/usr/bin/env bash
# The Slurm recipe (examples/slurm/grpo.sbatch) under a real Slurm: Debian's
# slurm-wlm, a controller and two slurmd daemons on this machine (two nodes
# of one host, each slurmd on its own port), munge, all started here and
# stopped on exit. Checks, with the project's GRPO driver on the toy task:
#   1. `sbatch --nodes=2 examples/slurm/grpo.sbatch` for a few steps ends
#      COMPLETED; the two agents' lines reach the job's output, both nodes
#      join the driver, and lines of workers on node 1 reach the driver's log;
#   2. `scancel` of a long run after its first step leaves no process of
#      the job behind (driver, agents, workers, slurmstepd) within 10 s, and
#      no token file.
# Run by hand (CI does not): it installs slurm-wlm and munge with apt-get when
# they are missing. Needs root; exits 77 (ctest's "skipped") when it cannot run.
#   scripts/test_slurm.sh [BUILD_DIR]    (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
build="$(cd "${1:-build}" && pwd)"
for exe in "$build/examples/grpo" "$build/runtime/baton-agent" "$build/examples/toy_task"; do
  [[ -x "$exe" ]] || { echo "test_slurm: $exe is not built" >&2; exit 1; }
done
if [[ $(id -u) -ne 0 ]]; then
  echo "test_slurm: skipped (needs root: it runs slurmctld, slurmd and munged)"
  exit 77
fi
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
  ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  echo "test_slurm: installing slurm-wlm and munge"
  if ! out=$({ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends slurm-wlm munge; } 2>&1); then
    echo "$out" | tail -5
    echo "test_slurm: skipped (cannot install slurm-wlm and munge)"
    exit 77
  fi
fi
started=$(date +%s)

# Every process this test starts (the daemons, and through them the jobs)
# carries this variable: what cleanup kills and the leftover check looks for.
tag="baton-slurm-$$"
tmp="$(mktemp -d /tmp/baton-slurm.XXXXXX)"
chmod 755 "$tmp"  # munged wants its socket's directories searchable by all

# The processes whose environment holds the tag (and $1, when given).
tagged_pids() {
  local p
  for p in /proc/[0-9]*; do
    tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qx "BATON_SLURM_TEST=$tag" || continue
    [[ -z "${1:-}" ]] || tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qx "$1" || continue
    echo "${p#/proc/}"
  done
}
cleanup() {
  set +e
  local jobs
  if [[ "${SLURM_CONF:-}" == "$tmp/slurm.conf" ]]; then  # this test's Slurm, no other
    jobs=$(squeue -h -o %i 2>/dev/null)
    [[ -z "$jobs" ]] || scancel $jobs 2>/dev/null
  fi
  local left
  for _ in $(seq 20); do
    left=$(tagged_pids)
    [[ -z "$left" ]] && break
    kill $left 2>/dev/null
    sleep 0.5
  done
  left=$(tagged_pids)
  [[ -z "$left" ]] || kill -9 $left 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# The cluster: one host, two nodes (n0 and n1, a slurmd each) with two fake
# GPUs each (Slurm's gres/gpu wants device files; /dev/null and /dev/zero
# stand in: the toy task runs on CPU workers, one per "GPU").
host="$(hostname -s)"
ncpu="$(nproc)"
# Free ports for slurmctld, the two slurmd and the driver (BATON_PORT), so that
# nothing else listening on this machine meets the job.
read -r ctld_port slurmd0_port slurmd1_port driver_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool/n0" "$tmp/spool/n1" "$tmp/log" "$tmp/home"
chmod 700 "$tmp/munge"
export SLURM_CONF="$tmp/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=batontest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge.socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# Finished jobs stay in scontrol's view (no slurmdbd, so no sacct) for an hour.
MinJobAge=3600
# scancel: SIGTERM, then SIGKILL 30 s later, longer than the test waits.
KillWait=30
GresTypes=gpu
NodeName=n0 NodeHostname=$host NodeAddr=127.0.0.1 Port=$slurmd0_port CPUs=$ncpu RealMemory=1000 Gres=gpu:2
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$slurmd1_port CPUs=$ncpu RealMemory=1000 Gres=gpu:2
PartitionName=batch Nodes=n0,n1 Default=YES MaxTime=INFINITE State=UP
EOF
echo "Name=gpu File=/dev/null,/dev/zero" >"$tmp/gres.conf"
cat >"$tmp/cgroup.conf" <<EOF
# Nothing here uses cgroups (proctrack/linuxproc, task/none); slurmd reads it.
CgroupPlugin=autodetect
IgnoreSystemd=yes
EOF
head -c 1024 /dev/urandom >"$tmp/munge/munge.key"
chmod 400 "$tmp/munge/munge.key"

daemon() { env BATON_SLURM_TEST="$tag" "$@"; }
daemon munged --socket="$tmp/munge.socket" --key-file="$tmp/munge/munge.key" \
  --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/munge/munged.log" \
  --seed-file="$tmp/munge/munged.seed"
daemon slurmctld -f "$SLURM_CONF"
daemon slurmd -f "$SLURM_CONF" -N n0
daemon slurmd -f "$SLURM_CONF" -N n1
for _ in $(seq 60); do
  [[ "$(sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ')" == "n0 idle n1 idle " ]] && break
  sleep 0.5
done
if [[ "$(sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ')" != "n0 idle n1 idle " ]]; then
  echo "test_slurm: FAILED: the nodes are not idle within 30 s:" >&2
  sinfo -N >&2 || true
  tail -5 "$tmp"/log/*.log >&2
  exit 1
fi
echo "test_slurm: slurm $(sinfo -V | cut -d' ' -f2), nodes n0 and n1 on $host, $ncpu CPUs each"

"$build/examples/toy_task" --out "$tmp/toy" >/dev/null
toy=("data.train_files=[$tmp/toy/data/train.jsonl]" "data.val_files=[$tmp/toy/data/val.jsonl]"
  "actor_rollout_ref.model.path=$tmp/toy/model" data.train_batch_size=8
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.rollout.n=4
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  trainer.val_before_train=false trainer.test_freq=-1)
# The recipe as a user submits it, with the toy task's config and this
# machine's sizes; the job's home (where the recipe puts its token) in $tmp.
submit() {  # sbatch's output and run directory named $1, then key=value ...
  local name="$1"
  shift
  env -u BATON_CLUSTER_TOKEN -u BATON_CLUSTER_TOKEN_FILE BATON_SLURM_TEST="$tag" \
    HOME="$tmp/home" BATON_BUILD="$build" CONFIG=configs/grpo_toy.yaml BATON_PORT="$driver_port" \
    sbatch --parsable --nodes=2 --gpus-per-node=2 --cpus-per-task="$ncpu" --time=20 \
    --chdir="$repo" --output="$tmp/$name.out" examples/slurm/grpo.sbatch \
    "${toy[@]}" "trainer.default_local_dir=$tmp/$name" "$@"
}
job_state() { scontrol show job -o "$1" | tr ' ' '\n' | sed -n 's/^JobState=//p'; }
# Waits up to $2 seconds for job $1 to end (a state that is not pending,
# running or completing); prints it.
wait_job_end() {
  local state
  for _ in $(seq $(($2 * 2))); do
    state=$(job_state "$1")
    case "$state" in
      PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED) sleep 0.5 ;;
      *) echo "$state"; return 0 ;;
    esac
  done
  echo "$state (after ${2}s)"
}

echo "test_slurm: sbatch --nodes=2 examples/slurm/grpo.sbatch, 2 steps"
t0=$(date +%s)
job=$(submit short trainer.total_training_steps=2)
state=$(wait_job_end "$job" 300)
took=$(($(date +%s) - t0))
if [[ "$state" != COMPLETED ]]; then
  echo "test_slurm: FAILED: job $job ended $state, not COMPLETED" >&2
  tail -40 "$tmp/short.out" >&2
  exit 1
fi
echo "test_slurm: job $job COMPLETED in ${took}s"
agents=$(grep -c "baton-agent: .* joined the driver at 127.0.0.1:$driver_port" "$tmp/short.out" || true)
if ((agents != 2)); then
  echo "test_slurm: FAILED: $agents agents' lines in the job's output, not 2" >&2
  tail -40 "$tmp/short.out" >&2
  exit 1
fi
for node in 0 1; do
  grep -q "node $node (.*) joined" "$tmp/short/baton.log" ||
    { echo "test_slurm: FAILED: the driver's log has no node $node joining" >&2; exit 1; }
done
node1_workers=$(grep -cE '^.{0,40}\[[A-Za-z]+:[23]\]' "$tmp/short/baton.log" || true)
if ((node1_workers == 0)); then
  echo "test_slurm: FAILED: no line of the workers on node 1 (ranks 2, 3) in the driver's log" >&2
  tail -40 "$tmp/short/baton.log" >&2
  exit 1
fi
[[ -s "$tmp/short/metrics.jsonl" ]] && (($(wc -l <"$tmp/short/metrics.jsonl") == 2)) ||
  { echo "test_slurm: FAILED: the run did not log its 2 steps" >&2; exit 1; }
echo "test_slurm: the agents' lines in the job's output:"
grep "baton-agent: .* joined the driver" "$tmp/short.out" | cut -c1-200
echo "test_slurm: $node1_workers lines of node 1's workers in the driver's log, e.g.:"
grep -m1 -E '^.{0,40}\[[A-Za-z]+:[23]\]' "$tmp/short/baton.log" | cut -c1-200
if compgen -G "$tmp/home/.baton/token-*" >/dev/null; then
  echo "test_slurm: FAILED: the job left its token file: $(ls "$tmp/home/.baton")" >&2
  exit 1
fi

echo "test_slurm: scancel of a long run after its first step"
job=$(submit long trainer.total_training_steps=1000)
for _ in $(seq 600); do
  [[ -s "$tmp/long/metrics.jsonl" ]] && break
  sleep 0.5
done
if [[ ! -s "$tmp/long/metrics.jsonl" ]]; then
  echo "test_slurm: FAILED: job $job ($(job_state "$job")) did no step in 300 s" >&2
  tail -30 "$tmp/long.out" >&2
  exit 1
fi
running=$(tagged_pids "SLURM_JOB_ID=$job" | wc -l)
scancel "$job"
cancelled=$(date +%s)
while :; do
  left=$(tagged_pids "SLURM_JOB_ID=$job")
  # slurmstepd carries the daemons' environment, not the job's.
  for p in $(tagged_pids); do
    [[ "$(readlink "/proc/$p/exe" 2>/dev/null)" == */slurmstepd ]] && left+=" $p"
  done
  gone=$(($(date +%s) - cancelled))
  [[ -n "${left// /}" ]] && ((gone < 10)) || break
  sleep 0.5
done
if [[ -n "${left// /}" ]]; then
  echo "test_slurm: FAILED: processes of job $job left 10 s after scancel:" >&2
  ps -o pid,ppid,args -p "$(echo $left | tr ' ' ',')" >&2 || true
  exit 1
fi
state=$(wait_job_end "$job" 60)
[[ "$state" == CANCELLED* ]] ||
  { echo "test_slurm: FAILED: job $job is $state after scancel, not CANCELLED" >&2; exit 1; }
echo "test_slurm: job $job $state; its $running processes (driver, agents, workers, srun," \
  "the batch script) all gone ${gone}s after scancel"
if compgen -G "$tmp/home/.baton/token-*" >/dev/null; then
  echo "test_slurm: FAILED: the cancelled job left its token file" >&2
  exit 1
fi

echo "test_slurm: OK in $(($(date +%s) - started))s"
