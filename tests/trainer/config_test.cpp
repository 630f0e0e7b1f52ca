#include "trainer/config/config.h"

#include "base/did_you_mean.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include "base/atomic_file.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;

const fs::path kBase = fs::path(BATON_CONFIGS_DIR) / "ppo_trainer.yaml";

// The message of the ConfigError `body` throws ("" if it throws nothing).
template <typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// A scratch folder removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("baton_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { baton::remove_tree(path_); }
  const fs::path& path() const { return path_; }
  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(Config, BaseConfigHasVerlDefaults) {
  const Config c = Config::load(kBase);
  EXPECT_EQ(c.get<int64_t>("data.train_batch_size"), 1024);
  EXPECT_EQ(c.get<int64_t>("data.max_prompt_length"), 512);
  EXPECT_EQ(c.get<std::string>("data.truncation"), "error");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.ppo_mini_batch_size"), 256);
  EXPECT_TRUE(c.is_null("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"));
  EXPECT_EQ(c.get<double>("actor_rollout_ref.actor.clip_ratio"), 0.2);
  EXPECT_EQ(c.get<double>("actor_rollout_ref.actor.optim.lr"), 1e-6);
  EXPECT_EQ(c.get<std::vector<double>>("actor_rollout_ref.actor.optim.betas"),
            (std::vector<double>{0.9, 0.999}));
  EXPECT_FALSE(c.get<bool>("actor_rollout_ref.actor.use_kl_loss"));
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.actor.kl_loss_type"), "low_var_kl");
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.actor.loss_agg_mode"), "token-mean");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.megatron.tensor_model_parallel_size"), 1);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.tensor_model_parallel_size"), 2);
  EXPECT_EQ(c.get<std::string>("algorithm.adv_estimator"), "gae");
  EXPECT_EQ(c.get<double>("algorithm.kl_ctrl.kl_coef"), 0.001);
  EXPECT_EQ(c.get<int64_t>("trainer.total_epochs"), 30);
  EXPECT_TRUE(c.is_null("trainer.total_training_steps"));
  EXPECT_EQ(c.get<int64_t>("trainer.save_freq"), -1);
  EXPECT_EQ(c.get<std::string>("trainer.resume_mode"), "auto");
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"),
            (std::vector<std::string>{"console", "file"}));
}

TEST(Config, InterpolationsFollowTheKeysTheyName) {
  const Config c = Config::load(kBase);
  EXPECT_EQ(c.get<int64_t>("critic.ppo_mini_batch_size"), 256);
  EXPECT_EQ(c.get<std::string>("critic.loss_agg_mode"), "token-mean");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.response_length"), 512);
  EXPECT_EQ(c.get<std::string>("trainer.default_local_dir"), "checkpoints/baton_examples/gsm8k");
  // A reference to a null key is null.
  EXPECT_TRUE(c.is_null("critic.model.path"));
}

TEST(Config, OverrideSetsScalarsOfEachType) {
  Config c = Config::load(kBase);
  c.apply_overrides({"data.train_batch_size=16", "actor_rollout_ref.actor.clip_ratio=0.3",
                     "actor_rollout_ref.actor.use_kl_loss=true", "data.truncation=left",
                     "actor_rollout_ref.model.path=/models/qwen", "data.val_batch_size=8",
                     "actor_rollout_ref.actor.optim.lr=3e-5"});
  EXPECT_EQ(c.get<int64_t>("data.train_batch_size"), 16);
  EXPECT_EQ(c.get<double>("actor_rollout_ref.actor.clip_ratio"), 0.3);
  EXPECT_TRUE(c.get<bool>("actor_rollout_ref.actor.use_kl_loss"));
  EXPECT_EQ(c.get<std::string>("data.truncation"), "left");
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.model.path"), "/models/qwen");
  EXPECT_EQ(c.get<int64_t>("data.val_batch_size"), 8);
  EXPECT_EQ(c.get<double>("actor_rollout_ref.actor.optim.lr"), 3e-5);
  // null disables a setting again.
  c.apply_override("data.val_batch_size=null");
  EXPECT_TRUE(c.is_null("data.val_batch_size"));
}

