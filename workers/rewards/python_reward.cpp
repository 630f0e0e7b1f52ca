#include "workers/rewards/python_reward.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/errors.h"

extern char** environ;

namespace baton::rewards {
namespace {

using detail::cat;

// The subprocess: imports the user's file, then answers each request line
// {"rows": [[data_source, solution_str, ground_truth, extra_info], ...]} with
// a line per row, {"i": k, "score": x} or {"i": k, "error": "..."}, and
// {"done": true}. The protocol has the process's stdout to itself: the
// user's prints go to stderr.
constexpr const char* kHost = R"PY(
import json, math, os, sys, traceback, importlib.util
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
def send(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()
def brief(e):
    return "".join(traceback.format_exception_only(type(e), e)).strip()
path, name, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
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
for line in sys.stdin:
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
  pid_t pid = -1;
  int fd = -1;  // our end of the socket pair: the child's stdin and stdout
  std::string buffer;
  std::string where;  // "compute_score in my_reward.py"

  ~Process() { stop(); }

  void start(const PythonRewardOptions& o) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw Error(cat("python reward ", where, ": socketpair: ", std::strerror(errno)));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
    const std::string kwargs = o.kwargs.dump();
    std::vector<std::string> args = {o.python, "-u", "-c", kHost, o.path, o.function, kwargs};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawnp(&pid, o.python.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(sv[1]);
    fd = sv[0];
    if (rc != 0) {
      pid = -1;
      throw Error(cat("python reward ", where, ": cannot start ", o.python, ": ", std::strerror(rc)));
    }
    std::string line;
    const Read r = read_line(120.0, line);
    if (r != Read::kLine) {
      throw Error(cat("python reward ", where, ": ", o.python,
                      r == Read::kTimeout ? " did not import the file within 120 s"
                                          : " exited before importing the file"));
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("fatal"))
      throw Error(cat("python reward ", where, ": ", j["fatal"].get<std::string>()));
    if (!j.is_object() || !j.value("ready", false))
      throw Error(cat("python reward ", where, ": unexpected first line from ", o.python, ": ",
                      line.substr(0, 200)));
  }

  void stop() {
    if (fd >= 0) close(fd);
    fd = -1;
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    pid = -1;
    buffer.clear();
  }

  // False when the process is gone.
  bool send(const std::string& line) {
    size_t sent = 0;
    while (sent < line.size()) {
      const ssize_t n = ::send(fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  enum class Read { kLine, kTimeout, kEof };

  Read read_line(double timeout_s, std::string& line) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const size_t nl = buffer.find('\n');
      if (nl != std::string::npos) {
        line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        return Read::kLine;
      }
      const double left = timeout_s - seconds_since(start);
      if (left <= 0) return Read::kTimeout;
      pollfd p{fd, POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(left * 1000) + 1);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) continue;  // the loop checks the time
      char chunk[65536];
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Read::kEof;
      buffer.append(chunk, static_cast<size_t>(n));
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
        const Read r = read_line(o.timeout_s, line);
        if (r != Read::kLine) {
          results[next].error = cat(where, r == Read::kTimeout
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
        if (read_line(o.timeout_s, line) != Read::kLine) alive = false;
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
    throw Error(cat("python reward ", options_.path, ": processes must be >= 1, got ",
                    options_.processes));
  if (!(options_.timeout_s > 0))
    throw Error(cat("python reward ", options_.path, ": timeout_s must be > 0, got ",
                    options_.timeout_s));
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
