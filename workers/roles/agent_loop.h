// The tool agent loop of a multi-turn rollout (verl's ToolAgentLoop): the
// engine::TurnHandler that GenerationEngine::generate asks at the end of every
// assistant turn what follows it.
//
// At a turn's end (a stop token), on the engine's thread:
//   - the turn's text (its tokens since the last appended ones, decoded with
//     their special tokens) is parsed for tool calls in `format` (hermes,
//     llama3_json; workers/tools/tool_call_parser.h);
//   - once max_assistant_turns turns are done, the trajectory ends;
//   - calls (or malformed calls) run on a pool (at most `threads` turns at
//     once), while the engine goes on decoding the other sequences: each call
//     on the configured tool of its name with the tool's config merged with
//     the row's tools_kwargs[name]; a malformed call, an unknown tool, a call
//     past max_parallel_calls and a tool's failure each give an error text
//     shown to the model in place of a result (counted in tool_errors); each
//     result's text is cut to max_tool_response_length characters
//     (tool_response_truncate_side: left keeps the start, right the end,
//     middle both ends with "..." between: verl's), and the turn's results
//     become `tool` messages;
//   - no call: a row with an interaction (workers/roles/interaction.h; its
//     extra_info's interaction_kwargs) asks it, on the pool, what follows,
//     until it has given max_user_turns user turns: it ends the trajectory
//     or its text becomes a `user` message; the turn's reward is recorded
//     either way. A row without one ends here (the final answer).
// The messages are rendered by the chat template, then the next assistant
// prefix (add_generation_prompt): the tokens the engine appends.
//
// Those tokens are the template's own text between the model's stop token
// and the next assistant turn: rendered once for a conversation ending with an
// assistant message, once with the new messages and the generation prompt
// after it; what the second adds, after the text the first puts behind the
// assistant's stop token (Qwen's "\n" after <|im_end|>), is encoded with the
// tokenizer (special tokens as written). Nothing already generated is
// re-tokenised: the trajectory is the generated tokens plus these.
//
// Example (inside a rollout worker's generate):
//   ToolAgentLoop loop(tokenizer, chat, tools::load_tool_config(path), options,
//                      tools_kwargs_of(prompts));
//   auto seqs = engine.generate(req.prompts, req.params, req.seeds, {}, &loop);
//   TurnMetrics m = loop.metrics(seqs[0].request, seqs[0].sample);
//
// Thread safety: on_stop is called by the engine's one thread; the tool and
// interaction runs and metrics() are safe from any thread.
#pragma once

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatch/data_proto.h"
#include "engine/rollout/generation.h"
#include "text/chat_template.h"
#include "text/tokenizer/tokenizer.h"
#include "workers/roles/interaction.h"
#include "workers/roles/role_options.h"
#include "workers/tools/tool_call_parser.h"
#include "workers/tools/tool_config.h"

namespace baton::workers {

// verl's actor_rollout_ref.rollout.multi_turn keys (those the loop reads).
struct MultiTurnOptions {
  int64_t max_assistant_turns = 0;        // 0: no limit but the response budget
  int64_t max_user_turns = 0;             // an interaction's turns; 0: no limit
  int64_t max_parallel_calls = 1;         // calls run per turn; the rest are errors
  int64_t max_tool_response_length = 256;  // characters of each result shown
  std::string tool_response_truncate_side = "middle";  // left | right | middle
  tools::ToolCallFormat format = tools::ToolCallFormat::kHermes;
  int64_t threads = 8;  // turns whose tools run at once
};

// What one trajectory did (verl's multi_turn metrics, per row).
// (Its assistant turns are the GeneratedSequence's `turns`.)
struct TurnMetrics {
  int64_t tool_calls = 0;
  int64_t tool_errors = 0;
  double tool_time_s = 0;
  std::vector<double> tool_rewards;  // each scoring call's reward contribution (verl's)
  int64_t user_turns = 0;            // the interaction's user turns
  std::vector<double> turn_scores;   // the interaction's reward of each turn it judged (verl's)
};

// `text` cut to `max_chars` characters from `side` (left: keep the start;
// right: keep the end; middle: both ends around "..."), verl's truncation.
// Counts UTF-8 characters and never splits one. Throws baton::InvalidArgument
// for another side.
std::string truncate_tool_response(const std::string& text, int64_t max_chars,
                                   const std::string& side);

class ToolAgentLoop final : public engine::TurnHandler {
 public:
  // `tools`: the configured tools (load_tool_config); their schemas go to the
  // template as `tools`. `tools_kwargs`: per request of the generate call,
  // a JSON object of per-tool settings ({} for none). `interactions`: the
  // configured ones (load_interaction_config); `interaction_kwargs`: per
  // request, its extra_info's interaction_kwargs (null for none). The
  // tokenizer and template must outlive the loop. Throws
  // baton::InvalidArgument naming the request for interaction_kwargs that
  // are not an object, name no configured interaction (or name none of
  // several), or come with no interaction configured.
  ToolAgentLoop(const data::Tokenizer& tokenizer, const data::ChatTemplate& chat,
                std::vector<tools::ConfiguredTool> tools, MultiTurnOptions options,
                std::vector<nlohmann::json> tools_kwargs = {},
                const std::vector<ConfiguredInteraction>& interactions = {},
                const std::vector<nlohmann::json>& interaction_kwargs = {});
  ~ToolAgentLoop() override;

