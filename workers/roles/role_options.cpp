#include "workers/roles/role_options.h"

#include <nlohmann/json.hpp>

#include <string>
#include <type_traits>
#include <vector>

#include "base/errors.h"

namespace baton::workers {
namespace {

using nlohmann::json;

// Each struct's fields are listed once, in `fields(o, f)`, which calls
// f(key, field) for every field; writing and reading both walk that list, so
// a field cannot travel one way and not the other. A member added to a struct
// in role_options.h must be added to its list (the round-trip test of
// tests/workers/role_options_test.cpp sets every field).

template <typename O, typename F>
void fields(O& o, F&& f) requires std::is_same_v<std::remove_const_t<O>, OffloadOptions> {
  f("params", o.params);
  f("grads", o.grads);
  f("optimizer", o.optimizer);
}

template <typename O, typename F>
void fields(O& l, F&& f) requires std::is_same_v<std::remove_const_t<O>, engine::LoraOptions> {
  f("rank", l.rank);
  f("alpha", l.alpha);
  f("targets", l.targets);
  f("seed", l.seed);
}

template <typename O, typename F>
void fields(O& m, F&& f) requires std::is_same_v<std::remove_const_t<O>, ModelOptions> {
  f("path", m.path);
  f("value_model", m.value_model);
  f("tp", m.tp);
  f("pp", m.pp);
  f("ep", m.ep);
  f("vocab_divisible_by", m.vocab_divisible_by);
  f("seed", m.seed);
  f("dtype", m.dtype);
  f("offload", m.offload);
  f("sequence_parallel", m.sequence_parallel);
  f("recompute_activations", m.recompute_activations);
  f("fused_lm_head", m.fused_lm_head);
  f("lora", m.lora);
  f("lora_adapter_path", m.lora_adapter_path);
  f("collective_timeout_ms", m.collective_timeout_ms);
}

template <typename O, typename F>
void fields(O& o, F&& f) requires std::is_same_v<std::remove_const_t<O>, OptimOptions> {
  f("lr", o.lr);
  f("weight_decay", o.weight_decay);
  f("beta1", o.beta1);
  f("beta2", o.beta2);
  f("warmup_steps", o.warmup_steps);
  f("scheduler", o.scheduler);
  f("min_lr_ratio", o.min_lr_ratio);
  f("total_steps", o.total_steps);
  f("grad_clip", o.grad_clip);
  f("distributed", o.distributed);
  f("overlap_grad_reduce", o.overlap_grad_reduce);
  f("bucket_bytes", o.bucket_bytes);
}

template <typename O, typename F>
void fields(O& u, F&& f) requires std::is_same_v<std::remove_const_t<O>, UpdateOptions> {
  f("mini_batch_size", u.mini_batch_size);
  f("micro_batch_size", u.micro_batch_size);
  f("max_token_len", u.max_token_len);
  f("epochs", u.epochs);
  f("shuffle", u.shuffle);
  f("loss_agg_mode", u.loss_agg_mode);
  f("loss_scale_factor", u.loss_scale_factor);
  f("seed", u.seed);
}

template <typename O, typename F>
void fields(O& p, F&& f) requires std::is_same_v<std::remove_const_t<O>, PolicyOptions> {
  f("loss_mode", p.loss_mode);
  f("clip_ratio", p.clip_ratio);
  f("clip_ratio_low", p.clip_ratio_low);
  f("clip_ratio_high", p.clip_ratio_high);
  f("clip_ratio_c", p.clip_ratio_c);
  f("clip_cov_ratio", p.clip_cov_ratio);
  f("clip_cov_lb", p.clip_cov_lb);
  f("clip_cov_ub", p.clip_cov_ub);
  f("kl_cov_ratio", p.kl_cov_ratio);
  f("ppo_kl_coef", p.ppo_kl_coef);
  f("tau_pos", p.tau_pos);
  f("tau_neg", p.tau_neg);
  f("dro_beta", p.dro_beta);
  f("entropy_coeff", p.entropy_coeff);
  f("use_kl_loss", p.use_kl_loss);
  f("kl_loss_coef", p.kl_loss_coef);
  f("kl_loss_type", p.kl_loss_type);
}

template <typename O, typename F>
void fields(O& m, F&& f) requires std::is_same_v<std::remove_const_t<O>, MultiTurnRolloutOptions> {
  f("enable", m.enable);
  f("tool_config_path", m.tool_config_path);
  f("interaction_config_path", m.interaction_config_path);
  f("tokenizer_path", m.tokenizer_path);
  f("format", m.format);
  f("max_assistant_turns", m.max_assistant_turns);
  f("max_user_turns", m.max_user_turns);
  f("max_parallel_calls", m.max_parallel_calls);
  f("max_tool_response_length", m.max_tool_response_length);
  f("tool_response_truncate_side", m.tool_response_truncate_side);
}

template <typename O, typename F>
void fields(O& r, F&& f) requires std::is_same_v<std::remove_const_t<O>, RolloutOptions> {
  f("tp", r.tp);
  f("response_length", r.response_length);
  f("max_batch", r.max_batch);
  f("cache_bytes", r.cache_bytes);
  f("gpu_memory_utilization", r.gpu_memory_utilization);
  f("free_cache_engine", r.free_cache_engine);
  f("packed_cpu_steps", r.packed_cpu_steps);
  f("device_decode_steps", r.device_decode_steps);
  f("cuda_graphs", r.cuda_graphs);
  f("log_prob_micro_batch_size", r.log_prob_micro_batch_size);
  f("log_prob_max_token_len", r.log_prob_max_token_len);
  f("multi_turn", r.multi_turn);
}

template <typename O, typename F>
void fields(O& o, F&& f) requires std::is_same_v<std::remove_const_t<O>, ActorRolloutRefOptions> {
  f("model", o.model);
  f("optim", o.optim);
  f("update", o.update);
  f("policy", o.policy);
  f("rollout", o.rollout);
  f("actor", o.actor);
  f("ref", o.ref);
  f("ref_dtype", o.ref_dtype);
  f("ref_log_prob_micro_batch_size", o.ref_log_prob_micro_batch_size);
  f("ref_log_prob_max_token_len", o.ref_log_prob_max_token_len);
  f("ref_param_offload", o.ref_param_offload);
}

template <typename O, typename F>
void fields(O& o, F&& f) requires std::is_same_v<std::remove_const_t<O>, CriticOptions> {
  f("model", o.model);
  f("optim", o.optim);
  f("update", o.update);
  f("cliprange_value", o.cliprange_value);
  f("forward_micro_batch_size", o.forward_micro_batch_size);
  f("forward_max_token_len", o.forward_max_token_len);
}

template <typename O, typename F>
void fields(O& o, F&& f) requires std::is_same_v<std::remove_const_t<O>, RewardModelOptions> {
  f("model", o.model);
  f("micro_batch_size", o.micro_batch_size);
  f("max_token_len", o.max_token_len);
}

// A scalar, a string or a list of strings travels as itself, an empty
// optional as null, a struct as an object of its fields.
template <typename T>
constexpr bool kLeaf = std::is_arithmetic_v<T> || std::is_same_v<T, std::string> ||
                       std::is_same_v<T, std::vector<std::string>>;

template <typename T>
json write(const T& value) {
  if constexpr (kLeaf<T>) {
    return value;
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    return value ? json(*value) : json(nullptr);
  } else {
    json j = json::object();
    fields(value, [&](const char* key, const auto& field) { j[key] = write(field); });
    return j;
  }
}

// Reads every field of `out` from `j`; a missing key, an unknown key or a
// value of the wrong type throws naming its path (`where.key`).
template <typename T>
void read(const json& j, T& out, const std::string& where) {
  if constexpr (std::is_same_v<T, std::optional<double>>) {
    if (j.is_null()) {
      out.reset();
    } else {
      double x = 0;
      read(j, x, where);
      out = x;
    }
  } else if constexpr (kLeaf<T>) {
    try {
      out = j.get<T>();
    } catch (const json::exception& e) {
      throw Error(where + ": " + e.what());
    }
  } else {
    if (!j.is_object()) throw Error(where + ": expected an object, got " + j.dump());
    size_t known = 0;
    fields(out, [&](const char* key, auto& field) {
      auto it = j.find(key);
      if (it == j.end()) throw Error(where + "." + key + ": missing");
      read(*it, field, where + "." + key);
      ++known;
    });
    if (known != j.size()) {
      for (const auto& [key, value] : j.items()) {
        bool found = false;
        fields(out, [&](const char* k, auto&) { found = found || key == k; });
        if (!found) throw Error(where + "." + key + ": not an option of " + where);
      }
    }
  }
}

template <typename T>
T parse(const std::string& text, const char* what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(std::string(what) + ": malformed JSON: " + e.what());
  }
  T out;
  read(j, out, what);
  return out;
}

}  // namespace

std::string ActorRolloutRefOptions::to_json() const { return write(*this).dump(); }
ActorRolloutRefOptions ActorRolloutRefOptions::from_json(const std::string& text) {
  return parse<ActorRolloutRefOptions>(text, "ActorRolloutRefOptions");
}

std::string CriticOptions::to_json() const { return write(*this).dump(); }
CriticOptions CriticOptions::from_json(const std::string& text) {
  return parse<CriticOptions>(text, "CriticOptions");
}

std::string RewardModelOptions::to_json() const { return write(*this).dump(); }
RewardModelOptions RewardModelOptions::from_json(const std::string& text) {
  return parse<RewardModelOptions>(text, "RewardModelOptions");
}

}  // namespace baton::workers
