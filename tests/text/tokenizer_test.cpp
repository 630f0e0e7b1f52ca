// The tokenizer against HF `tokenizers` 0.23.3: fixtures/make_tokenizer_fixtures.py trained the
// tokenizers and wrote HF's encodings and decodings; baton must give the same, token for token.
#include "text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "text/tokenizer/decoder.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/pre_tokenizer.h"

namespace baton::data {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const nlohmann::json& expected() {
  static const nlohmann::json e =
      nlohmann::json::parse(read(kFixtures + "/tokenizer_expected.json"));
  return e;
}

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, EncodeAndDecodeEqualHfTokenForToken) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/" + GetParam());
  const auto& cases = expected().at(GetParam());
  ASSERT_GT(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    SCOPED_TRACE("text: \"" + text + "\"");
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const auto plain = c.at("ids_no_special").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, true), ids);
    EXPECT_EQ(tok.encode(text, false), plain);
    EXPECT_EQ(tok.decode(ids, false), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip_special").get<std::string>());
    const auto& prefixes = c.at("prefix_decodes");
    for (std::size_t k = 0; k < prefixes.size(); ++k) {
      const std::vector<int32_t> prefix(plain.begin(),
                                        plain.begin() + static_cast<std::ptrdiff_t>(k));
      EXPECT_EQ(tok.decode(prefix, false), prefixes[k].get<std::string>()) << "prefix of " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity,
                         ::testing::Values("bpe", "wordlevel", "bpe_legacy_merges",
                                           "bpe_ignore_merges"));

TEST(HfParity, PreTokenizersCutTextAsHfDoes) {
  const auto& cases = expected().at("pre_tokenizers");
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.at("config").dump());
    const auto pre = make_pre_tokenizer(c.at("config"), "test");
    for (std::size_t i = 0; i < c.at("texts").size(); ++i) {
      const std::string text = c.at("texts")[i];
      EXPECT_EQ(pre_tokenize(pre.get(), text), c.at("pieces")[i].get<std::vector<std::string>>())
          << "text: \"" << text << "\"";
    }
  }
}

TEST(HfParity, NfcNormalizesAsHfDoes) {
  for (const auto& c : expected().at("normalizers")) {
    const auto normalizer = make_normalizer(c.at("config"), "test");
    for (std::size_t i = 0; i < c.at("texts").size(); ++i) {
      EXPECT_EQ(normalizer->normalize(c.at("texts")[i].get<std::string>()),
                c.at("outputs")[i].get<std::string>())
          << "text #" << i;
    }
  }
}

TEST(HfParity, DecodersJoinTokensAsHfDoes) {
  for (const auto& c : expected().at("decoders")) {
    SCOPED_TRACE(c.at("config").dump());
    const auto decoder = make_decoder(c.at("config"), "test");
    for (std::size_t i = 0; i < c.at("token_lists").size(); ++i) {
      EXPECT_EQ(decoder->decode(c.at("token_lists")[i].get<std::vector<std::string>>()),
                c.at("outputs")[i].get<std::string>())
          << "token list #" << i;
    }
  }
}

// Hand-checked against the fixture files: Qwen2's layout (700 BPE tokens, then
// <|endoftext|> 700, <|im_start|> 701, <|im_end|> 702 and four other added tokens).
TEST(Tokenizer, ReadsSpecialTokensAndChatTemplateFromConfig) {
  const Tokenizer bpe = Tokenizer::load(kFixtures + "/bpe");
  EXPECT_EQ(bpe.vocab_size(), 707);
  EXPECT_FALSE(bpe.bos_id().has_value());
  EXPECT_EQ(bpe.eos_id(), 702);
  EXPECT_EQ(bpe.pad_id(), 700);
  EXPECT_EQ(bpe.token_to_id("<|im_start|>"), 701);
  EXPECT_EQ(bpe.id_to_token(702), "<|im_end|>");
  EXPECT_EQ(bpe.token_to_id("Ġthe"), bpe.encode(" the", false).at(0));
  EXPECT_TRUE(bpe.is_special(700));
  EXPECT_FALSE(bpe.is_special(703));  // <think> is added but not special
  EXPECT_FALSE(bpe.token_to_id("no such token").has_value());
  EXPECT_FALSE(bpe.id_to_token(5000).has_value());
  EXPECT_NE(bpe.chat_template().find("<|im_start|>"), std::string::npos);

  const Tokenizer word = Tokenizer::load(kFixtures + "/wordlevel");
  EXPECT_EQ(word.bos_id(), 2);  // [PAD] [UNK] [BOS] [EOS] [SEP] come first
  EXPECT_EQ(word.eos_id(), 3);  // given as {"content": "[EOS]", ...}
  EXPECT_EQ(word.pad_id(), 0);
  EXPECT_EQ(word.chat_template(), "");
}

