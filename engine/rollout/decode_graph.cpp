#include "engine/rollout/decode_graph.h"

#if defined(BATON_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <exception>

#include "engine/errors.h"

namespace baton::engine {

#if defined(BATON_CUDA)

struct CapturedStep::Graph {
  at::cuda::CUDAGraph graph;
};

bool cuda_graphs_available() { return c10::cuda::device_count() > 0; }

CapturedStep::CapturedStep(const std::function<void()>& body) : graph_(std::make_unique<Graph>()) {
  // Capture needs a stream other than the legacy default one; the side
  // stream starts after the work already queued on the current stream and
  // the current stream continues after the capture's warm-up.
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  try {
    c10::cuda::CUDAStreamGuard on_side(side);
    body();  // warm-up: lazily created handles and buffers, outside the graph
    graph_->graph.capture_begin();
    body();
    graph_->graph.capture_end();
  } catch (const std::exception& e) {
    throw EngineError(
        std::string("CapturedStep: capturing the decode step in a CUDA graph failed: ") + e.what());
  }
  at::cuda::CUDAEvent captured;
  captured.record(side);
  captured.block(current);
}

void CapturedStep::replay() { graph_->graph.replay(); }

#else

struct CapturedStep::Graph {};

bool cuda_graphs_available() { return false; }

CapturedStep::CapturedStep(const std::function<void()>&) {
  throw EngineError("CapturedStep: CUDA graphs need a CUDA build (BATON_CUDA)");
}

void CapturedStep::replay() {}

#endif

CapturedStep::~CapturedStep() = default;

}  // namespace baton::engine
