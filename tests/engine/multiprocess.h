// Multi-process tests for the engine: run a test body on every rank of a small
// c10d world made of real processes, from inside an ordinary gtest TEST.
//
// The test binary re-executes itself, once per rank (posix_spawn of
// /proc/self/exe with --gtest_filter naming the current test), so no process
// that already ran torch ops is forked. In a child, run_world runs the body for
// that rank and exits: status 0 iff the test recorded no failure and the body
// threw nothing. The parent waits for all children, kills the rest when one
// fails (after a short grace) or when the timeout passes, and fails the test
// naming each failed rank and its exit status. Children print to the test's
// stdout/stderr; with this library's main (below) their failures are prefixed
// with "[rank r]".
//
// Link the executable with `engine_multiprocess` (it provides main; do not
// also link GTest::gtest_main).
//
// Example:
//   TEST(TensorParallel, ReduceSumsOverRanks) {
//     run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
//       ParallelConfig cfg;
//       cfg.tp = 2;
//       auto ps = ParallelState::create(store, rank, cfg);
//       at::Tensor y = reduce_from_tp_region(at::full({2}, double(rank + 1)), ps->tp());
//       expect_close(y, at::full({2}, 3.0), Tolerance::exact(), "sum over ranks");
//     });
//   }
//
// Code of the TEST outside the body runs in every child too: keep it to
// preparing inputs. A TEST may call run_world several times; each child runs
// only the body of the call it was spawned for.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "tests/tolerance.h"

namespace baton::engine::test {

using namespace ::baton::test;  // Tolerance, tensors_close, expect_close, ...

using RankBody = std::function<void(int64_t rank, c10::intrusive_ptr<c10d::Store> store)>;

// Runs `body` on `world_size` processes, one per rank, sharing a rendezvous
// store (baton::StoreServer, reached through AuthStore) the parent hosts on
// loopback. Blocks until every rank exits or `timeout` passes.
// Children use rank_threads() intra-op threads each.
// Call it from inside a TEST (gtest's current test names the child's filter).
void run_world(int64_t world_size, const RankBody& body,
               std::chrono::seconds timeout = std::chrono::seconds(120));

// True in a process spawned by run_world.
bool in_rank_process();

// Intra-op threads of a rank process: $BATON_TEST_THREADS, 1 when unset (so
// that ranks do not oversubscribe the cores). scripts/test_kernels.sh sets it
// to run the numerics tests with 1 and 2 threads.
int rank_threads();

// A normal(0, 1) fp32 tensor that depends only on `shape` and `seed` (its own
// generator), so every rank can build the same inputs.
at::Tensor seeded_randn(at::IntArrayRef shape, uint64_t seed);

// The main of engine_multiprocess: gtest, plus in a rank process
// rank_threads() intra-op threads and a result printer that prints only
// failures, prefixed by the rank.
int multiprocess_main(int argc, char** argv);

}  // namespace baton::engine::test