TEST(Config, IntIsAcceptedForFloatAndAnyScalarForString) {
  Config c = Config::load(kBase);
  c.apply_overrides({"algorithm.gamma=1", "trainer.experiment_name=2024"});
  EXPECT_EQ(c.get<double>("algorithm.gamma"), 1.0);
  EXPECT_EQ(c.get<std::string>("trainer.experiment_name"), "2024");
  // The float stays a float when written out and read back.
  const Config back = Config::from_yaml(c.to_yaml());
  EXPECT_EQ(back.get<double>("algorithm.gamma"), 1.0);
  EXPECT_NE(error_of([&] { back.get<int64_t>("algorithm.gamma"); }), "");
}

TEST(Config, OverridesAreSeenThroughInterpolations) {
  Config c = Config::load(kBase);
  c.apply_overrides({"actor_rollout_ref.actor.ppo_mini_batch_size=64", "trainer.project_name=math",
                     "data.max_response_length=128"});
  EXPECT_EQ(c.get<int64_t>("critic.ppo_mini_batch_size"), 64);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.response_length"), 128);
  EXPECT_EQ(c.get<std::string>("trainer.default_local_dir"), "checkpoints/math/gsm8k");
  // Setting an interpolated key replaces the reference, leaving its target alone.
  c.apply_override("critic.ppo_mini_batch_size=32");
  EXPECT_EQ(c.get<int64_t>("critic.ppo_mini_batch_size"), 32);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.ppo_mini_batch_size"), 64);
  // ...and is type-checked against the value it referred to.
  EXPECT_CONTAINS(error_of([&] { c.apply_override("critic.ppo_epochs=many"); }),
                  "config key 'critic.ppo_epochs' expects an int, got a string ('many')");
}

TEST(Config, OverrideParsesLists) {
  Config c = Config::load(kBase);
  c.apply_override("trainer.logger=[console]");
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"), std::vector<std::string>{"console"});
  // The spelling verl's docs use, after the shell removed the outer quotes.
  c.apply_override("trainer.logger=[\"console\",\"file\"]");
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"),
            (std::vector<std::string>{"console", "file"}));
  c.apply_override("trainer.logger=[]");
  EXPECT_TRUE(c.get<std::vector<std::string>>("trainer.logger").empty());
  c.apply_override("actor_rollout_ref.actor.optim.betas=[0.8, 1]");
  EXPECT_EQ(c.get<std::vector<double>>("actor_rollout_ref.actor.optim.betas"),
            (std::vector<double>{0.8, 1.0}));
  // Elements keep the type the list's elements had.
  EXPECT_CONTAINS(error_of([&] { c.apply_override("actor_rollout_ref.actor.optim.betas=[a,b]"); }),
                  "config key 'actor_rollout_ref.actor.optim.betas[0]' expects a float, got a "
                  "string ('a')");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("trainer.logger=[console"); }),
                  "cannot parse YAML in override 'trainer.logger=[console'");
}

TEST(Config, OverrideWithMappingMergesKeyByKey) {
  Config c = Config::load(kBase);
  c.apply_override("actor_rollout_ref.rollout.val_kwargs={n: 4, temperature: 0.6}");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.val_kwargs.n"), 4);
  EXPECT_EQ(c.get<double>("actor_rollout_ref.rollout.val_kwargs.temperature"), 0.6);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.val_kwargs.top_k"), -1);
  EXPECT_CONTAINS(
      error_of([&] { c.apply_override("actor_rollout_ref.rollout.val_kwargs={nn: 4}"); }),
      "unknown config key 'actor_rollout_ref.rollout.val_kwargs.nn'");
}

