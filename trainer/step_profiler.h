// StepProfiler: a Chrome trace (base/profiler.h) of the training steps that
// global_profiler.steps names (verl's key), one file per step:
// <global_profiler.save_path>/step_<N>.json, which ui.perfetto.dev opens
// (drag the file in) as chrome://tracing does.
//
// A profiled step records, on one timeline: the driver's "step N" span and
// the trainer's phases in it (the scopes that timing_s/* measures), each
// runtime call's driver-side spans (dispatch, encode, send, wait, collect) on
// the driver's "calls <group>" track, and in every worker process each call's
// spans (queue, decode, execute, encode result, send result) with the
// engine's inside (forward_backward, forward_only, optimizer step, reshard,
// generate, weight sync). One track (pid) per process: "driver" and
// "<worker class>:rank <r>". Worker clocks are aligned to the driver's
// (WorkerGroup::collect_profile); the file's otherData.clocks says by how much.
//
// Example (what PpoTrainer::fit does):
//   StepProfiler profiler(settings.profiler, {&group});  // read_trainer_settings
//   for (int64_t step = 1; ...; ++step) {
//     profiler.begin_step(step);   // recording on, if the step is chosen
//     ...                          // the step
//     profiler.end_step(step);     // off; every process's events to step_<N>.json
//   }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace baton {
class WorkerGroup;
}  // namespace baton

namespace baton::trainer {

// global_profiler.*.
struct ProfilerSettings {
  std::vector<int64_t> steps;  // the global steps to profile (from 1); empty: none
  std::string save_path;       // the directory of step_<N>.json
};

// Reads global_profiler.*, adding to `problems` one line per key that cannot
// be used, naming it: steps must be null or a list of step numbers >= 1,
// save_path null or a path. A config without the section profiles nothing;
// save_path null means <trainer.default_local_dir>/profile.
// read_trainer_settings reads it into TrainerSettings::profiler.
ProfilerSettings read_profiler_settings(const Config& config, std::vector<std::string>& problems);

class StepProfiler {
 public:
  // `groups`: every worker group whose processes are profiled (each process
  // once: the groups that own processes, not role views of them). They must
  // outlive the profiler.
  StepProfiler(ProfilerSettings settings, std::vector<WorkerGroup*> groups);

  bool profiles(int64_t step) const;

  // For a chosen step: turns recording on in the driver and every worker
  // process (blocking until they have) and starts the "step N" span.
  // Nothing otherwise.
  void begin_step(int64_t step);

  // For the step begun: ends its span, turns recording off everywhere,
  // collects every process's events and writes <save_path>/step_<N>.json
  // (atomically: a temporary file renamed). Returns the file's path; "" when
  // the step was not profiled. Throws baton::Error naming the file when it
  // cannot be written. Call it with no call in flight on the groups.
  std::string end_step(int64_t step);

 private:
  ProfilerSettings settings_;
  std::vector<WorkerGroup*> groups_;
  int64_t active_step_ = 0;  // the step being profiled, or 0
  int64_t origin_ns_ = 0;    // its start: time 0 of its file
};

}  // namespace baton::trainer
