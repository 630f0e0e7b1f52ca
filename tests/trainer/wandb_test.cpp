// The wandb logger (trainer/wandb_writer.h): a MetricsLogger with "wandb"
// whose offline run, read back from wandb's own .wandb file with wandb's
// protobuf records (the venv's wandb package), holds the project, name,
// config and every step's metrics; wandb.init's arguments as verl passes
// them; and a python without wandb, a subprocess that dies, one that hangs
// and a failing wandb.init each an error that names it, never a hang.
#include "trainer/wandb_writer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "trainer/metrics.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

struct Work {
  fs::path dir = fs::temp_directory_path() / ("baton_wandb_" + std::to_string(::getpid()));
  Work() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Work() { fs::remove_all(dir); }
  fs::path write(const std::string& name, const std::string& text) const {
    fs::create_directories((dir / name).parent_path());
    std::ofstream(dir / name) << text;
    return dir / name;
  }
};

// An environment variable set (or unset) for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Runs `script` with the venv's python; its stdout as JSON.
json run_python(const fs::path& script, const std::string& arg, const Work& w) {
  const fs::path out = w.dir / "out.json", err = w.dir / "err.txt";
  const std::string cmd = std::string("'") + BATON_PYTHON + "' '" + script.string() + "' '" + arg +
                          "' >'" + out.string() + "' 2>'" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  std::stringstream err_text;
  err_text << std::ifstream(err).rdbuf();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err_text.str();
  std::ifstream in(out);
  return json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// wandb 0.31 has no Python reader of its .wandb files: they are LevelDB-style
// logs (a 7-byte ":W&B" header, then 32 KiB blocks of records with a 7-byte
// header: CRC, length, type) of wandb_internal_pb2.Record protobufs, read
// here with wandb's own protobuf classes.
constexpr const char* kReader = R"PY(
import glob, json, math, struct, sys
from wandb.proto import wandb_internal_pb2 as pb
files = glob.glob(sys.argv[1] + "/wandb/offline-run-*/run-*.wandb")
assert len(files) == 1, files
data = open(files[0], "rb").read()
assert data[:7] == b":W&B\xe1\xbe\x00", data[:7]
block, pos, pending, records = 32768, 7, b"", []
while pos + 7 <= len(data):
    if block - pos % block < 7:
        pos += block - pos % block
        continue
    crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0 and length == 0:
        break
    chunk = data[pos + 7:pos + 7 + length]
    pos += 7 + length
    pending = chunk if kind in (1, 2) else pending + chunk
    if kind in (1, 4):
        record = pb.Record()
        record.ParseFromString(pending)
        records.append(record)
def key(item):  # "a/b" is stored as nested_key ["a", "b"]
    return item.key or "/".join(item.nested_key)
def value(text):
    v = json.loads(text)
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v
out = {"history": []}
for r in records:
    kind = r.WhichOneof("record_type")
    if kind == "run":
        out["project"], out["name"] = r.run.project, r.run.display_name
        out["config"] = {key(u): value(u.value_json) for u in r.run.config.update
                         if not key(u).startswith("_")}
    elif kind == "history":
        row = {key(i): value(i.value_json) for i in r.history.item if not key(i).startswith("_")}
        out["history"].append({"step": r.history.step.num, "metrics": row})
print(json.dumps(out))
)PY";

