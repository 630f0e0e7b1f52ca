#include "workers/roles/agent_loop.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <utility>

#include "base/errors.h"
#include "workers/tools/tool_registry.h"

namespace baton::workers {
namespace {

using detail::cat;

// Where each UTF-8 character of `text` starts (continuation bytes are
// 10xxxxxx).
std::vector<size_t> char_starts(const std::string& text) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) starts.push_back(i);
  return starts;
}

// A marker no template writes: the assistant content whose surroundings are
// the template's text around a turn.
constexpr const char* kMarker = "\x01" "baton-assistant-turn" "\x01";

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::string truncate_tool_response(const std::string& text, int64_t max_chars,
                                   const std::string& side) {
  if (side != "left" && side != "right" && side != "middle")
    throw InvalidArgument(cat("multi_turn.tool_response_truncate_side must be left, right or "
                              "middle, got '", side, "'"));
  const std::vector<size_t> starts = char_starts(text);
  const int64_t n = static_cast<int64_t>(starts.size());
  if (max_chars < 0 || n <= max_chars) return text;
  auto at = [&](int64_t c) { return c >= n ? text.size() : starts[static_cast<size_t>(c)]; };
  if (side == "left") return text.substr(0, at(max_chars)) + "...(truncated)";
  if (side == "right") return "(truncated)..." + text.substr(at(n - max_chars));
  const int64_t head = max_chars / 2, tail = max_chars - head;
  return text.substr(0, at(head)) + "\n...(truncated)...\n" + text.substr(at(n - tail));
}

// A counting semaphore over the turns whose tools run at once.
struct ToolAgentLoop::Slots {
  std::mutex mutex;
  std::condition_variable freed;
  int64_t free = 0;
  void acquire() {
    std::unique_lock lock(mutex);
    freed.wait(lock, [&] { return free > 0; });
    --free;
  }
  void release() {
    {
      std::lock_guard lock(mutex);
      ++free;
    }
    freed.notify_one();
  }
};

ToolAgentLoop::ToolAgentLoop(const data::Tokenizer& tokenizer, const data::ChatTemplate& chat,
                             std::vector<tools::ConfiguredTool> tools, MultiTurnOptions options,
                             std::vector<nlohmann::json> tools_kwargs,
                             const std::vector<ConfiguredInteraction>& interactions,
                             const std::vector<nlohmann::json>& interaction_kwargs)
    : tokenizer_(tokenizer),
      chat_(chat),
      tools_(std::move(tools)),
      options_(std::move(options)),
      tools_kwargs_(std::move(tools_kwargs)),
      template_tools_(tools::tool_schemas_for_template(tools_)),
      slots_(std::make_unique<Slots>()) {
  if (options_.threads < 1)
    throw InvalidArgument(cat("ToolAgentLoop: threads must be >= 1, got ", options_.threads));
  if (options_.max_parallel_calls < 1)
    throw InvalidArgument(cat("multi_turn.max_parallel_calls must be >= 1, got ",
                              options_.max_parallel_calls));
  // Checks the side once, before any turn.
  truncate_tool_response("", 0, options_.tool_response_truncate_side);
  slots_->free = options_.threads;
  // Each row's interaction: named by its interaction_kwargs, or the only one.
  interactions_.resize(interaction_kwargs.size());
  for (size_t i = 0; i < interaction_kwargs.size(); ++i) {
    const nlohmann::json& row = interaction_kwargs[i];
    if (row.is_null()) continue;
    const std::string where = cat("interaction_kwargs of prompt row ", i);
    if (!row.is_object()) throw InvalidArgument(cat(where, " must be an object, got ", row.dump()));
    if (interactions.empty())
      throw InvalidArgument(cat(where, ": no interaction is configured (set "
                                       "multi_turn.interaction_config_path)"));
    std::string name;
    if (const auto n = row.find("name"); n != row.end()) {
      if (!n->is_string()) throw InvalidArgument(cat(where, ": 'name' must be a string"));
      name = n->get<std::string>();
    } else if (interactions.size() == 1) {
      name = interactions[0].name;
    }
    std::string names;
    for (const auto& c : interactions) names += (names.empty() ? "" : ", ") + c.name;
    const auto c = std::find_if(interactions.begin(), interactions.end(),
                                [&](const ConfiguredInteraction& x) { return x.name == name; });
    if (c == interactions.end())
      throw InvalidArgument(cat(where, ": ",
                                name.empty() ? std::string("no 'name' to choose an interaction")
                                             : "no interaction named '" + name + "'",
                                "; the configured ones are: ", names));
    RowInteraction r;
    r.name = c->name;
    r.fn = &find_interaction(c->class_name);
    r.kwargs = c->config.is_object() ? c->config : nlohmann::json::object();
    for (const auto& [key, value] : row.items())
      if (key != "name") r.kwargs[key] = value;
    interactions_[i] = std::move(r);
  }
}

