// MetricsLogger: where a training run's per-step metrics go (verl's
// trainer.logger: "console", "file", "tensorboard" and "wandb"), and the
// curves drawn from them.
//
//   console  one table row per step to stdout (header every header_every
//            rows): step, critic/score/mean, a validation score, actor/pg_loss,
//            actor/entropy, actor/ppo_kl, actor/grad_norm,
//            response_length/mean, timing_s/step; "-" where a step has no
//            value. With `verbose`, every metric of the step after its row.
//   file     <dir>/metrics.jsonl: one JSON object per step,
//            {"step": N, "<key>": value, ...} (keys in sorted order), flushed
//            to the OS after each step, so a crashed process loses nothing it
//            logged. NaN and ±inf are written as null (JSON has no such
//            numbers).
//   tensorboard  TensorBoard event files (trainer/tensorboard_writer.h).
//   wandb    a Weights & Biases run, offline unless $WANDB_MODE says
//            otherwise, written by the wandb package in a Python subprocess
//            (trainer/wandb_writer.h).
//
// Resuming into a directory that has a metrics.jsonl: the lines already there
// are kept up to the first step this logger logs. When log(S) is first
// called, every line with step >= S is dropped (those steps are being run
// again) and the rest stay, in their order; unparsable lines (a line torn by
// a crash) are dropped too. Nothing is changed on disk before that first log().
// With options.resume_step set (the step of the checkpoint resumed from), the
// lines kept are those with step <= resume_step instead, whatever step comes
// first: validation before training logs the checkpoint's step again, and
// that must not drop the step's training line.
//
// plot() draws the curves with gnuplot (Debian's gnuplot-nox) from every step
// logged, those kept from an earlier run included.
//
// Not thread-safe: one thread logs.
//
// Example:
//   MetricsLogger logger(MetricsLoggerOptions().set_dir(out_dir).set_loggers({"console", "file"}));
//   logger.log(step, metrics);
//   ...
//   logger.plot(out_dir / "curves.png");
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/wandb_writer.h"

namespace baton::trainer {

class TensorBoardWriter;

struct MetricsLoggerOptions {
  // The run directory: metrics.jsonl goes there (created if missing). Needed
  // by "file".
  std::filesystem::path dir;
  // A subset of {"console", "file", "tensorboard", "wandb"}; other names are an error.
  std::vector<std::string> loggers = {"console"};
  // Shown in the console's first header ("project/experiment").
  std::string project_name;
  std::string experiment_name;
  // The console re-prints the column header every this many rows.
  int header_every = 20;
  // The console also prints every metric of each step.
  bool verbose = false;
  // Where the console writes; nullptr: std::cout. Not owned.
  std::ostream* console = nullptr;
  // Resuming from the checkpoint of this step: keep the existing lines of
  // metrics.jsonl with step <= resume_step (see above). Unset: keep those
  // before the first step logged.
  std::optional<int64_t> resume_step;
  // "tensorboard": where its event files go (trainer/tensorboard_writer.h).
  // Empty: verl's choice, $TENSORBOARD_DIR if set, else
  // tensorboard_log/<project_name>/<experiment_name>.
  std::filesystem::path tensorboard_dir;
  // "wandb": its subprocess's python, the run's config, where its files go
  // (trainer/wandb_writer.h). An empty project and name are project_name and
  // experiment_name; an empty dir is $WANDB_DIR if set, else `dir`.
  WandbOptions wandb;
  // The gnuplot executable plot() runs (looked up on PATH).
  std::string gnuplot = "gnuplot";

  MetricsLoggerOptions& set_dir(std::filesystem::path d) {
    dir = std::move(d);
    return *this;
  }
  MetricsLoggerOptions& set_loggers(std::vector<std::string> l) {
    loggers = std::move(l);
    return *this;
  }
  MetricsLoggerOptions& set_names(std::string project, std::string experiment) {
    project_name = std::move(project);
    experiment_name = std::move(experiment);
    return *this;
  }
  MetricsLoggerOptions& set_verbose(bool v) {
    verbose = v;
    return *this;
  }
  MetricsLoggerOptions& set_console(std::ostream* out) {
    console = out;
    return *this;
  }
  MetricsLoggerOptions& set_resume_step(int64_t step) {
    resume_step = step;
    return *this;
  }
};

class MetricsLogger {
 public:
  // Reads <dir>/metrics.jsonl when "file" is on and it exists (see resuming
  // above). Throws baton::Error for an unknown logger name, or "file" without
  // a dir or with a dir that cannot be created.
  explicit MetricsLogger(MetricsLoggerOptions options);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Logs one step to every logger. Steps need not be increasing (validation
  // before training logs the starting step), but a step logged twice is two
  // lines. Throws baton::Error when metrics.jsonl cannot be written.
  void log(int64_t step, const std::map<std::string, double>& metrics);

  // Draws a PNG of panels against step: critic/score/mean; every key starting
  // with "val-core/"; actor/ppo_kl (critic/kl when no step has it);
  // actor/entropy; response_length/mean. Panels without data are left out.
  // Writes <png minus extension>.dat (the data) and .gp (the script) next to
  // it and runs `gnuplot <script>`. Throws baton::Error when nothing was
  // logged that a panel shows, or when gnuplot is missing or fails (naming
  // the command, its exit status and its output).
  void plot(const std::filesystem::path& png) const;

  // <dir>/metrics.jsonl (whether or not "file" is on).
  std::filesystem::path jsonl_path() const;
  // Every step logged, with the steps kept from an earlier run first.
  const std::vector<std::pair<int64_t, std::map<std::string, double>>>& history() const {
    return history_;
  }

 private:
  void log_console(int64_t step, const std::map<std::string, double>& metrics);
  void log_file(int64_t step, const std::map<std::string, double>& metrics);

  MetricsLoggerOptions options_;
  bool console_ = false;
  bool file_ = false;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<WandbWriter> wandb_;
  int64_t rows_printed_ = 0;
  bool first_log_done_ = false;
  // Lines of an existing metrics.jsonl: (step, the line as it was).
  std::vector<std::pair<int64_t, std::string>> previous_lines_;
  std::ofstream jsonl_;
  std::vector<std::pair<int64_t, std::map<std::string, double>>> history_;
};

// The table row MetricsLogger's console prints for a step, and its header
// (same column widths). Exposed for tests and for drivers that print
// elsewhere.
std::string metrics_table_header();
std::string metrics_table_row(int64_t step, const std::map<std::string, double>& metrics);
// Every metric of a step, one "  key  value" line each, after "step N:".
std::string format_all_metrics(int64_t step, const std::map<std::string, double>& metrics);

}  // namespace baton::trainer
