#!/usr/bin/env bash
# Fails when a baton library or program refers to std::filesystem::remove_all.
# LibTorch 2.11's libtorch.so exports a static copy of libstdc++'s filesystem
# functions; the dynamic linker binds a program's calls to those copies, and
# that remove_all (either overload) calls through a null pointer on a
# directory: the SIGSEGV in every HF export on a GPU machine with torch 2.11
# (docs/gpu.md). The other copies ran correctly when tried (create_directories,
# copy, remove, equivalent, directory iteration). baton calls
# engine::remove_tree instead.
#
#   no_interposed_std_symbols.sh LIB_OR_PROGRAM...
set -uo pipefail
forbidden='std::filesystem::remove_all\('
status=0
for f in "$@"; do
  [[ -f "$f" ]] || { echo "missing: $f"; status=1; continue; }
  hits=$(nm -C -u "$f" 2>/dev/null | grep -E "$forbidden" | sort -u)
  if [[ -n "$hits" ]]; then
    echo "$f refers to std::filesystem::remove_all, which libtorch.so 2.11 replaces with one that crashes:"
    echo "$hits"
    status=1
  fi
done
((status == 0)) && echo "checked $# files: none refers to std::filesystem::remove_all"
exit $status
