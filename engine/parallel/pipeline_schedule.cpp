#include "engine/parallel/pipeline_schedule.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <deque>
#include <utility>

#include "base/profiler.h"
#include "engine/errors.h"

namespace baton::engine {
namespace {

// Point-to-point with the neighbouring stages. Tags keep the activation (2m)
// and gradient (2m+1) of micro-batch m apart. Sends are asynchronous: the
// tensor is kept until the send completes, so a stage can post its send and
// then wait on a receive without deadlocking against its neighbour. Messages
// travel on the groups' device (ParallelState::device): a GPU model on Gloo
// groups sends through host memory.
class StageLink {
 public:
  explicit StageLink(const Transformer& model)
      : pp_(model.parallel().pp()), via_(model.parallel().device()) {}

  // A posted receive; take() waits for it and returns it on `device`.
  struct Receive {
    at::Tensor buf;
    c10::intrusive_ptr<c10d::Work> work;
    at::Device device;
    at::Tensor take() {
      work->wait();
      return buf.to(device);
    }
  };

  void send(const at::Tensor& t, int64_t stage, int64_t tag) {
    std::vector<at::Tensor> buf{t.detach().to(via_).contiguous()};
    pending_.push_back({pp_.pg->send(buf, static_cast<int>(stage), static_cast<int>(tag)), buf});
  }
  Receive post_recv(at::IntArrayRef shape, const at::TensorOptions& opts, int64_t stage,
                    int64_t tag) {
    std::vector<at::Tensor> buf{at::empty(shape, opts.device(via_))};
    auto work = pp_.pg->recv(buf, static_cast<int>(stage), static_cast<int>(tag));
    return {buf[0], work, opts.device()};
  }
  at::Tensor recv(at::IntArrayRef shape, const at::TensorOptions& opts, int64_t stage,
                  int64_t tag) {
    return post_recv(shape, opts, stage, tag).take();
  }
  // Completes sends that are done; call now and then to bound memory.
  void reap(bool all) {
    while (!pending_.empty() && (all || pending_.front().work->isCompleted())) {
      pending_.front().work->wait();
      pending_.pop_front();
    }
  }
  ~StageLink() {
    try {
      reap(true);
    } catch (...) {
    }
  }

 private:
  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> keep;
  };
  const Group& pp_;
  const at::Device via_;
  std::deque<Pending> pending_;
};

struct Geometry {
  std::vector<int64_t> hidden_shape;  // a stage's input/output [b, S(/tp), H]
  at::TensorOptions options;
};

Geometry geometry(const Transformer& model, const MicroBatch& mb) {
  int64_t s = mb.input_ids.size(1);
  if (model.options().sequence_parallel) s /= model.parallel().tp().size;
  auto p = model.named_params().front().second;
  return {{mb.input_ids.size(0), s, model.config().hidden_size},
          at::TensorOptions().dtype(p.scalar_type()).device(p.device())};
}

void check_batches(const std::vector<MicroBatch>& mbs, const char* who) {
  if (mbs.empty()) throw EngineError(std::string(who) + ": no micro-batches");
  for (size_t i = 0; i < mbs.size(); ++i) {
    const auto& mb = mbs[i];
    if (!mb.input_ids.defined() || !mb.position_ids.defined() || !mb.attention_mask.defined())
      throw EngineError(detail::cat(who, ": micro-batch ", i,
                                    " lacks input_ids, position_ids or attention_mask"));
  }
}

}  // namespace

