// Every way loading or using a tokenizer fails says what was wrong and where.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/tokenizer/tokenizer.h"

namespace baton::data {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

nlohmann::json fixture_json(const std::string& name) {
  std::ifstream in(kFixtures + "/" + name + "/tokenizer.json");
  return nlohmann::json::parse(in);
}

// The message of the TokenizerError that `load` throws ("" if it does not throw).
template <typename F>
std::string error_of(F&& load) {
  try {
    load();
  } catch (const TokenizerError& e) {
    return e.what();
  }
  return "";
}

std::string load_error(const nlohmann::json& tokenizer, const std::string& config = "") {
  return error_of([&] { Tokenizer::from_json(tokenizer.dump(), config, "models/m"); });
}

// The message contains `part` (gtest has no substring matcher without gmock).
#define EXPECT_CONTAINS(message, part) \
  EXPECT_NE(std::string(message).find(part), std::string::npos) << "message: " << (message)

TEST(TokenizerErrors, MissingFileNamesThePath) {
  const std::string msg = error_of([] { Tokenizer::load("/nonexistent/model"); });
  EXPECT_CONTAINS(msg, "/nonexistent/model/tokenizer.json");
  EXPECT_CONTAINS(msg, "cannot open");
}

TEST(TokenizerErrors, MalformedJsonNamesTheFile) {
  const std::string msg = error_of([] { Tokenizer::from_json("{\"model\": {", "", "models/m"); });
  EXPECT_CONTAINS(msg, "models/m/tokenizer.json");
  EXPECT_CONTAINS(msg, "malformed JSON");

  const std::string config_msg = error_of(
      [] { Tokenizer::from_json(fixture_json("wordlevel").dump(), "{bos_token: 1}", "models/m"); });
  EXPECT_CONTAINS(config_msg, "models/m/tokenizer_config.json");
  EXPECT_CONTAINS(config_msg, "malformed JSON");

  // A number past a double is nlohmann's out_of_range, not a parse_error: it
  // is a malformed file all the same (it escaped and ended the process; found
  // by fuzz_tokenizer_json).
  const std::string huge = error_of([] { Tokenizer::from_json("{\"version\": 1e999}", "", "models/m"); });
  EXPECT_CONTAINS(huge, "models/m/tokenizer.json: malformed JSON");
}

TEST(TokenizerErrors, UnsupportedModelIsNamed) {
  auto json = fixture_json("wordlevel");
  json["model"]["type"] = "Unigram";
  const std::string msg = load_error(json);
  EXPECT_CONTAINS(msg, "models/m/tokenizer.json: model");
  EXPECT_CONTAINS(msg, "unsupported model type 'Unigram'");
}

TEST(TokenizerErrors, UnsupportedPreTokenizerInsideASequenceIsNamedWithItsPath) {
  auto json = fixture_json("wordlevel");
  json["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Metaspace"}, {"replacement", "_"}};
  const std::string msg = load_error(json);
  EXPECT_CONTAINS(msg, "models/m/tokenizer.json: pre_tokenizer.pretokenizers[1]");
  EXPECT_CONTAINS(msg, "unsupported pre-tokenizer type 'Metaspace'");
}

TEST(TokenizerErrors, UnsupportedNormalizerIsNamed) {
  auto json = fixture_json("bpe");
  json["normalizer"] = {{"type", "NFKC"}};
  const std::string msg = load_error(json);
  EXPECT_CONTAINS(msg, "tokenizer.json: normalizer");
  EXPECT_CONTAINS(msg, "unsupported normalizer type 'NFKC'");
}

TEST(TokenizerErrors, UnsupportedDecoderAndPostProcessorAreNamed) {
  auto json = fixture_json("bpe");
  json["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}};
  EXPECT_CONTAINS(load_error(json), "decoder: unsupported decoder type 'WordPiece'");
  json = fixture_json("bpe");
  json["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_CONTAINS(load_error(json),
                  "post_processor: unsupported post-processor type 'BertProcessing'");
}

TEST(TokenizerErrors, MergeOfAnUnknownTokenNamesTheMerge) {
  auto json = fixture_json("bpe");
  json["model"]["merges"][3] = {"zz", "qq"};
  const std::string msg = load_error(json);
  EXPECT_CONTAINS(msg, "model.merges[3]");
  EXPECT_CONTAINS(msg, "'zz'");
  json["model"]["merges"][3] = "a b c";
  EXPECT_CONTAINS(load_error(json), "model.merges[3]: expected \"left right\"");
}

TEST(TokenizerErrors, BadRegexNamesThePattern) {
  auto json = fixture_json("bpe");
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
  const std::string msg = load_error(json);
  EXPECT_CONTAINS(msg, "pre_tokenizer.pretokenizers[0].pattern");
  EXPECT_CONTAINS(msg, "(unclosed");
}

TEST(TokenizerErrors, DropoutIsRejected) {
  auto json = fixture_json("bpe");
  json["model"]["dropout"] = 0.1;
  EXPECT_CONTAINS(load_error(json), "model.dropout");
}

TEST(TokenizerErrors, ConfigTokenMissingFromVocabularyNamesConfigAndKey) {
  const std::string msg = load_error(fixture_json("wordlevel"), R"({"bos_token": "<s>"})");
  EXPECT_CONTAINS(msg, "models/m/tokenizer_config.json");
  EXPECT_CONTAINS(msg, "bos_token '<s>'");
  EXPECT_CONTAINS(load_error(fixture_json("wordlevel"), R"({"add_bos_token": true})"),
                  "add_bos_token is true but there is no bos_token");
}

TEST(TokenizerErrors, InvalidUtf8TextNamesTheByteOffset) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/bpe");
  const std::string msg = error_of([&] { tok.encode("ok\xC3(", false); });
  EXPECT_CONTAINS(msg, "not valid UTF-8");
  EXPECT_CONTAINS(msg, "byte offset 2");
}

TEST(TokenizerErrors, WordLevelWithoutUnkNamesTheUnknownPiece) {
  auto json = fixture_json("wordlevel");
  json["model"]["unk_token"] = nullptr;
  const Tokenizer tok = Tokenizer::from_json(json.dump(), "", "models/m");
  EXPECT_CONTAINS(error_of([&] { tok.encode("a\xE2\x88\x91", false); }),
                  "'\xE2\x88\x91' is not in the vocabulary");
}

// Found while writing tests/fuzz/fuzz_tokenizer_json (by reading the parsers it covers): the
// first escaped as nlohmann's type_error, the others made vocab_size() overflow an int32.
TEST(TokenizerErrors, NonStringChatTemplateNameIsNamed) {
  EXPECT_CONTAINS(
      load_error(fixture_json("wordlevel"), R"({"chat_template": [{"name": 1, "template": "x"}]})"),
      "models/m/tokenizer_config.json.chat_template[].name: expected a string");
}

TEST(TokenizerErrors, IdsWhoseSuccessorIsPastInt32AreRejected) {
  auto json = fixture_json("wordlevel");
  json["added_tokens"] = {{{"id", 2147483647}, {"content", "<x>"}, {"special", true}}};
  EXPECT_CONTAINS(load_error(json), "added_tokens[0].id: expected an id from 0 to 2147483646");
  json = fixture_json("wordlevel");
  json["model"]["vocab"]["<x>"] = 2147483647;
  EXPECT_CONTAINS(load_error(json), "model.vocab[\"<x>\"]: expected an id from 0 to 2147483646");
}

}  // namespace
}  // namespace baton::data
