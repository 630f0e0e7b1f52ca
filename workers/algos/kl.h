// KL between the policy and the reference: the per-token estimators used as a
// loss term (actor.kl_loss_type) and as a penalty in the reward
// (algorithm.kl_penalty), and the controllers of the reward penalty's
// coefficient β (algorithm.kl_ctrl).
//
// Example:
//   at::Tensor kl = kl_penalty(log_prob, ref_log_prob, "low_var_kl");     // [B, L]
//   auto ctrl = make_kl_controller({.type = "adaptive", .kl_coef = 0.001});
//   rewards = scores - ctrl->value * kl_penalty(old, ref, "kl") * mask;
//   ctrl->update(current_kl, batch_size);
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/errors.h"

namespace baton::algos {

// Per-token KL estimate with d = logprob − ref_logprob, by kind:
//   "kl", "k1"          d
//   "abs"               |d|
//   "mse", "k2"         d²/2
//   "low_var_kl", "k3"  x = clamp(−d, −20, 20); clamp(eˣ − x − 1, −10, 10)
//   any of these + "+"  the base kind's value with the gradient of k2
//                       (straight-through: k2 − sg(k2) + sg(value))
// "full" and anything else throw baton::InvalidArgument naming the kind.
at::Tensor kl_penalty(const at::Tensor& logprob, const at::Tensor& ref_logprob,
                      std::string_view kind);

// scores − (old_log_prob − ref_log_prob)·kl_ratio.
at::Tensor compute_rewards(const at::Tensor& scores, const at::Tensor& old_log_prob,
                           const at::Tensor& ref_log_prob, double kl_ratio);

// The coefficient β of the KL penalty in the reward (`value`), updated once
// per step with the batch's mean KL. Not thread-safe.
class KLController {
 public:
  virtual ~KLController() = default;
  // current_kl: the step's mean per-sequence KL; n_steps: its batch size.
  virtual void update(double current_kl, int64_t n_steps) = 0;

  double value = 0;
};

// β fixed at kl_coef.
class FixedKLController final : public KLController {
 public:
  explicit FixedKLController(double kl_coef);
  void update(double current_kl, int64_t n_steps) override;
};

// Ziegler et al.: e = clamp(current_kl/target_kl − 1, −0.2, 0.2),
// β ← β·(1 + e·n_steps/horizon). horizon must be > 0 (throws otherwise).
class AdaptiveKLController final : public KLController {
 public:
  AdaptiveKLController(double init_kl_coef, double target_kl, double horizon);
  void update(double current_kl, int64_t n_steps) override;

 private:
  double target_kl_, horizon_;
};

// algorithm.kl_ctrl, with verl's defaults.
struct KLControlOptions {
  std::string type = "fixed";  // "fixed" or "adaptive"
  double kl_coef = 0.001;      // β, or its initial value
  double target_kl = 0.1;      // adaptive only
  double horizon = 10000;      // adaptive only
};

// The controller named by options.type; another type throws
// baton::InvalidArgument naming it.
std::unique_ptr<KLController> make_kl_controller(const KLControlOptions& options);

}  // namespace baton::algos