ToolAgentLoop::~ToolAgentLoop() = default;

TurnMetrics ToolAgentLoop::metrics(int64_t request, int64_t sample) const {
  std::lock_guard lock(mutex_);
  const auto it = metrics_.find({request, sample});
  return it == metrics_.end() ? TurnMetrics{} : it->second;
}

std::vector<int64_t> ToolAgentLoop::turn_tokens(const nlohmann::ordered_json& messages,
                                                int64_t stop_token) const {
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "?"}}, {{"role", "assistant"}, {"content", kMarker}}});
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (!template_tools_.empty()) extra["tools"] = template_tools_;
  const std::string before = chat_.render(conversation, false, extra);
  for (const auto& m : messages) conversation.push_back(m);
  const std::string after = chat_.render(conversation, true, extra);
  if (after.compare(0, before.size(), before) != 0)
    throw Error(
        "ToolAgentLoop: the chat template renders a conversation with tool or user messages that "
        "does not begin with the same conversation without them; the turn's tokens cannot be "
        "appended to a trajectory");
  // What the template writes after the assistant's content: its end-of-turn
  // token (the stop token the model generated) and what follows it.
  const size_t marker = before.rfind(kMarker);
  std::string behind = before.substr(marker + std::string(kMarker).size());
  const std::string stop_text =
      tokenizer_.decode({static_cast<int32_t>(stop_token)}, /*skip_special_tokens=*/false);
  if (!stop_text.empty() && behind.compare(0, stop_text.size(), stop_text) == 0)
    behind.erase(0, stop_text.size());
  const std::vector<int32_t> ids =
      tokenizer_.encode(behind + after.substr(before.size()), /*add_special_tokens=*/false);
  return {ids.begin(), ids.end()};
}

bool ToolAgentLoop::interacts(int64_t request) const {
  return request < static_cast<int64_t>(interactions_.size()) &&
         interactions_[static_cast<size_t>(request)].has_value();
}

void ToolAgentLoop::record(std::pair<int64_t, int64_t> key, const nlohmann::ordered_json& messages) {
  if (!interacts(key.first)) return;
  std::lock_guard lock(mutex_);
  nlohmann::ordered_json& kept = messages_[key];
  if (kept.is_null()) kept = nlohmann::ordered_json::array();
  for (const auto& m : messages) kept.push_back(m);
}

std::optional<std::shared_future<std::vector<int64_t>>> ToolAgentLoop::on_stop(
    const engine::GeneratedSequence& seq) {
  if (options_.max_assistant_turns > 0 && seq.turns >= options_.max_assistant_turns)
    return std::nullopt;
  // This turn's tokens: those after the last appended one.
  size_t start = 0;
  for (size_t i = seq.generated_mask.size(); i > 0; --i)
    if (seq.generated_mask[i - 1] == 0) {
      start = i;
      break;
    }
  const std::vector<int32_t> turn(seq.response.begin() + static_cast<std::ptrdiff_t>(start),
                                  seq.response.end());
  tools::ToolCallParse parsed =
      tools::parse_tool_calls(tokenizer_.decode(turn, /*skip_special_tokens=*/false),
                              options_.format);
  const int64_t stop_token = seq.response.back();
  const int64_t request = seq.request, sample = seq.sample;
  const bool calls = !parsed.calls.empty() || !parsed.errors.empty();
  if (!calls && !interacts(request)) return std::nullopt;
  std::string text;
  if (interacts(request)) {
    text = tokenizer_.decode(turn, /*skip_special_tokens=*/true);
    record({request, sample},
           nlohmann::ordered_json::array({{{"role", "assistant"}, {"content", text}}}));
  }
  if (!calls) {
    std::lock_guard lock(mutex_);
    if (options_.max_user_turns > 0 &&
        metrics_[{request, sample}].user_turns >= options_.max_user_turns)
      return std::nullopt;
  }
  // Tools and interactions run on the pool, never on the engine's thread.
  auto on_pool = [this](auto work) {
    return std::async(std::launch::async,
                      [this, work = std::move(work)]() mutable {
                        slots_->acquire();
                        struct Release {
                          Slots& s;
                          ~Release() { s.release(); }
                        } release{*slots_};
                        return work();
                      })
        .share();
  };
  if (calls)
    return on_pool([this, request, sample, stop_token, calls = std::move(parsed.calls),
                    errors = std::move(parsed.errors)]() mutable {
      return run_turn(request, sample, std::move(calls), std::move(errors), stop_token);
    });
  return on_pool([this, request, sample, stop_token, text = std::move(text)]() mutable {
    return run_interaction(request, sample, std::move(text), stop_token);
  });
}