TEST(Tokenizer, IgnoreMergesTakesAWholeVocabularyWord) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe_ignore_merges");
  EXPECT_EQ(tok.encode(" HelloWorld", false), std::vector<int32_t>{700});
  const Tokenizer merged = Tokenizer::load(kFixtures + "/bpe");
  EXPECT_GT(merged.encode(" HelloWorld", false).size(), 1u);
}

TEST(Tokenizer, SpecialTokensAreNeverSplitAndDecodeCanSkipThem) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  const auto ids = tok.encode("<|im_start|>hi<|im_end|>", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 701);
  EXPECT_EQ(ids.back(), 702);
  EXPECT_EQ(tok.decode(ids, true), "hi");
}

Tokenizer wordlevel_with_config(const std::string& config) {
  return Tokenizer::from_json(read(kFixtures + "/wordlevel/tokenizer.json"), config, "wordlevel");
}

TEST(Tokenizer, AddBosTokenFalseDropsThePostProcessorsBos) {
  const Tokenizer tok = wordlevel_with_config(
      R"({"bos_token": "[BOS]", "eos_token": "[EOS]", "add_bos_token": false})");
  const auto plain = tok.encode("ab", false);
  std::vector<int32_t> want = plain;
  want.push_back(3);  // the template's [EOS] stays
  EXPECT_EQ(tok.encode("ab", true), want);
}

TEST(Tokenizer, AddEosTokenAddsEosOnlyWhenThePostProcessorDidNot) {
  const Tokenizer tok = wordlevel_with_config(
      R"({"bos_token": "[BOS]", "eos_token": "[EOS]", "add_eos_token": true})");
  std::vector<int32_t> want = {2};
  for (int32_t id : tok.encode("ab", false)) want.push_back(id);
  want.push_back(3);  // once: the template already ends with [EOS]
  EXPECT_EQ(tok.encode("ab", true), want);

  // Without a post-processor, add_bos_token alone puts bos first.
  auto json = nlohmann::json::parse(read(kFixtures + "/wordlevel/tokenizer.json"));
  json["post_processor"] = nullptr;
  const Tokenizer bare = Tokenizer::from_json(
      json.dump(), R"({"bos_token": "[BOS]", "add_bos_token": true})", "wordlevel");
  std::vector<int32_t> with_bos = {2};
  for (int32_t id : bare.encode("ab", false)) with_bos.push_back(id);
  EXPECT_EQ(bare.encode("ab", true), with_bos);
}

TEST(Tokenizer, DecodeSkipsIdsWithoutAToken) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  auto ids = tok.encode("hello", false);
  const std::string want = tok.decode(ids, false);
  ids.insert(ids.begin() + 1, 99999);
  ids.push_back(-1);
  EXPECT_EQ(tok.decode(ids, false), want);
}

TEST(Tokenizer, EncodesALongWhitespaceRunAndALongWordQuickly) {
  // The merge loop is a heap over a linked list: a 20000-character word must not take
  // quadratic time (the test fails by timing out under CTest's limit).
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  const std::string word(20000, 'a');
  const std::string spaces(20000, ' ');
  EXPECT_FALSE(tok.encode(word, false).empty());
  EXPECT_EQ(tok.decode(tok.encode(spaces + word, false), false), spaces + word);
}

TEST(Tokenizer, ConcurrentEncodesAndDecodesGiveTheSingleThreadedResults) {
  // The BPE cache is shared: four threads filling it at once must not change any result.
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  const auto& cases = expected().at("bpe");
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (const auto& c : cases) {
          const auto ids = tok.encode(c.at("text").get<std::string>(), true);
          if (ids != c.at("ids").get<std::vector<int32_t>>() ||
              tok.decode(ids, false) != c.at("decoded").get<std::string>()) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace baton::data
