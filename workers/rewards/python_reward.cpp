#include "workers/rewards/python_reward.h"

#include <chrono>
#include <thread>

#include "base/child_process.h"
#include "base/errors.h"
#include "workers/rewards/verl_reward_score.h"

namespace baton::rewards {
namespace {

using detail::cat;

// The subprocess: imports the user's file, then answers each request line
// {"rows": [[data_source, solution_str, ground_truth, extra_info], ...]} with
// a line per row, {"i": k, "score": x} or {"i": k, "error": "..."}, and
// {"done": true}. The protocol has the process's stdout to itself: the
// user's prints go to stderr.
//
// Unless a real verl is importable, a `verl` package stands in for verl's
// reward_score modules (verl_reward_score.h): each of its functions writes
// {"call": "gsm8k.compute_score", "args": {...}} and reads the trainer's
// {"result": ...} or {"error": "...", "type": "AssertionError"} from stdin.
constexpr const char* kHost = R"PY(
import builtins, importlib.abc, importlib.util, json, math, os, sys, traceback, types
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
def send(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()
def brief(e):
    return "".join(traceback.format_exception_only(type(e), e)).strip()
path, name, kwargs, api = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])

def verl_call(function, args):
    proto.write(json.dumps({"call": function, "args": args}, default=repr, allow_nan=False) + "\n")
    proto.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError("the trainer closed the pipe during verl.utils.reward_score." + function)
    answer = json.loads(line)
    if "error" in answer:
        kind = getattr(builtins, answer.get("type", ""), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RuntimeError
        raise kind(answer["error"])
    return answer["result"]

def install_verl_shim():
    mapped = ", ".join(api["functions"]) + " (" + ", ".join(
        "%s is %s" % a for a in api["aliases"].items()) + ")"
    def package(name, is_package=True):
        m = types.ModuleType(name, "baton's stand-in for verl's %s: verl's reward_score "
                             "functions answered by baton's built-ins" % name)
        m.__file__ = "<baton>"
        if is_package:
            m.__path__ = []
        def __getattr__(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            raise AttributeError("module '%s' has no attribute '%s' in baton, whose verl "
                                 "package maps only verl.utils.reward_score's %s"
                                 % (name, attr, mapped))
        m.__getattr__ = __getattr__
        sys.modules[name] = m
        return m
    verl = package("verl")
    verl.utils = package("verl.utils")
    scores = verl.utils.reward_score = package("verl.utils.reward_score")
    modules = {"": scores}
    for function, params in api["functions"].items():
        module, _, short = function.rpartition(".")
        if module not in modules:
            modules[module] = package("verl.utils.reward_score." + module, False)
            setattr(scores, module, modules[module])
        code = "def %s(%s):\n    return verl_call(%r, dict(locals()))\n" % (short, params, function)
        namespace = {"verl_call": verl_call}
        exec(code, namespace)
        namespace[short].__module__ = modules[module].__name__
        setattr(modules[module], short, namespace[short])
    scores._default_compute_score = scores.default_compute_score
    for alias, module in api["aliases"].items():
        sys.modules["verl.utils.reward_score." + alias] = modules[module]
        setattr(scores, alias, modules[module])
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.startswith("verl.") and sys.modules.get("verl") is verl:
                raise ImportError("baton runs verl reward files without verl: %s is not "
                                  "provided; baton maps verl.utils.reward_score's %s"
                                  % (fullname, mapped), name=fullname)
            return None
    sys.meta_path.append(Refuse())

try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    if importlib.util.find_spec("verl") is None:
        install_verl_shim()
    spec = importlib.util.spec_from_file_location("baton_user_reward", path)
    if spec is None:
        raise ImportError("not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError("no function '%s' in it" % name)
except BaseException as e:
    send({"fatal": brief(e)})
    sys.exit(1)
send({"ready": True})
for line in iter(sys.stdin.readline, ""):
    rows = json.loads(line)["rows"]
    for i, (source, solution, truth, extra) in enumerate(rows):
        try:
            info = json.loads(extra) if extra else None
        except ValueError:
            info = extra
        try:
            r = fn(source, solution, truth, info, **kwargs)
            if isinstance(r, dict):
                r = r.get("score")
            if isinstance(r, bool) or not isinstance(r, (int, float)):
                raise TypeError("returned %s %.80r, not a number" % (type(r).__name__, r))
            r = float(r)
            if not math.isfinite(r):
                raise ValueError("returned %r, not a finite number" % r)
            send({"i": i, "score": r})
        except BaseException as e:
            send({"i": i, "error": brief(e)})
    send({"done": True})
)PY";

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

struct PythonRewardPool::Process {
  std::unique_ptr<ChildProcess> child;
  std::string where;  // "compute_score in my_reward.py"

  void start(const PythonRewardOptions& o) {
    try {
      child = std::make_unique<ChildProcess>(
          std::vector<std::string>{o.python, "-u", "-c", kHost, o.path, o.function, o.kwargs.dump(),
                                   verl_reward_score_api().dump()});
    } catch (const Error& e) {
      throw Error(cat("python reward ", where, ": ", e.what()));
    }
    std::string line;
    const ChildProcess::Read r = read_answering_calls(120.0, line);
    if (r != ChildProcess::Read::kLine) {
      throw Error(cat("python reward ", where, ": ", o.python,
                      r == ChildProcess::Read::kTimeout ? " did not import the file within 120 s"
                                                        : " exited before importing the file"));
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("fatal"))
      throw Error(cat("python reward ", where, ": ", j["fatal"].get<std::string>()));
    if (!j.is_object() || !j.value("ready", false))
      throw Error(cat("python reward ", where, ": unexpected first line from ", o.python, ": ",
                      line.substr(0, 200)));
  }

  void stop() { child.reset(); }

  bool send(const std::string& line) { return child->send(line); }

  // The next line that is not a call of verl's reward_score functions (the
  // stand-in package's), answering those with the built-ins as they come.
  // Waits at most timeout_s in all.
  ChildProcess::Read read_answering_calls(double timeout_s, std::string& line) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const ChildProcess::Read r = child->read_line(timeout_s - seconds_since(start), line);
      if (r != ChildProcess::Read::kLine) return r;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || !j.contains("call") || !j["call"].is_string()) return r;
      nlohmann::json answer;
      try {
        answer = {{"result", call_verl_reward_score(j["call"].get<std::string>(),
                                                    j.value("args", nlohmann::json::object()))}};
      } catch (const VerlRewardScoreError& e) {
        answer = {{"error", e.what()}, {"type", e.python_type()}};
      } catch (const std::exception& e) {
        answer = {{"error", e.what()}, {"type", "RuntimeError"}};
      }
      // A child gone meanwhile is seen by the next read.
      child->send(answer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    }
  }

  // Scores inputs[first, last) into results, replacing the process after a
  // row that timed out or killed it.
  void score(const PythonRewardOptions& o, const std::vector<RewardInput>& inputs, size_t first,
             size_t last, std::vector<PythonRewardResult>& results) {
    size_t next = first;
    while (next < last) {
      nlohmann::json rows = nlohmann::json::array();
      for (size_t k = next; k < last; ++k) {
        const RewardInput& in = inputs[k];
        rows.push_back({std::string(in.data_source), std::string(in.response),
                        std::string(in.ground_truth), std::string(in.extra_info)});
      }
      const size_t base = next;
      bool alive = send(nlohmann::json{{"rows", rows}}.dump(
                            -1, ' ', false, nlohmann::json::error_handler_t::replace) +
                        "\n");
      while (alive && next < last) {
        std::string line;
        const ChildProcess::Read r = read_answering_calls(o.timeout_s, line);
        if (r != ChildProcess::Read::kLine) {
          results[next].error = cat(where, r == ChildProcess::Read::kTimeout
                                               ? cat(" did not return within ", o.timeout_s, " s")
                                               : std::string(" killed its interpreter"));
          alive = false;
          ++next;
          break;
        }
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_object() || !j.contains("i")) continue;  // not a row's answer
        const size_t k = base + j["i"].get<size_t>();
        if (k >= last) continue;
        if (j.contains("score"))
          results[k].score = j["score"].get<double>();
        else
          results[k].error = cat(where, " raised ", j.value("error", std::string("?")));
        next = k + 1;
      }
      if (alive) {
        // The batch's closing {"done": true}.
        std::string line;
        if (read_answering_calls(o.timeout_s, line) != ChildProcess::Read::kLine) alive = false;
      }
      if (!alive) {
        stop();
        start(o);
      }
    }
  }
};

