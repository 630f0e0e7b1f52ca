#!/usr/bin/env bash
# What a machine with NVIDIA GPUs runs in one go: build baton against that
# machine's own torch, run every *_CUDA test, then the toy task's GRPO and PPO
# (critic, reference, KL in the reward) on the GPU with a checkpoint, a resume
# and the HF export; with two or more GPUs also GRPO in TP2 and in DP2. Prints
# one JSON summary (and writes it to $OUT/summary.json); every step's log is
# under $OUT. Record what it printed in docs/gpu.md. Never part of CI.
#
#   bash scripts/gpu_check.sh [--debs DIR]
#
#   --debs DIR    Debian .debs of the build dependencies to unpack (dpkg -x)
#                 when apt-get cannot reach a registry (a machine with no
#                 network); otherwise scripts/setup.sh installs them.
#   BATON_PYTHON  the python whose torch is the LibTorch (default python3)
#   OUT           where logs and summary.json go (default /tmp/baton-gpu-check)
#   BUILD_DIR     build directory (default build-gpu), JOBS (default nproc)
#   STEPS         GRPO steps of the single-GPU run (default 30)
#   TESTS=0       skip building and running the test binaries (a rerun)
#   MAX_STEP_S    caps every step's time limit (default 300 s), so that a hang
#                 cannot eat a short GPU lease
#   BUILD_ONLY=1  the dependencies, configure and the programs' build only, then
#                 exit with the build's status (scripts/gpu_bench.sh's setup)
#   EXTRA_TARGETS more targets to build with the programs (space-separated)
#
# About 4 minutes on 16 cores with one H200 (build 3 minutes, 1.5 of them the tests).
set -uo pipefail
cd "$(dirname "$0")/.."
debs=""
while (($#)); do
  case "$1" in
    --debs) debs="$2"; shift 2 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-/tmp/baton-gpu-check}"
mkdir -p "$OUT"
B="${BUILD_DIR:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
STEPS="${STEPS:-30}"
MAX_STEP_S="${MAX_STEP_S:-300}"
TESTS="${TESTS:-1}"
BUILD_ONLY="${BUILD_ONLY:-0}"
((BUILD_ONLY)) && TESTS=0
PY="${BATON_PYTHON:-$(command -v python3)}"
T0=$(date +%s)
say() { echo "[gpu_check +$(($(date +%s) - T0))s] $*"; }
declare -A result  # step -> ok | failed (rc) | skipped
summary_extra=()

say "probe"
nvidia-smi -L | tee "$OUT/gpus.txt"
n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
torch_version=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null || echo none)
cxx_version=$(g++ -dumpfullversion 2>/dev/null || echo unknown)
echo "torch $torch_version at $PY; g++ $cxx_version; $n_gpus GPU(s): $gpu_name"

say "dependencies"
if [[ -n "$debs" ]]; then
  for f in "$debs"/*.deb; do dpkg -x "$f" / || echo "gpu_check: dpkg -x failed for $f"; done
  ldconfig
  # Debian 12's Cap'n Proto 0.9 headers do not compile under GCC 13 in C++20
  # (capnp/blob.h compares a const char* with a Text::Builder); the unpacked
  # copy is ours to mend: compare as StringPtr on both sides.
  if [[ -f /usr/include/capnp/blob.h && ${cxx_version%%.*} -ge 13 ]] &&
    grep -q 'return a == b.asString();' /usr/include/capnp/blob.h; then
    sed -i 's/return a == b.asString();/return b.asString() == kj::StringPtr(a);/;
            s/return a != b.asString();/return b.asString() != kj::StringPtr(a);/' \
      /usr/include/capnp/blob.h
  fi
else
  BATON_NO_VENV=1 bash scripts/setup.sh > "$OUT/setup.txt" 2>&1 || {
    tail -20 "$OUT/setup.txt"; echo "gpu_check: setup failed (pass --debs DIR offline)"; }
fi

say "configure + build (-j$JOBS)"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
[[ -n "${CUDACXX:-}" ]] || export CUDACXX="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
# The programs first, then the test binaries with -k 0: a test that does not
# compile against this LibTorch must not stop the training runs.
programs=(toy_task sft grpo ppo packing_bench ${EXTRA_TARGETS:-})
# The binaries that hold a *_CUDA test (tests/docs/gpu_check_test.sh checks it).
tests=(runtime_unit_tests runtime_process_tests engine_unit_tests engine_model_tests
  engine_parallel_model_tests)
build_rc=0
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DBATON_PYTHON="$PY" \
  -DBATON_BUILD_BENCH=ON > "$OUT/configure.txt" 2>&1 &&
  cmake --build "$B" -j "$JOBS" $(printf -- '--target %s ' "${programs[@]}") -- -k 0 > "$OUT/build.txt" 2>&1 ||
  build_rc=$?
if ((build_rc == 0 && TESTS)); then
  say "build: programs ok; test binaries"
  cmake --build "$B" -j "$JOBS" $(printf -- '--target %s ' "${tests[@]}") -- -k 0 \
    >> "$OUT/build.txt" 2>&1 || build_rc=$?
fi
if ((build_rc)); then
  grep -E "error|FAILED" "$OUT/build.txt" "$OUT/configure.txt" | head -30
  result[build]="failed ($build_rc)"
else
  result[build]=ok
fi
say "build: ${result[build]}"
((BUILD_ONLY)) && exit "$build_rc"

# Peak memory of every GPU, sampled while the runs go.
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 250 \
  > "$OUT/gpu_memory.csv" 2>/dev/null &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

tests_json='{}'
if [[ -x "$B/examples/grpo" ]] && ((TESTS)); then
  say "*_CUDA tests"
  (cd "$B" && timeout "$MAX_STEP_S" ctest -R '_CUDA' --output-on-failure) > "$OUT/cuda_tests.txt" 2>&1
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$OUT/cuda_tests.txt")
  skipped=$(grep -cE 'Test +#[0-9]+: .*(\*\*\*Skipped|Not Run)' "$OUT/cuda_tests.txt")
  failed_names=$(grep -E '\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout' "$OUT/cuda_tests.txt" |
    sed -E 's/.*: ([^ ]+) .*/"\1"/' | paste -sd, -)
  tests_json="{\"passed\": $passed, \"skipped\": $skipped, \"failed\": [${failed_names}]}"
  echo "$tests_json"
