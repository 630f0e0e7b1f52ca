#include "trainer/config/config_validation.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "trainer/step_profiler.h"

namespace baton::trainer {
namespace {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// Reads keys, recording every problem instead of stopping at the first.
class Checker {
 public:
  explicit Checker(const Config& config) : config_(config) {}

  void problem(std::string message) { problems_.push_back(std::move(message)); }
  const std::vector<std::string>& problems() const { return problems_; }

  // A non-null value of type T, or nullopt (a problem is recorded).
  template <typename T>
  std::optional<T> read(const std::string& key) {
    try {
      return config_.get<T>(key);
    } catch (const ConfigError& e) {
      problem(e.what());
      return std::nullopt;
    }
  }
  // A value of type T or null; `ok` is false when a problem was recorded.
  template <typename T>
  std::optional<T> read_nullable(const std::string& key, bool& ok) {
    try {
      ok = true;
      return config_.get_optional<T>(key);
    } catch (const ConfigError& e) {
      problem(e.what());
      ok = false;
      return std::nullopt;
    }
  }

  // An int ≥ minimum, or nullopt.
  std::optional<int64_t> at_least(const std::string& key, int64_t minimum) {
    const auto value = read<int64_t>(key);
    if (value && *value < minimum) {
      problem(cat(key, " = ", *value, " must be >= ", minimum));
      return std::nullopt;
    }
    return value;
  }
  // Null, or an int ≥ 1. nullopt for null or a problem.
  std::optional<int64_t> positive_or_null(const std::string& key) {
    bool ok = true;
    const auto value = read_nullable<int64_t>(key, ok);
    if (value && *value < 1) {
      problem(cat(key, " = ", *value, " must be >= 1 (or null)"));
      return std::nullopt;
    }
    return value;
  }
  double number(const std::string& key, double fallback) {
    return read<double>(key).value_or(fallback);
  }
  // A string among `choices`, or nullopt.
  std::optional<std::string> one_of(const std::string& key,
                                    std::initializer_list<const char*> choices) {
    const auto value = read<std::string>(key);
    if (!value) return std::nullopt;
    if (std::none_of(choices.begin(), choices.end(), [&](const char* c) { return *value == c; })) {
      std::string list;
      for (const char* c : choices) list += cat(list.empty() ? "" : ", ", c);
      problem(cat(key, " = '", *value, "' is not one of: ", list));
      return std::nullopt;
    }
    return value;
  }

