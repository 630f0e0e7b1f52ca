// global_profiler end to end: three GRPO steps of the toy task on two worker
// processes with step 2 profiled write one trace, step_2.json, in which the
// driver and both workers have a track, spans nest, every worker span of a
// call lies inside the driver's span of it, the trainer's phases and the
// engine's forward/backward, optimizer, reshard and generation appear, and
// nothing lies outside step 2.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/engine/temp_dir.h"
#include "tests/runtime/trace_checks.h"
#include "trainer/config/config.h"
#include "trainer/ppo_trainer.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;
using engine::testing::TempDir;

constexpr int64_t kDriverPid = 1;

TEST(StepProfiler, AProfiledStepWritesATraceOfEveryProcessWithNestedAlignedSpans) {
  TempDir toy, out;
  const std::string cmd = std::string("'") + TOY_TASK_EXE + "' --out '" + toy.path().string() +
                          "' --val-size 16 >/dev/null 2>&1";
  const int raw = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 0) << cmd;
  Config c = Config::load(fs::path(BATON_CONFIGS_DIR) / "grpo_toy.yaml");
  c.apply_overrides({
      "data.train_files=[" + toy.path().string() + "/data/train.jsonl]",
      "data.val_files=[" + toy.path().string() + "/data/val.jsonl]",
      "actor_rollout_ref.model.path=" + toy.path().string() + "/model",
      "trainer.default_local_dir=" + out.path().string(),
      "trainer.n_gpus_per_node=2",
      "data.train_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
      "actor_rollout_ref.rollout.n=2",
      "trainer.total_training_steps=3",
      "trainer.val_before_train=false",
      "trainer.test_freq=-1",
      "trainer.logger=[file]",
      "global_profiler.steps=[2]",
  });
  PpoTrainer trainer(c);
  EXPECT_EQ(trainer.fit().steps, 3);

  // One file, the profiled step's, under <default_local_dir>/profile.
  const fs::path dir = out.path() / "profile";
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  ASSERT_EQ(files, std::vector<std::string>{"step_2.json"});
  std::ifstream in(dir / "step_2.json");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const baton::testing::ParsedTrace t = baton::testing::parse_trace(text);
  EXPECT_EQ(t.other["step"], 2);

  // A track for the driver and each worker process (their pids follow the
  // order in which this test binary's driver started workers).
  std::set<std::string> names;
  std::vector<int64_t> worker_pids;
  for (const auto& [pid, name] : t.processes) {
    names.insert(name);
    if (pid != kDriverPid) worker_pids.push_back(pid);
  }
  EXPECT_EQ(t.processes.at(kDriverPid), "driver");
  EXPECT_EQ(names, (std::set<std::string>{"driver", "ActorRolloutRefWorker:rank 0",
                                          "ActorRolloutRefWorker:rank 1"}));
  ASSERT_EQ(worker_pids.size(), 2u);
  baton::testing::expect_spans_nest(t);
  EXPECT_GE(baton::testing::expect_calls_contain_worker_spans(t, kDriverPid), 2 * 2 * 3)
      << "generate, old log-probs and the update on both ranks, at least";

  // Everything lies within the one step span, step 2's.
  const baton::testing::TraceSpan* step = nullptr;
  for (const auto& s : t.spans) {
    if (s.cat != "trainer" || s.name.rfind("step ", 0) != 0) continue;
    EXPECT_EQ(step, nullptr) << "a second step span: " << s.name;
    step = &s;
  }
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->name, "step 2");
  EXPECT_EQ(step->pid, kDriverPid);
  for (const auto& s : t.spans) {
    EXPECT_GE(s.begin_ns, step->begin_ns) << baton::testing::describe(s);
    EXPECT_LE(s.end_ns, step->end_ns) << baton::testing::describe(s);
  }

  // The trainer's phases on the driver, the engine's spans in every worker.
  std::set<std::string> phases;
  std::map<int64_t, std::set<std::string>> engine, methods;
  for (const auto& s : t.spans) {
    if (s.cat == "trainer" && s.pid == kDriverPid) phases.insert(s.name);
    if (s.cat == "engine") engine[s.pid].insert(s.name);
    if (s.cat == "worker" && s.name == "execute") methods[s.pid].insert(s.args["method"]);
  }
  for (const char* phase : {"gen", "reward", "old_log_prob", "adv", "update_actor"})
    EXPECT_TRUE(phases.count(phase)) << "no trainer phase " << phase;
  for (int64_t pid : worker_pids) {
    SCOPED_TRACE("worker pid " + std::to_string(pid));
    for (const char* span : {"forward_backward", "forward_only", "optimizer step",
                             "reshard (enter rollout)", "generate"})
      EXPECT_TRUE(engine[pid].count(span)) << "no engine span " << span;
    for (const char* method :
         {"actor_generate_sequences", "actor_compute_log_prob", "actor_update_actor"})
      EXPECT_TRUE(methods[pid].count(method)) << "no call of " << method;
  }
}

}  // namespace
}  // namespace baton::trainer
