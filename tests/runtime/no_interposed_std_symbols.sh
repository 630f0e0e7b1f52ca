#!/usr/bin/env bash
# Fails when a baton library or program refers to a standard-library function
# that LibTorch 2.11's libtorch.so also exports (a static copy of libstdc++'s
# filesystem and time-zone code). The dynamic linker binds such a reference to
# libtorch.so's copy, whose remove_all calls through a null pointer: the
# SIGSEGV in every HF export on a GPU machine with torch 2.11 (docs/gpu.md).
# baton calls engine::remove_tree and engine::same_file instead.
#
#   no_interposed_std_symbols.sh LIB_OR_PROGRAM...
set -uo pipefail
forbidden='std::filesystem::remove_all\(|std::filesystem::equivalent\(|std::filesystem::permissions\(|std::chrono::tzdb|std::chrono::time_zone::|std::chrono::current_zone|std::chrono::locate_zone'
status=0
for f in "$@"; do
  [[ -f "$f" ]] || { echo "missing: $f"; status=1; continue; }
  hits=$(nm -C -u "$f" 2>/dev/null | grep -E "$forbidden" | sort -u)
  if [[ -n "$hits" ]]; then
    echo "$f refers to standard-library functions that libtorch.so 2.11 interposes:"
    echo "$hits"
    status=1
  fi
done
((status == 0)) && echo "checked $# files: none refers to an interposed standard-library function"
exit $status