std::vector<at::Tensor> forward_backward(Transformer& model, const std::vector<MicroBatch>& mbs,
                                         const LossFn& loss) {
  BATON_PROFILE_SCOPE("engine", "forward_backward");
  check_batches(mbs, "forward_backward");
  const ParallelState& ps = model.parallel();
  int64_t stages = ps.config().pp, stage = ps.coords().pp;
  int64_t m = static_cast<int64_t>(mbs.size());
  bool first = model.first_stage(), last = model.last_stage();
  StageLink link(model);
  std::vector<at::Tensor> losses;
  // In flight: (stage input that needs its grad, stage output) per micro-batch.
  std::deque<std::pair<at::Tensor, at::Tensor>> inflight;
  int64_t next_fwd = 0, next_bwd = 0;
  // In the steady phase a stage sends its forward output only once the receive
  // of the next gradient from that neighbour is posted (Megatron's
  // send_forward_recv_backward order). Each link then carries its messages in
  // the same order on both sides, the order its downstream stage runs in.
  // NCCL needs this: its sends and receives with one peer share a stream, so
  // two neighbours that both send first would wait on each other forever.
  // Gloo matches by tag; the order changes nothing there.
  at::Tensor deferred;  // forward output waiting to be sent
  int64_t deferred_tag = 0;

  auto forward_step = [&](bool defer_send) {
    const MicroBatch& mb = mbs[next_fwd];
    at::Tensor input;
    if (first) {
      input = mb.input_ids;
    } else {
      auto g = geometry(model, mb);
      input = link.recv(g.hidden_shape, g.options, stage - 1, 2 * next_fwd).requires_grad_(true);
    }
    at::Tensor out = model.forward(input, mb.position_ids, mb.attention_mask, mb.packed_lengths);
    if (last) {
      out = loss(out, mb);
      if (out.numel() != 1)
        throw EngineError(detail::cat("forward_backward: the loss of micro-batch ", next_fwd,
                                      " has ", out.numel(), " elements; it must be a scalar"));
      losses.push_back(out.detach());
    } else if (defer_send) {
      deferred = out;
      deferred_tag = 2 * next_fwd;
    } else {
      link.send(out, stage + 1, 2 * next_fwd);
    }
    inflight.emplace_back(first ? at::Tensor() : input, out);
    ++next_fwd;
  };

  auto backward_step = [&] {
    auto [input, out] = inflight.front();
    inflight.pop_front();
    model.before_backward(next_bwd == m - 1);
    if (last) {
      torch::autograd::backward({out});
    } else {
      auto g = geometry(model, mbs[next_bwd]);
      auto grad = link.post_recv(g.hidden_shape, g.options, stage + 1, 2 * next_bwd + 1);
      if (deferred.defined()) {
        link.send(deferred, stage + 1, deferred_tag);
        deferred = at::Tensor();
      }
      torch::autograd::backward({out}, {grad.take()});
    }
    if (!first) link.send(input.grad(), stage - 1, 2 * next_bwd + 1);
    ++next_bwd;
    link.reap(false);
  };

  int64_t warmup = std::min(stages - stage - 1, m);
  for (int64_t i = 0; i < warmup; ++i) forward_step(/*defer_send=*/false);
  for (int64_t i = 0; i < m - warmup; ++i) {
    forward_step(/*defer_send=*/true);
    backward_step();
  }
  while (next_bwd < m) backward_step();
  link.reap(true);
  return losses;
}

std::vector<at::Tensor> forward_only(Transformer& model, const std::vector<MicroBatch>& mbs,
                                     const OutputFn& fn) {
  BATON_PROFILE_SCOPE("engine", "forward_only");
  check_batches(mbs, "forward_only");
  at::NoGradGuard no_grad;
  const ParallelState& ps = model.parallel();
  int64_t stage = ps.coords().pp;
  bool first = model.first_stage(), last = model.last_stage();
  StageLink link(model);
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < mbs.size(); ++i) {
    const MicroBatch& mb = mbs[i];
    at::Tensor input = mb.input_ids;
    if (!first) {
      auto g = geometry(model, mb);
      input = link.recv(g.hidden_shape, g.options, stage - 1, static_cast<int64_t>(2 * i));
    }
    at::Tensor out = model.forward(input, mb.position_ids, mb.attention_mask, mb.packed_lengths);
    if (last) {
      outputs.push_back(fn(out, mb));
    } else {
      link.send(out, stage + 1, static_cast<int64_t>(2 * i));
    }
    link.reap(false);
  }
  link.reap(true);
  return outputs;
}

}  // namespace baton::engine
