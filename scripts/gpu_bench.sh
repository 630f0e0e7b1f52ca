#!/usr/bin/env bash
# baton against HF transformers and TRL on one GPU, in one run of under 8
# minutes on a lent H100/H200 (16 cores, no network): the device's copy
# bandwidth, random-init bf16 checkpoints at Qwen2.5-0.5B, Qwen2.5-1.5B and
# Qwen3-1.7B shapes, decode tokens/s at batch 1, 16, 64 and 256 (512-token
# prompts, 512 new tokens) for baton's engine (bench/rollout_bench) and HF
# generate with each row's memory-bandwidth bound, one GRPO configuration
# (8 prompts x 8 samples x 512 tokens, update included) for baton's grpo and
# TRL's GRPOTrainer, and each step's peak memory. Prints one JSON object (also
# $OUT/gpu_bench.json); every step's log is under $OUT and every step has a
# time limit: a step that fails or runs out of time is recorded in the JSON
# (status and log), the others still run. What each key means: docs/gpu.md,
# "Benchmark". Never part of CI.
#
#   bash scripts/gpu_bench.sh [--debs DIR] [--wheels DIR]
#   DEVICE=cpu SMOKE=1 bash scripts/gpu_bench.sh     # every step at tiny sizes, on a CPU
#
#   --debs DIR    passed to scripts/gpu_check.sh (build dependencies as .debs);
#                 default shared/gpu/debs or ../shared/gpu/debs when present
#   --wheels DIR  TRL and its missing dependencies as wheels, installed with
#                 pip --no-deps --no-index when `import trl` fails (cuda only:
#                 on a CPU give BATON_PYTHON a python with TRL); default
#                 shared/gpu/wheels or ../shared/gpu/wheels when present
#   DEVICE        cuda (default) or cpu
#   SMOKE=1       tiny shapes, 8-token prompts, 2 new tokens, 1 GRPO step
#   OUT           logs, checkpoints and gpu_bench.json (default /tmp/baton-gpu-bench)
#   BUILD_DIR     default build-gpu (cuda; built by gpu_check.sh BUILD_ONLY=1)
#                 or build (cpu: an already configured tree, only the two
#                 targets built); SKIP_BUILD=1 uses it as it is
#   BATON_PYTHON  the python with torch + transformers (default python3; on
#                 the CPU /opt/baton-venv/bin/python when present)
#   MODELS        comma-separated (default qwen2.5-0.5b,qwen2.5-1.5b,qwen3-1.7b)
#   BATCHES, PROMPT, NEW, GRPO_STEPS, DTYPE (bf16 on cuda, fp32 on cpu): overrides
#   TOTAL_S       the whole run's time budget (default 470 s): a step that would
#                 start with less than 10 s left is skipped, and each step's
#                 limit is cut to what is left; STEP_S caps each step (150 s)
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
debs="" wheels=""
for d in shared/gpu/debs ../shared/gpu/debs; do [[ -z "$debs" && -d "$d" ]] && debs="$d"; done
for d in shared/gpu/wheels ../shared/gpu/wheels; do [[ -z "$wheels" && -d "$d" ]] && wheels="$d"; done
while (($#)); do
  case "$1" in
    --debs) debs="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    *) echo "gpu_bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
DEVICE="${DEVICE:-cuda}"
SMOKE="${SMOKE:-0}"
OUT="${OUT:-/tmp/baton-gpu-bench}"
TOTAL_S="${TOTAL_S:-470}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
if [[ "$DEVICE" == cuda ]]; then
  B="${BUILD_DIR:-build-gpu}"
  PY="${BATON_PYTHON:-$(command -v python3)}"
else
  B="${BUILD_DIR:-build}"
  venv_py="${BATON_VENV:-/opt/baton-venv}/bin/python"
  [[ -x "$venv_py" ]] || venv_py="$(command -v python3)"
  PY="${BATON_PYTHON:-$venv_py}"
fi
say() { echo "[gpu_bench +$(($(date +%s) - T0))s] $*" >&2; }

# The build: gpu_check.sh's own (dependencies, configure, the programs) on a
# GPU machine; on a CPU, the two targets in an existing tree.
build_status=ok rc=0
build_log="$OUT/build.txt"
if [[ "${SKIP_BUILD:-0}" == 1 ]]; then
  build_status="skipped (SKIP_BUILD=1)"
elif [[ "$DEVICE" == cuda ]]; then
  say "build (scripts/gpu_check.sh BUILD_ONLY=1)"
  BUILD_ONLY=1 EXTRA_TARGETS=rollout_bench BUILD_DIR="$B" OUT="$OUT/build" BATON_PYTHON="$PY" \
    timeout 300 bash scripts/gpu_check.sh ${debs:+--debs "$debs"} > "$build_log" 2>&1
  rc=$?
  ((rc == 0)) || build_status="failed (rc $rc)"
else
  say "build (rollout_bench, grpo in $B)"
  timeout 600 cmake --build "$B" --target rollout_bench grpo > "$build_log" 2>&1
  rc=$?
  ((rc == 0)) || build_status="failed (rc $rc)"
fi
say "build: $build_status"
((rc == 0)) || tail -20 "$build_log" >&2

# TRL where the GPU machine's image lacks it (shared/gpu/wheels). Never on a
# CPU: that python is the project's venv, which scripts/setup_bench.sh owns.
if [[ "$DEVICE" == cuda && -n "$wheels" ]] && ! "$PY" -c "import trl, datasets" > /dev/null 2>&1; then
  say "pip install --no-deps --no-index $wheels/*.whl"
  "$PY" -m pip install -q --no-deps --no-index "$wheels"/*.whl > "$OUT/wheels.txt" 2>&1 ||
    tail -5 "$OUT/wheels.txt" >&2
fi

args=(run --device "$DEVICE" --out "$OUT" --build-dir "$B" --build-status "$build_status"
  --build-log "$build_log" --t0 "$T0" --deadline "$((T0 + TOTAL_S))" --step-cap "${STEP_S:-150}")
[[ "$SMOKE" == 1 ]] && args+=(--smoke)
[[ -n "${MODELS:-}" ]] && args+=(--models "$MODELS")
[[ -n "${BATCHES:-}" ]] && args+=(--batches "$BATCHES")
[[ -n "${PROMPT:-}" ]] && args+=(--prompt "$PROMPT")
[[ -n "${NEW:-}" ]] && args+=(--new "$NEW")
[[ -n "${GRPO_STEPS:-}" ]] && args+=(--grpo-steps "$GRPO_STEPS")
[[ -n "${DTYPE:-}" ]] && args+=(--dtype "$DTYPE")
"$PY" scripts/gpu_bench.py "${args[@]}"
