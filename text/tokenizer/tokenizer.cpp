#include "text/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/checksum_manifest.h"
#include "base/errors.h"
#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/decoder.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/normalizer.h"
#include "text/tokenizer/post_processor.h"
#include "text/tokenizer/pre_tokenizer.h"
#include "text/tokenizer/tokenizer_model.h"
#include "text/utf8.h"

namespace baton::data {
namespace {

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number past a double (fuzz_tokenizer_json).
    throw TokenizerError(source + ": malformed JSON: " + e.what());
  }
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path.string() + ": cannot open the file (does it exist?)");
  std::ostringstream text;
  text << in.rdbuf();
  std::string bytes = text.str();
  try {
    verify_file_bytes(path, bytes.data(), bytes.size());  // an HF export's checksums
  } catch (const FileError& e) {
    throw TokenizerError(e.what());
  }
  return bytes;
}

// A token setting of tokenizer_config.json: null, "text", or {"content": "text", ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key,
                                        const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return json_string(*it, "content", where + "." + key);
  throw TokenizerError(where + "." + key + ": expected a string, {\"content\": ...} or null");
}

}  // namespace

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<TokenizerModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<AddedVocabulary> added;
  std::optional<int32_t> bos, eos, pad;
  std::optional<bool> add_bos, add_eos;
  std::string chat_template;
  std::vector<std::pair<std::string, std::string>> special_tokens;

  std::optional<int32_t> lookup(std::string_view token) const {
    if (const auto id = added->find(token)) return id;
    return model->vocabulary().find(token);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const std::filesystem::path tokenizer_path = dir / "tokenizer.json";
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::string tokenizer_json = read_file(tokenizer_path);
  const std::string config_json =
      std::filesystem::exists(config_path) ? read_file(config_path) : std::string();
  return from_json(tokenizer_json, config_json, dir.string());
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const std::string& source) {
  const std::string file = source + "/tokenizer.json";
  const nlohmann::json root = parse_json(tokenizer_json, file);
  if (!root.is_object()) throw TokenizerError(file + ": expected a JSON object");
  const auto section = [&](const char* key) -> const nlohmann::json& {
    static const nlohmann::json null_json;
    const auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  auto impl = std::make_unique<Impl>();
  impl->normalizer = make_normalizer(section("normalizer"), file + ": normalizer");
  impl->pre_tokenizer = make_pre_tokenizer(section("pre_tokenizer"), file + ": pre_tokenizer");
  impl->model = make_tokenizer_model(json_field(root, "model", file), file + ": model");
  impl->post_processor = make_post_processor(section("post_processor"), file + ": post_processor");
  impl->decoder = make_decoder(section("decoder"), file + ": decoder");
  impl->added = std::make_unique<AddedVocabulary>(section("added_tokens"), impl->normalizer.get(),
                                                  file + ": added_tokens");

  if (!config_json.empty()) {
    const std::string config_file = source + "/tokenizer_config.json";
    const nlohmann::json config = parse_json(config_json, config_file);
    if (!config.is_object()) throw TokenizerError(config_file + ": expected a JSON object");
    const auto token_id = [&](const char* key) -> std::optional<int32_t> {
      const auto token = config_token(config, key, config_file);
      if (!token) return std::nullopt;
      const auto id = impl->lookup(*token);
      if (!id) {
        throw TokenizerError(config_file + ": " + key + " '" + *token +
                             "' is not a token of tokenizer.json");
      }
      return id;
    };
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token"}) {
      if (const auto token = config_token(config, key, config_file)) {
        impl->special_tokens.emplace_back(key, *token);
      }
    }
    impl->bos = token_id("bos_token");
    impl->eos = token_id("eos_token");
    impl->pad = token_id("pad_token");
    for (auto [key, flag] :
         {std::pair{"add_bos_token", &impl->add_bos}, std::pair{"add_eos_token", &impl->add_eos}}) {
      if (config.contains(key) && !config[key].is_null())
        *flag = json_bool(config, key, false, config_file);
    }
    if (const auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
      if (it->is_string()) {
        impl->chat_template = it->get<std::string>();
      } else if (it->is_array()) {  // [{"name": ..., "template": ...}]: the default one
        for (const auto& entry : *it) {
          if (entry.is_object() && entry.contains("name") &&
              json_string(entry, "name", config_file + ".chat_template[]") == "default") {
            impl->chat_template = json_string(entry, "template", config_file + ".chat_template");
          }
        }
      } else {
        throw TokenizerError(config_file + ".chat_template: expected a string or a list");
      }
    }
    if (impl->add_bos.value_or(false) && !impl->bos) {
      throw TokenizerError(config_file + ": add_bos_token is true but there is no bos_token");
    }
    if (impl->add_eos.value_or(false) && !impl->eos) {
      throw TokenizerError(config_file + ": add_eos_token is true but there is no eos_token");
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  if (const std::size_t bad = utf8::first_invalid(text); bad != text.size()) {
    throw TokenizerError("Tokenizer::encode: the text is not valid UTF-8 (byte offset " +
                         std::to_string(bad) + ")");
  }
  std::vector<int32_t> ids;
  for (const AddedVocabulary::Segment& segment : m.added->split(text, m.normalizer.get())) {
    if (segment.id) {
      ids.push_back(*segment.id);
      continue;
    }
    for (const std::string& piece : pre_tokenize(m.pre_tokenizer.get(), segment.text)) {
      m.model->tokenize(piece, ids);
    }
  }
  if (!add_special_tokens) return ids;
  std::vector<int32_t> out = m.post_processor ? m.post_processor->process(ids) : ids;
  // add_bos_token / add_eos_token, when set, decide whether the post-processor's (or the
  // text's) bos and eos stay: one is added when the post-processor added none, and one the
  // post-processor added is removed when the setting is false.
  const auto leading = [](const std::vector<int32_t>& v, int32_t id) {
    return std::find_if(v.begin(), v.end(), [id](int32_t x) { return x != id; }) - v.begin();
  };
  const auto trailing = [](const std::vector<int32_t>& v, int32_t id) {
    return std::find_if(v.rbegin(), v.rend(), [id](int32_t x) { return x != id; }) - v.rbegin();
  };
  if (m.add_bos && m.bos) {
    const bool added = leading(out, *m.bos) > leading(ids, *m.bos);
    if (*m.add_bos && !added) out.insert(out.begin(), *m.bos);
    if (!*m.add_bos && added) out.erase(out.begin());
  }
  if (m.add_eos && m.eos) {
    const bool added = trailing(out, *m.eos) > trailing(ids, *m.eos);
    if (*m.add_eos && !added) out.push_back(*m.eos);
    if (!*m.add_eos && added) out.pop_back();
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = m.added->decoded(id);
    if (token == nullptr) token = m.model->vocabulary().token(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && m.added->is_special(*token)) continue;
    tokens.push_back(*token);
  }
  if (m.decoder) return m.decoder->decode(std::move(tokens));
  std::string out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out += ' ';
    out += tokens[i];
  }
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->lookup(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* t = impl_->added->token(id)) return t->content;
  if (const std::string* t = impl_->model->vocabulary().token(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* t = impl_->added->token(id);
  return t != nullptr && t->special;
}

int32_t Tokenizer::vocab_size() const {
  int32_t end = impl_->model->vocabulary().end_id();
  for (const AddedToken& t : impl_->added->tokens()) end = std::max(end, t.id + 1);
  return end;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }
const std::vector<std::pair<std::string, std::string>>& Tokenizer::special_tokens() const {
  return impl_->special_tokens;
}

}  // namespace baton::data