TEST(Config, PlusAddsKeysThatDoNotExist) {
  Config c = Config::load(kBase);
  c.apply_overrides({"+trainer.note=first run", "+my.nested.value=3", "+data.extra=[1, 2]"});
  EXPECT_EQ(c.get<std::string>("trainer.note"), "first run");
  EXPECT_EQ(c.get<int64_t>("my.nested.value"), 3);
  EXPECT_EQ(c.get<std::vector<int64_t>>("data.extra"), (std::vector<int64_t>{1, 2}));
  EXPECT_CONTAINS(error_of([&] { c.apply_override("+data.train_batch_size=2"); }),
                  "config key 'data.train_batch_size' already exists");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("+data.shuffle.deeper=1"); }),
                  "'data.shuffle' is a bool, not a mapping");
  // ++ adds or sets.
  c.apply_overrides({"++trainer.note=second", "++trainer.other=1"});
  EXPECT_EQ(c.get<std::string>("trainer.note"), "second");
  EXPECT_EQ(c.get<int64_t>("trainer.other"), 1);
}

TEST(Config, UnknownKeyFailsNamingTheClosestKnownKey) {
  Config c = Config::load(kBase);
  const std::string message =
      error_of([&] { c.apply_override("actor_rollout_ref.actor.clip_ratoi=0.3"); });
  EXPECT_CONTAINS(message, "unknown config key 'actor_rollout_ref.actor.clip_ratoi'");
  EXPECT_CONTAINS(message, "did you mean 'actor_rollout_ref.actor.clip_ratio'?");
  EXPECT_CONTAINS(message, "'+actor_rollout_ref.actor.clip_ratoi=...'");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("trainer.total_epoch=3"); }),
                  "did you mean 'trainer.total_epochs'?");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("actor_rollout_ref.rolout.n=4"); }),
                  "did you mean 'actor_rollout_ref.rollout.n'?");
  EXPECT_CONTAINS(error_of([&] { c.get<int64_t>("data.train_batch"); }),
                  "unknown config key 'data.train_batch'");
}

// verl's scripts pass one path where the config has a list:
// data.train_files=$HOME/data/gsm8k/train.parquet is a list of one.
TEST(Config, AStringWhereAListOfStringsStandsIsAListOfOne) {
  Config c = Config::load(kBase);
  c.apply_overrides({"data.train_files=/data/gsm8k/train.parquet", "trainer.logger=console"});
  EXPECT_EQ(c.get<std::vector<std::string>>("data.train_files"),
            std::vector<std::string>{"/data/gsm8k/train.parquet"});
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"), std::vector<std::string>{"console"});
}

// A key that was null has no type (Hydra's Any): verl's scripts set
// data.train_files to one path and, later on the same line, to a list.
TEST(Config, AKeyThatWasNullTakesAnyValueEachTime) {
  Config c = Config::load(kBase);
  c.apply_overrides({"data.train_files=/data/a.parquet", "data.train_files=[/b.jsonl, /c.jsonl]"});
  EXPECT_EQ(c.get<std::vector<std::string>>("data.train_files"),
            (std::vector<std::string>{"/b.jsonl", "/c.jsonl"}));
  c.apply_overrides({"data.train_files=/d.parquet"});
  EXPECT_EQ(c.get<std::vector<std::string>>("data.train_files"),
            std::vector<std::string>{"/d.parquet"});
  // A typed key stays typed.
  c.apply_override("data.train_batch_size=8");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("data.train_batch_size=[8]"); }),
                  "expects an int, got a list");
}

