// An ActorRolloutRefWorker with rollout.multi_turn on, in 2 DP worker
// processes on the tiny Qwen2 fixture, with a ChatML tokenizer of its own
// (tests/workers/chatml_tokenizer.h) and verl's tool config file offering the
// calculator: init_model loads them, generate_sequences runs the tool agent
// loop and returns each row's multi_turn_* figures; a config naming a tool
// nobody registered fails init_model naming it.
//
// The random fixture writes no tool call, so every tool trajectory here is
// one turn: the rows of tool turns themselves are the engine's and the loop's
// tests (multi_turn_generation_test, agent_loop_test, agent_loop_qwen_test).
// An interaction answers every turn, though: with every printable character a
// stop token, rows with interaction_kwargs run their user turns in the
// workers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/atomic_file.h"
#include "dispatch/data_proto.h"
#include "runtime/baton.h"
#include "tests/workers/chatml_tokenizer.h"
#include "workers/roles/actor_rollout_ref_worker.h"
#include "workers/roles/rollout_worker.h"

namespace baton::workers {
namespace {

namespace fs = std::filesystem;

const std::string kModel = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen2";

struct Files {
  fs::path dir = fs::temp_directory_path() / ("baton_multi_turn_" + std::to_string(::getpid()));
  Files() {
    baton::remove_tree(dir);
    test::write_chatml_tokenizer(dir / "tokenizer");
    std::ofstream(dir / "tools.yaml") << R"(tools:
  - class_name: "verl.tools.calculator.Calculator"
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calculator
        description: Exact arithmetic.
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
)";
    std::ofstream(dir / "interaction.yaml") << R"(interaction:
  - name: judge
    class_name: verl.interactions.answer_check
    config: {reward_function: exact_match, feedback: "no"}
)";
    std::ofstream(dir / "unknown.yaml") << R"(tools:
  - tool_schema: {type: function, function: {name: web_search, parameters: {type: object}}}
)";
  }
  ~Files() { baton::remove_tree(dir); }
};

ActorRolloutRefOptions options(const Files& f, const std::string& tool_config) {
  ActorRolloutRefOptions o;
  o.model.path = kModel;
  o.rollout.response_length = 6;
  o.rollout.multi_turn.enable = true;
  o.rollout.multi_turn.tool_config_path = (f.dir / tool_config).string();
  o.rollout.multi_turn.tokenizer_path = (f.dir / "tokenizer").string();
  return o;
}

DataProto prompts() {
  at::Tensor ids =
      at::tensor({0, 0, 5, 9, 0, 3, 4, 7, 11, 12, 13, 14, 0, 0, 0, 42}, at::kLong).view({4, 4});
  DataProto d;
  d.set_tensor("input_ids", ids);
  d.set_tensor("attention_mask", (ids != 0).to(at::kLong));
  d.set_tensor("request_seed", at::tensor({11, 22, 33, 44}, at::kLong));
  d.set_meta("n", Value(int64_t{2}));
  d.set_meta("temperature", Value(1.0));
  return d;
}

TEST(MultiTurnWorker, TwoDpWorkersRunTheToolLoopAndReportEachRowsTurns) {
  Files f;
  ResourcePool pool = ResourcePool::cpu(2);
  WorkerGroup g = WorkerGroup::spawn(actor_rollout_ref_worker_class(), pool,
                                     {options(f, "tools.yaml").to_json()});
  g.call("init_model", {}).get();
  const DataProto out = g.call("generate_sequences", {prompts()}).get().as<DataProto>();
  ASSERT_EQ(out.size(), 8);
  for (const char* key : {"multi_turn_turns", "multi_turn_tool_calls", "multi_turn_tool_errors",
                          "multi_turn_tool_time_s"}) {
    ASSERT_TRUE(out.has_tensor(key)) << key;
    EXPECT_EQ(out.tensor(key).sizes(), (at::IntArrayRef{8})) << key;
  }
  EXPECT_TRUE(at::equal(out.tensor("multi_turn_turns"), at::ones({8}, at::kFloat)));
  EXPECT_EQ(out.tensor("multi_turn_tool_calls").sum().item<float>(), 0.0f);
  // One turn each: the response mask is the response's attention.
  EXPECT_TRUE(at::equal(out.tensor("attention_mask").slice(1, 4), out.tensor("response_mask")));
}

