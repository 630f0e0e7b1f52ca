#include "text/tokenizer/tokenizer_model.h"

#include <functional>
#include <nlohmann/json.hpp>

#include "text/tokenizer/bpe.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/tokenizer_error.h"
#include "text/tokenizer/word_level.h"

namespace baton::data {
namespace {

uint64_t token_hash(std::string_view token) { return std::hash<std::string_view>{}(token); }

}  // namespace

Vocabulary Vocabulary::from_json(const nlohmann::json& vocab, const std::string& where) {
  if (!vocab.is_object()) throw TokenizerError(where + ": expected an object of token -> id");
  Vocabulary v;
  for (const auto& [token, id_json] : vocab.items()) {
    // One past the largest id (end_id, vocab_size) must be an int32 too.
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= INT32_MAX) {
      throw TokenizerError(where + "[\"" + token + "\"]: expected an id from 0 to " +
                           std::to_string(INT32_MAX - 1));
    }
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    if (static_cast<std::size_t>(id) >= v.tokens_.size()) {
      v.tokens_.resize(static_cast<std::size_t>(id) + 1);
      v.has_token_.resize(static_cast<std::size_t>(id) + 1, false);
    }
    if (v.has_token_[static_cast<std::size_t>(id)]) {
      throw TokenizerError(where + ": id " + std::to_string(id) + " is given to both '" +
                           v.tokens_[static_cast<std::size_t>(id)] + "' and '" + token + "'");
    }
    v.tokens_[static_cast<std::size_t>(id)] = token;
    v.has_token_[static_cast<std::size_t>(id)] = true;
    ++v.size_;
  }
  std::size_t capacity = 16;
  while (capacity < 2 * v.size_) capacity *= 2;
  v.slots_.assign(capacity, 0);
  v.mask_ = capacity - 1;
  for (std::size_t id = 0; id < v.tokens_.size(); ++id) {
    if (v.has_token_[id]) v.index(static_cast<int32_t>(id));
  }
  return v;
}

void Vocabulary::index(int32_t id) {
  const uint64_t hash = token_hash(tokens_[static_cast<std::size_t>(id)]);
  std::size_t i = hash & mask_;
  while (slots_[i] != 0) i = (i + 1) & mask_;
  slots_[i] = (hash & 0xFFFFFFFF00000000ull) | (static_cast<uint64_t>(id) + 1);
}

std::optional<int32_t> Vocabulary::find(std::string_view token) const {
  const uint64_t hash = token_hash(token);
  for (std::size_t i = hash & mask_;; i = (i + 1) & mask_) {
    const uint64_t slot = slots_[i];
    if (slot == 0) return std::nullopt;
    if ((slot ^ hash) >> 32 == 0) {
      const auto id = static_cast<int32_t>((slot & 0xFFFFFFFFu) - 1);
      if (tokens_[static_cast<std::size_t>(id)] == token) return id;
    }
  }
}

const std::string* Vocabulary::token(int32_t id) const {
  if (id < 0 || id >= end_id() || !has_token_[static_cast<std::size_t>(id)]) return nullptr;
  return &tokens_[static_cast<std::size_t>(id)];
}

std::unique_ptr<TokenizerModel> make_tokenizer_model(const nlohmann::json& config,
                                                     const std::string& where) {
  // HF omits "type" in some older files; BPE is then recognised by its merges.
  std::string type;
  if (config.is_object() && !config.contains("type") && config.contains("merges")) {
    type = "BPE";
  } else {
    type = json_type(config, where);
  }
  if (type == "BPE") return std::make_unique<Bpe>(config, where);
  if (type == "WordLevel") return std::make_unique<WordLevel>(config, where);
  throw TokenizerError(where + ": unsupported model type '" + type +
                       "' (baton supports BPE and WordLevel)");
}

}  // namespace baton::data