TEST(Wandb, TheLoggersOfflineRunReadsBackWithWandbsRecords) {
  Work w;
  ScopedEnv mode("WANDB_MODE", std::nullopt), dir("WANDB_DIR", std::nullopt);
  {
    MetricsLoggerOptions o;
    o.loggers = {"wandb"};
    o.dir = w.dir / "run";  // wandb's files go under the run's directory
    o.set_names("baton_tests", "wandb_logger");
    o.wandb.set_python(BATON_PYTHON)
        .set_config_yaml(
            "trainer:\n  project_name: baton_tests\n  total_epochs: 3\n"
            "algorithm:\n  adv_estimator: grpo\n");
    MetricsLogger logger(o);
    logger.log(0, {{"val-core/openai/gsm8k/reward/mean@1", 0.25}});
    logger.log(1, {{"critic/score/mean", 0.5}, {"actor/pg_loss", -0.125}});
    logger.log(2, {{"critic/score/mean", 0.75},
                   {"actor/pg_loss", std::numeric_limits<double>::quiet_NaN()}});
  }
  const json got = run_python(w.write("read.py", kReader), (w.dir / "run").string(), w);
  EXPECT_EQ(got["project"], "baton_tests");
  EXPECT_EQ(got["name"], "wandb_logger");
  EXPECT_EQ(got["config"],
            json({{"trainer", {{"project_name", "baton_tests"}, {"total_epochs", 3}}},
                  {"algorithm", {{"adv_estimator", "grpo"}}}}));
  const json history = json::array(
      {{{"step", 0}, {"metrics", {{"val-core/openai/gsm8k/reward/mean@1", 0.25}}}},
       {{"step", 1}, {"metrics", {{"critic/score/mean", 0.5}, {"actor/pg_loss", -0.125}}}},
       {{"step", 2}, {"metrics", {{"critic/score/mean", 0.75}, {"actor/pg_loss", "nan"}}}}});
  EXPECT_EQ(got["history"], history);
}

// A `wandb` package standing in for the real one (first on PYTHONPATH of a
// wrapper around the venv's python): it records wandb.init's arguments, and
// its run.log exits at step 2 and hangs at step 5.
struct FakeWandb {
  Work w;
  fs::path python;
  FakeWandb(const std::string& wandb_py) {
    w.write("fake/wandb.py", wandb_py);
    python = w.write("python", "#!/bin/sh\nPYTHONPATH='" + (w.dir / "fake").string() + "' exec '" +
                                   BATON_PYTHON + "' \"$@\"\n");
    ::chmod(python.c_str(), 0755);
  }
  WandbOptions options() const {
    return WandbOptions().set_python(python.string()).set_names("p", "e").set_dir(w.dir / "run");
  }
};

constexpr const char* kFakeWandb = R"PY(
import json, os, sys, time
class Settings:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
class Run:
    dir = None
    def log(self, metrics, step=None):
        if step == 2:
            os._exit(7)
        if step == 5:
            time.sleep(600)
    def finish(self, exit_code=0):
        pass
def init(**kwargs):
    if kwargs["project"] == "bad":
        raise ValueError("project 'bad' is not allowed")
    kwargs["settings"] = kwargs["settings"] and kwargs["settings"].kwargs
    with open(os.path.join(kwargs["dir"], "init.json"), "w") as f:
        json.dump(kwargs, f)
    return Run()
)PY";

json init_arguments(const FakeWandb& fake) {
  std::ifstream in(fake.w.dir / "run" / "init.json");
  return json::parse(in, nullptr, false);
}

TEST(Wandb, InitGetsVerlsArgumentsAndTheModeIsOfflineUnlessWandbModeSaysOtherwise) {
  FakeWandb fake(kFakeWandb);
  {
    ScopedEnv mode("WANDB_MODE", std::nullopt), entity("WANDB_ENTITY", "team");
    WandbOptions o = fake.options();
    o.set_config_yaml("trainer:\n  logger: [console, wandb]\n");
    o.https_proxy = "http://proxy:3128";
    WandbWriter writer(o);
    writer.finish();
    EXPECT_EQ(init_arguments(fake),
              json({{"project", "p"},
                    {"name", "e"},
                    {"entity", "team"},
                    {"config", {{"trainer", {{"logger", {"console", "wandb"}}}}}},
                    {"settings", {{"https_proxy", "http://proxy:3128"}}},
                    {"dir", (fake.w.dir / "run").string()},
                    {"mode", "offline"}}));
  }
  {
    ScopedEnv mode("WANDB_MODE", "online"), entity("WANDB_ENTITY", std::nullopt);
    WandbWriter writer(fake.options());
    writer.finish();
    const json args = init_arguments(fake);
    EXPECT_FALSE(args.contains("mode")) << "wandb reads WANDB_MODE itself: " << args;
    EXPECT_EQ(args["entity"], nullptr);
    EXPECT_EQ(args["config"], nullptr);
    EXPECT_EQ(args["settings"], nullptr);
  }
}