TEST(Config, WrongTypeFailsNamingKeyExpectedAndGivenType) {
  Config c = Config::load(kBase);
  EXPECT_CONTAINS(error_of([&] { c.apply_override("data.train_batch_size=abc"); }),
                  "config key 'data.train_batch_size' expects an int, got a string ('abc') from "
                  "override 'data.train_batch_size=abc'");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("data.train_batch_size=0.5"); }),
                  "expects an int, got a float ('0.5')");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("actor_rollout_ref.actor.use_kl_loss=yes"); }),
                  "config key 'actor_rollout_ref.actor.use_kl_loss' expects a bool, got a string "
                  "('yes')");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("trainer.logger={a: 1}"); }),
                  "config key 'trainer.logger' expects a list, got a mapping");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("actor_rollout_ref.rollout=3"); }),
                  "config key 'actor_rollout_ref.rollout' expects a mapping, got an int ('3')");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("data.shuffle=[true]"); }),
                  "expects a bool, got a list");
  // A quoted number is a string.
  EXPECT_CONTAINS(error_of([&] { c.apply_override("data.train_batch_size='16'"); }),
                  "expects an int, got a string ('16')");
  // Nothing was changed by the failed overrides.
  EXPECT_EQ(c.get<int64_t>("data.train_batch_size"), 1024);
}

TEST(Config, TypedReadsFailNamingTheKey) {
  const Config c = Config::load(kBase);
  EXPECT_CONTAINS(error_of([&] { c.get<int64_t>("data.prompt_key"); }),
                  "config key 'data.prompt_key' expects an int, got a string ('prompt')");
  EXPECT_CONTAINS(error_of([&] { c.get<int64_t>("actor_rollout_ref.actor.clip_ratio"); }),
                  "expects an int, got a float ('0.2')");
  EXPECT_CONTAINS(error_of([&] { c.get<int64_t>("trainer.total_training_steps"); }),
                  "config key 'trainer.total_training_steps' is null");
  EXPECT_CONTAINS(error_of([&] { c.get<std::string>("data"); }),
                  "config key 'data' expects a string, got a mapping");
  EXPECT_CONTAINS(
      error_of([&] { c.get<std::vector<int64_t>>("actor_rollout_ref.actor.optim.betas"); }),
      "config key 'actor_rollout_ref.actor.optim.betas[0]' expects an int, got a float");
  EXPECT_EQ(c.get_optional<int64_t>("trainer.total_training_steps"), std::nullopt);
  EXPECT_EQ(c.get_optional<int64_t>("trainer.total_epochs"), 30);
}

TEST(Config, MalformedOverridesAreRejected) {
  Config c = Config::load(kBase);
  EXPECT_CONTAINS(error_of([&] { c.apply_override("data.train_batch_size"); }),
                  "malformed override 'data.train_batch_size': expected key=value");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("data..shuffle=true"); }),
                  "malformed config key 'data..shuffle'");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("=3"); }), "malformed config key ''");
}

// Found by tests/fuzz/fuzz_yaml_config: `+++a=1` made a key named '+a', which to_yaml wrote and
// from_yaml read back as 'a' (a second 'a' beside the first).
TEST(Config, APlusMarksAKeyAndNeverStartsAName) {
  EXPECT_CONTAINS(error_of([] { Config::from_yaml("a: 1\n+a: 2\n", "f.yaml"); }),
                  "f.yaml:2: key '+a' is 'a' again");
  Config c = Config::from_yaml("a: {b: 1}\n");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("+++a.c=1"); }), "malformed config key '+a.c'");
  EXPECT_CONTAINS(error_of([&] { c.apply_override("++a.+c=1"); }), "malformed config key 'a.+c'");
  c.apply_overrides({"++a.c=2", "+d={+e: 3}"});
  EXPECT_EQ(c.get<int64_t>("d.e"), 3);
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).to_yaml(), c.to_yaml());
  EXPECT_EQ(c.to_yaml(), "a:\n  b: 1\n  c: 2\nd:\n  e: 3\n");
}

// Found by tests/fuzz/fuzz_yaml_config: yaml-cpp wrote "$\r" unquoted, which read back as "$".
TEST(Config, ToYamlQuotesControlCharacters) {
  const Config c = Config::from_yaml("a: \"$\\r\"\nb: \"tab\\there\"\nc: \"\\x01\"\n");
  EXPECT_EQ(c.get<std::string>("a"), "$\r");
  EXPECT_EQ(c.to_yaml(), "a: \"$\\r\"\nb: \"tab\\there\"\nc: \"\\x01\"\n");
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).get<std::string>("b"), "tab\there");
}

