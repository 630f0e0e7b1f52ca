#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan, UBSan) in
# build-fuzz/ and runs them: each target first replays its committed corpus
# (tests/fuzz/corpus/<target>/, the seeds and every past crash), then fuzzes.
#   scripts/fuzz.sh [TARGET...]   the targets to run (default: all)
#   FUZZ_SECONDS   seconds of fuzzing per target (default 60; 0: replay only)
#   FUZZ_BUILD     0 to skip configuring and building (several runs at once)
#   FUZZ_DIR       build directory (default build-fuzz)
#   FUZZ_TIMEOUT   seconds one input may take before it counts as a hang (default
#                  10; raise it when the machine is busy, or a starved input is
#                  reported as a timeout)
# Per target: the work corpus grows in FUZZ_DIR/corpus/<target>/ (seeded from
# the committed one), crash/timeout/oom inputs land in
# FUZZ_DIR/artifacts/<target>/, libFuzzer's output in FUZZ_DIR/logs/<target>.log,
# and tests/fuzz/<target>.options, when present, adds libFuzzer flags to the
# fuzzing (not to the replay). Prints one JSON line per target at the end
# (executions, corpus size, new crash/timeout/oom inputs); exits 1 if any target
# failed: a crash, or a timeout or OOM that its options do not ignore.
# A crash's input goes, once fixed, to tests/fuzz/corpus/<target>/regression-<what>.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
dir="${FUZZ_DIR:-build-fuzz}"
all_targets=(fuzz_store_frame fuzz_handshake fuzz_tokenizer_json fuzz_chat_template
  fuzz_yaml_config fuzz_wire_message fuzz_data_proto fuzz_safetensors fuzz_model_config
  fuzz_checkpoint_meta)
# These five link the venv's LibTorch (tests/fuzz/CMakeLists.txt); without
# it they are skipped, saying so.
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

if [[ "${FUZZ_BUILD:-1}" != 0 ]]; then
  # The compiler and the parsers' libraries (scripts/setup.sh installs the
  # same libraries for the main build).
  packages=(cmake ninja-build pkg-config nlohmann-json3-dev libyaml-cpp-dev libpcre2-dev libtbb-dev)
  missing=()
  command -v clang++ >/dev/null || missing+=(clang)
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "fuzz: installing ${missing[*]}"
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -q
    "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  CXX=clang++ cmake -S tests/fuzz -B "$dir" -G Ninja >/dev/null
  available=$(ninja -C "$dir" -t targets all | sed -n 's/^\(fuzz_[a-z_]*\): .*/\1/p')
  kept=()
  for t in "${targets[@]}"; do
    if grep -qx "$t" <<<"$available"; then kept+=("$t"); else echo "fuzz: $t skipped (not configured: no LibTorch?)"; fi
  done
  targets=("${kept[@]}")
  cmake --build "$dir" --target "${targets[@]}"
fi

# From libFuzzer's output: the executions (its final stats or, with -fork, its
# last "#N: ..." status line) and the corpus size of its last status line.
executions() {
  grep -oE '^stat::number_of_executed_units: *[0-9]+|^#[0-9]+:' "$1" | tail -1 | tr -d ':' |
    grep -o '[0-9]*$' || echo 0
}
corp() { grep -o 'corp: [0-9]*' "$1" | tail -1 | grep -o '[0-9]*$' || echo 0; }
# How many inputs of a kind (crash, timeout, oom, leak) $2 lists that $1 does not.
new_artifacts() { comm -13 <(echo "$1") <(echo "$2") | grep -c "^$3-" || true; }

mkdir -p "$dir/logs"
summary=()
failed=0
for t in "${targets[@]}"; do
  bin="$dir/$t"
  seeds="tests/fuzz/corpus/$t"
  work="$dir/corpus/$t"
  artifacts="$dir/artifacts/$t"
  log="$dir/logs/$t.log"
  [[ -x "$bin" ]] || { echo "fuzz: $bin is missing (build it, or drop FUZZ_BUILD=0)" >&2; exit 2; }
  [[ -d "$seeds" ]] || { echo "fuzz: $seeds is missing: a target needs seed inputs" >&2; exit 2; }
  mkdir -p "$work" "$artifacts"
  common=("-timeout=${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 -print_final_stats=1 "-artifact_prefix=$artifacts/")
  # Tokens of the input's language (tests/fuzz/<target>.dict), which mutations splice in.
  [[ -f "tests/fuzz/$t.dict" ]] && common+=("-dict=tests/fuzz/$t.dict")
  # A target's own fuzzing flags (tests/fuzz/<target>.options: flags separated by blanks;
  # # starts a comment), e.g. -fork=1 -ignore_timeouts=1 for one whose hangs are known.
  options=()
  if [[ -f "tests/fuzz/$t.options" ]]; then
    read -r -a options <<<"$(sed 's/#.*//' "tests/fuzz/$t.options" | tr '\n' ' ')"
  fi
  before=$(ls "$artifacts")
  status=0
  start=$SECONDS
  # The committed corpus: every seed and past crash must run clean.
  "$bin" "${common[@]}" -runs=0 "$seeds" >"$log" 2>&1 || status=$?
  if ((status != 0)); then
    echo "fuzz: $t fails on its committed corpus ($seeds); see $log" >&2
  elif ((seconds > 0)); then
    # New inputs go to the first folder (the work corpus); the seeds are read only.
    "$bin" "${common[@]}" "${options[@]}" -max_total_time="$seconds" "$work" "$seeds" \
      >>"$log" 2>&1 || status=$?
    ((status == 0)) || echo "fuzz: $t failed; inputs in $artifacts/, output in $log" >&2
  fi
  after=$(ls "$artifacts")
  crashes=$(($(new_artifacts "$before" "$after" crash) + $(new_artifacts "$before" "$after" leak)))
  ((status == 0 || crashes > 0)) || crashes=1  # a timeout or OOM that stopped the run
  ((status == 0)) || failed=1
  summary+=("$(printf '{"target": "%s", "seconds": %d, "executions": %d, "corpus": %d, "crashes": %d, "timeouts": %d, "ooms": %d}' \
    "$t" $((SECONDS - start)) "$(executions "$log")" "$(corp "$log")" "$crashes" \
    "$(new_artifacts "$before" "$after" timeout)" "$(new_artifacts "$before" "$after" oom)")")
done
printf '%s\n' "${summary[@]}"
exit "$failed"
