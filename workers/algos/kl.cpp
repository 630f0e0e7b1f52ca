#include "workers/algos/kl.h"

#include <algorithm>
#include <stdexcept>

#include "base/errors.h"
#include "workers/algos/clamp.h"

namespace baton::algos {

at::Tensor kl_penalty(const at::Tensor& logprob, const at::Tensor& ref_logprob,
                      std::string_view kind) {
  const bool straight_through = kind.size() > 1 && kind.back() == '+';
  const std::string_view base = straight_through ? kind.substr(0, kind.size() - 1) : kind;
  const at::Tensor d = logprob - ref_logprob;
  at::Tensor value;
  if (base == "kl" || base == "k1") {
    value = d;
  } else if (base == "abs") {
    value = d.abs();
  } else if (base == "mse" || base == "k2") {
    value = 0.5 * d.square();
  } else if (base == "low_var_kl" || base == "k3") {
    const at::Tensor x = clamp_inclusive(-d, -20, 20);
    value = clamp_inclusive(x.exp() - x - 1, -10, 10);
  } else if (base == "full") {
    throw baton::InvalidArgument("kl_penalty: kind '" + std::string(kind) +
                                "' (the full-vocabulary KL) is not implemented; use kl/k1, abs, "
                                "mse/k2 or low_var_kl/k3 (optionally with a trailing '+')");
  } else {
    throw baton::InvalidArgument("kl_penalty: unknown kind '" + std::string(kind) +
                                "'; known: kl, k1, abs, mse, k2, low_var_kl, k3, each optionally "
                                "followed by '+' (k2's gradient)");
  }
  if (!straight_through) return value;
  const at::Tensor k2 = 0.5 * d.square();
  return k2 - k2.detach() + value.detach();
}

at::Tensor compute_rewards(const at::Tensor& scores, const at::Tensor& old_log_prob,
                           const at::Tensor& ref_log_prob, double kl_ratio) {
  return scores - (old_log_prob - ref_log_prob) * kl_ratio;
}

FixedKLController::FixedKLController(double kl_coef) { value = kl_coef; }

void FixedKLController::update(double, int64_t) {}

AdaptiveKLController::AdaptiveKLController(double init_kl_coef, double target_kl, double horizon)
    : target_kl_(target_kl), horizon_(horizon) {
  if (!(horizon > 0))
    throw baton::InvalidArgument("AdaptiveKLController: horizon must be > 0, got " +
                                std::to_string(horizon));
  value = init_kl_coef;
}

void AdaptiveKLController::update(double current_kl, int64_t n_steps) {
  const double error = std::clamp(current_kl / target_kl_ - 1, -0.2, 0.2);
  value *= 1 + error * static_cast<double>(n_steps) / horizon_;
}

std::unique_ptr<KLController> make_kl_controller(const KLControlOptions& options) {
  if (options.type == "fixed") return std::make_unique<FixedKLController>(options.kl_coef);
  if (options.type == "adaptive")
    return std::make_unique<AdaptiveKLController>(options.kl_coef, options.target_kl,
                                                  options.horizon);
  throw baton::InvalidArgument("kl_ctrl.type '" + options.type +
                              "' is not a KL controller; known: fixed, adaptive");
}

}  // namespace baton::algos
