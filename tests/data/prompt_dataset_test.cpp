// verl-format JSONL prompts: rendering, truncation, filtering, padding and row errors.
#include "data/prompt_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include "text/chat_template.h"

namespace baton::data {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

// A JSONL file in a fresh temporary directory.
class PromptFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("baton_prompts_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // The message of the error load throws ("" if none).
  std::string load_error(const std::string& path, const Tokenizer& tok,
                         const PromptDatasetOptions& options = {}) {
    try {
      PromptDataset::load({path}, tok, options);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  std::filesystem::path dir_;
};

#define EXPECT_CONTAINS(message, part) \
  EXPECT_NE(std::string(message).find(part), std::string::npos) << "message: " << (message)

const char* kRow =
    R"({"data_source": "gsm8k", "prompt": "%s", "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"index": 3}})";

std::string row(const std::string& prompt) {
  std::string s = kRow;
  return s.replace(s.find("%s"), 2, prompt) + "\n";
}

TEST_F(PromptFiles, ChatPromptsAreRenderedAndStringPromptsKept) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  const std::string path = write(
      "train.jsonl",
      R"({"data_source": "math", "prompt": [{"role": "user", "content": "What is 2+2?"}], "reward_model": {"ground_truth": 4}})"
      "\n\n" +
          row("plain text"));
  const PromptDataset ds = PromptDataset::load({path}, tok);
  ASSERT_EQ(ds.size(), 2u);  // the empty line is skipped
  const ChatTemplate chat = ChatTemplate::from_template(tok.chat_template(), "bpe");
  EXPECT_EQ(ds.row(0).prompt_text, chat.render({{"user", "What is 2+2?"}}, true));
  EXPECT_EQ(ds.row(0).prompt_ids, tok.encode(ds.row(0).prompt_text, false));
  EXPECT_EQ(ds.row(0).data_source, "math");
  EXPECT_EQ(ds.row(0).ground_truth, "4");
  EXPECT_EQ(ds.row(0).extra_info, "{}");
  EXPECT_EQ(ds.row(1).prompt_text, "plain text");
  EXPECT_EQ(ds.row(1).ground_truth, "72");
  EXPECT_EQ(ds.row(1).extra_info, R"({"index":3})");
  EXPECT_EQ(ds.row(1).line, 3);
}

TEST_F(PromptFiles, SeveralFilesAreReadInOrder) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/wordlevel");
  const std::string first = write("a.jsonl", row("ab") + row("cd"));
  const std::string second = write("b.jsonl", row("ef"));
  const PromptDataset ds = PromptDataset::load({first, second}, tok);
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds.row(2).prompt_text, "ef");
  EXPECT_EQ(ds.row(2).file, second);
  EXPECT_EQ(ds.row(2).line, 1);
}

TEST_F(PromptFiles, WithoutChatTemplateMessagesAreConcatenated) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/wordlevel");
  const std::string path = write(
      "t.jsonl",
      R"({"data_source": "d", "prompt": [{"role": "system", "content": "ab"}, {"role": "user", "content": "cd"}], "reward_model": {"ground_truth": "x"}})"
      "\n");
  const PromptDataset ds = PromptDataset::load({path}, tok);
  EXPECT_EQ(ds.row(0).prompt_text, "ab\ncd");
}

// The wordlevel fixture tokenizes one character per token (spaces dropped), so lengths are
// easy to derive by hand: "abcdefgh" is 8 tokens.
TEST_F(PromptFiles, TruncationKeepsTheChosenEnd) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/wordlevel");
  const std::string path = write("t.jsonl", row("abcdefgh"));
  const auto ids = tok.encode("abcdefgh", false);
  ASSERT_EQ(ids.size(), 8u);
  const auto opts = [](Truncation t) {
    return PromptDatasetOptions().set_max_prompt_length(5).set_truncation(t);
  };
  EXPECT_EQ(PromptDataset::load({path}, tok, opts(Truncation::kLeft)).row(0).prompt_ids,
            std::vector<int32_t>(ids.begin() + 3, ids.end()));
  EXPECT_EQ(PromptDataset::load({path}, tok, opts(Truncation::kRight)).row(0).prompt_ids,
            std::vector<int32_t>(ids.begin(), ids.begin() + 5));
  const std::vector<int32_t> middle = {ids[0], ids[1], ids[5], ids[6], ids[7]};  // 2 + 3
  EXPECT_EQ(PromptDataset::load({path}, tok, opts(Truncation::kMiddle)).row(0).prompt_ids, middle);
  const std::string msg = load_error(path, tok, opts(Truncation::kError));
  EXPECT_CONTAINS(msg, path + ":1");
  EXPECT_CONTAINS(msg, "8 tokens");
  EXPECT_CONTAINS(msg, "max_prompt_length = 5");
}