TEST(Config, PlainOverrideValuesAreNotParsedAsYaml) {
  Config c = Config::load(kBase);
  c.apply_overrides({"trainer.experiment_name=run: 1 #a",
                     "trainer.project_name=", "actor_rollout_ref.model.path=a=b"});
  EXPECT_EQ(c.get<std::string>("trainer.experiment_name"), "run: 1 #a");
  EXPECT_EQ(c.get<std::string>("trainer.project_name"), "");
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.model.path"), "a=b");
}

TEST(Config, SetIsCheckedLikeAnOverride) {
  Config c = Config::load(kBase);
  c.set("data.train_batch_size", 8);
  c.set("actor_rollout_ref.rollout.temperature", 0.7);
  c.set("data.shuffle", false);
  c.set("trainer.project_name", "p");
  EXPECT_EQ(c.get<int64_t>("data.train_batch_size"), 8);
  EXPECT_EQ(c.get<double>("actor_rollout_ref.rollout.temperature"), 0.7);
  EXPECT_FALSE(c.get<bool>("data.shuffle"));
  EXPECT_EQ(c.get<std::string>("trainer.project_name"), "p");
  EXPECT_CONTAINS(error_of([&] { c.set("data.shuffle", 3); }),
                  "config key 'data.shuffle' expects a bool, got an int ('3')");
  EXPECT_CONTAINS(error_of([&] { c.set("data.shufle", true); }), "did you mean 'data.shuffle'?");
}

TEST(Config, KeysAndSections) {
  const Config c = Config::load(kBase);
  EXPECT_EQ(c.keys("actor_rollout_ref"),
            (std::vector<std::string>{"model", "actor", "ref", "rollout"}));
  EXPECT_EQ(c.keys().front(), "data");
  const Config rollout = c.section("actor_rollout_ref.rollout");
  // A section is resolved: its references to keys outside it still work.
  EXPECT_EQ(rollout.get<int64_t>("response_length"), 512);
  EXPECT_EQ(rollout.get<int64_t>("val_kwargs.n"), 1);
  EXPECT_TRUE(c.has("data.seed"));
  EXPECT_FALSE(c.has("data.seed.x"));
  EXPECT_FALSE(c.has("data.sead"));
  EXPECT_CONTAINS(error_of([&] { c.section("data.seed"); }), "expects a mapping, got an int");
}

TEST(Config, InterpolationErrorsNameTheKeys) {
  Config c = Config::load(kBase);
  c.apply_overrides(
      {"+x.a=${x.b}", "+x.b=${x.a}", "+x.c=${trainer.total_epoch}", "+x.d=run-${data}"});
  EXPECT_CONTAINS(error_of([&] { c.get<int64_t>("x.a"); }),
                  "config interpolation cycle: x.a -> x.b -> x.a");
  const std::string unknown = error_of([&] { c.get<int64_t>("x.c"); });
  EXPECT_CONTAINS(unknown,
                  "unknown config key 'trainer.total_epoch' (in '${trainer.total_epoch}', "
                  "the value of 'x.c')");
  EXPECT_CONTAINS(unknown, "did you mean 'trainer.total_epochs'?");
  EXPECT_CONTAINS(error_of([&] { c.get<std::string>("x.d"); }),
                  "'${data}' inside 'run-${data}' is a mapping");
  EXPECT_NE(error_of([&] { c.resolved(); }), "");
}

