#include "trainer/metrics.h"

#include <cstdlib>

#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <sstream>
#include <system_error>

#include "base/errors.h"
#include "trainer/tensorboard_writer.h"

namespace baton::trainer {
namespace fs = std::filesystem;

namespace {

using Metrics = std::map<std::string, double>;

struct Column {
  const char* header;
  const char* key;  // nullptr: the first key starting with "val-core/"
};

constexpr Column kColumns[] = {
    {"score", "critic/score/mean"},       {"val", nullptr},
    {"pg_loss", "actor/pg_loss"},         {"entropy", "actor/entropy"},
    {"ppo_kl", "actor/ppo_kl"},           {"grad_norm", "actor/grad_norm"},
    {"resp_len", "response_length/mean"}, {"step_s", "timing_s/step"},
};
constexpr int kStepWidth = 7;
constexpr int kColumnWidth = 11;  // "%.4g" is at most 10 characters: -1.235e+05

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

const double* find_value(const Metrics& m, const Column& c) {
  if (c.key != nullptr) {
    const auto it = m.find(c.key);
    return it == m.end() ? nullptr : &it->second;
  }
  const auto it = m.lower_bound("val-core/");
  return it != m.end() && starts_with(it->first, "val-core/") ? &it->second : nullptr;
}

std::string format_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", x);
  return buf;
}

std::string pad_left(const std::string& s, int width) {
  return s.size() >= static_cast<size_t>(width) ? " " + s : std::string(width - s.size(), ' ') + s;
}

// Quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Quoted for gnuplot: single quotes, where only '' is special.
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string json_line(int64_t step, const Metrics& metrics) {
  nlohmann::ordered_json j;
  j["step"] = step;
  for (const auto& [k, v] : metrics) {
    if (k == "step") continue;  // the step is the argument
    if (std::isfinite(v)) {
      j[k] = v;
    } else {
      j[k] = nullptr;
    }
  }
  return j.dump();
}

}  // namespace

std::string metrics_table_header() {
  std::string out = pad_left("step", kStepWidth);
  for (const Column& c : kColumns) out += pad_left(c.header, kColumnWidth);
  return out;
}

std::string metrics_table_row(int64_t step, const Metrics& metrics) {
  std::string out = pad_left(std::to_string(step), kStepWidth);
  for (const Column& c : kColumns) {
    const double* v = find_value(metrics, c);
    out += pad_left(v == nullptr ? "-" : format_number(*v), kColumnWidth);
  }
  return out;
}

std::string format_all_metrics(int64_t step, const Metrics& metrics) {
  size_t width = 0;
  for (const auto& [k, v] : metrics) width = std::max(width, k.size());
  std::string out = "step " + std::to_string(step) + ":\n";
  for (const auto& [k, v] : metrics) {
    out += "  " + k + std::string(width - k.size() + 2, ' ') + format_number(v) + "\n";
  }
  return out;
}

MetricsLogger::MetricsLogger(MetricsLoggerOptions options) : options_(std::move(options)) {
  for (const std::string& l : options_.loggers) {
    if (l == "console") {
      console_ = true;
    } else if (l == "file") {
      file_ = true;
    } else if (l == "tensorboard") {
      std::filesystem::path dir = options_.tensorboard_dir;
      if (dir.empty()) {
        const char* env = std::getenv("TENSORBOARD_DIR");
        dir = env != nullptr && *env != '\0'
                  ? std::filesystem::path(env)
                  : std::filesystem::path("tensorboard_log") / options_.project_name /
                        options_.experiment_name;
      }
      tensorboard_ = std::make_unique<TensorBoardWriter>(dir);
    } else if (l == "wandb") {
      WandbOptions w = options_.wandb;
      if (w.project.empty() && w.name.empty())
        w.set_names(options_.project_name, options_.experiment_name);
      if (w.dir.empty()) {
        const char* env = std::getenv("WANDB_DIR");
        w.dir = env != nullptr && *env != '\0' ? std::filesystem::path(env) : options_.dir;
      }
      wandb_ = std::make_unique<WandbWriter>(std::move(w));
    } else {
      throw Error("MetricsLogger: unknown logger '" + l +
                  "'; loggers baton has: console, file, tensorboard, wandb");
    }
  }
  if (options_.header_every < 1) options_.header_every = 1;
  if (!file_) return;
  if (options_.dir.empty()) throw Error("MetricsLogger: the file logger needs a directory (dir)");
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) {
    throw Error("MetricsLogger: cannot create " + options_.dir.string() + ": " + ec.message());
  }
  std::ifstream in(jsonl_path());
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    Metrics m;
    for (const auto& [k, v] : j.items()) {
      if (k == "step") continue;
      if (v.is_number()) m[k] = v.get<double>();
      if (v.is_null()) m[k] = std::numeric_limits<double>::quiet_NaN();
    }
    previous_lines_.emplace_back(step, line);
    history_.emplace_back(step, std::move(m));
  }
}