std::vector<int64_t> ToolAgentLoop::run_interaction(int64_t request, int64_t sample,
                                                    std::string response, int64_t stop_token) {
  const RowInteraction& row = *interactions_[static_cast<size_t>(request)];
  const std::pair key{request, sample};
  nlohmann::ordered_json messages;
  int64_t user_turns = 0;
  {
    std::lock_guard lock(mutex_);
    messages = messages_[key];
    user_turns = metrics_[key].user_turns;
  }
  InteractionReply reply;
  try {
    reply = (*row.fn)(InteractionInput{row.kwargs, response, messages, user_turns});
  } catch (const std::exception& e) {
    throw Error(cat("interaction '", row.name, "' failed: ", e.what()));
  }
  std::vector<int64_t> tokens;
  if (!reply.terminate) {
    const nlohmann::ordered_json user =
        nlohmann::ordered_json::array({{{"role", "user"}, {"content", reply.text}}});
    tokens = turn_tokens(user, stop_token);
    record(key, user);
  }
  std::lock_guard lock(mutex_);
  TurnMetrics& m = metrics_[key];
  m.turn_scores.push_back(reply.reward);
  if (!reply.terminate) ++m.user_turns;
  return tokens;  // none: the trajectory ends
}

std::vector<int64_t> ToolAgentLoop::run_turn(int64_t request, int64_t sample,
                                             std::vector<tools::ParsedToolCall> calls,
                                             std::vector<std::string> parse_errors,
                                             int64_t stop_token) {
  const auto start = std::chrono::steady_clock::now();
  TurnMetrics turn;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  auto tool_message = [&](const std::string& text) {
    messages.push_back(
        {{"role", "tool"},
         {"content", truncate_tool_response(text, options_.max_tool_response_length,
                                            options_.tool_response_truncate_side)}});
  };
  for (const std::string& e : parse_errors) {
    ++turn.tool_errors;
    tool_message("Error: a malformed tool call: " + e);
  }
  const nlohmann::json* row_kwargs =
      request < static_cast<int64_t>(tools_kwargs_.size()) ? &tools_kwargs_[request] : nullptr;
  for (size_t c = 0; c < calls.size(); ++c) {
    const tools::ParsedToolCall& call = calls[c];
    ++turn.tool_calls;
    if (static_cast<int64_t>(c) >= options_.max_parallel_calls) {
      ++turn.tool_errors;
      tool_message(cat("Error: at most ", options_.max_parallel_calls,
                       " tool call(s) per turn; '", call.name, "' was not run"));
      continue;
    }
    const auto tool = std::find_if(tools_.begin(), tools_.end(),
                                   [&](const tools::ConfiguredTool& t) { return t.name == call.name; });
    if (tool == tools_.end()) {
      std::string names;
      for (const auto& t : tools_) names += (names.empty() ? "" : ", ") + t.name;
      ++turn.tool_errors;
      tool_message(cat("Error: no tool named '", call.name, "'; the tools are: ", names));
      continue;
    }
    // The tool's config, overridden key by key by the row's tools_kwargs.
    nlohmann::json kwargs = tool->config.is_object() ? tool->config : nlohmann::json::object();
    if (row_kwargs && row_kwargs->is_object()) {
      const auto mine = row_kwargs->find(call.name);
      if (mine != row_kwargs->end() && mine->is_object()) kwargs.update(*mine);
    }
    const tools::ToolResult r = tools::call_tool(call.name, call.arguments, kwargs);
    if (r.error) ++turn.tool_errors;
    if (r.reward) turn.tool_rewards.push_back(*r.reward);
    tool_message(r.text);
  }
  std::vector<int64_t> tokens = turn_tokens(messages, stop_token);
  turn.tool_time_s = seconds_since(start);
  record({request, sample}, messages);
  std::lock_guard lock(mutex_);
  TurnMetrics& m = metrics_[{request, sample}];
  m.tool_calls += turn.tool_calls;
  m.tool_errors += turn.tool_errors;
  m.tool_time_s += turn.tool_time_s;
  m.tool_rewards.insert(m.tool_rewards.end(), turn.tool_rewards.begin(), turn.tool_rewards.end());
  return tokens;
}

