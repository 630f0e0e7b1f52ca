#include "trainer/step_profiler.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

#include "base/atomic_file.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/profiler.h"
#include "runtime/worker_group.h"

namespace baton::trainer {

namespace {

constexpr const char* kSteps = "global_profiler.steps";
constexpr const char* kSavePath = "global_profiler.save_path";

// The driver's pid in traces (workers have theirs from 2 on: WorkerProcess::trace_pid).
constexpr int kDriverPid = 1;

}  // namespace

ProfilerSettings read_profiler_settings(const Config& config, std::vector<std::string>& problems) {
  ProfilerSettings s;
  if (config.has(kSteps)) {
    try {
      if (const auto steps = config.get_optional<std::vector<int64_t>>(kSteps)) s.steps = *steps;
    } catch (const ConfigError& e) {
      problems.push_back(std::string(kSteps) +
                         " must be null or a list of step numbers, like [2, 3]: " + e.what());
    }
    for (int64_t step : s.steps) {
      if (step < 1) {
        // Appended, not chained with +: GCC 12 warns (-Warray-bounds) on the chain.
        std::string p = kSteps;
        p += " has ";
        p += std::to_string(step);
        p += "; steps count from 1";
        problems.push_back(std::move(p));
      }
    }
  }
  std::optional<std::string> path;
  if (config.has(kSavePath)) {
    try {
      path = config.get_optional<std::string>(kSavePath);
    } catch (const ConfigError& e) {
      problems.push_back(std::string(kSavePath) + " must be null or a directory: " + e.what());
    }
  }
  if (path) {
    s.save_path = *path;
  } else {
    try {
      s.save_path =
          (std::filesystem::path(config.get<std::string>("trainer.default_local_dir")) / "profile")
              .string();
    } catch (const ConfigError&) {
      // trainer.default_local_dir's own read names it.
    }
  }
  return s;
}

StepProfiler::StepProfiler(ProfilerSettings settings, std::vector<WorkerGroup*> groups)
    : settings_(std::move(settings)), groups_(std::move(groups)) {}

bool StepProfiler::profiles(int64_t step) const {
  return std::find(settings_.steps.begin(), settings_.steps.end(), step) != settings_.steps.end();
}

void StepProfiler::begin_step(int64_t step) {
  if (!profiles(step)) return;
  // Events from before the origin (an earlier session's stragglers) are left
  // out of the file, so it is taken before anything records.
  origin_ns_ = profiler::now_ns();
  active_step_ = step;
  // The workers first, so that the driver does not record their answers.
  for (WorkerGroup* g : groups_) g->set_profiling(true);
  profiler::set_enabled(true);
}

std::string StepProfiler::end_step(int64_t step) {
  if (active_step_ == 0 || step != active_step_) return "";
  active_step_ = 0;
  const std::string step_name = "step " + std::to_string(step);
  // A call's driver span ends before its caller sees the result; one whose
  // future nobody waited for may still be in flight.
  if (!profiler::wait_for_lanes(std::chrono::seconds(5)))
    log(LogLevel::kWarn, "profiler: a call of " + step_name +
                             " is still in flight; its driver-side span is left out");
  profiler::record({step_name, "trainer", origin_ns_, profiler::now_ns(), 0,
                    profiler::Args().add("step", step).take()});
  profiler::set_enabled(false);
  for (WorkerGroup* g : groups_) g->set_profiling(false);
  std::vector<profiler::ProcessProfile> processes = {
      profiler::collect_process(kDriverPid, "driver", origin_ns_)};
  for (WorkerGroup* g : groups_) {
    for (auto& p : g->collect_profile(origin_ns_)) processes.push_back(std::move(p));
  }
  const std::filesystem::path file =
      std::filesystem::path(settings_.save_path) / ("step_" + std::to_string(step) + ".json");
  try {
    baton::write_file_atomically(
        file, profiler::chrome_trace(processes, "\"step\":" + std::to_string(step)));
  } catch (const std::exception& e) {
    throw Error("global_profiler: cannot write the trace of " + step_name + " to " + file.string() +
                ": " + e.what());
  }
  return file.string();
}

}  // namespace baton::trainer