MetricsLogger::~MetricsLogger() = default;

fs::path MetricsLogger::jsonl_path() const { return options_.dir / "metrics.jsonl"; }

void MetricsLogger::log(int64_t step, const Metrics& metrics) {
  if (!first_log_done_) {
    first_log_done_ = true;
    const auto kept = [&](int64_t s) {
      return options_.resume_step ? s <= *options_.resume_step : s < step;
    };
    std::erase_if(history_, [&](const auto& h) { return !kept(h.first); });
    if (file_) {
      // Rewrite the kept lines through a temporary file, so that a crash here
      // leaves the old file or the new one, never half of one.
      const fs::path path = jsonl_path();
      const fs::path tmp = path.string() + ".tmp";
      {
        std::ofstream out(tmp, std::ios::trunc);
        for (const auto& [s, line] : previous_lines_) {
          if (kept(s)) out << line << '\n';
        }
        out.flush();
        if (!out) throw Error("MetricsLogger: cannot write " + tmp.string());
      }
      std::error_code ec;
      fs::rename(tmp, path, ec);
      if (ec) {
        throw Error("MetricsLogger: cannot rename " + tmp.string() + " to " + path.string() + ": " +
                    ec.message());
      }
      previous_lines_.clear();
      jsonl_.open(path, std::ios::app);
      if (!jsonl_) throw Error("MetricsLogger: cannot open " + path.string() + " for appending");
    }
  }
  history_.emplace_back(step, metrics);
  if (file_) log_file(step, metrics);
  if (tensorboard_) {
    tensorboard_->add(step, metrics);
    tensorboard_->flush();
  }
  if (wandb_) wandb_->log(step, metrics);
  if (console_) log_console(step, metrics);
}

void MetricsLogger::log_file(int64_t step, const Metrics& metrics) {
  jsonl_ << json_line(step, metrics) << '\n';
  jsonl_.flush();
  if (!jsonl_) throw Error("MetricsLogger: cannot write " + jsonl_path().string());
}

void MetricsLogger::log_console(int64_t step, const Metrics& metrics) {
  std::ostream& out = options_.console != nullptr ? *options_.console : std::cout;
  if (rows_printed_ == 0 && !(options_.project_name.empty() && options_.experiment_name.empty())) {
    out << "# " << options_.project_name << "/" << options_.experiment_name << "\n";
  }
  if (rows_printed_ % options_.header_every == 0) out << metrics_table_header() << "\n";
  out << metrics_table_row(step, metrics) << "\n";
  if (options_.verbose) out << format_all_metrics(step, metrics);
  out.flush();
  ++rows_printed_;
}

