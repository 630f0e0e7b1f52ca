# Precompiled headers shared by many targets (compile time on 2 cores is a
# cost every CI run pays; docs/architecture.md, "Building fast").
#
# Most of baton's translation units spend most of their time parsing the same
# LibTorch headers: ATen, torch::nn::Module, autograd functions and c10d's
# ProcessGroup. One precompiled header of them is built once, by the donor
# targets below, and reused (REUSE_FROM) by every library, program and test
# that links LibTorch: GCC then loads it instead of parsing those headers
# again. Reuse needs the same compile flags as the donor's; every user links
# baton::torch, which carries them. A target whose flags differ would only
# get a -Winvalid-pch warning and parse the headers as before.
#
# Loading the header is not free (it is ~650 MB; ~4 s per file here), so a
# file that includes no LibTorch header skips it (baton_skip_pch); measured
# per file with -g1: a file with c10d and torch::nn 20.5 s -> 13.3 s, one with
# ATen alone 8.6 s -> 6.3 s, one without LibTorch 5.8 s -> 10.1 s.
set(BATON_PCH_HEADERS
  <ATen/ATen.h>
  <torch/nn/module.h>
  <torch/csrc/autograd/custom_function.h>
  <torch/csrc/distributed/c10d/ProcessGroup.hpp>
  <nlohmann/json.hpp>)

file(WRITE ${PROJECT_BINARY_DIR}/baton_pch_donor.cpp "// The donor of the shared precompiled header.\n")
add_library(baton_pch STATIC ${PROJECT_BINARY_DIR}/baton_pch_donor.cpp)
target_link_libraries(baton_pch PRIVATE baton_torch nlohmann_json::nlohmann_json)
target_precompile_headers(baton_pch PRIVATE ${BATON_PCH_HEADERS})

# baton_use_pch(target...): the target reuses the shared precompiled header.
function(baton_use_pch)
  foreach(t IN LISTS ARGN)
    target_precompile_headers(${t} REUSE_FROM baton_pch)
  endforeach()
endfunction()

# The tests' donor: the same headers and GoogleTest's.
function(baton_add_test_pch)
  file(WRITE ${PROJECT_BINARY_DIR}/baton_test_pch_donor.cpp "// The tests' precompiled header donor.\n")
  add_library(baton_test_pch STATIC ${PROJECT_BINARY_DIR}/baton_test_pch_donor.cpp)
  target_link_libraries(baton_test_pch PRIVATE baton_torch nlohmann_json::nlohmann_json GTest::gtest)
  target_precompile_headers(baton_test_pch PRIVATE ${BATON_PCH_HEADERS} <gtest/gtest.h>)
endfunction()

# baton_use_test_pch(target...): a test reuses the tests' precompiled header.
function(baton_use_test_pch)
  foreach(t IN LISTS ARGN)
    target_precompile_headers(${t} REUSE_FROM baton_test_pch)
  endforeach()
endfunction()

# baton_skip_pch(file...): files (of the calling directory) that include no
# LibTorch header compile without the shared precompiled header.
function(baton_skip_pch)
  set_source_files_properties(${ARGN} DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
    PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
endfunction()
