#include "workers/role_options.h"

#include <nlohmann/json.hpp>

#include "runtime/errors.h"

namespace baton::workers {
namespace {

using nlohmann::json;

// Reads j[key] into `field` when present (a missing key keeps the default);
// a value of the wrong type names the key.
template <typename T>
void read(const json& j, const char* key, T& field, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return;
  try {
    field = it->get<T>();
  } catch (const json::exception& e) {
    throw Error(where + "." + key + ": " + e.what());
  }
}

const json& section(const json& j, const char* key, const std::string& where) {
  static const json empty = json::object();
  auto it = j.find(key);
  if (it == j.end()) return empty;
  if (!it->is_object()) throw Error(where + "." + key + ": expected an object");
  return *it;
}

json to_j(const ModelOptions& m) {
  return {{"path", m.path}, {"value_model", m.value_model}, {"tp", m.tp},
          {"pp", m.pp},     {"vocab_divisible_by", m.vocab_divisible_by}, {"seed", m.seed},
          {"dtype", m.dtype}};
}
void from_j(const json& j, ModelOptions& m, const std::string& w) {
  read(j, "path", m.path, w);
  read(j, "value_model", m.value_model, w);
  read(j, "tp", m.tp, w);
  read(j, "pp", m.pp, w);
  read(j, "vocab_divisible_by", m.vocab_divisible_by, w);
  read(j, "seed", m.seed, w);
  read(j, "dtype", m.dtype, w);
}

json to_j(const OptimOptions& o) {
  return {{"lr", o.lr},           {"weight_decay", o.weight_decay}, {"beta1", o.beta1},
          {"beta2", o.beta2},     {"warmup_steps", o.warmup_steps}, {"scheduler", o.scheduler},
          {"min_lr_ratio", o.min_lr_ratio}, {"total_steps", o.total_steps},
          {"grad_clip", o.grad_clip},       {"distributed", o.distributed}};
}
void from_j(const json& j, OptimOptions& o, const std::string& w) {
  read(j, "lr", o.lr, w);
  read(j, "weight_decay", o.weight_decay, w);
  read(j, "beta1", o.beta1, w);
  read(j, "beta2", o.beta2, w);
  read(j, "warmup_steps", o.warmup_steps, w);
  read(j, "scheduler", o.scheduler, w);
  read(j, "min_lr_ratio", o.min_lr_ratio, w);
  read(j, "total_steps", o.total_steps, w);
  read(j, "grad_clip", o.grad_clip, w);
  read(j, "distributed", o.distributed, w);
}

json to_j(const UpdateOptions& u) {
  return {{"mini_batch_size", u.mini_batch_size}, {"micro_batch_size", u.micro_batch_size},
          {"epochs", u.epochs},   {"shuffle", u.shuffle}, {"loss_agg_mode", u.loss_agg_mode},
          {"seed", u.seed}};
}
void from_j(const json& j, UpdateOptions& u, const std::string& w) {
  read(j, "mini_batch_size", u.mini_batch_size, w);
  read(j, "micro_batch_size", u.micro_batch_size, w);
  read(j, "epochs", u.epochs, w);
  read(j, "shuffle", u.shuffle, w);
  read(j, "loss_agg_mode", u.loss_agg_mode, w);
  read(j, "seed", u.seed, w);
}

json to_j(const PolicyOptions& p) {
  return {{"loss_mode", p.loss_mode},       {"clip_ratio", p.clip_ratio},
          {"clip_ratio_low", p.clip_ratio_low}, {"clip_ratio_high", p.clip_ratio_high},
          {"clip_ratio_c", p.clip_ratio_c}, {"clip_cov_ratio", p.clip_cov_ratio},
          {"clip_cov_lb", p.clip_cov_lb},   {"clip_cov_ub", p.clip_cov_ub},
          {"kl_cov_ratio", p.kl_cov_ratio}, {"ppo_kl_coef", p.ppo_kl_coef},
          {"entropy_coeff", p.entropy_coeff}, {"use_kl_loss", p.use_kl_loss},
          {"kl_loss_coef", p.kl_loss_coef}, {"kl_loss_type", p.kl_loss_type}};
}
void from_j(const json& j, PolicyOptions& p, const std::string& w) {
  read(j, "loss_mode", p.loss_mode, w);
  read(j, "clip_ratio", p.clip_ratio, w);
  read(j, "clip_ratio_low", p.clip_ratio_low, w);
  read(j, "clip_ratio_high", p.clip_ratio_high, w);
  read(j, "clip_ratio_c", p.clip_ratio_c, w);
  read(j, "clip_cov_ratio", p.clip_cov_ratio, w);
  read(j, "clip_cov_lb", p.clip_cov_lb, w);
  read(j, "clip_cov_ub", p.clip_cov_ub, w);
  read(j, "kl_cov_ratio", p.kl_cov_ratio, w);
  read(j, "ppo_kl_coef", p.ppo_kl_coef, w);
  read(j, "entropy_coeff", p.entropy_coeff, w);
  read(j, "use_kl_loss", p.use_kl_loss, w);
  read(j, "kl_loss_coef", p.kl_loss_coef, w);
  read(j, "kl_loss_type", p.kl_loss_type, w);
}

json to_j(const RolloutOptions& r) {
  return {{"tp", r.tp},
          {"response_length", r.response_length},
          {"max_batch", r.max_batch},
          {"cache_bytes", r.cache_bytes},
          {"packed_cpu_steps", r.packed_cpu_steps},
          {"log_prob_micro_batch_size", r.log_prob_micro_batch_size}};
}
void from_j(const json& j, RolloutOptions& r, const std::string& w) {
  read(j, "tp", r.tp, w);
  read(j, "response_length", r.response_length, w);
  read(j, "max_batch", r.max_batch, w);
  read(j, "cache_bytes", r.cache_bytes, w);
  read(j, "packed_cpu_steps", r.packed_cpu_steps, w);
  read(j, "log_prob_micro_batch_size", r.log_prob_micro_batch_size, w);
}

json parse(const std::string& text, const char* what) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) throw Error(std::string(what) + ": expected a JSON object");
    return j;
  } catch (const json::exception& e) {
    throw Error(std::string(what) + ": malformed JSON: " + e.what());
  }
}

}  // namespace