 private:
  const Config& config_;
  std::vector<std::string> problems_;
};

constexpr std::initializer_list<const char*> kLossAggModes = {
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
    "seq-mean-token-sum-norm"};
constexpr std::initializer_list<const char*> kKlKinds = {
    "kl",  "k1",  "abs",  "mse",  "k2",  "low_var_kl",  "k3",
    "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"};

constexpr std::initializer_list<const char*> kDtypes = {"float32", "bfloat16"};

// A model layout: TP × PP over the world; returns its DP size, or nullopt.
// `per_node` (set when the workers span several nodes): a TP group must stay
// within one, as WorkerGroup::spawn requires.
std::optional<int64_t> check_layout(Checker& c, std::optional<int64_t> world,
                                    const std::string& role, const std::string& tp_key,
                                    const std::string& pp_key,
                                    std::optional<int64_t> per_node = std::nullopt) {
  const auto tp = c.at_least(tp_key, 1);
  const auto pp = pp_key.empty() ? std::optional<int64_t>(1) : c.at_least(pp_key, 1);
  if (per_node && tp && *per_node % *tp != 0)
    c.problem(cat(tp_key, " = ", *tp, " does not divide trainer.n_gpus_per_node = ", *per_node,
                  ": the ", role, "'s tensor-parallel groups would span two nodes"));
  if (!world || !tp || !pp) return std::nullopt;
  const int64_t model = *tp * *pp;
  if (*world % model != 0) {
    const std::string sizes =
        pp_key.empty() ? cat(tp_key, " = ", *tp)
                       : cat(tp_key, " x ", pp_key, " = ", *tp, " x ", *pp, " = ", model);
    c.problem(cat("the ", role,
                  " layout does not fit the workers: trainer.nnodes x "
                  "trainer.n_gpus_per_node = ",
                  *world, " is not divisible by ", sizes));
    return std::nullopt;
  }
  return *world / model;
}

// optim.*: a learning rate >= 0, Adam's betas in [0, 1), ratios in [0, 1].
void check_optim(Checker& c, const std::string& prefix) {
  if (c.number(prefix + ".lr", 0) < 0) c.problem(prefix + ".lr must be >= 0");
  if (const auto betas = c.read<std::vector<double>>(prefix + ".betas")) {
    const bool ok = betas->size() == 2 && std::all_of(betas->begin(), betas->end(),
                                                      [](double b) { return b >= 0 && b < 1; });
    if (!ok) c.problem(prefix + ".betas must be two numbers in [0, 1), like [0.9, 0.999]");
  }
  c.at_least(prefix + ".lr_warmup_steps", -1);
  for (const char* ratio : {".lr_warmup_steps_ratio", ".min_lr_ratio"}) {
    const double value = c.number(prefix + ratio, 0);
    if (value < 0 || value > 1) c.problem(cat(prefix, ratio, " = ", value, " must be in [0, 1]"));
  }
  c.one_of(prefix + ".lr_scheduler_type", {"constant", "cosine"});
}

// Mini- and micro-batches of one trained role over its DP ranks.
void check_update_batches(Checker& c, const std::string& role, std::optional<int64_t> train_batch,
                          std::optional<int64_t> n, std::optional<int64_t> dp,
                          const std::string& mini_key, const std::string& micro_key) {
  const auto mini = c.at_least(mini_key, 1);
  const auto micro = c.positive_or_null(micro_key);
  if (!mini || !train_batch) return;
  if (*mini <= *train_batch && *train_batch % *mini != 0) {
    c.problem(cat("data.train_batch_size = ", *train_batch, " is not divisible by ", mini_key,
                  " = ", *mini, " (the ", role, "'s mini-batches must split the batch evenly)"));
    return;
  }
  if (!n || !dp) return;
  // A mini-batch larger than the batch is capped at the batch.
  const int64_t effective = std::min(*mini, *train_batch);
  const int64_t sequences = effective * *n;
  if (sequences % *dp != 0) {
    c.problem(cat(mini_key, " x actor_rollout_ref.rollout.n = ", effective, " x ", *n, " = ",
                  sequences, " sequences per mini-batch do not split evenly over the ", role, "'s ",
                  *dp, " data-parallel ranks"));
    return;
  }
  const int64_t local = sequences / *dp;
  if (micro && local % *micro != 0)
    c.problem(cat("the ", role, "'s ", local, " sequences per mini-batch and rank (", mini_key,
                  " x rollout.n / DP = ", sequences, " / ", *dp, ") are not divisible by ",
                  micro_key, " = ", *micro));
}

}  // namespace

bool critic_enabled(const Config& config) {
  if (auto enable = config.get_optional<bool>("critic.enable")) return *enable;
  return config.get<std::string>("algorithm.adv_estimator") == "gae";
}

namespace {

// What the layout checks found, for the batch checks that need it (empty
// where a key was missing or malformed: that is reported already).
struct Layouts {
  std::optional<int64_t> actor_dp, rollout_dp, critic_dp;
  bool has_critic = false;
};

// Workers and layouts: nodes and slots, each role's TP x PP over the world.
Layouts check_workers_and_layouts(Checker& c, const Config& config) {
  Layouts l;
  const auto nnodes = c.at_least("trainer.nnodes", 1);
  const auto per_node = c.at_least("trainer.n_gpus_per_node", 1);
  const std::optional<int64_t> world =
      nnodes && per_node ? std::optional<int64_t>(*nnodes * *per_node) : std::nullopt;
  if (nnodes && *nnodes > 1 && config.is_null("trainer.cluster_listen"))
    c.problem(cat("trainer.nnodes = ", *nnodes,
                  " needs node agents: set trainer.cluster_listen to the host:port where the "
                  "driver waits for them (`baton-agent --driver HOST:PORT` on every node)"));
  if (!config.is_null("trainer.cluster_listen") &&
      config.get_optional<bool>("async_training.enable").value_or(false))
    c.problem(
        "trainer.cluster_listen: the fully-async trainer runs on one machine only "
        "(set async_training.enable = false to use node agents)");
  // Several nodes: every TP group within one.
  const std::optional<int64_t> node_size =
      nnodes && *nnodes > 1 ? per_node : std::optional<int64_t>();
  l.actor_dp =
      check_layout(c, world, "actor", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
                   "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size", node_size);
  // The reference policy is a frozen copy in the actor's processes: its layout is the actor's.
  for (const char* size : {"tensor_model_parallel_size", "pipeline_model_parallel_size"}) {
    const std::string ref = cat("actor_rollout_ref.ref.megatron.", size);
    const std::string act = cat("actor_rollout_ref.actor.megatron.", size);
    const auto r = c.read<int64_t>(ref), a = c.read<int64_t>(act);
    if (r && a && *r != *a)
      c.problem(cat(ref, " = ", *r, " differs from ", act, " = ", *a,
                    "; the reference policy runs in the actor's layout (set them equal)"));
  }
  l.rollout_dp = check_layout(
      c, world, "rollout", "actor_rollout_ref.rollout.tensor_model_parallel_size", "", node_size);

  try {
    l.has_critic = critic_enabled(config);
  } catch (const ConfigError& e) {
    c.problem(e.what());
  }
  if (l.has_critic)
    l.critic_dp = check_layout(c, world, "critic", "critic.megatron.tensor_model_parallel_size",
                               "critic.megatron.pipeline_model_parallel_size", node_size);
  if (c.read<bool>("reward_model.enable").value_or(false))
    check_layout(c, world, "reward model", "reward_model.megatron.tensor_model_parallel_size",
                 "reward_model.megatron.pipeline_model_parallel_size", node_size);

  return l;
}

// Batches: sizes, dynamic batch budgets, mini- and micro-batches per rank.
void check_batches(Checker& c, const Layouts& l) {
  const auto train_batch = c.at_least("data.train_batch_size", 1);
  const auto n = c.at_least("actor_rollout_ref.rollout.n", 1);
  c.positive_or_null("data.val_batch_size");
  c.at_least("actor_rollout_ref.rollout.val_kwargs.n", 1);
  c.at_least("data.max_prompt_length", 1);
  c.at_least("data.max_response_length", 1);
  c.at_least("actor_rollout_ref.actor.ppo_epochs", 1);
  c.positive_or_null("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu");
  c.positive_or_null("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu");
  // Dynamic batch sizes: a packed micro-batch holds whole sequences, so its
  // budget must hold the longest one.
  const auto longest = [&]() -> std::optional<int64_t> {
    const auto p = c.read<int64_t>("data.max_prompt_length");
    const auto r = c.read<int64_t>("data.max_response_length");
    if (!p || !r) return std::nullopt;
    return *p + *r;
  }();
  auto check_dynamic = [&](const std::string& switch_key, const std::string& max_key) {
    const auto max_tokens = c.at_least(max_key, 1);
    if (!c.read<bool>(switch_key).value_or(false)) return;
    if (max_tokens && longest && *max_tokens < *longest)
      c.problem(cat(max_key, " = ", *max_tokens, " cannot hold a sequence of ", *longest,
                    " tokens (data.max_prompt_length + data.max_response_length) with ", switch_key,
                    " = true"));
  };
  check_dynamic("actor_rollout_ref.actor.use_dynamic_bsz",
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu");
  check_dynamic("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu");
  check_dynamic("actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu");
  check_update_batches(c, "actor", train_batch, n, l.actor_dp,
                       "actor_rollout_ref.actor.ppo_mini_batch_size",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu");
  if (l.has_critic) {
    c.at_least("critic.ppo_epochs", 1);
    check_update_batches(c, "critic", train_batch, n, l.critic_dp, "critic.ppo_mini_batch_size",
                         "critic.ppo_micro_batch_size_per_gpu");
    check_dynamic("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu");
    check_dynamic("critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu");
  }
  if (c.read<bool>("reward_model.enable").value_or(false))
    check_dynamic("reward_model.use_dynamic_bsz", "reward_model.forward_max_token_len_per_gpu");
  if (train_batch && n && l.rollout_dp && (*train_batch * *n) % *l.rollout_dp != 0)
    c.problem(cat("data.train_batch_size x actor_rollout_ref.rollout.n = ", *train_batch, " x ", *n,
                  " = ", *train_batch * *n, " sequences do not split evenly over the rollout's ",
                  *l.rollout_dp,
                  " data-parallel ranks (trainer.nnodes x trainer.n_gpus_per_node / "
                  "actor_rollout_ref.rollout.tensor_model_parallel_size)"));
}

// Choices and ranges: names from fixed sets, dtypes, optimizers, losses, KL,
// sampling.
void check_choices_and_ranges(Checker& c, const Config& config, bool has_critic) {
  c.one_of("data.truncation", {"error", "left", "right", "middle"});
  c.one_of("actor_rollout_ref.actor.strategy", {"megatron"});
  c.one_of("actor_rollout_ref.actor.loss_agg_mode", kLossAggModes);
  c.one_of("actor_rollout_ref.actor.kl_loss_type", kKlKinds);
  const auto actor_dtype = c.one_of("actor_rollout_ref.actor.megatron.dtype", kDtypes);
  c.one_of("actor_rollout_ref.ref.megatron.dtype", kDtypes);
  // The rollout generates with the actor's parameters (the HybridEngine
  // shares or reshards them): its dtype is theirs.
  if (const auto rollout_dtype = c.one_of("actor_rollout_ref.rollout.dtype", kDtypes);
      rollout_dtype && actor_dtype && *rollout_dtype != *actor_dtype)
    c.problem(cat("actor_rollout_ref.rollout.dtype = '", *rollout_dtype,
                  "' differs from actor_rollout_ref.actor.megatron.dtype = '", *actor_dtype,
                  "'; the rollout generates with the actor's parameters (set them equal)"));
  check_optim(c, "actor_rollout_ref.actor.optim");
  if (c.read<std::string>("actor_rollout_ref.actor.policy_loss.loss_mode").value_or("") ==
          "vanilla" &&
      c.number("actor_rollout_ref.actor.clip_ratio_c", 3.0) <= 1.0)
    c.problem(cat("actor_rollout_ref.actor.clip_ratio_c = ",
                  c.number("actor_rollout_ref.actor.clip_ratio_c", 3.0),
                  " must be > 1 (the dual-clip bound of the vanilla policy loss)"));
  if (has_critic) {
    c.one_of("critic.strategy", {"megatron"});
    c.one_of("critic.loss_agg_mode", kLossAggModes);
    c.one_of("critic.megatron.dtype", kDtypes);
    check_optim(c, "critic.optim");
  } else if (!config.is_null("critic.enable") &&
             c.read<std::string>("algorithm.adv_estimator").value_or("") == "gae") {
    c.problem("algorithm.adv_estimator = gae needs a critic, but critic.enable = false");
  }
  c.one_of("algorithm.kl_penalty", kKlKinds);
  if (c.one_of("algorithm.kl_ctrl.type", {"fixed", "adaptive"}).value_or("") == "adaptive") {
    if (c.number("algorithm.kl_ctrl.horizon", 1) <= 0)
      c.problem("algorithm.kl_ctrl.horizon must be > 0 with algorithm.kl_ctrl.type = adaptive");
    if (c.number("algorithm.kl_ctrl.target_kl", 1) <= 0)
      c.problem("algorithm.kl_ctrl.target_kl must be > 0 with algorithm.kl_ctrl.type = adaptive");
  }
  if (c.number("actor_rollout_ref.rollout.temperature", 1.0) < 0)
    c.problem("actor_rollout_ref.rollout.temperature must be >= 0 (0 is greedy)");
  const double top_p = c.number("actor_rollout_ref.rollout.top_p", 1.0);
  if (!(top_p > 0 && top_p <= 1))
    c.problem(cat("actor_rollout_ref.rollout.top_p = ", top_p, " must be in (0, 1]"));
  c.at_least("actor_rollout_ref.rollout.top_k", -1);
  c.one_of("reward_model.reward_manager", {"naive"});
}

// The run: epochs, steps, frequencies, logging, devices, resume.
void check_run(Checker& c) {
  c.at_least("trainer.total_epochs", 1);
  c.positive_or_null("trainer.total_training_steps");
  c.at_least("trainer.critic_warmup", 0);
  c.read<int64_t>("trainer.save_freq");
  c.read<int64_t>("trainer.test_freq");
  c.read<bool>("trainer.val_before_train");
  c.read<std::string>("trainer.default_local_dir");
  c.at_least("trainer.log_max_bytes", 1);
  c.at_least("trainer.log_backup_count", 0);
  c.at_least("trainer.collective_timeout_s", 1);
  c.one_of("trainer.device", {"cpu", "cuda"});
  if (c.one_of("trainer.resume_mode", {"auto", "disable", "resume_path"}).value_or("") ==
      "resume_path") {
    bool ok = true;
    if (!c.read_nullable<std::string>("trainer.resume_from_path", ok) && ok)
      c.problem("trainer.resume_mode = resume_path needs trainer.resume_from_path");
  }
  if (const auto loggers = c.read<std::vector<std::string>>("trainer.logger"))
    for (const auto& logger : *loggers)
      if (logger != "console" && logger != "file")
        c.problem(cat("trainer.logger has '", logger, "'; the loggers are console and file"));
}

}  // namespace

void validate_ppo_config(const Config& config) {
  Checker c(config);
  const Layouts layouts = check_workers_and_layouts(c, config);
  check_batches(c, layouts);
  check_choices_and_ranges(c, config, layouts.has_critic);
  check_run(c);
  for (std::string& p : profiler_config_problems(config)) c.problem(std::move(p));

  if (!c.problems().empty()) {
    std::string message = "the config cannot be used:";
    for (const auto& p : c.problems()) message += "\n  - " + p;
    throw ConfigError(message);
  }
}

}  // namespace baton::trainer
