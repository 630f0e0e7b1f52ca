// Weights & Biases runs (trainer.logger: wandb), written by the real `wandb`
// package in a Python subprocess (base/child_process.h) that the trainer
// feeds one JSON line per step. As verl's Tracking does:
//   wandb.init(project=project_name, name=experiment_name,
//              entity=$WANDB_ENTITY, config=<the run's resolved config>,
//              settings=wandb.Settings(https_proxy=trainer.wandb_proxy) if set)
//   run.log(metrics, step=step) per step, run.finish() at the end.
// Unlike verl, the mode is "offline" unless $WANDB_MODE says otherwise (so a
// run needs no account or network; `wandb sync <dir>/wandb/offline-run-*`
// uploads it later), and wandb's files go under `dir`.
//
// It never hangs the trainer: every answer the subprocess owes is waited for
// at most timeout_s, and a subprocess that died, cannot import wandb or
// fails in wandb is a baton::Error naming what happened.
//
// Example:
//   WandbWriter w(WandbOptions().set_names("gsm8k", "grpo").set_dir("checkpoints/run"));
//   w.log(1, {{"critic/score/mean", 0.5}});
//   w.finish();
//
// Not thread-safe: one thread logs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace baton {
class ChildProcess;
}

namespace baton::trainer {

struct WandbOptions {
  // The interpreter that has the wandb package (trainer.logger_python; PATH
  // is searched).
  std::string python = "python3";
  // wandb.init's project and name.
  std::string project;
  std::string name;
  // wandb.init's dir: wandb/offline-run-*/ goes under it (created if
  // missing); empty: the current directory.
  std::filesystem::path dir;
  // The run's config as YAML (Config::to_yaml of the resolved config), given
  // to wandb.init(config=...) as a dict; empty: no config.
  std::string config_yaml;
  // trainer.wandb_proxy (verl's, added with +trainer.wandb_proxy=...): wandb's
  // https_proxy; empty: none.
  std::string https_proxy;
  // The longest wait for any answer of the subprocess (its start and
  // wandb.init included), in seconds.
  double timeout_s = 120;

  WandbOptions& set_python(std::string p) {
    python = std::move(p);
    return *this;
  }
  WandbOptions& set_names(std::string p, std::string n) {
    project = std::move(p);
    name = std::move(n);
    return *this;
  }
  WandbOptions& set_dir(std::filesystem::path d) {
    dir = std::move(d);
    return *this;
  }
  WandbOptions& set_config_yaml(std::string yaml) {
    config_yaml = std::move(yaml);
    return *this;
  }
};

class WandbWriter {
 public:
  // Starts the subprocess and waits for wandb.init. Throws baton::Error when
  // the interpreter cannot start, has no wandb ("trainer.logger: wandb needs
  // the wandb package in <python>; ..."), or wandb.init fails (its error).
  explicit WandbWriter(WandbOptions options);
  // finish(), its errors swallowed.
  ~WandbWriter();
  WandbWriter(const WandbWriter&) = delete;
  WandbWriter& operator=(const WandbWriter&) = delete;

  // run.log(metrics, step=step), waiting for it to be done. NaN and ±inf are
  // logged as such. Throws baton::Error when the subprocess is gone, does not
  // answer within timeout_s (it is then killed) or wandb raises; after that,
  // every call throws.
  void log(int64_t step, const std::map<std::string, double>& metrics);

  // run.finish() and the subprocess's exit. Once; later calls do nothing.
  // Throws baton::Error as log() does.
  void finish();

  // wandb's run directory (<dir>/wandb/offline-run-...).
  const std::string& run_dir() const { return run_dir_; }

 private:
  // Sends `line`, reads the answer; throws naming `what` on a failure.
  std::string exchange(const std::string& line, const std::string& what);

  WandbOptions options_;
  std::unique_ptr<ChildProcess> child_;
  std::string run_dir_;
  std::string failed_;  // why the writer is unusable; empty while it works
};

// Throws baton::Error (the message WandbWriter's constructor gives) unless
// `python` can import wandb: the trainer checks this before starting workers.
void check_wandb_importable(const std::string& python);

}  // namespace baton::trainer