std::unique_ptr<AgentLoopResources> AgentLoopResources::load(
    const MultiTurnRolloutOptions& options) {
  data::Tokenizer tokenizer = [&] {
    try {
      return data::Tokenizer::load(options.tokenizer_path);
    } catch (const std::exception& e) {
      throw Error(cat("multi_turn: the tokenizer of ", options.tokenizer_path,
                      " does not load: ", e.what()));
    }
  }();
  data::ChatTemplate chat = data::ChatTemplate::from_tokenizer(
      tokenizer, (std::filesystem::path(options.tokenizer_path) / "tokenizer_config.json").string());
  if (!chat.has_template())
    throw Error(cat("multi_turn: the tokenizer of ", options.tokenizer_path,
                    " has no chat template, which renders the tool turns"));
  MultiTurnOptions loop;
  loop.max_assistant_turns = options.max_assistant_turns;
  loop.max_parallel_calls = options.max_parallel_calls;
  loop.max_tool_response_length = options.max_tool_response_length;
  loop.tool_response_truncate_side = options.tool_response_truncate_side;
  loop.format = tools::parse_tool_call_format(options.format);
  loop.max_user_turns = options.max_user_turns;
  std::vector<ConfiguredInteraction> interactions;
  if (!options.interaction_config_path.empty())
    interactions = load_interaction_config(options.interaction_config_path);
  std::vector<tools::ConfiguredTool> tool_list;
  if (!options.tool_config_path.empty()) tool_list = tools::load_tool_config(options.tool_config_path);
  auto r = std::unique_ptr<AgentLoopResources>(new AgentLoopResources{
      std::move(tokenizer), std::move(chat), std::move(tool_list), loop, std::move(interactions)});
  // A template that cannot render a tool or user turn fails here, not
  // mid-rollout.
  const auto eos = r->tokenizer.eos_id();
  ToolAgentLoop probe(r->tokenizer, r->chat, r->tools, r->options);
  probe.turn_tokens(nlohmann::ordered_json::array({{{"role", "tool"}, {"content", "0"}}}),
                    eos ? *eos : 0);
  if (!r->interactions.empty())
    probe.turn_tokens(nlohmann::ordered_json::array({{{"role", "user"}, {"content", "0"}}}),
                      eos ? *eos : 0);
  return r;
}

namespace {

// Each row's extra_info[field] (an object), `fallback` where absent.
std::vector<nlohmann::json> extra_info_objects(const DataProto& prompts, const char* field,
                                               const nlohmann::json& fallback,
                                               const char* meaning) {
  std::vector<nlohmann::json> out(static_cast<size_t>(prompts.size()), fallback);
  if (!prompts.has_column("extra_info")) return out;
  const List& extras = prompts.column("extra_info");
  for (size_t i = 0; i < extras.size() && i < out.size(); ++i) {
    if (extras[i].kind() != ValueKind::kString) continue;
    nlohmann::json extra;
    try {
      extra = nlohmann::json::parse(extras[i].as_string());
    } catch (const nlohmann::json::exception& e) {
      throw Error(cat("multi_turn: extra_info of prompt row ", i, " is not JSON: ", e.what()));
    }
    if (!extra.is_object() || !extra.contains(field)) continue;
    const nlohmann::json& value = extra[field];
    if (value.is_null()) continue;
    if (!value.is_object())
      throw Error(cat("multi_turn: extra_info.", field, " of prompt row ", i, " must be an object ",
                      meaning, ", got ", value.dump()));
    out[i] = value;
  }
  return out;
}

}  // namespace

std::vector<nlohmann::json> tools_kwargs_of(const DataProto& prompts) {
  return extra_info_objects(prompts, "tools_kwargs", nlohmann::json::object(),
                            "of per-tool settings");
}

std::vector<nlohmann::json> interaction_kwargs_of(const DataProto& prompts) {
  return extra_info_objects(prompts, "interaction_kwargs", nullptr,
                            "(the interaction's name and settings)");
}

void add_multi_turn_columns(DataProto& out, const std::vector<engine::GeneratedSequence>& seqs,
                            const ToolAgentLoop& loop) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  at::Tensor turns = at::zeros({n}, at::kFloat), calls = at::zeros({n}, at::kFloat),
             errors = at::zeros({n}, at::kFloat), seconds = at::zeros({n}, at::kFloat),
             user_turns = at::zeros({n}, at::kFloat);
  List scores;
  scores.reserve(seqs.size());
  for (int64_t i = 0; i < n; ++i) {
    const engine::GeneratedSequence& s = seqs[static_cast<size_t>(i)];
    const TurnMetrics m = loop.metrics(s.request, s.sample);
    turns[i] = static_cast<float>(s.turns);
    calls[i] = static_cast<float>(m.tool_calls);
    errors[i] = static_cast<float>(m.tool_errors);
    seconds[i] = static_cast<float>(m.tool_time_s);
    user_turns[i] = static_cast<float>(m.user_turns);
    std::string text =
        nlohmann::json{{"tool_rewards", m.tool_rewards}, {"turn_scores", m.turn_scores}}.dump();
    scores.emplace_back(std::move(text));
  }
  out.set_tensor("multi_turn_turns", turns);
  out.set_tensor("multi_turn_tool_calls", calls);
  out.set_tensor("multi_turn_tool_errors", errors);
  out.set_tensor("multi_turn_tool_time_s", seconds);
  out.set_tensor("multi_turn_user_turns", user_turns);
  out.set_column("rollout_reward_scores", std::move(scores));
}

}  // namespace baton::workers
