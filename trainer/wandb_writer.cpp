#include "trainer/wandb_writer.h"

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/child_process.h"
#include "base/errors.h"
#include "base/log.h"

namespace baton::trainer {
namespace {

using detail::cat;
using nlohmann::json;

// The subprocess. argv[1] is a JSON object of the options. It answers with
// one line: {"ready": true, "run_dir": ...}, {"no_wandb": "<import error>"}
// or {"fatal": "..."}; then each request line, {"step": N, "metrics": {...}}
// or {"finish": true}, with {"ok": true} or {"error": "..."}. Non-finite
// values come as the strings "nan", "inf", "-inf". The protocol has its own
// copies of stdin and stdout: wandb's output goes to stderr, and the
// processes wandb starts inherit neither (so the trainer sees this one's end).
constexpr const char* kHost = R"PY(
import json, os, sys, traceback
proto = os.fdopen(os.dup(1), "w")
requests = os.fdopen(os.dup(0), "r")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.dup2(2, 1)
sys.stdout = sys.stderr
def send(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()
def brief(e):
    return "".join(traceback.format_exception_only(type(e), e)).strip()
options = json.loads(sys.argv[1])
try:
    import wandb
except BaseException as e:
    send({"no_wandb": brief(e)})
    sys.exit(1)
if options.get("check"):
    send({"ready": True, "run_dir": ""})
    sys.exit(0)
try:
    config = None
    if options["config_yaml"]:
        import yaml
        config = yaml.safe_load(options["config_yaml"])
    settings = None
    if options["https_proxy"]:
        settings = wandb.Settings(https_proxy=options["https_proxy"])
    os.makedirs(options["dir"], exist_ok=True)
    init = dict(project=options["project"] or None, name=options["name"] or None,
                entity=os.environ.get("WANDB_ENTITY"), config=config, settings=settings,
                dir=options["dir"])
    if not os.environ.get("WANDB_MODE"):
        init["mode"] = "offline"
    run = wandb.init(**init)
except BaseException as e:
    send({"fatal": "wandb.init failed: " + brief(e)})
    sys.exit(1)
send({"ready": True, "run_dir": os.path.dirname(run.dir) if run.dir else ""})
for line in requests:
    message = json.loads(line)
    try:
        if message.get("finish"):
            run.finish(exit_code=0)
            send({"ok": True})
            break
        metrics = {k: float(v) if isinstance(v, str) else v
                   for k, v in message["metrics"].items()}
        run.log(metrics, step=message["step"])
        send({"ok": True})
    except BaseException as e:
        send({"error": brief(e)})
else:
    run.finish(exit_code=1)  # the trainer went away without finishing
)PY";

constexpr const char* kLoggers = "loggers baton has: console, file, tensorboard, wandb";

std::unique_ptr<ChildProcess> start_host(const std::string& python, const json& options) {
  try {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{python, "-u", "-c", kHost, options.dump()});
  } catch (const Error& e) {
    throw Error(cat("trainer.logger: wandb: ", e.what(),
                    " (trainer.logger_python names the python that has wandb)"));
  }
}

// The host's first line: run_dir when it is ready; throws naming the problem.
std::string wait_ready(ChildProcess& child, const std::string& python, double timeout_s) {
  std::string line;
  const ChildProcess::Read r = child.read_line(timeout_s, line);
  if (r == ChildProcess::Read::kTimeout) {
    child.kill();
    throw Error(cat("trainer.logger: wandb: ", python,
                    " did not import wandb and start its run "
                    "within ",
                    timeout_s, " s"));
  }
  if (r == ChildProcess::Read::kExited)
    throw Error(cat("trainer.logger: wandb: ", python, " ", child.exit_reason(),
                    " before starting wandb (its stderr says why)"));
  const json j = json::parse(line, nullptr, false);
  if (j.is_object() && j.contains("no_wandb"))
    throw Error(cat("trainer.logger: wandb needs the wandb package in ", python, " (",
                    j["no_wandb"].get<std::string>(),
                    "; scripts/setup_python.sh installs it in baton's venv, or pip install "
                    "wandb); ",
                    kLoggers));
  if (j.is_object() && j.contains("fatal"))
    throw Error(cat("trainer.logger: wandb: ", j["fatal"].get<std::string>()));
  if (!j.is_object() || !j.value("ready", false))
    throw Error(cat("trainer.logger: wandb: unexpected first line from ", python, ": ",
                    line.substr(0, 200)));
  return j.value("run_dir", std::string());
}

}  // namespace

WandbWriter::WandbWriter(WandbOptions options) : options_(std::move(options)) {
  const json o = {{"project", options_.project},
                  {"name", options_.name},
                  {"dir", options_.dir.empty() ? "." : options_.dir.string()},
                  {"config_yaml", options_.config_yaml},
                  {"https_proxy", options_.https_proxy}};
  child_ = start_host(options_.python, o);
  run_dir_ = wait_ready(*child_, options_.python, options_.timeout_s);
}

WandbWriter::~WandbWriter() {
  try {
    finish();
  } catch (const std::exception& e) {
    baton::log(LogLevel::kWarn, e.what());
  }
}

std::string WandbWriter::exchange(const std::string& line, const std::string& what) {
  if (!failed_.empty()) throw Error(failed_);
  const auto fail = [&](const std::string& why) {
    failed_ =
        cat("trainer.logger: wandb (", options_.python, ", run ", run_dir_, "): ", what, ": ", why);
    child_->kill();
    throw Error(failed_);
  };
  std::string answer;
  if (!child_->send(line)) {
    child_->read_line(5, answer);  // reaps it, so that exit_reason() can tell
    fail("the wandb subprocess is gone (it " + child_->exit_reason() + ")");
  }
  const ChildProcess::Read r = child_->read_line(options_.timeout_s, answer);
  if (r == ChildProcess::Read::kTimeout)
    fail(cat("no answer within ", options_.timeout_s, " s; the wandb subprocess was killed"));
  if (r == ChildProcess::Read::kExited)
    fail("the wandb subprocess " + child_->exit_reason() + " (its stderr says why)");
  const json j = json::parse(answer, nullptr, false);
  if (j.is_object() && j.contains("error"))
    throw Error(cat("trainer.logger: wandb: ", what, ": ", j["error"].get<std::string>()));
  if (!j.is_object() || !j.value("ok", false)) fail("unexpected answer: " + answer.substr(0, 200));
  return answer;
}

void WandbWriter::log(int64_t step, const std::map<std::string, double>& metrics) {
  if (!child_) throw Error("trainer.logger: wandb: log() after finish()");
  json m = json::object();
  for (const auto& [k, v] : metrics) {
    if (std::isfinite(v))
      m[k] = v;
    else
      m[k] = std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
  }
  const json line = {{"step", step}, {"metrics", m}};
  exchange(line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
           cat("run.log at step ", step));
}

void WandbWriter::finish() {
  if (!child_) return;
  if (failed_.empty()) {
    try {
      exchange(json{{"finish", true}}.dump() + "\n", "run.finish()");
    } catch (...) {
      child_.reset();
      throw;
    }
    child_->close_and_wait(options_.timeout_s);
  }
  child_.reset();
}

void check_wandb_importable(const std::string& python) {
  std::unique_ptr<ChildProcess> child = start_host(python, json{{"check", true}});
  wait_ready(*child, python, 120);
  child->close_and_wait(10);
}

}  // namespace baton::trainer