std::string ActorRolloutRefOptions::to_json() const {
  json j = {{"model", to_j(model)},   {"optim", to_j(optim)},     {"update", to_j(update)},
            {"policy", to_j(policy)}, {"rollout", to_j(rollout)}, {"actor", actor},
            {"ref", ref},             {"ref_dtype", ref_dtype}};
  return j.dump();
}

ActorRolloutRefOptions ActorRolloutRefOptions::from_json(const std::string& text) {
  const std::string w = "ActorRolloutRefOptions";
  json j = parse(text, w.c_str());
  ActorRolloutRefOptions o;
  from_j(section(j, "model", w), o.model, w + ".model");
  from_j(section(j, "optim", w), o.optim, w + ".optim");
  from_j(section(j, "update", w), o.update, w + ".update");
  from_j(section(j, "policy", w), o.policy, w + ".policy");
  from_j(section(j, "rollout", w), o.rollout, w + ".rollout");
  read(j, "actor", o.actor, w);
  read(j, "ref", o.ref, w);
  read(j, "ref_dtype", o.ref_dtype, w);
  return o;
}

std::string CriticOptions::to_json() const {
  json j = {{"model", to_j(model)},
            {"optim", to_j(optim)},
            {"update", to_j(update)},
            {"cliprange_value", cliprange_value},
            {"forward_micro_batch_size", forward_micro_batch_size}};
  return j.dump();
}

CriticOptions CriticOptions::from_json(const std::string& text) {
  const std::string w = "CriticOptions";
  json j = parse(text, w.c_str());
  CriticOptions o;
  from_j(section(j, "model", w), o.model, w + ".model");
  from_j(section(j, "optim", w), o.optim, w + ".optim");
  from_j(section(j, "update", w), o.update, w + ".update");
  read(j, "cliprange_value", o.cliprange_value, w);
  read(j, "forward_micro_batch_size", o.forward_micro_batch_size, w);
  return o;
}

std::string RewardModelOptions::to_json() const {
  json j = {{"model", to_j(model)}, {"micro_batch_size", micro_batch_size}};
  return j.dump();
}

RewardModelOptions RewardModelOptions::from_json(const std::string& text) {
  const std::string w = "RewardModelOptions";
  json j = parse(text, w.c_str());
  RewardModelOptions o;
  from_j(section(j, "model", w), o.model, w + ".model");
  read(j, "micro_batch_size", o.micro_batch_size, w);
  return o;
}

}  // namespace baton::workers
