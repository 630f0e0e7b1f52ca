#include "workers/roles/interaction.h"

#include <map>
#include <utility>

#include "base/errors.h"
#include "base/registry.h"
#include "workers/rewards/reward_registry.h"
#include "workers/tools/tool_config.h"

namespace baton::workers {
namespace {

using detail::cat;

constexpr const char* kIncorrect =
    "Your response is incorrect! You need to reflect on your answer and try again.";

std::string text_of(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// verl's Gsm8kInteraction, with the reward function a setting.
InteractionReply answer_check(const InteractionInput& in) {
  const std::string fn_name = in.kwargs.value("reward_function", std::string("gsm8k"));
  const auto truth = in.kwargs.find("ground_truth");
  if (truth == in.kwargs.end() || truth->is_null())
    throw InvalidArgument(
        "interaction answer_check: no ground_truth in the row's interaction_kwargs");
  const std::string ground_truth = text_of(*truth);
  rewards::RewardInput input;
  input.data_source = fn_name;
  input.response = in.response;
  input.ground_truth = ground_truth;
  const double score = rewards::find_reward_function(fn_name)(input);
  InteractionReply reply;
  reply.reward = score;
  reply.terminate = score >= in.kwargs.value("pass_score", 1.0);
  if (!reply.terminate) reply.text = in.kwargs.value("feedback", std::string(kIncorrect));
  return reply;
}

Registry<InteractionFunction>& interactions() {
  static Registry<InteractionFunction>* registry = [] {
    // A built-in here, not with BATON_INTERACTION: a static registration in
    // a static library is dropped when nothing else in its object is used.
    auto* r = new Registry<InteractionFunction>(
        "interaction", "register your own with BATON_INTERACTION or register_interaction");
    r->add("answer_check", answer_check);
    return r;
  }();
  return *registry;
}

// `entry`'s string `key`; "" when absent. `where` prefixes errors.
std::string string_key(const nlohmann::ordered_json& entry, const char* key,
                       const std::string& where) {
  const auto it = entry.find(key);
  if (it == entry.end() || it->is_null()) return "";
  if (!it->is_string()) throw InvalidArgument(cat(where, ": '", key, "' must be a string"));
  return it->get<std::string>();
}

}  // namespace

void register_interaction(std::string name, InteractionFunction fn) {
  if (name.empty()) throw InvalidArgument("register_interaction: the interaction's name is empty");
  if (!fn) throw InvalidArgument("register_interaction: empty function for '" + name + "'");
  interactions().add(std::move(name), std::move(fn));
}

const InteractionFunction& find_interaction(std::string_view name) {
  return interactions().get(name);
}

std::vector<std::string> interaction_names() { return interactions().names(); }

std::vector<ConfiguredInteraction> load_interaction_config(const std::filesystem::path& path) {
  const std::string file = path.string();
  const nlohmann::ordered_json root = tools::read_yaml_file(path, "the interaction config");
  const std::string format_hint =
      "an interaction config is a mapping whose 'interaction' lists entries with name, "
      "class_name and config (verl's format)";
  if (!root.is_object()) throw InvalidArgument(cat(file, ": ", format_hint));
  const auto list = root.find("interaction");
  if (list == root.end()) throw InvalidArgument(cat(file, ": missing 'interaction' (", format_hint, ")"));
  if (list->is_null()) return {};
  if (!list->is_array())
    throw InvalidArgument(cat(file, ": 'interaction' must be a list (", format_hint, ")"));
  std::vector<ConfiguredInteraction> out;
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::ordered_json& entry = (*list)[i];
    const std::string where = cat(file, ": interaction[", i, "]");
    if (!entry.is_object())
      throw InvalidArgument(cat(where, ": an entry must be a mapping with name, class_name and config"));
    ConfiguredInteraction c;
    c.name = string_key(entry, "name", where);
    c.class_name = string_key(entry, "class_name", where);
    if (c.name.empty()) throw InvalidArgument(cat(where, ": missing 'name' (what rows select it by)"));
    if (c.class_name.empty())
      throw InvalidArgument(cat(where, ": missing 'class_name' (a registered interaction)"));
    if (!interactions().find(c.class_name)) {
      const size_t dot = c.class_name.rfind('.');
      const std::string last = dot == std::string::npos ? c.class_name : c.class_name.substr(dot + 1);
      try {
        interactions().get(last);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(cat(where, ": 'class_name': ", e.what()));
      }
      c.class_name = last;
    }
    c.config = nlohmann::json::object();
    if (const auto config = entry.find("config"); config != entry.end() && !config->is_null()) {
      if (!config->is_object())
        throw InvalidArgument(cat(where, ": 'config' must be a mapping of the interaction's settings"));
      c.config = *config;
    }
    if (const auto [it, added] = index_of.emplace(c.name, i); !added)
      throw InvalidArgument(cat(where, ": 'name': interaction '", c.name,
                                "' is listed twice (also interaction[", it->second, "])"));
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace baton::workers
