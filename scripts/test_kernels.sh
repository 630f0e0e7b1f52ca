#!/usr/bin/env bash
# Runs the numerics-sensitive tests (CTest label "numerics") the way machines
# with other CPUs run them: under several CPU kernel paths, each with 1 and 2
# intra-op threads, then prints a table (kernel path × threads → pass/fail and
# how much of the tightest tolerance was used). Exits non-zero if any run
# failed. Does not build: run scripts/build.sh (or scripts/test.sh) first.
#
#   bash scripts/test_kernels.sh                  # the default matrix
#   bash scripts/test_kernels.sh --all            # every test, not only "numerics"
#   bash scripts/test_kernels.sh -R HfParity      # extra arguments go to ctest
#   CORES="Haswell Zen" THREADS="1" bash scripts/test_kernels.sh
#
# A machine's fp32 numerics come from two libraries, each picking a code
# path for the CPU at run time: OpenBLAS (matrix multiplies) and ATen's own
# vectorised kernels (softmax, norms, reductions, elementwise). Each row
# stands for a machine of one OpenBLAS core type: OPENBLAS_CORETYPE=<core>,
# and ATEN_CPU_CAPABILITY limited to that core's instruction set. (bf16
# matmuls go to oneDNN when the real CPU has AVX-512: limiting oneDNN with
# ONEDNN_MAX_CPU_ISA does not make ATen choose its own bf16 path, as a CPU
# without AVX-512 would, it makes oneDNN fail, so oneDNN is left alone.)
# Core types this CPU cannot execute are skipped (and listed). The forced core is checked: OpenBLAS prints the
# core it loads (OPENBLAS_VERBOSE=2), and a row whose core differs from the
# one asked for fails. When LibTorch uses MKL instead (ATen/Config.h says
# AT_MKL_ENABLED() 1, or MKL is what libblas.so.3 resolves to), the rows are
# MKL_ENABLE_INSTRUCTIONS=SSE4_2, AVX2 and AVX512 instead (ATen limited the
# same way).
#
# Threads: OMP_NUM_THREADS (LibTorch's and OpenBLAS's OpenMP pools in the
# single-process tests) and BATON_TEST_THREADS (each rank of the
# multi-process tests, tests/engine/multiprocess.h).
#
# Environment: CORES (OpenBLAS core types, default "Haswell SkylakeX Zen
# Sandybridge Prescott"), MKL_ISAS (default "SSE4_2 AVX2 AVX512"), THREADS
# (default "1 2"), BUILD_DIR (default build), JOBS (ctest -j, default 2).
# Logs: $BUILD_DIR/test_kernels/<row>-<threads>t.log, and .tsv files of the
# tolerance use (tests/tolerance.h, BATON_TOLERANCE_LOG).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
jobs=${JOBS:-2}
read -r -a threads <<<"${THREADS:-1 2}"
label_args=(-L numerics)
ctest_extra=()
for arg in "$@"; do
  if [[ $arg == --all ]]; then label_args=(); else ctest_extra+=("$arg"); fi
done

if [[ ! -f $build/CTestTestfile.cmake ]]; then
  echo "test_kernels: no CTest tree in $build/; build first (bash scripts/build.sh)" >&2
  exit 2
fi
probe=""  # any test executable linked to LibTorch, to see which BLAS it loads
for exe in "$build/tests/engine/engine_unit_tests" "$build/tests/engine/engine_model_tests"; do
  [[ -x $exe ]] && probe=$exe && break
done
if [[ -z $probe ]]; then
  echo "test_kernels: $build/tests/engine/engine_unit_tests is missing; build first" >&2
  exit 2
fi

# --- What this CPU can run ---------------------------------------------------
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has_flags() {  # has_flags "avx2 fma": all of them
  local f
  for f in $1; do [[ $cpu_flags == *" $f "* ]] || return 1; done
}
# OpenBLAS core type → "required CPU flags | ATEN_CPU_CAPABILITY"
declare -A core_isa=(
  [Prescott]="pni|default"
  [Core2]="ssse3|default"
  [Nehalem]="sse4_2|default"
  [Sandybridge]="avx|default"
  [Haswell]="avx2 fma|avx2"
  [Zen]="avx2 fma|avx2"
  [SkylakeX]="avx512f avx512cd avx512bw avx512dq avx512vl|avx512"
  [Cooperlake]="avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16|avx512"
)
declare -A mkl_isa=(
  [SSE4_2]="sse4_2|default"
  [AVX2]="avx2 fma|avx2"
  [AVX512]="avx512f avx512cd avx512bw avx512dq avx512vl|avx512"
)

# --- Which BLAS LibTorch uses ------------------------------------------------
loaded_core() {  # the OpenBLAS core the probe loads under the given environment
  env "$@" OPENBLAS_VERBOSE=2 "$probe" --gtest_list_tests 2>&1 >/dev/null |
    sed -n 's/^Core: //p' | tail -n 1
}
torch_dir=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
aten_config=""
for prefix in "$torch_dir/../../.." "$torch_dir/../../../.."; do
  if [[ -f $prefix/include/ATen/Config.h ]]; then
    aten_config=$(readlink -f "$prefix/include/ATen/Config.h")
    break
  fi
done
blas_lib=$(ldd "$probe" | awk '/libblas\.so|libmkl|libopenblas/ {print $3}' | head -n 1)
blas_real=$(readlink -f "${blas_lib:-/nonexistent}" 2>/dev/null || true)
native_core=$(loaded_core)
if [[ -n $aten_config ]] && grep -q 'define AT_MKL_ENABLED() 1' "$aten_config"; then
  blas=mkl
  blas_note="LibTorch built with MKL ($aten_config)"