// Rows 0 and 2 are judged by the interaction (a ground truth no sample
// writes): each of their samples gets max_user_turns "no" user turns, so
// three assistant turns; rows 1 and 3 end at their first stop. `worker_class`
// is spawned on 2 CPU workers with `init_args`.
void expect_interaction_turns(const char* worker_class, const Files& f, bool rollout_worker) {
  ActorRolloutRefOptions o = options(f, "tools.yaml");
  o.rollout.multi_turn.tool_config_path.clear();
  o.rollout.multi_turn.interaction_config_path = (f.dir / "interaction.yaml").string();
  o.rollout.multi_turn.max_user_turns = 2;
  o.rollout.response_length = 96;
  ResourcePool pool = ResourcePool::cpu(2);
  List init_args = {Value(o.to_json())};
  if (rollout_worker) init_args.emplace_back(int64_t{1});  // the actor's world size
  WorkerGroup g = WorkerGroup::spawn(worker_class, pool, init_args);
  g.call("init_model", {}).get();
  DataProto in = prompts();
  const Value judged(std::string(R"({"interaction_kwargs": {"ground_truth": "zzz"}})"));
  in.set_column("extra_info", {judged, Value(), judged, Value()});
  // Every printable character (ids 4..100 of the ChatML tokenizer) stops a turn.
  List stops;
  for (int64_t id = 4; id <= 100; ++id) stops.emplace_back(id);
  in.set_meta("stop_token_ids", Value(std::move(stops)));
  const DataProto out = g.call("generate_sequences", {in}).get().as<DataProto>();
  ASSERT_EQ(out.size(), 8);
  // The user turn's tokens: "<|im_end|>\n<|im_start|>user\nno<|im_end|>\n<|im_start|>assistant\n".
  const int64_t user_turn_tokens = 23;
  for (int64_t row = 0; row < 8; ++row) {
    const bool judged_row = (row / 2) % 2 == 0;  // n = 2: rows 0,1 are prompt 0's samples
    SCOPED_TRACE("row " + std::to_string(row));
    EXPECT_EQ(out.tensor("multi_turn_user_turns")[row].item<float>(), judged_row ? 2.0f : 0.0f);
    EXPECT_EQ(out.tensor("multi_turn_turns")[row].item<float>(), judged_row ? 3.0f : 1.0f);
    const at::Tensor mask = out.tensor("response_mask")[row];
    const at::Tensor attention = out.tensor("attention_mask")[row].slice(0, 4);
    EXPECT_EQ((attention - mask).sum().item<int64_t>(), judged_row ? 2 * user_turn_tokens : 0)
        << "the user turns' tokens are never trained";
    const nlohmann::json scores =
        nlohmann::json::parse(out.column("rollout_reward_scores")[static_cast<size_t>(row)].as_string());
    EXPECT_EQ(scores["turn_scores"],
              judged_row ? nlohmann::json({0.0, 0.0}) : nlohmann::json::array());
  }
}

TEST(MultiTurnWorker, AnInteractionsUserTurnsRunInTheWorkers) {
  Files f;
  expect_interaction_turns(actor_rollout_ref_worker_class(), f, false);
}

// Fully-async training's separate rollout workers run the same loop.
TEST(MultiTurnWorker, RolloutWorkersRunTheAgentLoopToo) {
  Files f;
  expect_interaction_turns(rollout_worker_class(), f, true);
}

TEST(MultiTurnWorker, AToolConfigNamingAnUnregisteredToolFailsInitModel) {
  Files f;
  ResourcePool pool = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn(actor_rollout_ref_worker_class(), pool,
                                     {options(f, "unknown.yaml").to_json()});
  try {
    g.call("init_model", {}).get();
    FAIL() << "init_model accepted a tool nobody registered";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("web_search"), std::string::npos) << what;
    EXPECT_NE(what.find("unknown.yaml"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace baton::workers