TEST_F(PromptFiles, FilterOverlongPromptsDropsThemBeforeTruncation) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/wordlevel");
  const std::string path = write("t.jsonl", row("abc") + row("abcdefgh") + row("abcde"));
  const PromptDataset ds = PromptDataset::load(
      {path}, tok, PromptDatasetOptions().set_max_prompt_length(5).set_filter_overlong_prompts(true));
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds.filtered(), 1u);
  EXPECT_EQ(ds.row(1).prompt_text, "abcde");
}

TEST_F(PromptFiles, BatchesAreLeftPaddedWithMaskAndPositions) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/wordlevel");  // pad_token [PAD] = 0
  const std::string path = write("t.jsonl", row("ab") + row("abcd"));
  const PromptDataset ds =
      PromptDataset::load({path}, tok, PromptDatasetOptions().set_max_prompt_length(4));
  EXPECT_EQ(ds.pad_id(), 0);
  const PromptBatch b = ds.batch({1, 0});
  const auto a = tok.encode("abcd", false);
  EXPECT_EQ(b.size, 2);
  EXPECT_EQ(b.seq_len, 4);
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{a[0], a[1], a[2], a[3], 0, 0, a[0], a[1]}));
  EXPECT_EQ(b.attention_mask, (std::vector<int32_t>{1, 1, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(b.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 0, 0, 0, 1}));
  EXPECT_EQ(b.raw_prompt_ids[1], (std::vector<int32_t>{a[0], a[1]}));
  EXPECT_EQ(b.indices, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(b.ground_truths, (std::vector<std::string>{"72", "72"}));
}

TEST_F(PromptFiles, BadRowsNameFileLineAndField) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  struct Case {
    std::string line, want;
  };
  const std::vector<Case> cases = {
      {R"({"data_source": "d", "prompt": 5, "reward_model": {"ground_truth": "1"}})",
       "field 'prompt': expected a string or a list"},
      {R"({"data_source": "d", "prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}})",
       "field 'prompt'[0].content: expected a string"},
      {R"({"prompt": "p", "reward_model": {"ground_truth": "1"}})", "field 'data_source'"},
      {R"({"data_source": "d", "prompt": "p", "reward_model": {}})",
       "field 'reward_model.ground_truth' is missing"},
      {R"({"data_source": "d", "prompt": "p", "reward_model": {"ground_truth": [1]}})",
       "field 'reward_model.ground_truth': expected a string or a number"},
      {R"({"data_source": "d", "prompt": "p", "reward_model": {"ground_truth": "1"}, "extra_info": 3})",
       "field 'extra_info': expected an object"},
      {R"({"data_source": "d", "prompt": "p",)", "malformed JSON"},
      {R"({"data_source": "d", "prompt": "p", "n": 1e999})", "malformed JSON"},  // past a double
      {R"([1, 2])", "expected a JSON object per line"},
  };
  for (const Case& c : cases) {
    const std::string path = write("bad.jsonl", row("fine") + c.line + "\n");
    const std::string msg = load_error(path, tok);
    EXPECT_CONTAINS(msg, path + ":2: ");
    EXPECT_CONTAINS(msg, c.want);
  }
  EXPECT_CONTAINS(load_error((dir_ / "missing.jsonl").string(), tok), "missing.jsonl: cannot open");
}

TEST_F(PromptFiles, UnsupportedChatTemplateFailsOnTheFirstChatRow) {
  std::ifstream in(kFixtures + "/bpe/tokenizer.json");
  const std::string tokenizer_json((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  const Tokenizer tok = Tokenizer::from_json(
      tokenizer_json,
      R"({"eos_token": "<|im_end|>", "chat_template": "{% include 'chat.jinja' %}"})", "models/m");
  const std::string path = write(
      "t.jsonl",
      row("strings need no template") +
          R"({"data_source": "d", "prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": "1"}})"
          "\n");
  const std::string msg = load_error(path, tok);
  EXPECT_CONTAINS(msg, path + ":2: ");
  EXPECT_CONTAINS(msg, "chat_template");
}

}  // namespace
}  // namespace baton::data