elif [[ $blas_real == *mkl* ]]; then
  blas=mkl
  blas_note="libblas.so.3 is MKL ($blas_real)"
elif [[ -n $native_core ]]; then
  blas=openblas
  blas_note="OpenBLAS ($blas_real), native core $native_core"
else
  echo "test_kernels: cannot tell which BLAS LibTorch uses (libblas: ${blas_real:-none};" \
    "no OpenBLAS core printed, no MKL found)" >&2
  exit 2
fi
echo "test_kernels: $blas_note"
if [[ $blas == openblas ]]; then
  echo "test_kernels: MKL variants (MKL_ENABLE_INSTRUCTIONS) skipped: LibTorch does not use MKL" \
    "(${aten_config:-ATen/Config.h not found}: AT_MKL_ENABLED() 0)"
  read -r -a rows <<<"${CORES:-Haswell SkylakeX Zen Sandybridge Prescott}"
else
  read -r -a rows <<<"${MKL_ISAS:-SSE4_2 AVX2 AVX512}"
fi

# --- Runs -------------------------------------------------------------------
logs="$(cd "$build" && pwd)/test_kernels"  # absolute: tests run in their own directories
mkdir -p "$logs"
declare -A result worst
skipped=()
failed=0
for row in "${rows[@]}"; do
  if [[ $blas == openblas ]]; then spec=${core_isa[$row]:-}; else spec=${mkl_isa[$row]:-}; fi
  if [[ -z $spec ]]; then
    echo "test_kernels: unknown $blas row '$row' (known: ${!core_isa[*]} / ${!mkl_isa[*]})" >&2
    exit 2
  fi
  IFS='|' read -r flags aten <<<"$spec"
  if ! has_flags "$flags"; then
    skipped+=("$row (needs: $flags)")
    continue
  fi
  row_env=(ATEN_CPU_CAPABILITY="$aten")
  if [[ $blas == openblas ]]; then
    row_env+=(OPENBLAS_CORETYPE="$row")
    got=$(loaded_core "${row_env[@]}")
    if [[ ${got,,} != "${row,,}" ]]; then
      echo "test_kernels: OPENBLAS_CORETYPE=$row did not take effect (OpenBLAS loaded" \
        "'${got:-nothing}')" >&2
      for t in "${threads[@]}"; do result[$row,$t]="core not applied"; done
      failed=1
      continue
    fi
  else
    row_env+=(MKL_ENABLE_INSTRUCTIONS="$row")
  fi
  for t in "${threads[@]}"; do
    log="$logs/$row-${t}t.log"
    tsv="$logs/$row-${t}t.tsv"
    rm -f "$tsv"
    echo "test_kernels: $row, $t thread(s): ctest ${label_args[*]} ${ctest_extra[*]} → $log"
    status=0
    env "${row_env[@]}" OMP_NUM_THREADS="$t" BATON_TEST_THREADS="$t" BATON_TOLERANCE_LOG="$tsv" \
      ctest --test-dir "$build" "${label_args[@]}" --output-on-failure -j"$jobs" \
      "${ctest_extra[@]}" >"$log" 2>&1 || status=$?
    summary=$(grep -E 'tests passed|No tests were found' "$log" | tail -n 1 || true)
    total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' <<<"$summary")
    bad=$(sed -n 's/.* \([0-9]*\) tests failed out of.*/\1/p' <<<"$summary")
    if [[ $status -eq 0 && -n $total && $total -gt 0 ]]; then
      result[$row,$t]="pass ($total tests)"
    elif [[ -z $total ]]; then
      result[$row,$t]="FAIL (no tests ran; ctest exit $status)"
      failed=1
    else
      result[$row,$t]="FAIL (${bad:-?} of ${total:-?}; ctest exit $status)"
      failed=1
      grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Exception)' "$log" | sed 's/^/    /' || true
    fi
    if [[ -s $tsv ]]; then
      worst[$row,$t]=$(sort -t $'\t' -k3,3g "$tsv" | tail -n 1 | awk -F'\t' '{print $3 " (" $1 ": " $2 ")"}')
    fi
  done
done

# --- Table ------------------------------------------------------------------
echo
printf '%-34s' "kernel path"
for t in "${threads[@]}"; do printf ' | %-28s' "$t thread(s)"; done
echo
for row in "${rows[@]}"; do
  [[ -n ${result[$row,${threads[0]}]:-} ]] || continue
  if [[ $blas == openblas ]]; then
    IFS='|' read -r _ aten <<<"${core_isa[$row]}"
    name="OpenBLAS $row, ATen $aten"
  else
    IFS='|' read -r _ aten <<<"${mkl_isa[$row]}"
    name="MKL $row, ATen $aten"
  fi
  printf '%-34s' "$name"
  for t in "${threads[@]}"; do printf ' | %-28s' "${result[$row,$t]}"; done
  echo
done
for s in "${skipped[@]}"; do echo "skipped: $s: this CPU lacks it"; done
echo
echo "largest fraction of a tolerance used (|diff| / allowed; > 1 fails):"
for row in "${rows[@]}"; do
  for t in "${threads[@]}"; do
    [[ -n ${worst[$row,$t]:-} ]] && echo "  $row, $t thread(s): ${worst[$row,$t]}"
  done
done
exit $failed