TEST(Config, FileOverridesItsBaseAndIsChecked) {
  TempDir dir;
  dir.write("base.yaml", "a:\n  b: 1\n  c: [x]\n  f: 0.5\nd: text\ne: ${a.b}\nn: null\n");
  const fs::path child =
      dir.write("sub/child.yaml",
                "base: ../base.yaml\na:\n  b: 2\n  +g: new\n+h: {i: 1, +j: 2}\nn: {+k: 3}\n");
  const Config c = Config::load(child);
  EXPECT_EQ(c.get<int64_t>("a.b"), 2);
  EXPECT_EQ(c.get<std::vector<std::string>>("a.c"), std::vector<std::string>{"x"});
  EXPECT_EQ(c.get<std::string>("a.g"), "new");
  EXPECT_EQ(c.get<int64_t>("h.i"), 1);
  EXPECT_EQ(c.get<int64_t>("h.j"), 2);  // new values are stored without their '+'
  EXPECT_EQ(c.get<int64_t>("n.k"), 3);  // a null key takes any value
  EXPECT_EQ(c.get<int64_t>("e"), 2);    // the base's reference sees the child's value
  EXPECT_FALSE(c.has("base"));

  // Bases chain.
  const fs::path grandchild = dir.write("sub/grandchild.yaml", "base: child.yaml\nd: other\n");
  const Config g = Config::load(grandchild);
  EXPECT_EQ(g.get<std::string>("d"), "other");
  EXPECT_EQ(g.get<int64_t>("a.b"), 2);

  // A key the base lacks, or a wrong type, fails naming file and line.
  const fs::path typo = dir.write("typo.yaml", "base: base.yaml\na:\n  bb: 2\n");
  const std::string typo_message = error_of([&] { Config::load(typo); });
  EXPECT_CONTAINS(typo_message, "unknown config key 'a.bb'");
  EXPECT_CONTAINS(typo_message, "typo.yaml:3");
  EXPECT_CONTAINS(typo_message, "did you mean 'a.b'?");
  const fs::path wrong = dir.write("wrong.yaml", "base: base.yaml\na:\n  f: half\n");
  EXPECT_CONTAINS(error_of([&] { Config::load(wrong); }),
                  "config key 'a.f' expects a float, got a string ('half') from");
  EXPECT_CONTAINS(
      error_of([&] { Config::load(dir.write("plus.yaml", "base: base.yaml\n+d: 1\n")); }),
      "config key 'd' already exists");
}

TEST(Config, BadFilesFailNamingThem) {
  TempDir dir;
  const fs::path a = dir.write("a.yaml", "base: b.yaml\nx: 1\n");
  dir.write("b.yaml", "base: a.yaml\nx: 2\n");
  EXPECT_CONTAINS(error_of([&] { Config::load(a); }), "config files name each other as base");
  EXPECT_CONTAINS(error_of([&] { Config::load(dir.path() / "missing.yaml"); }),
                  "missing.yaml': no such file");
  const fs::path missing_base = dir.write("c.yaml", "base: nowhere.yaml\n");
  EXPECT_CONTAINS(error_of([&] { Config::load(missing_base); }), "nowhere.yaml': no such file");
  const fs::path bad = dir.write("bad.yaml", "a: [1, 2\nb: 3\n");
  EXPECT_CONTAINS(error_of([&] { Config::load(bad); }), "cannot parse YAML in ");
  EXPECT_CONTAINS(error_of([&] { Config::load(dir.write("list.yaml", "- 1\n- 2\n")); }),
                  "the top level of a config must be a mapping");
  EXPECT_CONTAINS(error_of([&] { Config::load(dir.write("dup.yaml", "a: 1\na: 2\n")); }),
                  "key 'a' appears twice");
}