PythonRewardPool::PythonRewardPool(PythonRewardOptions options) : options_(std::move(options)) {
  if (options_.processes < 1)
    throw Error(
        cat("python reward ", options_.path, ": processes must be >= 1, got ", options_.processes));
  if (!(options_.timeout_s > 0))
    throw Error(
        cat("python reward ", options_.path, ": timeout_s must be > 0, got ", options_.timeout_s));
  for (int64_t i = 0; i < options_.processes; ++i) {
    auto p = std::make_unique<Process>();
    p->where = options_.function + " in " + options_.path;
    p->start(options_);
    processes_.push_back(std::move(p));
  }
}

PythonRewardPool::~PythonRewardPool() = default;

std::vector<PythonRewardResult> PythonRewardPool::score(const std::vector<RewardInput>& inputs) {
  std::lock_guard lock(mutex_);
  std::vector<PythonRewardResult> results(inputs.size());
  const size_t workers = std::min(processes_.size(), std::max<size_t>(inputs.size(), 1));
  const size_t per = (inputs.size() + workers - 1) / workers;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(workers);
  for (size_t w = 0; w < workers; ++w) {
    const size_t first = w * per, last = std::min(inputs.size(), first + per);
    if (first >= last) break;
    threads.emplace_back([&, w, first, last] {
      try {
        processes_[w]->score(options_, inputs, first, last, results);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

}  // namespace baton::rewards