fi

toy="$OUT/toy"
data=("data.train_files=[$toy/data/train.jsonl]" "data.val_files=[$toy/data/val.jsonl]")
gpu=(trainer.device=cuda)
# run NAME SECONDS CMD...: one step of the check, its log in $OUT/NAME.txt.
run() {
  local name=$1 limit=$2
  shift 2
  ((limit <= MAX_STEP_S)) || limit=$MAX_STEP_S
  say "$name"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  if ((rc == 0)); then result[$name]=ok; else result[$name]="failed ($rc)"; fi
  tail -6 "$OUT/$name.txt"
  grep -m3 -E "fatal signal|failed on rank|error:" "$OUT/$name.txt"
  return $rc
}
# Validation accuracy (%) of a run directory's metrics.jsonl: its first
# ("first") or last ("last") validation.
accuracy() {
  "$PY" - "$1/metrics.jsonl" "$2" <<'EOF' 2>/dev/null || echo null
import json, sys
vals = [v for l in open(sys.argv[1]) if l.strip()
        for k, v in json.loads(l).items() if k.startswith("val-core/")]
print(round(100 * (vals[0] if sys.argv[2] == "first" else vals[-1]), 2) if vals else "null")
EOF
}
# Median seconds per step of a run directory's metrics.jsonl.
step_seconds() {
  "$PY" - "$1/metrics.jsonl" <<'EOF' 2>/dev/null || echo null
import json, statistics, sys
steps = [json.loads(l).get("timing_s/step") for l in open(sys.argv[1]) if l.strip()]
steps = [s for s in steps if s is not None]
print(round(statistics.median(steps), 4) if steps else "null")
EOF
}