  std::optional<std::shared_future<std::vector<int64_t>>> on_stop(
      const engine::GeneratedSequence& seq) override;

  // The metrics of (request, sample) so far; a row that never stopped has
  // turns 1 and nothing else.
  TurnMetrics metrics(int64_t request, int64_t sample) const;

  // The tokens a turn with these (tool or user) messages appends after the
  // model's stop token `stop_token` (see the header comment). Throws
  // baton::Error when the template renders a conversation with the messages
  // that does not begin with the same conversation without them.
  std::vector<int64_t> turn_tokens(const nlohmann::ordered_json& messages,
                                   int64_t stop_token) const;

 private:
  struct RowInteraction {
    std::string name;  // the configured name
    const InteractionFunction* fn = nullptr;
    nlohmann::json kwargs;  // config merged with the row's interaction_kwargs
  };

  std::vector<int64_t> run_turn(int64_t request, int64_t sample,
                                std::vector<tools::ParsedToolCall> calls,
                                std::vector<std::string> parse_errors, int64_t stop_token);
  std::vector<int64_t> run_interaction(int64_t request, int64_t sample, std::string response,
                                       int64_t stop_token);
  bool interacts(int64_t request) const;  // the row has an interaction
  // Appends `messages` to the trajectory's (kept only for rows with one).
  void record(std::pair<int64_t, int64_t> key, const nlohmann::ordered_json& messages);

  const data::Tokenizer& tokenizer_;
  const data::ChatTemplate& chat_;
  std::vector<tools::ConfiguredTool> tools_;
  MultiTurnOptions options_;
  std::vector<nlohmann::json> tools_kwargs_;
  nlohmann::ordered_json template_tools_;
  std::vector<std::optional<RowInteraction>> interactions_;  // per request

  struct Slots;  // the pool's bound on turns at once
  std::unique_ptr<Slots> slots_;
  mutable std::mutex mutex_;
  std::map<std::pair<int64_t, int64_t>, TurnMetrics> metrics_;
  std::map<std::pair<int64_t, int64_t>, nlohmann::ordered_json> messages_;
};

// What a rollout worker loads once for multi-turn rollouts
// (MultiTurnRolloutOptions): the tokenizer and chat template of
// tokenizer_path, the tools of tool_config_path, the interactions of
// interaction_config_path, the loop's options.
struct AgentLoopResources {
  data::Tokenizer tokenizer;
  data::ChatTemplate chat;
  std::vector<tools::ConfiguredTool> tools;
  MultiTurnOptions options;
  std::vector<ConfiguredInteraction> interactions;

  // Throws baton::Error naming the file for a tokenizer, template, tool or
  // interaction config that does not load, a template that cannot render
  // tool or user turns, and an unknown format or truncation side.
  static std::unique_ptr<AgentLoopResources> load(const MultiTurnRolloutOptions& options);
};

// Each prompt row's tools_kwargs, where verl's datasets put them: the
// `tools_kwargs` object of the row's `extra_info` column (JSON text); {} for a
// row without one, or a batch without the column. Throws baton::Error naming
// the row for extra_info that is not JSON or tools_kwargs that is not an
// object.
std::vector<nlohmann::json> tools_kwargs_of(const DataProto& prompts);

// Each prompt row's interaction_kwargs (the object of that name in its
// extra_info; null for a row without one). Errors as tools_kwargs_of.
std::vector<nlohmann::json> interaction_kwargs_of(const DataProto& prompts);

// Adds each row's multi-turn figures to a rollout's result (rows as `seqs`,
// the order rollout_result writes them): multi_turn_turns,
// multi_turn_tool_calls, multi_turn_tool_errors, multi_turn_tool_time_s,
// multi_turn_user_turns, [N] float (the trainer logs them as multi_turn/*),
// and the string column rollout_reward_scores: JSON {"tool_rewards": [...],
// "turn_scores": [...]}, which the reward manager passes to the reward
// function in extra_info (verl's).
void add_multi_turn_columns(DataProto& out, const std::vector<engine::GeneratedSequence>& seqs,
                            const ToolAgentLoop& loop);

}  // namespace baton::workers
