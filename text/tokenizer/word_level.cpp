#include "text/tokenizer/word_level.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/tokenizer_error.h"

namespace baton::data {

WordLevel::WordLevel(const nlohmann::json& config, const std::string& where)
    : vocab_(Vocabulary::from_json(json_field(config, "vocab", where), where + ".vocab")) {
  const auto it = config.find("unk_token");
  if (it != config.end() && !it->is_null()) {
    const std::string unk = json_string(config, "unk_token", where);
    unk_id_ = vocab_.find(unk);
    if (!unk_id_) {
      throw TokenizerError(where + ".unk_token: '" + unk + "' is not in the vocabulary");
    }
  }
}

void WordLevel::tokenize(std::string_view piece, std::vector<int32_t>& ids) const {
  if (const auto id = vocab_.find(piece)) {
    ids.push_back(*id);
  } else if (unk_id_) {
    ids.push_back(*unk_id_);
  } else {
    throw TokenizerError("WordLevel: '" + std::string(piece) +
                         "' is not in the vocabulary and the model has no unk_token");
  }
}

}  // namespace baton::data