if [[ -x "$B/examples/grpo" ]]; then
  run toy_task 120 "$B/examples/toy_task" --out "$toy"
  # SFT on the GPU; the CPU if that fails, so that RL still has its base.
  sft=("$B/examples/sft" --config configs/sft_toy.yaml "data.train_files=[$toy/data/sft.jsonl]"
    "data.val_files=[$toy/data/val.jsonl]" "model.path=$toy/model" "trainer.default_local_dir=$toy/sft")
  if ! run sft_gpu 300 "${sft[@]}" trainer.device=cuda trainer.n_gpus_per_node=1; then
    run sft_cpu 300 "${sft[@]}"
  fi
  half=$((STEPS / 2))
  # GRPO: half the steps with checkpoints, then a resume to the end and the export.
  run grpo_gpu 300 "$B/examples/grpo" --config configs/grpo_toy.yaml "${data[@]}" "${gpu[@]}" \
    "actor_rollout_ref.model.path=$toy/sft/model" "trainer.default_local_dir=$toy/grpo" \
    trainer.n_gpus_per_node=1 trainer.total_training_steps=$half trainer.save_freq=$half
  run grpo_gpu_resume 300 "$B/examples/grpo" --config configs/grpo_toy.yaml "${data[@]}" "${gpu[@]}" \
    "actor_rollout_ref.model.path=$toy/sft/model" "trainer.default_local_dir=$toy/grpo" \
    trainer.n_gpus_per_node=1 trainer.total_training_steps=$STEPS trainer.save_freq=$STEPS \
    trainer.resume_mode=auto
  grep -m1 -i "resum" "$OUT/grpo_gpu_resume.txt"
  [[ -f "$toy/grpo/actor_hf/config.json" ]] && result[grpo_export]=ok || result[grpo_export]=missing
  # PPO: critic beside the actor, reference policy, KL in the reward.
  ppo=("$B/examples/ppo" --config configs/ppo_toy.yaml "${data[@]}" "${gpu[@]}"
    "actor_rollout_ref.model.path=$toy/sft/model" "critic.model.path=$toy/sft/model"
    "trainer.default_local_dir=$toy/ppo" trainer.n_gpus_per_node=1
    algorithm.use_kl_in_reward=true)
  run ppo_gpu 300 "${ppo[@]}" trainer.total_training_steps=4 trainer.save_freq=2
  run ppo_gpu_resume 300 "${ppo[@]}" trainer.total_training_steps=6 trainer.save_freq=6 \
    trainer.resume_mode=auto
  [[ -f "$toy/ppo/actor_hf/config.json" ]] && result[ppo_export]=ok || result[ppo_export]=missing
  # Dynamic batch size (packed micro-batches) and offload of the actor's
  # parameters, gradients and optimizer state between phases.
  run grpo_packed_offload 300 "$B/examples/grpo" --config configs/grpo_toy.yaml "${data[@]}" "${gpu[@]}" \
    "actor_rollout_ref.model.path=$toy/sft/model" "trainer.default_local_dir=$toy/grpo_packed" \
    trainer.n_gpus_per_node=1 trainer.total_training_steps=10 \
    actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=256 \
    actor_rollout_ref.actor.megatron.param_offload=true actor_rollout_ref.actor.megatron.grad_offload=true \
    actor_rollout_ref.actor.megatron.optimizer_offload=true
  run packing_bench 120 "$B/bench/packing_bench" --device cuda --iters 3
  # Fully-async: an actor and a RolloutWorker process (both on GPU 0 here),
  # weights synced every step.
  run grpo_async 300 "$B/examples/grpo" --config configs/grpo_toy_async.yaml "${data[@]}" "${gpu[@]}" \
    "actor_rollout_ref.model.path=$toy/sft/model" "trainer.default_local_dir=$toy/grpo_async" \
    trainer.n_gpus_per_node=1 trainer.total_training_steps=10
  if ((n_gpus >= 2)); then
    run grpo_tp2 300 "$B/examples/grpo" --config configs/grpo_toy.yaml "${data[@]}" "${gpu[@]}" \
      "actor_rollout_ref.model.path=$toy/sft/model" "trainer.default_local_dir=$toy/grpo_tp2" \
      trainer.n_gpus_per_node=2 trainer.total_training_steps=10 \
      actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
      actor_rollout_ref.rollout.tensor_model_parallel_size=2
    run grpo_dp2 300 "$B/examples/grpo" --config configs/grpo_toy.yaml "${data[@]}" "${gpu[@]}" \
      "actor_rollout_ref.model.path=$toy/sft/model" "trainer.default_local_dir=$toy/grpo_dp2" \
      trainer.n_gpus_per_node=2 trainer.total_training_steps=10
  fi
fi
kill $sampler 2>/dev/null
peak=$(awk -F', ' '{ if ($2 > m[$1]) m[$1] = $2 } END { s = ""; for (g in m) s = s (s ? ", " : "") "\"" g "\": " m[g]; print "{" s "}" }' "$OUT/gpu_memory.csv" 2>/dev/null)

steps_json=""
for k in "${!result[@]}"; do steps_json+="${steps_json:+, }\"$k\": \"${result[$k]}\""; done
cat > "$OUT/summary.json" <<EOF
{"date": "$(date -u +%Y-%m-%dT%H:%MZ)", "gpus": $n_gpus, "gpu": "$gpu_name",
 "torch": "$torch_version", "gxx": "$cxx_version", "commit": "$(git rev-parse --short HEAD 2>/dev/null)",
 "steps": {$steps_json},
 "cuda_tests": $tests_json,
 "grpo": {"accuracy_before_pct": $(accuracy "$toy/grpo" first),
          "accuracy_after_pct": $(accuracy "$toy/grpo" last),
          "seconds_per_step_median": $(step_seconds "$toy/grpo"), "steps": $STEPS},
 "ppo": {"accuracy_before_pct": $(accuracy "$toy/ppo" first),
         "accuracy_after_pct": $(accuracy "$toy/ppo" last),
         "seconds_per_step_median": $(step_seconds "$toy/ppo")},
 "grpo_packed_offload": {"accuracy_before_pct": $(accuracy "$toy/grpo_packed" first),
          "accuracy_after_pct": $(accuracy "$toy/grpo_packed" last),
          "seconds_per_step_median": $(step_seconds "$toy/grpo_packed")},
 "grpo_async": {"accuracy_before_pct": $(accuracy "$toy/grpo_async" first),
          "accuracy_after_pct": $(accuracy "$toy/grpo_async" last),
          "seconds_per_step_median": $(step_seconds "$toy/grpo_async")},
 "peak_gpu_memory_mib": ${peak:-{\}},
 "seconds": $(($(date +%s) - T0))}
EOF
say "summary"
cat "$OUT/summary.json"
