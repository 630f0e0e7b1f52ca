// CapturedStep: one decode step of GenerationEngine's device loop recorded
// in a CUDA graph and replayed, so that a step costs one launch instead of
// a launch per kernel (hundreds for a 24-layer model). The step reads and
// writes fixed buffers (the captured addresses): the caller copies each
// step's inputs into them before replay() and reads the outputs after.
//
// Example (GenerationEngine, a batch bucket of 64 rows):
//   CapturedStep step([&] { bucket.run_step(); });   // warm-up, then capture
//   for (int64_t j = 0; j < k; ++j) { bucket.u.copy_(uniforms[j]); step.replay(); ... }
//
// Capture runs `body` once uncaptured on a side stream (cuBLAS handles,
// the allocator's first blocks), then records it; both runs happen before the
// constructor returns, so the buffers' contents afterwards are the warm-up's:
// refill them before the first replay. The graph's memory (the step's
// intermediates) is its own pool, freed with it.
//
// Thread safety: none; one generation engine owns it.
#pragma once

#include <functional>
#include <memory>

namespace baton::engine {

// Whether this build and process can capture CUDA graphs (a CUDA build and
// a visible device).
bool cuda_graphs_available();

class CapturedStep {
 public:
  // REQUIRES: cuda_graphs_available(); `body` enqueues CUDA work only (no
  // host synchronisation, no host-to-device copy from pageable memory).
  // Throws EngineError when capture fails, with CUDA's reason.
  explicit CapturedStep(const std::function<void()>& body);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // Runs the recorded step on the current stream.
  void replay();

 private:
  struct Graph;
  std::unique_ptr<Graph> graph_;
};

}  // namespace baton::engine