TEST(Config, ResolvedConfigRoundTripsThroughItsFile) {
  TempDir dir;
  Config c = Config::load(kBase);
  c.apply_overrides({"trainer.experiment_name='123'", "trainer.project_name=true story",
                     "+extra.empty=", "+extra.looks_null='null'", "+extra.colon=a: b",
                     "+extra.quote=it's \"x\"", "+extra.inf=.inf", "algorithm.gamma=1",
                     "+extra.nested={a: [1, 2], b: {c: ~}}", "+extra.map={}"});
  const fs::path saved = dir.path() / "run" / "config.yaml";
  c.save(saved);
  std::ifstream in(saved);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("${"), std::string::npos) << text;

  const Config back = Config::load(saved);
  // Exactly the resolved config: same text, same values and types.
  EXPECT_EQ(back.to_yaml(), c.resolved().to_yaml());
  EXPECT_EQ(back.get<std::string>("trainer.experiment_name"), "123");
  EXPECT_EQ(back.get<std::string>("trainer.project_name"), "true story");
  EXPECT_EQ(back.get<std::string>("trainer.default_local_dir"), "checkpoints/true story/123");
  EXPECT_EQ(back.get<std::string>("extra.empty"), "");
  EXPECT_EQ(back.get<std::string>("extra.looks_null"), "null");
  EXPECT_EQ(back.get<std::string>("extra.colon"), "a: b");
  EXPECT_EQ(back.get<std::string>("extra.quote"), "it's \"x\"");
  EXPECT_EQ(back.get<double>("extra.inf"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(back.get<double>("algorithm.gamma"), 1.0);
  EXPECT_EQ(back.get<std::vector<int64_t>>("extra.nested.a"), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(back.is_null("extra.nested.b.c"));
  EXPECT_TRUE(back.keys("extra.map").empty());
  EXPECT_EQ(back.get<int64_t>("critic.ppo_mini_batch_size"), 256);
  EXPECT_EQ(back.get<double>("actor_rollout_ref.actor.optim.lr"), 1e-6);
  EXPECT_EQ(back.get<std::vector<std::string>>("trainer.logger"),
            (std::vector<std::string>{"console", "file"}));
}

TEST(Config, CommandLineGivesFileOverridesAndTheRest) {
  TempDir dir;
  const fs::path file =
      dir.write("run.yaml", "base: " + kBase.string() + "\ndata:\n  train_batch_size: 32\n");
  const std::string config_arg = "--config=" + file.string();
  const char* argv[] = {"grpo",    "--config",        file.c_str(), "data.train_batch_size=16",
                        "--bench", "+trainer.note=x", "extra"};
  const CommandLineConfig parsed = config_from_command_line(7, argv);
  EXPECT_EQ(parsed.config.get<int64_t>("data.train_batch_size"), 16);
  EXPECT_EQ(parsed.config.get<std::string>("trainer.note"), "x");
  EXPECT_EQ(parsed.other_args, (std::vector<std::string>{"--bench", "extra"}));

  const char* equals_form[] = {"ppo", config_arg.c_str()};
  EXPECT_EQ(config_from_command_line(2, equals_form).config.get<int64_t>("data.train_batch_size"),
            32);
  // Without --config, the default file.
  const char* no_file[] = {"ppo", "trainer.total_epochs=2"};
  EXPECT_EQ(config_from_command_line(2, no_file, kBase).config.get<int64_t>("trainer.total_epochs"),
            2);
  EXPECT_CONTAINS(error_of([&] { config_from_command_line(2, no_file); }), "no config file");
  const char* dangling[] = {"ppo", "--config"};
  EXPECT_CONTAINS(error_of([&] { config_from_command_line(2, dangling); }),
                  "--config needs a file");
  const char* typo[] = {"ppo", "--config", file.c_str(), "data.train_bach_size=1"};
  EXPECT_CONTAINS(error_of([&] { config_from_command_line(4, typo); }),
                  "did you mean 'data.train_batch_size'?");
}

TEST(Config, ClosestMatchIsByEditDistance) {
  EXPECT_EQ(closest_match("lamb", {"gamma", "lam", "kl_ctrl"}), "lam");
  EXPECT_EQ(closest_match("x", {}), "");
  // The one edit distance every module's "did you mean" uses (base/did_you_mean.h).
  EXPECT_EQ(closest_match("vanila", {"gspo", "vanilla"}, 2), "vanilla");
  EXPECT_EQ(closest_match("ppo", {"gspo", "vanilla"}, 0), "");
  EXPECT_EQ(closest_match("dp_comput_proto", {"DP_COMPUTE_PROTO", "ONE_TO_ALL"}, 3, true),
            "DP_COMPUTE_PROTO");
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace baton::trainer