void MetricsLogger::plot(const fs::path& png) const {
  struct Panel {
    std::string title;
    std::vector<std::string> keys;
  };
  auto any_step_has = [&](const std::string& key) {
    for (const auto& [s, m] : history_) {
      const auto it = m.find(key);
      if (it != m.end() && std::isfinite(it->second)) return true;
    }
    return false;
  };
  std::vector<Panel> candidates = {{"critic/score/mean", {"critic/score/mean"}}};
  Panel val{"validation (val-core/*)", {}};
  for (const auto& [s, m] : history_) {
    for (auto it = m.lower_bound("val-core/"); it != m.end() && starts_with(it->first, "val-core/");
         ++it) {
      if (std::find(val.keys.begin(), val.keys.end(), it->first) == val.keys.end()) {
        val.keys.push_back(it->first);
      }
    }
  }
  candidates.push_back(val);
  const std::string kl = any_step_has("actor/ppo_kl") ? "actor/ppo_kl" : "critic/kl";
  candidates.push_back({kl, {kl}});
  candidates.push_back({"actor/entropy", {"actor/entropy"}});
  candidates.push_back({"response_length/mean", {"response_length/mean"}});

  // One data block per series (gnuplot's `index`), finite points only.
  std::ostringstream data, plots;
  int index = 0, panels = 0;
  for (const Panel& p : candidates) {
    std::string plot_cmd;
    int series = 0;
    for (const std::string& key : p.keys) {
      if (!any_step_has(key)) continue;
      ++series;
      data << "# " << key << "\n";
      for (const auto& [s, m] : history_) {
        const auto it = m.find(key);
        if (it != m.end() && std::isfinite(it->second)) {
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%.17g", it->second);
          data << s << " " << buf << "\n";
        }
      }
      data << "\n\n";
      plot_cmd += std::string(plot_cmd.empty() ? "plot " : ", ") + "data index " +
                  std::to_string(index++) + " using 1:2 with linespoints title " + gp_quote(key);
    }
    if (plot_cmd.empty()) continue;
    ++panels;
    // A lone series is named by the panel's title; several get a key below.
    plots << "set title " << gp_quote(p.title) << "\n"
          << (series == 1 ? "unset key" : "set key below") << "\n"
          << plot_cmd << "\n";
  }
  if (panels == 0) {
    throw Error(
        "MetricsLogger::plot: no step has critic/score/mean, val-core/*, actor/ppo_kl, "
        "critic/kl, actor/entropy or response_length/mean; nothing to draw in " +
        png.string());
  }

  const int cols = panels == 1 ? 1 : 2;
  const int rows = (panels + cols - 1) / cols;
  fs::path base = png;
  base.replace_extension();
  const fs::path dat = base.string() + ".dat";
  const fs::path script = base.string() + ".gp";
  std::ostringstream gp;
  gp << "data = " << gp_quote(dat.string()) << "\n"
     << "size = '" << 560 * cols << "," << 340 * rows << "'\n"
     << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
     << "  set terminal pngcairo noenhanced size @size\n"
     << "} else {\n"
     << "  set terminal png noenhanced size @size\n"
     << "}\n"
     << "set output " << gp_quote(png.string()) << "\n"
     << "set grid\nset xlabel 'step'\n"
     << "set multiplot layout " << rows << "," << cols << " title "
     << gp_quote(options_.project_name.empty() && options_.experiment_name.empty()
                     ? std::string("training curves")
                     : options_.project_name + "/" + options_.experiment_name)
     << "\n"
     << plots.str() << "unset multiplot\nset output\n";
  for (const auto& [path, text] : {std::pair{dat, data.str()}, std::pair{script, gp.str()}}) {
    std::ofstream out(path, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw Error("MetricsLogger::plot: cannot write " + path.string());
  }

  const std::string command = shell_quote(options_.gnuplot) + " " + shell_quote(script.string());
  std::error_code ec;
  fs::remove(png, ec);  // so that an old PNG does not pass for a new one
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw Error("MetricsLogger::plot: cannot run " + command);
  std::string output;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = ::pclose(pipe);
  const bool ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!ok || !fs::exists(png) || fs::file_size(png) == 0) {
    std::string why =
        status == -1               ? "could not be waited for"
        : !WIFEXITED(status)       ? "was killed by signal " + std::to_string(WTERMSIG(status))
        : WEXITSTATUS(status) != 0 ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                   : "exited 0 but wrote no " + png.string();
    throw Error("MetricsLogger::plot: `" + command + "` " + why +
                (output.empty() ? std::string() : ": " + output) +
                (WIFEXITED(status) && WEXITSTATUS(status) == 127
                     ? " (install gnuplot: Debian's gnuplot-nox, which scripts/setup.sh installs)"
                     : ""));
  }
}

}  // namespace baton::trainer
