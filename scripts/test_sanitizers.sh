#!/usr/bin/env bash
# The test suite under sanitizers, each in its own build directory:
#   asan   AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/): every test
#   tsan   ThreadSanitizer (build-tsan/): the runtime's and dispatch's tests
#
#   bash scripts/test_sanitizers.sh [asan|tsan|all] [ctest arguments...]
#   bash scripts/test_sanitizers.sh asan -R 'StoreServer|WorkerGroupTest'
#
# BUILD_TARGETS limits what is built (default: every target for asan, the
# runtime and dispatch test binaries for tsan). Suppressions, each with its
# reason, are in scripts/sanitizers/. Reports stop the process with a non-zero
# status (halt_on_error), so a report fails its test. LibTorch, Gloo and the
# other prebuilt libraries are not instrumented: ASan still sees their heap
# (malloc is intercepted), TSan does not see their synchronisation.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
shift || true
bash scripts/setup.sh
python="${BATON_VENV:-/opt/baton-venv}/bin/python"
supp="$PWD/scripts/sanitizers"

configure() {  # dir, flags
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBATON_PYTHON="$python" \
    -DBATON_CUDA="${BATON_CUDA:-ON}" -DBATON_WERROR=OFF \
    "-DCMAKE_CXX_FLAGS=$2 -fno-omit-frame-pointer" "-DCMAKE_C_FLAGS=$2 -fno-omit-frame-pointer" \
    "-DCMAKE_EXE_LINKER_FLAGS=$2" "-DCMAKE_SHARED_LINKER_FLAGS=$2"
}

build() {  # dir, default targets
  local targets=()
  for t in ${BUILD_TARGETS:-$2}; do targets+=(--target "$t"); done
  cmake --build "$1" "${targets[@]}"
}

status=0
if [[ "$mode" == asan || "$mode" == all ]]; then
  configure build-asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  build build-asan ""
  export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:detect_stack_use_after_return=0:strict_init_order=1:detect_odr_violation=0:suppressions=$supp/asan.supp"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
  # InstallTest builds a downstream project against the installed (here
  # instrumented) libraries without the sanitizer flags; it cannot link there.
  ctest --test-dir build-asan --output-on-failure -j2 --timeout 900 -E '^InstallTest\.' "$@" ||
    status=1
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
fi
if [[ "$mode" == tsan || "$mode" == all ]]; then
  configure build-tsan "-fsanitize=thread"
  build build-tsan "runtime_unit_tests runtime_process_tests dispatch_unit_tests dispatch_registration_tests dispatch_process_tests"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
  # The suites of those binaries (the other binaries are not built here).
  suites="BusyWorker|CallArgs|Channel|Colocated|ColocatedTest|ConstantTimeEqual|DataProto"
  suites+="|DispatchModeRegistration|DispatchTest|DriverDeath|Future|FutureArgsTest|Handshake"
  suites+="|HmacSha256|Init|MegatronLayout|MegatronTest|MeshDispatch|MethodRegistration"
  suites+="|ProfilerTest|Profiling|RandomToken|RankFailures|Sha256|Shutdown|StoreProtocol"
  suites+="|StoreServer|TokenFile|TypeSpec|UsableCores|Value|ValueCodec|WorkerCrash|WorkerDeath"
  suites+="|WorkerFunction|WorkerFunctionTest|WorkerGroupTest|ClusterTest|ClusterOptionsTest|ClusterProtocolTest|Tls|TlsWorkerGroup|RelayTest"
  ctest --test-dir build-tsan --output-on-failure -j2 --timeout 900 \
    -R "^([A-Za-z]+/)?($suites)\." \
    "$@" || status=1
fi
exit $status