// $WANDB_DIR, when set, is where the logger's run goes.
TEST(Wandb, TheLoggerHonoursWandbDir) {
  FakeWandb fake(kFakeWandb);
  ScopedEnv dir("WANDB_DIR", (fake.w.dir / "elsewhere").string());
  MetricsLoggerOptions o;
  o.loggers = {"wandb"};
  o.dir = fake.w.dir / "run";
  o.wandb.set_python(fake.python.string());
  { MetricsLogger logger(o); }
  EXPECT_TRUE(fs::exists(fake.w.dir / "elsewhere" / "init.json"));
  EXPECT_FALSE(fs::exists(fake.w.dir / "run" / "init.json"));
}

TEST(Wandb, ADeadOrHungSubprocessIsAnErrorNotAHang) {
  FakeWandb fake(kFakeWandb);
  WandbWriter dies(fake.options());
  dies.log(1, {{"a", 1.0}});
  try {
    dies.log(2, {{"a", 2.0}});
    ADD_FAILURE() << "a dead subprocess was not noticed";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "run.log at step 2");
    EXPECT_CONTAINS(e.what(), "exited with status 7");
  }
  EXPECT_THROW(dies.log(3, {{"a", 3.0}}), Error) << "a failed writer keeps failing";
  dies.finish();  // nothing left to finish: no error, no wait

  WandbOptions o = fake.options();
  o.timeout_s = 0.5;
  WandbWriter hangs(o);
  try {
    hangs.log(5, {{"a", 5.0}});
    ADD_FAILURE() << "a hung subprocess was waited for";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "no answer within 0.5 s; the wandb subprocess was killed");
  }
}

TEST(Wandb, APythonWithoutWandbOrAFailingInitIsNamed) {
  Work w;
  const fs::path python = w.write("python", "#!/bin/sh\nPYTHONPATH='" + (w.dir / "fake").string() +
                                                "' exec '" + BATON_PYTHON + "' \"$@\"\n");
  ::chmod(python.c_str(), 0755);
  w.write("fake/wandb.py", "raise ModuleNotFoundError(\"No module named 'wandb'\")\n");
  const std::string message = "trainer.logger: wandb needs the wandb package in " +
                              python.string() + " (ModuleNotFoundError: No module named 'wandb'";
  try {
    check_wandb_importable(python.string());
    ADD_FAILURE() << "a python without wandb passed the check";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), message);
    EXPECT_CONTAINS(e.what(), "loggers baton has: console, file, tensorboard, wandb");
  }
  MetricsLoggerOptions o;
  o.loggers = {"console", "wandb"};
  o.wandb.set_python(python.string()).set_dir(w.dir / "run");
  try {
    MetricsLogger logger(o);
    ADD_FAILURE() << "a python without wandb started the logger";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), message);
  }
  try {
    check_wandb_importable("/no/such/python3");
    ADD_FAILURE() << "a missing python passed the check";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "cannot start /no/such/python3");
    EXPECT_CONTAINS(e.what(), "trainer.logger_python");
  }
  FakeWandb fake(kFakeWandb);
  try {
    WandbWriter writer(fake.options().set_names("bad", "e"));
    ADD_FAILURE() << "a failing wandb.init was not noticed";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "wandb.init failed: ValueError: project 'bad' is not allowed");
  }
  check_wandb_importable(BATON_PYTHON);  // the venv has it (scripts/setup_python.sh)
}

}  // namespace
}  // namespace baton::trainer
